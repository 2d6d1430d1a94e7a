"""Checks of scalar options (thresholds, counts, flags, choices), shared by every fuser and head.

A wrong type is a ``TypeError``, a value outside the allowed range a ``ValueError``; both name the option,
what it must be and what it got. Strings are never parsed into numbers and bools are not numbers: an
option written ``"0.5"`` or ``True`` in a config is a mistake worth reporting, not a value to guess.

:func:`first_few` is how every message lists the first few of many items (ids, images, keys), and
:func:`did_you_mean` how one suggests the valid name closest to a misspelt one.
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "check_real", "check_reals", "check_integer", "check_integers", "check_seed", "check_distinct_integers", "check_flag", "check_choice", "check_choices", "check_device",
    "check_whole", "check_max_det", "check_iou_thr", "first_few", "did_you_mean", "real_as_float", "torch_ready_array",
]


def _scalar(value: Any) -> Any:
    """A 0-d tensor or array as its Python number; anything else unchanged."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    return value


def _interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    if math.isinf(low) and math.isinf(high):
        return "a finite number"
    if math.isinf(high):
        if low == 0:
            return "a positive number" if low_open else "a number >= 0"
        return f"{'>' if low_open else '>='} {low:g}"
    if math.isinf(low):
        return f"{'<' if high_open else '<='} {high:g}"
    return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def real_as_float(value: numbers.Real) -> float:
    """``value`` as a float, an integer beyond the float range (``10**400``, which YAML and JSON read as
    Python ints) as the infinity of its sign: ``float`` raises OverflowError for it, naming no option, where
    a check of finite numbers refuses an infinity with its own message."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def check_real(
    value: Any,
    name: str,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a finite float in the interval from ``low`` to ``high`` (ends open when told).

    Python and NumPy reals and 0-d tensors are numbers; bools, strings, None and complex are not.
    """
    scalar = _scalar(value)
    if isinstance(scalar, bool) or not isinstance(scalar, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}: {value!r}")
    number = real_as_float(scalar)
    below = number <= low if low_open else number < low
    above = number >= high if high_open else number > high
    if not math.isfinite(number) or below or above:
        raise ValueError(f"{name} must be {_interval(low, high, low_open, high_open)}, got {value!r}")
    return number


