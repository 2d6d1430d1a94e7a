"""Evaluation reports: the results table, its figures, and the static HTML page of ``detens report``.

- :mod:`~detens.report.table`: ``markdown_table``, ``best_per_column``;
- :mod:`~detens.report.plots`: the PNG figures (``plot_report``, ``plot_reliability``, ...);
- :mod:`~detens.report.record`: ``EvaluationRecord``, what an evaluation saves so its page can be rebuilt;
- :mod:`~detens.report.page`: ``write_report``, the page itself (``index.html`` and its PNGs).

matplotlib and OpenCV are imported only when a figure or an image is drawn.
"""

from __future__ import annotations

from detens.report.plots import plot_reliability, plot_report
from detens.report.table import REPEATED_COLUMNS, TABLE_COLUMNS, best_per_column, markdown_table

__all__ = ["REPEATED_COLUMNS", "TABLE_COLUMNS", "best_per_column", "markdown_table", "plot_report", "plot_reliability"]
