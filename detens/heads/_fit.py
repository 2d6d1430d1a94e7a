"""Fitting every fusion head on saved predictions and COCO ground truth: one entry, :func:`fit_head`.

Dimension legend: N models, C clusters (of one image, or of all training images concatenated), G
ground-truth boxes of one image, F features.

Every head type trains through :data:`TRAINERS` (head type → :class:`Trainer`: its config dataclass,
default config and training function), so ``detens train``, the cross-validation harness and user code
call the same ``fit_head(kind, predictions, image_ids, config)``:

- ``theta`` / ``theta_seed``: the Θ head (seed 000) trained by its analytic gradients
  (:func:`train_theta`); ``theta_seed`` is the seed paper's exact formulation;
- ``selection``, ``deep``, ``superlearner``: the network heads (:func:`train_head`);
- ``calibration``: per-model isotonic score calibration (MoCaE) before a fixed fuser.

The flow for the cluster-based heads: the models' boxes are matched into clusters once per image
(``detens.match``) and paired with the image's ground truth (:func:`build_samples`); targets are assigned
from the head's current fused boxes (COCO-style greedy matching by fused score). Only the clusters are
kept per image, so memory grows with the number of matched objects, not with the prediction files.
With ``match_iou_grid`` one head is trained per matching IoU and the one with the best mAP on the
TRAINING images is kept (:func:`fit_with_match_iou_search`). With ``bags_grid`` the number of bootstrap
fits averaged is chosen among those values by a cross-validation INSIDE the training images
(:func:`choose_by_inner_cv`): more fits lower a network head's variance but not always its error, and
only held-out images can tell.

The network heads (:func:`train_head`):

1. every training image's clusters go through the head's feature extractor once (features depend on the
   predictions only, never on the parameters); the feature standardization is fitted on them;
2. targets are assigned from the untrained head's fused boxes and scores, COCO-style
   (:func:`score_targets`): the matched GT box (for the box loss), the crowd-ignored clusters, and the
   score target: ``"matched"`` (1 for a match at ``target_iou``, else 0) or ``"iou_fraction"`` (the
   fraction of the COCO IoU thresholds 0.50:0.05:0.95 at which the fused box is a true positive);
   ``reassign_every`` re-assigns them from the current head every that many epochs;
3. the clusters of all images are pooled and shuffled into mini-batches of ``batch_clusters``; Adam(W)
   minimizes the head's loss. Everything is seeded by ``config.seed`` (initialization, shuffling, the
   knapsack layer's noise), so training is deterministic on the CPU.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from detens.checks import (
    check_choice,
    check_device,
    check_distinct_integers,
    check_flag,
    check_integer,
    check_integers,
    check_max_det,
    check_real,
    check_reals,
    check_seed,
)
from detens.heads._io import ground_truth_label_space
from detens.matching import Clusters, match
from detens.predictions import EnsemblePredictions
from detens.targets import Targets, assign_targets

__all__ = [
    "ImageSample",
    "TrainHistory",
    "ThetaTrainConfig",
    "theta_seed_config",
    "HeadTrainConfig",
    "CalibrationTrainConfig",
    "DeepTrainConfig",
    "SelectionTrainConfig",
    "SuperLearnerTrainConfig",
    "Trainer",
    "TRAINERS",
    "COCO_IOU_THRESHOLDS",
    "build_samples",
    "assign_all_targets",
    "score_targets",
    "train_theta",
    "train_head",
    "train_network_head",
    "make_head",
    "NETWORK_HEADS",
    "config_for",
    "fit_with_match_iou_search",
    "choose_by_inner_cv",
    "calibration_target",
    "check_fit_data",
    "fit_head",
]

logger = logging.getLogger(__name__)

@dataclass(eq=False)
class ImageSample:
    """The clusters of one image and its ground truth.

    Args:
        image_id (int): the COCO image id.
        clusters (Clusters): ``preds (Tensor[C, N, 5])`` ...
        gt_boxes (Tensor[G, 4]): xyxy pixels. gt_labels (Tensor[G]). gt_iscrowd (Tensor[G] bool).
    """

    image_id: int
    clusters: Clusters
    gt_boxes: Tensor
    gt_labels: Tensor
    gt_iscrowd: Tensor


@dataclass
class ThetaTrainConfig:
    """Training settings of the Θ head; ``configs/train/theta.yaml`` documents every key.

    The defaults are the settings that fuse well (the normalized box, the matching IoU chosen on the
    training images); :func:`theta_seed_config` is the seed paper's exact formulation.
    """

    match_iou: float = 0.55
    match_iou_grid: list[float] = field(default_factory=lambda: [0.6, 0.65, 0.7])
    target_iou: float = 0.5
    per_class: bool = False
    normalize_box: bool = True
    shrinkage: float = 0.01
    lambda_reg: float = 1.0
    lambda_cls: float = 1.0
    lambda_cons: float = 1.0
    eps: float = 1e-6
    optimizer: Literal["gd", "adam"] = "gd"
    lr: float = 0.1
    epochs: int = 60
    batch_images: int = 0
    reassign_every: int = 0
    seed: int = 0
    device: str = "cpu"
    score_max_det: int | None = None

    def __post_init__(self) -> None:
        for name in ("match_iou", "target_iou"):
            check_real(getattr(self, name), name, 0.0, 1.0, low_open=True, high_open=True)
        self.match_iou_grid = check_reals(self.match_iou_grid, "match_iou_grid", 0.0, 1.0, low_open=True, high_open=True)
        self.score_max_det = check_max_det(self.score_max_det, "score_max_det")
        for name in ("per_class", "normalize_box"):
            check_flag(getattr(self, name), name)
        for name in ("shrinkage", "lambda_reg", "lambda_cls", "lambda_cons"):
            check_real(getattr(self, name), name, 0.0)
        if self.lambda_reg == self.lambda_cls == self.lambda_cons == 0:  # each alone at 0 is an ablation
            raise ValueError("lambda_reg, lambda_cls and lambda_cons are all 0: the loss would be 0 and Θ saved as "
                             "initialized, as if fitted; give one of them above 0")
        check_real(self.eps, "eps", 0.0, 0.5, low_open=True, high_open=True)  # ThetaHead's own bounds
        check_choice(self.optimizer, "optimizer", ("gd", "adam"))
        check_real(self.lr, "lr", 0.0, low_open=True)
        check_integer(self.epochs, "epochs", 1)  # 0: the head as initialized, saved as if fitted
        for name in ("batch_images", "reassign_every"):
            check_integer(getattr(self, name), name, 0)
        check_seed(self.seed)
        self.device = check_device(self.device)


def theta_seed_config(**overrides: Any) -> ThetaTrainConfig:
    """The seed paper's exact Θ: A = ŶᵀΘ (no box normalization), a fixed matching IoU, 200 epochs of
    full-batch gradient descent (``configs/train/theta_seed.yaml`` mirrors it)."""
    return ThetaTrainConfig(**{"normalize_box": False, "match_iou_grid": [], "epochs": 200, **overrides})


def build_samples(
    data: EnsemblePredictions,
    image_ids: Sequence[int] | None = None,
    match_iou: float = 0.55,
    device: torch.device | str = "cpu",
    progress: Callable[[int], None] | None = None,
) -> list[ImageSample]:
    """Match every image's predictions into clusters and pair them with its ground truth.

    Images with no cluster and no ground truth carry no signal and are skipped.

    Raises:
        ValueError: an image id that is not in the ground truth (naming up to 10 of them).
    """
    if image_ids is not None:
        data.gt.check_has_images(image_ids)
    samples = []
    for image_id in data.image_ids if image_ids is None else image_ids:
        per_model = [d.to(device) for d in data.per_model(image_id)]
        clusters = match(per_model, iou_thr=match_iou)
        gt_boxes, gt_labels, gt_iscrowd = (t.to(device) for t in data.gt.targets(image_id))
        if len(clusters) or len(gt_boxes):
            samples.append(ImageSample(int(image_id), clusters, gt_boxes, gt_labels, gt_iscrowd))
        if progress is not None:
            progress(1)
    return samples


@torch.no_grad()
def assign_all_targets(head: torch.nn.Module, samples: Sequence[ImageSample], target_iou: float) -> list[Targets]:
    """Targets of every sample from the head's current fused boxes and scores."""
    targets = []
    for s in samples:
        boxes, scores = head(s.clusters)
        targets.append(
            assign_targets(s.clusters, boxes, scores, s.gt_boxes, s.gt_labels, iou_thr=target_iou, gt_iscrowd=s.gt_iscrowd)
        )
    return targets


