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


def packaged_names(kind: Kind) -> list[str]:
    """The names shipped for ``kind`` (file stems), sorted."""
    folder = CONFIG_ROOT / kind
    suffixes = _SUFFIXES[kind]
    return sorted(p.stem for p in folder.iterdir() if p.suffix in suffixes) if folder.is_dir() else []


def find_packaged(value: str | Path, kind: Kind) -> Path:
    """``value`` as an existing file, else the shipped file of that name (``coco_yolo3``).

    Raises:
        FileNotFoundError: neither; the message names the path tried and lists the shipped names.
    """
    if kind not in _SUFFIXES:
        raise ValueError(f"kind must be one of {', '.join(_SUFFIXES)}, got {kind!r}")
    path = Path(value).expanduser()
    if path.is_file():
        return path
    name = str(value)
    if path.parent == Path(".") and name:
        stem = path.stem if path.suffix in _SUFFIXES[kind] else name
        for suffix in _SUFFIXES[kind]:
            candidate = CONFIG_ROOT / kind / f"{stem}{suffix}"
            if candidate.is_file():
                return candidate
    shipped = ", ".join(packaged_names(kind)) or "none"
    raise FileNotFoundError(
        f"{_WHAT[kind]} {name!r} not found: no such file ({path.absolute()}) and not a shipped name "
        f"(shipped: {shipped})"
    )
