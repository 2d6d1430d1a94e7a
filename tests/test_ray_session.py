"""ray_session's hold on the process's Ray logging state: quiet when asked, and everything it changed put
back when it ends. Ray's own init and shutdown are stood in for, so no cluster starts; what is checked is
the state of Ray's real loggers and Ray Data's real DataContext."""

from __future__ import annotations

import contextlib
import logging
import re

import pytest

ray = pytest.importorskip("ray")
ray_data = pytest.importorskip("ray.data")

from detens.engines.ray_cache import RayOptions, ray_session  # noqa: E402

RAY_LOGGERS = ("ray", "ray.data")


def progress_bars() -> bool:
    return ray_data.DataContext.get_current().enable_progress_bars


def state() -> tuple[dict[str, int], bool]:
    return {name: logging.getLogger(name).level for name in RAY_LOGGERS}, progress_bars()


@pytest.fixture(autouse=True)
def process_state():
    """Each test starts from levels of its own, none of them Ray's defaults, so that a level put back is
    told from one Ray sets; the process's logging is left as the test found it."""
    root = logging.getLogger()
    saved = root.level, state()
    logging.getLogger("ray").setLevel(logging.DEBUG)
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    ray_data.DataContext.get_current().enable_progress_bars = True
    yield
    root.setLevel(saved[0])
    for name, level in saved[1][0].items():
        logging.getLogger(name).setLevel(level)
    ray_data.DataContext.get_current().enable_progress_bars = saved[1][1]


class FakeRay:
    """``ray.init``, ``ray.shutdown`` and ``ray.is_initialized`` without a cluster; ``init`` sets the ``ray``
    logger's level as the real one does (``logging_level``, INFO by default)."""

    def __init__(self, monkeypatch, initialized=False, fail=None):
        self.initialized, self.fail, self.calls = initialized, fail, []
        monkeypatch.setattr(ray, "is_initialized", lambda: self.initialized)
        monkeypatch.setattr(ray, "init", self.init)
        monkeypatch.setattr(ray, "shutdown", self.shutdown)
        monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 1.0})

    def init(self, **kwargs):
        self.calls.append(("init", kwargs))
        logging.getLogger("ray").setLevel(kwargs.get("logging_level", logging.INFO))
        if self.fail is not None:
            raise self.fail
        self.initialized = True

    def shutdown(self):
        self.calls.append(("shutdown", {}))
        self.initialized = False


BEFORE = ({"ray": logging.DEBUG, "ray.data": logging.WARNING}, True)
QUIETED = ({"ray": logging.ERROR, "ray.data": logging.ERROR}, False)


@pytest.mark.parametrize("initialized", [False, True], ids=["started here", "already running"])
def test_quiet_lasts_for_the_session_only(monkeypatch, initialized):
    fake = FakeRay(monkeypatch, initialized)
    assert state() == BEFORE
    with ray_session(RayOptions(), quiet=True):
        assert state() == QUIETED
    assert state() == BEFORE
    started = [] if initialized else [("init", {"include_dashboard": False, "log_to_driver": False,
                                                "logging_level": logging.ERROR}), ("shutdown", {})]
    assert fake.calls == started


def test_quiet_false_leaves_ray_as_it_is_whatever_the_root_logger_says(monkeypatch):
    """A plain Python session's root logger is at WARNING: it is no request to be quiet."""
    fake = FakeRay(monkeypatch)
    logging.getLogger().setLevel(logging.WARNING)
    with ray_session(RayOptions(), quiet=False):
        assert state() == ({"ray": logging.INFO, "ray.data": logging.WARNING}, True)  # INFO: ray.init's own
    assert fake.calls[0] == ("init", {"include_dashboard": False, "log_to_driver": False})
    assert state() == BEFORE  # ray.init's level is put back too


@pytest.mark.parametrize("root", [logging.INFO, logging.WARNING])
def test_without_quiet_ray_is_left_as_it_is_whatever_the_root_logger_says(monkeypatch, root):
    FakeRay(monkeypatch, initialized=True)
    logging.getLogger().setLevel(root)
    with ray_session(RayOptions()):
        assert state() == BEFORE
    assert state() == BEFORE


