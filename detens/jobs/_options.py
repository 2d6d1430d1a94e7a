"""What a job takes: its options as one dataclass, each field checked and converted as it is set, so a job
started from Python (``detens.cache(...)``) gets the values the command line gives it (``detens cache ...``).

A job's options are a keyword-only dataclass deriving from :class:`JobOptions`, each field made by one of
the kinds below; the command's flags are the fields' names (``max_det`` is ``--max-det``). A value of the
wrong type is a TypeError naming the option, a bad value a ValueError: a string is never read as a number,
nor a number or a string as a bool (``overwrite="no"`` would otherwise discard finished work). Every path
option, to read or to write, takes a leading ``~`` as the home folder (:func:`detens.io.home_expanded`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from detens.checks import check_flag, real_as_float
from detens.io import check_file_path, home_expanded, path_as_written

__all__ = [
    "JobOptions", "UsageError", "check_existing_folder", "check_file_or_folder", "check_folder", "check_given_folder",
    "check_int", "check_output_file", "check_positive_int", "check_text_list", "check_text_pair",
    "command_line_flag", "existing_folder", "file_or_folder", "file_or_shipped_name", "flag", "folder",
    "input_path", "integer", "internal", "listed", "not_a_folder", "number", "output_file", "parse_set", "path",
    "python_keyword", "text",
]


class UsageError(ValueError):
    """A mistake in how a job was called, found after its options were read (the command reports it like a
    bad flag, naming the command and its ``--help``)."""


# --------------------------------------------------------------------------------------- the checks of values
def check_folder(value: str) -> str:
    """The path of a folder, which may not exist yet, kept as written but for a leading ``~``
    (:func:`detens.io.home_expanded`): a ``Path`` would drop the ``./`` of ``./~/runs``, which read again would
    be the home folder's ``runs``. An empty one is refused rather than read as the working directory
    (``Path("")`` is ``.``): it is most often an unset shell variable (``--out "$OUT"``), and the job would
    write its outputs among the user's own files. So is a path that is a file, before anything is done
    (creating the folder would fail only then, as "File exists").

    Raises:
        ValueError: ``value`` is empty or a file.
    """
    if not value:
        raise ValueError("expected a folder, got an empty path (write . for the working directory)")
    value = home_expanded(value)
    if os.path.exists(value) and not os.path.isdir(value):
        raise ValueError(f"expected a folder, got {value!r}, which is a file")
    return value


def command_line_flag(name: str) -> str:
    """The option ``name`` as the command line writes it: ``--max-det`` for ``max_det``."""
    return f"--{name.replace('_', '-')}"


def python_keyword(name: str, is_flag: bool) -> str:
    """The option ``name`` as a Python call writes it: ``max_det``, or ``overwrite=True`` for a flag (an option
    that takes no value on the command line)."""
    return f"{name}=True" if is_flag else name


def check_output_file(value: str) -> str:
    """The path of a file to write, kept as written but for a leading ``~`` (:func:`detens.io.home_expanded`). A path
    ending in a separator names a folder: read as a ``Path`` it loses the separator, and the file would be
    written at the folder's name (``--out runs/x/`` writing the file ``runs/x``). An empty one is refused as
    :func:`check_folder` refuses it (``Path("")`` is the working directory).

    Raises:
        ValueError: ``value`` is empty or ends in a separator.
    """
    if not value:
        raise ValueError("expected a file path, got an empty path")
    value = home_expanded(value)
    check_file_path(value, None)
    return value


def check_file_or_folder(value: str) -> str:
    """The path of a file to write or of a folder to write it in, kept as written but for a leading ``~``
    (:func:`detens.io.home_expanded`): a trailing separator (:func:`detens.io.names_a_folder`) makes it a folder,
    created if need be. An empty one is refused as :func:`check_folder` refuses it.

    Raises:
        ValueError: ``value`` is empty.
    """
    if not value:
        raise ValueError("expected a file or a folder, got an empty path (write . for the working directory)")
    return home_expanded(value)


def check_existing_folder(value: str) -> str:
    """The path of a folder that exists, kept as written but for a leading ``~`` (:func:`detens.io.home_expanded`). An
    empty one is refused as :func:`check_folder` refuses it, not read as the working directory.

    Raises:
        ValueError: ``value`` is empty, or no folder is at it.
    """
    if not value:
        raise ValueError("expected a folder, got an empty path (write . for the working directory)")
    value = home_expanded(value)
    if not os.path.isdir(value):
        raise ValueError(not_a_folder(value, repr(value)))
    return value


def check_given_folder(flag: str, value: str | None) -> None:
    """Raise ``UsageError`` unless ``value`` of ``flag`` (None: the option left out) is a folder that exists
    (:func:`check_existing_folder`)."""
    if value is None:
        return
    try:
        check_existing_folder(value)
    except ValueError as err:
        raise UsageError(f"{flag}: {err}") from None


def not_a_folder(path: str | os.PathLike[str], shown: str | None = None) -> str:
    """Why ``path``, not a folder, cannot be read as one (no such folder, or a file), naming it as ``shown``
    (None: the path as given)."""
    shown = str(path) if shown is None else shown
    return f"{shown} is a file, not a folder" if os.path.exists(path) else f"no such folder: {shown}"


def check_int_text(value: str) -> int:
    """An integer from its text: digits with an optional minus sign. ``int`` also reads ``"6_40"`` as 640
    and ignores spaces around the digits, which on a command line are more likely a slip than a number.

    Raises:
        ValueError: ``value`` is no such text.
    """
    if not re.fullmatch(r"-?[0-9]+", value):
        raise ValueError(f"expected an integer, got {value!r}")
    return int(value)


def check_finite_number(value: str | float) -> float:
    """A finite real number, from its text or a number. ``float`` reads ``nan`` and ``inf`` as numbers,
    which a config's own check would then blame on the config file, or on a key the user never gave, and
    ``"0_5"`` as 5 (underscores and spaces around the number are refused here).

    Raises:
        ValueError: ``value`` is no number, or NaN or infinite.
    """
    number = value
    if isinstance(value, str):
        try:
            if "_" in value or value != value.strip():
                raise ValueError(value)
            number = float(value)
        except ValueError:
            raise ValueError(f"expected a number, got {value!r}") from None
    number = real_as_float(number)
    if not math.isfinite(number):
        raise ValueError(f"expected a finite number, got {value!r}")
    return number


def check_positive_int(value: str | int) -> int:
    """An integer >= 1, from its text or a number (an integral one: ``2.0`` is refused).

    Raises:
        ValueError: ``value`` is no integer or below 1.
    """
    if isinstance(value, str):
        try:
            value = check_int_text(value)
        except ValueError:
            raise ValueError(f"expected an integer >= 1, got {value!r}") from None
    if value < 1:
        raise ValueError(f"expected an integer >= 1, got {value}")
    return int(value)


def file_or_shipped_name(flag: str, value: str | None) -> str | None:
    """``value`` of ``flag``, a file or the name of a file shipped in the package (``--config``, ``--head``),
    as given (None: the option left out). An empty one is refused, as :func:`check_folder` refuses an empty
    folder: it is most often an unset shell variable, and looked up as a path it would be reported as the
    working directory, which is no file.

    Raises:
        UsageError: an empty ``value``.
    """
    if value == "":
        raise UsageError(f"{flag}: expected a file or a shipped name, got an empty path")
    return value


def check_text_list(key: str, value: Any) -> tuple[str, ...]:
    """``value`` of the repeatable option ``key`` as a tuple of strings (None, the option left out: none).

    Raises:
        TypeError: ``value`` is one string (its characters are no list of values) or no sequence of strings.
    """
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{key} must be a list of str, got {type(value).__name__}: {value!r}")
    return tuple(value)


def check_text_pair(
    key: str, value: Any, pair: str = "(annotation file, prediction folder)"
) -> tuple[str, str] | None:
    """``value`` of the option ``key`` that takes two paths, by default an annotation file and a
    prediction folder (``GT PREDICTIONS``; ``pair`` names them in the error), as a pair of strings, a leading
    ``~`` of each expanded (:func:`detens.io.home_expanded`; None: the option left out).

    Raises:
        TypeError: ``value`` is no sequence of two strings or ``os.PathLike``.
    """
    if value is None:
        return None
    if (
        isinstance(value, (str, os.PathLike)) or not isinstance(value, Sequence) or len(value) != 2
        or not all(isinstance(v, (str, os.PathLike)) for v in value)
    ):
        raise TypeError(f"{key} must be a pair {pair} of str or os.PathLike, got {type(value).__name__}: {value!r}")
    return home_expanded(value[0]), home_expanded(value[1])


def parse_set(items: Sequence[str], prefix: str = "") -> dict[str, Any]:
    """``--set key=value`` flags as ``{key: value}``, each value read as YAML (``1e-3`` a number, ``[1, 2]``
    a list). ``prefix``: what every key starts with, left out of the keys (``theta.`` of ``--set
    theta.epochs=2``, whose key is ``epochs``); messages name each flag as given.

    Raises:
        UsageError: an item without ``=``, or a key given twice (one of the values would be dropped unseen),
            naming it.
        ValueError: a value that is not valid YAML, naming it.
    """
    import yaml

    from detens.config import parse_yaml

    overrides: dict[str, Any] = {}
    given: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"--set expects key=value, got {item!r}")
        target, value = item.split("=", 1)
        key = target.removeprefix(prefix).strip()
        if key in given:
            raise UsageError(f"--set {given[key]!r} and --set {item!r} both set {prefix}{key}: give one of them")
        given[key] = item
        try:
            overrides[key] = parse_yaml(value)
        except yaml.YAMLError as err:
            problem = getattr(err, "problem", None) or type(err).__name__
            raise ValueError(f"--set {item!r}: the value is not valid YAML ({problem})") from None
    return overrides


# ------------------------------------------------------------------------------------------ the kinds of fields
def _field(default: Any, kind: str, *, required: bool = False, choices: Sequence[Any] | None = None) -> Any:
    return dataclasses.field(
        default=default, metadata={"kind": kind, "required": required, "choices": choices}
    )


def flag() -> Any:
    """An option without a value (``--overwrite``): True or False (a NumPy bool too), default False."""
    return _field(False, "flag")


def integer(default: int | None = None, *, positive: bool = False) -> Any:
    """A count (an ``int`` or a NumPy integer; never a float or a bool); ``positive``: at least 1."""
    return _field(default, "positive_int" if positive else "int")


def number(default: float | None = None) -> Any:
    """A finite real number (an int, a float, a NumPy number; never a bool), stored as a float."""
    return _field(default, "float")


def path(default: Path | None = None, *, required: bool = False) -> Any:
    """A file or folder path to read (a ``str`` or an ``os.PathLike``), stored as a ``Path``, which drops a
    trailing separator: a file to write is an :func:`output_file` or a :func:`file_or_folder`."""
    return _field(default, "path", required=required)


def input_path(default: str | None = None, *, required: bool = False) -> Any:
    """A file or folder to read, or a name that stands for files (a shipped config's, a glob), stored as the
    ``str`` given (an ``os.PathLike`` as its path) with a leading ``~`` expanded (:func:`detens.io.home_expanded`)."""
    return _field(default, "input_path", required=required)


def output_file(*, required: bool = False) -> Any:
    """A file to write (:func:`check_output_file`: not a path ending in a separator), stored as the ``str``
    given (an ``os.PathLike`` as its path)."""
    return _field(None, "output_file", required=required)


def file_or_folder() -> Any:
    """A file to write, or a folder to write it in where the path ends in a separator or is a folder
    (:func:`check_file_or_folder`), stored as the ``str`` given (an ``os.PathLike`` as its path): a ``Path``
    would drop the separator."""
    return _field(None, "file_or_folder")


def folder(*, required: bool = False) -> Any:
    """A folder to write to, which may not exist yet (:func:`check_folder`), stored as a ``Path``."""
    return _field(None, "folder", required=required)


def existing_folder() -> Any:
    """A folder that exists (:func:`check_existing_folder`), stored as the ``str`` given."""
    return _field(None, "existing_folder")


def text(default: str | None = None, *, required: bool = False, choices: Sequence[str] | None = None) -> Any:
    """A string option (an ``os.PathLike`` is taken as its path), one of ``choices`` where given."""
    return _field(default, "str", required=required, choices=choices)


def listed(default: Any = None) -> Any:
    """An option of several values (a flag with ``nargs`` or given more than once); the job's options check
    it in their own ``__post_init__`` (after this base's), as each takes its own kind of list
    (:func:`check_text_list`, :func:`check_text_pair`, ...)."""
    return _field(default, "listed")


def internal(default: Any = None) -> Any:
    """What the command line passes to the job that is no option of it (the command line itself)."""
    return _field(default, "internal")


def check_int(key: str, value: Any) -> int:
    """``value`` of the option ``key`` as an ``int``: an ``int`` or a NumPy integer (from an array); bools and
    floats are no counts.

    Raises:
        TypeError: naming ``key`` and what it got.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{key} must be an int, got {type(value).__name__}: {value!r}")
    return int(value)


def _folder_to_write(value: str) -> Path:
    return path_as_written(check_folder(value))


#: the check of each kind of path option; each reads a leading ``~`` as the home folder (:func:`detens.io.home_expanded`)
_PATH_CHECKS = {
    "path": path_as_written, "input_path": home_expanded, "folder": _folder_to_write,
    "existing_folder": check_existing_folder, "output_file": check_output_file, "file_or_folder": check_file_or_folder,
}


def _checked(kind: str, key: str, value: Any) -> Any:
    """``value`` of the option ``key`` of ``kind``, converted, or a TypeError/ValueError naming the option."""
    if kind == "flag":
        return check_flag(value, key)
    if kind in ("int", "positive_int"):
        value = check_int(key, value)
        if kind == "positive_int" and value < 1:
            raise ValueError(f"{key} must be an int >= 1, got {value}")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{key} must be a number, got {type(value).__name__}: {value!r}")
        number = real_as_float(value)
        if not math.isfinite(number):
            raise ValueError(f"{key} must be a finite number, got {value}")
        return number
    if kind in _PATH_CHECKS:
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"{key} must be a path (str or os.PathLike), got {type(value).__name__}: {value!r}")
        try:
            return _PATH_CHECKS[kind](os.fspath(value))
        except ValueError as err:
            raise ValueError(f"{key}: {err}") from None
    if kind == "str":
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str):
            raise TypeError(f"{key} must be a str, got {type(value).__name__}: {value!r}")
        return value
    raise TypeError(f"{key}: unknown kind of option {kind!r}")  # pragma: no cover - a field made without a kind


