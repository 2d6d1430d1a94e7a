"""The commands' jobs as Python calls (``detens.cache``, ``detens.fuse_images``): options of NumPy types, and
``quiet=True`` undone when the call returns or raises. The command's own work is replaced by a stand-in that
records what it was given and what it found; the jobs on real data are tested in test_cache_cli.py and
test_fuse_cli.py."""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import detens
import detens.jobs
import detens.jobs.calls
from detens.cli import command_parser, run_command
from detens.jobs._options import UsageError, check_finite_number

REPO = Path(__file__).resolve().parents[1]
LOGGERS = ("ultralytics", "openvino", "onnxruntime")
ENVIRON = ("YOLO_VERBOSE", "TF_CPP_MIN_LOG_LEVEL")


def _state() -> dict:
    """What --quiet changes: the detector libraries' logger levels and the environment they read."""
    return {
        "levels": {name: logging.getLogger(name).level for name in LOGGERS},
        "environ": {key: os.environ.get(key) for key in ENVIRON},
    }


def _stderr_is_devnull() -> bool:
    null, fd_2 = os.stat(os.devnull), os.fstat(2)
    return (fd_2.st_dev, fd_2.st_ino) == (null.st_dev, null.st_ino)


@pytest.fixture
def stand_in(monkeypatch):
    """Replace the cache and fuse commands' work by a stand-in: ``stand_in.seen`` holds, per call, the
    options it was given and the state it ran in; ``stand_in.error`` (if set) is raised by it."""

    class StandIn:
        seen: list[dict] = []
        error: BaseException | None = None

        def __call__(self, args):
            self.seen.append({"args": args, "state": _state(), "stderr": sys.stderr,
                              "fd_2_silenced": _stderr_is_devnull()})
            if self.error is not None:
                raise self.error
            return 0

    run = StandIn()
    run.seen = []
    for command in ("cache", "fuse"):  # the job itself, which the command line and the Python call both reach
        monkeypatch.setattr(detens.jobs.job(command)[0], "run", run)
    for key in ENVIRON:
        monkeypatch.delenv(key, raising=False)
    levels = {name: logging.getLogger(name).level for name in LOGGERS}
    yield run
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


# ---------------------------------------------------------------------------------------------- option types
def test_numpy_numbers_are_options_of_their_kind(stand_in, tmp_path):
    """Counts and numbers computed with NumPy are the ints and floats they hold; a float is still no count."""
    assert detens.cache(out=tmp_path / "o", merge=True, max_images=np.int64(2), imgsz=np.int32(320),
                        conf=np.float32(0.25), iou=np.int16(1), overwrite=np.bool_(True)) == 0
    args = stand_in.seen[-1]["args"]
    assert (args.max_images, args.imgsz, args.conf, args.iou, args.overwrite) == (2, 320, 0.25, 1.0, True)
    assert [type(v) for v in (args.max_images, args.imgsz, args.conf, args.iou, args.overwrite)] == [
        int, int, float, float, bool]
    assert detens.fuse_images("cfg.yaml", "images", tmp_path / "f", imgsz=np.uint16(640)) == 0
    assert stand_in.seen[-1]["args"].imgsz == 640 and type(stand_in.seen[-1]["args"].imgsz) is int

    for options, message in [
        ({"max_images": 2.0}, r"max_images must be an int, got float: 2.0"),
        ({"max_images": np.float64(2.0)}, r"max_images must be an int, got float64"),
        ({"max_images": np.bool_(True)}, r"max_images must be an int, got bool"),
        ({"conf": np.bool_(True)}, r"conf must be a number, got bool"),
        ({"overwrite": np.int64(1)}, r"overwrite must be True or False, got int64"),
    ]:
        with pytest.raises(TypeError, match=message):
            detens.cache(out=tmp_path / "o", merge=True, **options)
    assert len(stand_in.seen) == 2  # the refused calls ran nothing


