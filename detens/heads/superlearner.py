"""The Super Learner baseline of e2e-CEL (seed 003, after Ju et al. 2018), adapted to detection.

Dimension legend: C clusters, N models, F features.

A fully connected network maps each cluster's features to per-model combination weights,

    w = softmax(MLP(x)) ∈ Δ^N,    box = Σᵢ wᵢ boxᵢ,    score = Σᵢ wᵢ pᵢ

over all N models: an absent model has pᵢ = 0 and its box row is the mean present box (see
:class:`~detens.matching.Clusters`), so weight on an absent model lowers the score without moving the
box, and the fused box stays a convex combination of the present boxes. The output layer starts at
zero, so an untrained Super Learner (w = 1/N) fuses exactly like ``mean``. The loss is the one of the
selection head: GIoU on matched clusters plus binary cross-entropy of the fused score.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from detens.heads._io import check_number
from detens.heads._net import NetHead, make_mlp, score_and_box_loss
from detens.heads._registry import HEADS
from detens.matching import Clusters
from detens.targets import Targets

__all__ = ["SuperLearnerHead"]


@HEADS.register("superlearner")
class SuperLearnerHead(NetHead):
    """Per-cluster softmax combination weights from an MLP; see the module docstring.

    Args:
        model_names (list[str]): the ensemble's models (clusters are put into this order by their ``sources``).
        lambda_box, lambda_cls (float): weights of the GIoU box loss and the score BCE.
        features, class_ids, class_embed, hidden, depth, activation, match_iou: see
            :class:`~detens.heads._net.NetHead`.

    Parameters: ``weight_net`` (F + E → N).
    """

    type_name = "superlearner"
    extra_config = ("lambda_box", "lambda_cls")
    # Per-model weights from visibility over-fit the tiled members: with 2x2 tiled YOLOs it scored 0.4586
    # with visibility and 0.4675 without (2-fold CV inside coco_val2017_extra). Still readable by name.
    visibility_by_default = False

    def __init__(
        self,
        model_names: Sequence[str],
        lambda_box: float = 1.0,
        lambda_cls: float = 1.0,
        features: Sequence[str] | None = None,
        class_ids: Sequence[int] | None = None,
        class_embed: int = 0,
        hidden: int = 64,
        depth: int = 2,
        activation: str = "relu",
        match_iou: float = 0.55,
    ) -> None:
        super().__init__(model_names, features, class_ids, class_embed, hidden, depth, activation, match_iou)
        self.lambda_box = check_number(lambda_box, "lambda_box")
        self.lambda_cls = check_number(lambda_cls, "lambda_cls")
        self.weight_net = make_mlp(self.in_features, self.hidden, self.depth, self.num_models, activation, zero_last=True)

    def weights(self, x: Tensor) -> Tensor:
        """Tensor[C, N]: the combination weights (rows sum to 1)."""
        return torch.softmax(self.weight_net(x), dim=1)

    def fuse_features(self, clusters: Clusters, features: Tensor) -> tuple[Tensor, Tensor]:
        x = self.inputs(features, clusters.labels)
        w = self.weights(x)  # [C, N]
        preds = clusters.preds.to(x.dtype)
        fused = torch.einsum("cn,cnk->ck", w, preds)  # [C, 5]
        return fused[:, :4], fused[:, 4].clamp(0.0, 1.0)

    def loss_features(
        self, clusters: Clusters, features: Tensor, targets: Targets, score_targets: Tensor | None = None
    ) -> Tensor:
        """Tensor[C]: ``lambda_cls`` · BCE(fused score, target) + ``lambda_box`` · GIoU loss (matched only);
        0 where ignored."""
        boxes, scores = self.fuse_features(clusters, features)
        return score_and_box_loss(boxes, scores, targets, score_targets, self.lambda_cls, self.lambda_box)
