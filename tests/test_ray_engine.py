"""`--engine ray` on a local Ray cluster started by the test: the cache and fuse jobs give what the local
engine gives on 20 real images of coco_val2017_206 (one of them made unreadable), and importing detens
never imports ray."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "coco_val2017_206"
NUM_IMAGES = 20
MODELS = ("yolov8n", "yolo11n", "yolo26n")
YOLO26N = REPO.parent / "shared" / "models" / "yolo26n_int8_tflite" / "yolo26n_int8.tflite"

ray = pytest.importorskip("ray", reason="the Ray engine tests need ray (pip install 'detens[ray]')")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not DATA.is_dir(), reason="needs ../shared/data/coco_val2017_206"),
]

from detens.cli import main  # noqa: E402
from detens.sources import read_image  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    """A local two-CPU Ray cluster for the module (the jobs use it instead of starting their own)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, with_orientation_tag):
    """20 annotated images (the 5th made unreadable, the last by name given an EXIF orientation tag, read with
    a warning) and their ground truth, which gives the 10th image its width as height and its height as width
    (as for a photo turned upright by its EXIF tag when annotated)."""
    root = tmp_path_factory.mktemp("ray")
    full = json.loads((DATA / "instances_val2017.json").read_text())
    keep = set(sorted({a["image_id"] for a in full["annotations"]})[:NUM_IMAGES])
    images = [im for im in full["images"] if im["id"] in keep]
    (root / "images").mkdir()
    for image in images:
        shutil.copy(DATA / "images" / image["file_name"], root / "images" / image["file_name"])
    broken = images[4]["file_name"]
    (root / "images" / broken).write_bytes(b"not a jpeg" * 20)
    swapped = images[9]["file_name"]
    tagged = root / "images" / max(image["file_name"] for image in images if image["file_name"] not in (broken, swapped))
    tagged.write_bytes(with_orientation_tag(tagged.read_bytes(), 6))
    images[9] = {**images[9], "width": images[9]["height"], "height": images[9]["width"]}
    subset = {**full, "images": images, "annotations": [a for a in full["annotations"] if a["image_id"] in keep]}
    (root / "gt.json").write_text(json.dumps(subset))
    return root, broken, swapped


def cache(root: Path, out: Path, *extra: str) -> int:
    return main(["cache", "--config", "coco_yolo3", "--images", str(root / "images"), "--gt", str(root / "gt.json"),
                 "--out", str(out), "--quiet", *extra])


@contextlib.contextmanager
def on_ray_only():
    """While open, ``detens cache`` cannot run the local engine here on the driver (its runner raises) and
    every call of the Ray path is recorded (the member names it was given): a ``--engine ray`` run that fell
    back to the local engine would otherwise give the very results it is compared with. The actors run in
    other processes, where neither patch applies."""
    import detens.engines.ray_cache as ray_cache
    import detens.jobs.cache as cache_job

    calls: list[list[str]] = []
    detect_on_ray = ray_cache.detect_on_ray

    def spy(model, ensemble, categories, todo, *args, **kwargs):
        calls.append(sorted(todo))
        return detect_on_ray(model, ensemble, categories, todo, *args, **kwargs)

    def local_engine(*args, **kwargs):
        raise AssertionError("an --engine ray run ran the local engine")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cache_job, "run_entry", local_engine)
        patch.setattr(ray_cache, "detect_on_ray", spy)
        yield calls


def assert_same_results(a: list[dict], b: list[dict]) -> None:
    assert [(r["image_id"], r["category_id"]) for r in a] == [(r["image_id"], r["category_id"]) for r in b]
    for x, y in zip(a, b, strict=True):
        assert x["bbox"] == pytest.approx(y["bbox"], abs=1e-4) and x["score"] == pytest.approx(y["score"], abs=1e-4)


