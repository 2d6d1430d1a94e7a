from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from detens.config import (
    config_differences,
    from_dict,
    load_yaml_config,
    parse_yaml,
    read_yaml_file,
    save_yaml_config,
)
from detens.registry import Registry


@dataclass
class Inner:
    lr: float = 0.1
    optimizer: Literal["gd", "adam"] = "gd"


@dataclass
class Outer:
    name: str = "x"
    epochs: int = 3
    weights: list[float] | None = None
    inner: Inner = field(default_factory=Inner)


class TestFromDict:
    def test_nested_and_defaults(self):
        cfg = from_dict(Outer, {"epochs": 5, "inner": {"lr": 1}, "weights": [1, 2]})
        assert cfg.epochs == 5 and cfg.inner.lr == 1.0 and isinstance(cfg.inner.lr, float)
        assert cfg.weights == [1.0, 2.0] and cfg.inner.optimizer == "gd"

    def test_unknown_key_suggests_the_nearest(self):
        with pytest.raises(ValueError, match=r"unknown key 'epoch'.*Did you mean 'epochs'"):
            from_dict(Outer, {"epoch": 5})
        with pytest.raises(ValueError, match=r"unknown key 'lrr' in Outer.inner.*Did you mean 'lr'"):
            from_dict(Outer, {"inner": {"lrr": 5}})

    @pytest.mark.parametrize(
        "data, fragment",
        [
            ({"epochs": "five"}, "expected an integer"),
            ({"epochs": 2.5}, "expected an integer"),
            ({"inner": {"optimizer": "sgd"}}, "'sgd' is not one of 'gd', 'adam'"),
            ({"weights": "1,2"}, "does not fit"),
            ({"inner": 3}, "expected a mapping"),
            ({"inner": {"lr": float("nan")}}, "expected a finite number, got nan"),
            ({"inner": {"lr": float("-inf")}}, "expected a finite number, got -inf"),
            ({"weights": [1.0, float("inf")]}, "expected a finite number, got inf"),
            ({"inner": {"lr": 10**400}}, "expected a finite number"),  # beyond the float range
        ],
    )
    def test_wrong_types(self, data, fragment):
        with pytest.raises((TypeError, ValueError), match=fragment):
            from_dict(Outer, data)

    def test_a_word_yaml_reads_as_a_boolean_is_refused_saying_to_quote_it(self):
        """YAML 1.1 reads an unquoted on, off, yes and no as true/false: the message showed a True or False the
        file does not hold."""
        hint = " (YAML reads an unquoted yes, no, on, off, true or false as true/false: quote the word)"
        with pytest.raises(TypeError, match="^" + re.escape("Outer.name: expected a string, got bool True" + hint)):
            from_dict(Outer, parse_yaml("name: on"))
        message = "Outer.inner.optimizer: False is not one of 'gd', 'adam'"
        with pytest.raises(ValueError, match="^" + re.escape(message + hint) + "$"):
            from_dict(Outer, parse_yaml("inner: {optimizer: no}"))
        with pytest.raises(TypeError, match=r"^Outer\.name: expected a string, got int 3$"):  # no word to quote
            from_dict(Outer, parse_yaml("name: 3"))
        assert from_dict(Outer, parse_yaml("name: 'on'")).name == "on"

    def test_numpy_numbers_are_the_python_numbers_they_hold(self):
        """A mapping built in Python may hold NumPy numbers; a NumPy float is still no integer, nor a bool one."""
        import numpy as np

        cfg = from_dict(Outer, {"epochs": np.int64(7), "inner": {"lr": np.float32(0.5)}, "weights": [np.int8(2)]})
        assert (cfg.epochs, cfg.inner.lr, cfg.weights) == (7, 0.5, [2.0])
        assert [type(v) for v in (cfg.epochs, cfg.inner.lr, cfg.weights[0])] == [int, float, float]
        for data in ({"epochs": np.float64(7.0)}, {"epochs": np.bool_(True)}, {"inner": {"lr": np.bool_(True)}}):
            with pytest.raises(TypeError, match="expected"):
                from_dict(Outer, data)

    def test_yaml_round_trip_and_overrides(self, tmp_path):
        path = tmp_path / "c.yaml"
        save_yaml_config(from_dict(Outer, {"epochs": 9}), path)
        cfg = load_yaml_config(Outer, path, overrides={"name": "cli", "epochs": None})
        assert cfg.epochs == 9 and cfg.name == "cli"

    @pytest.mark.parametrize(("text", "kind"), [("[]", "list"), ("false", "bool"), ("0", "int"), ("''", "str")])
    def test_a_top_level_that_is_no_mapping_is_refused_even_when_empty(self, tmp_path, text, kind):
        from detens.ensemble_config import load_ensemble_config

        path = tmp_path / "c.yaml"
        path.write_text(text)
        for load in (lambda: load_yaml_config(Outer, path), lambda: load_ensemble_config(path)):
            with pytest.raises(ValueError, match=f"the top level must be a mapping, got {kind}"):
                load()
        path.write_text("# nothing set: the defaults\n")
        assert load_yaml_config(Outer, path) == Outer()

    def test_missing_file(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="nope.yaml"):
            load_yaml_config(Outer, tmp_path / "nope.yaml")

    @pytest.mark.parametrize(
        "content, where, fragment",
        [
            # a tag that would run code if it were not refused
            (b"epochs: 3\nname: !!python/object/apply:os.system ['true']\n", ":2:7:", "constructor for the tag"),
            (b"epochs: 3\nname: [unclosed\n", ":3:1:", "expected ',' or ']'"),  # truncated
            (b"epochs: 3\n\tname: x\n", ":2:1:", "found character '\\t'"),
            (b"epochs: 3\nname: '\xff'\n", "", "not a UTF-8 text file"),
            # PyYAML would keep the last value: the reader of the file sees the first
            (b"epochs: 3\nname: x\nepochs: 5\n", ":3:1:", "found duplicate key 'epochs' (first on line 1)"),
            (b"inner:\n  lr: 0.1\n  lr: 0.2\n", ":3:3:", "found duplicate key 'lr' (first on line 2)"),
            # YAML 1.1 would read these as 416 and 90, where the writer meant 640 and a reader sees a time
            (b"epochs: 0640\n", ":1:9:", "found '0640', which YAML 1.1 reads as an octal number (416)"),
            (b"name: 1:30\n", ":1:7:", "found '1:30', which YAML 1.1 reads as a base-60 number (90); quote it"),
            # aliases of aliases: a few hundred bytes that any walk of the config would expand to 10**9 values
            (b"name: [&a0 [x, x, x, x, x, x, x, x, x, x], " + b", ".join(
                b"&a%d [" % i + b", ".join([b"*a%d" % (i - 1)] * 10) + b"]" for i in range(1, 9)) + b"]\n",
             ":1:", "holds more than 100000 values once its aliases (*name) are read in full"),
            (b"name: &a [1, *a]\n", ":1:7:", "an alias (*name) refers to a value that holds it"),
            (b"name: " + b"[" * 5000 + b"]" * 5000 + b"\n", "", "nested too deeply to be read"),
            (b"epochs: 1" + b"0" * 5000 + b"\n", ":1:9:", "as a number: Exceeds the limit (4300 digits)"),
        ],
    )
    def test_unreadable_yaml_is_a_config_error_naming_file_and_line(self, tmp_path, content, where, fragment):
        from detens.config import ConfigError
        from detens.ensemble_config import load_ensemble_config

        path = tmp_path / "c.yaml"
        path.write_bytes(content)
        for load in (lambda: load_yaml_config(Outer, path), lambda: load_ensemble_config(path)):
            with pytest.raises(ConfigError) as info:
                load()
            assert f"{path}{where}" in str(info.value) and fragment in str(info.value)


