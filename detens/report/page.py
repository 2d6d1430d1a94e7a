"""The report page: ``index.html`` with inline CSS and no script, its PNGs beside it (``*.png`` and
``examples/*.png``) and ``page.json`` (every number on the page). Nothing is fetched from elsewhere, so
the folder opens from disk, offline, and can be copied as a whole.

A page is drawn whole into a hidden folder inside the page's folder and only then moved into place, so
a page that fails (an image it needs is missing, a record that does not give its table) leaves the folder
as it was: an earlier page in it stays whole, a new folder is not left behind. The earlier page's files
that the new one does not have are removed with it; :func:`page_writes` says which paths a page in a
folder may write or remove, so that a command can refuse to put its page over its other outputs.

Pages written before the numbers file was ``page.json`` named it ``report.json``, the name the docs give
the table of ``detens evaluate``: such a file is removed as an earlier page's only when its content is a
page's numbers (a table beside the page stays).

A page is drawn from its record and the options alone: written again from the same record it is the same
bytes (it shows when the evaluation ran, the record's ``created``, and not when the page was written).
"""

from __future__ import annotations

import fnmatch
import html
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from detens.checks import check_integer, check_real
from detens.coco import CocoGroundTruth
from detens.error_breakdown import ERROR_TYPES, SPECIAL_ERRORS
from detens.io import atomic_write_json, atomic_write_text, check_replaceable, read_json_file
from detens.report.analysis import analyze_record, best_methods
from detens.report.examples import write_examples
from detens.report.plots import (
    plot_class_deltas,
    plot_error_breakdown,
    plot_pr_curves,
    plot_reliability,
    plot_report,
    plot_support,
)
from detens.report.record import EvaluationRecord
from detens.report.table import TABLE_COLUMNS, best_per_column, cell_text

__all__ = ["check_page_replaceable", "page_writes", "write_report"]

logger = logging.getLogger(__name__)

_INDEX = "index.html"
_NUMBERS = "page.json"
#: What older pages named their numbers file; removed by the next page only when it holds a page's numbers.
_OLD_NUMBERS = "report.json"
#: Every figure a page may draw, its key in the page → its file: a page draws its figures under these
#: names and the next page removes those it does not draw by them, so a name is written once.
_FIGURES = {"map": "map.png", "pr": "pr_curves.png", "errors": "errors.png", "reliability": "reliability.png",
            "classes": "class_deltas.png", "votes": "votes.png"}
