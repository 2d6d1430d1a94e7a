"""Per-image fusion time: detens vs ensemble_boxes vs one torchvision NMS, on the same synthetic images.

    detens bench [--sizes 3x100 3x300 5x1000 5x3000] [--repeats 15] [--device cpu]
                          [--threads 1] [--out results.json]

For each size ``NxK`` (N models, K boxes per model, 80 classes) it builds ``--repeats`` synthetic images
and times, per image (median over the images):

- ``detens wbf``: ``detens.fuse(per_model, "wbf")`` (its compiled clustering loop, the CPU default);
- ``match+theta``: ``detens.fuse(per_model, "theta", head=ThetaHead(model_names))``, i.e. ``detens.match``
  then the Θ head;
- ``match+deep``: ``detens.fuse(per_model, "deep", head=DeepEnsembleHead(model_names, box="learned",
  median_box=True))``, ``detens.match`` then the network head ``make demo`` ships (its features, score
  network and learned box; untrained weights cost what trained ones do);
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
ensemble_boxes is not a dependency of detens: ``pip install 'detens[bench]'`` (or ``pip install ensemble-boxes``).

    detens bench --coco GT RESULTS [--coco-sizes 200 1000 5000] [--out results.json]

times COCO evaluation instead: each evaluator of ``detens.evaluate_coco`` (``--backend`` of ``detens
evaluate``) on the annotations and results replicated to each size. The input is checked once per size,
untimed (detens' checks are the same for every evaluator and would blur their differences), and each
evaluator runs once on one image first, untimed (imports, first-call set-up); a column is the evaluator's
own work, indexing the ground truth and results included.
"""

from __future__ import annotations

import argparse

from detens.catalogue import DEFAULT_BENCH_SIZES, MAX_BENCH_BOXES
from detens.cli import argparse_type, integer, output_file, positive_int, run_command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # The options of one mode default to None here (the real defaults are _MODE_DEFAULTS) so that an option
    # given for a mode that does not run can be told apart from its default, and rejected.
    parser.add_argument("--sizes", nargs="+", type=argparse_type("detens.jobs.bench", "parse_size"),
                        help=f"NxK: N models, K boxes per model, N x K at most {MAX_BENCH_BOXES:,} "
                             f"(default: {' '.join(DEFAULT_BENCH_SIZES)})")
    parser.add_argument("--repeats", type=integer,
                        help="images per size; sizes above 5000 boxes use a third of them (default: 15)")
    parser.add_argument("--device", help="device of the input Detections (default: cpu)")
    parser.add_argument("--threads", type=positive_int, help="torch intra-op threads (default: 1)")
    parser.add_argument("--seed", type=integer, help="seed of the synthetic images (default: 0)")
    parser.add_argument("--out", type=output_file, help="also write the results as JSON (atomic write)")
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
    parser.add_argument("--coco-sizes", nargs="+", type=integer,
                        help="with --coco: the image counts (default: 200 1000 5000)")


def run(args: argparse.Namespace) -> int:
    from detens.jobs.bench import BenchOptions, run

    return run(BenchOptions.from_namespace(args))


def main(argv: list[str] | None = None) -> int:
    return run_command("bench", argv)