class TestRegistry:
    def test_unknown_name_lists_valid_names(self):
        reg = Registry("fusion method")
        reg.register("wbf")(len)
        reg.register("nms")(len)
        assert reg.get("wbf") is len and reg.names() == ["nms", "wbf"]
        with pytest.raises(ValueError, match=r"unknown fusion method 'wfb'; valid names: nms, wbf\. Did you mean 'wbf'"):
            reg.get("wfb")
        with pytest.raises(ValueError, match="already registered"):
            reg.register("wbf")(len)
        with pytest.raises(TypeError, match="^fusion method name must be a string, got int$"):
            reg.get(3)

    def test_names_are_non_empty_strings(self):
        reg = Registry("fusion method")
        reg.register("wbf")(len)
        for bad in (3, "", None):
            with pytest.raises(TypeError, match="fusion method names must be non-empty strings"):
                reg.register(bad)
        assert reg.names() == ["wbf"] and len(reg) == 1
        assert ["wbf"] not in reg and {"a": 1} not in reg and "wbf" in reg


def test_every_public_name_of_detens_resolves():
    import subprocess
    import sys

    code = (
        "import sys, detens\n"
        "assert 'ultralytics' not in sys.modules, 'import detens must stay light'\n"
        "missing = [n for n in detens.__all__ if getattr(detens, n, None) is None]\n"
        "assert not missing, missing\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _imported_for_type_checkers(module) -> dict[str, str]:
    """``{name: module}`` of the imports under ``if TYPE_CHECKING:`` in ``module``'s source."""
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    blocks = [node for node in tree.body if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)]
    return {alias.asname or alias.name: node.module for block in blocks for node in block.body
            if isinstance(node, ast.ImportFrom) for alias in node.names}


