"""tools/cache.py on a slice of coco_val2017_206: COCO results per member, resume, shards + merge,
unreadable images, refused setting changes.

The real-model tests run YOLO26n (INT8 TFLite, the fastest to load) on three images; the bookkeeping
tests replay saved predictions through ``type: precomputed`` members, which go through the same code
path (config → build_detector → detect_loaded on the images read from disk → partial files → outputs).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import math
import re
import shlex
import shutil
import time
from pathlib import Path

import pytest
import torch
import yaml

from detens.coco import evaluate_coco, load_coco_gt, validate_coco_results
from detens.predictions import EnsemblePredictions

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "coco_val2017_206"
YOLO26N = REPO.parent / "shared" / "models" / "yolo26n_int8_tflite" / "yolo26n_int8.tflite"
NUM_IMAGES = 3

pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason="needs ../shared/data/coco_val2017_206")


import detens.jobs.cache as cache_tool  # noqa: E402
from detens.cli import cache as cache_cli  # noqa: E402
from detens.jobs._inputs import path_digest  # noqa: E402


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def slice_(tmp_path_factory):
    """The first images of coco_val2017_206 (by id) copied to a folder, with their ground truth."""
    root = tmp_path_factory.mktemp("cache")
    full = json.loads((DATA / "instances_val2017.json").read_text())
    images = sorted(full["images"], key=lambda im: im["id"])[:NUM_IMAGES]
    ids = {im["id"] for im in images}
    gt = {
        "info": full.get("info", {}),
        "images": images,
        "annotations": [a for a in full["annotations"] if a["image_id"] in ids],
        "categories": full["categories"],
    }
    (root / "images").mkdir()
    for im in images:
        shutil.copy(DATA / "images" / im["file_name"], root / "images" / im["file_name"])
    (root / "gt.json").write_text(json.dumps(gt))

    real = {
        "name": "slice_real",
        "conf": 0.001,
        "max_det": 300,
        "models": [
            {"type": "ultralytics", "weights": str(YOLO26N), "name": "yolo26n", "tta": ["identity", "hflip"]}
        ],
    }
    (root / "real.yaml").write_text(yaml.safe_dump(real, sort_keys=False))

    # saved predictions of two "models": a few boxes per image, none at all on the last image
    saved = {"a": [], "b": []}
    for k, im in enumerate(images[:-1]):
        for j in range(3):
            box = [10.0 + 7 * j + k, 20.0 + 5 * j, 30.0 + j, 40.0]
            saved["a"].append(
                {"image_id": im["id"], "category_id": 1 + j, "bbox": box, "score": 0.875 - 0.125 * j}
            )
        saved["b"].append(
            {"image_id": im["id"], "category_id": 18, "bbox": [5.0, 6.0, 50.0, 60.0], "score": 0.5}
        )
    saved["b"].append({"image_id": images[0]["id"], "category_id": 1, "bbox": [1, 2, 3, 4], "score": 0.0005})
    for name, results in saved.items():
        (root / f"saved_{name}.json").write_text(json.dumps(results))
    replay = {
        "name": "slice_replay",
        "models": [
            {"type": "precomputed", "results": str(root / f"saved_{name}.json"), "name": name}
            for name in saved
        ],
    }
    (root / "replay.yaml").write_text(yaml.safe_dump(replay, sort_keys=False))
    return root


def run(
    root: Path, out: Path, *extra: str, config: str = "replay.yaml", images: Path | None = None, gt: Path | None = None
) -> int:
    return cache_cli.main(
        [
            "--config",
            str(root / config),
            "--images",
            str(images or root / "images"),
            "--gt",
            str(gt or root / "gt.json"),
            "--out",
            str(out),
            "--quiet",
            *extra,
        ]
    )


def summary_of(out: Path, name: str = "cache_summary.json") -> dict:
    return json.loads((out / name).read_text())


@pytest.fixture(scope="module")
def real_run(slice_):
    """YOLO26n with two test-time views, uninterrupted."""
    out = slice_ / "real_full"
    assert run(slice_, out, config="real.yaml") == 0
    return out


@pytest.fixture(scope="module")
def replay_run(slice_):
    out = slice_ / "replay_full"
    assert run(slice_, out) == 0
    return out


def gt_ids(root: Path) -> list[int]:
    return load_coco_gt(root / "gt.json").image_ids


def images_with_the_first_broken(root: Path, folder: Path) -> str:
    """A copy of ``root``'s images in ``folder`` whose first image (by id) is not a decodable JPEG; its name."""
    shutil.copytree(root / "images", folder)
    bad_name = load_coco_gt(root / "gt.json").file_name(gt_ids(root)[0])
    (folder / bad_name).write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg" * 8)
    return bad_name


# ------------------------------------------------------------------------------------------ real model
@pytest.mark.slow
class TestRealModel:
    def test_each_view_is_a_valid_coco_results_file(self, slice_, real_run):
        gt = load_coco_gt(slice_ / "gt.json")
        outputs = {}
        for member in ("yolo26n", "yolo26n|hflip"):
            raw = json.loads((real_run / f"{member}.json").read_text())
            assert isinstance(raw, list)  # a plain COCO results list
            results = validate_coco_results(raw, member)
            assert {r["image_id"] for r in results} == set(gt.image_ids)
            assert [r["image_id"] for r in results] == sorted(r["image_id"] for r in results)
            assert {r["category_id"] for r in results} <= set(gt.category_ids)
            assert min(r["score"] for r in results) >= 0.001
            for image_id in gt.image_ids:
                mine = [r for r in results if r["image_id"] == image_id]
                height, width = gt.image_size(image_id)
                assert 0 < len(mine) <= 300
                for r in mine:
                    x, y, w, h = r["bbox"]
                    assert x >= -0.01 and y >= -0.01 and x + w <= width + 0.01 and y + h <= height + 0.01
            outputs[member] = results
        assert outputs["yolo26n"] != outputs["yolo26n|hflip"]  # two members, two different files
        metrics = evaluate_coco(gt, outputs["yolo26n"])
        assert metrics["map50"] > 0.4, metrics  # YOLO26n finds these objects (0.42 mAP on all 206 images)

    def test_summary_config_and_prediction_folder(self, slice_, real_run):
        summary = summary_of(real_run)
        assert summary["images"] == NUM_IMAGES and summary["unreadable"] == {}
        for member in ("yolo26n", "yolo26n|hflip"):
            entry = summary["models"][member]
            results = json.loads((real_run / f"{member}.json").read_text())
            assert entry["status"] == "complete" and entry["images"] == NUM_IMAGES
            assert entry["boxes"] == len(results) and entry["seconds"] > 0
            assert entry["settings"]["conf"] == 0.001 and entry["settings"]["max_det"] == 300
        assert summary["models"]["yolo26n|hflip"]["settings"]["view"] == "hflip"
        # what produced the predictions: the detector runtime among them
        assert summary["software"]["ai-edge-litert"] == importlib.metadata.version("ai-edge-litert")
        assert summary["software"]["detens"] == importlib.metadata.version("detens")
        config = yaml.safe_load((real_run / "config.yaml").read_text())
        assert config["dataset"] == str((slice_ / "gt.json").absolute()) and config["conf"] == 0.001
        # the folder is what tools/train.py and tools/evaluate.py read (cache_summary.json is not a model)
        predictions = EnsemblePredictions.from_folder(real_run, load_coco_gt(slice_ / "gt.json"))
        assert predictions.model_names == ["yolo26n", "yolo26n|hflip"]

    def test_resume_skips_finished_images_and_equals_an_uninterrupted_run(self, slice_, real_run):
        out = slice_ / "real_resume"
        assert run(slice_, out, "--models", "yolo26n", "--max-images", "2", config="real.yaml") == 0
        assert not (out / "yolo26n.json").exists()  # stopped early: no final file yet
        first = summary_of(out)["models"]["yolo26n"]
        assert first["status"] == "incomplete" and first["images_left"] == NUM_IMAGES - 2
        done = sorted((out / ".partial" / "yolo26n").glob("[0-9]*.json"))
        assert [int(p.stem) for p in done] == gt_ids(slice_)[:2]
        stamps = {p: p.stat().st_mtime_ns for p in done}

        assert run(slice_, out, "--models", "yolo26n", config="real.yaml") == 0
        second = summary_of(out)["models"]["yolo26n"]
        assert second["processed_this_run"] == NUM_IMAGES - 2 and second["resumed"] == 2
        assert {p: p.stat().st_mtime_ns for p in done} == stamps  # finished images were not redone
        assert (out / "yolo26n.json").read_bytes() == (real_run / "yolo26n.json").read_bytes()
        assert not (out / "yolo26n|hflip.json").exists()  # --models left the other view alone

    def test_two_shards_merged_equal_the_unsharded_run(self, slice_, real_run):
        out = slice_ / "real_shards"
        for shard in ("0/2", "1/2"):
            assert run(slice_, out, "--models", "yolo26n", "--shard", shard, config="real.yaml") == 0
        assert not (out / "yolo26n.json").exists()
        shard0 = json.loads((out / "shards" / "yolo26n.shard-0-of-2.json").read_text())
        ids = gt_ids(slice_)
        assert shard0["image_ids"] == ids[0::2] and shard0["shard"] == [0, 2]
        assert cache_cli.main(["merge", "--out", str(out), "--gt", str(slice_ / "gt.json"), "--quiet"]) == 0
        assert (out / "yolo26n.json").read_bytes() == (real_run / "yolo26n.json").read_bytes()
        merged = summary_of(out)["models"]["yolo26n"]
        assert merged["images"] == NUM_IMAGES and merged["shards"] == 2 and merged["status"] == "complete"
        assert summary_of(out)["software"]["torch"] == importlib.metadata.version("torch")
        assert summary_of(out)["image_ids"] == ids
        assert summary_of(out)["categories"] == summary_of(real_run)["categories"]


# --------------------------------------------------------------------------------- saved predictions
def test_replay_outputs(slice_, replay_run):
    ids = gt_ids(slice_)
    a = validate_coco_results(json.loads((replay_run / "a.json").read_text()))
    saved_a = json.loads((slice_ / "saved_a.json").read_text())
    assert [(r["image_id"], r["category_id"], r["score"]) for r in a] == [
        (r["image_id"], r["category_id"], r["score"]) for r in saved_a
    ]
    b = json.loads((replay_run / "b.json").read_text())
    assert all(r["score"] >= 0.001 for r in b) and len(b) == NUM_IMAGES - 1  # conf 0.001 dropped one
    # the last image has no box, yet it is finished: a partial file with an empty list
    record = json.loads((replay_run / ".partial" / "a" / f"{ids[-1]}.json").read_text())
    assert record["results"] == [] and record["image_id"] == ids[-1]
    summary = summary_of(replay_run)
    assert summary["models"]["a"]["images"] == NUM_IMAGES and summary["models"]["a"]["boxes"] == len(a)


def test_rerun_of_a_finished_run_processes_nothing(slice_, replay_run):
    before = (replay_run / "a.json").read_bytes()
    assert run(slice_, replay_run) == 0
    summary = summary_of(replay_run)
    for member in ("a", "b"):
        assert summary["models"][member]["processed_this_run"] == 0
        assert summary["models"][member]["resumed"] == NUM_IMAGES
    assert (replay_run / "a.json").read_bytes() == before


def test_another_image_set_never_drops_finished_results_for_good(slice_, tmp_path, capfd):
    """A finished <member>.json made for more images than a new --gt lists: while .partial/ keeps their
    records the run leaves them out (saying so) and a run with the first ground truth puts them back;
    once .partial/ is gone it is refused, as the results could not be made again without the detectors."""
    full = json.loads((slice_ / "gt.json").read_text())
    dropped = gt_ids(slice_)[1]  # "a" has results on it
    fewer = {**full, "images": [im for im in full["images"] if im["id"] != dropped],
             "annotations": [a for a in full["annotations"] if a["image_id"] != dropped]}
    (tmp_path / "fewer.json").write_text(json.dumps(fewer))

    def cache_with(gt: Path, out: Path, *extra: str) -> int:
        return cache_cli.main(["--config", str(slice_ / "replay.yaml"), "--images", str(slice_ / "images"),
                               "--gt", str(gt), "--out", str(out), *extra])

    out = tmp_path / "out"
    assert run(slice_, out) == 0
    finished = (out / "a.json").read_bytes()
    assert dropped in {r["image_id"] for r in json.loads(finished)}
    capfd.readouterr()
    assert cache_with(tmp_path / "fewer.json", out, "--quiet") == 0  # the records are kept: said, not refused
    assert f"{out / 'a.json'}: 1 images of the earlier ground truth" in capfd.readouterr().err
    assert dropped not in {r["image_id"] for r in json.loads((out / "a.json").read_text())}
    assert run(slice_, out) == 0 and (out / "a.json").read_bytes() == finished  # put back from .partial/

    shutil.rmtree(out / ".partial")
    capfd.readouterr()
    assert cache_with(tmp_path / "fewer.json", out, "--quiet") == 2
    err = capfd.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err, err
    assert (f"{out / 'a.json'} holds results of 1 images that --gt {tmp_path / 'fewer.json'} does not list and "
            f"whose records .partial/ no longer keeps (image ids {dropped}): this run would drop them for good") in err
    assert (out / "a.json").read_bytes() == finished
    assert cache_with(tmp_path / "fewer.json", out, "--quiet", "--overwrite") == 0


@pytest.mark.parametrize("content", ["7", '"results"', '{"image_id": 5}', '[{"image_id": [5]}, {"image_id": "6"}, 3]'])
def test_a_results_file_holding_no_results_has_none_to_lose(tmp_path, content):
    """A member's results file that is a JSON number, text or object, or whose entries name no image by a
    whole-number id, is taken as an unreadable one is: it holds no result a run could lose."""
    from types import SimpleNamespace

    (tmp_path / "cache_summary.json").write_text(json.dumps({"gt_fingerprint": "earlier"}))
    (tmp_path / cache_tool.member_output("a", None)).write_text(content)
    data = SimpleNamespace(fingerprint="now", all_ids=[1])
    cache_tool.check_no_results_lost(tmp_path, "a", data, tmp_path / "cache_summary.json", tmp_path / "gt.json")
    # beside such entries, a result of an image the new ground truth lacks still counts
    (tmp_path / cache_tool.member_output("a", None)).write_text('[{"image_id": [5]}, {"image_id": "6"}, 3, {"image_id": 9}]')
    with pytest.raises(ValueError, match=r"holds results of 1 images that --gt .* \(image ids 9\)"):
        cache_tool.check_no_results_lost(tmp_path, "a", data, tmp_path / "cache_summary.json", tmp_path / "gt.json")


