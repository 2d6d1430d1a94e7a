"""Cross-validated comparison of fusion methods on saved predictions (the evaluation protocol).

Every method is an :class:`EvalMethod`. Learned or tuned methods (``learned = True``) are fitted on
K−1 folds of images and predict the held-out fold; fixed methods predict every image once. Held-out
predictions are pooled into ONE COCO evaluation, so no method is ever scored on an image it was fitted
on, and the folds (by image, fixed by the seed) are identical for every method. ``head:PATH`` scores a head
trained elsewhere as a fixed method (held-out only if that training never saw these images).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from detens.coco import detections_to_coco, evaluate_coco
from detens.detections import Detections
from detens.folds import kfold_image_splits
from detens.fusers import fuse
from detens.predictions import EnsemblePredictions
from detens.registry import Registry

__all__ = [
    "METHODS",
    "EvalMethod",
    "EvaluationData",
    "FixedFusion",
    "SingleModel",
    "TunedWBF",
    "ThetaMethod",
    "PretrainedHead",
    "expand_methods",
    "cross_validate",
]

logger = logging.getLogger(__name__)


class EvaluationData:
    """Saved predictions with each image's per-model Detections built once and kept in memory."""

    def __init__(self, predictions: EnsemblePredictions) -> None:
        self.predictions = predictions
        self.gt = predictions.gt
        self.model_names = predictions.model_names
        self._per_model: dict[int, list[Detections]] = {}

    def per_model(self, image_id: int) -> list[Detections]:
        if image_id not in self._per_model:
            self._per_model[image_id] = self.predictions.per_model(image_id)
        return self._per_model[image_id]

    @property
    def image_ids(self) -> list[int]:
        """The evaluated images: those with ground truth."""
        return self.gt.annotated_image_ids

    def score(self, predict: Callable[[int], Detections], image_ids: Sequence[int], backend: str = "faster") -> float:
        """mAP of ``predict`` over ``image_ids`` (used inside hyper-parameter searches on training folds)."""
        results = []
        for image_id in image_ids:
            results += detections_to_coco(predict(image_id), image_id, decimals=None)
        return evaluate_coco(self.gt, results, image_ids=image_ids, backend=backend)["map"]


class EvalMethod:
    """One row of the comparison. Subclasses set ``learned`` and implement ``predict`` (and ``fit``)."""

    learned: bool = False

    def fit(self, data: EvaluationData, train_ids: Sequence[int]) -> None:
        """Fit on the training images (only called when ``learned``)."""

    def predict(self, data: EvaluationData, image_id: int) -> Detections:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """What was fitted (chosen hyper-parameters, learned weights), for the report."""
        return {}


#: name → factory(model_names, **options) → EvalMethod. Names ending in ":" take a suffix (``single:yolo11n``).
METHODS: Registry[Callable[..., EvalMethod]] = Registry("evaluation method")


class FixedFusion(EvalMethod):
    """A fuser with fixed parameters (``detens.fuse``)."""

    def __init__(self, method: str, **params: Any) -> None:
        self.method = method
        self.params = params

    def predict(self, data: EvaluationData, image_id: int) -> Detections:
        return fuse(data.per_model(image_id), self.method, **self.params)

    def describe(self) -> dict[str, Any]:
        return dict(self.params)


class SingleModel(EvalMethod):
    """One ensemble member alone: the baseline every fusion must beat."""

    def __init__(self, model_names: Sequence[str], name: str) -> None:
        if name not in model_names:
            raise ValueError(f"single:{name}: unknown model; the ensemble has {list(model_names)}")
        self.index = list(model_names).index(name)

    def predict(self, data: EvaluationData, image_id: int) -> Detections:
        return data.per_model(image_id)[self.index]


def _weight_grid(num_models: int, values: Sequence[float]) -> list[tuple[float, ...]]:
    """Per-model weight vectors from ``values``^N, one per direction (WBF is invariant to a common scale)."""
    seen, grid = set(), []
    for combo in itertools.product(values, repeat=num_models):
        key = tuple(round(w / max(combo), 6) for w in combo)
        if key not in seen:
            seen.add(key)
            grid.append(tuple(float(w) for w in combo))
    return grid