@dataclass
class TrainHistory:
    """Loss per epoch (mean J over the epoch's batches), wall time, and what an inner cross-validation
    chose (``selection``: empty, or the option searched, its candidates' held-out mAPs and the folds)."""

    loss: list[float] = field(default_factory=list)
    seconds: float = 0.0
    selection: dict[str, Any] = field(default_factory=dict)


def train_theta(
    samples: Sequence[ImageSample],
    model_names: Sequence[str],
    config: ThetaTrainConfig,
    on_epoch: Callable[[int, float], None] | None = None,
):
    """Train a :class:`~detens.heads.theta.ThetaHead` on ``samples``; deterministic for ``config.seed``.

    A fit that diverged is an error, not a head: the objective J became non-finite, or J of all the training
    images on the targets of the last assignment ended above J of the Θ those targets were assigned from.
    Gradient steps that are small enough lower J on fixed targets, so a rise means ``config.lr`` overshoots
    (too large a step drives every θᵢ to the floor ``eps`` and every fused score to 0, or Θ to huge values).
    Rises within float rounding (the square root of the dtype's machine epsilon, relative) are not counted.
    With mini-batches (``config.batch_images``) that J is summed batch by batch (:func:`_objective_in_batches`),
    so the check needs no more memory than a training step.

    Returns:
        (ThetaHead, TrainHistory)

    Raises:
        ValueError: no samples. FloatingPointError: the fit diverged; the message names the learning rate.
    """
    from detens.heads.theta import ThetaHead, make_optimizer

    if not samples:
        raise ValueError("no training images: every image lacked both predictions and ground truth")
    torch.manual_seed(config.seed)
    class_ids = None
    if config.per_class:
        # Only classes with clusters get a row of their own: a class seen only as ground truth has no cluster
        # to move its row, which would stay near its initial 1/N instead of falling back to the global Θ.
        seen = torch.cat([s.clusters.labels for s in samples])
        class_ids = sorted(int(i) for i in seen.unique().tolist())
    head = ThetaHead(
        model_names,
        per_class=config.per_class,
        class_ids=class_ids,
        normalize_box=config.normalize_box,
        eps=config.eps,
        lambda_reg=config.lambda_reg,
        lambda_cls=config.lambda_cls,
        lambda_cons=config.lambda_cons,
        shrinkage=config.shrinkage,
        match_iou=config.match_iou,
    ).to(config.device)
    optimizer = make_optimizer(head, config.optimizer, config.lr)
    order_rng = random.Random(config.seed)
    batch = config.batch_images or len(samples)
    history = TrainHistory()
    start = time.perf_counter()
    full_batch = None  # every sample stacked, only when that is the training batch
    reference = None  # (epoch, J) of the Θ the current targets were assigned from, on all training images

    def objective_on_all_samples() -> float:
        if full_batch is not None:
            with torch.no_grad():
                return float(head.loss_on_batch(*full_batch))
        # mini-batches: stacking every sample only to score them would cost the memory that batching saves
        return _objective_in_batches(head, samples, targets, batch)

    setting = f"{config.optimizer}, lr={config.lr:g}"
    for epoch in range(config.epochs):
        if epoch == 0 or (config.reassign_every and epoch % config.reassign_every == 0):
            targets = assign_all_targets(head, samples, config.target_iou)
            if batch >= len(samples):
                full_batch = head.stack_batch([s.clusters for s in samples], targets)
            reference = (epoch, objective_on_all_samples())
        order = list(range(len(samples)))
        if batch < len(samples):
            order_rng.shuffle(order)
        losses = []
        for begin in range(0, len(order), batch):
            chosen = order[begin : begin + batch]
            if batch >= len(samples):  # the seed's full-batch rule: stack once, reuse every epoch
                stacked = full_batch
            else:
                stacked = head.stack_batch([samples[i].clusters for i in chosen], [targets[i] for i in chosen])
            optimizer.zero_grad()
            loss = head.loss_on_batch(*stacked)
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"the Θ objective became {float(loss.detach())} at epoch {epoch} ({setting}); "
                    "lower the learning rate"
                )
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        history.loss.append(sum(losses) / len(losses))
        if on_epoch is not None:
            on_epoch(epoch, history.loss[-1])
    if reference is not None:
        final = objective_on_all_samples()
        if not all(bool(torch.isfinite(p).all()) for p in head.parameters()) or not math.isfinite(final):
            raise FloatingPointError(f"the Θ weights became non-finite after {config.epochs} epochs ({setting}); "
                                     "lower the learning rate")
        rounding = torch.finfo(head.theta.dtype).eps ** 0.5
        if final > reference[1] + rounding * abs(reference[1]):
            raise FloatingPointError(
                f"the Θ fit diverged: its objective on the training images rose from {reference[1]:.6g} "
                f"(epoch {reference[0]}) to {final:.6g} (after epoch {config.epochs - 1}) on the same targets "
                f"({setting}, Θ = {[round(v, 6) for v in head.theta.tolist()]}); lower the learning rate"
            )
    history.seconds = time.perf_counter() - start
    return head, history


@torch.no_grad()
def _objective_in_batches(
    head: torch.nn.Module, samples: Sequence[ImageSample], targets: Sequence[Targets], batch_images: int
) -> float:
    """J of the Θ head on all ``samples`` and their ``targets``, stacking ``batch_images`` samples at a time.

    Each batch gives its sum of J over the clusters that count and their number; J is the sum of the sums
    divided by the sum of the numbers, plus the shrinkage pull: ``head.loss_on_batch`` of every sample
    stacked (a mean over all clusters, not a mean of the batches' means), to float rounding, in the memory
    of one batch. No sample, or no cluster that counts: the pull alone.

    Args:
        head (ThetaHead): the head whose J it is.
        samples (list[ImageSample]), targets (list[Targets]): one per image, in the same order.
        batch_images (int): samples per batch, >= 1.

    Returns:
        float: J.
    """
    if len(samples) != len(targets):
        raise ValueError(f"got {len(samples)} samples but {len(targets)} targets; one per image")
    check_integer(batch_images, "batch_images", 1)
    total, count = 0.0, 0
    for begin in range(0, len(samples), batch_images):
        chosen = slice(begin, begin + batch_images)
        stacked = head.stack_batch([s.clusters for s in samples[chosen]], list(targets[chosen]))
        part, counted = head.objective_sum(*stacked)
        total, count = total + float(part), count + counted
    return total / max(count, 1) + float(head.shrinkage_pull())


