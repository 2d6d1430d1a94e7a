"""Matching-based fusers without learned parameters: unweighted average and consensus voting."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from detens.checks import check_integer
from detens.detections import Detections
from detens.fusers._registry import FUSERS, check_weights
from detens.matching import Clusters, check_per_model, match, weighted_mean_box


def average_clusters(clusters: Clusters, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted mean box of the present rows, and score Σ wᵢpᵢ / Σ wᵢ over ALL models.

    An absent model counts with score 0, so an object seen by fewer models scores lower. An object seen
    only by models of weight 0 gets the plain mean of their boxes (and score 0).

    Returns:
        boxes (Tensor[C, 4]) normalized, scores (Tensor[C]).
    """
    weights = (weights / weights.max()).to(clusters.preds.dtype)  # [N] in [0, 1]: tiny weights do not underflow
    boxes = weighted_mean_box(clusters.preds[..., :4], weights.expand_as(clusters.present), clusters.present)
    scores = (clusters.preds[..., 4] * weights).sum(1) / weights.sum()
    return boxes, scores.clamp(0.0, 1.0)


@FUSERS.register("mean")
def mean_fusion(
    per_model: Sequence[Detections], iou_thr: float = 0.55, weights: Sequence[float] | None = None
) -> Detections:
    """Unweighted (or ``weights``-weighted) average of each matched object's boxes and scores.

    The models' boxes are matched into objects by :func:`detens.match` at ``iou_thr``, in [0, 1).
    """
    clusters = match(per_model, iou_thr=iou_thr)
    w = check_weights(weights, len(per_model), clusters.device)
    boxes, scores = average_clusters(clusters, w)
    return clusters.to_detections(boxes, scores, source="fused:mean")


@FUSERS.register("vote")
def vote_fusion(
    per_model: Sequence[Detections],
    iou_thr: float = 0.55,
    min_votes: int | None = None,
    weights: Sequence[float] | None = None,
) -> Detections:
    """Consensus voting: keep the objects found by at least ``min_votes`` models (default: a majority).

    Objects are matched (``iou_thr``, in [0, 1)) and kept ones averaged as in ``mean``.
    """
    check_per_model(per_model)
    num_models = len(per_model)
    if min_votes is None:
        min_votes = math.ceil(num_models / 2)
    min_votes = check_integer(min_votes, "min_votes", 1, num_models)
    clusters = match(per_model, iou_thr=iou_thr)
    w = check_weights(weights, num_models, clusters.device)
    boxes, scores = average_clusters(clusters, w)
    keep = clusters.present.sum(1) >= min_votes
    return clusters[keep].to_detections(boxes[keep], scores[keep], source="fused:vote")
