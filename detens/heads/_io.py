"""Saved fusion heads: one file format for every head type, JSON or safetensors, never pickle.

A head file carries:

- ``format`` = ``"detens-head"`` and ``format_version``;
- ``type``: the head type (``"theta"``, ...), which :func:`detens.heads.load_head` dispatches on;
- ``model_names``: the ensemble the head was trained for, in order (one weight column per model);
- ``config``: the head's constructor options (JSON-serializable), every one of them: a loader refuses a
  config that lacks one (:func:`check_config_keys`) instead of filling in the constructor's default, which
  need not be what the head was trained with;
- ``tensors``: named tensors (the learned parameters);
- ``label_space`` (optional): the label space the head was trained in, ``[{"id": 1, "name": "person"},
  ...]`` sorted by id, which :func:`detens.heads.check_head_label_space` compares by name with the label
  space the head is used in. Files without it (written before it was recorded, or by a head trained
  outside :func:`detens.heads.fit_head` and :func:`detens.heads.fit_calibration`) load as before; their ids
  alone are checked.

In ``.json`` files each tensor is ``{"dtype": "float32", "shape": [...], "data": [flat values]}``
(Python floats round-trip float32 and float64 exactly). In ``.safetensors`` files the tensors are stored
natively and the other fields go into the string metadata (``model_names``, ``config`` and
``label_space`` JSON-encoded).

``detens train`` writes beside the head its training log, ``<head file>.log.json``, which lists the
images it was fitted on under ``trained_on`` (:func:`read_trained_on`) and the digest of the head it
describes under ``head_sha256`` (:func:`head_digest`): a head file replaced later (copied over, or a run
killed while it moved its files into place) is not credited with the log of another.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from detens.checks import check_integer, check_integers, check_iou_thr, check_real
from detens.detections import MAX_LABEL
from detens.io import atomic_write_bytes, atomic_write_text, check_file_path, parse_json, read_json_file

__all__ = [
    "HeadFile",
    "HeadFileError",
    "FORMAT",
    "FORMAT_VERSION",
    "SUFFIXES",
    "check_config_keys",
    "check_label_space",
    "check_stored_class_ids",
    "find_head_file",
    "ground_truth_label_space",
    "head_digest",
    "head_label_space",
    "named_categories",
    "read_head_file",
    "read_head_file_at",
    "read_trained_on",
    "training_log_path",
    "TRAINED_ON",
    "TRAINING_LOG_SUFFIX",
    "write_head_file",
    "HEAD_DIGEST",
]

logger = logging.getLogger(__name__)

FORMAT = "detens-head"
FORMAT_VERSION = 1
#: the key of a head's training log that lists the images it was fitted on, by file name without folders
#: (as images are told apart across annotation files)
TRAINED_ON = "trained_on"
#: the key of a head's training log that holds the digest of the head it describes (:func:`head_digest`)
HEAD_DIGEST = "head_sha256"
#: the suffix of that log's name after the head file's name
TRAINING_LOG_SUFFIX = ".log.json"
SUFFIXES = (".json", ".safetensors")

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "int64": torch.int64,
}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
#: What a head file holds besides its tensors.
_FIELDS = ("format", "format_version", "type", "model_names", "config", "label_space")


class HeadFileError(ValueError):
    """A head file that is not a valid detens head (corrupt, truncated, wrong format or content)."""


@dataclass
class HeadFile:
    """The parsed content of a saved head, before the head type interprets it."""

    type: str
    model_names: list[str]
    config: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, Tensor] = field(default_factory=dict)
    label_space: dict[int, str] | None = None


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(
            f"head file {str(path)!r} must end in one of {', '.join(SUFFIXES)}, got {suffix or 'no suffix'!r}"
        )
    return suffix


def check_number(value: Any, name: str, minimum: float = 0.0, strict: bool = False) -> float:
    """``value`` as a float if it is a finite number (not a bool) ``>= minimum`` (``> minimum`` if strict)."""
    return check_real(value, name, minimum, low_open=strict)


def check_int(value: Any, name: str, minimum: int = 0) -> int:
    """``value`` as an int if it is an integer (Python or NumPy, not a bool) ``>= minimum``."""
    return check_integer(value, name, minimum)


def check_match_iou(value: Any) -> float:
    """``value`` as a float if it is a number in [0, 1): the matching IoU a head was trained with."""
    return check_iou_thr(value, "match_iou")


def check_class_ids(class_ids: Sequence[int] | Tensor | None) -> list[int]:
    """``class_ids`` (None: none) as a list of ints, in the given order; each a valid label (0 .. MAX_LABEL)."""
    return [] if class_ids is None else check_integers(class_ids, "class_ids", 0, MAX_LABEL)


def check_model_names(model_names: Any, what: str = "model_names") -> list[str]:
    """A fresh list of unique, non-empty model names; anything else is a clear error."""
    if isinstance(model_names, str) or not isinstance(model_names, (list, tuple)):
        raise TypeError(
            f"{what} must be a list of model names, got {type(model_names).__name__}: {model_names!r}"
        )
    names = list(model_names)
    if not names:
        raise ValueError(f"{what} is empty: a head needs at least one model")
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise TypeError(f"{what}[{i}] must be a non-empty string, got {name!r}")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{what} must be unique, got duplicates {duplicates} in {names}")
    return names


def check_label_space(label_space: Any, what: str = "label_space") -> dict[int, str]:
    """``{category id: name}`` sorted by id, from a mapping or a COCO-style ``[{"id", "name"}, ...]`` list;
    each id a valid label (0 .. MAX_LABEL, once), each name a non-empty string, kept as given.

    Raises:
        TypeError, ValueError: naming ``what`` and the offending entry.
    """
    if isinstance(label_space, Mapping):
        pairs = list(label_space.items())
    elif isinstance(label_space, list):
        pairs = []
        for i, entry in enumerate(label_space):
            if not isinstance(entry, Mapping) or set(entry) != {"id", "name"}:
                raise TypeError(f"{what}[{i}] must be an object with keys id and name, got {entry!r}")
            pairs.append((entry["id"], entry["name"]))
    else:
        raise TypeError(f"{what} must map category ids to names, got {type(label_space).__name__}")
    out: dict[int, str] = {}
    for key, name in pairs:
        cat = check_integer(key, f"{what} category id", 0, MAX_LABEL)
        if cat in out:
            raise ValueError(f"{what} gives category id {cat} twice")
        if not isinstance(name, str) or not name.strip():
            raise TypeError(f"{what}: the name of category id {cat} must be a non-empty string, got {name!r}")
        out[cat] = name
    return dict(sorted(out.items()))


def named_categories(categories: Mapping[int, str]) -> dict[int, str]:
    """The categories of ``categories`` that have a name: a ground truth's ``category_names`` gives the id
    itself (``"5"``) for a category without one, which names nothing to compare."""
    return {
        int(cat): name for cat, name in categories.items()
        if isinstance(name, str) and name.strip() and name.strip() != str(cat)
    }


def ground_truth_label_space(gt: Any) -> dict[int, str] | None:
    """The label space a head fitted on the ground truth ``gt`` records: its named categories
    (:func:`named_categories`), None when it names none."""
    categories = getattr(gt, "category_names", None)
    return (named_categories(categories) or None) if categories is not None else None


def head_label_space(head: Any) -> dict[int, str] | None:
    """The label space ``head`` (or a head inside it) records, ``{category id: name}``; None when none does."""
    modules = head.modules() if isinstance(head, torch.nn.Module) else (head,)
    for module in modules:
        label_space = getattr(module, "label_space", None)
        if label_space is not None:
            return label_space
    return None


def write_head_file(
    path: str | Path,
    head_type: str,
    model_names: list[str],
    config: dict[str, Any],
    tensors: dict[str, Tensor],
    label_space: Mapping[int, str] | None = None,
) -> None:
    """Write a head atomically as ``.json`` or ``.safetensors`` (chosen by the suffix); ``label_space``
    (``{category id: name}``, None: not written) is the one the head was trained in."""
    path = check_file_path(path)
    suffix = _suffix(path)
    categories = None
    if label_space is not None:
        categories = [{"id": c, "name": n} for c, n in check_label_space(label_space).items()]
    cpu = {}
    for name, tensor in tensors.items():
        if tensor.dtype not in _DTYPE_NAMES:
            raise TypeError(f"tensor {name!r} has dtype {tensor.dtype}; head files hold {', '.join(_DTYPES)}")
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise ValueError(
                f"tensor {name!r} holds NaN or inf; refusing to save a broken head to {str(path)!r}"
            )
        cpu[name] = tensor.detach().to("cpu").contiguous()
    if suffix == ".json":
        document = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "type": head_type,
            "model_names": list(model_names),
            "config": config,
            **({"label_space": categories} if categories is not None else {}),
            "tensors": {
                name: {"dtype": _DTYPE_NAMES[t.dtype], "shape": list(t.shape), "data": t.reshape(-1).tolist()}
                for name, t in cpu.items()
            },
        }
        atomic_write_text(path, json.dumps(document, indent=1, allow_nan=False) + "\n")
    else:
        from safetensors.torch import save

        metadata = {
            "format": FORMAT,
            "format_version": str(FORMAT_VERSION),
            "type": head_type,
            "model_names": json.dumps(list(model_names)),
            "config": json.dumps(config, allow_nan=False),
        }
        if categories is not None:
            metadata["label_space"] = json.dumps(categories)
        atomic_write_bytes(path, _sorted_safetensors_header(save(cpu, metadata=metadata)))


def _sorted_safetensors_header(blob: bytes) -> bytes:
    """``blob``, a safetensors file, with the keys of its JSON header sorted. safetensors writes the metadata
    from a hash map, whose order changes from one save to the next: the same head would be saved as
    other bytes by each run. The tensors' bytes are left as they are; their offsets are from the end of
    the header, which is padded with spaces to a multiple of 8 bytes as safetensors pads it."""
    size = int.from_bytes(blob[:8], "little")
    header = json.dumps(json.loads(blob[8 : 8 + size]), sort_keys=True, separators=(",", ":")).encode("utf-8")
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + blob[8 + size :]


def _bad(path: Path, why: str) -> HeadFileError:
    return HeadFileError(f"{str(path)!r} is not a valid detens head file: {why}")


#: The largest safetensors header that safetensors reads (it refuses a larger one).
_MAX_SAFETENSORS_HEADER = 100_000_000
#: Bytes per value of the safetensors dtypes a head file may hold (others are refused after reading).
_SAFETENSORS_ITEM_SIZES = {"F32": 4, "F64": 8, "I64": 8}


def _check_safetensors_header(path: Path) -> None:
    """Raise :class:`HeadFileError` naming the file and the entry where the header of the safetensors file
    ``path`` gives a key twice (safetensors keeps one of them without a word: one of two tensors of a name,
    one of two values of a metadata field) or a tensor whose shape and dtype need other bytes than its
    offsets give, or bytes beyond the file. The rest is left to safetensors, which reads the header again."""
    size = path.stat().st_size
    with path.open("rb") as file:
        length = int.from_bytes(file.read(8), "little")
        if size < 8 or not 0 < length <= min(size - 8, _MAX_SAFETENSORS_HEADER):
            raise _bad(
                path, f"a safetensors file begins with the length of its header (8 bytes), a header within the "
                f"file and at most {_MAX_SAFETENSORS_HEADER} bytes; this one of {size} bytes gives "
                f"{length if size >= 8 else 'no length'} (truncated, or not safetensors)"
            )
        text = file.read(length)
    try:
        header = parse_json(text, "the safetensors header of", path)
    except ValueError as err:
        raise _bad(path, f"cannot read safetensors ({err})") from None
    if not isinstance(header, dict):
        raise _bad(path, f"the safetensors header must be a JSON object, got {type(header).__name__}")
    stored = size - 8 - length
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        shape, offsets, dtype = entry.get("shape"), entry.get("data_offsets"), entry.get("dtype")
        if (
            isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)
            and isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int for n in offsets)
            and dtype in _SAFETENSORS_ITEM_SIZES
        ):
            needed = math.prod(shape) * _SAFETENSORS_ITEM_SIZES[dtype]
            begin, end = offsets
            if not 0 <= begin <= end <= stored or end - begin != needed:
                raise _bad(
                    path, f"tensor {name!r} ({dtype}, shape {shape}) needs {needed} bytes, but its data_offsets "
                    f"{offsets} give {end - begin} of the {stored} bytes of data the file holds"
                )


def _tensor_from_json(path: Path, name: str, entry: Any) -> Tensor:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data"}:
        raise _bad(path, f"tensor {name!r} must be an object with keys dtype, shape, data")
    dtype = _DTYPES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
    if dtype is None:
        raise _bad(
            path, f"tensor {name!r} has dtype {entry['dtype']!r}; expected one of {', '.join(_DTYPES)}"
        )
    shape, data = entry["shape"], entry["data"]
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
        raise _bad(path, f"tensor {name!r} has an invalid shape {shape!r}; expected a list of integers >= 0")
    if not isinstance(data, list) or len(data) != math.prod(shape):
        raise _bad(path, f"tensor {name!r} of shape {shape} needs {math.prod(shape)} values")
    kinds = (int,) if dtype == torch.int64 else (int, float)  # a float in an int64 tensor would be truncated
    if not all(type(v) in kinds for v in data):
        raise _bad(path, f"tensor {name!r} ({entry['dtype']}) holds values that are not {' or '.join(k.__name__ for k in kinds)}")
    try:
        return torch.tensor(data, dtype=dtype).reshape(shape)
    except (OverflowError, RuntimeError, ValueError) as err:  # an integer beyond int64
        raise _bad(path, f"tensor {name!r} holds a value out of the {entry['dtype']} range ({err})") from None


def find_head_file(path: str | Path) -> Path:
    """``path`` as an existing file, else the shipped head of that name (``coco_yolo3_deep``), as
    ``detens fuse --head`` takes it.

    Raises:
        FileNotFoundError: neither; the message names the path tried and lists the shipped heads.
    """
    from detens.packaged import find_packaged

    return find_packaged(path, "heads")


def beside_head(head_path: str | Path, suffix: str) -> Path:
    """The file ``<head file name><suffix>`` beside the head file ``head_path`` (``head.json.log.json``)."""
    head_path = Path(head_path)
    return head_path.with_name(head_path.name + suffix)


def training_log_path(head_path: str | Path) -> Path:
    """The training log that ``detens train`` writes beside the head file ``head_path``."""
    return beside_head(head_path, TRAINING_LOG_SUFFIX)


def head_digest(head: HeadFile) -> str:
    """The sha256 (hex) of a head's content as read from its file (:func:`read_head_file`): its type, models,
    config, label space and tensors. The same for the head saved as ``.json`` or ``.safetensors`` and
    whatever the line endings of its file (a checkout may change them), unlike a digest of the bytes."""
    fields = {
        "type": head.type,
        "model_names": head.model_names,
        "config": head.config,
        "label_space": None if head.label_space is None else [[c, n] for c, n in sorted(head.label_space.items())],
    }
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, allow_nan=False).encode("utf-8"))
    for name in sorted(head.tensors):
        tensor = head.tensors[name].detach().to("cpu").contiguous()
        digest.update(f"\0{name}\0{_DTYPE_NAMES[tensor.dtype]}\0{list(tensor.shape)}\0".encode())
        values = tensor.numpy()
        digest.update(values.astype(values.dtype.newbyteorder("<"), copy=False).tobytes())
    return digest.hexdigest()


def read_trained_on(head_path: str | Path) -> list[str] | None:
    """The images the head file ``head_path`` was fitted on, by file name without folders, as its training
    log lists them; None where there is no log beside it, or one that does not list them (a head trained
    by an earlier version, or fitted in Python and saved), or a log written for another head: its
    ``head_sha256`` is not the head's digest (:func:`head_digest`; the head file was replaced after the
    log was written), which is warned of.

    Raises:
        HeadFileError: a log that cannot be read, whose list is not a list of file names or whose digest
            is not a string; a head file that cannot be read.
    """
    log = training_log_path(head_path)
    if not log.is_file():
        return None
    try:
        record = read_json_file(log, "training log")
    except (OSError, ValueError) as err:
        raise HeadFileError(f"{str(log)!r}: the head's training log cannot be read: {err}") from None
    names = record.get(TRAINED_ON) if isinstance(record, dict) else None
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise HeadFileError(f"{str(log)!r}: {TRAINED_ON} must be a list of image file names")
    described = record.get(HEAD_DIGEST)
    if described is None:  # a log of an earlier version: trusted, as before
        return names
    if not isinstance(described, str):
        raise HeadFileError(f"{str(log)!r}: {HEAD_DIGEST} must be the head's digest as a string, got {described!r}")
    if described != head_digest(read_head_file(head_path)):
        logger.warning(
            "%r was written for another head than %r (its %s differs: the head file was replaced after "
            "it): the images this head was fitted on are not known, so scoring them is not warned of",
            str(log), str(head_path), HEAD_DIGEST,
        )
        return None
    return names


def read_head_file(path: str | Path) -> HeadFile:
    """Read a ``.json`` or ``.safetensors`` head file, or a shipped head by name (:func:`find_head_file`);
    corrupt or foreign files raise :class:`HeadFileError`, a missing one ``FileNotFoundError``."""
    return read_head_file_at(find_head_file(path))  # a missing file is named as such, whatever its suffix


def read_head_file_at(path: Path) -> HeadFile:
    """:func:`read_head_file` of the file at ``path`` as it is written: never looked up as a shipped head's
    name, nor a leading ``~`` read as the home folder. A file that a run wrote at a path of its own (a staged
    copy, in a folder that may be named ``~``) is read there and nowhere else."""
    suffix = _suffix(path)
    if suffix == ".json":
        try:
            document = parse_json(path.read_bytes(), "head file", path)
        except ValueError as err:
            raise _bad(path, f"cannot parse JSON ({err})") from None
        if not isinstance(document, dict):
            raise _bad(path, "the top level must be a JSON object")
        unknown = sorted(set(document) - {*_FIELDS, "tensors"})
        if unknown:
            raise _bad(path, f"unknown fields {unknown}; a head file holds {', '.join((*_FIELDS, 'tensors'))}")
        fields = document
        raw_tensors = document.get("tensors")
        if not isinstance(raw_tensors, dict):
            raise _bad(path, "missing the 'tensors' object")
        tensors = {name: _tensor_from_json(path, name, entry) for name, entry in raw_tensors.items()}
        model_names, config = fields.get("model_names"), fields.get("config")
        label_space = fields.get("label_space")
    else:
        from safetensors import SafetensorError, safe_open

        _check_safetensors_header(path)
        try:
            with safe_open(str(path), framework="pt") as f:
                fields = dict(f.metadata() or {})
                tensors = {name: f.get_tensor(name) for name in f.keys()}
        except (SafetensorError, OSError, ValueError, RuntimeError) as err:
            raise _bad(path, f"cannot read safetensors ({err})") from err
        unknown = sorted(set(fields) - set(_FIELDS))
        if unknown:
            raise _bad(path, f"unknown metadata fields {unknown}; a head file holds {', '.join(_FIELDS)}")
        try:
            model_names = parse_json(fields.get("model_names", "null"), "the metadata's model_names in", path)
            config = parse_json(fields.get("config", "null"), "the metadata's config in", path)
            label_space = (parse_json(fields["label_space"], "the metadata's label_space in", path)
                           if "label_space" in fields else None)
        except ValueError as err:
            raise _bad(path, f"metadata is not valid JSON ({err})") from None
        if fields.get("format_version") == str(FORMAT_VERSION):
            fields["format_version"] = FORMAT_VERSION

    if fields.get("format") != FORMAT:
        raise _bad(path, f"'format' is {fields.get('format')!r}, expected {FORMAT!r}")
    if type(fields.get("format_version")) is not int or fields["format_version"] != FORMAT_VERSION:
        raise _bad(
            path,
            f"format_version {fields.get('format_version')!r} is not supported (this detens reads {FORMAT_VERSION})",
        )
    head_type = fields.get("type")
    if not isinstance(head_type, str) or not head_type:
        raise _bad(path, f"'type' must name the head type, got {head_type!r}")
    try:
        model_names = check_model_names(model_names, "model_names")
    except (TypeError, ValueError) as err:
        raise _bad(path, str(err)) from err
    if config is None:
        raise _bad(path, "missing the 'config' object (the settings the head was trained with)")
    if not isinstance(config, dict):
        raise _bad(path, f"'config' must be an object, got {type(config).__name__}")
    if label_space is not None:
        try:
            label_space = check_label_space(label_space)
        except (TypeError, ValueError) as err:
            raise _bad(path, str(err)) from None
    for name, tensor in tensors.items():
        if tensor.dtype not in _DTYPE_NAMES:
            raise _bad(path, f"tensor {name!r} has dtype {tensor.dtype}; head files hold {', '.join(_DTYPES)}")
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise _bad(path, f"tensor {name!r} holds NaN or inf")
    return HeadFile(head_type, model_names, config, tensors, label_space)


def check_config_keys(config: Mapping[str, Any], keys: Sequence[str], where: str, what: str) -> None:
    """Raise unless a stored ``config`` holds exactly ``keys``: none unknown, none missing.

    Every head type's loader calls this before building anything from the config. A missing key is not
    filled in with the constructor's default: that default need not be the value the head was trained
    with (a Θ head fitted with ``normalize_box=True`` fuses to other boxes without it), and nothing in
    the file would show the difference.

    Args:
        config (Mapping[str, Any]): the config as read from the file.
        keys (Sequence[str]): every key a file of this head type holds, in the order to list them.
        where (str): the file (and the part of it) in error messages.
        what (str): the head type in error messages (``"theta"``).

    Raises:
        HeadFileError: naming the file, the unknown or missing keys, and the keys a config holds.
    """
    unknown = sorted(set(config) - set(keys))
    if unknown:
        raise HeadFileError(
            f"{where}: unknown config keys {unknown}; a {what} head's config holds the keys {', '.join(keys)}"
        )
    missing = [key for key in keys if key not in config]
    if missing:
        raise HeadFileError(
            f"{where}: the config lacks the keys {missing}; a {what} head's config holds every one of "
            f"{', '.join(keys)}, each with the value the head was trained with (add the missing ones from the "
            "training run's config: the constructor's defaults need not be what training used)"
        )


def check_stored_class_ids(class_ids: Any, where: str) -> None:
    """Raise unless a stored config's ``class_ids`` (None or a list) are in increasing order, without repeats.

    A head's per-class rows (Θ rows, embedding rows) follow its sorted class ids, and ``save`` writes the
    ids sorted. The constructor sorts whatever it is given, so ids out of order in a file would silently
    put each stored row on another class: refused instead. Values that are not ids are left to the
    constructor's checks.

    Raises:
        HeadFileError: naming the file and the ids.
    """
    if not isinstance(class_ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in class_ids):
        return
    if any(a >= b for a, b in itertools.pairwise(class_ids)):
        raise HeadFileError(
            f"{where}: config class_ids {class_ids} must be in increasing order without repeats (as head.save "
            "writes them): the per-class rows of the tensors follow that order"
        )


def check_sizes(config: dict[str, Any], tensors: dict[str, Tensor], keys: Sequence[str], where: str) -> None:
    """Raise unless each size option in ``config`` (``hidden``, ``depth``, ...) is at most the number of
    values the file stores.

    A layer of width H holds at least H numbers, so a larger size cannot match the stored tensors: refusing
    it here keeps a head file from making the loader build (and allocate) a network of that size.
    """
    stored = sum(t.numel() for t in tensors.values())
    for key in keys:
        value = config.get(key)
        if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value > max(stored, 1):
            raise HeadFileError(
                f"{where}: config {key} = {value} is larger than the {stored} numbers the file stores"
            )


def check_head_clusters(clusters: Any, model_names: list[str], what: str) -> None:
    """Raise unless ``clusters`` is a Clusters of as many models as the head (``what`` names the head)."""
    from detens.matching import Clusters

    if not isinstance(clusters, Clusters):
        raise TypeError(f"expected Clusters, got {type(clusters).__name__}")
    if clusters.num_models != len(model_names):
        raise ValueError(
            f"the clusters hold {clusters.num_models} models but {what} was built for "
            f"{len(model_names)}: {model_names}"
        )


def clusters_in_member_order(clusters: Any, model_names: list[str], what: str, reorder: bool = True) -> Any:
    """``clusters`` checked (:func:`check_head_clusters`) and with their models in the order of
    ``model_names``, placed by ``clusters.sources`` (:func:`member_order`; unknown sources: as given).

    Args:
        what (str): the head, in error messages (``"deep head"``).
        reorder (bool): False for the low-level paths that take the clusters as they are (features that
            another call fuses): clusters in another order are then a ``ValueError`` instead.
    """
    check_head_clusters(clusters, model_names, f"this {what}")
    if clusters.sources is None:
        return clusters
    order = member_order(clusters.sources, model_names, what)
    if order == list(range(len(model_names))):
        return clusters
    if not reorder:
        raise ValueError(
            f"the clusters' models are {list(clusters.sources)} but this {what} is for {list(model_names)} in that order; "
            "call the head on the clusters (it reorders them), or match the Detections in the head's order"
        )
    return clusters.select_models([order.index(i) for i in range(len(model_names))])


def read_head_for(path: str | Path, type_name: str, model_names: Sequence[str] | None) -> Any:
    """:func:`read_head_file`, checked to hold a ``type_name`` head for ``model_names`` (when given).

    The same models in another order are accepted: the head keeps its own order, and fusion puts each
    Detections in it by its ``source`` name (:func:`member_order`).

    Raises:
        HeadFileError: another head type. ValueError: other models; the message names both lists.
    """
    stored = read_head_file(path)
    where = repr(str(path))
    if stored.type != type_name:
        raise HeadFileError(f"{where} holds a {stored.type!r} head, not {type_name!r}; load it with detens.load_head")
    if model_names is not None:
        names = check_model_names(model_names)
        if sorted(names) != sorted(stored.model_names):
            renamed = (
                "; if they are those detectors under other names, name them as the head does (an ensemble "
                "YAML's `name`, a detector's name=..., fuse_results' model_names=[...], a Detections' source)"
                if len(names) == len(stored.model_names)
                else ""
            )
            raise ValueError(
                f"head {where} was trained for models {stored.model_names}, not for the models {names} it was "
                f"given to fuse (its weights belong to its models; fit a head on these models' predictions{renamed})"
            )
    return stored


def member_order(sources: Sequence[Any], model_names: Sequence[str], what: str = "head") -> list[int]:
    """The model index (in ``model_names``) of each Detections, from their ``source`` names.

    By name when every source is one of ``model_names`` (any order); else by position when there are as
    many Detections as models, none of their sources names another model or another position's model
    (a missing source, None or empty, says nothing). Anything else raises ``ValueError`` naming both
    lists: applying one model's weights to another's boxes would be a silent wrong result. So does a model
    named twice.
    """
    sources = list(sources)
    names = list(model_names)
    if all(s in names for s in sources):
        repeated = sorted({s for s in sources if sources.count(s) > 1})
        if repeated:  # one model's boxes twice, another's never: always a mistake
            raise ValueError(f"two Detections name the same model {repeated}: sources {sources}")
        return [names.index(s) for s in sources]
    positional = len(sources) == len(names) and all(not s or s == names[i] for i, s in enumerate(sources))
    if not positional:
        raise ValueError(
            f"cannot tell which model made each Detections: their sources are {sources} but this {what} is for "
            f"models {names}; give each Detections its model's name as source (det.with_source(name)), or pass "
            "one per model in the head's order"
        )
    return list(range(len(names)))


def in_member_order(per_model: Sequence[Any], model_names: Sequence[str], what: str = "head") -> list[Any]:
    """The Detections put into the order of ``model_names`` (each placed by :func:`member_order`).

    Raises:
        ValueError: the sources cannot be placed, two name the same model, or the counts differ.
    """
    per_model = list(per_model)
    if len(per_model) != len(model_names):
        raise ValueError(
            f"this {what} is for {len(model_names)} models {list(model_names)} but {len(per_model)} Detections "
            "were given; pass one per model"
        )
    order = member_order([d.source for d in per_model], model_names, what)
    by_model = dict(zip(order, per_model, strict=True))
    return [by_model[i] for i in range(len(model_names))]
