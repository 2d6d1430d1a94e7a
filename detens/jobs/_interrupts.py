"""What counts as a Ctrl-C in the jobs and the command line, and how a job ends on one."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import NoReturn

from detens._termination import Terminated, raise_terminated

__all__ = ["RESUME_ADVICE", "CtrlCHeld", "ctrl_c_held", "is_interruption", "raise_interruption"]

#: the attribute, set True, of the log record by which an interrupted fuse run says its finished images are
#: saved and how to resume it, so that a caller whose runs cannot resume (``detens bench``, in a temporary
#: folder) can drop it
RESUME_ADVICE = "detens_resume_advice"


def is_interruption(err: BaseException) -> bool:
    """Whether ``err`` is a Ctrl-C: a KeyboardInterrupt, or an error raised while one was being handled.

    Code that a KeyboardInterrupt leaves in a broken state (a lock released twice in Ray's batching thread)
    fails with an error of its own, which stands for the interruption, not for a bug or a user's mistake.
    """
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__context__
    return False


def raise_interruption(err: BaseException) -> NoReturn:
    """Raise the KeyboardInterrupt of the Ctrl-C ``err`` (:func:`is_interruption`), for a job that has saved
    its finished work: ``err`` itself, or one caused by ``err`` where it is the error of code the Ctrl-C broke,
    so that a Python caller's ``except KeyboardInterrupt`` stops on either (the command line reports both alike)."""
    if isinstance(err, KeyboardInterrupt):
        raise err
    raise KeyboardInterrupt from err


class CtrlCHeld:
    """What :func:`ctrl_c_held` saw: ``pressed`` is True once a Ctrl-C (or a SIGTERM the command line takes
    as one) came while it held them; ``interruption()`` is the exception to stop with after the block."""

    pressed: bool = False
    terminated: bool = False

    def interruption(self) -> KeyboardInterrupt:
        return Terminated() if self.terminated else KeyboardInterrupt()


@contextlib.contextmanager
def ctrl_c_held() -> Iterator[CtrlCHeld]:
    """Hold back a Ctrl-C for a block that must not stop half done (the files of a run that belong
    together); the caller reads ``pressed`` of what it yields and stops after the block.

    A Ctrl-C is held where it would raise a KeyboardInterrupt, in the main thread under Python's own
    handler, and so is a SIGTERM under the command line's (:func:`~detens._termination.sigterm_as_interruption`);
    a handler of the program's own is left to do what it does, and in another thread a signal raises
    nothing to hold.
    """
    held = CtrlCHeld()
    if threading.current_thread() is not threading.main_thread():
        yield held
        return

    def hold(signum: int, frame: object) -> None:
        held.pressed = True
        held.terminated = held.terminated or signum == signal.SIGTERM

    taken = {
        signum: handler
        for signum, handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, raise_terminated))
        if signal.getsignal(signum) is handler
    }
    for signum in taken:
        signal.signal(signum, hold)
    try:
        yield held
    finally:
        for signum, handler in taken.items():
            signal.signal(signum, handler)
