"""Write the HTML report page of a saved evaluation, without fitting or fusing again.

    detens report results.json --out report/ [--images DIR] [--examples 3] [--conf 0.3]

EVALUATION is the ``--out`` of ``detens evaluate`` (its ``<out>.evaluation.json.gz`` beside it is read) or
that record itself. The page (``index.html`` with its PNGs and ``page.json``, the numbers on it) shows
the metrics table with the best of each column marked, precision-recall curves at IoU 0.5 and 0.75, the
per-class AP changes of the best fused method against the best single model, the TIDE error breakdown,
reliability diagrams, how many members support each fused true and false positive, and the images where
fusion helped most and hurt most. It opens from disk: inline CSS, no script, nothing fetched.

Given the table, the record must hold that very table: a table beside the record of another run (a
``detens evaluate`` killed between writing the two) is refused, naming the rows that differ; a
``<out>.partial.json`` beside them, left by a run that did not finish, is warned about.

The page is drawn whole before it replaces the one in ``--out``: a mistake (an image to draw missing from
``--images`` or unreadable, a record that does not give its table) is one ``error:`` line and leaves
``--out`` as it was. The images to draw are picked and read first, from the table's best single model and
best fused method, so an image missing from the folder is reported before any method's figures are
computed. The earlier page's files that the new one lacks are removed; other files stay. A page that would
write over EVALUATION or its record (``--out`` the folder that holds them and EVALUATION named like a file
of the page, ``page.json`` or ``index.html``) is refused before anything is drawn.
"""

from __future__ import annotations

import argparse

from detens.cli import finite_number, folder_path, integer, run_command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("evaluation", help="the --out JSON of detens evaluate, or its .evaluation.json.gz")
    parser.add_argument(
        "--out", type=folder_path, required=True, metavar="DIR", help="the page's folder (index.html and PNGs)"
    )
    parser.add_argument(
        "--images", metavar="DIR",
        help="the scored images, for the side-by-sides (default: the folder the evaluation found); "
        "every image to draw must be in it",
    )
    parser.add_argument(
        "--examples", type=integer, default=3,
        help="images where fusion helped most, and as many where it hurt most (0: none)",
    )
    parser.add_argument(
        "--conf", type=finite_number, default=0.3,
        help="side-by-sides draw detections scored at least this; a vote histogram counts them",
    )


def run(args: argparse.Namespace) -> int:
    from detens.jobs.report import ReportOptions, run

    return run(ReportOptions.from_namespace(args))


def main(argv: list[str] | None = None) -> int:
    return run_command("report", argv)
