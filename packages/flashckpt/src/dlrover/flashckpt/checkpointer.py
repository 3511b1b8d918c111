"""`FlashCheckpointer`: the one object a training script uses.

    ckpt = FlashCheckpointer("/ckpt")        # ids, rank and world size from the launcher
    state = {"model": model.state_dict(), "optim": optim.state_dict(), "step": 0}
    loaded = ckpt.load(target=state)         # after a restart: from memory, else from storage
    for step in ...:
        ckpt.save(step, state, persist=step % 100 == 0)   # blocks only for the memory copy
    ckpt.close(job_end=True)

Under ``dlrover-run``, ``torchrun`` or a plain ``python`` the job and run ids, rank and world size
come from the environment (`dlrover.flashckpt.job_env`); arguments override them, and the
explicit form ``FlashCheckpointer(StagerConfig(job_id=..., run_id=..., rank=..., world_size=...),
"/ckpt")`` gives every setting. Ranks agree on the step to load over torch.distributed's default
process group (`dlrover.flashckpt.dist.default_group_agree`) unless `agree` or `replicated` says
otherwise. `prepare(state)` allocates and pre-faults the slots before the first save; without it
the first save pays for its slot and the others are faulted in behind it (see `Stager`).

Saver modes:

* ``"auto"``: under ``dlrover-run`` (``DLROVER_FLASHCKPT_HOST`` names the agent's `SaverHost`),
  the agent's saver for this run, which outlives this process and follows elastic resizes; an
  unreachable host is an error, never a reason to start another saver. Without it (plain
  torchrun, one process), a detached saver process, started by the first rank on the node.
* ``"connect"``: a saver must already listen at the run's socket.
* ``"none"``: persist synchronously in this process (single-process jobs and tests).

Memory outlives `FlashCheckpointer.close`: a restarted process loads from it. Only
``close(job_end=True)`` removes it (the saver does, or this rank's stager with ``"none"``).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dlrover.common import Clock, ConfigError, SystemClock
from dlrover.common.step_slots import StepReporter, optional_reporter
from dlrover.flashckpt.agree import AgreeFn, agree_single
from dlrover.flashckpt.client import PersistOutcome, SaverClient
from dlrover.flashckpt.collectives import RankGroup
from dlrover.flashckpt.commit import Committer, RetentionPolicy
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.dist import default_group_agree
from dlrover.flashckpt.errors import (
    ChecksumError,
    FlashCkptError,
    LayoutError,
    NoCheckpointError,
    StorageError,
)
from dlrover.flashckpt.events import EventLog, FlashEvent
from dlrover.flashckpt.job_env import current_dist_state, launcher_process, resolve_identity
from dlrover.flashckpt.memory import LoadedState, MemoryReader
from dlrover.flashckpt.payloads import payload_from_slot
from dlrover.flashckpt.persist import persist_rank
from dlrover.flashckpt.replicated import ReplicatedLoader
from dlrover.flashckpt.saver_link import SaverLink, SaverMode, check_saver_mode
from dlrover.flashckpt.segment import ShmSegment, run_ranks, segment_path
from dlrover.flashckpt.slotio import read_header
from dlrover.flashckpt.stager import SaveResult, Stager
from dlrover.flashckpt.storage.base import Storage
from dlrover.flashckpt.storage.location import StorageLocation
from dlrover.flashckpt.storage.posix import PosixStorage
from dlrover.flashckpt.storage_loader import StorageReader

__all__ = ["AgreeFn", "FlashCheckpointer", "agree_single"]  # AgreeFn and agree_single: from `agree`

_log = logging.getLogger(__name__)


@contextmanager
def _checkpoint_phase(steps: StepReporter) -> Iterator[None]:
    """A checkpoint phase, then back to the phase the process was in (a save during eval returns to eval)."""
    before = steps.current_phase
    steps.phase("checkpoint")
    try:
        yield
    finally:
        steps.phase(before)


def _saver_location(storage_dir: str | None, storage: Storage | None) -> StorageLocation:
    """Where the node's saver writes: the place `storage` (or `storage_dir`) names.

    Raises:
        ConfigError: a storage another process cannot open, or a `storage_dir` naming another place.
    """
    try:
        location = StorageLocation.of(storage) if storage is not None else None
        of_dir = StorageLocation(os.path.abspath(storage_dir)) if storage_dir is not None else None
    except FlashCkptError as e:
        raise ConfigError(str(e)) from None
    if location is not None and of_dir is not None and location.url != of_dir.url:
        raise ConfigError(
            f"storage_dir {storage_dir!r} and storage ({location.url}) name different places: pass one of them"
        )
    result = location or of_dir
    assert result is not None
    return result


def _storage_location(storage_dir: str | None, storage: Storage | None) -> StorageLocation | None:
    """Where checkpoints go, when another process can open it (None: an in-memory storage)."""
    try:
        return _saver_location(storage_dir, storage)
    except ConfigError:
        if storage_dir is None:
            return None  # a storage only this process can open: its run id is the fixed one
        raise


class FlashCheckpointer:
    """Stage to memory, persist in the background, load from memory or storage.

    ``FlashCheckpointer("/ckpt")`` is all a script under ``dlrover-run``, ``torchrun`` or plain
    ``python`` needs: who the process is comes from its environment (see
    `dlrover.flashckpt.job_env`; `identity_reason` says where each part came from), and ranks agree
    on the step to load over torch.distributed's default process group.

    Args:
        dir_or_config: the POSIX checkpoint directory; or, in the explicit form
            ``FlashCheckpointer(config, "/ckpt")``, a `StagerConfig` (then `storage_dir` is the
            directory).
        storage_dir: the POSIX checkpoint directory (or pass `storage`).
        config: every stager setting, ids included (the explicit form); None: the ids from the
            environment and the other settings' defaults.
        storage: where checkpoints go and are loaded from (default: `PosixStorage(storage_dir)`).
            The node's saver, another process, opens the same place itself: a `PosixStorage`, or
            an `FsspecStorage` (S3 through s3fs) whose filesystem options are JSON-compatible;
            any other storage (in-memory) needs ``saver="none"``.
        job_id: overrides the job id from the environment (``DLROVER_JOB_ID`` under
            ``dlrover-run``, ``TORCHELASTIC_RUN_ID`` under torchrun).
        run_id: overrides the run id derived from the storage location.
        rank: overrides the rank (torch.distributed's when initialised, else ``RANK``).
        world_size: overrides the world size (torch.distributed's, else ``WORLD_SIZE``).
        saver: ``"auto"``, ``"connect"`` or ``"none"`` (see the module docstring).
        agree: cross-rank agreement on the step to load from memory (default:
            `default_group_agree`: alone with one rank, else over torch.distributed's default
            process group, which must be initialised by the time of `load`; or set `replicated`).
        replicated: the state is the same on every rank (DDP's model and optimizer), so `load`
            restores the newest copy any rank holds, in memory first, and sends it to the ranks
            without one: a job resized by an elastic restart resumes from memory, and from a
            storage checkpoint of any world size (see `dlrover.flashckpt.replicated`). Needs
            torch.distributed initialised before `load` when ``world_size > 1``.
        group: with `replicated`, the process group to load over (default: the world).
        retention: which committed checkpoints to keep: applied by whoever commits (this process
            with ``saver="none"``, else the node's saver; None: keep all, or under ``dlrover-run``
            the agent's ``--checkpoint-keep-last``).
        idle_exit_s: a detached saver's idle exit time (a hosted saver has none).
        saver_nice: niceness added to a detached saver (persisting yields the CPU to training).
        persist_bandwidth_mb_s: a detached saver's persist rate cap in MB/s (None: the default,
            `default_persist_bandwidth_mb_s`; 0: none; a hosted saver takes the agent's setting).
        clock: time source.
        host_timeout_s: bound on the agent's answer to a saver request (the agent answers
            without waiting on persists, even when a resize replaces the saver).

    Raises:
        ConfigError: inconsistent arguments, or an environment that does not say who this
            process is (the message names what is missing; see `resolve_identity`).
        SaverUnavailableError: (``auto``, ``connect``) no saver can be reached; under
            ``dlrover-run`` the message names the host's socket.
    """

    def __init__(
        self,
        dir_or_config: str | os.PathLike[str] | StagerConfig | None = None,
        storage_dir: str | os.PathLike[str] | None = None,
        *,
        config: StagerConfig | None = None,
        storage: Storage | None = None,
        job_id: str | None = None,
        run_id: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        saver: SaverMode = "auto",
        agree: AgreeFn | None = None,
        replicated: bool = False,
        group: Any = None,
        retention: RetentionPolicy | None = None,
        idle_exit_s: float = 60.0,
        saver_nice: int = 19,
        persist_bandwidth_mb_s: float | None = None,
        clock: Clock | None = None,
        host_timeout_s: float = 180.0,
    ) -> None:
        if isinstance(dir_or_config, StagerConfig):
            if config is not None:
                raise ConfigError("a StagerConfig was passed twice (first argument and config=)")
            config = dir_or_config
        elif dir_or_config is not None:
            if storage_dir is not None:
                raise ConfigError(
                    f"the checkpoint directory was passed twice ({dir_or_config!r} and storage_dir={storage_dir!r})"
                )
            storage_dir = dir_or_config
        storage_dir = os.fspath(storage_dir) if storage_dir is not None else None
        if storage is None and storage_dir is None:
            raise ConfigError("FlashCheckpointer needs storage_dir or storage")
        if config is None:
            location = _storage_location(storage_dir, storage)
            identity = resolve_identity(
                os.environ,
                current_dist_state(),
                storage_url=location.url if location is not None else None,
                launcher=launcher_process(),
                job_id=job_id,
                run_id=run_id,
                rank=rank,
                world_size=world_size,
            )
            config = StagerConfig(
                job_id=identity.job_id, run_id=identity.run_id, rank=identity.rank, world_size=identity.world_size
            )
            self.identity_reason = identity.reason
            rank_source = identity.rank_source
        else:
            given = [name for name, v in (("job_id", job_id), ("run_id", run_id), ("rank", rank),
                                          ("world_size", world_size)) if v is not None]  # fmt: skip
            if given:
                raise ConfigError(f"{', '.join(given)} given beside a StagerConfig: set them in the config")
            self.identity_reason = "job id, run id, rank and world size given in the StagerConfig"
            rank_source = "the StagerConfig"
        _log.info("rank %d: flash checkpoint identity: %s", config.rank, self.identity_reason)
        # A running saver ("connect") writes where it was started to; "auto" starts it here.
        location = _saver_location(storage_dir, storage) if saver == "auto" else None
        check_saver_mode(saver, location if saver == "auto" else storage_dir)
        if replicated and agree is not None:
            raise ConfigError("a replicated checkpointer agrees on its own; pass agree or replicated, not both")
        self.config = config
        self._clock = clock or SystemClock()
        self.storage: Storage = storage if storage is not None else PosixStorage(str(storage_dir))
        self._agree = agree or default_group_agree(config.world_size, config.num_slots, rank_source)
        self._replicated = replicated
        self._group = group
        self._mode = saver
        self._retention = retention
        self.events = EventLog()
        # Every save ends a step: under dlrover-run the agent's hang detector hears of it.
        self._steps = optional_reporter()
        # Save requests made before this process started are not for it.
        self._served_request = self._steps.save_request() if self._steps is not None else 0
        self._initial_request = self._served_request
        self._polling_marked = False  # whether the agent was told this script polls save requests
        self._link = SaverLink(
            config,
            location,
            saver,
            events=self.events,
            clock=self._clock,
            idle_exit_s=idle_exit_s,
            saver_nice=saver_nice,
            persist_bandwidth_mb_s=persist_bandwidth_mb_s,
            host_timeout_s=host_timeout_s,
            retention=retention,
        )
        on_sealed = self._link.notify_sealed if self._link.client is not None else None
        self.stager = Stager(config, clock=self._clock, on_sealed=on_sealed, owner=None if saver == "none" else False)
        self.stager.events = self.events  # one event log per rank

    @property
    def client(self) -> SaverClient | None:
        """The connection to the node's saver (None with ``saver="none"``)."""
        return self._link.client

    def _record(self, kind: str, step: int, reason: str) -> None:
        self.events.record(FlashEvent(kind, step, reason, self._clock.wall_time()))

    def prepare(self, state: Any) -> None:
        """Allocate and pre-fault shared memory for `state` (see `Stager.prepare`)."""
        self.stager.prepare(state)

    def save(self, step: int, state: Any, persist: bool = False) -> SaveResult:
        """Copy `state` into shared memory; with `persist`, also have it written to storage.

        Returns once the memory copy is done; persisting happens in the saver (or, with
        ``saver="none"``, right here after sealing). A saver that cannot be reached never stops
        training: ``auto`` mode reconnects (through the agent when it hosts the saver, else by
        starting a detached one), otherwise a ``persist_failed`` event is recorded
        and the snapshot stays in memory. A save serves any save request the agent made before it
        (see `save_requested`).
        """
        request = self._steps.save_request() if self._steps is not None else 0
        if request > self._served_request:
            # The agent holds a planned round or a stop until this rank saved: that save must not
            # wait on a snapshot kept for a persist the saver has not reached yet.
            self.stager.release_kept(f"the agent asked for a save (request {request})")
        if self._steps is None:
            result = self.stager.save(step, state)
        else:
            # The copy blocks training: a checkpoint phase, which the goodput accounting counts
            # as time blocked by saves (a load before the first step, see `load`).
            with _checkpoint_phase(self._steps):
                result = self.stager.save(step, state)
                if step >= 0:
                    self._steps.step(step)
        if result.saved and request > self._served_request:
            self._served_request = request
            assert self._steps is not None  # a request is only read from the agent's step slots
            # Answered once sealed (checksums written): the agent stops this process as soon as
            # every worker has answered. Only a save that answers a request waits for its seal.
            with _checkpoint_phase(self._steps):
                self.stager.flush()
            self._steps.serve_save_request(request)
        if persist and result.saved:
            if self.client is not None:
                self._link.persist_keeping(self.stager, step, result.slot)
            elif self._steps is None:
                self._persist_here(step)
            else:
                # Written here, in the training process: judged by the checkpoint phase's
                # allowance, not by the pace of the steps around it.
                with _checkpoint_phase(self._steps):
                    self._persist_here(step)
        return result

    def save_requested(self) -> bool:
        """Whether the node's agent asks for a flash checkpoint now: a planned rendezvous round
        (nodes joining or leaving the job) is coming, or the node is being stopped (SIGTERM),
        and the agent holds the round or the stop until every worker of its node has sealed a
        snapshot since it asked (bounded by ``dlrover-run --round-save-timeout``), so the new
        round resumes from the step the old one reached and redoes none. Before a stop the agent
        waits only for workers whose script has called this at least once. Cheap (one read of
        mapped memory): poll it every step and save when it is true; False when not run by
        ``dlrover-run``. In a job of several ranks, agree first (an ``all_reduce`` with MAX of
        the flag), so every rank saves the same step::

            flag = torch.tensor([int(ckpt.save_requested())])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() or step % save_every == 0:
                ckpt.save(step, state)
        """
        if self._steps is None:
            return False
        if not self._polling_marked:
            # The agent waits for a save before stopping the workers only where they answer.
            self._steps.mark_polling_save_requests()
            self._polling_marked = True
        return self._steps.save_request() > self._served_request

    def round_pending(self) -> bool:
        """Whether a save of this process answered the agent's request (see `save_requested`): the
        agent restarts the node's workers for the planned round as soon as every one of them has
        answered, so a step trained from now on is trained again after the round. A script that
        would rather not waste that step sleeps until the agent stops it (bounded by
        ``--round-save-timeout`` plus the agent's monitor interval).

        False when not run by ``dlrover-run`` and until a save answers a request.
        """
        return self._served_request > self._initial_request

    def wait_persisted(self, step: int, timeout_s: float = 300.0) -> PersistOutcome:
        """Wait for the saver's answer about persisting `step`.

        Raises:
            FlashCkptError: there is no saver (``saver="none"`` persists synchronously).
        """
        if self._steps is None:
            return self._link.wait_persisted(step, timeout_s)
        # Training waits here: a checkpoint phase, as the save itself (see `save`).
        with _checkpoint_phase(self._steps):
            return self._link.wait_persisted(step, timeout_s)

    def _persist_here(self, step: int) -> None:
        self.stager.flush()
        c = self.config
        for slot in range(c.num_slots):
            seg = ShmSegment.attach(segment_path(c.shm_dir, c.job_id, c.run_id, c.rank, slot))
            try:
                header = read_header(seg)
                if header is None or header.step != step:
                    continue
                if not seg.try_lock(exclusive=False):
                    raise FlashCkptError(f"slot {slot} is locked; cannot persist step {step}")
                try:
                    persist_rank(self.storage, payload_from_slot(seg, header, c.rank, c.world_size))
                finally:
                    seg.unlock()
            finally:
                seg.close()
            Committer(self.storage, self._retention).try_commit(step, c.world_size)
            return
        raise FlashCkptError(f"step {step} is not in memory")

    def load(self, target: Any | None = None) -> LoadedState:
        """Load the newest state every rank can load: from memory when every rank holds the agreed
        step, else the newest committed checkpoint every rank can read.

        Every rank takes part (the agree function is a collective) and every rank ends with the
        same step: a rank whose snapshot or files of a step are damaged makes all ranks fall back
        to the previous candidate together (a ``fallback`` event on each says why), never only
        itself. A `replicated` checkpointer loads the newest copy any rank holds instead.

        Raises:
            NoCheckpointError: neither memory nor storage holds a checkpoint every rank can load.
            StateStructureError, WorldSizeError: (on the rank concerned; the others raise
                `FlashCkptError` naming it) the target or the world size does not fit, which no
                fallback mends.
        """
        if self._steps is None:
            return self._load(target)
        # Before the first step, a checkpoint phase is the load (see `save`).
        with _checkpoint_phase(self._steps):
            loaded = self._load(target)
        if loaded.step > 0:
            # The restored process has finished these steps: its next mark is one step past them
            # (the goodput accounting then knows which steps it trains again).
            self._steps.step(loaded.step)
        return loaded

    def _load(self, target: Any | None) -> LoadedState:
        if self._replicated:
            group = RankGroup(self._group)
            loader = ReplicatedLoader(
                self.config, self.storage, group, events=self.events, clock=self._clock, keep=self.stager.adopt
            )
            return loader.load(target)
        reader = MemoryReader(self.config, self._clock, pinner=self.stager.pinner)
        step = self._agree([s.step for s in reader.snapshots()])
        if step is not None:
            loaded = self._load_agreed(step, lambda: reader.load(target=target, step=step, keep=self.stager.adopt))
            if loaded is not None:
                return loaded
        storage = StorageReader(self.storage, self.events, self._clock)
        try:
            remaining = storage.candidates()
        except Exception:
            self._agree([])  # the others wait in this collective: tell them there is nothing here
            raise
        while True:
            step = self._agree(remaining)
            if step is None:
                raise NoCheckpointError(
                    f"rank {self.config.rank}: no checkpoint every rank can load, in memory or in storage"
                )
            remaining = [s for s in remaining if s < step]
            c = self.config
            load = functools.partial(storage.load, c.rank, c.world_size, target=target, step=step)
            loaded = self._load_agreed(step, load)
            if loaded is not None:
                return loaded

    def _load_agreed(self, step: int, load: Callable[[], LoadedState]) -> LoadedState | None:
        """Run `load` of `step` on this rank and agree with the others on the outcome.

        Returns:
            The state when every rank loaded `step`; None when some rank could not (the ranks
            that did then load an earlier candidate over it).

        Raises:
            FlashCkptError: some rank hit an error no fallback mends (this rank's own error when
                it was one of them).
        """
        loaded: LoadedState | None = None
        fallback: FlashCkptError | None = None
        fatal: Exception | None = None
        try:
            loaded = load()
        except (ChecksumError, LayoutError, NoCheckpointError, StorageError) as e:
            fallback = e
        except Exception as e:  # also torch refusing a copy into the target: the others still agree below
            fatal = e
        # One collective with three outcomes: the newest step in every rank's list is 2 when
        # every rank loaded, 1 when some only need a fallback, None when some rank cannot go on.
        verdict = self._agree([1, 2] if loaded is not None else [1] if fallback is not None else [])
        if verdict == 2:
            return loaded
        if verdict is None:
            if fatal is not None:
                raise fatal
            raise FlashCkptError(f"rank {self.config.rank}: another rank cannot load step {step}; see its log")
        why = f"rank {self.config.rank}: {fallback}" if fallback is not None else "another rank cannot load it"
        self._record("fallback", step, f"step {step} is not loadable on every rank ({why}); trying an earlier one")
        return None

    def close(self, job_end: bool = False) -> None:
        """Detach, keeping the snapshots in memory for a restarted process.

        Args:
            job_end: the job is over: remove the run's shared memory. The saver does it when told
                (call this on one rank, after every rank's last save); with ``saver="none"`` this
                rank's stager removes its own segments, and those of ranks beyond the world size
                (saved before the job shrank; no rank of the job owns them now).
        """
        if job_end and self._mode == "none":
            c = self.config
            for rank in run_ranks(c.shm_dir, c.job_id, c.run_id):
                if rank >= c.world_size:
                    for slot in range(c.num_slots):
                        segment_path(c.shm_dir, c.job_id, c.run_id, rank, slot).unlink(missing_ok=True)
        self.stager.close(remove=job_end if self._mode == "none" else False)
        self._link.close(job_end)
        if self._steps is not None:
            self._steps.close()
            self._steps = None
