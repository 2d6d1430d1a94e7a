"""Evaluation reports: a Markdown table and a bar chart of ``{method: {metric: value}}``, and a reliability
diagram of ``{method: detection_calibration(...)}``."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["TABLE_COLUMNS", "markdown_table", "plot_report", "plot_reliability"]

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


def markdown_table(report: Mapping[str, Mapping[str, float]]) -> str:
    """One row per method, in the report's order; a missing metric prints as ``-``."""
    header = "| method | " + " | ".join(title for _, title, _ in TABLE_COLUMNS) + " |"
    rule = "|---|" + "---:|" * len(TABLE_COLUMNS)
    rows = []
    for method, metrics in report.items():
        cells = [fmt.format(metrics[key]) if key in metrics else "-" for key, _, fmt in TABLE_COLUMNS]
        name = method.replace("|", "\\|")  # TTA members are named like "yolo26n|hflip"
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join([header, rule, *rows])


def plot_report(report: Mapping[str, Mapping[str, float]], path: str | Path, title: str = "COCO mAP") -> None:
    """Horizontal bar chart of mAP and AP50 per method, written atomically as PNG."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from detens.io import atomic_write_bytes

    methods = list(report)
    maps = [report[m].get("map", 0.0) for m in methods]
    map50 = [report[m].get("map50", 0.0) for m in methods]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(methods) + 2.0))
    y = range(len(methods))
    ax.barh([i + 0.2 for i in y], map50, height=0.4, label="AP50", color="#9ecae1")
    ax.barh([i - 0.2 for i in y], maps, height=0.4, label="mAP@[.5:.95]", color="#3182bd")
    for i, value in enumerate(maps):
        ax.text(value + 0.003, i - 0.2, f"{value:.3f}", va="center", fontsize=8)
    ax.set_yticks(list(y), methods)
    ax.invert_yaxis()
    ax.set_xlabel("COCO AP")
    ax.set_title(textwrap.fill(title, 70), fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def plot_reliability(
    curves: Mapping[str, Mapping[str, Any]], path: str | Path, title: str | None = None
) -> None:
    """Reliability diagram, one line per method, written atomically as PNG.

    Each line joins ``(mean_score, tp_rate)`` of the method's non-empty bins; the dashed diagonal is
    perfect calibration, and each legend label carries the method's ECE.

    Args:
        curves (dict[str, dict]): ``{method: detection_calibration(...)}``; only ``"ece"`` and ``"bins"``
            (``[{"count", "mean_score", "tp_rate", ...}, ...]``) are read. Empty draws the diagonal alone;
            a method with no detection gets a legend entry and no points.
        path: where the PNG goes (folders are created).
        title (str | None): the plot's title; ``"Reliability diagram"`` by default.

    Raises:
        TypeError: ``curves`` is not a mapping, or a method's curve is not a dict.
        ValueError: a method's curve lacks ``"ece"`` or ``"bins"``, or a bin lacks a key (naming the
            method and the bin).
    """
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from detens.io import atomic_write_bytes

    if not isinstance(curves, Mapping):
        raise TypeError(
            f"curves must be a dict {{method: detection_calibration(...)}}, got {type(curves).__name__}"
        )
    lines = []  # checked before a figure exists, so a bad curve leaves no figure open
    for method, curve in curves.items():
        if not isinstance(curve, Mapping):
            raise TypeError(
                f"curves[{method!r}] must be a detection_calibration dict, got {type(curve).__name__}"
            )
        missing = [k for k in ("ece", "bins") if k not in curve]
        if missing:
            raise ValueError(f"curves[{method!r}] lacks {missing}; pass what detection_calibration returns")
        xs, ys = [], []
        for b, entry in enumerate(curve["bins"]):
            lacking = [k for k in ("count", "mean_score", "tp_rate") if k not in entry]
            if lacking:
                raise ValueError(f"curves[{method!r}]['bins'][{b}] lacks {lacking}")
            if entry["count"]:
                xs.append(float(entry["mean_score"]))
                ys.append(float(entry["tp_rate"]))
        lines.append((f"{method} (ECE {float(curve['ece']):.3f})", xs, ys))

    fig, ax = plt.subplots(figsize=(6, 6))
    ax.plot([0, 1], [0, 1], linestyle="--", color="0.5", linewidth=1, label="perfect calibration")
    for label, xs, ys in lines:
        ax.plot(xs, ys, marker="o", markersize=4, linewidth=1.5, label=label)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    ax.set_xlabel("mean score in bin")
    ax.set_ylabel("true-positive rate in bin")
    ax.set_title(textwrap.fill("Reliability diagram" if title is None else title, 60), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