def test_the_state_comes_back_when_the_block_raises(monkeypatch):
    fake = FakeRay(monkeypatch)
    with pytest.raises(KeyError, match="in the block"), ray_session(RayOptions(), quiet=True):
        raise KeyError("in the block")
    assert state() == BEFORE and [name for name, _ in fake.calls] == ["init", "shutdown"]


def test_the_state_comes_back_when_ray_init_fails(monkeypatch):
    monkeypatch.setattr("detens.engines.ray_cache.check_cluster_answers", lambda *args: None)  # something answers
    fake = FakeRay(monkeypatch, fail=ConnectionError("no cluster at ray://nowhere:10001"))
    session = ray_session(RayOptions(address="ray://nowhere:10001"), quiet=True)
    with pytest.raises(ConnectionError, match="no cluster"), session:
        pytest.fail("the block ran without a cluster")
    assert state() == BEFORE
    assert [name for name, _ in fake.calls] == ["init"] and not session.started  # nothing to shut down


def test_the_state_comes_back_when_shutdown_fails(monkeypatch):
    FakeRay(monkeypatch)

    def shutdown():
        raise RuntimeError("shutdown failed")

    monkeypatch.setattr(ray, "shutdown", shutdown)
    with pytest.raises(RuntimeError, match="shutdown failed"), ray_session(RayOptions(), quiet=True):
        assert state() == QUIETED
    assert state() == BEFORE


@pytest.mark.parametrize("quiet", ["yes", 1, 0.0])
def test_quiet_must_be_a_bool(quiet):
    with pytest.raises(TypeError, match=f"quiet must be True or False, got {type(quiet).__name__}"):
        ray_session(RayOptions(), quiet=quiet)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"actors": 2.5}, TypeError, r"actors must be an integer, got float: 2\.5"),
        ({"actors": "2"}, TypeError, r"actors must be an integer, got str"),
        ({"actors": True}, TypeError, r"actors must be an integer, got bool"),
        ({"actors": 0}, ValueError, r"actors must be an integer >= 1, got 0"),
        ({"num_cpus": 2.5}, TypeError, r"num_cpus must be an integer, got float: 2\.5"),
        ({"num_cpus": "2"}, TypeError, r"num_cpus must be an integer, got str"),
        ({"num_cpus": 0}, ValueError, r"num_cpus must be an integer >= 1, got 0"),
        ({"num_gpus": "1"}, TypeError, r"num_gpus must be a number, got str"),
        ({"num_gpus": -1}, ValueError, r"num_gpus must be .*0.*, got -1"),
        ({"num_gpus": float("nan")}, ValueError, r"num_gpus must be"),
        ({"address": 10001}, TypeError, r"address must be a str, got int"),
        ({"address": " "}, ValueError, r"^address is empty: give a cluster's address \(auto, host:port, ray://host:10001\), "
                                       r"or None to start a local cluster$"),
        *(({"address": address}, ValueError, rf"^address {re.escape(repr(address))} is not a Ray cluster's address: "
           r"give host:port \(a cluster's GCS, port 6379 by default\), ray://host:port \(its Ray Client server, port "
           r"10001 by default\) or auto \(the cluster started on this machine by ray start\)$")
          for address in ("not an address", "host:port", "head", "ray://head", "http://head:8265", "head:0",
                          "head:65536", " head:6379", "AUTO")),
        ({"address": "auto", "num_cpus": 2}, ValueError,
         r"^num_cpus=2 sizes a local cluster to start, but address 'auto' names an existing one, which has its own "
         r"CPUs: give one or the other$"),
        ({"address": "ray://head:10001", "num_cpus": 2}, ValueError, r"address 'ray://head:10001' names an existing"),
    ],
)
def test_ray_options_of_another_kind_or_out_of_range_are_named(options, error, message):
    """A count is never truncated (2.5 actors are not 2) nor read from a string."""
    with pytest.raises(error, match=message):
        RayOptions(**options)


@pytest.mark.parametrize("address", ["auto", "local", "head:6379", "10.0.0.5:1", "[::1]:6379", "ray://head:10001",
                                     "ray://10.0.0.5:65535", "head-node.example.com:6379"])
