"""List the configs and heads shipped inside detens, print one, or copy one out to edit.

    detens configs                              # every shipped ensemble config, training config and head
    detens configs coco_yolo3                   # print the ensemble config coco_yolo3.yaml
    detens configs coco_yolo3 --out mine.yaml   # a copy to edit: detens fuse --config mine.yaml ...
    detens configs deep --kind train            # the deep head's training config

The shipped files go by name everywhere (``--config coco_yolo3``, ``--head coco_yolo3_deep``); a copy goes by
its path. A copied ensemble config finds the same weights (its ``weights`` are names looked up in
``$DETENS_WEIGHTS``, ``weights_dir`` and ``shared/models`` as before) and the same head (``fusion.head`` is a
shipped head's name). A head is not printed (it is weights); its type and models are. ``--out`` never
replaces an existing file; a folder takes the copy under its shipped file name: one that exists,
or a path ending in ``/`` (``--out copies/``), created.
"""

from __future__ import annotations

import argparse

from detens.cli import file_or_folder, run_command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from detens.packaged import KINDS

    parser.add_argument("name", nargs="?", help="a shipped name (coco_yolo3, deep, coco_yolo3_deep); none: list them")
    parser.add_argument("--kind", choices=KINDS, help="where to look for NAME, or what to list (default: every kind)")
    parser.add_argument(
        "--out", type=file_or_folder, metavar="FILE",
        help="write a copy of NAME there (a file, or a folder: one that exists, or a path ending in /) instead of "
        "printing it"
    )


def run(args: argparse.Namespace) -> int:
    from detens.jobs.configs import ConfigsOptions, run

    return run(ConfigsOptions.from_namespace(args))


def main(argv: list[str] | None = None) -> int:
    return run_command("configs", argv)
