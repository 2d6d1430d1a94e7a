"""Head files are untrusted input: every field is checked, and a bad one is one HeadFileError naming the
file and the field, before anything is built from it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
from pathlib import Path

import pytest
import torch

from detens.heads import CalibratedHead, HeadFileError, load_head
from detens.heads.bagged import BaggedHead
from detens.heads.calibration import CalibrationHead
from detens.heads.deep import DeepEnsembleHead
from detens.heads.selection import SelectionHead
from detens.heads.superlearner import SuperLearnerHead
from detens.heads.theta import ThetaHead

NAMES = ["a", "b"]


def saved(tmp_path: Path, head, name: str = "head.json") -> dict:
    path = tmp_path / name
    head.save(path)
    return json.loads(path.read_text())


def write(tmp_path: Path, document: dict, name: str = "bad.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document))  # json.dumps writes inf as Infinity, as a hand-edited file may
    return path


def set_path(document: dict, keys: tuple, value) -> dict:
    target = document
    for key in keys[:-1]:
        target = target[key]
    target[keys[-1]] = value
    return document


HEADS = {
    "theta": lambda: ThetaHead(NAMES),
    "theta_per_class": lambda: ThetaHead(NAMES, per_class=True, class_ids=[1, 3]),
    "deep": lambda: DeepEnsembleHead(NAMES, hidden=4, depth=1),
    "selection": lambda: SelectionHead(NAMES, hidden=4, depth=1),
    "calibration": lambda: CalibrationHead(NAMES),
    "calibrated": lambda: CalibratedHead(CalibrationHead(NAMES), DeepEnsembleHead(NAMES, hidden=4, depth=1)),
}

#: (head, keys to change, new value, fragment of the error)
BAD_FIELDS = [
    ("theta", ("format_version",), True, "format_version True is not supported"),
    ("theta", ("format_version",), "1", "format_version '1' is not supported"),
    ("theta", ("extra",), 1, "unknown fields ['extra']"),
    ("theta", ("model_names",), ["a", "a"], "must be unique"),
    ("theta", ("config", "lambda_reg"), math.inf, "lambda_reg must be a number >= 0, got inf"),
    ("theta", ("config", "match_iou"), 10**400, "match_iou must be in [0, 1)"),
    ("theta", ("config", "eps"), True, "eps must be a number, got bool"),
    ("theta", ("config", "class_ids"), [1, 2], "class_ids / num_classes apply only with per_class=True"),
    ("theta", ("tensors", "theta", "data"), [0.0, 0.0], "theta must hold float32 weights >= 0 with a positive sum"),
    ("theta", ("tensors", "theta", "data"), [1.5, -0.5], "theta must hold float32 weights >= 0"),
    ("theta", ("tensors", "theta", "shape"), [True, 2], "invalid shape [True, 2]"),
    ("theta", ("tensors", "theta", "data"), [0.5, math.nan], "tensor 'theta' holds NaN or inf"),
    ("theta", ("tensors", "theta", "dtype"), "float16", "expected one of float32, float64, int64"),
    ("theta", ("tensors", "theta", "dtype"), ["float32"], "expected one of float32, float64, int64"),
    ("theta_per_class", ("tensors", "class_theta", "data"), [0.5, 0.5, 0.0, 0.0], "class_theta must hold"),
    ("deep", ("config", "hidden"), 10**9, "config hidden = 1000000000 is larger than the"),
    ("deep", ("config", "depth"), 10**9, "config depth = 1000000000 is larger than the"),
    ("deep", ("config", "members"), 10**400, "config members = 1000"),
    ("deep", ("config", "hidden"), 5, "expected tensors"),
    ("deep", ("config", "activation"), "gelu", "activation must be one of"),
    # None would build the constructor's default groups, which need not be the ones trained with
    ("deep", ("config", "features"), None, "config features must be the list of feature groups"),
    ("selection", ("config", "features"), None, "config features must be the list of feature groups"),
    ("calibrated", ("config", "head", "features"), None, "config features must be the list of feature groups"),
    ("deep", ("tensors", "feature_std", "data"), [0.0] * HEADS["deep"]().in_features, "feature_std must be > 0"),
    ("deep", ("tensors", "class_ids"), {"dtype": "float32", "shape": [0], "data": []}, "wrong kind of dtype"),
    ("deep", ("tensors", "class_ids"), {"dtype": "int64", "shape": [1], "data": [1.5]}, "values that are not int"),
    ("deep", ("tensors", "class_ids"), {"dtype": "int64", "shape": [1], "data": [10**400]}, "out of the int64 range"),
    ("selection", ("config", "k"), 0, "k must be an integer >= 1, got 0"),
    ("selection", ("config", "class_embed"), 10**6, "config class_embed = 1000000 is larger than"),
    ("calibration", ("config", "fuser_params"), {"iou_thr": 5}, "do not fit the 'wbf' fuser: iou_thr must be in [0, 1)"),
    ("calibration", ("config", "fuser_params"), {"bogus": 1}, "takes no parameter ['bogus']"),
    ("calibration", ("config", "fuser_params"), {"weights": [1.0]}, "one number per model (2)"),
    ("calibration", ("config", "tie_break"), -math.inf, "tie_break must be a number >= 0, got -inf"),
    ("calibrated", ("config", "head_type"), "theta", "head_type must name a network head type or 'bagged'"),
    ("calibrated", ("config", "head"), [1], "head must be a config mapping"),
    ("calibrated", ("config", "extra"), {}, "unknown config keys ['extra']"),
    ("calibrated", ("config", "head", "hidden"), 10**9, "head: config hidden = 1000000000 is larger than the"),
    ("calibrated", ("config", "calibration", "tie_break"), 2.0, "calibration: invalid calibration head"),
    ("calibrated", ("tensors", "stray"), {"dtype": "float32", "shape": [1], "data": [0.0]}, "belong to neither"),
    ("calibrated", ("tensors", "calibration.curves", "data"), [5, -1, 2, 1, -1, 2], "invalid curve row"),
]


#: numbers a head file's loader may allocate through torch's factories; the heads of HEADS hold a few
#: hundred, a file asking for ``hidden = 10**9`` or ``depth = 10**9`` far more.
ALLOCATION_CAP = 10**6


class _TooMuchAllocated(Exception):
    pass


@contextlib.contextmanager
def allocation_cap(cap: int = ALLOCATION_CAP):
    """While open, ``torch.empty`` / ``zeros`` / ``ones`` (what ``nn.Linear``, ``nn.Embedding``,
    ``nn.LayerNorm`` and the heads' buffers allocate with) raise once more than ``cap`` numbers are asked
    for in all, before allocating them. Yields ``[numbers asked for]``."""
    asked = [0]

    def capped(factory):
        def allocate(*size, **kwargs):
            shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
            asked[0] += math.prod(int(n) for n in shape)
            if asked[0] > cap:
                raise _TooMuchAllocated(f"{asked[0]} numbers asked for, more than {cap}")
            return factory(*size, **kwargs)

        return allocate

    with pytest.MonkeyPatch.context() as patch:
        for name in ("empty", "zeros", "ones"):
            patch.setattr(torch, name, capped(getattr(torch, name)))
        yield asked


def test_allocation_cap_stops_a_large_network():
    with pytest.raises(_TooMuchAllocated), allocation_cap():
        torch.nn.Linear(10**4, 10**3)  # 10**7 weights
    with allocation_cap() as asked:
        torch.nn.Linear(4, 4)
    assert asked == [4 * 4 + 4]


@pytest.mark.parametrize("head, keys, value, message", BAD_FIELDS)
def test_bad_field_is_a_head_file_error_naming_file_and_field(tmp_path, head, keys, value, message):
    """Refused before anything of the size the file asks for is built: nothing large is allocated."""
    path = write(tmp_path, set_path(saved(tmp_path, HEADS[head]()), keys, value))
    with pytest.raises(HeadFileError) as info, allocation_cap() as asked:
        load_head(path)
    assert asked[0] <= ALLOCATION_CAP
    assert str(path) in str(info.value) and message in str(info.value)


@pytest.mark.parametrize("head", sorted(HEADS))
def test_valid_files_load(tmp_path, head):
    original = HEADS[head]()
    loaded = load_head(write(tmp_path, saved(tmp_path, original)))
    assert type(loaded) is type(original) and loaded.model_names == NAMES


@pytest.mark.parametrize("text", ["[" * 100_000, '{"format": "detens-head", "format_version": 1, "type": "theta",'])
def test_unparsable_json(tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(HeadFileError, match="cannot parse JSON"):
        load_head(path)


def test_safetensors_metadata_and_dtypes_are_checked(tmp_path):
    from safetensors.torch import save_file

    metadata = {"format": "detens-head", "format_version": "1", "type": "theta", "model_names": '["a", "b"]',
                "config": json.dumps(ThetaHead(NAMES).config())}
    path = tmp_path / "head.safetensors"
    save_file({"theta": torch.tensor([0.5, 0.5], dtype=torch.float16)}, path, metadata=metadata)
    with pytest.raises(HeadFileError, match="tensor 'theta' has dtype torch.float16"):
        load_head(path)
    save_file({"theta": torch.tensor([0.5, 0.5])}, path, metadata={**metadata, "pickle": "x"})
    with pytest.raises(HeadFileError, match=r"unknown metadata fields \['pickle'\]"):
        load_head(path)
    save_file({"theta": torch.tensor([0.5, 0.5])}, path, metadata=metadata)
    assert load_head(path).theta.tolist() == [0.5, 0.5]


@pytest.mark.parametrize("text, message", [
    ('{"format": "detens-head", "format_version": 1, "type": "theta", "type": "deep"}', "has the key 'type' twice"),
    ('{"format_version": ' + "1" * 5000 + "}", "cannot be read as JSON: Exceeds the limit"),
])
def test_json_that_python_would_read_otherwise_is_refused_naming_the_file(tmp_path, text, message):
    """A key given twice would be read as its last value (a second 'theta' tensor taking the place of the
    first), and an integer of 5000 digits is a ValueError of Python's naming no file."""
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(HeadFileError) as info:
        load_head(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_a_tensor_given_twice_in_a_json_head_is_refused(tmp_path):
    path = tmp_path / "head.json"
    ThetaHead(NAMES).save(path)
    text = path.read_text().replace('"tensors": {', '"tensors": {"theta": {"dtype": "float32", "shape": [2], "data": [0.9, 0.1]},')
    path.write_text(text)
    with pytest.raises(HeadFileError, match="has the key 'theta' twice"):
        load_head(path)


def safetensors_parts(path: Path) -> tuple[dict, bytes]:
    """The JSON header and the data of the safetensors file ``path``."""
    blob = path.read_bytes()
    length = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8 : 8 + length]), blob[8 + length :]


