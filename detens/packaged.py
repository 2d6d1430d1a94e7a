"""Configs and heads shipped inside the package, addressable by name.

``detens/configs/ensembles/<name>.yaml`` (ensemble configs), ``detens/configs/train/<head>.yaml``
(training configs, mirroring the code defaults) and ``detens/configs/heads/<name>.json`` (trained heads).
A value that is an existing file is used as it is; otherwise a bare name is looked up here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

__all__ = ["CONFIG_ROOT", "packaged_names", "find_packaged"]

CONFIG_ROOT = Path(__file__).resolve().parent / "configs"

Kind = Literal["ensembles", "train", "heads"]
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
            variable), not a file.
    """
    if kind not in _SUFFIXES:
        raise ValueError(f"kind must be one of {', '.join(_SUFFIXES)}, got {kind!r}")
    if isinstance(value, str) and value == "":
        raise ValueError(f"{_WHAT[kind]}: expected a file or a shipped name, got {value!r}")
    given = Path(value).expanduser()
    path = Path(folder) / given if folder is not None and not given.is_absolute() else given
    if path.is_file():
        return path
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
