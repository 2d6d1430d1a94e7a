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

Methods that fit nothing (single, nms, wbf, mean, head:PATH, ...) need no fitting data: alone, with
``--cv 0`` and no ``--fit-on``, each scores every image once, without folds.

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

COCOeval keeps the 100 highest-scoring boxes of each image *and category*: a fusion that gives more
boxes per image than its members has all of them count. ``--max-det N`` scores each image's N best boxes
of every method and member instead (COCO's detection challenge takes 100), in the choices each method
makes on the fitting images too (``wbf_tuned``'s search; a head's matching IoU, median box, bags and fuser
after calibration, through its training config's ``score_max_det``). COCOeval's own cut stays: with N above
100, each image still counts at most 100 boxes of each category.

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
completes; a run starts by removing an earlier run's, so the rows there are always the running one's.
The same command run again resumes: every method (per seed) that an interrupted run finished is kept in
``<out stem>.unfinished/`` (its fits and held-out predictions) and taken as it was; a run with other inputs or
options starts that folder over, and a run that completes removes it. ``detens report`` refuses a table that its record's run did not write.
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

from detens.catalogue import COCO_BACKENDS, DEFAULT_EVALUATION_METHODS, EVALUATION_METHODS
from detens.cli import (
    add_threads_argument,
    argparse_type,
    folder_path,
    integer,
    output_file,
    positive_int,
    run_command,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gt", required=True, help="COCO annotation file")
    parser.add_argument(
        "--predictions", required=True,
        help="folder of <model>.json COCO results; --gt may annotate some of the images a detens cache there ran on "
        "(the others' predictions are not used)",
    )
    parser.add_argument(
        "--methods",
        default=DEFAULT_EVALUATION_METHODS,
        help=f"comma-separated; 'single' expands to every model; 'head:PATH' scores a head file trained elsewhere "
        f"(known: {', '.join(EVALUATION_METHODS)}; default: {DEFAULT_EVALUATION_METHODS})",
    )
    parser.add_argument("--models", help="comma-separated model names (default: every file, sorted)")
    parser.add_argument("--cv", type=integer, default=2, help="number of folds (K >= 2), or 0 for none: with --fit-on, or "
                        "without it for fixed methods only, each scoring every image once (default: 2)")
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
        # a text default, which argparse parses as it would the flag's value ([0]): it is EvaluateOptions.seed's
        # default too, and a dataclass field cannot default to a list
        "--seed", type=argparse_type("detens.jobs.evaluate", "parse_seeds"), default="0",
        help="fixes the folds; several (0,1,2) repeat the cross-validation once per seed and report the means "
        "(default: 0)",
    )
    parser.add_argument(
        # no default of []: it is EvaluateOptions.train_config's default too, and a dataclass field cannot
        # default to a list
        "--train-config", action="append", metavar="HEAD=YAML",
        help="training config of every method that fits this head type (e.g. theta=configs/train/theta.yaml; "
        "selection=... also configures selection_k1 ... selection_k8; repeatable); "
        "default: the head's code defaults, which configs/train/<head>.yaml mirror",
    )
    parser.add_argument(
        "--set", action="append", metavar="HEAD.KEY=VALUE",
        help="override one key of a head type's training config, over --train-config's file (deep.epochs=5; "
        "repeatable; the value is read as YAML)",
    )
    parser.add_argument("--backend", default="pycocotools", choices=COCO_BACKENDS,
                        help="COCO evaluator of the reported figures (default: %(default)s, the reference; "
                        "tuning inside the folds uses the fastest installed one)")
    parser.add_argument("--out", type=output_file, required=True, help="JSON report {method: {metric: value}}")
    parser.add_argument("--plot", type=output_file, help="bar chart PNG")
    parser.add_argument(
        "--reliability", type=output_file, help="reliability diagram PNG: per method, score vs true-positive rate at IoU 0.5 (10 bins)"
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
        "--bootstrap", type=integer, default=0, metavar="B",
        help="paired bootstrap over the scored images: B draws, every method scored on the same draws "
        "(<out>.bootstrap.json); 0 = off",
    )
    parser.add_argument(
        "--bootstrap-against", metavar="METHOD",
        help="the method whose mAP the bootstrap subtracts from every other's on each draw (default: the first)",
    )
    parser.add_argument(
        "--max-det", type=positive_int, metavar="N",
        help="score each image's N highest-scoring boxes of every method and member (COCO's detection challenge "
        "takes 100), also in the choices methods make on the fitting images (wbf_tuned's search; a head's "
        "matching IoU, median box, bags and fuser after calibration); COCOeval still keeps at most 100 per image "
        "and category, also for N above 100. Default: every box (COCOeval keeps 100 per image and category)",
    )
    add_threads_argument(parser)


def run(args: argparse.Namespace) -> int:
    from detens.jobs.evaluate import EvaluateOptions, run

    return run(EvaluateOptions.from_namespace(args))


def main(argv: list[str] | None = None) -> int:
    return run_command("evaluate", argv)
