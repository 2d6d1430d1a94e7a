"""The deep ensemble head (seed 002, "deep ensemble learning"): a multi-layer ensemble function that
rescores each fused object.

Dimension legend: C clusters, N models, F features, H hidden width.

Seed 002 combines unit models by stacked ensemble layers z^l = σ(V^l z^{l−1} + b^l) over their outputs.
Here the "unit model outputs" of a cluster are its per-object features (:mod:`detens.heads._features`:
by default (:data:`DEEP_FEATURES`) the models' scores and presence, each box's agreement with the mean
box, the context of the object in its image, and visibility when a member is a tiled view; optionally
the class), and the layers produce the fused **score**:

    s̄ = (1/N) Σᵢ pᵢ                            (the ``mean`` fuser's score; absent models count 0)
    z = a · logit(s̄) + b + MLP(x)              (MLP: ``depth`` layers of width ``hidden``, output layer zero-initialized)
    score = sigmoid(z)

so an untrained head (a = 1, b = 0, MLP ≡ 0) scores exactly like ``mean`` and training learns a
correction. The **box** comes from a base combination of the present boxes (``box``):

- ``"score_weighted"`` (default): Σᵢ pᵢ boxᵢ / Σᵢ pᵢ over the present models (as WBF weights boxes);
- ``"mean"``: the mean present box;
- ``"learned"``: softmax(log(pᵢ + 10⁻³) + δᵢ(x)) over the present models, δ from a second MLP (zero
  output layer, so it starts close to score-weighted), trained with a GIoU loss on matched clusters.

With ``median_box`` a cluster seen by at least three models takes, side by side, the median of its
present boxes instead: one member's stray side then moves the box not at all, where any weighted mean
moves it by that member's weight. It has no parameters (the GIoU loss trains the weighted box, which
clusters of one or two boxes keep). Training chooses it on the training images (``median_box: auto``):
it wins where the members localize about equally well (three nano YOLOs), and loses where one member is
much better than the others (a weak member's side is as likely to be the median as a strong one's).

**Training target.** COCO mAP@[.5:.95] averages AP over the IoU thresholds τ ∈ {0.50, 0.55, ..., 0.95}.
The score is trained with binary cross-entropy against the fraction of those thresholds at which the
fused box is a true positive under COCO's greedy matching (see
:func:`detens.heads._fit.score_targets`), so a well-localized object is ranked above a loosely
localized one and a duplicate that COCO would count as a false positive is pushed down.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import generalized_box_iou_loss

from detens.heads._features import present_mean_box, present_median_box
from detens.heads._io import check_int, check_number
from detens.heads._net import NetHead, check_score_targets, make_mlp
from detens.heads._registry import HEADS
from detens.matching import Clusters, weighted_mean_box
from detens.targets import Targets

__all__ = ["DeepEnsembleHead", "BOX_MODES", "DEEP_FEATURES", "MEDIAN_MIN_PRESENT", "score_weighted_box"]

BOX_MODES = ("score_weighted", "mean", "learned")
#: With ``median_box``, clusters of at least this many present boxes take the per-side median.
MEDIAN_MIN_PRESENT = 3
_LOGIT_CLAMP = 1e-6

#: The default feature groups: per-model scores and presence, cluster statistics, agreement (each box's
#: IoU with the mean box), context. Not the IoU of every pair of models (``iou``): its N(N−1)/2 columns
#: outgrow a few hundred fitting images as members are added (nine members, 2-fold CV on 168 COCO images:
#: 1.0 mAP point lower with it).
DEEP_FEATURES = (
    "present",
    "score",
    "log_score",
    "frac_present",
    "mean_score",
    "max_score",
    "score_spread",
    "iou_mean",
    "dup_iou",
    "dup_margin",
    "log_overlaps",
    "log_class_rank",
    "rel_class_score",
    "other_class_iou",
    "other_class_score",
    "other_class_mass",
)


def score_weighted_box(preds: Tensor, present: Tensor) -> Tensor:
    """Tensor[C, 4]: Σᵢ pᵢ boxᵢ / Σᵢ pᵢ over the present rows of ``preds (Tensor[C, N, 5])``.

    A cluster whose present scores are all 0 gets the mean present box.
    """
    return weighted_mean_box(preds[..., :4], preds[..., 4], present)


@HEADS.register("deep")
class DeepEnsembleHead(NetHead):
    """Rescoring head of stacked ensemble layers (seed 002); see the module docstring.

    Args:
        model_names (list[str]): the ensemble's models (clusters are put into this order by their ``sources``).
        box (str): ``"score_weighted"``, ``"mean"`` or ``"learned"``.
        lambda_box (float): weight of the GIoU box loss (``box="learned"`` only).
        members (int): number of score MLPs whose corrections are averaged.
        median_box (bool): clusters of at least :data:`MEDIAN_MIN_PRESENT` present boxes take the per-side
            median of those boxes (module docstring).
        features, class_ids, class_embed, hidden, depth, activation, match_iou: see
            :class:`~detens.heads._net.NetHead`
            (default features: :data:`DEEP_FEATURES`; default activation ReLU, ``"sigmoid"`` is the seed's σ).

    Parameters: ``calibration (Tensor[2])`` = (a, b), the score MLPs ``score_net`` and, for
    ``box="learned"``, ``box_net``.
    """

    type_name = "deep"
    default_features = DEEP_FEATURES
    extra_config = ("box", "lambda_box", "members", "median_box")

    def __init__(
        self,
        model_names: Sequence[str],
        box: str = "score_weighted",
        lambda_box: float = 1.0,
        members: int = 1,
        median_box: bool = False,
        features: Sequence[str] | None = None,
        class_ids: Sequence[int] | None = None,
        class_embed: int = 0,
        hidden: int = 64,
        depth: int = 2,
        activation: str = "relu",
        match_iou: float = 0.55,
    ) -> None:
        super().__init__(model_names, features, class_ids, class_embed, hidden, depth, activation, match_iou)
        if box not in BOX_MODES:
            raise ValueError(f"box must be one of {', '.join(BOX_MODES)}, got {box!r}")
        members = check_int(members, "members", 1)
        if not isinstance(median_box, bool):
            raise TypeError(f"median_box must be true or false, got {median_box!r}")
        self.box = box
        self.median_box = median_box
        self.lambda_box = check_number(lambda_box, "lambda_box")
        self.members = members
        self.calibration = nn.Parameter(torch.tensor([1.0, 0.0]))
        self.score_net = nn.ModuleList(
            make_mlp(self.in_features, self.hidden, self.depth, 1, activation, zero_last=True) for _ in range(members)
        )
        self.box_net = (
            make_mlp(self.in_features, self.hidden, self.depth, self.num_models, activation, zero_last=True)
            if box == "learned"
            else None
        )

    def _boxes(self, clusters: Clusters, x: Tensor) -> Tensor:
        """Tensor[C, 4]: the fused boxes (the weighted box, or with ``median_box`` the median where enough
        models are present)."""
        if not self.median_box:
            return self._weighted_boxes(clusters, x)
        few = clusters.present.sum(1) < MEDIAN_MIN_PRESENT  # [C]
        boxes = present_median_box(clusters.preds.to(x.dtype), clusters.present)
        if bool(few.any()):
            boxes[few] = self._weighted_boxes(clusters[few], x[few])
        return boxes

    def _weighted_boxes(self, clusters: Clusters, x: Tensor) -> Tensor:
        preds = clusters.preds.to(x.dtype)
        if self.box == "mean":
            return present_mean_box(preds, clusters.present)
        if self.box == "score_weighted":
            return score_weighted_box(preds, clusters.present)
        logits = torch.log(preds[..., 4] + 1e-3) + self.box_net(x)  # [C, N]
        weights = torch.softmax(logits.masked_fill(~clusters.present, float("-inf")), dim=1)  # [C, N]
        return (preds[..., :4] * weights[..., None]).sum(1)

    def score_logits(self, clusters: Clusters, x: Tensor) -> Tensor:
        """Tensor[C]: z = a · logit(s̄) + b + MLP(x)."""
        mean_score = clusters.preds[..., 4].to(x.dtype).sum(1) / self.num_models
        base = torch.logit(mean_score.clamp(_LOGIT_CLAMP, 1 - _LOGIT_CLAMP))
        correction = torch.stack([net(x).squeeze(1) for net in self.score_net]).mean(0)
        return self.calibration[0] * base + self.calibration[1] + correction

    def fuse_features(self, clusters: Clusters, features: Tensor) -> tuple[Tensor, Tensor]:
        x = self.inputs(features, clusters.labels)
        return self._boxes(clusters, x), torch.sigmoid(self.score_logits(clusters, x))

    def loss_features(
        self, clusters: Clusters, features: Tensor, targets: Targets, score_targets: Tensor | None = None
    ) -> Tensor:
        """Tensor[C]: BCE of the fused score against ``score_targets`` (in [0, 1], else ``ValueError``;
        default: matched), plus ``lambda_box`` · GIoU loss of the learned weighted box on matched clusters;
        0 where ignored."""
        if score_targets is not None:
            check_score_targets(score_targets)
        x = self.inputs(features, clusters.labels)
        soft = targets.matched.to(x.dtype) if score_targets is None else score_targets.to(x.dtype)
        per_cluster = F.binary_cross_entropy_with_logits(self.score_logits(clusters, x), soft, reduction="none")
        if self.box_net is not None and self.lambda_box > 0 and bool(targets.matched.any()):
            matched = targets.matched
            boxes = self._weighted_boxes(clusters[matched], x[matched])
            box_loss = generalized_box_iou_loss(boxes, targets.boxes[matched].to(x.dtype), reduction="none")
            per_cluster = per_cluster.index_add(0, matched.nonzero().squeeze(1), self.lambda_box * box_loss)
        return torch.where(targets.ignore, torch.zeros_like(per_cluster), per_cluster)
