"""The results table: ``{method: {metric: value}}`` as Markdown, and which cell is best in each column."""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = [
    "TABLE_COLUMNS", "REPEATED_COLUMNS", "LOWER_IS_BETTER", "CEILINGS", "is_measured", "cell_text", "markdown_table",
    "best_per_column",
]

#: (metric key, column title, format) of the results table.
TABLE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("map", "mAP", "{:.4f}"),
    ("map50", "AP50", "{:.3f}"),
    ("map75", "AP75", "{:.3f}"),
    ("map_small", "APs", "{:.3f}"),
    ("map_medium", "APm", "{:.3f}"),
    ("map_large", "APl", "{:.3f}"),
    ("ece", "ECE", "{:.3f}"),
    ("fusion_ms", "fusion ms/img", "{:.2f}"),
)

#: The columns of a table of repeated cross-validations: the means, and the mAP's spread over the seeds.
REPEATED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    TABLE_COLUMNS[0], ("map_sd", "mAP sd", "{:.4f}"), *TABLE_COLUMNS[1:]
)


def is_measured(value: float | None) -> bool:
    """Whether a table's ``value`` is a figure: not ``None`` (not measured), not below zero (pycocotools'
    ``-1`` for a size range with no object in it, which would read as an AP below zero) and not NaN (no
    figure either, and neither better nor worse than any). An evaluation record refuses NaN; a table given
    from Python may hold one."""
    return value is not None and not math.isnan(value) and float(value) >= 0


def cell_text(value: float | None, fmt: str) -> str:
    """A table cell: ``fmt`` of a value :func:`is_measured`, else ``-``."""
    return fmt.format(value) if is_measured(value) else "-"


def markdown_table(
    report: Mapping[str, Mapping[str, float]], columns: tuple[tuple[str, str, str], ...] = TABLE_COLUMNS
) -> str:
    """One row per method, in the report's order; a missing metric, or one not measured, prints as ``-``
    (:func:`cell_text`).

    Args:
        report: ``{method: {metric: value}}``. columns: (metric key, title, format) of each column.
    """
    header = "| method | " + " | ".join(title for _, title, _ in columns) + " |"
    rule = "|---|" + "---:|" * len(columns)
    rows = []
    for method, metrics in report.items():
        cells = [cell_text(metrics.get(key), fmt) for key, _, fmt in columns]
        name = method.replace("|", "\\|")  # TTA members are named like "yolo26n|hflip"
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join([header, rule, *rows])


#: Columns where the smallest value is best (the others: the largest).
LOWER_IS_BETTER: frozenset[str] = frozenset({"ece", "fusion_ms"})
#: Rows that read the ground truth of the images they fuse: ceilings, never "best".
CEILINGS: frozenset[str] = frozenset({"oracle"})


def best_per_column(report: Mapping[str, Mapping[str, float]]) -> dict[str, list[str]]:
    """``{metric key: [methods holding the best value]}`` for each of :data:`TABLE_COLUMNS`.

    Values not :func:`is_measured` and the :data:`CEILINGS` never win; ``fusion_ms`` is compared among fusion
    methods only, since a single model fuses nothing. Ties all win; a column no method reports is absent.
    """
    best: dict[str, list[str]] = {}
    for key, _, _ in TABLE_COLUMNS:
        candidates = {
            method: float(metrics[key])
            for method, metrics in report.items()
            if is_measured(metrics.get(key))
            and method not in CEILINGS
            and not (key == "fusion_ms" and method.startswith("single:"))
        }
        if not candidates:
            continue
        target = (min if key in LOWER_IS_BETTER else max)(candidates.values())
        best[key] = [method for method, value in candidates.items() if value == target]
    return best
