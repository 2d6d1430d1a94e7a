"""The evaluation report page: `detens evaluate --report` on a real evaluation of 20 COCO images (three
YOLO members cached by `detens cache`), every image the page references exists, its numbers are the
table's, `detens report` rebuilds it from the saved evaluation, and headless Chromium loads it without a
console error, fetching nothing outside its folder, into a screenshot that is not blank."""

from __future__ import annotations

import base64
import fcntl
import gzip
import importlib.metadata
import json
import os
import re
import select
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from detens.report.record import EvaluationRecord, record_path
from detens.report.table import best_per_column

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
DATA = SHARED / "data" / "coco_val2017_206"
NUM_IMAGES = 20
METHODS = "single,nms,wbf,mean"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="needs ../shared/data/coco_val2017_206")


# ----------------------------------------------------------------------------------------- no data needed
BEST_CASES = [
    # (case, table, expected best per column for the columns given)
    ("max AP, min ECE", {"a": {"map": 0.4, "ece": 0.02}, "b": {"map": 0.5, "ece": 0.03}}, {"map": ["b"], "ece": ["a"]}),
    ("ties all win", {"a": {"map": 0.5}, "b": {"map": 0.5}}, {"map": ["a", "b"]}),
    ("-1 never wins", {"a": {"map_small": -1.0}, "b": {"map_small": -1.0}}, {}),
    ("fusion time among fusion methods", {"single:x": {"fusion_ms": 0.0}, "wbf": {"fusion_ms": 5.0},
                                          "nms": {"fusion_ms": 1.0}}, {"fusion_ms": ["nms"]}),
    ("the oracle is a ceiling", {"oracle": {"map": 0.9}, "deep": {"map": 0.45}}, {"map": ["deep"]}),
    ("not measured never wins", {"single:x": {"map": 0.0, "ece": None}, "nms": {"map": 0.4, "ece": 0.009}},
     {"map": ["nms"], "ece": ["nms"]}),
]


@pytest.mark.parametrize("case, table, expected", BEST_CASES, ids=[c[0] for c in BEST_CASES])
def test_best_per_column(case, table, expected):
    assert best_per_column(table) == expected


def test_a_figure_not_measured_prints_as_a_dash_and_draws_no_bar(tmp_path):
    """The record's loader takes null for a figure not measured; the table, its best cells and the bar chart
    failed on it ("float() argument must be ... not 'NoneType'")."""
    from detens.report import markdown_table, plot_report

    table = {"single:x": {"map": 0.0, "map50": None, "ece": None}, "wbf": {"map": 0.4, "map50": 0.6, "ece": 0.02}}
    lines = markdown_table(table).splitlines()
    assert lines[2].startswith("| single:x | 0.0000 | - | - | - | - | - | - | -")
    plot_report(table, tmp_path / "map.png")
    assert (tmp_path / "map.png").read_bytes().startswith(PNG_SIGNATURE)


def test_a_size_range_with_no_object_prints_as_a_dash_not_as_an_ap_below_zero():
    """pycocotools gives -1 for APs where no small object is annotated: the tables printed "-1.000"."""
    from detens.report import markdown_table
    from detens.report.page import _metrics_table
    from detens.report.table import cell_text

    assert [cell_text(v, "{:.3f}") for v in (-1.0, -1, None, 0.0, 0.25)] == ["-", "-", "-", "0.000", "0.250"]
    table = {"wbf": {"map": 0.4, "map_small": -1.0, "map_medium": 0.3}}
    assert markdown_table(table).splitlines()[2].startswith("| wbf | 0.4000 | - | - | - | 0.300 |")
    record = SimpleNamespace(metrics=table)
    html = _metrics_table(record, ["wbf"])
    assert "-1" not in html and html.count("<td>-</td>") == 6 and ">0.300</td>" in html


def test_a_nan_figure_prints_as_a_dash_as_it_never_wins_its_column():
    """A record refuses NaN metrics, but the table's functions take any table from Python: a NaN printed as
    "nan" while its column's best skipped it, the two deciding apart what a figure is."""
    from detens.report import markdown_table
    from detens.report.table import cell_text

    nan = float("nan")
    table = {"a": {"map": nan, "ece": nan}, "b": {"map": 0.3, "ece": 0.05}}
    assert markdown_table(table).splitlines()[2].startswith("| a | - | - | - | - | - | - | - | - |")
    assert best_per_column(table) == {"map": ["b"], "ece": ["b"]}
    for value in (nan, np.float32("nan"), -1.0, -1, None, 0.0, 0, 0.25, np.float64(0.5)):
        assert (cell_text(value, "{}") != "-") == ("map" in best_per_column({"m": {"map": value}})), value


def test_a_bidirectional_control_in_a_name_is_shown_not_obeyed_and_a_figure_keeps_its_file_name():
    """A right-to-left override (U+202E) in a model name reversed the text after it on its line of the page."""
    from detens.report.page import _e, _figure

    assert _e("yolo\u202eabc <x>") == "yolo\\u202eabc &lt;x&gt;"
    assert all(_e(chr(code)) == f"\\u{code:04x}" for code in (0x200E, 0x200F, 0x202A, 0x202E, 0x2066, 0x2069))
    assert _e("ﺏ اكتشاف 車") == "ﺏ اكتشاف 車"  # right-to-left and other scripts are text, left as they are
    assert '<img src="examples/a\u202eb.jpg"' in _figure("examples/a\u202eb.jpg", "x\u202ey")


def test_characters_the_fonts_lack_are_one_logged_line_per_figure(caplog):
    """matplotlib warns once per character and drawing pass: a class named in CJK printed dozens of lines,
    --quiet or not. Other warnings pass through."""
    import warnings

    from detens.report.plots import _plain_text

    @_plain_text
    def plot(data, path):
        for _ in range(3):  # tight_layout, then savefig, ...
            for code, name in ((29483, "CJK UNIFIED IDEOGRAPH-732B"), (29356, "CJK UNIFIED IDEOGRAPH-72AC")):
                warnings.warn(f"Glyph {code} (\\N{{{name}}}) missing from font(s) DejaVu Sans.", UserWarning, stacklevel=1)
        warnings.warn("something else", RuntimeWarning, stacklevel=1)

    with caplog.at_level("WARNING", logger="detens.report.plots"), pytest.warns(RuntimeWarning, match="something else"):
        plot({}, "figure.png")
    assert caplog.messages == ["figure.png: 2 characters with no glyph in matplotlib's fonts, drawn as boxes: "
                               "\u732b (U+732B), \u72ac (U+72AC)"]


def test_repeats_leave_a_figure_out_of_the_mean_where_a_seed_did_not_measure_it():
    from detens.evaluation import summarize_repeats

    runs = {0: {"a": {"map": 0.4, "ece": None}}, 1: {"a": {"map": 0.5, "ece": 0.02}}}
    summary = summarize_repeats(runs)["a"]
    assert summary["ece"] is None and summary["map"] == pytest.approx(0.45)


def test_the_ece_of_a_method_without_detections_is_not_measured():
    """It was 0.0, the column's best: a member that found nothing was shown as perfectly calibrated."""
    from detens.evaluation import cross_validate
    from detens.predictions import EnsemblePredictions

    record = tiny_record()
    box = {"image_id": 1, "category_id": 3, "bbox": [1.5, 2.0, 30.0, 40.0], "score": 0.9}
    gt = {**record.gt, "images": [*record.gt["images"], {"id": 2, "width": 100, "height": 80, "file_name": "2.jpg"}],
          "annotations": [*record.gt["annotations"], {**record.gt["annotations"][0], "id": 2, "image_id": 2}]}
    predictions = EnsemblePredictions(["a", "none"], [[box, {**box, "image_id": 2}], []], gt)
    report = cross_validate(predictions, ["single", "wbf"], k=2)
    assert report["single:none"].metrics["ece"] is None and report["single:none"].calibration["count"] == 0
    assert report["single:a"].metrics["ece"] is not None


def tiny_record() -> EvaluationRecord:
    gt = {
        "images": [{"id": 1, "width": 100, "height": 80, "file_name": "1.jpg"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [1.5, 2.0, 30.0, 40.0], "area": 1200.0,
                         "iscrowd": 0}],
        "categories": [{"id": 3, "name": "car"}],
    }
    results = [{"image_id": 1, "category_id": 3, "bbox": [1.5, 2.0, 30.0, 40.000000000000014], "score": 0.1 + 0.2}]
    return EvaluationRecord({"command": "detens evaluate ..."}, gt, {"single:a": {"map": 1.0}}, {},
                            {"single:a": results}, {"a": results})


def test_record_round_trip_keeps_every_float_bit(tmp_path):
    record = tiny_record()
    path = record.save(record_path(tmp_path / "results.json"))
    assert path.name == "results.evaluation.json.gz"
    loaded = EvaluationRecord.load(tmp_path / "results.json")  # found beside the table
    assert loaded.results == record.results and loaded.members == record.members and loaded.gt == record.gt
    assert loaded.results["single:a"][0]["score"] == 0.1 + 0.2  # 0.30000000000000004, not 0.3
    assert record.save(tmp_path / "again.evaluation.json.gz").read_bytes() == path.read_bytes()  # reproducible


