"""Calibration of detection scores: each detection labelled true/false positive as COCOeval does, then the
expected calibration error (ECE) over equal-width score bins.

Dimension legend: D detections of one image and category, G ground-truth boxes of the same image and
category, B score bins.

A detector is calibrated when, among the detections it scores ``s``, a fraction ``s`` are true positives.
The reliability curve plots, per score bin, the mean score against the true-positive rate;
:func:`detens.report.plot_reliability` draws it from what :func:`detection_calibration` returns.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from detens.checks import check_integer, check_real
from detens.coco import (
    CocoGroundTruth,
    check_result_categories,
    evaluated_image_ids,
    group_results_by_image,
    load_coco_gt,
    load_coco_results,
    validate_coco_results,
)

__all__ = ["detection_calibration"]

logger = logging.getLogger(__name__)

# COCOeval's "all" area range. Boxes outside it (area > 1e10 px²) are never met in practice, but they are
# handled as COCOeval handles them so that the labels are COCOeval's on any input.
_ALL_AREA = (0.0, 1e5**2)

_TP, _FP, _IGNORED = 1, 0, -1  # a detection's label


def detection_calibration(
    gt: CocoGroundTruth | Mapping[str, Any] | str | Path,
    results: Sequence[Mapping[str, Any]] | str | Path,
    image_ids: Iterable[int] | None = None,
    bins: int = 10,
    iou_thr: float = 0.5,
    max_dets: int = 100,
) -> dict[str, Any]:
    """Expected calibration error and reliability bins of COCO detections.

    Each detection is labelled exactly as ``pycocotools.cocoeval.COCOeval.evaluateImg`` labels it for the
    area range "all" at IoU threshold ``iou_thr`` and ``maxDets = max_dets``:

    * per image **and per category** (pycocotools keeps the top ``maxDets`` of each image-category pair,
      not of the image), the detections are sorted by score, highest first, ties kept in the order of
      ``results`` (a stable sort), and only the first ``max_dets`` are kept; the rest are dropped;
    * in that order each detection is matched to the not-yet-matched ground-truth box of its category
      with the highest IoU ``>= iou_thr`` (on equal IoU, the later annotation, as pycocotools does);
      non-crowd boxes are tried first, crowd boxes (``iscrowd=1``) only when no non-crowd box matches.
      A crowd box can absorb any number of detections, and its IoU is the intersection over the
      *detection's* area;
    * matched to a non-crowd box: true positive; matched to a crowd box: ignored (left out of every
      statistic, as COCOeval leaves it out of AP); unmatched: false positive.

    IoU is computed like pycocotools' ``bbIou``: in float64 on the ``[x, y, w, h]`` boxes as written in
    the annotation file and the results (not on the float32 xyxy boxes of ``CocoGroundTruth.targets``),
    so that a detection sitting exactly at the threshold gets the same label.

    The scores are then put in ``bins`` equal-width bins ``[b / bins, (b + 1) / bins)`` (the last bin
    includes 1) and::

        ECE = sum_b (n_b / n) * |mean_score_b - tp_rate_b|

    Args:
        gt: the ground truth, a :class:`~detens.coco.CocoGroundTruth` (or anything
            :func:`~detens.coco.load_coco_gt` accepts). Never modified.
        results: COCO result dicts (``image_id``, ``category_id``, ``bbox`` xywh pixels, ``score`` in
            ``[0, 1]``) or the path of a results JSON file. Never modified. Results on images outside
            ``image_ids`` are dropped (those on images absent from ``gt`` with a warning).
        image_ids: the images to evaluate, each in ``gt``; by default ``gt.annotated_image_ids``, as in
            :func:`~detens.coco.evaluate_coco` (an image without annotations is a negative image: all its
            detections are false positives).
        bins (int): number of score bins, ``>= 1``.
        iou_thr (float): IoU threshold, in ``(0, 1)``.
        max_dets (int): detections kept per image and category, ``>= 1``.

    Returns:
        dict: ``{"ece": float, "count": int, "tp": int, "ignored": int, "bins": [...]}`` where ``count``
        is the number of detections in the statistics (true and false positives), ``tp`` the number of
        true positives, ``ignored`` the number of detections matched to crowd regions, and ``bins`` has
        one dict per bin, in score order: ``{"lo": float, "hi": float, "count": int,
        "mean_score": float | None, "tp_rate": float | None}`` (``None`` for an empty bin). No
        detection to score (empty ``results``, say) is a normal case: ``ece`` 0.0, ``count`` 0 and
        every bin empty.

    Raises:
        TypeError: ``gt`` is not a ground truth, ``results`` is not a list of result dicts, or ``bins``,
            ``iou_thr``, ``max_dets`` have the wrong type.
        ValueError: ``bins < 1``, ``iou_thr`` outside ``(0, 1)``, ``max_dets < 1``, a score outside
            ``[0, 1]``, a ``category_id`` the ground truth does not define, an ``image_ids`` entry not in
            the ground truth, an empty ``image_ids``, or a malformed result (naming its index and field).
    """
    bins = check_integer(bins, "bins", 1)
    max_dets = check_integer(max_dets, "max_dets", 1)
    iou_thr = check_real(iou_thr, "iou_thr", 0.0, 1.0, low_open=True, high_open=True)

    truth = load_coco_gt(gt)
    if isinstance(results, (str, Path)):
        clean = load_coco_results(results)
    else:
        clean = validate_coco_results(results, "results")
    for i, r in enumerate(clean):
        if not 0.0 <= r["score"] <= 1.0:
            raise ValueError(
                f"results[{i}].score = {r['score']!r} is outside [0, 1]; calibration compares scores with "
                "true-positive rates, so scores must be probabilities"
            )
    check_result_categories(truth, clean, "results")
    categories = set(truth.category_ids)
    eval_ids = evaluated_image_ids(truth, image_ids)
    outside = sum(r["image_id"] not in truth for r in clean)
    if outside:
        logger.warning(
            "detection_calibration: dropped %d results on images absent from the ground truth", outside
        )

    by_image = group_results_by_image(clean)
    scores: list[float] = []
    labels: list[int] = []
    for image_id in eval_ids:
        detections = by_image.get(image_id, [])
        if not detections:
            continue  # no detection, nothing to label: missed objects do not enter calibration
        annotations = [a for a in truth.annotations(image_id) if int(a["category_id"]) in categories]
        for category in sorted({d["category_id"] for d in detections}):
            dts = [d for d in detections if d["category_id"] == category]
            gts = [a for a in annotations if int(a["category_id"]) == category]
            dts = sorted(dts, key=lambda d: -d["score"])[:max_dets]  # sorted() is stable, like mergesort
            scores += [d["score"] for d in dts]
            labels += _label(dts, gts, iou_thr)

    score_array = np.asarray(scores, dtype=np.float64)  # [n + ignored]
    label_array = np.asarray(labels, dtype=np.int64)
    kept = label_array != _IGNORED
    return _ece(score_array[kept], label_array[kept] == _TP, bins, ignored=int((~kept).sum()))


def _bbox_iou(dt_boxes: np.ndarray, gt_boxes: np.ndarray, iscrowd: np.ndarray) -> np.ndarray:
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


def _label(dts: list[dict[str, Any]], gts: list[dict[str, Any]], iou_thr: float) -> list[int]:
    """``_TP``, ``_FP`` or ``_IGNORED`` for each detection of one image and category (sorted by score).

    The loop of ``COCOeval.evaluateImg`` for one threshold, with its ground truth order: boxes COCOeval
    ignores (crowds, and areas outside "all") after the others, each group in annotation order.
    """
    lo, hi = _ALL_AREA
    dt_area = [d["bbox"][2] * d["bbox"][3] for d in dts]
    if not gts:
        return [_IGNORED if not lo <= a <= hi else _FP for a in dt_area]
    crowd_flags = [bool(g.get("iscrowd", 0)) for g in gts]
    areas = [float(g["area"]) if "area" in g else float(g["bbox"][2]) * float(g["bbox"][3]) for g in gts]
    ignore_flags = [c or not lo <= a <= hi for c, a in zip(crowd_flags, areas, strict=True)]
    order = sorted(range(len(gts)), key=lambda g: ignore_flags[g])  # stable: annotation order kept
    gt_boxes = np.array([[float(v) for v in gts[g]["bbox"]] for g in order], dtype=np.float64)  # [G, 4]
    crowd = [crowd_flags[g] for g in order]
    ignore = [ignore_flags[g] for g in order]
    dt_boxes = np.array([d["bbox"] for d in dts], dtype=np.float64)  # [D, 4]
    ious = _bbox_iou(dt_boxes, gt_boxes, np.array(crowd, dtype=bool)).tolist()  # [D][G]

    taken = [False] * len(order)
    labels = []
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
            labels.append(_IGNORED if not lo <= area <= hi else _FP)
            continue
        taken[match] = True
        labels.append(_IGNORED if ignore[match] else _TP)
    return labels


def _ece(scores: np.ndarray, tp: np.ndarray, bins: int, ignored: int) -> dict[str, Any]:
    """ECE and per-bin statistics of ``scores (ndarray[n] float64)`` labelled ``tp (ndarray[n] bool)``."""
    # b / bins (one correctly rounded division) rather than linspace, whose 3 * 0.1 would put a score of
    # 0.3 in the bin [0.2, 0.3)
    edges = np.arange(bins + 1, dtype=np.float64) / bins  # [B + 1]
    index = np.clip(np.searchsorted(edges, scores, side="right") - 1, 0, bins - 1)  # [n]
    counts = np.bincount(index, minlength=bins)  # [B]
    score_sums = np.bincount(index, weights=scores, minlength=bins)
    tp_sums = np.bincount(index, weights=tp.astype(np.float64), minlength=bins)
    n = int(scores.size)
    ece = 0.0
    table = []
    for b in range(bins):
        count = int(counts[b])
        mean_score = tp_rate = None
        if count:
            mean_score = float(score_sums[b] / count)
            tp_rate = float(tp_sums[b] / count)
            ece += count / n * abs(mean_score - tp_rate)
        table.append(
            {
                "lo": float(edges[b]),
                "hi": float(edges[b + 1]),
                "count": count,
                "mean_score": mean_score,
                "tp_rate": tp_rate,
            }
        )
    return {"ece": float(ece), "count": n, "tp": int(tp.sum()), "ignored": ignored, "bins": table}
