"""The README's "Train your own fusion weights" walkthrough, executed command by command as written
(default arguments), on a small slice of coco_val2017_206: cache -> train -> evaluate -> fuse."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
DATA = SHARED / "data" / "coco_val2017_206"
SECTION = "## Train your own fusion weights"
NUM_IMAGES = 8

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not DATA.is_dir(), reason="needs ../shared/data/coco_val2017_206"),
]


def walkthrough_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert SECTION in text, f"README.md lacks the section {SECTION!r}"
    body = re.split(r"^## ", text.split(SECTION, 1)[1], maxsplit=1, flags=re.MULTILINE)[0]
    blocks = re.findall(r"```bash\n(.*?)```", body, flags=re.DOTALL)
    return [re.sub(r"\\\n\s*", " ", block).strip() for block in blocks]


def test_the_walkthrough_has_its_four_steps():
    commands = walkthrough_commands()
    assert [shlex.split(c)[:2] for c in commands] == [
        ["detens", "cache"], ["detens", "train"], ["detens", "evaluate"], ["detens", "fuse"],
    ]


def test_walkthrough_runs_end_to_end(tmp_path, monkeypatch, capsys):
    from detens.cli import main

    full = json.loads((DATA / "instances_val2017.json").read_text())
    annotated = sorted({a["image_id"] for a in full["annotations"]})[:NUM_IMAGES]
    keep = set(annotated)
    (tmp_path / "DATA" / "images").mkdir(parents=True)
    (tmp_path / "IMAGES").mkdir()
    images = [im for im in full["images"] if im["id"] in keep]
    for image in images:
        shutil.copy(DATA / "images" / image["file_name"], tmp_path / "DATA" / "images" / image["file_name"])
    for image in images[:2]:
        shutil.copy(DATA / "images" / image["file_name"], tmp_path / "IMAGES" / image["file_name"])
    subset = {**full, "images": images, "annotations": [a for a in full["annotations"] if a["image_id"] in keep]}
    (tmp_path / "DATA" / "instances.json").write_text(json.dumps(subset))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DETENS_WEIGHTS", str(SHARED / "models"))

    for command in walkthrough_commands():
        argv = shlex.split(command)[1:]
        assert main(argv) == 0, f"{command}\n{capsys.readouterr().err}"

    cached = sorted(p.name for p in (tmp_path / "predictions").glob("*.json"))
    assert cached == ["cache_summary.json", "yolo11n.json", "yolo26n.json", "yolov8n.json"]
    head = json.loads((tmp_path / "runs" / "train" / "head.json").read_text())
    # deep calibrates its members' scores by default: the file holds the calibration and the deep head
    assert head["type"] == "calibrated" and head["config"]["head_type"] == "deep"
    assert sorted(head["model_names"]) == ["yolo11n", "yolo26n", "yolov8n"]
    report = json.loads((tmp_path / "report.json").read_text())
    assert {"wbf_tuned", "deep", "calibration", "single:yolo26n"} <= set(report)
    assert all(0.0 < row["map"] <= 1.0 for row in report.values())
    assert (tmp_path / "report.png").stat().st_size > 0 and (tmp_path / "reliability.png").stat().st_size > 0
    fused = tmp_path / "runs" / "fused"
    summary = json.loads((fused / "summary.json").read_text())
    assert summary["method"] == "deep" and summary["done"] == 2  # the head's type ran, by name
    from pycocotools.coco import COCO

    results = COCO(str(fused / "images.json")).loadRes(str(fused / "predictions.json"))
    assert len(results.getImgIds()) == 2 and len(results.getAnnIds()) > 0