def test_ray_options_take_each_form_of_address_ray_init_takes(address):
    assert RayOptions(address=address).address == address
    assert RayOptions(address="local", num_cpus=2).num_cpus == 2  # a new local cluster, sized


def test_ray_options_keep_numpy_numbers_as_the_python_numbers_they_hold():
    import numpy as np

    options = RayOptions(actors=np.int64(3), num_cpus=np.int32(2), num_gpus=np.float32(0.5))
    assert (options.actors, options.num_cpus, options.num_gpus) == (3, 2, 0.5)
    assert [type(v) for v in (options.actors, options.num_cpus, options.num_gpus)] == [int, int, float]
    assert RayOptions().gpus_per_actor() in (0.0, 1.0) and RayOptions(num_gpus=0.25).gpus_per_actor() == 0.25


@pytest.mark.parametrize("from_environment", [False, True])
def test_an_address_where_no_cluster_answers_is_refused_before_ray_waits_for_it(monkeypatch, from_environment):
    """ray.init given such an address waited without end, logging a timeout every 30 seconds."""
    import socket

    fake = FakeRay(monkeypatch)
    with socket.socket() as listener:  # a port just freed: nothing answers there
        listener.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{listener.getsockname()[1]}"
    if from_environment:
        monkeypatch.setenv("RAY_ADDRESS", f"ray://{address}")
    else:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    options = RayOptions() if from_environment else RayOptions(address=address)
    what = f"$RAY_ADDRESS 'ray://{address}'" if from_environment else f"address '{address}'"
    with pytest.raises(ConnectionError, match=rf"^no Ray cluster answers at the {re.escape(what)} \(.*\): start one "
                                              r"there \(ray start --head\), or give no address"):
        with ray_session(options, quiet=True):
            pass
    assert fake.calls == [] and state() == BEFORE


def test_an_address_that_answers_or_that_ray_resolves_itself_goes_to_ray(monkeypatch):
    import socket

    from detens.engines.ray_address import check_cluster_answers

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        check_cluster_answers(address)
        check_cluster_answers(f"ray://{address}")
        fake = FakeRay(monkeypatch)
        with ray_session(RayOptions(address=address)):
            pass
    assert fake.calls[0] == ("init", {"include_dashboard": False, "log_to_driver": False, "address": address})
    for left_to_ray in ("auto", "local", "no-port-here"):
        check_cluster_answers(left_to_ray)


class FakeRayWithSigterm(FakeRay):
    """``init`` sets a SIGTERM handler of its own, as the real one does (``sys.exit(signum)``)."""

    def init(self, **kwargs):
        import signal
        import sys

        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
        super().init(**kwargs)


@pytest.mark.parametrize("fail", [None, ConnectionError("no cluster")], ids=["started", "init failed"])
def test_the_commands_sigterm_handler_stands_during_the_session_and_the_one_before_after_it(monkeypatch, fail):
    """ray.init replaced the command line's SIGTERM handler (a SIGTERM taken as a Ctrl-C, which saves the
    finished images) with its own, which ended the run in a traceback and exit status 15, and outlived the
    session in a Python caller's process."""
    import signal

    from detens._termination import raise_terminated, sigterm_as_interruption

    monkeypatch.setattr("detens.engines.ray_cache.check_cluster_answers", lambda *args: None)
    before = signal.getsignal(signal.SIGTERM)
    for command_line in (True, False):
        FakeRayWithSigterm(monkeypatch, fail=fail)
        outer = signal.getsignal(signal.SIGTERM) if not command_line else raise_terminated
        with sigterm_as_interruption() if command_line else contextlib.nullcontext():
            try:
                with ray_session(RayOptions()):
                    during = signal.getsignal(signal.SIGTERM)
                    # the command's handler; a Python caller's process has Ray's for the session
                    assert during is raise_terminated if command_line else during not in (before, raise_terminated)
            except ConnectionError:
                assert fail is not None
            assert signal.getsignal(signal.SIGTERM) is outer
        assert signal.getsignal(signal.SIGTERM) is before