#: The page's files that one page may have and the next may not (besides the side-by-sides).
_PAGE_FILES = (_INDEX, _NUMBERS, *_FIGURES.values())
_EXAMPLES_DIR = "examples"
#: Each kind of side-by-side → its PNG, ``rank`` (1: the image helped, or hurt, most) and ``image_id`` to
#: fill in: a page draws them under these names and the next page removes those it does not draw by them.
_EXAMPLES = {"helped": f"{_EXAMPLES_DIR}/helped_{{rank}}_{{image_id}}.png",
             "hurt": f"{_EXAMPLES_DIR}/hurt_{{rank}}_{{image_id}}.png"}

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto; max-width: 1280px;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.6em 0; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid #e4e4e4; text-align: right; }
th:first-child, td:first-child { text-align: left; }
td.best { font-weight: 700; background: #e3f4e3; }
td, th, dd, h1, h2, p, li, figcaption { overflow-wrap: anywhere; }
tr.single td:first-child { color: #555; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 0.15em 1em; font-size: 0.9em; }
dl.meta dt { font-weight: 600; } dl.meta dd { margin: 0; }
code, pre { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 0.85em; }
pre { background: #f6f6f6; padding: 0.6em; white-space: pre-wrap; word-break: break-all; }
img { max-width: 100%; height: auto; border: 1px solid #eee; box-sizing: border-box; }
figure { margin: 1em 0; } figure.narrow { max-width: 640px; } figcaption { font-size: 0.85em; color: #555; }
p.note { font-size: 0.9em; color: #444; }
"""


def write_report(
    record: EvaluationRecord,
    out_dir: str | Path,
    images_dir: str | Path | None = None,
    examples: int = 3,
    conf: float = 0.3,
    command: str | None = None,
) -> Path:
    """Write the report page of one evaluation into ``out_dir``; returns ``out_dir / "index.html"``.

    Args:
        record (EvaluationRecord): the evaluation (its table, pooled predictions and ground truth).
        out_dir: the page's folder (created; an earlier page in it is replaced, only once this one is
            drawn whole: module docstring).
        images_dir: the image files of the scored images, for the side-by-sides; default the record's
            ``meta["images"]``. Without that folder the page says so and leaves them out; a folder that
            lacks an image to draw is an error.
        examples (int): images where fusion helped most, and as many where it hurt most, ``>= 0``.
        conf (float): side-by-sides draw the detections scored at least this; the second vote histogram
            counts them.
        command (str | None): the command that wrote this page, when not the evaluation itself
            (``detens report ...``).

    Raises:
        ValueError: ``examples < 0``, ``conf`` outside ``[0, 1]``, ``out_dir`` a file, or a record whose
            predictions do not give its table.
        FileNotFoundError: an image to draw is missing from the image folder or unreadable.
    """
    examples = check_integer(examples, "examples", 0)
    conf = check_real(conf, "conf", 0.0, 1.0)
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"out_dir must be a folder, but {out_dir} is a file")
    # the outermost folder this call creates: a failed page takes it away again
    created = next((f for f in reversed((out_dir, *out_dir.parents)) if not f.exists()), None)
    out_dir.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".page-", dir=out_dir))
    try:
        # the side-by-sides first: they need only the table's best rows, and an image missing from the
        # folder ends the page in seconds rather than after the analysis of every method
        shown, examples_note = _examples(record, images_dir, stage, examples, conf)
        analysis = analyze_record(record, support_scores=(0.0, conf))
        _draw(record, analysis, stage, shown, examples_note, conf, command)
        _move_into_place(stage, out_dir)
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return out_dir / _INDEX


def _draw(
    record: EvaluationRecord, analysis: dict[str, Any], out_dir: Path, shown: dict[str, list[dict[str, Any]]],
    examples_note: str, conf: float, command: str | None,
) -> None:
    """Every file of the page but the side-by-sides (:func:`_examples` drew them) into ``out_dir``."""
    methods = analysis["methods"]
    meta = record.meta
    protocol = meta.get("protocol", "")

    figures = {key: _FIGURES[key] for key in ("map", "pr", "errors", "reliability")}  # the ones every page has
    plot_report({m: record.metrics[m] for m in methods}, out_dir / figures["map"], title=f"COCO mAP, {protocol}")
    plot_pr_curves(analysis["curves"], out_dir / figures["pr"], title=f"Precision-recall, all classes, {protocol}")
    plot_error_breakdown(analysis["errors"], out_dir / figures["errors"], ERROR_TYPES + SPECIAL_ERRORS,
                         title="TIDE error breakdown at IoU 0.5")
    plot_reliability({m: record.calibration[m] for m in methods if m in record.calibration},
                     out_dir / figures["reliability"], title=f"Reliability (TP at IoU 0.5), {protocol}")
    single, fused = analysis["best_single"], analysis["best_fused"]
    deltas = analysis["class_deltas"]
    if deltas is not None and (deltas["improved"] or deltas["degraded"]):
        figures["classes"] = _FIGURES["classes"]
        rows = [(r["name"], r["single"], r["fused"]) for r in deltas["improved"] + deltas["degraded"][::-1]]
        plot_class_deltas(rows, out_dir / figures["classes"], single, fused, metric="AP@[.5:.95]")
    support_key = str(conf)
    if analysis["support"].get(support_key):
        figures["votes"] = _FIGURES["votes"]
        plot_support(analysis["support"][support_key], out_dir / figures["votes"],
                     title=f"Fused detections scored >= {conf:g}, by supporting members")

    atomic_write_json(out_dir / _NUMBERS, {"meta": meta, "metrics": record.metrics, **analysis,
                                               "examples": shown}, indent=1)
    atomic_write_text(out_dir / _INDEX, _page(record, analysis, figures, shown, examples_note, conf, command))


def page_writes(out_dir: str | Path, path: str | Path) -> bool:
    """Whether a page written into ``out_dir`` may write or remove ``path`` (one of the names a page gives
    its files, the side-by-sides' included): a command checks its other outputs with it before it runs.

    ``report.json`` is not one of them: a page removes an older page's ``report.json`` only when it holds a
    page's numbers, which a table never does.
    """
    try:
        relative = Path(path).resolve().relative_to(Path(out_dir).resolve()).as_posix()
    except ValueError:  # not inside the page's folder
        return False
    examples = [template.format(rank="*", image_id="*") for template in _EXAMPLES.values()]
    # one folder deep at most: fnmatch's * also matches "/"
    return relative in _PAGE_FILES or (
        relative.count("/") == 1 and any(fnmatch.fnmatchcase(relative, pattern) for pattern in examples)
    )


def check_page_replaceable(out_dir: str | Path, flag: str) -> None:
    """Raise if a file of the page already in ``out_dir`` (the folder of ``flag``, ``"--report"``), which the
    new page replaces or removes, may not be (:func:`detens.io.check_replaceable`): the page would find it
    only when it moves into place, once it is drawn (and, for ``detens evaluate``, the evaluation done).

    Raises:
        ValueError: naming the file.
    """
    out_dir = Path(out_dir)
    if out_dir.is_dir():
        for name in _page_files(out_dir):
            check_replaceable(out_dir / name, "the page's file", f"another {flag}")


def _is_old_numbers(path: Path) -> bool:
    """Whether ``path`` is the numbers file of a page written before it was named ``page.json``: a JSON
    object with the page's sections. A table of ``detens evaluate`` (``{method: {metric: value}}``) never
    is: its ``"methods"``, if a method had that name, would be an object, not a list."""
    try:
        numbers = read_json_file(path, "page numbers file")
    except (OSError, ValueError):  # cut short, nested too deeply, a key twice, ...: no page wrote it
        return False
    return (isinstance(numbers, dict) and isinstance(numbers.get("methods"), list)
            and {"meta", "metrics", "examples"} <= set(numbers))


def _page_files(out_dir: Path) -> list[Path]:
    """The files of the page in ``out_dir``, relative to it: those the next page replaces or removes (a
    file of the folder that no page draws stays)."""
    files = [Path(name) for name in _PAGE_FILES if (out_dir / name).is_file()]
    if (out_dir / _OLD_NUMBERS).is_file() and _is_old_numbers(out_dir / _OLD_NUMBERS):
        files.append(Path(_OLD_NUMBERS))
    examples = [template.format(rank="*", image_id="*") for template in _EXAMPLES.values()]
    return files + sorted(path.relative_to(out_dir) for pattern in examples for path in out_dir.glob(pattern))


def _move_into_place(stage: Path, out_dir: Path) -> None:
    """Replace the page in ``out_dir`` by the one drawn in ``stage``, ``index.html`` last."""
    new = {path.relative_to(stage) for path in stage.rglob("*") if path.is_file()}
    old = _page_files(out_dir)
    index = Path(_INDEX)
    # gone first and back last: a folder caught halfway has no page rather than one whose PNGs are mixed
    (out_dir / index).unlink(missing_ok=True)
    for name in sorted(set(old) - new):
        (out_dir / name).unlink(missing_ok=True)
    for name in sorted(new - {index}):
        (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(stage / name, out_dir / name)
    os.replace(stage / index, out_dir / index)
    examples = out_dir / _EXAMPLES_DIR
    if examples.is_dir() and not any(examples.iterdir()):
        examples.rmdir()


def _examples(
    record: EvaluationRecord, images_dir: str | Path | None, out_dir: Path, count: int, conf: float,
) -> tuple[dict[str, list[dict[str, Any]]], str]:
    """The side-by-sides, or none and the reason. The best single model and the best fused method are the
    table's (:func:`~detens.report.analysis.best_methods`), as the analysis finds them."""
    single, fused = best_methods(record.metrics)
    folder = images_dir if images_dir is not None else record.meta.get("images")
    if count == 0:
        return {}, "No side-by-sides were asked for."
    if single is None or not record.members:
        return {}, "Side-by-sides need a single model and a fused method in the table (add 'single' to --methods)."
    if fused is None:
        return {}, "Side-by-sides need a fused method in the table beside the single models (add one to --methods)."
    if folder is None:
        logger.warning("report: the evaluation record names no image folder and none was given; the page has no "
                       "side-by-sides")
        return {}, "No side-by-sides: the evaluation record names no image folder; pass --images."
    if not Path(folder).is_dir():
        logger.warning("report: the image folder %s was not found; the page has no side-by-sides", folder)
        return {}, f"No side-by-sides: the image folder {folder} was not found; pass --images."
    truth = CocoGroundTruth(record.gt)
    shown = write_examples(truth, Path(folder), fused, record.results[fused], single.split(":", 1)[1],
                           record.members, out_dir, _EXAMPLES, count=count, conf=conf)
    return shown, ""


#: Unicode's bidirectional controls, shown as escapes: one in a model or class name (U+202E, right-to-left
#: override) would reverse the text after it on its line of the page.
_BIDI_CONTROLS = {code: f"\\u{code:04x}" for code in (0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def _e(value: Any) -> str:
    """``value`` as text of the page: HTML-escaped, its bidirectional controls shown as escapes."""
    return html.escape(str(value).translate(_BIDI_CONTROLS))


def _metrics_table(record: EvaluationRecord, methods: Sequence[str]) -> str:
    best = best_per_column({m: record.metrics[m] for m in methods})
    head = "<tr><th>method</th>" + "".join(f"<th>{_e(title)}</th>" for _, title, _ in TABLE_COLUMNS) + "</tr>"
    rows = []
    for m in methods:
        cells = []
        for key, _, fmt in TABLE_COLUMNS:
            text = cell_text(record.metrics[m].get(key), fmt)
            marked = m in best.get(key, [])
            cells.append(f'<td class="best">{_e(text)}</td>' if marked else f"<td>{_e(text)}</td>")
        kind = ' class="single"' if m.startswith("single:") else ""
        rows.append(f"<tr{kind}><td>{_e(m)}</td>{''.join(cells)}</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _errors_table(errors: dict[str, dict[str, Any]], methods: Sequence[str]) -> str:
    types = ERROR_TYPES + SPECIAL_ERRORS
    head = ("<tr><th>method</th><th>AP50</th>" + "".join(f"<th>{_e(t)}</th>" for t in types)
            + "".join(f"<th># {_e(t)}</th>" for t in ("tp",) + ERROR_TYPES) + "</tr>")
    rows = []
    for m in methods:
        e = errors[m]
        dap = {**e["dap"], **e["dap_special"]}
        cells = [f"<td>{e['ap']:.4f}</td>"] + [f"<td>{100 * dap[t]:.2f}</td>" for t in types]
        cells += [f"<td>{e['counts'][t]}</td>" for t in ("tp",) + ERROR_TYPES]
        rows.append(f"<tr><td>{_e(m)}</td>{''.join(cells)}</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _support_table(support: dict[str, dict[str, Any]]) -> str:
    first = next(iter(next(iter(support.values())).values()))
    n = first["members"]
    head = ("<tr><th>method</th><th>scores</th>" + "".join(f"<th>TP {k}</th>" for k in range(n + 1))
            + "".join(f"<th>FP {k}</th>" for k in range(n + 1)) + "</tr>")
    rows = []
    for score, per_method in support.items():
        for m, s in per_method.items():
            cells = "".join(f"<td>{v}</td>" for v in s["tp"] + s["fp"])
            rows.append(f"<tr><td>{_e(m)}</td><td>&ge; {float(score):g}</td>{cells}</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _class_table(deltas: dict[str, list[dict[str, Any]]], single: str, fused: str) -> str:
    head = f"<tr><th>class</th><th>{_e(single)}</th><th>{_e(fused)}</th><th>change</th></tr>"
    rows = [
        f"<tr><td>{_e(r['name'])}</td><td>{r['single']:.3f}</td><td>{r['fused']:.3f}</td><td>{r['delta']:+.3f}</td></tr>"
        for r in deltas["improved"] + deltas["degraded"]
    ]
    return f"<table>{head}{''.join(rows)}</table>"


def _figure(src: str, caption: str, narrow: bool = False) -> str:
    kind = ' class="narrow"' if narrow else ""
    # the file's name as it is (a link, not text)
    return f'<figure{kind}><img src="{html.escape(src)}" alt="{_e(caption)}"><figcaption>{_e(caption)}</figcaption></figure>'


def _images_text(record: EvaluationRecord) -> str:
    """How many images were scored, and how many of them have no annotations (scored with --all-images:
    their detections are false positives)."""
    scored = len(record.image_ids)
    annotated = len({int(a["image_id"]) for a in record.gt["annotations"]})
    if annotated == scored:
        return f"{scored} images with ground truth scored"
    return (f"{scored} images scored, {annotated} with ground truth and {scored - annotated} without "
            "(their detections are false positives)")


def _categories_text(scored: int, listed: int) -> str:
    """The categories COCO's mAP averages over (those with ground truth in the scored images) against those
    the label space lists: a category without ground truth has no AP and counts in no mean."""
    if scored == listed:
        return f"{listed} categories, all with ground truth"
    return (f"{scored} categories with ground truth, over which the APs are averaged "
            f"({listed} in the label space, {listed - scored} without ground truth here)")


def _left_out_text(images: Any, fate: str) -> str | None:
    """What a record says of the images the cache could not read (``meta.left_out``, ``meta.fit_on.left_out``),
    the first 10 named; None when it lists none."""
    images = [image for image in images or [] if isinstance(image, dict)]
    if not images:
        return None
    names = ", ".join(str(image.get("file_name", image.get("image_id"))) for image in images[:10])
    more = " ..." if len(images) > 10 else ""
    return f"{len(images)} image{'s' if len(images) > 1 else ''} the cache could not read, {fate}: {names}{more}"


def _page(
    record: EvaluationRecord,
    analysis: dict[str, Any],
    figures: dict[str, str],
    shown: dict[str, list[dict[str, Any]]],
    examples_note: str,
    conf: float,
    command: str | None,
) -> str:
    meta = record.meta
    methods = analysis["methods"]
    single, fused = analysis["best_single"], analysis["best_fused"]
    fit_on = meta.get("fit_on")
    folds = meta.get("folds") or []
    facts = [
        ("dataset", f"{meta.get('gt', '?')}: {_images_text(record)}, "
                    f"{sum(1 for a in record.gt['annotations'] if not a.get('iscrowd', 0))} boxes, "
                    f"{_categories_text(len(analysis['scored_categories']), len(record.gt['categories']))}"),
        ("predictions", f"{meta.get('predictions', '?')} (members: {', '.join(meta.get('models') or [])})"),
    ]
    left_out = _left_out_text(meta.get("left_out"), "neither scored nor fitted on")
    if left_out:
        facts.append(("left out of the dataset", left_out))
    facts += [
        ("protocol", meta.get("protocol", "?")),
        ("folds", f"{len(folds)} held-out folds of {', '.join(str(f) for f in folds)} images, seed {meta.get('seed')}"
                  if folds else "none: fitted on other data, every image scored" if fit_on
                  else "none: no method fitted, every image scored once"),
    ]
    if fit_on:
        facts.append(("fitting data", f"{fit_on.get('gt')} with {fit_on.get('predictions')} "
                                      f"({fit_on.get('images')} images, {fit_on.get('mode')})"))
        fit_left_out = _left_out_text(fit_on.get("left_out"), "not fitted on")
        if fit_left_out:
            facts.append(("left out of the fitting data", fit_left_out))
    facts += [("COCO evaluator", meta.get("backend", "pycocotools")), ("evaluated", meta.get("created", "?"))]
    meta_html = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts)
    commands = f"<pre>{_e(meta.get('command', '?'))}</pre>"
    if command:
        commands += f"<p class='note'>This page was rebuilt from the saved evaluation by:</p><pre>{_e(command)}</pre>"

    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>detens evaluation: {_e(', '.join(meta.get('models') or []))}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>detens evaluation report</h1>",
        f"<dl class='meta'>{meta_html}</dl>",
        "<p class='note'>Made by:</p>" + commands,
        "<h2>Metrics</h2>",
        "<p class='note'>COCO bbox AP of the pooled held-out predictions (one evaluation per method); the best "
        "value of each column is highlighted (lowest for ECE and fusion time; fusion time among fusion methods). "
        "ECE: expected calibration error of the scores against \"true positive at IoU 0.5\", 10 bins.</p>",
        _metrics_table(record, methods),
        _figure(figures["map"], "mAP@[.5:.95] and AP50 per method", narrow=True),
        "<h2>Precision-recall</h2>",
        "<p class='note'>COCO's interpolated precision at 101 recall thresholds, averaged over the classes with "
        "ground truth (area all, 100 detections per image and class); the mean of each curve, in the legend, is "
        "the table's AP50 / AP75. Single models dashed.</p>",
        _figure(figures["pr"], "Precision-recall curves at IoU 0.5 and 0.75"),
        "<h2>Per-class AP: best fused method vs best single model</h2>",
    ]
    if "classes" in figures:
        parts += [
            f"<p class='note'>AP@[.5:.95] per class of <b>{_e(fused)}</b> (best fused mAP) minus "
            f"<b>{_e(single)}</b> (best single mAP): the 10 most improved and the 10 most degraded classes.</p>",
            _figure(figures["classes"], f"Per-class AP change, {fused} vs {single}"),
            _class_table(analysis["class_deltas"], single, fused),
        ]
    else:
        parts.append("<p class='note'>Needs a single model and a fused method in the table.</p>")
    parts += [
        "<h2>Error breakdown (TIDE)</h2>",
        "<p class='note'>Each false positive is given one error type, tested in TIDE's order on COCOeval's own "
        "matching at IoU 0.5 (background threshold 0.1): <b>loc</b> right class, IoU 0.1-0.5 with an object; "
        "<b>cls</b> wrong class, IoU &ge; 0.5 with an object of another class; <b>dupe</b> a second detection of an "
        "object already found; <b>bkg</b> IoU &le; 0.1 with every object; <b>both</b> wrong class and poor box; "
        "<b>missed</b>: objects no detection found or nearly found. Each dAP is the AP50 gained (in points) by fixing "
        "that type alone; false_positives / false_negatives: every false positive removed / every missed object "
        "removed. AP50 here is the table's AP50.</p>",
        _figure(figures["errors"], "AP50 points recovered per error type"),
        _errors_table(analysis["errors"], methods),
        "<h2>Calibration</h2>",
        "<p class='note'>Per score bin, the mean score against the fraction of true positives (IoU 0.5); the "
        "diagonal is perfect calibration. ECE per method in the legend and the table.</p>",
        _figure(figures["reliability"], "Reliability diagram", narrow=True),
        "<h2>Votes: how many members support each fused detection</h2>",
    ]
    if "votes" in figures:
        first = next(iter(analysis["support"][str(conf)].values()))
        parts += [
            f"<p class='note'>A member supports a fused detection when it has a box of the same class at IoU "
            f"&ge; {first['iou_thr']:g} with it; true and false positives as COCOeval labels them at IoU 0.5. "
            f"The plot counts fused detections scored &ge; {conf:g} (member boxes likewise); the table also "
            f"counts every detection.</p>",
            _figure(figures["votes"], "Fused true and false positives by supporting members"),
            _support_table(analysis["support"]),
        ]
    else:
        parts.append("<p class='note'>Needs fused methods and the members' predictions.</p>")
    parts.append("<h2>Images: where fusion helped most and hurt most</h2>")
    if shown:
        parts.append(
            f"<p class='note'>Per image, AP50 of <b>{_e(fused)}</b> minus that of <b>{_e(single)}</b> on that image "
            f"alone. Panels: each member, then the fused output; detections scored &ge; {conf:g} in class colors "
            "with their scores; ground truth dashed white.</p>"
        )
        for kind, title in (("helped", "Helped most"), ("hurt", "Hurt most")):
            parts.append(f"<h3>{title}</h3>")
            if not shown[kind]:
                parts.append("<p class='note'>No image.</p>")
            for e in shown[kind]:
                caption = f"image {e['image_id']} ({e['file_name']}): AP50 change {e['delta']:+.3f}"
                parts.append(_figure(e["png"], caption))
    else:
        parts.append(f"<p class='note'>{_e(examples_note)}</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
