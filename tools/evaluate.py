#!/usr/bin/env python
"""Compare fusion methods on saved predictions with K-fold cross-validation over images.

    python tools/evaluate.py --gt instances.json --predictions predictions/ \\
        --methods single,nms,soft_nms,wbf,wbf_tuned,vote,mean,theta --cv 2 --seed 0 \\
        --out report.json [--plot report.png]

``single`` expands to every model of the folder. Learned and tuned methods (``wbf_tuned``, ``theta`` and
the heads) are fitted on K−1 folds and predict the held-out fold; all held-out predictions are pooled into
one COCO evaluation. Folds are by image, fixed by ``--seed``, identical for every method.

Prints a Markdown table; writes ``{method: {metric: value}}`` to ``--out`` and what each fold's fit chose
(tuned thresholds, learned weights) to ``<out>.fitted.json``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

try:
    import detens  # noqa: F401
except ImportError:  # run from a clone without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from detens.coco import load_coco_gt
from detens.config import from_dict
from detens.evaluation import METHODS, MethodResult, cross_validate
from detens.io import atomic_write_json
from detens.predictions import EnsemblePredictions
from detens.report import markdown_table, plot_report
from detens.training import ThetaTrainConfig

logger = logging.getLogger("detens.evaluate")
REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gt", required=True, help="COCO annotation file")
    parser.add_argument("--predictions", required=True, help="folder of <model>.json COCO results")
    parser.add_argument(
        "--methods",
        default="single,nms,soft_nms,wbf,wbf_tuned,vote,mean,theta",
        help=f"comma-separated; 'single' expands to every model; 'head:PATH' scores a head file trained elsewhere "
        f"(known: {', '.join(METHODS.names())})",
    )
    parser.add_argument("--models", help="comma-separated model names (default: every file, sorted)")
    parser.add_argument("--cv", type=int, default=2, help="number of folds (K)")
    parser.add_argument("--seed", type=int, default=0, help="fixes the folds")
    parser.add_argument("--theta-config", default=str(REPO / "configs/train/theta.yaml"), help="training YAML of theta")
    parser.add_argument("--backend", default="pycocotools", choices=["pycocotools", "faster"])
    parser.add_argument("--out", required=True, help="JSON report {method: {metric: value}}")
    parser.add_argument("--plot", help="bar chart PNG")
    parser.add_argument(
        "--threads", type=int, default=1,
        help="torch intra-op threads (default 1: fusion works on tensors of a few hundred boxes, where thread "
        "hand-offs cost more than they save)",
    )
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s")
    torch.set_num_threads(max(1, args.threads))

    gt = load_coco_gt(args.gt)
    models = args.models.split(",") if args.models else None
    predictions = EnsemblePredictions.from_folder(args.predictions, gt, models=models)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    options = {}
    if "theta" in methods:
        import yaml

        theta_yaml = yaml.safe_load(Path(args.theta_config).read_text()) or {}
        options["theta"] = {"config": from_dict(ThetaTrainConfig, theta_yaml, where=args.theta_config)}

    def on_method(name: str, result: MethodResult) -> None:
        print(f"{name:>22}: mAP {result.metrics['map']:.4f}  AP50 {result.metrics['map50']:.4f}", flush=True)

    logger.info(
        "%d models %s, %d images with ground truth, %d-fold CV (seed %d)",
        predictions.num_models, predictions.model_names, len(gt.annotated_image_ids), args.cv, args.seed,
    )
    report = cross_validate(
        predictions, methods, k=args.cv, seed=args.seed, backend=args.backend, method_options=options,
        on_method=on_method,
    )
    table = {name: result.metrics for name, result in report.items()}
    out = Path(args.out)
    atomic_write_json(out, table, indent=1)
    atomic_write_json(out.with_name(out.stem + ".fitted.json"),
                      {name: result.fitted for name, result in report.items() if result.fitted}, indent=1)
    if args.plot:
        plot_report(table, args.plot, title=f"COCO mAP, {args.cv}-fold CV, models: {', '.join(predictions.model_names)}")
    print()
    print(markdown_table(table))
    print(f"\nreport: {out}" + (f", plot: {args.plot}" if args.plot else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
