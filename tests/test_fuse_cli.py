"""tools/fuse.py end to end on a folder with a corrupt file, an empty file and names with spaces."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import cv2
import pytest
import yaml

from detens.coco import validate_coco_results

ultralytics = pytest.importorskip("ultralytics")
from ultralytics.utils import ASSETS  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _load_tool():
    spec = importlib.util.spec_from_file_location("detens_tool_fuse", REPO / "tools" / "fuse.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fuse_tool = _load_tool()


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
    config = yaml.safe_load((REPO / "configs" / "ensembles" / "coco_yolo3.yaml").read_text())
    config["name"] = "test_pair"
    config["conf"] = 0.05
    config["models"] = [m for m in config["models"] if m["name"] in ("yolov8n", "yolo26n")]
    config["fusion"] = {"method": "wbf", "params": {"iou_thr": 0.55}, "head": None}
    (root / "pair.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root


def run(workspace, out, *extra):
    return fuse_tool.main(
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


def test_predictions_json(full_run):
    predictions = json.loads((full_run / "predictions.json").read_text())
    assert [im["file_name"] for im in predictions["images"]] == EXPECTED
    assert [im["id"] for im in predictions["images"]] == [1, 2, 3]
    assert [(im["height"], im["width"]) for im in predictions["images"]] == [
        (1080, 810),
        (540, 405),
        (720, 1280),
    ]
    assert predictions["info"]["complete"] is True and predictions["info"]["models"] == ["yolov8n", "yolo26n"]
    results = validate_coco_results(predictions["results"])
    assert {r["image_id"] for r in results} == {1, 2, 3}
    for image_id in (1, 2):  # both copies of bus.jpg: the bus is found
        assert max(r["score"] for r in results if r["image_id"] == image_id and r["category_id"] == 6) > 0.5
    people = [r for r in results if r["image_id"] == 3 and r["category_id"] == 1 and r["score"] > 0.5]
    assert len(people) >= 2
    assert len(predictions["categories"]) == 80


def test_unreadable_files_are_reported_and_skipped(full_run):
    summary = json.loads((full_run / "summary.json").read_text())
    assert sorted(summary["unreadable"]) == ["corrupt.jpg", "empty.jpg"]
    assert (
        "could not decode" in summary["unreadable"]["corrupt.jpg"]
        and "empty" in summary["unreadable"]["empty.jpg"]
    )
    assert summary["images"] == 5 and summary["done"] == 3 and summary["processed_this_run"] == 3
    assert set(summary["ms_per_image"]) == {"read", "detect:yolov8n", "detect:yolo26n", "fuse", "write"}
    assert summary["models"] == ["yolov8n", "yolo26n"] and summary["weights"]["yolov8n"].endswith(
        "yolov8n_int8.tflite"
    )


def test_labels_and_vis(full_run):
    predictions = json.loads((full_run / "predictions.json").read_text())
    for image in predictions["images"]:
        stem = image["output_stem"]
        assert stem == image["file_name"].rsplit(".", 1)[0]  # no two images share a stem here
        lines = (full_run / "labels" / f"{stem}.txt").read_text().splitlines()
        expected = [r for r in predictions["results"] if r["image_id"] == image["id"] and r["score"] >= 0.25]
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
        assert {r["image_id"] for r in results} == {1, 2, 3}
    resolved = yaml.safe_load((full_run / "config.yaml").read_text())
    assert resolved["output"]["save_per_model"] is True and resolved["fusion"]["method"] == "wbf"


def test_resume_after_interruption(workspace, full_run, monkeypatch):
    out = workspace / "out interrupted"
    original = fuse_tool.process_image
    calls = []

    def interrupt_on_second(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(fuse_tool, "process_image", interrupt_on_second)
    assert run(workspace, out, "--save-per-model") == 130
    partial = json.loads((out / "predictions.json").read_text())  # valid, and says it is incomplete
    assert partial["info"]["complete"] is False and [im["file_name"] for im in partial["images"]] == [
        "bus.jpg"
    ]
    assert json.loads((out / "summary.json").read_text())["interrupted"] is True

    monkeypatch.setattr(fuse_tool, "process_image", original)
    assert run(workspace, out, "--save-per-model") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["processed_this_run"] == 2 and summary["resumed"] == 1 and summary["done"] == 3
    resumed = json.loads((out / "predictions.json").read_text())
    complete = json.loads((full_run / "predictions.json").read_text())
    assert resumed["images"] == complete["images"] and resumed["info"]["complete"] is True
    assert sorted(map(json.dumps, resumed["results"])) == sorted(map(json.dumps, complete["results"]))

    # nothing left to do: no model is loaded, the outputs are rewritten identically
    monkeypatch.setattr(fuse_tool, "build_ensemble", lambda config: pytest.fail("models loaded for nothing"))
    assert run(workspace, out, "--save-per-model") == 0
    assert json.loads((out / "predictions.json").read_text()) == resumed


def test_changed_config_refuses_to_resume(workspace, full_run):
    with pytest.raises(SystemExit, match="different config"):
        run(workspace, full_run, "--save-per-model", "--method", "mean")


def test_method_override_overwrite_glob_and_single_file(workspace):
    out = workspace / "out mean"
    source = str(workspace / "images" / "*.jpg")
    code = fuse_tool.main(
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
    predictions = json.loads((out / "predictions.json").read_text())
    assert [im["file_name"] for im in predictions["images"]] == ["bus.jpg", "zidane copy.jpg"]
    assert predictions["info"]["method"] == "mean" and not (out / "vis").exists()
    code = fuse_tool.main(
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
    predictions = json.loads((out / "predictions.json").read_text())
    assert [im["file_name"] for im in predictions["images"]] == ["bus.jpg"] and (
        out / "vis" / "bus.jpg"
    ).is_file()


def test_no_images_and_special_source(workspace, tmp_path):
    (tmp_path / "empty").mkdir()
    assert (
        fuse_tool.main(
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
    assert fuse_tool.main(argv) == 0
    predictions = json.loads((out / "predictions.json").read_text())
    assert {im["file_name"]: im["output_stem"] for im in predictions["images"]} == {"a.JPG": "a_jpg", "a.jpg": "a_jpg_2"}
    for image in predictions["images"]:
        drawn = cv2.imread(str(out / "vis" / f"{image['output_stem']}.jpg"))
        assert drawn.shape[:2] == (image["height"], image["width"])  # its own drawing: the sizes differ
        assert (out / "labels" / f"{image['output_stem']}.txt").is_file()


def test_output_stems():
    assert fuse_tool.output_stems(["a.jpg", "a.png", "b.jpg", "s/a.jpg", "noext"]) == {
        "a.jpg": "a_jpg", "a.png": "a_png", "b.jpg": "b", "s/a.jpg": "s/a", "noext": "noext",
    }  # fmt: skip


def test_shipped_config_head_follows_its_method(tmp_path):
    config_path = str(REPO / "configs" / "ensembles" / "coco_yolo3.yaml")
    base = ["--config", config_path, "--source", "x", "--out", str(tmp_path)]
    names = ["yolov8n", "yolo11n", "yolo26n"]

    config = fuse_tool.resolve_config(fuse_tool.parse_args(base))
    assert config.fusion.method == "theta" and Path(config.fusion.head).is_file()  # relative to the YAML
    params = fuse_tool.fusion_params(config, names)
    assert sorted(params["head"].model_names) == sorted(names) and params["head"].match_iou > 0  # matched by name

    config = fuse_tool.resolve_config(fuse_tool.parse_args(base + ["--method", "wbf"]))
    assert config.fusion.head is None and "head" not in fuse_tool.fusion_params(config, names)

    config = fuse_tool.resolve_config(fuse_tool.parse_args(base + ["--method", "nms", "--head", "my_head.json"]))
    with pytest.raises(ValueError, match="fusion.head is set but the method is 'nms'"):
        fuse_tool.fusion_params(config, names)
