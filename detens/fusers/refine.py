"""The ``refine`` fuser: class-wise Soft-NMS over the boxes of all models, then score voting of the box
coordinates (the refining step of MoCaE, "Mixture of Calibrated Experts", TMLR 2024; the voting is the
"score voting" of VarifocalNet).

Dimension legend: K boxes of all models together, k kept boxes, P (kept box, candidate box) pairs.

1. **Decay.** Soft-NMS exactly as the ``soft_nms`` fuser (the same code): per class, repeatedly keep the
   best remaining box and multiply the others' scores by exp(−u²/σ) (u: their IoU with it), or by (1 − u)
   where u > ``iou_thr`` with ``decay="linear"``; boxes whose score falls to ``thresh`` or below are dropped.
   The kept boxes carry their decayed scores.
2. **Vote.** Each kept box b is replaced by the weighted average of the candidate boxes bⱼ of its class
   (every input box, before the decay, itself included) that overlap it at IoU uⱼ > ``vote_iou``:

       b ← Σⱼ wⱼ bⱼ / Σⱼ wⱼ,        wⱼ = sⱼ · exp(−(1 − uⱼ)² / σ_v)

   with sⱼ the candidate's input score (times ``w_n / Σw`` with ``weights``). Its score is unchanged.

MoCaE's released code votes with σ_v = 0.04 over candidates at IoU > 0.01 (the defaults here). Its
Soft-NMS is mmcv's, whose default decay is linear, configured with an IoU threshold of 0.65 and at most
100 boxes per image: ``decay="linear", iou_thr=0.65`` here (no cap on the number of boxes). The
Gaussian decay is the default here, as for ``soft_nms``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from detens.checks import check_iou_thr, check_real
from detens.detections import Detections
from detens.fusers._lockstep import disjoint_groups
from detens.fusers._registry import FUSERS
from detens.fusers.nms import soft_nms_pass
from detens.matching import range_pairs_in_blocks

__all__ = ["refine_fusion", "score_vote"]


def _pair_iou(a: Tensor, b: Tensor) -> Tensor:
    """Tensor[P]: IoU of the box pairs ``a[p], b[p]`` (Tensor[P, 4] each, positive areas)."""
    extent = (torch.minimum(a[:, 2:], b[:, 2:]) - torch.maximum(a[:, :2], b[:, :2])).clamp(min=0)  # [P, 2]
    inter = extent[:, 0] * extent[:, 1]
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / (area_a + area_b - inter)


def score_vote(
    boxes: Tensor,
    normalized: Tensor,
    scores: Tensor,
    labels: Tensor,
    kept: Tensor,
    vote_iou: float = 0.01,
    vote_sigma: float = 0.04,
) -> Tensor:
    """Score voting: each kept box becomes the weighted average of the candidates of its class that overlap it.

    Args:
        boxes (Tensor[K, 4]): the candidates' boxes to average (pixels).
        normalized (Tensor[K, 4]): the same boxes normalized to [0, 1] (float64), for the IoUs.
        scores (Tensor[K]): the candidates' scores sⱼ (the voting weights' first factor).
        labels (Tensor[K]): their classes.
        kept (Tensor[k] int64): indices of the boxes to refine (each a candidate itself).
        vote_iou (float): candidates at IoU ≤ ``vote_iou`` with a kept box do not vote for it.
        vote_sigma (float): σ_v of the weights sⱼ · exp(−(1 − uⱼ)² / σ_v).

    Returns:
        Tensor[k, 4] float64: the voted boxes (a kept box whose voters all weigh 0 keeps its own box).
    """
    device = boxes.device
    boxes = boxes.to(torch.float64)
    if kept.numel() == 0:
        return boxes.new_zeros((0, 4))
    # Only a candidate that overlaps a kept box votes for it (IoU > vote_iou >= 0), so only one of its
    # group: boxes of two different groups do not intersect. On a crowded image no gap splits a class into
    # groups, and pairing each kept box with its whole group took memory in proportion to kept × boxes
    # (26 GB for 100,000 boxes of 3 classes): a sweep over the group's boxes sorted by x1 finds the few
    # that reach it. Keys (group · 4 + x1) never mix groups since every x lies in [0, 1].
    group = disjoint_groups(normalized, labels, margin=0.0)  # [K]
    sorted_key, by_key = torch.sort(group.to(torch.float64) * 4 + normalized[:, 0], stable=True)  # [K]
    widest = torch.zeros(int(group.max()) + 1, dtype=torch.float64, device=device)
    widest = widest.scatter_reduce(0, group, normalized[:, 2] - normalized[:, 0], reduce="amax")  # [G]
    kept_group = group[kept]  # [k]
    base = kept_group.to(torch.float64) * 4
    slack = 1e-5  # rounding of the keys never drops a voter; a candidate too many has IoU 0 and is dropped
    lo = torch.searchsorted(sorted_key, base + normalized[kept, 0] - widest[kept_group] - slack, right=False)  # [k]
    hi = torch.searchsorted(sorted_key, base + normalized[kept, 2] + slack, right=True)  # [k]
    total = torch.zeros(kept.numel(), dtype=torch.float64, device=device)
    summed = torch.zeros((kept.numel(), 4), dtype=torch.float64, device=device)
    for _, _, pair_kept, position in range_pairs_in_blocks(lo, hi):
        pair_other = by_key[position]  # [P]
        iou = _pair_iou(normalized[kept[pair_kept]], normalized[pair_other])  # [P]
        voting = iou > vote_iou
        pair_kept, pair_other, iou = pair_kept[voting], pair_other[voting], iou[voting]
        # each kept box's votes are added in the candidates' order, so that its sums do not depend on the sweep
        in_order = torch.argsort(pair_kept * labels.numel() + pair_other)
        pair_kept, pair_other, iou = pair_kept[in_order], pair_other[in_order], iou[in_order]
        weight = scores[pair_other].to(torch.float64) * torch.exp(-((1.0 - iou) ** 2) / vote_sigma)  # [P]
        total.index_add_(0, pair_kept, weight)
        summed.index_add_(0, pair_kept, weight[:, None] * boxes[pair_other])
    voted = summed / total.clamp(min=torch.finfo(torch.float64).tiny)[:, None]
    return torch.where((total > 0)[:, None], voted, boxes[kept])


@FUSERS.register("refine")
def refine_fusion(
    per_model: Sequence[Detections],
    weights: Sequence[float] | Tensor | None = None,
    sigma: float = 0.5,
    thresh: float = 0.001,
    vote_iou: float = 0.01,
    vote_sigma: float = 0.04,
    decay: Literal["gaussian", "linear"] = "gaussian",
    iou_thr: float = 0.3,
) -> Detections:
    """Class-wise Soft-NMS over the boxes of all models, then score voting of the kept boxes' coordinates.

    Args:
        per_model (list[Detections]): one per model, same image and device (typically calibrated first,
            ``detens.fuse(per_model, "refine", calibration=head)``, as MoCaE does).
        weights (Sequence[float] | Tensor[N] | None): model n's scores are multiplied by ``w_n / Σw``
            (as in ``soft_nms``); None leaves the scores as they are.
        sigma (float): the Gaussian decay's width σ.
        thresh (float): minimum decayed score to keep a box.
        vote_iou (float): in [0, 1); only candidates at IoU > ``vote_iou`` with a kept box vote for it.
        vote_sigma (float): σ_v of the voting weights sⱼ · exp(−(1 − uⱼ)² / σ_v).
        decay (str): ``"gaussian"`` or ``"linear"`` (the Soft-NMS decay, see :func:`soft_nms_fusion`).
        iou_thr (float): the linear decay's overlap threshold, in [0, 1).

    Returns:
        Detections: the kept boxes, voted, with their decayed scores, clipped to the image, sorted by
        score, source ``"fused:refine"``.
    """
    vote_sigma = check_real(vote_sigma, "vote_sigma", 0.0, low_open=True)
    vote_iou = check_iou_thr(vote_iou, "vote_iou")
    passed = soft_nms_pass(per_model, weights, sigma, thresh, decay, iou_thr)
    image_size, device = per_model[0].image_size, per_model[0].device
    if passed is None:
        return Detections.empty(image_size, source="fused:refine", device=device)
    pixel, normalized, scores, labels, kept_t, decayed_t = passed
    by_score = torch.argsort(decayed_t, descending=True, stable=True)
    kept_t, decayed_t = kept_t[by_score], decayed_t[by_score]
    voted = score_vote(pixel, normalized, scores, labels, kept_t, vote_iou, vote_sigma)
    height, width = image_size
    # A weighted average of clipped boxes lies in the image up to rounding; the clamp removes the rounding.
    voted = voted.float()
    voted[:, 0::2] = voted[:, 0::2].clamp(0, width)
    voted[:, 1::2] = voted[:, 1::2].clamp(0, height)
    return Detections(
        voted.to(device), decayed_t.float().to(device), labels[kept_t].to(device), image_size, "fused:refine"
    )