def safetensors_blob(header: bytes, data: bytes, length: int | None = None) -> bytes:
    return (len(header) if length is None else length).to_bytes(8, "little") + header + data


def crafted_safetensors(header: dict, data: bytes) -> dict[str, bytes]:
    """Damaged or crafted versions of a saved Θ head (two weights, 8 bytes of data)."""
    theta = header["theta"]
    text = json.dumps(header).encode()
    twice_tensor = json.dumps(header).replace('"theta":', '"theta": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "theta":', 1)
    config = header["__metadata__"]["config"]
    return {
        "no length": b"\x01\x02",
        "a length of 2**62": safetensors_blob(text, data, 2**62),
        "a length beyond the file": safetensors_blob(text, data, len(text) + len(data) + 1),
        "a header that is no JSON": safetensors_blob(b"not json", data),
        "a header that is a list": safetensors_blob(b"[1, 2]", data),
        "a tensor twice": safetensors_blob(twice_tensor.encode(), data),
        "a metadata key twice": safetensors_blob(json.dumps({**header, "__metadata__": {
            **header["__metadata__"], "config": config.replace('"eps":', '"eps": 0.5, "eps":')}}).encode(), data),
        "a shape of other bytes": safetensors_blob(json.dumps({**header, "theta": {**theta, "shape": [3]}}).encode(), data),
        "a shape whose size overflows": safetensors_blob(
            json.dumps({**header, "theta": {**theta, "shape": [2**40, 2**40, 2**40]}}).encode(), data),
        "offsets beyond the data": safetensors_blob(
            json.dumps({**header, "theta": {**theta, "data_offsets": [8, 16]}}).encode(), data),
    }


