"""A rank's link to its node's saver, however the saver is provided.

Saver modes:

* ``"auto"``: under ``dlrover-run`` (``DLROVER_FLASHCKPT_HOST`` names the agent's `SaverHost`),
  the agent's saver for this run, which outlives the training process and follows elastic
  resizes; an unreachable host is an error, never a reason to start another saver. Without it
  (plain torchrun, one process), a detached saver process, started by the first rank on the node.
* ``"connect"``: a saver must already listen at the run's socket.
* ``"none"``: no saver; the checkpointer persists in the training process.

The saver persists what the ranks ask for and, when a training process dies, the newest
snapshot every rank holds (see `dlrover.flashckpt.saver`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Literal

from dlrover.common import Clock, ConfigError
from dlrover.flashckpt.client import DetachedSaverSpec, PersistOutcome, SaverClient, ensure_saver
from dlrover.flashckpt.commit import RetentionPolicy
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.errors import FlashCkptError, SaverUnavailableError
from dlrover.flashckpt.events import EventLog, FlashEvent
from dlrover.flashckpt.host import HOST_SOCKET_ENV_VAR, SaverRequest, request_saver
from dlrover.flashckpt.pacing import persist_bandwidth_or_default
from dlrover.flashckpt.saver import socket_path
from dlrover.flashckpt.stager import SealedNotice, Stager
from dlrover.flashckpt.storage.location import StorageLocation

__all__ = ["SaverLink", "SaverMode", "check_saver_mode", "coordinator_node"]

SaverMode = Literal["auto", "connect", "none"]

_log = logging.getLogger(__name__)


def check_saver_mode(mode: str, storage: object | None) -> None:
    """Refuse a mode that is not one of `SaverMode`, or ``auto`` without a storage to write to.

    Raises:
        ConfigError: naming the bad value.
    """
    if mode not in ("auto", "connect", "none"):
        raise ConfigError(f"saver must be 'auto', 'connect' or 'none', got {mode!r}")
    if mode == "auto" and storage is None:
        raise ConfigError("saver='auto' needs storage_dir (or a storage another process can open) for the node's saver")


def coordinator_node(env: Mapping[str, str]) -> tuple[bool, str]:
    """Whether this node's saver moves the tracker (exactly one node's may), and why.

    The node of global rank 0 coordinates. Launchers say which node that is in different ways:
    torchrun and ``dlrover-run`` set ``GROUP_RANK`` (the node rank); the DeepSpeed and MPI-style
    launchers set only ``RANK`` and ``LOCAL_RANK``, and every launcher numbers a node's ranks
    contiguously, so the node starts at rank 0 exactly when ``RANK - LOCAL_RANK`` is 0; under
    ``srun`` alone, ``SLURM_NODEID``. With none of them the job is taken to be on one node.
    """
    if env.get("GROUP_RANK", "").isdigit():
        return env["GROUP_RANK"] == "0", f"GROUP_RANK={env['GROUP_RANK']}"
    rank, local = env.get("RANK", ""), env.get("LOCAL_RANK", "")
    if rank.isdigit() and local.isdigit():
        return int(rank) - int(local) == 0, f"RANK={rank} LOCAL_RANK={local}"
    if env.get("SLURM_NODEID", "").isdigit():
        return env["SLURM_NODEID"] == "0", f"SLURM_NODEID={env['SLURM_NODEID']}"
    return True, "no node rank in the environment: one node"


class SaverLink:
    """Connects a rank to its node's saver (see the module docstring) and keeps it connected.

    Args:
        config: the rank's stager settings (job, run, rank, world size, shared memory).
        storage: where the saver writes (``auto`` needs it): a POSIX directory or an fsspec URL.
        mode: ``"auto"``, ``"connect"`` or ``"none"``.
        events: where saver problems are recorded.
        clock: time source for event timestamps.
        idle_exit_s: a detached saver's idle exit time.
        saver_nice: niceness added to a detached saver.
        persist_bandwidth_mb_s: a detached saver's persist rate cap in MB/s (None: the default,
            `default_persist_bandwidth_mb_s`; 0: none).
        host_timeout_s: bound on the agent's answer to a saver request.
        retention: which committed checkpoints the saver keeps (None: a detached saver keeps
            all, the agent's saver its own setting, ``dlrover-run --checkpoint-keep-last``).

    Raises:
        ConfigError: a bad mode, ``auto`` without `storage_dir`, or a request the agent cannot take.
        SaverUnavailableError: (``auto``, ``connect``) no saver can be reached.
    """

    def __init__(
        self,
        config: StagerConfig,
        storage: StorageLocation | None,
        mode: SaverMode,
        *,
        events: EventLog,
        clock: Clock,
        idle_exit_s: float = 60.0,
        saver_nice: int = 19,
        persist_bandwidth_mb_s: float | None = None,
        host_timeout_s: float = 180.0,
        retention: RetentionPolicy | None = None,
    ) -> None:
        check_saver_mode(mode, storage)
        self.config = config
        self.mode: SaverMode = mode
        self.events = events
        self._clock = clock
        self._host_timeout_s = host_timeout_s
        self._spec: DetachedSaverSpec | None = None
        self._host: tuple[str, SaverRequest] | None = None
        self.client: SaverClient | None = None
        coordinator, why = coordinator_node(os.environ)
        _log.info(
            "rank %d: this node's saver %s commits (%s)",
            config.rank,
            "coordinates" if coordinator else "does not coordinate",
            why,
        )
        host_socket = os.environ.get(HOST_SOCKET_ENV_VAR, "") if mode == "auto" else ""
        keep_last, keep_every = RetentionPolicy.counts(retention)
        if host_socket:
            assert storage is not None
            try:
                request = SaverRequest(
                    config.job_id,
                    config.run_id,
                    config.world_size,
                    storage.url,
                    coordinator,
                    # The agent's working directory may differ from this process's.
                    shm_dir=os.path.abspath(config.shm_dir),
                    num_slots=config.num_slots,
                    storage_options=storage.options,
                    keep_last=keep_last,
                    keep_every=keep_every,
                )
            except FlashCkptError as e:
                raise ConfigError(f"cannot ask the agent for a saver: {e}") from None
            self._host = (host_socket, request)
            self.client = self._connect()
        elif mode == "auto":
            assert storage is not None
            self._spec = DetachedSaverSpec(
                config.job_id,
                config.run_id,
                config.world_size,
                storage.url,
                config.shm_dir,
                idle_exit_s,
                nice=saver_nice,
                coordinator=coordinator,
                storage_options=storage.options,
                keep_last=keep_last,
                keep_every=keep_every,
                persist_bandwidth_mb_s=persist_bandwidth_or_default(persist_bandwidth_mb_s),
            )
            self.client = self._connect()
        elif mode == "connect":
            path = socket_path(config.shm_dir, config.job_id, config.run_id)
            self.client = SaverClient(path, config.rank, config.world_size, events=self.events, clock=self._clock)

    def _connect(self) -> SaverClient:
        """The run's saver: the agent's (through its host), else a detached one."""
        if self._host is not None:
            host_socket, request = self._host
            hosted = request_saver(host_socket, request, self._host_timeout_s)
            client = SaverClient(hosted.path, self.config.rank, self.config.world_size, clock=self._clock)
        else:
            assert self._spec is not None
            client = ensure_saver(self._spec, self.config.rank, self._clock)
        client.events = self.events
        return client

    def notify_sealed(self, notice: SealedNotice) -> None:
        """Tell the saver a snapshot is sealed (the stager's ``on_sealed``)."""
        # The notice only wakes the saver; when the saver is gone a ``saver_lost`` event already
        # says so, and the next persist request reconnects.
        if self.client is not None and not self.client.closed:
            self.client.notify_sealed(notice)

    def request_persist(self, step: int) -> bool:
        """Ask the saver to persist `step`; a lost saver is restarted (``auto``) or reported, never fatal.

        Returns:
            Whether the request was sent (to `client`, which answers it).
        """
        assert self.client is not None
        try:
            self.client.request_persist(step)
            return True
        except SaverUnavailableError as e:
            reason = f"the saver is unreachable ({e})"
        if self.mode == "auto":
            try:
                self.client.close()
                self.client = self._connect()
                how = "the agent provided its saver again" if self._host is not None else "a new saver was started"
                self._record("saver_restarted", step, f"{reason}; {how}")
                self.client.request_persist(step)
                return True
            except SaverUnavailableError as e:
                reason = f"{reason}; restarting it failed ({e})"
        self._record("persist_failed", step, f"step {step} stays in memory only: {reason}")
        return False

    def persist_keeping(self, stager: Stager, step: int, slot: int | None) -> None:
        """`request_persist`, and keep `slot` (holding `step`) from `stager`'s later saves until the
        saver holds the snapshot (see `Stager.keep_until`): it reaches the request only after the
        persists queued before it (the node's other ranks'), and a rank that saves every step would
        have written over it by then. None: no slot to keep (the step is not in memory)."""
        if not self.request_persist(step) or slot is None:
            return
        client = self.client
        assert client is not None
        stager.keep_until(slot, step, lambda: client.holding_or_done(step))

    def wait_persisted(self, step: int, timeout_s: float) -> PersistOutcome:
        """Wait for the saver's answer about persisting `step`.

        Raises:
            FlashCkptError: there is no saver.
        """
        if self.client is None:
            raise FlashCkptError("no saver: persisting was synchronous")
        return self.client.wait_persisted(step, timeout_s)

    def close(self, job_end: bool) -> None:
        """Disconnect; with `job_end`, tell the saver the job is over (it removes the run's memory)."""
        if self.client is not None:
            self.client.close(shutdown_saver=job_end)

    def _record(self, kind: str, step: int, reason: str) -> None:
        self.events.record(FlashEvent(kind, step, reason, self._clock.wall_time()))
