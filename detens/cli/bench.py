"""Per-image fusion time: detens vs ensemble_boxes vs one torchvision NMS, on the same synthetic images.

    detens bench [--sizes 3x100 3x300 5x1000 5x3000] [--repeats 15] [--device cpu]
                          [--threads 1] [--out results.json]

For each size ``NxK`` (N models, K boxes per model, 80 classes) it builds ``--repeats`` synthetic images
and times, per image (median over the images):

- ``detens wbf``: ``detens.fuse(per_model, "wbf")`` (its compiled clustering loop, the CPU default);
- ``match+theta``: ``detens.fuse(per_model, "theta", head=ThetaHead(model_names))``, i.e. ``detens.match``
  then the Θ head (rows fall back to ``match+mean``, clearly labelled, if ThetaHead cannot be imported);
- ``ensemble_boxes``: ``weighted_boxes_fusion`` fed normalized lists of lists (the conversion from
  Detections is done beforehand and not timed);
- ``match, tensor path``: ``detens.match(per_model, backend="tensor")`` alone, the formulation GPUs use
  (on the CPU, ``match`` runs its compiled loop; both give the same clusters);
- ``batched_nms``: one ``torchvision.ops.batched_nms`` over the concatenated boxes of all models (the
  floor for any fusion; the concatenation is timed too).

Each method runs once on an untimed warm-up image first. The ratios are of medians measured in the same
run. Timing is single-threaded by default (``--threads 1``): fusing one image is a chain of small
operations that intra-op threads do not speed up (ensemble_boxes is single-threaded numpy anyway), and
on a shared, busy machine idle-spinning torch worker threads slow everything down. Real pipelines
parallelize across images instead.

Synthetic images (``synthetic_image``), 480×640 pixels, 80 classes:

- ``clip(K // 40, 5, 75)`` ground-truth objects, classes drawn from a Zipf-like distribution
  (p(c) ∝ 1/(c+1): a few frequent classes, as in COCO), sizes log-uniform from 2% to 50% of the image
  side, centres uniform;
- every model has its own localization noise (σ from 4% to 10% of the object size);
- 60% of a model's K boxes lie on objects: for each object one "true" detection (score ~ Beta(8, 2))
  if the model finds it (probability 0.9), the rest duplicates on random objects with more jitter and
  low scores (~ Beta(1.5, 6)); a box carries the object's class with probability 0.7, else a class
  drawn from the class distribution (confusion);
- the other 40% are background clutter: random position and size, a class from the class distribution,
  scores ~ Beta(1, 8).

So boxes of different models cluster around shared objects (each object draws tens to hundreds of
same-class boxes at the larger sizes), as in the low-confidence outputs of real detectors.
``--device`` must be a device this machine has (checked with the other options, before any timing).
ensemble_boxes is not a dependency of detens: ``pip install ensemble-boxes`` (it comes with ``detens[dev]``).

    detens bench --coco GT RESULTS [--coco-sizes 200 1000 5000] [--out results.json]

times COCO evaluation instead: each evaluator of ``detens.evaluate_coco`` (``--backend`` of ``detens
evaluate``) on the annotations and results replicated to each size. The input is checked once per size,
untimed (detens' checks are the same for every evaluator and would blur their differences), and each
evaluator runs once on one image first, untimed (imports, first-call set-up); a column is the evaluator's
own work, indexing the ground truth and results included.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import platform
import shlex
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detens import Detections, match
from detens.cli import positive_int
from detens.extras import import_extra
from detens.fusers import fuse
from detens.io import atomic_write_json, check_writable_file
from detens.jobs._options import UsageError, file_or_shipped_name

logger = logging.getLogger("bench")

IMAGE_SIZE = (480, 640)
NUM_CLASSES = 80
DEFAULT_SIZES = ("3x100", "3x300", "5x1000", "5x3000")
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


def _methods(num_models: int) -> tuple[dict[str, Callable[[list[Detections]], Any]], str]:
    from torchvision.ops import batched_nms

    names = [f"model{i}" for i in range(num_models)]
    try:
        from detens.heads.theta import ThetaHead

        head = ThetaHead(names)
        learned_name = "match+theta"
    except ImportError as err:  # pragma: no cover - only while the head is being written
        logger.warning("ThetaHead unavailable (%s): timing match + mean instead", err)
        head, learned_name = None, "match+mean (ThetaHead missing)"

    def learned(per_model: list[Detections]) -> Any:
        if head is None:
            return fuse(per_model, "mean")
        return fuse(per_model, "theta", head=head)

    def floor(per_model: list[Detections]) -> Any:
        all_boxes = Detections.concat(per_model)
        return batched_nms(all_boxes.boxes, all_boxes.scores, all_boxes.labels, 0.5)

    def tensor_match(per_model: list[Detections]) -> Any:
        return match(per_model, backend="tensor")

    methods = {"detens wbf": lambda pm: fuse(pm, "wbf"), learned_name: learned, TENSOR_MATCH: tensor_match}
    return {**methods, "batched_nms": floor}, learned_name


def bench_size(num_models: int, boxes_per_model: int, repeats: int, device: torch.device, seed: int) -> dict[str, Any]:
    from ensemble_boxes import weighted_boxes_fusion

    rng = np.random.default_rng(seed)
    images = [synthetic_image(rng, num_models, boxes_per_model) for _ in range(repeats + 1)]
    methods, learned_name = _methods(num_models)
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
        max_diff = max(max_diff, float(np.abs(ours - theirs).max(initial=0.0)))
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {
        "size": f"{num_models}x{boxes_per_model}",
        "num_models": num_models,
        "boxes_per_model": boxes_per_model,
        "images": repeats,
        "learned_name": learned_name,
        "median_ms": medians,
        "all_ms": times,
        "wbf_max_abs_diff_vs_ensemble_boxes": max_diff,
        "ratios": {
            "ensemble_boxes / detens wbf": medians["ensemble_boxes"] / medians["detens wbf"],
            "detens wbf / batched_nms": medians["detens wbf"] / medians["batched_nms"],
            f"ensemble_boxes / {learned_name}": medians["ensemble_boxes"] / medians[learned_name],
            f"{learned_name} / batched_nms": medians[learned_name] / medians["batched_nms"],
        },
    }


def markdown_table(results: list[dict[str, Any]]) -> str:
    learned = results[0]["learned_name"]
    header = (
        f"| boxes per image (models × boxes) | detens wbf | {learned} | {TENSOR_MATCH} | ensemble_boxes wbf "
        f"| batched_nms | ensemble_boxes / detens wbf | detens wbf / batched_nms | ensemble_boxes / {learned} "
        f"| {learned} / batched_nms |"
    )
    lines = [header, "|" + "---|" * 10]
    for r in results:
        m, q = r["median_ms"], r["ratios"]
        lines.append(
            f"| {r['size']} | {m['detens wbf']:.1f} ms | {m[learned]:.1f} ms | {m[TENSOR_MATCH]:.1f} ms "
            f"| {m['ensemble_boxes']:.1f} ms | {m['batched_nms']:.1f} ms | {q['ensemble_boxes / detens wbf']:.1f}× "
            f"| {q['detens wbf / batched_nms']:.2f}× | {q[f'ensemble_boxes / {learned}']:.1f}× "
            f"| {q[f'{learned} / batched_nms']:.2f}× |"
        )
    return "\n".join(lines)


def parse_size(text: str) -> tuple[int, int]:
    try:
        models, boxes = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must look like 5x1000 (models x boxes per model), got {text!r}") from None
    if models < 1 or boxes < 1:
        raise argparse.ArgumentTypeError(f"size needs at least 1 model and 1 box, got {text!r}")
    return models, boxes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # The options of one mode default to None here (the real defaults are _MODE_DEFAULTS) so that an option
    # given for a mode that does not run can be told apart from its default, and rejected.
    parser.add_argument("--sizes", nargs="+", type=parse_size,
                        help=f"NxK: N models, K boxes per model (default: {' '.join(DEFAULT_SIZES)})")
    parser.add_argument("--repeats", type=int,
                        help="images per size; sizes above 5000 boxes use a third of them (default: 15)")
    parser.add_argument("--device", help="device of the input Detections (default: cpu)")
    parser.add_argument("--threads", type=positive_int, help="torch intra-op threads (default: 1)")
    parser.add_argument("--seed", type=int, help="seed of the synthetic images (default: 0)")
    parser.add_argument("--out", type=Path, help="also write the results as JSON (atomic write)")
    parser.add_argument(
        "--engines", metavar="IMAGES",
        help="instead of the fusers: time `detens fuse` on this image folder with the local engine and with "
        "Ray (1 and 2 actors), and Ray's start-up",
    )
    parser.add_argument("--config", help="with --engines: the ensemble (default: coco_yolo3)")
    parser.add_argument(
        "--coco", nargs=2, metavar=("GT", "RESULTS"),
        help="instead of the fusers: time evaluate_coco's evaluators (the input checked beforehand, untimed) on "
        "the dataset replicated to 200, 1000 and 5000 images (COCO annotations and a results file of them)",
    )
    parser.add_argument("--coco-sizes", nargs="+", type=int,
                        help="with --coco: the image counts (default: 200 1000 5000)")


# Each mode's own options and their defaults; an option of a mode that does not run is a usage error.
_MODE_DEFAULTS: dict[str, dict[str, Any]] = {
    "fusers": {"sizes": [parse_size(s) for s in DEFAULT_SIZES], "repeats": 15, "device": "cpu", "threads": 1,
               "seed": 0},
    "engines": {"config": "coco_yolo3"},
    "coco": {"coco_sizes": [200, 1000, 5000]},
}


def check_args(args: argparse.Namespace) -> str:
    """The mode that runs ("fusers", "engines" or "coco"), with the defaults of its options filled in; a
    :class:`UsageError` names options that only another mode reads."""
    if args.coco and args.engines:
        raise UsageError("--coco and --engines are two different benchmarks; give one of them")
    mode = "coco" if args.coco else "engines" if args.engines else "fusers"
    unused = [
        f"--{name.replace('_', '-')}"
        for other, options in _MODE_DEFAULTS.items() if other != mode
        for name in options if getattr(args, name) is not None
    ]
    if unused:
        what = {"fusers": "the fusers (no --coco, no --engines)", "engines": "--engines", "coco": "--coco"}
        raise UsageError(f"{', '.join(unused)} would not be used: this run times {what[mode]}")
    for name, default in _MODE_DEFAULTS[mode].items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if mode == "fusers" and args.repeats < 1:
        raise UsageError("--repeats must be at least 1")
    if mode == "fusers":
        from detens.checks import check_device

        try:
            args.device = check_device(args.device, "--device")
        except (TypeError, ValueError) as err:
            raise UsageError(str(err)) from None
    if mode == "coco" and min(args.coco_sizes) < 1:
        raise UsageError(f"--coco-sizes must be at least 1, got {min(args.coco_sizes)}")
    # What these two benchmarks compare against is not a dependency of an installed detens: say what to
    # install before any timing, not with a traceback once the first size has run.
    if mode == "fusers":
        import_extra(
            "ensemble_boxes",
            "detens bench times detens' WBF against ensemble_boxes', which is not installed: pip install "
            "ensemble-boxes (it comes with 'detens[dev]'); --coco and --engines do not need it",
        )
    if mode == "engines":
        file_or_shipped_name("--config", args.config)
        import_extra("ray", "detens bench --engines times the Ray engine, which needs ray: pip install 'detens[ray]'")
    return mode


def bench_engines(images: str, config: str, work: Path) -> list[dict[str, Any]]:
    """Wall time of ``detens fuse`` over ``images`` per engine (each run from scratch into ``work``),
    and of starting a local Ray cluster; the rows of the engine table."""
    import ray

    from detens.cli import run_command
    from detens.sources import list_images

    count = len(list_images(images))
    if not count:
        raise ValueError(f"--engines {images!r}: no images there")
    rows = []

    def timed(label: str, *extra: str) -> None:
        out = work / label.replace(" ", "_")
        start = time.perf_counter()
        code = run_command("fuse", ["--config", config, "--source", images, "--out", str(out), "--overwrite",
                                    "--quiet", "--no-vis", *extra])
        seconds = time.perf_counter() - start
        if code != 0:
            raise RuntimeError(f"detens fuse ({label}) failed with exit status {code}")
        rows.append({"engine": label, "images": count, "seconds": round(seconds, 2),
                     "images_per_s": round(count / seconds, 2)})
        logger.info("%s: %d images in %.1f s", label, count, seconds)

    timed("local")
    start = time.perf_counter()
    ray.init(include_dashboard=False, log_to_driver=False)
    rows.append({"engine": "ray start-up (local cluster)", "images": 0,
                 "seconds": round(time.perf_counter() - start, 2), "images_per_s": None})
    try:
        for actors in (1, 2):
            timed(f"ray {actors} actor{'s' if actors > 1 else ''}", "--engine", "ray", "--actors", str(actors))
    finally:
        ray.shutdown()
    return rows


def replicate_coco(gt: dict[str, Any], results: list[dict[str, Any]], images: int) -> tuple[dict, list]:
    """``gt`` and ``results`` copied until they hold ``images`` images: copy c shifts every image id (and
    annotation id, annotations without one numbered first) by c times the largest one, so each copy is
    scored like the original."""
    from detens.coco import with_annotation_ids

    originals = gt["images"]
    if not originals:
        raise ValueError("the ground truth has no images to replicate")
    annotations = with_annotation_ids(gt["annotations"])
    image_step = max(int(im["id"]) for im in originals) + 1
    ann_step = max((int(a["id"]) for a in annotations), default=0) + 1
    copies = -(-images // len(originals))
    out_images, out_anns, out_results = [], [], []
    for c in range(copies):
        out_images += [{**im, "id": int(im["id"]) + c * image_step} for im in originals]
        out_anns += [{**a, "id": int(a["id"]) + c * ann_step, "image_id": int(a["image_id"]) + c * image_step}
                     for a in annotations]
        out_results += [{**r, "image_id": int(r["image_id"]) + c * image_step} for r in results]
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


def run(args: argparse.Namespace) -> int:
    mode = check_args(args)
    if args.out is not None:
        check_writable_file(args.out, "--out")
    if mode == "coco":
        rows = bench_coco(*args.coco, args.coco_sizes)
        print(f"evaluate_coco seconds ({platform.processor() or platform.machine()}); the dataset replicated\n")
        print("| images | results | backend | seconds | mAP |\n|---:|---:|---|---:|---:|")
        for row in rows:
            print(f"| {row['images']} | {row['results']} | {row['backend']} | {row['seconds']:.2f} | {row['map']:.4f} |")
        if args.out:
            atomic_write_json(args.out, {"coco": rows}, indent=2)
        return 0
    if mode == "engines":
        import tempfile

        with tempfile.TemporaryDirectory(prefix="detens-bench-") as work:
            rows = bench_engines(args.engines, args.config, Path(work))
        print(f"`detens fuse --config {args.config}` on {rows[0]['images']} images ({platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} CPUs); seconds include loading the models (per actor on Ray)\n")
        print("| engine | images | seconds | images/s |\n|---|---:|---:|---:|")
        for row in rows:
            print(f"| {row['engine']} | {row['images']} | {row['seconds']:.1f} | {row['images_per_s'] or '-'} |")
        if args.out:
            atomic_write_json(args.out, {"engines": rows}, indent=2)
        return 0
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    results = []
    started = time.perf_counter()
    for num_models, boxes_per_model in args.sizes:
        repeats = args.repeats if num_models * boxes_per_model <= 5000 else max(1, args.repeats // 3)
        logger.info("timing %dx%d on %d images ...", num_models, boxes_per_model, repeats)
        results.append(bench_size(num_models, boxes_per_model, repeats, device, args.seed))
    elapsed = time.perf_counter() - started

    command_line = getattr(args, "_command_line", None)
    command = shlex.join(command_line) if command_line else "detens bench (called from Python)"
    environment = (
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch thread(s), "
        f"device {device}, torch {torch.__version__}, {NUM_CLASSES} classes, image {IMAGE_SIZE[1]}×{IMAGE_SIZE[0]}"
    )
    print(f"Per-image median fusion time ({environment}); `{command}`, {elapsed:.0f} s in all.\n")
    print(markdown_table(results))
    print(f"\ndetens wbf vs ensemble_boxes: same boxes, largest difference (normalized boxes and scores) "
          f"{max(r['wbf_max_abs_diff_vs_ensemble_boxes'] for r in results):.1e}")
    if args.out:
        atomic_write_json(
            args.out,
            {"command": command, "environment": environment, "seconds": elapsed, "results": results},
            indent=2,
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    from detens.cli import run_command

    return run_command("bench", argv)