# ---------------------------------------------------------------------------------------------------- quiet
@pytest.mark.parametrize(
    "error, raised",
    [(None, None), (UsageError("bad"), ValueError), (ValueError("bad"), ValueError),
     (KeyboardInterrupt(), KeyboardInterrupt)],
)
@pytest.mark.parametrize("job", ["cache", "fuse_images"])
def test_quiet_is_undone_when_the_call_returns_or_raises(stand_in, tmp_path, job, error, raised):
    logging.getLogger("openvino").setLevel(logging.DEBUG)  # a level of the caller's own, kept
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"  # so is a value the caller set
    before = _state()
    stand_in.error = error
    call = {
        "cache": lambda: detens.cache(out=tmp_path / "o", merge=True, quiet=True),
        "fuse_images": lambda: detens.fuse_images("cfg.yaml", "images", tmp_path / "f", quiet=True),
    }[job]
    if raised is None:
        assert call() == 0
    else:
        with pytest.raises(raised):
            call()
    during = stand_in.seen[-1]["state"]
    assert during["levels"] == dict.fromkeys(LOGGERS, logging.WARNING)
    assert during["environ"] == {"YOLO_VERBOSE": "False", "TF_CPP_MIN_LOG_LEVEL": "0"}
    assert _state() == before


def test_quiet_python_calls_leave_a_stderr_of_the_callers_own(stand_in, tmp_path, capsys):
    """Where ``sys.stderr`` is no file descriptor 2 (pytest's capture here, a notebook's elsewhere), the Python
    call keeps it and leaves descriptor 2 alone; the command silences descriptor 2 as it always has."""
    callers, before = sys.stderr, _state()
    assert detens.cache(out=tmp_path / "o", merge=True, quiet=True) == 0
    assert stand_in.seen[-1]["stderr"] is callers and not stand_in.seen[-1]["fd_2_silenced"]

    assert run_command("cache", ["--out", str(tmp_path / "o"), "--merge", "--quiet"]) == 0
    assert stand_in.seen[-1]["fd_2_silenced"] and stand_in.seen[-1]["state"]["environ"]["YOLO_VERBOSE"] == "False"
    assert sys.stderr is callers and not _stderr_is_devnull()
    assert _state() == before  # the command puts them back as well, for a caller that goes on


_ULTRALYTICS_STATE = """
import json, logging, os, sys
from detens.jobs._logging import libraries_quieted

def state():
    import ultralytics.utils as utils
    logger = logging.getLogger("ultralytics")
    handlers = [h.level for h in logger.handlers if h.name == "ultralytics.utils.set_logging"]
    return {"VERBOSE": utils.VERBOSE, "level": logger.level, "handlers": handlers,
            "YOLO_VERBOSE": os.environ.get("YOLO_VERBOSE")}

if sys.argv[1] == "quieted":
    with libraries_quieted():
        during = state()
    print(json.dumps({"during": during, "after": state()}))
else:
    print(json.dumps({"after": state()}))
"""


