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
    --fit-on GT PREDICTIONS --cv 0 no cross-validation: fit on that dataset alone and score every
                                   annotated image of --gt (a validation split to fit on, a test split
                                   to report)

Only images with at least one annotation are scored and fitted on (crowd regions count): an image of
``--gt`` without annotations is left out, so its false positives cost nothing, and the table can be
higher than a COCOeval over every image of the file. The log says how many images that leaves out.
``--all-images`` keeps them, as that COCOeval does: they are scored (their detections are false
positives) and learned and tuned methods fit on them as negative images, those of the fitting data
(``--also-fit-on``, ``--fit-on``) too. They join the folds apart, dealt by the same seed after the
annotated images, which keep the folds of a run without the flag.

The extra dataset must have the same categories and every model (file order does not matter), and no
annotated image of ``--gt``: an image both hold would be fitted on and scored. Across the two files an
image is identified by its ``file_name`` without folders (ids are per file); sharing one is an error.

Images the cache could not read (each member's ``unreadable`` in the folder's ``cache_summary.json``)
are left out of scoring and fitting, for every member alike (the ensemble never saw them whole), with a
warning that names them; the record (below) lists them under ``meta.left_out``, those of the fitting data
under ``meta.fit_on.left_out`` (with several seeds, which write no record, ``<out>.run.json`` does). An
error if that leaves no annotated image.

Repeated cross-validation: ``--seed 0,1,2`` runs the whole comparison once per seed (other folds each
time) and reports every metric's mean over the seeds, the mAP's standard deviation over them (``mAP sd``)
and each seed's mAP (``map_by_seed`` in ``--out``). On a few hundred images the split alone moves a
method by a few tenths of a point; the repeats show whether a gap between two methods survives it.
``<out>.fitted.json`` holds each seed's fits, ``<out>.run.json`` how the run was made (the record's
``meta`` with ``seeds`` and ``folds_by_seed`` for ``seed`` and ``folds``). The record, the report page, the
reliability diagram and ``<out>.calibration.json`` draw one cross-validation: run one seed for them.

Prints a Markdown table; writes ``{method: {metric: value}}`` to ``--out``, what each fold's fit chose
(tuned thresholds, learned weights) to ``<out>.fitted.json`` and each method's reliability bins (score vs
true-positive rate at IoU 0.5) to ``<out>.calibration.json``.

