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
  ``left_out_also_fit_on`` of the second dataset); ``<out>.log``: the epoch lines of every fit run (a
  search runs several, each headed ``fit <i>``).

An output on an input file (``--gt``, ``--images-from``, a JSON file of a prediction folder) is an error
before the fit, as is a new ``.json`` output in a prediction folder (every later run would read it as a
member's predictions).

The terminal shows one progress bar per fit (epoch and loss); ``--quiet`` hides it.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm import tqdm

from detens.checks import first_few
from detens.cli import add_threads_argument, run_command
from detens.coco import load_coco_gt
from detens.config import parse_yaml, save_yaml_config
from detens.heads import TRAINERS, fit_head, load_train_config
from detens.io import atomic_write_bytes, atomic_write_json, atomic_write_text, check_writable_file
from detens.jobs._inputs import model_names
from detens.jobs._options import UsageError, file_or_shipped_name
from detens.jobs._outputs import refuse_outputs_over_inputs
from detens.predictions import EnsemblePredictions, join_predictions, shared_images, shares_images_phrase

logger = logging.getLogger("detens.train")

HEAD_TYPES = sorted(TRAINERS)


def read_image_ids(path: Path) -> list[int]:
    """One integer image id per line (blank lines and ``#`` comments ignored), each id once. A UTF-8 byte
    order mark at the start of the file (Windows editors save one) is not part of the first line.

    Raises:
        ValueError: a file that is not UTF-8 text, a line that is not an integer, an id on more than one line
            (naming the ids and their lines), or no id at all.
    """
    try:
        # not "utf-8-sig": its error offsets would not count the mark's 3 bytes
        text = path.read_text(encoding="utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not a text file of image ids, one per line ({err.reason} at byte {err.start})") from None
    ids = []
    lines: dict[int, list[int]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            image_id = int(line)
        except ValueError:
            raise ValueError(f"{path}:{number}: expected an integer image id, got {line!r}") from None
        ids.append(image_id)
        lines.setdefault(image_id, []).append(number)
    if not ids:
        raise ValueError(f"{path} lists no image ids")
    repeated = {i: numbers for i, numbers in lines.items() if len(numbers) > 1}
    if repeated:
        shown = first_few(
            [f"{i} (lines {', '.join(map(str, numbers))})" for i, numbers in sorted(repeated.items())], noun="ids"
        )
        raise ValueError(
            f"{path} lists image ids more than once: {shown}; list each image once (a repeated image "
            "would weigh twice in the fit)"
        )
    return ids


def check_no_image_twice(
    predictions: EnsemblePredictions, image_ids: list[int], extra: EnsemblePredictions, all_images: bool = False
) -> None:
    """Raise ``ValueError`` if ``--also-fit-on``'s data holds a training image of ``--gt`` (the same base file
    name: :func:`~detens.predictions.shared_images`): joined, that image would weigh twice in the fit, which
    ``--images-from`` refuses for a repeated id. ``extra``'s annotated images are compared, every one with
    ``all_images`` (all are trained on)."""
    shared = shared_images(predictions, extra, first_ids=image_ids,
                           second_ids=extra.gt.image_ids if all_images else None)
    if shared:
        phrase = shares_images_phrase(shared, "the training images of --gt", annotated=not all_images)
        raise ValueError(
            f"--also-fit-on's data {phrase}; "
            "each image must be trained on once, or it weighs twice in the fit: remove them from one of the two "
            "(or, if they are different images, give them different file names)"
        )


def parse_set(items: list[str]) -> dict[str, Any]:
    overrides = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        try:
            overrides[key.strip()] = parse_yaml(value)
        except yaml.YAMLError as err:
            problem = getattr(err, "problem", None) or type(err).__name__
            raise ValueError(f"--set {item!r}: the value is not valid YAML ({problem})") from None
    return overrides


def plot_loss(losses: list[float], path: Path, title: str) -> None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(losses) + 1), losses, color="#3182bd")
    ax.set_xlabel("epoch")
    ax.set_ylabel("J (mean per cluster)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def finite_float(text: str) -> float:
    """argparse type: a finite number. ``float`` takes ``nan`` and ``inf`` too, which the config's check would
    then report as a ``--set`` key the user never gave."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gt", required=True, help="COCO annotation file")
    parser.add_argument("--predictions", required=True, help="folder of <model>.json COCO results")
    parser.add_argument("--out", required=True, help="head file to write (.json or .safetensors)")
    parser.add_argument("--head", default="theta", choices=HEAD_TYPES,
                        help=f"head type: {', '.join(HEAD_TYPES)} (default: theta)")
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
    parser.add_argument("--epochs", type=int, help="training epochs (overrides the config)")
    parser.add_argument("--lr", type=finite_float, help="learning rate (overrides the config)")
    parser.add_argument("--seed", type=int, help="random seed (overrides the config)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    add_threads_argument(parser)


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    if out.suffix.lower() not in (".json", ".safetensors"):
        raise UsageError(f"--out must end in .json or .safetensors, got {out}")
    check_writable_file(out, "--out")
    _refuse_outputs_over_inputs(args)
    overrides = parse_set(args.set)
    flags = {k: v for k, v in (("epochs", args.epochs), ("lr", args.lr), ("seed", args.seed)) if v is not None}
    # Merged into the --set keys below, a flag the head type lacks would be reported as a --set key
    options = {f.name for f in fields(TRAINERS[args.head].config_class)}
    for name in flags:
        if name not in options:
            raise UsageError(
                f"--{name}: a {args.head} head has no {name} option; its training options are {', '.join(sorted(options))}"
            )
    overrides.update(flags)
    config = load_train_config(args.head, file_or_shipped_name("--config", args.config), overrides)

    if args.images_from and args.all_images:
        raise UsageError("--images-from lists the images to train on and --all-images takes every image: give one")
    if args.images_from and not Path(args.images_from).is_file():
        raise UsageError(f"--images-from: no such file: {args.images_from} (one image id per line)")
    listed = read_image_ids(Path(args.images_from)) if args.images_from else None
    gt = load_coco_gt(args.gt)
    models = model_names(args.models, args.predictions)
    predictions = EnsemblePredictions.from_folder(args.predictions, gt, models=models)
    if listed is not None:
        image_ids = listed
    elif args.all_images:
        image_ids = predictions.gt.image_ids
    else:
        image_ids = predictions.gt.annotated_image_ids
    if listed is None and len(image_ids) < len(predictions.gt.image_ids):
        # a dataset of one's own often holds images with none of its classes: say they are not fitted on
        logger.info(
            "%d of the %d images of %s have no annotation and are not trained on (--all-images, or listing them "
            "in --images-from, fits on them as images without objects)",
            len(predictions.gt.image_ids) - len(image_ids), len(predictions.gt.image_ids), args.gt,
        )
    unknown = sorted(set(image_ids) - set(gt.image_ids))
    if unknown:
        raise ValueError(f"--images-from lists image ids not in {args.gt}: {unknown[:10]}")
    # from_folder warned about the left-out images already; --images-from may still name them
    left_out = {image.image_id for image in predictions.left_out}
    if left_out & set(image_ids):
        image_ids = [i for i in image_ids if i not in left_out]
        if not image_ids:
            raise ValueError(
                f"every image that --images-from {args.images_from} lists is left out: the cache could not read "
                "them (see the warning above)"
            )
    left_out_record = {"left_out": [asdict(image) for image in predictions.left_out]}
    if args.also_fit_on:
        extra_gt, extra_folder = args.also_fit_on
        extra = EnsemblePredictions.from_folder(extra_folder, load_coco_gt(extra_gt), models=predictions.model_names)
        if not args.all_images and not extra.gt.annotated_image_ids:  # it would add no image to the fit
            raise UsageError(f"--also-fit-on's annotation file {extra_gt} has no annotated image to train on")
        check_no_image_twice(predictions, image_ids, extra, args.all_images)
        left_out_record["left_out_also_fit_on"] = [asdict(image) for image in extra.left_out]
        predictions, extra_ids = join_predictions(predictions, extra, all_images=args.all_images)
        image_ids = list(image_ids) + extra_ids
    if not image_ids:
        raise UsageError(f"--gt {args.gt} has no annotated image to train on")

    epoch_lines: list[str] = []
    fits = 0
    bar = tqdm(total=getattr(config, "epochs", None), desc=f"{args.head} fit", unit="epoch",
               disable=args.quiet, dynamic_ncols=True)

    def on_epoch(epoch: int, loss: float) -> None:
        nonlocal fits
        if epoch == 0:
            if bar.n:  # the next fit of a multi-fit head (bags, a grid of matching IoUs)
                bar.reset()
            fits += 1
            epoch_lines.append(f"fit {fits}")
        epoch_lines.append(f"epoch {epoch + 1} loss {loss:.6f}")
        bar.set_postfix_str(f"loss {loss:.5f}", refresh=False)
        bar.update(1)

    logger.info("%d images, models %s", len(image_ids), predictions.model_names)
    start = time.perf_counter()
    try:
        head, history, config = fit_head(args.head, predictions, image_ids, config, on_epoch=on_epoch)
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    head.save(out)
    save_yaml_config(config, out.with_name(out.name + ".config.yaml"))
    loss_plot = out.with_name(out.name + ".loss.png")
    if history.loss:
        plot_loss(history.loss, loss_plot, f"{args.head} head: {', '.join(predictions.model_names)}")
    else:  # fitted without epochs (calibration curves): no curve, and none of an earlier head left beside it
        loss_plot.unlink(missing_ok=True)
        epoch_lines.append(f"no epochs: a {args.head} head is fitted without gradient steps")
    atomic_write_text(out.with_name(out.name + ".log"), "\n".join(epoch_lines) + "\n")
    atomic_write_json(
        out.with_name(out.name + ".log.json"),
        {
            "head": args.head,
            "models": predictions.model_names,
            "images": len(image_ids),
            **left_out_record,
            "match_iou": getattr(config, "match_iou", None),
            "train_seconds": round(seconds, 3),
            "loss": history.loss,
            **({"inner_cv": history.selection} if history.selection else {}),
            **({"theta": head.theta.detach().cpu().tolist()} if hasattr(head, "theta") else {}),
        },
        indent=1,
    )
    learned = f"Θ = {[round(v, 4) for v in head.theta.detach().cpu().tolist()]}; " if hasattr(head, "theta") else ""
    logger.info("trained %s head in %.1f s; %shead written to %s", args.head, seconds, learned, out)
    return 0


def _refuse_outputs_over_inputs(args: argparse.Namespace) -> None:
    """Raise now, not once the head is trained, if a file the run writes is one it reads or a JSON file in
    a prediction folder (:func:`detens.jobs._outputs.refuse_outputs_over_inputs`)."""
    out = Path(args.out)
    outputs = [("--out", out), *((f"the {suffix} file", out.with_name(out.name + suffix))
                                 for suffix in (".config.yaml", ".loss.png", ".log", ".log.json"))]
    inputs = [("--gt", Path(args.gt))]
    if args.images_from:
        inputs.append(("--images-from", Path(args.images_from)))
    folders = [("--predictions", Path(args.predictions))]
    if args.also_fit_on:
        inputs.append(("--also-fit-on's annotation file", Path(args.also_fit_on[0])))
        folders.append(("--also-fit-on", Path(args.also_fit_on[1])))
    refuse_outputs_over_inputs(outputs, inputs, folders)


def main(argv: list[str] | None = None) -> int:
    return run_command("train", argv)