def test_a_table_of_several_seeds_is_said_to_have_no_record(tmp_path):
    """Such a run writes its table and <out>.run.json; 'detens evaluate writes it' would send the user to
    run the very command that wrote the table."""
    (tmp_path / "report.json").write_text(json.dumps({"mean": {"map": 0.5}}))
    (tmp_path / "report.run.json").write_text(json.dumps({"seeds": [0, 1]}))
    with pytest.raises(FileNotFoundError) as error:
        EvaluationRecord.load(tmp_path / "report.json")
    assert str(error.value) == (
        f"evaluation record not found: {tmp_path / 'report.evaluation.json.gz'} ({tmp_path / 'report.run.json'} "
        "is of a detens evaluate run of several seeds, which writes none: run one --seed for a report page)"
    )


RECORD_MISTAKES = [
    ("missing", None, r"evaluation record not found: .*missing\.evaluation\.json\.gz.*detens evaluate"),
    ("not gzip", b"{}", r"not a gzip-compressed JSON evaluation record"),
    ("other format", gzip.compress(b'{"format": "x"}'), r"not a detens evaluation record .*'x'"),
    ("truncated", gzip.compress(b'{"format": "x"}' * 100, mtime=0)[:30], r"truncated\.evaluation\.json\.gz is not a gzip"),
    # bytes overwritten inside a deflate block: zlib's own error, not gzip's
    ("damaged", (lambda data: data[:200] + b"\xff" * 50 + data[250:])(
        gzip.compress(json.dumps({"x": list(range(20_000))}).encode(), mtime=0)), r"damaged\.evaluation\.json\.gz is not a gzip"),
    ("nested", gzip.compress(b"[" * 100_000 + b"]" * 100_000), r"nested\.evaluation\.json\.gz nests arrays or objects too deeply"),
    ("long integer", gzip.compress(b'{"format": ' + b"1" * 5000 + b"}"), r"long_integer\.evaluation\.json\.gz cannot be read as JSON"),
    ("key twice", gzip.compress(b'{"format": "x", "format": "y"}'), r"key_twice\.evaluation\.json\.gz has the key 'format' twice"),
    ("columns differ", None, r"results\['single:a'\]: its columns differ in length"),
]


@pytest.mark.parametrize("case, content, message", RECORD_MISTAKES, ids=[c[0] for c in RECORD_MISTAKES])
def test_record_mistakes_name_the_file(tmp_path, case, content, message):
    path = tmp_path / f"{case.replace(' ', '_')}.evaluation.json.gz"
    if case == "missing":
        path = tmp_path / "missing.json"
    elif case == "columns differ":
        tiny_record().save(path)
        document = json.loads(gzip.decompress(path.read_bytes()))
        document["results"]["single:a"]["score"].append(0.5)
        path.write_bytes(gzip.compress(json.dumps(document).encode()))
    else:
        path.write_bytes(content)
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        EvaluationRecord.load(path)


@pytest.mark.parametrize("metrics, message", [
    ({}, "the evaluation record's 'metrics' holds no method: a run scores at least one"),
    ({"single:a": {"map50": 0.5}}, "the evaluation record's metrics['single:a'] lacks 'map', the mAP the page ranks by"),
    ({"single:a": {"map": "high"}},
     "the evaluation record's metrics['single:a']['map'] must be a number, got str: 'high'"),
    ({"single:a": {"map": None}}, "the evaluation record's metrics['single:a']['map'] must be a number, got NoneType: None"),
    ({"single:a": {"map": 0.5, "ece": True}},
     "the evaluation record's metrics['single:a']['ece'] must be a number, got bool: True"),
    ({"single:a": {"map": float("nan")}}, "the evaluation record's metrics['single:a']['map'] must be a finite number, got nan"),
])
def test_a_table_without_a_number_to_rank_by_is_refused_naming_the_row(tmp_path, metrics, message):
    record = tiny_record()
    path = record.save(tmp_path / "good.evaluation.json.gz")
    document = json.loads(gzip.decompress(path.read_bytes()))
    document["metrics"] = metrics
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    with pytest.raises(ValueError) as error:
        EvaluationRecord.load(path)
    assert str(error.value) == f"{path}: {message}"
    EvaluationRecord(record.meta, record.gt, {"single:a": {"map": 0.5, "ece": None}}, {}, record.results)  # null: not measured


@pytest.mark.parametrize("change, message", [
    (lambda d: d["meta"].update(models=[1, 2]), "the evaluation record's meta['models'] must list the members' names, got [1, 2]"),
    (lambda d: d["meta"].update(models="yolo11n"), "the evaluation record's meta['models'] must be a list or null, got str: 'yolo11n'"),
    (lambda d: d["meta"].update(fit_on="elsewhere"),
     "the evaluation record's meta['fit_on'] must be a JSON object or null, got str: 'elsewhere'"),
    (lambda d: d["meta"].update(folds=5), "the evaluation record's meta['folds'] must be a list or null, got int: 5"),
    (lambda d: d["meta"].update(folds=["x"]), "the evaluation record's meta['folds'] must list the folds' image counts, got ['x']"),
    (lambda d: d["meta"].update(seed=True), "the evaluation record's meta['seed'] must be an integer or null, got bool: True"),
    (lambda d: d["calibration"].update({"single:a": {"ece": 0.1}}),
     "the evaluation record's calibration['single:a'] must hold 'ece' (a number) and 'bins' (a list): "
     "detection_calibration's output, which the reliability diagram draws"),
    (lambda d: d["calibration"].update({"single:a": {"ece": float("nan"), "bins": []}}),
     "the evaluation record's calibration['single:a']['ece'] must be in [0, 1], got nan"),
    (lambda d: d["calibration"].update({"single:a": {"ece": "0.1", "bins": []}}),
     "the evaluation record's calibration['single:a']['ece'] must be a number, got str: '0.1'"),
    (lambda d: d["calibration"].update({"single:a": {"ece": 1.5, "bins": []}}),
     "the evaluation record's calibration['single:a']['ece'] must be in [0, 1], got 1.5"),
    (lambda d: d["gt"].update(images=[]), "the evaluation record's ground truth lists no image: a run scores at least one"),
    (lambda d: d["members"].update(b=d["members"].pop("a")),
     "the evaluation record's metrics has rows ['single:a'] of models that are not among its members ['b']"),
    (lambda d: [d[k].update({"single:": d[k].pop("single:a")}) for k in ("metrics", "results")],
     "the evaluation record's metrics has a row 'single:' that names no model"),
])
def test_a_record_the_page_cannot_read_is_refused_naming_the_file_and_the_field(tmp_path, change, message):
    """Each of these loaded, then ended the page in a traceback (KeyError, AttributeError) or an error that
    named nothing ("can only join an iterable")."""
    path = tiny_record().save(tmp_path / "bad.evaluation.json.gz")
    document = json.loads(gzip.decompress(path.read_bytes()))
    change(document)
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    with pytest.raises(ValueError) as error:
        EvaluationRecord.load(path)
    assert str(error.value) == f"{path}: {message}"


def test_side_by_sides_without_a_fused_method_say_that_one_is_missing(tmp_path):
    """The note asked to add 'single' to --methods, which the table of single models had."""
    from detens.report.page import _examples

    shown, note = _examples(tiny_record(), tmp_path, tmp_path / "page", 3, 0.3)
    assert shown == {}
    assert note == "Side-by-sides need a fused method in the table beside the single models (add one to --methods)."


@pytest.mark.parametrize("fitting", [False, True])
def test_a_page_is_not_written_into_a_prediction_folder_its_evaluation_read(tmp_path, capsys, fitting):
    """Its page.json would be read there as one more member's results: every later evaluate on it failed."""
    from detens.cli import main

    record, folder = tiny_record(), tmp_path / "predictions"
    folder.mkdir()
    (folder / "a.json").write_text("[]")
    meta = {"fit_on": {"predictions": str(folder)}} if fitting else {"predictions": str(folder)}
    path = EvaluationRecord({**record.meta, **meta}, record.gt, record.metrics, {}, record.results,
                            record.members).save(tmp_path / "r.evaluation.json.gz")
    assert main(["report", str(path), "--out", str(folder), "--quiet"]) == 2
    what = "fitting data" if fitting else "predictions"
    assert capsys.readouterr().err == (
        f"error: detens report: the report page's numbers {folder / 'page.json'} would be written into the prediction "
        f"folder of the evaluation's {what}, where every .json file is read as a member's predictions; give it "
        "another folder (see detens report --help)\n"
    )
    assert sorted(p.name for p in folder.iterdir()) == ["a.json"]


def test_a_renamed_record_is_read_as_the_record_it_is(tmp_path):
    """'report.json.gz' was taken for a table and its record looked for as report.json.evaluation.json.gz."""
    record = tiny_record()
    path = tmp_path / "kept.json.gz"
    path.write_bytes(record.save(tmp_path / "r.evaluation.json.gz").read_bytes())
    assert EvaluationRecord.load(path).results == record.results


