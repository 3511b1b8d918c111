"""`PsJobMaster`: runs a TensorFlow parameter-server job on a scheduler backend.

It gives every task an address for the whole job and its `TF_CONFIG`, serves the shard service the chief reads
its data from (token-authenticated, on the master's own gRPC server), starts the tasks through the backend, and
carries out what `PsJobCore` decides from what the backend observes. Every decision is an event in the job's
event log (`<work_dir>/events.jsonl`), and so is each restore of the chief's data position, with the samples and
steps it undid.

It also measures the job for the next one like it: each role's peak memory, samples per second by worker count,
and the model's size from the chief's newest TensorFlow checkpoint (read without TensorFlow, see
`tf_checkpoint`), recorded as the job's profile when it ends (`plan.build_ps_profile`). With `ps_state_ratio`,
a checkpoint whose largest server share is over that fraction of a server's memory adds a server before one is
killed for memory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from dlrover.autoscale import HotPsConfig, Resources, Role, plan_hot_ps
from dlrover.common import (
    TOKEN_FILE_ENV_VAR,
    Clock,
    ConfigError,
    GrpcServer,
    ServerConfig,
    SystemClock,
    add_ping_service,
    generate_token,
    validate_token,
    write_token_file,
)
from dlrover.common.orphan_guard import guarded_argv
from dlrover.common.validators import positive
from dlrover.master.eventlog import EventLog, read_event_log
from dlrover.master.journal import JournaledEvent
from dlrover.master.launch_retry import LaunchRetries, LaunchRetrySettings
from dlrover.master.profiles import ProfileRecorder, ThroughputBySize
from dlrover.master.psjob import node as node_main
from dlrover.master.psjob.core import JobOutcome, PsDecision, PsEvent, PsJobCore, TaskPhase
from dlrover.master.psjob.flash import DEFAULT_FLASH_ROOT, FlashCheckpoints, checkpoint_number
from dlrover.master.psjob.job_service import PsJobServicer
from dlrover.master.psjob.plan import DEFAULT_PS_JOB_NAME, PsPlanChoice, build_ps_profile, ps_signature
from dlrover.master.psjob.ports import task_ports
from dlrover.master.psjob.progress import Rewind, RewindWatchingServicer
from dlrover.master.psjob.ps_load import PsCpuSampler, TaskMemoryPeaks
from dlrover.master.psjob.spec import PsJobSpec, TaskKey, tf_config
from dlrover.master.psjob.standby import StandbyTasks
from dlrover.master.psjob.tf_checkpoint import CheckpointReadError, CheckpointSizes, newest_checkpoint, sizes_of
from dlrover.master.scheduler.base import (
    MASTER_ADDR_ENV_VAR,
    REASON_OOM_KILLED,
    BackendUnavailableError,
    NodeMemoryRecords,
    NodeRejectedError,
    NodeSpec,
    ObservedNode,
    ObservedState,
    SchedulerBackend,
    SchedulerError,
    check_node_fits,
)
from dlrover.master.scheduler.cgroups import CgroupMemoryGroups, detect_memory_groups
from dlrover.master.scheduler.local import LocalScheduler
from dlrover.master.states import JobState, NodeState
from dlrover.master.status import JobSummary, NodeSummary
from dlrover.master.v1 import job_pb2_grpc
from dlrover.shard import ShardRegistry
from dlrover.shard.v1 import shard_pb2_grpc

__all__ = ["CHECKPOINT_DIR_ENV_VAR", "TASK_ENV_VAR", "PsJobConfig", "PsJobMaster"]

_log = logging.getLogger(__name__)

TASK_ENV_VAR = "DLROVER_PS_TASK"
"""Set for every task: its role and index (`worker:1`), the same as its `TF_CONFIG` says."""

CHECKPOINT_DIR_ENV_VAR = "DLROVER_CHECKPOINT_DIR"
"""Set for every task: the directory the chief's program should save its TensorFlow checkpoints in (the master
reads the model's size from the newest one)."""

EVENT_LOG_NAME = "events.jsonl"
_MIB = 1024 * 1024
# How a task's phase reads in the job's status, where every task is a node.
_NODE_STATE = {
    TaskPhase.LAUNCHED: NodeState.PENDING,
    TaskPhase.RUNNING: NodeState.RUNNING,
    TaskPhase.WAITING: NodeState.RELAUNCHING,
    TaskPhase.SUCCEEDED: NodeState.SUCCEEDED,
    TaskPhase.LEFT_OUT: NodeState.REMOVED,
    TaskPhase.HELD: NodeState.PENDING,
}


def _ended_state(outcome: JobOutcome) -> JobState:
    return JobState.SUCCEEDED if outcome.succeeded else JobState.FAILED


