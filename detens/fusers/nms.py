"""Selection fusers: class-wise NMS and Soft-NMS over the boxes of all models (ensemble_boxes semantics).

Dimension legend: N models, K boxes of all models together, G box groups, T boxes in the largest group.

Both follow ``ensemble_boxes.nms_method`` (1.0.9): with ``weights``, model n's scores are multiplied
by ``w_n / Σw``; boxes are clipped to the image and zero-area boxes dropped; each class is processed
independently. IoUs are computed on normalized float64 boxes, as the reference does. Unlike the
reference, Soft-NMS returns the DECAYED scores (ensemble_boxes returns the original ones, so its
Soft-NMS only ever removes boxes), the output is sorted by score, and the caller's lists are never
modified. Boxes of equal score are taken by label, then coordinates (the reference takes them in numpy's
unspecified order of ties), so that the result does not depend on the order of the models: where scores
tie the two may keep different boxes. The linear Soft-NMS's ``iou_thr`` defaults to 0.3, the Soft-NMS
paper's N_t (ensemble_boxes' default is 0.5).

Soft-NMS visits a group's boxes one at a time against all the others of the group, so its time grows with
the square of the largest group: on a crowded image no gap splits a class, and one model's 100,000 boxes
spread evenly over a 100,000 px square image take 52 s in three classes, more than 400 s in one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from torch import Tensor
from torchvision.ops import batched_nms

from detens.checks import check_choice, check_iou_thr, check_real
from detens.detections import Detections, compute_device
from detens.fusers._lockstep import disjoint_groups, lockstep_layout
from detens.fusers._order import lexicographic_order
from detens.fusers._registry import FUSERS, check_weights
from detens.matching import check_per_model

__all__ = ["nms_fusion", "soft_nms_fusion"]


def _weighted_boxes(
    per_model: Sequence[Detections], weights: Sequence[float] | Tensor | None, device: torch.device
) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """All models' boxes, prepared as ensemble_boxes' ``nms_method`` does.

    Returns:
        pixel boxes clipped to the image (Tensor[K, 4] float32), normalized boxes (Tensor[K, 4] float64),
        weighted scores (Tensor[K] float64), labels (Tensor[K]); zero-area boxes dropped, the rest in
        :func:`_canonical_order`. None if no box is left.
    """
    w = check_weights(weights, len(per_model), device)  # [N] float64
    height, width = per_model[0].image_size
    # Selection is not differentiable: inputs that require grad are read as plain data.
    pixel = torch.cat([d.boxes for d in per_model]).detach().to(device)  # [K, 4]
    scale = torch.tensor([width, height, width, height], dtype=torch.float64, device=device)
    normalized = (pixel.double() / scale).clamp(0.0, 1.0)
    scores = torch.cat([d.scores for d in per_model]).detach().to(device, torch.float64)  # [K]
    labels = torch.cat([d.labels for d in per_model]).to(device)
    if weights is not None:
        model = torch.cat([torch.full((len(d),), i, device=device) for i, d in enumerate(per_model)]).long()
        scores = scores * w[model] / w.sum()
    area = (normalized[:, 2] - normalized[:, 0]) * (normalized[:, 3] - normalized[:, 1])
    keep = (area > 0).nonzero().squeeze(1)
    if keep.numel() == 0:
        return None
    pixel = torch.stack(
        [pixel[:, 0].clamp(0, width), pixel[:, 1].clamp(0, height), pixel[:, 2].clamp(0, width), pixel[:, 3].clamp(0, height)],
        dim=1,
    )
    keep = keep[_canonical_order(normalized[keep], scores[keep], labels[keep])]
    return pixel[keep], normalized[keep], scores[keep], labels[keep]


def _canonical_order(normalized: Tensor, scores: Tensor, labels: Tensor) -> Tensor:
    """Tensor[K]: the boxes by decreasing score, equal scores by label, then by coordinates.

    Which of two boxes of equal score a selection keeps must not depend on the order the models were
    passed in (INT8 detectors quantize their scores, so equal scores are common).
    """
    return lexicographic_order([-scores, labels, *normalized.unbind(1)])


@FUSERS.register("nms")
def nms_fusion(
    per_model: Sequence[Detections], weights: Sequence[float] | Tensor | None = None, iou_thr: float = 0.5
) -> Detections:
    """Class-wise NMS over the boxes of all models.

    Args:
        per_model (list[Detections]): one per model, same image and device.
        weights (Sequence[float] | Tensor[N] | None): model n's scores are multiplied by ``w_n / Σw``
            (as ensemble_boxes does); None leaves the scores as they are.
        iou_thr (float): in [0, 1); a box is suppressed by a higher-scoring box of its class at IoU >
            ``iou_thr``.

    Returns:
        Detections: the kept boxes, clipped to the image, sorted by score, source ``"fused:nms"``.
    """
    check_per_model(per_model)
    iou_thr = check_iou_thr(iou_thr)
    image_size, device = per_model[0].image_size, per_model[0].device
    prepared = _weighted_boxes(per_model, weights, compute_device(device))
    if prepared is None:
        return Detections.empty(image_size, source="fused:nms", device=device)
    pixel, normalized, scores, labels = prepared
    # batched_nms offsets each class's boxes by its id times the largest coordinate: with a large id the
    # offset leaves float64 too few bits for the boxes, so it is given the classes' ranks instead.
    classes = torch.unique(labels, return_inverse=True)[1]
    # the boxes are in canonical order (_weighted_boxes): strictly decreasing stand-in scores make every
    # device's sort keep that order, ties included
    rank = torch.arange(scores.numel(), 0, -1, dtype=torch.float64, device=scores.device)
    keep = batched_nms(normalized, rank, classes, iou_thr)  # sorted by decreasing score
    return Detections(
        pixel[keep].to(device), scores[keep].float().to(device), labels[keep].to(device), image_size, "fused:nms"
    )


def _soft_nms_lockstep(
    normalized: Tensor, scores: Tensor, labels: Tensor, iou_thr: float, sigma: float, thresh: float, linear: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Soft-NMS of every class at once; within a class, spatially separated groups too.

    A box only decays the boxes it overlaps (IoU > 0), so separated groups are independent and advance
    in lockstep: at step t every group selects its best remaining box and decays the rest of the group.
    Groups of similar size share one lockstep (a tier), so small groups are not padded to the largest.

    Returns:
        kept (ndarray[k] int64): indices of the kept boxes, decayed (ndarray[k] float64): their scores.
    """
    # Within a group, boxes by descending score: the first of equal scores is selected first.
    order = torch.argsort(scores, descending=True, stable=True)
    layout = lockstep_layout(disjoint_groups(normalized[order], labels[order], margin=0.0))
    row, col = layout.row.numpy(), layout.col.numpy()
    by_row = np.argsort(row, kind="stable")  # boxes row by row
    sizes = np.bincount(row, minlength=layout.num_groups)  # [G] descending
    row_start = np.concatenate([[0], np.cumsum(sizes)])
    data = np.concatenate([normalized[order].numpy(), scores[order].numpy()[:, None]], axis=1)  # [K, 5]
    index = order.numpy()

    kept: list[np.ndarray] = []
    decayed: list[np.ndarray] = []
    first = 0
    while first < layout.num_groups:
        width = int(sizes[first])
        last = first + int(np.count_nonzero(sizes[first:] > width // 2))  # rows [first, last): one tier
        members = by_row[row_start[first] : row_start[last]]
        tier_row, tier_col = row[members] - first, col[members]
        tier_sizes = sizes[first:last]
        active = [int(a) for a in np.count_nonzero(tier_sizes[None, :] > np.arange(width)[:, None], axis=1)]
        _soft_nms_tier(data[members], index[members], tier_row, tier_col, last - first, width, active,
                       iou_thr, sigma, thresh, linear, kept, decayed)
        first = last
    if not kept:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    return np.concatenate(kept), np.concatenate(decayed)


@np.errstate(divide="ignore", invalid="ignore")
def _soft_nms_tier(
    data: np.ndarray,
    index: np.ndarray,
    row: np.ndarray,
    col: np.ndarray,
    num_rows: int,
    width: int,
    active: list[int],
    iou_thr: float,
    sigma: float,
    thresh: float,
    linear: bool,
    kept: list[np.ndarray],
    decayed: list[np.ndarray],
) -> None:
    """Lockstep Soft-NMS of one tier of groups (rows ordered by size); appends to ``kept`` and ``decayed``.

    Args:
        data (ndarray[k, 5]): normalized box and score of the tier's boxes; index (ndarray[k]): their ids.
        row, col (ndarray[k]): their group (row) in the tier and position in the group.
        active (list[int]): ``active[t]`` = number of rows with more than t boxes.
    """
    boxes = np.zeros((4, num_rows, width))  # [4, R, T], padding is never selected
    boxes[:, row, col] = data[:, :4].T
    remaining = np.full((num_rows, width), -1.0)  # [R, T] current score; -1 = padding or selected
    remaining[row, col] = data[:, 4]
    ids = np.zeros((num_rows, width), dtype=np.int64)
    ids[row, col] = index
    areas = (boxes[2] - boxes[0]) * (boxes[3] - boxes[1])  # [R, T]
    rows = np.arange(num_rows)
    for step_rows in active:
        r = rows[:step_rows]
        current = remaining[:step_rows]  # [A, T] a view: updates below write through
        best = current.argmax(1)  # [A]
        best_score = current[r, best]
        alive = best_score > thresh  # [A] a group whose best is below thresh is finished for good
        if not alive.any():
            break
        kept.append(ids[r[alive], best[alive]])
        decayed.append(best_score[alive])
        current[r, best] = -1.0
        chosen = boxes[:, r, best]  # [4, A]
        # IoU as the reference computes it.
        top_left = np.maximum(boxes[0:2, :step_rows], chosen[0:2, :, None])  # [2, A, T]
        extent = np.minimum(boxes[2:4, :step_rows], chosen[2:4, :, None])
        extent -= top_left
        np.maximum(extent, 0.0, out=extent)
        inter = extent[0] * extent[1]  # [A, T]
        iou = inter / (areas[r, best][:, None] + areas[:step_rows] - inter)
        if linear:
            decay = np.where(iou > iou_thr, 1.0 - iou, 1.0)
        else:
            decay = np.exp(-(iou * iou) / sigma)
        np.multiply(current, decay, out=current, where=(current >= 0) & alive[:, None])


def soft_nms_pass(
    per_model: Sequence[Detections],
    weights: Sequence[float] | Tensor | None,
    sigma: float,
    thresh: float,
    decay: str,
    iou_thr: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor] | None:
    """Check the Soft-NMS options, then run class-wise Soft-NMS over the boxes of all models on the CPU.

    Returns:
        None when no model has a box; else ``(pixel (Tensor[K, 4]), normalized (Tensor[K, 4]), scores
        (Tensor[K]), labels (Tensor[K]))`` of every weighted input box and ``kept (Tensor[M])`` (indices
        into them), ``decayed (Tensor[M])`` (their decayed scores), on the CPU.
    """
    check_per_model(per_model)
    check_choice(decay, "decay", ("gaussian", "linear"))
    iou_thr = check_iou_thr(iou_thr)
    sigma = check_real(sigma, "sigma", 0.0, low_open=True)
    thresh = check_real(thresh, "thresh", 0.0, 1.0, high_open=True)
    # Sequential within a group, like WBF: numpy on the CPU, then back to the input device.
    prepared = _weighted_boxes(per_model, weights, torch.device("cpu"))
    if prepared is None:
        return None
    pixel, normalized, scores, labels = prepared
    kept, decayed = _soft_nms_lockstep(normalized, scores, labels, iou_thr, sigma, thresh, decay == "linear")
    return pixel, normalized, scores, labels, torch.from_numpy(kept), torch.from_numpy(decayed)


@FUSERS.register("soft_nms")
def soft_nms_fusion(
    per_model: Sequence[Detections],
    weights: Sequence[float] | Tensor | None = None,
    iou_thr: float = 0.3,
    sigma: float = 0.5,
    thresh: float = 0.001,
    decay: Literal["gaussian", "linear"] = "gaussian",
) -> Detections:
    """Class-wise Soft-NMS over the boxes of all models, returning the decayed scores.

    Repeatedly keeps the best remaining box of a class and decays the others by their IoU u with it:
    ``decay="gaussian"`` multiplies by exp(−u²/σ) (``iou_thr`` unused), ``"linear"`` by (1 − u) where
    u > ``iou_thr``. Boxes whose decayed score falls to ``thresh`` or below are dropped.

    The decay is chosen with ``decay``, not ``method`` (ensemble_boxes' name, ``method=1|2``): ``method``
    is ``detens.fuse``'s own argument, so ``fuse(per_model, "soft_nms", decay="linear")`` works.

    Args:
        per_model (list[Detections]): one per model, same image and device.
        weights (Sequence[float] | Tensor[N] | None): model n's scores are multiplied by ``w_n / Σw``
            (as ensemble_boxes does); None leaves the scores as they are.
        iou_thr (float): the linear method's overlap threshold, in [0, 1) (default 0.3, the Soft-NMS paper's
            N_t; ensemble_boxes' default is 0.5).
        sigma (float): the Gaussian method's width.
        thresh (float): minimum decayed score to keep a box.
        decay (str): ``"gaussian"`` or ``"linear"``.

    Returns:
        Detections: kept boxes with their decayed scores, clipped to the image, sorted by score,
        source ``"fused:soft_nms"``.
    """
    passed = soft_nms_pass(per_model, weights, sigma, thresh, decay, iou_thr)
    image_size, device = per_model[0].image_size, per_model[0].device
    if passed is None:
        return Detections.empty(image_size, source="fused:soft_nms", device=device)
    pixel, _, _, labels, kept_t, decayed_t = passed
    by_score = torch.argsort(decayed_t, descending=True, stable=True)
    kept_t, decayed_t = kept_t[by_score], decayed_t[by_score]
    return Detections(
        pixel[kept_t].to(device), decayed_t.float().to(device), labels[kept_t].to(device), image_size, "fused:soft_nms"
    )
