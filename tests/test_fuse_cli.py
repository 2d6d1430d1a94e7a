"""tools/fuse.py end to end on a folder with a corrupt file, an empty file and names with spaces."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import cv2
import pytest
import yaml

from detens.coco import validate_coco_results

ultralytics = pytest.importorskip("ultralytics")
from ultralytics.utils import ASSETS  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


from detens.cli import fuse as fuse_cli  # noqa: E402
from detens.jobs import fuse as fuse_tool  # noqa: E402
from detens.jobs._interrupts import RESUME_ADVICE  # noqa: E402


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuse")
    images = root / "images"
    (images / "sub").mkdir(parents=True)
    shutil.copy(Path(ASSETS) / "bus.jpg", images / "bus.jpg")
    shutil.copy(Path(ASSETS) / "zidane.jpg", images / "zidane copy.jpg")
    bus = cv2.imread(str(Path(ASSETS) / "bus.jpg"))
    cv2.imwrite(str(images / "sub" / "bus small.png"), cv2.resize(bus, (405, 540)))
    (images / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not really a jpeg" * 10)
    (images / "empty.jpg").write_bytes(b"")
    (images / "notes.txt").write_text("not an image, not listed")
    config = yaml.safe_load((REPO / "detens" / "configs" / "ensembles" / "coco_yolo3.yaml").read_text())
    config["name"] = "test_pair"
    config["conf"] = 0.05
    config["models"] = [m for m in config["models"] if m["name"] in ("yolov8n", "yolo26n")]
    config["fusion"] = {"method": "wbf", "params": {"iou_thr": 0.55}, "head": None}
    (root / "pair.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root


def run(workspace, out, *extra):
    return fuse_cli.main(
        [
            "--config",
            str(workspace / "pair.yaml"),
            "--source",
            str(workspace / "images"),
            "--out",
            str(out),
            "--quiet",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def full_run(workspace):
    out = workspace / "out full"
    assert run(workspace, out, "--save-per-model") == 0
    return out


EXPECTED = ["bus.jpg", "sub/bus small.png", "zidane copy.jpg"]
IDS = [1, 4, 5]  # their places among the listed images: bus.jpg, corrupt.jpg, empty.jpg, sub/..., zidane ...


def read_outputs(out):
    """(images.json, predictions.json) of a run."""
    return json.loads((out / "images.json").read_text()), json.loads((out / "predictions.json").read_text())


def test_predictions_json(full_run):
    images, predictions = read_outputs(full_run)
    assert [im["file_name"] for im in images["images"]] == EXPECTED
    # the source's order, given before any image is read: the unreadable corrupt.jpg and empty.jpg keep 2 and 3
    assert [im["id"] for im in images["images"]] == IDS
    assert [(im["height"], im["width"]) for im in images["images"]] == [
        (1080, 810),
        (540, 405),
        (720, 1280),
    ]
    assert images["info"]["complete"] is True and images["info"]["models"] == ["yolov8n", "yolo26n"]
    assert images["annotations"] == [] and not (full_run / "partial").exists()  # complete: partial/ removed
    results = validate_coco_results(predictions)
    assert {r["image_id"] for r in results} == set(IDS)
    for image_id in IDS[:2]:  # both copies of bus.jpg: the bus is found
        assert max(r["score"] for r in results if r["image_id"] == image_id and r["category_id"] == 6) > 0.5
    people = [r for r in results if r["image_id"] == IDS[2] and r["category_id"] == 1 and r["score"] > 0.5]
    assert len(people) >= 2
    assert len(images["categories"]) == 80


def test_outputs_open_with_pycocotools(full_run):
    from pycocotools.coco import COCO

    coco = COCO(str(full_run / "images.json"))
    fused = coco.loadRes(str(full_run / "predictions.json"))
    assert sorted(fused.getImgIds()) == IDS
    assert len(fused.getAnnIds()) == len(json.loads((full_run / "predictions.json").read_text())) > 0


def test_unreadable_files_are_reported_and_skipped(full_run):
    summary = json.loads((full_run / "summary.json").read_text())
    assert sorted(summary["unreadable"]) == ["corrupt.jpg", "empty.jpg"]
    assert (
        "could not decode" in summary["unreadable"]["corrupt.jpg"]
        and "empty" in summary["unreadable"]["empty.jpg"]
    )
    assert summary["images"] == 5 and summary["done"] == 3 and summary["processed_this_run"] == 3
    assert set(summary["ms_per_image"]) == {"read", "detect:yolov8n", "detect:yolo26n", "fuse", "outputs"}
    assert summary["fuse_first_call_ms"] > 0 and summary["method"] == "wbf" and summary["complete"] is True
    assert summary["models"] == ["yolov8n", "yolo26n"] and summary["weights"]["yolov8n"].endswith(
        "yolov8n_int8.tflite"
    )


def test_a_run_without_a_readable_image_lists_only_the_outputs_it_wrote(workspace, tmp_path, capsys):
    source, out = tmp_path / "src", tmp_path / "o"
    source.mkdir()
    for name in ("corrupt.jpg", "empty.jpg"):
        shutil.copy(workspace / "images" / name, source / name)
    assert fuse_cli.main(["--config", str(workspace / "pair.yaml"), "--source", str(source), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert f"results in {out}/: predictions.json, images.json, summary.json, config.yaml" in lines, lines
    assert captured.err.count("error:") == 1 and "could be read (2 unreadable" in captured.err, captured.err
    assert not (out / "labels").exists() and not (out / "vis").exists()
    shutil.copy(workspace / "images" / "bus.jpg", source / "bus.jpg")
    assert fuse_cli.main(["--config", str(workspace / "pair.yaml"), "--source", str(source), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"results in {out}/: predictions.json, images.json, labels/, vis/, summary.json, config.yaml" in lines, lines


def test_labels_and_vis(full_run):
    images, predictions = read_outputs(full_run)
    for image in images["images"]:
        stem = image["output_stem"]
        assert stem == image["file_name"].rsplit(".", 1)[0]  # no two images share a stem here
        lines = (full_run / "labels" / f"{stem}.txt").read_text().splitlines()
        expected = [r for r in predictions if r["image_id"] == image["id"] and r["score"] >= 0.25]
        assert len(lines) == len(expected) > 0
        for line in lines:
            fields = line.split()
            assert len(fields) == 6 and 0 <= int(fields[0]) < 80
            assert all(0.0 <= float(v) <= 1.0 for v in fields[1:])
        drawn = cv2.imread(str(full_run / "vis" / f"{stem}.jpg"))
        assert drawn.shape[:2] == (image["height"], image["width"])
    bus_lines = (full_run / "labels" / "bus.txt").read_text().splitlines()
    assert any(line.startswith("5 ") for line in bus_lines)  # YOLO class 5 = bus


def test_per_model_and_resolved_config(full_run):
    for name in ("yolov8n", "yolo26n"):
        results = validate_coco_results(json.loads((full_run / "per_model" / f"{name}.json").read_text()))
        assert {r["image_id"] for r in results} == set(IDS)
    resolved = yaml.safe_load((full_run / "config.yaml").read_text())
    assert resolved["output"]["save_per_model"] is True and resolved["fusion"]["method"] == "wbf"


def interrupt_on_image(monkeypatch, number, press_ctrl_c=None):
    """Make ``detens fuse`` stop as at Ctrl-C (``press_ctrl_c()``, default a KeyboardInterrupt) when it comes
    to its ``number``-th image (from 1); returns the undo, which puts the real ``process_image`` back."""
    original = fuse_tool.process_image
    calls = []

    def interrupting(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == number:
            if press_ctrl_c is not None:
                press_ctrl_c()
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(fuse_tool, "process_image", interrupting)
    return lambda: monkeypatch.setattr(fuse_tool, "process_image", original)


def images_fused(monkeypatch, after=None) -> list[str]:
    """The names of the images ``detens fuse`` fuses from now on, in order (the list returned grows as it
    runs); ``after(name)``, when given, runs once each image's record is made, as another shell or a hand
    acting on the folder while the run goes on."""
    names: list[str] = []
    original = fuse_tool.process_image

    def processing(*args, **kwargs):
        names.append(args[1])
        record = original(*args, **kwargs)
        if after is not None:
            after(args[1])
        return record

    monkeypatch.setattr(fuse_tool, "process_image", processing)
    return names


def summary_of_a_rerun(workspace, source, out, monkeypatch) -> dict:
    """The summary of the same command run again on ``out`` with the real ``detens fuse``, which ends well."""
    monkeypatch.undo()
    assert fuse_into(workspace, source, out) == 0
    return json.loads((out / "summary.json").read_text())


def test_resume_after_interruption(workspace, full_run, monkeypatch, capsys, press_ctrl_c):
    out = workspace / f"out interrupted {press_ctrl_c.__name__}"
    undo = interrupt_on_image(monkeypatch, 2, press_ctrl_c)
    capsys.readouterr()
    assert run(workspace, out, "--save-per-model") == 130
    assert capsys.readouterr().err.endswith("error: interrupted\n")  # after saying what was kept
    partial_images, partial_results = read_outputs(out)  # valid, and says it is incomplete
    assert partial_images["info"]["complete"] is False
    assert [im["file_name"] for im in partial_images["images"]] == ["bus.jpg"]
    assert {r["image_id"] for r in partial_results} == {1}
    assert json.loads((out / "summary.json").read_text())["interrupted"] is True
    assert (out / "partial").is_dir()

    undo()
    assert run(workspace, out, "--save-per-model") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["processed_this_run"] == 2 and summary["resumed"] == 1 and summary["done"] == 3
    resumed_images, resumed = read_outputs(out)
    complete_images, complete = read_outputs(full_run)
    assert resumed_images["images"] == complete_images["images"] and resumed_images["info"]["complete"] is True
    assert sorted(map(json.dumps, resumed)) == sorted(map(json.dumps, complete))
    assert not (out / "partial").exists()

    # a complete run again: nothing left to do, no model is loaded, the outputs are rewritten identically
    per_model = (out / "per_model" / "yolo26n.json").read_text()
    monkeypatch.setattr(fuse_tool, "build_ensemble", lambda config: pytest.fail("models loaded for nothing"))
    assert run(workspace, out, "--save-per-model") == 0
    assert read_outputs(out) == (resumed_images, resumed)
    assert (out / "per_model" / "yolo26n.json").read_text() == per_model and not (out / "partial").exists()


def test_an_interrupted_run_says_its_results_are_partial(workspace, tmp_path, monkeypatch, capsys):
    source, out = one_image_source(workspace, tmp_path / "src", "x.jpg", "y.jpg", "z.jpg"), tmp_path / "o"
    interrupt_on_image(monkeypatch, 2)
    capsys.readouterr()
    assert fuse_loudly(workspace, source, out, "--no-vis") == 130
    captured = capsys.readouterr()
    assert ("WARNING detens.fuse: interrupted: the finished images are saved; run the same command again to "
            "resume\n") in captured.err and captured.err.endswith("error: interrupted\n"), captured.err
    lines = captured.out.splitlines()
    assert [line for line in lines if " in " in line and line.endswith("summary.json, config.yaml")] == [
        f"partial results (1 of 3 images) in {out}/: predictions.json, images.json, labels/, summary.json, config.yaml"
    ], lines
    assert lines[-1] == "interrupted: run the same command again to finish"


def test_an_interrupted_overwrite_run_says_to_resume_without_overwrite(workspace, tmp_path, monkeypatch, capsys,
                                                                       caplog):
    """The same run with ``--overwrite`` would discard the images it finished: the advice to resume leaves the
    flag out, in the caller's words, and the run without it resumes."""
    import detens

    source = one_image_source(workspace, tmp_path / "src", "x.jpg", "y.jpg", "z.jpg")
    out, called_out = tmp_path / "o", tmp_path / "called"
    undo = interrupt_on_image(monkeypatch, 2)
    capsys.readouterr()
    assert fuse_loudly(workspace, source, out, "--no-vis", "--overwrite") == 130
    captured = capsys.readouterr()
    assert ("interrupted: the finished images are saved; run the same command again without --overwrite to "
            "resume\n") in captured.err, captured.err
    assert captured.out.splitlines()[-1] == "interrupted: run the same command again without --overwrite to finish"
    undo()
    assert fuse_into(workspace, source, out, "--no-vis") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["done"], summary["resumed"], summary["processed_this_run"]) == (3, 1, 2)

    undo = interrupt_on_image(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        detens.fuse_images(workspace / "pair.yaml", source, called_out, no_vis=True, overwrite=True)
    assert ("interrupted: the finished images are saved; make the same call again without overwrite=True to "
            "resume") in caplog.text
    assert capsys.readouterr().out.splitlines()[-1] == (
        "interrupted: make the same call again without overwrite=True to finish"
    )
    undo()
    assert detens.fuse_images(workspace / "pair.yaml", source, called_out, no_vis=True) == 0
    assert json.loads((called_out / "summary.json").read_text())["resumed"] == 1


def test_a_python_call_raises_the_interrupt_once_the_finished_images_are_saved(workspace, tmp_path, monkeypatch,
                                                                              capsys, caplog, press_ctrl_c):
    """``detens.fuse_images`` stops its caller on a Ctrl-C (a script's loop over calls too), after saving what
    the command saves before it ends with status 130; the same call made again resumes."""
    import detens

    source = one_image_source(workspace, tmp_path / "src", "x.jpg", "y.jpg", "z.jpg")
    undo = interrupt_on_image(monkeypatch, 2, press_ctrl_c)
    capsys.readouterr()
    called = []
    with pytest.raises(KeyboardInterrupt):
        for out in (tmp_path / "first", tmp_path / "second"):
            called.append(out)
            detens.fuse_images(workspace / "pair.yaml", source, out, no_vis=True)
    assert called == [tmp_path / "first"]
    out = tmp_path / "first"
    images, results = read_outputs(out)
    assert [im["file_name"] for im in images["images"]] == ["x.jpg"] and images["info"]["complete"] is False
    assert {r["image_id"] for r in results} == {1}
    assert json.loads((out / "summary.json").read_text())["interrupted"] is True
    # in the caller's words: a Python call has no command to run again
    assert "interrupted: the finished images are saved; make the same call again to resume" in caplog.text
    assert capsys.readouterr().out.splitlines()[-1] == "interrupted: make the same call again to finish"
    # marked, for a caller whose runs cannot resume (detens bench) to leave out
    assert [r.getMessage() for r in caplog.records if getattr(r, RESUME_ADVICE, False)] == [
        "interrupted: the finished images are saved; make the same call again to resume"]

    undo()
    assert detens.fuse_images(workspace / "pair.yaml", source, out, no_vis=True) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["done"], summary["resumed"], summary["processed_this_run"]) == (3, 1, 2)
    assert summary["complete"] and not (out / "partial").exists()