The files of a run replace those of an earlier run with the same ``--out`` only once every method has
run, ``--out`` last, so a run that fails or is interrupted leaves the earlier run's files as they were.
Its finished rows are not lost: ``<out>.partial.json`` holds them (``--out``'s form; the means of the
seeds done so far with several seeds), rewritten as each method (seed) finishes and removed when the run
completes; a run starts by removing an earlier run's, so the rows there are always the running one's. ``detens report`` refuses a table that its record's run did not write.
Two outputs on one file (``--plot`` on ``--out``, an ``--out`` named like its record) and an output on an
input (``--gt``, a JSON file of a prediction folder, a head file) are errors before the evaluation runs, as is
a new ``.json`` output in a prediction folder (every later run would read it as a member's predictions).

How much of a gap is the sample of images: ``--bootstrap B`` draws the scored images with replacement B
times (fixed by ``--seed``), scores every method on the same draws and writes ``<out>.bootstrap.json``:
per method its mAP's mean, standard deviation and 95 % interval over the draws, and the same of its
difference to ``--bootstrap-against`` (default: the first method), with the share of draws where it is
above, and ``draws``, the number of draws these figures are over: a draw of images with crowd regions
only has no AP to measure and is left out, with a warning. A second table prints the spreads and the
differences. Needs one ``--seed``. The mean over draws is not the mAP (a class a draw misses leaves that
draw's average); read the spreads and the paired differences.

With one seed it also saves ``<out>.evaluation.json.gz``: the scored images' ground truth, the table, and
the pooled held-out predictions of every method and member (a few MB per method), from which ``detens
report`` rebuilds the report page later without fitting or fusing again. ``--report DIR`` writes
that page now: ``DIR/index.html`` with its PNGs (metrics, precision-recall curves, per-class AP changes,
TIDE error breakdown, calibration, member votes, and images where fusion helped and hurt most, drawn from
``--images``, by default the ``images`` folder beside ``--gt``: every scored image must be there, readable
and of the size the ground truth gives it, which is checked (each image decoded once) before the evaluation
runs) and ``DIR/page.json``, the numbers on it. The table may sit in ``DIR`` (``--out DIR/report.json``);
a page file that would land on another output of the run (``--out DIR/page.json``, ``--plot
DIR/map.png``) is an error before the evaluation runs. The curves of
a table scored with ``--backend hotcoco`` are drawn by pycocotools, which agrees with it to 1e-4.
"""

from __future__ import annotations

import argparse
import logging
import shlex
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

import detens
from detens.bootstrap import bootstrap_map, summarize_bootstrap
from detens.cli import add_threads_argument, folder_path, run_command
from detens.coco import BACKENDS, CocoGroundTruth, detections_to_coco, load_coco_gt
from detens.evaluation import (
    METHODS,
    MethodResult,
    check_method_names,
    cross_validate,
    expand_methods,
    head_kind,
    method_names,
    summarize_repeats,
)
from detens.folds import kfold_image_splits
from detens.heads import TRAINERS, load_train_config
from detens.io import atomic_write_json, check_writable_file, check_writable_folder
from detens.jobs._inputs import comma_separated, model_names
from detens.jobs._options import UsageError, file_or_shipped_name
from detens.jobs._outputs import refuse_outputs_over_inputs, refuse_results_in_prediction_folders
from detens.predictions import EnsemblePredictions
from detens.report import REPEATED_COLUMNS, markdown_table, plot_reliability, plot_report
from detens.report.record import EvaluationRecord, partial_path, record_path

logger = logging.getLogger("detens.evaluate")


def parse_seeds(text: str) -> list[int]:
    """``"0"`` or ``"0,1,2"`` → the fold seeds (distinct integers)."""
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seed takes an integer or comma-separated integers (0,1,2), got {text!r}") from None
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"--seed lists a seed twice: {text!r}")
    if any(seed < 0 for seed in seeds):
        raise argparse.ArgumentTypeError(f"--seed takes seeds >= 0, got {text!r}")
    return seeds


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
        help="annotations and prediction folder of more fitting images, joined to every fold's fitting side; "
        "it may not share an annotated image with --gt (same file name, folders aside)",
    )
    extra.add_argument(
        "--fit-on", nargs=2, metavar=("GT", "PREDICTIONS"),
        help="with --cv 0: fit learned and tuned methods on this dataset only, score every annotated image of --gt "
        "(every image with --all-images); "
        "it may not share an annotated image with --gt (same file name, folders aside)",
    )
    parser.add_argument(
        "--all-images", action="store_true",
        help="also score the images without annotations, as a COCOeval over every image of --gt does (their "
        "detections are false positives), and fit on them, and on those of the fitting data, as negative images; "
        "default: only annotated images are scored and fitted on",
    )
    parser.add_argument(
        "--seed", type=parse_seeds, default=[0],
        help="fixes the folds; several (0,1,2) repeat the cross-validation once per seed and report the means",
    )
    parser.add_argument(
        "--train-config", action="append", default=[], metavar="HEAD=YAML",
        help="training config of every method that fits this head type (e.g. theta=configs/train/theta.yaml; "
        "selection=... also configures selection_k1 ... selection_k8; repeatable); "
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
        "--report", type=folder_path, metavar="DIR",
        help="write the report page there (index.html and PNGs; rebuild it later with detens report)",
    )
    parser.add_argument(
        "--images", metavar="DIR",
        help="the images of --gt, for the report's side-by-sides (default: the 'images' folder beside --gt); "
        "with --report it must hold every scored image, as annotated (checked before the evaluation)",
    )
    parser.add_argument(
        "--bootstrap", type=int, default=0, metavar="B",
        help="paired bootstrap over the scored images: B draws, every method scored on the same draws "
        "(<out>.bootstrap.json); 0 = off",
    )
    parser.add_argument(
        "--bootstrap-against", metavar="METHOD",
        help="the method whose mAP the bootstrap subtracts from every other's on each draw (default: the first)",
    )
    add_threads_argument(parser)


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    if args.cv < 0 or args.cv == 1:
        raise UsageError(f"--cv must be the number of folds (>= 2), or 0 with --fit-on; got {args.cv}")
    if (args.cv == 0) != (args.fit_on is not None):
        raise UsageError("--cv 0 and --fit-on go together: without cross-validation the fitting data is --fit-on's")
    methods = comma_separated("--methods", args.methods, "method", "method names", valid=method_names())
    check_method_names(methods)
    for method in methods:
        if method.startswith("head:"):
            file_or_shipped_name(f"--methods {method!r}", method.removeprefix("head:"))
    options, options_by_head = {}, {}
    for item in args.train_config:
        kind, _, path = item.partition("=")
        if kind not in TRAINERS or not path:
            raise UsageError(f"--train-config takes HEAD=YAML with HEAD one of {', '.join(sorted(TRAINERS))}, got {item!r}")
        if kind in options_by_head:
            raise UsageError(f"--train-config {kind}= is given twice; give each head type one file")
        takers = [m for m in methods if head_kind(m) == kind]
        if not takers:
            raise UsageError(f"--train-config {item}: no method of --methods ({', '.join(methods)}) fits a {kind} head")
        config = load_train_config(kind, path)
        options_by_head[kind] = config
        options.update({method: {"config": config} for method in takers})
    for flag, value in (("--out", args.out), ("--plot", args.plot), ("--reliability", args.reliability)):
        if value is not None:
            check_writable_file(Path(value), flag)
    outputs, folders = _outputs(args), _prediction_folders(args)
    _refuse_outputs_on_one_file(outputs)
    refuse_outputs_over_inputs(outputs, _inputs(args, methods), folders)
    if args.report is not None:
        check_writable_folder(args.report, "--report")
        _refuse_a_page_over_outputs(args.report, outputs)
        refuse_results_in_prediction_folders([("the report page's numbers", Path(args.report) / "page.json")], folders)
    if args.images is not None and not Path(args.images).is_dir():
        raise UsageError(f"--images: no such folder: {args.images}")
    if args.bootstrap < 0:
        raise UsageError(f"--bootstrap must be the number of draws (>= 1), or 0 for none; got {args.bootstrap}")
    if args.bootstrap_against is not None and not args.bootstrap:
        raise UsageError("--bootstrap-against needs --bootstrap B")
    if len(args.seed) > 1:
        if args.bootstrap:
            raise UsageError(f"--bootstrap draws one cross-validation's predictions; give it one --seed, not {len(args.seed)}")
        if args.cv == 0:
            raise UsageError("several --seed values repeat the cross-validation, but --cv 0 has no folds to vary")
        for flag, value in (("--report", args.report), ("--reliability", args.reliability), ("--images", args.images)):
            if value is not None:
                raise UsageError(f"{flag} draws one cross-validation's predictions; give it one --seed, not {len(args.seed)}")
    gt = load_coco_gt(args.gt)
    models = model_names(args.models, args.predictions)
    predictions = EnsemblePredictions.from_folder(args.predictions, gt, models=models)
    if not predictions.gt.annotated_image_ids:
        raise UsageError(f"--gt {args.gt} has no annotated image: there is no ground truth to score methods against")
    images = Path(args.images) if args.images else Path(args.gt).parent / "images"
    if args.report and images.is_dir():
        _check_report_images(images, predictions.gt, given=args.images is not None)
    fit_on = None
    if (fitting := _fitting_data(args)) is not None:
        flag, fit_gt, fit_folder = fitting
        fit_on = EnsemblePredictions.from_folder(fit_folder, load_coco_gt(fit_gt), models=predictions.model_names)
        if not fit_on.gt.annotated_image_ids:
            raise UsageError(f"{flag}'s annotation file {fit_gt} has no annotated image to fit on")
    scored = _scored_ids(predictions, args.all_images)

    against = None
    if args.bootstrap:
        names = expand_methods(methods, predictions.model_names)
        against = args.bootstrap_against or names[0]
        if against not in names:
            raise UsageError(f"--bootstrap-against {against!r} is not among the methods run: {', '.join(names)}")

    out = Path(args.out)
    partial = partial_path(out)
    partial.unlink(missing_ok=True)  # an earlier run's rows: this run's own replace them as they finish
    finished: dict[str, MethodResult] = {}

    def on_method(name: str, result: MethodResult) -> None:
        chose = ""
        if name == "wbf_tuned":
            chose = "  chose " + "; ".join(
                f"iou_thr {f['iou_thr']}, {f['conf_type']}, weights {f['weights']}" for f in result.fitted
            )
        print(f"{name:>22}: mAP {result.metrics['map']:.4f}  AP50 {result.metrics['map50']:.4f}{chose}", flush=True)
        finished[name] = result
        # every finished row is on disk at once: a failure or a kill later loses none of them; not in --out,
        # which stays the earlier run's, beside that run's record, until this run completes
        atomic_write_json(partial, {n: r.metrics for n, r in finished.items()}, indent=1)

    seeds = ", ".join(map(str, args.seed))
    protocol = f"{args.cv}-fold CV (seed{'s' if len(args.seed) > 1 else ''} {seeds})" if args.cv else "no CV"
    if fit_on is not None:
        protocol += f", fitting on {len(_scored_ids(fit_on, args.all_images))} images of {Path(fit_gt).parent.name}" + (
            " too" if args.cv else ""
        )
    if args.all_images:
        protocol += ", images without annotations scored"
    logger.info(
        "%d models %s, %d images with ground truth, %s",
        predictions.num_models, predictions.model_names, len(predictions.gt.annotated_image_ids), protocol,
    )
    unannotated = len(predictions.gt.unannotated_image_ids)
    if unannotated and args.all_images:
        logger.info(
            "%d image%s of --gt without annotations %s scored and fitted on as negative images (--all-images): "
            "their detections are false positives", unannotated, "s" if unannotated > 1 else "",
            "are" if unannotated > 1 else "is",
        )
    elif unannotated:
        # a user's own dataset often holds background images; their false positives would lower every mAP
        # that a plain COCOeval over the file gives, so the table differs from that unless this is said
        logger.info(
            "%d image%s of --gt without annotations %s neither scored nor fitted on "
            "(only images with ground truth are evaluated; --all-images scores them)", unannotated,
            "s" if unannotated > 1 else "", "are" if unannotated > 1 else "is",
        )
    if len(args.seed) > 1:
        return _run_repeats(args, predictions, methods, options, fit_on, protocol)
    report = cross_validate(
        predictions, methods, k=args.cv, seed=args.seed[0], backend=args.backend, method_options=options,
        on_method=on_method, fit_on=fit_on, all_images=args.all_images,
    )
    table = {name: result.metrics for name, result in report.items()}
    record = _record(args, report, predictions, protocol, fit_on, images if images.is_dir() else None)
    # the earlier run's files are replaced only now that this run has every row, and --out last: a kill
    # in between leaves a table that its record does not match, which detens report refuses
    saved = record.save(record_path(out))
    atomic_write_json(_beside(out, ".fitted.json"),
                      {name: result.fitted for name, result in report.items() if result.fitted}, indent=1)
    atomic_write_json(_beside(out, ".calibration.json"),
                      {name: result.calibration for name, result in report.items()}, indent=1)
    _beside(out, ".bootstrap.json").unlink(missing_ok=True)  # the earlier run's draws; this run's come below
    _beside(out, ".run.json").unlink(missing_ok=True)  # an earlier run of several seeds; the record says it now
    _complete(out, table)
    if args.plot:
        plot_report(table, args.plot, title=f"COCO mAP, {protocol}, models: {', '.join(predictions.model_names)}")
    if args.reliability:
        plot_reliability({name: result.calibration for name, result in report.items()}, args.reliability,
                         title=f"Reliability (TP at IoU 0.5), {protocol}")
    page = None
    if args.report:
        from detens.report.page import write_report

        page = write_report(record, args.report)
    bootstrap = None
    if args.bootstrap:
        summary = summarize_bootstrap(
            bootstrap_map(predictions.gt, {name: result.results for name, result in report.items()},
                          image_ids=scored, resamples=args.bootstrap, seed=args.seed[0]),
            against,
        )
        bootstrap = _beside(out, ".bootstrap.json")
        atomic_write_json(bootstrap, {"draws": args.bootstrap, "seed": args.seed[0], "against": against,
                                      "methods": summary}, indent=1)
    print()
    print(markdown_table(table))
    if bootstrap is not None:
        print()
        print(bootstrap_table(summary, against))
    print(f"\nreport: {out}" + "".join(f", {what}: {path}" for what, path in
                                        (("plot", args.plot), ("reliability", args.reliability),
                                         ("record", saved), ("page", page), ("bootstrap", bootstrap)) if path))
    return 0


def _check_report_images(folder: Path, gt: CocoGroundTruth, given: bool) -> None:
    """Raise now, not once the evaluation is done, if a scored image in ``folder`` is missing, unreadable or
    not the size its ground truth gives it: the report draws the images where fusion helped and hurt most
    from it, and any scored image may be one of them. The check the report makes of the images it draws,
    each image decoded and let go: every scored image's pixels at once would be more than memory holds."""
    from detens.report.examples import read_images

    try:
        read_images(gt, folder, gt.annotated_image_ids, pixels=False)
    except (FileNotFoundError, ValueError) as err:
        where = "--images" if given else "the images folder beside --gt (--images names another)"
        raise UsageError(f"--report draws the scored images from {where}: {err}") from None


def _outputs(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """Every file this run writes (or removes, as an earlier run's), each with what names it in a message."""
    out = Path(args.out)
    outputs = [("--out", out), ("the record", record_path(out)), ("the unfinished rows", partial_path(out)),
               *((f"the {suffix} file", _beside(out, suffix))
                 for suffix in (".fitted.json", ".calibration.json", ".bootstrap.json", ".run.json")),
               ("--plot", args.plot), ("--reliability", args.reliability)]
    return [(what, Path(path)) for what, path in outputs if path is not None]


def _fitting_data(args: argparse.Namespace) -> tuple[str, Path, Path] | None:
    """``(flag, annotation file, prediction folder)`` of ``--also-fit-on`` or ``--fit-on``; None without either."""
    for flag, given in (("--also-fit-on", args.also_fit_on), ("--fit-on", args.fit_on)):
        if given:
            return flag, Path(given[0]), Path(given[1])
    return None


def _prediction_folders(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """The prediction folders this run reads, each with its flag."""
    folders = [("--predictions", Path(args.predictions))]
    if (fitting := _fitting_data(args)) is not None:
        flag, _, folder = fitting
        folders.append((flag, folder))
    return folders


def _inputs(args: argparse.Namespace, methods: list[str]) -> list[tuple[str, Path]]:
    """The files this run reads besides its prediction folders, each with what names it in a message."""
    inputs = [("--gt", Path(args.gt))]
    if (fitting := _fitting_data(args)) is not None:
        flag, fit_gt, _ = fitting
        inputs.append((f"{flag}'s annotation file", fit_gt))
    inputs += [(f"the head file of --methods {m}", Path(m.split(":", 1)[1])) for m in methods if m.startswith("head:")]
    inputs += [(f"--train-config {item}", Path(item.partition("=")[2])) for item in args.train_config]
    return inputs


def _refuse_outputs_on_one_file(outputs: list[tuple[str, Path]]) -> None:
    """Raise now, not once the evaluation is done, if two outputs of the run are one file: the one written
    later would replace the other (a ``--plot`` PNG over the table, the table over its record)."""
    seen: dict[Path, str] = {}
    for what, path in outputs:
        other = seen.setdefault(path.resolve(), what)
        if other != what:
            raise UsageError(
                f"{what} and {other} would both be written to {path}; give each output a file of its own"
            )


def _refuse_a_page_over_outputs(report: Path, outputs: list[tuple[str, Path]]) -> None:
    """Raise now, not once the evaluation is done, if the page in ``--report`` would write or remove one of
    the run's ``outputs`` (``--out`` is the table that ``detens report`` checks the page's record against)."""
    from detens.report.page import page_writes

    for what, path in outputs:
        if page_writes(report, path):
            raise UsageError(
                f"the report page in --report {report} would write over {path} ({what}); "
                "give the page a folder of its own, or the file another name"
            )


def _beside(out: Path, suffix: str) -> Path:
    """An output file beside the table ``out`` (``report.json`` → ``report<suffix>``)."""
    return out.with_name(out.stem + suffix)


def _complete(out: Path, table: dict[str, Any]) -> None:
    """Write the table, the last file of a complete run (its record and fits are on disk already), and
    drop the finished rows kept while the run went."""
    atomic_write_json(out, table, indent=1)
    partial_path(out).unlink(missing_ok=True)


def bootstrap_table(summary: dict[str, dict[str, Any]], against: str) -> str:
    """The bootstrap summary as a Markdown table: each method's mAP spread over the draws, and its
    difference to ``against`` on the same draws (in mAP points)."""
    lines = [f"| method | mAP sd | − {against} (mean of draws) | 95 % of draws | draws above |",
             "|---|---:|---:|---:|---:|"]
    for name, row in summary.items():
        d, shown = row["difference"], name.replace("|", "\\|")
        lines.append(
            f"| {shown} | {row['map']['sd']:.4f} | {100 * d['mean']:+.2f} "
            f"| {100 * d['ci95'][0]:+.2f} to {100 * d['ci95'][1]:+.2f} | {d['above']:.2f} |"
        )
    return "\n".join(lines)


def _run_repeats(
    args: argparse.Namespace,
    predictions: EnsemblePredictions,
    methods: list[str],
    options: dict[str, dict[str, Any]],
    fit_on: EnsemblePredictions | None,
    protocol: str,
) -> int:
    """The comparison once per ``--seed``; the table of means so far is on disk after every seed (in the
    partial file until the last seed)."""
    out = Path(args.out)
    runs: dict[int, dict[str, dict[str, float]]] = {}
    fitted: dict[str, dict[str, Any]] = {}
    for seed in args.seed:
        def on_method(name: str, result: MethodResult, seed: int = seed) -> None:
            print(f"seed {seed}: {name:>22}: mAP {result.metrics['map']:.4f}  AP50 {result.metrics['map50']:.4f}", flush=True)

        report = cross_validate(
            predictions, methods, k=args.cv, seed=seed, backend=args.backend, method_options=options,
            on_method=on_method, fit_on=fit_on, all_images=args.all_images,
        )
        runs[seed] = {name: result.metrics for name, result in report.items()}
        for name, result in report.items():
            if result.fitted:
                fitted.setdefault(name, {})[str(seed)] = result.fitted
        summary = summarize_repeats(runs)
        atomic_write_json(partial_path(out), summary, indent=1)
    # an earlier one-seed run's files describe a table that this one replaces
    for stale in (record_path(out), _beside(out, ".calibration.json"), _beside(out, ".bootstrap.json")):
        stale.unlink(missing_ok=True)
    atomic_write_json(_beside(out, ".run.json"), _repeats_meta(args, predictions, protocol, fit_on), indent=1)
    atomic_write_json(_beside(out, ".fitted.json"), fitted, indent=1)
    _complete(out, summary)
    if args.plot:
        plot_report(summary, args.plot, title=f"COCO mAP, mean of {protocol}, models: {', '.join(predictions.model_names)}")
    print()
    print(markdown_table(summary, REPEATED_COLUMNS))
    print(f"\nreport: {out}, run: {_beside(out, '.run.json')}" + (f", plot: {args.plot}" if args.plot else ""))
    return 0


def _record(
    args: argparse.Namespace,
    report: dict[str, MethodResult],
    predictions: EnsemblePredictions,
    protocol: str,
    fit_on: EnsemblePredictions | None,
    images: Path | None,
) -> EvaluationRecord:
    """What the report page needs from this run: the table, its pooled predictions, the members', the
    scored images' ground truth, and how the run was made."""
    gt: CocoGroundTruth = predictions.gt
    scored = _scored_ids(predictions, args.all_images)
    members: dict[str, list[dict[str, Any]]] = {name: [] for name in predictions.model_names}
    for image_id in scored:
        for name, det in zip(predictions.model_names, predictions.per_model(image_id), strict=True):
            members[name] += detections_to_coco(det, image_id, decimals=None)
    subset = gt.subset(scored).dataset
    meta = {
        **_run_meta(args, predictions, protocol, fit_on),
        "images": str(images.resolve()) if images is not None else None,
        "seed": args.seed[0],
        "folds": _fold_sizes(gt, args.cv, args.seed[0], args.all_images),
    }
    return EvaluationRecord(
        meta=meta,
        gt={k: subset[k] for k in ("images", "annotations", "categories")},
        metrics={name: result.metrics for name, result in report.items()},
        calibration={name: result.calibration for name, result in report.items()},
        results={name: result.results for name, result in report.items()},
        members=members,
    )


def _repeats_meta(
    args: argparse.Namespace, predictions: EnsemblePredictions, protocol: str, fit_on: EnsemblePredictions | None
) -> dict[str, Any]:
    """How a run of several seeds was made, for ``<out>.run.json`` (such a run writes no record): the
    record's ``meta`` with ``seeds`` and ``folds_by_seed`` for what one cross-validation has (``images``,
    ``seed``, ``folds``)."""
    return {
        **_run_meta(args, predictions, protocol, fit_on),
        "seeds": args.seed,
        "folds_by_seed": {str(seed): _fold_sizes(predictions.gt, args.cv, seed, args.all_images) for seed in args.seed},
    }


def _run_meta(
    args: argparse.Namespace, predictions: EnsemblePredictions, protocol: str, fit_on: EnsemblePredictions | None
) -> dict[str, Any]:
    """How the run was made, whatever its seeds: the command, the data, the protocol, and the images of
    either dataset that the cache could not read, neither scored nor fitted on."""
    command = getattr(args, "_command_line", None)
    fitting = _fitting_data(args)
    return {
        "command": shlex.join(command) if command else "detens evaluate (called from Python)",
        "gt": str(Path(args.gt).resolve()),
        "predictions": str(Path(args.predictions).resolve()),
        "models": predictions.model_names,
        "protocol": protocol,
        "cv": args.cv,
        "fit_on": None if fit_on is None or fitting is None else {
            "gt": str(fitting[1].resolve()),
            "predictions": str(fitting[2].resolve()),
            "images": len(_scored_ids(fit_on, args.all_images)),
            "mode": "joined to every fold's fitting side" if args.also_fit_on else "the only fitting data",
            "left_out": _left_out(fit_on),
        },
        "backend": args.backend,
        "all_images": args.all_images,
        "scored_images": len(_scored_ids(predictions, args.all_images)),
        "left_out": _left_out(predictions),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "detens_version": detens.__version__,
    }


def _left_out(predictions: EnsemblePredictions) -> list[dict[str, Any]]:
    """The images of ``predictions``' ground truth that the cache could not read, as JSON objects."""
    return [asdict(image) for image in predictions.left_out]


def _scored_ids(predictions: EnsemblePredictions, all_images: bool) -> list[int]:
    """The images cross_validate scores (or, of the fitting data, fits on): the annotated ones, every one
    with ``--all-images``."""
    return predictions.gt.image_ids if all_images else predictions.gt.annotated_image_ids


def _fold_sizes(gt: CocoGroundTruth, cv: int, seed: int, all_images: bool) -> list[int]:
    """The number of held-out images of each fold that cross_validate scores (the same split, the same
    seed); none without cross-validation."""
    if not cv:
        return []
    negatives = gt.unannotated_image_ids if all_images else []
    return [len(test) for _, test in kfold_image_splits(gt.annotated_image_ids, cv, seed, negatives)]


def main(argv: list[str] | None = None) -> int:
    return run_command("evaluate", argv)
