"""The job's master, hosted by one of its agents: torchrun's multi-node command lines.

Under torchrun the nodes of a job meet at a store one of their agents serves: with
``--rdzv-backend=c10d --rdzv-endpoint=HOST[:PORT]`` the agent on HOST (the first to bind the port
there), and with the static default, ``--master-addr=HOST --master-port=PORT --node-rank=R``, the
agent of node rank 0. Given the same command line, `dlrover-run` runs the job's master at that
endpoint, in the agent torchrun would have serving the store, and every agent (that one too)
joins it there. Nothing else needs to run first, as with torchrun.

Two differences from torchrun, both deliberate:

* Every RPC to the master is authenticated, so every node must be given the same job token
  (``--token-file`` on a shared filesystem, or ``DLROVER_JOB_TOKEN``).
* Node ranks are assigned by the master's rendezvous, as under torchrun's c10d backend; a static
  ``--node-rank`` chooses only which node hosts the master.

The node hosting the master is a single point of failure, as the store's host is under torchrun
(the others keep training while it is unreachable, up to ``--master-lost-timeout``). To survive
its loss, run ``dlrover-master`` apart and pass ``--master HOST:PORT``. After its own workers
finish, the hosting agent keeps serving until the job has ended on every node, at most
``--exit-barrier-timeout`` seconds, so that no node loses its master while it still trains.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import attrs

from dlrover.common import ConfigError, parse_host_port
from dlrover.launcher.args import LaunchConfig

if TYPE_CHECKING:
    from dlrover.master import MasterRuntime
    from dlrover.master.config import LifecycleConfig

__all__ = ["HostedMaster", "PeerEndpoint", "embedded_lifecycle", "is_local_host", "peer_endpoint", "peer_master"]

_log = logging.getLogger(__name__)

C10D_DEFAULT_PORT = 29400  # torchrun's, for an --rdzv-endpoint without a port
STATIC_DEFAULT_PORT = 29500  # torchrun's --master-port default


@attrs.frozen
class PeerEndpoint:
    """Where a torchrun command line has its nodes meet.

    Attributes:
        host: the endpoint's host.
        port: the endpoint's port.
        backend: ``c10d`` (the agent on `host` that binds first serves) or ``static`` (node
            rank 0 serves).
        node_rank: ``--node-rank`` (static only).
    """

    host: str
    port: int
    backend: str
    node_rank: int | None = None

    @property
    def address(self) -> str:
        """``host:port`` as agents dial it (IPv6 literals bracketed)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _split(endpoint: str, default_port: int) -> tuple[str, int]:
    try:
        return parse_host_port(endpoint, default_port)
    except ValueError as exc:
        raise ConfigError(f"--rdzv-endpoint: {exc}") from None


def peer_endpoint(cfg: LaunchConfig) -> PeerEndpoint | None:
    """The torchrun-style endpoint a multi-node command line names, or None if it names none.

    Raises:
        ConfigError: a backend no node can host (etcd), or a static rendezvous without
            ``--node-rank``.
    """
    backend = cfg.rdzv_backend
    if backend in ("etcd", "etcd-v2"):
        raise ConfigError(
            f"--rdzv-backend={backend} meets at an etcd server, which dlrover-run does not use: run "
            "dlrover-master and pass --master HOST:PORT (or --rdzv-backend=c10d with a node's address)"
        )
    if backend == "c10d":
        if not cfg.rdzv_endpoint:
            raise ConfigError("--rdzv-backend=c10d needs --rdzv-endpoint=HOST[:PORT] (a node's address)")
        host, port = _split(cfg.rdzv_endpoint, C10D_DEFAULT_PORT)
        return PeerEndpoint(host, port, "c10d")
    static_form = backend == "static" or (
        backend == "dlrover" and not cfg.rdzv_endpoint and (cfg.master_port is not None or cfg.node_rank is not None)
    )
    if not static_form:
        return None
    if cfg.node_rank is None:
        raise ConfigError(
            "a static rendezvous (--master-addr/--master-port) needs --node-rank on every node: node rank 0 "
            "hosts the job's master"
        )
    if backend == "static" and cfg.rdzv_endpoint:
        host, port = _split(cfg.rdzv_endpoint, cfg.master_port or STATIC_DEFAULT_PORT)
    else:
        host, port = cfg.master_addr, cfg.master_port or STATIC_DEFAULT_PORT
    return PeerEndpoint(host, port, "static", cfg.node_rank)


def _is_loopback(host: str) -> bool:
    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        return False