@pytest.mark.slow
def test_ultralytics_imported_while_quiet_is_set_up_as_a_later_import_would_be():
    """Imported within a quiet call, Ultralytics reads YOLO_VERBOSE=False into its flag and logger; after the
    call they are what a plain import gives (each in a fresh process: an import happens once)."""
    env = {key: value for key, value in os.environ.items() if key not in ENVIRON}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])

    def run(mode):
        done = subprocess.run([sys.executable, "-c", _ULTRALYTICS_STATE, mode], env=env, capture_output=True,
                              text=True, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    quieted, plain = run("quieted"), run("plain")
    assert quieted["during"]["VERBOSE"] is False and quieted["during"]["level"] > logging.WARNING
    assert quieted["after"] == plain["after"]
    assert plain["after"]["VERBOSE"] is True and plain["after"]["YOLO_VERBOSE"] is None


# ------------------------------------------------------------------------------------- the options of each job
@pytest.mark.parametrize("command", sorted(detens.jobs.JOBS))
def test_each_flag_of_a_command_is_an_option_of_its_job_with_the_same_default(command):
    """The command line and the Python call reach the job through one options class: a flag the job does not
    know, or a default that differs between the two, would make them run different jobs."""
    from detens.cli import command_parser

    _, options_class = detens.jobs.job(command)
    parser = command_parser(command)
    flags = {a.dest: a.default for a in parser._actions if a.dest not in ("help", "debug")}
    fields = {f.name: f.default for f in dataclasses.fields(options_class) if f.name in options_class.option_names()}
    assert sorted(flags) == sorted(fields)
    assert {name: flags[name] for name in flags} == fields
    required = {a.dest for a in parser._actions if a.required}
    assert required == {f.name for f in dataclasses.fields(options_class) if f.metadata.get("required")}


#: every option that names a file or a folder, per command (a positional one by its name); the pairs take two paths
PATH_OPTIONS = {
    "fuse": ["--config", "--source", "--out", "--head", "--weights-dir"],
    "cache": ["--config", "--images", "--gt", "--out", "--weights-dir"],
    "train": ["--gt", "--predictions", "--out", "--config", "--images-from", "--also-fit-on"],
    "evaluate": ["--gt", "--predictions", "--also-fit-on", "--fit-on", "--out", "--plot", "--reliability", "--report",
                 "--images"],
    "bench": ["--out", "--engines", "--config", "--coco"],
    "report": ["evaluation", "--out", "--images"],
    "configs": ["--out"],
}
_PAIRS = ("--also-fit-on", "--fit-on", "--coco")


@pytest.mark.parametrize("command, left_out", [
    *((command, None) for command in sorted(PATH_OPTIONS) if command != "evaluate"),
    ("evaluate", "--fit-on"), ("evaluate", "--also-fit-on"),  # they exclude each other
])
@pytest.mark.parametrize("prefix", ["~/", "./~/"])
def test_every_path_option_reads_a_leading_tilde_as_the_home_folder_and_one_after_dot_slash_as_a_folder(
    command, left_out, prefix, tmp_path, monkeypatch
):
    """A shell leaves ``~`` as written after ``--out=`` and in quotes: the job expands it, as it does in a
    Python call, and never creates a folder named ``~`` in the working directory. ``./~/`` is that folder,
    never the home folder, though ``Path`` drops the ``./`` (``Path("./~/x")`` is ``Path("~/x")``)."""
    home = tmp_path / "home"
    folder = home if prefix == "~/" else tmp_path / "~"
    (home / "weights_dir").mkdir(parents=True)
    (tmp_path / "~" / "weights_dir").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    _, options_class = detens.jobs.job(command)
    path_kinds = ("path", "input_path", "folder", "existing_folder", "output_file", "file_or_folder")
    listed = {flag.removeprefix("--").replace("-", "_") for flag in PATH_OPTIONS[command]}
    assert {f.name for f in dataclasses.fields(options_class) if f.metadata.get("kind") in path_kinds} <= listed
    argv, expected = [], {}
    for flag in PATH_OPTIONS[command]:
        name = flag.removeprefix("--").replace("-", "_")
        if flag == left_out:
            continue
        if flag in _PAIRS:
            argv += [flag, f"{prefix}{name}_1", f"{prefix}{name}_2"]
            expected[name] = (str(folder / f"{name}_1"), str(folder / f"{name}_2"))
        else:
            argv.append(f"{flag}={prefix}{name}" if flag.startswith("--") else f"{prefix}{name}")
            expected[name] = str(folder / name)
    if command == "evaluate":
        argv += ["--train-config", f"deep={prefix}deep.yaml", *(["--cv", "0"] if left_out == "--also-fit-on" else [])]
    options = options_class.from_namespace(command_parser(command).parse_args(argv))
    given = {name: getattr(options, name) for name in expected}

    def given_again(value):  # as a message shows it, or a hint gives it to detens again
        return os.path.abspath(os.path.expanduser(str(value)))

    assert {name: tuple(map(given_again, v)) if isinstance(v, (tuple, list)) else given_again(v)
            for name, v in given.items()} == expected
    if command == "evaluate":
        assert os.path.abspath(options.train_config[0].removeprefix("deep=")) == str(folder / "deep.yaml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "~"] and [p.name for p in (tmp_path / "~").iterdir()] == ["weights_dir"]


def test_options_are_checked_as_they_are_made(tmp_path):
    from detens.jobs.report import ReportOptions

    (tmp_path / "file").write_text("")
    options = ReportOptions.from_python({"evaluation": tmp_path / "r.json", "out": str(tmp_path / "page"),
                                          "examples": np.int64(2)})
    assert (options.evaluation, options.out, options.examples, options.conf) == (
        str(tmp_path / "r.json"), tmp_path / "page", 2, 0.3)
    assert type(options.examples) is int and options.command_line is None
    for given, error, message in [
        ({"out": tmp_path / "page"}, TypeError, r"report\(\) needs evaluation"),
        ({"evaluation": "r.json", "out": tmp_path / "file"}, ValueError, r"out: expected a folder, got .*which is a file"),
        ({"evaluation": "r.json", "out": ""}, ValueError, r"out: expected a folder, got an empty path"),
        ({"evaluation": "r.json", "out": "p", "examples": 2.0}, TypeError, r"examples must be an int, got float"),
        ({"evaluation": "r.json", "out": "p", "conf": "0.3"}, TypeError, r"conf must be a number, got str"),
        ({"evaluation": "r.json", "out": "p", "quiet": "no"}, TypeError, r"quiet must be True or False"),
        ({"evaluation": "r.json", "out": "p", "pages": 2}, TypeError, r"report\(\) got unknown options \['pages'\]; valid: conf, evaluation"),
        ({"evaluation": "r.json", "out": "p", "command_line": ["x"]}, TypeError, r"unknown options \['command_line'\]"),
    ]:
        with pytest.raises(error, match=message):
            ReportOptions.from_python(given)


def test_an_option_and_the_way_to_resume_are_named_in_the_callers_words(tmp_path):
    from detens.jobs.fuse import FuseOptions

    given = {"config": "coco_yolo3", "source": "images", "out": tmp_path / "o"}
    from_python = FuseOptions.from_python(given)
    from_command = FuseOptions(**given, command_line=("detens", "fuse"))
    assert [from_python.option(name) for name in ("vis_conf", "overwrite", "source")] == [
        "vis_conf", "overwrite=True", "source"]
    assert [from_command.option(name) for name in ("vis_conf", "overwrite", "source")] == [
        "--vis-conf", "--overwrite", "--source"]
    for internal_or_unknown in ("command_line", "methd"):
        with pytest.raises(KeyError, match=f"FuseOptions has no option '{internal_or_unknown}'"):
            from_python.option(internal_or_unknown)
    assert (from_python.run_again, from_command.run_again) == ("make the same call again", "run the same command again")
    # the same run with overwrite again would discard the finished work, not resume it
    overwriting = FuseOptions.from_python({**given, "overwrite": True})
    assert overwriting.run_again == "make the same call again without overwrite=True"
    assert FuseOptions(**given, overwrite=True, command_line=("detens", "fuse")).run_again == (
        "run the same command again without --overwrite")


PYTHON_CALLS = [name for name in detens.jobs.calls.__all__ if name in detens.__all__]
#: arguments each Python call needs before its options are read
NEEDED = {"cache": {}, "fuse_images": {"config": "coco_yolo3", "source": "images", "out": "out"}}


@pytest.mark.parametrize("call", PYTHON_CALLS)
def test_a_python_call_names_itself_in_its_option_errors(call, stand_in):
    """``fuse()`` would be ``detens.fuse``, another function than the ``detens.fuse_images`` called."""
    assert sorted(PYTHON_CALLS) == sorted(NEEDED)
    with pytest.raises(TypeError, match=rf"^{call}\(\) got unknown options \['methd'\]; valid: "):
        getattr(detens, call)(**NEEDED[call], methd="wbf")
    assert stand_in.seen == []


@pytest.mark.parametrize("command, option", [("evaluate", "out"), ("evaluate", "plot"), ("evaluate", "reliability"),
                                             ("train", "out"), ("bench", "out")])
def test_a_file_to_write_given_as_a_folder_path_is_refused_from_python_too(command, option):
    options_class = detens.jobs.job(command)[1]
    given = {"gt": "gt.json", "predictions": "p", "out": "r.json"} if command != "bench" else {}
    with pytest.raises(ValueError, match=rf"^{option}: expected a file path, got 'runs/x/': a path ending in / names a folder$"):
        options_class.from_python({**given, option: "runs/x/"})
    with pytest.raises(ValueError, match=rf"^{option}: expected a file path, got an empty path$"):
        options_class.from_python({**given, option: ""})
    assert getattr(options_class.from_python({**given, option: Path("runs/x.json")}), option) == "runs/x.json"


def test_a_folder_to_write_in_may_end_in_a_separator_in_python_calls(stand_in, tmp_path):
    detens.fuse_images("coco_yolo3", "images", f"{tmp_path}/fused/")
    detens.cache(images=str(tmp_path), gt="gt.json", out=f"{tmp_path}/cached/")
    assert [seen["args"].out for seen in stand_in.seen] == [tmp_path / "fused", tmp_path / "cached"]


def test_the_jobs_never_reach_up_to_the_command_line():
    """The command imports the jobs, never the other way: a job run from Python loads no parser and no
    command-line module (checked in a fresh interpreter, where nothing else has imported them)."""
    modules = [f"detens.jobs.{name}" for name in ("calls", "_engine", "_inputs", "_logging", "_outputs")]
    modules += [module for module, _ in detens.jobs.JOBS.values()]
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m == 'argparse' or m.startswith('detens.cli')))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    loaded = done.stdout.strip().splitlines()[-1]
    assert "detens.cli" not in loaded, loaded
    for module in modules:  # argparse may come with a library; the jobs' own code never uses it
        source = Path(importlib.import_module(module).__file__).read_text()
        assert "argparse" not in source, module