@dataclasses.dataclass(kw_only=True)
class JobOptions:
    """The options of a job. Subclasses are keyword-only dataclasses whose fields come from :func:`flag`,
    :func:`integer`, :func:`number`, :func:`path`, :func:`input_path`, :func:`output_file`, :func:`file_or_folder`,
    :func:`folder`, :func:`existing_folder`, :func:`text`, :func:`listed` and :func:`internal`; each value is
    checked and converted when the options are made (None: the option left out, its default kept; a required
    one left out is a TypeError).

    Attributes:
        quiet (bool): warnings and results only: no progress bars or lines, no library chatter, no run
            summary (``summary.json`` holds it; evaluate still prints its table).
        command_line (tuple[str, ...] | None): the command line that started the job, recorded in outputs
            that say how they were made (None from Python).
    """

    #: the job's name: ``cache`` (``detens cache``)
    job: ClassVar[str] = "job"
    #: the Python function the options are given to, named in messages (``fuse_images()``: ``detens.fuse``
    #: is another function); None: the job's name (``cache()`` of ``detens.cache``)
    call: ClassVar[str | None] = None

    quiet: bool = flag()
    command_line: tuple[str, ...] | None = internal()

    def __post_init__(self) -> None:
        missing = []
        for spec in dataclasses.fields(self):
            kind = spec.metadata.get("kind")
            value = getattr(self, spec.name)
            if kind is None or kind in ("internal", "listed"):
                continue
            if value is None:
                if spec.metadata["required"]:
                    missing.append(spec.name)
                continue
            value = _checked(kind, spec.name, value)
            choices = spec.metadata["choices"]
            if choices is not None and value not in choices:
                raise ValueError(f"{spec.name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
            setattr(self, spec.name, value)
        if missing:
            raise TypeError(f"{self.call or self.job}() needs {', '.join(missing)}")

    @property
    def run_again(self) -> str:
        """How the caller resumes this job's unfinished run, in its own words: ``run the same command again``,
        or ``make the same call again`` for a Python call (no command line); ``... without --overwrite`` where
        the job has that flag set, since the same run with it would discard the finished work instead."""
        again = "make the same call again" if self.command_line is None else "run the same command again"
        if getattr(self, "overwrite", False) is True:
            again += f" without {self.option('overwrite')}"
        return again

    def option(self, name: str) -> str:
        """The option ``name`` (a field) as the caller writes it: ``--max-det`` / ``--overwrite`` on the
        command line, ``max_det`` / ``overwrite=True`` in a Python call (no command line)."""
        spec = next((f for f in dataclasses.fields(self) if f.name == name), None)
        if spec is None or spec.metadata.get("kind") == "internal":
            raise KeyError(f"{type(self).__name__} has no option {name!r}")
        if self.command_line is not None:
            return command_line_flag(name)
        return python_keyword(name, spec.metadata.get("kind") == "flag")

    @classmethod
    def option_names(cls) -> list[str]:
        """The options a caller sets (every field but the internal ones)."""
        return [f.name for f in dataclasses.fields(cls) if f.metadata.get("kind") != "internal"]

    @classmethod
    def flag_names(cls) -> list[str]:
        """The options that take no value on the command line (``overwrite``, ``quiet``)."""
        return [f.name for f in dataclasses.fields(cls) if f.metadata.get("kind") == "flag"]

    @classmethod
    def from_python(cls, options: Mapping[str, Any]) -> JobOptions:
        """The options of a Python call (``None`` for an option: left out).

        Raises:
            TypeError: an option the job does not have, one of the wrong type, or a required one left out.
            ValueError: a bad value (a path that is a file where a folder is expected, a value not among the
                choices).
        """
        valid = cls.option_names()
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise TypeError(f"{cls.call or cls.job}() got unknown options {unknown}; valid: {', '.join(sorted(valid))}")
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        return cls(**{key: defaults[key] if value is None else value for key, value in options.items()})

    @classmethod
    def from_namespace(cls, args: Any) -> JobOptions:
        """The options of a parsed command line: the attributes of ``args`` named like the fields (the
        command line itself from ``args._command_line``, where the parser's caller recorded it)."""
        names = cls.option_names()
        command_line = getattr(args, "_command_line", None)
        return cls(
            **{name: getattr(args, name) for name in names},
            command_line=tuple(command_line) if command_line is not None else None,
        )
