"""``detens bench --engines`` with its fuse runs and Ray replaced by stand-ins (the real ones would load the
ensemble's detectors and start a Ray cluster), and the options of the bench job from Python."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import detens.jobs.calls
from detens.cli import main
from detens.jobs._interrupts import RESUME_ADVICE
from detens.jobs.bench import BenchOptions, check_args


@pytest.fixture
def engines(tmp_path, monkeypatch):
    """An image folder, a stand-in Ray and a stand-in ``detens.jobs.calls.fuse_images``: ``engines.calls`` holds
    each fuse run's arguments and the root logger's level during it; ``engines.code`` is what it returns,
    ``engines.error`` (if set) what it raises, ``engines.done`` the images its summary says it fused (0: the run
    ends with fuse's error for a source it could read nothing of)."""
    images = tmp_path / "images"
    images.mkdir()
    for name in ("a.jpg", "b.jpg"):
        (images / name).write_bytes(b"")
    ray = SimpleNamespace(started=0, stopped=0)
    ray.init = lambda **kwargs: setattr(ray, "started", ray.started + 1)
    ray.shutdown = lambda: setattr(ray, "stopped", ray.stopped + 1)
    ray.is_initialized = lambda: ray.started > ray.stopped
    ray.cluster_resources = lambda: {"CPU": 2.0}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setitem(sys.modules, "ray", ray)
    state = SimpleNamespace(images=images, ray=ray, calls=[], code=0, error=None, done=2)

    def fuse_images(config, source, out, **options):
        state.calls.append({"config": config, "source": source, "out": Path(out), "options": options,
                            "root_level": logging.getLogger().level})
        logging.getLogger("detens.fuse").info("a line of the fuse run")
        logging.getLogger("detens.fuse").warning("a warning of the fuse run")
        if state.error is not None:
            if isinstance(state.error, KeyboardInterrupt):  # as the real run says it, once it saved its images
                logging.getLogger("detens.fuse").warning(
                    "interrupted: the finished images are saved; make the same call again to resume",
                    extra={RESUME_ADVICE: True})
            raise state.error
        Path(out).mkdir(parents=True, exist_ok=True)
        unreadable = {} if state.done else {
            name: f"cannot read image '{Path(source) / name}': OpenCV could not decode it" for name in ("a.jpg", "b.jpg")}
        (Path(out) / "summary.json").write_text(json.dumps({"done": state.done, "unreadable": unreadable}))
        if state.done == 0:  # as the real run ends when it reads none of its images
            raise ValueError(f"no image of --source {source} could be read (2 unreadable, listed in "
                             f"{Path(out) / 'summary.json'})")
        return state.code

    monkeypatch.setattr(detens.jobs.calls, "fuse_images", fuse_images)
    return state


def test_engines_runs_fuse_per_engine_and_its_own_lines_show_after_them(engines, capsys):
    assert main(["bench", "--engines", str(engines.images), "--config", "pair.yaml"]) == 0
    assert [(call["config"], call["source"], call["out"].name, call["options"]) for call in engines.calls] == [
        ("pair.yaml", str(engines.images), "local", {"overwrite": True, "quiet": True, "no_vis": True}),
        ("pair.yaml", str(engines.images), "ray_1_actor",
         {"overwrite": True, "quiet": True, "no_vis": True, "engine": "ray", "actors": 1}),
        ("pair.yaml", str(engines.images), "ray_2_actors",
         {"overwrite": True, "quiet": True, "no_vis": True, "engine": "ray", "actors": 2}),
    ]
    # each fuse run is quiet (warnings only), as `detens fuse --quiet` is; bench's level is back after it
    assert [call["root_level"] for call in engines.calls] == [logging.WARNING] * 3
    assert (engines.ray.started, engines.ray.stopped) == (1, 1)
    captured = capsys.readouterr()
    assert "a line of the fuse run" not in captured.err
    assert captured.err.count("WARNING detens.fuse: a warning of the fuse run") == 3
    for label in ("local", "ray 1 actor", "ray 2 actors"):  # logged after each fuse run
        assert f"INFO bench: {label}: 2 images in" in captured.err, captured.err
    assert "`detens fuse --config pair.yaml` on 2 images" in captured.out
    assert "| ray 2 actors | 2 |" in captured.out


def test_engines_quiet_shows_no_info_line(engines, capsys):
    assert main(["bench", "--engines", str(engines.images), "--quiet"]) == 0
    assert [call["config"] for call in engines.calls] == ["coco_yolo3"] * 3
    assert "INFO" not in capsys.readouterr().err


def test_an_interrupted_fuse_run_interrupts_bench(engines, capsys):
    """fuse raises KeyboardInterrupt after a Ctrl-C it caught to save its work: bench ends as on any Ctrl-C,
    Ray shut down."""
    engines.error = KeyboardInterrupt()
    level = logging.getLogger().level
    assert main(["bench", "--engines", str(engines.images)]) == 130
    err = capsys.readouterr().err
    assert err.endswith("error: interrupted\n") and "Traceback" not in err, err
    # the run's folder goes with bench's temporary one: nothing resumes, and bench says what is lost
    assert "to resume" not in err and "a warning of the fuse run" in err, err
    assert "WARNING bench: interrupted: the engine table is not written (nothing of bench's runs is kept)" in err
    assert len(engines.calls) == 1 and engines.ray.started == 0
    assert logging.getLogger().level == level


def test_an_interrupted_ray_run_shuts_ray_down(engines, capsys, monkeypatch):
    def fuse_images(config, source, out, **options):
        if options.get("engine") == "ray":
            raise KeyboardInterrupt
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "summary.json").write_text(json.dumps({"done": 2}))
        return 0

    monkeypatch.setattr(detens.jobs.calls, "fuse_images", fuse_images)
    assert main(["bench", "--engines", str(engines.images)]) == 130
    assert capsys.readouterr().err.endswith("error: interrupted\n")
    assert (engines.ray.started, engines.ray.stopped) == (1, 1)


