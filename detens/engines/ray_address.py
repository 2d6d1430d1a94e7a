"""The cluster address given to the Ray engine: its form, checked before any work; the cluster ``ray.init``
joins with it (``$RAY_ADDRESS`` standing for no address and for ``auto``, as Ray reads it); whether something
answers there; and whether the Ray session already running in this process is that cluster.

An address is ``host:port`` (a cluster's GCS, port 6379 by default), ``ray://host:port`` (its Ray Client
server, port 10001 by default), ``auto`` (the cluster started on this machine by ``ray start``) or ``local``
(a new local cluster, ``$RAY_ADDRESS`` or not). Ray's own messages for what it cannot use name its own
``--address`` flag, or none, and say nothing of what it expected; these name the engine's option and the value.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket

__all__ = [
    "ADDRESS_FORMS", "CLUSTER_CONNECT_TIMEOUT_S", "check_address", "check_auto_finds_a_cluster",
    "check_cluster_answers", "check_num_cpus_with", "check_running_session", "cluster_to_join",
]

#: What an address may be, for the messages that refuse one.
ADDRESS_FORMS = (
    "host:port (a cluster's GCS, port 6379 by default), ray://host:port (its Ray Client server, port 10001 by "
    "default) or auto (the cluster started on this machine by ray start)"
)

# host: a name, an IPv4 address or a bracketed IPv6 one; another scheme (a dashboard's http://) or a space
# is a mistake, which Ray reports in words of its own, or as a host it cannot reach
_HOST_PORT = re.compile(r"(?:ray://)?(?:[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5})")

#: Seconds to wait for a cluster's address to accept a connection (Ray itself retries without end).
CLUSTER_CONNECT_TIMEOUT_S = 10.0


def check_address(address: str, name: str = "address", no_address: str = "None") -> None:
    """Raise ``ValueError`` unless ``address`` is one of :data:`ADDRESS_FORMS` or ``local``, with a port in
    [1, 65535]; ``name`` names it in the message (``--ray-address``, ``$RAY_ADDRESS``), and ``no_address``
    says how the caller gives no address, which starts a local cluster (``None``, ``leave the option out``).
    An empty one is named as such: Ray would start a local cluster, and it is most often an unset shell
    variable where a cluster was meant."""
    if not address.strip():
        raise ValueError(f"{name} is empty: give a cluster's address (auto, host:port, ray://host:10001), or "
                         f"{no_address} to start a local cluster")
    if address in ("auto", "local"):
        return
    form = _HOST_PORT.fullmatch(address)
    if form is None or not 1 <= int(form.group(1)) <= 65535:
        raise ValueError(f"{name} {address!r} is not a Ray cluster's address: give {ADDRESS_FORMS}")


def cluster_to_join(address: str | None, name: str = "address") -> tuple[str, str] | None:
    """The address that ``ray.init(address=address)`` joins a cluster at, and how a message names it
    (``name``, or ``$RAY_ADDRESS`` where that stands for None or ``auto``, as ``ray.init`` reads it); None
    where it starts a local cluster.

    Raises:
        ValueError: ``$RAY_ADDRESS``, read here, is not an address (:func:`check_address`).
    """
    from_environment = os.environ.get("RAY_ADDRESS") or None
    if from_environment is not None and address in (None, "auto"):
        check_address(from_environment, "$RAY_ADDRESS", "unset it")
        address, name = from_environment, "$RAY_ADDRESS"
    return None if address is None or address == "local" else (address, name)


def check_num_cpus_with(address: str | None, num_cpus: int | None, name: str = "address") -> None:
    """Raise ``ValueError`` where ``num_cpus``, the size of a local cluster to start, comes with the
    ``address`` of an existing cluster (``name``'s value), which has its own: ``ray.init`` refuses both in
    words of its own, or (before it) ``num_cpus`` went unused unseen."""
    if num_cpus is not None and address not in (None, "local"):
        raise ValueError(f"num_cpus={num_cpus} sizes a local cluster to start, but {name} {address!r} names an "
                         "existing one, which has its own CPUs: give one or the other")


def check_cluster_answers(address: str, what: str = "address") -> None:
    """Raise ``ConnectionError`` unless something accepts a connection at ``address`` (``host:port`` or
    ``ray://host:port``; ``auto`` and other forms are left to Ray) within
    :data:`CLUSTER_CONNECT_TIMEOUT_S`: ``ray.init`` given an address where no cluster runs waits for it
    without end, logging a timeout every 30 seconds. ``what`` names the address in the message."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CLUSTER_CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise ConnectionError(
            f"no Ray cluster answers at the {what} {address!r} ({err.strerror or err}): start one there (ray start "
            "--head), or give no address to start a local cluster"
        ) from None


def check_auto_finds_a_cluster(name: str = "address") -> None:
    """Raise ``ConnectionError`` where ``auto`` (``name``'s value, ``$RAY_ADDRESS`` unset) finds no cluster
    on this machine: Ray's own error names a ``--address`` flag that the engine does not have."""
    if not _clusters_auto_finds():
        raise ConnectionError(
            f"{name} 'auto' finds no Ray cluster running on this machine: start one (ray start --head), give a "
            "cluster's host:port or ray://host:port, or give no address to start a local cluster"
        )


def _clusters_auto_finds() -> set[str]:
    """The GCS addresses ``auto`` may join, ``$RAY_ADDRESS`` unset: the cluster of this machine's last ``ray
    start``, as recorded in Ray's temporary folder, else any cluster running on it (Ray takes the first it
    lists, so each is one it may join)."""
    from ray._private import services

    recorded = services.find_bootstrap_address(None)
    return {recorded} if recorded else set(services.find_gcs_addresses())


def check_running_session(address: str | None, num_cpus: int | None, name: str = "address") -> None:
    """Raise ``ValueError`` where the Ray session running in this process, which the engine uses as it is,
    is not the cluster that ``address`` (``name``'s value) names, or not of ``num_cpus`` CPUs: ``ray.init``
    would refuse to run twice, and the engine would otherwise run on another cluster than the one asked for.
    No address and no ``num_cpus`` take the session whatever it is."""
    if address is None and num_cpus is None:
        return
    import ray

    running = _session_address()
    # a Ray Client session that does not say which server it joined cannot be told apart: it is taken
    if address is not None and running is not None and not _names_session(address, running):
        raise ValueError(
            f"Ray already runs in this process, joined to the cluster at {running!r}, which the {name} {address!r} "
            "does not name: give no address to use that session, or call ray.shutdown() first to join another"
        )
    if num_cpus is not None:
        cpus = ray.cluster_resources().get("CPU", 0.0)
        if cpus != num_cpus:
            raise ValueError(
                f"num_cpus={num_cpus} sizes a local cluster to start, but Ray already runs in this process, on a "
                f"cluster of {cpus:g} CPU{'' if cpus == 1 else 's'} at {running!r}: leave num_cpus out to use "
                "that session, or call ray.shutdown() first"
            )


def _session_address() -> str | None:
    """The address of the cluster this process's Ray session joined: its GCS's, or ``ray://`` and its Ray
    Client server's (None where the client does not say)."""
    import ray
    from ray.util.client import ray as client

    if client.is_connected():
        server = getattr(getattr(client.get_context(), "client_worker", None), "_conn_str", None)
        return f"ray://{server}" if server else None
    return str(ray.get_runtime_context().gcs_address)


def _names_session(address: str, running: str) -> bool:
    """Whether ``address`` (:func:`check_address`'s forms) names the cluster at ``running``."""
    joined = cluster_to_join(address)
    if joined is None:  # local: a new cluster
        return False
    target = joined[0]
    if target == "auto":
        return any(_same_endpoint(found, running) for found in _clusters_auto_finds())
    return _same_endpoint(target, running)


def _same_endpoint(address: str, other: str) -> bool:
    """Whether two addresses (``host:port``, ``ray://host:port``) reach the same port of the same host, a
    host by any of its names."""
    same_kind = address.startswith("ray://") == other.startswith("ray://")
    return same_kind and bool(_endpoints(address) & _endpoints(other))


def _endpoints(address: str) -> set[tuple[str, int]]:
    """The (host, port) pairs that ``address`` reaches: the host as given and as resolved; a loopback host
    as this node's address too, by which Ray names a cluster it started on this machine."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    host = host.strip("[]")
    hosts = {host}
    try:
        hosts |= {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:  # a name that does not resolve here: only its spelling can match
        pass
    if any(_is_loopback(h) for h in hosts):
        import ray.util

        hosts.add(ray.util.get_node_ip_address())
    return {(h, int(port)) for h in hosts} if port.isdigit() else set()


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
