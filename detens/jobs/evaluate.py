"""The job of ``detens evaluate``: compare fusion methods on saved predictions with cross-validated COCO mAP
(the command's help page, :mod:`detens.cli.evaluate`, says what it fits, scores, writes and refuses)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import numbers
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

import detens
from detens.bootstrap import bootstrap_map, summarize_bootstrap
from detens.catalogue import DEFAULT_EVALUATION_METHODS
from detens.coco import BACKENDS, CocoGroundTruth, detections_to_coco, load_coco_gt
from detens.evaluation import (
    MethodResult,
    check_method_names,
    cross_validate,
    expand_methods,
    fitted_method_names,
    head_kind,
    method_names,
    summarize_repeats,
)
from detens.folds import kfold_image_splits
from detens.fusers import highest_scoring
from detens.heads import TRAINERS, load_train_config
from detens.io import atomic_write_json, check_writable_file, check_writable_folder, home_expanded
from detens.jobs._inputs import comma_separated, file_digests, model_names
from detens.jobs._options import (
    JobOptions,
    UsageError,
    check_given_folder,
    check_int_text,
    check_text_list,
    check_text_pair,
    file_or_shipped_name,
    folder,
    input_path,
    integer,
    listed,
    output_file,
    parse_set,
    text,
)
from detens.jobs._options import flag as flag_option  # flag names a command-line flag in the code below
from detens.jobs._outputs import (
    output_file_lock,
    refuse_outputs_over_inputs,
    refuse_results_in_prediction_folders,
    refuse_unwritable_outputs,
)
from detens.jobs._software import software_versions
from detens.jobs._unfinished import UnfinishedRun, discard_unfinished, run_key, unfinished_folder
from detens.predictions import CACHE_SUMMARY, EnsemblePredictions
from detens.report import REPEATED_COLUMNS, markdown_table, plot_reliability, plot_report
from detens.report.record import EvaluationRecord, partial_path, record_path

__all__ = ["EvaluateOptions", "bootstrap_table", "parse_seeds", "run"]

logger = logging.getLogger("detens.evaluate")


def parse_seeds(text: str, name: str = "--seed") -> list[int]:
    """``"0"`` or ``"0,1,2"`` → the fold seeds (distinct integers); ``name``: the option, in messages.

    Raises:
        ValueError: a part that is no integer, a seed listed twice, or one below 0.
    """
    try:
        seeds = [check_int_text(part.strip()) for part in text.split(",")]  # "0, 1, 2" too
    except ValueError:
        raise ValueError(f"{name} takes an integer or comma-separated integers (0,1,2), got {text!r}") from None
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{name} lists a seed twice: {text!r}")
    if any(seed < 0 for seed in seeds):
        raise ValueError(f"{name} takes seeds >= 0, got {text!r}")
    return seeds


def _check_seeds(value: Any) -> tuple[int, ...]:
    """``seed`` as the fold seeds: their text (``"0,1,2"``, as ``--seed`` takes it), one seed, or a sequence
    of them, checked as :func:`parse_seeds` checks the text.

    Raises:
        TypeError: ``value`` is none of these (a float, a bool, a list holding one).
        ValueError: a seed listed twice, or one below 0.
    """
    if isinstance(value, str):
        return tuple(parse_seeds(value, "seed"))
    seeds = [value] if isinstance(value, numbers.Integral) else value
    if (
        isinstance(seeds, bool) or not isinstance(seeds, Sequence)
        or any(isinstance(s, bool) or not isinstance(s, numbers.Integral) for s in seeds)
    ):
        raise TypeError(
            f"seed must be an int, a list of ints or their text ('0,1,2'), got {type(value).__name__}: {value!r}"
        )
    return tuple(parse_seeds(",".join(str(int(s)) for s in seeds), "seed"))


@dataclasses.dataclass(kw_only=True)
class EvaluateOptions(JobOptions):
    """The options of ``detens evaluate``.

    Attributes:
        gt (str): the COCO annotation file.
        predictions (str): the folder of ``<model>.json`` COCO results.
        methods (str): comma-separated methods; ``single`` expands to every model, ``head:PATH`` scores a
            head file trained elsewhere.
        models (str | None): comma-separated model names (None: every file, sorted).
        cv (int): the number of folds (>= 2), or 0 with ``fit_on``, or 0 without it when every method is
            fixed (each scores every image once, nothing is fitted).
        also_fit_on (tuple[str, str] | None): the annotation file and prediction folder of more fitting
            images, joined to every fold's fitting side.
        fit_on (tuple[str, str] | None): with ``cv=0``: the annotation file and prediction folder that
            learned and tuned methods fit on alone (excludes ``also_fit_on``).
        all_images (bool): also score the images without annotations, and fit on them as negative images.
        seed (tuple[int, ...]): the fold seeds; several repeat the cross-validation once per seed. Given as
            their text (``"0,1,2"``, the default ``"0"``), one int or a sequence of ints.
        train_config (tuple[str, ...]): ``HEAD=YAML`` training configs, one per head type.
        set (tuple[str, ...]): ``HEAD.KEY=VALUE`` overrides of a head type's training config (over
            ``train_config``'s file, else the code defaults).
        backend (str): the COCO evaluator of the reported figures.
        out (str): the JSON report ``{method: {metric: value}}``.
        plot (str | None): a bar chart PNG.
        reliability (str | None): a reliability diagram PNG.
        report (Path | None): the folder of the report page.
        images (str | None): the images of ``gt``, for the report's side-by-sides (None: the ``images``
            folder beside ``gt``).
        bootstrap (int): paired bootstrap draws over the scored images (0: none).
        bootstrap_against (str | None): the method the bootstrap subtracts from every other's mAP (None:
            the first).
        threads (int): torch intra-op threads.
        max_det (int | None): score each method's (and member's) ``max_det`` highest-scoring boxes of an
            image, in the choices made on the fitting images too (None: every box; see
            :func:`~detens.evaluation.cross_validate`).
    """

    job = "evaluate"

    gt: str = input_path(required=True)
    predictions: str = input_path(required=True)
    methods: str = text(DEFAULT_EVALUATION_METHODS)
    models: str | None = text()
    cv: int = integer(2)
    also_fit_on: tuple[str, str] | None = listed()
    fit_on: tuple[str, str] | None = listed()
    all_images: bool = flag_option()
    seed: tuple[int, ...] = listed("0")
    train_config: tuple[str, ...] = listed()
    set: tuple[str, ...] = listed()
    backend: str = text("pycocotools", choices=BACKENDS)
    out: str = output_file(required=True)
    plot: str | None = output_file()
    reliability: str | None = output_file()
    report: Path | None = folder()
    images: str | None = input_path()
    bootstrap: int = integer(0)
    bootstrap_against: str | None = text()
    threads: int = integer(1, positive=True)
    max_det: int | None = integer(positive=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.also_fit_on = check_text_pair("also_fit_on", self.also_fit_on)
        self.fit_on = check_text_pair("fit_on", self.fit_on)
        # the command line's parser refuses both; from Python the first would be taken silently
        if self.also_fit_on is not None and self.fit_on is not None:
            raise ValueError("also_fit_on and fit_on exclude each other: give one")
        self.seed = _check_seeds(self.seed)
        self.train_config = tuple(map(_yaml_home_expanded, check_text_list("train_config", self.train_config)))
        self.set = check_text_list("set", self.set)


def run(options: EvaluateOptions) -> int:
    """Fit and score every method, print the table and write the run's files; returns 0.

    Holds a lock on ``--out`` (``.<name>.detens.lock`` beside it, cut short where that name would be too
    long: :func:`~detens.io.name_within_limit`) while it runs: a second run on the same ``--out`` would take
    the first one's rows for an interrupted run's, or start its folder of finished methods over under it.

    Raises:
        UsageError: a bad option, or an output on an input or on another output (found before any method
            runs).
        ValueError: among others, another run holds ``--out``, naming it.
    """
    out = Path(options.out)
    check_writable_file(out, "--out")
    with output_file_lock(out, "detens evaluate"):
        return _run(options)


def _run(options: EvaluateOptions) -> int:
    torch.set_num_threads(options.threads)
    if options.cv < 0 or options.cv == 1:
        raise UsageError(
            f"--cv must be the number of folds (>= 2), or 0 (with --fit-on, or fixed methods only); got {options.cv}"
        )
    methods = comma_separated("--methods", options.methods, "method", "method names", valid=method_names())
    check_method_names(methods)
    # fixed methods alone need no fitting data: --cv 0 then scores every image once, with no folds
    needs_fit_on = options.also_fit_on is not None or bool(fitted_method_names(methods))
    if (options.cv == 0 and options.fit_on is None and needs_fit_on) or (options.cv != 0 and options.fit_on is not None):
        raise UsageError("--cv 0 and --fit-on go together: without cross-validation the fitting data is --fit-on's")
    for method in methods:
        if method.startswith("head:"):
            file_or_shipped_name(f"--methods {method!r}", method.removeprefix("head:"))
    files: dict[str, str] = {}
    for item in options.train_config:
        kind, _, path = item.partition("=")
        if kind not in TRAINERS or not path:
            raise UsageError(f"--train-config takes HEAD=YAML with HEAD one of {', '.join(sorted(TRAINERS))}, got {item!r}")
        if kind in files:
            raise UsageError(f"--train-config {kind}= is given twice; give each head type one file")
        _takers(kind, methods, f"--train-config {item}")
        files[kind] = path
    sets = _sets_by_head(options.set, methods)
    method_options = {}
    for kind in sorted({*files, *sets}):
        config = load_train_config(kind, files.get(kind), sets.get(kind), overrides_name=f"--set {kind}")
        method_options.update({method: {"config": config} for method in _takers(kind, methods, "")})
    for flag, value in (("--plot", options.plot), ("--reliability", options.reliability)):  # --out: by run()
        if value is not None:
            check_writable_file(Path(value), flag)
    outputs, folders = _outputs(options), _prediction_folders(options)
    refuse_unwritable_outputs(outputs)
    _refuse_outputs_on_one_file(outputs)
    refuse_outputs_over_inputs(outputs, _inputs(options, methods), folders)
    if options.report is not None:
        from detens.report.page import check_page_replaceable

        check_writable_folder(options.report, "--report")
        _refuse_a_page_over_outputs(options.report, outputs)
        check_page_replaceable(options.report, "--report")
        refuse_results_in_prediction_folders([("the report page's numbers", Path(options.report) / "page.json")], folders)
    check_given_folder("--images", options.images)
    if options.bootstrap < 0:
        raise UsageError(f"--bootstrap must be the number of draws (>= 1), or 0 for none; got {options.bootstrap}")
    if options.bootstrap_against is not None and not options.bootstrap:
        raise UsageError("--bootstrap-against needs --bootstrap B")
    if len(options.seed) > 1:
        if options.bootstrap:
            raise UsageError(f"--bootstrap draws one cross-validation's predictions; give it one --seed, not {len(options.seed)}")
        if options.cv == 0:
            raise UsageError("several --seed values repeat the cross-validation, but --cv 0 has no folds to vary")
        for flag, value in (("--report", options.report), ("--reliability", options.reliability), ("--images", options.images)):
            if value is not None:
                raise UsageError(f"{flag} draws one cross-validation's predictions; give it one --seed, not {len(options.seed)}")
    gt = load_coco_gt(options.gt)
    models = model_names(options.models, options.predictions)
    predictions = EnsemblePredictions.from_folder(options.predictions, gt, models=models)
    if not predictions.gt.annotated_image_ids:
        raise UsageError(f"--gt {options.gt} has no annotated image: there is no ground truth to score methods against")
    images = Path(options.images) if options.images else Path(options.gt).parent / "images"
    if options.report and images.is_dir():
        _check_report_images(images, predictions.gt, given=options.images is not None)
    fit_on = None
    if (fitting := _fitting_data(options)) is not None:
        flag, fit_gt, fit_folder = fitting
        fit_on = EnsemblePredictions.from_folder(fit_folder, load_coco_gt(fit_gt), models=predictions.model_names)
        if not fit_on.gt.annotated_image_ids:
            raise UsageError(f"{flag}'s annotation file {fit_gt} has no annotated image to fit on")
    scored = _scored_ids(predictions, options.all_images)

    against = None
    if options.bootstrap:
        names = expand_methods(methods, predictions.model_names)
        against = options.bootstrap_against or names[0]
        if against not in names:
            raise UsageError(f"--bootstrap-against {against!r} is not among the methods run: {', '.join(names)}")

    out = Path(options.out)
    partial = partial_path(out)
    partial.unlink(missing_ok=True)  # an earlier run's rows: this run's own replace them as they finish
    unfinished = UnfinishedRun(out, _run_key(options, methods, method_options, predictions, fit_on))
    finished: dict[str, MethodResult] = {}

    def on_method(name: str, result: MethodResult) -> None:
        chose = ""
        if name == "wbf_tuned":
            chose = "  chose " + "; ".join(
                f"iou_thr {f['iou_thr']}, {f['conf_type']}, weights {f['weights']}" for f in result.fitted
            )
        _show_progress(options, name, result, note=chose)
        unfinished.save(options.seed[0], name, result)
        finished[name] = result
        # every finished row is on disk at once: a failure or a kill later loses none of them; not in --out,
        # which stays the earlier run's, beside that run's record, until this run completes
        atomic_write_json(partial, {n: r.metrics for n, r in finished.items()}, indent=1)

    seeds = ", ".join(map(str, options.seed))
    protocol = f"{options.cv}-fold CV (seed{'s' if len(options.seed) > 1 else ''} {seeds})" if options.cv else "no CV"
    if not options.cv and fit_on is None:
        protocol += ", no method fitted: every image scored once"
    if fit_on is not None:
        protocol += f", fitting on {len(_scored_ids(fit_on, options.all_images))} images of {Path(fit_gt).resolve().parent.name}" + (
            " too" if options.cv else ""
        )
    if options.max_det is not None:
        protocol += f", each image's {options.max_det} best boxes scored"
    if options.all_images:
        protocol += ", images without annotations scored"
    logger.info(
        "%d models %s, %d images with ground truth, %s",
        predictions.num_models, predictions.model_names, len(predictions.gt.annotated_image_ids), protocol,
    )
    unannotated = len(predictions.gt.unannotated_image_ids)
    if unannotated and options.all_images:
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
    if len(options.seed) > 1:
        with _saying_what_is_kept(unfinished):
            return _run_repeats(options, predictions, methods, method_options, fit_on, protocol, unfinished)
    done = unfinished.finished(options.seed[0], expand_methods(methods, predictions.model_names))
    for name, result in done.items():
        _show_progress(options, name, result, note=_RESUMED)
        finished[name] = result
    if done:
        atomic_write_json(partial, {n: r.metrics for n, r in finished.items()}, indent=1)
    with _saying_what_is_kept(unfinished):
        report = cross_validate(
            predictions, methods, k=options.cv, seed=options.seed[0], backend=options.backend,
            method_options=method_options, on_method=on_method, fit_on=fit_on, all_images=options.all_images,
            max_det=options.max_det, done=done,
        )
    table = {name: result.metrics for name, result in report.items()}
    record = _record(options, report, predictions, protocol, fit_on, images if images.is_dir() else None)
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
    try:
        if options.plot:
            plot_report(table, options.plot, title=f"COCO mAP, {protocol}, models: {', '.join(predictions.model_names)}")
        if options.reliability:
            plot_reliability({name: result.calibration for name, result in report.items()}, options.reliability,
                             title=f"Reliability (TP at IoU 0.5), {protocol}")
        page = None
        if options.report:
            from detens.report.page import write_report

            page = write_report(record, options.report)
        bootstrap = None
        if options.bootstrap:
            summary = summarize_bootstrap(
                bootstrap_map(predictions.gt, {name: result.results for name, result in report.items()},
                              image_ids=scored, resamples=options.bootstrap, seed=options.seed[0]),
                against,
            )
            bootstrap = _beside(out, ".bootstrap.json")
            atomic_write_json(bootstrap, {"draws": options.bootstrap, "seed": options.seed[0], "against": against,
                                          "methods": summary}, indent=1)
    except KeyboardInterrupt:  # the run's table is complete: say so, since the same command would refit everything
        logger.warning(
            "interrupted after the table %s and its record were written, complete; what comes after them (the "
            "plots, the report page, the bootstrap) may be missing%s", out,
            f": detens report {out} --out {options.report} draws the page from them" if options.report else "",
        )
        raise
    print()
    print(markdown_table(table))
    if bootstrap is not None:
        print()
        print(bootstrap_table(summary, against))
    print(f"\nreport: {out}" + "".join(f", {what}: {path}" for what, path in
                                        (("plot", options.plot), ("reliability", options.reliability),
                                         ("record", saved), ("page", page), ("bootstrap", bootstrap)) if path))
    return 0


@contextlib.contextmanager
def _saying_what_is_kept(unfinished: UnfinishedRun) -> Iterator[None]:
    """On a Ctrl-C, say how many finished methods ``unfinished`` keeps for the same command to resume: a bare
    interruption reads as if every fit were lost."""
    try:
        yield
    except KeyboardInterrupt:
        kept = unfinished.count()
        if kept:
            logger.warning(
                "interrupted: %d finished method result%s %s saved in %s; run the same command again to resume "
                "(not fitted or scored again)", kept, "s" if kept > 1 else "", "are" if kept > 1 else "is",
                unfinished.folder,
            )
        raise


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


def _outputs(options: EvaluateOptions) -> list[tuple[str, Path]]:
    """Every file this run writes (or removes, as an earlier run's), each with what names it in a message."""
    out = Path(options.out)
    outputs = [("--out", out), ("the record", record_path(out)), ("the unfinished rows", partial_path(out)),
               ("the unfinished run's folder", unfinished_folder(out)),
               *((f"the {suffix} file", _beside(out, suffix))
                 for suffix in (".fitted.json", ".calibration.json", ".bootstrap.json", ".run.json")),
               ("--plot", options.plot), ("--reliability", options.reliability)]
    return [(what, Path(path)) for what, path in outputs if path is not None]


def _fitting_data(options: EvaluateOptions) -> tuple[str, Path, Path] | None:
    """``(flag, annotation file, prediction folder)`` of ``--also-fit-on`` or ``--fit-on``; None without either."""
    for flag, given in (("--also-fit-on", options.also_fit_on), ("--fit-on", options.fit_on)):
        if given:
            return flag, Path(given[0]), Path(given[1])
    return None


def _prediction_folders(options: EvaluateOptions) -> list[tuple[str, Path]]:
    """The prediction folders this run reads, each with its flag."""
    folders = [("--predictions", Path(options.predictions))]
    if (fitting := _fitting_data(options)) is not None:
        flag, _, folder = fitting
        folders.append((flag, folder))
    return folders


# after a resumed method's progress line
_RESUMED = "  (finished by the interrupted run)"


def _show_progress(
    options: EvaluateOptions, name: str, result: MethodResult, *, seed: int | None = None, note: str = ""
) -> None:
    """Print a finished method's line while the run goes (not with ``quiet``: the table is the result)."""
    if options.quiet:
        return
    line = f"{name:>22}: mAP {result.metrics['map']:.4f}  AP50 {result.metrics['map50']:.4f}{note}"
    print(line if seed is None else f"seed {seed}: {line}", flush=True)


def _takers(kind: str, methods: Sequence[str], given: str) -> list[str]:
    """The methods of ``methods`` that fit a ``kind`` head; none is a mistake of the flag ``given``."""
    takers = [m for m in methods if head_kind(m) == kind]
    if not takers:
        raise UsageError(f"{given}: no method of --methods ({', '.join(methods)}) fits a {kind} head")
    return takers


def _sets_by_head(items: Sequence[str], methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``--set HEAD.KEY=VALUE`` flags as ``{head type: {key: value}}``, each head's read by :func:`parse_set`.

    Raises:
        UsageError: an item not of that form, an unknown head type, one no method of ``methods`` fits, or
            a key given twice (one of the values would be dropped unseen).
        ValueError: a value that is not valid YAML.
    """
    by_head: dict[str, list[str]] = {}
    for item in items:
        target, equals, _ = item.partition("=")
        kind, dot, key = target.partition(".")
        if not equals or not dot or not key.strip() or kind not in TRAINERS:
            raise UsageError(f"--set takes HEAD.KEY=VALUE with HEAD one of {', '.join(sorted(TRAINERS))} "
                             f"(deep.epochs=5), got {item!r}")
        _takers(kind, methods, f"--set {item}")
        by_head.setdefault(kind, []).append(item)
    return {kind: parse_set(given, prefix=f"{kind}.") for kind, given in by_head.items()}


def _run_key(
    options: EvaluateOptions,
    methods: list[str],
    method_options: dict[str, dict[str, Any]],
    predictions: EnsemblePredictions,
    fit_on: EnsemblePredictions | None,
) -> str:
    """What makes a method's row, for resuming an interrupted run: the files read (by content), the
    members, the protocol's options, the training configs and the torch threads (the network heads sum in
    their order). Not the methods themselves: each finished one is kept by its name."""
    folders = [(flag, Path(folder)) for flag, folder in _prediction_folders(options)]
    files = [Path(options.gt)] + [folder / f"{m}.json" for _, folder in folders for m in predictions.model_names]
    files += [folder / CACHE_SUMMARY for _, folder in folders]  # the images it left out
    if (fitting := _fitting_data(options)) is not None:
        files.append(fitting[1])
    files += [Path(item.partition("=")[2]) for item in options.train_config]
    files += [_head_file(m) for m in methods if m.startswith("head:")]  # a head file trained again
    return run_key({
        "files": file_digests(str(path) for path in files),
        "models": predictions.model_names,
        "fit_on": None if fit_on is None else ("also" if options.also_fit_on else "only"),
        "cv": options.cv, "backend": options.backend, "all_images": options.all_images,
        "max_det": options.max_det, "threads": options.threads, "method_options": method_options,
        "detens": detens.__version__,
    })


def _yaml_home_expanded(item: str) -> str:
    """A ``HEAD=YAML`` training config with a leading ``~`` of its file expanded, as every path option's."""
    kind, given, path = item.partition("=")
    return f"{kind}={home_expanded(path)}" if given else item


def _head_file(method: str) -> Path:
    """The file of a ``head:PATH`` method, as loading it reads the path (a leading ``~`` expanded); the method
    keeps its name as given, which names its row."""
    return Path(home_expanded(method.split(":", 1)[1]))


def _inputs(options: EvaluateOptions, methods: list[str]) -> list[tuple[str, Path]]:
    """The files this run reads besides its prediction folders, each with what names it in a message."""
    inputs = [("--gt", Path(options.gt))]
    if (fitting := _fitting_data(options)) is not None:
        flag, fit_gt, _ = fitting
        inputs.append((f"{flag}'s annotation file", fit_gt))
    inputs += [(f"the head file of --methods {m}", _head_file(m)) for m in methods if m.startswith("head:")]
    inputs += [(f"--train-config {item}", Path(item.partition("=")[2])) for item in options.train_config]
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
    discard_unfinished(out)


def bootstrap_table(summary: dict[str, dict[str, Any]], against: str) -> str:
    """The bootstrap summary as a Markdown table: each method's mAP spread over the draws (a standard
    deviation of mAP, a fraction as the mAP column's), its difference to ``against`` on the same draws (in
    mAP points: 100 times a difference of mAP) and the share of the draws where it is above ``against``."""
    lines = [f"| method | mAP sd over draws | − {against}, points (mean of draws) | 95 % of draws, points | share of draws above |",
             "|---|---:|---:|---:|---:|"]
    for name, row in summary.items():
        d, shown = row["difference"], name.replace("|", "\\|")
        lines.append(
            f"| {shown} | {row['map']['sd']:.4f} | {100 * d['mean']:+.2f} "
            f"| {100 * d['ci95'][0]:+.2f} to {100 * d['ci95'][1]:+.2f} | {d['above']:.2f} |"
        )
    return "\n".join(lines)


def _run_repeats(
    options: EvaluateOptions,
    predictions: EnsemblePredictions,
    methods: list[str],
    method_options: dict[str, dict[str, Any]],
    fit_on: EnsemblePredictions | None,
    protocol: str,
    unfinished: UnfinishedRun,
) -> int:
    """The comparison once per ``--seed``; the table of means so far is on disk after every seed (in the
    partial file until the last seed), and every finished method in ``unfinished``."""
    out = Path(options.out)
    runs: dict[int, dict[str, dict[str, float]]] = {}
    fitted: dict[str, dict[str, Any]] = {}
    calibration_checks: dict[tuple[int, ...], dict[str, str | None]] = {}  # one pass per target for every seed
    for seed in options.seed:
        def on_method(name: str, result: MethodResult, seed: int = seed) -> None:
            _show_progress(options, name, result, seed=seed)
            unfinished.save(seed, name, result)

        done = unfinished.finished(seed, expand_methods(methods, predictions.model_names))
        for name, result in done.items():
            _show_progress(options, name, result, seed=seed, note=_RESUMED)
        report = cross_validate(
            predictions, methods, k=options.cv, seed=seed, backend=options.backend,
            method_options=method_options, on_method=on_method, fit_on=fit_on, all_images=options.all_images,
            calibration_checks=calibration_checks, max_det=options.max_det, done=done,
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
    atomic_write_json(_beside(out, ".run.json"), _repeats_meta(options, predictions, protocol, fit_on), indent=1)
    atomic_write_json(_beside(out, ".fitted.json"), fitted, indent=1)
    _complete(out, summary)
    if options.plot:
        plot_report(summary, options.plot, title=f"COCO mAP, mean of {protocol}, models: {', '.join(predictions.model_names)}")
    print()
    print(markdown_table(summary, REPEATED_COLUMNS))
    print(f"\nreport: {out}, run: {_beside(out, '.run.json')}" + (f", plot: {options.plot}" if options.plot else ""))
    return 0


def _record(
    options: EvaluateOptions,
    report: dict[str, MethodResult],
    predictions: EnsemblePredictions,
    protocol: str,
    fit_on: EnsemblePredictions | None,
    images: Path | None,
) -> EvaluationRecord:
    """What the report page needs from this run: the table, its pooled predictions, the members', the
    scored images' ground truth, and how the run was made."""
    gt: CocoGroundTruth = predictions.gt
    scored = _scored_ids(predictions, options.all_images)
    members: dict[str, list[dict[str, Any]]] = {name: [] for name in predictions.model_names}
    for image_id in scored:
        for name, det in zip(predictions.model_names, predictions.per_model(image_id), strict=True):
            # cut as the table's single:<name> rows are, so that the report compares like with like
            members[name] += detections_to_coco(highest_scoring(det, options.max_det), image_id, decimals=None)
    subset = gt.subset(scored).dataset
    meta = {
        **_run_meta(options, predictions, protocol, fit_on),
        "images": str(images.resolve()) if images is not None else None,
        "seed": options.seed[0],
        "folds": _fold_sizes(gt, options.cv, options.seed[0], options.all_images),
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
    options: EvaluateOptions, predictions: EnsemblePredictions, protocol: str, fit_on: EnsemblePredictions | None
) -> dict[str, Any]:
    """How a run of several seeds was made, for ``<out>.run.json`` (such a run writes no record): the
    record's ``meta`` with ``seeds`` and ``folds_by_seed`` for what one cross-validation has (``images``,
    ``seed``, ``folds``)."""
    return {
        **_run_meta(options, predictions, protocol, fit_on),
        "seeds": options.seed,
        "folds_by_seed": {str(seed): _fold_sizes(predictions.gt, options.cv, seed, options.all_images) for seed in options.seed},
    }


def _run_meta(
    options: EvaluateOptions, predictions: EnsemblePredictions, protocol: str, fit_on: EnsemblePredictions | None
) -> dict[str, Any]:
    """How the run was made, whatever its seeds: the command, the data, the protocol, and the images of
    either dataset that the cache could not read, neither scored nor fitted on."""
    command = options.command_line
    fitting = _fitting_data(options)
    return {
        "command": shlex.join(command) if command else "detens evaluate (called from Python)",
        "gt": str(Path(options.gt).resolve()),
        "predictions": str(Path(options.predictions).resolve()),
        "models": predictions.model_names,
        "protocol": protocol,
        "cv": options.cv,
        "fit_on": None if fit_on is None or fitting is None else {
            "gt": str(fitting[1].resolve()),
            "predictions": str(fitting[2].resolve()),
            "images": len(_scored_ids(fit_on, options.all_images)),
            "mode": "joined to every fold's fitting side" if options.also_fit_on else "the only fitting data",
            "left_out": _left_out(fit_on),
        },
        "backend": options.backend,
        "all_images": options.all_images,
        "max_det": options.max_det,
        "scored_images": len(_scored_ids(predictions, options.all_images)),
        "left_out": _left_out(predictions),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "detens_version": detens.__version__,
        "software": software_versions(),
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
