"""Cross-validated comparison of fusion methods on saved predictions (the evaluation protocol).

Every method is an :class:`EvalMethod`. Learned or tuned methods (``learned = True``) are fitted on
K−1 folds of images and predict the held-out fold; fixed methods predict every image once. Held-out
predictions are pooled into ONE COCO evaluation, so no method is ever scored on an image it was fitted
on, and the folds (by image, fixed by the seed) are identical for every method. More fitting images
(``fit_on``) join the fitting side of every fold and are never scored; with ``k = 0`` methods fit on them
alone and score every image (fit on one dataset, score another), and fixed methods alone need none.
Either way the fitting data must not hold a scored image (identified by its base file name), or that
image would be fitted on and scored.

The methods (:data:`METHODS`):

- every model alone (``single:<model>``) and the fixed fusers (``nms``, ``soft_nms``, ``wbf``, ``vote``,
  ``mean``); ``wbf_tuned``: WBF with its settings searched on the fitting images;
- every head type of :data:`detens.heads.TRAINERS` (``theta``, ``theta_seed``, ``deep``, ``selection``,
  ``superlearner``, ``calibration``) through one wrapper, :class:`HeadMethod`; ``selection_k1`` ...
  ``selection_k8``: the selection head with k fixed;
- baselines of the e2e-CEL paper: ``random_k1`` ... ``random_k8`` (k random present models per object)
  and ``oracle`` (per object, the model row closest to its ground-truth box: it READS THE GROUND TRUTH
  of the image it fuses, so it is a ceiling, never a method);
- ``head:PATH``: a head trained elsewhere, scored as a fixed method (held-out only if that training
  never saw these images).

On a few hundred images the split itself moves a method's mAP by a few tenths of a point, as much as
the gaps between good methods; repeating the cross-validation with other seeds (other folds) and
averaging (:func:`summarize_repeats`) shows how much of a gap is the split.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torchvision.ops import box_iou

from detens.calibration_metrics import detection_calibration
from detens.catalogue import MAX_K
from detens.checks import check_choices, check_integer, check_max_det, check_reals
from detens.coco import BACKENDS, detections_to_array, detections_to_coco, evaluate_coco, fastest_backend
from detens.detections import Detections
from detens.folds import kfold_image_splits
from detens.fusers import fuse, highest_scoring
from detens.fusers.consensus import average_clusters
from detens.fusers.wbf import CONF_TYPES
from detens.heads import TRAINERS
from detens.matching import Clusters, match
from detens.predictions import EnsemblePredictions, join_predictions, shared_images, shares_images_phrase
from detens.registry import Registry, unknown_name_error
from detens.targets import assign_targets

__all__ = [
    "METHODS",
    "EvalMethod",
    "EvaluationData",
    "FixedFusion",
    "SingleModel",
    "TunedWBF",
    "HeadMethod",
    "PretrainedHead",
    "OracleMethod",
    "oracle_fusion",
    "selection_methods",
    "MAX_K",
    "expand_methods",
    "check_method_names",
    "method_names",
    "head_kind",
    "cross_validate",
    "summarize_repeats",
]

logger = logging.getLogger(__name__)


class EvaluationData:
    """Saved predictions with each image's per-model Detections built once and kept in memory.

    Args:
        predictions (EnsemblePredictions): every image a method may fit on or be scored on.
        image_ids (list[int] | None): the images that are scored (default: every annotated image);
            the others (extra fitting images) are only ever fitted on.
        fit_ids (list[int] | None): the images that methods are fitted on, in one fold or another (default:
            ``image_ids``), which :meth:`EvalMethod.check_data` looks at.
        max_det (int | None): every method's boxes of an image are cut to their ``max_det`` highest-scoring
            before they are scored (:meth:`cut`), in the choices made on the fitting images (the heads'
            through their config's ``score_max_det``) as in the held-out figures; None: every box counts.
    """

    def __init__(
        self,
        predictions: EnsemblePredictions,
        image_ids: Sequence[int] | None = None,
        fit_ids: Sequence[int] | None = None,
        max_det: int | None = None,
    ) -> None:
        self.predictions = predictions
        self.max_det = check_max_det(max_det)
        self.gt = predictions.gt
        self.model_names = predictions.model_names
        self.image_ids = list(self.gt.annotated_image_ids if image_ids is None else image_ids)
        self.fit_ids = list(self.image_ids if fit_ids is None else fit_ids)
        self._per_model: dict[int, list[Detections]] = {}
        # each calibration target's check of fit_ids (check_fit_data's answers): one pass over the images'
        # detections serves every head that fits curves of that target
        self.calibration_checks: dict[str, str | None] = {}

    def per_model(self, image_id: int) -> list[Detections]:
        if image_id not in self._per_model:
            self._per_model[image_id] = self.predictions.per_model(image_id)
        return self._per_model[image_id]

    def cut(self, detections: Detections) -> Detections:
        """``detections`` as they are scored: their ``max_det`` highest-scoring boxes."""
        return highest_scoring(detections, self.max_det)

    def score(
        self, predict: Callable[[int], Detections], image_ids: Sequence[int], backend: str | None = None
    ) -> float:
        """mAP of ``predict`` over ``image_ids`` (each image's boxes :meth:`cut`), used inside hyper-parameter
        searches on training folds (``backend`` None: :func:`~detens.coco.fastest_backend`)."""
        rows = [detections_to_array(self.cut(predict(image_id)), image_id) for image_id in image_ids]
        results = np.concatenate(rows) if rows else np.zeros((0, 7))
        return evaluate_coco(self.gt, results, image_ids=image_ids, backend=backend or fastest_backend())["map"]


class EvalMethod:
    """One row of the comparison. Subclasses set ``learned`` and implement ``predict`` (and ``fit``)."""

    learned: bool = False

    def fit(self, data: EvaluationData, train_ids: Sequence[int]) -> None:
        """Fit on the training images (only called when ``learned``)."""

    def check_data(self, data: EvaluationData) -> None:
        """Refuse ``data`` before any method runs when it cannot be this method's (a head file trained on
        another label space; a member without the detections that the calibration curve of a head to fit
        needs); nothing to check by default."""

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


#: The tuned-WBF search space: matching IoU up to 0.95 (where WBF barely fuses), every fused-score rule
#: of the reference, and per-model weights.
WBF_IOU_GRID: tuple[float, ...] = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))
WBF_CONF_TYPES: tuple[str, ...] = ("avg", "box_and_model_avg", "max")
WBF_WEIGHT_VALUES: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0, 4.0)


class TunedWBF(EvalMethod):
    """WBF with ``iou_thr``, ``conf_type`` and per-model ``weights`` searched for mAP on the training images.

    Coordinate ascent from (0.55, ``"avg"``, all weights 1): one round searches ``iou_thr`` over
    ``iou_grid`` with the rest fixed, then ``conf_type`` over ``conf_types``, then each model's weight
    over ``weight_values`` in turn; rounds repeat until one changes nothing (at most ``max_rounds``).
    When the weights end on the grid's edge (one at its largest value and one at its smallest: their
    ratio could not go further), the weight grid is widened (twice the largest, half the smallest value);
    when ``iou_thr`` ends on the top of its grid, the IoU grid gains the value halfway to 1 (0.95 → 0.975:
    WBF then fuses only near-identical boxes). The ascent goes on from there, at most ``max_widenings``
    times. Each setting is scored once. :meth:`describe` reports the choice, the final grids and whether
    each coordinate ended inside its grid.

    Raises:
        TypeError: a grid that is no list (a single number or name), or a value in it of another type,
            naming the option and the value.
        ValueError: an empty grid; an IoU outside (0, 1), a weight <= 0 or a conf_type WBF lacks
            (:data:`detens.fusers.wbf.CONF_TYPES`), naming the option, its position and the value;
            ``max_rounds`` < 1 or ``max_widenings`` < 0.
    """

    learned = True

    def __init__(
        self,
        model_names: Sequence[str],
        iou_grid: Sequence[float] = WBF_IOU_GRID,
        conf_types: Sequence[str] = WBF_CONF_TYPES,
        weight_values: Sequence[float] = WBF_WEIGHT_VALUES,
        max_rounds: int = 4,
        max_widenings: int = 3,
    ) -> None:
        # checked here, when cross_validate builds every method, not by the first fuse of the search
        grids = {
            # 0 fuses any two boxes that touch, 1 none
            "iou_grid": check_reals(iou_grid, "iou_grid", 0.0, 1.0, low_open=True, high_open=True),
            "conf_types": check_choices(conf_types, "conf_types", CONF_TYPES),
            # only the ratios count, and widening halves the smallest: a 0 would stay 0, and all 0 is no weighting
            "weight_values": check_reals(weight_values, "weight_values", 0.0, low_open=True),
        }
        for name, grid in grids.items():
            if not grid:
                raise ValueError(f"wbf_tuned needs a non-empty {name}, got {grid}")
        self.model_names = list(model_names)
        self.iou_grid = tuple(sorted(grids["iou_grid"]))
        self.conf_types = tuple(grids["conf_types"])
        self.weight_values = tuple(sorted(grids["weight_values"]))
        self.max_rounds = check_integer(max_rounds, "max_rounds", 1)
        self.max_widenings = check_integer(max_widenings, "max_widenings", 0)
        self.weight_grid, self.searched_iou_grid = self.weight_values, self.iou_grid
        self.best: dict[str, Any] = {"iou_thr": 0.55, "conf_type": "avg", "weights": [1.0] * len(self.model_names)}
        self._scores: dict[tuple, float] = {}

    def _score(self, data: EvaluationData, train_ids: Sequence[int], setting: tuple) -> float:
        if setting not in self._scores:
            iou_thr, conf_type, weights = setting
            params = dict(iou_thr=iou_thr, conf_type=conf_type, weights=list(weights))
            self._scores[setting] = data.score(lambda i: fuse(data.per_model(i), "wbf", **params), train_ids)
        return self._scores[setting]

    def fit(self, data: EvaluationData, train_ids: Sequence[int]) -> None:
        self._scores = {}
        iou_thr, conf_type, weights = 0.55, "avg", (1.0,) * len(self.model_names)

        def best_of(candidates: list[tuple]) -> tuple:
            # max() keeps the first of equal scores: the current setting comes first, so ties never move it
            return max(candidates, key=lambda setting: self._score(data, train_ids, setting))

        grid, iou_grid = self.weight_values, self.iou_grid
        for widening in range(self.max_widenings + 1):
            if widening and not _weights_interior(weights, grid):
                grid = tuple(sorted({*grid, grid[-1] * 2.0, grid[0] / 2.0}))
                logger.info("wbf_tuned: weights %s on the grid's edge; widened to %s", list(weights), list(grid))
            if widening and _iou_on_top(iou_thr, iou_grid):
                iou_grid = (*iou_grid, round((iou_grid[-1] + 1.0) / 2.0, 4))
                logger.info("wbf_tuned: iou_thr %s on the grid's top; widened to %s", iou_thr, list(iou_grid))
            for _ in range(self.max_rounds):
                before = (iou_thr, conf_type, weights)
                current = (iou_thr, conf_type, weights)
                iou_thr = best_of([current] + [(t, conf_type, weights) for t in iou_grid])[0]
                current = (iou_thr, conf_type, weights)
                conf_type = best_of([current] + [(iou_thr, c, weights) for c in self.conf_types])[1]
                for m in range(len(weights)):
                    current = (iou_thr, conf_type, weights)
                    trials = [weights[:m] + (w,) + weights[m + 1 :] for w in grid]
                    weights = best_of([current] + [(iou_thr, conf_type, w) for w in trials])[2]
                if (iou_thr, conf_type, weights) == before:
                    break
            if _weights_interior(weights, grid) and not _iou_on_top(iou_thr, iou_grid):
                break
        self.weight_grid, self.searched_iou_grid = grid, iou_grid
        self.best = {
            "iou_thr": iou_thr,
            "conf_type": conf_type,
            "weights": list(weights),
            "train_map": self._score(data, train_ids, (iou_thr, conf_type, weights)),
        }
        logger.info("wbf_tuned: best on %d training images %s (%d settings)", len(train_ids), self.best, len(self._scores))

    def predict(self, data: EvaluationData, image_id: int) -> Detections:
        return fuse(
            data.per_model(image_id), "wbf", iou_thr=self.best["iou_thr"], weights=self.best["weights"],
            conf_type=self.best["conf_type"],
        )

    def describe(self) -> dict[str, Any]:
        return dict(
            self.best,
            settings_searched=len(self._scores),
            weight_grid=list(self.weight_grid),
            iou_grid=list(self.searched_iou_grid),
            iou_interior=self.searched_iou_grid[0] < self.best["iou_thr"] < self.searched_iou_grid[-1],
            weights_interior=_weights_interior(self.best["weights"], self.weight_grid),
        )


#: The IoU grid widens toward 1 no further than this (there WBF fuses only near-identical boxes).
_IOU_CEILING = 0.99


def _iou_on_top(iou_thr: float, iou_grid: Sequence[float]) -> bool:
    """``iou_thr`` is the largest of ``iou_grid`` and the grid may still grow toward 1."""
    return iou_thr == iou_grid[-1] and iou_grid[-1] < _IOU_CEILING


def _weights_interior(weights: Sequence[float], grid: Sequence[float]) -> bool:
    """WBF's fused box and ``avg`` score depend on the weights' ratios: the weights are on the grid's
    edge only when one sits at its largest value and another at its smallest (their ratio is capped)."""
    return not (any(w == grid[-1] for w in weights) and any(w == grid[0] for w in weights))


class HeadMethod(EvalMethod):
    """A head of any trainable type (:data:`detens.heads.TRAINERS`: ``theta``, ``theta_seed``, ``deep``,
    ``selection``, ``superlearner``, ``calibration``) fitted on the training images with
    :func:`detens.heads.fit_head`, fusing through the ``theta`` fuser.

    Args:
        model_names (list[str]): the ensemble.
        kind (str): the head type.
        config: its training config (default: :func:`detens.heads.config_for` ``(kind)``, the good settings).
        **overrides: config fields to change (applied on top of ``config``).
    """

    learned = True

    def __init__(self, model_names: Sequence[str], kind: str, config: Any = None, **overrides: Any) -> None:
        from detens.heads import config_for

        self.model_names = list(model_names)
        self.kind = kind
        if config is None:
            config = config_for(kind, **overrides)
        elif overrides:
            config = replace(config, **overrides)
        self.config = config
        self.fitted_config = config
        self.head = None
        self.seconds = 0.0
        self.final_loss: float | None = None
        self.selection: dict[str, Any] = {}

    def check_data(self, data: EvaluationData) -> None:
        from detens.heads import check_fit_data

        given = getattr(self.config, "score_max_det", None)
        if given is not None and given != data.max_det:
            scored = "scores every box" if data.max_det is None else f"scores each image's {data.max_det} best boxes"
            raise ValueError(
                f"{self.kind}: its training config's score_max_det {given} would choose its settings by other boxes "
                f"than the evaluation scores (it {scored}); leave it out, the evaluation sets it (--max-det)"
            )
        check_fit_data(self.kind, data.predictions, data.fit_ids, self.config, answers=data.calibration_checks)

    def fit(self, data: EvaluationData, train_ids: Sequence[int]) -> None:
        from detens.heads import fit_head

        config = self.config
        if data.max_det is not None:  # the fit's own choices score what the evaluation scores
            config = replace(config, score_max_det=data.max_det)
        self.head, history, self.fitted_config = fit_head(self.kind, data.predictions, train_ids, config)
        self.seconds += history.seconds
        self.final_loss = history.loss[-1] if history.loss else None
        self.selection = history.selection

    def predict(self, data: EvaluationData, image_id: int) -> Detections:
        if self.head is None:
            raise RuntimeError(f"{self.kind}: predict before fit")
        return fuse(data.per_model(image_id), "theta", head=self.head)

    def describe(self) -> dict[str, Any]:
        out = {"kind": self.kind, "config": asdict(self.fitted_config), "final_loss": self.final_loss,
               "train_seconds": round(self.seconds, 2)}
        if self.head is not None and hasattr(self.head, "theta"):
            out["theta"] = self.head.theta.detach().cpu().tolist()
        if self.selection:
            out["inner_cv"] = self.selection
        return out


class PretrainedHead(EvalMethod):
    """``head:PATH``: a head trained elsewhere (any type, ``detens.load_head``) fusing every image as is.

    It is not refitted per fold, so its figure is held-out only if the head never saw these images: train
    it on other data (``detens train``) to compare it with the cross-validated rows. The heads shipped in
    ``configs/heads/`` were trained on the 206 COCO images, so on those they are scored in-sample. Where the
    head's training log lists its images (``trained_on``, as ``detens train`` writes it), scoring any of
    them is warned of.
    """

    def __init__(self, model_names: Sequence[str], name: str) -> None:
        from detens.heads import load_head
        from detens.heads._io import find_head_file, read_trained_on

        self.path = name
        file = find_head_file(name)  # a shipped name's file, with the head's training log beside it
        self.head = load_head(file)
        if sorted(self.head.model_names) != sorted(model_names):
            raise ValueError(
                f"head {name!r} was trained for models {self.head.model_names}, but the predictions have "
                f"{list(model_names)}"
            )
        self.trained_on = read_trained_on(file)

    def check_data(self, data: EvaluationData) -> None:
        """Check the head's label space against the ground truth's (warning where a head without per-class
        parameters was fitted on another), and warn where its training log says it was fitted on images
        scored here (by file name, folders aside): its row is then no held-out figure."""
        from detens.heads import check_head_label_space, warn_of_class_agnostic_head_label_space
        from detens.predictions import base_file_names, shares_images_phrase

        check_head_label_space(self.head, data.gt.category_names, f"head {self.path!r}", "the ground truth")
        warn_of_class_agnostic_head_label_space(self.head, data.gt.category_names, f"head {self.path!r}", "the ground truth")
        if self.trained_on is None:
            return
        shared = sorted(set(base_file_names(data.gt, data.image_ids)) & set(self.trained_on))
        if shared:
            logger.warning(
                "head:%s %s, so its row scores images it was fitted on: it is not a held-out figure",
                self.path, shares_images_phrase(shared, "the images scored here", annotated=False),
            )

    def predict(self, data: EvaluationData, image_id: int) -> Detections:
        # each Detections names its model (the file name), so the head takes them in its own order
        return fuse(data.per_model(image_id), "theta", head=self.head)

    def describe(self) -> dict[str, Any]:
        return {"head": self.path, "type": self.head.type_name, "match_iou": self.head.match_iou}


def oracle_fusion(
    clusters: Clusters,
    gt_boxes: torch.Tensor,
    gt_labels: torch.Tensor,
    gt_iscrowd: torch.Tensor | None = None,
    iou_thr: float = 0.5,
) -> Detections:
    """The selection ceiling: each matched cluster takes the present model row closest to its GT box.

    Clusters are matched to the ground truth as the ``mean`` fuser's output would be (COCO-style, greedy
    by score, IoU ≥ ``iou_thr``); a matched cluster's box becomes the present row of highest IoU with its
    GT box, an unmatched one keeps the mean box. Scores are the ``mean`` fuser's.

    Args:
        clusters (Clusters): one image's clusters. gt_boxes (Tensor[G, 4]) pixels, gt_labels (Tensor[G]),
            gt_iscrowd (Tensor[G] bool | None).
    """
    weights = torch.ones(clusters.num_models, device=clusters.device)
    boxes, scores = average_clusters(clusters, weights)
    if len(clusters):
        targets = assign_targets(clusters, boxes, scores, gt_boxes, gt_labels, iou_thr=iou_thr, gt_iscrowd=gt_iscrowd)
        if bool(targets.matched.any()):
            index = targets.matched.nonzero().squeeze(1)
            rows = clusters.preds[index, :, :4]  # [M, N, 4]
            gt = targets.boxes[index].to(rows.dtype)  # [M, 4]
            iou = torch.stack([box_iou(rows[:, n], gt).diagonal() for n in range(clusters.num_models)], 1)  # [M, N]
            iou = iou.masked_fill(~clusters.present[index], -1.0)
            best = iou.argmax(1)
            boxes = boxes.clone()
            boxes[index] = rows[torch.arange(index.numel(), device=rows.device), best]
    return clusters.to_detections(boxes, scores, source="fused:oracle")


class OracleMethod(EvalMethod):
    """:func:`oracle_fusion` on every image (reads that image's ground truth: a ceiling, not a method)."""

    learned = False

    def __init__(self, model_names: Sequence[str], iou_thr: float = 0.55, target_iou: float = 0.5) -> None:
        self.iou_thr = iou_thr
        self.target_iou = target_iou

    def predict(self, data: EvaluationData, image_id: int) -> Detections:
        per_model = data.per_model(image_id)
        clusters = match(per_model, iou_thr=self.iou_thr)
        gt_boxes, gt_labels, gt_iscrowd = (t.to(clusters.device) for t in data.gt.targets(image_id))
        return oracle_fusion(clusters, gt_boxes, gt_labels, gt_iscrowd, self.target_iou)

    def describe(self) -> dict[str, Any]:
        return {"iou_thr": self.iou_thr, "target_iou": self.target_iou, "uses_ground_truth": True}


def selection_methods(num_models: int) -> list[str]:
    """``["selection_k1", ..., "selection_k<N>"]``: the k sweep of an N-model ensemble."""
    return [f"selection_k{k}" for k in range(1, min(num_models, MAX_K) + 1)]


def _register_fixed(name: str, method: str, **params: Any) -> None:
    METHODS.register(name)(lambda model_names, **options: FixedFusion(method, **{**params, **options}))


def _head_factory(kind: str, **fixed: Any) -> Callable[..., HeadMethod]:
    def factory(model_names: Sequence[str], config: Any = None, **overrides: Any) -> HeadMethod:
        return HeadMethod(model_names, kind, config, **{**overrides, **fixed})

    return factory


def _random_factory(k: int) -> Callable[..., FixedFusion]:
    def factory(model_names: Sequence[str], **params: Any) -> FixedFusion:
        return FixedFusion("random_k", **{"k": k, "seed": 0, **params})

    return factory


for _name in ("nms", "soft_nms", "wbf", "vote", "mean"):
    _register_fixed(_name, _name)
METHODS.register("single:")(lambda model_names, name: SingleModel(model_names, name))
METHODS.register("head:")(PretrainedHead)
METHODS.register("wbf_tuned")(TunedWBF)
#: method name → the head type it fits (``selection_k2`` → ``selection``).
_HEAD_KINDS: dict[str, str] = {}
for _kind in TRAINERS:
    METHODS.register(_kind)(_head_factory(_kind))
    _HEAD_KINDS[_kind] = _kind
for _k in range(1, MAX_K + 1):
    METHODS.register(f"selection_k{_k}")(_head_factory("selection", k=_k))
    _HEAD_KINDS[f"selection_k{_k}"] = "selection"
    METHODS.register(f"random_k{_k}")(_random_factory(_k))
METHODS.register("oracle")(OracleMethod)


def head_kind(name: str) -> str | None:
    """The head type (:data:`detens.heads.TRAINERS`) that method ``name`` fits, or None for the others."""
    return _HEAD_KINDS.get(name)


def method_names() -> list[str]:
    """Every name a list of methods takes: ``single`` (every model alone) and the registered methods, those
    ending in ``:`` with a suffix (``single:<model>``, ``head:<file>``)."""
    return sorted(["single", *METHODS.names()])


def _check_method_name(name: str) -> None:
    """Raise the registry's unknown-name error for a name that is no method, listing :func:`method_names`
    (``single`` too, which expands before any lookup and is not registered itself)."""
    if name == "single":
        return
    try:
        _lookup(name)
    except ValueError:
        key = name.split(":", 1)[0] + ":" if ":" in name else name
        raise unknown_name_error(METHODS.kind, key, method_names()) from None


def expand_methods(names: Sequence[str], model_names: Sequence[str]) -> list[str]:
    """``single`` expands to ``single:<model>`` for every model; other names pass through (validated).

    Raises:
        ValueError: a method named twice (``single`` names every ``single:<model>``): it would run twice
            and show once.
    """
    expanded = []
    for name in names:
        if name == "single":
            expanded += [f"single:{m}" for m in model_names]
        else:
            _check_method_name(name)
            expanded.append(name)
    repeated = sorted({n for n in expanded if expanded.count(n) > 1})
    if repeated:
        raise ValueError(f"methods {list(names)} name {repeated} twice ('single' is every single:<model>)")
    return expanded


def check_method_names(names: Sequence[str]) -> None:
    """Raise ``ValueError`` (listing the valid names) for a name that is not a method, before any data loads."""
    if not names:
        raise ValueError(f"no methods given; valid names: {', '.join(method_names())}")
    for name in names:
        _check_method_name(name)
    repeated = sorted({n for n in names if list(names).count(n) > 1})
    if repeated:
        raise ValueError(f"methods name {repeated} twice")


def fitted_method_names(names: Sequence[str]) -> list[str]:
    """The methods of ``names`` that are fitted or tuned on data, told by name before any data loads: the
    head types (:data:`_HEAD_KINDS`) and the method classes whose ``learned`` is set (``wbf_tuned``)."""
    return [n for n in names if n != "single" and (n in _HEAD_KINDS or getattr(_lookup(n)[0], "learned", False))]


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
    """One row: COCO metrics plus ``ece`` (None for a method without detections, whose calibration is not
    measured) and ``fusion_ms``, what each fold's fit chose, the reliability
    bins of :func:`~detens.calibration_metrics.detection_calibration` (TP at IoU 0.5), and the pooled
    held-out predictions that every figure of the row was computed from (COCO result dicts at full
    precision, every scored image), so a report can draw curves and break errors down without fusing again.
    """

    metrics: dict[str, float | None]
    fitted: list[dict[str, Any]] = field(default_factory=list)
    calibration: dict[str, Any] = field(default_factory=dict)
    results: list[dict[str, Any]] = field(default_factory=list, repr=False)


def cross_validate(
    predictions: EnsemblePredictions,
    methods: Sequence[str],
    k: int = 2,
    seed: int = 0,
    backend: str = "pycocotools",
    method_options: dict[str, dict[str, Any]] | None = None,
    on_method: Callable[[str, MethodResult], None] | None = None,
    fit_on: EnsemblePredictions | None = None,
    clock: Callable[[], float] = time.perf_counter,
    all_images: bool = False,
    calibration_checks: dict[tuple[int, ...], dict[str, str | None]] | None = None,
    max_det: int | None = None,
    done: Mapping[str, MethodResult] | None = None,
) -> dict[str, MethodResult]:
    """Score every method on pooled held-out predictions; see the module docstring.

    Args:
        predictions (EnsemblePredictions): the N models' saved predictions and the ground truth; every
            annotated image of ``predictions.gt`` is scored (images left out there, which the cache could
            not read, are neither scored nor fitted on), every image with ``all_images``.
        methods (list[str]): method names (``single`` expands to every model).
        k (int): folds (>= 2); 0: no cross-validation, learned and tuned methods are fitted on
            ``fit_on`` alone and score every image of ``predictions`` (fit on one dataset, score on another);
            without ``fit_on``, fixed methods only, each scoring every image once.
        seed (int): fixes the folds.
        backend (str): COCO evaluator for the reported figures (tuning always uses the fast one).
        method_options (dict[str, dict]): extra constructor options per method name.
        fit_on (EnsemblePredictions | None): more fitting images (same categories, the same models in any
            order, none of the scored images): joined to the fitting side of every fold, never scored.
            Required when ``k`` is 0 and a method is learned or tuned.
        clock (Callable[[], float]): the timer of ``fusion_ms``, in seconds.
        all_images (bool): score and fit on the images without annotations too, of ``predictions`` and of
            ``fit_on``, as negative images (their detections are false positives), as a COCOeval over
            every image of the file does; by default they are left out. They join the folds apart
            (:func:`~detens.folds.kfold_image_splits`' ``negative_ids``): the annotated images keep the
            folds of the default run.
        calibration_checks (dict | None): the answers of the fitting data's calibration check
            (:func:`~detens.heads.check_fit_data`), kept by the fitting images for calls on the same
            ``predictions`` and ``fit_on`` with other fold seeds, whose folds cover the same fitting images: one
            pass over them per calibration target for every seed. None: this call's own.
        max_det (int | None): score each method's (each member's) ``max_det`` highest-scoring boxes of an
            image (COCO's detection challenge takes 100), also where a method chooses its settings on the
            fitting images (:meth:`EvaluationData.score`, and a head's ``score_max_det``: its matching IoU,
            median box, bags, fuser after calibration). None: every box, cut by COCOeval to 100 per image
            *and category* only.
        done (Mapping[str, MethodResult] | None): rows an earlier call with the same inputs and options
            finished: taken as they are (each method is still built and checked), not run again, and not
            passed to ``on_method``.

    Returns:
        dict[str, MethodResult]: per method its metrics (``map`` ... plus ``fusion_ms``: the mean time of
        one image's fusion, inputs built beforehand, one-time costs left out: see :func:`_predict_images`),
        for learned methods what each fold's fit chose, and the pooled predictions that were scored.

    Raises:
        ValueError: ``k`` is 0 without ``fit_on`` and a method is learned or tuned; an unknown
            ``backend``; no annotated image in ``predictions``; ``fit_on`` holds a scored image
            (the same base file name: :func:`~detens.predictions.shared_images`), other categories or not
            every model; a head to fit that calibrates every member's scores (``calibration``, ``deep``) and
            a member without detections (on a ground-truth object) on the fitting images
            (:func:`~detens.heads.check_fit_data`): all before any method runs. A fit's own error names the
            method and the fold it was fitting.
    """
    if backend not in BACKENDS:  # evaluate_coco would say so only after the first method's work
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    annotated_ids = predictions.gt.annotated_image_ids
    if not annotated_ids:  # COCO's AP is undefined without ground truth: refused before any method is fitted
        raise ValueError("the scored data has no annotated image: there is no ground truth to score methods against")
    negative_ids = predictions.gt.unannotated_image_ids if all_images else []
    scored_ids = sorted(annotated_ids + negative_ids)
    extra_ids: list[int] = []
    fitting = "the fitting data" if k == 0 else "the extra fitting data"  # without folds, fit_on is all of it
    if fit_on is not None:
        _check_fitting_images_unscored(predictions, fit_on, all_images, fitting)
        if not fit_on.gt.annotated_image_ids:
            raise ValueError(f"{fitting} has no annotated image")
        predictions, extra_ids = join_predictions(predictions, fit_on, all_images=all_images, what=fitting)
    names = expand_methods(methods, predictions.model_names)
    folds = [(extra_ids, scored_ids)] if k == 0 else [
        (train + extra_ids, test) for train, test in kfold_image_splits(annotated_ids, k, seed, negative_ids)
    ]
    data = EvaluationData(predictions, scored_ids, sorted({i for train, _ in folds for i in train}), max_det)
    if calibration_checks is not None:
        data.calibration_checks = calibration_checks.setdefault(tuple(data.fit_ids), {})
    method_options = method_options or {}
    # Every method is built before any runs, so a bad option or head file fails before hours of work.
    built = {name: build_method(name, data.model_names, **method_options.get(name, {})) for name in names}
    if k == 0 and fit_on is None and any(method.learned for method in built.values()):
        raise ValueError("k=0 (no cross-validation) needs fit_on: the dataset that learned and tuned methods fit on")
    for method in built.values():
        method.check_data(data)
    report: dict[str, MethodResult] = {}
    for name in names:
        if done is not None and name in done:  # finished by an earlier run of the same evaluation
            report[name] = done[name]
            continue
        options = method_options.get(name, {})
        method = built[name]
        plan = folds if method.learned else [([], scored_ids)]
        results, fitted, predict_seconds, predicted = [], [], 0.0, 0
        for fold, (train_ids, test_ids) in enumerate(plan, 1):
            if method.learned:
                method = build_method(name, data.model_names, **options)
                try:
                    method.fit(data, train_ids)
                except ValueError as err:
                    # a fit names its images by their number only: which method and fold failed is said here
                    where = f"fitted on the {len(train_ids)} images of {fitting}" if k == 0 else (
                        f"fold {fold} of {k}, fitted on its {len(train_ids)} training images ({len(test_ids)} held out)"
                    )
                    raise ValueError(f"{name}, {where}: {err}") from None
                fitted.append(method.describe())
            fold_results, seconds = _predict_images(method, data, test_ids, clock)
            results += fold_results
            predict_seconds += seconds
            predicted += len(test_ids)
        metrics = evaluate_coco(data.gt, results, image_ids=scored_ids, backend=backend)
        calibration = detection_calibration(data.gt, results, image_ids=scored_ids)
        # of no detection there is no calibration to measure: not a perfect one
        metrics["ece"] = calibration["ece"] if calibration["count"] else None
        metrics["fusion_ms"] = 1e3 * predict_seconds / max(predicted, 1)
        report[name] = MethodResult(metrics, fitted, calibration, results)
        if on_method is not None:
            on_method(name, report[name])
    return report


def _predict_images(
    method: EvalMethod, data: EvaluationData, image_ids: Sequence[int], clock: Callable[[], float]
) -> tuple[list[dict[str, Any]], float]:
    """``method``'s COCO results on ``image_ids`` and the seconds (by ``clock``) its fusion took.

    The first image is fused once untimed before the timed pass: one-time costs (loading the compiled
    kernels: about half a second on the first WBF call of a process, ~1 ms per image afterwards; the first
    call of a freshly fitted head) would otherwise land in the figure of whichever method pays them first.
    """
    if image_ids:
        method.predict(data, image_ids[0])
    results, seconds = [], 0.0
    for image_id in image_ids:
        data.per_model(image_id)  # build (and cache) the inputs outside the timed region
        start = clock()
        fused = method.predict(data, image_id)
        seconds += clock() - start
        results += detections_to_coco(data.cut(fused), image_id, decimals=None)
    return results, seconds


def _check_fitting_images_unscored(
    predictions: EnsemblePredictions, fit_on: EnsemblePredictions, all_images: bool = False,
    what: str = "the extra fitting data",
) -> None:
    """Raise ``ValueError`` if the fitting data ``fit_on`` (``what``, for the message) holds an image that
    ``predictions`` scores: a method fitted on it would be scored on it too, and its figure would not be
    held out. The annotated images of either side are compared; every image with ``all_images`` (where
    those without annotations are scored and fitted on too)."""
    if all_images:
        shared = shared_images(predictions, fit_on, predictions.gt.image_ids, fit_on.gt.image_ids)
    else:
        shared = shared_images(predictions, fit_on)
    if shared:
        phrase = shares_images_phrase(shared, "the scored data", annotated=not all_images)
        raise ValueError(
            f"{what} {phrase}; the fitting data "
            "must not contain scored images, or methods are scored on images they were fitted on: remove them from "
            "the fitting data (or, if they are different images, give them different file names)"
        )


def summarize_repeats(runs: dict[int, dict[str, dict[str, float]]]) -> dict[str, dict[str, Any]]:
    """The tables of repeated cross-validations (one per fold seed) as one table.

    Args:
        runs (dict[int, dict[str, dict[str, float]]]): ``{seed: {method: {metric: value}}}``, every seed
            with the same methods (the metric keys of :func:`cross_validate`).

    Returns:
        dict[str, dict]: per method (in the first run's order) the mean over the seeds of every metric
        (None where a seed did not measure it), ``map_sd`` (the sample standard deviation of ``map`` over
        the seeds; 0 for one seed) and ``map_by_seed`` (``{seed: map}``).
    """
    if not runs:
        raise ValueError("summarize_repeats needs at least one run")
    methods = list(next(iter(runs.values())))
    for seed, table in runs.items():
        if list(table) != methods:
            raise ValueError(f"the run of seed {seed} has the methods {list(table)}, the first run {methods}")
    summary: dict[str, dict[str, Any]] = {}
    for method in methods:
        rows = [runs[seed][method] for seed in runs]
        keys = [key for key in rows[0] if all(key in row for row in rows)]
        # None: not measured (the ECE of no detection) in some seed, so not in the mean
        measured = [key for key in keys if all(row[key] is not None for row in rows)]
        values = {key: np.array([row[key] for row in rows], dtype=np.float64) for key in measured}
        summary[method] = {key: float(values[key].mean()) if key in values else None for key in keys}
        maps = values["map"]
        summary[method]["map_sd"] = float(maps.std(ddof=1)) if maps.size > 1 else 0.0
        summary[method]["map_by_seed"] = {int(seed): float(runs[seed][method]["map"]) for seed in runs}
    return summary
