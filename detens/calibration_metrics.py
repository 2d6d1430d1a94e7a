"""Calibration of detection scores: each detection labelled true/false positive as COCOeval does, then the
expected calibration error (ECE) over equal-width score bins. The labelling is COCOeval's own matching
(:mod:`detens.coco_match`).

Dimension legend: n labelled detections, B score bins.

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
    load_coco_gt,
    load_coco_results,
    validate_coco_results,
)
from detens.coco_match import IGNORED, TP, iter_matches

__all__ = ["detection_calibration"]

logger = logging.getLogger(__name__)


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
        clean = validate_coco_results(results, "results")  # scores in [0, 1]: compared with rates
    check_result_categories(truth, clean, "results")
    eval_ids = evaluated_image_ids(truth, image_ids)
    outside = sum(r["image_id"] not in truth for r in clean)
    if outside:
        logger.warning(
            "detection_calibration: dropped %d results on images absent from the ground truth", outside
        )

    scores: list[float] = []
    labels: list[int] = []
    # images without detections yield nothing to label: missed objects do not enter calibration
    for image in iter_matches(truth, clean, eval_ids, iou_thr, max_dets):
        scores += [d["score"] for d in image.detections]
        labels += image.labels

    score_array = np.asarray(scores, dtype=np.float64)  # [n + ignored]
    label_array = np.asarray(labels, dtype=np.int64)
    kept = label_array != IGNORED
    return _ece(score_array[kept], label_array[kept] == TP, bins, ignored=int((~kept).sum()))




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
