"""Training the network heads (selection / e2e-CEL, deep ensemble, Super Learner) on saved predictions.

Dimension legend: N models, C clusters (of one image, or of all training images concatenated), F features.

The flow, shared by the three heads (:func:`train_head`):

1. every training image's clusters (``detens.training.build_samples``) go through the head's feature
   extractor once (features depend on the predictions only, never on the parameters); the feature
   standardization is fitted on them;
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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import torch
from torch import Tensor

from detens.matching import Clusters
from detens.predictions import EnsemblePredictions
from detens.targets import Targets, assign_targets
from detens.training import ImageSample, TrainHistory

__all__ = [
    "HeadTrainConfig",
    "DeepTrainConfig",
    "SelectionTrainConfig",
    "SuperLearnerTrainConfig",
    "HEAD_KINDS",
    "COCO_IOU_THRESHOLDS",
    "score_targets",
    "train_head",
    "make_head",
    "config_for",
    "fit_head",
]

logger = logging.getLogger(__name__)

#: The IoU thresholds of COCO mAP@[.5:.95].
COCO_IOU_THRESHOLDS: tuple[float, ...] = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))
SCORE_TARGETS = ("matched", "iou_fraction")


@dataclass
class HeadTrainConfig:
    """Settings shared by the network heads; the per-head subclasses add and re-default fields.

    Args:
        match_iou (float): the matching IoU of the clusters (``train_head`` uses the clusters it is given;
            :func:`fit_head` builds them with it).
        match_iou_grid (list[float]): :func:`fit_head` trains one head per IoU of the grid and keeps the
            one with the best mAP on the training images (empty: just ``match_iou``).
        target_iou (float): IoU of a GT match for the box target and the ``"matched"`` score target.
        score_target (str): ``"matched"`` or ``"iou_fraction"`` (see the module docstring).
        epochs (int), lr (float), weight_decay (float): AdamW settings (weight decay 0: Adam).
        batch_clusters (int): clusters per mini-batch (0: all training clusters in one batch).
        reassign_every (int): re-assign targets from the current head every that many epochs (0: never).
        hidden (int), depth (int), activation (str), class_embed (int), features (list[str] | None):
            the head's network (see :class:`detens.heads._net.NetHead`).
        lambda_box (float): weight of the GIoU box loss.
        seed (int): seeds initialization, shuffling and the knapsack noise.
        device (str): where to train (``"cpu"``, ``"cuda"``).
    """

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
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        for name in ("match_iou", "target_iou"):
            value = getattr(self, name)
            if not 0.0 < value < 1.0:
                raise ValueError(f"{name} must be in (0, 1), got {value}")
        self.match_iou_grid = [float(v) for v in self.match_iou_grid]
        if any(not 0.0 < v < 1.0 for v in self.match_iou_grid):
            raise ValueError(f"match_iou_grid values must be in (0, 1), got {self.match_iou_grid}")
        if self.score_target not in SCORE_TARGETS:
            raise ValueError(f"score_target must be one of {', '.join(SCORE_TARGETS)}, got {self.score_target!r}")
        for name in ("epochs", "batch_clusters", "reassign_every", "class_embed", "depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0 or self.lambda_box < 0:
            raise ValueError("weight_decay and lambda_box must be >= 0")

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

    Args:
        box (str): ``"score_weighted"``, ``"mean"`` or ``"learned"`` (see :mod:`detens.heads.deep`).
        members (int): score MLPs averaged in the head.
    """

    match_iou_grid: list[float] = field(default_factory=lambda: [0.55, 0.7])
    score_target: Literal["matched", "iou_fraction"] = "iou_fraction"
    epochs: int = 10
    box: str = "score_weighted"
    members: int = 1

    def head_options(self) -> dict[str, Any]:
        return {**super().head_options(), "box": self.box, "members": self.members}


@dataclass
class SelectionTrainConfig(HeadTrainConfig):
    """The e2e-CEL selection head (IoU-aware score target by default: it measured better than
    ``"matched"`` under cross-validation).

    Args:
        k (int): sub-ensemble size. epsilon (float), num_samples (int), baseline (bool): the knapsack layer.
        combine (str), score (str): how the selected rows are combined (see :mod:`detens.heads.selection`).
        lambda_cls (float): weight of the score BCE.
    """

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

    match_iou_grid: list[float] = field(default_factory=lambda: [0.55, 0.7])
    epochs: int = 10
    lr: float = 1e-3
    weight_decay: float = 1e-2
    lambda_cls: float = 1.0

    def head_options(self) -> dict[str, Any]:
        return {**super().head_options(), "lambda_cls": self.lambda_cls}


#: head kind → its training config class (the head class is ``detens.heads.HEADS.get(kind)``)
HEAD_KINDS: dict[str, type[HeadTrainConfig]] = {
    "selection": SelectionTrainConfig,
    "deep": DeepTrainConfig,
    "superlearner": SuperLearnerTrainConfig,
}


def config_for(kind: str, **overrides: Any) -> HeadTrainConfig:
    """The default training config of ``kind`` with ``overrides`` (unknown keys are an error)."""
    cls = _config_class(kind)
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ValueError(f"unknown {kind} training options {unknown}; valid: {', '.join(sorted(names))}")
    return cls(**overrides)


def _config_class(kind: str) -> type[HeadTrainConfig]:
    if kind not in HEAD_KINDS:
        raise ValueError(f"unknown head kind {kind!r}; valid kinds: {', '.join(HEAD_KINDS)}")
    return HEAD_KINDS[kind]


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
    kind: Literal["selection", "deep", "superlearner"],
    samples: Sequence[ImageSample],
    model_names: Sequence[str],
    config: HeadTrainConfig | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
):
    """Train a network head on ``samples``; deterministic for ``config.seed`` (on the CPU).

    Args:
        kind (str): ``"selection"`` (e2e-CEL), ``"deep"`` (deep ensemble rescoring) or ``"superlearner"``.
        samples (list[ImageSample]): training images (``detens.training.build_samples``).
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
                    f"the {kind} loss became {float(loss.detach())} at epoch {epoch}; lower the learning rate"
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


def fit_head(
    kind: Literal["selection", "deep", "superlearner"],
    predictions: EnsemblePredictions,
    image_ids: Sequence[int],
    config: HeadTrainConfig | None = None,
    progress: Callable[[int], None] | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
):
    """Train a head of ``kind`` on ``image_ids``; with ``config.match_iou_grid`` also choose the matching
    IoU on the same training images (:func:`detens.training.fit_with_match_iou_search`).

    Returns:
        (head, TrainHistory, HeadTrainConfig): the head, its history, the config it was trained with.
    """
    from detens.training import fit_with_match_iou_search

    config = config if config is not None else _config_class(kind)()
    return fit_with_match_iou_search(
        lambda samples, trial: train_head(kind, samples, predictions.model_names, trial, on_epoch=on_epoch),
        predictions, image_ids, config, progress,
    )
