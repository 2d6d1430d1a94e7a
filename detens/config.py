"""YAML configs mirrored by dataclasses; unknown keys are rejected with the nearest valid key suggested."""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import numbers
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from detens.checks import real_as_float
from detens.io import check_not_special_file

__all__ = [
    "ConfigError",
    "config_differences",
    "dump_yaml",
    "from_dict",
    "load_yaml_config",
    "parse_yaml",
    "read_yaml_file",
    "to_dict",
    "save_yaml_config",
]

C = TypeVar("C")


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``1e-3`` as a number: YAML 1.1, which PyYAML follows, wants a
    dot in the mantissa (``1.0e-3``) and reads ``1e-3`` as a string, where YAML 1.2 and every user read a
    number. A key given twice in one mapping is an error naming the key and both lines: PyYAML would keep
    the last value, so the setting the reader sees first would be silently ignored."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *defaults": keys after it override, by design
                    continue
                key = self.construct_object(key_node, deep=deep)
                if not isinstance(key, collections.abc.Hashable):
                    continue  # the base class reports an unhashable key
                if key in first_line:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found duplicate key {key!r} (first on line {first_line[key] + 1}); give each key once",
                        key_node.start_mark,
                    )
                first_line[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            _check_expanded_size(node)
        return node

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        # YAML 1.1 reads 0640 as octal (416) and 1:30 as base 60 (90), where YAML 1.2 and a reader see 640
        # and a string: refused rather than guessed
        text = str(self.construct_scalar(node))
        digits = text.lstrip("+-").replace("_", "")
        if ":" in digits or (len(digits) > 1 and digits[0] == "0" and digits[1] not in "xXbB"):
            how = "a base-60" if ":" in digits else "an octal"
            fix = "quote it" if ":" in digits else "write it without the leading 0, or quote it"
            raise yaml.constructor.ConstructorError(
                None, None,
                f"found {text!r}, which YAML 1.1 reads as {how} number ({super().construct_yaml_int(node)}); "
                f"{fix} for a string",
                node.start_mark,
            )
        try:
            return super().construct_yaml_int(node)
        except ValueError as err:  # more digits than Python converts
            raise yaml.constructor.ConstructorError(None, None, f"cannot read {text[:20]}... as a number: {err}",
                                                    node.start_mark) from None


#: The most values (scalars, lists and mappings) a YAML document may hold with its aliases read in full. A
#: config holds hundreds; aliases of aliases (a "billion laughs") cost little to parse but expand to
#: billions, which reading the config (checking its keys, comparing it with a run's, writing it) walks.
MAX_YAML_VALUES = 100_000


def _check_expanded_size(root: yaml.Node) -> None:
    """Raise ``yaml.composer.ComposerError`` where the document ``root`` would hold more than
    :data:`MAX_YAML_VALUES` values with its aliases expanded, or an alias inside the value it names (a
    value that holds itself, which no config is). Each node is counted once, however many aliases name it."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # expanded, their own size not known yet: the ancestors of the nodes on top
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_counted = stack.pop()
        children = [part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode) else (
            node.value if isinstance(node, yaml.SequenceNode) else [])
        if children_counted:
            open_nodes.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
            if sizes[id(node)] > MAX_YAML_VALUES:
                raise yaml.composer.ComposerError(
                    None, None, f"this value holds more than {MAX_YAML_VALUES} values once its aliases (*name) are "
                    "read in full; a config holds far fewer: write it without aliases of aliases", node.start_mark,
                )
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_nodes:
            raise yaml.composer.ComposerError(
                None, None, "an alias (*name) refers to a value that holds it: the value would hold itself",
                node.start_mark,
            )
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)


# YAML 1.1 reads an exponent as a number only with a dot and a signed exponent (1.0e-3); 1e-3, 1.5e3 and
# .5e3 would be strings
_EXPONENT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$")
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT, list("-+0123456789."))
_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


class _Dumper(yaml.SafeDumper):
    """``yaml.SafeDumper`` that quotes a string :func:`parse_yaml` would read as a number: being YAML 1.1, a
    plain SafeDumper writes ``"1e3"`` bare, and the file would read back as 1000.0."""


_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT, list("-+0123456789."))


def parse_yaml(text: str) -> Any:
    """``text`` read as YAML the safe way (no Python tags), every exponent (``1e-3``, ``1.5e3``) as a number.

    Raises:
        yaml.YAMLError: not valid YAML, a key given twice in one mapping, lists or mappings nested too deeply,
            aliases that expand to more than :data:`MAX_YAML_VALUES` values, an integer of more digits than
            Python converts.
    """
    try:
        return yaml.load(text, Loader=_Loader)
    except RecursionError:
        raise yaml.YAMLError("lists or mappings nested too deeply to be read") from None


def dump_yaml(data: Any) -> str:
    """``data`` as YAML (keys in their order) that :func:`parse_yaml` reads back as ``data``."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


class ConfigError(ValueError):
    """A config file that cannot be read as YAML; the message names the file, the line and the column."""


def config_differences(old: Any, new: Any, where: str = "") -> list[str]:
    """What differs between two parsed configs, one ``key.path: old -> new`` per changed value (list items
    as ``models[1].conf``; a list of another length as one difference), in the order of their keys."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for key in [*old, *(k for k in new if k not in old)]:
            inner = f"{where}.{key}" if where else str(key)
            if key not in new:
                found.append(f"{inner}: {old[key]!r} -> (none)")
            elif key not in old:
                found.append(f"{inner}: (none) -> {new[key]!r}")
            else:
                found += config_differences(old[key], new[key], inner)
        return found
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        pairs = enumerate(zip(old, new, strict=True))
        return [d for i, (a, b) in pairs for d in config_differences(a, b, f"{where}[{i}]")]
    if isinstance(old, list) and isinstance(new, list):
        return [f"{where}: {len(old)} entries -> {len(new)}"]
    return [] if old == new else [f"{where}: {old!r} -> {new!r}"]


def read_yaml_file(path: str | Path, what: str = "config file") -> Any:
    """The content of a YAML file, read with :func:`parse_yaml` (tags such as ``!!python/object`` are refused).

    Raises:
        FileNotFoundError: no such file, naming ``what`` and the path.
        ValueError: a pipe or a device there (:func:`detens.io.check_not_special_file`).
        ConfigError: not UTF-8, or not valid YAML (truncated, a tab in the indentation, a Python tag, a key
            given twice in one mapping), naming the file, the line and the column.
    """
    path = Path(path)
    check_not_special_file(path, what)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        return parse_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not a UTF-8 text file ({err})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(err, "problem", None) or str(err)
        context = getattr(err, "context", None)
        raise ConfigError(f"{where}: invalid YAML: {f'{context}; ' if context else ''}{problem}") from None


def _unknown_key_error(cls: type, key: str, where: str) -> ValueError:
    from detens.checks import did_you_mean

    valid = [f.name for f in dataclasses.fields(cls)]
    return ValueError(f"unknown key {key!r} in {where}; valid keys: {', '.join(valid)}.{did_you_mean(key, valid)}")


#: Said where a string was expected and a bool was read: YAML 1.1, which PyYAML follows, reads an unquoted
#: yes, no, on and off as booleans, where YAML 1.2 and the writer of ``name: on`` mean the word.
_QUOTE_THE_WORD = " (YAML reads an unquoted yes, no, on, off, true or false as true/false: quote the word)"


def _convert(value: Any, annotation: Any, where: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, where)
            except (TypeError, ValueError) as err:
                errors.append(str(err))
        raise TypeError(f"{where}: {value!r} does not fit {annotation}: {'; '.join(errors)}")
    if origin is typing.Literal:
        if value not in args:
            hint = _QUOTE_THE_WORD if isinstance(value, bool) and all(isinstance(a, str) for a in args) else ""
            raise ValueError(f"{where}: {value!r} is not one of {', '.join(map(repr, args))}{hint}")
        return value
    if dataclasses.is_dataclass(annotation):
        if isinstance(value, annotation):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"{where}: expected a mapping for {annotation.__name__}, got {type(value).__name__}")
        return _build(annotation, value, where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        item_type = args[0] if args else Any
        items = [_convert(v, item_type, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError(f"{where}: expected a mapping, got {type(value).__name__}")
        key_type, value_type = args if args else (Any, Any)
        return {_convert(k, key_type, where): _convert(v, value_type, f"{where}.{k}") for k, v in value.items()}
    if annotation is float:  # NumPy numbers too (a dict built in Python); bools are no numbers
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{where}: expected a number, got {type(value).__name__} {value!r}")
        number = real_as_float(value)
        if not math.isfinite(number):  # .nan and .inf are YAML floats; no setting means either
            raise ValueError(f"{where}: expected a finite number, got {value!r}")
        return number
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{where}: expected an integer, got {type(value).__name__} {value!r}")
        return int(value)
    if annotation is bool:
        if not isinstance(value, bool):
            raise TypeError(f"{where}: expected true/false, got {type(value).__name__} {value!r}")
        return value
    if annotation is str:
        if not isinstance(value, str):
            hint = _QUOTE_THE_WORD if isinstance(value, bool) else ""
            raise TypeError(f"{where}: expected a string, got {type(value).__name__} {value!r}{hint}")
        return value
    return value


class _RefusedValue(Exception):
    """A dataclass's own check refused a value: carried up to :func:`from_dict`'s caller-facing ``where``
    (a nested dataclass's own message already says where in the mapping it is)."""


def from_dict(cls: type[C], data: dict[str, Any], where: str | None = None) -> C:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and values of the wrong type; every
    error starts with ``where`` (default: the class name): a key's type error with the key's path in the
    mapping, a dataclass's own check of its values (nested ones too) with ``where`` alone."""
    where = where or cls.__name__
    try:
        return _build(cls, data, where)
    except _RefusedValue as refused:
        raise ValueError(f"{where}: {refused}") from refused.__cause__


def _build(cls: type[C], data: dict[str, Any], where: str) -> C:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise TypeError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise _unknown_key_error(cls, str(key), where)
        kwargs[key] = _convert(value, hints[key], f"{where}.{key}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise _RefusedValue(str(err)) from err


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def load_yaml_config(cls: type[C], path: str | Path, overrides: dict[str, Any] | None = None) -> C:
    """Read ``path`` (YAML) into ``cls``; ``overrides`` (e.g. CLI flags) win over the file."""
    path = Path(path)
    data = read_yaml_file(path)
    data = {} if data is None else data  # an empty file; not `or {}`, which would take [] or 0 for one
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return from_dict(cls, data, where=str(path))


def save_yaml_config(config: Any, path: str | Path) -> None:
    from detens.io import atomic_write_text

    atomic_write_text(path, dump_yaml(to_dict(config)))