CRAFTED_SAFETENSORS = {
    "no length": "gives no length",
    "a length of 2**62": "gives 4611686018427387904 (truncated, or not safetensors)",
    "a length beyond the file": "a header within the file",
    "a header that is no JSON": "is not valid JSON",
    "a header that is a list": "the safetensors header must be a JSON object, got list",
    "a tensor twice": "has the key 'theta' twice",
    "a metadata key twice": "config in",
    "a shape of other bytes": "tensor 'theta' (F32, shape [3]) needs 12 bytes, but its data_offsets [0, 8] give 8",
    "a shape whose size overflows": "tensor 'theta' (F32, shape [1099511627776, 1099511627776, 1099511627776]) needs",
    "offsets beyond the data": "its data_offsets [8, 16] give 8 of the 8 bytes of data the file holds",
}


@pytest.mark.parametrize("case", sorted(CRAFTED_SAFETENSORS))
def test_a_crafted_safetensors_header_is_a_head_file_error_naming_the_file_and_the_entry(tmp_path, case):
    """safetensors keeps one of two entries of a name without a word, and names no tensor in its own errors."""
    good = tmp_path / "good.safetensors"
    ThetaHead(NAMES).save(good)
    path = tmp_path / "crafted.safetensors"
    path.write_bytes(crafted_safetensors(*safetensors_parts(good))[case])
    with pytest.raises(HeadFileError) as info, allocation_cap() as asked:
        load_head(path)
    assert asked[0] <= ALLOCATION_CAP
    assert str(path) in str(info.value) and CRAFTED_SAFETENSORS[case] in str(info.value)
    if case == "a metadata key twice":
        assert "has the key 'eps' twice" in str(info.value)


