"""COCOeval's bbox matching, detection by detection, and its 101-point average precision.

pycocotools computes the matching inside ``COCOeval.evaluateImg`` and keeps only matrices of ids; the
calibration metrics, the error breakdown and the report need to know, for each detection, whether it is a
true positive, a false positive or ignored, and which ground-truth box it took. This module reproduces
that matching operation for operation (so a detection sitting exactly at a threshold gets COCOeval's
label) and ``COCOeval.accumulate``'s precision at the 101 recall thresholds (so an AP computed here is
bit-identical to pycocotools' for the same labels).

Dimension legend: D detections of one image and category, G ground-truth boxes of the same image and
category, R = 101 recall thresholds, K categories.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from detens.coco import CocoGroundTruth, group_results_by_image

__all__ = [
    "TP",
    "FP",
    "IGNORED",
    "RECALL_THRESHOLDS",
    "ImageMatches",
    "coco_iou",
    "match_category",
    "iter_matches",
    "precision_at_recalls",
    "mean_ap",
]

TP, FP, IGNORED = 1, 0, -1  # a detection's label

# COCOeval's "all" area range. Boxes outside it (area > 1e10 px²) are never met in practice, but they are
# handled as COCOeval handles them so that the labels are COCOeval's on any input.
_ALL_AREA = (0.0, 1e5**2)

#: COCOeval's ``recThrs``: ``np.linspace(0, 1, 101)`` written the way pycocotools writes it.
RECALL_THRESHOLDS: np.ndarray = np.linspace(0.0, 1.00, int(np.round((1.00 - 0.0) / 0.01)) + 1, endpoint=True)


def coco_iou(dt_boxes: np.ndarray, gt_boxes: np.ndarray, iscrowd: np.ndarray) -> np.ndarray:
    """pycocotools' ``bbIou``, operation for operation, so that the float64 results are bit-identical.

    Args:
        dt_boxes (ndarray[D, 4] float64): xywh.
        gt_boxes (ndarray[G, 4] float64): xywh.
        iscrowd (ndarray[G] bool): crowd boxes divide by the detection's area instead of the union.

    Returns:
        ndarray[D, G] float64.
    """
    dx, dy, dw, dh = (dt_boxes[:, i : i + 1] for i in range(4))  # [D, 1]
    gx, gy, gw, gh = (gt_boxes[None, :, i] for i in range(4))  # [1, G]
    w = np.minimum(dw + dx, gw + gx) - np.maximum(dx, gx)  # [D, G]
    h = np.minimum(dh + dy, gh + gy) - np.maximum(dy, gy)
    overlap = (w > 0) & (h > 0)
    inter = np.where(overlap, w * h, 0.0)
    dt_area = dw * dh  # [D, 1]
    union = np.where(iscrowd[None, :], dt_area, dt_area + gw * gh - inter)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(overlap, inter / np.where(overlap, union, 1.0), 0.0)


def match_category(
    dts: Sequence[Mapping[str, Any]], gts: Sequence[Mapping[str, Any]], iou_thr: float
) -> tuple[list[int], list[int]]:
    """COCOeval's matching of one image and category at one IoU threshold, area range "all".

    The loop of ``COCOeval.evaluateImg``: the ground truth that COCOeval ignores (crowds, and areas outside
    "all") goes after the rest, each group in annotation order; each detection, in the given order, takes
    the not-yet-taken box of highest IoU ``>= iou_thr`` (on equal IoU the later box); a crowd box can be
    taken any number of times and is tried only when no box that counts matches.

    Args:
        dts (list[dict]): COCO results of one image and category, already sorted by score, highest first,
            and cut to ``maxDets``.
        gts (list[dict]): the annotations of the same image and category, in annotation order.
        iou_thr (float): in ``(0, 1)``.

    Returns:
        (list[int], list[int]): per detection its label (:data:`TP`, :data:`FP` or :data:`IGNORED`: matched
        to a crowd box or outside the area range) and the index into ``gts`` of the box it took (``-1``
        when unmatched).
    """
    lo, hi = _ALL_AREA
    dt_area = [d["bbox"][2] * d["bbox"][3] for d in dts]
    if not gts:
        return [IGNORED if not lo <= a <= hi else FP for a in dt_area], [-1] * len(dts)
    crowd_flags = [bool(g.get("iscrowd", 0)) for g in gts]
    areas = [float(g["area"]) if "area" in g else float(g["bbox"][2]) * float(g["bbox"][3]) for g in gts]
    ignore_flags = [c or not lo <= a <= hi for c, a in zip(crowd_flags, areas, strict=True)]
    order = sorted(range(len(gts)), key=lambda g: ignore_flags[g])  # stable: annotation order kept
    gt_boxes = np.array([[float(v) for v in gts[g]["bbox"]] for g in order], dtype=np.float64)  # [G, 4]
    crowd = [crowd_flags[g] for g in order]
    ignore = [ignore_flags[g] for g in order]
    dt_boxes = np.array([d["bbox"] for d in dts], dtype=np.float64).reshape(-1, 4)  # [D, 4]
    ious = coco_iou(dt_boxes, gt_boxes, np.array(crowd, dtype=bool)).tolist()  # [D][G]

    taken = [False] * len(order)
    labels, matched = [], []
    for row, area in zip(ious, dt_area, strict=True):
        best, match = iou_thr, -1  # COCOeval caps the threshold at 1 - 1e-10; iou_thr < 1 never needs it
        for g, iou in enumerate(row):
            if taken[g] and not crowd[g]:
                continue
            # a match with a box that counts ends the search before the boxes COCOeval ignores
            if match > -1 and not ignore[match] and ignore[g]:
                break
            if iou < best:
                continue
            best, match = iou, g  # `>=`: on equal IoU the later box wins, as in pycocotools
        if match == -1:
            labels.append(IGNORED if not lo <= area <= hi else FP)
            matched.append(-1)
            continue
        taken[match] = True
        labels.append(IGNORED if ignore[match] else TP)
        matched.append(order[match])
    return labels, matched


@dataclass
class ImageMatches:
    """COCOeval's view of one image at one IoU threshold.

    Attributes:
        image_id (int): the image.
        detections (list[dict]): the detections COCOeval keeps (the top ``maxDets`` of each category),
            grouped by category (ascending), each group sorted by score as COCOeval sorts it.
        labels (list[int]): per detection :data:`TP`, :data:`FP` or :data:`IGNORED`.
        matched (list[int]): per detection the index into ``annotations`` of the box it took, or ``-1``.
        annotations (list[dict]): the image's annotations of the evaluated categories, in file order.
    """

    image_id: int
    detections: list[dict[str, Any]]
    labels: list[int]
    matched: list[int]
    annotations: list[dict[str, Any]]


def iter_matches(
    truth: CocoGroundTruth,
    results: Sequence[Mapping[str, Any]],
    image_ids: Sequence[int],
    iou_thr: float = 0.5,
    max_dets: int = 100,
) -> Iterator[ImageMatches]:
    """COCOeval's matching of every image of ``image_ids`` (in the given order; COCOeval's is ascending).

    Per image and category the detections are sorted by score, highest first, ties kept in the order of
    ``results`` (pycocotools' mergesort), and cut to ``max_dets``; then :func:`match_category`.
    Detections of categories the ground truth does not define are left out. An image without detections
    is yielded too (its annotations are what the detector missed).

    Args:
        truth (CocoGroundTruth): the ground truth.
        results (list[dict]): validated COCO results (any images; those outside ``image_ids`` are skipped).
        image_ids (list[int]): the images, each in ``truth``.
        iou_thr (float): in ``(0, 1)``.
        max_dets (int): detections kept per image and category.
    """
    categories = set(truth.category_ids)
    by_image = group_results_by_image(results)
    for image_id in image_ids:
        annotations = [a for a in truth.annotations(image_id) if int(a["category_id"]) in categories]
        kept, labels, matched = [], [], []
        detections = by_image.get(image_id, [])
        for category in sorted({d["category_id"] for d in detections} & categories):
            dts = [d for d in detections if d["category_id"] == category]
            dts = sorted(dts, key=lambda d: -d["score"])[:max_dets]  # sorted() is stable, like mergesort
            index = [i for i, a in enumerate(annotations) if int(a["category_id"]) == category]
            category_labels, category_matched = match_category(dts, [annotations[i] for i in index], iou_thr)
            kept += dts
            labels += category_labels
            matched += [index[m] if m >= 0 else -1 for m in category_matched]
        yield ImageMatches(image_id, kept, labels, matched, annotations)


def precision_at_recalls(scores: np.ndarray, labels: np.ndarray, num_positives: int) -> np.ndarray:
    """One category's interpolated precision at the 101 recall thresholds, as ``COCOeval.accumulate``.

    Args:
        scores (ndarray[D] float64): the category's detections over all images, concatenated in COCOeval's
            order (images ascending, each image's detections as :func:`iter_matches` keeps them).
        labels (ndarray[D] int): :data:`TP`, :data:`FP` or :data:`IGNORED` (ignored ones still take a place
            in the cumulative sums, as in pycocotools, which keeps the result bit-identical).
        num_positives (int): the category's ground-truth boxes that count (not crowd), ``>= 1``.

    Returns:
        ndarray[R] float64: the precision at each recall threshold (0 beyond the highest recall reached).
    """
    order = np.argsort(-scores, kind="mergesort")
    labels = np.asarray(labels)[order]
    tps = labels == TP
    fps = labels == FP
    tp = np.cumsum(tps).astype(np.float64)  # [D]
    fp = np.cumsum(fps).astype(np.float64)
    recall = tp / num_positives
    precision = (tp / (fp + tp + np.spacing(1))).tolist()
    for i in range(len(precision) - 1, 0, -1):  # the envelope: precision never rises with recall
        if precision[i] > precision[i - 1]:
            precision[i - 1] = precision[i]
    q = np.zeros(len(RECALL_THRESHOLDS))
    index = np.searchsorted(recall, RECALL_THRESHOLDS, side="left")
    for r, i in enumerate(index):
        if i >= len(precision):
            break
        q[r] = precision[i]
    return q


def mean_ap(per_category: Mapping[int, tuple[np.ndarray, np.ndarray, int]], categories: Sequence[int]) -> float:
    """COCO AP at one IoU threshold: the mean of the precision table ``[R, K]`` over categories with ground truth.

    Args:
        per_category (dict[int, (scores, labels, num_positives)]): per category what
            :func:`precision_at_recalls` takes; a category absent or with ``num_positives == 0`` has no
            ground truth and is left out, as COCOeval leaves it out.
        categories (list[int]): the evaluated categories, in COCOeval's order (ascending ids).

    Returns:
        float: the AP, or ``-1.0`` when no category has ground truth (pycocotools' value).
    """
    table = -np.ones((len(RECALL_THRESHOLDS), len(categories)))  # [R, K]
    for k, category in enumerate(categories):
        scores, labels, positives = per_category.get(category, (np.zeros(0), np.zeros(0, dtype=int), 0))
        if positives > 0:
            table[:, k] = precision_at_recalls(np.asarray(scores, dtype=np.float64), labels, positives)
    valid = table[table > -1]
    return float(np.mean(valid)) if valid.size else -1.0