class TunedWBF(EvalMethod):
    """WBF with ``iou_thr`` and per-model ``weights`` grid-searched for mAP on the training images.

    The full grid (``iou_grid`` × ``weight_values``^N, deduplicated by scale) is searched when it has at
    most ``max_configs`` points; larger grids (many models) fall back to coordinate descent over the
    same values, one weight at a time.
    """

    learned = True

    def __init__(
        self,
        model_names: Sequence[str],
        iou_grid: Sequence[float] = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75),
        weight_values: Sequence[float] = (1.0, 2.0, 3.0),
        max_configs: int = 200,
        conf_type: str = "avg",
    ) -> None:
        self.num_models = len(model_names)
        self.iou_grid = tuple(iou_grid)
        self.weight_values = tuple(weight_values)
        self.max_configs = max_configs
        self.conf_type = conf_type
        self.best: dict[str, Any] = {"iou_thr": 0.55, "weights": [1.0] * self.num_models}
        self.searched = 0

    def _score(self, data: EvaluationData, train_ids: Sequence[int], iou_thr: float, weights: Sequence[float]) -> float:
        self.searched += 1
        params = dict(iou_thr=iou_thr, weights=list(weights), conf_type=self.conf_type)
        return data.score(lambda i: fuse(data.per_model(i), "wbf", **params), train_ids)

    def fit(self, data: EvaluationData, train_ids: Sequence[int]) -> None:
        weight_grid = _weight_grid(self.num_models, self.weight_values)
        if len(self.iou_grid) * len(weight_grid) <= self.max_configs:
            candidates = itertools.product(self.iou_grid, weight_grid)
            scored = [(self._score(data, train_ids, t, w), t, w) for t, w in candidates]
            best_map, iou_thr, weights = max(scored, key=lambda s: s[0])
        else:
            weights = [1.0] * self.num_models
            best_map, iou_thr = max((self._score(data, train_ids, t, weights), t) for t in self.iou_grid)
            for m in range(self.num_models):
                for value in self.weight_values:
                    trial = list(weights)
                    trial[m] = value
                    score = self._score(data, train_ids, iou_thr, trial)
                    if score > best_map:
                        best_map, weights = score, trial
        self.best = {"iou_thr": iou_thr, "weights": list(weights), "train_map": best_map}
        logger.info("wbf_tuned: best on %d training images %s (%d configs)", len(train_ids), self.best, self.searched)

    def predict(self, data: EvaluationData, image_id: int) -> Detections:
        return fuse(
            data.per_model(image_id), "wbf", iou_thr=self.best["iou_thr"], weights=self.best["weights"],
            conf_type=self.conf_type,
        )

    def describe(self) -> dict[str, Any]:
        return dict(self.best, configs_searched=self.searched)


class ThetaMethod(EvalMethod):
    """The Θ head trained with :func:`detens.training.train_theta` on the training images."""

    learned = True

    def __init__(self, model_names: Sequence[str], config: Any = None) -> None:
        from detens.training import ThetaTrainConfig

        self.model_names = list(model_names)
        self.config = config if config is not None else ThetaTrainConfig()
        self.head = None
        self.fitted_config = self.config
        self.seconds = 0.0

    def fit(self, data: EvaluationData, train_ids: Sequence[int]) -> None:
        from detens.training import fit_theta

        self.head, history, self.fitted_config = fit_theta(data.predictions, train_ids, self.config)
        self.seconds += history.seconds

    def predict(self, data: EvaluationData, image_id: int) -> Detections:
        return fuse(data.per_model(image_id), "theta", head=self.head, iou_thr=self.fitted_config.match_iou)

    def describe(self) -> dict[str, Any]:
        theta = self.head.theta.detach().cpu().tolist() if self.head is not None else None
        return {"theta": theta, "match_iou": self.fitted_config.match_iou, "train_seconds": round(self.seconds, 2)}


class PretrainedHead(EvalMethod):
    """``head:PATH``: a head trained elsewhere (any type, ``detens.load_head``) fusing every image as is.

    It is not refitted per fold, so its figure is held-out only if the head never saw these images: train
    it on other data (``tools/train.py``) to compare it with the cross-validated rows. The heads shipped in
    ``configs/heads/`` were trained on the 206 COCO images, so on those they are scored in-sample.
    """

    def __init__(self, model_names: Sequence[str], name: str) -> None:
        from detens.heads import load_head

        self.path = name
        self.head = load_head(name)
        if sorted(self.head.model_names) != sorted(model_names):
            raise ValueError(
                f"head {name!r} was trained for models {self.head.model_names}, but the predictions have "
                f"{list(model_names)}"
            )
        # The predictions folder lists its models by file name; the head's weights follow its own order.
        self.order = [list(model_names).index(m) for m in self.head.model_names]

    def predict(self, data: EvaluationData, image_id: int) -> Detections:
        per_model = data.per_model(image_id)
        return fuse([per_model[i] for i in self.order], "theta", head=self.head)

    def describe(self) -> dict[str, Any]:
        return {"head": self.path, "type": self.head.type_name, "match_iou": self.head.match_iou}