def check_reals(
    values: Any,
    name: str,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> list[float]:
    """``values`` (a list, tuple or 1-D array of numbers, each as :func:`check_real` takes it) as a list of floats.

    A single number or a string is refused, not iterated or parsed: ``0.6`` where a list such as
    ``[0.6]`` is expected is a mistake worth naming.
    """
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a list of numbers, got {type(values).__name__}: {values!r}")
    if getattr(values, "ndim", 1) != 1:
        raise ValueError(f"{name} must be a flat list of numbers, got shape {list(values.shape)}")
    return [
        check_real(v, f"{name}[{i}]", low, high, low_open=low_open, high_open=high_open) for i, v in enumerate(values)
    ]


def check_integer(value: Any, name: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int in ``[low, high]`` (None: unbounded); Python or NumPy integers, not bools or floats."""
    scalar = _scalar(value)
    if isinstance(scalar, bool) or not isinstance(scalar, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}: {value!r}")
    return _in_range(int(scalar), value, name, low, high)


def check_whole(value: Any, name: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int in ``[low, high]``, given as an integer or as an integer-valued float (``3.0``: ids
    read from a float array, as ``Detections`` takes its labels).

    Any other float is a ``ValueError`` naming it, never truncated: ``1.5`` is not the id 1. Bools, strings
    and None are a ``TypeError``, as in :func:`check_integer`.
    """
    scalar = _scalar(value)
    if isinstance(scalar, bool) or not isinstance(scalar, numbers.Real):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}: {value!r}")
    if isinstance(scalar, numbers.Integral):
        return _in_range(int(scalar), scalar, name, low, high)
    number = float(scalar)
    if not number.is_integer():  # nan and inf too
        raise ValueError(f"{name} must be a whole number, got {scalar!r}")
    return _in_range(int(number), scalar, name, low, high)


def _in_range(number: int, value: Any, name: str, low: int | None, high: int | None) -> int:
    """``number`` (``value`` as an int) if it lies in ``[low, high]``, else a ValueError naming ``value``."""
    if (low is not None and number < low) or (high is not None and number > high):
        if high is None:
            bound = f">= {low}"
        elif low is None:
            bound = f"<= {high}"
        else:
            bound = f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")
    return number


def check_max_det(value: Any, name: str = "max_det") -> int | None:
    """A cap on the boxes of an image: None (no cap), or an integer >= 1."""
    return None if value is None else check_integer(value, name, 1)


def check_iou_thr(value: Any, name: str = "iou_thr") -> float:
    """``value`` as an IoU threshold in ``[0, 1)``: boxes overlapping by more than it are taken as one
    object (matched, fused, suppressed, decayed, voting).

    1 is refused: no IoU exceeds it, not even that of two identical boxes, so a fuser given it would
    return the models' boxes as they are, which no one asking for fusion means.
    """
    return check_real(value, name, 0.0, 1.0, high_open=True)


def check_seed(value: Any, name: str = "seed") -> int:
    """``value`` as a seed in ``[0, 2**63 - 1]``. A negative seed is refused: ``random.Random`` reads -s as
    s and ``torch.manual_seed`` reads it as 2**64 - s, so the two generators of one fit would disagree on
    which run it names."""
    return check_integer(value, name, 0, 2**63 - 1)


def check_integers(values: Any, name: str, low: int | None = None, high: int | None = None) -> list[int]:
    """``values`` (a list, tuple, set, array or 1-D tensor of integers in ``[low, high]``, e.g. image ids) as
    a list of ints.

    A string is refused, not iterated: ``"139"`` is not the ids 1, 3 and 9.
    """
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a list of integers, got {type(values).__name__}: {values!r}")
    if getattr(values, "ndim", 1) != 1:
        raise ValueError(f"{name} must be a flat list of integers, got shape {list(values.shape)}")
    return [check_integer(v, f"{name}[{i}]", low, high) for i, v in enumerate(values)]


def check_distinct_integers(values: Any, name: str) -> list[int]:
    """:func:`check_integers`, each value once (image ids to fit on: a repeated one would weigh twice).

    Raises:
        ValueError: naming the repeated values (up to 10).
    """
    ids = check_integers(values, name)
    duplicates = sorted(i for i, count in Counter(ids).items() if count > 1)
    if duplicates:
        raise ValueError(f"{name} must be distinct, got duplicates {duplicates[:10]}")
    return ids


def check_flag(value: Any, name: str) -> bool:
    """``value`` if it is a bool (Python or NumPy); 0, 1, "yes" and None are not."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__}: {value!r}")
    return bool(value)


def check_name_list(value: Any, name: str = "model_names") -> list[str] | None:
    """``value`` (an iterable of names, or None) as a list; a string is refused, not split into one name per
    character, and so is a name that is no string or an empty one (a member is found by its name)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a list with one name per model, got {type(value).__name__}: {value!r}")
    names = list(value)
    for i, item in enumerate(names):
        if not isinstance(item, str):
            raise TypeError(f"{name}[{i}] must be a model's name, a string, got {type(item).__name__}: {item!r}")
        if not item:
            raise ValueError(f"{name}[{i}] is empty: a model's name must be a non-empty string")
    return names


def check_choice(value: Any, name: str, choices: Collection[str]) -> str:
    """``value`` if it is one of the string ``choices``; the error lists them (a TypeError for a value that
    is no string at all)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {', '.join(choices)}, got {type(value).__name__} {value!r}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def check_choices(values: Any, name: str, choices: Collection[str]) -> list[str]:
    """``values`` (a list or tuple of strings, each one of ``choices`` as :func:`check_choice` takes it) as a
    list. A single string is refused, not iterated: ``"avg"`` is not the choices ``a``, ``v`` and ``g``."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a list of names among {', '.join(choices)}, got {type(values).__name__}: "
                        f"{values!r}")
    return [check_choice(v, f"{name}[{i}]", choices) for i, v in enumerate(values)]