def test_a_python_call_names_its_keyword_options_where_the_command_names_flags(stand_in, tmp_path, capsys):
    stand_in.error = UsageError("--ray-address, --actors and --gpus-per-actor go with --engine ray (--help, --x)")
    with pytest.raises(ValueError) as raised:
        detens.cache(out=tmp_path / "o", merge=True)
    assert type(raised.value) is ValueError  # the library's error, not the command's
    assert str(raised.value) == "ray_address, actors and gpus_per_actor go with engine ray (--help, --x)"
    # the command line keeps its flags
    assert run_command("cache", ["--out", str(tmp_path / "o"), "--merge"]) == 2
    assert "--ray-address, --actors and --gpus-per-actor go with --engine ray" in capsys.readouterr().err


def test_a_python_call_names_its_keyword_options_in_a_connection_error_too(stand_in, tmp_path):
    """Where nothing answers at --ray-address, the job's ConnectionError named the flag to a Python caller."""
    stand_in.error = ConnectionError("no Ray cluster answers at the --ray-address 'head:6379' (Connection refused)")
    with pytest.raises(ConnectionError) as raised:
        detens.cache(out=tmp_path / "o", merge=True)
    assert str(raised.value) == "no Ray cluster answers at the ray_address 'head:6379' (Connection refused)"