def test_an_interrupt_before_the_first_result_raises_in_python_and_leaves_the_folder(workspace, tmp_path,
                                                                                   monkeypatch, press_ctrl_c):
    import detens

    source, out = one_image_source(workspace, tmp_path / "src"), tmp_path / "o"
    interrupt_on_image(monkeypatch, 1, press_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        detens.fuse_images(workspace / "pair.yaml", source, out, quiet=True)
    assert not out.exists()


def test_a_resume_on_a_narrower_source_warns_of_the_unfinished_images_it_leaves_out(workspace, tmp_path, monkeypatch,
                                                                                    capfd):
    source, out = one_image_source(workspace, tmp_path / "src", "a.jpg", "b.jpg", "c.jpg", "d.jpg"), tmp_path / "o"
    undo = interrupt_on_image(monkeypatch, 2)
    assert fuse_into(workspace, source, out, "--no-vis") == 130  # a.jpg done
    undo()
    capfd.readouterr()
    assert fuse_into(workspace, str(source / "[ab].jpg"), out, "--no-vis") == 0
    err = capfd.readouterr().err  # --quiet: sys.stderr is a copy of fd 2
    assert (f"{out}: 2 images that the interrupted run had yet to fuse are not in this --source and are left out: "
            "c.jpg, d.jpg; run with that run's --source to fuse them") in err, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["done"] == 2 and summary["processed_this_run"] == 1


def test_a_python_resume_on_a_narrower_source_names_the_keyword_option(workspace, tmp_path, monkeypatch, caplog):
    import detens

    source, out = one_image_source(workspace, tmp_path / "src", "a.jpg", "b.jpg", "c.jpg"), tmp_path / "o"
    undo = interrupt_on_image(monkeypatch, 2)
    assert fuse_into(workspace, source, out, "--no-vis") == 130  # a.jpg done
    undo()
    assert detens.fuse_images(workspace / "pair.yaml", str(source / "[ab].jpg"), out, no_vis=True, quiet=True) == 0
    assert (f"{out}: 1 image that the interrupted run had yet to fuse is not in this source and is left out: "
            "c.jpg; run with that run's source to fuse them") in caplog.text, caplog.text


def test_complete_run_grows_with_new_images(workspace, tmp_path, monkeypatch):
    source = tmp_path / "grow"
    source.mkdir()
    shutil.copy(workspace / "images" / "bus.jpg", source / "bus.jpg")
    args = ["--config", str(workspace / "pair.yaml"), "--out", str(tmp_path / "o"), "--quiet", "--no-vis"]
    assert fuse_cli.main([*args, "--source", str(source)]) == 0
    first_images, first = read_outputs(tmp_path / "o")
    shutil.copy(workspace / "images" / "zidane copy.jpg", source / "zidane.jpg")
    calls = images_fused(monkeypatch)
    assert fuse_cli.main([*args, "--source", str(source)]) == 0
    images, results = read_outputs(tmp_path / "o")
    assert calls == ["zidane.jpg"]  # bus.jpg came from the complete run's outputs
    assert [im["file_name"] for im in images["images"]] == ["bus.jpg", "zidane.jpg"]
    assert [r for r in results if r["image_id"] == 1] == first


@pytest.mark.parametrize("order", ["as written", "shuffled"])
def test_a_complete_run_unpacks_each_images_results_as_a_grouping_of_the_whole_list_does(tmp_path, order):
    """The results are read an image at a time from the file's text; against the slow obvious reading (the
    whole list loaded, grouped by image), for results in the order runs write them and in any other."""
    import random

    rng = random.Random(0)
    out = tmp_path / "o"
    out.mkdir()
    images = [{"id": i, "file_name": f"{i}.jpg", "height": 8, "width": 9, "output_stem": str(i)} for i in (3, 1, 7, 4)]
    (out / "images.json").write_text(json.dumps({"images": images, "categories": [], "annotations": []}))
    files = {"predictions.json": None, "per_model/a.json": None, "per_model/b.json": None}
    for name in files:
        results = [{"image_id": i, "bbox": [rng.random(), 1, 2, 3], "score": rng.random(), "category_id": 1}
                   for i in (1, 1, 3, 7, 7, 7) if rng.random() < 0.8]
        if order == "shuffled":
            rng.shuffle(results)
        files[name] = results
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text(json.dumps(results, indent=rng.choice([None, 2])))
    assert fuse_tool.unpack_finished_run(out) == 4

    def grouped(results, image_id):
        return [{k: v for k, v in r.items() if k != "image_id"} for r in results if r["image_id"] == image_id]

    for image in images:
        record = fuse_tool.read_partial(out, image["file_name"])
        assert record["fused"] == grouped(files["predictions.json"], image["id"])
        assert record["per_model"] == {"a": grouped(files["per_model/a.json"], image["id"]),
                                       "b": grouped(files["per_model/b.json"], image["id"])}


_IMAGE = {"id": 1, "file_name": "a.jpg", "height": 8, "width": 9}
_RESULT = {"image_id": 1, "bbox": [0, 1, 2, 3], "score": 0.5, "category_id": 1}


@pytest.mark.parametrize("file_name, content, problem", [
    ("predictions.json", "[{", r"predictions\.json cannot be read as a JSON list \(Expecting"),
    ("predictions.json", None, r"predictions\.json is missing"),
    ("predictions.json", "7", r"predictions\.json cannot be read as a JSON list \(expected a JSON list"),
    ("predictions.json", json.dumps([_RESULT, {k: v for k, v in _RESULT.items() if k != "image_id"}]),
     r"predictions\.json: result 1 names no image of images\.json by its image_id: \{'bbox'"),
    ("predictions.json", json.dumps([3]), r"predictions\.json: result 0 names no image of images\.json by its image_id: 3"),
    ("predictions.json", json.dumps([{**_RESULT, "image_id": [1]}]), r"result 0 names no image .*'image_id': \[1\]"),
    ("predictions.json", json.dumps([{**_RESULT, "image_id": 2}]), r"result 0 names no image .*'image_id': 2"),
    ("per_model/a.json", "[{", r"per_model/a\.json cannot be read as a JSON list"),
    ("images.json", "{", r"images\.json is not valid JSON"),
    ("images.json", None, r"image list not found: .*images\.json"),
    ("images.json", '{"images": 3}', r"images\.json is no object with a list of images"),
    ("images.json", json.dumps({"images": [{k: v for k, v in _IMAGE.items() if k != "id"}]}),
     r"images\.json: image 0 lacks 'id'"),
    ("images.json", json.dumps({"images": [{k: v for k, v in _IMAGE.items() if k != "height"}]}),
     r"images\.json: image 0 lacks 'height'"),
    ("images.json", json.dumps({"images": [{**_IMAGE, "id": "1"}]}), r"image 0 must have a whole-number id and a"),
    ("images.json", json.dumps({"images": [{**_IMAGE, "height": 0}]}),
     r"give the image 'a\.jpg' a record that is not as a run writes it \(height must be"),
    ("predictions.json", json.dumps([{**_RESULT, "bbox": [0, 1, 2]}]), r"'a\.jpg' a record .*\(fused\[0\]"),
    ("per_model/a.json", json.dumps([{**_RESULT, "score": 1.5}]), r"'a\.jpg' a record .*\(per_model\['a'\]\[0\]"),
])
def test_a_complete_run_whose_files_cannot_be_unpacked_is_refused_naming_the_file(tmp_path, file_name, content,
                                                                                  problem):
    """Taken as absent, a complete run's damaged images.json, predictions.json or per_model/ file would leave
    its images that --source does not give out of the outputs, for good: refused before a record is written,
    where it was a KeyError or TypeError, or (an unreadable file) unpacked as nothing."""
    out = tmp_path / "o"
    (out / "per_model").mkdir(parents=True)
    (out / "images.json").write_text(json.dumps({"images": [_IMAGE], "categories": [], "annotations": []}))
    for name in ("predictions.json", "per_model/a.json"):
        (out / name).write_text(json.dumps([_RESULT]))
    assert fuse_tool.unpack_finished_run(out) == 1  # as written, the files unpack
    shutil.rmtree(out / "partial")
    if content is None:
        (out / file_name).unlink()
    else:
        (out / file_name).write_text(content)
    with pytest.raises(ValueError, match=rf"^cannot build on the complete run in {re.escape(str(out))}: .*{problem}.*"
                                         "; taken as absent, the outputs this run writes would lose that run's images "
                                         "that --source does not give. Restore the file, or use another --out, or "
                                         "--overwrite"):
        fuse_tool.unpack_finished_run(out)
    assert not (out / "partial").exists() and not (out / fuse_tool.UNPACKING).exists()


def test_a_rerun_on_a_complete_run_whose_results_cannot_be_read_changes_nothing(workspace, tmp_path, capfd):
    source, out = one_image_source(workspace, tmp_path / "src", "a.jpg"), tmp_path / "o"
    assert fuse_into(workspace, source, out, "--no-vis") == 0
    (out / "predictions.json").write_bytes((out / "predictions.json").read_bytes()[:-5])  # cut short
    before = folder_state(out)
    capfd.readouterr()
    assert fuse_into(workspace, one_image_source(workspace, tmp_path / "other", "b.jpg"), out, "--no-vis") == 2
    err = capfd.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err, err
    assert f"error: cannot build on the complete run in {out}: {out / 'predictions.json'} cannot be read" in err
    assert folder_state(out) == before
    assert fuse_into(workspace, source, out, "--no-vis", "--overwrite") == 0


def test_a_rerun_with_nothing_to_do_keeps_the_timings(workspace, tmp_path):
    """A finished run's images come back from its files, which hold no timings: its own are kept."""
    source, out = one_image_source(workspace, tmp_path / "src", "x.jpg"), tmp_path / "o"
    assert fuse_into(workspace, source, out, "--no-vis") == 0
    first = json.loads((out / "summary.json").read_text())
    assert first["ms_per_image"] and first["processed_this_run"] == 1
    assert fuse_into(workspace, source, out, "--no-vis") == 0
    again = json.loads((out / "summary.json").read_text())
    assert again["processed_this_run"] == 0 and again["ms_per_image"] == first["ms_per_image"]


def test_an_interrupted_run_keeps_its_image_ids_on_resume(workspace, tmp_path, monkeypatch):
    # partial/x.jpg.jpg.json sorts before partial/x.jpg.json, while the source lists x.jpg first
    source = tmp_path / "ids"
    source.mkdir()
    for name in ("x.jpg", "x.jpg.jpg", "y.jpg"):
        shutil.copy(workspace / "images" / "bus.jpg", source / name)
    out = tmp_path / "o"
    args = ["--config", str(workspace / "pair.yaml"), "--out", str(out), "--quiet", "--no-vis", "--source", str(source)]
    undo = interrupt_on_image(monkeypatch, 3)
    assert fuse_cli.main(args) == 130
    interrupted_images, interrupted = read_outputs(out)
    assert {im["file_name"]: im["id"] for im in interrupted_images["images"]} == {"x.jpg": 1, "x.jpg.jpg": 2}
    undo()
    assert fuse_cli.main(args) == 0
    images, results = read_outputs(out)
    assert {im["file_name"]: im["id"] for im in images["images"]} == {"x.jpg": 1, "x.jpg.jpg": 2, "y.jpg": 3}
    assert sorted(map(json.dumps, interrupted)) == sorted(json.dumps(r) for r in results if r["image_id"] != 3)


TIMINGS = ("ms_per_image", "fuse_first_call_ms", "wall_s_this_run", "images_per_s_this_run", "processed_this_run",
           "resumed")


def run_outputs(out):
    """What a run wrote, less what differs between an uninterrupted run and an interrupted-and-resumed one
    by design (timings, the counts of this run's images): images.json, predictions.json, summary.json and the
    files of labels/ and vis/."""
    summary = json.loads((out / "summary.json").read_text())
    files = {p.relative_to(out).as_posix(): p.read_bytes() for folder in ("labels", "vis")
             for p in sorted((out / folder).rglob("*")) if p.is_file()}
    return (*read_outputs(out), {k: v for k, v in summary.items() if k not in TIMINGS}, files)


def mixed_source(workspace, folder):
    """x.jpg, then x.jpg.jpg, whose partial record sorts first, an unreadable image listed before both, and y.jpg."""
    one_image_source(workspace, folder, "x.jpg", "x.jpg.jpg", "y.jpg")
    shutil.copy(workspace / "images" / "corrupt.jpg", folder / "a corrupt.jpg")
    return folder


def test_an_interrupted_and_resumed_run_writes_what_an_uninterrupted_one_writes(workspace, tmp_path, monkeypatch):
    source = mixed_source(workspace, tmp_path / "src")
    assert fuse_into(workspace, source, tmp_path / "whole") == 0
    whole = run_outputs(tmp_path / "whole")

    out = tmp_path / "o"
    undo = interrupt_on_image(monkeypatch, 3)
    assert fuse_into(workspace, source, out) == 130
    interrupted_images, _ = read_outputs(out)
    undo()
    assert fuse_into(workspace, source, out) == 0
    assert run_outputs(out) == whole
    # the ids the interrupted run wrote were already the final ones: the source's order, the unreadable
    # image's included
    assert interrupted_images["images"] == whole[0]["images"][:2]
    assert {im["file_name"]: im["id"] for im in whole[0]["images"]} == {"x.jpg": 2, "x.jpg.jpg": 3, "y.jpg": 4}


def test_ids_that_an_interrupted_earlier_version_gave_in_finishing_order_are_renumbered(workspace, tmp_path,
                                                                                         monkeypatch, capsys):
    """An earlier version planned no ids: an interrupted run numbered its finished images in the order they
    finished (Ray's), and a resumed run kept those. Now they are renumbered, saying so, as an uninterrupted
    run numbers them."""
    source = mixed_source(workspace, tmp_path / "src")
    assert fuse_into(workspace, source, tmp_path / "whole", "--no-vis") == 0
    whole = run_outputs(tmp_path / "whole")

    out = tmp_path / "o"
    undo = interrupt_on_image(monkeypatch, 3)
    assert fuse_into(workspace, source, out, "--no-vis") == 130
    undo()
    # what the earlier version left, had x.jpg.jpg finished first: no plan, and the ids in finishing order
    record = json.loads((out / fuse_tool.RUN_RECORD).read_text())
    del record["image_ids"]
    (out / fuse_tool.RUN_RECORD).write_text(json.dumps(record))
    finishing_order = {3: 1, 2: 2}  # x.jpg.jpg, then x.jpg
    images, results = read_outputs(out)
    for image in images["images"]:
        image["id"] = finishing_order[image["id"]]
    (out / "images.json").write_text(json.dumps(images))
    (out / "predictions.json").write_text(json.dumps([{**r, "image_id": finishing_order[r["image_id"]]}
                                                      for r in results]))

    capsys.readouterr()
    assert fuse_loudly(workspace, source, out, "--no-vis") == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "renumbered" in line]
    assert len(warned) == 1 and warned[0].endswith(
        "renumbered 1 image that an unfinished run of an earlier version wrote to images.json, numbered as they "
        "finished and with no id for an unreadable image; the ids follow the source's order now, as in an "
        "uninterrupted run: x.jpg.jpg 1 -> 3"), warned
    assert run_outputs(out) == whole


def test_no_output_file_is_at_the_path_of_a_folder_of_others(workspace, tmp_path, monkeypatch):
    """``x.png`` beside the folder ``x.jpg/``: its drawing is not ``vis/x.jpg``, the folder of ``x.jpg/a.jpg``'s;
    beside ``x.png.json/``: its partial record is not ``partial/x.png.json``, the folder of ``b.jpg``'s."""
    source = tmp_path / "src"
    one_image_source(workspace, source / "x.jpg", "a.jpg")
    one_image_source(workspace, source / "x.png.json", "b.jpg")
    bus = cv2.imread(str(workspace / "images" / "bus.jpg"))
    cv2.imwrite(str(source / "x.png"), cv2.resize(bus, (405, 540)))
    assert fuse_into(workspace, source, tmp_path / "whole") == 0
    whole = run_outputs(tmp_path / "whole")
    images = {im["file_name"]: im for im in whole[0]["images"]}
    assert {name: im["output_stem"] for name, im in images.items()} == {
        "x.jpg/a.jpg": "x.jpg/a", "x.png": "x_png", "x.png.json/b.jpg": "x.png.json/b"}
    assert sorted(whole[3]) == ["labels/x.jpg/a.txt", "labels/x.png.json/b.txt", "labels/x_png.txt",
                                "vis/x.jpg/a.jpg", "vis/x.png.json/b.jpg", "vis/x_png.jpg"]
    assert cv2.imread(str(tmp_path / "whole" / "vis" / "x_png.jpg")).shape[:2] == (540, 405)  # x.png's drawing

    # interrupted with both records in partial/: a resumed run finds each
    out = tmp_path / "o"
    undo = interrupt_on_image(monkeypatch, 3)
    assert fuse_into(workspace, source, out) == 130
    assert sorted(p.relative_to(out / "partial").as_posix() for p in (out / "partial").rglob("*.json")) == [
        "x.jpg/a.jpg.json", "x.png.json"]
    undo()
    calls = images_fused(monkeypatch)
    assert fuse_into(workspace, source, out) == 0
    assert calls == ["x.png.json/b.jpg"] and run_outputs(out) == whole


def test_a_record_of_an_earlier_version_in_a_folder_named_as_a_record_is_found(workspace, tmp_path, monkeypatch):
    """Earlier versions kept every folder's own name in partial/: ``partial/d.json/b.jpg.json``."""
    source = one_image_source(workspace, tmp_path / "src" / "d.json", "b.jpg", "c.jpg").parent
    out = tmp_path / "o"
    undo = interrupt_on_image(monkeypatch, 2)
    assert fuse_into(workspace, source, out, "--no-vis") == 130
    undo()
    (out / "partial" / "d.json_").rename(out / "partial" / "d.json")
    calls = images_fused(monkeypatch)
    assert fuse_into(workspace, source, out, "--no-vis") == 0
    images, _ = read_outputs(out)
    assert calls == ["d.json/c.jpg"]
    assert [im["file_name"] for im in images["images"]] == ["d.json/b.jpg", "d.json/c.jpg"]