def check_device(value: Any, name: str = "device") -> str:
    """``value`` (a string such as ``"cpu"``, ``"cuda"`` or ``"cuda:1"``, or a ``torch.device``) as the string
    of a torch device this machine has.

    Checked when a config is made, so a typo or a GPU this machine lacks is reported before any data is
    read, not as a torch error halfway through a run.
    """
    import torch

    if not isinstance(value, (str, torch.device)):
        raise TypeError(f"{name} must be a device string such as cpu or cuda, got {type(value).__name__}: {value!r}")
    try:
        device = torch.device(value)
    except RuntimeError:
        raise ValueError(f"{name} must be a torch device: cpu, cuda or cuda:<index>, got {value!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name} is {value!r} but no CUDA device is available on this machine; use cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"{name} is {value!r} but this machine has {torch.cuda.device_count()} CUDA device(s) "
                f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})"
            )
    elif device.type != "cpu":
        # torch parses more device types than a machine has (mps off a Mac; meta, which holds no data)
        available = {
            "mps": lambda: torch.backends.mps.is_available(),
            "xpu": lambda: hasattr(torch, "xpu") and torch.xpu.is_available(),
        }.get(device.type)
        if available is None or not available():
            raise ValueError(f"{name} is {value!r} but this machine has no {device.type} device; use cpu or cuda")
    return value if isinstance(value, str) else str(device)


def torch_ready_array(array: np.ndarray) -> np.ndarray:
    """``array`` as ``torch.as_tensor`` takes it: itself when it can, else a copy holding the same values.

    Two layouts of valid NumPy arrays are refused by ``torch.as_tensor`` and ``torch.from_numpy``: another
    byte order (``dtype('>f4')``, as some file formats store numbers) and negative strides (``a[::-1]``,
    ``np.flip``, ``np.argsort(s)[::-1]``). A read-only array (``np.frombuffer``, as inference servers'
    clients return outputs; a read-only memory map; ``np.broadcast_to``) is copied too: torch would wrap it
    in a writable tensor and warn that writing into it is undefined.
    """
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if any(stride < 0 for stride in array.strides) or not array.flags.writeable:
        return array.copy()  # C order: positive strides, writable
    return array


def first_few(
    items: Sequence[Any],
    limit: int = 10,
    sep: str = ", ",
    *,
    show: Callable[[Any], str] = str,
    total: int | None = None,
    noun: str = "",
) -> str:
    """The first ``limit`` of ``items`` for a message, each as ``show`` writes it, joined by ``sep``; when
    there are more, ``... (N in all)`` after one more ``sep``: ``"1, 2, 3, ... (12 in all)"``.

    Args:
        total: the count to give (default: ``len(items)``), when the items stand for more things (runs of
            ids such as ``1-11``).
        noun: what is counted, as in ``(300 ids in all)``.
    """
    shown = sep.join(show(item) for item in items[:limit])
    if len(items) <= limit:
        return shown
    count = len(items) if total is None else total
    return f"{shown}{sep}... ({count} {f'{noun} ' if noun else ''}in all)"


def did_you_mean(name: str, valid: Iterable[str], key: Callable[[str], str] | None = None) -> str:
    """`` Did you mean 'x'?`` with ``x`` the one of ``valid`` closest to ``name`` (difflib's
    ``get_close_matches``), to end a message that lists the valid names; ``""`` when none is close.
    ``key`` compares the names as it spells them (``str.lower``), while ``x`` is shown as ``valid`` gives it."""
    import difflib

    valid = list(valid)
    spell = key or (lambda text: text)
    spelled = {spell(v): v for v in reversed(valid)}  # the first of the names spelled alike is shown
    close = difflib.get_close_matches(spell(name), list(spelled), n=1)
    return f" Did you mean {spelled[close[0]]!r}?" if close else ""
