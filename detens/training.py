"""Training learned fusion heads on saved predictions and COCO ground truth.

Dimension legend: N models, C clusters of one image, G ground-truth boxes of one image.

The flow for every image: the models' boxes are matched into clusters once (``detens.match``); the
clusters are paired with the image's ground truth; targets are assigned from the head's current fused
boxes (COCO-style greedy matching by fused score) and re-assigned every ``reassign_every`` epochs.
Only the clusters are kept per image (not the raw predictions), so memory grows with the number of
matched objects, not with the size of the prediction files.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from detens.matching import Clusters, match
from detens.predictions import EnsemblePredictions
from detens.targets import Targets, assign_targets

__all__ = ["ImageSample", "ThetaTrainConfig", "theta_seed_config", "TrainHistory", "build_samples", "assign_all_targets", "train_theta", "fit_theta", "fit_with_match_iou_search"]

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

    def __post_init__(self) -> None:
        for name, value in [("match_iou", self.match_iou), ("target_iou", self.target_iou)] + [
            ("match_iou_grid", v) for v in self.match_iou_grid
        ]:
            if not 0.0 < value < 1.0:
                raise ValueError(f"{name} must be in (0, 1), got {value}")
        for name in ("epochs", "batch_images", "reassign_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


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
    """
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
    """Loss per epoch (mean J over the epoch's batches) and wall time."""

    loss: list[float] = field(default_factory=list)
    seconds: float = 0.0


def train_theta(
    samples: Sequence[ImageSample],
    model_names: Sequence[str],
    config: ThetaTrainConfig,
    on_epoch: Callable[[int, float], None] | None = None,
):
    """Train a :class:`~detens.heads.theta.ThetaHead` on ``samples``; deterministic for ``config.seed``.

    Returns:
        (ThetaHead, TrainHistory)
    """
    from detens.heads.theta import ThetaHead, make_optimizer

    if not samples:
        raise ValueError("no training images: every image lacked both predictions and ground truth")
    torch.manual_seed(config.seed)
    class_ids = None
    if config.per_class:
        seen = torch.cat([s.clusters.labels for s in samples] + [s.gt_labels for s in samples])
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
    full_batch = None
    for epoch in range(config.epochs):
        if epoch == 0 or (config.reassign_every and epoch % config.reassign_every == 0):
            targets = assign_all_targets(head, samples, config.target_iou)
            full_batch = None
        order = list(range(len(samples)))
        if batch < len(samples):
            order_rng.shuffle(order)
        losses = []
        for begin in range(0, len(order), batch):
            chosen = order[begin : begin + batch]
            if batch >= len(samples):  # the seed's full-batch rule: stack once, reuse every epoch
                if full_batch is None:
                    full_batch = head.stack_batch([s.clusters for s in samples], targets)
                stacked = full_batch
            else:
                stacked = head.stack_batch([samples[i].clusters for i in chosen], [targets[i] for i in chosen])
            optimizer.zero_grad()
            loss = head.loss_on_batch(*stacked)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        history.loss.append(sum(losses) / len(losses))
        if on_epoch is not None:
            on_epoch(epoch, history.loss[-1])
    history.seconds = time.perf_counter() - start
    return head, history


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
    from dataclasses import replace

    from detens.coco import detections_to_coco, evaluate_coco

    grid = list(config.match_iou_grid) or [config.match_iou]
    best = None
    for match_iou in grid:
        trial_config = replace(config, match_iou=match_iou, match_iou_grid=[])
        samples = build_samples(predictions, image_ids, match_iou, config.device, progress=progress)
        head, history = train(samples, trial_config)
        if len(grid) == 1:
            return head, history, trial_config
        results = []
        with torch.no_grad():
            for s in samples:
                results += detections_to_coco(head.fuse(s.clusters), s.image_id, decimals=None)
        train_map = evaluate_coco(predictions.gt, results, image_ids=image_ids, backend="faster")["map"]
        logger.info("%s head, match_iou %.2f: training mAP %.4f", type(head).__name__, match_iou, train_map)
        if best is None or train_map > best[0]:
            best = (train_map, head, history, trial_config)
    return best[1], best[2], best[3]


def fit_theta(
    predictions: EnsemblePredictions,
    image_ids: Sequence[int],
    config: ThetaTrainConfig,
    progress: Callable[[int], None] | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
):
    """Train Θ on ``image_ids`` (see :func:`fit_with_match_iou_search`).

    Returns:
        (ThetaHead, TrainHistory, ThetaTrainConfig): the head, its history, the config it was trained with.
    """
    return fit_with_match_iou_search(
        lambda samples, trial: train_theta(samples, predictions.model_names, trial, on_epoch=on_epoch),
        predictions, image_ids, config, progress,
    )
