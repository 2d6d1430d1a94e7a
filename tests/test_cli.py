"""The `detens` command: user mistakes end as one `error:` line and exit status 2 (no traceback), before
any detector loads; the built package runs from a folder outside the repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from detens import ThetaHead
from detens.cli import COMMANDS, build_parser, main

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
IMAGE = SHARED / "data" / "coco_val2017_206" / "images" / "000000000139.jpg"

needs_data = pytest.mark.skipif(not IMAGE.is_file(), reason="needs ../shared/data/coco_val2017_206")


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A folder with one image, a config whose weights do not exist, one with a typo, a head for other
    models and a train file that is not a head."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "images").mkdir()
    if IMAGE.is_file():
        (tmp_path / "images" / IMAGE.name).write_bytes(IMAGE.read_bytes())
    config = {"name": "bad", "models": [{"type": "ultralytics", "weights": "no_such_model.tflite", "name": "x"}]}
    (tmp_path / "missing_weights.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump({**config, "confg": 0.1}))
    ThetaHead(["a", "b", "c"]).save(tmp_path / "other_models.json")
    (tmp_path / "folder.json").mkdir()
    return tmp_path


def fuse_args(*extra: str) -> list[str]:
    return ["fuse", "--source", "images", "--out", "out", *extra]


MISTAKES = [
    # (case, argv, what the error line says)
    ("wrong weights path", fuse_args("--config", "missing_weights.yaml"), r"weights 'no_such_model\.tflite' not found"),
    ("YAML typo", fuse_args("--config", "typo.yaml"), r"unknown key 'confg'.*conf"),
    ("unknown method", fuse_args("--method", "wbff"), r"unknown fusion method 'wbff'.*Did you mean 'wbf'"),
    ("head for other models", fuse_args("--head", "other_models.json"), r"trained for models \['a', 'b', 'c'\], not for the models \['yolov8n', 'yolo11n', 'yolo26n'\] it was given to fuse \(its weights belong to its models; fit a head on these models' predictions; if they are those detectors under other names, name them as the head does \(an ensemble YAML's `name`, a detector's name=\.\.\., fuse_results' model_names=\[\.\.\.\], a Detections' source\)\)"),
    ("head of another type", fuse_args("--method", "deep", "--head", "coco_yolo3_theta"), r"given a 'theta' head"),
    ("head with a fixed fuser", fuse_args("--method", "nms", "--head", "coco_yolo3_deep"), r"fixed fuser 'nms'"),
    ("unknown config name", fuse_args("--config", "coco_yolo9"), r"'coco_yolo9' not found.*coco_yolo3"),
    ("no such source", ["fuse", "--source", "no_such_folder", "--out", "out"], r"image source not found: 'no_such_folder'"),
    ("missing --source", ["fuse", "--out", "out"], r"required: --source"),
    ("bad number", fuse_args("--conf", "abc"), r"--conf: expected a number, got .abc."),
    # what int() and float() read, but a command line more likely holds by a slip
    ("integer with an underscore", fuse_args("--imgsz", "6_40"), r"argument --imgsz: expected an integer, got '6_40'"),
    ("number with an underscore", fuse_args("--conf", "0_5"), r"argument --conf: expected a number, got '0_5'"),
    ("count with spaces", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json", "--max-det", " 100"],
     r"argument --max-det: expected an integer >= 1, got ' 100'"),
    ("seed with an underscore", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                 "--seed", "0,1_0"], r"--seed takes an integer or comma-separated integers"),
    ("unknown command", ["fusee"], r"invalid choice: 'fusee'"),
    # named by the command that does not know it, with the flag it has nearest
    ("unknown flag", fuse_args("--conff", "0.1"),
     r"^error: detens fuse: unrecognized arguments: --conff 0\.1; did you mean --conf\? \(see detens fuse --help\)$"),
    ("flag of another command", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json", "--config", "c"],
     r"^error: detens evaluate: unrecognized arguments: --config c; did you mean --train-config\?"),
    # argparse reads a value that starts with '-' as an option: the message says how to give it
    ("value that starts with a dash", ["cache", "--config", "coco_yolo3", "--out", "o", "--shard", "-1/2"],
     r"^error: detens cache: argument --shard: expected one argument; argparse takes '-1/2' for an option: write "
     r"--shard=-1/2 \(see detens cache --help\)$"),
    ("option without its value", ["cache", "--config", "coco_yolo3", "--out", "o", "--shard"],
     r"^error: detens cache: argument --shard: expected one argument \(see detens cache --help\)$"),
    ("stray argument", fuse_args("extra"), r"^error: detens fuse: unrecognized arguments: extra \(see detens fuse --help\)$"),
    ("--cv 1", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json", "--cv", "1"], r"--cv must be"),
    ("unknown evaluate method", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                 "--methods", "wbf,deeep"], r"unknown evaluation method 'deeep'.*Did you mean 'deep'"),
    ("missing annotations", ["train", "--gt", "gt.json", "--predictions", "p", "--out", "h.json"], r"gt\.json"),
    ("head file suffix", ["train", "--gt", "gt.json", "--predictions", "p", "--out", "h.txt"], r"\.json or \.safetensors"),
    ("--set value not YAML", ["train", "--gt", "gt.json", "--predictions", "p", "--out", "h.json", "--set", "epochs=[1,"],
     r"--set 'epochs=\[1,': the value is not valid YAML"),
    ("--set a key twice", ["train", "--gt", "gt.json", "--predictions", "p", "--out", "h.json", "--set", "lr=0.1",
                           "--set", "lr=0.2"],
     r"^error: detens train: --set 'lr=0\.1' and --set 'lr=0\.2' both set lr: give one of them \(see detens train --help\)$"),
    ("evaluate --set a key twice", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                    "--methods", "theta", "--set", "theta.epochs=2", "--set", "theta.epochs=3"],
     r"--set 'theta\.epochs=2' and --set 'theta\.epochs=3' both set theta\.epochs: give one of them"),
    ("evaluate --set a key twice, spaced", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                            "--methods", "theta", "--set", "theta.epochs=2", "--set", "theta. epochs=3"],
     r"^error: detens evaluate: --set 'theta\.epochs=2' and --set 'theta\. epochs=3' both set theta\.epochs: give one"),
    ("train --out under a file", ["train", "--gt", "gt.json", "--predictions", "p", "--out", "typo.yaml/h.json"],
     r"--out typo\.yaml/h\.json cannot be written: typo\.yaml is a file, not a folder"),
    ("train --out a folder", ["train", "--gt", "gt.json", "--predictions", "p", "--out", "folder.json"],
     r"--out folder\.json is a folder; give the path of a file"),
    ("evaluate --out a folder", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "images"],
     r"--out images is a folder"),
    ("evaluate --plot under a file", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                      "--plot", "typo.yaml/p.png"], r"--plot typo\.yaml/p\.png cannot be written"),
    ("bench --out under a file", ["bench", "--out", "typo.yaml/b.json"], r"--out typo\.yaml/b\.json cannot be written"),
    ("cache without --gt", ["cache", "--images", "images", "--out", "out"], r"--images and --gt are required"),
    ("merge without shards", ["cache", "merge", "--out", "out"], r"no shard files"),
    ("evaluate --images missing", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                   "--images", "no_such_folder"], r"--images: no such folder: 'no_such_folder'"),
    ("evaluate --images a file", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                  "--images", "typo.yaml"], r"--images: 'typo\.yaml' is a file, not a folder"),
    ("report --images a file", ["report", "r.json", "--out", "page", "--images", "typo.yaml"],
     r"--images: 'typo\.yaml' is a file, not a folder"),
    ("a line break in a name", ["report", "a\nerror: b.json", "--out", "page"],
     r"evaluation record not found: .*a\\nerror: b\.evaluation\.json\.gz"),
    ("--weights-dir empty", fuse_args("--weights-dir", ""),
     r"argument --weights-dir: expected a folder, got an empty path \(write \. for the working directory\)"),
    ("report --images empty", ["report", "r.json", "--out", "page", "--images", ""],
     r"--images: expected a folder, got an empty path \(write \. for the working directory\)"),
    ("evaluate --images empty", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                 "--images", ""], r"--images: expected a folder, got an empty path"),
    ("evaluate --report a file", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                  "--report", "typo.yaml"], r"argument --report: expected a folder, got .typo\.yaml., which is a file"),
    ("evaluate --report under a file", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                        "--report", "typo.yaml/page"],
     r"--report typo\.yaml/page cannot be written: typo\.yaml is a file, not a folder"),
    ("report --out under a file", ["report", "r.json", "--out", "typo.yaml/page"],
     r"--out typo\.yaml/page cannot be written: typo\.yaml is a file, not a folder"),
    ("evaluate --seed not integers", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                      "--seed", "0,one"], r"--seed takes an integer or comma-separated integers"),
    ("evaluate --seed repeated", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                  "--seed", "1,1"], r"--seed lists a seed twice: '1,1'"),
    ("evaluate --seed negative", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                  "--seed", "0,-1"], r"--seed takes seeds >= 0, got '0,-1'"),
    ("evaluate --methods empty", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                  "--methods", " , "], r"--methods ' , ' names no method; give method names"),
    ("evaluate a method twice", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                 "--methods", "wbf,mean,wbf"], r"methods name \['wbf'\] twice"),
    ("evaluate seeds with --report", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                      "--seed", "0,1", "--report", "out"], r"--report draws one cross-validation"),
    ("evaluate seeds with --images", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                      "--seed", "0,1", "--images", "."], r"--images draws one cross-validation"),
    ("evaluate --threads below 1", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                    "--threads", "-4"], r"--threads: expected an integer >= 1, got -4"),
    ("train --threads not a number", ["train", "--gt", "gt.json", "--predictions", "p", "--out", "h.json",
                                      "--threads", "two"], r"--threads: expected an integer >= 1, got 'two'"),
    ("bench --threads 0", ["bench", "--threads", "0"], r"--threads: expected an integer >= 1, got 0"),
    ("bench --coco with a fuser option", ["bench", "--coco", "gt.json", "r.json", "--sizes", "3x100", "--device", "cuda"],
     r"--sizes, --device would not be used: this run times --coco"),
    ("bench --config without --engines", ["bench", "--config", "coco_yolo4_tta"],
     r"--config would not be used: this run times the fusers"),
    ("bench --coco-sizes with --engines", ["bench", "--engines", "images", "--coco-sizes", "10"],
     r"--coco-sizes would not be used: this run times --engines"),
    ("bench --coco and --engines", ["bench", "--coco", "gt.json", "r.json", "--engines", "images"],
     r"--coco and --engines are two different benchmarks"),
    ("bench --repeats 0", ["bench", "--repeats", "0"], r"--repeats must be at least 1"),
    ("bench --sizes beyond the bound", ["bench", "--sizes", "3x100000000"],
     r"--sizes: size '3x100000000' makes images of 300,000,000 boxes; at most 1,000,000"),
    ("bench --seed -1", ["bench", "--seed=-1"], r"--seed must be an integer >= 0, got -1"),
    ("bench --device unknown", ["bench", "--device", "foo"],
     r"--device must be a torch device: cpu, cuda or cuda:<index>, got 'foo'"),
    ("evaluate --out in the page", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "out/page.json",
                                    "--report", "out"],
     r"the report page in --report out would write over out/page\.json \(--out\)"),
    ("evaluate --plot in the page", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                     "--plot", "out/map.png", "--report", "out"],
     r"the report page in --report out would write over out/map\.png \(--plot\)"),
    ("report over its table", ["report", "out/index.html", "--out", "out"],
     r"the page in --out out would write over out/index\.html \(EVALUATION\)"),
    ("bench --coco-sizes 0", ["bench", "--coco", "gt.json", "r.json", "--coco-sizes", "0"], r"--coco-sizes must be at least 1"),
    ("evaluate seeds without folds", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json",
                                      "--seed", "0,1", "--cv", "0", "--fit-on", "gt.json", "p"],
     r"several --seed values repeat the cross-validation, but --cv 0 has no folds"),
    ("report without a record", ["report", "r.json", "--out", "out"],
     r"evaluation record not found: r\.evaluation\.json\.gz \(detens evaluate writes it"),
    ("report of a folder", ["report", "images", "--out", "out"],
     r"evaluation record \(or the table beside it\) expected, got a folder: images"),
    ("evaluate --gt a folder", ["evaluate", "--gt", "images", "--predictions", "images", "--out", "r.json"],
     r"COCO annotation file expected, got a folder: images"),
    ("report --examples -1", ["report", "r.json", "--out", "out", "--examples", "-1"], r"--examples must be >= 0"),
    ("report --conf 2", ["report", "r.json", "--out", "out", "--conf", "2"], r"--conf must be in \[0, 1\]"),
]


def exit_code_and_stderr(argv: list[str], capsys) -> tuple[int, str]:
    """``detens`` run on ``argv``: its exit status and what it wrote to stderr."""
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's own errors (bad flags) exit from parse_args
        code = stop.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case, argv, expected", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_user_mistakes_are_one_error_line(workspace, capsys, case, argv, expected):
    import re

    code, err = exit_code_and_stderr(argv, capsys)
    assert code == 2, err
    error_lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and "Traceback" not in err, err
    assert err.rstrip("\n").splitlines()[-1] == error_lines[0], err  # the whole message on that line
    assert re.search(expected, error_lines[0]), err
    assert not (workspace / "out").exists() or not any((workspace / "out").iterdir())  # nothing claimed


UNWRITABLE_OUTPUTS = [
    # /proc takes no new entries although its permission bits let root write there
    ("fuse", ["fuse", "--source", "images", "--out", "/proc/detens_out"], "--out /proc/detens_out"),
    ("cache", ["cache", "--images", "images", "--gt", "gt.json", "--out", "/proc/detens_out"], "--out /proc/detens_out"),
    ("train", ["train", "--gt", "gt.json", "--predictions", "p", "--out", "/proc/detens_out/h.json"],
     "--out /proc/detens_out/h.json"),
    ("evaluate", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "/proc/detens_out/r.json"],
     "--out /proc/detens_out/r.json"),
    ("bench", ["bench", "--out", "/proc/detens_out/b.json"], "--out /proc/detens_out/b.json"),
]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("case, argv, named", UNWRITABLE_OUTPUTS, ids=[m[0] for m in UNWRITABLE_OUTPUTS])
def test_an_output_nothing_can_be_created_in_is_refused_before_the_work(workspace, capsys, case, argv, named):
    code, err = exit_code_and_stderr(argv, capsys)
    assert code == 2, err
    why = "no permission to write in /proc" if os.geteuid() else "nothing can be created in /proc"
    assert err.startswith(f"error: {named} cannot be written: {why}") and err.count("\n") == 1, err


@pytest.mark.parametrize("case, argv, named", UNWRITABLE_OUTPUTS, ids=[m[0] for m in UNWRITABLE_OUTPUTS])
def test_an_output_behind_a_link_that_leads_nowhere_is_refused_naming_its_target(workspace, capsys, case, argv,
                                                                                   named):
    """Storage not mounted: the link is there, its folder is not, and mkdir said only "File exists"."""
    try:
        os.symlink("unmounted", "dang")
    except (OSError, NotImplementedError):
        pytest.skip("no symbolic links here")
    code, err = exit_code_and_stderr([a.replace("/proc/detens_out", "dang") for a in argv], capsys)
    assert code == 2, err
    assert err == (f"error: {named.replace('/proc/detens_out', 'dang')} cannot be written: dang is a symbolic link "
                   "to unmounted, which does not exist: create it, or give another path\n")


@pytest.mark.parametrize("value", ["", ",", " , "])
def test_an_empty_methods_value_lists_every_method_name(workspace, capsys, value):
    """An unset shell variable leaves --methods empty: the error says what could have been given."""
    from detens.evaluation import method_names

    code, err = exit_code_and_stderr(
        ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json", "--methods", value], capsys
    )
    assert code == 2
    assert err == (f"error: --methods {value!r} names no method; give method names separated by commas; "
                   f"valid names: {', '.join(method_names())}\n")
    assert {"single", "single:", "head:", "wbf", "deep", "calibration"} <= set(method_names())


def test_an_unknown_method_lists_single_among_the_valid_names(workspace, capsys):
    """``single`` expands to every model before any lookup, so the registry alone does not know it."""
    from detens.evaluation import method_names

    code, err = exit_code_and_stderr(
        ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json", "--methods", "wbf,Single"], capsys
    )
    assert code == 2
    assert err == (f"error: unknown evaluation method 'Single'; valid names: {', '.join(method_names())}. "
                   "Did you mean 'single'?\n")


EMPTY_FOLDERS = [
    ("fuse --out", ["fuse", "--source", "images", "--out", ""], "--out"),
    ("cache --out", ["cache", "--images", "images", "--gt", "gt.json", "--out", ""], "--out"),
    ("cache --images", ["cache", "--images", "", "--gt", "gt.json", "--out", "out"], "--images"),
]


@pytest.mark.parametrize("case, argv, flag", EMPTY_FOLDERS, ids=[m[0] for m in EMPTY_FOLDERS])
def test_an_empty_folder_is_refused_not_taken_for_the_working_directory(workspace, capsys, case, argv, flag):
    before = sorted(p.name for p in workspace.iterdir())
    code, err = exit_code_and_stderr(argv, capsys)
    assert code == 2 and f"argument {flag}: expected a folder, got an empty path" in err, err
    assert sorted(p.name for p in workspace.iterdir()) == before


@pytest.mark.parametrize("case, argv, flag", EMPTY_FOLDERS, ids=[m[0] for m in EMPTY_FOLDERS])
def test_a_file_is_refused_as_a_folder(workspace, capsys, case, argv, flag):
    (workspace / "a_file").write_text("mine")
    argv = [("a_file" if value == "" else value) for value in argv]
    code, err = exit_code_and_stderr(argv, capsys)
    assert code == 2 and f"argument {flag}: expected a folder, got 'a_file', which is a file" in err, err
    assert (workspace / "a_file").read_text() == "mine"


EVALUATE = ["evaluate", "--gt", "gt.json", "--predictions", "p"]
#: every option naming one file to write, with a value ending in a separator
FOLDER_FOR_A_FILE = [
    ("evaluate --out", [*EVALUATE, "--out", "runs/evdir/"], "--out", "runs/evdir/"),
    ("evaluate --plot", [*EVALUATE, "--out", "r.json", "--plot", "runs/plots/"], "--plot", "runs/plots/"),
    ("evaluate --reliability", [*EVALUATE, "--out", "r.json", "--reliability=runs/r/"], "--reliability", "runs/r/"),
    ("train --out", ["train", "--gt", "gt.json", "--predictions", "p", "--out", "heads/"], "--out", "heads/"),
    ("bench --out", ["bench", "--out", "bench/"], "--out", "bench/"),
    ("evaluate --out, an existing folder", [*EVALUATE, "--out", "images/"], "--out", "images/"),
]


@pytest.mark.parametrize("case, argv, flag, value", FOLDER_FOR_A_FILE, ids=[m[0] for m in FOLDER_FOR_A_FILE])
def test_a_file_option_ending_in_a_separator_is_refused_as_typed(workspace, capsys, case, argv, flag, value):
    """``Path`` drops the trailing separator: ``--out runs/evdir/`` wrote the file ``runs/evdir`` (and
    ``runs/evdir.calibration.json`` ...) where the user named a folder."""
    before = sorted(p.name for p in workspace.iterdir())
    code, err = exit_code_and_stderr(argv, capsys)
    command = argv[0]
    assert code == 2 and err == (f"error: detens {command}: argument {flag}: expected a file path, got {value!r}: a path "
                                 f"ending in / names a folder (see detens {command} --help)\n"), err
    assert sorted(p.name for p in workspace.iterdir()) == before


def test_every_option_naming_a_file_to_write_is_of_the_kind_that_refuses_a_folder():
    """The survey above, kept whole: an output file option added later is checked the same way."""
    import dataclasses

    import detens.jobs

    files = sorted(
        (command, field.name)
        for command in detens.jobs.JOBS
        for field in dataclasses.fields(detens.jobs.job(command)[1])
        if field.metadata.get("kind") == "output_file"
    )
    covered = {(argv[0], flag.removeprefix("--")) for _, argv, flag, _ in FOLDER_FOR_A_FILE}
    assert files == [("bench", "out"), ("evaluate", "out"), ("evaluate", "plot"), ("evaluate", "reliability"),
                     ("train", "out")]
    assert set(files) == covered


def test_an_unquoted_glob_expanded_by_the_shell_is_named(workspace, capsys):
    for name in ("a.jpg", "b.jpg", "c.jpg"):
        (workspace / "images" / name).write_bytes(b"")
    for argv, taken in [
        (["fuse", "--source", "images/a.jpg", "images/b.jpg", "images/c.jpg", "--out", "out"],
         "--source takes one value, here images/a.jpg; "),
        (["fuse", "--out", "out", "--source=images/a.jpg", "images/b.jpg", "images/c.jpg"],
         "--source takes one value, here images/a.jpg; "),
        (["configs", "images/a.jpg", "images/b.jpg", "images/c.jpg"], ""),
    ]:
        code, err = exit_code_and_stderr(argv, capsys)
        assert code == 2 and err == (
            f"error: detens {argv[0]}: unrecognized arguments: images/b.jpg images/c.jpg: {taken}quote a glob "
            f"('images/*.jpg') so the shell does not expand it (see detens {argv[0]} --help)\n"
        ), err


EMPTY_FILES = [
    ("fuse --config", fuse_args("--config", ""), "--config"),
    ("fuse --head", fuse_args("--config", "missing_weights.yaml", "--head", ""), "--head"),
    ("cache --config", ["cache", "--config", "", "--images", "images", "--gt", "gt.json", "--out", "out"], "--config"),
    ("train --config", ["train", "--gt", "gt.json", "--predictions", "p", "--out", "h.json", "--config", ""],
     "--config"),
    ("bench --config", ["bench", "--engines", "images", "--config", ""], "--config"),
    ("evaluate head:", ["evaluate", "--gt", "gt.json", "--predictions", "p", "--out", "r.json", "--methods",
                        "mean,head:"], "--methods 'head:'"),
]


@pytest.mark.parametrize("case, argv, flag", EMPTY_FILES, ids=[m[0] for m in EMPTY_FILES])
def test_an_empty_file_or_name_is_refused_not_looked_up_as_the_working_directory(workspace, capsys, case, argv,
                                                                                 flag):
    """An empty --head is not passed over either (the config's own head would run)."""
    before = sorted(p.name for p in workspace.iterdir())
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag}: expected a file or a shipped name, got an empty path" in err, err
    assert str(workspace) not in err
    assert sorted(p.name for p in workspace.iterdir()) == before