def test_a_mistake_in_a_fuse_run_is_one_error_line(engines, capsys):
    engines.error = ValueError("--config: no ensemble named 'pair'")
    assert main(["bench", "--engines", str(engines.images), "--config", "pair"]) == 2
    err = capsys.readouterr().err
    assert err.endswith("error: --config: no ensemble named 'pair'\n") and "Traceback" not in err, err


def test_engines_without_images_is_refused(engines, tmp_path, capsys):
    (tmp_path / "none").mkdir()
    assert main(["bench", "--engines", str(tmp_path / "none")]) == 2
    assert "no images there" in capsys.readouterr().err
    assert engines.calls == []


def test_engines_over_files_that_are_no_images_is_refused_before_ray_starts(engines, capsys):
    """A listed file that no decoder reads is skipped by fuse in no time: no rate to report. The error names
    the files, where fuse's named its summary in bench's temporary folder, gone with it."""
    engines.done = 0
    assert main(["bench", "--engines", str(engines.images)]) == 2
    err = capsys.readouterr().err
    images = engines.images
    assert err.endswith(f"error: no image of --engines {images} could be read; unreadable: a.jpg: cannot read image "
                        f"'{images / 'a.jpg'}': OpenCV could not decode it; unreadable: b.jpg: cannot read image "
                        f"'{images / 'b.jpg'}': OpenCV could not decode it\n"), err
    assert "summary.json" not in err and not engines.calls[0]["out"].exists()
    assert len(engines.calls) == 1 and engines.ray.started == 0


def test_the_rate_counts_the_images_fused(engines, capsys):
    engines.done = 1  # one of the two files unreadable
    assert main(["bench", "--engines", str(engines.images)]) == 0
    assert "| ray 2 actors | 1 |" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------- the options
def test_the_list_options_take_python_values():
    options = BenchOptions.from_python({"sizes": ["3x100", (5, 1000), [2, 7]], "repeats": 3})
    assert options.sizes == [(3, 100), (5, 1000), (2, 7)]
    options = BenchOptions.from_python({"coco": ("gt.json", Path("r.json")), "coco_sizes": (10, 20)})
    assert (options.coco, options.coco_sizes) == (["gt.json", "r.json"], [10, 20])
    mode, filled = check_args(BenchOptions.from_python({"coco": ["gt.json", "r.json"]}))
    assert (mode, filled.coco_sizes, filled.sizes) == ("coco", [200, 1000, 5000], None)
    mode, filled = check_args(BenchOptions.from_python({}))
    assert mode == "fusers" and filled.sizes == [(3, 100), (3, 300), (5, 1000), (5, 3000)]
    assert (filled.repeats, filled.device, filled.threads, filled.seed) == (15, "cpu", 1, 0)


