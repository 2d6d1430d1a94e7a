"""``detens configs``: the shipped configs and heads listed, printed and copied out to edit."""

from __future__ import annotations

import pytest

from detens.cli import main
from detens.packaged import KINDS, describe_shipped, packaged_names, shipped_file


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(["configs", *argv])
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_listing_names_every_shipped_file_under_its_use(capsys):
    code, out, err = run([], capsys)
    assert (code, err) == (0, "")
    blocks = out.split("\n\n")
    assert [b.splitlines()[0].split(" (")[0] for b in blocks[:3]] == ["ensemble configs", "training configs", "trained heads"]
    for kind, block in zip(KINDS, blocks[:3], strict=True):
        listed = [line.split()[0] for line in block.splitlines()[1:]]
        assert listed == packaged_names(kind) and listed
    assert "coco_yolo3" in packaged_names("ensembles") and "deep" in packaged_names("train")
    code, out, _ = run(["--kind", "heads"], capsys)
    assert code == 0 and out.startswith("trained heads") and "coco_yolo3_deep" in out and "coco_yolo3.yaml" not in out
    assert "theta_seed" not in out


@pytest.mark.parametrize("name", packaged_names("ensembles"))
def test_an_ensemble_is_described_by_the_members_and_fusion_its_config_gives(name):
    from detens.adapters import declared_member_names
    from detens.ensemble_config import load_ensemble_config

    config = load_ensemble_config(name)
    head = f" (head {name}_deep)" if config.fusion.head else ""  # the shipped configs' heads follow their names
    assert describe_shipped(*shipped_file(name)) == (
        f"{', '.join(declared_member_names(config))} fused by {config.fusion.method}{head}"
    )


@pytest.mark.parametrize("name", packaged_names("heads"))
def test_a_head_is_described_by_the_type_and_models_its_file_gives(name):
    from detens.heads import load_head

    head = load_head(name)
    text = describe_shipped(*shipped_file(name))
    assert text.endswith(f" for {', '.join(head.model_names)}")
    assert text.startswith(name.rsplit("_", 1)[-1] + " head")  # coco_yolo3_theta: a theta head


@pytest.mark.parametrize("name", packaged_names("train"))
def test_a_training_config_is_described_by_the_first_sentence_of_its_opening_comment(name):
    _, path = shipped_file(name)
    text = describe_shipped("train", path)
    first_line = path.read_text(encoding="utf-8").splitlines()[0]
    assert first_line.startswith("# " + text[:40]) and text.endswith(".") and ". " not in text


def test_a_name_prints_its_file_and_a_head_prints_what_it_is(capsys):
    _, path = shipped_file("coco_yolo3")
    code, out, err = run(["coco_yolo3"], capsys)
    assert (code, out, err) == (0, path.read_text(encoding="utf-8"), "")
    code, out, _ = run(["deep", "--kind", "train"], capsys)
    assert code == 0 and out == shipped_file("deep", "train")[1].read_text(encoding="utf-8")
    code, out, _ = run(["coco_yolo3_deep"], capsys)
    head_path = shipped_file("coco_yolo3_deep")[1]
    assert code == 0 and out.splitlines()[0] == str(head_path) and "deep head" in out and len(out) < 500


def test_a_copy_is_the_shipped_file_runs_as_it_and_is_never_written_over(tmp_path, capsys, monkeypatch):
    from detens.ensemble_config import load_ensemble_config

    monkeypatch.chdir(tmp_path)
    code, out, err = run(["coco_yolo3", "--out", "mine/ensemble.yaml"], capsys)
    assert (code, err) == (0, "") and out == "copied coco_yolo3.yaml to mine/ensemble.yaml; give it as --config mine/ensemble.yaml\n"
    copy, shipped = load_ensemble_config("mine/ensemble.yaml"), load_ensemble_config("coco_yolo3")
    assert (tmp_path / "mine" / "ensemble.yaml").read_bytes() == shipped_file("coco_yolo3")[1].read_bytes()
    assert copy.fusion.head == shipped.fusion.head and copy.models == shipped.models
    (tmp_path / "mine" / "ensemble.yaml").write_text("edited")
    code, out, err = run(["coco_yolo3", "--out", "mine/ensemble.yaml"], capsys)
    assert code == 2 and out == ""
    assert err == "error: --out mine/ensemble.yaml exists; the copy never replaces a file: remove it, or give another path\n"
    assert (tmp_path / "mine" / "ensemble.yaml").read_text() == "edited"
    # a folder takes the copy under the shipped file name
    code, _, _ = run(["coco_yolo3_theta", "--out", "mine", "--quiet"], capsys)
    assert code == 0 and (tmp_path / "mine" / "coco_yolo3_theta.json").read_bytes() == shipped_file("coco_yolo3_theta")[1].read_bytes()
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["coco_yolo3_theta.json", "ensemble.yaml"]


@pytest.mark.parametrize("out, written", [("copies/", "copies/coco_yolo3.yaml"), ("new/sub/", "new/sub/coco_yolo3.yaml")])
def test_an_out_ending_in_a_separator_is_a_folder_created_to_hold_the_copy(out, written, tmp_path, capsys, monkeypatch):
    """``Path`` drops the trailing separator: read as a path alone, ``copies/`` was the file ``copies``."""
    monkeypatch.chdir(tmp_path)
    code, printed, err = run(["coco_yolo3", "--out", out], capsys)
    assert (code, err) == (0, "") and printed == f"copied coco_yolo3.yaml to {written}; give it as --config {written}\n"
    assert (tmp_path / written).read_bytes() == shipped_file("coco_yolo3")[1].read_bytes()
    assert (tmp_path / out).is_dir()


@pytest.mark.parametrize("argv, message", [
    (["coco_yolo9"], r"^error: no shipped ensemble config or training config or head file is called 'coco_yolo9'; "
                     r"shipped: calibration, .*theta_seed\. Did you mean 'coco_yolo3'\?$"),
    (["deep", "--kind", "heads"], r"^error: no shipped head file is called 'deep'; shipped: coco_yolo3_deep, "),
    (["--out", "x.yaml"], r"^error: detens configs: --out copies one shipped file: give its NAME"),
    (["--kind", "trian"], r"invalid choice: 'trian' .*did you mean 'train'\?"),
    (["coco_yolo3", "--out", "/proc/detens/x.yaml"], r"^error: --out /proc/detens/x\.yaml cannot be written"),
    (["coco_yolo3", "--out", ""], r"^error: detens configs: argument --out: expected a file or a folder, got an empty path"),
], ids=["unknown name", "name of another kind", "--out without a name", "unknown kind", "--out unwritable", "--out empty"])
def test_mistakes_are_one_error_line(argv, message, capsys, tmp_path, monkeypatch):
    import re

    monkeypatch.chdir(tmp_path)
    code, out, err = run(argv, capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and re.search(message, err), err
    assert list(tmp_path.iterdir()) == []


def test_a_name_shipped_as_two_kinds_needs_its_kind(tmp_path, monkeypatch):
    import detens.packaged as packaged

    for kind, suffix in (("ensembles", ".yaml"), ("train", ".yaml")):
        (tmp_path / kind).mkdir()
        (tmp_path / kind / f"twin{suffix}").write_text("# twin\n")
    monkeypatch.setattr(packaged, "CONFIG_ROOT", tmp_path)
    with pytest.raises(ValueError, match=r"^'twin' is shipped as ensemble config and as training config: give its "
                                         r"kind \(ensembles, train\)$"):
        shipped_file("twin")
    assert shipped_file("twin", "train") == ("train", tmp_path / "train" / "twin.yaml")
