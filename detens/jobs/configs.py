"""The job of ``detens configs``: list the ensemble configs, training configs and heads shipped inside the
package, print one, or copy one out to edit (the command's help page, :mod:`detens.cli.configs`)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from detens.io import atomic_write_bytes, check_writable_file, names_a_folder
from detens.jobs._options import JobOptions, UsageError, file_or_folder, text
from detens.packaged import CONFIG_ROOT, KINDS, describe_shipped, packaged_names, shipped_file

__all__ = ["ConfigsOptions", "run", "listing"]

#: How each kind is used, for the listing's headings.
_USED_BY = {
    "ensembles": "ensemble configs (detens fuse --config NAME, detens cache --config NAME)",
    "train": "training configs (detens train --head TYPE --config NAME, detens evaluate --train-config TYPE=NAME)",
    "heads": "trained heads (detens fuse --head NAME, a config's fusion.head, detens.fuse(head=NAME))",
}


@dataclasses.dataclass(kw_only=True)
class ConfigsOptions(JobOptions):
    """The options of ``detens configs``.

    Attributes:
        name (str | None): a shipped file's name (``coco_yolo3``); None: list them all.
        kind (str | None): where to look for ``name``, or what to list: ``ensembles``, ``train`` or ``heads``
            (None: every kind; a name shipped as two kinds needs it).
        out (str | None): write a copy of ``name`` there (a file, or a folder to put it in under its own
            name: one that exists, or a path ending in a separator, ``copies/``, created) instead of printing
            it; an existing file is never replaced.
    """

    job = "configs"

    name: str | None = text()
    kind: str | None = text(choices=KINDS)
    out: str | None = file_or_folder()


def listing(kind: str | None = None) -> str:
    """The shipped files of ``kind`` (None: every kind) with one line on each, under their use."""
    blocks = []
    for each in KINDS if kind is None else (kind,):
        names = packaged_names(each)
        width = max(map(len, names), default=0)
        rows = [f"  {name:<{width}}  {describe_shipped(*shipped_file(name, each))}" for name in names]
        blocks.append("\n".join([f"{_USED_BY[each]}:", *(rows or ["  none"])]))
    blocks.append(f"Shipped in {CONFIG_ROOT}. detens configs NAME prints one; detens configs NAME --out FILE copies "
                  "it to edit (then give the copy by its path: --config FILE).")
    return "\n\n".join(blocks) + "\n"


def run(options: ConfigsOptions) -> int:
    """Print the listing, or the shipped file ``options.name``, or copy it to ``options.out``; returns 0.

    Raises:
        UsageError: ``--out`` without a name.
        ValueError: a name not shipped (the nearest one suggested), or an ``--out`` that exists or cannot be
            written.
    """
    if options.name is None:
        if options.out is not None:
            raise UsageError("--out copies one shipped file: give its NAME (detens configs lists them)")
        sys.stdout.write(listing(options.kind))
        return 0
    kind, source = shipped_file(options.name, options.kind)
    if options.out is None:
        if kind == "heads":  # weights, not text to read: what it is, and how to copy it
            sys.stdout.write(f"{source}\n{describe_shipped(kind, source)}\n(detens configs {options.name} --out FILE "
                             "copies it)\n")
        else:
            sys.stdout.write(source.read_text(encoding="utf-8"))
        return 0
    out = Path(options.out)
    target = out / source.name if names_a_folder(options.out) or out.is_dir() else out
    if target.exists():
        raise ValueError(f"--out {target} exists; the copy never replaces a file: remove it, or give another path")
    check_writable_file(target, "--out")
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(target, source.read_bytes())
    if not options.quiet:
        use = {"ensembles": "--config", "train": "--config", "heads": "--head"}[kind]
        print(f"copied {source.name} to {target}; give it as {use} {target}")
    return 0