def test_quiet_prints_no_summary_and_loud_prints_the_member_table(slice_, capsys):
    out = slice_ / "replay_quiet"
    capsys.readouterr()
    assert run(slice_, out) == 0  # --quiet
    assert capsys.readouterr().out == ""
    loud = ["--config", str(slice_ / "replay.yaml"), "--images", str(slice_ / "images"), "--gt", str(slice_ / "gt.json"),
            "--out", str(out)]
    assert cache_cli.main(loud) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].split() == ["member", "images", "boxes", "det", "s", "img/s", "status"], printed
    assert printed[-1] == f"results in {out}/, summary {out / 'cache_summary.json'}", printed


def ctrl_c_on_second_image(detect, press_ctrl_c, pause: float = 0.0):
    """``detect`` (the cache's ``detect_loaded``) that presses Ctrl-C as it is called for the second image,
    each call taking at least ``pause`` seconds (a time the stopped run must record)."""
    calls = []

    def detect_then_ctrl_c(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            press_ctrl_c()
        time.sleep(pause)
        return detect(*args, **kwargs)

    return detect_then_ctrl_c


def test_interrupted_run_resumes(slice_, replay_run, monkeypatch, capsys, press_ctrl_c):
    """Ctrl-C in the middle of a model: finished images are kept, the re-run completes the same file."""
    out = slice_ / f"replay_interrupted_{press_ctrl_c.__name__}"
    real_detect = cache_tool.detect_loaded
    monkeypatch.setattr(cache_tool, "detect_loaded", ctrl_c_on_second_image(real_detect, press_ctrl_c, pause=0.01))
    capsys.readouterr()
    assert run(slice_, out) == 130
    assert capsys.readouterr().err.endswith("error: interrupted\n")  # as a Ctrl-C anywhere else ends
    assert not (out / "a.json").exists() and not (out / "b.json").exists()
    assert len(list((out / ".partial" / "a").glob("[0-9]*.json"))) == 1
    assert summary_of(out)["stopped_by"] == "interrupt"
    stopped = summary_of(out)["models"]["a"]
    assert stopped["status"] == "incomplete" and stopped["processed_this_run"] == 1
    assert stopped["wall_s_this_run"] >= 0.01 and 0 <= stopped["load_s_this_run"] <= stopped["wall_s_this_run"]
    # a leftover temporary file and a damaged record are not taken for finished images
    (out / ".partial" / "a" / ".123.json.tmp").write_text('{"image_id": 1')
    (out / ".partial" / "b" / f"{gt_ids(slice_)[1]}.json").write_text('{"image_id": ')
    monkeypatch.setattr(cache_tool, "detect_loaded", real_detect)
    assert run(slice_, out) == 0
    summary = summary_of(out)
    assert summary["models"]["a"]["processed_this_run"] == NUM_IMAGES - 1
    assert summary["models"]["b"]["processed_this_run"] == NUM_IMAGES
    for member in ("a", "b"):
        assert (out / f"{member}.json").read_bytes() == (replay_run / f"{member}.json").read_bytes()


#: damaged records of finished images: what each is made of (from the good record) and a fragment of its warning
DAMAGED_RECORDS = {
    "cut short": (lambda record: json.dumps(record)[:20], "is not valid JSON"),
    "a list": (lambda record: json.dumps([record]), "a JSON object expected, got list"),
    "a NaN box": (lambda record: json.dumps({**record, "results": [{**record["results"][0], "bbox": [1, float("nan"), 3, 4]}]}),
                  "results[0].bbox must be 4 finite numbers"),
    "a box of 3 numbers": (lambda record: json.dumps({**record, "results": [{**record["results"][0], "bbox": [1, 2, 3]}]}),
                           "results[0].bbox must be 4 finite numbers"),
    "a score of 1.5": (lambda record: json.dumps({**record, "results": [{**record["results"][0], "score": 1.5}]}),
                       "results[0].score must be in [0, 1]"),
    "another image's results": (lambda record: json.dumps({**record, "results": [{**record["results"][0], "image_id": 7}]}),
                                "results of other images 7"),
    "another image's id": (lambda record: json.dumps({**record, "image_id": 7}), "image_id is 7, not the"),
    "ms as text": (lambda record: json.dumps({**record, "ms": "fast"}), "ms must be the milliseconds"),
    "ms beyond the float range": (lambda record: json.dumps({**record, "ms": 10**400}), "ms must be the milliseconds"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED_RECORDS))
def test_a_damaged_record_of_a_finished_image_is_named_and_the_image_detected_again(slice_, replay_run, tmp_path,
                                                                                    capfd, case):
    """A record that cannot be used is named with what is wrong, not taken into the member's results (which
    train and evaluate would refuse as a whole) nor passed over without a word."""
    out = tmp_path / "damaged"
    shutil.copytree(replay_run, out)
    damage, message = DAMAGED_RECORDS[case]
    path = out / ".partial" / "a" / f"{gt_ids(slice_)[0]}.json"
    path.write_text(damage(json.loads(path.read_text())))
    capfd.readouterr()
    assert run(slice_, out) == 0
    warned = [line for line in capfd.readouterr().err.splitlines() if line.startswith(f"WARNING detens.cache: {path}: ")]
    assert len(warned) == 1 and message in warned[0] and warned[0].endswith("the image is detected again")
    assert [summary_of(out)["models"][m]["processed_this_run"] for m in ("a", "b")] == [1, 0]
    assert (out / "a.json").read_bytes() == (replay_run / "a.json").read_bytes()


#: JSON too deeply nested to be read
TOO_DEEP = "[" * 100_000 + "]" * 100_000


def test_a_summary_too_deeply_nested_to_be_read_is_taken_for_none_as_an_unreadable_one_is(slice_, replay_run, tmp_path):
    out = tmp_path / "deep"
    shutil.copytree(replay_run, out)
    (out / "cache_summary.json").write_text(TOO_DEEP)
    assert run(slice_, out) == 0  # read nowhere as a summary: every image resumed from its record
    models = summary_of(out)["models"]
    assert sorted(models) == ["a", "b"] and [models[m]["resumed"] for m in ("a", "b")] == [NUM_IMAGES] * 2
    assert (out / "a.json").read_bytes() == (replay_run / "a.json").read_bytes()


def test_settings_too_deeply_nested_to_be_read_are_refused_as_unreadable_ones_are(slice_, replay_run, tmp_path,
                                                                                    capsys):
    out = tmp_path / "deep"
    shutil.copytree(replay_run, out)
    (out / ".partial" / "b" / "_settings.json").write_text(TOO_DEEP)
    refused(capsys, run(slice_, out, "--models", "b"), r"^error: .* holds results of 'b' made with other settings")


def test_a_python_call_raises_the_interrupt_once_the_finished_images_are_saved(slice_, replay_run, monkeypatch,
                                                                              capsys, caplog, press_ctrl_c):
    """``detens.cache`` stops its caller on a Ctrl-C (a script's loop over calls too), after saving what the
    command saves before it ends with status 130; the same call made again resumes."""
    import detens

    out = slice_ / f"python_interrupted_{press_ctrl_c.__name__}"
    real_detect = cache_tool.detect_loaded
    monkeypatch.setattr(cache_tool, "detect_loaded", ctrl_c_on_second_image(real_detect, press_ctrl_c))

    def call():
        return detens.cache(slice_ / "replay.yaml", slice_ / "images", slice_ / "gt.json", out)

    capsys.readouterr()
    called = 0
    with pytest.raises(KeyboardInterrupt):
        for _ in range(2):
            called += 1
            call()
    assert called == 1
    assert len(list((out / ".partial" / "a").glob("[0-9]*.json"))) == 1
    assert summary_of(out)["stopped_by"] == "interrupt"
    # in the caller's words: a Python call has no command to run again
    assert "interrupted: the finished images are saved; make the same call again to resume" in caplog.text
    assert "not finished: make the same call again to resume" in capsys.readouterr().out.splitlines()

    monkeypatch.setattr(cache_tool, "detect_loaded", real_detect)
    assert call() == 0
    summary = summary_of(out)
    assert summary["models"]["a"]["processed_this_run"] == NUM_IMAGES - 1
    for member in ("a", "b"):
        assert (out / f"{member}.json").read_bytes() == (replay_run / f"{member}.json").read_bytes()


def test_an_unfinished_overwrite_run_says_to_resume_without_overwrite(slice_, tmp_path, capsys):
    """The same run with --overwrite would discard the images it finished, not resume them."""
    out = tmp_path / "o"
    command = ["--config", str(slice_ / "replay.yaml"), "--images", str(slice_ / "images"),
               "--gt", str(slice_ / "gt.json"), "--out", str(out)]
    capsys.readouterr()
    assert cache_cli.main([*command, "--overwrite", "--max-images", "1"]) == 0
    assert "not finished: run the same command again without --overwrite to resume" in (
        capsys.readouterr().out.splitlines())
    assert cache_cli.main(command) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:4]}
    assert all(row.endswith(f"complete ({NUM_IMAGES - 1} this run, 1 resumed)") for row in rows.values()), rows


def test_a_resumed_run_says_how_many_images_it_resumed(slice_, tmp_path, capsys):
    out = tmp_path / "o"
    assert run(slice_, out, "--max-images", "1") == 0  # as if interrupted after each member's first image
    capsys.readouterr()
    assert cache_cli.main(["--config", str(slice_ / "replay.yaml"), "--images", str(slice_ / "images"),
                           "--gt", str(slice_ / "gt.json"), "--out", str(out)]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:4]}
    assert rows.keys() == {"a", "b"}, rows
    assert all(row.endswith(f"complete ({NUM_IMAGES - 1} this run, 1 resumed)") for row in rows.values()), rows


def test_merge_of_three_shards_and_subcommand_forms(slice_, replay_run):
    out = slice_ / "replay_shards3"
    for index in range(3):
        assert run(slice_, out, "--shard", f"{index}/3") == 0
    assert cache_cli.main(["--merge", "--out", str(out), "--quiet"]) == 0  # no --gt needed
    for member in ("a", "b"):
        assert (out / f"{member}.json").read_bytes() == (replay_run / f"{member}.json").read_bytes()
    assert summary_of(out)["images"] == NUM_IMAGES


def test_merge_with_a_missing_shard_fails_clearly(slice_, capsys):
    out = slice_ / "replay_missing"
    assert run(slice_, out, "--shard", "0/3") == 0
    assert run(slice_, out, "--shard", "2/3") == 0
    capsys.readouterr()
    assert cache_cli.main(["merge", "--out", str(out), "--gt", str(slice_ / "gt.json"), "--quiet"]) == 2
    err = capsys.readouterr().err
    missing_id = gt_ids(slice_)[1]
    assert "a: shard 1/3 is missing (1 images: " + str(missing_id) + ")" in err
    assert "b: shard 1/3 is missing" in err and "--shard 1/3" in err
    assert err.count("\n") == 1 and err.startswith(f"error: cannot merge the shards in {out / 'shards'}: a: "), err  # one line
    assert "run --shard 1/3 | b: shard 1/3" in err
    assert not (out / "a.json").exists() and not (out / "b.json").exists()
    # the same images split two ways cannot be mixed either
    assert run(slice_, out, "--shard", "0/2", "--models", "a") == 0
    assert cache_cli.main(["merge", "--out", str(out), "--quiet"]) == 2
    assert "a: shards of different splits (n=2, n=3)" in capsys.readouterr().err


@pytest.mark.parametrize("merge", [False, True])
def test_a_summary_that_is_a_pipe_is_refused_before_any_work_not_waited_on(slice_, tmp_path, capsys, named_pipe,
                                                                           merge):
    """The run reads the summary back for its other members' entries: a pipe would be waited on (or read
    as no summary, their entries dropped), and is refused like any other input that is one."""
    out = tmp_path / "o"
    if merge:
        assert run(slice_, out, "--shard", "0/1") == 0
    else:
        out.mkdir()
    pipe = named_pipe(out / "cache_summary.json")
    capsys.readouterr()
    code = cache_cli.main(["merge", "--out", str(out), "--quiet"]) if merge else run(slice_, out)
    refused(capsys, code, rf"^error: cache summary {re.escape(str(pipe))} is not a regular file \(a pipe\); ")
    assert not (out / "a.json").exists() and not (out / "b.json").exists() and (merge or not (out / ".partial").exists())