def _register_fixed(name: str, method: str, **params: Any) -> None:
    METHODS.register(name)(lambda model_names, **options: FixedFusion(method, **{**params, **options}))


for _name in ("nms", "soft_nms", "wbf", "vote", "mean"):
    _register_fixed(_name, _name)
METHODS.register("single:")(lambda model_names, name: SingleModel(model_names, name))
METHODS.register("head:")(PretrainedHead)
METHODS.register("wbf_tuned")(TunedWBF)
METHODS.register("theta")(ThetaMethod)


@METHODS.register("theta_seed")
def _theta_seed(model_names: Sequence[str], config: Any = None) -> ThetaMethod:
    """The seed-exact Θ (configs/train/theta_seed.yaml): A = ŶᵀΘ, fixed matching IoU."""
    from pathlib import Path

    from detens.config import load_yaml_config
    from detens.training import ThetaTrainConfig

    if config is None:
        path = Path(__file__).resolve().parents[1] / "configs" / "train" / "theta_seed.yaml"
        config = load_yaml_config(ThetaTrainConfig, path) if path.is_file() else ThetaTrainConfig(normalize_box=False)
    return ThetaMethod(model_names, config)


def expand_methods(names: Sequence[str], model_names: Sequence[str]) -> list[str]:
    """``single`` expands to ``single:<model>`` for every model; other names pass through (validated)."""
    expanded = []
    for name in names:
        if name == "single":
            expanded += [f"single:{m}" for m in model_names]
        else:
            _lookup(name)
            expanded.append(name)
    return expanded


def _lookup(name: str) -> tuple[Callable[..., EvalMethod], dict[str, Any]]:
    if ":" in name:
        prefix, suffix = name.split(":", 1)
        return METHODS.get(prefix + ":"), {"name": suffix}
    return METHODS.get(name), {}


def build_method(name: str, model_names: Sequence[str], **options: Any) -> EvalMethod:
    factory, implied = _lookup(name)
    return factory(model_names, **implied, **options)


@dataclass
class MethodResult:
    metrics: dict[str, float]
    fitted: list[dict[str, Any]] = field(default_factory=list)


def cross_validate(
    predictions: EnsemblePredictions,
    methods: Sequence[str],
    k: int = 2,
    seed: int = 0,
    backend: str = "pycocotools",
    method_options: dict[str, dict[str, Any]] | None = None,
    on_method: Callable[[str, MethodResult], None] | None = None,
) -> dict[str, MethodResult]:
    """Score every method on pooled held-out predictions; see the module docstring.

    Args:
        predictions (EnsemblePredictions): the N models' saved predictions and the ground truth.
        methods (list[str]): method names (``single`` expands to every model).
        k (int): folds; seed (int): fixes the folds.
        backend (str): COCO evaluator for the reported figures (tuning always uses the fast one).
        method_options (dict[str, dict]): extra constructor options per method name.

    Returns:
        dict[str, MethodResult]: per method its metrics (``map`` ... plus ``fusion_ms`` per image) and,
        for learned methods, what each fold's fit chose.
    """
    data = EvaluationData(predictions)
    names = expand_methods(methods, data.model_names)
    folds = kfold_image_splits(data.image_ids, k, seed)
    method_options = method_options or {}
    # Every method is built before any runs, so a bad option or head file fails before hours of work.
    built = {name: build_method(name, data.model_names, **method_options.get(name, {})) for name in names}
    report: dict[str, MethodResult] = {}
    for name in names:
        options = method_options.get(name, {})
        method = built[name]
        plan = [(train, test) for train, test in folds] if method.learned else [([], data.image_ids)]
        results, fitted, predict_seconds, predicted = [], [], 0.0, 0
        for train_ids, test_ids in plan:
            if method.learned:
                method = build_method(name, data.model_names, **options)
                method.fit(data, train_ids)
                fitted.append(method.describe())
            for image_id in test_ids:
                data.per_model(image_id)  # build (and cache) the inputs outside the timed region
                start = time.perf_counter()
                fused = method.predict(data, image_id)
                predict_seconds += time.perf_counter() - start
                predicted += 1
                results += detections_to_coco(fused, image_id, decimals=None)
        metrics = evaluate_coco(data.gt, results, image_ids=data.image_ids, backend=backend)
        metrics["fusion_ms"] = 1e3 * predict_seconds / max(predicted, 1)
        report[name] = MethodResult(metrics, fitted)
        if on_method is not None:
            on_method(name, report[name])
    return report


# The network heads and the e2e-CEL baselines (issue 6) register themselves into METHODS.
from detens import evaluation_heads  # noqa: E402,F401  isort: skip