def test_cache_on_ray_equals_local(cluster, dataset):
    root, broken, swapped = dataset
    assert cache(root, root / "local") == 0
    with on_ray_only() as calls:
        assert cache(root, root / "on_ray", "--engine", "ray", "--actors", "2") == 0
    assert calls == [[name] for name in MODELS]  # one Ray job per model of coco_yolo3, in its order
    local_summary = json.loads((root / "local" / "cache_summary.json").read_text())
    ray_summary = json.loads((root / "on_ray" / "cache_summary.json").read_text())
    for name in MODELS:
        local = json.loads((root / "local" / f"{name}.json").read_text())
        on_ray = json.loads((root / "on_ray" / f"{name}.json").read_text())
        assert len(local) > 100
        assert_same_results(local, on_ray)
        unreadable = ray_summary["models"][name]["unreadable"]
        assert list(unreadable) == list(local_summary["models"][name]["unreadable"]) == sorted([broken, swapped])
        assert "could not decode" in unreadable[broken]
        height, width = read_image(root / "images" / swapped).shape[:2]
        assert f"is {width}x{height} pixels (width x height) but its annotations give it {height}x{width}" in (
            unreadable[swapped]
        )
        assert unreadable[swapped] == local_summary["models"][name]["unreadable"][swapped]
        assert ray_summary["models"][name]["images"] == local_summary["models"][name]["images"] == NUM_IMAGES - 2
        assert ray_summary["models"][name]["load_s_this_run"] > 0  # the actors' model load
    assert broken in json.dumps(ray_summary["unreadable"])
    # the actors' reads warn as the local engine's do, though their log lines stay on the actors
    (tagged,) = ray_summary["read_warnings"]
    assert ray_summary["read_warnings"] == local_summary["read_warnings"]
    assert ray_summary["read_warnings"][tagged][0].startswith("its EXIF orientation tag (6: ")

    # a rerun resumes: every image done (the unreadable one is tried again and skipped again)
    with on_ray_only() as calls:
        assert cache(root, root / "on_ray", "--engine", "ray") == 0
    assert calls == [[name] for name in MODELS]  # each model's unreadable image is its only one to do
    again = json.loads((root / "on_ray" / "cache_summary.json").read_text())
    assert all(again["models"][name]["processed_this_run"] == 0 for name in MODELS)


