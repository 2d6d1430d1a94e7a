"""Logging set-up shared by the command-line tools (``tools/*.py``)."""

from __future__ import annotations

import logging
import sys

from tqdm import tqdm

__all__ = ["log_above_progress_bars"]


class _TqdmHandler(logging.Handler):
    """Log lines printed above the progress bar instead of through it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # pragma: no cover - logging must never raise
            self.handleError(record)


def log_above_progress_bars(quiet: bool) -> None:
    """Route the root logger through tqdm (INFO, or WARNING when ``quiet``), replacing its handlers."""
    handler = _TqdmHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, handlers=[handler], force=True)
