"""Scalar option checks (``detens.checks``) and the per-model weights check, table-driven."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from detens.checks import (
    check_choice,
    check_choices,
    check_device,
    check_flag,
    check_integer,
    check_integers,
    check_real,
    check_reals,
    check_whole,
    first_few,
    torch_ready_array,
)
from detens.fusers import check_weights


@pytest.mark.parametrize(
    "value, bounds, expected, error, message",
    [
        (0.5, {}, 0.5, None, None),
        (1, {"low": 0, "high": 1}, 1.0, None, None),
        (np.float32(0.25), {}, 0.25, None, None),
        (np.int64(3), {}, 3.0, None, None),
        (torch.tensor(0.5), {}, 0.5, None, None),
        (0.0, {"low": 0.0, "low_open": True}, None, ValueError, "x must be a positive number, got 0.0"),
        (1.0, {"low": 0, "high": 1, "high_open": True}, None, ValueError, r"x must be in \[0, 1\), got 1.0"),
        (-0.1, {"low": 0.0}, None, ValueError, "x must be a number >= 0, got -0.1"),
        (math.nan, {}, None, ValueError, "x must be a finite number, got nan"),
        (math.inf, {"low": 0.0}, None, ValueError, "x must be a number >= 0, got inf"),
        (10**400, {}, None, ValueError, "x must be a finite number, got 1000"),  # beyond the float range
        (-(10**400), {"high": 0.0}, None, ValueError, "x must be <= 0, got -1000"),
        (None, {}, None, TypeError, "x must be a number, got NoneType: None"),
        ("0.5", {}, None, TypeError, "x must be a number, got str: '0.5'"),
        (True, {}, None, TypeError, "x must be a number, got bool: True"),
        (1 + 1j, {}, None, TypeError, "x must be a number, got complex"),
        ([0.5], {}, None, TypeError, "x must be a number, got list"),
        (torch.tensor([0.5]), {}, None, TypeError, "x must be a number, got Tensor"),
    ],
)
def test_check_real(value, bounds, expected, error, message):
    if error is None:
        assert check_real(value, "x", **bounds) == expected
    else:
        with pytest.raises(error, match=message):
            check_real(value, "x", **bounds)


@pytest.mark.parametrize(
    "value, bounds, expected, error, message",
    [
        (3, (1, None), 3, None, None),
        (np.int64(2), (1, 3), 2, None, None),
        (np.uint8(7), (None, None), 7, None, None),
        (0, (1, None), None, ValueError, "n must be an integer >= 1, got 0"),
        (4, (1, 3), None, ValueError, r"n must be an integer in \[1, 3\], got 4"),
        (2.0, (1, None), None, TypeError, "n must be an integer, got float: 2.0"),
        (True, (1, None), None, TypeError, "n must be an integer, got bool: True"),
        ("a", (1, None), None, TypeError, "n must be an integer, got str: 'a'"),
        (math.inf, (None, None), None, TypeError, "n must be an integer, got float: inf"),
    ],
)
def test_check_integer(value, bounds, expected, error, message):
    if error is None:
        assert check_integer(value, "n", *bounds) == expected
    else:
        with pytest.raises(error, match=message):
            check_integer(value, "n", *bounds)


@pytest.mark.parametrize(
    "value, bounds, error, message",
    [
        (3, (0, None), None, None),
        (np.int16(3), (0, None), None, None),
        (3.0, (0, None), None, None),
        (np.float32(7.0), (0, 10), None, None),
        (-0.0, (0, None), None, None),
        (torch.tensor(5.0), (0, None), None, None),
        (np.array(2.0, dtype=">f8"), (0, None), None, None),
        (1.5, (0, None), ValueError, "n must be a whole number, got 1.5"),
        (np.float64(2.25), (0, None), ValueError, "n must be a whole number, got 2.25"),
        (math.nan, (None, None), ValueError, "n must be a whole number, got nan"),
        (math.inf, (None, None), ValueError, "n must be a whole number, got inf"),
        (-1.0, (0, None), ValueError, "n must be an integer >= 0, got -1.0"),
        (2.0**31, (0, 2**31 - 1), ValueError, r"n must be an integer in \[0, 2147483647\], got 2147483648.0"),
        (True, (0, None), TypeError, "n must be an integer, got bool: True"),
        (np.bool_(False), (0, None), TypeError, "n must be an integer, got bool"),
        ("3", (0, None), TypeError, "n must be an integer, got str: '3'"),
        (None, (0, None), TypeError, "n must be an integer, got NoneType"),
    ],
)
def test_check_whole(value, bounds, error, message):
    """Integers, and floats that are integers, as the ints they are; any other float is named, never truncated."""
    if error is None:
        number = float(value) if not isinstance(value, (int, np.integer)) else value
        assert check_whole(value, "n", *bounds) == int(number) and float(number).is_integer()
        assert type(check_whole(value, "n", *bounds)) is int
    else:
        with pytest.raises(error, match=message):
            check_whole(value, "n", *bounds)


@pytest.mark.parametrize("dtype", ["<f4", ">f4", ">f8", ">i2", ">i8", ">u4", "<i8", "|u1", "|b1"])
def test_torch_ready_array_keeps_the_values(dtype):
    array = np.array([[0, 1, 2], [3, 250, 7]]).astype(dtype)
    native = torch_ready_array(array)
    assert native.dtype.isnative and native.dtype == array.dtype.newbyteorder("=")
    assert np.array_equal(native, array) and native.shape == array.shape
    assert (native is array) == array.dtype.isnative  # a native array is not copied
    assert torch.equal(torch.as_tensor(native), torch.as_tensor(array.astype(array.dtype.newbyteorder("="))))


@pytest.mark.parametrize(
    "make",
    [lambda a: a[::-1], lambda a: a[:, ::-1], lambda a: np.flip(a), lambda a: a.astype(">f8")[::-1], lambda a: a.T, lambda a: a[::2]],
    ids=["rows_reversed", "columns_reversed", "flipped", "big_endian_reversed", "transposed", "stepped"],
)
def test_torch_ready_array_takes_every_layout(make):
    array = make(np.arange(12, dtype=np.float64).reshape(4, 3))
    ready = torch_ready_array(array)
    assert np.array_equal(ready, array) and ready.shape == array.shape
    assert (ready is array) == (array.dtype.isnative and min(array.strides) >= 0)  # copied only when needed
    assert torch.as_tensor(ready).tolist() == array.tolist()


@pytest.mark.parametrize(
    "make",
    [lambda a: np.frombuffer(a.tobytes(), a.dtype).reshape(a.shape), lambda a: np.broadcast_to(a[:1], a.shape),
     lambda a: a.astype(">f8")],
    ids=["from_buffer", "broadcast", "big_endian"],
)
def test_torch_ready_array_of_a_read_only_array_is_a_writable_copy(make):
    array = make(np.arange(12, dtype=np.float64).reshape(4, 3))
    array.setflags(write=False)
    ready = torch_ready_array(array)
    assert ready.flags.writeable and not np.shares_memory(ready, array) and np.array_equal(ready, array)


@pytest.mark.parametrize("value, ok", [(True, True), (False, True), (np.bool_(True), True), (1, False), ("yes", False), (None, False)])
def test_check_flag(value, ok):
    if ok:
        assert check_flag(value, "f") is bool(value)
    else:
        with pytest.raises(TypeError, match="f must be True or False"):
            check_flag(value, "f")


def test_check_choice_lists_the_choices():
    assert check_choice("b", "c", ("a", "b")) == "b"
    with pytest.raises(ValueError, match="^c must be one of a, b, got 'z'$"):
        check_choice("z", "c", ("a", "b"))
    for bad, shown in ((None, "NoneType None"), (["a"], "list ['a']"), (1, "int 1")):
        with pytest.raises(TypeError, match=f"^c must be one of a, b, got {re.escape(shown)}$"):
            check_choice(bad, "c", ("a", "b"))


def test_check_choices_names_the_position_of_a_bad_one():
    assert check_choices(("b", "a"), "c", ("a", "b")) == ["b", "a"] and check_choices([], "c", ("a",)) == []
    with pytest.raises(ValueError, match=r"^c\[1\] must be one of a, b, got 'z'$"):
        check_choices(["a", "z"], "c", ("a", "b"))
    for bad, shown in (("ab", "str: 'ab'"), (None, "NoneType: None"), ({"a": 1}, "dict: {'a': 1}")):
        with pytest.raises(TypeError, match=f"^c must be a list of names among a, b, got {re.escape(shown)}$"):
            check_choices(bad, "c", ("a", "b"))


@pytest.mark.parametrize(
    "weights, error, message",
    [
        ("123", TypeError, "weights must be a list with one number per model"),
        ({"a": 1.0, "b": 1.0}, TypeError, "weights must be a list"),
        (2.0, TypeError, "weights must be a list"),
        ([1.0, None], TypeError, r"weights\[1\] must be a number, got NoneType"),
        ([1.0, "2"], TypeError, r"weights\[1\] must be a number, got str"),
        ([True, False], TypeError, r"weights\[0\] must be a number, got bool"),
        (np.array([1.0, 2.0], dtype=object), TypeError, "weights must hold real numbers"),
        (torch.tensor([True, False]), TypeError, "weights must hold real numbers"),
        ([1.0], ValueError, r"one number per model \(2\), got 1"),
        (torch.ones(2, 1), ValueError, r"one number per model \(2\), got shape \[2, 1\]"),
        ([1.0, -1.0], ValueError, r"weights\[1\] must be a number >= 0, got -1.0"),
        ([1.0, math.nan], ValueError, r"weights\[1\] must be a number >= 0, got nan"),
        ([1.0, math.inf], ValueError, r"weights\[1\] must be a number >= 0, got inf"),
        ([0.0, 0.0], ValueError, "must not all be 0"),
    ],
)
def test_bad_weights(weights, error, message):
    with pytest.raises(error, match=message):
        check_weights(weights, 2, torch.device("cpu"))


@pytest.mark.parametrize(
    "weights", [[1, 2.5], (1.0, 2.5), np.array([1.0, 2.5]), torch.tensor([1.0, 2.5]), [np.int64(1), np.float32(2.5)]]
)
def test_good_weights_are_a_fresh_float64_tensor_relative_to_the_largest(weights):
    got = check_weights(weights, 2, torch.device("cpu"))
    assert got.dtype == torch.float64 and got.tolist() == [0.4, 1.0]
    got.add_(1)  # the caller's weights are not touched
    assert np.asarray(weights, dtype=np.float64).tolist() == [1.0, 2.5]


@pytest.mark.parametrize("weights, relative", [
    ([1e308, 1e308], [1.0, 1.0]),
    ([1.5e308, 3e307, 0.0], [1.0, 0.2, 0.0]),
    (np.array([1.7e308, 1.7e308, 1.7e308]), [1.0, 1.0, 1.0]),
    ([10**308, 10**308], [1.0, 1.0]),  # Python ints, their sum beyond the float range
])
def test_finite_weights_near_the_float64_limit_keep_their_ratios(weights, relative):
    got = check_weights(weights, len(relative), torch.device("cpu"), torch.float32)
    assert got.dtype == torch.float32 and got.tolist() == pytest.approx(relative)


@pytest.mark.parametrize(
    "values, error, message",
    [
        ("139", TypeError, "ids must be a list of integers, got str: '139'"),
        (139, TypeError, "ids must be a list of integers, got int"),
        ({1: 2}, TypeError, "ids must be a list of integers, got dict"),
        ([1, 2.5], TypeError, r"ids\[1\] must be an integer, got float: 2.5"),
        (torch.ones(2, 2, dtype=torch.int64), ValueError, r"ids must be a flat list of integers, got shape \[2, 2\]"),
    ],
)
def test_check_integers(values, error, message):
    with pytest.raises(error, match=message):
        check_integers(values, "ids")
    assert check_integers(np.array([3, 1]), "ids") == [3, 1] and check_integers(range(2), "ids") == [0, 1]


@pytest.mark.parametrize(
    "values, error, message",
    [
        (0.6, TypeError, "grid must be a list of numbers, got float: 0.6"),
        ("0.6", TypeError, "grid must be a list of numbers, got str: '0.6'"),
        ([0.5, "0.6"], TypeError, r"grid\[1\] must be a number, got str: '0.6'"),
        ([0.5, 1.0], ValueError, r"grid\[1\] must be in \(0, 1\), got 1.0"),
    ],
)
def test_check_reals(values, error, message):
    with pytest.raises(error, match=message):
        check_reals(values, "grid", 0.0, 1.0, low_open=True, high_open=True)
    assert check_reals((0.5, np.float32(0.25), 1), "grid") == [0.5, 0.25, 1.0]


@pytest.mark.parametrize(
    "value, error, message",
    [
        ("banana", ValueError, "device must be a torch device: cpu, cuda or cuda:<index>, got 'banana'"),
        ("", ValueError, "device must be a torch device"),
        (0.5, TypeError, "device must be a device string such as cpu or cuda, got float: 0.5"),
        (None, TypeError, "device must be a device string"),
    ],
)
def test_check_device_refuses_what_is_no_device(value, error, message):
    with pytest.raises(error, match=message):
        check_device(value)


def test_check_device_accepts_what_this_machine_has():
    assert check_device("cpu") == "cpu" and check_device(torch.device("cpu")) == "cpu"
    if torch.cuda.is_available():
        assert check_device("cuda") == "cuda" and check_device("cuda:0") == "cuda:0"
        with pytest.raises(ValueError, match=f"this machine has {torch.cuda.device_count()} CUDA device"):
            check_device(f"cuda:{torch.cuda.device_count()}")
    else:
        with pytest.raises(ValueError, match="device is 'cuda:0' but no CUDA device is available"):
            check_device("cuda:0")


@pytest.mark.parametrize("value", ["meta", "mps", "xpu:0", "hpu", torch.device("meta")])
def test_check_device_refuses_device_types_this_machine_lacks(monkeypatch, value):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    if hasattr(torch, "xpu"):
        monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device is .* but this machine has no \w+ device; use cpu or cuda"):
        check_device(value)


def test_check_device_accepts_mps_where_the_machine_has_it(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert check_device("mps") == "mps"


def test_check_device_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device is 'cuda' but no CUDA device is available on this machine; use cpu"):
        check_device("cuda")


def test_folds_refuse_a_string_of_ids():
    from detens.folds import kfold_image_splits

    with pytest.raises(TypeError, match="image_ids must be a list of integers"):
        kfold_image_splits("1397", k=2)


def test_check_distinct_integers():
    from detens.checks import check_distinct_integers

    assert check_distinct_integers((3, 1, 2), "ids") == [3, 1, 2]
    assert check_distinct_integers([], "ids") == []
    with pytest.raises(ValueError, match=r"ids must be distinct, got duplicates \[1, 3\]"):
        check_distinct_integers([3, 1, 3, 1, 2], "ids")
    with pytest.raises(TypeError, match="ids must be a list of integers"):
        check_distinct_integers("139", "ids")


def test_first_few_lists_some_then_how_many_in_all():
    assert first_few(list(range(1, 4))) == "1, 2, 3"
    assert first_few(list(range(1, 11))) == ", ".join(map(str, range(1, 11)))  # all fit: no count
    assert first_few(list(range(1, 13)), 3) == "1, 2, 3, ... (12 in all)"
    assert first_few(["a b", "c"], 1, "; ") == "a b; ... (2 in all)"
    assert first_few([1, 2, 3], 2, show=lambda i: f"#{i}") == "#1, #2, ... (3 in all)"
    assert first_few(["1-11", "13-25", "27"], 2, total=24, noun="ids") == "1-11, 13-25, ... (24 ids in all)"
    assert first_few([]) == ""


def test_messages_list_their_first_few_items_one_way():
    """The lists of ids, images and keys in messages, written by one helper."""
    from detens.adapters._labels import id_ranges
    from detens.predictions import LeftOutImage, _describe_images

    ids = [i for i in range(1, 200) if i % 3]  # 1, 2, 4, 5, 7, ...: one run every three ids
    assert id_ranges(ids, 3) == f"1, 2, 4, 5, 7, 8, ... ({len(ids)} ids in all)"
    assert id_ranges([]) == "none"
    left_out = [LeftOutImage(i, f"{i}.jpg", {"a": "corrupt"}) for i in range(3)]
    assert _describe_images(left_out, 2) == "0 (0.jpg, unreadable by a); 1 (1.jpg, unreadable by a); ... (3 in all)"