def test_cache_on_ray_overwrite_that_fails_before_its_first_result_keeps_the_earlier_results(
    cluster, dataset, tmp_path
):
    """As with the local engine: --overwrite removes a member's results only once its new ones arrive."""
    root, _, _ = dataset
    weights = tmp_path / "yolo26n.tflite"
    shutil.copy(YOLO26N, weights)
    config = {"name": "one", "models": [{"type": "ultralytics", "weights": str(weights), "name": "yolo26n"}]}
    (tmp_path / "one.yaml").write_text(json.dumps(config))  # JSON is YAML
    out = tmp_path / "out"
    args = ["cache", "--config", str(tmp_path / "one.yaml"), "--images", str(root / "images"),
            "--gt", str(root / "gt.json"), "--out", str(out), "--quiet"]
    assert main([*args, "--max-images", "1"]) == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert len(list((out / ".partial" / "yolo26n").glob("[0-9]*.json"))) == 1
    weights.write_bytes(b"a broken export" * 100)  # found on the driver; the actors fail to load it
    with on_ray_only() as calls:
        assert main([*args, "--engine", "ray", "--overwrite"]) == 2
    assert calls == [["yolo26n"]]  # the failure was the actors' (the local engine fails the same way)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_an_error_on_an_actor_is_the_local_engines_error(cluster, dataset, tmp_path, capsys):
    """A corrupt weights file fails on the actors as it fails here: one error line, exit status 2 (not a
    Ray traceback), and a summary whose ``stopped_by`` holds no terminal colour codes."""
    root, _, _ = dataset
    weights = tmp_path / "yolo26n.tflite"
    weights.write_bytes(b"a broken export" * 100)
    config = {"name": "one", "models": [{"type": "ultralytics", "weights": str(weights), "name": "yolo26n"}]}
    (tmp_path / "one.yaml").write_text(json.dumps(config))  # JSON is YAML
    capsys.readouterr()
    for engine in ("local", "ray"):
        out = tmp_path / engine
        argv = ["cache", "--config", str(tmp_path / "one.yaml"), "--images", str(root / "images"),
                "--gt", str(root / "gt.json"), "--out", str(out), "--quiet", "--engine", engine]
        if engine == "ray":
            with on_ray_only() as calls:
                code = main(argv)
            assert calls == [["yolo26n"]]  # the error came from the Ray path, not from the local engine
        else:
            code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and err.count("error:") == 1 and "Traceback" not in err, err
        assert "not a valid Flatbuffer" in err and str(weights) in err, err
        stopped_by = json.loads((out / "cache_summary.json").read_text())["stopped_by"]
        assert stopped_by == (f"error: ValueError: {tmp_path / 'one.yaml'}: model 'yolo26n': ultralytics could not "
                              f"load {str(weights)!r}: ValueError: The model is not a valid Flatbuffer buffer")
    code = main(["fuse", "--config", str(tmp_path / "one.yaml"), "--source", str(root / "images"), "--out",
                 str(tmp_path / "fused"), "--quiet", "--engine", "ray"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1 and "Traceback" not in err and "not a valid Flatbuffer" in err, err


class _TwoArgError(ValueError):
    def __init__(self, what, why):  # pickles, but does not unpickle (its args are one message)
        super().__init__(f"{what}: {why}")


def test_an_actors_exception_is_raised_again_on_the_driver():
    from detens.engines.ray_cache import failure_record, raise_failure

    def raised(err):
        try:
            raise err
        except Exception as caught:
            return failure_record(caught)

    with pytest.raises(FileNotFoundError, match="no such weights") as info:
        raise_failure(raised(FileNotFoundError("no such weights")))
    if sys.version_info >= (3, 11):
        assert "raised on a Ray actor" in info.value.__notes__[0] and "\x1b" not in info.value.__notes__[0]
    with pytest.raises(ValueError, match=r"_TwoArgError: model: broken") as info:  # its nearest builtin type
        raise_failure(raised(_TwoArgError("model", "\x1b[36mbroken\x1b[39m")))
    assert "\x1b" not in "".join(getattr(info.value, "__notes__", []))


def test_fuse_on_ray_equals_local(cluster, dataset):
    root, broken, _ = dataset
    args = ["fuse", "--config", "coco_yolo3", "--source", str(root / "images"), "--quiet", "--save-per-model"]
    assert main([*args, "--out", str(root / "fused_local")]) == 0
    assert main([*args, "--out", str(root / "fused_ray"), "--engine", "ray", "--actors", "2"]) == 0
    for name in ("images.json", "predictions.json", "per_model/yolo26n.json"):
        local = json.loads((root / "fused_local" / name).read_text())
        on_ray = json.loads((root / "fused_ray" / name).read_text())
        if name == "images.json":
            assert local["images"] == on_ray["images"] and len(local["images"]) == NUM_IMAGES - 1
        else:
            assert_same_results(local, on_ray)
    local_labels = sorted(p.name for p in (root / "fused_local" / "labels").iterdir())
    assert local_labels == sorted(p.name for p in (root / "fused_ray" / "labels").iterdir())
    for label in local_labels:
        assert (root / "fused_local" / "labels" / label).read_text() == (root / "fused_ray" / "labels" / label).read_text()
    summary = json.loads((root / "fused_ray" / "summary.json").read_text())
    assert list(summary["unreadable"]) == [broken] and summary["method"] == "deep"
    assert summary["weights"] == json.loads((root / "fused_local" / "summary.json").read_text())["weights"]


@pytest.fixture(scope="module")
def small(dataset, with_orientation_tag):
    """Five readable images (the first with an EXIF orientation tag, read with a warning) and the unreadable
    one, a one-model ensemble, and its local engine's outputs."""
    root, broken, _ = dataset
    source = root / "small"
    source.mkdir()
    readable = sorted(p.name for p in (root / "images").iterdir() if p.name != broken)[:5]
    for name in [*readable, broken]:
        shutil.copy(root / "images" / name, source / name)
    (source / readable[0]).write_bytes(with_orientation_tag((source / readable[0]).read_bytes(), 6))
    config = {"name": "one", "models": [{"type": "ultralytics", "weights": str(YOLO26N), "name": "yolo26n"}],
              "fusion": {"method": "wbf"}}
    (root / "one.yaml").write_text(json.dumps(config))  # JSON is YAML
    assert fuse_one(root, source, root / "small_local") == 0
    return root, source, root / "small_local"


def fuse_one(root: Path, source: Path, out: Path, *extra: str) -> int:
    return main(["fuse", "--config", str(root / "one.yaml"), "--source", str(source), "--out", str(out), "--quiet",
                 "--save-per-model", *extra])


# what differs between two runs of the same images by design: how long they took
TIMES = ("ms_per_image", "fuse_first_call_ms", "wall_s_this_run", "images_per_s_this_run")


def untimed(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in TIMES}


def assert_same_fused(out: Path, expected: Path) -> None:
    """``out`` holds the images, ids, results, labels and unreadable images of ``expected``."""
    assert json.loads((out / "images.json").read_text()) == json.loads((expected / "images.json").read_text())
    for name in ("predictions.json", "per_model/yolo26n.json"):
        assert_same_results(json.loads((out / name).read_text()), json.loads((expected / name).read_text()))
    labels = sorted(p.relative_to(expected).as_posix() for p in (expected / "labels").rglob("*.txt"))
    assert labels == sorted(p.relative_to(out).as_posix() for p in (out / "labels").rglob("*.txt"))
    assert all((out / label).read_text() == (expected / label).read_text() for label in labels)
    summary, expected_summary = (json.loads((folder / "summary.json").read_text()) for folder in (out, expected))
    assert summary["unreadable"] == expected_summary["unreadable"] and summary["complete"]


def test_fuse_summaries_are_the_local_engines(cluster, small, tmp_path):
    """The Ray engine's summary.json is the local engine's but for the times, which it reports too."""
    root, source, local = small
    assert fuse_one(root, source, tmp_path / "on_ray", "--engine", "ray", "--actors", "2") == 0
    assert_same_fused(tmp_path / "on_ray", local)
    summaries = [json.loads((out / "summary.json").read_text()) for out in (local, tmp_path / "on_ray")]
    assert untimed(summaries[0]) == untimed(summaries[1])
    assert summaries[0]["weights"] == {"yolo26n": str(YOLO26N)} and summaries[0]["done"] == 5
    (tagged,) = summaries[1]["read_warnings"]  # the actors' reads warn as the local engine's do
    assert summaries[1]["read_warnings"][tagged][0].startswith("its EXIF orientation tag (6: ")
    for summary in summaries:  # the actors time their first fusion call as the local engine does
        assert summary["fuse_first_call_ms"] > 0 and set(summary["ms_per_image"]) == {
            "read", "detect:yolo26n", "fuse", "outputs"}


def test_fuse_summaries_are_the_local_engines_when_no_image_is_readable(cluster, small, tmp_path):
    """Neither engine ran a detector on an image: neither names the weights or times a first fusion call
    (the local engine loads no detector for no image; Ray's actors load theirs anyway)."""
    root, _, _ = small
    unreadable = tmp_path / "unreadable"
    unreadable.mkdir()
    for name in ("a.jpg", "b.jpg"):
        (unreadable / name).write_bytes(b"not a jpeg" * 20)
    # either engine writes its summary, then ends with the error that no image could be read
    assert fuse_one(root, unreadable, tmp_path / "none_local") == 2
    assert fuse_one(root, unreadable, tmp_path / "none_on_ray", "--engine", "ray", "--actors", "2") == 2
    summaries = [json.loads((tmp_path / out / "summary.json").read_text()) for out in ("none_local", "none_on_ray")]
    assert {k: v for k, v in summaries[0].items() if k not in TIMES[2:]} == {
        k: v for k, v in summaries[1].items() if k not in TIMES[2:]}
    assert summaries[1]["weights"] == {} and summaries[1]["fuse_first_call_ms"] is None
    assert summaries[1]["models"] == ["yolo26n"] and list(summaries[1]["unreadable"]) == ["a.jpg", "b.jpg"]


@pytest.mark.parametrize("resumed_on", ["ray", "local"])
def test_an_interrupted_ray_run_whose_images_finished_out_of_order_resumes_to_the_uninterrupted_ids(
    cluster, small, tmp_path, monkeypatch, resumed_on
):
    """Ray's actors finish images out of order (here: the last first) and the run is interrupted after two
    of them: the ids it wrote, and those of the resumed run, on either engine, are the uninterrupted run's."""
    import detens.engines.ray_fuse as ray_fuse
    import detens.jobs.fuse as fuse_job

    root, source, local = small
    out = tmp_path / "o"
    fuse_on_ray, write_image = ray_fuse.fuse_on_ray, fuse_job.write_image
    written: list[str] = []

    def last_first(items, *args, **kwargs):
        # all of them first: the order Ray's actors finish in varies from run to run
        yield from sorted(fuse_on_ray(items, *args, **kwargs), key=lambda row: row["name"], reverse=True)

    def interrupted_after_two(folder, record, files):
        if len(written) == 2:
            raise KeyboardInterrupt
        written.append(record["file_name"])
        write_image(folder, record, files)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray_fuse, "fuse_on_ray", last_first)
        patch.setattr(fuse_job, "write_image", interrupted_after_two)
        assert fuse_one(root, source, out, "--engine", "ray", "--actors", "2") == 130
    expected = json.loads((local / "images.json").read_text())["images"]
    assert written == [im["file_name"] for im in expected[:-3:-1]]  # Ray's path ran, last image first
    interrupted = json.loads((out / "images.json").read_text())["images"]
    assert interrupted == expected[-2:]  # the ids of an uninterrupted run already

    assert fuse_one(root, source, out, *(["--engine", "ray"] if resumed_on == "ray" else [])) == 0
    assert_same_fused(out, local)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed"] == 2 and summary["processed_this_run"] == 3


@pytest.mark.parametrize("flags", [["--actors", "2"], ["--actors", "1"], ["--ray-address", ""]])
def test_ray_flags_need_the_ray_engine(capsys, tmp_path, flags):
    """Their default values too (--actors 1, an empty address): given, they would go unused unseen."""
    assert main(["fuse", "--source", str(tmp_path), "--out", str(tmp_path / "o"), *flags]) == 2
    assert "go with --engine ray" in capsys.readouterr().err


def test_an_empty_ray_address_is_refused_not_taken_for_a_local_cluster(capsys, tmp_path):
    assert main(["fuse", "--source", str(tmp_path), "--out", str(tmp_path / "o"), "--engine", "ray",
                 "--ray-address", ""]) == 2
    assert "--ray-address is empty: give a cluster's address" in capsys.readouterr().err


@pytest.mark.parametrize("address", ["not an address", "http://head:8265", "ray://head"])
def test_a_ray_address_of_no_form_ray_takes_is_one_error_line_naming_the_flag(capsys, tmp_path, address):
    """Ray's own words were `Invalid address format: not an address`; a dashboard's address was looked up as
    the host `http://head`, and a Ray Client address without its port went to Ray as it was."""
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.jpg").write_bytes(b"not a jpeg")  # refused before any image is read
    assert main(["fuse", "--source", str(tmp_path / "images"), "--out", str(tmp_path / "o"), "--engine", "ray",
                 "--ray-address", address]) == 2
    assert capsys.readouterr().err == (
        f"error: detens fuse: --ray-address {address!r} is not a Ray cluster's address: give host:port (a cluster's "
        "GCS, port 6379 by default), ray://host:port (its Ray Client server, port 10001 by default) or auto (the "
        "cluster started on this machine by ray start) (see detens fuse --help)\n"
    )


def test_a_running_session_is_used_where_the_address_names_it_and_refused_where_it_names_another(cluster,
                                                                                                 monkeypatch):
    """The engine used the session of a process where Ray already ran whatever address it was given: a Python
    caller's local session stood in for the cluster asked for, without a word."""
    from ray._private import services

    from detens.engines.ray_cache import RayOptions, ray_session

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: None)  # no `ray start` recorded
    running = ray.get_runtime_context().gcs_address
    host, port = running.rsplit(":", 1)
    for same in ({}, {"address": running}, {"address": f"localhost:{port}"}, {"address": f"127.0.0.1:{port}"},
                 {"address": "auto"}, {"num_cpus": 2}):
        with ray_session(RayOptions(**same)):
            assert ray.get_runtime_context().gcs_address == running
        assert ray.is_initialized()  # not the session's to shut down
    for other in (f"{host}:{int(port) % 65535 + 1}", "10.0.0.5:6379", "ray://10.0.0.5:10001", "local"):
        with pytest.raises(ValueError, match=rf"^Ray already runs in this process, joined to the cluster at "
                                             rf"{re.escape(repr(running))}, which the address {re.escape(repr(other))} "
                                             r"does not name: give no address to use that session, or call "
                                             r"ray\.shutdown\(\) first to join another$"):
            with ray_session(RayOptions(address=other)):
                pytest.fail("the block ran on another cluster than the one asked for")
    # auto joins the cluster of this machine's last `ray start` where one is recorded, whatever else runs
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: "10.0.0.5:6379")
    with pytest.raises(ValueError, match="which the address 'auto' does not name"):
        with ray_session(RayOptions(address="auto")):
            pass
    with pytest.raises(ValueError, match=rf"^num_cpus=3 sizes a local cluster to start, but Ray already runs in this "
                                         rf"process, on a cluster of 2 CPUs at {re.escape(repr(running))}: leave "
                                         r"num_cpus out to use that session"):
        with ray_session(RayOptions(num_cpus=3)):
            pass
    assert ray.is_initialized() and ray.get_runtime_context().gcs_address == running


