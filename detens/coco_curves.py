"""Precision-recall curves and per-class AP from the same COCOeval run that gives the summary metrics.

:func:`~detens.coco.evaluate_coco` keeps only ``COCOeval.stats``; the report also needs the precision table
that ``COCOeval.accumulate`` builds (``eval["precision"]``, ``[T, R, K, A, M]``: IoU thresholds, recall
thresholds, categories, area ranges, max detections). :func:`coco_curves` runs the evaluator
``evaluate_coco`` runs, on the same results and images, and returns its stats beside the curves, so a
caller can check that the curves belong to the figures of its table.

Dimension legend: R = 101 recall thresholds, K categories.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from detens.coco import (
    METRIC_KEYS,
    CocoGroundTruth,
    _captured_stdout,
    _faster_evaluator,
    _results_coco,
    check_result_categories,
    evaluated_image_ids,
    load_coco_gt,
    load_coco_results,
    validate_coco_results,
)

__all__ = ["CURVE_BACKENDS", "CURVE_IOUS", "coco_curves"]

#: The evaluators :func:`coco_curves` runs. A table scored by hotcoco gets pycocotools' curves
#: (:func:`detens.report.analysis.curves_backend`): hotcoco's figures are within 1e-4 of them (tests/test_coco.py).
CURVE_BACKENDS: tuple[str, ...] = ("pycocotools", "faster")

#: IoU thresholds of the returned precision-recall curves (indices 0 and 5 of COCOeval's ``iouThrs``).
CURVE_IOUS: tuple[float, ...] = (0.5, 0.75)

_AREA_ALL, _MAX_DETS_100 = 0, 2  # indices into COCOeval's areaRng and maxDets


def coco_curves(
    gt: str | Path | Mapping[str, Any] | CocoGroundTruth,
    results: Sequence[Mapping[str, Any]] | str | Path,
    image_ids: Iterable[int] | None = None,
    backend: Literal["pycocotools", "faster"] = "pycocotools",
) -> dict[str, Any]:
    """COCOeval's summary metrics, class-averaged precision-recall curves and per-class AP.

    Args:
        gt, results, image_ids, backend: as :func:`~detens.coco.evaluate_coco` takes them (the same
            images are evaluated, the same results dropped).

    Returns:
        dict: ``metrics`` (:data:`~detens.coco.METRIC_KEYS`, what ``evaluate_coco`` returns for these
        arguments); ``recall`` (list[R], the recall thresholds); ``precision`` (``{"0.5": list[R],
        "0.75": list[R]}``: COCO's interpolated precision at each recall threshold, averaged over the
        categories with ground truth, area "all", 100 detections; its mean is AP50 / AP75); ``class_ap``
        and ``class_ap50`` (``{category_id: AP@[.5:.95] | AP@.5}``, ``None`` for a category without ground
        truth in these images).
    """
    from pycocotools.cocoeval import COCOeval

    if backend not in CURVE_BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(CURVE_BACKENDS)}, got {backend!r}")
    truth = load_coco_gt(gt)
    clean = load_coco_results(results) if isinstance(results, (str, Path)) else validate_coco_results(results)
    eval_ids = evaluated_image_ids(truth, image_ids)
    check_result_categories(truth, clean, "results")
    wanted = set(eval_ids)
    clean = [r for r in clean if r["image_id"] in wanted]
    if backend == "faster":
        evaluator = _faster_evaluator(truth, clean)
    else:
        evaluator = COCOeval(truth.coco, _results_coco(truth.coco, clean), iouType="bbox")
    evaluator.params.imgIds = eval_ids
    with _captured_stdout("curves"):
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()

    precision = np.asarray(evaluator.eval["precision"])[:, :, :, _AREA_ALL, _MAX_DETS_100]  # [T, R, K]
    ious = np.asarray(evaluator.params.iouThrs)
    curves = {}
    for iou in CURVE_IOUS:
        table = precision[int(np.argmin(np.abs(ious - iou)))]  # [R, K]
        valid = table[:, (table > -1).all(axis=0)]  # categories with ground truth
        curves[str(iou)] = (valid.mean(axis=1) if valid.shape[1] else np.zeros(len(table))).tolist()
    class_ap, class_ap50 = {}, {}
    for k, category in enumerate(evaluator.params.catIds):
        column = precision[:, :, k]  # [T, R]
        has_gt = bool((column > -1).all())
        class_ap[int(category)] = float(column.mean()) if has_gt else None
        class_ap50[int(category)] = float(column[0].mean()) if has_gt else None
    return {
        "metrics": dict(zip(METRIC_KEYS, (float(v) for v in evaluator.stats), strict=True)),
        "recall": [float(r) for r in evaluator.params.recThrs],
        "precision": curves,
        "class_ap": class_ap,
        "class_ap50": class_ap50,
    }
