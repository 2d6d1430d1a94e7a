"""The job of ``detens train``: fit a fusion head on saved predictions and COCO ground truth (the command's
help page, :mod:`detens.cli.train`, says what it reads, what it writes and what is refused)."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import asdict, fields
from pathlib import Path

import torch
from tqdm import tqdm

from detens.checks import first_few
from detens.coco import load_coco_gt
from detens.config import save_yaml_config
from detens.heads import TRAINERS, check_fit_data, fit_head, load_train_config
from detens.heads._io import (
    HEAD_DIGEST,
    TRAINED_ON,
    TRAINING_LOG_SUFFIX,
    beside_head,
    head_digest,
    read_head_file_at,
)
from detens.io import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    check_not_special_file,
    check_writable_file,
    files_written_together,
)
from detens.jobs._inputs import model_names
from detens.jobs._interrupts import ctrl_c_held
from detens.jobs._options import (
    JobOptions,
    UsageError,
    check_text_list,
    check_text_pair,
    file_or_shipped_name,
    flag,
    input_path,
    integer,
    listed,
    number,
    output_file,
    parse_set,
    text,
)
from detens.jobs._outputs import output_file_lock, refuse_outputs_over_inputs, refuse_unwritable_outputs
from detens.predictions import (
    EnsemblePredictions,
    base_file_names,
    join_predictions,
    shared_images,
    shares_images_phrase,
)

__all__ = [
    "HEAD_TYPES", "TrainOptions", "check_no_image_twice", "loss_plot_png", "read_image_ids", "run",
]

logger = logging.getLogger("detens.train")

HEAD_TYPES = sorted(TRAINERS)

#: the files written beside the head (``head.json.log``, ...), by suffix
_SIDE_FILES = (".config.yaml", ".loss.png", ".log", TRAINING_LOG_SUFFIX)


@dataclasses.dataclass(kw_only=True)
class TrainOptions(JobOptions):
    """The options of ``detens train``.

    Attributes:
        gt (str): the COCO annotation file.
        predictions (str): the folder of ``<model>.json`` COCO results.
        out (str): the head file to write (``.json`` or ``.safetensors``).
        head (str): the head type, one of :data:`HEAD_TYPES`.
        config (str | None): a training YAML, or a shipped one by head name (None: the head's code defaults).
        images_from (str | None): a file of the image ids to train on, one per line, each once (None: every
            annotated image).
        all_images (bool): train on every image of ``gt`` and of ``also_fit_on``'s file, those without
            annotations as negative images.
        models (str | None): comma-separated model names (None: every file, sorted).
        also_fit_on (tuple[str, str] | None): the annotation file and prediction folder of more training
            images.
        epochs (int | None): training epochs (overrides the config).
        lr (float | None): the learning rate (overrides the config); a finite number.
        seed (int | None): the random seed (overrides the config).
        set (tuple[str, ...]): ``key=value`` overrides of config keys.
        threads (int): torch intra-op threads.
    """

    job = "train"

    gt: str = input_path(required=True)
    predictions: str = input_path(required=True)
    out: str = output_file(required=True)
    head: str = text("theta", choices=HEAD_TYPES)
    config: str | None = input_path()
    images_from: str | None = input_path()
    all_images: bool = flag()
    models: str | None = text()
    also_fit_on: tuple[str, str] | None = listed()
    epochs: int | None = integer()
    lr: float | None = number()
    seed: int | None = integer()
    set: tuple[str, ...] = listed()
    threads: int = integer(1, positive=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.also_fit_on = check_text_pair("also_fit_on", self.also_fit_on)
        self.set = check_text_list("set", self.set)


def read_image_ids(path: Path) -> list[int]:
    """One integer image id per line (blank lines and ``#`` comments ignored), each id once. A UTF-8 byte
    order mark at the start of the file (Windows editors save one) is not part of the first line.

    Raises:
        ValueError: a file that is not UTF-8 text, a line that is not an integer, an id on more than one line
            (naming the ids and their lines), or no id at all.
    """
    try:
        # not "utf-8-sig": its error offsets would not count the mark's 3 bytes
        content = path.read_text(encoding="utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not a text file of image ids, one per line ({err.reason} at byte {err.start})") from None
    ids = []
    lines: dict[int, list[int]] = {}
    for line_number, line in enumerate(content.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            image_id = int(line)
        except ValueError:
            raise ValueError(f"{path}:{line_number}: expected an integer image id, got {line!r}") from None
        ids.append(image_id)
        lines.setdefault(image_id, []).append(line_number)
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


def loss_plot_png(losses: list[float], title: str) -> bytes:
    """The loss curve ``losses`` (one value per epoch) drawn as a PNG image."""
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
    return buffer.getvalue()


def run(options: TrainOptions) -> int:
    """Fit the head and write it with its config, loss curve and logs; returns 0.

    Holds a lock on ``--out`` (``.<name>.detens.lock`` beside it) while it runs: of two runs on the same
    ``--out``, the last to finish would replace the other's head without a word.

    Raises:
        KeyboardInterrupt: a Ctrl-C: during the fit, with nothing written; while the files are written, once
            every one of them is (the run is finished).
        UsageError: a bad option, or an output on an input (found before the fit).
        ValueError: among others, another run holds ``--out``, naming it.
    """
    out = Path(options.out)
    if out.suffix.lower() not in (".json", ".safetensors"):
        raise UsageError(f"--out must end in .json or .safetensors, got {out}")
    check_writable_file(out, "--out")
    with output_file_lock(out, "detens train"):
        return _run(options, out)


def _run(options: TrainOptions, out: Path) -> int:
    torch.set_num_threads(options.threads)
    _refuse_outputs_over_inputs(options)
    overrides = parse_set(options.set)
    flags = {k: v for k, v in (("epochs", options.epochs), ("lr", options.lr), ("seed", options.seed)) if v is not None}
    # Read as a layer of config keys below, a flag the head type lacks would be reported as an unknown key
    head_options = {f.name for f in fields(TRAINERS[options.head].config_class)}
    for name in flags:
        if name not in head_options:
            raise UsageError(
                f"--{name}: a {options.head} head has no {name} option; its training options are {', '.join(sorted(head_options))}"
            )
    config = load_train_config(options.head, file_or_shipped_name("--config", options.config), overrides, flags)

    if options.images_from and options.all_images:
        raise UsageError("--images-from lists the images to train on and --all-images takes every image: give one")
    if options.images_from:
        check_not_special_file(options.images_from, "--images-from")
    if options.images_from and not Path(options.images_from).is_file():
        raise UsageError(f"--images-from: no such file: {options.images_from} (one image id per line)")
    listed = read_image_ids(Path(options.images_from)) if options.images_from else None
    gt = load_coco_gt(options.gt)
    models = model_names(options.models, options.predictions)
    predictions = EnsemblePredictions.from_folder(options.predictions, gt, models=models)
    if listed is not None:
        image_ids = listed
    elif options.all_images:
        image_ids = predictions.gt.image_ids
    else:
        image_ids = predictions.gt.annotated_image_ids
    if listed is None and len(image_ids) < len(predictions.gt.image_ids):
        # a dataset of one's own often holds images with none of its classes: say they are not fitted on
        logger.info(
            "%d of the %d images of %s have no annotation and are not trained on (--all-images, or listing them "
            "in --images-from, fits on them as images without objects)",
            len(predictions.gt.image_ids) - len(image_ids), len(predictions.gt.image_ids), options.gt,
        )
    unknown = sorted(set(image_ids) - set(gt.image_ids))
    if unknown:
        raise ValueError(f"--images-from lists image ids not in {options.gt}: {unknown[:10]}")
    # from_folder warned about the left-out images already; --images-from may still name them
    left_out = {image.image_id for image in predictions.left_out}
    if left_out & set(image_ids):
        image_ids = [i for i in image_ids if i not in left_out]
        if not image_ids:
            raise ValueError(
                f"every image that --images-from {options.images_from} lists is left out: the cache could not read "
                "them (see the warning above)"
            )
    left_out_record = {"left_out": [asdict(image) for image in predictions.left_out]}
    if options.also_fit_on:
        extra_gt, extra_folder = options.also_fit_on
        extra = EnsemblePredictions.from_folder(extra_folder, load_coco_gt(extra_gt), models=predictions.model_names)
        if not options.all_images and not extra.gt.annotated_image_ids:  # it would add no image to the fit
            raise UsageError(f"--also-fit-on's annotation file {extra_gt} has no annotated image to train on")
        check_no_image_twice(predictions, image_ids, extra, options.all_images)
        left_out_record["left_out_also_fit_on"] = [asdict(image) for image in extra.left_out]
        predictions, extra_ids = join_predictions(predictions, extra, all_images=options.all_images)
        image_ids = list(image_ids) + extra_ids
    if not image_ids:
        raise UsageError(f"--gt {options.gt} has no annotated image to train on")
    if not set(predictions.gt.annotated_image_ids) & set(image_ids):  # --all-images or --images-from
        source = f"--gt {options.gt}" + (f" and --also-fit-on {options.also_fit_on[0]}" if options.also_fit_on else "")
        raise UsageError(
            f"none of the {len(image_ids)} images to train on has an annotation ({source}): a head fitted on them "
            "could only learn to score every box 0"
        )
    # what the head needs of each member's data (a calibration curve its detections), said as evaluate says
    # it, before any matching
    check_fit_data(options.head, predictions, image_ids, config)

    epoch_lines: list[str] = []
    fits = 0
    epochs = getattr(config, "epochs", None)  # None: a head fitted without gradient steps has no bar to show
    bar = tqdm(total=epochs, desc=f"{options.head} fit", unit="epoch", disable=options.quiet or epochs is None,
               dynamic_ncols=True)

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
        head, history, config = fit_head(options.head, predictions, image_ids, config, on_epoch=on_epoch)
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    # drawn before the first file is written, so that writing the files is brief enough to hold a Ctrl-C
    curve = None
    if history.loss:
        curve = loss_plot_png(history.loss, f"{options.head} head: {', '.join(predictions.model_names)}")
    else:  # fitted without epochs (calibration curves)
        epoch_lines.append(f"no epochs: a {options.head} head is fitted without gradient steps")
    log = {
        "head": options.head,
        "models": predictions.model_names,
        "images": len(image_ids),
        # by file name, folders aside, as images are told apart across annotation files: what an evaluation
        # of this head on other images checks they do not hold
        TRAINED_ON: sorted({name for name in base_file_names(predictions.gt, image_ids) if name is not None}),
        **left_out_record,
        "match_iou": getattr(config, "match_iou", None),
        "train_seconds": round(seconds, 3),
        "loss": history.loss,
        **({"inner_cv": history.selection} if history.selection else {}),
        **({"theta": head.theta.detach().cpu().tolist()} if hasattr(head, "theta") else {}),
    }
    # The head and its files belong together: a Ctrl-C among them would leave the new head beside an earlier
    # head's files (or none), which nothing flags. Held, it stops the run once they are all written; a failed
    # write (a full disk) leaves the earlier set as it was.
    with ctrl_c_held() as ctrl_c, files_written_together(out.parent) as staged:
        config_path, loss_plot, epoch_log, training_log = (staged(beside_head(out, s).name) for s in _SIDE_FILES)
        head_file = staged(out.name)  # moved into place last: a later --head reads it once its files describe it
        head.save(head_file)
        log[HEAD_DIGEST] = head_digest(read_head_file_at(head_file))  # of the file as written, as a reader sees it
        save_yaml_config(config, config_path)
        if curve is not None:  # else the set has none, and an earlier head's goes
            atomic_write_bytes(loss_plot, curve)
        atomic_write_text(epoch_log, "\n".join(epoch_lines) + "\n")
        atomic_write_json(training_log, log, indent=1)
    learned = f"Θ = {[round(v, 4) for v in head.theta.detach().cpu().tolist()]}; " if hasattr(head, "theta") else ""
    logger.info("trained %s head in %.1f s; %shead written to %s", options.head, seconds, learned, out)
    if ctrl_c.pressed:
        written = [suffix for suffix in _SIDE_FILES if curve is not None or suffix != ".loss.png"]
        logger.warning(
            "interrupted while the head was written: the run finished first; %s and its %s and %s files are "
            "all this run's", out, ", ".join(written[:-1]), written[-1],
        )
        raise ctrl_c.interruption()
    return 0


def _refuse_outputs_over_inputs(options: TrainOptions) -> None:
    """Raise now, not once the head is trained, if a file the run writes is one it reads or a JSON file in
    a prediction folder (:func:`detens.jobs._outputs.refuse_outputs_over_inputs`)."""
    out = Path(options.out)
    outputs = [("--out", out), *((f"the {suffix} file", beside_head(out, suffix)) for suffix in _SIDE_FILES)]
    refuse_unwritable_outputs(outputs)
    inputs = [("--gt", Path(options.gt))]
    if options.images_from:
        inputs.append(("--images-from", Path(options.images_from)))
    folders = [("--predictions", Path(options.predictions))]
    if options.also_fit_on:
        inputs.append(("--also-fit-on's annotation file", Path(options.also_fit_on[0])))
        folders.append(("--also-fit-on", Path(options.also_fit_on[1])))
    refuse_outputs_over_inputs(outputs, inputs, folders)