def test_type_checkers_see_each_lazily_imported_name_as_what_it_is():
    """Names imported on first use come from a module ``__getattr__``, which type checkers and editors read
    as its return type (``object``: every public name of detens was neither callable nor a type to them)."""
    import detens
    import detens.adapters

    assert _imported_for_type_checkers(detens) == detens._EXPORTS
    lazy = detens.adapters._LAZY
    typed = _imported_for_type_checkers(detens.adapters)
    assert {name: typed.get(name) for name in lazy} == lazy


def test_the_functions_the_shipped_configs_point_to_exist():
    import re

    import detens

    configs = Path(__file__).resolve().parents[1] / "detens" / "configs"
    named = {m for path in configs.rglob("*.yaml") for m in re.findall(r"detens\.(\w+)\(", path.read_text())}
    assert "list_methods" in named
    assert [n for n in sorted(named) if not callable(getattr(detens, n, None))] == []
    assert {"wbf", "soft_nms", "deep", "theta", "calibration"} <= set(detens.list_methods())


@pytest.mark.parametrize("kind", ["theta", "theta_seed", "deep", "selection", "superlearner", "calibration"])
def test_training_yaml_mirrors_the_code_defaults(kind):
    from detens.heads import TRAINERS, config_for

    path = Path(__file__).resolve().parents[1] / "detens" / "configs" / "train" / f"{kind}.yaml"
    assert load_yaml_config(TRAINERS[kind].config_class, path) == config_for(kind)


def test_a_key_given_twice_in_a_training_config_names_the_file_the_key_and_its_lines(tmp_path):
    import re

    from detens.config import ConfigError
    from detens.heads import load_train_config

    path = tmp_path / "train.yaml"
    path.write_text("match_iou_grid: []\nepochs: 100\nlr: 0.1\nepochs: 3\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:4:1: .*duplicate key 'epochs' \(first on line 2\)"):
        load_train_config("theta", str(path))
    path.write_text("match_iou_grid: []\nepochs: 3\n")
    assert load_train_config("theta", str(path)).epochs == 3


