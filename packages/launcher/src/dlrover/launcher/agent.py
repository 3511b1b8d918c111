"""The per-node elastic agent: rendezvous, start workers, watch them, act, repeat.

The loop only carries out `Step`s decided by `dlrover.launcher.decisions`; everything it needs
from the job goes through a `ControlPlane`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

import attrs

from dlrover.common import (
    MASTER_LOST_TIMEOUT_ENV_VAR,
    Clock,
    DLRoverError,
    SystemClock,
    owned_temp_dir,
    remove_dead_owners,
)
from dlrover.common.process import exiting_status
from dlrover.common.step_slots import (
    STACK_DUMP_ENV_VAR,
    STEP_SLOT_ENV_VAR,
    STEP_SLOTS_ENV_VAR,
    SlotReading,
    StepSlotFile,
)
from dlrover.common.validators import non_negative, non_negative_finite, positive
from dlrover.diagnosis import (
    ActionKind,
    Decision,
    HangConfig,
    HangReport,
    OomCount,
    OomWatch,
    StackDump,
    main_thread_frames,
    request_stack_dump,
)
from dlrover.flashckpt.commit import RetentionPolicy
from dlrover.flashckpt.host import SaverHost, SaverHostConfig, host_socket_path
from dlrover.flashckpt.job_env import safe_job_id
from dlrover.flashckpt.pacing import default_persist_bandwidth_mb_s
from dlrover.flashckpt.segment import DEFAULT_SHM_DIR, SHM_DIR_ENV_VAR
from dlrover.launcher.control import (
    ControlPlane,
    FailureReport,
    MasterAction,
    Progress,
    ResourceUsage,
    RoundAssignment,
)
from dlrover.launcher.decisions import (
    Step,
    StepKind,
    after_failure,
    assess_workers,
    first_failure,
    on_master_actions,
    refill_due,
)
from dlrover.launcher.env import (
    CHECKPOINT_SOCKET_ENV_VAR,
    JOB_ID_ENV_VAR,
    NODE_ID_ENV_VAR,
    WorkerIdentity,
    standby_env,
    worker_env,
)
from dlrover.launcher.hang import HangWatch, read_cpu_seconds
from dlrover.launcher.netcheck import NetworkCheck, NetworkCheckSettingsMismatch, NetworkCheckStopped
from dlrover.launcher.netcheck_plan import CheckOutcome, after_check_report, check_step
from dlrover.launcher.resource_usage import ProcessTreeSampler
from dlrover.launcher.step_ledger import StepLedger
from dlrover.launcher.step_watch import StepWatch
from dlrover.launcher.store_host import StoreHost
from dlrover.launcher.worker_logs import failure_line
from dlrover.launcher.workers import StandbyPool, WorkerExit, WorkerGroup, WorkerSpec

__all__ = ["Agent", "AgentConfig", "AgentResult"]

_log = logging.getLogger(__name__)
# After a stalled rank was found busy, the verdict waits at least this long before the next probe
# (a long unmarked evaluation is not dumped every few seconds).
_BUSY_RECHECK_S = 30.0
# Excuses the master relayed last stay this many heartbeat intervals when heartbeats fail (the master keeps a
# silent node's own for its heartbeat timeout, 6 intervals by default).
_RELAYED_EXCUSE_HEARTBEATS = 6

# How often to ask a rendezvous that does not say when to ask again (a master from before it paced
# the checks), or one that could not be reached: the cadence agents kept before the pacing.
_UNPACED_WAITING_CHECK_S = 1.0

NODE_SHM_PREFIX = "dlrover-node-"
"""Names the agent's own directory in ``checkpoint_shm_dir`` (an `owned_temp_dir`)."""


@attrs.frozen
class AgentConfig:
    """How one node's agent runs its workers.

    Attributes:
        worker_argv: the command of every worker (see `LaunchConfig.worker_command`).
        nproc_per_node: workers on this node.
        max_restarts: worker restarts after failures before the node gives up.
        run_id: the job's run id (TORCHELASTIC_RUN_ID).
        job_id: names the job to the workers in ``DLROVER_JOB_ID`` (what a `FlashCheckpointer`
            names its shared memory after): the same for every worker this agent starts,
            restarts included, and unique to the job; empty: `run_id` in a file-name-safe form
            (`dlrover.flashckpt.safe_job_id`).
        role: the workers' role name.
        monitor_interval_s: how often the workers are checked.
        shutdown_grace_s: how long workers get between SIGTERM and SIGKILL.
        rendezvous_timeout_s: the longest wait for a round to complete.
        log_dir: root of the workers' log files, kept in ``<run_id>_<unique>/attempt_<n>/
            <local_rank>/`` (a folder of this agent's own, as torchrun's); None keeps none.
        error_dir: root of the workers' error files (``TORCHELASTIC_ERROR_FILE``, written by
            torch's ``@record``) when there is no `log_dir`; with one they go beside the logs, at
            ``<run_id>_<unique>/attempt_<n>/<local_rank>/error-rank<rank>.json``. None of both:
            none.
        redirects: local rank -> streams written only to files (1 stdout, 2 stderr).
        tee: local rank -> streams written to files and the console.
        local_ranks_filter: local ranks whose console output is shown; empty shows all.
        extra_env: variables added to every worker's environment.
        hang_timeout_s: a worker whose CPU time does not grow for this long is hung and
            reported as such; 0 turns the CPU-idle watch off.
        step_hang: the adaptive hang detector judging the workers' step reports (see
            `dlrover.launcher.step_watch`): a worker stalled longer than max(k x the median
            training time between its step marks, the floor), or its first-steps or phase
            allowance, is hung; every worker's
            stack is dumped into the failure evidence and the failure is reported. None: off
            (the reports still reach the master). Workers that never report are not judged.
        stack_dump_timeout_s: bound on each worker's stack dump (py-spy, or its faulthandler).
        hang_busy_probe_s: before a step-report hang is reported, every worker's stack is dumped
            again this long after the first dump; a worker whose main thread moved between the
            two runs Python code (an evaluation or a save nobody marked as a phase), so the
            verdict waits another window (at least 30 s) and is judged again, up to the eval
            phase's allowance without a step mark (`StepWatch.excuse_busy`). Only this node's
            workers are probed; the finding goes to the other nodes with the heartbeat, where it
            excuses ranks whose own verdict comes later than it arrives (see `StepWatch.excuses`).
            0: report at once.
        heartbeat_interval_s: heartbeat this often instead of at the master's interval.
        waiting_check_interval_s: between heartbeats, ask the rendezvous at most this often whether
            nodes wait to join (a growth, onto a warm spare too): one small RPC per node each time,
            so the round starts within about this long instead of within a heartbeat interval.
            Each answer says when to ask again (`WaitingCount.retry_after_s`): the nodes of a large
            job ask less often, so together they ask the master about `poll_rate_per_s` times a
            second. 0 or a value at or above the heartbeat interval: with each heartbeat only.
        master_lost_timeout_s: how long workers keep training while the master cannot be
            reached (a restarting master resumes from its journal) before the agent gives up.
        round_save_timeout_s: before a planned round (nodes waiting to join, or the master's
            restart for a resize that let nodes go) and before stopping the workers for a
            SIGTERM (a backend stopping the node, a leaving node of a shrink among them), the
            agent asks its workers for a flash checkpoint through the step slot file (the
            checkpointer's ``save_requested()``) and restarts or stops them once every one has
            sealed a snapshot since, or after this many seconds; 0 restarts or stops at once.
            A backend's stop grace longer than this leaves the save its time. Only with the
            node's saver hosted here, and only for workers that poll the request (their
            checkpointer's ``save_requested()`` was called) or, before a round, have sealed a
            snapshot since they started.
        host_checkpoint_saver: run the node's flash-checkpoint savers in this agent (workers
            find them through ``DLROVER_FLASHCKPT_HOST``), so they outlive crashed workers and
            their shared memory is removed when the agent exits.
        checkpoint_shm_dir: the shared-memory directory (a tmpfs) in which the agent makes a
            directory of its own for the workers' snapshots and the saver host's sockets
            (removed at exit, or by the next agent on the host if this one is killed); workers
            are told it in ``DLROVER_FLASHCKPT_SHM_DIR``, the default of `StagerConfig.shm_dir`.
        failure_persist_hold_s: 0 (the default): when a worker dies, the savers persist the
            newest snapshot every local rank holds at once, while the workers restart. Otherwise
            they hold that persist back while the restarted workers restore from memory, so it
            does not take CPU from them on a node with few cores: until every rank has sealed a
            snapshot again, this long, the node's ranks change, or the agent exits. The persist
            then takes a slot the workers' next-but-one save may wait for (see
            `dlrover.flashckpt.SaverConfig`).
        checkpoint_stop_timeout_s: at exit, bound on finishing the savers' persists (on a
            failure or stop: the newest snapshot) before the memory is removed.
        checkpoint_retention: which committed checkpoints the node's savers keep (None: all); a
            job's own `RetentionPolicy` (given to its `FlashCheckpointer`) overrides it.
        persist_bandwidth_mb_s: the savers' cap on their persist rate in MB/s (default: 256 per
            CPU the agent may use; 0: none), which bounds what a background persist takes from
            training on a node with few free cores.
        prewarm_modules: modules that standby interpreters import ahead of time, so workers
            (the first ones and every restart) skip that cost (`--prewarm`, see `StandbyPool`);
            empty: every worker starts a fresh interpreter.
        prewarm_refill_after_s: the standbys for the next start are started once every
            worker has sealed a flash checkpoint since it started, or this long after the
            start, whichever comes first (see `refill_due`).
        prewarm_join_wait_s: with standbys, a node joining a job whose rendezvous has formed a
            round registers and joins only once they finished their imports, waiting at most
            this long (0: at once): it makes the training nodes stop for a new round, and without
            the wait they would idle while its workers import (seconds; tens of seconds with
            CUDA). The nodes of a starting job join at once.
        store_import_idle_wait_s: such a joining node defers its torch import for the store it
            hosts as node rank 0 until its workers train, or until it has waited this long for its
            round (a warm spare held in reserve imports while idle; see `_wait_for_warm_standbys`).
        worker_reap_timeout_s: a worker seen beginning to exit with a failure (the others are
            stopped then) is reported once it has exited; if the kernel has still not let it be
            reaped this long after, it is reported with the status it was seen exiting with.
        duplicate_filters: substrings of tee'd stdout and stderr lines also written to the
            attempt's ``filtered_stdout.log`` / ``filtered_stderr.log`` (see `WorkerSpec`).
        virtual_local_rank: every worker sees only its own GPU, as device 0, with
            ``LOCAL_RANK=0`` (torchrun's ``--virtual-local-rank``; see `worker_env`).
        resource_sample_interval_s: resource use is sampled for heartbeats at most this often
            (a sample walks the process table); heartbeats in between repeat the last one.
        exit_barrier_timeout_s: when this node's workers succeed and its agent hosts the
            round's store, the longest the agent keeps that store open for the nodes still
            training (torchrun's exit barrier; see `Agent`); 0 closes it at once.
        log_max_bytes: cap on each worker log file; one that reaches it rotates (see
            `WorkerSpec.log_max_bytes`); 0: none.
    """

    worker_argv: tuple[str, ...]
    nproc_per_node: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    max_restarts: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    run_id: str = "none"
    job_id: str = ""
    role: str = "default"
    monitor_interval_s: float = attrs.field(default=0.1, validator=non_negative)
    shutdown_grace_s: float = attrs.field(default=10.0, validator=non_negative)
    rendezvous_timeout_s: float = attrs.field(default=600.0, validator=non_negative)
    log_dir: Path | None = None
    error_dir: Path | None = None
    redirects: Mapping[int, int] = attrs.field(factory=dict)
    tee: Mapping[int, int] = attrs.field(factory=dict)
    local_ranks_filter: tuple[int, ...] = ()
    extra_env: Mapping[str, str] = attrs.field(factory=dict)
    hang_timeout_s: float = attrs.field(default=0.0, validator=non_negative)
    step_hang: HangConfig | None = attrs.field(factory=HangConfig)
    stack_dump_timeout_s: float = attrs.field(default=10.0, validator=positive)
    hang_busy_probe_s: float = attrs.field(default=2.0, validator=non_negative)
    master_lost_timeout_s: float = attrs.field(default=300.0, validator=non_negative)
    round_save_timeout_s: float = attrs.field(default=10.0, validator=non_negative)
    heartbeat_interval_s: float | None = None
    waiting_check_interval_s: float = attrs.field(default=0.25, validator=non_negative)
    host_checkpoint_saver: bool = True
    checkpoint_shm_dir: str = DEFAULT_SHM_DIR
    checkpoint_stop_timeout_s: float = attrs.field(default=120.0, validator=positive)
    failure_persist_hold_s: float = attrs.field(default=0.0, validator=non_negative_finite)
    checkpoint_retention: RetentionPolicy | None = None
    persist_bandwidth_mb_s: float = attrs.field(factory=default_persist_bandwidth_mb_s, validator=non_negative_finite)
    prewarm_modules: tuple[str, ...] = ()
    prewarm_refill_after_s: float = attrs.field(default=30.0, validator=non_negative)
    prewarm_join_wait_s: float = attrs.field(default=120.0, validator=non_negative_finite)
    store_import_idle_wait_s: float = attrs.field(default=2.0, validator=non_negative_finite)
    worker_reap_timeout_s: float = attrs.field(default=30.0, validator=non_negative)
    exit_barrier_timeout_s: float = attrs.field(default=300.0, validator=non_negative_finite)
    resource_sample_interval_s: float = attrs.field(default=1.0, validator=non_negative_finite)
    virtual_local_rank: bool = False
    duplicate_filters: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    log_max_bytes: int = attrs.field(default=0, validator=attrs.validators.ge(0))