def _pooled_map(
    gt: Any, fused: Iterable[tuple[int, Any]], image_ids: Sequence[int], max_det: int | None = None
) -> float:
    """COCO mAP (the fastest installed evaluator) of ``(image_id, Detections)`` pairs pooled over ``image_ids``,
    each image's ``max_det`` highest-scoring boxes (None: all of them)."""
    from detens.coco import detections_to_coco, evaluate_coco, fastest_backend
    from detens.fusers import highest_scoring

    results = []
    for image_id, detections in fused:
        results += detections_to_coco(highest_scoring(detections, max_det), image_id, decimals=None)
    return evaluate_coco(gt, results, image_ids=image_ids, backend=fastest_backend())["map"]


def fit_with_match_iou_search(
    train: Callable[[list[ImageSample], Any], tuple[Any, TrainHistory]],
    predictions: EnsemblePredictions,
    image_ids: Sequence[int],
    config: Any,
    progress: Callable[[int], None] | None = None,
):
    """Build the samples of ``image_ids`` and ``train(samples, config)`` a head; with
    ``config.match_iou_grid`` also choose the matching IoU.

    For each IoU of the grid a head is trained and scored (COCO mAP of its fused boxes) on the SAME
    training images; the best IoU wins and is written into the returned config. Held-out images are
    never looked at, so the choice is safe inside cross-validation.

    Args:
        config: a training config with ``match_iou``, ``match_iou_grid`` and ``device`` fields.

    Returns:
        (head, TrainHistory, config): the head, its history, the config it was trained with.
    """
    grid = list(config.match_iou_grid) or [config.match_iou]
    best = None
    for match_iou in grid:
        trial_config = replace(config, match_iou=match_iou, match_iou_grid=[])
        samples = build_samples(predictions, image_ids, match_iou, config.device, progress=progress)
        head, history = train(samples, trial_config)
        if len(grid) == 1:
            return head, history, trial_config
        with torch.no_grad():
            fused = ((s.image_id, head.fuse(s.clusters)) for s in samples)
            train_map = _pooled_map(predictions.gt, fused, image_ids, config.score_max_det)
        logger.info("%s head, match_iou %.2f: training mAP %.4f", type(head).__name__, match_iou, train_map)
        if best is None or train_map > best[0]:
            best = (train_map, head, history, trial_config)
    return best[1], best[2], best[3]


#: Model names of the head that a network config builds to check its options (the real ones come with the data).
_PROBE_MODELS = ("model0", "model1")
#: Models of the calibration head that a calibration config builds to check its fusers' options.
_PROBE_ENSEMBLE_SIZE = 32
#: The most parameters a network head's config may ask for (1.6 GB to fit, with gradients and Adam's state).
MAX_HEAD_PARAMETERS = 100_000_000

#: The IoU thresholds of COCO mAP@[.5:.95].
COCO_IOU_THRESHOLDS: tuple[float, ...] = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))
SCORE_TARGETS = ("matched", "iou_fraction")


@dataclass
class HeadTrainConfig:
    """Settings shared by the network heads; the per-head subclasses add and re-default fields.

    Every option is checked when the config is made, the network ones by the head's own constructor
    (a head built once on the meta device), so a mistake is reported before any data is read.

    Args:
        match_iou (float): the matching IoU of the clusters (``train_head`` uses the clusters it is given;
            :func:`fit_head` builds them with it).
        match_iou_grid (list[float]): :func:`fit_head` trains one head per IoU of the grid and keeps the
            one with the best mAP on the training images (empty: just ``match_iou``).
        target_iou (float): IoU of a GT match for the box target and the ``"matched"`` score target.
        score_target (str): ``"matched"`` or ``"iou_fraction"`` (see the module docstring).
        epochs (int), lr (float), weight_decay (float): AdamW settings (epochs >= 1; weight decay 0: Adam).
        batch_clusters (int): clusters per mini-batch (0: all training clusters in one batch).
        reassign_every (int): re-assign targets from the current head every that many epochs (0: never).
        hidden (int), depth (int), activation (str), class_embed (int), features (list[str] | None):
            the head's network (see :class:`detens.heads._net.NetHead`).
        lambda_box (float): weight of the GIoU box loss.
        bags (int): 1: one head; B > 1: B heads, head b fitted on a bootstrap sample of the training
            images with seed ``seed + b``, averaged (:class:`~detens.heads.bagged.BaggedHead`).
        bags_grid (list[int]): choose ``bags`` among these by an ``inner_folds``-fold cross-validation
            inside the training images (:func:`choose_by_inner_cv`; empty: just ``bags``). With a grid,
            ``bags`` must stay 1: any other value would be overwritten by the choice, so it is an error.
        inner_folds (int): folds of that inner cross-validation (>= 2; unused without ``bags_grid``).
        calibrate (bool): first fit each model's calibration curve (score -> ``calibration_target``) on the
            training images, then fit the head on the calibrated scores; the result is a
            :class:`~detens.heads.calibrated.CalibratedHead` holding both.
        calibration_target (str): what the curves map a score to (unused without ``calibrate``): ``"iou"``,
            the expected IoU of the box with its best-matching object (MoCaE), or ``"tp50"``, the chance that
            it matches an object at IoU 0.5 (:func:`~detens.heads.calibration.fit_calibration`'s ``target``).
            The fit and :func:`check_fit_data` both read it through :func:`calibration_target`.
        seed (int): seeds initialization, shuffling and the knapsack noise.
        device (str): where to train (``"cpu"``, ``"cuda"``, ``"cuda:1"``); a device this machine lacks is a
            ``ValueError`` when the config is made.
        score_max_det (int | None): the choices made by the mAP of the training images (``match_iou_grid``,
            ``median_box: auto``, ``bags_grid``) score each image's ``score_max_det`` highest-scoring fused
            boxes (None: every box); ``detens evaluate --max-det`` sets it.
    """

    #: the head type this config trains (None: the base, whose options every network head takes)
    head_type: ClassVar[str | None] = None

    match_iou: float = 0.55
    match_iou_grid: list[float] = field(default_factory=list)
    target_iou: float = 0.5
    score_target: Literal["matched", "iou_fraction"] = "matched"
    epochs: int = 20
    lr: float = 3e-3
    weight_decay: float = 1e-4
    batch_clusters: int = 2048
    reassign_every: int = 0
    hidden: int = 64
    depth: int = 2
    activation: str = "relu"
    class_embed: int = 0
    features: list[str] | None = None
    lambda_box: float = 1.0
    bags: int = 1
    bags_grid: list[int] = field(default_factory=list)
    inner_folds: int = 2
    calibrate: bool = False
    calibration_target: Literal["iou", "tp50"] = "iou"
    seed: int = 0
    device: str = "cpu"
    score_max_det: int | None = None

    def __post_init__(self) -> None:
        self.calibrate = check_flag(self.calibrate, "calibrate")
        self.score_max_det = check_max_det(self.score_max_det, "score_max_det")
        from detens.heads.calibration import TARGETS

        if not isinstance(self.calibration_target, str) or self.calibration_target not in TARGETS:
            raise ValueError(
                f"calibration_target must be one of {', '.join(TARGETS)}, got {self.calibration_target!r}"
            )
        self.bags = check_integer(self.bags, "bags", 1)
        if not isinstance(self.bags_grid, list):
            raise TypeError(
                f"bags_grid must be a list of integers >= 1, got {type(self.bags_grid).__name__}: {self.bags_grid!r}"
            )
        grid = check_integers(self.bags_grid, "bags_grid")
        if any(b < 1 for b in grid):
            raise ValueError(f"bags_grid must be a list of integers >= 1, got {self.bags_grid!r}")
        self.bags_grid = sorted(set(grid))
        if self.bags_grid and self.bags != 1:
            # the inner cross-validation overwrites bags with its choice, so a value given here is silently lost
            raise ValueError(
                f"bags {self.bags} would not be used: the head chooses bags among bags_grid {self.bags_grid} by an "
                "inner cross-validation; give bags_grid: [] to fix it, or list the values to choose among"
            )
        check_integer(self.inner_folds, "inner_folds", 2)
        for name in ("match_iou", "target_iou"):
            check_real(getattr(self, name), name, 0.0, 1.0, low_open=True, high_open=True)
        self.match_iou_grid = check_reals(self.match_iou_grid, "match_iou_grid", 0.0, 1.0, low_open=True, high_open=True)
        if self.score_target not in SCORE_TARGETS:
            raise ValueError(f"score_target must be one of {', '.join(SCORE_TARGETS)}, got {self.score_target!r}")
        check_integer(self.epochs, "epochs", 1)  # 0: the head as initialized, saved as if fitted
        # depth 0 is a linear head, no hidden layer
        for name in ("batch_clusters", "reassign_every", "class_embed", "depth"):
            check_integer(getattr(self, name), name, 0)
        check_real(self.lr, "lr", 0.0, low_open=True)
        for name in ("weight_decay", "lambda_box"):
            check_real(getattr(self, name), name, 0.0)
        check_seed(self.seed)
        self.device = check_device(self.device)
        self._check_head_options()

    def _check_head_options(self, model_names: Sequence[str] = _PROBE_MODELS) -> None:
        """Build the head once on the meta device (no memory, no data), so that its constructor's checks of
        the network options (box, members, k, epsilon, activation, features, ...) fail when the config is
        made, not when the first fit builds the head, after other methods of an evaluation have run; again
        for the ensemble's ``model_names`` (:func:`check_fit_data`), where a check depends on them (a feature
        list that selects no column for these models)."""
        from detens.heads._net import NetHead
        from detens.heads._registry import HEADS

        options = self.head_options()
        if self.head_type is None:  # no head type: the options every network head takes
            head_class = NetHead
            options.pop("lambda_box")
        else:
            head_class = HEADS.get(self.head_type)
        with torch.device("meta"):
            head = head_class(list(model_names), **options)
        size = sum(parameter.numel() for parameter in head.parameters())
        if size > MAX_HEAD_PARAMETERS:
            shown = ", ".join(f"{key} {options[key]}" for key in ("hidden", "depth", "class_embed") if key in options)
            raise ValueError(
                f"the head's networks would hold {size:,} parameters ({shown}), more than the {MAX_HEAD_PARAMETERS:,} "
                "a fit allocates (with its gradients and optimizer state, 16 bytes each); the shipped heads hold "
                "thousands: give smaller sizes"
            )

    def head_options(self) -> dict[str, Any]:
        """Constructor options of the head (the network fields of this config)."""
        return {
            "features": self.features,
            "class_embed": self.class_embed,
            "hidden": self.hidden,
            "depth": self.depth,
            "activation": self.activation,
            "lambda_box": self.lambda_box,
            "match_iou": self.match_iou,
        }