def test_in_python_words_rewrites_whole_flags_of_the_job_only():
    from detens.jobs.calls import in_python_words

    names = ["max_det", "max_images", "shard"]
    assert in_python_words("--max-det and --max-images; --shard 1/2", names) == "max_det and max_images; shard 1/2"
    assert in_python_words("--max-detections, --shards, a--shard, --", names) == "--max-detections, --shards, a--shard, --"
    assert in_python_words("", names) == ""
    # an option without a value reads as the keyword that sets it
    flags = ["overwrite"]
    assert in_python_words("--shard with --overwrite", [*names, *flags], flags) == "shard with overwrite=True"
    # another run's command line, quoted, keeps its flags; the text around it is reworded
    held = "out is in use by detens cache --shard 0/2 (pid 12): use another --shard"
    assert in_python_words(held, names) == held.removesuffix("--shard") + "shard"
    quoted = "not a file of `detens cache --shard`; the detens cache run on --shard"
    assert in_python_words(quoted, names) == quoted.removesuffix("--shard") + "shard"


def test_a_python_calls_log_lines_name_its_keyword_options_during_the_call_only(stand_in, tmp_path, caplog,
                                                                                 monkeypatch):
    """The job's log lines are reworded as its errors are, on each detens logger, for the call alone."""
    loggers = [logging.getLogger(name) for name in ("detens.cache", "detens.jobs._unfinished")]

    def log_and_raise(args):
        for logger in loggers:
            logger.warning("%s: with --gt %s, without --overwrite, or %s", "out", "gt.json", "--max-images")
        raise ValueError("in use by detens cache --shard 0/2: use another --out")

    monkeypatch.setattr(detens.jobs.job("cache")[0], "run", log_and_raise)
    with pytest.raises(ValueError, match=r"^in use by detens cache --shard 0/2: use another out$"):
        detens.cache(out=tmp_path / "o", merge=True)
    said = [record.getMessage() for record in caplog.records]
    assert said == ["out: with gt gt.json, without overwrite=True, or max_images"] * 2, said
    assert all(not logger.filters for logger in loggers)  # gone once the call returned
    caplog.clear()
    loggers[0].warning("after the call: --gt")
    assert [record.getMessage() for record in caplog.records] == ["after the call: --gt"]