@pytest.mark.parametrize("quiet", [[], ["--quiet"]])
def test_a_command_run_in_a_process_leaves_its_logging_as_it_found_it(tmp_path, capsys, quiet):
    """``bench`` runs ``fuse --quiet`` in its own process: its INFO lines must still show afterwards."""
    import logging

    from detens.cli import run_command

    root, seen = logging.getLogger(), []

    class Kept(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    kept = Kept()
    level, handlers = root.level, root.handlers[:]
    root.addHandler(kept)
    root.setLevel(logging.DEBUG)
    try:
        code = run_command("report", [str(tmp_path / "missing.json"), "--out", str(tmp_path / "page"), *quiet])
        assert code == 2 and "evaluation record not found" in capsys.readouterr().err
        assert root.level == logging.DEBUG and kept in root.handlers
        logging.getLogger("detens.bench").info("after the command")
        assert seen == ["after the command"]
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_an_empty_head_is_refused_in_python_calls_too(workspace):
    import detens

    with pytest.raises(ValueError, match="^head: expected a file or a shipped name, got an empty path"):
        detens.fuse_images("missing_weights.yaml", "images", "out", head="")
    assert not (workspace / "out").exists()


def test_an_empty_out_is_refused_in_python_calls_too(workspace):
    import detens

    with pytest.raises(ValueError, match="out: expected a folder, got an empty path"):
        detens.fuse_images("coco_yolo3", "images", "")
    assert not (workspace / "config.yaml").exists()


def test_a_corrupt_weights_file_is_one_error_line_naming_it(workspace, capsys):
    """A truncated .pt checkpoint is the user's file to replace, as a corrupt ONNX model is: no traceback."""
    (workspace / "broken.pt").write_bytes(b"not a checkpoint" * 64)
    config = {"name": "broken", "models": [{"type": "ultralytics", "weights": "broken.pt", "name": "x"}]}
    (workspace / "broken.yaml").write_text(yaml.safe_dump(config))
    code = main(fuse_args("--config", "broken.yaml", "--method", "wbf", "--quiet"))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert "could not load" in err and str(workspace / "broken.pt") in err, err
    assert not (workspace / "out").exists()


@needs_data
def test_a_member_whose_options_its_adapter_refuses_is_one_error_line_naming_it_and_the_file(workspace, capsys):
    """The line named the option alone: which of the members had it was left to guess."""
    (workspace / "saved.json").write_text("[]")
    (workspace / "saved_images.json").write_text(json.dumps({IMAGE.name: 139}))
    saved = {"type": "precomputed", "results": "saved.json", "images": "saved_images.json"}
    weights = SHARED / "models" / "nanodet_m_416_onnx" / "nanodet_m.onnx"
    broken = {"type": "onnx", "weights": str(weights), "decoder": "nanodet_gfl", "name": "nanodet_m",
              "options": {"decoder_options": {"strides": [8, 0, 32]}}}
    config = {"name": "members", "models": [{**saved, "name": "first"}, broken, {**saved, "name": "last"}]}
    (workspace / "members.yaml").write_text(yaml.safe_dump(config))
    code, err = exit_code_and_stderr(fuse_args("--config", "members.yaml", "--method", "wbf", "--quiet"), capsys)
    assert code == 2, err
    assert err.splitlines()[-1] == (
        "error: members.yaml: model 'nanodet_m': decoder_options.strides[1] must be an integer >= 1, got 0"
    ), err
    assert err.count("error:") == 1 and "Traceback" not in err, err


GOOD_GT = {"images": [{"id": 1, "width": 10, "height": 10}], "annotations": [], "categories": [{"id": 1, "name": "a"}]}


@pytest.mark.parametrize("gt, results, expected", [
    ([{"image_id": 1}], [], r"gt\.json holds a list, i\.e\. COCO results, not a COCO annotation file"),
    ({"annotations": []}, [], r"gt\.json is not a COCO annotation file: it lacks \['images', 'categories'\]"),
    ({**GOOD_GT, "images": {"id": 1}}, [], r"gt\.json: 'images' must be a list of objects"),
    (GOOD_GT, {"annotations": []}, r"r\.json must be a list of result dicts, got a dict"),
    (GOOD_GT, [1], r"r\.json\[0\] must be a dict, got int"),
    ({**GOOD_GT, "images": []}, [], r"gt\.json: the annotation file lists no images"),
], ids=["a list", "no images", "images not a list", "results a dict", "results of numbers", "images empty"])
def test_bench_coco_names_the_file_that_is_not_coco(workspace, capsys, gt, results, expected):
    import re

    (workspace / "gt.json").write_text(json.dumps(gt))
    (workspace / "r.json").write_text(json.dumps(results))
    code = main(["bench", "--coco", "gt.json", "r.json", "--coco-sizes", "2", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: ") and re.search(expected, err), err


def test_bench_refuses_a_gpu_this_machine_lacks(workspace, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--device", "cuda", "--sizes", "1x5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "--device is 'cuda' but no CUDA device is available on this machine; use cpu" in err


@pytest.mark.parametrize("module, argv, expected", [
    ("ensemble_boxes", ["--sizes", "1x5", "--repeats", "1"], r"pip install ensemble-boxes"),
    ("ray", ["--engines", "images"], r"pip install 'detens\[ray\]'"),
], ids=["fusers without ensemble_boxes", "engines without ray"])
def test_bench_names_the_package_it_lacks(workspace, capsys, monkeypatch, module, argv, expected):
    """ensemble_boxes and ray are no dependencies of an installed detens: one error line, before any timing."""
    import re

    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed
    assert main(["bench", *argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: ") and re.search(expected, err), err


def test_bench_records_the_command_it_was_given(workspace, capsys):
    from detens.cli import run_command

    argv = ["bench", "--sizes", "1x5", "--repeats", "1", "--out", "b.json", "--quiet"]
    assert main(argv) == 0
    assert json.loads((workspace / "b.json").read_text())["command"] == "detens " + " ".join(argv)
    assert "`detens bench --sizes 1x5 --repeats 1 --out b.json --quiet`" in capsys.readouterr().out
    assert run_command("bench", argv[1:], prog="tools/bench.py") == 0  # called from Python, another argv
    assert json.loads((workspace / "b.json").read_text())["command"] == "tools/bench.py " + " ".join(argv[1:])


def test_bench_coco_times_the_evaluators_not_the_input_checks(workspace, monkeypatch):
    """Every check of the input moves bench's clock by 100 s: none of it may show in a backend's seconds."""
    from types import SimpleNamespace

    from detens import coco
    from detens.jobs import bench
    from detens.jobs.bench import bench_coco

    clock = [0.0]  # bench's clock, moved only by the checks: the evaluators' own time is not measured here
    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    gt = {"images": [{"id": i, "width": 50, "height": 50, "file_name": f"{i}.jpg"} for i in (1, 2)],
          "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [5, 5, 20, 20], "area": 400, "iscrowd": 0}],
          "categories": [{"id": 1, "name": "a"}]}
    results = [{"image_id": 1, "category_id": 1, "bbox": [6, 5, 20, 20], "score": 0.9},
               {"image_id": 2, "category_id": 1, "bbox": [0, 0, 9, 9], "score": 0.4}]
    (workspace / "gt.json").write_text(json.dumps(gt))
    (workspace / "r.json").write_text(json.dumps(results))
    checks = []
    for name in ("_check_gt_dataset", "validate_coco_results", "_check_result_array", "check_result_categories"):
        check = getattr(coco, name)

        def slow(*args, _check=check, _name=name, **kwargs):
            checks.append(_name)
            clock[0] += 100.0
            return _check(*args, **kwargs)

        monkeypatch.setattr(coco, name, slow)
    rows = bench_coco("gt.json", "r.json", [4])
    assert {"_check_gt_dataset", "validate_coco_results"} <= set(checks)  # checked all the same, untimed
    assert [row["backend"] for row in rows] == list(coco.BACKENDS)
    assert all(row["seconds"] == 0 for row in rows), rows
    assert rows[0]["map"] > 0 and rows[0]["results"] == 4


def test_debug_shows_the_exception(workspace):
    with pytest.raises(ValueError, match="unknown fusion method"):
        main(fuse_args("--method", "wbff", "--debug"))


def test_every_command_has_help_with_option_text(capsys):
    parser = build_parser()
    for command in COMMANDS:
        with pytest.raises(SystemExit) as stop:
            parser.parse_args([command, "--help"])
        assert stop.value.code == 0
        text = capsys.readouterr().out
        assert f"usage: detens {command}" in text and "--quiet" in text and "--debug" in text
    with pytest.raises(SystemExit):
        parser.parse_args(["fuse", "--help"])
    fuse_help = capsys.readouterr().out
    for name in ("wbf", "soft_nms", "theta", "deep", "selection", "superlearner", "calibration"):
        assert name in fuse_help  # the methods and head types by name


def main_in_a_fresh_process(argv: list[str], watched: tuple[str, ...]) -> tuple[subprocess.CompletedProcess, str]:
    """``main(argv)`` in a new interpreter; its output, and its exit status with the ``watched`` modules it
    imported, as one line (``0 ['torch']``)."""
    script = (
        "import sys\nfrom detens.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit as stop:\n    code = stop.code\n"
        f"heavy = sorted(m for m in {watched!r} if m in sys.modules)\n"
        "print(code, heavy, file=sys.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    return done, done.stderr.splitlines()[-1]


@pytest.mark.parametrize("argv", [["--help"], [], ["fuze"]])
def test_the_command_list_and_its_mistakes_import_no_command(argv):
    """``detens --help`` lists the commands; building their options would import torch (seconds)."""
    done, ending = main_in_a_fresh_process(argv, ("torch", "torchvision", "numpy", "detens.fusers", "detens.cli.fuse"))
    assert ending == f"{0 if argv == ['--help'] else 2} []", done.stderr
    if argv == ["--help"]:
        assert all(name in done.stdout for name in COMMANDS)
    else:
        assert done.stderr.count("error:") == 1, done.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_help_page_imports_no_torch(command):
    """The help pages list the fusion methods, head types and defaults from :mod:`detens.catalogue`: the
    registries holding them import torch, seconds before a page could show."""
    done, ending = main_in_a_fresh_process([command, "--help"], ("torch", "torchvision", "detens.fusers", "detens.heads"))
    assert ending == "0 []", done.stderr
    assert f"usage: detens {command}" in done.stdout


@pytest.mark.parametrize("argv, hint", [
    (["fuze"], "argument COMMAND: invalid choice: 'fuze' (choose from 'fuse', 'cache', 'train', 'evaluate', "
               "'bench', 'report', 'configs'); did you mean 'fuse'? (see detens --help)"),
    (["evaluate", "--gt", "a", "--predictions", "b", "--out", "c", "--backend", "fast"],
     "invalid choice: 'fast' (choose from 'pycocotools', 'faster', 'hotcoco'); did you mean 'faster'? "
     "(see detens evaluate --help)"),
    (["fuse", "--engine", "rya"], "invalid choice: 'rya' (choose from 'local', 'ray'); did you mean 'ray'?"),
    (["xyz"], "invalid choice: 'xyz' (choose from 'fuse', 'cache', 'train', 'evaluate', 'bench', 'report', 'configs') "
              "(see detens --help)"),
])
def test_a_value_outside_the_choices_is_answered_with_the_nearest_one(argv, hint, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and hint in err, err


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out == f"detens {version('detens')}\n"


def test_python_dash_m_reports_a_mistake_without_traceback(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "detens", "fuse", "--source", str(tmp_path), "--out", str(tmp_path / "o"),
         "--method", "wbff"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "not using the config's head" not in done.stderr  # nothing said of a method that does not exist
    assert [line for line in done.stderr.splitlines() if line.startswith("error:")] == [
        line for line in done.stderr.splitlines() if "unknown fusion method 'wbff'" in line
    ] != []


_CTRL_C_IN_IMPORT = """
import runpy, sys

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == MODULE:
            raise KeyboardInterrupt  # as if the user pressed Ctrl-C while Python imports it
        return None

MODULE, entry, sys.argv = sys.argv[1], sys.argv[2], sys.argv[2:]
sys.meta_path.insert(0, CtrlC())
if entry == "-m":
    sys.argv[0] = "detens"
    runpy.run_module("detens", run_name="__main__", alter_sys=True)
else:
    runpy.run_path(entry, run_name="__main__")
"""


@pytest.mark.parametrize("entry", ["-m", "tools/fuse.py"])
@pytest.mark.parametrize("module", ["torch", "detens.jobs._logging"])  # the command's imports, the run's set-up
def test_ctrl_c_while_python_imports_is_the_usual_interruption(tmp_path, entry, module):
    """``python -m detens`` (as the ``detens`` script) and a tools/ script: Ctrl-C before the command runs
    ends as one during the run, one line and exit status 130, not a traceback."""
    command = ["fuse"] if entry == "-m" else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _CTRL_C_IN_IMPORT, module, entry if entry == "-m" else str(REPO / entry), *command,
         "--source", str(tmp_path), "--out", str(tmp_path / "o")],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )
    assert (done.returncode, done.stderr) == (130, "error: interrupted\n")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("flags", "debug"), [
    ([], False), (["--debug"], True), (["--debu"], True), (["--deb"], True),  # argparse takes the abbreviations
    (["--", "--debug"], False),  # a positional argument after --, refused by argparse
])
def test_ctrl_c_while_the_command_is_imported(tmp_path, capsys, monkeypatch, flags, debug):
    from detens.cli import run_command

    class CtrlC:
        def find_spec(self, name, path=None, target=None):
            if name == "detens.cli.fuse":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "detens.cli.fuse", raising=False)
    monkeypatch.setattr(sys, "meta_path", [CtrlC(), *sys.meta_path])
    argv = ["--source", str(tmp_path), "--out", str(tmp_path / "o"), *flags]
    for call in (lambda: main(["fuse", *argv]), lambda: run_command("fuse", argv)):
        if debug:  # --debug shows where it was
            with pytest.raises(KeyboardInterrupt):
                call()
        else:
            assert call() == 130
            assert capsys.readouterr().err == "error: interrupted\n"


def test_an_error_raised_while_ctrl_c_is_handled_is_the_interruption(tmp_path, capsys, monkeypatch, press_ctrl_c):
    """Code that a Ctrl-C leaves broken fails with its own error: that ends as the interruption (exit status
    130), not as a traceback; --debug shows it."""
    import detens.jobs.fuse as fuse_job

    monkeypatch.setattr(fuse_job, "run", lambda options: press_ctrl_c())
    argv = ["fuse", "--source", str(tmp_path), "--out", str(tmp_path / "o")]
    assert main(argv) == 130
    assert capsys.readouterr().err == "error: interrupted\n"
    with pytest.raises((KeyboardInterrupt, RuntimeError)):
        main([*argv, "--debug"])


def test_a_user_error_raised_while_ctrl_c_is_handled_is_the_interruption(tmp_path, capsys, monkeypatch):
    import detens.jobs.fuse as fuse_job

    def run(options):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ValueError("a check that the interrupt left half done") from None

    monkeypatch.setattr(fuse_job, "run", run)
    assert main(["fuse", "--source", str(tmp_path), "--out", str(tmp_path / "o")]) == 130
    assert capsys.readouterr().err == "error: interrupted\n"


def test_an_error_after_a_handled_ctrl_c_is_no_interruption(tmp_path, capsys, monkeypatch):
    import detens.jobs.fuse as fuse_job

    def run(options):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
        raise RuntimeError("a bug")  # not raised while the interrupt was handled: a traceback

    monkeypatch.setattr(fuse_job, "run", run)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["fuse", "--source", str(tmp_path), "--out", str(tmp_path / "o")])


@pytest.mark.parametrize("command", COMMANDS)
def test_debug_before_parsing_is_read_as_argparse_reads_it(command):
    """What a Ctrl-C before parsing takes for ``--debug`` is what the command's parser takes for it, on every
    command line that the parser accepts (an ambiguous abbreviation, such as ``--de`` beside ``--device``,
    is refused by the parser, so either reading is right there)."""
    import contextlib
    import io

    from detens.cli import _asks_for_debug, command_parser

    parser = command_parser(command)
    for action in parser._actions:  # only --debug is looked at: leave out the command's required inputs
        action.required = False
    accepted = []
    for argv in (["--debug"], ["--debu"], ["--deb"], ["--de"], ["--d"], ["--debug=1"], ["--deb="], ["--debugs"],
                 ["-debug"], ["--", "--debug"], ["--quiet"], ["--quiet", "--debug"], []):
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                debug = parser.parse_args(argv).debug
        except SystemExit:
            continue
        assert _asks_for_debug(argv) == debug, argv
        accepted.append(argv)
    assert ["--deb"] in accepted and ["--debug=1"] not in accepted, accepted


@needs_data
@pytest.mark.slow
def test_built_package_runs_outside_the_repository(tmp_path):
    """Build the wheel, install it into a folder of its own and run `detens fuse` from elsewhere with
    DETENS_WEIGHTS set: the package's configs and shipped head, a COCO results file that loadRes reads."""
    wheels, site, work = tmp_path / "wheels", tmp_path / "site", tmp_path / "work"
    work.mkdir()
    (work / "images").mkdir()
    (work / "images" / IMAGE.name).write_bytes(IMAGE.read_bytes())
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)],
                   check=True, cwd=tmp_path, timeout=600)
    wheel = next(wheels.glob("detens-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, timeout=600)
    env = {**os.environ, "PYTHONPATH": str(site), "DETENS_WEIGHTS": str(SHARED / "models")}
    where = subprocess.run([sys.executable, "-c", "import detens; print(detens.__file__)"], env=env, cwd=work,
                           capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(site)  # the installed copy, not the repository
    assert (site / "detens" / "configs" / "heads" / "coco_yolo3_deep.json").is_file()
    command = [str(site / "bin" / "detens"), "fuse", "--config", "coco_yolo3", "--source", "images",
               "--out", "out", "--quiet"]
    done = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    from pycocotools.coco import COCO

    fused = COCO(str(work / "out" / "images.json")).loadRes(str(work / "out" / "predictions.json"))
    assert fused.getImgIds() == [1] and len(fused.getAnnIds()) > 0
    summary = json.loads((work / "out" / "summary.json").read_text())
    assert summary["method"] == "deep" and summary["head"].startswith(str(site))
    assert all(str(SHARED / "models") in w for w in summary["weights"].values())