@dataclass
class DeepTrainConfig(HeadTrainConfig):
    """The deep ensemble head: IoU-aware score target, few epochs (the head starts as ``mean`` scoring).

    Defaults: calibrated member scores and the learned box, chosen by 2-fold cross-validation inside the
    tuning images (coco_val2017_extra), where on each of three ensembles they were at least as good as raw
    scores with the score-weighted box (three YOLOs +0.2 mAP points, YOLO26n + YOLOX-Nano + NanoDet-m +2.2,
    all six detectors +0.9).

    Args:
        box (str): ``"score_weighted"``, ``"mean"`` or ``"learned"`` (see :mod:`detens.heads.deep`).
        members (int): score MLPs averaged in the head.
        median_box (bool | str): the per-side median box where at least three models see the object
            (:mod:`detens.heads.deep`); ``"auto"``: the head is trained without it, then keeps it if it
            raises the mAP of the training images (:func:`choose_median_box`).
    """

    head_type: ClassVar[str | None] = "deep"

    match_iou_grid: list[float] = field(default_factory=lambda: [0.55, 0.7])
    score_target: Literal["matched", "iou_fraction"] = "iou_fraction"
    epochs: int = 10
    calibrate: bool = True
    box: str = "learned"
    members: int = 1
    median_box: bool | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.median_box, bool) and self.median_box != "auto":
            raise ValueError(f"median_box must be true, false or auto, got {self.median_box!r}")

    def head_options(self) -> dict[str, Any]:
        return {**super().head_options(), "box": self.box, "members": self.members,
                "median_box": self.median_box is True}


@dataclass
class SelectionTrainConfig(HeadTrainConfig):
    """The e2e-CEL selection head (IoU-aware score target by default: it measured better than
    ``"matched"`` under cross-validation).

    Args:
        k (int): sub-ensemble size. epsilon (float), num_samples (int), baseline (bool): the knapsack layer.
        combine (str), score (str): how the selected rows are combined (see :mod:`detens.heads.selection`).
        lambda_cls (float): weight of the score BCE.
    """

    head_type: ClassVar[str | None] = "selection"

    score_target: Literal["matched", "iou_fraction"] = "iou_fraction"
    k: int = 2
    epsilon: float = 0.1
    num_samples: int = 32
    baseline: bool = True
    combine: str = "mean"
    score: str = "mean_present"
    lambda_cls: float = 1.0

    def head_options(self) -> dict[str, Any]:
        return {
            **super().head_options(),
            "k": self.k,
            "epsilon": self.epsilon,
            "num_samples": self.num_samples,
            "baseline": self.baseline,
            "combine": self.combine,
            "score": self.score,
            "lambda_cls": self.lambda_cls,
        }


@dataclass
class SuperLearnerTrainConfig(HeadTrainConfig):
    """The Super Learner head: a low learning rate, strong weight decay and few epochs (it starts as
    ``mean`` fusion and overfits the ~100 images of a fold quickly). lambda_cls (float): weight of the
    score BCE."""

    head_type: ClassVar[str | None] = "superlearner"

    match_iou_grid: list[float] = field(default_factory=lambda: [0.55, 0.7])
    epochs: int = 10
    lr: float = 1e-3
    weight_decay: float = 1e-2
    lambda_cls: float = 1.0

    def head_options(self) -> dict[str, Any]:
        return {**super().head_options(), "lambda_cls": self.lambda_cls}


#: network head type → its training config class (the head class is ``detens.heads.HEADS.get(kind)``)
NETWORK_HEADS: dict[str, type[HeadTrainConfig]] = {
    "selection": SelectionTrainConfig,
    "deep": DeepTrainConfig,
    "superlearner": SuperLearnerTrainConfig,
}


def _config_class(kind: str) -> type[HeadTrainConfig]:
    if kind not in NETWORK_HEADS:
        raise ValueError(f"unknown network head {kind!r}; valid: {', '.join(NETWORK_HEADS)}")
    return NETWORK_HEADS[kind]


def make_head(kind: str, model_names: Sequence[str], config: HeadTrainConfig, class_ids: Sequence[int] | None = None):
    """An untrained head of ``kind`` built from the network fields of ``config``."""
    from detens.heads import HEADS

    _config_class(kind)
    return HEADS.get(kind)(model_names, class_ids=class_ids, **config.head_options())


