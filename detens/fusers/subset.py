"""The random k-subset baseline of e2e-CEL (seed 003), adapted to detection.

Dimension legend: C clusters, N models.

Per matched object, k of the models that found it are drawn at random and combined exactly as the
selection head combines its learned choice (:func:`detens.heads.selection.combine_selected`: the mean box
of the drawn models; score = their mean score × the fraction of models that found the object), so the two
differ only in *how* the sub-ensemble is chosen. With k ≥ N it is the ``mean`` fuser.

The draw is seeded and independent of the order in which the models are passed: the present models of
a cluster are first put in a canonical order (by score, then by box), the clusters too (by their
models' scores and boxes in that order, then by label), and the random draw picks positions in those
orders. That holds for the objects :func:`detens.match` finds; where two models give one object equal
scores, which box seeds it follows the order of the models (as ``match`` documents), and so may the
object's boxes and the draw.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from detens.checks import check_integer
from detens.detections import Detections
from detens.fusers._order import lexicographic_order
from detens.fusers._registry import FUSERS
from detens.matching import Clusters, match

__all__ = ["random_k_fusion", "random_subset"]


def random_subset(clusters: Clusters, k: int, generator: torch.Generator) -> torch.Tensor:
    """Tensor[C, N] bool: k present models per cluster drawn uniformly (all present ones if fewer).

    Invariant to the order of the models' columns in ``clusters``: the draw picks positions in the present
    models' canonical order (score descending, ties by box coordinates).
    """
    from detens.heads.knapsack import top_k_mask

    preds, present = clusters.preds, clusters.present
    num, num_models = present.shape
    if num == 0:
        return present.clone()
    # canonical rank of each model in its cluster: lexicographic by (−score, x1, y1, x2, y2)
    keys = torch.cat([-preds[..., 4:5], preds[..., :4]], dim=2).masked_fill(~present[..., None], float("inf"))  # [C, N, 5]
    order = torch.arange(num_models, device=preds.device).expand(num, -1)
    for column in range(4, -1, -1):  # stable sorts from the least significant key
        position = torch.argsort(keys[..., column].gather(1, order), dim=1, stable=True)
        order = order.gather(1, position)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(num_models, device=preds.device).expand(num, -1))  # [C, N]
    # The clusters too take a canonical order (their members' keys in canonical order, then the label):
    # the order match() returns them in follows the models' order where scores tie.
    canonical = torch.cat(
        [keys.gather(1, order[..., None].expand(-1, -1, 5)).reshape(num, -1), clusters.labels.to(keys.dtype)[:, None]],
        dim=1,
    )  # [C, 5N + 1]
    cluster_order = lexicographic_order(canonical.unbind(1))
    priority = torch.rand((num, num_models), generator=generator, device=generator.device).to(preds.device)
    drawn = torch.empty_like(priority)
    drawn[cluster_order] = priority  # row i of the draw goes to the i-th cluster in canonical order
    return top_k_mask(drawn.gather(1, rank), present, k)


@FUSERS.register("random_k")
def random_k_fusion(
    per_model: Sequence[Detections], k: int = 1, seed: int = 0, iou_thr: float = 0.55
) -> Detections:
    """Average a random k-subset of the models that found each object (the e2e-CEL "random selection").

    Args:
        per_model (list[Detections]): one per model.
        k (int): models drawn per object (``k >= N``: all present, i.e. ``mean``).
        seed (int): seeds the draw (a fresh generator per call, so one image always fuses the same way).
        iou_thr (float): the matching IoU threshold (see :func:`detens.match`), in [0, 1).
    """
    from detens.heads.selection import combine_selected

    k = check_integer(k, "k", 1)
    # the range torch.Generator.manual_seed takes
    seed = check_integer(seed, "seed", -(2**63), 2**64 - 1)
    clusters = match(per_model, iou_thr=iou_thr)
    generator = torch.Generator().manual_seed(seed)
    chosen = random_subset(clusters, k, generator)
    boxes, scores = combine_selected(clusters.preds, clusters.present, chosen, k, "mean", "mean_present")
    return clusters.to_detections(boxes, scores, source="fused:random_k")