def test_a_python_call_given_another_clusters_address_than_its_sessions_names_its_keyword_option(cluster, small,
                                                                                                 tmp_path):
    import detens

    root, source, _ = small
    with pytest.raises(ValueError, match=r"which the ray_address '10\.0\.0\.5:6379' does not name"):
        detens.fuse_images(root / "one.yaml", source, tmp_path / "o", engine="ray", ray_address="10.0.0.5:6379",
                           quiet=True)
    assert not (tmp_path / "o").exists()


def test_unreadable_images_are_named_as_given_on_both_engines(cluster, small, tmp_path, monkeypatch):
    """The actors read absolute paths (their working directory may be another): their messages named those,
    where the local engine's name the file as --source gave it."""
    root, source, _ = small
    monkeypatch.chdir(source.parent)
    for engine in ("local", "ray"):
        assert fuse_one(root, Path(source.name), tmp_path / engine, "--engine", engine) == 0
    local, on_ray = (json.loads((tmp_path / engine / "summary.json").read_text()) for engine in ("local", "ray"))
    assert on_ray["unreadable"] == local["unreadable"] and len(local["unreadable"]) == 1
    (message,) = local["unreadable"].values()
    assert message.startswith(f"cannot read image '{source.name}/")


def test_importing_detens_does_not_import_ray():
    code = (
        "import sys, detens, detens.cli, detens.cli.fuse, detens.cli.cache, detens.jobs.cache, detens.engines; "
        "assert 'ray' not in sys.modules, 'ray imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_python_calls_run_the_same_jobs(cluster, dataset, tmp_path):
    import detens

    root, _, _ = dataset
    out = tmp_path / "py"
    with on_ray_only() as calls:
        assert detens.cache("coco_yolo3", root / "images", root / "gt.json", out, models="yolo26n", engine="ray",
                            quiet=True) == 0
    assert calls == [["yolo26n"]]
    assert detens.cache("coco_yolo3", root / "images", root / "gt.json", tmp_path / "py_local", models="yolo26n",
                        quiet=True) == 0
    assert_same_results(json.loads((out / "yolo26n.json").read_text()),
                        json.loads((tmp_path / "py_local" / "yolo26n.json").read_text()))
    assert detens.fuse_images("coco_yolo3", root / "images", tmp_path / "fused", method="wbf", quiet=True) == 0
    assert json.loads((tmp_path / "fused" / "summary.json").read_text())["method"] == "wbf"
    with pytest.raises(TypeError, match="unknown options \\['colour'\\]"):
        detens.fuse_images("coco_yolo3", root / "images", tmp_path / "x", colour="red")
    with pytest.raises(ValueError, match="unknown fusion method"):
        detens.fuse_images("coco_yolo3", root / "images", tmp_path / "x", method="wbff")


def test_fuse_on_ray_checks_saved_predictions_before_any_work(cluster, tmp_path, capsys):
    """An image missing from a ``precomputed`` member's results is one error line before Ray runs anything,
    as with the local engine (it used to fail on an actor)."""
    full = json.loads((DATA / "instances_val2017.json").read_text())
    images = sorted(full["images"], key=lambda im: im["id"])[:2]
    (tmp_path / "images").mkdir()
    for image in images:
        shutil.copy(DATA / "images" / image["file_name"], tmp_path / "images" / image["file_name"])
    saved = [{"image_id": images[0]["id"], "category_id": 1, "bbox": [10.0, 10.0, 50.0, 50.0], "score": 0.9}]
    (tmp_path / "saved.json").write_text(json.dumps(saved))
    (tmp_path / "saved_images.json").write_text(json.dumps({"images": images[:1]}))  # the second is missing
    member = {"type": "precomputed", "results": str(tmp_path / "saved.json"),
              "images": str(tmp_path / "saved_images.json")}
    config = {"name": "saved", "models": [{**member, "name": "saved"}, {**member, "name": "twin"}]}
    (tmp_path / "saved.yaml").write_text(json.dumps(config))  # JSON is YAML
    code = main(["fuse", "--config", str(tmp_path / "saved.yaml"), "--source", str(tmp_path / "images"),
                 "--out", str(tmp_path / "o"), "--method", "wbf", "--quiet", "--engine", "ray"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert "1 of the 2 images have no saved predictions in member 'saved'" in err and images[1]["file_name"] in err
    assert not (tmp_path / "o").exists()


def test_weights_found_from_the_drivers_working_directory_are_found_by_the_actors(cluster, dataset, tmp_path,
                                                                                  monkeypatch):
    """Weights named relative to a ``shared/models`` above the driver's working directory load on actors
    whose working directory is elsewhere (a cluster started from another folder), for both jobs."""
    root, _, _ = dataset
    (tmp_path / "shared" / "models").mkdir(parents=True)
    shutil.copy(YOLO26N, tmp_path / "shared" / "models" / "only_here.tflite")
    config = {"name": "one", "models": [{"type": "ultralytics", "weights": "only_here.tflite", "name": "one"}],
              "fusion": {"method": "wbf"}}
    (tmp_path / "one.yaml").write_text(json.dumps(config))  # JSON is YAML
    images = tmp_path / "images"
    images.mkdir()
    for path in sorted((root / "images").iterdir())[:2]:
        shutil.copy(path, images / path.name)
    monkeypatch.chdir(tmp_path)  # the cluster's workers stay in the folder it was started from
    import detens

    assert detens.fuse_images("one.yaml", images, tmp_path / "fused", engine="ray", quiet=True) == 0
    summary = json.loads((tmp_path / "fused" / "summary.json").read_text())
    assert summary["done"] == 2 and summary["weights"] == {"one": str(tmp_path / "shared/models/only_here.tflite")}
    assert detens.cache("one.yaml", root / "images", root / "gt.json", tmp_path / "cached", engine="ray",
                        max_images=2, quiet=True) == 0
    assert json.loads((tmp_path / "cached" / "cache_summary.json").read_text())["models"]["one"]["images"] == 2


def test_a_quiet_python_call_silences_the_detector_libraries_as_the_command_does(tmp_path):
    config = {"name": "one", "models": [{"type": "ultralytics", "weights": str(YOLO26N), "name": "yolo26n"}],
              "fusion": {"method": "wbf"}}
    (tmp_path / "one.yaml").write_text(json.dumps(config))  # JSON is YAML
    image = sorted((DATA / "images").iterdir())[0]
    code = (f"import detens, sys; sys.exit(detens.fuse_images({str(tmp_path / 'one.yaml')!r}, {str(image)!r}, "
            f"{str(tmp_path / 'out')!r}, quiet=True))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    # Ultralytics' "Loading ... for LiteRT inference", and LiteRT's own line on file descriptor 2
    assert "Loading" not in done.stdout + done.stderr and "XNNPACK" not in done.stdout + done.stderr, done
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["done"] == 1


@pytest.mark.parametrize("once", [True, False])
def test_an_actor_that_dies_on_every_try_stops_the_run_and_one_that_dies_once_does_not(cluster, tmp_path, once):
    """Ray Data retried the batch of an actor that died without end: the run waited forever."""
    from detens.engines.ray_cache import RayOptions, map_on_actors

    class _DiesOnImageThree:  # defined here: the actors get it by value, not by importing this module
        """Kills its own process on the item 3 (as a native crash, or the system killing it for memory,
        would); with ``once``, only the first time (a marker file says it did)."""

        def __init__(self, marker: str, once: bool) -> None:
            self.marker, self.once = marker, once

        def __call__(self, batch):
            import os

            if 3 in batch["x"] and not (self.once and os.path.exists(self.marker)):
                open(self.marker, "w").close()
                os._exit(1)
            return {"x": batch["x"], "failure": [""] * len(batch["x"])}

    rows = map_on_actors([{"x": x} for x in range(6)], _DiesOnImageThree,
                         {"marker": str(tmp_path / "died"), "once": once}, 1, RayOptions())
    if once:
        assert sorted(int(row["x"]) for row in rows) == list(range(6))
    else:
        with pytest.raises(ChildProcessError, match=r"^a Ray actor \(_DiesOnImageThree\) died on the same images 4 "
                                                    r"times: a native crash, or the system killing it for memory"):
            list(rows)
    assert (tmp_path / "died").exists()