@pytest.mark.parametrize("options, error, message", [
    ({"sizes": "3x100"}, TypeError, r"sizes must be a list of sizes"),
    ({"sizes": []}, ValueError, r"sizes must name at least one size"),
    ({"sizes": ["3y100"]}, ValueError, r"sizes\[0\]: size must look like 5x1000"),
    ({"sizes": [(3, 0)]}, ValueError, r"sizes\[0\]: size needs at least 1 model and 1 box"),
    # a size beyond the bound ran until the machine killed it for memory, printing nothing
    ({"sizes": ["3x100000000"]}, ValueError,
     r"^sizes\[0\]: size '3x100000000' makes images of 300,000,000 boxes; at most 1,000,000 \(models x boxes per model\)"),
    ({"sizes": [(2, 500_001)]}, ValueError, r"^sizes\[0\]: size \(2, 500001\) makes images of 1,000,002 boxes"),
    ({"sizes": [(3, 100.0)]}, TypeError, r"sizes\[0\] must be an int, got float"),
    ({"sizes": [3]}, TypeError, r"sizes\[0\] must be '5x1000' or \(5, 1000\)"),
    ({"coco": "gt.json"}, TypeError, r"coco must be a pair \(GT, RESULTS\) of str or os\.PathLike"),
    ({"coco": ["gt.json"]}, TypeError, r"coco must be a pair \(GT, RESULTS\) of str or os\.PathLike"),
    ({"coco": ["gt.json", "r.json"], "coco_sizes": ["10"]}, TypeError, r"coco_sizes\[0\] must be an int, got str"),
    ({"coco": ["gt.json", "r.json"], "coco_sizes": []}, ValueError, r"coco_sizes must name at least one"),
    ({"threads": 0}, ValueError, r"threads must be an int >= 1, got 0"),
    ({"repeats": "3"}, TypeError, r"repeats must be an int, got str"),
])
def test_the_options_are_checked_as_they_are_made(options, error, message):
    with pytest.raises(error, match=message):
        BenchOptions.from_python(options)


def test_the_largest_size_allowed_is_the_bound():
    assert BenchOptions.from_python({"sizes": ["4x250000", (1, 1_000_000)]}).sizes == [(4, 250_000), (1, 1_000_000)]


def test_the_fuser_bench_times_every_method_and_tabulates_them():
    pytest.importorskip("ensemble_boxes")
    import torch

    from detens.jobs.bench import DEEP, TENSOR_MATCH, THETA, bench_size, markdown_table

    result = bench_size(2, 30, repeats=2, device=torch.device("cpu"), seed=0)
    methods = ["detens wbf", THETA, DEEP, TENSOR_MATCH, "ensemble_boxes", "batched_nms"]
    assert sorted(result["median_ms"]) == sorted(methods)
    assert all(len(result["all_ms"][name]) == 2 and result["median_ms"][name] > 0 for name in methods)
    assert result["wbf_max_abs_diff_vs_ensemble_boxes"] < 1e-5
    assert result["ratios"][f"ensemble_boxes / {DEEP}"] == result["median_ms"]["ensemble_boxes"] / result["median_ms"][DEEP]
    header, rule, row = markdown_table([result]).splitlines()
    assert header.count("|") == rule.count("|") == row.count("|") == 13
    assert f"| {DEEP} |" in header and row.startswith("| 2x30 |")


def test_the_fuser_bench_fails_where_detens_wbf_and_ensemble_boxes_differ(monkeypatch):
    """Scores rounded to 3 decimals tie, and the two libraries visit tied boxes in different orders: the
    check of "same boxes" must then fail, not report a difference and go on."""
    pytest.importorskip("ensemble_boxes")
    import torch

    from detens import Detections
    from detens.jobs import bench

    real = bench.synthetic_image

    def tied(*args, **kwargs):
        return [Detections(d.boxes, (d.scores * 1000).round() / 1000, d.labels, d.image_size) for d in real(*args, **kwargs)]

    monkeypatch.setattr(bench, "synthetic_image", tied)
    with pytest.raises(RuntimeError, match=r"^detens wbf differs from ensemble_boxes by .* \(normalized boxes and "
                                           r"scores\) at 3x300, above the 1e-05 of float arithmetic$"):
        bench.bench_size(3, 300, repeats=3, device=torch.device("cpu"), seed=0)


@pytest.mark.parametrize("which", [0, 1])
def test_the_coco_bench_refuses_to_write_over_its_inputs(tmp_path, capsys, which):
    inputs = [tmp_path / "gt.json", tmp_path / "results.json"]
    inputs[0].write_text(json.dumps({"images": [{"id": 1, "width": 10, "height": 10, "file_name": "a.jpg"}],
                                     "annotations": [], "categories": [{"id": 1, "name": "a"}]}))
    inputs[1].write_text("[]")
    before = [path.read_bytes() for path in inputs]
    assert main(["bench", "--quiet", "--coco", *map(str, inputs), "--coco-sizes", "10", "--out", str(inputs[which])]) == 2
    err = capsys.readouterr().err
    kind = ("annotation", "results")[which]
    assert err == (f"error: detens bench: --out {inputs[which]} is --coco's {kind} file: the run would write over "
                   "its own input; give the output another name (see detens bench --help)\n")
    assert [path.read_bytes() for path in inputs] == before