@pytest.mark.parametrize("section, name, column, value, message", [
    ("results", "single:a", "score", float("nan"), "[0].score must be a finite number, got nan"),
    ("results", "single:a", "score", None, "[0].score must be a finite number, got None"),
    ("results", "single:a", "score", 1.5, "[0].score must be in [0, 1] (detens' scores are probabilities), got 1.5"),
    ("members", "a", "bbox", [1, 2, 3], "[0].bbox must be 4 finite numbers [x, y, width, height], got [1, 2, 3]"),
    ("members", "a", "bbox", [1, 2, -3, 4],
     "[0].bbox = [1.0, 2.0, -3.0, 4.0] has a negative width or height; COCO boxes are [x, y, w, h]"),
    ("results", "single:a", "image_id", "1", "[0].image_id must be an integer, got '1'"),
    ("results", "single:a", "category_id", True, "[0].category_id must be an integer, got True"),
])
def test_a_record_whose_results_are_no_coco_results_is_refused_naming_the_file_and_the_row(
    tmp_path, section, name, column, value, message
):
    path = tiny_record().save(tmp_path / "bad.evaluation.json.gz")
    document = json.loads(gzip.decompress(path.read_bytes()))
    document[section][name][column][0] = value
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    with pytest.raises(ValueError) as error:
        EvaluationRecord.load(path)
    assert str(error.value) == f"{path}: {section}[{name!r}]{message}"


def test_the_column_check_of_a_record_passes_only_results_that_validate():
    """The record's results are checked column by column, for speed; what that passes, the row-by-row
    validate_coco_results must accept, and what it refuses, that check must have left to it."""
    from detens.coco import validate_coco_results
    from detens.report.record import _columns_are_results

    rng = np.random.default_rng(0)
    mutations = [
        ("score", lambda: float("nan")), ("score", lambda: -0.1), ("score", lambda: 1.0), ("score", lambda: None),
        ("score", lambda: "0.5"), ("score", lambda: True), ("bbox", lambda: [1, 2, 3]), ("bbox", lambda: [1, 2, True, 4]), ("bbox", lambda: [1, 2, 3, float("inf")]),
        ("bbox", lambda: [1, 2, 0, 0]), ("bbox", lambda: [1, 2, -1, 4]), ("bbox", lambda: "1 2 3 4"),
        ("image_id", lambda: 1.0), ("image_id", lambda: "1"), ("image_id", lambda: True), ("category_id", lambda: 2.5),
        ("category_id", lambda: None), ("category_id", lambda: 7), ("category_id", lambda: -1),
        ("category_id", lambda: 2**31),
    ]
    verdicts = set()
    for _ in range(300):
        k = int(rng.integers(0, 5))
        columns = {"image_id": rng.integers(1, 9, k).tolist(), "category_id": rng.integers(1, 4, k).tolist(),
                   "bbox": rng.uniform(0, 50, (k, 4)).tolist(), "score": rng.uniform(0, 1, k).tolist()}
        if k and rng.random() < 0.7:
            key, make = mutations[int(rng.integers(len(mutations)))]
            columns[key][int(rng.integers(k))] = make()
        rows = [dict(zip(columns, row, strict=True)) for row in zip(*columns.values(), strict=True)]
        try:
            validate_coco_results(rows)
            valid = True
        except (TypeError, ValueError):
            valid = False
        fast = _columns_are_results(columns)
        assert valid or not fast, columns  # never passes what the row check refuses
        verdicts.add((fast, valid))
    assert verdicts == {(True, True), (False, False), (False, True)}  # the last: float ids, left to the rows


def test_example_pngs_must_name_both_kinds(tmp_path):
    from detens.report.examples import write_examples

    with pytest.raises(ValueError, match=r"pngs must give the PNG of 'helped' and of 'hurt', got \['helped'\]"):
        write_examples(None, tmp_path, "wbf", [], "m0", {}, tmp_path, {"helped": "helped_{rank}_{image_id}.png"})


MALFORMED_SECTIONS = [
    ("results a list", "results", [], r"'results' must be a JSON object \(\{method: columns\}\), got list"),
    ("meta a list", "meta", [], r"'meta' must be a JSON object \(how the run was made\), got list"),
    ("gt a string", "gt", "instances.json", r"'gt' must be a JSON object .*got str"),
    ("members a list", "members", [], r"'members' must be a JSON object \(\{model: columns\}\), got list"),
    ("a metrics row a number", "metrics", {"single:a": 1.0}, r"metrics\['single:a'\] must be a JSON object, got float"),
]


@pytest.mark.parametrize("case, section, value, message", MALFORMED_SECTIONS, ids=[c[0] for c in MALFORMED_SECTIONS])
def test_a_malformed_section_names_the_file_and_the_section(tmp_path, case, section, value, message):
    path = tiny_record().save(tmp_path / "r.evaluation.json.gz")
    document = json.loads(gzip.decompress(path.read_bytes()))
    document[section] = value
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: the evaluation record's " + message):
        EvaluationRecord.load(path)
    record = tiny_record()
    setattr(record, section, value)
    with pytest.raises(ValueError, match=message):  # made in Python, the same check
        EvaluationRecord(record.meta, record.gt, record.metrics, record.calibration, record.results, record.members)


def test_page_writes_names_the_files_of_a_page(tmp_path):
    from detens.report.page import _PAGE_FILES, page_writes

    page = tmp_path / "page"
    for name in (*_PAGE_FILES, "page.json", "index.html", "map.png", "examples/helped_1_139.png",
                 "examples/hurt_3_7.png"):
        assert page_writes(page, page / name), name
    assert page_writes(str(page), tmp_path / "elsewhere" / ".." / "page" / "page.json")  # the same file
    for name in ("report.json", "report.evaluation.json.gz", "notes.txt", "examples/mine.png",
                 "examples/sub/helped_1_2.png", "sub/index.html", "examples/hurt_1_notes.txt"):
        assert not page_writes(page, page / name), name
    assert not page_writes(page, tmp_path / "index.html")  # beside the folder, not in it


@pytest.mark.parametrize("content", ["[" * 100_000 + "]" * 100_000, "1" * 5000, '{"meta": 1, "meta": 2}', "\xff"])
def test_a_report_json_in_the_page_folder_that_cannot_be_read_is_no_page_file(tmp_path, content):
    """A report.json beside the page that is nested too deeply, an integer of 5000 digits, gives a key twice
    or is no UTF-8 is not the numbers file of an earlier page: it stays, as a file that is not JSON does,
    where nesting raised a RecursionError and the integer a ValueError."""
    from detens.report.page import _page_files, check_page_replaceable

    (tmp_path / "report.json").write_bytes(content.encode("latin-1"))
    check_page_replaceable(tmp_path, "--report")
    assert _page_files(tmp_path) == []


@pytest.mark.parametrize("pixels", [True, False])
def test_a_resized_image_file_is_refused_naming_it_and_both_sizes(tmp_path, pixels):
    import cv2

    from detens.coco import CocoGroundTruth
    from detens.report.examples import read_images

    truth = CocoGroundTruth(tiny_record().gt)  # 1.jpg: 100 x 80 (width x height)
    cv2.imwrite(str(tmp_path / "1.jpg"), np.zeros((80, 100, 3), np.uint8))
    read = read_images(truth, tmp_path, [1], pixels=pixels)
    assert (read[1].shape == (80, 100, 3)) if pixels else read == {}
    cv2.imwrite(str(tmp_path / "1.jpg"), np.zeros((40, 50, 3), np.uint8))  # a half-size copy
    with pytest.raises(ValueError, match=r"1 of the 1 images to draw in .* are not the size the ground truth gives "
                                         r"them \(width x height\): 1\.jpg is 50x40, the ground truth says 100x80"):
        read_images(truth, tmp_path, [1], pixels=pixels)
    (tmp_path / "1.jpg").write_bytes(b"not an image")
    with pytest.raises(FileNotFoundError, match=r"1 of the 1 images to draw are not usable in .* \(unreadable 1\.jpg\)"):
        read_images(truth, tmp_path, [1], pixels=pixels)