@attrs.frozen
class AgentResult:
    """How the agent ended.

    Attributes:
        exit_code: the status `dlrover-run` exits with.
        reason: why, in a sentence.
        restarts: worker restarts caused by failures.
        rounds: rendezvous rounds this node took part in.
        logs: where the workers' logs are, in words, for the summary line (`dlrover-run` fills
            it in: the folder, or that it was removed); "" when none were kept.
    """

    exit_code: int
    reason: str
    restarts: int
    rounds: int
    logs: str = ""


class Agent:
    """Runs this node's workers for the whole job.

    Args:
        config: what to run and how.
        control: the master, as seen from this node.
        clock: time source for intervals.
        environ: the environment workers inherit.
        progress: reads this node's training progress for heartbeats; by default, the newest
            step every local worker has sealed as a flash checkpoint in this agent's saver host
            (-1 before that, or without the host) and what the agent and its workers use
            (`ProcessTreeSampler`; GPUs with `sample_gpus`).
        network_check: checks the nodes of every round before its workers start
            (`--network-check`); None skips the check.
        store_host: hosts each round's torch.distributed store when this node gets rank 0, as
            torchrun's agent does (`dlrover-run` passes a `TorchStoreHost`): a fresh store per
            round, listening before its address is published, closed once the round's workers
            have stopped and when the agent exits. None: worker rank 0 hosts the store instead.
        read_exiting_status: how a worker that has begun to exit is recognised before it can be
            reaped (`dlrover.common.exiting_status`); tests replace it.
        oom_watch: reads the host's OOM records (the memory cgroup's ``oom_kill`` counter, the
            kernel log) so that a failed worker's evidence says whether the OOM killer ended it;
            `OomWatch()` reads the real ones and fails soft where they are not readable.
        standby: a pool of standby workers already importing for this node's workers (see
            `early_standbys`), taken over by the agent (which closes it); one is started when
            `AgentConfig.prewarm_modules` names modules and none is given.
    """

    def __init__(
        self,
        config: AgentConfig,
        control: ControlPlane,
        *,
        clock: Clock | None = None,
        environ: Mapping[str, str] | None = None,
        progress: Callable[[], Progress] | None = None,
        network_check: NetworkCheck | None = None,
        store_host: StoreHost | None = None,
        read_exiting_status: Callable[[int], int | None] = exiting_status,
        sample_gpus: bool = False,
        oom_watch: OomWatch | None = None,
        standby: StandbyPool | None = None,
    ) -> None:
        self._oom_watch = oom_watch or OomWatch()
        # The cgroup's OOM kill count when the current workers started (None: not readable).
        self._oom_before: OomCount | None = None
        self._read_exiting_status = read_exiting_status
        self._network_check = network_check
        self._store_host = store_host
        self._check_heartbeat_at = 0.0
        # What the master asked for during the network check, carried out when the check ends.
        self._check_action: Step | None = None
        self._config = config
        self._control = control
        self._clock = clock or SystemClock()
        # How long to wait between checks for nodes waiting to join: the rendezvous's last pace.
        self._waiting_every = self._config.waiting_check_interval_s
        self._environ = dict(os.environ if environ is None else environ)
        # Named once for the agent's life: restarted workers find their predecessors' snapshots.
        self._job_env = {JOB_ID_ENV_VAR: config.job_id or safe_job_id(config.run_id)}
        self._progress = progress or self._node_progress
        self._sample_gpus = sample_gpus
        self._run_dir_path: Path | None = None
        self._sampler: ProcessTreeSampler | None = None
        self._last_usage: tuple[float, ResourceUsage | None] | None = None  # (when, sample)
        self._stop_requested = threading.Event()
        self._stop_reason = ""
        self._stop_signal = signal.SIGTERM
        self._stop_requests = 0  # a second one ends the save a leaving node waits for
        # While `run` runs: a pipe `request_stop` writes to, so that the wait between two looks
        # at the workers (which also wakes when one exits) ends at once on a stop.
        self._wake_lock = threading.Lock()
        self._wake: tuple[int, int] | None = None
        self._node_id = ""
        self._heartbeat_interval_s = 2.0
        self._host_env: dict[str, str] = {}
        # Standby workers `dlrover-run` started for this agent before importing it (`early_standbys`):
        # owned from here on, closed with the node's services.
        self._standby: StandbyPool | None = standby
        self._saver_host: SaverHost | None = None
        # (when, global ranks) of the workers whose start used the standbys not yet replaced.
        self._refill_pending: tuple[float, frozenset[int]] | None = None
        self._store_import_deferred = False  # see `_wait_for_warm_standbys`
        # (when, global ranks) of the workers started, until each has sealed a snapshot: then
        # what the node saved under other ranks before a resize is removed.
        self._departed_sweep: tuple[float, frozenset[int]] | None = None
        self._node_dir = contextlib.ExitStack()
        self._node_dir_path: Path | None = None
        # The node's step slot file (made with the first workers) and the current workers' watch.
        self._step_slots: StepSlotFile | None = None
        self._group_ranks: tuple[float, frozenset[int]] | None = None  # (start time, global ranks) of the workers
        self._step_watch: StepWatch | None = None
        self._workers_running = False  # between a start of the workers and their end
        # (node rank, nodes, RANK of local rank 0, WORLD_SIZE) of the last workers started.
        self._layout: tuple[int, int, int, int] | None = None
        self._round_number = 0  # the round this node's workers run in (0: none yet)
        # Step marks of local rank 0 for the master's goodput accounting, per set of workers, and
        # when (wall) this agent joined and left the rendezvous of the current round.
        self._ledger = StepLedger()
        self._round_times: tuple[float, float] | None = None
        # The newest checkpoint step of each run the master was told about.
        self._commits_told: dict[tuple[str, str], int] = {}

    @property
    def run_dir(self) -> Path | None:
        """This agent's folder of worker logs and error files (``<root>/<run id>_<unique>``), once
        the first workers have started; None before, or without a log or error dir."""
        return self._run_dir_path

    def request_stop(self, reason: str, sig: signal.Signals = signal.SIGTERM) -> None:
        """Ask the loop to stop its workers and exit (safe from a signal handler).

        The workers get `sig` first (the signal the agent received, as torchrun forwards it),
        SIGKILL after the grace period; the agent exits with 128 + `sig`.
        """
        self._stop_reason = reason
        self._stop_signal = sig
        self._stop_requests += 1
        self._stop_requested.set()
        # Never blocks: a signal handler may interrupt this very thread while it holds the lock
        # (opening or closing the pipe), and then the loop is not waiting on it anyway.
        if self._wake_lock.acquire(blocking=False):
            try:
                if self._wake is not None:
                    with contextlib.suppress(OSError):  # full: it is readable already
                        os.write(self._wake[1], b"\0")
            finally:
                self._wake_lock.release()

    def _open_wake(self) -> None:
        read_fd, write_fd = os.pipe()
        try:
            os.set_blocking(write_fd, False)
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            raise
        with self._wake_lock:
            self._wake = (read_fd, write_fd)

    def _close_wake(self) -> None:
        with self._wake_lock:
            wake, self._wake = self._wake, None
        if wake is not None:
            os.close(wake[0])
            os.close(wake[1])

    def run(self) -> AgentResult:
        """Run until the workers succeed, the job stops, or this node gives up.

        The node's checkpoint savers run in this process for the whole job (see
        `AgentConfig.host_checkpoint_saver`). Whatever the exit, once the workers are stopped
        they finish their persists (after a failure, a stop or a signal: the newest snapshot
        every rank holds) and the job's shared memory is removed.
        """
        self._saver_host = self._start_saver_host() if self._config.host_checkpoint_saver else None
        result: AgentResult | None = None
        self._open_wake()
        try:
            self._start_standby_pool()
            self._store_import_deferred = self._wait_for_warm_standbys()
            if not self._store_import_deferred:
                # A starting job: the torch import behind the store overlaps registration and the
                # first rendezvous, which any node may leave as rank 0.
                self._prepare_store_host()
            if self._stop_requested.is_set():  # not registered: nothing to leave
                result = AgentResult(128 + self._stop_signal, self._stop_reason, 0, 0)
                return result
            result = self._run_rounds()
            return result
        finally:
            self._close_wake()
            self._close_store()
            self._stop_node_services(succeeded=result is not None and result.exit_code == 0)
            if self._sampler is not None:
                self._sampler.close()
                self._sampler = None

    def _stop_node_services(self, succeeded: bool) -> None:
        """Close the standby workers and stop the saver host (idempotent): after a success its
        memory is simply removed; otherwise the newest snapshot is persisted first."""
        if self._standby is not None:
            self._standby.close(self._config.shutdown_grace_s)
            self._standby = None
        host, self._saver_host = self._saver_host, None
        if host is not None:
            _log.info("stopping the checkpoint saver host (%s)", "job done" if succeeded else "persisting newest")
            host.stop(remove_memory=True, persist_newest=not succeeded)
            self._host_env = {}
        slots, self._step_slots = self._step_slots, None
        self._step_watch = None
        if slots is not None:
            slots.close()
        had_node_dir = self._node_dir_path is not None
        self._node_dir.close()
        self._node_dir_path = None
        if had_node_dir:
            # What an agent SIGKILLed past its stop grace left (a node that left the job while
            # the others train on) goes now, not only when the next agent here starts.
            remove_dead_owners(NODE_SHM_PREFIX, dir=self._config.checkpoint_shm_dir)

    def _node_shm_dir(self) -> Path:
        """This agent's own directory in ``checkpoint_shm_dir``, made on first use.

        The workers' snapshots, the saver host's sockets, the step slot file and the stack dumps
        go there: another agent on the host never shares them, and what a SIGKILLed agent left
        is removed by the next one here to start or stop.
        """
        if self._node_dir_path is None:
            shm = self._config.checkpoint_shm_dir
            remove_dead_owners(NODE_SHM_PREFIX, dir=shm)
            self._node_dir_path = Path(self._node_dir.enter_context(owned_temp_dir(NODE_SHM_PREFIX, dir=shm)))
        return self._node_dir_path

    def _node_progress(self) -> Progress:
        """The default progress: the newest step every local worker finished (by its step reports)
        or sealed (as a flash checkpoint), the samples they consumed, their step stats, and
        resource use."""
        step = -1
        host, layout = self._saver_host, self._layout
        if host is not None and layout is not None:
            first = layout[2]
            newest = host.newest_step_sealed_by(range(first, first + self._config.nproc_per_node))
            step = -1 if newest is None or newest < 0 else newest
        rank_steps = self._step_watch.stats(self._clock.now()) if self._step_watch is not None else ()
        samples = sum(r.samples for r in rank_steps)
        if len(rank_steps) == self._config.nproc_per_node:
            step = max(step, min(r.steps for r in rank_steps))
        now = self._clock.now()
        last = self._last_usage
        if last is None or now - last[0] >= self._config.resource_sample_interval_s:
            try:
                if self._sampler is None:
                    self._sampler = ProcessTreeSampler(os.getpid(), include_gpus=self._sample_gpus)
                last = self._last_usage = (now, self._sampler.sample())
            except Exception as exc:  # a sample is a courtesy to the master: it never ends training
                if last is None or last[1] is not None:
                    _log.warning("no resource samples in heartbeats: %s", exc)
                last = self._last_usage = (now, None)
        watch = self._step_watch if self._workers_running else None
        excuses = watch.excuses(now) if watch is not None else ()
        return Progress(
            step=step,
            samples=samples,
            resources=last[1],
            rank_steps=rank_steps,
            attempts=self._ledger.reports(),
            excuses=excuses,
        )

    def _heartbeat(self) -> Sequence[tuple[ActionKind, str] | MasterAction]:
        """Send a heartbeat with the node's progress; the step marks it carried are not sent again.

        Raises:
            DLRoverError: the master did not answer (the marks go with the next heartbeat).
        """
        progress = self._progress()
        actions = self._control.heartbeat(progress)
        self._ledger.acknowledge(progress.attempts)
        if self._step_watch is not None:
            # Ranks of other nodes in a named phase or busy: this node's ranks that wait on them are not hung.
            # A heartbeat that fails (not retried: a blip) leaves them for a while, as the master keeps a
            # silent node's for its heartbeat timeout.
            self._step_watch.excuse_elsewhere(
                self._control.peer_excuses(),
                self._clock.now(),
                valid_for_s=_RELAYED_EXCUSE_HEARTBEATS * self._heartbeat_interval_s,
            )
        return actions

    def _flush_progress(self) -> None:
        """One last heartbeat after the workers finished, so their last steps and checkpoint
        reach the master's accounting before this node reports success (best effort)."""
        self._read_slots()
        try:
            self._heartbeat()
            self._tell_commits()
        except DLRoverError as exc:
            _log.warning("could not send the last steps to the master: %s", exc)

    def _tell_commits(self) -> None:
        """Tell the master about checkpoints this node's savers committed since it last heard.

        One the master did not take is told again after the next heartbeat; a master that is
        away is the heartbeat's concern, not this courtesy's.
        """
        host = self._saver_host
        if host is None:
            return
        for commit in host.commits():
            key = (commit.job_id, commit.run_id)
            if commit.step <= self._commits_told.get(key, -1):
                continue
            try:
                self._control.commit_checkpoint(commit.step, commit.path, commit.world_size)
            except DLRoverError as exc:
                _log.warning("could not tell the master about checkpoint step %d: %s", commit.step, exc)
                return
            self._commits_told[key] = commit.step
            _log.info("told the master: checkpoint step %d committed at %s", commit.step, commit.path)

    def _read_slots(self) -> dict[int, SlotReading]:
        """Read every worker's step slot; local rank 0's goes to the goodput ledger."""
        if self._step_slots is None:
            return {}
        readings = self._step_slots.read_all()
        self._ledger.observe(readings.get(0))
        return readings

    def _start_standby_pool(self) -> None:
        """Standbys import `prewarm_modules` while this node registers and waits for its round (those
        `dlrover-run` started before it imported the agent, when given, are taken over)."""
        cfg = self._config
        if not cfg.prewarm_modules:
            return
        env = standby_env(
            self._environ,
            nproc_per_node=cfg.nproc_per_node,
            role=cfg.role,
            run_id=cfg.run_id,
            max_restarts=cfg.max_restarts,
            extra={**self._node_env(), **cfg.extra_env, **self._host_env},  # the order `_specs` uses
        )
        if self._standby is None:
            # Owned before it starts anything, so `run` closes whatever a failing fill started.
            self._standby = StandbyPool(cfg.worker_argv, cfg.prewarm_modules, env, size=cfg.nproc_per_node)
            when = ""
        else:
            # Started from the same program and environment but for DLRover's own variables, which a
            # taken standby gets with its worker's environment (and a refill from here on).
            self._standby.set_env(env)
            when = " started before the agent,"
        self._refill_standbys()
        _log.info("%d standby worker(s)%s importing %s", cfg.nproc_per_node, when, ", ".join(cfg.prewarm_modules))

    def _wait_for_warm_standbys(self) -> bool:
        """Join a job that has formed a round once the first workers can start at once (see
        `AgentConfig.prewarm_join_wait_s`). A starting job's nodes join at once: their first
        round waits for the slowest node's workers anyway, and nodes of an elastic range that
        join together stay in one first round.

        Returns whether this node joins a job that has formed a round (False when not asked:
        no standbys, or no wait). Such a node (a growth, a replacement) takes the lowest free
        rank, never the store's rank 0 while that node lives, so its agent imports torch for
        the store only once its workers train (`_refill_when_training`): on a host whose cores
        the standbys' imports and the round's start already share, a third import would delay
        the round that every node waits on."""
        wait_s = self._config.prewarm_join_wait_s
        if self._standby is None or wait_s <= 0:
            return False
        try:
            formed = self._control.round_has_formed(self._stop_requested.is_set)
        except DLRoverError:
            if self._stop_requested.is_set():
                return False  # `run` ends the node before it registers
            raise  # the master never listened: what registering would have said
        if not formed:
            return False
        started = self._clock.now()
        if self._standby.wait_warm(wait_s, self._stop_requested.is_set):
            _log.info(
                "standby workers done importing after %.1f s: joining the training job", self._clock.now() - started
            )
        elif not self._stop_requested.is_set():
            _log.warning("standby workers still importing after %.1f s: joining the job anyway", wait_s)
        return True

    def _prepare_store_host(self) -> None:
        """Start the store host's background import (at once, or once a deferral ends: see
        `_wait_for_warm_standbys`); opening a store before then imports on the spot."""
        self._store_import_deferred = False
        if self._store_host is not None:
            self._store_host.prepare()

    def _waiting_for_round(self) -> Callable[[], bool]:
        """What `next_round` polls while this node waits for its round: whether to stop; and, for
        a node that deferred the store's import, after `store_import_idle_wait_s` of waiting (a
        warm spare held in reserve, a node waiting for peers: its import then takes nothing from a
        round's start) the import starts, so that a spare that takes over node rank 0 opens the
        store without importing then."""
        since = self._clock.now()
        idle_wait_s = self._config.store_import_idle_wait_s

        def should_stop() -> bool:
            if self._store_import_deferred and self._clock.now() - since >= idle_wait_s:
                self._prepare_store_host()
            return self._stop_requested.is_set()

        return should_stop

    def _refill_standbys(self) -> None:
        """Warm standbys for the next start; a failure only costs that start its head start."""
        if self._standby is None:
            return
        try:
            self._standby.fill()
        except OSError as exc:
            _log.warning("could not start standby workers (%s); the next workers start fresh", exc)

    def _start_saver_host(self) -> SaverHost:
        cfg = self._config
        # The workers' snapshots and the host's sockets go in a directory of this agent's own:
        # another agent on the host (a second "node", another job) never shares a run's socket
        # or segments with it, and what a SIGKILLed agent left is removed by the next one here.
        node_dir = self._node_shm_dir()
        host = SaverHost(
            SaverHostConfig(
                str(host_socket_path(node_dir)),
                stop_timeout_s=cfg.checkpoint_stop_timeout_s,
                failure_persist_hold_s=cfg.failure_persist_hold_s,
                retention=cfg.checkpoint_retention,
                persist_bandwidth_mb_s=cfg.persist_bandwidth_mb_s,
            ),
            clock=self._clock,
        )
        try:
            host.start()
        except BaseException:
            self._node_dir.close()  # run() has not reached its cleanup yet
            self._node_dir_path = None
            raise
        self._host_env = {CHECKPOINT_SOCKET_ENV_VAR: str(host.socket_path), SHM_DIR_ENV_VAR: str(node_dir)}
        _log.info("checkpoint saver host listening on %s", host.socket_path)
        return host

    def _run_rounds(self) -> AgentResult:
        registration = self._control.register(
            self._config.nproc_per_node, self._stop_requested.is_set, max_restarts=self._config.max_restarts
        )
        self._node_id = registration.node_id
        self._heartbeat_interval_s = self._config.heartbeat_interval_s or registration.heartbeat_interval_s
        restarts = rounds = 0
        open_store = self._open_store if self._store_host is not None else None
        while True:
            if self._stop_requested.is_set():
                return AgentResult(128 + self._stop_signal, self._stop_reason, restarts, rounds)
            # Every exit from one round's body, a `continue`, a return or an exception, comes after
            # the round's workers have stopped (`_run_group` stops them): then its store goes.
            try:
                try:
                    joined = self._clock.wall_time()
                    assignment = self._control.next_round(
                        self._config.rendezvous_timeout_s, self._waiting_for_round(), open_store
                    )
                    self._round_times = (joined, self._clock.wall_time())
                except DLRoverError:
                    if self._stop_requested.is_set():
                        return AgentResult(128 + self._stop_signal, self._stop_reason, restarts, rounds)
                    raise
                rounds += 1
                _log.info(
                    "round %d: node rank %d of %d, store at %s:%d (hosted by %s)",
                    assignment.round,
                    assignment.group_rank,
                    assignment.group_world_size,
                    assignment.master_addr,
                    assignment.master_port,
                    "node rank 0's agent" if assignment.agent_store else "worker rank 0",
                )
                checked = self._check_nodes(assignment, restarts)
                if checked is not None:
                    _log.info("%s: %s", checked.kind.value, checked.reason)
                    if checked.kind is StepKind.EXIT:
                        self._leave_quietly()
                        return AgentResult(checked.exit_code, checked.reason, restarts, rounds)
                    continue
                step = self._run_group(assignment, restarts)
                _log.info("%s: %s", step.kind.value, step.reason)
                if step.kind is StepKind.SUCCEED:
                    self._flush_progress()
                    self._control.report_success(assignment)
                    # Only the round's store may still be needed (below): standbys and checkpoint
                    # memory go now, not after a wait for the other nodes.
                    self._stop_node_services(succeeded=True)
                    self._exit_barrier(assignment)
                    return AgentResult(0, step.reason, restarts, rounds)
                if step.kind is StepKind.EXIT:
                    try:
                        self._control.leave()
                    except DLRoverError as exc:
                        # Leaving is a courtesy that speeds up the others' next round; the exit and
                        # its reason stand whether or not the master heard it.
                        _log.warning("could not leave the rendezvous: %s", exc)
                    return AgentResult(step.exit_code, step.reason, restarts, rounds)
                if step.counts_as_restart:
                    restarts += 1
            finally:
                self._close_store()

    def _exit_barrier(self, assignment: RoundAssignment) -> None:
        """Keep this round's store open until every node of the round has finished.

        Only the agent that hosts the store waits, as torchrun's agents do in their exit barrier:
        workers of a node that finishes later may still use it (NCCL's watchdog polls it, and
        user code and `destroy_process_group` may read it), and would fail on a closed one. The
        wait ends when every node of the round reported success, when the round ends otherwise
        (a node rejoins, leaves or expires: a next round has a new store), on a stop request, or
        after `exit_barrier_timeout_s`. An unreachable master is waited out up to that bound:
        the other nodes keep training through it too.
        """
        cfg = self._config
        world = assignment.group_world_size
        hosts_store = assignment.agent_store and assignment.group_rank == 0 and self._store_host is not None
        if not hosts_store or world < 2 or cfg.exit_barrier_timeout_s <= 0:
            return
        started = self._clock.now()
        deadline = started + cfg.exit_barrier_timeout_s
        others = frozenset(range(world)) - {assignment.group_rank}  # its own mark is not needed
        _log.info(
            "keeping round %d's store open until its other %d node(s) finish (at most %.0f s)",
            assignment.round,
            len(others),
            cfg.exit_barrier_timeout_s,
        )
        # A master whose job just ended lingers about two heartbeat intervals before it exits:
        # polls come faster than that, so the last node's mark is read before it is gone.
        longest_interval = max(min(0.5, self._heartbeat_interval_s / 4), 0.01)
        interval = min(0.05, longest_interval)
        pending = others
        unreachable = False
        while True:
            if self._stop_requested.is_set():
                _log.info("closing round %d's store: %s", assignment.round, self._stop_reason or "stop requested")
                return
            try:
                pending = others - self._control.finished_ranks(assignment)
                if not pending:
                    waited = self._clock.now() - started
                    _log.info("every node of round %d finished (waited %.1f s)", assignment.round, waited)
                    return
                waiting = self._control.nodes_waiting(once=True)
                unreachable = False
            except DLRoverError as exc:
                if not unreachable:  # once per outage, not every poll
                    _log.warning("exit barrier: the master is unreachable, still waiting: %s", exc)
                unreachable = True
            else:
                if waiting > 0:
                    _log.info(
                        "round %d ended before node rank(s) %s finished (a node rejoins or left); closing its store",
                        assignment.round,
                        sorted(pending),
                    )
                    return
            now = self._clock.now()
            if now >= deadline:
                _log.warning(
                    "node rank(s) %s of round %d did not finish within the exit barrier timeout (%.0f s); "
                    "closing its store, which their workers can no longer use",
                    sorted(pending),
                    assignment.round,
                    cfg.exit_barrier_timeout_s,
                )
                return
            self._clock.sleep(min(interval, deadline - now))
            interval = min(interval * 2, longest_interval)

    def _open_store(self, host: str) -> int:
        """Open this round's store (this node got rank 0); the control plane publishes its address."""
        assert self._store_host is not None
        port = self._store_host.open(host)
        _log.info("hosting this round's torch.distributed store on %s:%d", host, port)
        return port

    def _close_store(self) -> None:
        if self._store_host is not None:
            self._store_host.close()

    def _run_group(self, assignment: RoundAssignment, restarts: int) -> Step:
        """Start this round's workers, watch them until a step other than CONTINUE, stop them."""
        layout = (
            assignment.group_rank,
            assignment.group_world_size,
            *assignment.worker_ranks(self._config.nproc_per_node),
        )
        if self._saver_host is not None and self._layout not in (None, layout):
            # The ranks this node holds, or the world size, changed: a held failure persist would
            # wait for ranks that never seal here again, or end on a replaced saver that no longer
            # commits.
            self._saver_host.release_held_failures(
                f"this node's ranks changed (node rank {self._layout[0]} of {self._layout[1]}, first rank "
                f"{self._layout[2]} of {self._layout[3]} -> node rank {layout[0]} of {layout[1]}, first rank "
                f"{layout[2]} of {layout[3]})"
            )
        self._layout = layout
        self._round_number = assignment.round
        group = self._start_workers(assignment, restarts)
        step: Step | None = None
        try:
            step = self._watch(group, restarts)
            return step
        finally:
            if group.running():
                group.stop(self._config.shutdown_grace_s, self._stop_signal)
            self._workers_running = False  # their phases excuse nobody elsewhere any more
            self._read_slots()  # the last steps before the workers ended
            pending, self._refill_pending = self._refill_pending, None
            if pending is not None and step is not None and step.kind is StepKind.RESTART:
                # The group ended before it trained again (a crash loop, a failure while restoring):
                # start the next standbys now that its workers are gone, overlapping the rendezvous.
                _log.info("starting standby workers for the next restart: the workers stopped before training again")
                self._prepare_store_host()
                self._refill_standbys()

    def _start_workers(self, assignment: RoundAssignment, restarts: int) -> WorkerGroup:
        self._prepare_step_slots()
        nproc = self._config.nproc_per_node
        first, _world_size = assignment.worker_ranks(nproc)
        self._step_watch = StepWatch({i: first + i for i in range(nproc)}, self._config.step_hang)
        group = WorkerGroup(
            self._specs(assignment, restarts),
            standby=self._standby,
            read_exiting_status=self._read_exiting_status,
            reap_timeout_s=self._config.worker_reap_timeout_s,
        )
        started_at = self._clock.now()  # before the start: no checkpoint of these workers is older
        self._oom_before = self._oom_watch.count()
        wall = self._clock.wall_time()
        rdzv = self._round_times
        self._ledger.start_attempt(
            first,
            rendezvous_start=rdzv[0] if rdzv else None,
            rendezvous_end=rdzv[1] if rdzv else None,
            workers_start=wall,
            wall_offset=wall - started_at,
        )
        group.start()
        self._workers_running = True
        ranks = frozenset(range(first, first + nproc))
        if self._standby is not None:
            # Warm again for the next restart, but not while these workers restore: the imports
            # would take their CPU (see `refill_due`).
            self._refill_pending = (started_at, ranks)
        if self._saver_host is not None:
            self._departed_sweep = (started_at, ranks)
        self._group_ranks = (started_at, ranks)
        return group

    def _sweep_departed_ranks(self) -> None:
        """Once every worker has sealed a snapshot since it started (and no failure persist may
        still read the old ones), remove the node's snapshots of ranks it no longer runs."""
        host, pending = self._saver_host, self._departed_sweep
        if host is None or pending is None:
            return
        started_at, ranks = pending
        if not ranks <= host.ranks_sealed_since(started_at) or host.failure_persist_pending():
            return
        self._departed_sweep = None
        removed = host.remove_departed_ranks(ranks)
        if removed:
            _log.info("removed %d snapshot files of ranks this node no longer runs", len(removed))

    def _refill_when_training(self) -> None:
        if self._refill_pending is None:
            return
        started_at, ranks = self._refill_pending
        host = self._saver_host
        sealed = host.ranks_sealed_since(started_at) if host is not None else frozenset()
        persisting = host is not None and host.failure_persist_pending()
        now = self._clock.now()
        if refill_due(
            now, started_at, self._config.prewarm_refill_after_s, sealed, ranks, failure_persisting=persisting
        ):
            self._refill_pending = None
            self._prepare_store_host()  # deferred while joining a running job; else started at once
            why = "the workers are training again" if set(ranks) <= set(sealed) else "the refill timer ran out"
            _log.info("starting standby workers for the next restart %.1f s after the start: %s", now - started_at, why)
            self._refill_standbys()

    def _watch(self, group: WorkerGroup, restarts: int) -> Step:
        next_heartbeat = self._clock.now()
        next_waiting_check = self._clock.now() + self._waiting_every
        master_lost_since: float | None = None
        hangs = HangWatch(self._config.hang_timeout_s) if self._config.hang_timeout_s > 0 else None
        steps = self._step_watch
        while True:
            if self._stop_requested.is_set():
                stop = Step(StepKind.EXIT, self._stop_reason or "stop requested", exit_code=128 + self._stop_signal)
                return self._save_before_stop(group, stop)
            next_heartbeat, next_waiting_check, nodes_waiting = self._waiting_between_heartbeats(
                next_heartbeat, next_waiting_check
            )
            if self._clock.now() >= next_heartbeat:
                next_heartbeat = self._clock.now() + self._heartbeat_interval_s
                try:
                    step = on_master_actions(self._heartbeat())
                    self._tell_commits()
                    if step.kind is not StepKind.CONTINUE:
                        return self._save_for_resize(group, step)
                    nodes_waiting = max(nodes_waiting, self._control.nodes_waiting())
                    # The heartbeat asked too: the next check keeps the rendezvous's pace.
                    next_waiting_check = self._clock.now() + self._waiting_every
                    master_lost_since = None
                except DLRoverError as exc:
                    # The master may be restarting (it resumes from its journal): training goes
                    # on untouched while it is away, up to master_lost_timeout_s.
                    now = self._clock.now()
                    master_lost_since = now if master_lost_since is None else master_lost_since
                    lost_s = now - master_lost_since
                    if lost_s >= self._config.master_lost_timeout_s:
                        return Step(StepKind.EXIT, f"lost the master for {lost_s:.0f} s: {exc}", exit_code=1)
                    _log.warning("master unreachable for %.1f s, workers keep running: %s", lost_s, exc)
            exits = group.poll()
            failing = group.failing
            if failing and not group.terminated:
                # Whatever the master answers, this node's workers stop; stopping the others now
                # lets their teardown overlap the failed one's (the kernel frees a dying worker's
                # memory before it can be reaped: tenths of a second per GB).
                _log.info("local rank %d is failing: stopping the other workers now", failing[0])
                group.terminate()
            step = assess_workers(exits, self._config.nproc_per_node, nodes_waiting, failing)
            step = self._save_before_round(group, step, nodes_waiting)
            if step.kind is StepKind.REPORT_FAILURE:
                failed = first_failure(exits, failing)
                assert failed is not None
                _log.error("%s", failure_line(failed, group.rank_of(failed.local_rank)))
                memory = self._oom_watch.evidence(self._oom_before, [failed.pid])
                return self._report(_failure_report(failed, restarts, memory))
            if step.kind is not StepKind.CONTINUE:
                return step
            if not failing:  # a failure is reported, not a hang of its aftermath
                hung = self._hang_of(group, exits, steps, hangs, restarts)
                if hung is not None:
                    return self._report(hung)
            self._refill_when_training()
            self._sweep_departed_ranks()
            if not self._stop_requested.is_set():
                # Wakes as soon as a worker exits: the report of a failure (and so the restart)
                # does not wait for the next tick.
                group.wait(self._config.monitor_interval_s, None if self._wake is None else self._wake[0])

    def _waiting_between_heartbeats(self, next_heartbeat: float, due_at: float) -> tuple[float, float, int]:
        """When to heartbeat next, when to ask again whether nodes wait to join, and how many were
        seen waiting now (0 when not asked): asked between heartbeats (one attempt, bounded by the
        poll timeout) every `waiting_check_interval_s` or as seldom as the rendezvous's answer
        asks (in a job of thousands of nodes), so a round for a joining node starts within that
        long rather than within a heartbeat interval. Nodes waiting bring the heartbeat forward:
        the master's word on this node (a restart for a failure's round, which must not wait for a
        save) comes before the round."""
        every = self._config.waiting_check_interval_s
        if not 0 < every < self._heartbeat_interval_s or self._clock.now() < due_at:
            return next_heartbeat, due_at, 0
        try:
            check = self._control.waiting_check()
            waiting = check.num_nodes_waiting
            # A rendezvous that does not pace (an older master) is asked as often as before pacing.
            pace = check.retry_after_s if check.retry_after_s > 0 else _UNPACED_WAITING_CHECK_S
        except DLRoverError as exc:  # the heartbeats judge whether the master is lost
            _log.debug("could not ask whether nodes wait to join: %s", exc)
            waiting, pace = 0, _UNPACED_WAITING_CHECK_S
        self._waiting_every = max(every, pace)
        now = self._clock.now()
        return (min(next_heartbeat, now) if waiting else next_heartbeat), now + self._waiting_every, waiting

    def _save_before_round(self, group: WorkerGroup, step: Step, nodes_waiting: int) -> Step:
        """Before a planned round (`step` restarts the workers because nodes wait to join), have
        the workers seal a flash checkpoint, so the new round resumes from the step this one
        reached and redoes none (see `round_save_timeout_s`). Returns the step to take: `step`,
        or what the master asked for on a heartbeat during the wait.

        Waits on its own monitoring, heartbeating meanwhile: a worker that exits, a stop request
        or a master's action ends the wait.
        """
        if step.kind is not StepKind.RESTART or nodes_waiting <= 0:
            return step
        step = self._save_first(group, step, "planned round")
        if step.kind is not StepKind.RESTART:
            return step
        if group.failing or first_failure(group.poll(), group.failing) is not None:
            # A worker failed while the others saved: its failure is reported (on the next look), not
            # taken into the round's restart, and nothing excuses the peers' collective errors.
            return Step(StepKind.CONTINUE, "a worker failed during the save before the round")
        self._announce_round_restart(nodes_waiting)
        return step

    def _announce_round_restart(self, nodes_waiting: int) -> None:
        """Before this node's workers stop for a new round, tell the rendezvous: the peers' workers,
        whose collectives break when these stop, may report that failure before their own agents see
        the waiting nodes, and it is this restart's consequence, not theirs to be charged for."""
        try:
            self._control.restarting_for_round(nodes_waiting, self._round_number)
        except DLRoverError as exc:
            _log.warning("could not tell the master that the workers restart for a new round (%s): peers' "
                         "collective errors that follow may be charged to them", exc)  # fmt: skip

    def _save_before_stop(self, group: WorkerGroup, step: Step) -> Step:
        """Before stopping the workers for a SIGTERM (how a backend stops a node it lets go, a
        planned shrink among them, within its stop grace), have them seal a flash checkpoint, so
        the job's next round resumes from the step they reached (see `round_save_timeout_s`).

        Only when every worker's script polls the save request (its checkpointer's
        ``save_requested()``, marked in its step slot): a request nobody answers would spend the
        grace the saver needs to persist the newest snapshot. Another stop request ends the wait;
        any other signal (SIGINT: a person at the terminal) stops at once. Returns `step`.
        """
        if self._stop_signal is not signal.SIGTERM:
            return step
        return self._save_before_leaving(group, step, "stop")

    def _save_for_resize(self, group: WorkerGroup, step: Step) -> Step:
        """The master's step on a heartbeat, after the save a resize asks for first: a planned
        round's restart (nodes left; see `round_save_timeout_s`), or this node's removal by a
        shrink (`_save_before_leaving`); any other step at once."""
        if not step.planned_round:
            return step
        if step.kind is StepKind.RESTART:
            return self._save_first(group, step, "planned round")
        return self._save_before_leaving(group, step, "leaving the job")

    def _save_before_leaving(self, group: WorkerGroup, step: Step, what: str) -> Step:
        """Have the workers seal a flash checkpoint before this node leaves the job (`step`
        stops them), so the next round resumes from the step they reached. Only when every
        worker polls the save request: one nobody answers would spend the backend's stop grace,
        which the saver needs to persist the newest snapshot. The backend's SIGTERM, which
        follows a shrink's removal, does not end the wait; a second stop request or a signal
        other than SIGTERM does."""
        if not self._workers_poll_save_requests():
            return step
        return self._save_first(group, step, what, leaving=True)

    def _workers_poll_save_requests(self) -> bool:
        """Whether every worker's script polls the save request (marked in its step slot)."""
        slots = self._step_slots
        readings = {} if slots is None else slots.read_all()
        return all(i in readings and readings[i].polls_save_requests for i in range(self._config.nproc_per_node))

    def _save_first(self, group: WorkerGroup, step: Step, what: str, *, leaving: bool = False) -> Step:
        """Ask the workers for a flash checkpoint and wait until each has sealed one that began
        after the request, or `round_save_timeout_s`, before `step` is taken (`what` names it in
        the log). Returns the step to take: `step`, or what the master asked for on a heartbeat
        during the wait.

        Waits on its own monitoring: a worker that exits or a stop request ends the wait (when
        `leaving`, see `_save_before_leaving`); unless `leaving` (the master has nothing more to
        say to this node), it heartbeats meanwhile and a master's action for a failure or a stop
        ends it too. The master's planned-round restart or shrink removal does not: a rendezvous
        that dissolved when a shrink let a peer go starts this wait before the heartbeat brings
        the resize's own restart, and the save under way is the one that restart asks for. Only with
        the node's saver hosted here, and only for workers that poll the save request or have
        sealed a snapshot since they started (others may not checkpoint at all: a request would
        go unanswered).
        """
        host, slots, timeout = self._saver_host, self._step_slots, self._config.round_save_timeout_s
        if host is None or slots is None or timeout <= 0 or self._group_ranks is None:
            return step
        started_at, ranks = self._group_ranks
        if not (ranks <= host.ranks_sealed_since(started_at) or self._workers_poll_save_requests()):
            return step
        asked_at = self._clock.now()
        number = slots.request_save()
        _log.info("%s: asked the workers for a flash checkpoint (request %d)", what, number)
        next_heartbeat = asked_at + self._heartbeat_interval_s
        local_slots = range(self._config.nproc_per_node)
        while True:
            answered = self._answered_save_request(group, number, asked_at)
            waited = self._clock.now() - asked_at
            if len(answered) == len(local_slots):
                newest = host.newest_step_sealed_by(ranks)
                _log.info("%s: every worker sealed step %s %.2f s after the request", what, newest, waited)
                return step
            stopped = self._stop_requested.is_set()
            if leaving:  # the SIGTERM that stops a leaving node is no reason to stop waiting
                stopped = self._stop_requests > 1 or (stopped and self._stop_signal is not signal.SIGTERM)
            if waited >= timeout or group.poll() or stopped:
                missing = ", ".join(str(i) for i in local_slots if i not in answered)
                _log.warning(
                    "%s: local rank(s) %s sealed no flash checkpoint within %.1f s "
                    "(--round-save-timeout %g); the next round resumes from their newest one",
                    what,
                    missing,
                    waited,
                    timeout,
                )
                return step
            if not leaving and self._clock.now() >= next_heartbeat:
                next_heartbeat = self._clock.now() + self._heartbeat_interval_s
                asked = self._heartbeat_while_saving()
                if asked is not None and not asked.planned_round:
                    return asked  # a failure's restart or a stop: broken collectives save nothing
                if asked is not None:
                    # The master's word on the same resize (the restart it planned, found by the
                    # rendezvous first, or this node's removal): the save under way serves it.
                    # Ending the wait here restarted the workers before their next step saved.
                    _log.info("%s: the master asks for the same round's step, after this save: %s", what, asked.reason)
                    step = asked
                    if asked.kind is StepKind.EXIT:
                        what, leaving = "leaving the job", True
            # Not woken by the stop pipe while leaving: it stays readable once written.
            wake = None if leaving or self._wake is None else self._wake[0]
            group.wait(self._config.monitor_interval_s, wake)

    def _answered_save_request(self, group: WorkerGroup, number: int, asked_at: float) -> set[int]:
        """The local ranks whose workers answered save request `number`: with a save that began
        after it (the checkpointer's own rule: one under way when it came holds an older step), or,
        for a worker whose script does not poll requests (a sharded checkpointer saves on its own
        schedule), with any snapshot sealed since the request was made."""
        assert self._step_slots is not None
        assert self._saver_host is not None
        readings = self._step_slots.read_all()
        sealed = self._saver_host.ranks_sealed_since(asked_at)
        answered = set()
        for local_rank in range(self._config.nproc_per_node):
            reading = readings.get(local_rank)
            if reading is not None and reading.served_request >= number:
                answered.add(local_rank)
            elif reading is None or not reading.polls_save_requests:
                rank = group.rank_of(local_rank)
                if rank.isdigit() and int(rank) in sealed:
                    answered.add(local_rank)
        return answered

    def _heartbeat_while_saving(self) -> Step | None:
        """One heartbeat during the save before a round (the node must not look lost); the
        master's action, if it asked for one, replaces the round's restart: at once when it is for
        a failure or a stop, after the save when it is the resize's own (`Step.planned_round`)."""
        try:
            asked = on_master_actions(self._heartbeat())  # acknowledges the step marks it carried
        except DLRoverError as exc:
            _log.warning("heartbeat during the save before a round failed: %s", exc)
            return None
        if asked.kind is StepKind.CONTINUE:
            return None
        if not asked.planned_round:
            _log.info("the master asked for more while the workers saved: %s", asked.reason)
        return asked

    def _check_nodes(self, assignment: RoundAssignment, restarts: int) -> Step | None:
        """Run the network check of this round, if on; None when this node goes on to train.

        A node the check leaves out reports itself to the master with the probes as evidence and
        exits without training; the others start a new round without it. What the master asks
        for during the check is carried out when it ends: a stop ends the check at once and
        exits as a stop does while training; a restart starts a new round instead of training.
        A master that stays unreachable past `master_lost_timeout_s` ends the agent (status 1);
        settings that differ from the other nodes' are a configuration error (status 2).
        """
        if self._network_check is None:
            return None
        self._check_action = None
        try:
            outcome = self._run_check(self._network_check, assignment, restarts)
        finally:
            action = self._take_check_action()
        if isinstance(outcome, Step):
            return outcome
        step = check_step(outcome)
        if step is not None and step.kind is StepKind.REPORT_FAILURE:
            _log.error("%s", outcome.reason)
            delivered = self._deliver(FailureReport(-1, 1, None, outcome.evidence, restarts, network_check=True))
            if isinstance(delivered, str):
                return after_check_report(outcome, None, delivered)
            return after_check_report(outcome, delivered)
        if action is not None:
            # A restart the master asked for during the check: a new round, no workers started.
            return Step(StepKind.RESTART, f"{action.reason} (during the network check: {outcome.reason})")
        return step

    def _run_check(self, check: NetworkCheck, assignment: RoundAssignment, restarts: int) -> CheckOutcome | Step:
        """The check's outcome, or the exit step when it could not reach one."""
        try:
            return check.run(
                assignment,
                should_stop=self._check_should_stop,
                keepalive=self._keepalive_during_check,
                store_retry_s=self._config.master_lost_timeout_s,
                node_id=self._node_id,
            )
        except NetworkCheckStopped:
            if self._check_action is not None and self._check_action.kind is StepKind.EXIT:
                return self._check_action
            return Step(StepKind.EXIT, self._stop_reason or "stop requested", exit_code=128 + self._stop_signal)
        except NetworkCheckSettingsMismatch as exc:
            reason = f"configuration error: {exc}"
            _log.error("%s", reason)
            answer = self._deliver(FailureReport(-1, 2, None, reason, restarts, network_check=True))
            if isinstance(answer, str):
                return Step(StepKind.EXIT, f"{reason}; the report did not reach the master: {answer}", exit_code=2)
            told = f"reported to the master, which answered {answer.action.value}: {answer.outcome}"
            return Step(StepKind.EXIT, f"{reason}; {told}", exit_code=2)
        except DLRoverError as exc:
            return Step(StepKind.EXIT, f"network check of round {assignment.round} gave up: {exc}", exit_code=1)

    def _take_check_action(self) -> Step | None:
        action, self._check_action = self._check_action, None
        return action

    def _check_should_stop(self) -> bool:
        return self._stop_requested.is_set() or (
            self._check_action is not None and self._check_action.kind is StepKind.EXIT
        )

    def _keepalive_during_check(self) -> None:
        """Heartbeat at the usual interval while the check runs, so the node is not taken for dead.

        The master's actions come once, with one heartbeat: they are kept for `_check_nodes`.
        """
        now = self._clock.now()
        if now < self._check_heartbeat_at:
            return
        self._check_heartbeat_at = now + self._heartbeat_interval_s
        try:
            step = on_master_actions(self._heartbeat())
        except DLRoverError as exc:
            _log.warning("heartbeat during the network check failed: %s", exc)
            return
        if step.kind is StepKind.CONTINUE:
            return
        _log.info("master action during the network check: %s", step.reason)
        if self._check_action is None or step.kind is StepKind.EXIT:
            self._check_action = step

    def _leave_quietly(self) -> None:
        try:
            self._control.leave()
        except DLRoverError as exc:
            # As after any exit: leaving only speeds up the others' next round.
            _log.warning("could not leave the rendezvous: %s", exc)

    def _report(self, report: FailureReport) -> Step:
        """Report a failure and turn the master's answer into a step.

        A master that cannot be reached (it may be restarting) is asked again, with backoff, for
        up to `master_lost_timeout_s`; the report is not idempotent, so in the rare case that a
        reply was lost after the master acted, the failure counts twice against the budgets.
        """
        answer = self._deliver(report)
        if isinstance(answer, str):
            return Step(StepKind.EXIT, answer, exit_code=1)
        return after_failure(answer)

    def _deliver(self, report: FailureReport) -> Decision | str:
        """Report a failure, retrying as `_report` says; the master's answer, or why it failed."""
        started = self._clock.now()
        wait = 0.5
        while True:
            try:
                return self._control.report_failure(report)
            except DLRoverError as exc:
                lost_s = self._clock.now() - started
                if lost_s >= self._config.master_lost_timeout_s or self._stop_requested.is_set():
                    return f"could not report a failure for {lost_s:.0f} s: {exc}"
                _log.warning("could not report a failure (retrying in %.1f s): %s", wait, exc)
                self._stop_requested.wait(wait)
                wait = min(wait * 2, 10.0)

    def _hung_workers(
        self, group: WorkerGroup, exits: Mapping[int, WorkerExit], hangs: HangWatch, restarts: int
    ) -> FailureReport | None:
        now = self._clock.now()
        readings = {}
        for rank, pid in group.pids.items():
            cpu = read_cpu_seconds(pid) if rank not in exits else None
            if cpu is not None:
                readings[rank] = cpu
        hung = hangs.observe(readings, now)
        if not hung:
            return None
        stalled_s = hangs.stalled_for(hung[0], now)
        evidence = (
            f"hang: local rank(s) {hung} made no CPU progress for {stalled_s:.1f} s "
            f"(--hang-timeout {self._config.hang_timeout_s} s): stopped, deadlocked, or waiting on a lost peer"
        )
        return FailureReport(hung[0], 0, None, evidence, restarts, hang=True)

    def _hang_of(
        self,
        group: WorkerGroup,
        exits: Mapping[int, WorkerExit],
        steps: StepWatch | None,
        hangs: HangWatch | None,
        restarts: int,
    ) -> FailureReport | None:
        """The report of hung workers, by their step reports first, then by their CPU time; None if none."""
        if steps is not None and self._step_slots is not None:
            steps.observe(self._read_slots(), self._clock.now())
            verdict = steps.check(self._clock.now())
            if verdict is not None and verdict.hung:
                dumps = self._dump_stacks(group, exits)
                busy = self._busy_worker(group, exits, dumps)
                if self._config.hang_busy_probe_s > 0 and (set(group.poll()) - set(exits) or group.failing):
                    return None  # a worker exited while it was probed: its exit is reported, not a hang
                wait_s = max(verdict.window_s, _BUSY_RECHECK_S)
                if busy is None or not steps.excuse_busy(self._clock.now(), wait_s):
                    steps.busy_over()
                    return self._stalled_workers(group, exits, steps, verdict, dumps=dumps, restarts=restarts)
                local_rank, frame = busy
                _log.warning(
                    "%s; but local rank %d runs Python code (its main thread moved, now at %s): busy, not "
                    "hung, judged again in %.0f s (mark long work with StepReporter.phase('eval'))",
                    verdict.reason,
                    local_rank,
                    frame,
                    wait_s,
                )
        if hangs is not None:
            return self._hung_workers(group, exits, hangs, restarts)
        return None

    def _dump_stacks(
        self, group: WorkerGroup, exits: Mapping[int, WorkerExit], only: Collection[int] | None = None
    ) -> dict[int, StackDump]:
        """The stacks of every running worker (or of those in `only`), by local rank (py-spy, or the
        faulthandler it registered)."""
        node_dir = self._node_dir_path
        dumps = {}
        for rank, pid in sorted(group.pids.items()):
            if rank in exits or (only is not None and rank not in only):
                continue
            dump_path = node_dir / _stack_file(rank) if node_dir is not None else None
            dumps[rank] = request_stack_dump(pid, dump_path=dump_path, timeout_s=self._config.stack_dump_timeout_s)
        return dumps

    def _busy_worker(
        self, group: WorkerGroup, exits: Mapping[int, WorkerExit], first: Mapping[int, StackDump]
    ) -> tuple[int, str] | None:
        """A worker whose main thread moved between `first` and a second dump taken
        `hang_busy_probe_s` later, with the frame it is in now; None when every main thread stood
        still (or the probe is off, or no dump shows one)."""
        if self._config.hang_busy_probe_s <= 0:
            return None
        before = {rank: (d.method, main_thread_frames(d.text)) for rank, d in first.items() if d.ok}
        probed = {rank for rank, (_, frames) in before.items() if frames}
        if not probed:
            return None
        self._clock.sleep(self._config.hang_busy_probe_s)
        for rank, dump in self._dump_stacks(group, exits, probed).items():
            frames = main_thread_frames(dump.text) if dump.ok else None
            # Only dumps of one method compare: py-spy and faulthandler print frames differently.
            if frames and dump.method == before[rank][0] and frames != before[rank][1]:
                return rank, frames[0]
        return None

    def _stalled_workers(
        self,
        group: WorkerGroup,
        exits: Mapping[int, WorkerExit],
        steps: StepWatch,
        verdict: HangReport,
        *,
        dumps: Mapping[int, StackDump],
        restarts: int,
    ) -> FailureReport:
        """The report of workers whose step reports stopped: the verdict, then every worker's stack."""
        first = steps.local_rank(verdict.stalled_ranks[0])
        local_rank = first if first is not None else 0
        parts = [f"hang: {verdict.reason}"]
        for rank, pid in sorted(group.pids.items()):
            dump = dumps.get(rank)
            if rank in exits or dump is None:
                parts.append(f"--- local rank {rank} (rank {group.rank_of(rank)}) already exited ---")
                continue
            how = dump.method if dump.ok else f"no dump: {dump.reason}"
            parts.append(f"--- stack of local rank {rank} (rank {group.rank_of(rank)}, pid {pid}; {how}) ---")
            if dump.ok:
                parts.append(dump.text.rstrip())
        # The verdict last too: the master keeps (and summarises) the end of a long evidence.
        parts.append(f"hang: {verdict.reason}; every worker's stack is above")
        evidence = "\n".join(parts)
        _log.error("%s", evidence)
        return FailureReport(local_rank, 0, None, evidence, restarts, hang=True)

    def _run_dir(self) -> Path | None:
        """This agent's folder for worker logs and error files, made on first use: as torchrun's,
        ``<log dir>/<run id>_<unique>``, so that nodes sharing a log dir, and later runs of the
        same job id, never write into each other's files. None without a log or error dir."""
        cfg = self._config
        root = cfg.log_dir if cfg.log_dir is not None else cfg.error_dir
        if root is None:
            return None
        if self._run_dir_path is None:
            root.mkdir(parents=True, exist_ok=True)
            self._run_dir_path = Path(tempfile.mkdtemp(prefix=f"{cfg.run_id}_", dir=root))
            what = "worker logs and error files" if cfg.log_dir is not None else "worker error files (no logs)"
            _log.info("%s go under %s", what, self._run_dir_path)
        return self._run_dir_path

    def _node_env(self) -> dict[str, str]:
        """What every worker of this node is told about the job and the node.

        The job id, stable across worker restarts (checkpoints find their memory by it), and how
        long to wait for a lost master: the workers' own master clients (shards, reports) wait as
        long as this agent keeps them training without one, so a master restart fails no step.
        """
        return {**self._job_env, MASTER_LOST_TIMEOUT_ENV_VAR: f"{self._config.master_lost_timeout_s:g}"}

    def _step_env(self, local_rank: int) -> dict[str, str]:
        """Where worker `local_rank` reports its steps and dumps its stacks (none without slots)."""
        if self._step_slots is None or self._node_dir_path is None:
            return {}
        return {
            STEP_SLOTS_ENV_VAR: str(self._step_slots.path),
            STEP_SLOT_ENV_VAR: str(local_rank),
            STACK_DUMP_ENV_VAR: str(self._node_dir_path / _stack_file(local_rank)),
        }

    def _prepare_step_slots(self) -> None:
        """A clear slot per worker and no stale stack dumps, before a set of workers starts."""
        node_dir = self._node_shm_dir()
        if self._step_slots is None:
            self._step_slots = StepSlotFile(node_dir / "steps.slots", self._config.nproc_per_node)
        else:
            self._step_slots.reset()
        for local_rank in range(self._config.nproc_per_node):
            (node_dir / _stack_file(local_rank)).unlink(missing_ok=True)

    def _specs(self, assignment: RoundAssignment, restarts: int) -> list[WorkerSpec]:
        cfg = self._config
        nproc = cfg.nproc_per_node
        # As torchrun: this node's workers follow those of the nodes ranked before it, which may
        # each run a different number of workers.
        first, world_size = assignment.worker_ranks(nproc)
        run_dir = self._run_dir()
        attempt_dir = run_dir / f"attempt_{restarts}" if run_dir is not None and cfg.log_dir is not None else None
        errors_dir = run_dir / f"attempt_{restarts}" if run_dir is not None else None
        specs = []
        for local_rank in range(nproc):
            rank = first + local_rank
            identity = WorkerIdentity(
                rank=rank,
                local_rank=local_rank,
                world_size=world_size,
                local_world_size=nproc,
                group_rank=assignment.group_rank,
                group_world_size=assignment.group_world_size,
                role_rank=rank,
                role_world_size=world_size,
                role_name=cfg.role,
            )
            env = worker_env(
                self._environ,
                identity,
                master_addr=assignment.master_addr,
                master_port=assignment.master_port,
                run_id=cfg.run_id,
                restart_count=restarts,
                max_restarts=cfg.max_restarts,
                agent_store=assignment.agent_store,
                extra={
                    NODE_ID_ENV_VAR: self._node_id,
                    **self._node_env(),
                    **cfg.extra_env,
                    **self._host_env,
                    **self._step_env(local_rank),
                },
                virtual_local_rank=cfg.virtual_local_rank,
            )
            specs.append(
                WorkerSpec(
                    local_rank=local_rank,
                    argv=cfg.worker_argv,
                    env=env,
                    log_dir=attempt_dir / str(local_rank) if attempt_dir is not None else None,
                    redirect=cfg.redirects.get(local_rank, 0),
                    tee=cfg.tee.get(local_rank, 0),
                    show=not cfg.local_ranks_filter or local_rank in cfg.local_ranks_filter,
                    prefix=f"[{cfg.role}{rank}]:",
                    error_file=errors_dir / str(local_rank) / f"error-rank{rank}.json" if errors_dir else None,
                    duplicate_filters=cfg.duplicate_filters,
                    log_max_bytes=cfg.log_max_bytes,
                )
            )
        return specs


def _stack_file(local_rank: int) -> str:
    return f"stacks-{local_rank}.txt"


def _failure_report(failed: WorkerExit, restarts: int, memory: Sequence[str] = ()) -> FailureReport:
    """The report of a worker that failed: its stderr tail, what its error file says, then what
    the host's OOM records say (`OomWatch.evidence`)."""
    evidence = failed.stderr_tail
    if failed.error:
        evidence += f"\n--- its error file (torch.distributed.elastic @record) ---\n{failed.error}"
    if memory:
        # Last: the master keeps the end of a long evidence.
        evidence += "\n" + "\n".join(memory)
    return FailureReport(failed.local_rank, failed.exit_code, failed.signal_name, evidence, restarts)
