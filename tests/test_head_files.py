"""Head files are untrusted input: every field is checked, and a bad one is one HeadFileError naming the
file and the field, before anything is built from it.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch

from detens.heads import CalibratedHead, HeadFileError, load_head
from detens.heads.calibration import CalibrationHead
from detens.heads.deep import DeepEnsembleHead
from detens.heads.selection import SelectionHead
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
    ("deep", ("tensors", "feature_std", "data"), [0.0] * 21, "feature_std must be > 0"),
    ("deep", ("tensors", "class_ids"), {"dtype": "float32", "shape": [0], "data": []}, "wrong kind of dtype"),
    ("deep", ("tensors", "class_ids"), {"dtype": "int64", "shape": [1], "data": [1.5]}, "values that are not int"),
    ("deep", ("tensors", "class_ids"), {"dtype": "int64", "shape": [1], "data": [10**400]}, "out of the int64 range"),
    ("selection", ("config", "k"), 0, "k must be an integer >= 1, got 0"),
    ("selection", ("config", "class_embed"), 10**6, "config class_embed = 1000000 is larger than"),
    ("calibration", ("config", "fuser_params"), {"iou_thr": 5}, "do not fit the 'wbf' fuser: iou_thr must be in [0, 1]"),
    ("calibration", ("config", "fuser_params"), {"bogus": 1}, "unexpected keyword argument 'bogus'"),
    ("calibration", ("config", "fuser_params"), {"weights": [1.0]}, "one number per model (2)"),
    ("calibration", ("config", "tie_break"), -math.inf, "tie_break must be a number >= 0, got -inf"),
    ("calibrated", ("config", "head_type"), "theta", "head_type must name a network head type or 'bagged'"),
    ("calibrated", ("config", "head"), [1], "head must be a config mapping"),
    ("calibrated", ("config", "extra"), {}, "has the keys calibration, head_type and head"),
    ("calibrated", ("config", "head", "hidden"), 10**9, "head: config hidden = 1000000000 is larger than the"),
    ("calibrated", ("config", "calibration", "tie_break"), 2.0, "calibration: invalid calibration head"),
    ("calibrated", ("tensors", "stray"), {"dtype": "float32", "shape": [1], "data": [0.0]}, "belong to neither"),
    ("calibrated", ("tensors", "calibration.curves", "data"), [5, -1, 2, 1, -1, 2], "invalid curve row"),
]


@pytest.mark.parametrize("head, keys, value, message", BAD_FIELDS)
def test_bad_field_is_a_head_file_error_naming_file_and_field(tmp_path, head, keys, value, message):
    path = write(tmp_path, set_path(saved(tmp_path, HEADS[head]()), keys, value))
    start = time.perf_counter()
    with pytest.raises(HeadFileError) as info:
        load_head(path)
    assert time.perf_counter() - start < 5, "refused only after building what the file asked for"
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
                "config": "{}"}
    path = tmp_path / "head.safetensors"
    save_file({"theta": torch.tensor([0.5, 0.5], dtype=torch.float16)}, path, metadata=metadata)
    with pytest.raises(HeadFileError, match="tensor 'theta' has dtype torch.float16"):
        load_head(path)
    save_file({"theta": torch.tensor([0.5, 0.5])}, path, metadata={**metadata, "pickle": "x"})
    with pytest.raises(HeadFileError, match=r"unknown metadata fields \['pickle'\]"):
        load_head(path)
    save_file({"theta": torch.tensor([0.5, 0.5])}, path, metadata=metadata)
    assert load_head(path).theta.tolist() == [0.5, 0.5]