# ------------------------------------------------------------------------------------------ missing keys
def small(cls):
    return cls(NAMES, hidden=4, depth=1)


#: one saved head of every type (and of every kind of part a combined head holds)
EVERY_TYPE = {
    "theta": lambda: ThetaHead(NAMES, normalize_box=True, match_iou=0.7),
    "theta_per_class": lambda: ThetaHead(NAMES, per_class=True, class_ids=[1, 3]),
    "deep": lambda: DeepEnsembleHead(NAMES, hidden=4, depth=1, box="learned", median_box=True),
    "selection": lambda: small(SelectionHead),
    "superlearner": lambda: small(SuperLearnerHead),
    "bagged": lambda: BaggedHead([small(DeepEnsembleHead), small(DeepEnsembleHead)]),
    "calibration": lambda: CalibrationHead(NAMES, fuser="nms"),
    "calibrated": lambda: CalibratedHead(CalibrationHead(NAMES), small(DeepEnsembleHead)),
    "calibrated_bagged": lambda: CalibratedHead(
        CalibrationHead(NAMES), BaggedHead([small(SuperLearnerHead), small(SuperLearnerHead)])
    ),
}


def config_key_paths(config: dict, head_type: str) -> list[tuple]:
    """Every key of a saved config, nested parts included, as a path into ``config``."""
    paths = [(key,) for key in config]
    if head_type == "bagged":
        paths += [("members", b, *path) for b, member in enumerate(config["members"])
                  for path in config_key_paths(member, "member")]
    elif head_type == "calibrated":
        paths += [("calibration", key) for key in config["calibration"]]
        paths += [("head", *path) for path in config_key_paths(config["head"], config["head_type"])]
    return paths


def missing_key_cases() -> list[tuple[str, tuple]]:
    cases = []
    for name, make in EVERY_TYPE.items():
        head = make()
        config = head.parts()[0] if hasattr(head, "parts") else head.config()
        cases += [(name, path) for path in config_key_paths(config, head.type_name)]
    return cases


@pytest.mark.parametrize("suffix", [".json", ".safetensors"])
@pytest.mark.parametrize("head, key_path", missing_key_cases())
def test_each_missing_config_key_is_a_head_file_error_naming_it(tmp_path, head, key_path, suffix):
    path = tmp_path / f"head{suffix}"
    EVERY_TYPE[head]().save(path)
    if suffix == ".json":
        document = json.loads(path.read_text())
        parent = document["config"]
        for key in key_path[:-1]:
            parent = parent[key]
        del parent[key_path[-1]]
        path.write_text(json.dumps(document))
    else:
        from safetensors import safe_open
        from safetensors.torch import save_file

        with safe_open(str(path), framework="pt") as f:
            metadata = dict(f.metadata())
            tensors = {name: f.get_tensor(name) for name in f.keys()}
        config = json.loads(metadata["config"])
        parent = config
        for key in key_path[:-1]:
            parent = parent[key]
        del parent[key_path[-1]]
        save_file(tensors, path, metadata={**metadata, "config": json.dumps(config)})
    with pytest.raises(HeadFileError) as info:
        load_head(path)
    message = str(info.value)
    assert str(path) in message and f"the config lacks the keys [{key_path[-1]!r}]" in message, message
    assert "holds every one of" in message


def test_a_file_without_its_config_says_it_is_missing(tmp_path):
    document = saved(tmp_path, ThetaHead(NAMES))
    del document["config"]
    with pytest.raises(HeadFileError, match=r"missing the 'config' object \(the settings the head was trained with"):
        load_head(write(tmp_path, document))


def test_missing_keys_are_all_named(tmp_path):
    document = saved(tmp_path, ThetaHead(NAMES))
    for key in ("match_iou", "normalize_box"):
        del document["config"][key]
    with pytest.raises(HeadFileError, match=r"lacks the keys \['normalize_box', 'match_iou'\]"):
        load_head(write(tmp_path, document))


@pytest.mark.parametrize("head", sorted(EVERY_TYPE))
def test_complete_files_of_every_type_load_unchanged(tmp_path, head):
    original = EVERY_TYPE[head]()
    loaded = load_head(write(tmp_path, saved(tmp_path, original)))
    assert type(loaded) is type(original)
    if hasattr(original, "parts"):
        assert loaded.parts()[0] == original.parts()[0]
    else:
        assert loaded.config() == original.config()


