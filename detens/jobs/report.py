"""The job of ``detens report``: write the HTML report page of a saved evaluation (the command's help page,
:mod:`detens.cli.report`, says what the page holds and what is refused)."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from detens.io import check_writable_folder
from detens.jobs._options import (
    JobOptions,
    UsageError,
    check_given_folder,
    folder,
    input_path,
    integer,
    number,
)
from detens.jobs._outputs import refuse_results_in_prediction_folders
from detens.report.record import EvaluationRecord, record_path

__all__ = ["ReportOptions", "run"]


@dataclasses.dataclass(kw_only=True)
class ReportOptions(JobOptions):
    """The options of ``detens report``.

    Attributes:
        evaluation (str): the ``--out`` JSON of ``detens evaluate``, or its ``.evaluation.json.gz``.
        out (Path): the page's folder (``index.html`` and PNGs).
        images (str | None): the scored images, for the side-by-sides (None: the folder the evaluation found).
        examples (int): images where fusion helped most, and as many where it hurt most (0: none).
        conf (float): side-by-sides draw detections scored at least this; a vote histogram counts them.
    """

    job = "report"

    evaluation: str = input_path(required=True)
    out: Path = folder(required=True)
    images: str | None = input_path()
    examples: int = integer(3)
    conf: float = number(0.3)


def run(options: ReportOptions) -> int:
    """Write the page; returns 0.

    Raises:
        UsageError: a bad option, or a page that would write over the evaluation it is drawn from.
    """
    from detens.report.page import check_page_replaceable, page_writes, write_report

    if options.examples < 0:
        raise UsageError(f"--examples must be >= 0, got {options.examples}")
    if not 0.0 <= options.conf <= 1.0:
        raise UsageError(f"--conf must be in [0, 1], got {options.conf}")
    check_writable_folder(options.out, "--out")
    check_page_replaceable(options.out, "--out")
    # the table and its record stay what the page was drawn from, never a file of the page
    for what, path in (("EVALUATION", Path(options.evaluation)), ("its record", record_path(options.evaluation))):
        if page_writes(options.out, path):
            raise UsageError(
                f"the page in --out {options.out} would write over {path} ({what}); give the page a folder of its own"
            )
    check_given_folder("--images", options.images)
    record = EvaluationRecord.load(options.evaluation)
    # a page's page.json in a prediction folder it was evaluated on would be read there as a member's results
    fit_on = record.meta.get("fit_on") or {}
    read = (("the evaluation's predictions", record.meta.get("predictions")),
            ("the evaluation's fitting data", fit_on.get("predictions")))
    refuse_results_in_prediction_folders(
        [("the report page's numbers", Path(options.out) / "page.json")],
        [(what, Path(folder)) for what, folder in read if isinstance(folder, str) and Path(folder).is_dir()],
    )
    page = write_report(
        record, options.out, images_dir=options.images, examples=options.examples, conf=options.conf,
        command=shlex.join(options.command_line) if options.command_line else None,
    )
    print(f"page: {page}")
    return 0
