"""What counts as a Ctrl-C in the jobs and the command line."""

from __future__ import annotations

__all__ = ["is_interruption"]


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