@pytest.mark.parametrize(
    "cls, not_saved",
    [
        (ThetaHead, {"num_classes"}),  # shorthand for class_ids, which is saved
        (DeepEnsembleHead, set()),
        (SelectionHead, set()),
        (SuperLearnerHead, set()),
        (CalibrationHead, {"curves", "class_curves"}),  # saved as tensors
    ],
)
def test_saved_config_holds_every_constructor_option(cls, not_saved):
    # the loaders refuse a config without one of these keys, so save must write them all
    head = cls(NAMES, class_ids=[1, 3], per_class=True) if cls is ThetaHead else cls(NAMES)
    options = set(inspect.signature(cls).parameters) - {"model_names"} - not_saved
    assert set(head.config()) == options


def shipped_heads() -> list[Path]:
    from detens.packaged import CONFIG_ROOT

    folder = CONFIG_ROOT / "heads"
    return sorted(p for p in folder.iterdir() if p.suffix in (".json", ".safetensors") and ".log." not in p.name)


def test_shipped_heads_hold_every_key():
    paths = shipped_heads()
    assert len(paths) >= 3
    for path in paths:
        assert load_head(path).model_names


def test_shipped_heads_load_by_name_and_a_missing_file_is_named_before_its_suffix(tmp_path, monkeypatch):
    from detens.fusers.theta import load_cached_head
    from detens.heads._io import read_head_file

    monkeypatch.chdir(tmp_path)
    head = load_head("coco_yolo3_theta", model_names=["yolo26n", "yolov8n", "yolo11n"])
    assert isinstance(head, ThetaHead) and ThetaHead.load("coco_yolo3_theta").model_names == head.model_names
    assert read_head_file("coco_yolo3_deep").type == load_cached_head("coco_yolo3_deep").type_name == "calibrated"
    shipped = r"\(shipped: coco_yolo3_deep, coco_yolo3_theta, coco_yolo3_tiles_deep\)"
    for missing in ("coco_yolo3_thet", "runs/nowhere/head", "head.txt"):
        with pytest.raises(FileNotFoundError, match=rf"head file '{missing}' not found: no such file \({tmp_path / missing}\)"
                                                    rf" and not a shipped name {shipped}"):
            load_head(missing)
    (tmp_path / "head.txt").write_text("{}")  # a file: its suffix is what is wrong
    with pytest.raises(ValueError, match=r"head file 'head.txt' must end in one of .json, .safetensors, got '.txt'"):
        load_head("head.txt")


# -------------------------------------------------------------------------------------- class id order
def per_class_theta() -> ThetaHead:
    head = ThetaHead(NAMES, per_class=True, class_ids=[1, 3])
    with torch.no_grad():
        head.class_theta.copy_(torch.tensor([[0.9, 0.1], [0.2, 0.8]]))
    return head


def test_saved_class_ids_are_sorted_and_rows_stay_with_their_class(tmp_path):
    head = ThetaHead(NAMES, per_class=True, class_ids=[3, 1])
    with torch.no_grad():
        head.class_theta.copy_(torch.tensor([[0.9, 0.1], [0.2, 0.8]]))
    document = saved(tmp_path, head)
    assert document["config"]["class_ids"] == [1, 3]
    loaded = load_head(write(tmp_path, document))
    labels = torch.tensor([1, 3, 7])
    assert torch.equal(loaded.cluster_theta(labels), head.cluster_theta(labels))


@pytest.mark.parametrize("class_ids", [[3, 1], [1, 1]])
def test_theta_class_ids_out_of_order_are_refused(tmp_path, class_ids):
    # rows [0.9, 0.1], [0.2, 0.8] listed as classes [3, 1] would otherwise land on classes 1, 3
    document = saved(tmp_path, per_class_theta())
    document["config"]["class_ids"] = class_ids
    path = write(tmp_path, document)
    with pytest.raises(HeadFileError) as info:
        load_head(path)
    assert str(path) in str(info.value)
    assert f"config class_ids {class_ids} must be in increasing order without repeats" in str(info.value)


