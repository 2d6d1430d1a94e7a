"""Logging set-up of the `detens` commands: log lines above progress bars, quiet detector libraries."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

from tqdm import tqdm

__all__ = ["libraries_quieted", "log_above_progress_bars", "native_stderr_silenced", "quiet_libraries", "quieted"]


class _TqdmHandler(logging.Handler):
    """Log lines printed above the progress bar instead of through it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # pragma: no cover - logging must never raise
            self.handleError(record)


@contextlib.contextmanager
def log_above_progress_bars(quiet: bool) -> Iterator[None]:
    """Route the root logger through tqdm (INFO, or WARNING when ``quiet``) for a block, its own handlers
    set aside; on the way out they and its level are as they were, so that a caller that runs a command
    in its process (``bench`` runs ``fuse --quiet``) keeps logging as before."""
    root = logging.getLogger()
    level, handlers = root.level, root.handlers[:]
    handler = _TqdmHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING if quiet else logging.INFO)
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


#: What the detector libraries read at import to decide how much they say.
_QUIET_ENVIRON = {"YOLO_VERBOSE": "False", "TF_CPP_MIN_LOG_LEVEL": "2"}
_QUIET_LOGGERS = ("ultralytics", "openvino", "onnxruntime")


def quiet_libraries() -> None:
    """Silence the detector libraries' loading chatter (Ultralytics' model summaries, LiteRT/TensorFlow
    and OpenVINO info lines); warnings and errors still show. Left so for the rest of the process:
    :func:`libraries_quieted` puts it back."""
    for key, value in _QUIET_ENVIRON.items():  # a value the user set is theirs to keep
        os.environ.setdefault(key, value)
    for name in _QUIET_LOGGERS:  # "ultralytics" is Ultralytics' LOGGER, when imported already
        logging.getLogger(name).setLevel(logging.WARNING)


@contextlib.contextmanager
def libraries_quieted() -> Iterator[None]:
    """:func:`quiet_libraries` for a block, and on its way out (returned or raised) the environment and
    logger levels as they were.

    Ultralytics imported within the block read ``YOLO_VERBOSE=False`` into its ``VERBOSE`` flag and its
    logger; they are set up again as an import after the block would set them.
    """
    added = [key for key in _QUIET_ENVIRON if key not in os.environ]
    levels = {name: logging.getLogger(name).level for name in _QUIET_LOGGERS}
    had_ultralytics = "ultralytics.utils" in sys.modules
    quiet_libraries()
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)
        utils = None if had_ultralytics else sys.modules.get("ultralytics.utils")
        for name, level in levels.items():
            if not (name == "ultralytics" and utils is not None):  # set by its import within the block
                logging.getLogger(name).setLevel(level)
        if utils is not None and "YOLO_VERBOSE" in added:
            utils.VERBOSE = True  # the default of an unset YOLO_VERBOSE
            utils.set_logging(utils.LOGGING_NAME, verbose=True)


def _stderr_is_fd_2() -> bool:
    try:
        return sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):
        return False


@contextlib.contextmanager
def quieted(quiet: bool, *, only_where_stderr_is_fd_2: bool = False) -> Iterator[None]:
    """``--quiet`` for a block (nothing when ``quiet`` is False): :func:`libraries_quieted` and
    :func:`native_stderr_silenced`, both undone on the way out.

    Args:
        only_where_stderr_is_fd_2: silence file descriptor 2 only where Python's ``sys.stderr`` writes to
            it: for the Python calls, whose caller may have its own ``sys.stderr`` (a notebook's), which the
            silencing would replace by a copy of descriptor 2 and which native lines do not reach anyway.
            The commands silence it wherever descriptor 2 exists.
    """
    if not quiet:
        yield
        return
    silence = not only_where_stderr_is_fd_2 or _stderr_is_fd_2()
    with libraries_quieted(), native_stderr_silenced() if silence else contextlib.nullcontext():
        yield


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