def test_a_merge_key_may_be_overridden_and_a_repeated_key_is_refused_at_any_depth():
    import yaml

    # "<<" copies the keys of another mapping, which the keys beside it override: YAML means that
    assert parse_yaml("base: &b {x: 1, y: 2}\nm:\n  <<: *b\n  x: 5\n")["m"] == {"x": 5, "y": 2}
    with pytest.raises(yaml.YAMLError, match="found duplicate key 'x'"):
        parse_yaml("m: [{x: 1, x: 2}]")
    assert parse_yaml("1: a\n'1': b\n") == {1: "a", "1": "b"}  # two keys: an integer and a string


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1e-3", 1e-3), ("1E+5", 1e5), ("-2e3", -2000.0), ("1.0e-6", 1e-6), ("10", 10), ("1.5", 1.5),
     ("1e", "1e"), ("'1e-3'", "1e-3"), ("[1e-3, 2]", [1e-3, 2]), ("e3", "e3"),
     # YAML 1.1 itself reads these as strings: a dot with an unsigned exponent, or no digit before the dot
     ("1.5e3", 1500.0), ("5.e3", 5000.0), (".5e3", 500.0), ("-2.5E2", -250.0), ("1_000e1", 10000.0),
     (".inf", float("inf")), ("1.2.3e4", "1.2.3e4"), ("12e3abc", "12e3abc")],
)
def test_every_exponent_is_a_number(text, expected):
    value = parse_yaml(text)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(("text", "expected"), [("0", 0), ("-0", 0), ("10_000", 10000), ("0x1F", 31), ("0b101", 5),
                                                ("'0640'", "0640"), ("'1:30'", "1:30"), ("0.5", 0.5), ("007.5", 7.5)])
def test_integers_read_the_same_in_yaml_1_1_and_1_2(text, expected):
    value = parse_yaml(text)
    assert value == expected and type(value) is type(expected)


def test_a_set_flag_with_a_leading_zero_is_refused():
    from detens.jobs._options import parse_set

    with pytest.raises(ValueError, match=r"--set 'seed=010': the value is not valid YAML \(found '010', which YAML 1\.1"):
        parse_set(["seed=010"])


def test_set_flags_of_one_head_are_read_without_its_prefix_and_named_as_given():
    from detens.jobs._options import UsageError, parse_set

    assert parse_set(["theta.lr=1e-3", "theta. epochs = 2"], prefix="theta.") == {"lr": 0.001, "epochs": 2}
    with pytest.raises(UsageError, match=r"^--set 'theta\.epochs=2' and --set 'theta\. epochs=3' both set "
                                         r"theta\.epochs: give one of them$"):
        parse_set(["theta.epochs=2", "theta. epochs=3"], prefix="theta.")
    with pytest.raises(UsageError, match=r"^--set expects key=value, got 'lr'$"):
        parse_set(["lr"])


def test_yaml_files_and_set_overrides_read_1e_3_as_a_number(tmp_path):
    from detens.heads import load_train_config
    from detens.jobs._options import parse_set

    path = tmp_path / "my.yaml"
    path.write_text("lr: 1e-3\nmatch_iou_grid: []\n")
    assert read_yaml_file(path) == {"lr": 0.001, "match_iou_grid": []}
    assert load_train_config("theta", str(path), {}).lr == 0.001
    assert parse_set(["lr=1e-3", "weight_decay=5E-4"]) == {"lr": 0.001, "weight_decay": 0.0005}
    assert load_train_config("deep", None, parse_set(["lr=1e-3"])).lr == 0.001
    with pytest.raises(ValueError, match="the value is not valid YAML"):
        parse_set(["lr=[1e-3"])
    path.write_text("lr: !!python/object:os.system {}\n")
    with pytest.raises(ValueError, match="invalid YAML"):
        read_yaml_file(path)


@pytest.mark.parametrize(
    ("index", "error", "message"),
    [(True, TypeError, "must be an integer, got bool"), (3.0, TypeError, "must be an integer, got float"),
     (80, ValueError, r"must be an integer in \[0, 79\], got 80"), (-1, ValueError, r"must be an integer in \[0, 79\], got -1")],
)
def test_coco80_indices_are_integers_in_range(index, error, message):
    import numpy as np

    from detens.labels import coco80_to_category_id

    assert coco80_to_category_id(0) == 1 and coco80_to_category_id(np.int64(79)) == 90
    with pytest.raises(error, match=f"COCO-80 class index {message}"):
        coco80_to_category_id(index)