def test_each_kind_of_option_is_checked_as_its_flag_is(tmp_path):
    from detens.jobs.evaluate import EvaluateOptions
    from detens.jobs.fuse import FuseOptions

    given = {"gt": "gt.json", "predictions": "p", "out": "r.json"}
    options = EvaluateOptions.from_python({**given, "threads": np.int8(2), "seed": [np.int64(0), 1],
                                           "also_fit_on": ("gt2.json", tmp_path), "train_config": ["deep=d.yaml"]})
    assert (options.threads, options.seed, options.also_fit_on, options.train_config) == (
        2, (0, 1), ("gt2.json", str(tmp_path)), ("deep=d.yaml",))
    assert EvaluateOptions.from_python(given).seed == (0,)  # the flag's default, "0", read as --seed reads it
    for extra, error, message in [
        ({"threads": 0}, ValueError, r"threads must be an int >= 1, got 0"),
        ({"backend": "cocoeval"}, ValueError, r"backend must be one of 'pycocotools', .*got 'cocoeval'"),
        ({"seed": 0.5}, TypeError, r"seed must be an int, a list of ints"),
        ({"seed": "0,0"}, ValueError, r"^seed lists a seed twice"),
        ({"seed": [-1]}, ValueError, r"^seed takes seeds >= 0"),
        ({"also_fit_on": "gt2.json"}, TypeError, r"also_fit_on must be a pair"),
        ({"train_config": "deep=d.yaml"}, TypeError, r"train_config must be a list of str"),
        ({"also_fit_on": ("a", "b"), "fit_on": ("c", "d")}, ValueError, r"also_fit_on and fit_on exclude each other"),
    ]:
        with pytest.raises(error, match=message):
            EvaluateOptions.from_python({**given, **extra})

    fuse = FuseOptions.from_python({"source": "images", "out": tmp_path / "f", "weights_dir": tmp_path})
    assert (fuse.config, fuse.engine, fuse.actors, fuse.weights_dir) == ("coco_yolo3", "local", None, str(tmp_path))  # None: 1 actor
    with pytest.raises(ValueError, match=r"weights_dir: no such folder: .*missing"):
        FuseOptions.from_python({"source": "images", "out": tmp_path / "f", "weights_dir": tmp_path / "missing"})
    # empty: refused as --images and --out refuse it, not looked up as a folder named ''
    with pytest.raises(ValueError, match=r"^weights_dir: expected a folder, got an empty path \(write \. for the working"):
        FuseOptions.from_python({"source": "images", "out": tmp_path / "f", "weights_dir": ""})
    with pytest.raises(ValueError, match=r"engine must be one of 'local', 'ray', got 'rayy'"):
        FuseOptions.from_python({"source": "images", "out": tmp_path / "f", "engine": "rayy"})
    assert FuseOptions.from_python({"source": "images", "out": tmp_path / "f", "conf": np.float32(0.5)}).conf == 0.5
    # an int beyond the float range too, which float() refuses with an OverflowError naming no option
    for bad in (math.nan, math.inf, np.float64("-inf"), 10**400, -(10**400)):
        for key in ("conf", "vis_conf"):
            with pytest.raises(ValueError, match=rf"^{key} must be a finite number, got"):
                FuseOptions.from_python({"source": "images", "out": tmp_path / "f", key: bad})