@pytest.mark.parametrize("cls", [DeepEnsembleHead, SelectionHead, SuperLearnerHead])
@pytest.mark.parametrize("config_ids, tensor_ids", [([3, 1], [1, 3]), ([3, 1], [3, 1]), ([1, 3, 3], [1, 3])])
def test_net_class_ids_out_of_order_are_refused(tmp_path, cls, config_ids, tensor_ids):
    document = saved(tmp_path, cls(NAMES, class_ids=[1, 3], class_embed=2, hidden=4, depth=1))
    document["config"]["class_ids"] = config_ids
    document["tensors"]["class_ids"]["data"] = tensor_ids
    path = write(tmp_path, document)
    with pytest.raises(HeadFileError) as info:
        load_head(path)
    assert str(path) in str(info.value)
    assert f"config class_ids {config_ids} must be in increasing order without repeats" in str(info.value)


def test_bagged_member_class_ids_out_of_order_are_refused(tmp_path):
    member = lambda: DeepEnsembleHead(NAMES, class_ids=[1, 3], class_embed=2, hidden=4, depth=1)  # noqa: E731
    document = saved(tmp_path, BaggedHead([member(), member()]))
    document["config"]["members"][1]["class_ids"] = [3, 1]
    with pytest.raises(HeadFileError, match=r"member 1: config class_ids \[3, 1\] must be in increasing order"):
        load_head(write(tmp_path, document))


# ---------------------------------------------------------------------------------------- label space
LABEL_SPACE = {9: "bird", 1: "Cat", 5: "dog  (mixed) é"}  # kept as given, ids sorted


@pytest.mark.parametrize("suffix", [".json", ".safetensors"])
@pytest.mark.parametrize("head", [*HEADS, "bagged"])
def test_label_space_round_trips_in_both_formats(tmp_path, head, suffix):
    made = BaggedHead([DeepEnsembleHead(NAMES, hidden=4, depth=1) for _ in range(2)]) if head == "bagged" else HEADS[head]()
    assert made.label_space is None
    made.save(tmp_path / f"plain{suffix}")
    assert load_head(tmp_path / f"plain{suffix}").label_space is None
    made.label_space = dict(LABEL_SPACE)
    made.save(tmp_path / f"head{suffix}")
    loaded = load_head(tmp_path / f"head{suffix}")
    assert loaded.label_space == LABEL_SPACE and list(loaded.label_space) == [1, 5, 9]
    assert type(loaded).load(tmp_path / f"head{suffix}").label_space == LABEL_SPACE
    loaded.save(tmp_path / f"again{suffix}")
    assert load_head(tmp_path / f"again{suffix}").label_space == LABEL_SPACE


@pytest.mark.parametrize("head", [*HEADS, "bagged"])
def test_a_head_saved_again_as_safetensors_is_the_same_bytes(tmp_path, head):
    from safetensors.torch import load_file

    from detens.heads._io import read_head_file

    made = BaggedHead([DeepEnsembleHead(NAMES, hidden=4, depth=1) for _ in range(2)]) if head == "bagged" else HEADS[head]()
    made.label_space = dict(LABEL_SPACE)
    # safetensors orders the metadata by a hash seeded anew for each map: a few saves would show it
    for i in range(4):
        made.save(tmp_path / f"head{i}.safetensors")
    first = (tmp_path / "head0.safetensors").read_bytes()
    assert [(tmp_path / f"head{i}.safetensors").read_bytes() for i in range(1, 4)] == [first] * 3
    size = int.from_bytes(first[:8], "little")
    assert size % 8 == 0
    header = json.loads(first[8 : 8 + size])
    assert list(header) == sorted(header) and list(header["__metadata__"]) == sorted(header["__metadata__"])
    assert load_head(tmp_path / "head0.safetensors").label_space == LABEL_SPACE
    made.save(tmp_path / "head.json")
    as_json = read_head_file(tmp_path / "head.json")
    stored = load_file(tmp_path / "head0.safetensors")
    assert stored.keys() == as_json.tensors.keys()
    assert all(torch.equal(stored[name], as_json.tensors[name]) for name in stored)


def test_label_space_is_a_list_of_categories_and_a_file_without_it_loads(tmp_path):
    head = ThetaHead(NAMES, per_class=True, class_ids=[1, 5])
    head.label_space = {5: "dog", 1: "cat"}
    document = saved(tmp_path, head)
    assert document["label_space"] == [{"id": 1, "name": "cat"}, {"id": 5, "name": "dog"}]
    del document["label_space"]  # as files written before heads recorded one
    assert load_head(write(tmp_path, document, "old.json")).label_space is None


def test_a_label_space_of_many_renamed_ids_is_shortened_in_the_refusal():
    from detens.heads import check_head_label_space

    head = ThetaHead(NAMES, per_class=True, class_ids=list(range(1, 8)))
    head.label_space = {c: f"class {c}" for c in range(1, 8)}
    shown = ", ".join(f"{c} is 'class {c}' in the head but 'other {c}' there" for c in range(1, 6))
    with pytest.raises(ValueError, match=rf"^the head was trained on a label space whose category ids name other "
                                         rf"classes than in the dataset: {shown}, \.\.\. \(7 in all\); its per-class"):
        check_head_label_space(head, {c: f"other {c}" for c in range(1, 8)}, "the head", "the dataset")