def is_local_host(host: str) -> bool:
    """Whether `host` names this machine: it resolves to an address a socket here can bind."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((sockaddr[0], 0, *sockaddr[2:]))
            return True
    return False


class HostedMaster:
    """The job's master as this agent serves it (see `peer_master`).

    Args:
        runtime: the running master.
        linger_s: how long it keeps serving after the job ended.
        address: where it listens, for messages.
    """

    def __init__(self, runtime: MasterRuntime, linger_s: float, address: str) -> None:
        self._runtime = runtime
        self._linger_s = linger_s
        self._stop = threading.Event()
        self.address = address

    def request_stop(self) -> None:
        """End `wait_job_end` now (safe from a signal handler)."""
        self._stop.set()

    def wait_job_end(self, timeout_s: float, poll_s: float = 0.5) -> bool:
        """After this node's workers succeeded: serve until the job has ended on every node (at
        most `timeout_s`, or until `request_stop`), then a little longer so that every agent hears
        of the end from it. Returns whether the job ended."""
        deadline = time.monotonic() + timeout_s
        _log.info("serving the job's master until the job ends on every node (at most %.0f s)", timeout_s)
        while not self._runtime.wait_finished(timeout_s=min(poll_s, max(deadline - time.monotonic(), 0.0))):
            if self._stop.is_set():
                _log.warning("stopped while the other nodes still ran; the master this node serves stops now")
                return False
            if time.monotonic() >= deadline:
                _log.warning(
                    "the job had not ended on every node %.0fs after this node's workers finished; the master "
                    "it serves stops now",
                    timeout_s,
                )
                return False
        # Agents' next heartbeats are answered with the job's end instead of silence.
        self._stop.wait(self._linger_s)
        return True


def embedded_lifecycle(cfg: LaunchConfig) -> LifecycleConfig:
    """The lifecycle of a master an agent runs itself (`--standalone`, or for its peers).

    Every agent declares its ``--max-restarts`` when it registers, and that is its node's
    process-restart budget (this one's is only the fallback for an agent that declares none);
    the job-wide failure limit is raised so that no node is stopped short of it: each node may
    fail once per restart and once more.
    """
    from dlrover.master.config import LifecycleConfig, NodeRange

    nodes = NodeRange(cfg.nodes.min_nodes, cfg.nodes.max_nodes, cfg.node_unit)
    default = LifecycleConfig(nodes=nodes)
    return LifecycleConfig(
        nodes=nodes,
        max_process_restarts=cfg.max_restarts,
        max_job_failures=max(default.job_failure_limit, cfg.nodes.max_nodes * (cfg.max_restarts + 1)),
        node_resources=cfg.node_resources,
    )


@contextmanager
def peer_master(cfg: LaunchConfig, endpoint: PeerEndpoint, token: str) -> Iterator[HostedMaster | None]:
    """Serve the job's master at `endpoint` if this agent is the one to; yields it (None: another
    agent serves it). It stops on leaving; call `HostedMaster.wait_job_end` first when this
    node's workers succeeded, so the other nodes do not lose it while they finish.

    Raises:
        ConfigError: this agent must host the master (node rank 0 of a static rendezvous) and
            cannot listen at the endpoint.
    """
    from dlrover.master import MasterConfig, create_master

    if _is_loopback(endpoint.host):
        _log.warning(
            "the nodes meet at %s, a loopback address: only agents on this host can reach it (every host "
            "would serve a master of its own); give an address the other nodes reach",
            endpoint.address,
        )
    hosts = endpoint.node_rank == 0 if endpoint.backend == "static" else is_local_host(endpoint.host)
    if not hosts:
        yield None
        return
    config = MasterConfig(
        job_name=cfg.rdzv_id if cfg.rdzv_id != "none" else "dlrover-run",
        backend="external",
        # Every interface, as torchrun's store listens: the endpoint's name may resolve to
        # another address here (127.0.1.1 for the host's own name on Debian) than elsewhere.
        # Every RPC still needs the job token.
        bind_address="::" if ":" in endpoint.host else "0.0.0.0",  # noqa: S104 (the job's nodes connect)
        port=endpoint.port,
        lifecycle=embedded_lifecycle(cfg),
        token=token,
    )
    runtime = create_master(config)
    try:
        runtime.start()
    except ConfigError as exc:
        runtime.stop()
        if endpoint.backend == "static":
            raise ConfigError(f"node rank 0 hosts the job's master at {endpoint.address}: {exc}") from exc
        # As torchrun's c10d agents on one host: the first to bind serves, the others join it
        # (if another program holds the port, registering fails and says so).
        _log.warning(
            "port %d is taken here, by another agent of the job serving its master, it is assumed (%s)",
            endpoint.port,
            exc,
        )
        yield None
        return
    except BaseException:
        runtime.stop()
        raise
    try:
        _log.info("serving the job's master at %s (torchrun's %s endpoint)", endpoint.address, endpoint.backend)
        yield HostedMaster(runtime, 2 * config.heartbeat_interval_s, endpoint.address)
    finally:
        runtime.stop()