@pytest.mark.parametrize(
    "command, flag, value",
    [("fuse", "--conf", "nan"), ("fuse", "--vis-conf", "inf"), ("cache", "--conf", "-inf"), ("cache", "--iou", "nan"),
     ("train", "--lr", "nan"), ("report", "--conf", "inf"), ("fuse", "--gpus-per-actor", "nan")],
)
def test_a_number_flag_that_is_not_finite_is_named(command, flag, value, capsys):
    """float() reads nan and inf; the config's own check would then blame the config file for them."""
    with pytest.raises(SystemExit) as stop:
        command_parser(command).parse_args([f"{flag}={value}"])  # "-inf" alone would read as a flag
    assert stop.value.code == 2
    assert f"argument {flag}: expected a finite number, got '{value}'" in capsys.readouterr().err


@pytest.mark.parametrize("value", [10**400, -(10**400), "1" + "0" * 400], ids=["10**400", "-10**400", "text"])
def test_a_number_beyond_the_float_range_is_not_finite(value):
    """An int that no float holds is refused as an infinity is, not with float()'s OverflowError."""
    with pytest.raises(ValueError, match=r"^expected a finite number, got "):
        check_finite_number(value)


def test_a_refused_value_names_the_keyword_option_in_a_python_call(tmp_path, capsys):
    """Not only usage errors: the job's refusal of a value (no image matches the source) keeps its type and
    names ``source``, where the command names ``--source``."""
    pattern = str(tmp_path / "none*.jpg")
    with pytest.raises(ValueError, match=r"^no images found in source ") as raised:
        detens.fuse_images("coco_yolo3", pattern, tmp_path / "out")
    assert "--source" not in str(raised.value)
    assert run_command("fuse", ["--source", pattern, "--out", str(tmp_path / "out2")]) == 2
    assert "error: no images found in --source" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------- Ctrl-C
def test_a_held_ctrl_c_is_seen_after_the_block_and_a_handler_of_the_programs_own_is_left_alone(real_signals_handled):
    import signal

    from detens.jobs._interrupts import ctrl_c_held

    with ctrl_c_held() as ctrl_c:
        signal.raise_signal(signal.SIGINT)  # no KeyboardInterrupt here
        assert ctrl_c.pressed
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        with ctrl_c_held() as ctrl_c:
            signal.raise_signal(signal.SIGINT)
        assert seen == [signal.SIGINT] and not ctrl_c.pressed
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_sigterm_is_a_ctrl_c_under_the_command_line_held_and_seen_as_one_and_its_handler_put_back(
        real_signals_handled):
    import signal

    from detens._termination import Terminated, raise_terminated, sigterm_as_interruption, was_terminated
    from detens.jobs._interrupts import ctrl_c_held, raise_interruption

    before = signal.getsignal(signal.SIGTERM)
    with sigterm_as_interruption():
        assert signal.getsignal(signal.SIGTERM) is raise_terminated
        with pytest.raises(Terminated):
            signal.raise_signal(signal.SIGTERM)
        with ctrl_c_held() as held:
            signal.raise_signal(signal.SIGTERM)  # held: the block ends first
            assert held.pressed and held.terminated
        assert signal.getsignal(signal.SIGTERM) is raise_terminated
        assert isinstance(held.interruption(), Terminated)
        with ctrl_c_held() as held:
            signal.raise_signal(signal.SIGINT)
        assert held.pressed and not held.terminated and type(held.interruption()) is KeyboardInterrupt
    assert signal.getsignal(signal.SIGTERM) is before
    with ctrl_c_held():  # no command line: SIGTERM is not held (its default would end the test run)
        assert signal.getsignal(signal.SIGTERM) is before
    # an error that code broken by the SIGTERM raises, re-raised as the interruption, still tells where it came from
    try:
        try:
            raise Terminated
        except Terminated:
            raise RuntimeError("a lock released twice")  # noqa: B904  as such code raises it
    except RuntimeError as broken:
        with pytest.raises(KeyboardInterrupt) as raised:
            raise_interruption(broken)
    assert was_terminated(raised.value) and not was_terminated(KeyboardInterrupt())