def test_new_images_whose_folder_is_an_earlier_images_file_are_refused_before_any_result(workspace, tmp_path,
                                                                                         capsys):
    """``x.png`` of a complete run keeps its stem ``x``, and its drawing ``vis/x.jpg``: the folder ``x.jpg/``
    added since cannot have its drawings there."""
    source, out = one_image_source(workspace, tmp_path / "src", "x.png"), tmp_path / "o"
    assert fuse_into(workspace, source, out) == 0
    before = folder_state(out)
    one_image_source(workspace, source / "x.jpg", "a.jpg")
    capsys.readouterr()
    assert fuse_into(workspace, source, out) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err, err
    assert ("'x.png' has the output stem 'x' from an earlier run, and its file 'x.jpg' is where the outputs of "
            "'x.jpg/a.jpg' need a folder") in err, err
    assert folder_state(out) == before


def test_a_run_that_read_no_image_names_no_members_and_does_not_stop_the_next(workspace, tmp_path, capfd):
    """Members without a name in the config are named once loaded: a run that loads none (no image readable)
    records none, and the next run, which loads them, is no change of members."""
    config = tmp_path / "unnamed.yaml"
    config.write_text(yaml.safe_dump({"name": "unnamed", "fusion": {"method": "wbf"},
                                      "models": [{"weights": "yolo26n_int8_tflite/yolo26n_int8.tflite"}]}))
    source, out = tmp_path / "src", tmp_path / "o"
    source.mkdir()
    shutil.copy(workspace / "images" / "corrupt.jpg", source / "corrupt.jpg")
    args = ["--config", str(config), "--source", str(source), "--out", str(out), "--quiet", "--no-vis"]
    assert fuse_cli.main(args) == 2  # nothing could be read: an error, after the summary that says why
    err = capfd.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err, err
    assert f"no image of --source {source} could be read (1 unreadable, listed in {out / 'summary.json'})" in err
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["models"], summary["weights"], summary["fuse_first_call_ms"]) == ([], {}, None)
    assert summary["done"] == 0 and list(summary["unreadable"]) == ["corrupt.jpg"]
    one_image_source(workspace, source, "bus.jpg")
    assert fuse_cli.main(args) == 0  # one image read is a run that did its work, the unreadable one reported
    summary = json.loads((out / "summary.json").read_text())
    assert summary["models"] == ["yolo26n_int8"] and summary["done"] == 1, summary
    assert list(summary["unreadable"]) == ["corrupt.jpg"]
    assert summary["weights"]["yolo26n_int8"].endswith("yolo26n_int8.tflite")


def test_a_pipe_named_like_an_image_is_reported_as_unreadable_not_left_out(workspace, tmp_path, named_pipe):
    """os.walk lists a pipe among the files; leaving it out would lose it without a word, and reading it
    would wait for a writer."""
    source, out = one_image_source(workspace, tmp_path / "src", "bus.jpg"), tmp_path / "o"
    named_pipe(source / "pipe.jpg")
    assert fuse_into(workspace, source, out, "--no-vis") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["done"] == 1 and summary["unreadable"] == {
        "pipe.jpg": f"cannot read image '{source / 'pipe.jpg'}': it is not a regular file (a pipe)"}


def test_a_run_with_nothing_left_to_do_says_its_timings_are_the_earlier_runs(workspace, tmp_path, capsys):
    source, out = one_image_source(workspace, tmp_path / "src", "a.jpg"), tmp_path / "o"
    assert fuse_into(workspace, source, out, "--no-vis") == 0
    capsys.readouterr()
    assert fuse_cli.main(["--config", str(workspace / "pair.yaml"), "--source", str(source), "--out", str(out),
                          "--no-vis"]) == 0
    printed = capsys.readouterr().out
    assert "(0 this run, 1 resumed, 0 unreadable)" in printed and "\nms per image (earlier runs): read " in printed


def test_changed_config_refuses_to_resume(workspace, full_run, capsys):
    before = read_outputs(full_run)
    assert run(workspace, full_run, "--save-per-model", "--method", "mean") == 2
    err = capsys.readouterr().err
    assert f"error: {full_run} holds results of a different config (fusion.method: 'wbf' -> 'mean'); use another" in err
    assert read_outputs(full_run) == before


def test_method_override_overwrite_glob_and_single_file(workspace):
    out = workspace / "out mean"
    source = str(workspace / "images" / "*.jpg")
    code = fuse_cli.main(
        [
            "--config",
            str(workspace / "pair.yaml"),
            "--source",
            source,
            "--out",
            str(out),
            "--quiet",
            "--method",
            "mean",
            "--no-vis",
        ]
    )
    assert code == 0
    images, _ = read_outputs(out)
    assert [im["file_name"] for im in images["images"]] == ["bus.jpg", "zidane copy.jpg"]
    assert images["info"]["method"] == "mean" and not (out / "vis").exists()
    code = fuse_cli.main(
        [
            "--config",
            str(workspace / "pair.yaml"),
            "--source",
            str(workspace / "images" / "bus.jpg"),
            "--out",
            str(out),
            "--quiet",
            "--overwrite",
            "--method",
            "vote",
        ]
    )
    assert code == 0
    images, _ = read_outputs(out)
    assert [im["file_name"] for im in images["images"]] == ["bus.jpg"] and (
        out / "vis" / "bus.jpg"
    ).is_file()