@pytest.mark.parametrize("value, message", [
    ([{"id": 1, "name": "cat"}, {"id": 1, "name": "dog"}], "gives category id 1 twice"),
    ([{"id": 1, "name": ""}], "name of category id 1 must be a non-empty string"),
    ([{"id": 1, "name": 7}], "name of category id 1 must be a non-empty string"),
    ([{"id": -1, "name": "cat"}], "label_space category id"),
    ([{"id": True, "name": "cat"}], "label_space category id"),
    ([{"id": 1}], r"label_space\[0\] must be an object with keys id and name"),
    ({"1": "cat"}, "label_space category id"),
    ("cat", "label_space must map category ids to names"),
])
@pytest.mark.parametrize("suffix", [".json", ".safetensors"])
def test_bad_label_space_is_a_head_file_error(tmp_path, value, message, suffix):
    if suffix == ".json":
        path = write(tmp_path, set_path(saved(tmp_path, ThetaHead(NAMES)), ("label_space",), value))
    else:
        from safetensors.torch import save_file

        ThetaHead(NAMES).save(tmp_path / "good.safetensors")
        with safetensors_open(tmp_path / "good.safetensors") as (metadata, tensors):
            pass
        path = tmp_path / "bad.safetensors"
        save_file(tensors, str(path), metadata={**metadata, "label_space": json.dumps(value)})
    with pytest.raises(HeadFileError, match=rf"is not a valid detens head file: .*{message}"):
        load_head(path)


@contextlib.contextmanager
def safetensors_open(path: Path):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        yield dict(f.metadata()), {name: f.get_tensor(name) for name in f.keys()}


def test_a_head_given_other_models_says_to_rename_them_only_when_their_number_is_the_heads():
    from detens.heads._io import find_head_file, read_head_for

    path = find_head_file("coco_yolo3_deep")
    with pytest.raises(ValueError) as renamed:
        read_head_for(path, "calibrated", ["yolov8n_int8", "yolo11n_int8", "yolo26n_int8"])  # Ultralytics' names of the files
    assert "not for the models ['yolov8n_int8', 'yolo11n_int8', 'yolo26n_int8']" in str(renamed.value)
    assert "name them as the head does" in str(renamed.value)
    with pytest.raises(ValueError) as other:
        read_head_for(path, "calibrated", ["yolov8n", "yolo11n"])
    assert str(other.value).endswith("fit a head on these models' predictions)")


def test_the_training_images_of_a_head_are_read_from_its_training_log(tmp_path):
    from detens.heads._io import find_head_file, read_trained_on, training_log_path

    # the shipped head's log lists the 204 annotated images of the 206 and the 168 extra ones
    shipped = read_trained_on(find_head_file("coco_yolo3_deep"))
    assert len(shipped) == 372 and shipped == sorted(shipped) and "000000000139.jpg" in shipped
    head = tmp_path / "head.json"
    assert training_log_path(head) == tmp_path / "head.json.log.json"
    assert read_trained_on(head) is None  # no log: nothing known
    training_log_path(head).write_text(json.dumps({"head": "theta", "images": 2}))
    assert read_trained_on(head) is None  # a log of an earlier version
    training_log_path(head).write_text(json.dumps({"trained_on": ["a.jpg", "b.jpg"]}))
    assert read_trained_on(head) == ["a.jpg", "b.jpg"]
    for bad, message in [('{"trained_on": ', "the head's training log cannot be read: .*is not valid JSON: Expecting value"),
                         ('{"trained_on": [1]}', "trained_on must be a list of image file names"),
                         ("[" * 100_000, "the head's training log cannot be read: .*nests arrays or objects too deeply"),
                         # the images named last would be taken for all those the head was fitted on
                         ('{"trained_on": ["a.jpg"], "trained_on": ["b.jpg"]}', ".*has the key 'trained_on' twice")]:
        training_log_path(head).write_text(bad)
        with pytest.raises(HeadFileError, match=f"^'{training_log_path(head)}': {message}"):
            read_trained_on(head)


