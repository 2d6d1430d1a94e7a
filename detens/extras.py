"""The optional dependencies of detens (its extras: ``ray``, ``onnx``, ``supervision``) and the error that says
one is not installed."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["MissingExtraError", "import_extra"]


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message says what to install.

    A setup step the user has left to do, not a fault of the program: the ``detens`` command reports it as
    one ``error:`` line, as it does a bad flag. Other ImportErrors (a broken install, a bug) keep their
    traceback.
    """


def import_extra(module: str, message: str) -> Any:
    """``import module``, or :class:`MissingExtraError` with ``message`` when it (or its top package) is not
    installed.

    An ImportError raised while an installed module imports (one of its own dependencies missing, a broken
    build) is raised as it is: ``message`` would wrongly say to install what is there.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is not None and (err.name == module or module.startswith(f"{err.name}.")):
            raise MissingExtraError(message) from err
        raise
