"""Every number of the report page, computed from an :class:`~detens.report.record.EvaluationRecord`.

The page's figures come from the pooled predictions that the table scored; the COCO run behind the curves
is checked against the table's own figures (:func:`check_same_run`), so the page and the table cannot
disagree without the report failing (by more than 1e-4 for a table scored by hotcoco, whose curves
pycocotools draws: :data:`OTHER_EVALUATOR_TOLERANCE`).
"""

from __future__ import annotations

import logging
from typing import Any

from detens.coco import CocoGroundTruth
from detens.coco_curves import CURVE_BACKENDS, coco_curves
from detens.error_breakdown import error_breakdown
from detens.report.record import EvaluationRecord
from detens.report.support import member_support
from detens.report.table import CEILINGS

__all__ = [
    "SAME_RUN_TOLERANCE", "OTHER_EVALUATOR_TOLERANCE", "curves_backend", "ordered_methods", "best_methods",
    "check_same_run", "class_deltas", "analyze_record",
]

logger = logging.getLogger(__name__)

#: The largest difference allowed between a metric recomputed from the record and the table's (the same
#: evaluator on the same results agrees to the last bit; faster-coco-eval and pycocotools to ~1e-15).
SAME_RUN_TOLERANCE = 1e-9
#: The same, where the curves come from another evaluator than the table's (pycocotools for a table scored
#: by hotcoco): the two agree to 1e-4 (tests/test_coco.py; equal scores may be taken in another order).
OTHER_EVALUATOR_TOLERANCE = 1e-4
_CHECKED = ("map", "map50", "map75", "map_small", "map_medium", "map_large")


def ordered_methods(metrics: dict[str, Any]) -> list[str]:
    """The table's rows, single models first, each group in the run's order."""
    return [m for m in metrics if m.startswith("single:")] + [m for m in metrics if not m.startswith("single:")]


def best_methods(metrics: dict[str, dict[str, float]]) -> tuple[str | None, str | None]:
    """(best single model, best fused method) by mAP; ``None`` where the table has no such row.
    Ceilings that read the ground truth (:data:`~detens.report.table.CEILINGS`) are never the best."""
    singles = {m: v["map"] for m, v in metrics.items() if m.startswith("single:")}
    fused = {m: v["map"] for m, v in metrics.items() if not m.startswith("single:") and m not in CEILINGS}
    return (max(singles, key=singles.get) if singles else None, max(fused, key=fused.get) if fused else None)


def curves_backend(backend: str) -> str:
    """The evaluator that draws the curves of a table scored by ``backend``: the same one where
    :func:`~detens.coco_curves.coco_curves` runs it, else (hotcoco) pycocotools, the reference."""
    return backend if backend in CURVE_BACKENDS else "pycocotools"


def check_same_run(
    method: str, table: dict[str, float], recomputed: dict[str, float], tolerance: float = SAME_RUN_TOLERANCE
) -> None:
    """Raise ``ValueError`` if the metrics recomputed from the record differ from the table's row by more
    than ``tolerance``."""
    for key in _CHECKED:
        if table.get(key) is not None and abs(float(table[key]) - recomputed[key]) > tolerance:
            raise ValueError(
                f"{method}: the record's predictions give {key} {recomputed[key]!r} but its table says "
                f"{table[key]!r}; the record does not hold the predictions this table scored"
            )


def class_deltas(
    single_ap: dict[int, float | None], fused_ap: dict[int, float | None], names: dict[int, str], count: int = 10
) -> dict[str, list[dict[str, Any]]]:
    """The ``count`` classes the fused method improved most and the ``count`` it degraded most.

    Returns:
        dict: ``{"improved": [...], "degraded": [...]}``, each ``{"category_id", "name", "single", "fused",
        "delta"}``, largest change first (ties by category id); classes without ground truth left out.
    """
    rows = [
        {"category_id": c, "name": names.get(c, str(c)), "single": s, "fused": fused_ap[c], "delta": fused_ap[c] - s}
        for c, s in single_ap.items()
        if s is not None and fused_ap.get(c) is not None
    ]
    improved = sorted((r for r in rows if r["delta"] > 0), key=lambda r: (-r["delta"], r["category_id"]))[:count]
    degraded = sorted((r for r in rows if r["delta"] < 0), key=lambda r: (r["delta"], r["category_id"]))[:count]
    return {"improved": improved, "degraded": degraded}


def analyze_record(record: EvaluationRecord, support_scores: tuple[float, ...] = (0.0, 0.3)) -> dict[str, Any]:
    """Curves, per-class AP, error breakdown and member support of every method of ``record``.

    Args:
        record (EvaluationRecord): one evaluation run.
        support_scores (tuple[float, ...]): the score thresholds of the member-support histograms.

    Returns:
        dict: ``methods`` (table order, singles first), ``best_single``, ``best_fused``, ``curves``
        (``{method: coco_curves(...)}`` less the metrics), ``errors`` (``{method: error_breakdown(...)}``),
        ``class_deltas`` (best fused vs best single, AP@[.5:.95]), ``support`` (``{str(score): {fused
        method: member_support(...)}}``, empty without members), ``scored_categories`` (the category ids
        COCOeval averages over: those with ground truth that counts in the scored images; the others have
        no AP, -1 in COCOeval, and are left out of every mean).

    The curves come from the table's evaluator (``meta["backend"]``) or, for a table scored by hotcoco, from
    pycocotools (:func:`curves_backend`); the table is then checked to :data:`OTHER_EVALUATOR_TOLERANCE`
    instead of :data:`SAME_RUN_TOLERANCE`.

    Raises:
        ValueError: the record's predictions do not give the record's table (:func:`check_same_run`).
    """
    truth = CocoGroundTruth(record.gt)
    image_ids = record.image_ids
    backend = record.meta.get("backend", "pycocotools")
    drawn_by = curves_backend(backend)
    tolerance = SAME_RUN_TOLERANCE if drawn_by == backend else OTHER_EVALUATOR_TOLERANCE
    methods = ordered_methods(record.metrics)
    curves, errors = {}, {}
    for method in methods:
        logger.info("report: %s", method)
        result = coco_curves(truth, record.results[method], image_ids, backend=drawn_by)
        check_same_run(method, record.metrics[method], result.pop("metrics"), tolerance)
        curves[method] = result
        errors[method] = error_breakdown(truth, record.results[method], image_ids)
    # the same ground truth under every method: any one's per-class AP says which classes have one
    class_ap = next(iter(curves.values()))["class_ap"] if curves else {}
    scored_categories = sorted(c for c, ap in class_ap.items() if ap is not None)
    best_single, best_fused = best_methods(record.metrics)
    deltas = None
    if best_single and best_fused:
        deltas = class_deltas(curves[best_single]["class_ap"], curves[best_fused]["class_ap"], truth.category_names)
    support: dict[str, dict[str, Any]] = {}
    if record.members:
        for score in support_scores:
            support[str(score)] = {
                m: member_support(truth, record.results[m], record.members, image_ids, min_score=score)
                for m in methods
                if not m.startswith("single:")
            }
    return {
        "methods": methods,
        "best_single": best_single,
        "best_fused": best_fused,
        "curves": curves,
        "errors": errors,
        "class_deltas": deltas,
        "support": support,
        "scored_categories": scored_categories,
    }