def test_no_images_and_special_source(workspace, tmp_path):
    (tmp_path / "empty").mkdir()
    assert (
        fuse_cli.main(
            [
                "--config",
                str(workspace / "pair.yaml"),
                "--source",
                str(tmp_path / "empty"),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    images, root = fuse_tool.resolve_source(fuse_tool.ASSETS_SOURCE)
    assert [p.name for p in images] == ["bus.jpg", "zidane.jpg"] and root == Path(ASSETS)


def test_names_that_differ_only_in_case_get_their_own_outputs(workspace, tmp_path):
    # a.jpg and a.JPG both mapped to a_jpg: the second image's labels/ and vis/ files replaced the first's
    images = tmp_path / "images"
    images.mkdir()
    shutil.copy(Path(ASSETS) / "bus.jpg", images / "a.jpg")
    shutil.copy(Path(ASSETS) / "zidane.jpg", images / "a.JPG")
    out = tmp_path / "out"
    argv = ["--config", str(workspace / "pair.yaml"), "--source", str(images), "--out", str(out), "--quiet"]
    assert fuse_cli.main(argv) == 0
    images, _ = read_outputs(out)
    assert {im["file_name"]: im["output_stem"] for im in images["images"]} == {"a.JPG": "a_jpg", "a.jpg": "a_jpg_2"}
    for image in images["images"]:
        drawn = cv2.imread(str(out / "vis" / f"{image['output_stem']}.jpg"))
        assert drawn.shape[:2] == (image["height"], image["width"])  # its own drawing: the sizes differ
        assert (out / "labels" / f"{image['output_stem']}.txt").is_file()


def parse(argv):
    from detens.cli import build_parser

    return fuse_tool.FuseOptions.from_namespace(build_parser(["fuse"]).parse_args(["fuse", *argv]))


def test_shipped_config_head_follows_its_method(tmp_path):
    base = ["--config", "coco_yolo3", "--source", "x", "--out", str(tmp_path)]  # a shipped config, by name
    names = ["yolo26n", "yolov8n", "yolo11n"]  # the head's models, in another order

    config = fuse_tool.resolve_config(parse(base))
    assert config.fusion.method == "deep" and Path(config.fusion.head).is_file()  # relative to the YAML
    params = fuse_tool.fusion_params(config, names)
    assert sorted(params["head"].model_names) == sorted(names) and params["head"].match_iou > 0  # matched by name
    assert fuse_tool.method_label(config, params) == "deep"

    config = fuse_tool.resolve_config(parse(base + ["--method", "wbf"]))
    assert config.fusion.head is None and "head" not in fuse_tool.fusion_params(config, names)

    config = fuse_tool.resolve_config(parse(base + ["--method", "theta"]))  # theta runs the config's head
    assert fuse_tool.method_label(config, fuse_tool.fusion_params(config, names)) == "deep"

    config = fuse_tool.resolve_config(parse(["--config", "coco_yolo3", "--source", "x", "--out", "o",
                                             "--head", "coco_yolo3_theta"]))  # a shipped head, by name
    assert config.fusion.method == "theta" and config.fusion.head.endswith("coco_yolo3_theta.json")
    # the config's own head given as --head is the same run: named by the method that runs it (deep), not by
    # its wrapper's type (calibrated), so that a run started without the flag resumes with it
    same = fuse_tool.resolve_config(parse(base + ["--head", "coco_yolo3_deep"]))
    assert same.fusion.method == "deep" and same == fuse_tool.resolve_config(parse(base))

    with pytest.raises(ValueError, match=r"fixed fuser 'nms': a head runs as its own type; set fusion.method \(or "
                                         r"--method\) to the head's type, or drop the head \(fusion.head: null\)"):
        fuse_tool.fusion_params(fuse_tool.resolve_config(parse(base + ["--method", "nms", "--head", "coco_yolo3_deep"])), names)
    with pytest.raises(ValueError, match=r"the method 'deep' was given a 'theta' head .*; set fusion.method \(or "
                                         r"--method\) to 'theta'$"):
        fuse_tool.fusion_params(fuse_tool.resolve_config(parse(base + ["--method", "deep", "--head", "coco_yolo3_theta"])), names)
    # the shipped deep head calibrates its members' scores (a "calibrated" head): it is named by what runs it
    with pytest.raises(ValueError, match=r"the method 'selection' was given a 'deep' head .*to 'deep'$"):
        fuse_tool.fusion_params(fuse_tool.resolve_config(parse(base + ["--method", "selection", "--head", "coco_yolo3_deep"])), names)
    with pytest.raises(ValueError, match="trained for|other models|models"):
        fuse_tool.fusion_params(config, ["a", "b", "c"])


@pytest.mark.parametrize(
    "flags, yaml_key, yaml_value",
    [
        (["--weights-dir", "."], None, None),  # relative weights that only the flag's folder holds
        (["--vis-conf", "0.5"], "vis_conf", 2.0),  # a YAML value that only the flag replaces
    ],
)
def test_another_method_drops_the_yamls_head_with_the_flags_applied(tmp_path, monkeypatch, flags, yaml_key, yaml_value):
    """Whether the YAML's head belongs to the method run is read from the YAML with the other flags applied,
    as the run's config is: read without them, a YAML that they make whole would be refused."""
    (tmp_path / "cfg").mkdir()
    (tmp_path / "run" / "mine").mkdir(parents=True)
    (tmp_path / "run" / "mine" / "v8.tflite").write_bytes(b"not read here")
    config = {"models": [{"weights": "mine/v8.tflite", "name": "v8"}],
              "fusion": {"method": "deep", "head": "coco_yolo3_deep"}}
    if yaml_key is not None:
        config["models"][0]["weights"] = str(tmp_path / "run" / "mine" / "v8.tflite")
        config["output"] = {yaml_key: yaml_value}
    (tmp_path / "cfg" / "e.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.delenv("DETENS_WEIGHTS", raising=False)
    monkeypatch.chdir(tmp_path / "run")
    base = ["--config", "../cfg/e.yaml", "--source", "x", "--out", str(tmp_path / "o"), *flags]

    assert fuse_tool.resolve_config(parse(base)).fusion.method == "deep"
    config = fuse_tool.resolve_config(parse([*base, "--method", "wbf"]))
    assert (config.fusion.method, config.fusion.head) == ("wbf", None)
    config = fuse_tool.resolve_config(parse([*base, "--method", "theta"]))  # theta runs the YAML's head
    assert config.fusion.method == "theta" and config.fusion.head.endswith("coco_yolo3_deep.json")


def test_a_shipped_head_named_in_a_yaml_runs(tmp_path):
    config = yaml.safe_load((REPO / "detens" / "configs" / "ensembles" / "coco_yolo3.yaml").read_text())
    config["fusion"] = {"method": "deep", "head": "coco_yolo3_deep"}  # "a path, or a shipped name"
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(config))
    config = fuse_tool.resolve_config(parse(["--config", str(tmp_path / "e.yaml"), "--source", "x", "--out", "o"]))
    assert config.fusion.head.endswith("coco_yolo3_deep.json")
    params = fuse_tool.fusion_params(config, ["yolov8n", "yolo11n", "yolo26n"])
    assert fuse_tool.method_label(config, params) == "deep"


def test_fusion_weights_are_given_in_one_place():
    from detens.config import from_dict
    from detens.ensemble_config import EnsembleConfig

    def config(weight, params):
        return from_dict(EnsembleConfig, {
            "models": [{"weights": "a.pt", "name": "a", "weight": weight}, {"weights": "b.pt", "name": "b"}],
            "fusion": {"method": "wbf", "params": params},
        })

    assert fuse_tool.fusion_params(config(2.0, {"iou_thr": 0.6}), ["a", "b"])["weights"] == [2.0, 1.0]
    assert "weights" not in fuse_tool.fusion_params(config(1.0, {"iou_thr": 0.6}), ["a", "b"])
    assert fuse_tool.fusion_params(config(1.0, {"weights": [1.0, 5.0]}), ["a", "b"])["weights"] == [1.0, 5.0]
    with pytest.raises(ValueError, match=r"fusion weights are given twice: fusion.params.weights \[1.0, 5.0\]"):
        fuse_tool.fusion_params(config(2.0, {"weights": [1.0, 5.0]}), ["a", "b"])


@pytest.mark.parametrize("method", ["nms", "soft_nms", "refine", "wbf"])
def test_equal_member_weights_fuse_as_no_weights(method):
    """The NMS-style fusers scale model n's scores by w_n / Σw when given weights (as ensemble_boxes does), so
    a config's equal weights must not reach them: weight 2 on every member fuses as weight 1 does."""
    import torch

    import detens
    from detens.config import from_dict
    from detens.detections import Detections
    from detens.ensemble_config import EnsembleConfig

    def params(weight):
        config = from_dict(EnsembleConfig, {
            "models": [{"weights": "a.pt", "name": "a", "weight": weight}, {"weights": "b.pt", "name": "b", "weight": weight}],
            "fusion": {"method": method},
        })
        return fuse_tool.fusion_params(config, ["a", "b"])

    a = Detections(torch.tensor([[10.0, 10.0, 50.0, 50.0]]), torch.tensor([0.9]), torch.tensor([1]), (100, 100))
    b = Detections(torch.tensor([[12.0, 10.0, 52.0, 50.0]]), torch.tensor([0.6]), torch.tensor([1]), (100, 100))
    fused = [detens.fuse([a, b], method, **params(weight)) for weight in (1.0, 2.0, 0.5)]
    assert "weights" not in params(2.0)
    for other in fused[1:]:
        torch.testing.assert_close(other.scores, fused[0].scores, rtol=0, atol=0)
        torch.testing.assert_close(other.boxes, fused[0].boxes, rtol=0, atol=0)
    assert fused[0].scores.max().item() == pytest.approx(0.9 if method != "wbf" else 0.75, abs=1e-6)
    with pytest.raises(ValueError, match=re.escape("every member's weight is 0 (models[].weight: [0.0, 0.0]): give "
                                                   "at least one a weight above 0")):
        params(0.0)


def test_a_bad_fusion_parameter_is_named_as_one_of_fusion_params():
    from detens.config import from_dict
    from detens.ensemble_config import EnsembleConfig

    def config(params):
        return from_dict(EnsembleConfig, {"models": [{"weights": "a.pt", "name": "a"}], "max_det": 300,
                                          "fusion": {"method": "wbf", "params": params}})

    # the members' own max_det is valid: the message must say which max_det is refused
    with pytest.raises(ValueError, match=re.escape(
            "fusion (method 'wbf', params {'max_det': 0}): max_det must be an integer >= 1, got 0")):
        fuse_tool.fusion_params(config({"max_det": 0}), ["a"])
    with pytest.raises(TypeError, match=re.escape("fusion (method 'wbf', params {'iou_tr': 0.5}): fusion method 'wbf' "
                                                  "takes no parameter ['iou_tr']")):
        fuse_tool.fusion_params(config({"iou_tr": 0.5}), ["a"])
    assert fuse_tool.fusion_params(config({"max_det": 5}), ["a"])["max_det"] == 5
    weighted = from_dict(EnsembleConfig, {"models": [{"weights": "a.pt", "name": "a", "weight": 2.0},
                                                     {"weights": "b.pt", "name": "b"}],
                                          "fusion": {"method": "random_k", "params": {"max_det": 50}}})
    with pytest.raises(TypeError, match=re.escape("fusion (method 'random_k', params {'max_det': 50}, the members' "
                                                  "weights [2.0, 1.0]): fusion method 'random_k' takes no parameter "
                                                  "['weights']")):
        fuse_tool.fusion_params(weighted, ["a", "b"])


def pair_config(workspace, tmp_path, fusion, named=True):
    """The workspace's pair of YOLOs with another ``fusion`` (members unnamed unless ``named``)."""
    config = yaml.safe_load((workspace / "pair.yaml").read_text())
    config["fusion"] = fusion
    if not named:
        for model in config["models"]:
            model.pop("name")
    path = tmp_path / "pair.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.mark.parametrize("engine", [[], ["--engine", "ray"]])
@pytest.mark.parametrize("named", [True, False])
@pytest.mark.parametrize("fusion, fragment", [
    ({"method": "wbf", "params": {"iou_th": 0.5}},
     "fusion method 'wbf' takes no parameter ['iou_th']; its parameters: ['weights', 'iou_thr', "),
    ({"method": "soft_nms", "params": {"bogus": 1}}, "fusion method 'soft_nms' takes no parameter ['bogus']"),
    ({"method": "wbf", "params": {"iou_thr": 5}}, "iou_thr must be in [0, 1), got 5"),
    ({"method": "wbf", "params": {"weights": [1, 2, 3]}}, "weights must hold one number per model (2), got 3"),
    ({"method": "deep", "head": "coco_yolo3_deep.json"}, "was trained for"),
])
def test_fusion_params_are_checked_before_any_detector_loads(workspace, tmp_path, capsys, monkeypatch, engine,
                                                             named, fusion, fragment):
    if fusion.get("head"):
        fusion = {**fusion, "head": str(REPO / "detens" / "configs" / "heads" / fusion["head"])}
    config = pair_config(workspace, tmp_path, fusion, named)
    monkeypatch.setattr(fuse_tool, "build_ensemble", lambda *a, **k: pytest.fail("models loaded for nothing"))
    code = fuse_cli.main(["--config", str(config), "--source", str(workspace / "images"), "--out",
                           str(tmp_path / "o"), "--quiet", *engine])
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1 and fragment in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


def test_fusion_max_det_in_the_config_caps_each_image(workspace, full_run, tmp_path):
    """``fusion.params.max_det`` is detens.fuse's: each image keeps its highest-scoring fused boxes."""
    config = pair_config(workspace, tmp_path, {"method": "wbf", "params": {"iou_thr": 0.55, "max_det": 4}})
    source, out = one_image_source(workspace, tmp_path / "src"), tmp_path / "o"
    assert fuse_cli.main(["--config", str(config), "--source", str(source), "--out", str(out), "--quiet"]) == 0
    _, capped = read_outputs(out)
    _, everything = read_outputs(full_run)
    bus = [r for r in everything if r["image_id"] == 1]  # bus.jpg, fused with the same members and iou_thr
    assert len(bus) > 4 and [r["score"] for r in capped] == sorted((r["score"] for r in bus), reverse=True)[:4]


def one_image_source(workspace, folder, *names):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names or ("bus.jpg",):
        shutil.copy(workspace / "images" / "bus.jpg", folder / name)
    return folder


def fuse_into(workspace, source, out, *extra):
    return fuse_cli.main(["--config", str(workspace / "pair.yaml"), "--source", str(source), "--out", str(out),
                           "--quiet", *extra])


def folder_state(out):
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("extra", [(), ("--overwrite",)], ids=["adding an image", "--overwrite"])
def test_an_earlier_output_that_may_not_be_replaced_is_refused_before_any_model_loads(workspace, tmp_path, monkeypatch,
                                                                                      capsys, immutable, extra):
    """The run would find it only when it sets the file aside (--overwrite) or writes it, once every image is
    fused."""
    source, out = one_image_source(workspace, tmp_path / "src", "x.jpg"), tmp_path / "o"
    assert fuse_into(workspace, source, out, "--no-vis") == 0
    before = folder_state(out)
    one_image_source(workspace, source, "y.jpg")
    immutable(out / "predictions.json")
    loads = []
    monkeypatch.setattr(fuse_tool, "build_ensemble", lambda *args, **kwargs: loads.append(args))
    capsys.readouterr()
    assert fuse_into(workspace, source, out, "--no-vis", *extra) == 2
    assert capsys.readouterr().err == (
        f"error: the output {out / 'predictions.json'} cannot be written: the file there may be neither replaced, "
        "moved nor removed (Operation not permitted: it is marked immutable or append-only, as lsattr shows); lift "
        "that mark, or give another --out\n")
    assert loads == [] and folder_state(out) == before


@pytest.mark.parametrize("failure", [RuntimeError("the detector broke"), KeyboardInterrupt()])
def test_overwrite_that_fails_before_its_first_result_leaves_the_folder_as_it_was(workspace, tmp_path, monkeypatch,
                                                                                  failure):
    source, out = one_image_source(workspace, tmp_path / "src"), tmp_path / "o"
    assert fuse_into(workspace, source, out) == 0
    before = folder_state(out)

    def broken(*args, **kwargs):
        raise failure

    monkeypatch.setattr(fuse_tool, "fuse_image", broken)
    if isinstance(failure, KeyboardInterrupt):
        assert fuse_into(workspace, source, out, "--overwrite", "--method", "mean") == 130
    else:
        with pytest.raises(RuntimeError, match="^the detector broke$"):
            fuse_cli.main(["--config", str(workspace / "pair.yaml"), "--source", str(source), "--out", str(out),
                            "--quiet", "--overwrite", "--method", "mean", "--debug"])
    assert folder_state(out) == before
    # a new folder that fails the same way is not left behind, and the run ends as the first one did;
    # with --overwrite too, which finds nothing to set aside there
    for overwrite in ([], ["--overwrite"]):
        into_new = ["--config", str(workspace / "pair.yaml"), "--source", str(source), "--out",
                    str(tmp_path / "new"), "--quiet", "--debug", *overwrite]
        with pytest.raises(type(failure)):  # --debug: the exception itself, a Ctrl-C's too
            fuse_cli.main(into_new)
        assert not (tmp_path / "new").exists(), overwrite


@pytest.mark.parametrize(
    ("step", "failure"),
    [
        ("fuse_image", RuntimeError("the detector broke")),
        ("fuse_image", KeyboardInterrupt()),
        # right after the complete run is unpacked, and just before the first image is read
        ("finished_records", RuntimeError("the detector broke")),
        ("tqdm", KeyboardInterrupt()),
    ],
)
def test_a_run_adding_images_that_fails_before_its_first_new_result_leaves_the_complete_run_as_it_was(
        workspace, tmp_path, monkeypatch, step, failure):
    """Adding images unpacks the complete run into partial/ records; failing before a new image is fused
    must not leave them (and an unfinished run's record) in a folder whose files still hold every image."""
    source, out = one_image_source(workspace, tmp_path / "src", "x.jpg"), tmp_path / "o"
    assert fuse_into(workspace, source, out, "--no-vis") == 0
    before = folder_state(out)
    one_image_source(workspace, source, "y.jpg")

    def broken(*args, **kwargs):
        raise failure

    monkeypatch.setattr(fuse_tool, step, broken)
    if isinstance(failure, KeyboardInterrupt):
        assert fuse_into(workspace, source, out, "--no-vis") == 130
    else:
        with pytest.raises(RuntimeError, match="^the detector broke$"):
            fuse_into(workspace, source, out, "--no-vis", "--debug")
    assert folder_state(out) == before
    assert sorted(p.name for p in out.iterdir()) == sorted(["config.yaml", "images.json", "labels", "predictions.json",
                                                            "summary.json"])
    monkeypatch.undo()
    assert fuse_into(workspace, source, out, "--no-vis") == 0  # the same command then adds the image
    images, _ = read_outputs(out)
    assert [im["file_name"] for im in images["images"]] == ["x.jpg", "y.jpg"]


def test_a_run_adding_images_to_one_that_read_none_leaves_no_run_record_when_it_fails_first(workspace, tmp_path,
                                                                                           monkeypatch):
    source, out = tmp_path / "src", tmp_path / "o"
    source.mkdir()
    (source / "broken.jpg").write_bytes(b"not an image")
    assert fuse_into(workspace, source, out, "--no-vis") == 2  # complete, with no image read
    before = folder_state(out)
    one_image_source(workspace, source, "x.jpg")

    def broken(*args, **kwargs):
        raise RuntimeError("the detector broke")

    monkeypatch.setattr(fuse_tool, "fuse_image", broken)
    with pytest.raises(RuntimeError, match="^the detector broke$"):
        fuse_into(workspace, source, out, "--no-vis", "--debug")
    assert folder_state(out) == before and not (out / fuse_tool.RUN_RECORD).exists()


_KILLED_ON_IMAGE = """
import os, signal, sys
from detens.cli import fuse as fuse_cli
from detens.jobs import fuse

real, calls = fuse.process_image, []


def process_image(*args, **kwargs):
    calls.append(args[1])
    if len(calls) == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)  # no clean-up of any kind
    return real(*args, **kwargs)


fuse.process_image = process_image
sys.exit(fuse_cli.main(sys.argv[2:]))
"""


def killed_on_image(workspace, number, source, out, *extra):
    """Run ``detens fuse`` in another process, killed (SIGKILL) when it comes to its ``number``-th image."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_ON_IMAGE, str(number), "--config", str(workspace / "pair.yaml"), "--source",
         str(source), "--out", str(out), "--quiet", *extra],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr


def fuse_loudly(workspace, source, out, *extra):
    """:func:`fuse_into` without ``--quiet``: its log lines reach ``sys.stderr``."""
    return fuse_cli.main(["--config", str(workspace / "pair.yaml"), "--source", str(source), "--out", str(out),
                           *extra])


def test_overwrite_killed_before_its_first_result_is_undone_by_the_next_run(workspace, tmp_path, capsys):
    source, out = one_image_source(workspace, tmp_path / "src", "x.jpg", "y.jpg"), tmp_path / "o"
    assert fuse_into(workspace, source, out, "--no-vis") == 0
    before = folder_state(out)
    killed_on_image(workspace, 1, source, out, "--no-vis", "--overwrite", "--method", "mean")
    assert (out / ".replaced").is_dir() and yaml.safe_load((out / "config.yaml").read_text())["fusion"]["method"] == "mean"
    # the next run puts them back before anything else, as the killed run would have had it failed, and
    # says so; this one then fails its own check (the earlier run's config is back: "mean" is another)
    capsys.readouterr()
    assert fuse_loudly(workspace, source, out, "--no-vis", "--method", "mean") == 2
    err = capsys.readouterr().err
    assert "killed before its first result: the earlier outputs it had set aside in .replaced/ are back" in err, err
    assert "different config" in err and folder_state(out) == before

    # killed again; an --overwrite run then sets aside the earlier outputs (not the killed run's) and replaces them
    killed_on_image(workspace, 1, source, out, "--no-vis", "--overwrite", "--method", "mean")
    assert fuse_loudly(workspace, source, out, "--no-vis", "--overwrite", "--method", "mean") == 0
    assert "are back" in capsys.readouterr().err
    images, _ = read_outputs(out)
    assert images["info"]["method"] == "mean" and [im["file_name"] for im in images["images"]] == ["x.jpg", "y.jpg"]
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


def test_overwrite_killed_after_its_first_result_stands(workspace, tmp_path, capsys):
    source, out = one_image_source(workspace, tmp_path / "src", "x.jpg", "y.jpg"), tmp_path / "o"
    assert fuse_into(workspace, source, out, "--no-vis") == 0
    killed_on_image(workspace, 2, source, out, "--no-vis", "--overwrite", "--method", "mean")
    assert (out / ".replaced").is_dir() and (out / "partial" / "x.jpg.json").is_file()
    capsys.readouterr()
    assert fuse_loudly(workspace, source, out, "--no-vis", "--method", "mean") == 0  # resumes the killed run
    assert "removed the earlier outputs in .replaced/" in capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "mean" and summary["resumed"] == 1 and summary["processed_this_run"] == 1
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


def test_a_run_removes_the_temporaries_of_killed_writers_from_its_out(workspace, tmp_path):
    from detens.io import _host_tag

    source, out = one_image_source(workspace, tmp_path / "src", "x.jpg"), tmp_path / "o"
    assert fuse_into(workspace, source, out) == 0
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead = f"labels/.x.txt.abcd_123.{_host_tag()}-{int(gone.stdout)}.tmp"
    live = f"vis/.x.jpg.abcd_123.{_host_tag()}-{os.getpid()}.tmp"
    for name in (dead, live, f".predictions.json.abcd_123.{_host_tag()}-{int(gone.stdout)}.tmp"):
        (out / name).write_text("cut short")
    assert fuse_into(workspace, source, out) == 0  # nothing left to fuse: no detector loads
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.tmp")) == [live]


class Killed(BaseException):
    """The process ends here (``kill -9``): nothing after runs, no ``except`` or ``finally`` of its own."""


def an_interrupted_run(out):
    """The files of an interrupted ``detens fuse`` run (one image finished, ``partial/`` kept)."""
    for name, text in {"config.yaml": "fusion: {method: wbf}\n", "summary.json": "{}", "images.json": "{}",
                       "predictions.json": "[]", fuse_tool.RUN_RECORD: "{}", "partial/x.jpg.json": "{}",
                       "labels/x.txt": "0 0.5 0.5 0.1 0.1 0.9\n", "vis/x.jpg": "jpeg"}.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)


def an_overwrite_killed_before_its_first_result(out):
    """What ``--overwrite`` leaves when killed on its first image: the earlier outputs set aside, its
    config and run record written, the image's labels written but not its record."""
    fuse_tool.set_aside_outputs(out)
    for name, text in {"config.yaml": "fusion: {method: mean}\n", fuse_tool.RUN_RECORD: '{"new": 1}',
                       "labels/y.txt": "1 0.5 0.5 0.1 0.1 0.9\n"}.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)


def cut_short_at(monkeypatch, step):
    """Make the ``step``-th move, removal or write of ``detens fuse``'s folder handling raise :class:`Killed`."""
    count = 0

    def counted(real):
        def operation(*args, **kwargs):
            nonlocal count
            count += 1
            if count == step:
                raise Killed
            return real(*args, **kwargs)

        return operation

    monkeypatch.setattr(fuse_tool, "_remove", counted(fuse_tool._remove))
    monkeypatch.setattr(fuse_tool, "atomic_write_json", counted(fuse_tool.atomic_write_json))
    monkeypatch.setattr(Path, "rename", counted(Path.rename))


@pytest.mark.parametrize("killed_while", ["setting aside", "restoring"])
def test_outputs_set_aside_come_back_whichever_step_was_killed(tmp_path, monkeypatch, killed_while):
    """A run killed while it sets the earlier outputs aside, or while it restores them (itself, or as the
    next run recovering from a killed one), loses none of them: the next run finishes the restore."""
    for step in itertools.count(1):
        out = tmp_path / str(step)
        an_interrupted_run(out)
        before = folder_state(out)
        if killed_while == "restoring":
            an_overwrite_killed_before_its_first_result(out)
        with monkeypatch.context() as patched:
            cut_short_at(patched, step)
            try:
                if killed_while == "setting aside":
                    an_overwrite_killed_before_its_first_result(out)
                else:
                    fuse_tool.recover_replaced(out)
                cut_short = False
            except Killed:
                cut_short = True
        fuse_tool.recover_replaced(out)
        assert folder_state(out) == before, step
        assert sorted(os.listdir(out)) == ["config.yaml", "images.json", "labels", "partial", "predictions.json",
                                           "summary.json", fuse_tool.RUN_RECORD, "vis"], step
        if not cut_short:
            break
    assert step > 3


def test_a_run_killed_before_it_moved_anything_is_not_said_to_have_replaced_the_earlier_outputs(tmp_path, caplog):
    """Killed between writing the list of what it sets aside and moving partial/ (the first), the run left
    the earlier outputs where they were: its finished images are theirs, and none of them is removed."""
    out = tmp_path / "o"
    an_interrupted_run(out)
    before = folder_state(out)
    with pytest.MonkeyPatch.context() as patched:
        cut_short_at(patched, 2)  # the list is written; partial/ does not move
        with pytest.raises(Killed):
            fuse_tool.set_aside_outputs(out)
    assert json.loads((out / ".replaced" / "_set_aside.json").read_text())["moved"][0] == "partial"
    with caplog.at_level("INFO", logger="detens"):
        fuse_tool.recover_replaced(out)
    assert folder_state(out) == before and not (out / ".replaced").exists()
    assert "removed the earlier outputs" not in caplog.text and "are back" in caplog.text, caplog.text


def test_a_replaced_folder_of_an_earlier_version_is_restored_too(tmp_path):
    """Versions before the list of what was set aside moved everything first, then wrote their own."""
    out = tmp_path / "o"
    an_interrupted_run(out)
    before = folder_state(out)
    an_overwrite_killed_before_its_first_result(out)
    (out / ".replaced" / "_set_aside.json").unlink()
    fuse_tool.recover_replaced(out)
    assert folder_state(out) == before and not (out / ".replaced").exists()


@pytest.mark.parametrize("moved", range(1, len(fuse_tool.OUTPUT_NAMES)))
def test_a_replaced_folder_of_an_earlier_version_killed_while_moving_is_restored_too(tmp_path, moved):
    """Such a version killed half-way through moving the earlier outputs (in OUTPUT_NAMES' order) left
    the rest where they were: they stay."""
    out = tmp_path / "o"
    an_interrupted_run(out)
    (out / "per_model").mkdir()
    (out / "per_model" / "a.json").write_text("[]")
    before = folder_state(out)
    (out / ".replaced").mkdir()
    for item in fuse_tool.OUTPUT_NAMES[:moved]:
        (out / item).rename(out / ".replaced" / item)
    fuse_tool.recover_replaced(out)
    assert folder_state(out) == before and not (out / ".replaced").exists()


def test_earlier_outputs_that_could_not_all_be_deleted_do_not_stop_the_next_runs(tmp_path, monkeypatch):
    """A file that cannot be deleted now (held open on a network mount, permissions) is left in
    .replaced.removing; the next --overwrite run's earlier outputs still go, and so does the rest later."""
    out = tmp_path / "o"
    an_interrupted_run(out)
    undeletable = []
    real_rmtree = shutil.rmtree

    def rmtree(path, *args, **kwargs):
        if Path(path).name == fuse_tool.REPLACED_REMOVING and undeletable:
            return  # as ignore_errors leaves it when a file there cannot be deleted
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(fuse_tool.shutil, "rmtree", rmtree)
    undeletable.append(True)
    for method in ("mean", "nms"):  # two --overwrite runs that stand
        fuse_tool.set_aside_outputs(out)
        (out / "partial").mkdir()
        (out / "config.yaml").write_text(f"fusion: {{method: {method}}}\n")
        (out / "partial" / "y.jpg.json").write_text(method)
        fuse_tool.discard_replaced(out)
        assert not (out / ".replaced").exists() and (out / ".replaced.removing").is_dir()
    undeletable.clear()
    fuse_tool.recover_replaced(out)  # the next run, when the files can go
    assert sorted(os.listdir(out)) == ["config.yaml", "partial"]
    assert (out / "partial" / "y.jpg.json").read_text() == "nms"


def test_a_second_run_on_the_same_out_is_refused(workspace, tmp_path, capsys, lock_in_another_process):
    source, out = one_image_source(workspace, tmp_path / "src"), tmp_path / "o"
    holder = lock_in_another_process(out)
    assert fuse_into(workspace, source, out) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and f"pid {holder.pid}" in err and "Traceback" not in err, err
    assert [p.name for p in out.iterdir()] == [".detens.lock"]  # nothing written beside the other run's


def test_a_run_whose_out_is_moved_stops_before_it_writes_there_again(workspace, tmp_path, monkeypatch, capsys):
    """It went on, made --out anew for the images left (with no config.yaml nor run record: a folder no
    rerun takes for a run's) and ended with status 0; the moved folder resumes."""
    source, out, moved = one_image_source(workspace, tmp_path / "src", "x.jpg", "y.jpg", "z.jpg"), tmp_path / "o", \
        tmp_path / "moved"

    def moving_out_after_the_first(name):
        if not moved.exists():
            out.rename(moved)  # as `mv` in another shell

    images_fused(monkeypatch, after=moving_out_after_the_first)
    assert fuse_into(workspace, source, out) == 2
    assert capsys.readouterr().err == (
        f"error: the lock file {out / '.detens.lock'} of this run is gone: {out} was moved or deleted, or the file "
        "removed, while the run wrote there; the run stops rather than write outputs where they would be lost or "
        "mixed with another run's\n")
    assert not out.exists()
    assert [json.loads(p.read_text())["file_name"] for p in (moved / "partial").iterdir()] == ["x.jpg"]
    summary = summary_of_a_rerun(workspace, source, moved, monkeypatch)
    assert (summary["complete"], summary["resumed"], summary["processed_this_run"]) == (True, 1, 2)


def test_a_run_whose_outputs_lack_images_it_fused_ends_with_an_error(workspace, tmp_path, monkeypatch, capsys):
    """Its summary said complete: false, and it ended with status 0. A run whose only missing images are
    unreadable ones, reported and skipped, is complete (test_unreadable_files_are_reported_and_skipped)."""
    source, out = one_image_source(workspace, tmp_path / "src", "x.jpg", "y.jpg"), tmp_path / "o"

    def losing_the_first_record(name):
        if name == "y.jpg":
            (out / "partial" / "x.jpg.json").unlink()  # as a hand cleaning the folder up meanwhile

    images_fused(monkeypatch, after=losing_the_first_record)
    assert fuse_into(workspace, source, out) == 2
    assert capsys.readouterr().err == (
        f"error: {out} lacks the results of 1 of the run's 2 images, whose records went from {out / 'partial'} "
        "while the run wrote there (its summary.json says complete: false); run the same command again to fuse "
        "them\n")
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["complete"], summary["done"], summary["unreadable"]) == (False, 1, {})
    summary = summary_of_a_rerun(workspace, source, out, monkeypatch)
    assert (summary["complete"], summary["done"], summary["processed_this_run"]) == (True, 2, 1)


def test_images_whose_names_are_near_the_limit_on_a_name_are_fused_resumed_and_added_to(workspace, tmp_path,
                                                                                          monkeypatch):
    """A file system takes a name of at most 255 bytes (UTF-8: a CJK character is 3): partial/<name>.json of
    a name of 251 bytes or more, and labels/<stem>.txt of a stem told apart by _jpg, could not be written,
    and the run failed there each time it was run again, never fusing the other images."""
    long = "b" * 250
    names = [f"{long}.jpg", f"{long}.png", "画" * 83 + ".jpg"]  # 254, 254 and 253 bytes
    source = one_image_source(workspace, tmp_path / "src", *names)
    assert fuse_into(workspace, source, tmp_path / "whole") == 0
    whole = run_outputs(tmp_path / "whole")
    stems = {im["file_name"]: im["output_stem"] for im in whole[0]["images"]}
    assert stems[names[2]] == "画" * 83  # its files' names fit: as before
    for name, extension in zip(names[:2], ("jpg", "png"), strict=True):  # b…b_jpg.txt would be 258 bytes
        assert stems[name].startswith(long[:200]) and re.fullmatch(r"b+~[0-9a-f]{12}", stems[name])
        assert stems[name] != stems[names[0] if extension == "png" else names[1]]
    assert sorted(whole[3]) == sorted(f"{folder}/{stem}.{kind}" for stem in stems.values()
                                      for folder, kind in (("labels", "txt"), ("vis", "jpg")))

    out = tmp_path / "o"
    undo = interrupt_on_image(monkeypatch, 3)
    assert fuse_into(workspace, source, out) == 130
    records = {json.loads(p.read_text())["file_name"]: p.name for p in (out / "partial").iterdir()}
    assert len(records) == 2 and all(len(os.fsencode(name)) <= 255 for name in records.values())
    undo()
    assert fuse_into(workspace, source, out) == 0  # resumed: the records are found by the names they hold
    assert json.loads((out / "summary.json").read_text())["resumed"] == 2
    assert run_outputs(out) == whole

    # a complete run given one more image: its images are unpacked into records under the same names
    one_image_source(workspace, source, "short.jpg")
    assert fuse_into(workspace, source, out) == 0
    images, _ = read_outputs(out)
    assert [(im["file_name"], im["id"], im["output_stem"]) for im in images["images"]] == [
        *((im["file_name"], im["id"], im["output_stem"]) for im in whole[0]["images"]), ("short.jpg", 4, "short")]
    assert json.loads((out / "summary.json").read_text())["processed_this_run"] == 1


def test_a_rerun_keeps_earlier_images_with_their_ids_and_files(workspace, tmp_path):
    source, out = one_image_source(workspace, tmp_path / "src", "x.jpg", "y.jpg"), tmp_path / "o"
    assert fuse_into(workspace, source, out, "--no-vis") == 0
    first_images, first = read_outputs(out)
    assert [(im["file_name"], im["id"], im["output_stem"]) for im in first_images["images"]] == [
        ("x.jpg", 1, "x"), ("y.jpg", 2, "y")]
    # one of the images alone: the other keeps its results
    assert fuse_into(workspace, source / "y.jpg", out, "--no-vis") == 0
    assert read_outputs(out) == (first_images, first)
    # a new image whose stem would collide: the earlier ones keep theirs, their files still match
    shutil.copy(workspace / "images" / "bus.jpg", source / "x.png")
    assert fuse_into(workspace, source, out, "--no-vis") == 0
    images, results = read_outputs(out)
    assert [(im["file_name"], im["id"], im["output_stem"]) for im in images["images"]] == [
        ("x.jpg", 1, "x"), ("y.jpg", 2, "y"), ("x.png", 3, "x_png")]
    assert [r for r in results if r["image_id"] in (1, 2)] == first
    assert sorted(p.name for p in (out / "labels").iterdir()) == ["x.txt", "x_png.txt", "y.txt"]


def test_a_run_killed_while_partial_is_unpacked_or_removed_loses_no_image(workspace, tmp_path, monkeypatch):
    source, out = one_image_source(workspace, tmp_path / "src", "x.jpg", "y.jpg"), tmp_path / "o"
    real_rmtree, real_write = shutil.rmtree, fuse_tool.atomic_write_json

    def killed_after_the_first_record(path, *args, **kwargs):
        records = sorted(Path(path).rglob("*.jpg.json")) if Path(path).is_dir() else []
        if not records:
            return real_rmtree(path, *args, **kwargs)
        records[0].unlink()
        raise KeyboardInterrupt  # the process ends here, the other records stay

    monkeypatch.setattr(shutil, "rmtree", killed_after_the_first_record)
    assert fuse_into(workspace, source, out, "--no-vis") == 130
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    assert (out / "images.json").is_file()
    # killed before the run record went: it says what the complete summary.json says, and the next run ends it
    assert (out / fuse_tool.RUN_RECORD).is_file() and json.loads((out / "summary.json").read_text())["complete"]
    complete = read_outputs(out)
    # the other image alone: the one whose record went keeps its results and id
    assert fuse_into(workspace, source / "y.jpg", out, "--no-vis") == 0
    assert read_outputs(out) == complete
    assert not (out / fuse_tool.RUN_RECORD).exists() and not (out / fuse_tool.REMOVING).exists()

    def killed_after_one_unpacked(path, obj, *args, **kwargs):
        if Path(path).name == "y.jpg.json":
            raise KeyboardInterrupt
        return real_write(path, obj, *args, **kwargs)

    monkeypatch.setattr(fuse_tool, "atomic_write_json", killed_after_one_unpacked)
    assert fuse_into(workspace, source / "x.jpg", out, "--no-vis") == 130
    monkeypatch.setattr(fuse_tool, "atomic_write_json", real_write)
    assert fuse_into(workspace, source / "x.jpg", out, "--no-vis") == 0
    assert read_outputs(out) == complete


def test_an_image_named_like_the_run_record_is_kept_and_not_redone(workspace, tmp_path, monkeypatch):
    """A file given directly keeps its name whatever its extension: one named ``_run`` has the partial
    record ``partial/_run.json``, where earlier versions kept the run's own record."""
    source, out = one_image_source(workspace, tmp_path / "src", "_run", "x.jpg", "y.jpg"), tmp_path / "o"
    calls = images_fused(monkeypatch)
    assert fuse_into(workspace, source / "_run", out, "--no-vis") == 0
    assert fuse_into(workspace, source / "_run", out, "--no-vis") == 0
    assert calls == ["_run"]  # the rerun found it finished
    first_images, first = read_outputs(out)
    assert [(im["file_name"], im["id"]) for im in first_images["images"]] == [("_run", 1)] and first

    # the folder (which lists no file without an image extension) is interrupted after x.jpg: the record
    # of _run, unpacked from the complete run, and the run's own record are both there
    undo = interrupt_on_image(monkeypatch, 2)
    assert fuse_into(workspace, source, out, "--no-vis") == 130
    assert json.loads((out / "partial" / "_run.json").read_text())["file_name"] == "_run"
    assert json.loads((out / fuse_tool.RUN_RECORD).read_text())["models"] == ["yolov8n", "yolo26n"]
    undo()
    assert fuse_into(workspace, source, out, "--no-vis") == 0
    assert calls == ["_run", "x.jpg", "y.jpg"]
    images, results = read_outputs(out)
    assert [(im["file_name"], im["id"]) for im in images["images"]] == [("_run", 1), ("x.jpg", 2), ("y.jpg", 3)]
    assert [r for r in results if r["image_id"] == 1] == first
    assert sorted(os.listdir(out)) == ["config.yaml", "images.json", "labels", "predictions.json", "summary.json"]


def test_a_run_killed_before_its_first_result_resumes(workspace, tmp_path):
    """It leaves its config and its run record, and no partial/ yet: a run folder all the same."""
    source, out = one_image_source(workspace, tmp_path / "src", "x.jpg"), tmp_path / "o"
    killed_on_image(workspace, 1, source, out, "--no-vis")
    assert (out / fuse_tool.RUN_RECORD).is_file() and not (out / "partial").exists()
    assert fuse_into(workspace, source, out, "--no-vis") == 0
    images, _ = read_outputs(out)
    assert [im["file_name"] for im in images["images"]] == ["x.jpg"] and not (out / fuse_tool.RUN_RECORD).exists()

def an_earlier_versions_run_record(out):
    """Turn the unfinished run in ``out`` into what earlier versions left: their run record in partial/."""
    (out / fuse_tool.RUN_RECORD).rename(out / "partial" / "_run.json")


def test_an_unfinished_run_of_an_earlier_version_resumes(workspace, tmp_path, capsys):
    from detens import ThetaHead

    head_file = tmp_path / "head.json"
    ThetaHead(["yolov8n", "yolo26n"]).save(head_file)
    source, out = one_image_source(workspace, tmp_path / "src", "x.jpg", "y.jpg"), tmp_path / "o"
    killed_on_image(workspace, 2, source, out, "--head", str(head_file), "--no-vis")  # no summary.json
    an_earlier_versions_run_record(out)
    assert sorted(os.listdir(out / "partial")) == ["_run.json", "x.jpg.json"] and not (out / "summary.json").exists()
    assert fuse_tool.has_finished_image(out) and list(fuse_tool.finished_records(out)) == ["x.jpg"]

    # its record is the one a resumed run checks its inputs against
    intact = head_file.read_bytes()
    head = ThetaHead(["yolov8n", "yolo26n"])
    with torch_no_grad():
        head.theta.copy_(head.theta.new_tensor([0.9, 0.1]))
    head.save(head_file)
    # the killed run's lock file names it only: the next run removes it
    before = {name: data for name, data in folder_state(out).items() if name != ".detens.lock"}
    assert fuse_into(workspace, source, out, "--head", str(head_file), "--no-vis") == 2
    assert "head.json changed since the earlier run" in capsys.readouterr().err
    assert folder_state(out) == before

    head_file.write_bytes(intact)
    assert fuse_into(workspace, source, out, "--head", str(head_file), "--no-vis") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed"] == 1 and summary["processed_this_run"] == 1 and summary["complete"] is True
    images, _ = read_outputs(out)
    assert [(im["file_name"], im["id"]) for im in images["images"]] == [("x.jpg", 1), ("y.jpg", 2)]
    assert not (out / "partial").exists() and not (out / fuse_tool.RUN_RECORD).exists()


def test_only_an_image_record_at_the_earlier_run_record_path_is_a_finished_image(tmp_path):
    out = tmp_path / "o"
    (out / "partial").mkdir(parents=True)
    (out / "partial" / "_run.json").write_text(json.dumps({"models": ["a"], "weights": {}, "inputs": {}}))
    assert not fuse_tool.has_finished_image(out) and fuse_tool.finished_records(out) == {}
    assert fuse_tool.earlier_run_record(out) == {"models": ["a"], "weights": {}, "inputs": {}}
    image = {"file_name": "_run", "height": 2, "width": 2, "fused": []}
    (out / "partial" / "_run.json").write_text(json.dumps(image))
    # without its boxes, which a run holding every finished image's record would hold them all of
    assert fuse_tool.has_finished_image(out) and fuse_tool.finished_records(out) == {
        "_run": {"file_name": "_run", "height": 2, "width": 2}}
    assert fuse_tool.earlier_run_record(out) is None


@pytest.fixture(scope="module")
def one_of_two_fused(workspace, tmp_path_factory):
    """The source x.jpg, y.jpg; a run of it interrupted once x.jpg was fused; and the outputs of a run of it
    that was not interrupted."""
    root = tmp_path_factory.mktemp("one of two")
    source = one_image_source(workspace, root / "src", "x.jpg", "y.jpg")
    with pytest.MonkeyPatch.context() as patched:
        interrupt_on_image(patched, 2)
        assert fuse_into(workspace, source, root / "interrupted", "--no-vis") == 130
    assert fuse_into(workspace, source, root / "whole", "--no-vis") == 0
    return source, root / "interrupted", read_outputs(root / "whole")


def _with_first_box(record, **changed):
    return json.dumps({**record, "fused": [{**record["fused"][0], **changed}, *record["fused"][1:]]})


#: damaged records of a finished image: what each is made of (from the sound record) and a fragment of its warning
DAMAGED_FUSE_RECORDS = {
    "cut short": (lambda record: json.dumps(record)[:20], "is not valid JSON"),
    "not JSON": (lambda record: "<html>not found</html>", "is not valid JSON"),
    "a list": (lambda record: json.dumps([record]), "a JSON object expected, got list"),
    "nested too deeply": (lambda record: json.dumps(record)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
                          "nests arrays or objects too deeply to be read"),
    "a key twice": (lambda record: json.dumps(record)[:-1] + ', "height": 1}', "has the key 'height' twice"),
    "a 5000-digit height": (lambda record: json.dumps({**record, "height": 0}).replace('"height": 0', '"height": 1' + "0" * 5000),
                            "cannot be read as JSON"),
    "no height": (lambda record: json.dumps({k: v for k, v in record.items() if k != "height"}), "height is missing"),
    "a box of 3 numbers": (lambda record: _with_first_box(record, bbox=[1, 2, 3]), "fused[0].bbox must be 4 finite numbers"),
    "a NaN box": (lambda record: _with_first_box(record, bbox=[1, float("nan"), 3, 4]),
                  "fused[0].bbox must be 4 finite numbers"),
    "a score of 1.5": (lambda record: _with_first_box(record, score=1.5), "fused[0].score must be in [0, 1]"),
    "another image's record": (lambda record: json.dumps({**record, "file_name": "y.jpg"}),
                               "file_name is 'y.jpg', not the image whose record is at this path"),
    "times as text": (lambda record: json.dumps({**record, "times_ms": {"fuse": "fast"}}),
                      "times_ms['fuse'] must be the milliseconds it took"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED_FUSE_RECORDS))
def test_a_damaged_record_of_a_finished_image_is_named_and_the_image_fused_again(workspace, one_of_two_fused, tmp_path,
                                                                                monkeypatch, capfd, case):
    """A record that cannot be used is named with what is wrong, neither passed over without a word nor taken
    into the outputs (a box of 3 numbers in predictions.json) nor the end of the run (a KeyError)."""
    source, interrupted, whole = one_of_two_fused
    out = tmp_path / "o"
    shutil.copytree(interrupted, out)
    damage, message = DAMAGED_FUSE_RECORDS[case]
    path = out / "partial" / "x.jpg.json"
    path.write_text(damage(json.loads(path.read_text())))
    fused = images_fused(monkeypatch)
    capfd.readouterr()
    assert fuse_into(workspace, source, out, "--no-vis") == 0
    warned = [line for line in capfd.readouterr().err.splitlines() if line.startswith(f"WARNING detens.fuse: {path}: ")]
    assert len(warned) == 1 and message in warned[0] and warned[0].endswith("; the image is fused again"), warned
    assert fused == ["x.jpg", "y.jpg"] and read_outputs(out) == whole


def test_each_record_is_checked_once_per_run(workspace, one_of_two_fused, tmp_path, monkeypatch):
    """A record found sound as the run starts is not checked again when the outputs are written: checking its
    boxes costs several times reading it. The record of the image fused in this run is checked as it is read."""
    source, interrupted, whole = one_of_two_fused
    out = tmp_path / "o"
    shutil.copytree(interrupted, out)
    checked = []
    check = fuse_tool.check_record_content
    monkeypatch.setattr(fuse_tool, "check_record_content", lambda record: checked.append(record["file_name"]) or
                        check(record))
    assert fuse_into(workspace, source, out, "--no-vis") == 0
    assert sorted(checked) == ["x.jpg", "y.jpg"] and read_outputs(out) == whole


def test_a_damaged_record_of_an_image_not_in_the_source_is_named_as_left_out(workspace, one_of_two_fused, tmp_path,
                                                                            capfd):
    source, interrupted, _ = one_of_two_fused
    out = tmp_path / "o"
    shutil.copytree(interrupted, out)
    path = out / "partial" / "x.jpg.json"
    path.write_text(path.read_text()[:20])
    capfd.readouterr()
    assert fuse_into(workspace, source / "y.jpg", out, "--no-vis") == 0
    warned = [line for line in capfd.readouterr().err.splitlines() if line.startswith(f"WARNING detens.fuse: {path}: ")]
    assert len(warned) == 1 and warned[0].endswith(
        "its image, not in --source, is left out of the outputs: fuse it again from a --source that has it"), warned
    images, _ = read_outputs(out)
    assert [im["file_name"] for im in images["images"]] == ["y.jpg"]


def test_a_head_rewritten_at_the_same_path_is_not_resumed_over(workspace, tmp_path, capsys):
    from detens import ThetaHead

    head = ThetaHead(["yolov8n", "yolo26n"])
    head.save(tmp_path / "head.json")
    source, out = one_image_source(workspace, tmp_path / "src", "a.jpg"), tmp_path / "o"
    assert fuse_into(workspace, source, out, "--head", str(tmp_path / "head.json"), "--no-vis") == 0
    before = folder_state(out)
    with torch_no_grad():
        head.theta.copy_(head.theta.new_tensor([0.9, 0.1]))
    head.save(tmp_path / "head.json")
    one_image_source(workspace, source, "b.jpg")
    assert fuse_into(workspace, source, out, "--head", str(tmp_path / "head.json"), "--no-vis") == 2
    assert "head.json changed since the earlier run" in capsys.readouterr().err
    assert folder_state(out) == before


def test_weights_rewritten_at_the_same_path_are_not_resumed_over(workspace, tmp_path, capsys):
    weights = tmp_path / "weights"
    models = REPO.parent / "shared" / "models"
    for folder in ("yolov8n_int8_tflite", "yolo26n_int8_tflite"):
        shutil.copytree(models / folder, weights / folder)
    source, out = one_image_source(workspace, tmp_path / "src", "a.jpg"), tmp_path / "o"
    assert fuse_into(workspace, source, out, "--weights-dir", str(weights), "--no-vis") == 0
    before = folder_state(out)
    # a re-export saved over the old file: same name, other detections
    shutil.copy(weights / "yolov8n_int8_tflite" / "yolov8n_int8.tflite",
                weights / "yolo26n_int8_tflite" / "yolo26n_int8.tflite")
    one_image_source(workspace, source, "b.jpg")
    assert fuse_into(workspace, source, out, "--weights-dir", str(weights), "--no-vis") == 2
    err = capsys.readouterr().err
    assert "yolo26n_int8_tflite/yolo26n_int8.tflite changed since the earlier run" in err, err
    assert "yolov8n_int8" not in err.split("changed")[0], err
    assert folder_state(out) == before


def test_a_relative_weights_dir_is_the_yamls_and_a_flags_is_the_working_directorys(workspace, tmp_path, capsys,
                                                                                    monkeypatch):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere" / "deep"
    (project / "models" / "mine").mkdir(parents=True)
    (project / "cfg").mkdir()
    elsewhere.mkdir(parents=True)
    shutil.copy(REPO.parent / "shared" / "models" / "yolov8n_int8_tflite" / "yolov8n_int8.tflite",
                project / "models" / "mine" / "v8.tflite")  # a name no other weights folder has
    config = {"weights_dir": "../models", "models": [{"weights": "mine/v8.tflite", "name": "v8"}],
              "fusion": {"method": "wbf"}}
    (project / "cfg" / "wd.yaml").write_text(yaml.safe_dump(config))
    source = one_image_source(workspace, tmp_path / "src")
    monkeypatch.chdir(elsewhere)
    args = ["--config", str(project / "cfg" / "wd.yaml"), "--source", str(source), "--quiet", "--no-vis"]
    assert fuse_cli.main([*args, "--out", str(tmp_path / "o")]) == 0
    # recorded as one absolute path, which means the same file read from any folder
    weights = {"v8": str(project / "models" / "mine" / "v8.tflite")}
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["weights"] == weights
    (tmp_path / "elsewhere" / "models" / "mine").mkdir(parents=True)
    shutil.copy(project / "models" / "mine" / "v8.tflite", tmp_path / "elsewhere" / "models" / "mine")
    assert fuse_cli.main([*args, "--out", str(tmp_path / "o3"), "--weights-dir", "../models"]) == 0
    weights = {"v8": str(tmp_path / "elsewhere" / "models" / "mine" / "v8.tflite")}
    assert json.loads((tmp_path / "o3" / "summary.json").read_text())["weights"] == weights
    shutil.rmtree(tmp_path / "elsewhere" / "models")
    # the flag's folder is the working directory's: there is none, and a flag naming nothing is a mistake
    with pytest.raises(SystemExit) as stop:  # argparse's own errors exit from parse_args
        fuse_cli.main([*args, "--out", str(tmp_path / "o2"), "--weights-dir", "../models"])
    assert stop.value.code == 2
    assert "argument --weights-dir: no such folder: '../models'" in capsys.readouterr().err
    (tmp_path / "elsewhere" / "models").mkdir()
    assert fuse_cli.main([*args, "--out", str(tmp_path / "o2"), "--weights-dir", "../models"]) == 2
    missing = tmp_path / "elsewhere" / "models"
    assert f"{missing / 'mine' / 'v8.tflite'} (weights folder)" in capsys.readouterr().err


def test_an_image_map_of_saved_predictions_rewritten_at_the_same_path_is_not_resumed_over(workspace, tmp_path, capsys):
    """The file that gives saved predictions' images their ids counts as the results do: rewritten, the
    earlier boxes would belong to other images."""
    source = one_image_source(workspace, tmp_path / "src", "a.jpg")
    saved = {"a.jpg": 1, "b.jpg": 2}
    config = saved_config(tmp_path, [saved_result(1, 1), saved_result(2, 6)], saved)
    args = ["--config", str(config), "--source", str(source), "--out", str(tmp_path / "o"), "--method", "wbf",
            "--quiet", "--no-vis"]
    assert fuse_cli.main(args) == 0
    before = folder_state(tmp_path / "o")
    (tmp_path / "images.json").write_text(json.dumps(
        {"images": [{"id": 2, "file_name": "a.jpg"}, {"id": 1, "file_name": "b.jpg"}]}))
    one_image_source(workspace, source, "b.jpg")
    assert fuse_cli.main(args) == 2
    assert f"{tmp_path / 'images.json'} changed since the earlier run" in capsys.readouterr().err
    assert folder_state(tmp_path / "o") == before


def test_the_dataset_mapping_saved_predictions_images_counts_as_their_image_map(workspace, tmp_path, capsys):
    """Saved predictions with no image map of their own find their images in the config's dataset: that
    file, rewritten, would give the earlier boxes to other images as a rewritten map would."""
    source = one_image_source(workspace, tmp_path / "src", "a.jpg")
    (tmp_path / "saved").mkdir()  # no images.json beside the results
    results = tmp_path / "saved" / "results.json"
    results.write_text(json.dumps([saved_result(1, 1), saved_result(2, 6)]))
    dataset = tmp_path / "dataset.json"
    categories = [{"id": 1, "name": "person"}, {"id": 6, "name": "bus"}]
    images = [{"id": 1, "file_name": "a.jpg", "height": 1080, "width": 810},
              {"id": 2, "file_name": "b.jpg", "height": 1080, "width": 810}]
    dataset.write_text(json.dumps({"images": images, "annotations": [], "categories": categories}))
    config = tmp_path / "saved.yaml"
    config.write_text(yaml.safe_dump({"name": "saved", "dataset": str(dataset), "models": [
        {"type": "precomputed", "results": str(results), "name": "saved"}]}))
    args = ["--config", str(config), "--source", str(source), "--out", str(tmp_path / "o"), "--method", "wbf",
            "--quiet", "--no-vis"]
    assert fuse_cli.main(args) == 0
    assert str(dataset) in json.loads((tmp_path / "o" / "summary.json").read_text())["inputs"]
    before = folder_state(tmp_path / "o")
    images[0]["file_name"], images[1]["file_name"] = "b.jpg", "a.jpg"
    dataset.write_text(json.dumps({"images": images, "annotations": [], "categories": categories}))
    one_image_source(workspace, source, "b.jpg")
    assert fuse_cli.main(args) == 2
    assert f"{dataset} changed since the earlier run" in capsys.readouterr().err
    assert folder_state(tmp_path / "o") == before


def torch_no_grad():
    import torch

    return torch.no_grad()


def test_an_out_folder_with_foreign_outputs_is_refused(workspace, tmp_path, capsys):
    dataset = one_image_source(workspace, tmp_path / "dataset" / "images")
    labels = tmp_path / "dataset" / "labels"
    labels.mkdir()
    (labels / "bus.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    assert fuse_into(workspace, dataset, tmp_path / "dataset") == 2
    assert "already holds labels, which no detens fuse run wrote" in capsys.readouterr().err
    assert (labels / "bus.txt").read_text() == "0 0.5 0.5 0.2 0.2\n"


def test_an_out_folder_inside_the_source_is_not_read_back(workspace, tmp_path):
    source = one_image_source(workspace, tmp_path / "src")
    for _ in range(2):
        assert fuse_into(workspace, source, source / "runs") == 0
    images, _ = read_outputs(source / "runs")
    assert [im["file_name"] for im in images["images"]] == ["bus.jpg"]


def test_images_missing_from_saved_predictions_are_named_before_any_result(workspace, tmp_path, capsys):
    source = one_image_source(workspace, tmp_path / "src", "bus.jpg", "other.jpg")
    (tmp_path / "saved.json").write_text(json.dumps([
        {"image_id": 1, "category_id": 6, "bbox": [20.0, 230.0, 780.0, 520.0], "score": 0.9}]))
    (tmp_path / "images.json").write_text(json.dumps({"images": [{"id": 1, "file_name": "bus.jpg"}]}))
    member = {"type": "precomputed", "results": str(tmp_path / "saved.json"), "images": str(tmp_path / "images.json")}
    config = {"name": "saved", "models": [{**member, "name": "saved"}, {**member, "name": "twin"}]}
    (tmp_path / "saved.yaml").write_text(yaml.safe_dump(config))
    code = fuse_cli.main(["--config", str(tmp_path / "saved.yaml"), "--source", str(source), "--out",
                           str(tmp_path / "o"), "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert "1 of the 2 images have no saved predictions in member 'saved'" in err and "other.jpg" in err
    assert "saved: no saved predictions for" not in err, err  # the member is named once, not again by its own message
    assert not (tmp_path / "o").exists()


def saved_config(tmp_path, results, images, dataset=None, **member_keys):
    """A config of two ``precomputed`` members (with ``member_keys``) replaying ``results`` (COCO results) of
    ``images`` ({file: id})."""
    (tmp_path / "saved.json").write_text(json.dumps(results))
    (tmp_path / "images.json").write_text(json.dumps(
        {"images": [{"id": i, "file_name": name} for name, i in images.items()]}))
    member = {"type": "precomputed", "results": str(tmp_path / "saved.json"), "images": str(tmp_path / "images.json")}
    member.update(member_keys)
    config = {"name": "saved", "models": [{**member, "name": "saved"}, {**member, "name": "twin"}]}
    if dataset is not None:
        config["dataset"] = str(dataset)
    (tmp_path / "saved.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "saved.yaml"


def saved_result(image_id, category_id):
    return {"image_id": image_id, "category_id": category_id, "bbox": [20.0, 230.0, 780.0, 520.0], "score": 0.9}


@pytest.mark.parametrize("flags", [[], ["--no-labels"], ["--no-labels", "--no-vis"]])
def test_saved_category_ids_outside_the_label_space_are_named_before_any_result(workspace, tmp_path, capsys, flags):
    source = one_image_source(workspace, tmp_path / "src", "a.jpg", "b.jpg")
    # the unknown id is on the second image: no result of the first may be written either
    results = [saved_result(1, 6), saved_result(2, 6), saved_result(2, 999), saved_result(2, 12)]
    config = saved_config(tmp_path, results, {"a.jpg": 1, "b.jpg": 2})
    code = fuse_cli.main(["--config", str(config), "--source", str(source), "--out", str(tmp_path / "o"),
                           "--method", "wbf", "--quiet", *flags])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert f"{tmp_path / 'saved.json'} (member 'saved'): result 2 (image_id 2) has category_id 999" in err
    assert "not one of the 80 category ids of COCO (the config names no dataset): 1-11, 13-25, 27, 28," in err
    assert "neither are the saved ids [12]" in err and "class_map" in err
    assert not (tmp_path / "o").exists()


def test_saved_category_ids_follow_the_dataset_and_the_class_map(workspace, tmp_path, capsys):
    source = one_image_source(workspace, tmp_path / "src", "a.jpg")
    dataset = tmp_path / "gt.json"
    dataset.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg", "height": 1080, "width": 810}],
                                   "annotations": [], "categories": [{"id": 1, "name": "person"},
                                                                     {"id": 2, "name": "bus"}]}))
    results = [saved_result(1, 1), saved_result(1, 6)]
    args = ["--source", str(source), "--method", "wbf", "--quiet", "--no-vis"]
    config = saved_config(tmp_path, results, {"a.jpg": 1}, dataset)
    assert fuse_cli.main(["--config", str(config), "--out", str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err
    assert "has category_id 6, which is not one of the 2 category ids of the dataset" in err and ": 1, 2;" in err
    # a class_map onto the dataset's ids fixes it; an id the map sends outside is named with the map
    config = saved_config(tmp_path, results, {"a.jpg": 1}, dataset, class_map={1: 1, 6: 7})
    assert fuse_cli.main(["--config", str(config), "--out", str(tmp_path / "o"), *args]) == 2
    assert "model 'saved': class_map[6] = 7 is not one of the 2 category ids of the dataset" in capsys.readouterr().err
    config = saved_config(tmp_path, results, {"a.jpg": 1}, dataset, class_map={1: 1, 6: 2})
    assert fuse_cli.main(["--config", str(config), "--out", str(tmp_path / "o"), *args]) == 0
    _, fused = read_outputs(tmp_path / "o")
    assert sorted({r["category_id"] for r in fused}) == [1, 2]


@pytest.mark.parametrize("flags", [[], ["--no-labels"], ["--engine", "ray"]])
def test_a_class_map_outside_the_label_space_is_refused_before_any_detector_loads(workspace, tmp_path, capsys,
                                                                                   monkeypatch, flags):
    monkeypatch.setattr(fuse_tool, "build_ensemble", lambda *a, **k: pytest.fail("models loaded for nothing"))
    args = ["--source", str(workspace / "images"), "--out", str(tmp_path / "o"), "--quiet", *flags]
    config = yaml.safe_load((workspace / "pair.yaml").read_text())
    config["models"][1]["class_map"] = {0: 1, "bus": 999}
    (tmp_path / "cm.yaml").write_text(yaml.safe_dump(config))
    assert fuse_cli.main(["--config", str(tmp_path / "cm.yaml"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert ("model 'yolo26n': class_map['bus'] = 999 is not one of the 80 category ids of COCO (the config names no "
            "dataset): 1-11, 13-25, 27, 28,") in err
    # COCO's ids are not a dataset's: with one, its categories are the label space
    config["dataset"] = str(one_image_dataset(tmp_path))
    config["models"][1]["class_map"] = {0: 1, 5: 6}
    (tmp_path / "cm.yaml").write_text(yaml.safe_dump(config))
    assert fuse_cli.main(["--config", str(tmp_path / "cm.yaml"), *args]) == 2
    assert (f"model 'yolo26n': class_map[5] = 6 is not one of the 2 category ids of the dataset "
            f"{tmp_path / 'gt.json'}: 1, 2;") in capsys.readouterr().err
    # saved predictions: a mapped id is checked even when no saved result has its key
    results = [saved_result(1, 1)]
    config = saved_config(tmp_path, results, {"bus.jpg": 1}, None, class_map={1: 1, 12: 999})
    assert fuse_cli.main(["--config", str(config), "--method", "wbf", *args]) == 2
    assert "model 'saved': class_map[12] = 999 is not one of the 80 category ids of COCO" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def one_image_dataset(tmp_path):
    """A COCO dataset of one image, ``a.jpg`` (id 1), with the categories person (1) and bus (2)."""
    dataset = tmp_path / "gt.json"
    dataset.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg", "height": 1080, "width": 810}],
                                   "annotations": [], "categories": [{"id": 1, "name": "person"},
                                                                     {"id": 2, "name": "bus"}]}))
    return dataset


def test_images_not_of_the_datasets_size_are_fused_with_a_warning(workspace, tmp_path, capsys):
    source = one_image_source(workspace, tmp_path / "src", "a.jpg", "b.jpg")
    dataset = tmp_path / "half.json"  # a.jpg annotated at half its size; b.jpg not in the dataset
    dataset.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg", "height": 540, "width": 405}],
                                   "annotations": [], "categories": [{"id": 1, "name": "person"}]}))
    config = saved_config(tmp_path, [saved_result(1, 1), saved_result(2, 1)], {"a.jpg": 1, "b.jpg": 2}, dataset)
    args = ["--config", str(config), "--source", str(source), "--out", str(tmp_path / "o"), "--method", "wbf",
            "--no-vis"]
    assert fuse_cli.main(args) == 0
    err = capsys.readouterr().err
    assert (f"1 of the fused images are not the size {dataset} gives them (width x height: a.jpg is 810x1080, the "
            "dataset says 405x540): their boxes are in the files' pixels") in err, err
    assert len(json.loads((tmp_path / "o" / "predictions.json").read_text())) == 2  # fused all the same


def test_a_run_reads_its_datasets_images_once_and_again_when_the_file_changes(workspace, tmp_path, monkeypatch):
    """The ids are planned from the dataset's images as the run starts, their sizes compared as it ends."""
    reads = []
    read = fuse_tool.load_coco_gt
    monkeypatch.setattr(fuse_tool, "load_coco_gt", lambda path, *a, **k: reads.append(path) or read(path, *a, **k))
    source = one_image_source(workspace, tmp_path / "src", "a.jpg")
    config = saved_config(tmp_path, [saved_result(1, 1)], {"a.jpg": 1}, one_image_dataset(tmp_path))
    args = ["--config", str(config), "--source", str(source), "--method", "wbf", "--quiet", "--no-vis"]
    assert fuse_cli.main([*args, "--out", str(tmp_path / "o")]) == 0
    assert reads == [str(tmp_path / "gt.json")]
    dataset = json.loads((tmp_path / "gt.json").read_text())
    dataset["images"][0]["file_name"] = "b.jpg"  # rewritten in place: a.jpg is no longer the dataset's image 1
    (tmp_path / "gt.json").write_text(json.dumps(dataset))
    os.utime(tmp_path / "gt.json", ns=(1, 1))  # another version even where the clock would give the same time
    assert fuse_cli.main([*args, "--out", str(tmp_path / "o2")]) == 0
    assert len(reads) == 2


def test_images_added_to_a_complete_run_get_ids_of_their_own(workspace, tmp_path):
    source = one_image_source(workspace, tmp_path / "src", "a.jpg", "new1.jpg")
    saved = {"a.jpg": 1, "new1.jpg": 2, "new2.jpg": 3}
    config = saved_config(tmp_path, [saved_result(i, 2) for i in saved.values()], saved, one_image_dataset(tmp_path))
    args = ["--config", str(config), "--source", str(source), "--out", str(tmp_path / "o"), "--method", "wbf",
            "--quiet", "--no-vis"]
    assert fuse_cli.main(args) == 0
    first_images, _ = read_outputs(tmp_path / "o")
    assert {im["file_name"]: im["id"] for im in first_images["images"]} == {"a.jpg": 1, "new1.jpg": 2}
    one_image_source(workspace, source, "new2.jpg")
    assert fuse_cli.main(args) == 0
    images, results = read_outputs(tmp_path / "o")
    assert {im["file_name"]: im["id"] for im in images["images"]} == {"a.jpg": 1, "new1.jpg": 2, "new2.jpg": 3}
    assert sorted(r["image_id"] for r in results) == [1, 2, 3]  # one fused box per image, none merged


def test_files_that_share_a_dataset_base_name_are_refused_before_any_result(workspace, tmp_path, capsys):
    source = tmp_path / "src"
    one_image_source(workspace, source / "train", "a.jpg")
    one_image_source(workspace, source / "val", "a.jpg")
    saved = {"train/a.jpg": 1, "val/a.jpg": 2}
    config = saved_config(tmp_path, [saved_result(i, 2) for i in saved.values()], saved, one_image_dataset(tmp_path))
    code = fuse_cli.main(["--config", str(config), "--source", str(source), "--out", str(tmp_path / "o"),
                           "--method", "wbf", "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "'train/a.jpg', 'val/a.jpg' (relative to --source) and its 'a.jpg'" in err
    assert not (tmp_path / "o").exists()


def test_a_dataset_that_lists_a_file_under_two_ids_is_refused_before_any_result(workspace, tmp_path, capsys):
    """The file's results took the last of its ids, unsaid."""
    source = one_image_source(workspace, tmp_path / "src", "a.jpg")
    dataset = one_image_dataset(tmp_path)
    gt = json.loads(dataset.read_text())
    gt["images"].append({**gt["images"][0], "id": 7})
    dataset.write_text(json.dumps(gt))
    config = saved_config(tmp_path, [saved_result(1, 2)], {"a.jpg": 1}, dataset)
    code = fuse_cli.main(["--config", str(config), "--source", str(source), "--out", str(tmp_path / "o"),
                           "--method", "wbf", "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err, err
    assert "lists 1 file under more than one image id, e.g. 'a.jpg' under [1, 7]: each image file needs one record" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["v8/x", "../../escaped"])
def test_a_member_name_that_is_no_file_name_is_refused_before_any_result(workspace, tmp_path, capsys, name):
    source = one_image_source(workspace, tmp_path / "src", "a.jpg")
    config = saved_config(tmp_path, [saved_result(1, 6)], {"a.jpg": 1})
    data = yaml.safe_load(config.read_text())
    data["models"][0]["name"] = name
    config.write_text(yaml.safe_dump(data))
    out = tmp_path / "runs" / "o"
    code = fuse_cli.main(["--config", str(config), "--source", str(source), "--out", str(out), "--method", "wbf",
                           "--quiet", "--save-per-model"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and f"model name {name!r} cannot name the member's files" in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "escaped.json").exists()


def test_a_missing_config_head_is_named_by_its_yaml_and_key(workspace, tmp_path, capsys):
    source = one_image_source(workspace, tmp_path / "src", "a.jpg")
    config = saved_config(tmp_path, [saved_result(1, 1), saved_result(1, 2)], {"a.jpg": 1})
    data = yaml.safe_load(config.read_text())
    data["fusion"] = {"method": "deep", "head": "../heads/gone.json"}
    config.write_text(yaml.safe_dump(data))
    out = tmp_path / "o"
    assert fuse_cli.main(["--config", str(config), "--source", str(source), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert f"error: {config}: fusion.head: head file '{(tmp_path.parent / 'heads' / 'gone.json').resolve()}' not found" in err
    assert "working directory" not in err
    assert not out.exists()
    # another method drops the config's head: nothing to find
    assert fuse_cli.main(["--config", str(config), "--source", str(source), "--out", str(out), "--quiet",
                          "--method", "wbf", "--no-vis"]) == 0


def test_a_missing_config_head_that_is_in_the_working_directory_says_it_is_not_looked_at(
    workspace, tmp_path, capsys, monkeypatch
):
    from detens.heads.theta import ThetaHead

    source = one_image_source(workspace, tmp_path / "src", "a.jpg")
    (tmp_path / "configs").mkdir()
    config = saved_config(tmp_path / "configs", [saved_result(1, 1), saved_result(1, 2)], {"a.jpg": 1})
    data = yaml.safe_load(config.read_text())
    data["fusion"] = {"method": "theta", "head": "my_head.json"}
    config.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    ThetaHead(["saved", "twin"]).save(tmp_path / "my_head.json")
    out = tmp_path / "o"
    assert fuse_cli.main(["--config", str(config), "--source", str(source), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert err.startswith(f"error: {config}: fusion.head: head file '{tmp_path / 'configs' / 'my_head.json'}' not found")
    assert err.endswith(f"; the file {tmp_path / 'my_head.json'} in the working directory is not looked at (a YAML "
                        "means the same files wherever the command runs): give its path relative to the YAML, or an "
                        "absolute path, or --head\n")
    assert not out.exists()
    # named as the working directory's file, it is found
    assert fuse_cli.main(["--config", str(config), "--source", str(source), "--out", str(out), "--quiet",
                          "--head", "my_head.json", "--no-vis"]) == 0


def test_a_head_with_classes_of_another_label_space_is_refused_before_any_result(workspace, tmp_path, capsys):
    from detens.heads.calibration import CalibrationHead
    from detens.heads.theta import ThetaHead

    source = one_image_source(workspace, tmp_path / "src", "a.jpg")
    config = saved_config(tmp_path, [saved_result(1, 1), saved_result(1, 2)], {"a.jpg": 1},
                          one_image_dataset(tmp_path))
    args = ["--config", str(config), "--source", str(source), "--quiet", "--no-vis"]
    # per-class rows of COCO's 3 (car) and 62: trained where 2 is bicycle, not this dataset's bus
    ThetaHead(["saved", "twin"], per_class=True, class_ids=[1, 3, 62]).save(tmp_path / "coco.json")
    assert fuse_cli.main([*args, "--out", str(tmp_path / "o"), "--head", str(tmp_path / "coco.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert (f"head '{tmp_path / 'coco.json'}' has per-class parameters for category ids 3, 62, which are not "
            f"among the 2 category ids of the dataset {tmp_path / 'gt.json'}: 1, 2;") in err
    assert not (tmp_path / "o").exists()
    curve = (torch_tensor([0.0, 1.0]), torch_tensor([0.0, 1.0]))
    calibration = CalibrationHead(["saved", "twin"], {"saved": curve, "twin": curve},
                                  class_curves={"twin": {7: curve}}, per_class=True)
    calibration.save(tmp_path / "calibration.json")
    assert fuse_cli.main([*args, "--out", str(tmp_path / "o"), "--head", str(tmp_path / "calibration.json")]) == 2
    assert "category ids 7, which are not among the 2 category ids" in capsys.readouterr().err
    # the dataset's own classes, or none of its own, fuse
    ThetaHead(["saved", "twin"], per_class=True, class_ids=[1, 2]).save(tmp_path / "own.json")
    assert fuse_cli.main([*args, "--out", str(tmp_path / "o"), "--head", str(tmp_path / "own.json")]) == 0
    ThetaHead(["saved", "twin"]).save(tmp_path / "agnostic.json")
    assert fuse_cli.main([*args, "--out", str(tmp_path / "o2"), "--head", str(tmp_path / "agnostic.json")]) == 0
    # with no dataset the label space is COCO's, where 3 and 62 are classes
    config = saved_config(tmp_path, [saved_result(1, 1), saved_result(1, 3)], {"a.jpg": 1})
    assert fuse_cli.main(["--config", str(config), "--source", str(source), "--quiet", "--no-vis",
                           "--out", str(tmp_path / "o3"), "--head", str(tmp_path / "coco.json")]) == 0


def test_a_head_whose_ids_name_other_classes_is_refused_by_name(workspace, tmp_path, capsys):
    from detens.heads.theta import ThetaHead

    source = one_image_source(workspace, tmp_path / "src", "a.jpg")
    # no dataset: COCO, where 1, 5 and 9 exist too (person, airplane, boat), so the ids alone pass
    config = saved_config(tmp_path, [saved_result(1, 1), saved_result(1, 5)], {"a.jpg": 1})
    args = ["--config", str(config), "--source", str(source), "--quiet", "--no-vis"]
    custom = ThetaHead(["saved", "twin"], per_class=True, class_ids=[1, 5, 9])
    custom.label_space = {1: "cat", 5: "dog", 9: "bird"}
    custom.save(tmp_path / "custom.safetensors")
    assert fuse_cli.main([*args, "--out", str(tmp_path / "o"), "--head", str(tmp_path / "custom.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert (f"head '{tmp_path / 'custom.safetensors'}' was trained on a label space whose category ids name other "
            "classes than in COCO (the config names no dataset): 1 is 'cat' in the head but 'person' there, 5 is "
            "'dog' in the head but 'airplane' there, 9 is 'bird' in the head but 'boat' there; its per-class "
            "parameters would fuse the wrong classes") in err
    assert not (tmp_path / "o").exists()
    # COCO's own names, spelled otherwise (case, spacing, a VOC alias), are COCO's classes
    coco = ThetaHead(["saved", "twin"], per_class=True, class_ids=[1, 4, 5])
    coco.label_space = {1: "PERSON", 4: "motorbike", 5: " Aeroplane "}
    coco.save(tmp_path / "coco.json")
    assert fuse_cli.main([*args, "--out", str(tmp_path / "o"), "--head", str(tmp_path / "coco.json")]) == 0
    # a class-agnostic head has nothing of its own per class: any label space, whatever it records
    agnostic = ThetaHead(["saved", "twin"])
    agnostic.label_space = {1: "cat", 5: "dog", 9: "bird"}
    agnostic.save(tmp_path / "agnostic.json")
    assert fuse_cli.main([*args, "--out", str(tmp_path / "o2"), "--head", str(tmp_path / "agnostic.json")]) == 0
    # a dataset's categories are the names compared; one it leaves unnamed is not compared
    dataset = tmp_path / "gt.json"
    dataset.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg", "height": 1080, "width": 810}],
                                   "annotations": [], "categories": [{"id": 1, "name": "cat"}, {"id": 5},
                                                                     {"id": 9, "name": "Bird"}]}))
    config = saved_config(tmp_path, [saved_result(1, 1), saved_result(1, 5)], {"a.jpg": 1}, dataset)
    assert fuse_cli.main(["--config", str(config), "--source", str(source), "--quiet", "--no-vis",
                           "--out", str(tmp_path / "o3"), "--head", str(tmp_path / "custom.safetensors")]) == 0


def test_a_head_without_per_class_parameters_fitted_on_another_label_space_is_warned_of_once(
    workspace, tmp_path, capfd
):
    """Such a head applies in any label space, but one fitted on a custom dataset fused COCO's 80 classes
    without a word, so a user could not tell it from the head they meant."""
    from detens.heads.theta import ThetaHead

    source = one_image_source(workspace, tmp_path / "src", "a.jpg", "b.jpg")
    config = saved_config(tmp_path, [saved_result(1, 1), saved_result(2, 5)], {"a.jpg": 1, "b.jpg": 2})
    args = ["--config", str(config), "--source", str(source), "--quiet", "--no-vis"]
    custom = ThetaHead(["saved", "twin"])
    custom.label_space = {1: "Person", 10: "pedestrian", 20: "vehicle", 30: "dog", 91: "kite surfer", 92: "cone"}
    custom.save(tmp_path / "custom.json")

    def warned(out, head):
        capfd.readouterr()  # --quiet: sys.stderr is a copy of fd 2
        assert fuse_cli.main([*args, "--out", str(tmp_path / out), "--head", str(tmp_path / head)]) == 0
        return [line.removeprefix("WARNING detens.heads: ") for line in capfd.readouterr().err.splitlines()
                if line.startswith("WARNING")]

    assert warned("o", "custom.json") == [  # once for the run, not per image
        f"head '{tmp_path / 'custom.json'}' was fitted on another label space than COCO (the config names no "
        "dataset), whose categories are 1 'person', 2 'bicycle', 3 'car', 4 'motorcycle', 5 'airplane', ... "
        "(80 in all): 10 is 'pedestrian' in the head but 'traffic light' there, 20 is 'vehicle' in the head but "
        "'sheep' there, 30 is 'dog' in the head and no category there, 91 is 'kite surfer' in the head and no "
        "category there, 92 is 'cone' in the head and no category there; it has no per-class parameters, so it "
        "applies as it is, every class alike: fine if it was meant to carry over to these classes, else fit one "
        "on this label space (detens cache, detens train)"]
    # COCO's own names in other spellings, a subset of its classes, or no recorded label space: nothing to say
    coco = ThetaHead(["saved", "twin"])
    coco.label_space = {1: "PERSON", 4: "motorbike", 5: " Aeroplane "}
    coco.save(tmp_path / "coco.json")
    assert warned("o2", "coco.json") == []
    ThetaHead(["saved", "twin"]).save(tmp_path / "unrecorded.json")
    assert warned("o3", "unrecorded.json") == []


def torch_tensor(values):
    import torch

    return torch.tensor(values, dtype=torch.float64)


def test_yolo_classes_are_positions_in_images_json_categories(workspace, tmp_path):
    source = one_image_source(workspace, tmp_path / "src", "a.jpg")
    dataset = tmp_path / "gt.json"
    dataset.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg", "height": 1080, "width": 810}],
                                   "annotations": [], "categories": [{"id": 9, "name": "animal"},
                                                                     {"id": 1, "name": "human"},
                                                                     {"id": 5, "name": "vehicle"}]}))
    config = saved_config(tmp_path, [saved_result(1, 5)], {"a.jpg": 1}, dataset)
    assert fuse_cli.main(["--config", str(config), "--source", str(source), "--out", str(tmp_path / "o"),
                           "--method", "wbf", "--quiet", "--no-vis"]) == 0
    images, _ = read_outputs(tmp_path / "o")
    names = [c["name"] for c in images["categories"]]
    assert names == ["human", "vehicle", "animal"]
    (line,) = (tmp_path / "o" / "labels" / "a.txt").read_text().splitlines()
    assert names[int(line.split()[0])] == "vehicle"


def test_images_new_to_the_dataset_are_reported_in_one_warning(workspace, tmp_path, capsys):
    names = ["a.jpg", *(f"new{i}.jpg" for i in range(7))]
    source = one_image_source(workspace, tmp_path / "src", *names)
    results = [saved_result(1, 1)]
    images = {name: i + 1 for i, name in enumerate(names)}
    config = saved_config(tmp_path, [{**r, "image_id": i} for r in results for i in images.values()], images,
                          one_image_dataset(tmp_path))
    assert fuse_cli.main(["--config", str(config), "--source", str(source), "--out", str(tmp_path / "o"),
                           "--method", "wbf", "--no-vis"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "not in" in line]
    assert warnings == [f"WARNING detens.fuse: 7 images not in {tmp_path / 'gt.json'} get new image ids 2-8: new0.jpg, new1.jpg, "
                        "new2.jpg, new3.jpg, new4.jpg, ... (7 in all)"]


def test_a_device_this_machine_lacks_is_one_error_line_before_any_model_loads(workspace, tmp_path, monkeypatch,
                                                                              capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    source, out = one_image_source(workspace, tmp_path / "src"), tmp_path / "o"
    assert fuse_into(workspace, source, out, "--device", "cuda") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "device is 'cuda' but no CUDA device is available on this machine" in err[-1]
    assert "could not load" not in err[-1] and "Traceback" not in "\n".join(err)
    assert not out.exists()


def test_the_summary_lists_unreadable_images_in_the_images_order(tmp_path):
    """Ray reports images as its actors finish them: the summary does not depend on that order."""
    from detens.ensemble_config import load_ensemble_config

    names = ["a.jpg", "b.jpg", "c.jpg"]
    met = {"c.jpg": "empty file", "a.jpg": "could not decode"}  # the order an engine met them in
    run = {"method": "wbf", "processed": 2, "resumed": 0, "interrupted": False, "first_call_ms": None,
           "wall_s": 1.0, "weights": {}, "inputs": {}}
    ids = {"a.jpg": 1, "b.jpg": 2, "c.jpg": 3}
    stems = {name: name.removesuffix(".jpg") for name in names}
    summary = fuse_tool.write_outputs(tmp_path, load_ensemble_config("coco_yolo3"), names, ids, stems, ["m"],
                                      {1: "person"}, met, run)
    assert list(summary["unreadable"]) == ["a.jpg", "c.jpg"] and summary["unreadable"]["c.jpg"] == "empty file"
    assert list(json.loads((tmp_path / "summary.json").read_text())["unreadable"]) == ["a.jpg", "c.jpg"]


def test_a_link_that_leads_to_itself_is_an_unreadable_image_not_the_end_of_the_run(tmp_path):
    """Listed as a broken link, it reached Path.resolve (in the check for images a run wrote), which raises
    on a loop in Python 3.11: the run ended with a traceback before any image was fused."""
    from detens.sources import ImageReadError, list_images, read_image

    try:
        os.symlink("loop.jpg", tmp_path / "loop.jpg")
    except (OSError, NotImplementedError):
        pytest.skip("no symbolic links here")
    out = tmp_path / "out"
    assert list_images(tmp_path) == [tmp_path / "loop.jpg"]
    assert not fuse_tool._written_by_a_run(tmp_path / "loop.jpg", out)
    os.makedirs(out / "vis")
    os.symlink(out / "vis" / "loop.jpg", out / "vis" / "loop.jpg")
    assert fuse_tool._written_by_a_run(out / "vis" / "loop.jpg", out)  # still told apart in --out
    with pytest.raises(ImageReadError, match=r"cannot read image .*loop\.jpg'?: Too many levels of symbolic links"):
        read_image(tmp_path / "loop.jpg")


_KILLED_AT_CONFIG = """
import os, signal, sys
from detens.cli import fuse as fuse_cli
from detens.jobs import fuse


def save_ensemble_config(config, path):
    os.kill(os.getpid(), signal.SIGKILL)  # as the run claims --out, before its config is written


fuse.save_ensemble_config = save_ensemble_config
sys.exit(fuse_cli.main(sys.argv[1:]))
"""


_TERMINATED_AFTER_ONE_IMAGE = """
import os, signal, sys
from detens.cli import main
from detens.jobs import fuse

real_write_image = fuse.write_image
written = []


def write_image(out, record, files):
    real_write_image(out, record, files)
    written.append(record["file_name"])
    if len(written) == 2:
        os.kill(os.getpid(), signal.SIGTERM)  # as a job scheduler stops a run


fuse.write_image = write_image
sys.exit(main(sys.argv[1:]))
"""


def test_a_sigterm_ends_the_command_as_a_ctrl_c_does_after_saving_the_finished_images(workspace, tmp_path):
    """A scheduler's stop (or a plain kill) ended the run on the spot: no summary, and under Ray a traceback
    and exit status 15. It now stops as a Ctrl-C does, with the status shells give a SIGTERM."""
    source = one_image_source(workspace, tmp_path / "src", "x.jpg", "y.jpg", "z.jpg")
    reference, out = tmp_path / "reference", tmp_path / "o"
    assert fuse_into(workspace, source, reference, "--no-vis") == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _TERMINATED_AFTER_ONE_IMAGE, "fuse", "--config", str(workspace / "pair.yaml"),
         "--source", str(source), "--out", str(out), "--quiet", "--no-vis"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 143 and done.stderr.endswith("error: terminated\n"), done.stderr
    assert "Traceback" not in done.stderr and "interrupted: the finished images are saved" in done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and summary["done"] == 2, summary
    assert fuse_into(workspace, source, out, "--no-vis") == 0  # the same command resumes
    assert json.loads((out / "summary.json").read_text())["resumed"] == 2
    for name in ("predictions.json", "images.json", "config.yaml"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name


def test_a_run_killed_as_it_claims_out_leaves_a_folder_the_same_command_resumes(workspace, tmp_path):
    """The config was written before the run record: killed between the two, --out held a config.yaml that
    no run was said to have written, and every later run (--overwrite too) refused the folder."""
    source = one_image_source(workspace, tmp_path / "src", "x.jpg", "y.jpg")
    reference, out = tmp_path / "reference", tmp_path / "o"
    assert fuse_into(workspace, source, reference, "--no-vis") == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_AT_CONFIG, "--config", str(workspace / "pair.yaml"), "--source", str(source),
         "--out", str(out), "--quiet", "--no-vis"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [fuse_tool.RUN_RECORD]
    assert fuse_into(workspace, source, out, "--no-vis") == 0
    for name in ("predictions.json", "images.json", "config.yaml"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    assert not (out / fuse_tool.RUN_RECORD).exists()


def test_a_ctrl_c_while_the_outputs_are_written_waits_for_all_of_them(workspace, tmp_path, monkeypatch, capfd,
                                                                       real_signals_handled):
    """A Ctrl-C right after images.json was written left it saying the run was complete, beside no
    predictions.json or summary.json; held, the run writes them all and then ends as interrupted."""
    import signal

    source = one_image_source(workspace, tmp_path / "src", "x.jpg", "y.jpg")
    reference, out = tmp_path / "reference", tmp_path / "o"
    assert fuse_into(workspace, source, reference, "--no-vis") == 0
    real_write = fuse_tool.atomic_write_json

    def ctrl_c_after_the_image_list(path, *args, **kwargs):
        written = real_write(path, *args, **kwargs)
        if Path(path).name == "images.json":
            signal.raise_signal(signal.SIGINT)
        return written

    monkeypatch.setattr(fuse_tool, "atomic_write_json", ctrl_c_after_the_image_list)
    assert fuse_into(workspace, source, out, "--no-vis") == 130
    for name in ("predictions.json", "images.json", "config.yaml"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    assert json.loads((out / "summary.json").read_text())["done"] == 2 and not (out / "partial").exists()
    err = capfd.readouterr().err
    assert f"interrupted while the outputs were written: the run finished first; {out} holds all of them" in err
    assert err.endswith("error: interrupted\n"), err


def test_images_read_with_a_warning_are_listed_in_the_summary_and_kept_by_a_later_run(workspace, tmp_path, capsys,
                                                                                     with_orientation_tag):
    """A phone photo stored sideways (or a JPEG decoded in part) was fused with a warning that scrolled by:
    the run's summary did not say which of its images it concerned."""
    source, out = one_image_source(workspace, tmp_path / "src", "plain.jpg"), tmp_path / "o"
    (source / "sideways.jpg").write_bytes(with_orientation_tag((source / "plain.jpg").read_bytes(), 6))
    args = ["--config", str(workspace / "pair.yaml"), "--source", str(source), "--out", str(out), "--no-vis"]
    assert fuse_cli.main(args) == 0
    warning = ("its EXIF orientation tag (6: viewers show it turned 90° clockwise) is not applied: it is read, fused "
               "and drawn as stored, and its boxes are in the stored pixels (turn it upright first, e.g. with "
               "PIL.ImageOps.exif_transpose, to detect it as it is seen)")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["read_warnings"] == {"sideways.jpg": [warning]} and summary["done"] == 2
    assert f"\nread with a warning: sideways.jpg: {warning}\n" in capsys.readouterr().out
    # a complete run is unpacked when another image joins: the earlier image's warning stays listed
    one_image_source(workspace, source, "later.jpg")
    assert fuse_cli.main([*args, "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["read_warnings"] == {"sideways.jpg": [warning]} and summary["done"] == 3
    assert summary["processed_this_run"] == 1


def test_the_end_of_a_run_names_the_first_images_read_with_a_warning_and_counts_the_rest(tmp_path, capsys):
    from detens.ensemble_config import load_ensemble_config

    names = [f"{n:02d}.jpg" for n in range(13)]
    summary = {
        "ensemble": "e", "method": "wbf", "models": ["m"], "images": 13, "done": 13, "processed_this_run": 13,
        "resumed": 0, "unreadable": {}, "read_warnings": {name: ["holds 2 pages"] for name in names},
        "boxes": 0, "boxes_score_ge_0.25": 0, "ms_per_image": {}, "complete": True, "interrupted": False,
    }
    fuse_tool.print_summary(tmp_path, load_ensemble_config("coco_yolo3"), summary, "run it again")
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("read with a warning")]
    assert printed == [f"read with a warning: {name}: holds 2 pages" for name in names[:10]] + [
        "read with a warning: 3 more images, listed in summary.json"]


def test_a_source_folder_named_tilde_written_from_the_working_directory_is_not_the_home_folder(tmp_path, monkeypatch):
    """``--source ./~/images`` is a folder named ``~`` of the working directory, whose images are named
    relative to it; ``~/images`` is the home folder's."""
    home, work = tmp_path / "home", tmp_path / "work"
    for folder in (home / "images" / "a", work / "~" / "images" / "a"):
        folder.mkdir(parents=True)
        shutil.copy(Path(ASSETS) / "bus.jpg", folder / "bus.jpg")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    for source, where in (("./~/images", work / "~"), ("~/images", home)):
        images, root = fuse_tool.resolve_source(source)
        assert [p.absolute() for p in images] == [where / "images" / "a" / "bus.jpg"] and root.absolute() == where / "images"
        assert [fuse_tool.relative_name(p, root) for p in images] == ["a/bus.jpg"]
