from __future__ import annotations

import os

import pytest

from detens.adapters.weights import (
    ENV_VAR,
    WeightsNotFoundError,
    is_upstream_name,
    repository_weights_dir,
    resolve_weights,
    shared_models_above,
    weights_dirs,
)


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """Two weights folders holding model.onnx (different contents), and a working directory."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    a, b, cwd = tmp_path / "a", tmp_path / "b", tmp_path / "cwd"
    for folder in (a, b, cwd):
        folder.mkdir()
    (a / "model.onnx").write_text("a")
    (b / "model.onnx").write_text("b")
    (b / "only_b.onnx").write_text("b")
    (b / "export_openvino_model").mkdir()
    monkeypatch.chdir(cwd)
    return a, b, cwd


class TestResolutionOrder:
    def test_an_existing_path_comes_first(self, dirs, monkeypatch):
        a, b, cwd = dirs
        (cwd / "model.onnx").write_text("cwd")
        monkeypatch.setenv(ENV_VAR, str(a))
        resolved = resolve_weights("model.onnx", "ultralytics")
        assert resolved.local and resolved.value == str(cwd / "model.onnx")
        assert resolve_weights(str(b / "model.onnx")).value == str(b / "model.onnx")

    def test_then_the_env_folders_in_order(self, dirs, monkeypatch):
        a, b, _ = dirs
        monkeypatch.setenv(ENV_VAR, f"{a}{os.pathsep}{b}")
        assert resolve_weights("model.onnx").value == str(a / "model.onnx")
        assert resolve_weights("only_b.onnx").value == str(b / "only_b.onnx")
        assert resolve_weights("export_openvino_model").value == str(
            b / "export_openvino_model"
        )  # folders too

    def test_env_comes_before_the_explicit_folder(self, dirs, monkeypatch):
        a, b, _ = dirs
        monkeypatch.setenv(ENV_VAR, str(a))
        assert weights_dirs(default=b)[:2] == [a, b]
        assert resolve_weights("model.onnx", weights_dir=b).value == str(a / "model.onnx")
        assert resolve_weights("only_b.onnx", weights_dir=b).value == str(b / "only_b.onnx")

    def test_explicit_folder_when_env_unset(self, dirs):
        _, b, _ = dirs
        assert weights_dirs(default=b)[0] == b
        assert resolve_weights("model.onnx", weights_dir=b).value == str(b / "model.onnx")

    def test_shared_models_found_walking_up_from_the_working_directory(self, dirs, monkeypatch):
        a, _, cwd = dirs
        models = cwd.parent / "shared" / "models"
        models.mkdir(parents=True)
        (models / "found.onnx").write_text("x")
        deep = cwd / "x" / "y"
        deep.mkdir(parents=True)
        monkeypatch.chdir(deep)
        assert shared_models_above() == models.resolve()
        monkeypatch.setenv(ENV_VAR, str(a))
        dirs_searched = weights_dirs()
        assert dirs_searched[0] == a and dirs_searched[1] == models.resolve()  # the environment first
        assert resolve_weights("found.onnx").value == str(models.resolve() / "found.onnx")

    def test_repository_default(self, monkeypatch):
        monkeypatch.delenv(ENV_VAR, raising=False)
        repo_dir = repository_weights_dir()
        assert repo_dir.parent.name == "shared"
        assert weights_dirs()[-1:] == ([repo_dir] if repo_dir.is_dir() else [])

    @pytest.mark.parametrize(
        "name, kind",
        [
            ("yolo11n.pt", "ultralytics"),
            ("yolo26n", "ultralytics"),
            ("yolov8n.yaml", "ultralytics"),
            ("https://example.com/w.pt", "ultralytics"),
            ("DEFAULT", "torchvision"),
            ("COCO_V1", "torchvision"),
            ("FasterRCNN_ResNet50_FPN_Weights.COCO_V1", "torchvision"),
        ],
    )
    def test_upstream_names_pass_through_unchanged(self, dirs, name, kind):
        resolved = resolve_weights(name, kind)
        assert not resolved.local and resolved.value == name and resolved.path is None

    @pytest.mark.parametrize(
        "name, kind",
        [
            ("sub/yolo11n.pt", "ultralytics"),
            ("my_model.pt", "ultralytics"),
            ("model.pth", "torchvision"),
            ("yolo11n.pt", "torchvision"),
        ],
    )
    def test_not_upstream(self, name, kind):
        assert not is_upstream_name(name, kind)

    def test_a_local_file_shadows_the_upstream_name(self, dirs, monkeypatch):
        a, _, _ = dirs
        (a / "yolo11n.pt").write_text("local")
        monkeypatch.setenv(ENV_VAR, str(a))
        resolved = resolve_weights("yolo11n.pt", "ultralytics")
        assert resolved.local and resolved.value == str(a / "yolo11n.pt")


class TestMissing:
    def test_error_lists_where_it_looked(self, dirs, monkeypatch):
        a, b, cwd = dirs
        monkeypatch.setenv(ENV_VAR, f"{a}{os.pathsep}{b}")
        with pytest.raises(WeightsNotFoundError) as info:
            resolve_weights("missing.tflite", "ultralytics")
        message = str(info.value)
        assert "'missing.tflite' not found" in message
        for place in (cwd / "missing.tflite", a / "missing.tflite", b / "missing.tflite"):
            assert str(place) in message
        assert "yolo11n.pt" in message and ENV_VAR in message
        assert isinstance(info.value, FileNotFoundError)

    def test_error_names_a_relative_weights_folder_absolutely(self, dirs):
        _, _, cwd = dirs
        with pytest.raises(WeightsNotFoundError) as info:
            resolve_weights("missing.onnx", "onnx", weights_dir="../models")
        missing = cwd.parent / "models"
        assert f"{missing / 'missing.onnx'} (weights folder; {missing} does not exist)" in str(info.value)

    def test_error_without_any_weights_folder(self, dirs, monkeypatch):
        monkeypatch.setattr("detens.adapters.weights.repository_weights_dir", lambda: dirs[2] / "no_such_dir")
        monkeypatch.setattr("detens.adapters.weights.shared_models_above", lambda start=None: None)
        with pytest.raises(WeightsNotFoundError, match="no weights folder"):
            resolve_weights("missing.pth", "torchvision")

    def test_a_config_files_weights_are_looked_for_beside_it_not_in_the_working_directory(self, dirs, tmp_path):
        a, _, cwd = dirs
        config_folder = tmp_path / "cfg"
        (config_folder / "sub").mkdir(parents=True)
        (cwd / "sub").mkdir()
        (cwd / "sub" / "m.onnx").write_text("cwd")
        with pytest.raises(WeightsNotFoundError) as info:
            resolve_weights("sub/m.onnx", "onnx", weights_dir=str(a), beside=config_folder)
        message = str(info.value)
        assert f"{config_folder / 'sub' / 'm.onnx'} (as a path beside the config file)" in message
        assert str(a / "sub" / "m.onnx") in message and str(cwd / "sub") not in message
        (config_folder / "sub" / "m.onnx").write_text("beside")
        found = resolve_weights("sub/m.onnx", "onnx", beside=config_folder)
        assert found.local and found.value == str(config_folder / "sub" / "m.onnx")
        # an upstream name's download lands in the working directory, where it is read back from
        assert not resolve_weights("yolo11n.pt", "ultralytics", beside=config_folder).local
        (cwd / "yolo11n.pt").write_text("downloaded")
        downloaded = resolve_weights("yolo11n.pt", "ultralytics", beside=config_folder)
        assert downloaded.local and downloaded.value == str(cwd / "yolo11n.pt")
        # an absolute path is itself, and a name in a weights folder is found there
        assert resolve_weights(a / "model.onnx", "onnx", beside=config_folder).value == str(a / "model.onnx")
        assert resolve_weights("model.onnx", "onnx", weights_dir=str(a), beside=config_folder).value == str(
            a / "model.onnx"
        )

    def test_a_yaml_members_missing_weights_are_listed_where_they_were_looked_for(self, dirs, tmp_path):
        import yaml

        from detens.ensemble_config import load_ensemble_config
        from detens.jobs._inputs import input_fingerprints

        config_folder = tmp_path / "cfg"
        config_folder.mkdir()
        (config_folder / "e.yaml").write_text(yaml.safe_dump({"models": [{"weights": "w/m.tflite", "name": "m"}]}))
        config = load_ensemble_config(config_folder / "e.yaml")
        assert config.folder == config_folder
        with pytest.raises(WeightsNotFoundError) as info:
            input_fingerprints(config)
        message = str(info.value)
        assert message.startswith(f"{config_folder / 'e.yaml'}: model 'm': weights 'w/m.tflite' not found (looked at: ")
        assert "\n" not in message  # the CLI prints one error line
        assert f"{config_folder / 'w' / 'm.tflite'} (as a path beside the config file)" in message
        assert str(dirs[2] / "w") not in message  # the working directory is not looked at for a YAML's weights

    def test_absolute_missing_path(self, dirs):
        with pytest.raises(WeightsNotFoundError, match="as a path"):
            resolve_weights(dirs[0] / "nope.pt")

    @pytest.mark.parametrize("bad, error, message", [
        ("", ValueError, "^weights must not be empty$"),
        (3, TypeError, "^weights must be a path or a name, got int: 3$"),
        (None, TypeError, "^weights must be a path or a name, got NoneType: None$"),
    ])
    def test_bad_values(self, bad, error, message):
        with pytest.raises(error, match=message):
            resolve_weights(bad)

    def test_upstream_download_failure_is_a_clear_error(self, monkeypatch):
        """Offline, an upstream name fails inside Ultralytics; the adapter says what it tried."""
        pytest.importorskip("ultralytics")
        import ultralytics

        from detens.adapters.ultralytics import UltralyticsDetector

        def offline(*args, **kwargs):
            raise ConnectionError(
                "Download failure for https://github.com/.../yolo11n.pt. Environment may be offline."
            )

        monkeypatch.setattr(ultralytics, "YOLO", offline)
        with pytest.raises(
            WeightsNotFoundError, match=r"(?s)upstream download failed.*yolo11n.pt.*as a path"
        ):
            UltralyticsDetector("yolo11n.pt")


@pytest.mark.parametrize("member, name", [
    ({"type": "ultralytics", "weights": "yolo11n.pt", "name": "a"}, "yolo11n.pt"),
    ({"type": "torchvision", "arch": "fasterrcnn_mobilenet_v3_large_320_fpn", "weights": "DEFAULT", "name": "a"},
     "DEFAULT"),
])
def test_an_upstream_name_of_a_yaml_that_fails_to_download_lists_the_yaml_folder(tmp_path, monkeypatch, member, name):
    """The YAML's folder is where its relative weights are looked for first: the refusal names it, and says
    the working directory is the working directory (not the YAML's relative path read from there). It leads
    with the YAML and the member, as the refusal of weights found nowhere does."""
    pytest.importorskip("ultralytics")
    import torchvision.models
    import ultralytics

    from detens.adapters import build_ensemble

    def offline(*args, **kwargs):
        raise ConnectionError("Download failure. Environment may be offline.")

    monkeypatch.setattr(ultralytics, "YOLO", offline)
    monkeypatch.setattr(torchvision.models, "get_model", offline)
    monkeypatch.delenv(ENV_VAR, raising=False)
    config_folder, cwd = tmp_path / "cfg", tmp_path / "cwd"
    config_folder.mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    (config_folder / "ensemble.yaml").write_text(
        "models:\n  - " + "\n    ".join(f"{k}: {v}" for k, v in member.items()) + "\nfusion: {method: wbf}\n"
    )
    with pytest.raises(WeightsNotFoundError, match="upstream download failed") as caught:
        build_ensemble(config_folder / "ensemble.yaml")
    message = str(caught.value)
    assert message.startswith(f"{config_folder / 'ensemble.yaml'}: model 'a': ")
    assert f"{config_folder / name} (as a path beside the config file)" in message
    assert f"{cwd / name} (in the working directory" in message
    assert f"{cwd / name} (as a path)" not in message


def test_fuse_names_the_yaml_and_the_member_whose_upstream_weights_failed_to_download(tmp_path, monkeypatch, capsys):
    """One ``error:`` line, status 2, led by the YAML and the member as a member's other refusals are."""
    pytest.importorskip("ultralytics")
    import ultralytics

    from detens.cli import main

    def offline(*args, **kwargs):
        raise ConnectionError("Download failure. Environment may be offline.")

    monkeypatch.setattr(ultralytics, "YOLO", offline)
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "that.yaml").write_text("models: [{name: a, type: ultralytics, weights: yolov8n.pt}]\n")
    assert main(["fuse", "--config", "that.yaml", "--source", "ultralytics-assets", "--out", "out", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: that.yaml: model 'a': weights 'yolov8n.pt' are not on disk and the upstream "
                          "download failed (ConnectionError: Download failure.") and err.count("\n") == 1

_AUTOINSTALL_AFTER_AN_UPSTREAM_CHECK = """
import sys
from detens.adapters.weights import is_upstream_name
assert "ultralytics" not in sys.modules
is_upstream_name("yolo11n.pt", "ultralytics")  # what a command's first look at its members imports Ultralytics for
from ultralytics.utils import checks
print(checks.AUTOINSTALL)
"""


@pytest.mark.parametrize("user_value, expected", [(None, "False"), ("true", "True")])
def test_ultralytics_never_pip_installs_at_run_time_unless_the_user_says_so(user_value, expected):
    """Ultralytics reads YOLO_AUTOINSTALL once, at its import: the variable was set where a model was loaded, after
    a command had imported Ultralytics to tell upstream names apart, so a missing runtime was pip-installed."""
    pytest.importorskip("ultralytics")
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "YOLO_AUTOINSTALL"}
    if user_value is not None:
        env["YOLO_AUTOINSTALL"] = user_value
    done = subprocess.run([sys.executable, "-c", _AUTOINSTALL_AFTER_AN_UPSTREAM_CHECK], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == expected


def test_every_import_of_ultralytics_goes_through_import_ultralytics():
    """A module importing Ultralytics by itself would be its first import in some command, with auto-install on."""
    import ast
    from pathlib import Path

    import detens

    found = []
    for path in sorted(Path(detens.__file__).parent.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and ast.unparse(node.test) == "TYPE_CHECKING" for n in ast.walk(node)}
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if id(node) not in typing_only and any(n.split(".")[0] == "ultralytics" for n in names):
                found.append(f"{path.name}:{node.lineno}")
    assert found == []


def test_a_folder_named_tilde_written_from_the_working_directory_is_not_the_home_folder(tmp_path, monkeypatch):
    """Weights at ``./~/m.onnx`` and a weights folder ``./~/w`` are in a folder named ``~`` of the working
    directory, not the home folder's (``Path`` drops the ``./``); ``~/m.onnx`` is still the home folder's."""
    home, work = tmp_path / "home", tmp_path / "work"
    for folder in (home / "w", work / "~" / "w"):
        folder.mkdir(parents=True)
        (folder.parent / "m.onnx").write_text(str(folder.parent))
        (folder / "n.onnx").write_text(str(folder))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert resolve_weights("./~/m.onnx").value == str(work / "~" / "m.onnx")
    assert resolve_weights("~/m.onnx").value == str(home / "m.onnx")
    assert [folder.absolute() for folder in weights_dirs("./~/w")][0] == work / "~" / "w"
    assert os.path.abspath(resolve_weights("n.onnx", weights_dir="./~/w").value) == str(work / "~" / "w" / "n.onnx")
    assert resolve_weights("n.onnx", weights_dir="~/w").value == str(home / "w" / "n.onnx")
    monkeypatch.setenv(ENV_VAR, "./~/w")
    assert [folder.absolute() for folder in weights_dirs()][0] == work / "~" / "w"
