"""Configs and heads shipped inside the package, addressable by name.

``detens/configs/ensembles/<name>.yaml`` (ensemble configs), ``detens/configs/train/<head>.yaml``
(training configs, mirroring the code defaults) and ``detens/configs/heads/<name>.json`` (trained heads).
A value that is an existing file is used as it is; otherwise a bare name is looked up here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from detens.io import check_not_special_file, home_expanded, path_as_written

__all__ = ["CONFIG_ROOT", "KINDS", "packaged_names", "find_packaged", "shipped_file", "describe_shipped"]

CONFIG_ROOT = Path(__file__).resolve().parent / "configs"

Kind = Literal["ensembles", "train", "heads"]
#: The kinds of shipped files, in the order they are listed.
KINDS: tuple[Kind, ...] = ("ensembles", "train", "heads")
_SUFFIXES: dict[str, tuple[str, ...]] = {
    "ensembles": (".yaml",),
    "train": (".yaml",),
    "heads": (".json", ".safetensors"),
}
_WHAT = {"ensembles": "ensemble config", "train": "training config", "heads": "head file"}


def _shipped_files(kind: Kind) -> list[Path]:
    """The shipped files of ``kind``, in the order of its suffixes; a training run's side files
    (``<head>.json.log.json``, ...) are not shipped names of their own."""
    folder = CONFIG_ROOT / kind
    if not folder.is_dir():
        return []
    files = [p for p in folder.iterdir() if p.is_file() and p.suffix in _SUFFIXES[kind]]
    own = [p for p in files if not any(p.name.startswith(q.name + ".") for q in files if q != p)]
    return sorted(own, key=lambda p: (_SUFFIXES[kind].index(p.suffix), p.name))


def packaged_names(kind: Kind) -> list[str]:
    """The names shipped for ``kind`` (file stems), sorted."""
    return sorted({p.stem for p in _shipped_files(kind)})


def find_packaged(value: str | Path, kind: Kind, folder: str | Path | None = None) -> Path:
    """``value`` as an existing file, else the shipped file of that name (``coco_yolo3``).

    Args:
        value: a path, or a bare name.
        kind: what is shipped under that name: ``"ensembles"``, ``"train"`` or ``"heads"``.
        folder: where a relative ``value`` lies (the folder of the YAML that names it); None: the working
            directory.

    Raises:
        FileNotFoundError: neither; the message names the path tried and lists the shipped names.
        ValueError: an empty ``value``, which as a path is the working directory (most often an unset
            variable), not a file; a pipe or a device at ``value`` (:func:`detens.io.check_not_special_file`).
    """
    if kind not in _SUFFIXES:
        raise ValueError(f"kind must be one of {', '.join(_SUFFIXES)}, got {kind!r}")
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{_WHAT[kind]}: expected a file (str or Path) or a shipped name, got {type(value).__name__}: "
                        f"{value!r}")
    if isinstance(value, str) and value == "":
        raise ValueError(f"{_WHAT[kind]}: expected a file or a shipped name, got {value!r}")
    given = Path(home_expanded(value))
    # a path of the working directory is found again where it was, not under the home folder (./~/h.json)
    path = Path(folder) / given if folder is not None and not given.is_absolute() else path_as_written(value)
    if path.is_file():
        return path
    check_not_special_file(path, _WHAT[kind])  # a pipe (--config <(...)) is there, but can be read only once
    name = str(value)
    if given.parent == Path(".") and name:
        # a bare name takes the first of the kind's suffixes shipped; a file name, that file
        for candidate in _shipped_files(kind):
            if name in (candidate.stem, candidate.name):
                return candidate
    shipped = ", ".join(packaged_names(kind)) or "none"
    there = "a folder, not a file" if path.is_dir() else "no such file"
    raise FileNotFoundError(
        f"{_WHAT[kind]} {name!r} not found: {there} ({path.absolute()}) and not a shipped name "
        f"(shipped: {shipped})"
    )


def shipped_file(name: str, kind: Kind | None = None) -> tuple[Kind, Path]:
    """The shipped file called ``name`` (its stem, ``coco_yolo3``, or its file name) and its kind.

    Args:
        kind: the kind to look in; None: every kind, one of which must ship the name.

    Raises:
        ValueError: an unknown kind; a name no kind ships (listing the shipped names and suggesting the nearest),
            or several do (naming them, to choose by ``kind``).
    """
    from detens.checks import did_you_mean

    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    kinds = KINDS if kind is None else (kind,)
    found = [(k, p) for k in kinds for p in _shipped_files(k) if name in (p.stem, p.name)]
    if len({k for k, _ in found}) > 1:
        raise ValueError(f"{name!r} is shipped as {' and as '.join(_WHAT[k] for k, _ in found)}: give its kind "
                         f"({', '.join(k for k, _ in found)})")
    if not found:
        names = sorted({p.stem for k in kinds for p in _shipped_files(k)})
        what = " or ".join(_WHAT[k] for k in kinds)
        hint = did_you_mean(name, names)
        raise ValueError(f"no shipped {what} is called {name!r}; shipped: {', '.join(names) or 'none'}"
                         + (f".{hint}" if hint else ""))
    return found[0]


def describe_shipped(kind: Kind, path: Path) -> str:
    """One line on the shipped file ``path`` of ``kind``: an ensemble's members and fusion, a head's type and
    models, a training config's first comment line. Read without torch (a help line should not wait for
    it); a file that cannot be read is described as such."""
    import json

    import yaml

    try:
        if kind == "heads":
            if path.suffix != ".json":
                return "head (safetensors)"
            head = json.loads(path.read_text(encoding="utf-8"))
            config = head.get("config") if isinstance(head.get("config"), dict) else {}
            calibrated = head.get("type") == "calibrated"
            what = config.get("head_type") if calibrated else head.get("type")
            models = ", ".join(map(str, head.get("model_names") or [])) or "unnamed models"
            return f"{what} head{' on calibrated scores' if calibrated else ''} for {models}"
        text = path.read_text(encoding="utf-8")
        if kind == "train":  # the first sentence of the comment that opens the file
            opening = []
            for line in text.splitlines():
                if not line.startswith("#") or not line[1:].strip():
                    break
                opening.append(line[1:].strip())
            return " ".join(opening).split(". ")[0].removesuffix(".") + "." if opening else "training config"
        data = yaml.safe_load(text) or {}
        members = []
        for model in data.get("models") or []:
            name = model.get("name") or model.get("weights") or model.get("results")
            views = model.get("tta") or ["identity"]  # one member per view
            members += [str(name) if view == "identity" else f"{name}|{view}" for view in views]
        fusion = data.get("fusion") or {}
        head = f" (head {fusion['head']})" if fusion.get("head") else ""
        return f"{', '.join(members)} fused by {fusion.get('method', 'wbf')}{head}"
    except (OSError, ValueError, AttributeError, TypeError, yaml.YAMLError) as err:
        return f"(cannot be read: {err})"
