"""The report's figures, each written atomically as a PNG: a bar chart of ``{method: {metric: value}}``, a
reliability diagram of ``{method: detection_calibration(...)}``, precision-recall curves, per-class AP
changes, the error breakdown and the member-support histogram.

matplotlib is imported inside each function (``import detens`` stays light) with the Agg backend.
Every text is drawn as written: class and method names are the user's (``US$ bill, $5``), and
matplotlib's math text would garble a pair of ``$`` or fail on an odd one.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import textwrap
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from detens.checks import first_few

__all__ = [
    "plot_report",
    "plot_reliability",
    "plot_pr_curves",
    "plot_class_deltas",
    "plot_error_breakdown",
    "plot_support",
]


logger = logging.getLogger(__name__)

_Plot = TypeVar("_Plot", bound=Callable[..., None])


#: How matplotlib warns of a character its fonts cannot draw (once per character and per drawing pass).
_MISSING_GLYPH = re.compile(r"Glyph (\d+) \(.*\) missing from font")


def _plain_text(plot: _Plot) -> _Plot:
    """``plot`` with matplotlib's math text off while it draws and saves: tick labels are made as the
    figure is saved, so the setting must hold until then. matplotlib's warnings of characters its fonts
    lack (a class named in CJK: one per character and pass, dozens for one figure) become one logged
    line per figure."""

    @functools.wraps(plot)
    def plain(*args: Any, **kwargs: Any) -> None:
        import matplotlib

        with matplotlib.rc_context({"text.parse_math": False}), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plot(*args, **kwargs)
        missing: dict[str, None] = {}
        for warning in caught:
            match = _MISSING_GLYPH.search(str(warning.message))
            if match is None:
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
            else:
                missing[f"{chr(int(match.group(1)))} (U+{int(match.group(1)):04X})"] = None
        if missing:
            path = kwargs.get("path", args[1] if len(args) > 1 else "a figure")
            logger.warning("%s: %d character%s with no glyph in matplotlib's fonts, drawn as boxes: %s", path,
                           len(missing), "s" if len(missing) > 1 else "", first_few(list(missing), 5))

    return plain  # type: ignore[return-value]


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str | Path) -> None:
    """Write ``fig`` as PNG atomically and close it."""
    import io

    from detens.io import atomic_write_bytes

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    _pyplot().close(fig)
    atomic_write_bytes(path, buffer.getvalue())


@_plain_text
def plot_report(report: Mapping[str, Mapping[str, float]], path: str | Path, title: str = "COCO mAP") -> None:
    """Horizontal bar chart of mAP and AP50 per method, written atomically as PNG."""
    plt = _pyplot()
    methods = list(report)
    maps = [report[m].get("map", 0.0) for m in methods]
    # a figure not measured (missing, or None) draws no bar rather than one of 0
    map50 = [math.nan if report[m].get("map50") is None else report[m]["map50"] for m in methods]
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
    _save(fig, path)


@_plain_text
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
        # no detection: nothing measured, as the table's "-" says (detection_calibration gives 0.0 there)
        unmeasured = curve["ece"] is None or curve.get("count") == 0
        lines.append((method, "no detection" if unmeasured else f"ECE {float(curve['ece']):.3f}", xs, ys))

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 6))
    ax.plot([0, 1], [0, 1], linestyle="--", color="0.5", linewidth=1, label="perfect calibration")
    colors = _method_colors([method for method, *_ in lines])  # as the precision-recall curves colour them
    for method, measured, xs, ys in lines:
        ax.plot(xs, ys, marker="o", markersize=4, linewidth=1.5, color=colors[method], label=f"{method} ({measured})")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    ax.set_xlabel("mean score in bin")
    ax.set_ylabel("true-positive rate in bin")
    ax.set_title(textwrap.fill("Reliability diagram" if title is None else title, 60), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def _method_colors(methods: list[str]) -> dict[str, Any]:
    """One color per method, single models in greys so the fused methods stand out."""
    plt = _pyplot()
    singles = [m for m in methods if m.startswith("single:")]
    fused = [m for m in methods if not m.startswith("single:")]
    colors = {m: str(0.35 + 0.4 * i / max(1, len(singles) - 1)) if len(singles) > 1 else "0.45" for i, m in enumerate(singles)}
    palette = plt.get_cmap("tab10" if len(fused) <= 10 else "tab20")
    colors.update({m: palette(i % palette.N) for i, m in enumerate(fused)})
    return colors


@_plain_text
def plot_pr_curves(curves: Mapping[str, Mapping[str, Any]], path: str | Path, title: str | None = None) -> None:
    """Precision-recall curves, one panel per IoU threshold, one line per method, written as PNG.

    Args:
        curves (dict[str, dict]): ``{method: coco_curves(...)}``; ``"recall"`` (list[R]) and
            ``"precision"`` (``{iou: list[R]}``) are read. The legend gives each line's mean (the AP).
        path: where the PNG goes.
        title (str | None): above both panels.
    """
    plt = _pyplot()
    methods = list(curves)
    ious = list(next(iter(curves.values()))["precision"]) if curves else ["0.5", "0.75"]
    colors = _method_colors(methods)
    fig, axes = plt.subplots(1, len(ious), figsize=(6 * len(ious), 5.2), squeeze=False)
    for ax, iou in zip(axes[0], ious, strict=True):
        for method in methods:
            precision = curves[method]["precision"][iou]
            style = "--" if method.startswith("single:") else "-"
            ap = sum(precision) / len(precision)
            ax.plot(curves[method]["recall"], precision, style, color=colors[method], linewidth=1.4,
                    label=f"{method} ({ap:.3f})")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("recall")
        ax.set_ylabel("precision (interpolated, mean over classes)")
        ax.set_title(f"IoU {iou}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower left", fontsize=7)
    if title:
        fig.suptitle(textwrap.fill(title, 100), fontsize=10)
    fig.tight_layout()
    _save(fig, path)


@_plain_text
def plot_class_deltas(
    rows: list[tuple[str, float, float]], path: str | Path, single: str, fused: str, metric: str = "AP"
) -> None:
    """Per-class AP of ``fused`` minus ``single`` as horizontal bars (gains green, losses red), as PNG.

    Args:
        rows (list[(class name, single AP, fused AP)]): in the order to draw, top first.
        path: where the PNG goes.
        single, fused (str): the two methods, for the title and axis.
        metric (str): what the APs are, for the axis label.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 0.3 * max(len(rows), 1) + 1.6))
    deltas = [f - s for _, s, f in rows]
    y = list(range(len(rows)))
    ax.barh(y, deltas, color=["#2ca02c" if d >= 0 else "#d62728" for d in deltas], height=0.7)
    for i, ((_, s, f), d) in enumerate(zip(rows, deltas, strict=True)):
        ax.text(d, i, f" {d:+.3f} ({s:.2f}\u2192{f:.2f}) ", va="center", ha="left" if d >= 0 else "right", fontsize=7)
    ax.set_yticks(y, [name for name, _, _ in rows])
    ax.invert_yaxis()
    ax.axvline(0, color="0.3", linewidth=0.8)
    span = max([abs(d) for d in deltas] + [0.01])
    ax.set_xlim(-1.9 * span, 1.9 * span)  # room for the labels on both sides
    ax.set_xlabel(f"{metric}: {fused} minus {single}")
    ax.set_title(textwrap.fill(f"Per-class {metric}, {fused} vs {single}", 70), fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    _save(fig, path)


@_plain_text
def plot_error_breakdown(
    breakdowns: Mapping[str, Mapping[str, Any]], path: str | Path, types: tuple[str, ...], title: str | None = None
) -> None:
    """TIDE's dAP per error type, one panel per type, one bar per method, as PNG.

    Args:
        breakdowns (dict[str, dict]): ``{method: error_breakdown(...)}``; ``"dap"`` and ``"dap_special"``
            are read, in AP units (drawn in points).
        path: where the PNG goes.
        types (tuple[str, ...]): the error types to draw, one panel each.
        title (str | None): above the panels.
    """
    plt = _pyplot()
    methods = list(breakdowns)
    colors = _method_colors(methods)
    columns = 4
    rows = -(-len(types) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 0.22 * len(methods) * rows + 1.3 * rows + 0.6),
                             squeeze=False, sharey=True)
    for ax, name in zip(axes.flat, types, strict=False):
        values = [100 * {**breakdowns[m]["dap"], **breakdowns[m]["dap_special"]}[name] for m in methods]
        ax.barh(range(len(methods)), values, color=[colors[m] for m in methods], height=0.75)
        for i, v in enumerate(values):
            ax.text(v, i, f" {v:.2f}", va="center", fontsize=6.5)
        ax.set_title(name, fontsize=9)
        ax.set_xlim(0, max(values + [0.1]) * 1.35)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(axis="x", labelsize=7)
    for ax in axes.flat[len(types):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_yticks(range(len(methods)), methods, fontsize=7)
    axes[0, 0].invert_yaxis()
    if title:
        fig.suptitle(textwrap.fill(title, 110), fontsize=10)
    fig.supxlabel("AP50 points recovered by fixing that error type alone", fontsize=8)
    fig.tight_layout()
    _save(fig, path)


@_plain_text
def plot_support(supports: Mapping[str, Mapping[str, Any]], path: str | Path, title: str | None = None) -> None:
    """Per fused method, true and false positives by the number of members supporting them, as PNG.

    Args:
        supports (dict[str, dict]): ``{method: member_support(...)}``; ``"tp"`` and ``"fp"``
            (list[N + 1], counts by number of supporting members) are read.
        path: where the PNG goes.
        title (str | None): above the panels.
    """
    plt = _pyplot()
    methods = list(supports)
    columns = min(4, max(1, len(methods)))
    rows = -(-max(1, len(methods)) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.3 * columns, 2.6 * rows + 0.6), squeeze=False)
    for ax, method in zip(axes.flat, methods, strict=False):
        tp, fp = supports[method]["tp"], supports[method]["fp"]
        x = list(range(len(tp)))
        ax.bar([i - 0.2 for i in x], tp, width=0.4, color="#2ca02c", label="true positives")
        ax.bar([i + 0.2 for i in x], fp, width=0.4, color="#d62728", label="false positives")
        ax.set_xticks(x)
        ax.set_title(method, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(axis="y", alpha=0.3)
    for ax in axes.flat[len(methods):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    iou = next(iter(supports.values()))["iou_thr"] if supports else 0.55
    fig.supxlabel(f"members with a box of the same class at IoU >= {iou:g}", fontsize=8)
    if title:
        fig.suptitle(textwrap.fill(title, 110), fontsize=10)
    fig.tight_layout()
    _save(fig, path)