@torch.no_grad()
def score_targets(
    clusters: Clusters,
    boxes: Tensor,
    scores: Tensor,
    gt_boxes: Tensor,
    gt_labels: Tensor,
    gt_iscrowd: Tensor | None = None,
    kind: Literal["matched", "iou_fraction"] = "iou_fraction",
    target_iou: float = 0.5,
) -> tuple[Targets, Tensor]:
    """Targets of one image's clusters from fused boxes and scores.

    Args:
        clusters (Clusters): C clusters. boxes (Tensor[C, 4]) normalized, scores (Tensor[C]): fused.
        gt_boxes (Tensor[G, 4]) pixels, gt_labels (Tensor[G]), gt_iscrowd (Tensor[G] bool | None).
        kind (str): ``"matched"``: the score target is 1 for a match at ``target_iou``, else 0;
            ``"iou_fraction"``: the fraction of :data:`COCO_IOU_THRESHOLDS` at which the cluster is a
            true positive, each threshold matched greedily by score as COCOeval does (so a well-placed
            duplicate can win at a strict threshold where the first box fails).
        target_iou (float): the IoU of the returned :class:`Targets` (box targets, ignore flags).

    Returns:
        (Targets, Tensor[C]): the targets at ``target_iou`` and the score target in [0, 1].
    """
    if kind not in SCORE_TARGETS:
        raise ValueError(f"kind must be one of {', '.join(SCORE_TARGETS)}, got {kind!r}")
    targets = assign_targets(clusters, boxes, scores, gt_boxes, gt_labels, iou_thr=target_iou, gt_iscrowd=gt_iscrowd)
    if kind == "matched":
        return targets, targets.matched.to(targets.boxes.dtype)
    fraction = torch.zeros(len(clusters), dtype=targets.boxes.dtype, device=targets.device)
    for threshold in COCO_IOU_THRESHOLDS:
        at = assign_targets(clusters, boxes, scores, gt_boxes, gt_labels, iou_thr=threshold, gt_iscrowd=gt_iscrowd)
        fraction += at.matched.to(fraction.dtype)
    return targets, fraction / len(COCO_IOU_THRESHOLDS)


def _concat_clusters(items: Sequence[Clusters], num_models: int, device: torch.device) -> Clusters:
    if not items:
        return Clusters.empty(num_models, (1, 1), device)
    return Clusters(
        torch.cat([c.preds for c in items]),
        torch.cat([c.present for c in items]),
        torch.cat([c.labels for c in items]),
        torch.cat([c.source_index for c in items]),
        (1, 1),  # the image sizes differ; the losses use normalized coordinates only
    )


@torch.no_grad()
def _assign(head: Any, samples: Sequence[ImageSample], features: Sequence[Tensor], config: HeadTrainConfig):
    was_training = head.training
    head.eval()
    targets, soft = [], []
    try:
        for s, f in zip(samples, features, strict=True):
            boxes, scores = head.fuse_features(s.clusters, f)
            t, y = score_targets(
                s.clusters, boxes, scores, s.gt_boxes, s.gt_labels, s.gt_iscrowd, config.score_target, config.target_iou
            )
            targets.append(t)
            soft.append(y)
    finally:
        head.train(was_training)
    return targets, soft


def train_head(
    kind: str,
    samples: Sequence[ImageSample],
    model_names: Sequence[str],
    config: HeadTrainConfig | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
):
    """Train a network head on ``samples``; deterministic for ``config.seed`` (on the CPU).

    Args:
        kind (str): ``"selection"`` (e2e-CEL), ``"deep"`` (deep ensemble rescoring) or ``"superlearner"``.
        samples (list[ImageSample]): training images (:func:`build_samples`).
        model_names (list[str]): the ensemble, in the clusters' model order.
        config (HeadTrainConfig | None): the kind's config class (default: its defaults).
        on_epoch (callable | None): called with (epoch, mean loss) after every epoch.

    Returns:
        (head, TrainHistory): the trained head (on ``config.device``, in eval mode) and the mean loss
        per epoch.
    """
    expected = _config_class(kind)
    if config is None:
        config = expected()
    if not isinstance(config, expected):
        raise TypeError(f"a {kind} head trains with {expected.__name__}, got {type(config).__name__}")
    if not samples:
        raise ValueError("no training images: every image lacked both predictions and ground truth")
    device = torch.device(config.device)
    torch.manual_seed(config.seed)
    class_ids = None
    if config.class_embed:
        seen = torch.cat([s.clusters.labels.cpu() for s in samples])
        class_ids = sorted(int(i) for i in seen.unique().tolist())
    head = make_head(kind, model_names, config, class_ids).to(device)
    if kind == "selection":
        head.generator = torch.Generator(device=device).manual_seed(config.seed)

    start = time.perf_counter()
    samples = [
        ImageSample(s.image_id, s.clusters.to(device), s.gt_boxes.to(device), s.gt_labels.to(device), s.gt_iscrowd.to(device))
        for s in samples
    ]
    features = [head.features_of(s.clusters) for s in samples]
    head.fit_normalization(torch.cat(features) if features else torch.zeros(0, head.feature_columns.numel()))

    clusters = _concat_clusters([s.clusters for s in samples], head.num_models, device)
    all_features = torch.cat(features)

    def pool() -> tuple[Targets, Tensor, Tensor]:
        targets, soft = _assign(head, samples, features, config)
        targets_all, soft_all = Targets.cat(targets), torch.cat(soft)
        return targets_all, soft_all, (~targets_all.ignore).nonzero().squeeze(1)

    targets_all, soft_all, rows = pool()
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    order = torch.Generator().manual_seed(config.seed)
    history = TrainHistory()
    head.train()
    for epoch in range(config.epochs):
        if config.reassign_every and epoch and epoch % config.reassign_every == 0:
            targets_all, soft_all, rows = pool()
        batch = config.batch_clusters or max(1, rows.numel())
        permuted = rows[torch.randperm(rows.numel(), generator=order).to(device)]
        losses = []
        for begin in range(0, permuted.numel(), batch):
            index = permuted[begin : begin + batch]
            per_cluster = head.loss_features(clusters[index], all_features[index], targets_all[index], soft_all[index])
            loss = per_cluster.sum() / max(index.numel(), 1)
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"the {kind} loss became {float(loss.detach())} at epoch {epoch} (lr={config.lr:g}); lower the learning rate"
                )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        history.loss.append(sum(losses) / len(losses) if losses else 0.0)
        if on_epoch is not None:
            on_epoch(epoch, history.loss[-1])
        logger.debug("%s head epoch %d: loss %.5f", kind, epoch, history.loss[-1])
    head.eval()
    history.seconds = time.perf_counter() - start
    return head, history


def train_network_head(
    kind: str,
    samples: Sequence[ImageSample],
    model_names: Sequence[str],
    config: HeadTrainConfig,
    on_epoch: Callable[[int, float], None] | None = None,
):
    """:func:`train_head`, or with ``config.bags`` = B > 1 the bagged head of B fits: fit b sees a
    bootstrap sample of ``samples`` (as many images, drawn with replacement by ``config.seed``) and uses
    seed ``config.seed + b``. The history's loss per epoch is the mean over the fits.

    Returns:
        (head, TrainHistory): a network head, or a :class:`~detens.heads.bagged.BaggedHead`.
    """
    if config.bags == 1:
        return train_head(kind, samples, model_names, config, on_epoch)
    from detens.heads.bagged import BaggedHead

    draw = random.Random(config.seed)
    members, histories = [], []
    for b in range(config.bags):
        bootstrap = [samples[draw.randrange(len(samples))] for _ in samples]
        head, history = train_head(kind, bootstrap, model_names, replace(config, bags=1, seed=config.seed + b), on_epoch)
        members.append(head)
        histories.append(history)
    combined = TrainHistory(
        loss=[sum(h.loss[e] for h in histories) / len(histories) for e in range(config.epochs)],
        seconds=sum(h.seconds for h in histories),
    )
    return BaggedHead(members), combined


