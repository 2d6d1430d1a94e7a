"""Compare fusion methods on saved predictions with K-fold cross-validation over images.

    detens evaluate --gt instances.json --predictions predictions/ \\
        --methods single,nms,soft_nms,wbf,wbf_tuned,vote,mean,theta --cv 2 --seed 0 \\
        --out report.json [--plot report.png]

``single`` expands to every model of the folder. Learned and tuned methods (``wbf_tuned``, ``theta`` and
the heads) are fitted on K−1 folds and predict the held-out fold; all held-out predictions are pooled into
one COCO evaluation. Folds are by image, fixed by ``--seed``, identical for every method.

More fitting data, for every learned and tuned method alike (``wbf_tuned`` included):

    --also-fit-on GT PREDICTIONS   another dataset's annotations and prediction folder, joined to the
                                   fitting side of every fold; never scored
    --fit-on GT PREDICTIONS --cv 0 no cross-validation: fit on that dataset alone and score every image
                                   of --gt (a validation split to fit on, a test split to report)

The extra dataset must have the same categories and every model (file order does not matter).

Prints a Markdown table; writes ``{method: {metric: value}}`` to ``--out`` (rewritten as each method
finishes, so an interrupted run keeps its finished rows) and what each fold's fit chose
(tuned thresholds, learned weights) to ``<out>.fitted.json`` and each method's reliability bins (score vs
true-positive rate at IoU 0.5) to ``<out>.calibration.json``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

from detens.cli import UsageError, run_command
from detens.coco import BACKENDS, load_coco_gt
from detens.config import load_yaml_config
from detens.evaluation import METHODS, MethodResult, check_method_names, cross_validate
from detens.heads import TRAINERS
from detens.io import atomic_write_json
from detens.packaged import find_packaged
from detens.predictions import EnsemblePredictions
from detens.report import markdown_table, plot_reliability, plot_report

logger = logging.getLogger("detens.evaluate")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gt", required=True, help="COCO annotation file")
    parser.add_argument("--predictions", required=True, help="folder of <model>.json COCO results")
    parser.add_argument(
        "--methods",
        default="single,nms,soft_nms,wbf,wbf_tuned,vote,mean,theta",
        help=f"comma-separated; 'single' expands to every model; 'head:PATH' scores a head file trained elsewhere "
        f"(known: {', '.join(METHODS.names())})",
    )
    parser.add_argument("--models", help="comma-separated model names (default: every file, sorted)")
    parser.add_argument("--cv", type=int, default=2, help="number of folds (K >= 2), or 0 with --fit-on")
    extra = parser.add_mutually_exclusive_group()
    extra.add_argument(
        "--also-fit-on", nargs=2, metavar=("GT", "PREDICTIONS"),
        help="annotations and prediction folder of more fitting images, joined to every fold's fitting side",
    )
    extra.add_argument(
        "--fit-on", nargs=2, metavar=("GT", "PREDICTIONS"),
        help="with --cv 0: fit learned and tuned methods on this dataset only, score every image of --gt",
    )
    parser.add_argument("--seed", type=int, default=0, help="fixes the folds")
    parser.add_argument(
        "--train-config", action="append", default=[], metavar="METHOD=YAML",
        help="training config of a learned method (e.g. theta=configs/train/theta.yaml; repeatable); "
        "default: the head's code defaults, which configs/train/<head>.yaml mirror",
    )
    parser.add_argument("--backend", default="pycocotools", choices=BACKENDS,
                        help="COCO evaluator of the reported figures (default: %(default)s, the reference; "
                        "tuning inside the folds uses the fastest installed one)")
    parser.add_argument("--out", required=True, help="JSON report {method: {metric: value}}")
    parser.add_argument("--plot", help="bar chart PNG")
    parser.add_argument(
        "--reliability", help="reliability diagram PNG: per method, score vs true-positive rate at IoU 0.5 (10 bins)"
    )
    parser.add_argument(
        "--threads", type=int, default=1,
        help="torch intra-op threads (default 1: fusion works on tensors of a few hundred boxes, where thread "
        "hand-offs cost more than they save)",
    )


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(max(1, args.threads))
    if args.cv < 0 or args.cv == 1:
        raise UsageError(f"--cv must be the number of folds (>= 2), or 0 with --fit-on; got {args.cv}")
    if (args.cv == 0) != (args.fit_on is not None):
        raise UsageError("--cv 0 and --fit-on go together: without cross-validation the fitting data is --fit-on's")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    check_method_names(methods)
    gt = load_coco_gt(args.gt)
    models = args.models.split(",") if args.models else None
    predictions = EnsemblePredictions.from_folder(args.predictions, gt, models=models)
    fit_on = None
    if args.also_fit_on or args.fit_on:
        fit_gt, fit_folder = args.also_fit_on or args.fit_on
        fit_on = EnsemblePredictions.from_folder(fit_folder, load_coco_gt(fit_gt), models=predictions.model_names)
    options = {}
    for item in args.train_config:
        method, _, path = item.partition("=")
        if method not in TRAINERS or not path:
            raise UsageError(f"--train-config takes HEAD=YAML with HEAD one of {', '.join(sorted(TRAINERS))}, got {item!r}")
        options[method] = {"config": load_yaml_config(TRAINERS[method].config_class, find_packaged(path, "train"))}

    out = Path(args.out)
    finished: dict[str, MethodResult] = {}

    def on_method(name: str, result: MethodResult) -> None:
        chose = ""
        if name == "wbf_tuned":
            chose = "  chose " + "; ".join(
                f"iou_thr {f['iou_thr']}, {f['conf_type']}, weights {f['weights']}" for f in result.fitted
            )
        print(f"{name:>22}: mAP {result.metrics['map']:.4f}  AP50 {result.metrics['map50']:.4f}{chose}", flush=True)
        finished[name] = result
        # every finished row is on disk at once: a failure or a kill later loses none of them
        atomic_write_json(out, {n: r.metrics for n, r in finished.items()}, indent=1)

    protocol = f"{args.cv}-fold CV (seed {args.seed})" if args.cv else "no CV"
    if fit_on is not None:
        protocol += f", fitting on {len(fit_on.gt.annotated_image_ids)} images of {Path(fit_gt).parent.name}" + (
            " too" if args.cv else ""
        )
    logger.info(
        "%d models %s, %d images with ground truth, %s",
        predictions.num_models, predictions.model_names, len(gt.annotated_image_ids), protocol,
    )
    report = cross_validate(
        predictions, methods, k=args.cv, seed=args.seed, backend=args.backend, method_options=options,
        on_method=on_method, fit_on=fit_on,
    )
    table = {name: result.metrics for name, result in report.items()}
    atomic_write_json(out, table, indent=1)
    atomic_write_json(out.with_name(out.stem + ".fitted.json"),
                      {name: result.fitted for name, result in report.items() if result.fitted}, indent=1)
    atomic_write_json(out.with_name(out.stem + ".calibration.json"),
                      {name: result.calibration for name, result in report.items()}, indent=1)
    if args.plot:
        plot_report(table, args.plot, title=f"COCO mAP, {protocol}, models: {', '.join(predictions.model_names)}")
    if args.reliability:
        plot_reliability({name: result.calibration for name, result in report.items()}, args.reliability,
                         title=f"Reliability (TP at IoU 0.5), {protocol}")
    print()
    print(markdown_table(table))
    print(f"\nreport: {out}" + "".join(f", {what}: {path}" for what, path in
                                        (("plot", args.plot), ("reliability", args.reliability)) if path))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command("evaluate", argv)