def test_a_value_out_of_range_is_named_by_the_file_or_flag_that_gave_it(tmp_path):
    from detens.heads import load_train_config

    path = tmp_path / "my.yaml"
    path.write_text("lr: -1\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: lr must be a positive number, got -1"):
        load_train_config("deep", str(path))
    path.write_text("lr: 0.01\n")
    with pytest.raises(ValueError, match=r"^--set: score_max_det must be an integer >= 1, got 0$"):
        load_train_config("deep", str(path), {"score_max_det": 0})
    with pytest.raises(ValueError, match=r"^--set: epochs must be"):
        load_train_config("theta", None, {"epochs": -2})
    # a command's own flag for a key (detens train --lr) is named, not --set; it and --set give one key once
    with pytest.raises(ValueError, match=r"^--lr: lr must be a positive number, got -1"):
        load_train_config("deep", None, {"epochs": 3}, {"lr": -1.0})
    with pytest.raises(ValueError, match=r"^--lr 0.2 and --set lr=0.1 both set lr: give one of them$"):
        load_train_config("deep", None, {"lr": 0.1, "epochs": 3}, {"lr": 0.2})
    assert load_train_config("deep", str(path), None, {"lr": 0.2}).lr == 0.2  # over the file: a layer above it


def test_from_dict_names_where_the_dataclass_refuses_a_value():
    @dataclass
    class Checked:
        size: int = 1

        def __post_init__(self):
            if self.size < 1:
                raise ValueError(f"size must be >= 1, got {self.size}")

    with pytest.raises(ValueError, match=r"^a\.yaml: size must be >= 1, got 0$"):
        from_dict(Checked, {"size": 0}, where="a.yaml")
    with pytest.raises(ValueError, match=r"^Checked: size must be >= 1, got 0$"):
        from_dict(Checked, {"size": 0})
    assert from_dict(Checked, {"size": 2}).size == 2


def test_config_differences_name_each_changed_value_by_its_path():
    old = {"conf": 0.001, "models": [{"name": "a", "conf": None}, {"name": "b"}], "fusion": {"method": "wbf"}, "gone": 1}
    new = {"conf": 0.001, "models": [{"name": "a", "conf": 0.1}, {"name": "b"}], "fusion": {"method": "nms"}, "added": [1]}
    assert config_differences(old, new) == [
        "models[0].conf: None -> 0.1", "fusion.method: 'wbf' -> 'nms'", "gone: 1 -> (none)", "added: (none) -> [1]",
    ]
    assert config_differences(old, old) == []
    assert config_differences({"models": [1, 2]}, {"models": [1]}) == ["models: 2 entries -> 1"]
    assert config_differences({"tta": "hflip"}, {"tta": ["hflip"]}) == ["tta: 'hflip' -> ['hflip']"]


def test_dir_of_detens_lists_each_name_once_after_its_lazy_names_are_loaded():
    import detens

    detens.cache, detens.fuse_images  # noqa: B018  loaded on first use, then module globals too
    names = dir(detens)
    assert len(names) == len(set(names)) and {"cache", "fuse_images", "fuse"} <= set(names)


def test_detens_exposes_no_public_name_beyond_its_api_in_a_fresh_interpreter():
    """``from detens import *`` and tab completion must not offer ``importlib`` or ``Any``."""
    code = "import detens; print(sorted(n for n in dir(detens) if not n.startswith('_')))"
    listed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    import detens

    assert ast.literal_eval(listed) == sorted(detens.__all__)


def test_a_training_config_that_sets_nothing_is_the_defaults(tmp_path):
    """As every other YAML config of detens reads; it was a FileNotFoundError for a file that exists."""
    from detens.heads import config_for, load_train_config

    path = tmp_path / "train.yaml"
    path.write_text("# nothing set\n")
    assert load_train_config("deep", str(path)) == config_for("deep")
