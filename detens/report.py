"""Evaluation reports: a Markdown table and a bar chart of ``{method: {metric: value}}``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["TABLE_COLUMNS", "markdown_table", "plot_report"]

#: (metric key, column title, format) of the results table.
TABLE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("map", "mAP", "{:.4f}"),
    ("map50", "AP50", "{:.3f}"),
    ("map75", "AP75", "{:.3f}"),
    ("map_small", "APs", "{:.3f}"),
    ("map_medium", "APm", "{:.3f}"),
    ("map_large", "APl", "{:.3f}"),
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
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