def _slow_head_digest(head) -> str:
    """The digest spelled out: the fields as one sorted JSON text, then each tensor by name, its values one
    by one as little-endian numbers."""
    import hashlib
    import struct

    fields = {"type": head.type, "model_names": head.model_names, "config": head.config,
              "label_space": None if head.label_space is None else [[c, head.label_space[c]] for c in sorted(head.label_space)]}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode("utf-8"))
    codes = {torch.float32: ("float32", "<f"), torch.float64: ("float64", "<d"), torch.int64: ("int64", "<q")}
    for name in sorted(head.tensors):
        tensor = head.tensors[name]
        dtype_name, code = codes[tensor.dtype]
        digest.update(f"\0{name}\0{dtype_name}\0{list(tensor.shape)}\0".encode())
        for value in tensor.reshape(-1).tolist():
            digest.update(struct.pack(code, value))
    return digest.hexdigest()


@pytest.mark.parametrize("head", HEADS)
def test_a_heads_digest_is_of_its_content_whatever_its_file_format_or_line_endings(tmp_path, head):
    from detens.heads._io import head_digest, read_head_file

    made = HEADS[head]()
    made.label_space = dict(LABEL_SPACE)
    made.save(tmp_path / "head.json")
    made.save(tmp_path / "head.safetensors")
    read = read_head_file(tmp_path / "head.json")
    digest = head_digest(read)
    assert digest == _slow_head_digest(read) and len(digest) == 64
    assert head_digest(read_head_file(tmp_path / "head.safetensors")) == digest
    crlf = tmp_path / "crlf.json"
    crlf.write_bytes((tmp_path / "head.json").read_bytes().replace(b"\n", b"\r\n"))  # a checkout may do that
    assert crlf.read_bytes() != (tmp_path / "head.json").read_bytes()
    assert head_digest(read_head_file(crlf)) == digest
    # any change to what the head is changes it
    name = next(n for n in sorted(read.tensors) if read.tensors[n].numel())
    changed = read_head_file(tmp_path / "head.json")
    changed.tensors[name] = changed.tensors[name].clone()
    changed.tensors[name].reshape(-1)[0] += 1
    for other in (changed,
                  dataclasses.replace(read, model_names=read.model_names[::-1]),
                  dataclasses.replace(read, label_space={**LABEL_SPACE, 9: "Bird"}),
                  dataclasses.replace(read, label_space=None),
                  dataclasses.replace(read, config={**read.config, "unseen": 1})):
        assert head_digest(other) == _slow_head_digest(other) != digest


def test_a_training_log_written_for_another_head_is_not_read(tmp_path, caplog):
    from detens.heads._io import (
        HEAD_DIGEST,
        find_head_file,
        head_digest,
        read_head_file,
        read_trained_on,
        training_log_path,
    )

    for name in ("coco_yolo3_deep", "coco_yolo3_theta", "coco_yolo3_tiles_deep"):  # the shipped logs name their heads
        shipped = json.loads(training_log_path(find_head_file(name)).read_text())
        assert shipped[HEAD_DIGEST] == head_digest(read_head_file(name)), name
    head = tmp_path / "head.json"
    ThetaHead(NAMES).save(head)
    log = training_log_path(head)
    log.write_text(json.dumps({"trained_on": ["a.jpg"], HEAD_DIGEST: head_digest(read_head_file(head))}))
    assert read_trained_on(head) == ["a.jpg"]
    ThetaHead(NAMES, lambda_reg=2.0).save(head)  # replaced since: another head under the log
    with caplog.at_level("WARNING", logger="detens.heads._io"):
        assert read_trained_on(head) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"{str(log)!r} was written for another head than {str(head)!r} (its head_sha256 differs: the head file "
        "was replaced after it): the images this head was fitted on are not known, so scoring them is not warned of"]
    log.write_text(json.dumps({"trained_on": ["a.jpg"], HEAD_DIGEST: 1}))
    with pytest.raises(HeadFileError, match=f"^'{log}': head_sha256 must be the head's digest as a string, got 1$"):
        read_trained_on(head)


def test_a_head_in_a_folder_named_tilde_is_loaded_from_there(tmp_path, monkeypatch):
    from detens import TorchvisionFusion
    from detens.packaged import find_packaged

    shipped = find_packaged("coco_yolo3_theta", "heads")
    (tmp_path / "~").mkdir()
    (tmp_path / "~" / "h.json").write_bytes(shipped.read_bytes())
    home = tmp_path / "home"
    home.mkdir()
    (home / "h.json").write_text("not a head")  # what the home folder's h.json would give
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    head = load_head("./~/h.json")
    assert head.model_names == load_head(shipped).model_names
    assert find_packaged("./~/h.json", "heads") == tmp_path / "~" / "h.json"
    TorchvisionFusion(method="theta", head="./~/h.json", model_names=head.model_names)
    with pytest.raises(HeadFileError):
        load_head("~/h.json")
