"""Fixtures shared by several test modules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

_HOLD = """
import sys
from detens.io import output_lock
with output_lock(sys.argv[1], sys.argv[3], sys.argv[2]):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def lock_in_another_process():
    """``lock(folder, name=".detens.lock", command="detens fuse")``: another process holding the output lock of
    ``folder`` as ``command`` until the test ends (or the test kills it: ``.kill()`` on the returned process)."""
    started = []

    def lock(folder, name=".detens.lock", command="detens fuse"):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        process = subprocess.Popen([sys.executable, "-c", _HOLD, str(folder), name, command], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True, env=env)
        started.append(process)
        assert process.stdout.readline().strip() == "held"
        return process

    yield lock
    for process in started:
        process.kill()
        process.wait()


@pytest.fixture
def immutable(monkeypatch):
    """``mark(*paths)``: the files at ``paths`` behave as ``chattr +i`` makes them, in this process: opening one
    for writing, and replacing, renaming or removing it, fail with EPERM, whoever runs the tests (root too,
    whom no permission bit stops; ``chattr`` itself needs root and a file system that keeps the mark)."""
    import errno

    marked: set[str] = set()
    real_open, real_replace, real_rename, real_unlink = os.open, os.replace, os.rename, os.unlink

    def check(*paths):
        for path in paths:
            if isinstance(path, (str, os.PathLike)) and os.path.abspath(path) in marked:
                raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), os.fspath(path))

    def opened(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC):
            check(path)
        return real_open(path, flags, *args, **kwargs)

    def replaced(src, dst, *args, **kwargs):
        check(src, dst)
        return real_replace(src, dst, *args, **kwargs)

    def renamed(src, dst, *args, **kwargs):
        check(src, dst)
        return real_rename(src, dst, *args, **kwargs)

    def unlinked(path, *args, **kwargs):
        check(path)
        return real_unlink(path, *args, **kwargs)

    for name, fake in (("open", opened), ("replace", replaced), ("rename", renamed), ("unlink", unlinked)):
        monkeypatch.setattr(os, name, fake)
    return lambda *paths: marked.update(os.path.abspath(path) for path in paths)


@pytest.fixture
def named_pipe():
    """``make(path)``: a named pipe (FIFO) at ``path``, returned. Opening it to read waits for a writer: should
    the code under test do so, the pipe is opened for writing and closed at once, so that the read ends (with
    no data) and the test fails on what it finds instead of hanging."""
    import threading

    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes here")
    stop = threading.Event()
    pipes = []

    def unblock_readers():
        while not stop.wait(0.05):
            for path in pipes:
                try:  # succeeds only while a reader has the pipe open
                    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass

    watcher = threading.Thread(target=unblock_readers, daemon=True)
    watcher.start()

    def make(path):
        os.mkfifo(path)
        pipes.append(path)
        return path

    yield make
    stop.set()
    watcher.join()


@pytest.fixture(autouse=True)
def _no_weights_folders_of_the_environment(monkeypatch):
    """Weights are looked up in ``$DETENS_WEIGHTS`` before ``--weights-dir`` and a config's folder: a value
    set in the developer's shell would decide which files the tests load. Tests that need it set it."""
    monkeypatch.delenv("DETENS_WEIGHTS", raising=False)


@pytest.fixture
def real_signals_handled():
    """For a test that raises a real SIGINT in the test process, the state of an interactive one:

    - Python's own SIGINT handler, which raises KeyboardInterrupt. A process started in the background of a
      shell without job control (``cmd &`` in a script, as some CI runners start theirs) begins with SIGINT
      ignored, and Python then installs no handler.
    - An alternate signal stack that is valid. An OpenVINO model that an earlier test loaded through
      Ultralytics directly (not through detens' adapter, which guards against it) may have left the process
      on a freed one, on which the handler would crash.
    """
    import signal

    from detens.adapters._signal_stack import install_lasting_signal_stack

    install_lasting_signal_stack()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _ctrl_c() -> None:
    raise KeyboardInterrupt


def _error_while_ctrl_c_is_handled() -> None:
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:  # as a lock that Ray's batching thread releases twice
        raise RuntimeError("release unlocked lock") from None


@pytest.fixture(params=[_ctrl_c, _error_while_ctrl_c_is_handled], ids=["ctrl-c", "error while ctrl-c is handled"])
def press_ctrl_c(request):
    """A function that stops the code calling it as a Ctrl-C does: a KeyboardInterrupt, or an error that code
    left broken by one raises while the interrupt is handled (both end as the interruption)."""
    return request.param


@pytest.fixture
def lopsided_theta_head(tmp_path):
    """``make(names)``: a Θ head of two models that trusts the first far more than the second, and the path
    of its saved file: taking the models in the wrong order changes its fused boxes."""

    def make(names):
        import torch

        from detens import ThetaHead

        head = ThetaHead(list(names))
        with torch.no_grad():
            head.theta.copy_(torch.tensor([0.9, 0.1]))
        path = tmp_path / f"lopsided_{'_'.join(names)}.json"
        head.save(path)
        return head, path

    return make


@pytest.fixture(scope="session")
def assert_fuses_alike_inside_autocast():
    """``(head, per_model, dtype)``: check that ``head`` fuses ``per_model`` (directly after matching, and
    through ``detens.fuse``) to the same boxes, scores and labels inside a ``torch.autocast`` region of
    ``dtype`` as outside it. A pipeline that runs its detectors under autocast often fuses in that region."""

    def check(head, per_model, dtype):
        import torch

        from detens import fuse, match

        clusters = match(per_model, 0.55)
        expected, expected_via_fuse = head.fuse(clusters), fuse(per_model, "theta", head=head)
        with torch.autocast("cpu", dtype=dtype):
            got, got_via_fuse = head.fuse(clusters), fuse(per_model, "theta", head=head)
        for a, b in ((got, expected), (got_via_fuse, expected_via_fuse)):
            assert torch.equal(a.boxes, b.boxes) and torch.equal(a.scores, b.scores) and torch.equal(a.labels, b.labels)

    return check


@pytest.fixture
def jittered():
    """``jittered(model)``: ``model`` with its weights jittered in place, so that an untrained detection model's
    scores differ from box to box (as initialized, every box scores about 1/91)."""

    def jitter(model):
        import torch

        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
        return model

    return jitter


def _with_orientation_tag(data: bytes, orientation: int) -> bytes:
    # APP1 Exif: a big-endian TIFF header and one IFD entry, Orientation (0x0112), a SHORT
    exif = (b"Exif\x00\x00MM\x00\x2a\x00\x00\x00\x08\x00\x01\x01\x12\x00\x03\x00\x00\x00\x01\x00"
            + bytes([orientation]) + b"\x00\x00\x00\x00\x00\x00")
    return data[:2] + b"\xff\xe1" + (len(exif) + 2).to_bytes(2, "big") + exif + data[2:]


@pytest.fixture(scope="session")
def with_orientation_tag():
    """``(jpeg bytes, orientation) -> jpeg bytes`` with an EXIF orientation tag after the SOI marker."""
    return _with_orientation_tag