@pytest.mark.parametrize("pixels", [True, False])
@pytest.mark.parametrize("kind", [".png", ".jpg"])
def test_an_image_whose_header_is_sound_and_pixels_are_not_is_unreadable(tmp_path, pixels, kind):
    """What evaluate --report checks of every scored image before it runs: what drawing would fail on, and
    what detens fuse skips (cv2.imread reads the start of a truncated JPEG, grey below)."""
    import cv2

    from detens.coco import CocoGroundTruth
    from detens.report.examples import read_images

    truth = CocoGroundTruth(tiny_record().gt)  # 1.jpg: 100 x 80 (width x height)
    ok, encoded = cv2.imencode(kind, np.random.default_rng(0).integers(0, 256, (80, 100, 3), np.uint8))
    assert ok
    (tmp_path / "1.jpg").write_bytes(encoded.tobytes()[: encoded.size // 2])  # the header whole, half the pixels
    with pytest.raises(FileNotFoundError, match=r"1 of the 1 images to draw are not usable in .* \(unreadable 1\.jpg\)"):
        read_images(truth, tmp_path, [1], pixels=pixels)


#: file names that lead outside the images folder, joined to it
ESCAPING_FILE_NAMES = ["../outside.jpg", "sub/../../outside.jpg", "..\\outside.jpg", "ABSOLUTE", "C:\\outside.jpg"]


@pytest.mark.parametrize("pixels", [True, False])
@pytest.mark.parametrize("file_name", ESCAPING_FILE_NAMES)
def test_an_image_outside_the_images_folder_is_never_read(tmp_path, pixels, file_name):
    """A ground truth's file_name is joined to the images folder: '../x.jpg', or an absolute one, drew a
    file from elsewhere onto the page."""
    import cv2

    from detens.coco import CocoGroundTruth
    from detens.report.examples import read_images

    images = tmp_path / "images"
    images.mkdir()
    assert cv2.imwrite(str(tmp_path / "outside.jpg"), np.zeros((80, 100, 3), np.uint8))  # 1.jpg's size
    file_name = str(tmp_path / "outside.jpg") if file_name == "ABSOLUTE" else file_name
    gt = tiny_record().gt
    truth = CocoGroundTruth({**gt, "images": [{**gt["images"][0], "file_name": file_name}]})
    with pytest.raises(ValueError) as error:
        read_images(truth, images, [1], pixels=pixels)
    assert str(error.value) == (f"image 1 of the ground truth has file_name {file_name!r}, which leads outside the "
                                "images folder: expected a path inside it (relative to it, without '..')")


@pytest.mark.parametrize("pixels", [True, False])
def test_an_exif_rotated_image_is_drawn_as_stored(tmp_path, pixels, with_orientation_tag):
    """The ground truth's boxes and size describe the stored pixels; an EXIF "rotate 90°" tag is not applied."""
    import cv2

    from detens.coco import CocoGroundTruth
    from detens.report.examples import read_images

    truth = CocoGroundTruth(tiny_record().gt)  # 1.jpg: 100 x 80 (width x height)
    ok, encoded = cv2.imencode(".jpg", np.zeros((80, 100, 3), np.uint8))
    assert ok
    (tmp_path / "1.jpg").write_bytes(with_orientation_tag(encoded.tobytes(), 6))
    read = read_images(truth, tmp_path, [1], pixels=pixels)  # stored size: no rotated size refused
    assert (read[1].shape == (80, 100, 3)) if pixels else read == {}


@pytest.mark.parametrize("seed", range(6))
def test_per_image_ap_is_cocoevals_ap50_of_each_image_alone(seed):
    """The report's helped / hurt images are ranked by each image's AP50 as COCOeval scores that image alone
    (ties in score and IoU, crowd regions, classes without ground truth in the image)."""
    from test_error_breakdown import random_case

    from detens.coco import evaluate_coco
    from detens.report.examples import per_image_ap

    gt, results = random_case(seed)
    got = per_image_ap(gt, results, gt.image_ids)
    counted = {a["image_id"] for a in gt.coco.dataset["annotations"] if not a["iscrowd"]}
    assert set(got) == counted
    for image_id in counted:
        alone = evaluate_coco(gt, [r for r in results if r["image_id"] == image_id], image_ids=[image_id])
        assert got[image_id] == pytest.approx(alone["map50"], abs=1e-12), image_id


@pytest.mark.parametrize("seed", range(6))
def test_member_support_matches_a_slow_reference(seed):
    """Each fused detection counts the members with a box of its class at IoU >= 0.55 scoring at least
    ``min_score``, binned by its COCOeval label at IoU 0.5 (top 100 per image and class)."""
    import random

    from test_calibration_metrics import reference_iou
    from test_error_breakdown import random_case

    from detens.coco_match import FP, TP, iter_matches
    from detens.report.support import member_support

    gt, fused = random_case(seed)
    rng = random.Random(seed)
    members = {}
    for name in ("a", "b", "c"):
        members[name] = [{**r, "bbox": [v + rng.randint(-3, 3) for v in r["bbox"][:2]] + r["bbox"][2:],
                          "score": round(rng.random(), 1)} for r in fused if rng.random() < 0.7]

    for min_score in (0.0, 0.4):
        got = member_support(gt, fused, members, gt.image_ids, min_score=min_score)
        expected = {TP: [0] * 4, FP: [0] * 4}
        for image in iter_matches(gt, fused, gt.image_ids, 0.5):
            for detection, label in zip(image.detections, image.labels, strict=True):
                if label not in expected or detection["score"] < min_score:
                    continue
                support = sum(
                    any(r["image_id"] == image.image_id and r["category_id"] == detection["category_id"]
                        and r["score"] >= min_score and reference_iou(detection["bbox"], r["bbox"]) >= 0.55
                        for r in theirs)
                    for theirs in members.values())
                expected[label][support] += 1
        assert got["tp"] == expected[TP] and got["fp"] == expected[FP] and got["members"] == 3
        assert sum(got["tp"]) > 0 and sum(got["fp"]) > 0


def test_side_by_side_refuses_detections_of_another_image_size():
    from detens.detections import Detections
    from detens.report.examples import draw_side_by_side

    det = Detections(np.array([[200.0, 100.0, 390.0, 190.0]]), np.array([0.9]), np.array([0]), (200, 400))
    same = np.zeros((200, 400, 3), np.uint8)
    assert draw_side_by_side(same, [("m", det)], det.boxes.numpy(), {0: "person"}, 0.3, panel_width=200).shape[1] == 200
    with pytest.raises(ValueError, match=r"panel 'm': its detections are for a 400x200 image \(width x height\), "
                                         r"but the image is 200x100"):
        draw_side_by_side(np.zeros((100, 200, 3), np.uint8), [("m", det)], np.zeros((0, 4)), {0: "person"}, 0.3)
    with pytest.raises(ValueError, match=r"gt_boxes\[0\] is not finite"):
        draw_side_by_side(same, [("m", det)], np.array([[1.0, 2.0, np.nan, 4.0]]), {0: "person"}, 0.3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_side_by_side_draws_detections_on_the_gpu():
    from detens.detections import Detections
    from detens.report.examples import draw_side_by_side

    det = Detections(np.array([[200.0, 100.0, 390.0, 190.0]]), np.array([0.9]), np.array([0]), (200, 400))
    image = np.zeros((200, 400, 3), np.uint8)
    on_gpu = draw_side_by_side(image, [("m", det.to("cuda"))], det.boxes.numpy(), {0: "person"}, 0.3, panel_width=200)
    on_cpu = draw_side_by_side(image, [("m", det)], det.boxes.numpy(), {0: "person"}, 0.3, panel_width=200)
    np.testing.assert_array_equal(on_gpu, on_cpu)


# a pair of $ is math text to matplotlib (drawn garbled), an odd $ or a bad formula a parse error
MATH_LOOKING_NAMES = ["hot $x^$ dog", "US$ bill, $5"]


@pytest.mark.parametrize("name", MATH_LOOKING_NAMES)
def test_figures_draw_class_and_method_names_as_written(tmp_path, monkeypatch, name):
    import matplotlib.text

    from detens.report import plots

    drawn: list[tuple[str, bool]] = []
    save = plots._save

    def keep_texts(fig, path):
        fig.canvas.draw()  # tick labels are made here
        drawn.extend((t.get_text(), t.get_parse_math()) for t in fig.findobj(matplotlib.text.Text) if name in t.get_text())
        save(fig, path)

    monkeypatch.setattr(plots, "_save", keep_texts)
    method, single = f"wbf {name}", f"single:{name}"
    curve = {"recall": [0.0, 0.5, 1.0], "precision": {"0.5": [1.0, 0.8, 0.2]}}
    calibration = {"ece": 0.1, "bins": [{"count": 3, "mean_score": 0.5, "tp_rate": 0.4}]}
    breakdown = {"dap": {"cls": 0.01}, "dap_special": {}}
    support = {"tp": [1, 2], "fp": [0, 1], "iou_thr": 0.55}
    plots.plot_report({method: {"map": 0.3, "map50": 0.5}}, tmp_path / "map.png", title=name)
    plots.plot_reliability({method: calibration}, tmp_path / "reliability.png", title=name)
    plots.plot_pr_curves({method: curve, single: curve}, tmp_path / "pr.png", title=name)
    plots.plot_class_deltas([(name, 0.2, 0.3)], tmp_path / "classes.png", single, method)
    plots.plot_error_breakdown({method: breakdown}, tmp_path / "errors.png", ("cls",), title=name)
    plots.plot_support({method: support}, tmp_path / "votes.png", title=name)
    assert all((tmp_path / f).read_bytes()[:8] == PNG_SIGNATURE for f in
               ("map.png", "reliability.png", "pr.png", "classes.png", "errors.png", "votes.png"))
    # the name is in a title, tick labels and legends of every figure, each drawn as plain text
    assert len(drawn) >= 12 and all(parse_math is False for _, parse_math in drawn), drawn
    import matplotlib

    assert matplotlib.rcParams["text.parse_math"] is True  # left as it was


def test_the_readmes_report_commands_parse():
    """The README's report section runs `detens evaluate --report` and `detens report` with options that
    exist (the commands themselves run on the full data set, minutes; the test below runs them small)."""
    import re
    import shlex

    from detens.cli import build_parser

    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## The report page", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)[0]
    commands = [re.sub(r"#.*", "", c).strip() for c in re.sub(r"\\\n\s*", " ", block).splitlines() if c.strip()]
    assert [shlex.split(c)[:2] for c in commands] == [["detens", "evaluate"], ["detens", "report"]]
    parser = build_parser()
    evaluate = parser.parse_args(shlex.split(commands[0].replace("$S", "S"))[1:])
    assert evaluate.report and "single" in evaluate.methods
    report = parser.parse_args(shlex.split(commands[1])[1:])
    assert record_path(report.evaluation) == record_path(evaluate.out)  # rebuilds the evaluation just made
    assert (REPO / "docs" / "report_yolo3.png").read_bytes()[:8] == PNG_SIGNATURE
    assert "](docs/report_yolo3.png)" in section


@pytest.mark.parametrize(
    "examples, error, message",
    [
        (-1, ValueError, "examples must be an integer >= 0, got -1"),
        (True, TypeError, "examples must be an integer, got bool: True"),
        (2.0, TypeError, "examples must be an integer, got float: 2.0"),
        ("3", TypeError, "examples must be an integer, got str: '3'"),
    ],
)
def test_a_count_of_examples_that_is_no_integer_is_a_type_error_before_anything_is_written(
    tmp_path, examples, error, message
):
    from detens.report.page import write_report

    with pytest.raises(error, match=message):
        write_report(None, tmp_path / "page", examples=examples)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("conf", "error", "message"),
    [("0.3", TypeError, "conf must be a number, got str: '0.3'"), (1.5, ValueError, r"conf must be in \[0, 1\]")],
)
def test_a_conf_of_another_kind_or_out_of_range_is_named_before_anything_is_written(tmp_path, conf, error, message):
    from detens.report.page import write_report

    with pytest.raises(error, match=message):
        write_report(None, tmp_path / "page", conf=conf)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------- a quick evaluation: synthetic members, 8 images
@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """`detens evaluate` (single, wbf; 2-fold CV) on 8 annotated images of coco_val2017_206, with two
    members made from the ground truth (jittered boxes, misses, false positives) instead of detectors."""
    import random

    from detens.cli import main

    root = tmp_path_factory.mktemp("quick")
    full = json.loads((DATA / "instances_val2017.json").read_text())
    keep = set(sorted({a["image_id"] for a in full["annotations"]})[:8])
    images = [im for im in full["images"] if im["id"] in keep]
    (root / "images").mkdir()
    for image in images:
        shutil.copy(DATA / "images" / image["file_name"], root / "images" / image["file_name"])
    annotations = [a for a in full["annotations"] if a["image_id"] in keep]
    (root / "instances.json").write_text(json.dumps({**full, "images": images, "annotations": annotations}))
    (root / "predictions").mkdir()
    for seed, jitter in enumerate((0.03, 0.12)):
        rng = random.Random(seed)
        results = []
        for a in annotations:
            if not a["iscrowd"] and rng.random() > 0.2:
                x, y, w, h = a["bbox"]
                box = [x + rng.gauss(0, jitter * w), y + rng.gauss(0, jitter * h), max(1.0, w * (1 + rng.gauss(0, jitter))),
                       max(1.0, h * (1 + rng.gauss(0, jitter)))]
                results.append({"image_id": a["image_id"], "category_id": a["category_id"], "bbox": box,
                                "score": rng.uniform(0.3, 1.0)})
        for image in images:
            for _ in range(4):
                results.append({"image_id": image["id"], "category_id": rng.choice(annotations)["category_id"],
                                "bbox": [rng.uniform(0, image["width"] / 2), rng.uniform(0, image["height"] / 2),
                                         rng.uniform(10, 90), rng.uniform(10, 90)], "score": rng.uniform(0.01, 0.6)})
        (root / "predictions" / f"m{seed}.json").write_text(json.dumps(results))
    assert main(["evaluate", "--gt", str(root / "instances.json"), "--predictions", str(root / "predictions"),
                 "--methods", "single,wbf", "--cv", "2", "--out", str(root / "results.json"), "--quiet"]) == 0
    return root


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@needs_data
class TestReportFolder:
    def test_a_missing_image_is_one_error_before_anything_is_written(self, quick, tmp_path, capsys):
        from detens.cli import main

        page = tmp_path / "page"
        assert main(["report", str(quick / "results.json"), "--out", str(page), "--quiet"]) == 0
        shown = json.loads((page / "page.json").read_text())["examples"]
        drawn = [e["file_name"] for kind in ("helped", "hurt") for e in shown[kind]]
        assert len(drawn) >= 2
        assert sorted(folder_bytes(page / "examples")) == sorted(Path(e["png"]).name for k in shown for e in shown[k])
        earlier = folder_bytes(page)
        incomplete = tmp_path / "images"
        shutil.copytree(quick / "images", incomplete)
        (incomplete / drawn[-1]).unlink()
        (incomplete / drawn[0]).write_bytes(b"not an image")
        capsys.readouterr()
        # another --conf: every figure it would draw differs from the page already there
        errors = []
        for out in (page, tmp_path / "new" / "page"):
            code = main(["report", str(quick / "results.json"), "--out", str(out), "--images", str(incomplete),
                         "--conf", "0.5", "--quiet"])
            errors.append((code, capsys.readouterr().err))
        assert folder_bytes(page) == earlier and not [p for p in page.iterdir() if p.name.startswith(".")]
        assert not (tmp_path / "new").exists()
        for code, err in errors:
            assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
            assert f"missing {drawn[-1]}" in err and f"unreadable {drawn[0]}" in err, err

    def test_a_page_file_that_may_not_be_replaced_is_refused_before_any_method_is_analyzed(self, quick, tmp_path,
                                                                                           capsys, monkeypatch,
                                                                                           immutable):
        """The new page would find it only when it moves into place, once drawn."""
        import detens.report.page as page_module
        from detens.cli import main

        page = tmp_path / "page"
        assert main(["report", str(quick / "results.json"), "--out", str(page), "--examples", "0", "--quiet"]) == 0
        earlier = folder_bytes(page)
        immutable(page / "map.png")
        analyzed = []
        monkeypatch.setattr(page_module, "analyze_record", lambda *a, **k: analyzed.append(1))
        capsys.readouterr()
        assert main(["report", str(quick / "results.json"), "--out", str(page), "--examples", "0", "--quiet"]) == 2
        assert capsys.readouterr().err == (
            f"error: the page's file {page / 'map.png'} cannot be written: the file there may be neither replaced, "
            "moved nor removed (Operation not permitted: it is marked immutable or append-only, as lsattr shows); "
            "lift that mark, or give another --out\n")
        assert analyzed == [] and folder_bytes(page) == earlier

    @pytest.mark.parametrize("problem", ["missing", "unreadable", "resized"])
    def test_an_unusable_image_ends_the_page_before_any_method_is_analyzed(self, quick, tmp_path, capsys, monkeypatch,
                                                                           problem):
        import cv2

        import detens.report.page as page_module
        from detens.cli import main

        page = tmp_path / "page"
        assert main(["report", str(quick / "results.json"), "--out", str(page), "--examples", "1", "--quiet"]) == 0
        earlier = folder_bytes(page)
        drawn = json.loads((page / "page.json").read_text())["examples"]["helped"][0]["file_name"]
        images = tmp_path / "images"
        shutil.copytree(quick / "images", images)
        if problem == "missing":
            (images / drawn).unlink()
        elif problem == "unreadable":
            (images / drawn).write_bytes(b"not an image")
        else:
            pixels = cv2.imread(str(images / drawn))
            cv2.imwrite(str(images / drawn), pixels[::2, ::2])
        analyzed = []
        original = page_module.analyze_record
        monkeypatch.setattr(page_module, "analyze_record", lambda *a, **k: analyzed.append(1) or original(*a, **k))
        capsys.readouterr()
        code = main(["report", str(quick / "results.json"), "--out", str(page), "--examples", "1", "--images",
                     str(images), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and drawn in err, err
        assert analyzed == []  # the long work never started
        assert folder_bytes(page) == earlier
        assert main(["report", str(quick / "results.json"), "--out", str(page), "--examples", "1", "--quiet"]) == 0
        assert analyzed == [1]

    def test_the_header_counts_the_categories_cocoeval_averages_over(self, quick, tmp_path):
        import contextlib
        import io

        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval

        from detens.report.page import write_report

        record = EvaluationRecord.load(quick / "results.json")
        listed = len(record.gt["categories"])
        averaged = None
        for method, results in record.results.items():
            with contextlib.redirect_stdout(io.StringIO()):
                coco = COCO()
                coco.dataset = json.loads(json.dumps(record.gt))
                coco.createIndex()
                evaluator = COCOeval(coco, coco.loadRes(json.loads(json.dumps(results))), "bbox")
                evaluator.params.imgIds = record.image_ids
                evaluator.evaluate()
                evaluator.accumulate()
                evaluator.summarize()
            precision = evaluator.eval["precision"][:, :, :, 0, 2]  # [T, R, K], area all, 100 detections
            # COCOeval leaves -1 where a category has no ground truth and averages over the others alone
            counted = [c for k, c in enumerate(evaluator.params.catIds) if (precision[:, :, k] > -1).all()]
            assert np.mean(precision[:, :, [evaluator.params.catIds.index(c) for c in counted]]) == pytest.approx(
                record.metrics[method]["map"], abs=1e-12)
            assert averaged in (None, counted)
            averaged = counted
        assert 0 < len(averaged) < listed
        html = write_report(record, tmp_path / "page", examples=0).read_text()
        assert (f"{len(averaged)} categories with ground truth, over which the APs are averaged ({listed} in the "
                f"label space, {listed - len(averaged)} without ground truth here)") in html
        assert f"{listed} categories" not in html.replace(f"({listed} in the label space", "")
        assert json.loads((tmp_path / "page" / "page.json").read_text())["scored_categories"] == averaged

    def test_the_table_may_share_the_pages_folder(self, quick, tmp_path, capsys):
        from detens.cli import main

        folder = tmp_path / "run"
        table = folder / "report.json"
        assert main(["evaluate", "--gt", str(quick / "instances.json"), "--predictions", str(quick / "predictions"),
                     "--methods", "single,wbf", "--cv", "2", "--out", str(table), "--report", str(folder),
                     "--quiet"]) == 0
        written = table.read_bytes()
        assert json.loads(written) == EvaluationRecord.load(table).metrics  # the table, not the page's numbers
        assert json.loads((folder / "page.json").read_text())["metrics"] == json.loads(written)
        capsys.readouterr()
        assert main(["report", str(table), "--out", str(folder), "--examples", "1", "--quiet"]) == 0, capsys.readouterr().err
        assert table.read_bytes() == written and (folder / "index.html").is_file()

    def test_a_page_that_would_land_on_the_runs_files_is_refused_before_it_runs(self, quick, tmp_path, capsys):
        from detens.cli import main

        base = ["evaluate", "--gt", str(quick / "instances.json"), "--predictions", str(quick / "predictions"),
                "--methods", "wbf", "--report", str(tmp_path), "--quiet"]
        for extra, clash in ((["--out", str(tmp_path / "page.json")], "page.json (--out)"),
                             (["--out", str(tmp_path / "r.json"), "--plot", str(tmp_path / "map.png")], "map.png (--plot)"),
                             (["--out", str(tmp_path / "r.json"), "--reliability", str(tmp_path / "reliability.png")],
                              "reliability.png (--reliability)")):
            assert main(base + extra) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "Traceback" not in err, err
            assert f"the report page in --report {tmp_path} would write over {tmp_path / clash}" in err, err
            assert list(tmp_path.iterdir()) == []  # nothing ran
        shutil.copy(quick / "results.json", tmp_path / "index.html")  # a table named like the page's index
        shutil.copy(quick / "results.evaluation.json.gz", tmp_path / "index.evaluation.json.gz")
        assert main(["report", str(tmp_path / "index.html"), "--out", str(tmp_path), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"the page in --out {tmp_path} would write over {tmp_path / 'index.html'} (EVALUATION)" in err, err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["index.evaluation.json.gz", "index.html"]

    def test_an_empty_page_folder_is_refused_not_taken_for_the_working_directory(
        self, quick, tmp_path, monkeypatch, capsys
    ):
        from detens.cli import main

        monkeypatch.chdir(tmp_path)
        for flag, argv in (("--out", ["report", str(quick / "results.json"), "--out", ""]),
                           ("--report", ["evaluate", "--gt", str(quick / "instances.json"), "--predictions",
                                         str(quick / "predictions"), "--methods", "mean", "--out",
                                         str(tmp_path / "r.json"), "--report", ""])):
            try:  # refused as the arguments are parsed
                code = main([*argv, "--quiet"])
            except SystemExit as stop:
                code = stop.code
            assert code == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "Traceback" not in err, err
            assert f"argument {flag}: expected a folder, got an empty path (write . for the working directory)" in err, err
            assert list(tmp_path.iterdir()) == []

    def test_a_numpy_integer_count_of_examples_draws_the_page_of_the_python_int(self, quick, tmp_path):
        from detens.report.page import write_report

        record = EvaluationRecord.load(quick / "results.json")
        write_report(record, tmp_path / "int", examples=1)
        write_report(record, tmp_path / "numpy", examples=np.int64(1))
        assert folder_bytes(tmp_path / "numpy") == folder_bytes(tmp_path / "int")
        assert len(json.loads((tmp_path / "int" / "page.json").read_text())["examples"]["helped"]) == 1

    def test_a_page_written_again_from_its_record_is_the_same_bytes(self, quick, tmp_path):
        import time

        from detens.report.page import write_report

        record = EvaluationRecord.load(quick / "results.json")
        write_report(record, tmp_path / "first", examples=1)
        time.sleep(1.1)  # a page that showed when it was written would show another second
        write_report(record, tmp_path / "again", examples=1)
        first = folder_bytes(tmp_path / "first")
        assert {"index.html", "page.json"} <= set(first) and any(name.endswith(".png") for name in first)
        assert folder_bytes(tmp_path / "again") == first
        assert record.meta["created"] in first["index.html"].decode("utf-8")  # when the evaluation ran

    def test_an_older_pages_numbers_go_with_it_and_a_table_stays(self, quick, tmp_path):
        from detens.report.page import write_report

        record = EvaluationRecord.load(quick / "results.json")
        page = tmp_path / "page"
        write_report(record, page, examples=0)
        (page / "page.json").rename(page / "report.json")  # what a page wrote before page.json
        write_report(record, page, examples=0)
        assert not (page / "report.json").exists() and (page / "page.json").is_file()
        shutil.copy(quick / "results.json", page / "report.json")  # a table in the page's folder
        write_report(record, page, examples=0)
        assert (page / "report.json").read_bytes() == (quick / "results.json").read_bytes()

    def test_resized_copies_of_the_images_are_one_error(self, quick, tmp_path, capsys):
        import cv2

        from detens.cli import main

        resized = tmp_path / "half"
        resized.mkdir()
        for image in (quick / "images").iterdir():
            pixels = cv2.imread(str(image))
            cv2.imwrite(str(resized / image.name), cv2.resize(pixels, (pixels.shape[1] // 2, pixels.shape[0] // 2)))
        assert main(["report", str(quick / "results.json"), "--out", str(tmp_path / "page"), "--images", str(resized),
                     "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
        assert "are not the size the ground truth gives them (width x height)" in err
        named = re.findall(r"(\S+\.jpg) is (\d+)x(\d+), the ground truth says (\d+)x(\d+)", err)
        assert named and all(int(w) * 2 in (int(gw), int(gw) - 1) for _, w, _, gw, _ in named), err
        assert not (tmp_path / "page").exists()

    def test_a_new_page_replaces_the_earlier_ones_files(self, quick, tmp_path):
        from detens.cli import main

        page = tmp_path / "page"
        assert main(["report", str(quick / "results.json"), "--out", str(page), "--quiet"]) == 0
        (page / "notes.txt").write_text("mine")
        assert main(["report", str(quick / "results.json"), "--out", str(page), "--examples", "0", "--quiet"]) == 0
        assert not (page / "examples").exists() and (page / "notes.txt").read_text() == "mine"
        assert sorted(p.name for p in page.iterdir()) == sorted(
            ["notes.txt", "index.html", "page.json", *(u for u in references(page / "index.html").urls)])

    def test_the_files_a_page_replaces_are_the_files_it_draws(self, quick, tmp_path):
        from detens.report.page import _PAGE_FILES, write_report

        record = EvaluationRecord.load(quick / "results.json")
        page = tmp_path / "page"
        write_report(record, page, examples=0)
        # this page draws every figure a page can: its files are the ones the next page replaces
        assert sorted(p.name for p in page.iterdir()) == sorted(_PAGE_FILES)
        singles = [m for m in record.metrics if m.startswith("single:")]
        without_fusion = EvaluationRecord(
            record.meta, record.gt, {m: record.metrics[m] for m in singles}, {m: record.calibration[m] for m in singles},
            {m: record.results[m] for m in singles}, record.members)
        write_report(without_fusion, page, examples=0)  # no class changes, no votes: neither figure stays
        drawn = sorted(u for u in references(page / "index.html").urls)
        assert sorted(p.name for p in page.iterdir()) == sorted(["index.html", "page.json", *drawn])
        assert len(drawn) == len(_PAGE_FILES) - 4

    def test_the_examples_a_page_replaces_are_the_examples_it_draws(self, quick, tmp_path):
        from detens.report.page import _page_files, write_report

        record = EvaluationRecord.load(quick / "results.json")
        page = tmp_path / "page"
        write_report(record, page, examples=2)
        shown = json.loads((page / "page.json").read_text())["examples"]
        drawn = {Path(example["png"]) for kind in ("helped", "hurt") for example in shown[kind]}
        assert shown["helped"] and shown["hurt"]
        assert {path.relative_to(page) for path in (page / "examples").iterdir()} == drawn
        for name in ("mine.png", "helped_notes.png", "hurt_1_notes.txt"):  # no page draws these
            (page / "examples" / name).write_text("not the page's")
        assert {path for path in _page_files(page) if path.parent.name == "examples"} == drawn
        write_report(record, page, examples=0)
        left = {path.name for path in (page / "examples").iterdir()}
        assert left == {"mine.png", "helped_notes.png", "hurt_1_notes.txt"}

    def test_a_hotcoco_table_gets_pycocotools_curves_checked_to_their_agreement(self, quick):
        from detens.report.analysis import OTHER_EVALUATOR_TOLERANCE, analyze_record

        record = EvaluationRecord.load(quick / "results.json")
        assert record.meta["backend"] == "pycocotools"
        reference = analyze_record(record)
        record.meta["backend"] = "hotcoco"
        assert analyze_record(record)["curves"] == reference["curves"]
        record.metrics["wbf"]["map"] += OTHER_EVALUATOR_TOLERANCE / 2  # within the evaluators' agreement
        analyze_record(record)
        record.metrics["wbf"]["map"] += OTHER_EVALUATOR_TOLERANCE
        with pytest.raises(ValueError, match="wbf: the record's predictions give map"):
            analyze_record(record)

    def test_evaluate_with_hotcoco_writes_its_report(self, quick, tmp_path):
        pytest.importorskip("hotcoco", reason="--backend hotcoco needs hotcoco")
        from detens.cli import main

        out, page = tmp_path / "results.json", tmp_path / "page"
        assert main(["evaluate", "--gt", str(quick / "instances.json"), "--predictions", str(quick / "predictions"),
                     "--methods", "single,wbf", "--cv", "2", "--backend", "hotcoco", "--out", str(out),
                     "--report", str(page), "--quiet"]) == 0
        assert EvaluationRecord.load(out).meta["backend"] == "hotcoco"
        drawn = json.loads((page / "page.json").read_text())
        assert drawn["metrics"] == json.loads(out.read_text()) and set(drawn["curves"]) == set(drawn["metrics"])
        assert main(["report", str(out), "--out", str(tmp_path / "again"), "--examples", "0", "--quiet"]) == 0

    @pytest.mark.parametrize("fault", ["missing", "corrupt", "pipe", "resized"])
    def test_evaluate_checks_the_report_images_before_it_runs(self, quick, tmp_path, capsys, monkeypatch, fault,
                                                              named_pipe):
        import cv2

        from detens.cli import main
        from detens.jobs import evaluate

        images = tmp_path / "images"
        shutil.copytree(quick / "images", images)
        bad = sorted(images.iterdir())[0]
        if fault == "missing":
            bad.unlink()
            problem = f"1 of the 8 images to draw are not usable in {images} (missing {bad.name})"
        elif fault == "corrupt":
            bad.write_bytes(bad.read_bytes()[:100])  # a copy cut short, its header incomplete
            problem = f"1 of the 8 images to draw are not usable in {images} (unreadable {bad.name})"
        elif fault == "pipe":  # there, but no file to read: reading it would wait for a writer
            bad.unlink()
            named_pipe(bad)
            problem = f"1 of the 8 images to draw are not usable in {images} (unreadable {bad.name})"
        else:
            pixels = cv2.imread(str(bad))
            cv2.imwrite(str(bad), cv2.resize(pixels, (pixels.shape[1] // 2, pixels.shape[0] // 2)))
            height, width = pixels.shape[:2]
            problem = (f"1 of the 8 images to draw in {images} are not the size the ground truth gives them (width x "
                       f"height): {bad.name} is {width // 2}x{height // 2}, the ground truth says {width}x{height}")
        monkeypatch.setattr(evaluate, "cross_validate", lambda *a, **k: pytest.fail("the evaluation ran"))
        out = tmp_path / "results.json"
        assert main(["evaluate", "--gt", str(quick / "instances.json"), "--predictions", str(quick / "predictions"),
                     "--methods", "wbf", "--out", str(out), "--report", str(tmp_path / "page"), "--images", str(images),
                     "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
        assert f"--report draws the scored images from --images: {problem}" in err, err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]  # nothing written: no table, no page

    def test_an_image_file_outside_the_images_folder_is_refused_by_report_and_by_evaluate(
        self, quick, tmp_path, capsys, monkeypatch
    ):
        from detens.cli import main
        from detens.jobs import evaluate

        images = tmp_path / "images"
        shutil.copytree(quick / "images", images)
        gt = json.loads((quick / "instances.json").read_text())
        moved = gt["images"][0]
        shutil.move(images / moved["file_name"], tmp_path / moved["file_name"])  # beside the folder, not in it
        outside = f"../{moved['file_name']}"
        record = tmp_path / "results.evaluation.json.gz"
        document = json.loads(gzip.decompress((quick / "results.evaluation.json.gz").read_bytes()))
        next(im for im in document["gt"]["images"] if im["id"] == moved["id"])["file_name"] = outside
        record.write_bytes(gzip.compress(json.dumps(document).encode()))
        expected = (f"image {moved['id']} of the ground truth has file_name {outside!r}, which "
                    "leads outside the images folder: expected a path inside it (relative to it, without '..')")
        capsys.readouterr()
        assert main(["report", str(record), "--out", str(tmp_path / "page"), "--images", str(images), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err == f"error: {expected}\n", err  # the record loads: its tables need no image
        assert not (tmp_path / "page").exists()

        moved["file_name"] = outside
        (tmp_path / "instances.json").write_text(json.dumps(gt))
        monkeypatch.setattr(evaluate, "cross_validate", lambda *a, **k: pytest.fail("the evaluation ran"))
        assert main(["evaluate", "--gt", str(tmp_path / "instances.json"), "--predictions", str(quick / "predictions"),
                     "--methods", "wbf", "--out", str(tmp_path / "r.json"), "--report", str(tmp_path / "page"),
                     "--images", str(images), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert (f"--report draws the scored images from --images: image {moved['id']} of the ground truth has file_name "
                f"{outside!r}, which leads outside the images folder") in err, err
        assert not (tmp_path / "page").exists() and not (tmp_path / "r.json").exists()

    def test_a_table_that_its_record_did_not_write_is_refused(self, quick, tmp_path, capsys):
        from detens.cli import main

        for name in ("results.json", "results.evaluation.json.gz"):
            shutil.copy(quick / name, tmp_path / name)
        table = json.loads((tmp_path / "results.json").read_text())
        (tmp_path / "results.json").write_text(json.dumps({"wbf": table["wbf"]}))  # another run's first row
        (tmp_path / "results.partial.json").write_text(json.dumps({"wbf": table["wbf"]}))
        assert main(["report", str(tmp_path / "results.json"), "--out", str(tmp_path / "page")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {tmp_path / 'results.json'} and {tmp_path / 'results.evaluation.json.gz'} are "
                              "not from the same detens evaluate run (rows only in the record: single:m0, single:m1)")
        assert "results.partial.json holds the rows of a run that did not finish" in err and "Traceback" not in err
        assert not (tmp_path / "page").exists()
        # the record on its own is one run, and so is the table that run wrote; an unfinished run is told
        (tmp_path / "results.json").write_text(json.dumps(table))
        assert main(["report", str(tmp_path / "results.json"), "--out", str(tmp_path / "page"), "--examples", "0"]) == 0
        assert "results.partial.json is left by a detens evaluate run that did not finish" in capsys.readouterr().err
        assert json.loads((tmp_path / "page" / "page.json").read_text())["metrics"] == table


# ------------------------------------------------------------------------------ a real evaluation, 20 images
@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """20 annotated images of coco_val2017_206 cached with the shipped coco_yolo3 ensemble, then
    `detens evaluate --report` with cheap methods (2-fold CV)."""
    from detens.cli import main

    root = tmp_path_factory.mktemp("report")
    full = json.loads((DATA / "instances_val2017.json").read_text())
    keep = sorted({a["image_id"] for a in full["annotations"]})[:NUM_IMAGES]
    images = [im for im in full["images"] if im["id"] in set(keep)]
    (root / "data" / "images").mkdir(parents=True)
    for image in images:
        shutil.copy(DATA / "images" / image["file_name"], root / "data" / "images" / image["file_name"])
    subset = {**full, "images": images, "annotations": [a for a in full["annotations"] if a["image_id"] in set(keep)]}
    (root / "data" / "instances.json").write_text(json.dumps(subset))
    cwd = Path.cwd()
    os.chdir(root)
    old_weights = os.environ.get("DETENS_WEIGHTS")
    os.environ["DETENS_WEIGHTS"] = str(SHARED / "models")
    try:
        assert main(["cache", "--config", "coco_yolo3", "--images", "data/images", "--gt", "data/instances.json",
                     "--out", "predictions", "--quiet"]) == 0
        assert main(["evaluate", "--gt", "data/instances.json", "--predictions", "predictions", "--methods", METHODS,
                     "--cv", "2", "--seed", "0", "--out", "results.json", "--report", "page", "--quiet"]) == 0
    finally:
        os.chdir(cwd)
        if old_weights is None:
            os.environ.pop("DETENS_WEIGHTS", None)
        else:
            os.environ["DETENS_WEIGHTS"] = old_weights
    return root


class _References(HTMLParser):
    """Every URL an HTML page refers to, and its tags."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.urls += [value for name, value in attrs if name in ("src", "href", "srcset", "poster", "data")]


def references(page: Path) -> _References:
    parser = _References()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser


@needs_data
@pytest.mark.slow
class TestReportOfARealEvaluation:
    def test_every_image_the_page_references_exists(self, evaluated):
        page = evaluated / "page" / "index.html"
        refs = references(page)
        assert "script" not in refs.tags and "link" not in refs.tags  # inline CSS, nothing to run or load
        assert "http:" not in page.read_text() and "https:" not in page.read_text()
        pngs = [u for u in refs.urls if u.endswith(".png")]
        assert len(pngs) == len(refs.urls) >= 8  # map, PR, classes, errors, reliability, votes, side-by-sides
        for url in refs.urls:
            path = (page.parent / url).resolve()
            assert page.parent.resolve() in path.parents, url  # inside the page's folder
            assert path.read_bytes()[:8] == PNG_SIGNATURE, url
        assert any(u.startswith("examples/helped_") for u in pngs) and any(u.startswith("examples/hurt_") for u in pngs)

    def test_numbers_are_the_tables(self, evaluated):
        table = json.loads((evaluated / "results.json").read_text())
        report = json.loads((evaluated / "page" / "page.json").read_text())
        assert report["metrics"] == table
        assert report["methods"][:3] == [m for m in table if m.startswith("single:")]
        for method, metrics in table.items():
            assert report["errors"][method]["ap"] == metrics["map50"]  # bit-identical: the same matching
            for iou, key in (("0.5", "map50"), ("0.75", "map75")):
                assert np.mean(report["curves"][method]["precision"][iou]) == pytest.approx(metrics[key], abs=1e-12)
        best = max(table, key=lambda m: table[m]["map"])
        html = (evaluated / "page" / "index.html").read_text()
        assert f'<td class="best">{table[best]["map"]:.4f}</td>' in html
        for metrics in table.values():
            assert f"{metrics['map']:.4f}" in html

    def test_page_states_dataset_folds_and_command(self, evaluated):
        html = (evaluated / "page" / "index.html").read_text()
        assert f"{NUM_IMAGES} images with ground truth scored" in html
        assert "2 held-out folds of 10, 10 images, seed 0" in html
        assert f"detens evaluate --gt data/instances.json --predictions predictions --methods {METHODS}" in html

    def test_detens_report_rebuilds_the_page_from_the_saved_evaluation(self, evaluated, monkeypatch, capsys):
        from detens.cli import main

        monkeypatch.chdir(evaluated)
        assert main(["report", "results.json", "--out", "rebuilt", "--examples", "1", "--quiet"]) == 0
        first = json.loads((evaluated / "page" / "page.json").read_text())
        again = json.loads((evaluated / "rebuilt" / "page.json").read_text())
        for key in ("metrics", "curves", "errors", "class_deltas", "support", "best_single", "best_fused"):
            assert again[key] == first[key], key
        assert len(again["examples"]["helped"]) <= 1 and again["examples"]["helped"][0] == first["examples"]["helped"][0]
        assert "detens report results.json --out rebuilt --examples 1" in (evaluated / "rebuilt" / "index.html").read_text()

    def test_a_record_whose_predictions_do_not_give_its_table_is_refused(self, evaluated, tmp_path, capsys):
        from detens.cli import main

        record = EvaluationRecord.load(evaluated / "results.json")
        record.results["wbf"] = record.results["wbf"][::2]  # half the boxes: another mAP
        record.save(tmp_path / "tampered.evaluation.json.gz")
        assert main(["report", str(tmp_path / "tampered.evaluation.json.gz"), "--out", str(tmp_path / "p")]) == 2
        err = capsys.readouterr().err
        assert "error: wbf: the record's predictions give map" in err and "Traceback" not in err

    def test_without_images_the_page_says_so(self, evaluated, tmp_path):
        from detens.report.page import write_report

        record = EvaluationRecord.load(evaluated / "results.json")
        record.meta["images"] = str(tmp_path / "moved_away")
        index = write_report(record, tmp_path / "page", examples=2)
        assert f"No side-by-sides: the image folder {tmp_path / 'moved_away'} was not found; pass --images." in (
            index.read_text())
        assert not (tmp_path / "page" / "examples").exists()
        # the evaluation found no images beside --gt, and none are given: there is no folder to name
        record.meta["images"] = None
        html = write_report(record, tmp_path / "page", examples=2).read_text()
        assert "No side-by-sides: the evaluation record names no image folder; pass --images." in html
        assert "(None)" not in html

    def test_page_names_the_images_left_out(self, evaluated, tmp_path):
        from detens.report.page import write_report

        record = EvaluationRecord.load(evaluated / "results.json")
        assert record.meta["left_out"] == []  # every image was read
        assert record.meta["software"]["pycocotools"] == importlib.metadata.version("pycocotools")
        assert "the cache could not read" not in (evaluated / "page" / "index.html").read_text()
        record.meta["left_out"] = [{"image_id": 7, "file_name": "broken.jpg", "unreadable_by": {"yolov8n": "corrupt"}}]
        html = write_report(record, tmp_path / "page", examples=0).read_text()
        assert ("<dt>left out of the dataset</dt><dd>1 image the cache could not read, neither scored nor fitted on: "
                "broken.jpg</dd>") in html
        assert "left out of the fitting data" not in html

    def test_page_names_the_images_left_out_of_the_fitting_data(self, evaluated, tmp_path):
        from detens.report.page import write_report

        record = EvaluationRecord.load(evaluated / "results.json")
        assert record.meta["fit_on"] is None  # cross-validated on the scored images alone
        unreadable = {"unreadable_by": {"yolov8n": "corrupt"}}
        record.meta["fit_on"] = {
            "gt": "/data/extra/instances.json", "predictions": "/data/extra/predictions", "images": 40,
            "mode": "joined to every fold's fitting side",
            "left_out": [{"image_id": 3, "file_name": "torn.jpg", **unreadable},
                         {"image_id": 4, "file_name": "empty.jpg", **unreadable}],
        }
        html = write_report(record, tmp_path / "page", examples=0).read_text()
        assert ("<dt>left out of the fitting data</dt><dd>2 images the cache could not read, not fitted on: "
                "torn.jpg, empty.jpg</dd>") in html
        assert html.index("<dt>fitting data</dt>") < html.index("<dt>left out of the fitting data</dt>")
        assert "left out of the dataset" not in html  # every scored image was read

    def test_headless_chromium_loads_the_page_without_errors(self, evaluated):
        browser = chromium()
        if browser is None:
            pytest.skip("needs Chromium for the headless-browser check (Debian: apt-get install chromium)")
        page = (evaluated / "page" / "index.html").resolve()
        errors, requests, png = load_in_chromium(browser, page)
        assert errors == []
        assert requests and all(u.startswith(f"file://{page.parent}/") for u in requests), requests
        assert sum(u.endswith(".png") for u in requests) >= 8
        import cv2

        shot = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)
        assert shot is not None and shot.shape[1] == 1280
        not_white = (shot < 235).any(axis=2).mean()
        assert 0.02 < not_white and shot.std() > 20  # text, a table and figures, not an empty page


# ------------------------------------------------------------------------- Chromium over DevTools, stdlib only
def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def load_in_chromium(browser: str, page: Path, width: int = 1280, height: int = 1800, timeout: float = 60.0):
    """Open ``page`` in headless Chromium driven through the DevTools protocol over a pipe (fds 3 and 4,
    ``--remote-debugging-pipe``), so no debugging port and no client library are needed.

    Returns:
        (errors, requests, png): console errors, uncaught exceptions and error log entries (failed loads
        included); the URL of every request the page made; a PNG screenshot of the first screen.
    """
    to_chrome_r, to_chrome_w = os.pipe()
    from_chrome_r, from_chrome_w = os.pipe()
    # above 100, so that moving them to 3 and 4 in the child cannot clobber one with the other
    child_in = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 100)
    child_out = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 100)

    def plumb():
        os.dup2(child_in, 3)
        os.dup2(child_out, 4)

    profile = page.parent.parent / ".chromium-profile"
    process = subprocess.Popen(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--remote-debugging-pipe",
         "--no-first-run",
         "--no-default-browser-check", f"--user-data-dir={profile}", "about:blank"],
        pass_fds=(3, 4), preexec_fn=plumb, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    for fd in (to_chrome_r, from_chrome_w, child_in, child_out):
        os.close(fd)
    buffer = b""
    events: list[dict] = []
    next_id = 0
    deadline = time.monotonic() + timeout

    def receive() -> dict:
        nonlocal buffer
        while b"\0" not in buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([from_chrome_r], [], [], max(0.0, left))
            if not ready:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(from_chrome_r, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            buffer += chunk
        message, buffer = buffer.split(b"\0", 1)
        return json.loads(message)

    def call(method: str, params: dict | None = None, session: str | None = None) -> dict:
        nonlocal next_id
        next_id += 1
        message = {"id": next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(to_chrome_w, json.dumps(message).encode() + b"\0")
        while True:
            answer = receive()
            if answer.get("id") == next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]
            events.append(answer)

    try:
        target = call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            call(f"{domain}.enable", session=session)
        call("Emulation.setDeviceMetricsOverride",
             {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session)
        call("Page.navigate", {"url": page.as_uri()}, session)
        while not any(e.get("method") == "Page.loadEventFired" for e in events):
            events.append(receive())
        png = base64.b64decode(call("Page.captureScreenshot", {"format": "png"}, session)["data"])
        try:
            call("Browser.close")
        except RuntimeError:
            pass
    finally:
        os.close(to_chrome_w)
        os.close(from_chrome_r)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    errors = []
    requests = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append(params)
        elif method == "Runtime.exceptionThrown":
            errors.append(params)
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            errors.append(params["entry"])
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if url != page.as_uri():
                requests.append(url)
    return errors, requests, png
