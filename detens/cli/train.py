"""Train fusion weights on saved predictions and COCO ground truth.

    detens train --gt instances.json --predictions predictions/ --out head.json \\
        [--head theta|theta_seed|selection|deep|superlearner|calibration] [--config <head> | train.yaml] \\
        [--images-from ids.txt] [--models a,b,c] [--also-fit-on GT2 PREDICTIONS2]

``--predictions`` holds one COCO results file per model (``<model>.json``, as ``detens cache`` writes);
the head remembers the model names (it matches members by name when it fuses). Images the cache could
not read (each member's ``unreadable`` in the folder's ``cache_summary.json``) are left out for every
member, with a warning that names them, also where ``--images-from`` lists them. ``--images-from`` lists
each image once (a repeated id is an error, as it would weigh that image twice). ``--also-fit-on`` adds a
second dataset's images (same categories, the same models in any file order) to the training images; for the
same reason it may not hold a training image of ``--gt`` (an image is identified by its file name without
folders). By default the images with annotations are trained on; ``--all-images`` trains on every image of
``--gt`` and of ``--also-fit-on``'s file, those without annotations as negative images (their detections
are false positives), as ``detens evaluate --all-images`` fits (it and ``--images-from`` exclude each other).
Every key of the YAML config can be overridden with ``--set key=value`` (repeatable); ``--epochs``,
``--lr``, ``--seed`` are shortcuts (an error for a head type without that option, ``calibration``). Writes:

- ``--out``: the head (``.json`` or ``.safetensors``; no pickle), loadable by ``detens fuse --head``;
- ``<out>.config.yaml``: the resolved training config; ``<out>.loss.png``: the loss curve (none for a
  head fitted without epochs, ``calibration``);
- ``<out>.log.json``: the loss per epoch of the fit that was kept, the number of images, ``train_seconds``
  (the whole fit, searches over matching IoUs or bags included), the images left out (``left_out``, and
  ``left_out_also_fit_on`` of the second dataset), the images fitted on (``trained_on``, which
  ``detens evaluate --methods head:PATH`` checks the scored images against) and the digest of the head
  (``head_sha256``: a log beside a head file replaced since is not read); ``<out>.log``: the epoch lines
  of every fit run (a search runs several, each headed ``fit <i>``).

The files are written once the fit is done, as one set: each into a hidden temporary folder beside
``--out`` first, then moved into place, the head last. A Ctrl-C during the fit, or a write or a move that
fails (a full disk), leaves the earlier run's files at ``--out`` as they were; a Ctrl-C while the files
are written waits until they all are, then ends the run as interrupted, saying it finished: the files
beside a head are always its own.

An output on an input file (``--gt``, ``--images-from``, a JSON file of a prediction folder) is an error
before the fit, as is a new ``.json`` output in a prediction folder (every later run would read it as a
member's predictions).

The terminal shows one progress bar per fit (epoch and loss); ``--quiet`` hides it.
"""

from __future__ import annotations

import argparse

from detens.catalogue import TRAINED_HEAD_TYPES
from detens.cli import add_threads_argument, finite_number, integer, output_file, run_command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gt", required=True, help="COCO annotation file")
    parser.add_argument("--predictions", required=True, help="folder of <model>.json COCO results")
    parser.add_argument("--out", type=output_file, required=True, help="head file to write (.json or .safetensors)")
    parser.add_argument("--head", default="theta", choices=TRAINED_HEAD_TYPES,
                        help=f"head type: {', '.join(TRAINED_HEAD_TYPES)} (default: theta)")
    parser.add_argument(
        "--config", help="training YAML, or a shipped one by head name (default: the head's code defaults, "
        "which the shipped configs mirror)"
    )
    parser.add_argument(
        "--images-from",
        help="file with the image ids to train on, one per line, each once (default: all with GT); images the "
        "cache could not read are left out",
    )
    parser.add_argument(
        "--all-images", action="store_true",
        help="train on every image of --gt and of --also-fit-on's file, those without annotations as negative "
        "images (their detections are false positives); default: the annotated images",
    )
    parser.add_argument("--models", help="comma-separated model names (default: every file, sorted)")
    parser.add_argument(
        "--also-fit-on", nargs=2, metavar=("GT", "PREDICTIONS"),
        help="annotations and prediction folder of more training images (all their annotated images; every image "
        "with --all-images); it may not share a training image with --gt (same file name, folders aside)",
    )
    parser.add_argument("--epochs", type=integer, help="training epochs (overrides the config)")
    parser.add_argument("--lr", type=finite_number, help="learning rate (overrides the config)")
    parser.add_argument("--seed", type=integer, help="random seed (overrides the config)")
    # no default of []: it is TrainOptions.set's default too, and a dataclass field cannot default to a list
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key")
    add_threads_argument(parser)


def run(args: argparse.Namespace) -> int:
    from detens.jobs.train import TrainOptions, run

    return run(TrainOptions.from_namespace(args))


def main(argv: list[str] | None = None) -> int:
    return run_command("train", argv)