@dataclass(frozen=True)
class Trainer:
    """How one head type is fitted.

    Args:
        config_class (type): its training config dataclass (``configs/train/<kind>.yaml`` mirrors it).
        default (callable): ``(**overrides) -> config``: the default config (the good settings).
        fit (callable): ``(predictions, image_ids, config, progress, on_epoch) -> (head, TrainHistory,
            config)``; the returned config is the one the head was trained with (e.g. the chosen IoU).
    """

    config_class: type
    default: Callable[..., Any]
    fit: Callable[..., tuple[Any, TrainHistory, Any]]


#: head type → :class:`Trainer`; every type of :data:`detens.heads.HEADS` that can be fitted is here.
TRAINERS: dict[str, Trainer] = {}


def config_for(kind: str, **overrides: Any) -> Any:
    """The default training config of ``kind`` with ``overrides`` (unknown keys are an error)."""
    trainer = _trainer(kind)
    names = {f.name for f in fields(trainer.config_class)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ValueError(f"unknown {kind} training options {unknown}; valid: {', '.join(sorted(names))}")
    return trainer.default(**overrides)


def train_config_from(kind: str, *layers: tuple[str, dict[str, Any] | None]) -> Any:
    """The training config of ``kind`` from what a user gave: the head type's own defaults (``theta_seed``'s,
    not the plain ``theta`` ones), then each ``(where, keys)`` layer on top in order (a YAML file, then
    ``--set`` flags).

    Unknown keys and wrong types are a ``ValueError``/``TypeError`` naming the layer. So is a layer that
    gives ``match_iou`` without ``match_iou_grid`` (or ``bags`` without ``bags_grid``) while the grid it
    lands on is not empty: the search over the grid would overwrite it.
    """
    from detens.config import from_dict

    trainer = _trainer(kind)
    config = config_for(kind)
    data = asdict(config)
    for where, keys in layers:
        keys = dict(keys or {})
        data.update(keys)
        config = from_dict(trainer.config_class, data, where=where)  # each layer's mistakes named by it
        # after the values' own checks: a value out of range is that, whether or not it would be used
        for option, grid_name, chosen_by in [
            ("match_iou", "match_iou_grid", "its matching IoU among match_iou_grid {} on the fitting images"),
            ("bags", "bags_grid", "bags among bags_grid {} by an inner cross-validation on the fitting images"),
        ]:
            grid = data.get(grid_name)
            if option in keys and grid_name not in keys and grid:
                raise ValueError(
                    f"{where}: {option} {keys[option]} would not be used: the {kind} head chooses "
                    f"{chosen_by.format(list(grid))}; also give {grid_name}: [] to fix it, or list the values to "
                    "choose among"
                )
    return config


def load_train_config(
    kind: str,
    path: str | None = None,
    overrides: dict[str, Any] | None = None,
    flags: dict[str, Any] | None = None,
    overrides_name: str = "--set",
) -> Any:
    """The training config of ``kind``: :func:`train_config_from` with the YAML file ``path`` (a path, or the
    name of a shipped one such as ``deep``) if given, then ``overrides`` (``--set`` flags, a layer named
    ``overrides_name``), then ``flags`` (a command's own flags for config keys, ``{"lr": 0.01}`` from
    ``--lr``, each a layer named by its flag).

    Raises:
        FileNotFoundError: no such file. ValueError: its top level is not a mapping, or a
            key is given both in ``overrides`` and in ``flags`` (one of the two would be dropped unseen).
    """
    if clashes := sorted(set(overrides or {}) & set(flags or {})):
        key = clashes[0]
        raise ValueError(
            f"--{key} {flags[key]} and {overrides_name} {key}={overrides[key]} both set {key}: give one of them"
        )
    from detens.config import read_yaml_file
    from detens.packaged import find_packaged

    layers: list[tuple[str, dict[str, Any] | None]] = []
    if path is not None:
        config_path = find_packaged(path, "train")
        data = read_yaml_file(config_path, "training config")
        if data is None:  # nothing set (comments only): the defaults, as every YAML config of detens reads
            data = {}
        if not isinstance(data, dict):
            raise ValueError(f"{config_path}: the top level must be a mapping, got {type(data).__name__}")
        _check_head_type_of(kind, config_path, data)
        layers.append((str(config_path), data))
    if overrides:
        layers.append((overrides_name, overrides))
    layers += [(f"--{key}", {key: value}) for key, value in (flags or {}).items()]
    return train_config_from(kind, *layers)


def _check_head_type_of(kind: str, path: Any, data: dict[str, Any]) -> None:
    """Refuse a training config written for another head type, naming that type: its keys would otherwise
    be reported one by one as unknown, which hides the mix-up."""
    def options(head: str) -> set[str]:
        return {f.name for f in fields(TRAINERS[head].config_class)}

    if set(data) <= options(kind):
        return
    others = sorted(head for head in TRAINERS if head != kind and set(data) <= options(head))
    if others:
        raise ValueError(
            f"{path} is a training config of a {' / '.join(others)} head (its keys are that type's), not of a "
            f"{kind} head; give a {kind} one (the shipped one is named {kind!r})"
        )
    from detens.ensemble_config import EnsembleConfig

    if "models" in data and set(data) <= {f.name for f in fields(EnsembleConfig)}:
        raise ValueError(
            f"{path} is an ensemble config (its keys are those of detens fuse / detens cache --config), not a "
            f"training config of a {kind} head; give a {kind} one (the shipped one is named {kind!r})"
        )


def _trainer(kind: str) -> Trainer:
    if not isinstance(kind, str):
        raise TypeError(f"head type must be a string, one of {', '.join(sorted(TRAINERS))}; got {type(kind).__name__}")
    if kind not in TRAINERS:
        raise ValueError(f"unknown head type {kind!r}; valid: {', '.join(sorted(TRAINERS))}")
    return TRAINERS[kind]


def fit_head(
    kind: str,
    predictions: EnsemblePredictions,
    image_ids: Sequence[int],
    config: Any = None,
    progress: Callable[[int], None] | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
):
    """Fit a head of type ``kind`` (a name of :data:`TRAINERS`) on ``image_ids`` of ``predictions``.

    Args:
        kind (str): ``theta``, ``theta_seed``, ``selection``, ``deep``, ``superlearner``, ``calibration``.
        predictions (EnsemblePredictions): saved predictions and ground truth; the head's members are
            ``predictions.model_names``.
        image_ids (list[int]): the training images, each once.
        config: the kind's config dataclass (default: :func:`config_for` ``(kind)``).
        progress (callable | None): called with the number of images matched, as matching proceeds.
        on_epoch (callable | None): called with (epoch, mean loss) after every epoch.

    Returns:
        (head, TrainHistory, config): the head, its history, the config it was trained with. The head's
        ``label_space`` is the ground truth's named categories ``{id: name}``, saved with it, so that a
        head used in another label space whose ids name other classes is refused
        (:func:`detens.heads.check_head_label_space`).

    Raises:
        ValueError: an unknown ``kind`` (listing the valid ones), no image id, an image id given more than
            once (it would weigh twice in the fit), or one that is not in the ground truth.
        TypeError: ``predictions`` not of :class:`~detens.predictions.EnsemblePredictions`, ``image_ids`` not
            integers, or ``config`` of another kind's dataclass.
    """
    trainer = _trainer(kind)
    if not all(hasattr(predictions, name) for name in ("gt", "model_names", "per_model")):  # as CalibratedPredictions
        raise TypeError(
            f"predictions must be EnsemblePredictions (EnsemblePredictions.from_folder, or the constructor over "
            f"the members' COCO results), got {type(predictions).__name__}"
        )
    ids = check_distinct_integers(image_ids, "image_ids")
    if not ids:
        raise ValueError(f"no image ids given: a {kind} head is fitted on the training images that image_ids lists")
    predictions.gt.check_has_images(ids)
    config = config if config is not None else trainer.default()
    if not isinstance(config, trainer.config_class):
        raise TypeError(f"a {kind} head trains with {trainer.config_class.__name__}, got {type(config).__name__}")
    head, history, config = trainer.fit(predictions, ids, config, progress, on_epoch)
    head.label_space = ground_truth_label_space(predictions.gt)
    return head, history, config


def calibration_target(config: Any) -> Literal["iou", "tp50"] | None:
    """The target of the calibration curves that a fit with ``config`` fits before anything else (the
    ``target`` of :func:`~detens.heads.calibration.fit_calibration`): the calibration head's ``target``, a
    network head's ``calibration_target`` when it calibrates (``calibrate``); None for a fit without curves.
    The trainers and :func:`check_fit_data` all read it here, so the data checked is the data fitted."""
    if isinstance(config, CalibrationTrainConfig):
        return config.target
    if getattr(config, "calibrate", False):
        return config.calibration_target
    return None


def check_fit_data(
    kind: str,
    predictions: EnsemblePredictions,
    image_ids: Sequence[int],
    config: Any = None,
    answers: dict[str, str | None] | None = None,
) -> None:
    """Refuse ``image_ids`` of ``predictions`` before any fit when a head of type ``kind`` trained with
    ``config`` (default: the kind's default) could not be fitted on them for want of a member's data.

    The calibration head, and a network head with ``calibrate``, fit every member's calibration curve
    (of :func:`calibration_target`), which needs the member's detections, some of them on a ground-truth
    object (:func:`~detens.heads.calibration.check_calibration_data`). The other heads fit with a member that
    never detects anything (it is absent from every cluster), so nothing is checked for them. First, the
    options that depend on the ensemble are checked with its models, by building the head as the fit will
    (a feature list that selects no column for these members, a vote's ``min_votes`` above their number).

    Args:
        answers (dict[str, str | None] | None): what earlier calls found on these same ``predictions`` and
            ``image_ids``, by calibration target: why a member's curve cannot be fitted, or None where every
            curve can. Looked up first and filled in, so that several heads fitting curves of one target
            pass over the images' detections once. None: the data is checked on every call.

    Raises:
        ValueError: naming the head type, why it needs the member's data, and the member; or an option that
            does not fit the ensemble, naming the head type and the models.
        TypeError: ``config`` is not the kind's config class.
    """
    from detens.heads.calibration import check_calibration_data

    trainer = _trainer(kind)
    config = config if config is not None else trainer.default()
    if not isinstance(config, trainer.config_class):
        raise TypeError(f"a {kind} head trains with {trainer.config_class.__name__}, got {type(config).__name__}")
    check_options = getattr(config, "_check_head_options", None)
    if check_options is not None:
        try:
            check_options(predictions.model_names)
        except ValueError as err:
            raise ValueError(f"{kind}, for the models {', '.join(predictions.model_names)}: {err}") from None
    target = calibration_target(config)
    if target is None:
        return
    if answers is None or target not in answers:
        try:
            check_calibration_data(predictions, image_ids, target)
            problem = None
        except ValueError as err:
            problem = str(err)
        if answers is not None:
            answers[target] = problem
    else:
        problem = answers[target]
    if problem is not None:
        why = "" if isinstance(config, CalibrationTrainConfig) else (
            " calibrates every member's scores before it is fitted (calibrate: true; false fits it on the raw scores)"
        )
        raise ValueError(f"{kind}{why}: {problem}")


def choose_by_inner_cv(
    fit: Callable[..., tuple[Any, TrainHistory, Any]],
    predictions: EnsemblePredictions,
    image_ids: Sequence[int],
    candidates: Sequence[Any],
    folds: int,
    seed: int = 0,
) -> tuple[int, list[float]]:
    """Which training config generalizes best, judged on the training images alone.

    The images are split into ``folds`` folds (:func:`detens.folds.kfold_image_splits`, fixed by
    ``seed``); each candidate is fitted on all folds but one and fuses the held-out one, for every fold in
    turn, and the held-out fusions are pooled into one COCO mAP per candidate. Ties keep the earlier
    candidate.

    Args:
        fit (callable): ``(predictions, image_ids, config, progress, on_epoch) -> (head, TrainHistory,
            config)`` (a :class:`Trainer`'s ``fit``).
        candidates (list): the training configs to compare (at least one).

    Returns:
        (int, list[float]): the index of the best candidate and every candidate's held-out mAP.
    """
    from detens.folds import kfold_image_splits
    from detens.fusers import fuse

    if not candidates:
        raise ValueError("choose_by_inner_cv needs at least one candidate config")
    ids = list(image_ids)
    if len(ids) < folds:
        raise ValueError(
            f"an inner {folds}-fold cross-validation needs at least {folds} training images, got {len(ids)}"
        )
    splits = kfold_image_splits(ids, folds, seed)

    def held_out_fusions(candidate: Any) -> Iterator[tuple[int, Any]]:
        for train_ids, held_out in splits:
            head, _, _ = fit(predictions, train_ids, candidate, None, None)
            for image_id in held_out:
                yield image_id, fuse(predictions.per_model(image_id), "theta", head=head)

    scores = [
        _pooled_map(predictions.gt, held_out_fusions(candidate), ids, getattr(candidate, "score_max_det", None))
        for candidate in candidates
    ]
    best = max(range(len(candidates)), key=lambda i: (scores[i], -i))
    return best, scores


def choose_median_box(
    head: Any,
    predictions: EnsemblePredictions,
    image_ids: Sequence[int],
    device: torch.device | str = "cpu",
    max_det: int | None = None,
) -> tuple[bool, dict[bool, float]]:
    """Switch a deep head's (or every bagged member's) per-side median box on if it raises the COCO mAP of
    ``image_ids`` (the training images; each image's ``max_det`` best fused boxes, None: all), off
    otherwise; ties keep it off. The images are matched once (at the head's matching IoU, on ``device``)
    and fused both ways.

    Returns:
        (bool, dict): the choice, and the training mAP with it off and on.
    """
    from detens.heads.bagged import BaggedHead

    deep_heads = list(head.members) if isinstance(head, BaggedHead) else [head]
    samples = build_samples(predictions, image_ids, head.match_iou, device)

    def training_map(on: bool) -> float:
        for member in deep_heads:
            member.median_box = on
        return _pooled_map(predictions.gt, ((s.image_id, head.fuse(s.clusters)) for s in samples), image_ids, max_det)

    maps = {on: training_map(on) for on in (False, True)}
    chosen = maps[True] > maps[False]
    for member in deep_heads:
        member.median_box = chosen
    logger.info("median box: training mAP %.4f off, %.4f on -> %s", maps[False], maps[True], "on" if chosen else "off")
    return chosen, maps


def _cluster_trainer(train: Callable[..., tuple[Any, TrainHistory]]) -> Callable[..., Any]:
    """A :class:`Trainer` ``fit`` that builds the clusters and searches the matching IoU around ``train``
    (and, with ``bags_grid``, chooses the number of bagged fits by an inner cross-validation)."""

    def fit_fixed(predictions, image_ids, config, progress, on_epoch):
        calibration = None
        if getattr(config, "calibrate", False):
            from detens.heads.calibrated import CalibratedPredictions
            from detens.heads.calibration import fit_calibration

            calibration = fit_calibration(predictions, image_ids, target=calibration_target(config))
            predictions = CalibratedPredictions(predictions, calibration)
        head, history, fitted = fit_with_match_iou_search(
            lambda samples, trial: train(samples, predictions.model_names, trial, on_epoch),
            predictions, image_ids, config, progress,
        )
        if getattr(config, "median_box", None) == "auto":
            chosen, _ = choose_median_box(head, predictions, image_ids, config.device, config.score_max_det)
            fitted = replace(fitted, median_box=chosen)
        if calibration is not None:
            from detens.heads.calibrated import CalibratedHead

            head = CalibratedHead(calibration, head)
        return head, history, fitted

    def fit(predictions, image_ids, config, progress, on_epoch):
        grid = getattr(config, "bags_grid", [])
        if not grid:
            return fit_fixed(predictions, image_ids, config, progress, on_epoch)
        start = time.perf_counter()
        candidates = [replace(config, bags=bags, bags_grid=[]) for bags in grid]
        best, scores = choose_by_inner_cv(fit_fixed, predictions, image_ids, candidates, config.inner_folds, config.seed)
        logger.info("bags by %d-fold inner cross-validation: %s -> %d", config.inner_folds,
                    dict(zip(grid, (round(m, 4) for m in scores), strict=True)), grid[best])
        head, history, fitted = fit_fixed(predictions, image_ids, candidates[best], progress, on_epoch)
        history.seconds = time.perf_counter() - start
        history.selection = {"option": "bags", "folds": config.inner_folds,
                             "held_out_map": {str(b): m for b, m in zip(grid, scores, strict=True)}}
        return head, history, fitted

    return fit


TRAINERS["theta"] = Trainer(
    ThetaTrainConfig, ThetaTrainConfig,
    _cluster_trainer(lambda samples, names, config, on_epoch: train_theta(samples, names, config, on_epoch)),
)
TRAINERS["theta_seed"] = Trainer(ThetaTrainConfig, theta_seed_config, TRAINERS["theta"].fit)
for _kind, _config_cls in NETWORK_HEADS.items():
    TRAINERS[_kind] = Trainer(
        _config_cls, _config_cls,
        _cluster_trainer(
            lambda samples, names, config, on_epoch, kind=_kind: train_network_head(kind, samples, names, config, on_epoch)
        ),
    )


@dataclass
class CalibrationTrainConfig:
    """Training settings of the calibration head (MoCaE; ``configs/train/calibration.yaml`` mirrors them).

    Args:
        per_class (bool), shrinkage (float), target (str), tie_break (float): the curves, see
            :func:`detens.heads.calibration.fit_calibration`.
        fusers (list[str]): the fusers that may follow the calibration; the one with the best mAP of the
            calibrated training images is kept (``refine`` is MoCaE's Soft-NMS + score voting).
        fuser_params (dict[str, dict]): parameters of those fusers, by name.
        score_max_det (int | None): the choice of the fuser scores each training image's ``score_max_det``
            highest-scoring fused boxes (None: every box); ``detens evaluate --max-det`` sets it.
    """

    per_class: bool = False
    shrinkage: float = 50.0
    target: Literal["iou", "tp50"] = "iou"
    tie_break: float = 1e-4
    fusers: list[str] = field(default_factory=lambda: ["wbf", "soft_nms", "refine"])
    # empty: each fuser's own defaults (WBF's iou_thr is 0.55), so that any list of fusers is valid as it is
    fuser_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    score_max_det: int | None = None

    def __post_init__(self) -> None:
        self.score_max_det = check_max_det(self.score_max_det, "score_max_det")
        if isinstance(self.fusers, str) or not isinstance(self.fusers, (list, tuple)):
            raise TypeError(f"fusers must be a list of fuser names, got {type(self.fusers).__name__}: {self.fusers!r}")
        if not isinstance(self.fuser_params, dict):
            raise TypeError(
                f"fuser_params must be a mapping of fuser name to parameters, got "
                f"{type(self.fuser_params).__name__}: {self.fuser_params!r}"
            )
        if not self.fusers:
            raise ValueError("fusers must name at least one fuser to follow the calibration")
        unknown = sorted(set(self.fuser_params) - set(self.fusers))
        if unknown:
            raise ValueError(f"fuser_params names fusers {unknown} that are not in fusers {self.fusers}")
        self._check_head_options()

    def _check_head_options(self, model_names: Sequence[str] | None = None) -> None:
        """Build the head once per fuser, without curves (identity maps: no data, little work), so that its
        constructor's checks of ``shrinkage``, ``tie_break``, each fuser's name and ``fuser_params`` fail
        when the config is made, not after the curves are fitted and other methods of an evaluation ran;
        again for the ensemble's ``model_names`` (:func:`check_fit_data`), where a fuser's option depends on
        their number (a vote's ``min_votes``)."""
        from detens.fusers import FUSERS
        from detens.heads.calibration import CalibrationHead

        for i, fuser in enumerate(self.fusers):
            if isinstance(fuser, str) and fuser not in FUSERS:
                try:
                    FUSERS.get(fuser)  # its message lists the valid names
                except ValueError as err:
                    raise ValueError(f"fusers[{i}]: {err}") from None
            params = self.fuser_params.get(fuser)
            weights = params.get("weights") if isinstance(params, dict) else None
            # The ensemble is not known yet: per-model weights tell its size; without them, enough models
            # that no option bounded by the number of models (a vote's min_votes) is refused for want of them.
            count = len(weights) if isinstance(weights, list) and weights else _PROBE_ENSEMBLE_SIZE
            CalibrationHead(
                list(model_names) if model_names is not None else [f"model{m}" for m in range(count)],
                per_class=self.per_class, shrinkage=self.shrinkage,
                target=self.target, tie_break=self.tie_break, fuser=fuser, fuser_params=params,
            )


def _fit_calibration(predictions, image_ids, config: CalibrationTrainConfig, progress, on_epoch):
    from detens.heads.calibration import fit_calibration

    start = time.perf_counter()
    calibrated = fit_calibration(
        predictions, image_ids, per_class=config.per_class, shrinkage=config.shrinkage,
        target=calibration_target(config),
        fuser=config.fusers[0], fuser_params=config.fuser_params.get(config.fusers[0]), tie_break=config.tie_break,
    )
    best = (0.0, calibrated, config.fusers[0])
    if len(config.fusers) > 1:
        # the curves do not depend on the fuser: fit them once, then choose the fuser on the training images
        best = None
        for fuser in config.fusers:
            head = calibrated.with_fuser(fuser, config.fuser_params.get(fuser))
            train_map = _pooled_map(
                predictions.gt, ((i, head.fuse_detections(predictions.per_model(i))) for i in image_ids), image_ids,
                config.score_max_det,
            )
            logger.info("calibration + %s: training mAP %.4f", fuser, train_map)
            if best is None or train_map > best[0]:
                best = (train_map, head, fuser)
    if progress is not None:
        progress(len(image_ids))
    history = TrainHistory(seconds=time.perf_counter() - start)
    chosen = best[2]
    fuser_params = {chosen: config.fuser_params[chosen]} if chosen in config.fuser_params else {}
    return best[1], history, replace(config, fusers=[chosen], fuser_params=fuser_params)


TRAINERS["calibration"] = Trainer(CalibrationTrainConfig, CalibrationTrainConfig, _fit_calibration)
