"""The e2e-CEL selection head (seed 003): a selection net, a differentiable top-k knapsack layer, and a
combination of the selected models' predictions, trained end to end.

Dimension legend: C clusters, N models, F features.

For each cluster (one detected object):

1. the selection net g (an MLP over the cluster's features: the N×5 predictions, presence, box
   agreement, context, optionally a class embedding) predicts scores ĉ ∈ R^N, normalized
   ĉ ← ĉ / ‖ĉ‖₂ over the present models (the paper's eq. 13; absent entries are set to 0 first);
2. the knapsack layer (:mod:`detens.heads.knapsack`) selects b = K(ĉ) ∈ {0, 1}^N, the k highest-scoring
   present models (all present ones when fewer than k are present); in training its backward pass is
   the perturbed-optimizer estimate with ``num_samples`` Gaussian samples at temperature ``epsilon``;
3. the selected rows are combined:

   - box (``combine``): ``"mean"`` Σ bᵢ boxᵢ / Σ bᵢ (the paper's unweighted vote over the sub-ensemble),
     or ``"score_weighted"`` Σ bᵢ pᵢ boxᵢ / Σ bᵢ pᵢ;
   - score (``score``): ``"mean_present"`` (default) (Σ bᵢ pᵢ / Σ bᵢ) · (|present| / N), the mean selected
     score times the fraction of models that found the object, so an object found by fewer models
     scores lower for every k, and k = N reproduces the ``mean`` fuser exactly; ``"sum_k"`` Σ bᵢ pᵢ / k;
     ``"sum_n"`` Σ bᵢ pᵢ / N.

The loss mirrors J of DESIGN.md §2: on matched clusters a box term (GIoU loss of the fused box, weight
``lambda_box``), and on every non-ignored cluster binary cross-entropy of the fused score against
matched / unmatched (or a soft score target). Its gradient reaches g only through the knapsack layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from detens.heads._io import check_int, check_number
from detens.heads._net import NetHead, make_mlp, score_and_box_loss
from detens.heads._registry import HEADS
from detens.heads.knapsack import top_k_knapsack, top_k_mask
from detens.matching import Clusters, weighted_mean_box
from detens.targets import Targets

__all__ = ["SelectionHead", "COMBINE_MODES", "SCORE_MODES", "combine_selected"]

COMBINE_MODES = ("mean", "score_weighted")
SCORE_MODES = ("mean_present", "sum_k", "sum_n")


def combine_selected(
    preds: Tensor, present: Tensor, chosen: Tensor, k: int, combine: str = "mean", score: str = "mean_present"
) -> tuple[Tensor, Tensor]:
    """Fuse the selected rows of each cluster.

    Args:
        preds (Tensor[C, N, 5]): the clusters' predictions. present (Tensor[C, N] bool).
        chosen (Tensor[C, N]): the 0/1 selection (differentiable: the knapsack layer's output).
        k (int): the sub-ensemble size (for ``score="sum_k"``).
        combine (str): ``"mean"`` or ``"score_weighted"`` box. score (str): one of :data:`SCORE_MODES`.

    Returns:
        boxes (Tensor[C, 4]), scores (Tensor[C]) in [0, 1].
    """
    chosen = chosen.to(preds.dtype)
    num_models = preds.shape[1]
    p = preds[..., 4]
    tiny = torch.finfo(preds.dtype).tiny
    # a selection whose scores are all 0 gets its unweighted mean
    weight = chosen * p if combine == "score_weighted" else chosen  # [C, N]
    boxes = weighted_mean_box(preds[..., :4], weight, chosen > 0)
    selected_sum = (chosen * p).sum(1)  # [C]
    if score == "sum_k":
        scores = selected_sum / k
    elif score == "sum_n":
        scores = selected_sum / num_models
    else:
        fraction = present.to(preds.dtype).sum(1) / num_models
        scores = selected_sum / chosen.sum(1).clamp(min=tiny) * fraction
    return boxes, scores.clamp(0.0, 1.0)


@HEADS.register("selection")
class SelectionHead(NetHead):
    """e2e-CEL for detection: select k models per object and combine their predictions.

    Args:
        model_names (list[str]): the ensemble's models (clusters are put into this order by their ``sources``).
        k (int): the sub-ensemble size (``k >= N``: every present model, i.e. the ``mean`` fuser).
        epsilon (float): ε, the knapsack layer's noise temperature.
        num_samples (int): m, its Gaussian samples per backward pass.
        baseline (bool): the layer's variance-reduced estimate (subtract K(ĉ); same expectation).
        combine (str): :data:`COMBINE_MODES`. score (str): :data:`SCORE_MODES`.
        lambda_box, lambda_cls (float): weights of the GIoU box loss and the score BCE.
        features, class_ids, class_embed, hidden, depth, activation, match_iou: see
            :class:`~detens.heads._net.NetHead`.

    Parameters: the selection net ``selector`` (F + E → N).
    """

    type_name = "selection"
    extra_config = ("k", "epsilon", "num_samples", "baseline", "combine", "score", "lambda_box", "lambda_cls")

    def __init__(
        self,
        model_names: Sequence[str],
        k: int = 2,
        epsilon: float = 0.1,
        num_samples: int = 32,
        baseline: bool = True,
        combine: str = "mean",
        score: str = "mean_present",
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
        k = check_int(k, "k", 1)
        num_samples = check_int(num_samples, "num_samples", 1)
        if combine not in COMBINE_MODES:
            raise ValueError(f"combine must be one of {', '.join(COMBINE_MODES)}, got {combine!r}")
        if score not in SCORE_MODES:
            raise ValueError(f"score must be one of {', '.join(SCORE_MODES)}, got {score!r}")
        if not isinstance(baseline, bool):
            raise TypeError(f"baseline must be bool, got {baseline!r}")
        self.k = k
        self.epsilon = check_number(epsilon, "epsilon", strict=True)
        self.num_samples = num_samples
        self.baseline = baseline
        self.combine = combine
        self.score = score
        self.lambda_box = check_number(lambda_box, "lambda_box")
        self.lambda_cls = check_number(lambda_cls, "lambda_cls")
        self.selector = make_mlp(self.in_features, self.hidden, self.depth, self.num_models, activation)
        #: noise source of the knapsack layer in training (None: torch's global generator).
        self.generator: torch.Generator | None = None

    def selection_scores(self, clusters: Clusters, x: Tensor) -> Tensor:
        """Tensor[C, N]: ĉ / ‖ĉ‖₂ over the present models (absent entries 0)."""
        raw = self.selector(x) * clusters.present.to(x.dtype)  # [C, N]
        return raw / raw.norm(dim=1, keepdim=True).clamp(min=1e-12)

    def select(self, clusters: Clusters, x: Tensor) -> Tensor:
        """Tensor[C, N]: the 0/1 selection; differentiable (knapsack layer) when gradients are enabled."""
        scores = self.selection_scores(clusters, x)
        if torch.is_grad_enabled() and scores.requires_grad:
            return top_k_knapsack(
                scores, clusters.present, self.k, self.num_samples, self.epsilon, self.generator, self.baseline
            )
        return top_k_mask(scores, clusters.present, self.k).to(scores.dtype)

    def fuse_features(self, clusters: Clusters, features: Tensor) -> tuple[Tensor, Tensor]:
        x = self.inputs(features, clusters.labels)
        chosen = self.select(clusters, x)
        return combine_selected(clusters.preds.to(x.dtype), clusters.present, chosen, self.k, self.combine, self.score)

    def loss_features(
        self, clusters: Clusters, features: Tensor, targets: Targets, score_targets: Tensor | None = None
    ) -> Tensor:
        """Tensor[C]: ``lambda_cls`` · BCE(fused score, target) + ``lambda_box`` · GIoU loss (matched only);
        0 where ignored."""
        boxes, scores = self.fuse_features(clusters, features)
        return score_and_box_loss(boxes, scores, targets, score_targets, self.lambda_cls, self.lambda_box)
