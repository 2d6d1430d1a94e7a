"""SIGTERM taken as a Ctrl-C by the ``detens`` command: a scheduler's stop or a plain ``kill`` saves the
finished work and ends the command as a Ctrl-C does, where Python's default would end it on the spot (and
Ray's, once ``ray.init`` has run, with a traceback).

Standard library only: the command line installs the handler before it imports anything heavy.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["Terminated", "raise_terminated", "sigterm_as_interruption", "was_terminated"]


class Terminated(KeyboardInterrupt):
    """The interruption a SIGTERM raises under :func:`sigterm_as_interruption`: a ``KeyboardInterrupt``, so
    that every job saves its finished work on it as on a Ctrl-C."""


def raise_terminated(signum: int, frame: object) -> None:
    """The SIGTERM handler of :func:`sigterm_as_interruption`."""
    raise Terminated


@contextlib.contextmanager
def sigterm_as_interruption() -> Iterator[None]:
    """Within the block, a SIGTERM to the process raises :class:`Terminated` in the main thread; the handler
    before it is put back after. Outside the main thread, where no handler can be set, it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def was_terminated(err: BaseException) -> bool:
    """Whether the interruption ``err`` (or an error raised while it was handled) came from a SIGTERM."""
    seen: set[int] = set()
    chain: list[BaseException | None] = [err]
    while chain:
        cause = chain.pop()
        if cause is None or id(cause) in seen:
            continue
        if isinstance(cause, Terminated):
            return True
        seen.add(id(cause))
        chain += [cause.__cause__, cause.__context__]
    return False
