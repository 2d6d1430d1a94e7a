"""A lasting alternate signal stack for the threads that load OpenVINO models.

OpenVINO's CPU plugin gives the thread that compiles a model an alternate signal stack of its own
(``sigaltstack``), and when the plugin instance is destroyed it puts back the stack that was in place before
it, freeing its own. Two models loaded in turn and freed in the same order (the first, then the second)
leave the thread on the first model's stack, already freed: the next signal handled on the alternate stack
(Python's own SIGINT handler is installed with ``SA_ONSTACK``) kills the process with a segmentation fault,
so a Ctrl-C no longer saves the finished work. Measured with openvino 2026.4.1, two ``ov.Core`` objects
and one ``compile_model`` each.

:func:`install_lasting_signal_stack`, called before each load and prediction of an OpenVINO model, gives
the thread a stack that is never freed: every plugin instance then records that stack as the one to put
back, whatever the order in which they are destroyed. Linux only (``stack_t``'s layout differs elsewhere;
another platform keeps its stacks as they are).
"""

from __future__ import annotations

import ctypes
import sys
import threading
from functools import cache
from pathlib import Path

__all__ = ["install_lasting_signal_stack", "is_openvino_export"]

#: bytes of each lasting stack: more than Python's faulthandler allocates, which runs on whatever stack is current
STACK_BYTES = 1 << 16
_SS_ONSTACK = 1


class _StackT(ctypes.Structure):
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


#: thread id -> its lasting stack, kept for the life of the process (a stack in use must never be freed)
_STACKS: dict[int, ctypes.Array[ctypes.c_char]] = {}
_LOCK = threading.Lock()


@cache
def _sigaltstack() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sigaltstack
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.POINTER(_StackT), ctypes.POINTER(_StackT)]
    function.restype = ctypes.c_int
    return function


def current_signal_stack() -> tuple[int, int] | None:
    """``(address, size)`` of the calling thread's alternate signal stack (``(0, 0)`` for none); None where
    this module does not manage stacks."""
    sigaltstack = _sigaltstack()
    if sigaltstack is None:
        return None
    current = _StackT()
    if sigaltstack(None, ctypes.byref(current)) != 0:
        return None
    return int(current.ss_sp or 0), int(current.ss_size)


def install_lasting_signal_stack() -> bool:
    """Make a stack that is never freed the calling thread's alternate signal stack (see the module
    docstring); returns whether the thread is on it now. Nothing changes while the thread runs a signal
    handler on its current stack, nor off Linux."""
    sigaltstack = _sigaltstack()
    if sigaltstack is None:
        return False
    current = _StackT()
    if sigaltstack(None, ctypes.byref(current)) != 0 or current.ss_flags & _SS_ONSTACK:
        return False
    with _LOCK:
        stack = _STACKS.setdefault(threading.get_ident(), ctypes.create_string_buffer(STACK_BYTES))
    address = ctypes.addressof(stack)
    if current.ss_sp == address:
        return True
    return sigaltstack(ctypes.byref(_StackT(address, 0, STACK_BYTES)), None) == 0


def is_openvino_export(path: str) -> bool:
    """Whether ``path`` is an OpenVINO model: an ``.xml`` file, or a folder holding one (Ultralytics'
    ``*_openvino_model`` exports)."""
    model = Path(path)
    if model.suffix.lower() == ".xml":
        return True
    return model.is_dir() and any(model.glob("*.xml"))
