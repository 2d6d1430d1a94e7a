"""Logging set-up of the `detens` commands: log lines above progress bars, quiet detector libraries."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

from tqdm import tqdm

__all__ = ["log_above_progress_bars", "native_stderr_silenced", "quiet_libraries"]


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


def quiet_libraries() -> None:
    """Silence the detector libraries' loading chatter (Ultralytics' model summaries, LiteRT/TensorFlow
    and OpenVINO info lines); warnings and errors still show."""
    os.environ.setdefault("YOLO_VERBOSE", "False")  # read when ultralytics is first imported
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for name in ("ultralytics", "openvino", "onnxruntime"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if "ultralytics" in sys.modules:  # imported already: its verbosity flag was read at import
        from ultralytics.utils import LOGGER

        LOGGER.setLevel(logging.WARNING)


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Send what native libraries write to file descriptor 2 (LiteRT's "Created TensorFlow Lite XNNPACK
    delegate" and the like, which no setting turns off) to /dev/null, while Python's ``sys.stderr``
    (log records, ``error:`` lines) keeps writing to the real stderr."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real file descriptor 2 (an embedding host): nothing to silence
        yield
        return
    python_stderr = sys.stderr
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1, encoding="utf-8", errors="backslashreplace")
        try:
            yield
        finally:
            sys.stderr.flush()
            sys.stderr.close()
            sys.stderr = python_stderr
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
