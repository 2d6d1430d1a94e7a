"""The files beside an ``.onnx`` that hold some of its tensors (ONNX's external-data format).

A model over protobuf's 2 GB limit, or one saved with ``onnx.save_model(..., save_as_external_data=True)``,
keeps the content of some tensors in other files: such a tensor has ``data_location: EXTERNAL`` and an
``external_data`` entry ``location``, a path relative to the ``.onnx``'s folder, where onnxruntime reads
it when the model loads. :func:`external_data_files` lists those files by walking the protobuf wire
format of the model itself, so that it needs no ``onnx`` package; it looks wherever onnxruntime can
find a tensor: the graph's initializers and sparse initializers, node attributes (constants), the
subgraphs of control-flow nodes (``If``, ``Loop``, ``Scan``) and the model's functions.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path

__all__ = ["external_data_files"]

# the protobuf wire types (https://protobuf.dev/programming-guides/encoding/)
_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5
_FIXED_SIZES = {_FIXED64: 8, _FIXED32: 4}

# message -> {field number: the message that field holds}, for the fields that lead to tensors (onnx.proto)
_TENSOR_HOLDERS: dict[str, dict[int, str]] = {
    "model": {7: "graph", 25: "function"},  # graph, functions
    "graph": {1: "node", 5: "tensor", 15: "sparse_tensor"},  # node, initializer, sparse_initializer
    "function": {7: "node", 11: "attribute"},  # node, attribute_proto (the attributes' defaults)
    "node": {5: "attribute"},  # attribute
    "attribute": {
        5: "tensor",  # t
        6: "graph",  # g
        10: "tensor",  # tensors
        11: "graph",  # graphs
        22: "sparse_tensor",  # sparse_tensor
        23: "sparse_tensor",  # sparse_tensors
    },
    "sparse_tensor": {1: "tensor", 2: "tensor"},  # values, indices
}
_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 13, 14  # TensorProto fields
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
_ENTRY_KEY, _ENTRY_VALUE = 1, 2  # StringStringEntryProto fields

Buffer = bytes | mmap.mmap  # indexable: data[i] is an int, data[a:b] bytes


class _Malformed(ValueError):
    """Bytes that are not a protobuf message."""


def _varint(data: Buffer, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``data[pos]`` and the position after it."""
    value = shift = 0
    while pos < end and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise _Malformed(f"a truncated or overlong varint before byte {pos}")


def _fields(data: Buffer, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """``(field number, wire type, a, b)`` of each field of the message in ``data[start:end]``: a varint's
    value in ``a``, a length-delimited field's content at ``data[a:b]``; fixed-size fields give ``(a, b)``
    of their bytes. Offsets, not slices: a model of gigabytes is walked without copying it."""
    pos = start
    while pos < end:
        key, pos = _varint(data, pos, end)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _varint(data, pos, end)
            yield number, wire, value, -1
            continue
        if wire == _LENGTH_DELIMITED:
            size, pos = _varint(data, pos, end)
        elif wire in _FIXED_SIZES:
            size = _FIXED_SIZES[wire]
        else:  # 3, 4: groups, which onnx.proto does not use; 6, 7: not wire types
            raise _Malformed(f"wire type {wire} of field {number} at byte {pos}")
        if number == 0 or pos + size > end:
            raise _Malformed(
                f"field {number} of {size} bytes at byte {pos} runs past its message's end {end}"
            )
        yield number, wire, pos, pos + size
        pos += size


def _external_location(data: Buffer, start: int, end: int) -> str | None:
    """The ``location`` of the ``TensorProto`` in ``data[start:end]`` when its data is external, else None."""
    external, location = False, None
    for number, wire, a, b in _fields(data, start, end):
        if number == _TENSOR_DATA_LOCATION and wire == _VARINT:
            external = a == _EXTERNAL
        elif number == _TENSOR_EXTERNAL_DATA and wire == _LENGTH_DELIMITED:
            entry = {n: data[x:y] for n, w, x, y in _fields(data, a, b) if w == _LENGTH_DELIMITED}
            if entry.get(_ENTRY_KEY) == b"location":
                location = entry.get(_ENTRY_VALUE, b"").decode("utf-8")
    return location if external else None


def _locations(data: Buffer, start: int, end: int, message: str) -> Iterator[str]:
    """The external-data locations of the tensors inside the ``message`` in ``data[start:end]``."""
    if message == "tensor":
        location = _external_location(data, start, end)
        if location is not None:
            yield location
        return
    holders = _TENSOR_HOLDERS[message]
    for number, wire, a, b in _fields(data, start, end):
        if wire == _LENGTH_DELIMITED and number in holders:
            yield from _locations(data, a, b, holders[number])


def external_data_files(model: str | Path) -> list[Path]:
    """The files that ``model`` (an ``.onnx``) keeps tensors in, once each, in the order the model first
    names them: its tensors' external-data ``location`` under the model's folder, as onnxruntime reads
    them. Empty for a model that holds all its tensors.

    Raises:
        ValueError: ``model`` is not a protobuf message (not an ONNX model), or gives a tensor an empty
            location.
    """
    model = Path(model)
    with open(model, "rb") as handle:
        if handle.seek(0, 2) == 0:
            raise ValueError(f"{model} is empty, not an ONNX model")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            try:
                locations = list(dict.fromkeys(_locations(data, 0, len(data), "model")))
            except (_Malformed, UnicodeDecodeError) as err:
                raise ValueError(f"{model} is not an ONNX model: {err}") from None
    for location in locations:
        if not location:
            raise ValueError(
                f"{model} keeps a tensor in external data without naming the file (empty location)"
            )
    return [model.parent / location for location in locations]