@pytest.fixture
def clusters_on_this_machine(monkeypatch):
    """What ``auto`` finds, in place of Ray's own look (its temporary folder's record of the last ``ray
    start``, then the processes of this machine, where another user's cluster may run): set ``recorded``
    and ``running``."""
    from ray._private import services

    found = type("Found", (), {"recorded": None, "running": frozenset()})()
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: found.recorded)
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: found.running)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return found


def test_auto_that_finds_no_cluster_is_refused_in_the_engines_words(monkeypatch, clusters_on_this_machine):
    """Ray's ConnectionError named a `--address` flag that is none of the engine's."""
    fake = FakeRay(monkeypatch)
    for name in ("address", "--ray-address"):
        with pytest.raises(ConnectionError, match=rf"^{name} 'auto' finds no Ray cluster running on this machine: "
                                                  r"start one \(ray start --head\), give a cluster's host:port or "
                                                  r"ray://host:port, or give no address to start a local cluster$"):
            with ray_session(RayOptions(address="auto"), address_name=name):
                pass
    assert fake.calls == [] and state() == BEFORE
    clusters_on_this_machine.running = frozenset({"10.0.0.5:6379"})
    with ray_session(RayOptions(address="auto")):
        pass
    assert fake.calls[0] == ("init", {"include_dashboard": False, "log_to_driver": False, "address": "auto"})


def test_ray_address_from_the_environment_is_checked_as_an_address_is(monkeypatch):
    fake = FakeRay(monkeypatch)
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")  # a dashboard's, where Ray Jobs were meant
    with pytest.raises(ValueError, match=r"^\$RAY_ADDRESS 'http://head:8265' is not a Ray cluster's address: give "
                                         r"host:port"):
        with ray_session(RayOptions(address="auto")):  # which the environment's stands for, as for None
            pass
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    with pytest.raises(ValueError, match=r"^num_cpus=2 sizes a local cluster to start, but \$RAY_ADDRESS "
                                         r"'head:6379' names an existing one"):
        with ray_session(RayOptions(num_cpus=2)):
            pass
    monkeypatch.setenv("RAY_ADDRESS", " ")  # said as an empty option is, in the words of an environment variable
    with pytest.raises(ValueError, match=r"^\$RAY_ADDRESS is empty: give a cluster's address \(auto, host:port, "
                                         r"ray://host:10001\), or unset it to start a local cluster$"):
        with ray_session(RayOptions()):
            pass
    assert fake.calls == []
    with ray_session(RayOptions(address="local", num_cpus=2)):  # a new local cluster, the environment's or not
        pass
    assert fake.calls[0] == ("init", {"include_dashboard": False, "log_to_driver": False, "address": "local",
                                      "num_cpus": 2})


def test_a_ray_client_session_is_named_by_its_servers_address(monkeypatch):
    """A process joined through Ray Client (``ray.init("ray://head:10001")``) has no GCS address of its own to
    compare: the server it joined is the one a ``ray://`` address must name. (``ray[client]`` is no
    dependency of the engine; its session stands in here.)"""
    from types import SimpleNamespace

    from ray.util.client import ray as client

    from detens.engines.ray_address import check_running_session

    monkeypatch.setattr(client, "is_connected", lambda: True)
    monkeypatch.setattr(client, "get_context", lambda: SimpleNamespace(client_worker=SimpleNamespace(
        _conn_str="127.0.0.1:10001")))
    for same in (None, "ray://127.0.0.1:10001", "ray://localhost:10001"):
        check_running_session(same, None)
    for other in ("ray://127.0.0.1:10002", "127.0.0.1:10001", "ray://10.0.0.5:10001"):
        with pytest.raises(ValueError, match=rf"joined to the cluster at 'ray://127\.0\.0\.1:10001', which the "
                                             rf"address {re.escape(repr(other))} does not name"):
            check_running_session(other, None)
    monkeypatch.setattr(client, "get_context", lambda: SimpleNamespace(client_worker=SimpleNamespace()))
    for any_address in ("ray://127.0.0.1:10001", "ray://10.0.0.5:10001", "127.0.0.1:6379"):
        check_running_session(any_address, None)  # a server the session does not name cannot be told apart