@pytest.mark.parametrize("name", ["a.json", "cache_summary.json"])
def test_an_output_that_may_not_be_replaced_is_refused_before_any_model_loads(slice_, replay_run, tmp_path, capsys,
                                                                              monkeypatch, immutable, name):
    """A member's results and the summary are written once the members have run: only then would the run find
    the file it may not replace."""
    out = tmp_path / "o"
    shutil.copytree(replay_run, out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    immutable(out / name)
    loads = []
    monkeypatch.setattr(cache_tool, "build_detector", lambda *args, **kwargs: loads.append(args))
    capsys.readouterr()
    assert run(slice_, out, "--overwrite") == 2
    assert capsys.readouterr().err == (
        f"error: the output {out / name} cannot be written: the file there may be neither replaced, moved nor "
        "removed (Operation not permitted: it is marked immutable or append-only, as lsattr shows); lift that mark, "
        "or give another --out\n")
    assert loads == [] and {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_merge_names_a_shard_that_a_run_stopped_before_its_file_incomplete(slice_, tmp_path, capsys):
    out = tmp_path / "o"
    assert run(slice_, out, "--shard", "1/2") == 0
    assert run(slice_, out, "--shard", "0/2", "--max-images", "1") == 0  # as if killed after its first image
    capsys.readouterr()
    assert cache_cli.main(["merge", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    left = gt_ids(slice_)[2]
    assert f"a: shard 0/2 is incomplete (1 of its 2 images left: {left}); run --shard 0/2 again to finish it" in err
    assert "missing" not in err, err


def test_a_shard_run_points_to_the_shards_folder_and_the_merge(slice_, tmp_path, capsys):
    out = tmp_path / "o"
    gt = slice_ / "gt.json"
    capsys.readouterr()
    assert cache_cli.main(["--config", str(slice_ / "replay.yaml"), "--images", str(slice_ / "images"),
                           "--gt", str(gt), "--out", str(out), "--shard", "0/2"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2:] == [
        f"results in {out / 'shards'}/, summary {out / 'shards' / 'cache_summary.shard-0-of-2.json'}",
        f"once every shard is done, join them: detens cache merge --out {out} --gt {gt}",
    ], printed
    # from Python, the call that joins them; a path with a space is quoted on the command line
    import detens

    spaced = tmp_path / "o two"
    assert detens.cache(slice_ / "replay.yaml", slice_ / "images", gt, spaced, shard="1/2") == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"once every shard is done, join them: detens.cache(out={str(spaced)!r}, gt={str(gt)!r}, merge=True)")
    assert cache_cli.main(["--config", str(slice_ / "replay.yaml"), "--images", str(slice_ / "images"),
                           "--gt", str(gt), "--out", str(spaced), "--shard", "0/2"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"once every shard is done, join them: detens cache merge --out '{spaced}' --gt {gt}")
    assert cache_cli.main(["merge", "--out", str(spaced), "--gt", str(gt), "--quiet"]) == 0


def test_the_merge_it_points_to_reads_a_folder_named_tilde_as_that_folder(slice_, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    gt = slice_ / "gt.json"
    args = ["--config", str(slice_ / "replay.yaml"), "--images", str(slice_ / "images"), "--gt", str(gt)]
    for shard in ("0/2", "1/2"):
        assert cache_cli.main([*args, "--out", "./~/o", "--shard", shard]) == 0
    merge = capsys.readouterr().out.splitlines()[-1]
    # given again as printed, not read as the home folder's o
    assert merge == f"once every shard is done, join them: detens cache merge --out '{tmp_path / '~' / 'o'}' --gt {gt}"
    assert cache_cli.main(shlex.split(merge.split(": ", 1)[1])[2:] + ["--quiet"]) == 0
    assert (tmp_path / "~" / "o" / "a.json").is_file() and not (tmp_path / "home").exists()


def shard_gt(root: Path, folder: Path, count: int) -> Path:
    """An annotation file in ``folder`` of the first ``count`` images (by id) of ``root``'s."""
    gt = json.loads((root / "gt.json").read_text())
    images = sorted(gt["images"], key=lambda im: im["id"])[:count]
    ids = {im["id"] for im in images}
    subset = {**gt, "images": images, "annotations": [a for a in gt["annotations"] if a["image_id"] in ids]}
    (folder / f"gt{count}.json").write_text(json.dumps(subset))
    return folder / f"gt{count}.json"


def test_a_shard_on_another_annotation_file_is_refused_as_it_starts_naming_both(slice_, tmp_path, capfd):
    """The shards of a split merge only when made on one annotation file: the mistake is told as the odd shard
    starts, while the others may still run, not once every shard has run."""
    out, gt, gt2 = tmp_path / "o", slice_ / "gt.json", shard_gt(slice_, tmp_path, 2)
    assert run(slice_, out, "--shard", "0/2", "--max-images", "1") == 0  # shard 0 has started, and goes on later
    refused(capfd, run(slice_, out, "--shard", "1/2", gt=gt2),
            rf"^error: {re.escape(str(out / 'shards'))} holds shard 0/2, made on {re.escape(str(gt))} \(3 images\); "
            rf"this shard's --gt {re.escape(str(gt2))} \(2 images\) is another file, and the shards of a split merge "
            r"only when made on the same one: give the --gt of the others, use another --out, or --overwrite to start "
            r"this shard over on this file \(the others then run again on it too\)\n$")
    assert not (out / "shards" / ".annotations.shard-1-of-2.json").exists()  # a refused run changes nothing
    assert not (out / "shards" / "config.shard-1-of-2.yaml").exists()
    assert run(slice_, out, "--shard", "1/2") == 0
    assert run(slice_, out, "--shard", "0/2") == 0
    assert cache_cli.main(["merge", "--out", str(out), "--quiet"]) == 0
    # the split moved to another annotation file, shard by shard: --overwrite lets the first go, with a warning
    again = tmp_path / "again"
    assert run(slice_, again, "--shard", "1/2", gt=gt2) == 0
    refused(capfd, run(slice_, again, "--shard", "0/2"), rf"holds shard 1/2, made on {re.escape(str(gt2))} \(2 images\)")
    assert run(slice_, again, "--shard", "0/2", "--overwrite") == 0
    assert (f"WARNING detens.cache: {again / 'shards'} holds shard 1/2, made on {gt2} (2 images): run it again with "
            f"--gt {gt} before the merge") in capfd.readouterr().err  # --quiet: sys.stderr is a copy of fd 2
    assert run(slice_, again, "--shard", "1/2") == 0
    assert cache_cli.main(["merge", "--out", str(again), "--gt", str(gt), "--quiet"]) == 0


def test_a_refused_merge_names_the_annotation_files_and_the_shards_of_each(slice_, tmp_path, capsys):
    out, gt, gt2 = tmp_path / "o", slice_ / "gt.json", shard_gt(slice_, tmp_path, 2)
    assert run(slice_, out, "--shard", "0/2", "--models", "a") == 0
    # as a shard of an earlier version leaves it, which recorded no annotation file as it started
    (out / "shards" / ".annotations.shard-0-of-2.json").unlink()
    assert run(slice_, out, "--shard", "1/2", "--models", "a", gt=gt2) == 0
    capsys.readouterr()
    assert cache_cli.main(["merge", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert (f"a: the shards were made on different annotation files (shard 0/2 on {gt} (3 images); shard 1/2 on "
            f"{gt2} (2 images)); re-run the odd ones with the --gt of the others") in err, err
    assert run(slice_, out, "--shard", "1/2", "--models", "a") == 0
    assert cache_cli.main(["merge", "--out", str(out), "--gt", str(gt2), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert (f"a: the shards were made on {gt} (3 images), not on --gt {gt2} (2 images); merge with that --gt, or "
            "re-run the shards with this one") in err, err
    assert cache_cli.main(["merge", "--out", str(out), "--gt", str(gt), "--quiet"]) == 0


def test_a_merge_of_members_made_on_different_annotation_files_is_refused_naming_them(slice_, tmp_path, capsys):
    """Shards collected from runs with separate --out folders: each member's shards agree, the members do not,
    and one summary cannot describe both members' images."""
    out, elsewhere, gt, gt2 = tmp_path / "o", tmp_path / "e", slice_ / "gt.json", shard_gt(slice_, tmp_path, 2)
    for index in ("0/2", "1/2"):
        assert run(slice_, out, "--shard", index, "--models", "a") == 0
        assert run(slice_, elsewhere, "--shard", index, "--models", "b", gt=gt2) == 0
    for path in (elsewhere / "shards").glob("b.shard-*.json"):
        shutil.copy(path, out / "shards" / path.name)
    capsys.readouterr()
    assert cache_cli.main(["merge", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert (f"the members were made on different annotation files (a on {gt} (3 images); b on {gt2} (2 images)); "
            "re-run the odd ones' shards with the --gt of the others") in err, err
    assert not (out / "a.json").exists() and not (out / "cache_summary.json").exists()
    assert cache_cli.main(["merge", "--out", str(out), "--models", "a", "--quiet"]) == 0
    assert json.loads((out / "cache_summary.json").read_text())["images"] == NUM_IMAGES == 3


def test_merge_lists_the_first_images_of_a_missing_shard_then_their_count(tmp_path):
    ids = list(range(1, 25))
    shard = {"format": cache_tool.SHARD_FORMAT, "member": "a", "shard": [0, 2], "gt_fingerprint": "f",
             "dataset_image_ids": ids, "image_ids": ids[0::2], "unreadable": [], "settings": {}, "seconds": 0.0,
             "results": []}
    (tmp_path / "a.json").write_text(json.dumps(shard))
    with pytest.raises(cache_tool.MergeError) as refused:
        cache_tool.merge_member("a", {0: tmp_path / "a.json"}, 2, None)
    assert str(refused.value) == ("a: shard 1/2 is missing (12 images: 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, ... "
                                  "(12 in all)); run --shard 1/2")


DAMAGED_SHARD_FILES = {
    "a key lost": (lambda shard: {k: v for k, v in shard.items() if k != "gt_fingerprint"},
                   "it lacks 'gt_fingerprint' (a string)"),
    "ids as text": (lambda shard: {**shard, "image_ids": ["1", "3"]}, "image_ids must be a list of image ids, got ['1', '3']"),
    "unreadable as names": (lambda shard: {**shard, "unreadable": ["a.jpg"]}, "unreadable must be a list of"),
    "a NaN box": (lambda shard: {**shard, "results": [{"image_id": 1, "category_id": 1, "bbox": [1, math.nan, 2, 2],
                                                       "score": 0.5}]}, "results[0].bbox must be 4 finite numbers"),
    "seconds as text": (lambda shard: {**shard, "seconds": "1.5"}, "seconds must be a number of seconds >= 0"),
    "seconds beyond the float range": (lambda shard: {**shard, "seconds": 10**400},
                                       "seconds must be a number of seconds >= 0"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED_SHARD_FILES))
def test_a_damaged_shard_file_is_named_with_what_is_wrong(tmp_path, case):
    """A merge names the file and the key, where a key lost was a KeyError and a NaN box went into the results."""
    ids = [1, 2, 3]
    shard = {"format": cache_tool.SHARD_FORMAT, "member": "a", "shard": [0, 1], "gt_fingerprint": "f",
             "dataset_image_ids": ids, "image_ids": ids, "unreadable": [], "settings": {}, "seconds": 0.0,
             "results": []}
    damage, message = DAMAGED_SHARD_FILES[case]
    path = tmp_path / "a.json"
    path.write_text(json.dumps(damage(shard)))
    with pytest.raises(cache_tool.MergeError) as refused:
        cache_tool.merge_member("a", {0: path}, 1, None)
    assert str(refused.value).startswith(f"a: {path} is a damaged shard file of `detens cache --shard`: {message}")
    assert str(refused.value).endswith("run --shard 0/1 again")


def test_merge_with_nothing_to_merge(slice_, capsys):
    assert cache_cli.main(["merge", "--out", str(slice_ / "nowhere"), "--quiet"]) == 2
    assert "no shard files" in capsys.readouterr().err


def test_merge_rejects_the_options_of_a_detection_run(slice_, capsys):
    out = ["merge", "--out", str(slice_ / "nowhere"), "--quiet"]
    for extra, named in ((["--conf", "0.9", "--max-det", "1"], "--conf, --max-det"), (["--overwrite"], "--overwrite"),
                         (["--config", "coco_yolo4_tta"], "--config"), (["--engine", "ray"], "--engine"),
                         (["--max-images", "0"], "--max-images")):
        assert cache_cli.main(out + extra) == 2
        err = capsys.readouterr().err
        assert f"{named} would not be used" in err and "Traceback" not in err


def test_unreadable_image_is_skipped_and_reported(slice_, replay_run):
    ids = gt_ids(slice_)
    broken = slice_ / "images_broken"
    bad_name = images_with_the_first_broken(slice_, broken)
    out = slice_ / "replay_broken"
    assert run(slice_, out, images=broken) == 0
    summary = summary_of(out)
    assert list(summary["unreadable"]) == [bad_name] and "could not decode" in summary["unreadable"][bad_name]
    assert summary["models"]["a"]["unreadable"] == summary["unreadable"]
    assert (
        summary["models"]["a"]["status"] == "complete" and summary["models"]["a"]["images"] == NUM_IMAGES - 1
    )
    results = json.loads((out / "a.json").read_text())
    assert ids[0] not in {r["image_id"] for r in results} and results
    # sharded: the unreadable image counts as covered, and the merge reports it
    out_shards = slice_ / "replay_broken_shards"
    for index in range(2):
        assert run(slice_, out_shards, "--shard", f"{index}/2", images=broken) == 0
    assert (
        cache_cli.main(["merge", "--out", str(out_shards), "--gt", str(slice_ / "gt.json"), "--quiet"]) == 0
    )
    assert list(summary_of(out_shards)["unreadable"]) == [bad_name]
    assert (out_shards / "a.json").read_bytes() == (out / "a.json").read_bytes()
    # repaired, the image is processed on the next run and the output is complete
    assert run(slice_, out) == 0
    summary = summary_of(out)
    assert summary["unreadable"] == {} and summary["models"]["a"]["processed_this_run"] == 1
    assert (out / "a.json").read_bytes() == (replay_run / "a.json").read_bytes()


def test_images_read_with_a_warning_are_listed_in_the_summary_as_fuse_lists_them(slice_, replay_run, tmp_path,
                                                                                  capsys, with_orientation_tag):
    """cache logged what reading an image warned of (an orientation tag not applied, a JPEG decoded in part),
    which scrolled by, and on Ray stayed in the actors' logs; fuse's summary lists such images."""
    tagged = tmp_path / "tagged"
    shutil.copytree(slice_ / "images", tagged)
    name = load_coco_gt(slice_ / "gt.json").file_name(gt_ids(slice_)[1])
    (tagged / name).write_bytes(with_orientation_tag((tagged / name).read_bytes(), 6))
    out = tmp_path / "o"
    assert cache_cli.main(["--config", str(slice_ / "replay.yaml"), "--images", str(tagged), "--gt",
                           str(slice_ / "gt.json"), "--out", str(out)]) == 0
    summary = summary_of(out)
    (warning,) = summary["read_warnings"][name]
    assert warning.startswith("its EXIF orientation tag (6: viewers show it turned 90° clockwise) is not applied")
    assert list(summary["read_warnings"]) == [name] and summary["models"]["a"]["read_warnings"] == {name: [warning]}
    assert f"read with a warning: {name}: {warning}" in capsys.readouterr().out
    assert (out / "a.json").read_bytes() == (replay_run / "a.json").read_bytes()  # read all the same
    assert run(slice_, out, images=tagged) == 0  # nothing left to do: still listed
    assert summary_of(out)["read_warnings"] == {name: [warning]}
    shards = tmp_path / "shards"
    for index in range(2):
        assert run(slice_, shards, "--shard", f"{index}/2", images=tagged) == 0
    assert cache_cli.main(["merge", "--out", str(shards), "--gt", str(slice_ / "gt.json"), "--quiet"]) == 0
    assert summary_of(shards)["read_warnings"] == {name: [warning]}


def test_a_run_that_reads_no_image_ends_with_an_error_after_its_summary(slice_, tmp_path, capfd):
    broken = tmp_path / "broken"
    broken.mkdir()
    for image in (slice_ / "images").iterdir():
        (broken / image.name).write_bytes(b"not a jpeg" * 10)
    out = tmp_path / "o"
    assert run(slice_, out, images=broken) == 2
    err = capfd.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err, err
    assert f"no image could be read ({NUM_IMAGES} unreadable, listed in {out / 'cache_summary.json'})" in err
    summary = summary_of(out)
    assert len(summary["unreadable"]) == NUM_IMAGES and summary["models"]["a"]["images"] == 0
    # one image repaired: the run did its work, the others stay reported
    shutil.copy(slice_ / "images" / sorted(summary["unreadable"])[0], broken)
    assert run(slice_, out, images=broken) == 0
    assert len(summary_of(out)["unreadable"]) == NUM_IMAGES - 1


def test_an_image_that_is_a_pipe_is_skipped_and_reported_not_waited_on(slice_, tmp_path, named_pipe):
    images = tmp_path / "images"
    shutil.copytree(slice_ / "images", images)
    bad_name = load_coco_gt(slice_ / "gt.json").file_name(gt_ids(slice_)[0])
    (images / bad_name).unlink()
    named_pipe(images / bad_name)
    out = tmp_path / "out"
    assert run(slice_, out, images=images) == 0
    summary = summary_of(out)
    assert summary["unreadable"] == {bad_name: f"cannot read image '{images / bad_name}': it is not a regular file "
                                               "(a pipe)"}
    assert summary["models"]["a"]["status"] == "complete" and summary["models"]["a"]["images"] == NUM_IMAGES - 1


def test_unreadable_images_stay_listed_and_are_left_out_of_evaluation(slice_, replay_run, tmp_path):
    """An image one member could not read is left out for every member, until a run reads it."""
    ids = gt_ids(slice_)
    gt = load_coco_gt(slice_ / "gt.json")
    broken = slice_ / "images_broken_later"
    bad_name = images_with_the_first_broken(slice_, broken)
    out = slice_ / "replay_left_out"
    assert run(slice_, out, "--models", "a") == 0  # a reads every image; the file breaks before b runs
    assert run(slice_, out, "--models", "b", images=broken) == 0
    summary = summary_of(out)
    assert summary["models"]["a"]["unreadable"] == {} and list(summary["models"]["b"]["unreadable"]) == [bad_name]
    predictions = EnsemblePredictions.from_folder(out, gt)
    assert [image.image_id for image in predictions.left_out] == [ids[0]]
    assert list(predictions.left_out[0].unreadable_by) == ["b"] and predictions.gt.image_ids == ids[1:]
    assert EnsemblePredictions.from_folder(out, gt, models=["a"]).left_out == []

    from detens.cli import evaluate as evaluate_cli
    from detens.report.record import EvaluationRecord

    report = tmp_path / "report.json"
    assert evaluate_cli.main(["--gt", str(slice_ / "gt.json"), "--predictions", str(out), "--methods", "mean",
                              "--cv", "2", "--backend", "faster", "--out", str(report), "--quiet"]) == 0
    record = EvaluationRecord.load(report)
    assert record.image_ids == ids[1:] and [image["image_id"] for image in record.meta["left_out"]] == [ids[0]]

    # a run that does not get to the image (here: no new image at all) keeps it listed: b.json still lacks it
    assert run(slice_, out, "--models", "b", "--max-images", "0", images=broken) == 0
    assert list(summary_of(out)["models"]["b"]["unreadable"]) == [bad_name]
    assert summary_of(out)["models"]["b"]["status"] == "complete"
    assert [image.image_id for image in EnsemblePredictions.from_folder(out, gt).left_out] == [ids[0]]
    # repaired, it is read, no longer listed and no longer left out
    assert run(slice_, out, "--models", "b") == 0
    assert summary_of(out)["models"]["b"]["unreadable"] == {}
    assert EnsemblePredictions.from_folder(out, gt).left_out == []
    assert (out / "b.json").read_bytes() == (replay_run / "b.json").read_bytes()


def test_ground_truth_with_images_the_cache_never_ran_on_is_refused(slice_, replay_run, tmp_path, capsys):
    """A cache of some images scored against an annotation file of more: those would count as images where
    every model found nothing (a silently wrong mAP)."""
    ids = gt_ids(slice_)
    assert summary_of(replay_run)["image_ids"] == ids
    full = json.loads((slice_ / "gt.json").read_text())
    extra = {**full["images"][0], "id": max(ids) + 1, "file_name": "never_cached.jpg"}
    bigger = {**full, "images": [*full["images"], extra],
              "annotations": [*full["annotations"], {**full["annotations"][0], "id": 10**6, "image_id": extra["id"]}]}
    (tmp_path / "bigger.json").write_text(json.dumps(bigger))
    with pytest.raises(ValueError, match=rf"1 of the {len(ids) + 1} images of the ground truth were never run by the "
                                         rf"cache in .*: {extra['id']}; every model would count as finding nothing there"):
        EnsemblePredictions.from_folder(replay_run, load_coco_gt(tmp_path / "bigger.json"))

    from detens.cli import evaluate as evaluate_cli

    code = evaluate_cli.main(["--gt", str(tmp_path / "bigger.json"), "--predictions", str(replay_run), "--methods",
                              "mean", "--cv", "2", "--out", str(tmp_path / "r.json"), "--quiet"])
    refused(capsys, code, "never run by the cache")
    # a summary of an older version, without the list, is not checked
    summary = summary_of(replay_run)
    older = tmp_path / "older"
    shutil.copytree(replay_run, older)
    del summary["image_ids"]
    (older / "cache_summary.json").write_text(json.dumps(summary))
    assert EnsemblePredictions.from_folder(older, load_coco_gt(tmp_path / "bigger.json")).gt.image_ids[-1] == extra["id"]


def test_ground_truth_of_some_of_the_cached_images_scores_those(slice_, replay_run, tmp_path, capsys, caplog):
    """An annotation file of a subset of the images the cache ran on (its summary lists them): their predictions
    are taken and the others' left out, where a folder without the list refuses them."""
    ids = gt_ids(slice_)
    subset = shard_gt(slice_, tmp_path, 2)
    with caplog.at_level(logging.INFO, logger="detens.predictions"):
        predictions = EnsemblePredictions.from_folder(replay_run, load_coco_gt(subset))
    assert predictions.gt.image_ids == ids[:2] and predictions.image_ids == ids[:2]
    whole = EnsemblePredictions.from_folder(replay_run, load_coco_gt(slice_ / "gt.json"))
    for image_id in ids[:2]:
        for part, full in zip(predictions.per_model(image_id), whole.per_model(image_id), strict=True):
            assert torch.equal(part.boxes, full.boxes) and torch.equal(part.scores, full.scores)
    assert f"the ground truth has 2 of the {len(ids)} images the cache ran on" in caplog.text

    from detens.cli import evaluate as evaluate_cli

    code = evaluate_cli.main(["--gt", str(subset), "--predictions", str(replay_run), "--methods", "mean", "--cv", "2",
                              "--out", str(tmp_path / "r.json"), "--quiet"])
    assert code == 0, capsys.readouterr().err
    assert "mean" in json.loads((tmp_path / "r.json").read_text())
    summary = summary_of(replay_run)
    older = tmp_path / "older"
    shutil.copytree(replay_run, older)
    del summary["image_ids"]
    (older / "cache_summary.json").write_text(json.dumps(summary))
    first = shard_gt(slice_, tmp_path, 1)  # the cache's last image has no boxes: the second has
    assert EnsemblePredictions.from_folder(replay_run, load_coco_gt(first)).image_ids == ids[:1]
    with pytest.raises(ValueError, match=r"refer to 1 image ids that are not in the ground truth"):
        EnsemblePredictions.from_folder(older, load_coco_gt(first))


def test_ground_truth_whose_ids_name_other_classes_than_the_cache_is_refused(slice_, replay_run, tmp_path, capsys):
    """The same images annotated in another label space (COCO's ids where the cache ran on a dataset's own,
    or the other way round): the members' labels would be scored as other classes (a silently wrong mAP)."""
    full = json.loads((slice_ / "gt.json").read_text())
    assert summary_of(replay_run)["categories"] == sorted(
        ({"id": c["id"], "name": c["name"]} for c in full["categories"]), key=lambda c: c["id"])
    renamed = {**full, "categories": [{**c, "name": {1: "pedestrian", 3: "automobile"}.get(c["id"], c["name"])}
                                      for c in full["categories"]]}
    (tmp_path / "renamed.json").write_text(json.dumps(renamed))
    with pytest.raises(ValueError, match=r"^the ground truth's category ids name other classes than those of the "
                                         r"annotation file the cache in .* ran on \(.*gt\.json\): 1 is 'pedestrian' "
                                         r"in the ground truth but 'person' in the cache, 3 is 'automobile' in the ground truth but 'car' in the "
                                         r"cache; the members' labels were mapped onto that file's ids"):
        EnsemblePredictions.from_folder(replay_run, load_coco_gt(tmp_path / "renamed.json"))

    from detens.cli import evaluate as evaluate_cli
    from detens.cli import train as train_cli

    code = evaluate_cli.main(["--gt", str(tmp_path / "renamed.json"), "--predictions", str(replay_run), "--methods",
                              "mean", "--cv", "2", "--out", str(tmp_path / "r.json"), "--quiet"])
    refused(capsys, code, "1 is 'pedestrian' in the ground truth but 'person' in the cache")
    code = train_cli.main(["--gt", str(tmp_path / "renamed.json"), "--predictions", str(replay_run), "--head", "theta",
                           "--out", str(tmp_path / "h.json"), "--quiet"])
    refused(capsys, code, "1 is 'pedestrian' in the ground truth but 'person' in the cache")
    # names spelled otherwise are one class; a summary of an older version, without them, is not checked
    respelled = {**full, "categories": [{**c, "name": c["name"].upper().replace(" ", "_")} for c in full["categories"]]}
    (tmp_path / "respelled.json").write_text(json.dumps(respelled))
    assert EnsemblePredictions.from_folder(replay_run, load_coco_gt(tmp_path / "respelled.json")).model_names
    summary = summary_of(replay_run)
    older = tmp_path / "older"
    shutil.copytree(replay_run, older)
    del summary["categories"]
    (older / "cache_summary.json").write_text(json.dumps(summary))
    assert EnsemblePredictions.from_folder(older, load_coco_gt(tmp_path / "renamed.json")).model_names


def test_an_unfinished_cache_is_named_as_such_when_it_holds_no_results_yet(slice_, tmp_path, capsys):
    out = tmp_path / "unfinished"
    assert run(slice_, out, "--models", "a", "--max-images", "1") == 0
    assert summary_of(out)["stopped_by"] == "max_images"
    with pytest.raises(ValueError, match=rf"the cache in {re.escape(str(out))} is not finished \(a \({NUM_IMAGES - 1} "
                                         r"images left\)\): run the same detens cache command again to finish it"):
        EnsemblePredictions.from_folder(out, load_coco_gt(slice_ / "gt.json"))

    from detens.cli import evaluate as evaluate_cli

    code = evaluate_cli.main(["--gt", str(slice_ / "gt.json"), "--predictions", str(out), "--methods", "mean",
                              "--cv", "2", "--out", str(tmp_path / "r.json"), "--quiet"])
    refused(capsys, code, "is not finished")


def test_a_cache_stopped_after_some_members_is_not_taken_for_an_ensemble_of_those(slice_, tmp_path, capsys):
    """evaluate and train took the finished members for the whole ensemble without a word: a cache of three
    stopped during its third was scored, and a head fitted, as an ensemble of two."""
    from detens.cli import evaluate as evaluate_cli

    gt = load_coco_gt(slice_ / "gt.json")
    out = tmp_path / "stopped"
    assert run(slice_, out, "--models", "a") == 0
    assert run(slice_, out, "--models", "b", "--max-images", "2") == 0  # as a Ctrl-C leaves it, a summary said so
    with pytest.raises(ValueError, match=rf"^the cache in {re.escape(str(out))} is not finished \(b \({NUM_IMAGES - 2} "
                                         r"images left\)\): run the same detens cache command again to finish it, or "
                                         r"name the finished members to use them alone$"):
        EnsemblePredictions.from_folder(out, gt)
    assert EnsemblePredictions.from_folder(out, gt, models=["a"]).model_names == ["a"]  # named: taken
    code = evaluate_cli.main(["--gt", str(slice_ / "gt.json"), "--predictions", str(out), "--methods", "mean",
                              "--cv", "2", "--out", str(tmp_path / "r.json"), "--quiet"])
    refused(capsys, code, "is not finished")
    # killed before any summary: the finished images kept for the member tell the same
    (out / "cache_summary.json").unlink()
    with pytest.raises(ValueError, match=r"is not finished \(b \(2 images done\)\)"):
        EnsemblePredictions.from_folder(out, gt)


def refused(capsys, code, pattern):
    """A user's mistake: exit status 2 and one ``error:`` line matching ``pattern``."""
    err = capsys.readouterr().err
    assert code == 2 and re.search(pattern, err, re.S), err
    assert err.count("error:") == 1 and "Traceback" not in err


def test_changed_settings_are_refused_unless_overwrite(slice_, replay_run, capsys):
    out = slice_ / "replay_settings"
    assert run(slice_, out, "--models", "b") == 0
    code = run(slice_, out, "--models", "b", "--conf", "0.4")
    refused(capsys, code, r"other settings \(conf: 0.001 -> 0.4\).*--overwrite")
    assert yaml.safe_load((out / "config.yaml").read_text())["conf"] == 0.001  # a refused run changes nothing
    assert run(slice_, out, "--models", "b", "--conf", "0.4", "--overwrite") == 0
    b = json.loads((out / "b.json").read_text())
    assert len(b) == NUM_IMAGES - 1 and all(r["score"] >= 0.4 for r in b)
    assert summary_of(out)["models"]["b"]["settings"]["conf"] == 0.4
    assert yaml.safe_load((out / "config.yaml").read_text())["conf"] == 0.4


def test_results_without_their_recorded_settings_are_not_resumed_under_any(slice_, replay_run, tmp_path, capsys):
    """A member's partial folder without its settings file (removed, or rebuilt by a run that went on writing
    after its --out was deleted) holds results of settings nothing records: resumed, they were taken for
    results of any settings given."""
    out = tmp_path / "out"
    shutil.copytree(replay_run, out)
    (out / ".partial" / "b" / "_settings.json").unlink()
    before = (out / "b.json").read_bytes()
    for extra in ((), ("--conf", "0.4")):  # the run's own settings may or may not be the lost ones
        refused(capsys, run(slice_, out, "--models", "b", *extra),
                rf"^error: {re.escape(str(out / '.partial' / 'b'))} holds results of 'b' made with other settings "
                r"\(unknown: its _settings\.json is missing\); use another --out, or --overwrite to discard them\n$")
    assert (out / "b.json").read_bytes() == before and not (out / ".partial" / "b" / "_settings.json").exists()
    assert run(slice_, out, "--models", "b", "--conf", "0.4", "--overwrite") == 0
    assert summary_of(out)["models"]["b"]["processed_this_run"] == NUM_IMAGES
    assert all(r["score"] >= 0.4 for r in json.loads((out / "b.json").read_text()))
    # a member folder left empty holds nothing to resume: a fresh start
    shutil.rmtree(out / ".partial" / "a")
    (out / ".partial" / "a").mkdir()
    assert run(slice_, out, "--models", "a") == 0
    assert summary_of(out)["models"]["a"]["processed_this_run"] == NUM_IMAGES


def test_settings_a_member_never_reads_do_not_refuse_a_resume(slice_, tmp_path):
    """Saved predictions are not made again at another --imgsz or --iou: those settings are not theirs."""
    out = tmp_path / "unread"
    assert run(slice_, out, "--models", "b") == 0
    settings_path = out / ".partial" / "b" / "_settings.json"
    saved = json.loads(settings_path.read_text())
    assert "imgsz" not in saved and "iou" not in saved and saved["conf"] == 0.001
    assert run(slice_, out, "--models", "b", "--imgsz", "320", "--iou", "0.5") == 0
    assert summary_of(out)["models"]["b"]["resumed"] == NUM_IMAGES
    # a cache of an earlier version recorded them: it resumes too
    settings_path.write_text(json.dumps({**saved, "imgsz": 640, "iou": 0.7}))
    assert run(slice_, out, "--models", "b", "--imgsz", "320") == 0
    assert summary_of(out)["models"]["b"]["resumed"] == NUM_IMAGES


def test_bad_arguments(slice_, tmp_path, capsys):
    refused(capsys, run(slice_, tmp_path / "x", "--models", " , "), r"--models ' , ' names no member")
    refused(capsys, run(slice_, tmp_path / "x", "--models", "c"), r"--models 'c' matches no member; the members are a, b")
    refused(capsys, run(slice_, tmp_path / "x", "--models", "a,aa"), r"matches no member.*Did you mean 'a'")
    refused(capsys, run(slice_, tmp_path / "x", "--shard", "2/2"), r"--shard i/n needs")
    refused(capsys, run(slice_, tmp_path / "x", "--engine", "ray", "--gpus-per-actor", "-1"),
            r"--gpus-per-actor must be >= 0, got -1 \(see")
    refused(capsys, run(slice_, tmp_path / "x", images=tmp_path), "none of the 3 images")


def test_overwrite_of_one_shard_discards_the_other_shards_results_of_other_settings(slice_):
    out = slice_ / "replay_shard_overwrite"
    for index in (0, 1):
        assert run(slice_, out, "--models", "b", "--shard", f"{index}/2") == 0
    assert run(slice_, out, "--models", "b", "--shard", "0/2", "--conf", "0.4", "--overwrite") == 0
    # shard 1's partial results were made at conf 0.001: they must be detected again, not reused
    assert run(slice_, out, "--models", "b", "--shard", "1/2", "--conf", "0.4") == 0
    shard1 = summary_of(out, "shards/cache_summary.shard-1-of-2.json")["models"]["b"]
    assert shard1["processed_this_run"] == len(gt_ids(slice_)[1::2])
    assert cache_cli.main(["merge", "--out", str(out), "--quiet"]) == 0
    b = json.loads((out / "b.json").read_text())
    assert b and all(r["score"] >= 0.4 for r in b)


def test_a_refused_run_records_no_settings_of_the_members_checked_before(slice_, capsys):
    out = slice_ / "replay_refused_first"
    assert run(slice_, out, "--models", "b") == 0
    refused(capsys, run(slice_, out, "--conf", "0.4"), r"'b' made with other settings")
    assert not (out / ".partial" / "a" / "_settings.json").exists()
    assert run(slice_, out) == 0  # the settings of the earlier run: accepted


def test_settings_recorded_by_a_run_that_failed_before_any_result_do_not_refuse_the_corrected_run(
        slice_, monkeypatch, capsys):
    """A run that fails before its first result (a class map that maps nothing, found only as the model
    loads) has recorded every member's settings and no result: the run with the mistake mended has nothing
    to lose to them."""
    out = slice_ / "replay_failed_at_load"

    def unmapped(*args, **kwargs):
        raise ValueError("none of the model's classes matches a category name of the label space")

    monkeypatch.setattr(cache_tool, "detect_loaded", unmapped)
    refused(capsys, run(slice_, out), "none of the model's classes matches")
    assert (out / ".partial" / "a" / "_settings.json").is_file()
    monkeypatch.undo()
    assert run(slice_, out, "--conf", "0.4") == 0  # other settings, as a mended config has
    assert json.loads((out / ".partial" / "a" / "_settings.json").read_text())["conf"] == 0.4
    # once results exist, their settings are kept from a run with others
    refused(capsys, run(slice_, out), r"'a' made with other settings \(conf: 0.4 -> 0.001\)")


def test_saved_predictions_rewritten_in_place_are_refused(slice_, tmp_path, capsys):
    root = tmp_path / "root"
    shutil.copytree(slice_, root, ignore=shutil.ignore_patterns("real_*", "replay_*"))
    replay = yaml.safe_load((root / "replay.yaml").read_text())
    for model in replay["models"]:
        model["results"] = str(root / Path(model["results"]).name)
    (root / "replay.yaml").write_text(yaml.safe_dump(replay))
    out = tmp_path / "out"
    assert run(root, out, "--models", "b", "--max-images", "1") == 0
    saved = json.loads((root / "saved_b.json").read_text())
    (root / "saved_b.json").write_text(json.dumps([{**r, "score": 0.9} for r in saved]))
    refused(capsys, run(root, out, "--models", "b"), r"saved_b\.json changed since the earlier run.*--overwrite")
    assert run(root, out, "--models", "b", "--overwrite") == 0
    assert {r["score"] for r in json.loads((out / "b.json").read_text())} == {0.9}


def test_overwrite_that_fails_before_its_first_result_keeps_the_earlier_results(slice_, monkeypatch):
    out = slice_ / "replay_overwrite_fails"
    assert run(slice_, out, "--models", "b") == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def fail(*args, **kwargs):
        raise RuntimeError("the device is gone")

    monkeypatch.setattr(cache_tool, "detect_loaded", fail)
    with pytest.raises(RuntimeError, match="device is gone"):
        run(slice_, out, "--models", "b", "--conf", "0.4", "--overwrite")
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before


def test_a_crash_in_a_later_member_keeps_the_summary_of_the_earlier_ones(slice_, tmp_path, monkeypatch):
    broken = tmp_path / "images"
    bad_name = images_with_the_first_broken(slice_, broken)
    real_detect = cache_tool.detect_loaded

    def fail_on_b(member, *args, **kwargs):
        if member.name == "b":
            raise RuntimeError("out of memory")
        return real_detect(member, *args, **kwargs)

    monkeypatch.setattr(cache_tool, "detect_loaded", fail_on_b)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="out of memory"):  # the run's own error, not one of the summary
        run(slice_, out, images=broken)
    summary = summary_of(out)
    assert summary["stopped_by"] == "error: RuntimeError: out of memory"
    assert summary["models"]["a"]["status"] == "complete" and list(summary["unreadable"]) == [bad_name]
    assert summary["models"]["b"]["status"] == "incomplete"


def test_a_member_whose_results_file_cannot_be_written_is_summarized_as_not_finished(slice_, tmp_path, monkeypatch,
                                                                                     capsys):
    """The summary of the stopped run is written still, with the earlier member finished: writing the failed
    member's file again for the summary failed again, and lost it for every member."""
    import errno

    save = cache_tool.save_coco_results

    def full_disk_for_b(results, path):
        if Path(path).name == "b.json":
            raise OSError(errno.EFBIG, "File too large", str(path))
        return save(results, path)

    monkeypatch.setattr(cache_tool, "save_coco_results", full_disk_for_b)
    out = tmp_path / "out"
    refused(capsys, run(slice_, out), rf"^error: \[Errno 27\] File too large: '?{re.escape(str(out / 'b.json'))}'?\n$")
    summary = summary_of(out)
    assert summary["stopped_by"] == f"error: OSError: [Errno 27] File too large: '{out / 'b.json'}'"
    assert summary["models"]["a"]["status"] == "complete" and (out / "a.json").is_file()
    b = summary["models"]["b"]
    assert (b["status"], b["output"], b["images"], b["images_left"]) == ("incomplete", None, NUM_IMAGES, 0)
    assert not (out / "b.json").exists()
    monkeypatch.undo()
    assert run(slice_, out) == 0  # resumed, and finished
    summary = summary_of(out)
    assert summary["stopped_by"] is None and summary["models"]["b"]["status"] == "complete"
    assert summary["models"]["b"]["resumed"] == NUM_IMAGES and (out / "b.json").is_file()


@pytest.mark.parametrize("model, named", [
    ({"name": ".hidden"}, "model name '.hidden'"),
    ({"name": "up\\escaped"}, r"model name 'up\\\\escaped'"),
    ({"results_file": ".hidden.json"}, "member name '.hidden'"),  # a name taken from the results file
    ({"results_file": "tab\there.json"}, r"member name 'tab\\there'"),
    ({"name": "v8,a"}, "model name 'v8,a'"),  # --models could never choose it: commas separate its names
])
def test_a_member_name_that_cannot_name_its_files_is_refused(slice_, tmp_path, capsys, model, named):
    results = tmp_path / model.pop("results_file", "saved.json")
    shutil.copy(slice_ / "saved_b.json", results)
    config = tmp_path / "names.yaml"
    config.write_text(yaml.safe_dump({"name": "names", "models": [{"type": "precomputed", "results": str(results),
                                                                   **model}]}))
    out = tmp_path / "out"
    refused(capsys, run(slice_, out, config=str(config)), rf"{named} cannot name the member's files")
    assert not out.exists() or not any(out.rglob("*.json"))


def test_saved_predictions_are_checked_before_any_model_loads(slice_, tmp_path, capsys):
    ids = gt_ids(slice_)
    saved = json.loads((slice_ / "saved_b.json").read_text())
    (tmp_path / "badcat.json").write_text(json.dumps([*saved, {**saved[0], "category_id": 999}]))
    gt = json.loads((slice_ / "gt.json").read_text())
    gt["images"] = [im for im in gt["images"] if im["id"] != ids[-1]]
    (tmp_path / "fewer.json").write_text(json.dumps(gt))
    for name, model in {
        "badcat": {"results": str(tmp_path / "badcat.json")},
        "fewer": {"results": str(slice_ / "saved_b.json"), "images": str(tmp_path / "fewer.json")},
    }.items():
        config = {"name": name, "models": [{"type": "precomputed", "name": "b", **model}]}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    refused(capsys, run(slice_, out, config=str(tmp_path / "badcat.yaml")), r"badcat\.json.*999")
    refused(capsys, run(slice_, out, config=str(tmp_path / "fewer.yaml")), r"1 of the 3 images have no saved predictions in member 'b'")
    assert not out.exists() or not any(out.rglob("*.json"))


def test_a_class_map_outside_the_label_space_is_refused_before_any_model_loads(slice_, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cache_tool, "build_detector", lambda *a, **k: pytest.fail("a model loaded for nothing"))
    config = {"name": "cm", "models": [{"weights": str(YOLO26N), "name": "v26", "class_map": {0: 1, 5: 999}}]}
    (tmp_path / "cm.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    refused(capsys, run(slice_, out, config=str(tmp_path / "cm.yaml")),
            r"model 'v26': class_map\[5\] = 999 is not one of the 80 category ids of the dataset .*gt\.json")
    assert not out.exists() or not any(out.rglob("*.json"))


def test_a_dataset_in_another_label_space_than_the_gt_is_refused_before_any_model_loads(slice_, tmp_path, capsys,
                                                                                        monkeypatch):
    """The members' labels are mapped onto the config's dataset, the summary records --gt's categories: a
    --gt whose ids name other classes would have the members' boxes scored as those, unsaid."""
    full = json.loads((slice_ / "gt.json").read_text())
    swapped = {1: "car", 3: "person"}
    datasets = {
        "swapped": [{**c, "name": swapped.get(c["id"], c["name"])} for c in full["categories"]],
        "fewer": [c for c in full["categories"] if c["id"] != 90],
        "more": [*full["categories"], {"id": 91, "name": "pedestrian"}],
        "respelled": [{**c, "name": c["name"].upper().replace(" ", "_")} for c in full["categories"]],
    }
    for name, categories in datasets.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({**full, "categories": categories}))
        replay = yaml.safe_load((slice_ / "replay.yaml").read_text())
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({**replay, "dataset": str(tmp_path / f"{name}.json")}))
    out = tmp_path / "out"
    with monkeypatch.context() as patched:
        patched.setattr(cache_tool, "build_detector", lambda *a, **k: pytest.fail("a model loaded for nothing"))
        refused(capsys, run(slice_, out, config=str(tmp_path / "swapped.yaml")),
                r"--gt .*gt\.json is in another label space than the config's dataset .*swapped\.json: category id "
                r"1 is 'car' in the dataset but 'person' in --gt; 3 is 'person' in the dataset but 'car' in --gt; "
                r"the members' labels are mapped onto the dataset's ids .*: give --gt an annotation file of the "
                r"dataset's categories, or set the config's dataset: to --gt's")
        refused(capsys, run(slice_, out, config=str(tmp_path / "fewer.yaml")),
                r"category id 90 is no category in the dataset but 'toothbrush' in --gt;")
        refused(capsys, run(slice_, out, config=str(tmp_path / "more.yaml")),
                r"category id 91 is 'pedestrian' in the dataset and no category in --gt;")
    assert not out.exists() or not any(out.rglob("*.json"))
    # names spelled otherwise are the same classes, as the class maps read them
    assert run(slice_, out, config=str(tmp_path / "respelled.yaml")) == 0
    assert summary_of(out)["models"]["a"]["status"] == "complete"


def test_class_maps_that_disagree_are_warned_of_before_any_model_loads(slice_, tmp_path, capfd, monkeypatch):
    def not_loaded(*args, **kwargs):
        raise ValueError("no model loads in this test")

    monkeypatch.setattr(cache_tool, "build_detector", not_loaded)
    config = {"name": "apart", "models": [
        {"weights": str(YOLO26N), "name": "v26", "class_map": {"person": 1, "car": 3}},
        {"weights": str(YOLO26N), "name": "v26b", "class_map": {"person": 1, "car": 8}},
    ]}
    (tmp_path / "apart.yaml").write_text(yaml.safe_dump(config))
    capfd.readouterr()
    assert run(slice_, tmp_path / "out", config=str(tmp_path / "apart.yaml")) == 2
    err = capfd.readouterr().err
    assert "the members' class_maps map a class onto different ids: 'car' onto 3 (v26) and 8 (v26b)" in err, err
    assert err.index("onto different ids") < err.index("no model loads in this test")


# ---------------------------------------------------------------------------------------- weights digests
def weights_config(root: Path, *models: dict) -> str:
    """An ensemble YAML of ``models`` (``type: ultralytics`` unless given) in ``root``; returns its path."""
    config = {"name": "weights", "models": [{"type": "ultralytics", **model} for model in models]}
    (root / "weights.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return str(root / "weights.yaml")


def test_weights_found_nowhere_are_refused_naming_the_yaml_and_the_member(slice_, tmp_path, capsys):
    config = weights_config(tmp_path, {"weights": "nope/yolov8n.pt", "name": "a"})
    code = run(slice_, tmp_path / "out", config=config)
    refused(capsys, code, rf"^error: {re.escape(config)}: model 'a': weights 'nope/yolov8n.pt' not found \(looked at: ")


def saved_settings(out: Path, member: str) -> dict:
    return json.loads((out / ".partial" / member / "_settings.json").read_text())


@pytest.mark.slow
def test_weights_rewritten_in_place_are_refused_unless_overwrite(slice_, tmp_path, capsys):
    """A model re-exported over the old file: resuming would mix the two models' results."""
    weights = tmp_path / "yolo26n.tflite"
    shutil.copy(YOLO26N, weights)
    config = weights_config(tmp_path, {"weights": str(weights), "name": "yolo"})
    out = tmp_path / "out"
    assert run(slice_, out, "--max-images", "1", config=config) == 0
    first = gt_ids(slice_)[0]
    assert (out / ".partial" / "yolo" / f"{first}.json").is_file()
    shutil.copy(YOLO26N.parents[1] / "yolov8n_int8_tflite" / "yolov8n_int8.tflite", weights)  # another model
    code = run(slice_, out, config=config)
    refused(capsys, code, rf"weights {re.escape(repr(str(weights)))} of 'yolo' are not the file the earlier run in ")
    assert (out / ".partial" / "yolo" / f"{first}.json").is_file()  # a refused run changes nothing
    # --overwrite discards the old model's results (--max-images 0: without loading the new one)
    assert run(slice_, out, "--overwrite", "--max-images", "0", config=config) == 0
    assert not (out / ".partial" / "yolo" / f"{first}.json").exists()
    assert saved_settings(out, "yolo")["inputs"] == {str(weights): path_digest(weights)}


def test_other_weights_are_named_by_their_key_not_by_the_digests_of_the_files_no_longer_read(
        slice_, tmp_path, capsys):
    """The earlier file's digest is recorded and the new file's is not compared: shown, the digests read as if the
    new weights had none. The weights key says what changed."""
    first, second = tmp_path / "first.pt", tmp_path / "second.pt"
    first.write_bytes(b"an export")
    second.write_bytes(b"another export")
    out = tmp_path / "out"
    assert run(slice_, out, "--max-images", "0", config=weights_config(tmp_path, {"weights": str(first), "name": "yolo"})) == 0
    finish_one_image(slice_, out, "yolo")
    code = run(slice_, out, "--max-images", "0", config=weights_config(tmp_path, {"weights": str(second), "name": "yolo"}))
    refused(capsys, code, rf"'yolo' made with other settings \(weights: {re.escape(repr(str(first)))} -> "
                          rf"{re.escape(repr(str(second)))}\); use another --out, or --overwrite to discard them$")


def test_input_files_alone_changed_are_named_file_by_file():
    saved = {"type": "precomputed", "results": "r.json", "conf": 0.001,
             "inputs": {"r.json": "1111", "images.json": "2222"}}
    assert (cache_tool.settings_difference(saved, {**saved, "inputs": {"r.json": "1111"}})
            == "inputs: 'images.json' (sha256 2222) no longer read")
    assert (cache_tool.settings_difference(saved, {**saved, "conf": 0.4, "inputs": {"r.json": "1111"}})
            == "conf: 0.001 -> 0.4, inputs: 'images.json' (sha256 2222) no longer read")
    # another results file: its key says what changed (the new file's digest is not compared, only recorded)
    assert (cache_tool.settings_difference(saved, {**saved, "results": "s.json", "inputs": {}})
            == "results: 'r.json' -> 's.json'")


def finish_one_image(root: Path, out: Path, member: str) -> None:
    """What a run leaves that detected ``member`` on one image (its partial record): results whose settings
    and input files a later run must not mix with others. The weights of these tests are no models."""
    image_id = gt_ids(root)[0]
    record = {"image_id": image_id, "file_name": load_coco_gt(root / "gt.json").file_name(image_id), "results": [],
              "ms": 1.0}
    (out / ".partial" / member / f"{image_id}.json").write_text(json.dumps(record))


def test_a_weights_folder_changed_in_place_is_refused(slice_, tmp_path, capsys):
    """An export folder (OpenVINO) counts by all its files and their names."""
    folder = tmp_path / "model_openvino_model"
    folder.mkdir()
    for name in ("model.xml", "model.bin", "metadata.yaml"):
        (folder / name).write_text(f"{name} of the first export")
    config = weights_config(tmp_path, {"weights": str(folder), "name": "vino"})
    out = tmp_path / "out"
    assert run(slice_, out, "--max-images", "0", config=config) == 0  # records the settings, loads nothing
    assert saved_settings(out, "vino")["inputs"] == {str(folder): path_digest(folder)}
    finish_one_image(slice_, out, "vino")
    (folder / "model.bin").write_text("model.bin of the second export")
    code = run(slice_, out, "--max-images", "0", config=config)
    refused(capsys, code, r"model_openvino_model' of 'vino' are not the file the earlier run in")
    assert run(slice_, out, "--max-images", "0", "--overwrite", config=config) == 0
    assert run(slice_, out, "--max-images", "0", config=config) == 0  # the new content is the recorded one


def weights_folder(root: Path, content: bytes, name: str = "yolo11n.pt") -> Path:
    """A weights folder in ``root`` holding ``name`` with ``content``; returns the folder."""
    root.mkdir(parents=True)
    (root / name).write_bytes(content)
    return root


def test_weights_found_in_another_folder_must_be_the_file_the_earlier_run_used(
    slice_, tmp_path, monkeypatch, capsys
):
    """The same name in another $DETENS_WEIGHTS folder: the same file resumes, another one is refused."""
    monkeypatch.chdir(tmp_path)
    config = weights_config(tmp_path, {"weights": "yolo11n.pt", "name": "yolo"})
    out = tmp_path / "out"
    first = weights_folder(tmp_path / "first", b"an export")
    monkeypatch.setenv("DETENS_WEIGHTS", str(first))
    assert run(slice_, out, "--max-images", "0", config=config) == 0
    finish_one_image(slice_, out, "yolo")
    digest = path_digest(first / "yolo11n.pt")
    assert saved_settings(out, "yolo")["inputs"] == {"yolo11n.pt": digest}
    monkeypatch.setenv("DETENS_WEIGHTS", str(weights_folder(tmp_path / "copy", b"an export")))
    assert run(slice_, out, "--max-images", "0", config=config) == 0
    other = weights_folder(tmp_path / "other", b"another export")
    monkeypatch.setenv("DETENS_WEIGHTS", str(other))
    code = run(slice_, out, "--max-images", "0", config=config)
    refused(
        capsys,
        code,
        rf"the weights 'yolo11n.pt' of 'yolo' are not the file the earlier run in {re.escape(str(out))} used: "
        rf"they are now {re.escape(str(other / 'yolo11n.pt'))} .*--overwrite",
    )
    assert run(slice_, out, "--max-images", "0", "--overwrite", config=config) == 0
    assert saved_settings(out, "yolo")["inputs"] == {"yolo11n.pt": path_digest(other / "yolo11n.pt")}


def test_weights_no_longer_found_on_disk_are_refused_naming_where_it_looked(
    slice_, tmp_path, monkeypatch, capsys
):
    """A name the earlier run found on disk and that now finds no file: it would be downloaded instead."""
    monkeypatch.chdir(tmp_path)  # where Ultralytics would have saved yolo11n.pt had it downloaded it
    config = weights_config(tmp_path, {"weights": "yolo11n.pt", "name": "yolo"})
    out = tmp_path / "out"
    folder = weights_folder(tmp_path / "weights", b"an export")
    monkeypatch.setenv("DETENS_WEIGHTS", str(folder))
    assert run(slice_, out, "--max-images", "0", config=config) == 0
    finish_one_image(slice_, out, "yolo")
    monkeypatch.delenv("DETENS_WEIGHTS")
    code = run(slice_, out, "--max-images", "0", config=config)
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1 and "Traceback" not in err, err
    assert "the weights 'yolo11n.pt' of 'yolo' are no longer found on disk" in err
    assert f"the earlier run in {out} used a file of that name (sha256 " in err
    assert f"looked at: {tmp_path / 'yolo11n.pt'} (as a path beside the config file)" in err
    assert "would be downloaded" in err and "$DETENS_WEIGHTS or --weights-dir" in err and "--overwrite" in err
    assert "-> None" not in err
    monkeypatch.setenv("DETENS_WEIGHTS", str(folder))
    assert run(slice_, out, "--max-images", "0", config=config) == 0  # found again: it resumes


def test_onnx_external_data_changed_in_place_is_refused(slice_, tmp_path, capsys):
    """An ONNX model whose weights lie in an external-data file beside the .onnx: that file counts too."""
    onnx = pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.ones((1, 8), np.float32), "w")
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 8]) for n in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", io[:1], io[1:], [weights])
    model = tmp_path / "model.onnx"
    external = {"save_as_external_data": True, "location": "model.data", "size_threshold": 0}
    onnx.save_model(helper.make_model(graph), model, **external)
    config = weights_config(tmp_path, {"type": "onnx", "decoder": "yolox", "weights": str(model), "name": "ox"})
    out = tmp_path / "out"
    assert run(slice_, out, "--max-images", "0", config=config) == 0
    finish_one_image(slice_, out, "ox")
    before = model.read_bytes()
    (tmp_path / "model.data").write_bytes(np.full((1, 8), 2, np.float32).tobytes())  # retrained weights
    assert model.read_bytes() == before
    code = run(slice_, out, "--max-images", "0", config=config)
    refused(capsys, code, r"model\.onnx' of 'ox' are not the file the earlier run in .*--overwrite")


def test_folder_digest_covers_names_and_contents_not_the_place(tmp_path):
    folder = tmp_path / "a"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.xml").write_text("graph")
    (folder / "sub" / "model.bin").write_text("weights")
    digest = path_digest(folder)
    shutil.copytree(folder, tmp_path / "elsewhere")
    assert path_digest(tmp_path / "elsewhere") == digest
    (folder / "sub" / "model.bin").rename(folder / "sub" / "other.bin")
    assert path_digest(folder) != digest
    (folder / "sub" / "other.bin").rename(folder / "sub" / "model.bin")
    assert path_digest(folder) == digest
    (folder / "model.xml").write_text("graph 2")
    assert path_digest(folder) != digest
    with pytest.raises(FileNotFoundError, match="neither a file nor a folder"):
        path_digest(tmp_path / "missing")


def test_a_cache_without_weights_digests_resumes_and_records_them(slice_, tmp_path):
    """Caches written before the digests were recorded hold the weights path only: they resume."""
    weights = tmp_path / "model.pt"
    weights.write_bytes(b"an export")
    config = weights_config(tmp_path, {"weights": str(weights), "name": "w"})
    out = tmp_path / "out"
    assert run(slice_, out, "--max-images", "0", config=config) == 0
    settings_path = out / ".partial" / "w" / "_settings.json"
    settings = json.loads(settings_path.read_text())
    settings_path.write_text(json.dumps({k: v for k, v in settings.items() if k != "inputs"}))
    assert run(slice_, out, "--max-images", "0", config=config) == 0
    assert json.loads(settings_path.read_text()) == settings  # the digest of the weights as they are now


def test_weights_are_hashed_once_per_run(slice_, tmp_path, monkeypatch):
    weights = tmp_path / "model.pt"
    weights.write_bytes(b"an export")
    config = weights_config(
        tmp_path,
        {"weights": str(weights), "name": "w", "tta": ["identity", "hflip"]},
        {"weights": str(weights), "name": "w_conf", "conf": 0.25},
    )
    hashed = []
    from detens.jobs import _inputs

    real_digest = path_digest

    def counted(path):
        hashed.append(Path(path))
        return real_digest(path)

    monkeypatch.setattr(_inputs, "path_digest", counted)
    out = tmp_path / "out"
    assert run(slice_, out, "--max-images", "0", config=config) == 0
    assert hashed == [weights]
    digests = {member: saved_settings(out, member)["inputs"] for member in ("w", "w|hflip", "w_conf")}
    assert set(map(json.dumps, digests.values())) == {json.dumps({str(weights): real_digest(weights)})}


def test_members_that_read_no_weights_record_no_weights_digest(slice_, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where Ultralytics would have saved yolo11n.pt had it downloaded it
    monkeypatch.delenv("DETENS_WEIGHTS", raising=False)
    config = weights_config(
        tmp_path,
        {"type": "precomputed", "results": str(slice_ / "saved_b.json"), "name": "saved"},
        {"type": "torchvision", "arch": "fasterrcnn_resnet50_fpn", "name": "untrained"},  # no weights
        {"weights": "yolo11n.pt", "name": "upstream"},  # downloaded when online: no file to hash yet
    )
    out = tmp_path / "out"
    assert run(slice_, out, "--max-images", "0", config=config) == 0
    results = slice_ / "saved_b.json"
    assert saved_settings(out, "saved")["inputs"] == {str(results): path_digest(results)}
    assert "inputs" not in saved_settings(out, "untrained")
    assert "inputs" not in saved_settings(out, "upstream")


# ------------------------------------------------------------------------------------- saved predictions' map
def permuted_image_map(path: Path) -> None:
    """Rewrite the COCO image list at ``path`` in place with the file names moved one id along."""
    dataset = json.loads(path.read_text())
    names = [im["file_name"] for im in dataset["images"]]
    for im, name in zip(dataset["images"], names[1:] + names[:1], strict=True):
        im["file_name"] = name
    path.write_text(json.dumps(dataset))


@pytest.mark.parametrize("beside", [False, True], ids=["images", "images.json beside"])
def test_an_image_map_rewritten_in_place_is_refused(slice_, tmp_path, capsys, beside):
    """The file that maps the saved predictions' images to their ids counts as the results do: rewritten,
    a resume would give the earlier boxes to other images."""
    saved = tmp_path / "saved"
    saved.mkdir()
    shutil.copy(slice_ / "saved_b.json", saved / "predictions.json")
    image_map = saved / ("images.json" if beside else "map.json")
    shutil.copy(slice_ / "gt.json", image_map)
    member = {"type": "precomputed", "results": str(saved / "predictions.json"), "name": "b"}
    if not beside:
        member["images"] = str(image_map)
    config = tmp_path / "map.yaml"
    config.write_text(yaml.safe_dump({"name": "map", "models": [member]}))
    out = tmp_path / "out"
    assert run(slice_, out, "--max-images", "1", config=str(config)) == 0
    assert set(saved_settings(out, "b")["inputs"]) == {str(saved / "predictions.json"), str(image_map)}
    permuted_image_map(image_map)
    refused(capsys, run(slice_, out, config=str(config)), rf"{re.escape(str(image_map))} changed since the earlier run")
    assert len(list((out / ".partial" / "b").glob("[0-9]*.json"))) == 1  # a refused run changes nothing


def test_a_cache_without_the_image_map_digest_resumes_and_records_it(slice_, tmp_path):
    """Caches of earlier versions recorded the results' digest only: they resume, and record the map's."""
    member = {"type": "precomputed", "results": str(slice_ / "saved_b.json"), "images": str(slice_ / "gt.json"),
              "name": "b"}
    config = tmp_path / "map.yaml"
    config.write_text(yaml.safe_dump({"name": "map", "models": [member]}))
    out = tmp_path / "out"
    assert run(slice_, out, "--max-images", "1", config=str(config)) == 0
    settings_path = out / ".partial" / "b" / "_settings.json"
    settings = json.loads(settings_path.read_text())
    older = {**settings, "inputs": {str(slice_ / "saved_b.json"): settings["inputs"][str(slice_ / "saved_b.json")]}}
    settings_path.write_text(json.dumps(older))
    assert run(slice_, out, config=str(config)) == 0
    assert summary_of(out)["models"]["b"]["resumed"] == 1
    assert json.loads(settings_path.read_text()) == settings


# ---------------------------------------------------------------------------------------- weights folder
def test_the_weights_folder_neither_refuses_a_resume_nor_a_merge(slice_, tmp_path):
    """Where weights are looked for is no setting of the results: the weights' digests decide."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"  # shards run on two machines
    (tmp_path / "w1").mkdir()
    (tmp_path / "w2").mkdir()
    assert run(slice_, out, "--models", "b", "--shard", "0/2", "--weights-dir", str(tmp_path / "w1")) == 0
    assert run(slice_, elsewhere, "--models", "b", "--shard", "1/2", "--weights-dir", str(tmp_path / "w2")) == 0
    shutil.copy(elsewhere / "shards" / "b.shard-1-of-2.json", out / "shards")
    assert cache_cli.main(["merge", "--out", str(out), "--quiet"]) == 0
    assert run(slice_, out, "--models", "b", "--shard", "1/2") == 0  # resumes without --weights-dir
    assert "weights_dir" not in summary_of(out)["models"]["b"]["settings"]
    # caches of earlier versions recorded it: they resume and merge too
    settings_path = out / ".partial" / "b" / "_settings.json"
    settings_path.write_text(json.dumps({**json.loads(settings_path.read_text()), "weights_dir": "/elsewhere"}))
    shard = out / "shards" / "b.shard-0-of-2.json"
    record = json.loads(shard.read_text())
    shard.write_text(json.dumps({**record, "settings": {**record["settings"], "weights_dir": "/elsewhere"}}))
    assert run(slice_, out, "--models", "b", "--shard", "1/2", "--weights-dir", str(tmp_path)) == 0
    assert cache_cli.main(["merge", "--out", str(out), "--quiet"]) == 0


def rewrite_shard_inputs(shard: Path, inputs: dict[str, str] | None) -> None:
    """Give a shard file's settings these ``inputs`` digests (None: none recorded, as earlier versions)."""
    record = json.loads(shard.read_text())
    settings = {k: v for k, v in record["settings"].items() if k != "inputs"}
    if inputs is not None:
        settings["inputs"] = inputs
    shard.write_text(json.dumps({**record, "settings": settings}))


def test_shards_of_a_version_recording_fewer_digests_merge_with_newer_ones(slice_, tmp_path, capsys):
    """A digest only some shards recorded cannot tell them apart; two shards' different digests of one
    file still do, whichever shards recorded nothing."""
    out = tmp_path / "out"
    for index in range(3):
        assert run(slice_, out, "--models", "b", "--shard", f"{index}/3") == 0
    shards = [out / "shards" / f"b.shard-{index}-of-3.json" for index in range(3)]
    recorded = json.loads(shards[0].read_text())["settings"]["inputs"]
    assert recorded  # the saved predictions' digest
    rewrite_shard_inputs(shards[1], None)
    rewrite_shard_inputs(shards[2], {**recorded, "map.json": "0" * 64})
    assert cache_cli.main(["merge", "--out", str(out), "--quiet"]) == 0
    assert summary_of(out)["models"]["b"]["settings"]["inputs"] == {**recorded, "map.json": "0" * 64}
    other = {name: "f" * 64 for name in recorded}
    rewrite_shard_inputs(shards[2], other)
    code = cache_cli.main(["merge", "--out", str(out), "--quiet"])
    refused(capsys, code, r"different settings \(inputs: .* in shards \[0\], None in shards \[1\], .* in shards \[2\]\)")


def test_a_refused_merge_names_only_the_settings_that_differ(slice_, tmp_path, capsys):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"  # shards run on two machines
    assert run(slice_, out, "--models", "b", "--shard", "0/2", "--conf", "0.4") == 0
    assert run(slice_, elsewhere, "--models", "b", "--shard", "1/2") == 0
    shutil.copy(elsewhere / "shards" / "b.shard-1-of-2.json", out / "shards")
    code = cache_cli.main(["merge", "--out", str(out), "--quiet"])
    refused(capsys, code, r"b: the shards were made with different settings \(conf: 0\.4 in shards \[0\], "
                          r"0\.001 in shards \[1\]\); re-run the odd ones with --overwrite")
    assert not (out / "b.json").exists()


# ------------------------------------------------------------------------------------------ member names
@pytest.mark.parametrize("model", [{"name": "cache_summary"}, {"name": "Cache_Summary"},
                                   {"results_file": "cache_summary.json"}])
def test_a_member_name_of_the_commands_own_files_is_refused(slice_, tmp_path, capsys, model):
    """``<member>.json`` of a member named ``cache_summary`` would be overwritten by the summary."""
    results = tmp_path / model.pop("results_file", "saved.json")
    shutil.copy(slice_ / "saved_b.json", results)
    config = tmp_path / "reserved.yaml"
    config.write_text(yaml.safe_dump({"name": "reserved", "models": [
        {"type": "precomputed", "results": str(slice_ / "saved_a.json"), "name": "a"},
        {"type": "precomputed", "results": str(results), **model}]}))
    out = tmp_path / "out"
    for extra in ([], ["--shard", "0/2"], ["--models", "a"]):
        name = model.get("name", "cache_summary")
        refused(capsys, run(slice_, out, *extra, config=str(config)), rf"member name '{name}' is reserved")
    assert not out.exists() or not any(out.rglob("*.json"))


def test_an_empty_models_flag_is_refused(slice_, tmp_path, capsys):
    """Leaving --models out selects every member; an empty value (an unset shell variable) is a mistake."""
    for value in ("", " , "):
        refused(capsys, run(slice_, tmp_path / "x", "--models", value),
                rf"--models '{value}' names no member; .*; valid names: a, b\n")
        assert not (tmp_path / "x" / "a.json").exists()
    out = slice_ / "replay_shards3"
    if not out.is_dir():
        for index in range(3):
            assert run(slice_, out, "--shard", f"{index}/3") == 0
    refused(capsys, cache_cli.main(["merge", "--out", str(out), "--models", "", "--quiet"]),
            r"--models '' names no member; .*; valid names: a, b\n")


def test_an_empty_models_argument_is_refused_in_the_python_calls_own_words(slice_, tmp_path):
    """``detens.cache`` names its own argument (``models=[]``), not the command's flag."""
    import detens

    common = (str(slice_ / "replay.yaml"), slice_ / "images", slice_ / "gt.json", tmp_path / "x")
    for value, shown in (([], r"models=\[\]"), ((), r"models=\(\)"), ("", "models=''"), (" , ", "models=' , '")):
        for arguments in ((*common,), ()):
            options = {"models": value, "quiet": True} if arguments else {"out": common[-1], "merge": True, "models": value}
            with pytest.raises(ValueError, match=rf"^{shown} names no member; give .*or leave models out") as info:
                detens.cache(*arguments, **options)
            assert "--models" not in str(info.value)
    with pytest.raises(ValueError, match=r"^models\[1\] is ' ': each entry names a member"):
        detens.cache(*common, models=["a", " "], quiet=True)
    assert not (tmp_path / "x").exists()


def test_entries_without_a_name_are_released_once_their_names_are_learned(slice_, tmp_path, monkeypatch):
    """One model in memory at a time: a model loaded to learn its members' names is not kept."""
    import gc
    import weakref

    for name in ("first", "second", "third"):
        shutil.copy(slice_ / "saved_b.json", tmp_path / f"{name}.json")
    config = tmp_path / "unnamed.yaml"
    config.write_text(yaml.safe_dump({"name": "unnamed", "models": [
        {"type": "precomputed", "results": str(tmp_path / f"{name}.json")} for name in ("first", "second", "third")]}))
    real_build = cache_tool.build_detector
    built = []

    def build_alone(model, *args, **kwargs):
        gc.collect()
        alive = [ref() for ref in built if ref() is not None]
        assert not alive, f"{[d.name for d in alive]} still loaded while {model.results} loads"
        detector = real_build(model, *args, **kwargs)
        built.append(weakref.ref(detector))
        return detector

    monkeypatch.setattr(cache_tool, "build_detector", build_alone)
    out = tmp_path / "out"
    assert run(slice_, out, "--models", "second", config=str(config)) == 0
    assert len(built) == 4  # three to learn the names, then the selected one to run
    assert sorted(p.name for p in out.glob("*.json")) == ["cache_summary.json", "second.json"]


# ------------------------------------------------------------------------------------------- Python calls
def test_python_calls_check_each_option_like_its_flag(slice_, tmp_path):
    import detens

    out = tmp_path / "out"
    common = (str(slice_ / "replay.yaml"), slice_ / "images", slice_ / "gt.json", out)
    for options, error, message in [
        ({"overwrite": "no"}, TypeError, r"overwrite must be True or False, got str: 'no'"),
        ({"max_images": "3"}, TypeError, r"max_images must be an int, got str: '3'"),
        ({"max_images": True}, TypeError, r"max_images must be an int, got bool"),
        ({"conf": "0.5"}, TypeError, r"conf must be a number, got str"),
        ({"shard": (0, 2)}, TypeError, r"shard must be a str, got tuple"),
        ({"models": 3}, TypeError, r"models must be a str .* or a list of str"),
        ({"models": ["a", "b,c"]}, ValueError, r"'b,c' holds a comma"),
        ({"engine": "rayy"}, ValueError, r"engine must be one of 'local', 'ray', got 'rayy'"),
        ({"shard": "2/2"}, ValueError, r"^shard i/n needs"),
        ({"gpus_per_actor": 1.0}, ValueError, r"ray_address, actors and gpus_per_actor go with engine ray"),
        ({"weights_dir": tmp_path / "nope"}, ValueError, r"weights_dir: no such folder: '.*nope'"),
        ({"weights_dir": 3}, TypeError, r"weights_dir must be a path \(str or os.PathLike\), got int"),
    ]:
        with pytest.raises(error, match=message):
            detens.cache(*common, quiet=True, **options)
    assert not out.exists()
    with pytest.raises(TypeError, match=r"no_vis must be True or False, got str"):
        detens.fuse_images(str(slice_ / "replay.yaml"), slice_ / "images", tmp_path / "fused", no_vis="yes")
    with pytest.raises(TypeError, match=r"imgsz must be an int, got float"):
        detens.fuse_images(str(slice_ / "replay.yaml"), slice_ / "images", tmp_path / "fused", imgsz=640.0)
    assert not (tmp_path / "fused").exists()

    # a list of names is --models; a float flag takes an int; shards, then merge=True joins them
    for index in range(2):
        assert detens.cache(*common, models=["a", "b"], conf=0, shard=f"{index}/2", quiet=True) == 0
    assert detens.cache(out=out, merge=True, quiet=True) == 0
    assert summary_of(out)["models"]["a"]["shards"] == 2
    with pytest.raises(ValueError, match=r"^merge joins the shards .*\(it takes out, models, gt\); conf would not be used"):
        detens.cache(out=out, merge=True, conf=0.5)
    with pytest.raises(TypeError, match=r"cache\(\) needs out"):
        detens.cache(merge=True)


# ------------------------------------------------------------------------------------- optional dependencies
def test_a_missing_extra_is_one_error_line_and_an_import_bug_a_traceback(slice_, tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # as if ray were not installed
    refused(capsys, run(slice_, tmp_path / "x", "--engine", "ray"), r"the Ray engine needs ray: pip install 'detens\[ray\]'")
    monkeypatch.delitem(sys.modules, "ray")

    def broken(*args, **kwargs):
        raise ImportError("cannot import name 'gone' from 'detens.adapters'")

    monkeypatch.setattr(cache_tool, "select_members", broken)
    with pytest.raises(ImportError, match="cannot import name 'gone'"):
        run(slice_, tmp_path / "y")


def test_import_extra_tells_a_missing_module_from_a_broken_one(tmp_path, monkeypatch):
    from detens.extras import MissingExtraError, import_extra

    with pytest.raises(MissingExtraError, match=r"pip install 'detens\[x\]'") as info:
        import_extra("detens_no_such_module.sub", "needs it: pip install 'detens[x]'")
    assert isinstance(info.value, ImportError)
    (tmp_path / "detens_broken_extra.py").write_text("import detens_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="detens_no_such_dependency") as info:
        import_extra("detens_broken_extra", "needs it: pip install 'detens[x]'")
    assert not isinstance(info.value, MissingExtraError)


def test_a_second_run_on_the_same_out_is_refused_and_shards_of_a_split_are_not(slice_, tmp_path, capsys,
                                                                                lock_in_another_process):
    out = tmp_path / "o"
    holder = lock_in_another_process(out)
    assert run(slice_, out) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and f"pid {holder.pid}" in err and "Traceback" not in err, err
    assert [p.name for p in out.iterdir()] == [".detens.lock"]  # nothing written beside the other run's
    sharded = tmp_path / "sharded"
    holder = lock_in_another_process(sharded, ".detens.shard-0-of-2.lock")
    assert run(slice_, sharded, "--shard", "0/2") == 2
    assert f"pid {holder.pid}" in capsys.readouterr().err
    assert run(slice_, sharded, "--shard", "1/2") == 0


def test_an_unsharded_run_or_a_merge_and_a_shard_of_one_out_cannot_run_at_once(slice_, tmp_path, capsys,
                                                                                lock_in_another_process):
    """Each takes its own lock: without looking at the other kind's, both would write one member's partial
    results and settings with no check on each other."""
    out = tmp_path / "o"
    holder = lock_in_another_process(out)  # an unsharded run (or a merge)
    assert run(slice_, out, "--shard", "0/2") == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err, err
    assert f"{out} is in use by detens fuse (pid {holder.pid} on " in err
    assert "a shard cannot run on the same --out as an unsharded run or a merge" in err
    assert [p.name for p in out.iterdir()] == [".detens.lock"]  # nothing written beside the other run's
    holder.kill()
    holder.wait()
    assert run(slice_, out, "--shard", "0/2") == 0  # the file a killed holder left holds nothing

    holder = lock_in_another_process(out, ".detens.shard-1-of-2.lock")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and "lock" not in p.name}
    for second in (lambda: run(slice_, out), lambda: cache_cli.main(["merge", "--out", str(out), "--quiet"])):
        assert second() == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1 and f"pid {holder.pid}" in err and "unsharded run or a merge" in err, err
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and "lock" not in p.name}
    assert after == before
    assert run(slice_, out, "--shard", "0/2") == 0  # shards of a split run beside each other
    holder.kill()
    holder.wait()
    assert run(slice_, out, "--shard", "1/2") == 0
    assert cache_cli.main(["merge", "--out", str(out), "--quiet"]) == 0


# what a refusal can tell of a running shard: whether it writes the recorded settings or, with --overwrite, its
# own is recorded nowhere
RUNS_AND_MAY_WRITE = r"runs on the same --out, and may be writing more of them \(or, with --overwrite, results of its own settings\)"


def test_a_shard_with_other_settings_than_a_running_shards_is_refused_naming_both(slice_, tmp_path, capsys,
                                                                                 lock_in_another_process):
    out = tmp_path / "o"
    assert run(slice_, out, "--models", "b", "--shard", "0/2", "--max-images", "1") == 0
    holder = lock_in_another_process(out, ".detens.shard-0-of-2.lock")  # shard 0 goes on
    recorded = (out / ".partial" / "b" / "_settings.json").read_bytes()
    code = run(slice_, out, "--models", "b", "--shard", "1/2", "--conf", "0.4")
    refused(capsys, code, rf"'b' made with other settings \(conf: 0.001 -> 0.4\); detens fuse \(pid {holder.pid} "
                          rf"on .*\) {RUNS_AND_MAY_WRITE}: use another --out, or wait for it to end \(then "
                          r"--overwrite discards them\)$")
    # --overwrite would take its results away while it writes more of them
    code = run(slice_, out, "--models", "b", "--shard", "1/2", "--conf", "0.4", "--overwrite")
    refused(capsys, code, rf"--overwrite would discard every result of 'b' in {out}, made with other settings "
                          rf"\(conf: 0.001 -> 0.4\), while detens fuse \(pid {holder.pid} on .*\) "
                          rf"{RUNS_AND_MAY_WRITE}: wait for it to end, or use another --out$")
    assert (out / ".partial" / "b" / "_settings.json").read_bytes() == recorded
    assert run(slice_, out, "--models", "b", "--shard", "1/2") == 0  # its settings: welcome
    # settings recorded by an unsharded run are every shard's too
    unsharded = tmp_path / "unsharded"
    assert run(slice_, unsharded, "--models", "b", "--max-images", "1") == 0
    refused(capsys, run(slice_, unsharded, "--models", "b", "--shard", "1/2", "--conf", "0.4"),
            r"other settings \(conf: 0.001 -> 0.4\); use another --out, or --overwrite to discard them")


def test_shards_starting_at_once_with_other_settings_do_not_both_record_theirs(slice_, tmp_path, capfd, monkeypatch):
    """The settings are compared and recorded as one step: the second shard finds the first one's."""
    import threading

    out = tmp_path / "o"
    compare = cache_tool.check_settings
    second_compared = threading.Event()
    codes = {}

    def compare_while_the_other_starts(out_, member, settings, *args, **kwargs):
        if threading.current_thread() is threading.main_thread():
            other = threading.Thread(target=lambda: codes.setdefault(
                1, run(slice_, out, "--models", "b", "--shard", "1/2", "--conf", "0.4")))
            other.start()
            # unlocked, the other shard would compare now, find nothing recorded and record its own
            second_compared.wait(timeout=3)
            result = compare(out_, member, settings, *args, **kwargs)
            codes["other"] = other
            return result
        second_compared.set()
        return compare(out_, member, settings, *args, **kwargs)

    monkeypatch.setattr(cache_tool, "check_settings", compare_while_the_other_starts)
    codes[0] = run(slice_, out, "--models", "b", "--shard", "0/2")
    codes.pop("other").join(timeout=60)
    assert codes == {0: 0, 1: 2}
    err = capfd.readouterr().err
    assert err.count("error:") == 1 and "'b' made with other settings (conf: 0.001 -> 0.4); detens cache " \
                                        "--shard 0/2 (pid" in err, err
    assert json.loads((out / ".partial" / "b" / "_settings.json").read_text())["conf"] == 0.001


@pytest.mark.parametrize("running", [False, True])
def test_an_overwrite_compares_the_settings_again_when_it_records_them(
        slice_, tmp_path, capsys, monkeypatch, lock_in_another_process, running):
    """With --overwrite a member records its settings at its first result: a shard that started meanwhile
    with other settings has recorded its own, and they are not written over. The refusal tells the run,
    which has --overwrite, to run again (not to add the flag), once the other shard ends if it runs."""
    out = tmp_path / "o"
    detect = cache_tool.detect_loaded
    started = []

    def other_shard_first(*args, **kwargs):
        if not started:
            started.append(True)
            assert run(slice_, out, "--models", "b", "--shard", "1/2", "--conf", "0.4") == 0
            if running:
                lock_in_another_process(out, ".detens.shard-1-of-2.lock")  # and shard 1 runs again
        return detect(*args, **kwargs)

    monkeypatch.setattr(cache_tool, "detect_loaded", other_shard_first)
    code = run(slice_, out, "--models", "b", "--shard", "0/2", "--overwrite")
    held = r"'b' made with other settings \(conf: 0.4 -> 0.001\), recorded by another shard since this run started"
    again = r"run this command again \(its --overwrite then discards them\), or use another --out$"
    if running:
        refused(capsys, code, rf"{held}; detens fuse \(pid \d+ on .*\) {RUNS_AND_MAY_WRITE}: wait for it to end and "
                              rf"{again}")
    else:
        refused(capsys, code, rf"{held}: {again}")
    assert json.loads((out / ".partial" / "b" / "_settings.json").read_text())["conf"] == 0.4
    assert not (out / "shards" / "b.shard-0-of-2.json").exists()


def test_a_shard_refused_beside_an_overwrite_shard_is_not_told_it_writes_the_recorded_settings(
        slice_, tmp_path, capfd, monkeypatch):
    """A running --overwrite shard that has not claimed the member yet writes results of its own settings, not
    more of those recorded: the refusals of other shards meanwhile say it may write either."""
    out = tmp_path / "o"
    assert run(slice_, out, "--models", "b", "--shard", "0/2", "--max-images", "1") == 0  # records conf 0.001
    detect = cache_tool.detect_loaded
    codes = []

    def other_shards_meanwhile(*args, **kwargs):
        if not codes:
            for overwrite in ([], ["--overwrite"]):
                codes.append(run(slice_, out, "--models", "b", "--shard", "1/2", "--conf", "0.25", *overwrite))
        return detect(*args, **kwargs)

    monkeypatch.setattr(cache_tool, "detect_loaded", other_shards_meanwhile)
    assert run(slice_, out, "--models", "b", "--shard", "0/2", "--conf", "0.4", "--overwrite") == 0
    assert codes == [2, 2]
    err, overwrite_err = capfd.readouterr().err.splitlines()  # --quiet: sys.stderr is a copy of fd 2
    shard_0 = r"detens cache --shard 0/2 \(pid \d+ on .*\)"
    assert re.search(rf"'b' made with other settings \(conf: 0.001 -> 0.25\); {shard_0} {RUNS_AND_MAY_WRITE}: "
                     r"use another --out, or wait", err), err
    assert re.search(rf"^error: --overwrite would discard .* made with other settings \(conf: 0.001 -> 0.25\), while "
                     rf"{shard_0} {RUNS_AND_MAY_WRITE}: wait", overwrite_err), overwrite_err
    assert json.loads((out / ".partial" / "b" / "_settings.json").read_text())["conf"] == 0.4  # shard 0's own


def test_a_ground_truth_that_lists_one_file_under_two_ids_is_refused(slice_, tmp_path, capsys):
    """Each record's predictions were cached from the one file and scored against its own share of the
    file's objects (or, where the sizes differ, one of them reported unreadable under the shared name)."""
    gt = json.loads((slice_ / "gt.json").read_text())
    first, second = gt["images"][:2]
    second["file_name"] = first["file_name"]
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    out = tmp_path / "o"
    assert run(slice_, out, gt=tmp_path / "gt.json") == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err, err
    assert (f"error: {tmp_path / 'gt.json'} lists 1 file under more than one image id, e.g. {first['file_name']!r} "
            f"under {sorted([first['id'], second['id']])}: each image file needs one record, holding all its "
            "annotations") in err
    assert not out.exists()


def test_a_run_whose_out_is_moved_stops_before_it_writes_there_again(slice_, replay_run, tmp_path, monkeypatch,
                                                                     capsys):
    """It went on, made --out anew for the images left and ended with status 0; the moved folder resumes."""
    out, moved = tmp_path / "out", tmp_path / "moved"
    real_detect = cache_tool.detect_loaded

    def moving_out_after_the_first(*args, **kwargs):
        dets = real_detect(*args, **kwargs)
        if any(out.glob(".partial/a/[0-9]*.json")) and not moved.exists():
            out.rename(moved)  # as `mv` in another shell, once the first image is saved
        return dets

    monkeypatch.setattr(cache_tool, "detect_loaded", moving_out_after_the_first)
    assert run(slice_, out) == 2
    assert capsys.readouterr().err == (
        f"error: the lock file {out / '.detens.lock'} of this run is gone: {out} was moved or deleted, or the file "
        "removed, while the run wrote there; the run stops rather than write outputs where they would be lost or "
        "mixed with another run's\n")
    assert not out.exists()
    assert len(list((moved / ".partial" / "a").glob("[0-9]*.json"))) == 1
    monkeypatch.undo()
    assert run(slice_, moved) == 0
    summary = summary_of(moved)
    assert (summary["models"]["a"]["resumed"], summary["models"]["a"]["processed_this_run"]) == (1, NUM_IMAGES - 1)
    for member in ("a", "b"):
        assert (moved / f"{member}.json").read_bytes() == (replay_run / f"{member}.json").read_bytes()


def test_a_ray_run_whose_out_is_moved_stops_before_it_writes_the_next_row(slice_, tmp_path, monkeypatch, capsys):
    """The driver writes the actors' rows as they arrive: it went on writing them into --out made anew."""
    import contextlib

    import detens.engines.ray_cache as ray_cache

    out, moved = tmp_path / "out", tmp_path / "moved"

    def rows_moving_out_after_the_first(model, ensemble, categories, todo, *args, **kwargs):
        for member, ids in todo.items():
            for image_id in ids:
                yield {"member": member, "image_id": image_id, "results": [], "ms": 1.0, "error": None,
                       "read_warnings": [], "load_s": 0.0}
                if not moved.exists():
                    out.rename(moved)

    monkeypatch.setattr(ray_cache, "ray_session", lambda *args, **kwargs: contextlib.nullcontext("a session"))
    monkeypatch.setattr(ray_cache, "detect_on_ray", rows_moving_out_after_the_first)
    assert run(slice_, out, "--engine", "ray") == 2
    assert capsys.readouterr().err.startswith(f"error: the lock file {out / '.detens.lock'} of this run is gone: ")
    assert not out.exists() and len(list((moved / ".partial" / "a").glob("[0-9]*.json"))) == 1


def test_a_shard_whose_out_is_moved_names_its_own_lock_file(slice_, tmp_path, monkeypatch, capsys):
    out, moved = tmp_path / "out", tmp_path / "moved"
    real_detect = cache_tool.detect_loaded

    def moving_out_after_the_first(*args, **kwargs):
        dets = real_detect(*args, **kwargs)
        if any(out.glob(".partial/a/[0-9]*.json")) and not moved.exists():
            out.rename(moved)
        return dets

    monkeypatch.setattr(cache_tool, "detect_loaded", moving_out_after_the_first)
    assert run(slice_, out, "--shard", "0/2") == 2
    lock = out / ".detens.shard-0-of-2.lock"
    assert capsys.readouterr().err.startswith(f"error: the lock file {lock} of this run is gone: {out} was moved ")
    assert not out.exists() and len(list((moved / ".partial" / "a").glob("[0-9]*.json"))) == 1


def test_a_run_whose_out_is_moved_after_its_last_image_writes_no_output_there(slice_, replay_run, tmp_path,
                                                                              monkeypatch, capsys):
    """It wrote the members' outputs and its summary into --out made anew, the outputs empty."""
    out, moved = tmp_path / "out", tmp_path / "moved"
    real_save = cache_tool.save_finished_image

    def moving_out_after_the_last(*args, **kwargs):
        real_save(*args, **kwargs)
        if all(len(list(out.glob(f".partial/{m}/[0-9]*.json"))) == NUM_IMAGES for m in ("a", "b")):
            out.rename(moved)

    monkeypatch.setattr(cache_tool, "save_finished_image", moving_out_after_the_last)
    assert run(slice_, out) == 2
    assert capsys.readouterr().err.startswith(f"error: the lock file {out / '.detens.lock'} of this run is gone: ")
    assert not out.exists()
    monkeypatch.undo()
    assert run(slice_, moved) == 0
    for member in ("a", "b"):
        assert summary_of(moved)["models"][member]["resumed"] == NUM_IMAGES
        assert (moved / f"{member}.json").read_bytes() == (replay_run / f"{member}.json").read_bytes()
