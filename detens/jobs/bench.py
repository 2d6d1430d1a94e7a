"""The job of ``detens bench``: time the fusers against ensemble_boxes and torchvision, ``detens fuse`` per
engine, or COCO evaluation per evaluator (the command's help page, :mod:`detens.cli.bench`, says what is
timed and how)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import platform
import shlex
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detens import Detections, match
from detens.catalogue import DEFAULT_BENCH_SIZES, MAX_BENCH_BOXES
from detens.extras import import_extra
from detens.fusers import fuse
from detens.io import atomic_write_json, check_writable_file, read_json_file
from detens.jobs._interrupts import RESUME_ADVICE
from detens.jobs._options import (
    JobOptions,
    UsageError,
    check_int,
    check_text_pair,
    command_line_flag,
    file_or_shipped_name,
    input_path,
    integer,
    listed,
    output_file,
    text,
)
from detens.jobs._outputs import refuse_outputs_over_inputs

__all__ = [
    "BenchOptions", "IMAGE_SIZE", "NUM_CLASSES", "TENSOR_MATCH", "bench_coco", "bench_engines",
    "bench_size", "check_args", "markdown_table", "parse_size", "replicate_coco", "run", "synthetic_image",
]

logger = logging.getLogger("bench")

IMAGE_SIZE = (480, 640)
NUM_CLASSES = 80
TENSOR_MATCH = "match, tensor path"


def synthetic_image(
    rng: np.random.Generator, num_models: int, boxes_per_model: int, num_classes: int = NUM_CLASSES
) -> list[Detections]:
    """One image's detections from ``num_models`` models (see the module docstring)."""
    height, width = IMAGE_SIZE
    side = np.array([width, height], dtype=np.float64)
    class_p = 1.0 / np.arange(1, num_classes + 1)
    class_p /= class_p.sum()
    num_objects = int(np.clip(boxes_per_model // 40, 5, 75))
    obj_class = rng.choice(num_classes, num_objects, p=class_p)
    obj_size = np.exp(rng.uniform(np.log(0.02), np.log(0.5), (num_objects, 2))) * side  # [O, 2] w, h
    obj_center = rng.uniform(0, 1, (num_objects, 2)) * side

    def boxes_around(objects: np.ndarray, noise: float) -> np.ndarray:
        size = obj_size[objects] * np.exp(rng.normal(0, noise, (len(objects), 2)))
        center = obj_center[objects] + rng.normal(0, noise, (len(objects), 2)) * obj_size[objects]
        return np.concatenate([center - size / 2, center + size / 2], axis=1)

    per_model = []
    for _ in range(num_models):
        noise = rng.uniform(0.04, 0.10)
        num_on_objects = int(0.6 * boxes_per_model)
        found = np.flatnonzero(rng.random(num_objects) < 0.9)[:num_on_objects]
        duplicates = rng.integers(0, num_objects, num_on_objects - len(found))
        true_boxes = boxes_around(found, noise)
        dup_boxes = boxes_around(duplicates, 2 * noise)
        objects = np.concatenate([found, duplicates])
        labels = np.where(
            rng.random(len(objects)) < 0.7, obj_class[objects], rng.choice(num_classes, len(objects), p=class_p)
        )
        scores = np.concatenate([rng.beta(8, 2, len(found)), rng.beta(1.5, 6, len(duplicates))])

        num_clutter = boxes_per_model - num_on_objects
        clutter_size = np.exp(rng.uniform(np.log(0.02), np.log(0.4), (num_clutter, 2))) * side
        clutter_xy = rng.uniform(0, 1, (num_clutter, 2)) * side
        clutter = np.concatenate([clutter_xy - clutter_size / 2, clutter_xy + clutter_size / 2], axis=1)

        boxes = np.concatenate([true_boxes, dup_boxes, clutter])
        per_model.append(
            Detections(
                boxes,
                np.concatenate([scores, rng.beta(1, 8, num_clutter)]),
                np.concatenate([labels, rng.choice(num_classes, num_clutter, p=class_p)]).astype(np.int64),
                IMAGE_SIZE,
            ).clip()
        )
    return per_model


def _ensemble_boxes_inputs(per_model: list[Detections]) -> tuple[list, list, list]:
    height, width = IMAGE_SIZE
    scale = torch.tensor([width, height, width, height], dtype=torch.float64)
    return (
        [(d.boxes.cpu().double() / scale).tolist() for d in per_model],
        [d.scores.cpu().tolist() for d in per_model],
        [d.labels.cpu().tolist() for d in per_model],
    )


def _canonical(boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """[k, 6] rows (label, score, box) sorted lexicographically, scores rounded to float32."""
    rows = np.concatenate(
        [np.asarray(labels, np.float64)[:, None], np.asarray(scores, np.float32).astype(np.float64)[:, None],
         np.asarray(boxes, np.float64).reshape(-1, 4)],
        axis=1,
    )
    return rows[np.lexsort(rows.T[::-1])]


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Milliseconds of one call (the device synchronized before and after)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3


THETA, DEEP = "match+theta", "match+deep"
#: the largest difference of detens wbf's boxes and scores from ensemble_boxes' (normalized) that is float
#: arithmetic's; the synthetic scores never tie, so both visit the boxes in one order and agree to it
SAME_BOXES_TOLERANCE = 1e-5


def _methods(num_models: int) -> dict[str, Callable[[list[Detections]], Any]]:
    from torchvision.ops import batched_nms

    from detens.heads.deep import DeepEnsembleHead
    from detens.heads.theta import ThetaHead

    names = [f"model{i}" for i in range(num_models)]
    # Untrained heads do the work of trained ones: the weights change the outputs, not the operations.
    theta = ThetaHead(names)
    deep = DeepEnsembleHead(names, box="learned", median_box=True)

    def floor(per_model: list[Detections]) -> Any:
        all_boxes = Detections.concat(per_model)
        return batched_nms(all_boxes.boxes, all_boxes.scores, all_boxes.labels, 0.5)

    return {
        "detens wbf": lambda pm: fuse(pm, "wbf"),
        THETA: lambda pm: fuse(pm, "theta", head=theta),
        DEEP: lambda pm: fuse(pm, "deep", head=deep),
        TENSOR_MATCH: lambda pm: match(pm, backend="tensor"),
        "batched_nms": floor,
    }


def bench_size(num_models: int, boxes_per_model: int, repeats: int, device: torch.device, seed: int) -> dict[str, Any]:
    from ensemble_boxes import weighted_boxes_fusion

    rng = np.random.default_rng(seed)
    images = [synthetic_image(rng, num_models, boxes_per_model) for _ in range(repeats + 1)]
    methods = _methods(num_models)
    times: dict[str, list[float]] = {name: [] for name in [*methods, "ensemble_boxes"]}
    max_diff = 0.0
    for i, per_model in enumerate(images):
        per_model = [d.to(device) for d in per_model]
        reference_inputs = _ensemble_boxes_inputs(per_model)
        timings = {name: _timed(lambda fn=fn: fn(per_model), device) for name, fn in methods.items()}  # noqa: B023
        reference: list[Any] = []
        timings["ensemble_boxes"] = _timed(
            lambda: reference.append(weighted_boxes_fusion(*reference_inputs)), device  # noqa: B023
        )
        if i == 0:
            continue  # warm-up image
        for name, ms in timings.items():
            times[name].append(ms)
        # Sanity: detens wbf gives the reference's boxes (compared in a canonical order: numpy's argsort
        # orders equal scores arbitrarily).
        fused = fuse(per_model, "wbf")
        height, width = IMAGE_SIZE
        ours = _canonical(
            fused.boxes.cpu().double().numpy() / np.array([width, height, width, height]),
            fused.scores.cpu().double().numpy(),
            fused.labels.cpu().numpy(),
        )
        theirs = _canonical(*reference[0])
        if ours.shape != theirs.shape:
            raise RuntimeError(f"detens wbf found {len(ours)} boxes, ensemble_boxes {len(theirs)}")
        difference = float(np.abs(ours - theirs).max(initial=0.0))
        if difference > SAME_BOXES_TOLERANCE:
            raise RuntimeError(
                f"detens wbf differs from ensemble_boxes by {difference:.1e} (normalized boxes and scores) at "
                f"{num_models}x{boxes_per_model}, above the {SAME_BOXES_TOLERANCE:.0e} of float arithmetic"
            )
        max_diff = max(max_diff, difference)
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {
        "size": f"{num_models}x{boxes_per_model}",
        "num_models": num_models,
        "boxes_per_model": boxes_per_model,
        "images": repeats,
        "median_ms": medians,
        "all_ms": times,
        "wbf_max_abs_diff_vs_ensemble_boxes": max_diff,
        "ratios": {
            "ensemble_boxes / detens wbf": medians["ensemble_boxes"] / medians["detens wbf"],
            "detens wbf / batched_nms": medians["detens wbf"] / medians["batched_nms"],
            f"ensemble_boxes / {THETA}": medians["ensemble_boxes"] / medians[THETA],
            f"{THETA} / batched_nms": medians[THETA] / medians["batched_nms"],
            f"ensemble_boxes / {DEEP}": medians["ensemble_boxes"] / medians[DEEP],
        },
    }


def markdown_table(results: list[dict[str, Any]]) -> str:
    header = (
        f"| boxes per image (models × boxes) | detens wbf | {THETA} | {DEEP} | {TENSOR_MATCH} | ensemble_boxes wbf "
        f"| batched_nms | ensemble_boxes / detens wbf | detens wbf / batched_nms | ensemble_boxes / {THETA} "
        f"| {THETA} / batched_nms | ensemble_boxes / {DEEP} |"
    )
    lines = [header, "|" + "---|" * 12]
    for r in results:
        m, q = r["median_ms"], r["ratios"]
        lines.append(
            f"| {r['size']} | {m['detens wbf']:.1f} ms | {m[THETA]:.1f} ms | {m[DEEP]:.1f} ms | {m[TENSOR_MATCH]:.1f} ms "
            f"| {m['ensemble_boxes']:.1f} ms | {m['batched_nms']:.1f} ms | {q['ensemble_boxes / detens wbf']:.1f}× "
            f"| {q['detens wbf / batched_nms']:.2f}× | {q[f'ensemble_boxes / {THETA}']:.1f}× "
            f"| {q[f'{THETA} / batched_nms']:.2f}× | {q[f'ensemble_boxes / {DEEP}']:.1f}× |"
        )
    return "\n".join(lines)


def parse_size(text: str) -> tuple[int, int]:
    """``NxK`` as (N models, K boxes per model).

    Raises:
        ValueError: ``text`` is no ``NxK``, names no model or no box, or more than
            :data:`~detens.catalogue.MAX_BENCH_BOXES` boxes in all.
    """
    try:
        models, boxes = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"size must look like 5x1000 (models x boxes per model), got {text!r}") from None
    _check_size(models, boxes, text)
    return models, boxes


def _check_size(models: int, boxes: int, given: Any) -> None:
    if models < 1 or boxes < 1:
        raise ValueError(f"size needs at least 1 model and 1 box, got {given!r}")
    if models * boxes > MAX_BENCH_BOXES:
        raise ValueError(
            f"size {given!r} makes images of {models * boxes:,} boxes; at most {MAX_BENCH_BOXES:,} (models x boxes "
            "per model), some hundred times what an ensemble of detectors gives one image"
        )


def _sizes(value: Any) -> list[tuple[int, int]]:
    """``sizes`` as ``--sizes`` stores it: each size ``"5x1000"`` or ``(5, 1000)``."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(
            f"sizes must be a list of sizes ('5x1000' or (5, 1000)), got {type(value).__name__}: {value!r}"
        )
    if not value:
        raise ValueError("sizes must name at least one size")
    sizes = []
    for i, size in enumerate(value):
        if isinstance(size, str):
            try:
                sizes.append(parse_size(size))
            except ValueError as err:
                raise ValueError(f"sizes[{i}]: {err}") from None
            continue
        if not isinstance(size, Sequence) or len(size) != 2:
            raise TypeError(f"sizes[{i}] must be '5x1000' or (5, 1000), got {type(size).__name__}: {size!r}")
        models, boxes = (check_int(f"sizes[{i}]", v) for v in size)
        try:
            _check_size(models, boxes, size)
        except ValueError as err:
            raise ValueError(f"sizes[{i}]: {err}") from None
        sizes.append((models, boxes))
    return sizes


def _coco(value: Any) -> list[str]:
    """``coco`` as ``--coco`` stores it: the ground truth's path and the results' path."""
    return list(check_text_pair("coco", value, "(GT, RESULTS)"))


def _coco_sizes(value: Any) -> list[int]:
    """``coco_sizes`` as ``--coco-sizes`` stores it: image counts."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(f"coco_sizes must be a list of ints, got {type(value).__name__}: {value!r}")
    if not value:
        raise ValueError("coco_sizes must name at least one image count")
    return [check_int(f"coco_sizes[{i}]", v) for i, v in enumerate(value)]


@dataclasses.dataclass(kw_only=True)
class BenchOptions(JobOptions):
    """The options of ``detens bench``. The options of one benchmark default to None, its defaults filled in
    by :func:`check_args`, so that an option given for a benchmark that does not run is refused.

    Attributes:
        sizes (list[tuple[int, int]] | None): the fusers' sizes, (N models, K boxes per model); ``"5x1000"``
            is taken too (None: 3x100 3x300 5x1000 5x3000).
        repeats (int | None): images per size; sizes above 5000 boxes use a third of them (None: 15).
        device (str | None): device of the input Detections (None: cpu).
        threads (int | None): torch intra-op threads (None: 1).
        seed (int | None): seed of the synthetic images (None: 0).
        out (str | None): also write the results as JSON (atomic write).
        engines (str | None): instead of the fusers: time ``detens fuse`` on this image folder with the local
            engine and with Ray (1 and 2 actors), and Ray's start-up.
        config (str | None): with ``engines``: the ensemble (None: coco_yolo3).
        coco (list[str] | None): instead of the fusers: time evaluate_coco's evaluators on these COCO
            annotations and results (GT, RESULTS), replicated to each of ``coco_sizes`` images.
        coco_sizes (list[int] | None): with ``coco``: the image counts (None: 200 1000 5000).
    """

    job = "bench"

    sizes: list[tuple[int, int]] | None = listed()
    repeats: int | None = integer()
    device: str | None = text()
    threads: int | None = integer(positive=True)
    seed: int | None = integer()
    out: str | None = output_file()
    engines: str | None = input_path()
    config: str | None = input_path()
    coco: list[str] | None = listed()
    coco_sizes: list[int] | None = listed()

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, check in (("sizes", _sizes), ("coco", _coco), ("coco_sizes", _coco_sizes)):
            if getattr(self, name) is not None:
                setattr(self, name, check(getattr(self, name)))


# Each mode's own options and their defaults; an option of a mode that does not run is a usage error.
_MODE_DEFAULTS: dict[str, dict[str, Any]] = {
    "fusers": {"sizes": [parse_size(s) for s in DEFAULT_BENCH_SIZES], "repeats": 15, "device": "cpu", "threads": 1,
               "seed": 0},
    "engines": {"config": "coco_yolo3"},
    "coco": {"coco_sizes": [200, 1000, 5000]},
}


def check_args(options: BenchOptions) -> tuple[str, BenchOptions]:
    """The mode that runs ("fusers", "engines" or "coco") and the options with the defaults of that mode's options
    filled in; a :class:`UsageError` names options that only another mode reads."""
    if options.coco and options.engines:
        raise UsageError("--coco and --engines are two different benchmarks; give one of them")
    mode = "coco" if options.coco else "engines" if options.engines else "fusers"
    unused = [
        command_line_flag(name)
        for other, defaults in _MODE_DEFAULTS.items() if other != mode
        for name in defaults if getattr(options, name) is not None
    ]
    if unused:
        what = {"fusers": "the fusers (no --coco, no --engines)", "engines": "--engines", "coco": "--coco"}
        raise UsageError(f"{', '.join(unused)} would not be used: this run times {what[mode]}")
    filled = {name: default for name, default in _MODE_DEFAULTS[mode].items() if getattr(options, name) is None}
    options = dataclasses.replace(options, **filled)
    if mode == "fusers" and options.repeats < 1:
        raise UsageError("--repeats must be at least 1")
    if mode == "fusers" and options.seed < 0:  # numpy's own refusal comes mid-run and names no option
        raise UsageError(f"--seed must be an integer >= 0, got {options.seed}")
    if mode == "fusers":
        from detens.checks import check_device

        try:
            options = dataclasses.replace(options, device=check_device(options.device, "--device"))
        except (TypeError, ValueError) as err:
            raise UsageError(str(err)) from None
    if mode == "coco" and min(options.coco_sizes) < 1:
        raise UsageError(f"--coco-sizes must be at least 1, got {min(options.coco_sizes)}")
    # What these two benchmarks compare against is not a dependency of an installed detens: say what to
    # install before any timing, not with a traceback once the first size has run.
    if mode == "fusers":
        import_extra(
            "ensemble_boxes",
            "detens bench times detens' WBF against ensemble_boxes', which is not installed: pip install "
            "'detens[bench]' (or pip install ensemble-boxes); --coco and --engines do not need it",
        )
    if mode == "engines":
        file_or_shipped_name("--config", options.config)
        import_extra("ray", "detens bench --engines times the Ray engine, which needs ray: pip install 'detens[ray]'")
    return mode, options


@contextlib.contextmanager
def _warnings_only() -> Iterator[None]:
    """The root logger at WARNING for a block, as ``detens fuse --quiet`` has it (the INFO lines of a fuse run
    do not show among bench's), and at its own level again afterwards, so that bench's lines show."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.setLevel(level)


def _no_resume_advice(record: logging.LogRecord) -> bool:
    return not getattr(record, RESUME_ADVICE, False)


@contextlib.contextmanager
def _timed_run_not_resumable() -> Iterator[None]:
    """For a block that runs ``detens fuse`` into a temporary folder: an interrupted run's advice to resume
    it is left out (its folder goes with bench's), and bench says instead that it stopped."""
    from detens.jobs.fuse import logger as fuse_logger

    fuse_logger.addFilter(_no_resume_advice)
    try:
        yield
    except KeyboardInterrupt:
        logger.warning("interrupted: the engine table is not written (nothing of bench's runs is kept)")
        raise
    finally:
        fuse_logger.removeFilter(_no_resume_advice)


def bench_engines(images: str, config: str, work: Path) -> list[dict[str, Any]]:
    """Wall time of ``detens fuse`` over ``images`` per engine (each run from scratch into ``work``),
    and of starting a local Ray cluster; the rows of the engine table."""
    from detens.engines.ray_cache import RayOptions, ray_session
    from detens.jobs.calls import fuse_images
    from detens.sources import list_images

    count = len(list_images(images))
    if not count:
        raise ValueError(f"--engines {images!r}: no images there")
    rows = []

    def timed(label: str, **engine: Any) -> None:
        out = work / label.replace(" ", "_")
        start = time.perf_counter()
        with _warnings_only(), _timed_run_not_resumable():  # a Ctrl-C raises KeyboardInterrupt: bench stops
            try:
                code = fuse_images(config, images, out, overwrite=True, quiet=True, no_vis=True, **engine)
            except ValueError:
                refuse_unreadable_images(images, out)
                raise
        seconds = time.perf_counter() - start
        if code != 0:
            raise RuntimeError(f"detens fuse ({label}) failed with exit status {code}")
        # the images fused, not the files listed: an unreadable one is skipped in no time (fuse refuses a run
        # that reads none, so the rate is never over zero images)
        done = read_json_file(out / "summary.json", "fuse summary")["done"]
        rows.append({"engine": label, "images": done, "seconds": round(seconds, 2),
                     "images_per_s": round(done / seconds, 2)})
        logger.info("%s: %d images in %.1f s", label, done, seconds)

    timed("local")
    start = time.perf_counter()
    # the engine's own session: started once for both runs, and shut down as a run of the engine is
    with ray_session(RayOptions()):
        rows.append({"engine": "ray start-up (local cluster)", "images": 0,
                     "seconds": round(time.perf_counter() - start, 2), "images_per_s": None})
        for actors in (1, 2):
            timed(f"ray {actors} actor{'s' if actors > 1 else ''}", engine="ray", actors=actors)
    return rows


def refuse_unreadable_images(images: str, out: Path) -> None:
    """Raise, naming them, where the fuse run into ``out`` (bench's temporary folder) read none of ``images``:
    its own error names its summary, which goes with the folder.

    Raises:
        ValueError: the run's summary says it fused no image and could not read some.
    """
    from detens.checks import first_few
    from detens.jobs._inputs import unreadable_lines

    summary_path = out / "summary.json"
    if not summary_path.is_file():  # a run stopped before its summary: its error says why
        return
    summary = read_json_file(summary_path, "fuse summary")
    if summary["done"] == 0 and summary.get("unreadable"):
        lines = unreadable_lines(summary["unreadable"])
        raise ValueError(f"no image of --engines {images} could be read; {first_few(lines, 3, '; ')}") from None


def replicate_coco(gt: dict[str, Any], results: list[dict[str, Any]], images: int) -> tuple[dict, list]:
    """``gt`` and ``results`` copied until they hold ``images`` images: copy c shifts every image id (and
    annotation id, annotations without one numbered first) by c times the largest one, so each copy is
    scored like the original. Results on images ``gt`` does not list are left out (the evaluators drop
    them): shifted, their ids could be those of another copy's images."""
    from detens.coco import with_annotation_ids

    originals = gt["images"]
    if not originals:
        raise ValueError("the ground truth has no images to replicate")
    annotations = with_annotation_ids(gt["annotations"])
    original_ids = {int(im["id"]) for im in originals}
    image_step = max(original_ids) + 1
    ann_step = max((int(a["id"]) for a in annotations), default=0) + 1
    copies = -(-images // len(originals))
    out_images, out_anns, out_results = [], [], []
    for c in range(copies):
        out_images += [{**im, "id": int(im["id"]) + c * image_step} for im in originals]
        out_anns += [{**a, "id": int(a["id"]) + c * ann_step, "image_id": int(a["image_id"]) + c * image_step}
                     for a in annotations]
        out_results += [{**r, "image_id": int(r["image_id"]) + c * image_step} for r in results
                        if int(r["image_id"]) in original_ids]
    keep = {int(im["id"]) for im in out_images[:images]}
    return (
        {**gt, "images": out_images[:images], "annotations": [a for a in out_anns if a["image_id"] in keep]},
        [r for r in out_results if r["image_id"] in keep],
    )


def bench_coco(gt_path: str, results_path: str, sizes: list[int]) -> list[dict[str, Any]]:
    """Seconds of :func:`detens.evaluate_coco`'s evaluation per backend and dataset size (the rows of the
    table): each backend scores the same checked input (:func:`detens.coco.check_coco_input`, untimed,
    once per size), so its column is its own work (indexing the ground truth and the results, matching,
    accumulating), not detens' input checks; each runs once on the first image, untimed, before the first
    size (imports, first-call set-up).

    Raises:
        ValueError, TypeError: a file that is not COCO annotations (``gt_path``) or COCO results
            (``results_path``), naming the file and what it lacks.
    """
    from detens.coco import (
        BACKENDS,
        CocoGroundTruth,
        check_coco_input,
        evaluate_checked,
        load_coco_gt,
        load_coco_results,
    )

    # checked as evaluate checks them, before the copies hide which file and entry is wrong
    gt = load_coco_gt(gt_path).dataset
    if not gt["images"]:
        raise ValueError(f"{gt_path}: the annotation file lists no images; --coco times their evaluation")
    results = load_coco_results(results_path)
    known = {int(im["id"]) for im in gt["images"]}
    absent = sum(int(r["image_id"]) not in known for r in results)
    if absent:  # as evaluate_coco drops them, saying so
        logger.warning("%s: %d of %d results are on images absent from %s; they are left out",
                       results_path, absent, len(results), gt_path)
    warm_up = check_coco_input(*replicate_coco(gt, results, 1), image_ids=[int(gt["images"][0]["id"])])
    for backend in BACKENDS:
        evaluate_checked(warm_up, backend)
    rows = []
    for size in sizes:
        big_gt, big_results = replicate_coco(gt, results, size)
        checked = check_coco_input(big_gt, big_results)
        maps = {}
        for backend in BACKENDS:
            # the same checked input, but a ground truth no backend has indexed yet: each column pays for
            # its own indexes, none inherits the one before it
            fresh = dataclasses.replace(checked, truth=CocoGroundTruth(checked.truth.dataset))
            start = time.perf_counter()
            maps[backend] = evaluate_checked(fresh, backend)["map"]
            seconds = time.perf_counter() - start
            rows.append({"images": size, "results": len(big_results), "backend": backend,
                         "seconds": round(seconds, 3), "map": round(maps[backend], 6)})
            logger.info("%d images, %s: %.2f s", size, backend, seconds)
        if max(maps.values()) - min(maps.values()) > 1e-4:
            raise RuntimeError(f"the backends disagree at {size} images: {maps}")
    return rows


def run(options: BenchOptions) -> int:
    """Run the benchmark the options pick and print its table; returns 0.

    Raises:
        UsageError: options of a benchmark that does not run, or a bad value of one that does.
    """
    mode, options = check_args(options)
    if options.out is not None:
        check_writable_file(options.out, "--out")
        if mode == "coco":
            gt_file, results_file = options.coco
            refuse_outputs_over_inputs([("--out", Path(options.out))], [
                ("--coco's annotation file", Path(gt_file)), ("--coco's results file", Path(results_file))], [])
    if mode == "coco":
        rows = bench_coco(*options.coco, options.coco_sizes)
        print(f"evaluate_coco seconds ({platform.processor() or platform.machine()}); the dataset replicated\n")
        print("| images | results | backend | seconds | mAP |\n|---:|---:|---|---:|---:|")
        for row in rows:
            print(f"| {row['images']} | {row['results']} | {row['backend']} | {row['seconds']:.2f} | {row['map']:.4f} |")
        if options.out:
            atomic_write_json(options.out, {"coco": rows}, indent=2)
        return 0
    if mode == "engines":
        import tempfile

        with tempfile.TemporaryDirectory(prefix="detens-bench-") as work:
            rows = bench_engines(options.engines, options.config, Path(work))
        print(f"`detens fuse --config {options.config}` on {rows[0]['images']} images ({platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} CPUs); seconds include loading the models (per actor on Ray)\n")
        print("| engine | images | seconds | images/s |\n|---|---:|---:|---:|")
        for row in rows:
            print(f"| {row['engine']} | {row['images']} | {row['seconds']:.1f} | {row['images_per_s'] or '-'} |")
        if options.out:
            atomic_write_json(options.out, {"engines": rows}, indent=2)
        return 0
    torch.set_num_threads(options.threads)
    device = torch.device(options.device)

    results = []
    started = time.perf_counter()
    for num_models, boxes_per_model in options.sizes:
        repeats = options.repeats if num_models * boxes_per_model <= 5000 else max(1, options.repeats // 3)
        logger.info("timing %dx%d on %d images ...", num_models, boxes_per_model, repeats)
        results.append(bench_size(num_models, boxes_per_model, repeats, device, options.seed))
    elapsed = time.perf_counter() - started

    command = shlex.join(options.command_line) if options.command_line else "detens bench (called from Python)"
    environment = (
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch thread(s), "
        f"device {device}, torch {torch.__version__}, {NUM_CLASSES} classes, image {IMAGE_SIZE[1]}×{IMAGE_SIZE[0]}"
    )
    print(f"Per-image median fusion time ({environment}); `{command}`, {elapsed:.0f} s in all.\n")
    print(markdown_table(results))
    print(f"\ndetens wbf vs ensemble_boxes on these images (no two scores tie): same boxes, largest difference "
          f"(normalized boxes and scores) {max(r['wbf_max_abs_diff_vs_ensemble_boxes'] for r in results):.1e}, "
          f"within {SAME_BOXES_TOLERANCE:.0e}")
    if options.out:
        atomic_write_json(
            options.out,
            {"command": command, "environment": environment, "seconds": elapsed, "results": results},
            indent=2,
        )
    return 0
