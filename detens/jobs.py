"""The commands' jobs as Python calls: ``detens.cache(...)`` and ``detens.fuse_images(...)`` run exactly
what ``detens cache`` and ``detens fuse`` run (same outputs, resuming, engines), with keyword options named
like the flags (``--max-det`` is ``max_det``). A mistake raises the library's ``ValueError``/``TypeError``
instead of ending the process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["cache", "fuse_images"]


def _run(command: str, argv: list[str], options: dict[str, Any]) -> int:
    from detens.cli import UsageError, command_parser

    parser = command_parser(command)
    try:
        args = parser.parse_args(argv)
    except SystemExit:  # argparse already said why on stderr
        raise ValueError(f"invalid arguments for {command}: {argv}") from None
    known = sorted(k for k in vars(args) if not k.startswith("_"))
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"{command}() got unknown options {unknown}; valid: {', '.join(known)}")
    for key, value in options.items():
        setattr(args, key, Path(value) if key in ("out", "images", "gt") and value is not None else value)
    try:
        return int(args._run(args))
    except UsageError as err:
        raise ValueError(str(err)) from None


def cache(config: str | Path, images: str | Path, gt: str | Path, out: str | Path, **options: Any) -> int:
    """Cache each member's detections on a COCO-format dataset (``detens cache``).

    Args:
        config: a shipped ensemble name (``coco_yolo3``) or an ensemble YAML.
        images: the folder of the ground truth's images. gt: its COCO annotation file. out: the output folder.
        **options: the command's other flags, e.g. ``engine="ray"``, ``actors=2``, ``models="yolo26n"``,
            ``conf=0.001``, ``overwrite=True``, ``quiet=True``.

    Returns:
        int: 0 when done, 130 when interrupted (run again to resume).
    """
    argv = ["--config", str(config), "--images", str(images), "--gt", str(gt), "--out", str(out)]
    return _run("cache", argv, options)


def fuse_images(config: str | Path, source: str | Path, out: str | Path, **options: Any) -> int:
    """Run an ensemble on images and fuse its detections (``detens fuse``).

    Args:
        config: a shipped ensemble name or an ensemble YAML. source: an image, a folder or a glob.
        out: the output folder (``predictions.json``, ``images.json``, ...).
        **options: the command's other flags, e.g. ``engine="ray"``, ``head="runs/train/head.json"``,
            ``method="wbf"``, ``save_per_model=True``, ``quiet=True``.
    """
    return _run("fuse", ["--config", str(config), "--source", str(source), "--out", str(out)], options)
