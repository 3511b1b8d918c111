"""Hosting a `Master`: its gRPC server, the periodic tick, the metrics endpoint, and clean shutdown."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from dlrover.common import Clock, ConfigError, GrpcServer, ServerConfig
from dlrover.master.eventlog import EventLog
from dlrover.master.hosting import HostedRendezvous, HostedShards
from dlrover.master.identity import NodeAuthenticator
from dlrover.master.journal import StateJournal
from dlrover.master.master import Master
from dlrover.master.metrics import MetricsEndpoint
from dlrover.master.scheduler.base import HandsOverNodes, ReportsChanges, SchedulerBackend
from dlrover.master.servicers import add_master_services
from dlrover.master.statedir import StateDirLock

__all__ = ["MasterRuntime", "ServiceRegistration"]

_log = logging.getLogger(__name__)

ServiceRegistration = Callable[[GrpcServer], None]
"""Adds a servicer to a server before it starts, e.g. `lambda s: s.add(add_XServicer_to_server, x)`.

This is how the shard and rendezvous services are hosted on the master's server.
"""


class MasterRuntime:
    """A running master: owns the server, the tick thread and every resource it was given.

    Args:
        master: the master.
        token: the job token every call must carry.
        server_config: how the gRPC server listens.
        authenticator: node credentials.
        scheduler: closed on `stop()`.
        journal: closed on `stop()`.
        tick_interval_s: how often `master.tick()` runs; a backend that reports changes (`ReportsChanges`)
            also has it run at once after each change, at most once per `min_tick_gap_s`.
        extra_services: more services on the same server (shard, rendezvous).
        metrics_bind_address: interface of the Prometheus endpoint.
        metrics_port: its port (0: any free one); no endpoint when None.
        event_log: closed on `stop()`.
        token_file: where agents read the token from, if it is in a file.
        rendezvous: the hosted rendezvous (its service is among `extra_services`).
        shards: the hosted shard service (likewise).
        state_lock: the state directory's lock; released on `stop()`, after everything in the
            directory is closed.
        clock: the time source of the refused-call log's rate limit (the system clock by default).
        min_tick_gap_s: the least time between two ticks woken by backend changes (a burst of pod events
            becomes one tick per gap, not one per event).
    """

    def __init__(
        self,
        master: Master,
        *,
        token: str,
        server_config: ServerConfig,
        authenticator: NodeAuthenticator,
        scheduler: SchedulerBackend,
        journal: StateJournal,
        tick_interval_s: float,
        extra_services: Sequence[ServiceRegistration] = (),
        metrics_bind_address: str = "127.0.0.1",
        metrics_port: int | None = None,
        event_log: EventLog | None = None,
        token_file: str | None = None,
        rendezvous: HostedRendezvous | None = None,
        shards: HostedShards | None = None,
        state_lock: StateDirLock | None = None,
        clock: Clock | None = None,
        min_tick_gap_s: float = 0.05,
    ) -> None:
        if not tick_interval_s > 0:
            raise ConfigError(f"tick_interval_s must be positive, got {tick_interval_s!r}")
        if not min_tick_gap_s >= 0:
            raise ConfigError(f"min_tick_gap_s must not be negative, got {min_tick_gap_s!r}")
        self.master = master
        self.token = token
        self.token_file = token_file
        self.rendezvous = rendezvous
        self.shards = shards
        self._authenticator = authenticator
        # Every refused call is logged (rate-limited) by the server and counted by reason here.
        self._server = GrpcServer(server_config, token, refusal_observers=[master.metrics], clock=clock)
        add_master_services(self._server, master, authenticator)
        for register in extra_services:
            register(self._server)
        self._scheduler = scheduler
        self._journal = journal
        self._event_log = event_log
        self._tick_interval_s = tick_interval_s
        self._metrics_bind = metrics_bind_address
        self._metrics_port = metrics_port
        self._metrics: MetricsEndpoint | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by the backend's changes and by stop()
        self._min_tick_gap_s = min(min_tick_gap_s, tick_interval_s)
        self._ticker: threading.Thread | None = None
        self._state_lock = state_lock
        self._stopped = False

    @property
    def port(self) -> int:
        """The gRPC port."""
        return self._server.port

    @property
    def address(self) -> str:
        """`host:port` agents dial."""
        return self._server.address

    @property
    def metrics_port(self) -> int | None:
        """The Prometheus endpoint's port, if one is served."""
        return self._metrics.port if self._metrics is not None else None

    @property
    def scheduler(self) -> SchedulerBackend:
        """The scheduler backend the master drives."""
        return self._scheduler

    def node_credential(self, node_id: int) -> str:
        """The credential of `node_id` (for an embedding launcher that hands it to its agent directly)."""
        return self._authenticator.credential(node_id)

    def start(self) -> int:
        """Serve, launch the job's nodes, and start ticking; returns the gRPC port."""
        self.master.prepare()
        port = self._server.start()
        if self._metrics_port is not None:
            self._metrics = MetricsEndpoint(self.master.metrics.registry, self._metrics_bind, self._metrics_port)
        self.master.start()
        if isinstance(self._scheduler, ReportsChanges):
            self._scheduler.on_change(self._wake.set)
        self._ticker = threading.Thread(target=self._tick_loop, name="dlrover-master-tick", daemon=True)
        self._ticker.start()
        return port

    def _tick_loop(self) -> None:
        while True:
            # A change the backend reported ticks at once (after the gap); otherwise every interval.
            self._wake.wait(self._tick_interval_s)
            if self._stop.wait(self._min_tick_gap_s if self._wake.is_set() else 0):
                return
            self._wake.clear()
            try:
                self.master.tick()
            except Exception:
                # A tick that fails must not end ticking: the next one may succeed (a full disk
                # freed). It is logged with its traceback, never swallowed silently.
                _log.exception("master tick failed")

    def wait_finished(self, timeout_s: float | None = None, poll_s: float = 0.5) -> bool:
        """Block until the job ends, `stop()` is called, or `timeout_s` passes; True if the job ended."""
        remaining = timeout_s
        while not self.master.job_state.finished:
            step = poll_s if remaining is None else min(poll_s, remaining)
            if self._stop.wait(step):
                break
            if remaining is not None:
                remaining -= step
                if remaining <= 0:
                    break
        return self.master.job_state.finished

    def stop(self, *, hand_over: bool = False) -> None:
        """Stop ticking and serving, stop every node the scheduler runs, close the journal; idempotent.

        `hand_over`: a backend whose nodes outlive their master (`HandsOverNodes`) keeps them running for the
        master that replaces this one, instead of stopping them.
        """
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        self._wake.set()
        try:
            if self._ticker is not None:
                self._ticker.join(timeout=30)
            self._server.stop()
            try:
                # Nothing changes any more: the last export makes a clean restart lose nothing.
                self.master.flush_state()
            except Exception:
                _log.exception("could not journal the final rendezvous and shard state")
            if self._metrics is not None:
                self._metrics.close()
            if hand_over and isinstance(self._scheduler, HandsOverNodes):
                self._scheduler.detach()
            else:
                self._scheduler.close()
            self._journal.close()
            if self._event_log is not None:
                self._event_log.close()
        finally:
            # Last, and even when closing failed: nothing of this master writes the directory any
            # more, unless its ticker is stuck in a write; then a second master must not start
            # on the directory while it may still write, so the lock goes with the process.
            if self._ticker is not None and self._ticker.is_alive():
                _log.error(
                    "the master's ticker did not stop within 30 s; the state directory stays locked until this "
                    "process exits"
                )
            elif self._state_lock is not None:
                self._state_lock.release()

    def __enter__(self) -> MasterRuntime:
        try:
            self.start()
        except BaseException:
            # __exit__ does not run when __enter__ raises: release what start() had opened.
            self.stop()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()