def _argv(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


LAUNCH_FAILED_REASON = "LaunchFailed"
"""Why a task's node failed whose launch the backend kept failing (its retries spent)."""


@attrs.frozen
class PsJobConfig:
    """Everything `PsJobMaster` needs.

    Attributes:
        spec: the task groups, resources and budgets.
        command: the program the chief (and the evaluator) runs, as an argument list.
        work_dir: the job's directory: its token (0600), event log and per-task logs.
        job_name: names the job in events.
        task_host: the host every task listens on (the local backend runs them all here), and where their ports
            are chosen; a backend that names its tasks (`task_host(role, index)`, the Kubernetes backend's DNS
            names) gives their hosts instead.
        bind_address: the interface the master's gRPC server listens on.
        port: its port; 0 picks a free one.
        tick_interval_s: how often the backend is looked at.
        replacement_poll_s: how often while a task waits for its old node to end before its new one starts.
        stop_grace_s: how long a stopped task has between SIGTERM and SIGKILL.
        launch_retry: how a launch the backend failed for a passing reason (a plain `SchedulerError`: the API
            server away) is tried again, the task waiting and nothing charged, before it counts as the task's
            failure; a launch the platform refuses for good (`NodeRejectedError`) ends the job.
        hot_ps: add a parameter server when one is hot (`dlrover.autoscale.plan_hot_ps`, from the CPU each parameter
            server's process uses against its `--ps-cpu` request); None: never. A plan to give a hot server more
            CPU instead is reported in an event and not carried out (it would restart the server).
        hot_ps_interval_s: how often the heuristic is asked.
        hot_ps_warmup_s: a parameter server's CPU is not counted in its first this many seconds (its start).
        hot_ps_idle_s: the job counts as training while its chief acknowledged samples within this many seconds;
            longer without (a start-up, a restore, a stall), the load samples start again.
        checkpoint_dir: the storage the chief's TensorFlow checkpoints persist in; None: `<work_dir>/checkpoints`.
            The chief saves there (its `DLROVER_CHECKPOINT_DIR`) unless they go to memory (`flash_root`).
        flash_root: a memory file system shared by the chief and the parameter servers (the local backend's, which
            run on this host) where the chief saves its checkpoints, each copied to `checkpoint_dir` in the
            background (`dlrover.master.psjob.flash`) while it has room for them; None: straight to storage.
            Not with a backend given to the master, nor with parameter servers whose memory limit is enforced
            (their shares of a checkpoint would count against it).
        flash_reserve_mb: what `flash_root` keeps free beyond room for the checkpoints.
        mirror_poll_s: seconds between the background copier's looks for new checkpoints in memory.
        last_copy_timeout_s: the longest the last copy to storage may take (when the job ends, and before the
            chief moves to storage); past it the memory directory is kept, and the event says so.
        checkpoint_poll_s: how often the directory is looked at for a newer checkpoint.
        ps_state_ratio: add a parameter server (the same planned restart as a hot one) when the newest checkpoint's
            largest server share is over this fraction of a server's memory request; None: never.
        max_ps: the most parameter servers the job grows to (`ps_state_ratio`; `hot_ps` has its own).
        profile_store: record the job's profile in this store when it ends (None: not recorded).
        job_kind: the user's tag for jobs that are alike (part of the profile's signature).
        initial_plan: where the job's counts and resources came from (announced at start; None: not said).
        standby_tasks: keep the next incarnation of the chief and of a parameter server started and warm
            (TensorFlow imported), so a relaunched one starts at once (`dlrover.master.psjob.standby`); only with
            the default local backend (whose tasks run `node.py`, which knows how to wait as a standby), and a
            chief's only for a `python script.py` program run by this interpreter.
        standby_refill_s: how long after a chief's or server's launch the next standby of its role starts (its
            import would slow the restart it is for).
        standby_go_timeout_s: the longest the master waits to hand a standby its task (it reads at once).
        predecessor_margin_s: how long past their grace the tasks of a previous master of the job (a Kubernetes
            backend lists them) may take to end before this master gives up starting.
        token: the job token the shard service checks (a Kubernetes job's tasks read theirs from the job's
            Secret, so the master must use the same); None: a new one is made. Either way it is written to
            `<work_dir>/token`.
    """

    spec: PsJobSpec = attrs.field(validator=attrs.validators.instance_of(PsJobSpec))
    command: tuple[str, ...] = attrs.field(converter=_argv)
    work_dir: str = attrs.field(converter=str)
    job_name: str = DEFAULT_PS_JOB_NAME
    task_host: str = "127.0.0.1"
    bind_address: str = "127.0.0.1"
    port: int = 0
    tick_interval_s: float = attrs.field(default=0.2, validator=positive)
    replacement_poll_s: float = attrs.field(default=0.05, validator=positive)
    stop_grace_s: float = attrs.field(default=5.0, validator=attrs.validators.ge(0.0))
    launch_retry: LaunchRetrySettings = attrs.field(
        factory=LaunchRetrySettings, validator=attrs.validators.instance_of(LaunchRetrySettings)
    )
    hot_ps: HotPsConfig | None = None
    hot_ps_interval_s: float = attrs.field(default=10.0, validator=positive)
    hot_ps_warmup_s: float = attrs.field(default=60.0, validator=attrs.validators.ge(0.0))
    hot_ps_idle_s: float = attrs.field(default=10.0, validator=positive)
    checkpoint_dir: str | None = None
    checkpoint_poll_s: float = attrs.field(default=2.0, validator=positive)
    flash_root: str | None = DEFAULT_FLASH_ROOT
    flash_reserve_mb: int = attrs.field(default=1024, validator=attrs.validators.ge(0))
    mirror_poll_s: float = attrs.field(default=1.0, validator=positive)
    last_copy_timeout_s: float = attrs.field(default=600.0, validator=positive)
    ps_state_ratio: float | None = attrs.field(default=None, validator=attrs.validators.optional(positive))
    max_ps: int = attrs.field(default=16, validator=attrs.validators.ge(1))
    profile_store: str | None = None
    job_kind: str = ""
    initial_plan: PsPlanChoice | None = None
    token: str | None = attrs.field(default=None, repr=False)
    predecessor_margin_s: float = attrs.field(default=30.0, validator=positive)
    standby_tasks: bool = True
    standby_refill_s: float = attrs.field(default=10.0, validator=attrs.validators.ge(0.0))
    standby_go_timeout_s: float = attrs.field(default=1.0, validator=positive)

    @command.validator
    def _check_command(self, _attribute: object, value: tuple[str, ...]) -> None:
        if not value or not all(isinstance(part, str) and part for part in value):
            raise ConfigError(f"the chief needs a program to run, got {list(value)!r}")


class PsJobMaster:
    """A PS job's master: addresses, `TF_CONFIG`, the shard service, and the core's decisions carried out.

    Args:
        config: the job.
        scheduler: the backend that starts tasks, this master's to close once constructed (not when the
            constructor raises); None: the local backend (tasks are processes of this host,
            logging to `<work_dir>/logs/node-<id>.log`, and dying with this process; a role's memory is a
            kernel-enforced cgroup limit where this host allows one, and its record tells an OOM kill; their
            temp dir (``TMPDIR``) is `<work_dir>/tmp`, removed when the job stops).
        clock: the time source of the event log.

    Use `start()`, then `run()` (or `tick()` repeatedly), then `stop()`; or use it as a context manager.
    """

    def __init__(
        self, config: PsJobConfig, *, scheduler: SchedulerBackend | None = None, clock: Clock | None = None
    ) -> None:
        self._config = config
        self._clock = clock or SystemClock()
        self._core = PsJobCore(config.spec)
        self._init_launches()
        self._work = Path(config.work_dir)
        self._work.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The event log's lock first: a second master on this directory stops there, before it could replace
        # the token the running job's tasks read.
        self._events = EventLog(self._work / EVENT_LOG_NAME)
        given = scheduler is not None
        # A standby chief needs the tasks to run node.py (the default local backend's command).
        self._standby_possible = not given
        groups = detect_memory_groups() if config.spec.resources and not given else None
        # Tasks are stopped and killed by signal, so what they leave in their temp dir (TensorFlow's autograph
        # writes every converted function's source there, removed only at a clean exit) is the job's to remove.
        self._task_tmp = None if given else self._work / "tmp"
        self._scheduler = scheduler or LocalScheduler(
            guarded_argv(os.getpid(), [sys.executable, node_main.__file__, "--", *config.command]),
            stop_grace_s=config.stop_grace_s,
            log_dir=self._work / "logs",
            memory_groups=groups,
        )
        try:
            # A master replacing another on the same work directory (a Kubernetes state volume) numbers on from it.
            self._seq = max((e["seq"] for e in read_event_log(self._events.path) if isinstance(e.get("seq"), int)),
                            default=0)  # fmt: skip
            for role in Role:
                check_node_fits(self._scheduler, config.spec.resources.get(role), f"{role.value} resources")
            if self._task_tmp is not None:
                # Left by a master that was killed: its tasks died with it.
                shutil.rmtree(self._task_tmp, ignore_errors=True)
                self._task_tmp.mkdir(mode=0o700, exist_ok=True)
            self._token = validate_token(config.token) if config.token is not None else generate_token()
            self._token_file = write_token_file(self._work / "token", self._token)
        except BaseException:
            if not given:  # a backend the caller gave stays the caller's until this returns
                self._scheduler.close()
            self._events.close()
            raise
        self._registry = ShardRegistry(self._clock)
        self._server = GrpcServer(ServerConfig(config.bind_address, config.port), self._token)
        add_ping_service(self._server)
        self._shards = RewindWatchingServicer(self._registry, self._on_rewind)
        self._server.add(shard_pb2_grpc.add_ShardServiceServicer_to_server, self._shards)
        self._server.add(job_pb2_grpc.add_JobServiceServicer_to_server, PsJobServicer(self))
        self._events_lock = threading.Lock()
        self._checkpoint_dir = Path(config.checkpoint_dir or self._work / "checkpoints")
        self._flash = self._flash_checkpoints(enforced=isinstance(groups, CgroupMemoryGroups))
        self._committed: tuple[Path | None, float] = (None, 0.0)
        self._cluster: dict[Role, list[str]] = {}
        self._started = False
        self._stopped = False
        self._thread: int | None = None
        self._init_measures()
        self._init_status()
        self._checkpoint: CheckpointSizes | None = None
        self._checkpoint_problem = ""
        self._state_growth: str | None = None
        self._state_growth_futile = False
        self._share_at_last_add: int | None = None
        self._last_deferral = ""
        self._last_checkpoint_look = float("-inf")
        self._running = False
        self._profiled = False

    def _flash_checkpoints(self, *, enforced: bool) -> FlashCheckpoints:
        """Where the chief's checkpoints go: memory where every task that writes them shares it, else storage."""
        config = self._config
        limited = [f"the {role.value}'s to {r.memory_mb} MiB" for role in (Role.PS, Role.CHIEF)
                   if (r := config.spec.resources.get(role)) is not None and r.memory_mb]  # fmt: skip
        off = None
        if not self._standby_possible:
            off = (f"the {self._scheduler.name} backend's tasks share no memory file system, and every parameter "
                   "server writes its own share of a checkpoint")  # fmt: skip
        elif enforced and limited:
            off = (f"memory is limited ({', '.join(limited)}), and the shares of checkpoints they wrote to memory "
                   "would count against it")  # fmt: skip
        root = Path(config.flash_root) if config.flash_root is not None else None
        return FlashCheckpoints(self._checkpoint_dir, root, config.job_name, clock=self._clock, off_reason=off,
                                reserve_bytes=config.flash_reserve_mb * _MIB, poll_s=config.mirror_poll_s,
                                last_copy_timeout_s=config.last_copy_timeout_s)  # fmt: skip

    def _init_launches(self) -> None:
        # Launches the backend failed for a passing reason, waiting to be sent again (by node id), and the
        # nodes whose retries ran out, reported to the core as failed to start at every look.
        self._launch_retries = LaunchRetries(self._config.launch_retry)
        self._retrying: dict[int, tuple[TaskKey, NodeSpec]] = {}
        self._start_failures: dict[int, ObservedNode] = {}
        self._launched: dict[Role, list[Resources]] = {}  # what each role's tasks were launched with

    def _init_measures(self) -> None:
        """The standby chief, and what samples the tasks' processes (by the backend's nodes behind the core's)."""
        config = self._config
        roles = (Role.PS, *((Role.CHIEF,) if node_main.runs_in_this_interpreter(config.command) else ()))
        self._standby = (
            StandbyTasks(
                self._scheduler,
                self._work / "standby",
                roles,
                refill_delay_s=config.standby_refill_s,
                go_timeout_s=config.standby_go_timeout_s,
            )
            if config.standby_tasks and self._standby_possible
            else None
        )
        backend_pid = getattr(self._scheduler, "pid", None)
        pid_of = (lambda node_id: backend_pid(self._backend_id(node_id))) if callable(backend_pid) else None
        self._ps_load = (
            PsCpuSampler(pid_of, 2 * config.hot_ps.hot_duration_s, config.hot_ps_warmup_s)
            if config.hot_ps is not None and callable(pid_of)
            else None
        )
        self._last_ps_plan = float("-inf")
        self._trained = 0
        self._last_progress = float("-inf")
        self._last_ps_advice = ""
        self._memory_peaks = TaskMemoryPeaks(pid_of) if callable(pid_of) else None
        self._throughput = ThroughputBySize()

    @property
    def address(self) -> str:
        """`host:port` of the master's gRPC server (the shard service)."""
        return self._server.address

    @property
    def token_file(self) -> Path:
        """The file holding the job token (0600)."""
        return self._token_file

    @property
    def event_log(self) -> Path:
        """The job's event log."""
        return self._events.path

    @property
    def checkpoint_dir(self) -> Path:
        """The storage the chief's checkpoints persist in."""
        return self._checkpoint_dir

    @property
    def live_checkpoint_dir(self) -> Path:
        """Where the chief saves its checkpoints now (`DLROVER_CHECKPOINT_DIR` of the tasks launched next): memory,
        copied to `checkpoint_dir` in the background, or `checkpoint_dir` itself."""
        return self._flash.live_dir

    @property
    def checkpoint_sizes(self) -> CheckpointSizes | None:
        """The sizes of the newest checkpoint read so far (None: none yet)."""
        return self._checkpoint

    @property
    def core(self) -> PsJobCore:
        """The decisions' core (read its state; drive it only through `tick`)."""
        return self._core

    @property
    def scheduler(self) -> SchedulerBackend:
        """The backend the tasks run on."""
        return self._scheduler

    @property
    def cluster(self) -> Mapping[Role, Sequence[str]]:
        """Each role's task addresses, in index order (fixed at `start()`)."""
        return self._cluster

    def start(self) -> None:
        """Serve, give every task its address, and launch them all.

        Raises:
            RuntimeError: started twice.
            NodeRejectedError: the platform refuses a task for good (a launch failed for a passing reason is
                tried again, see `PsJobConfig.launch_retry`).
        """
        if self._started:
            raise RuntimeError("the PS job master was started already")
        self._started = True
        self._thread = threading.get_ident()
        self._server.start()
        try:
            self._checkpoint_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"checkpoint directory {self._checkpoint_dir} cannot be made: {exc}") from exc
        self._record(self._flash.start())
        self._committed = self._flash.committed()
        if self._config.initial_plan is not None:
            choice = self._config.initial_plan
            self._record(
                [PsEvent("initial_plan", f"initial plan: {choice.reason}", data=choice.to_data(self._core.spec))]
            )
        if isinstance(self._scheduler, NodeMemoryRecords) and self._config.spec.resources:
            self._record([PsEvent("memory_enforcement", self._scheduler.memory_enforcement)])
        if self._config.hot_ps is not None and self._ps_load is None:
            self._record([PsEvent("hot_ps_off", f"the {self._scheduler.name} backend shows no task's process: "
                                  "parameter servers' CPU is not sampled and none is added")])  # fmt: skip
        elif self._config.hot_ps is not None and self._config.spec.resources.get(Role.PS) is None:
            self._record([PsEvent("hot_ps_off", "parameter servers have no CPU request (--ps-cpu), so none is "
                                  "ever hot: none is added")])  # fmt: skip
        spec = self._config.spec
        first_node_id = self._stop_predecessors()
        ports = iter(task_ports(self._config.task_host, len(spec.tasks())))
        self._cluster = {role: [self._task_address(role, i, next(ports)) for i in range(spec.count(role))]
                         for role in Role}  # fmt: skip
        self._apply(self._core.start(self._clock.now(), first_node_id))
        self._running = True
        self._publish_status()

    def _stop_predecessors(self) -> int:
        """Stop the tasks a previous master of this job left (a Kubernetes backend lists them: the master's pod was
        replaced) and wait until they have ended; the first node id above theirs.

        This master holds none of their state (the shard service's above all), so the job starts again: the chief
        restores its newest checkpoint, data position included, and the event says so.

        Raises:
            BackendUnavailableError: they did not end within their grace and a margin (a passing reason: a master
                started later finds them ended).
        """
        left = dict(self._scheduler.observe())
        if not left:
            return 0
        self._record([PsEvent("predecessor_tasks", f"{len(left)} task(s) of a previous master of this job are "
                              "stopped; the job starts again from the chief's newest checkpoint",
                              data={"nodes": sorted(left)})])  # fmt: skip
        for node_id in left:
            self._scheduler.stop(node_id)
        grace = self._config.stop_grace_s  # the Kubernetes backend's pod deletion grace too (ps-job sets both)
        deadline = self._clock.now() + grace + self._config.predecessor_margin_s
        ended = (ObservedState.STOPPED, ObservedState.FAILED, ObservedState.SUCCEEDED)
        while True:
            seen = self._scheduler.observe()
            if all(node_id not in seen or seen[node_id].state in ended for node_id in left):
                return max(left) + 1
            if self._clock.now() > deadline:
                running = sorted(n for n in left if n in seen and seen[n].state not in ended)
                margin = self._config.predecessor_margin_s
                raise BackendUnavailableError(f"the previous master's nodes {running} did not end within {grace:g} s "
                                              f"and {margin:g} s more")  # fmt: skip
            self._clock.sleep(self._config.replacement_poll_s)

    def tick(self) -> PsDecision:
        """Look at the backend once and carry out what the core decides.

        Raises:
            RuntimeError: called from another thread than `start()`'s. The local backend's tasks die with the
                thread that started them (a parent-death signal), so every launch comes from that one.
        """
        if self._thread != threading.get_ident():
            raise RuntimeError("PsJobMaster.tick() must run in the thread that called start()")
        now = self._clock.now()
        self._retry_launches(now)
        observed = self._scheduler.observe()
        if self._standby is not None:
            observed = self._standby.translate(observed, now)
        if self._start_failures:
            observed = {**observed, **self._start_failures}
        decision = self._core.observe(self._with_memory_records(observed), now)
        self._apply(decision)
        if self._standby is not None:
            if decision.outcome is None:
                self._standby.refill(now)
            self._record([PsEvent("standby", note) for note in self._standby.notes])
            self._standby.notes.clear()
        self._publish_status()
        if decision.outcome is not None:
            self._record_profile()
            return decision
        self._measure(now)
        hot_ps, ps_load = self._config.hot_ps, self._ps_load
        if hot_ps is not None and ps_load is not None:
            self._watch_ps_load(now, hot_ps, ps_load)
        if now - self._last_checkpoint_look >= self._config.checkpoint_poll_s:
            self._last_checkpoint_look = now
            self._record(self._flash.look())
            self._committed = self._flash.committed()
            self._look_at_checkpoint(now)
        return decision

    def _running_tasks(self) -> dict[int, TaskKey]:
        core = self._core
        out = {}
        for key in core.spec.tasks():
            node = core.node_of(key)
            if node is not None and core.phase(key) is TaskPhase.RUNNING:
                out[node] = key
        return out

    def _measure(self, now: float) -> None:
        """Each role's peak memory, and samples per second at the running worker count (for the profile)."""
        running = self._running_tasks()
        if self._memory_peaks is not None:
            self._memory_peaks.sample({node: key.role for node, key in running.items()})
        # A resize's downtime is no worker count's: the count after it starts afresh.
        workers = 0 if self._core.resizing else sum(1 for key in running.values() if key.role is Role.WORKER)
        self._throughput.observe(now, self._shards.acknowledged_samples(), workers)

    def _look_at_checkpoint(self, now: float) -> None:
        """Read the newest checkpoint's sizes once it is new; with `ps_state_ratio`, add a server when one holds
        too much of the model for its memory (again at each look while the job is not steady enough to), unless
        the last server added did not make the largest share smaller (the model does not spread: more memory
        is the answer, which a `ps_advice` event says once)."""
        sizes = self._read_new_checkpoint()
        if self._core.resizing:
            self._state_growth = None  # the checkpoint after the resize says whether one more is needed
            return
        if sizes is not None:
            self._state_growth = self._state_growth_reason(sizes)
        why = self._state_growth
        if why is None:
            return
        largest = max(self._checkpoint.shard_bytes, default=0) if self._checkpoint is not None else 0
        after = self._share_at_last_add
        if after is not None and largest >= after:
            self._state_growth_futile = True
        if self._state_growth_futile or self._core.spec.ps >= self._config.max_ps:
            self._state_growth = None
            limit = ("the last server added did not make it smaller" if self._state_growth_futile
                     else f"the job has max_ps={self._config.max_ps} servers")  # fmt: skip
            self._advise(f"{why}, and {limit}: give the servers more memory (--ps-memory)")
            return
        decision = self._add_ps(f"{why}: adding one to spread the model", now)
        if decision.stops:  # under way (the chief stops first); deferred, it is asked again at the next look
            self._state_growth = None
            self._share_at_last_add = largest

    def _add_ps(self, reason: str, now: float) -> PsDecision:
        """Ask the core for one more server; a deferral it repeats word for word is logged once."""
        decision = self._core.add_ps(reason, now)
        fresh = tuple(e for e in decision.events if e.kind != "ps_add_deferred" or e.message != self._last_deferral)
        self._last_deferral = next((e.message for e in decision.events if e.kind == "ps_add_deferred"), "")
        self._apply(attrs.evolve(decision, events=fresh))
        return decision

    def _advise(self, message: str) -> None:
        """A `ps_advice` event, unless it is the last one again."""
        if message != self._last_ps_advice:
            self._last_ps_advice = message
            self._record([PsEvent("ps_advice", message)])

    def _read_new_checkpoint(self) -> CheckpointSizes | None:
        """The sizes of the newest checkpoint when it is one not read before (an event says them); else None."""
        try:
            prefix = newest_checkpoint(self._flash.live_dir)
            if prefix is None:
                return None
            # Named where it persists: the memory directory is gone when the job is.
            persisted = str(self._flash.persisted(prefix))
            if self._checkpoint is not None and self._checkpoint.prefix == persisted:
                return None
            sizes = attrs.evolve(sizes_of(prefix), prefix=persisted)
        except CheckpointReadError as exc:
            # A checkpoint being replaced (max_to_keep) reads again at the next look; a broken one is said once.
            if str(exc) != self._checkpoint_problem:
                self._checkpoint_problem = str(exc)
                self._record([PsEvent("checkpoint_unreadable", f"the model's size is not known: {exc}")])
            return None
        self._checkpoint = sizes
        largest = max(sizes.shard_bytes, default=0)
        self._record([PsEvent(
            "checkpoint_sizes",
            f"checkpoint {prefix.name}: {sizes.parameter_count} parameters ({sizes.model_bytes / _MIB:.1f} MiB), "
            f"{sizes.total_bytes / _MIB:.1f} MiB with the optimizer's state; the largest file (one server's share) "
            f"{largest / _MIB:.1f} MiB",
            data={"prefix": sizes.prefix, "parameter_count": sizes.parameter_count, "model_bytes": sizes.model_bytes,
                  "total_bytes": sizes.total_bytes, "shard_bytes": list(sizes.shard_bytes)},
        )])  # fmt: skip
        return sizes

    def _state_growth_reason(self, sizes: CheckpointSizes) -> str | None:
        """Why the job needs another server for the model's state (None: it does not, or that is not watched)."""
        ratio, ps = self._config.ps_state_ratio, self._core.spec.resources.get(Role.PS)
        largest = max(sizes.shard_bytes, default=0)
        if ratio is None or ps is None or not ps.memory_mb or largest <= ratio * ps.memory_mb * _MIB:
            return None
        return (f"one parameter server holds {largest / _MIB:.2f} MiB of the model's state, over {ratio:g} of its "
                f"{ps.memory_mb} MiB")  # fmt: skip

    def _record_profile(self) -> None:
        """Record the job's profile in the store, once, when it ends (also when stopped)."""
        if self._profiled or not self._running or self._config.profile_store is None:
            return
        self._profiled = True
        self._read_new_checkpoint()  # the last one may be newer than the last look (a short job: none looked yet)
        outcome = self._core.outcome
        name = "stopped" if outcome is None else "succeeded" if outcome.succeeded else "failed"
        reason = "the master was stopped" if outcome is None else outcome.reason
        if self._checkpoint is not None:
            note = f"sizes from the TensorFlow checkpoint {self._checkpoint.prefix}"
        else:
            note = self._checkpoint_problem or f"no checkpoint was found in {self._flash.live_dir}"
        peaks = self._memory_peaks
        workers = sum(1 for key in self._running_tasks().values() if key.role is Role.WORKER)
        # The workers it was sized with: one left out for good says nothing about how many the next run wants
        # (samples/s by worker count and the count at the end say what they did); added servers are kept.
        spec = attrs.evolve(self._core.spec, workers=self._config.spec.workers,
                            min_workers=self._config.spec.min_workers)  # fmt: skip
        profile = build_ps_profile(
            ps_signature(self._config.job_name, self._config.command, self._config.job_kind),
            spec,
            outcome=name,
            exit_reason=reason,
            launched=self._launched,
            peak_memory_mb={role: None if peaks is None else peaks.peak_mb(role) for role in Role},
            workers_at_end=workers or self._core.spec.workers,
            throughput=self._throughput.rates(),
            checkpoint=self._checkpoint,
            checkpoint_note=note,
            wall_time=self._clock.wall_time(),
        )
        profile_id, message = ProfileRecorder(self._config.profile_store).record(profile, self._clock.wall_time())
        self._record([PsEvent("profile_recorded", message, data={"profile_id": profile_id})])

    def _watch_ps_load(self, now: float, config: HotPsConfig, ps_load: PsCpuSampler) -> None:
        """Sample the parameter servers' CPU while the job trains (its chief acknowledged samples within the last
        `hot_ps_idle_s`); every `hot_ps_interval_s`, add a server when the heuristic says so. Start-ups, restores
        and resizes load the servers without training, so they never count: the samples start again after each."""
        trained = self._shards.acknowledged_samples()
        if trained > self._trained:
            self._last_progress = now
        self._trained = trained
        if self._core.resizing or now - self._last_progress > self._config.hot_ps_idle_s:
            ps_load.pause()
            return
        nodes = {}
        for index in range(self._core.spec.ps):
            key = TaskKey(Role.PS, index)
            node = self._core.node_of(key)
            if node is not None and self._core.phase(key) is TaskPhase.RUNNING:
                nodes[node] = self._core.spec.resources.get(Role.PS)
        ps_load.sample(nodes, now)
        if now - self._last_ps_plan < self._config.hot_ps_interval_s:
            return
        self._last_ps_plan = now
        plan = plan_hot_ps(now, ps_load.series(nodes), self._core.spec.ps, config)
        if plan.launched(Role.PS):
            self._add_ps(plan.reason, now)
        elif not plan.is_empty:
            self._advise(f"not carried out (it would restart the server): {plan.reason}")

    def _with_memory_records(self, observed: Mapping[int, ObservedNode]) -> Mapping[int, ObservedNode]:
        """`observed`, with a failed node the kernel's OOM killer ended (its memory cgroup's record) marked so."""
        scheduler = self._scheduler
        if not isinstance(scheduler, NodeMemoryRecords):
            return observed
        marked = dict(observed)
        for node_id, seen in observed.items():
            if seen.state is not ObservedState.FAILED or seen.reason:
                continue
            record = scheduler.memory_record(self._backend_id(node_id))
            if record is not None and record.oom_kills:
                evidence = (f"its memory cgroup ({record.source}, limit {record.limit_mb} MiB) counted "
                            f"oom_kill {record.oom_kills}")  # fmt: skip
                marked[node_id] = attrs.evolve(seen, reason=REASON_OOM_KILLED, evidence=evidence)
        return marked

    # ------------------------------------------------------------------ status (JobService)

    def _init_status(self) -> None:
        self._history: list[JournaledEvent] = []  # every event, for JobService.ListEvents
        self._failures = 0
        self._started_wall = self._clock.wall_time()
        self._stop_reason: str | None = None
        self._summary = self._job_summary(JobState.RUNNING, "")

    def summary(self) -> JobSummary:
        """The job's state and every task's node as of the last look (`role:index` names; thread-safe)."""
        with self._events_lock:
            return self._summary

    def events(self, after_seq: int, limit: int) -> list[JournaledEvent]:
        """Up to `limit` of the job's events after sequence number `after_seq` (thread-safe)."""
        with self._events_lock:
            return [e for e in self._history if e.seq > after_seq][:limit]

    def request_stop(self, reason: str) -> JobSummary:
        """Stop the job: `run()` returns (None) after its current look, and `stop()` stops every task. Thread-safe;
        the first reason stands, and a job that ended stays as it ended. Returns the job's summary after it."""
        with self._events_lock:
            outcome = self._core.outcome  # decided on the tick thread, maybe not yet published
            if outcome is not None and not self._summary.state.finished:
                return attrs.evolve(self._summary, state=_ended_state(outcome), exit_reason=outcome.reason)
            if self._stop_reason is not None or self._summary.state.finished:
                return self._summary
            self._stop_reason = reason
            self._summary = summary = attrs.evolve(self._summary, state=JobState.STOPPED, exit_reason=reason)
        self._record([PsEvent("job_stopping", f"the job is stopped on request: {reason}", data={"reason": reason})])
        return summary

    @property
    def stop_reason(self) -> str | None:
        """Why the job was stopped on request (None: it was not)."""
        with self._events_lock:
            return self._stop_reason

    def _publish_status(self) -> None:
        outcome = self._core.outcome
        if outcome is not None:
            summary = self._job_summary(_ended_state(outcome), outcome.reason)
        else:
            summary = self._job_summary(JobState.RUNNING, "")
        with self._events_lock:
            if self._stop_reason is not None and outcome is None:
                summary = attrs.evolve(summary, state=JobState.STOPPED, exit_reason=self._stop_reason)
            self._summary = summary

    def _job_summary(self, state: JobState, reason: str) -> JobSummary:
        core, spec = self._core, self._core.spec
        placed = getattr(self._scheduler, "placed_host", None)
        nodes, relaunched = [], 0
        for key in spec.tasks():
            node_id = core.node_of(key)
            launches, _charged = core.relaunches(key)
            relaunched += launches
            host = placed(self._backend_id(node_id)) if callable(placed) and node_id is not None else ""
            nodes.append(NodeSummary(node_id=-1 if node_id is None else node_id, rank=key.index,
                                     state=_NODE_STATE[core.phase(key)], name=str(key), host=str(host or ""),
                                     relaunch_count=launches))  # fmt: skip
        fixed = sum(spec.count(role) for role in Role if role is not Role.WORKER)
        total = len(nodes)
        committed, committed_at = self._committed
        return JobSummary(
            job_name=self._config.job_name,
            state=state,
            exit_reason=reason,
            nodes=tuple(nodes),
            min_nodes=fixed + spec.min_workers,
            max_nodes=total,
            job_failures=self._failures,
            elapsed_s=max(0.0, self._clock.wall_time() - self._started_wall),
            total_relaunches=relaunched,
            target_nodes=total,
            wanted_nodes=total,
            # The newest checkpoint in storage (memory's can be a copy ahead); its number where the program gives one.
            committed_step=checkpoint_number(committed),
            committed_path=str(committed or ""),
            committed_wall_time=committed_at,
        )

    def run(self, timeout_s: float | None = None, cancel: threading.Event | None = None) -> JobOutcome | None:
        """Tick until the job ends (its outcome), `timeout_s` passes, `cancel` is set or a stop is requested
        (`request_stop`, JobService.StopJob): None then.

        After a look that stopped a node, the next comes after `replacement_poll_s` rather than a whole tick: a task
        waiting for its old node to end starts as soon as it has (the restarted chief after a lost server).
        """
        deadline = None if timeout_s is None else self._clock.now() + timeout_s
        while self._core.outcome is None and (deadline is None or self._clock.now() < deadline):
            if self.stop_reason is not None:
                break
            decision = self.tick()
            if decision.outcome is not None:
                break
            waiting = decision.stops or any(self._core.phase(k) is TaskPhase.WAITING for k in self._core.spec.tasks())
            pause = min(self._config.replacement_poll_s, self._config.tick_interval_s) if waiting else None
            if cancel is None:
                self._clock.sleep(pause or self._config.tick_interval_s)
            elif cancel.wait(pause or self._config.tick_interval_s):
                break
        return self._core.outcome

    def stop(self) -> None:
        """Stop every task and the server, close the event log; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self._record_profile()
        except Exception:
            _log.exception("the job's profile was not recorded")
        try:
            self._scheduler.close()
        finally:
            if self._standby is not None:
                self._standby.close()
            if self._task_tmp is not None:  # every task has ended
                shutil.rmtree(self._task_tmp, ignore_errors=True)
            try:  # the tasks have ended: the last checkpoints in memory go to storage
                self._record(self._flash.close())
                self._committed = self._flash.committed()
                self._publish_status()
            finally:
                self._server.stop()
                self._events.close()

    def __enter__(self) -> PsJobMaster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ carrying out

    def _apply(self, decision: PsDecision) -> None:
        self._record(decision.events)
        kill = getattr(self._scheduler, "kill", None)
        for stop in decision.stops:
            # A launch still waiting for its retry is never sent: the core is done with that node.
            self._launch_retries.forget(stop.node_id)
            self._retrying.pop(stop.node_id, None)
            if not stop.graceful and callable(kill):
                kill(self._backend_id(stop.node_id))
            else:
                self._scheduler.stop(self._backend_id(stop.node_id))
        if decision.launches:
            self._address_new_tasks()
        if any(launch.task.role is Role.CHIEF for launch in decision.launches):
            self._record(self._flash.before_chief_launch())
        for launch in decision.launches:
            if launch.resources is not None:
                self._launched.setdefault(launch.task.role, []).append(launch.resources)
            spec = NodeSpec(
                job_name=self._config.job_name,
                node_id=launch.node_id,
                rank=launch.task.index,
                relaunch_count=launch.relaunch_count,
                env=self._task_env(launch.task, launch.node_id),
                role=launch.task.role,
                resources=launch.resources,
            )
            self._launch(launch.task, spec)

    def _launch(self, task: TaskKey, spec: NodeSpec) -> None:
        """Send a task's launch; one the backend fails for a passing reason waits for a retry (`_retry_launches`)
        and, its retries spent, is reported to the core as the node's failure to start.

        Raises:
            NodeRejectedError: the platform refuses the task for good (every launch would be refused alike).
        """
        node_id, now = spec.node_id, self._clock.now()
        standby: int | None = None
        try:
            if self._standby is None:
                self._scheduler.launch(spec)
            else:
                standby = self._standby.launch(spec, now)
        except NodeRejectedError:
            raise
        except SchedulerError as exc:
            self._launch_failed(task, spec, exc, now)
            return
        self._launch_retries.launched(node_id)
        self._retrying.pop(node_id, None)
        if standby is not None:
            self._promoted(task, node_id, standby)

    def _launch_failed(self, task: TaskKey, spec: NodeSpec, exc: SchedulerError, now: float) -> None:
        node_id = spec.node_id
        tries = self._launch_retries.failures(node_id) + 1
        delay = self._launch_retries.failed(node_id, now, str(exc))
        if delay is not None:
            self._retrying[node_id] = (task, spec)
            self._record([PsEvent("launch_retry", f"the backend could not launch {task} (node {node_id}), try "
                                  f"{tries}: {exc}; tried again in {delay:.1f} s, nothing charged",
                                  node_id=node_id, data={"error": str(exc), "delay_s": delay})])  # fmt: skip
            return
        self._retrying.pop(node_id, None)
        evidence = f"the backend could not launch it ({tries} tries): {exc}"
        self._start_failures[node_id] = ObservedNode(
            node_id, ObservedState.FAILED, reason=LAUNCH_FAILED_REASON, evidence=evidence
        )
        self._record([PsEvent("launch_failed", f"{task} (node {node_id}) could not be launched: {evidence}",
                              node_id=node_id, data={"error": str(exc)})])  # fmt: skip

    def _retry_launches(self, now: float) -> None:
        """Send again the launches whose wait is over, for tasks that still wait on those nodes."""
        for node_id in self._launch_retries.due(now):
            task, spec = self._retrying[node_id]
            if self._core.node_of(task) != node_id or self._core.phase(task) is not TaskPhase.LAUNCHED:
                # The task moved on (held for a resize, waiting for a peer, another node): not wanted.
                self._launch_retries.forget(node_id)
                del self._retrying[node_id]
                continue
            self._launch(task, spec)

    def _promoted(self, task: TaskKey, node_id: int, standby: int) -> None:
        """Say so, and let the task's node log be found where the standby writes."""
        link = self._work / "logs" / f"node-{node_id}.log"
        with contextlib.suppress(OSError):  # (a log link is a convenience: the standby's own log is all there)
            link.with_suffix(".tmp").unlink(missing_ok=True)
            link.with_suffix(".tmp").symlink_to(f"node-{standby}.log")
            os.replace(link.with_suffix(".tmp"), link)  # a reused work directory may hold an older one
        self._record([PsEvent("standby_promoted", f"the {task.role.value} standby (backend node {standby}) runs as "
                              f"{task} (node {node_id}), TensorFlow already imported", node_id=node_id,
                              data={"standby": standby, "role": task.role.value})])  # fmt: skip

    def _backend_id(self, node_id: int) -> int:
        """The backend node running the core's node `node_id` (another where a standby took it over)."""
        return node_id if self._standby is None else self._standby.backend_id(node_id)

    def _address_new_tasks(self) -> None:
        """Fit the addresses to a resized cluster (every task's `TF_CONFIG` names them from now on): a role that
        has fewer tasks keeps its first addresses (every task restarts, so which node had which does not matter);
        one that has more gets new ones."""
        spec = self._core.spec
        for role, addresses in self._cluster.items():
            del addresses[spec.count(role) :]
        missing = [role for role in Role if len(self._cluster.get(role, ())) < spec.count(role)]
        if not missing:
            return
        count = sum(spec.count(role) - len(self._cluster.get(role, ())) for role in missing)
        taken = {int(a.rsplit(":", 1)[1]) for addresses in self._cluster.values() for a in addresses}
        ports = iter(task_ports(self._config.task_host, count, exclude=taken))
        for role in missing:
            addresses = self._cluster.setdefault(role, [])
            while len(addresses) < spec.count(role):
                addresses.append(self._task_address(role, len(addresses), next(ports)))

    def _task_address(self, role: Role, index: int, port: int) -> str:
        """`host:port` of a task: the backend's name for it where it gives tasks their own (a Kubernetes DNS
        name), else `task_host`. Ports are distinct even there: tasks of a one-host test cluster share a
        network, and TensorFlow's servers listen on every interface."""
        task_host = getattr(self._scheduler, "task_host", None)
        host = task_host(role.value, index) if callable(task_host) else self._config.task_host
        return f"{host}:{port}"

    def _task_env(self, task: TaskKey, node_id: int) -> dict[str, str]:
        return {
            "TF_CONFIG": tf_config(self._cluster, task),
            TASK_ENV_VAR: str(task),
            MASTER_ADDR_ENV_VAR: self.address,
            TOKEN_FILE_ENV_VAR: str(self._token_file),
            CHECKPOINT_DIR_ENV_VAR: str(self._flash.live_dir),
            "DLROVER_NODE_ID": str(node_id),
            "DLROVER_JOB_NAME": self._config.job_name,
            **({"TMPDIR": str(self._task_tmp)} if self._task_tmp is not None else {}),
        }

    def _on_rewind(self, rewind: Rewind) -> None:
        if rewind.samples is None:
            message = f"the chief restored dataset {rewind.dataset!r} to a position this master did not hand out"
        else:
            message = (
                f"the chief restored dataset {rewind.dataset!r} to its checkpoint: {rewind.samples} sample(s), "
                f"{rewind.steps} step(s), trained since are trained again"
            )
        data: dict[str, Any] = {"dataset": rewind.dataset, "samples": rewind.samples, "steps": rewind.steps}
        self._record([PsEvent("data_rewound", message, data=data)])

    def _record(self, events: Sequence[PsEvent]) -> None:
        if not events:
            return
        with self._events_lock:
            out = []
            for event in events:
                self._seq += 1
                data = {**event.data, **({"task": str(event.task)} if event.task is not None else {})}
                out.append(JournaledEvent(self._seq, self._clock.wall_time(), event.kind, event.message,
                                          event.node_id, None, data))  # fmt: skip
                self._failures += event.kind == "task_failed"
                _log.info("%s: %s", event.kind, event.message)
            self._events.write(out)
            self._history.extend(out)
