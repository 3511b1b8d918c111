"""The scenario format: a job, the failures it meets, what each recovery phase costs, and the
strategies to compare. Read from TOML (`load`), validated as a whole before anything runs: a bad
value is a `ScenarioError` naming it.

```toml
[job]
accelerators = 1024            # a multiple of accelerators_per_node
accelerators_per_node = 8
step_time_s = 8.0              # one step of the full world
checkpoint_gib = 1500.0        # the whole training state (model, optimizer), all ranks together
days = 30.0                    # how long the job runs

[failures]
rate_per_gpu_day = 4.74e-4     # interruptions per accelerator per day (Llama 3: 419 in 54 days on 16,384)
trace = ""                     # a JSON-lines trace to replay instead (see trace.py); relative to this file
[failures.mix]                 # cause -> share (normalized); causes are those of CAUSES
gpu = 0.353
host_maintenance = 0.076

[costs]                        # seconds unless named otherwise; see Costs
...

[[strategy]]
name = "whole-job restart"
kind = "restart_job"           # restart_job | dlrover
...
```
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import tomllib

from dlrover.common import ConfigError
from dlrover.common.validators import non_negative_finite, non_negative_int, positive_finite, positive_int
from dlrover.diagnosis import NO_OOM_KILL, ActionKind, FailureKind, LadderStep

__all__ = ["CAUSES", "Cause", "Costs", "Failures", "Job", "Scenario", "ScenarioError", "Strategy", "load", "parse"]


class ScenarioError(ConfigError):
    """A scenario that cannot be run; the message names the value. (A value the shared validators refuse
    while a scenario is changed, as `attrs.evolve` does for another size, is their `ConfigError`.)"""


@attrs.frozen
class Cause:
    """One cause of interruption, as the job meets it.

    Attributes:
        name: the cause (the Llama 3 report's categories, and the others the issue names).
        effect: what it does to the node: ``crash`` (its processes exit; the node is fine, a restart
            fixes it), ``hang`` (a collective stops making progress; nothing exits), ``broken`` (its
            processes exit and the node stays faulty until it is replaced), ``lost`` (the machine is
            gone without a word: power, maintenance), ``preempted`` (the machine is reclaimed after a
            notice: the platform reports the node preempted, and the node must be replaced), ``user``
            (the training script fails the same way on every attempt until a person fixes it),
            ``slow`` (the node keeps training, slower: a straggler; every synchronous step takes
            `Costs.straggler_slowdown` times as long while it is in the world, for
            `Costs.straggler_lasts_s` at most).
        evidence: what the failed process's log ends with: the real classifier reads it.
        exit_code: the failed process's exit status (None: it did not exit, or nothing saw one).
        fails_node_check: a node it left faulty fails `dlrover-run --network-check`'s probe (matrix
            products and timed collectives with a partner): every ``broken`` cause but silent data
            corruption, which computes wrong numbers without an error the probe would see.
    """

    name: str
    effect: str
    evidence: str
    exit_code: int | None
    fails_node_check: bool = False


def _cause(name: str, effect: str, evidence: str, exit_code: int | None = 1) -> tuple[str, Cause]:
    return name, Cause(name, effect, evidence, exit_code, effect == "broken" and name != "silent_data_corruption")


_XID = "NVRM: Xid (PCI:0000:3b:00): {0}, pid=4242, {1}\nRuntimeError: CUDA error: {2}"
CAUSES: Mapping[str, Cause] = dict(
    [
        _cause("gpu", "broken", _XID.format(79, "GPU has fallen off the bus.", "unspecified launch failure")),
        _cause(
            "gpu_hbm",
            "broken",
            _XID.format(
                48, "An uncorrectable double bit error (DBE) has been detected.", "uncorrectable ECC error encountered"
            ),
        ),
        _cause("gpu_sram", "broken", _XID.format(94, "Contained ECC error.", "uncorrectable ECC error encountered")),
        _cause(
            "gpu_system_processor",
            "broken",
            _XID.format(119, "Timeout waiting for RPC from GSP!", "unspecified launch failure"),
        ),
        _cause("gpu_thermal", "broken", _XID.format(79, "GPU has fallen off the bus.", "unspecified launch failure")),
        _cause(
            "silent_data_corruption",
            "broken",
            _XID.format(63, "Row remapping event: uncorrectable error.", "uncorrectable ECC error encountered"),
        ),
        _cause(
            "network",
            "broken",
            "NCCL WARN NET/IB : Got completion from peer 10.0.3.7<40192> with error 12, opcode 0, len 0, "
            "vendor err 129 (Recv)\ntorch.distributed.DistBackendError: NCCL error in: "
            "ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, NCCL version 2.21.5",
        ),
        _cause(
            "nic",
            "broken",
            "NCCL WARN NET/IB : Got completion from peer 10.0.3.7<40192> with error 12, opcode 0, len 0, "
            "vendor err 129 (Recv)\ntorch.distributed.DistBackendError: NCCL error in: "
            "ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, NCCL version 2.21.5",
        ),
        _cause("host_maintenance", "lost", "", None),
        _cause("host_hardware", "lost", "", None),
        _cause(
            "software",
            "crash",
            "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f1e (most recent call first):\n"
            '  File "/usr/lib/python3/site-packages/torch/nn/modules/module.py", line 1532 in _call_impl',
            -11,
        ),
        _cause(
            "nccl_hang",
            "hang",
            "[rank12]:[E ProcessGroupNCCL.cpp:632] [Rank 12] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=88231, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, Timeout(ms)=600000) "
            "ran for 600026 milliseconds before timing out.",
            None,
        ),
        _cause(
            "dependency",
            "crash",
            "ConnectionResetError: [Errno 104] Connection reset by peer\n"
            "torch.distributed.DistStoreError: Failed to recv, got 0 bytes. Connection was likely closed.",
        ),
        # A process killed from outside (SIGKILL: an operator, a test's fault injection, an OOM killer outside
        # the job's cgroup): no log of its own; the agent says how it ended and that its memory cgroup counted
        # no OOM kill. What `validate` replays.
        _cause(
            "killed",
            "crash",
            f"local rank 1 exited with signal SIGKILL\n{NO_OOM_KILL}: the memory cgroup's oom_kill count stayed at 0 "
            "while the workers ran (/sys/fs/cgroup/memory.events)",
            -9,
        ),
        # The kernel's OOM killer on the host (its log line reaches the agent): the master relaunches the node
        # with more memory, so the new node does not run out again.
        _cause(
            "host_oom",
            "crash",
            "Out of memory: Killed process 48213 (python) total-vm:182331244kB, anon-rss:120931232kB, file-rss:0kB, "
            "shmem-rss:0kB, UID:1000 pgtables:240312kB oom_score_adj:0\nlocal rank 3 exited with signal SIGKILL",
            -9,
        ),
        # The trainer stops on a diverged loss: the master rolls the job back to its newest checkpoint (twice
        # a job, by its ladder; a third stops it, as it would a real job).
        _cause("nan_loss", "crash", "ValueError: Loss is NaN at step 48213; stopping: the loss diverged"),
        # A node that keeps running, slower: a throttled or degraded GPU, a noisy neighbour on the host, a
        # flapping link. Nothing fails; every synchronous step waits for it (`Costs.straggler_slowdown`) until
        # the slowness passes (`Costs.straggler_lasts_s`) or the node leaves the job.
        _cause("straggler", "slow", "", None),
        # A spot or preemptible machine reclaimed by its provider, or a node drained for a higher-priority
        # workload: the platform reports the node preempted (its notice is the evidence) and the machine goes.
        # Not the job's fault: the master relaunches the node, charging no failure budget.
        _cause(
            "preemption",
            "preempted",
            "WARNING agent: spot instance interruption notice received, instance will be reclaimed in 120 s\n"
            "INFO agent: received SIGTERM, stopping workers",
            143,
        ),
        _cause(
            "user_code",
            "user",
            'Traceback (most recent call last):\n  File "train.py", line 212, in <module>\n'
            "    loss = model(batch)[\"los\"]\nKeyError: 'los'",
        ),
    ]
)
"""The causes a mix may name. The Llama 3 report's hardware causes that leave the machine up
(GPU, HBM3, SRAM, GPU system processor, thermal, SDC, network, NIC) are ``broken``; those that take
it down (host maintenance, power, chassis, SSD, CPU, system memory) ``lost``."""

EFFECTS = ("crash", "hang", "broken", "lost", "preempted", "user", "slow")


def _share(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ScenarioError(f"{attribute.name} must be a number in [0, 1], got {value!r}")


def _slowdown(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 1 < value < math.inf:
        raise ScenarioError(f"{attribute.name} must be a finite number > 1, got {value!r}")


@attrs.frozen
class Job:
    """The training job: its size, its step, its state and how long it runs.

    `sync_lead_share` is the share of a step a rank computes before its first synchronization point
    (what `dlrover.launcher` measures as its lead time): a data-parallel job's forward and the
    backward up to its first gradient bucket (about 0.4); 0 for a job whose step opens with a
    collective (FSDP or ZeRO-3 gathering the first layer's parameters), whose ranks' leads say
    nothing about their speed.

    `model_parallel_nodes` is the nodes of one model replica (tensor and pipeline parallel): they train on
    the same batch, so one reader per replica leases data shards from the master (`data_feed`);
    `shard_steps` is how many steps of a reader's batches one shard holds.
    """

    accelerators: int = attrs.field(validator=positive_int)
    accelerators_per_node: int = attrs.field(default=8, validator=positive_int)
    step_time_s: float = attrs.field(default=8.0, validator=positive_finite)
    checkpoint_gib: float = attrs.field(default=100.0, validator=positive_finite)
    days: float = attrs.field(default=30.0, validator=positive_finite)
    sync_lead_share: float = attrs.field(default=0.4, validator=_share)
    model_parallel_nodes: int = attrs.field(default=1, validator=positive_int)
    shard_steps: int = attrs.field(default=1000, validator=positive_int)

    def __attrs_post_init__(self) -> None:
        if self.accelerators % self.accelerators_per_node:
            raise ScenarioError(
                f"accelerators ({self.accelerators}) must be a multiple of accelerators_per_node "
                f"({self.accelerators_per_node})"
            )

    @property
    def nodes(self) -> int:
        """How many nodes the job runs at full size."""
        return self.accelerators // self.accelerators_per_node

    @property
    def shard_gib(self) -> float:
        """One accelerator's part of the training state (the state is sharded over all of them)."""
        return self.checkpoint_gib / self.accelerators

    @property
    def duration_s(self) -> float:
        """How long the job runs, in seconds."""
        return self.days * 86400.0


@attrs.frozen
class Failures:
    """How often the job is interrupted and by what: a rate and a mix, or a trace to replay."""

    rate_per_gpu_day: float = attrs.field(default=0.0, validator=non_negative_finite)
    mix: Mapping[str, float] = attrs.field(factory=dict)
    trace: Path | None = None

    def __attrs_post_init__(self) -> None:
        for name, share in self.mix.items():
            if name not in CAUSES:
                raise ScenarioError(f"failures.mix: unknown cause {name!r}; known: {', '.join(CAUSES)}")
            if isinstance(share, bool) or not isinstance(share, int | float) or not math.isfinite(share) or share < 0:
                raise ScenarioError(f"failures.mix.{name} must be a finite number >= 0, got {share!r}")
        if self.trace is None and self.rate_per_gpu_day > 0 and not any(self.mix.values()):
            raise ScenarioError("failures.mix must give some cause a share > 0 when rate_per_gpu_day > 0")


@attrs.frozen
class Costs:
    """What each recovery phase costs, in seconds (calibrated; see the README for where each comes from).

    Attributes:
        process_restart_s: from the decision to restart until the new training processes have
            imported torch and joined the rendezvous.
        crash_detection_s: from a process's exit until its agent reported it.
        node_provision_s: from a relaunch until the new node's agent runs (scheduling, image, start).
        lost_node_detection_s: for the restart-the-job baseline, from a machine's loss until the job
            notices (the survivors' collective times out): the NCCL timeout.
        nccl_timeout_s: how long a hung collective takes to time out where nothing else watches.
        adaptive_hang_floor_s: the adaptive hang detector's floor (it fires after max(5 x step, floor)).
        cpu_idle_hang_s: the agent's CPU-idle hang watch.
        human_response_s: from a user-code stop until a person fixed it and restarted the job.
        flash_save_gib_s: how fast a flash checkpoint copies one accelerator's shard to pinned
            shared memory while the step waits (GiB/s per accelerator; an H200 measured 46).
        memory_load_gib_s: how fast a restarted process restores its shard from shared memory,
            checksums verified (GiB/s per accelerator; the H200 measured 7.5, 4 GiB in 0.53 s).
        replica_gib_s: how fast a replaced node fetches its shards from a peer's replica (GiB/s per
            accelerator: its share of the node's network).
        storage_read_gib_s: reading a checkpoint from storage, GiB/s for the whole job.
        storage_write_gib_s: writing one to storage, GiB/s for the whole job.
        rendezvous_last_call_s: the rendezvous's wait for more nodes once it has enough.
        heartbeat_timeout_s: the master's heartbeat timeout (a silent node is lost after it).
        network_check_s: ``dlrover-run --network-check``'s probes of a round's nodes, before its
            training processes start (its probe processes import torch while the round forms).
        heartbeat_interval_s: how often agents heartbeat with their ranks' step stats (the master's
            ``--heartbeat-interval-s``): the straggler detector judges what they carry.
        straggler_slowdown: how many times as long a step takes while a straggler is in the world
            (the cause ``straggler``).
        straggler_lasts_s: how long a straggler's slowness lasts when its node stays in the job.
    """

    process_restart_s: float = attrs.field(default=30.0, validator=non_negative_finite)
    crash_detection_s: float = attrs.field(default=5.0, validator=non_negative_finite)
    node_provision_s: float = attrs.field(default=300.0, validator=non_negative_finite)
    lost_node_detection_s: float = attrs.field(default=600.0, validator=non_negative_finite)
    nccl_timeout_s: float = attrs.field(default=600.0, validator=non_negative_finite)
    adaptive_hang_floor_s: float = attrs.field(default=60.0, validator=non_negative_finite)
    cpu_idle_hang_s: float = attrs.field(default=180.0, validator=non_negative_finite)
    human_response_s: float = attrs.field(default=3600.0, validator=non_negative_finite)
    flash_save_gib_s: float = attrs.field(default=46.0, validator=positive_finite)
    memory_load_gib_s: float = attrs.field(default=7.5, validator=positive_finite)
    replica_gib_s: float = attrs.field(default=5.0, validator=positive_finite)
    storage_read_gib_s: float = attrs.field(default=20.0, validator=positive_finite)
    storage_write_gib_s: float = attrs.field(default=10.0, validator=positive_finite)
    rendezvous_last_call_s: float = attrs.field(default=5.0, validator=non_negative_finite)
    heartbeat_timeout_s: float = attrs.field(default=60.0, validator=positive_finite)
    network_check_s: float = attrs.field(default=20.0, validator=non_negative_finite)
    heartbeat_interval_s: float = attrs.field(default=5.0, validator=positive_finite)
    straggler_slowdown: float = attrs.field(default=2.0, validator=_slowdown)
    straggler_lasts_s: float = attrs.field(default=21600.0, validator=positive_finite)


STRATEGY_KINDS = ("restart_job", "dlrover")
HANG_DETECTION = ("nccl_timeout", "cpu_idle", "adaptive")
STRAGGLER_ACTIONS = ("report", "replace")
AUTOSCALE_MODES = ("off", "advise", "on")


def _optional_count(inst: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None:
        non_negative_int(inst, attribute, value)


@attrs.frozen
class Strategy:
    """One way to run the job.

    Attributes:
        name: how tables and plots name it.
        kind: ``restart_job`` (every failure restarts the whole job from its newest storage
            checkpoint: plain torchrun) or ``dlrover`` (the real master decides).
        storage_interval_s: a storage checkpoint every this many seconds (blocking for
            ``restart_job``; persisted from memory in the background for ``dlrover``).
        flash_every_steps: ``dlrover``: a flash checkpoint to shared memory every this many steps (0: none).
        replicated_memory: ``dlrover``: every node's flash checkpoint has a replica on a peer, so a
            replaced node restores from memory instead of every rank rolling back to storage.
        hang_detection: what finds a hung collective: ``nccl_timeout``, ``cpu_idle`` or ``adaptive``.
        spare_nodes: ``dlrover``: warm spares the master keeps.
        min_nodes: ``dlrover``: the fewest nodes the job trains with (0: all of them); fewer than all
            lets it go on with the survivors while a replacement starts (it needs `replicated_memory`:
            the smaller world restores the lost node's shard from its replica).
        max_node_relaunches: ``dlrover``: the master's ``--max-node-relaunches`` (its default: 16, or
            one per 64 nodes of a larger job).
        max_relaunches: ``dlrover``: the master's ``--max-relaunches``, relaunches of each rank (default 3).
        max_job_failures: ``dlrover``: the master's ``--max-job-failures`` (its default: 20, or two
            per node of a job of more than 10).
        failure_budget_window_s: ``dlrover``: the master's ``--failure-budget-window``, how long a failure
            counts against the budgets above and the policy's ladders (default 86400, a day; 0: the
            job's whole life).
        network_check: ``dlrover``: every agent runs ``--network-check``: each round's nodes are
            probed before training (`Costs.network_check_s`), except once after a pass when the
            round has the same nodes (a restart after a worker failure); a node a fault left broken
            (`Cause.fails_node_check`) fails its probe, reports it and leaves, and the others start a
            new round without it.
        max_process_restarts: ``dlrover``: restarts of a node's processes before it is relaunched (the
            master's own default, 3, for agents that declare none; `dlrover-run --max-restarts` declares it).
        backend_relaunches: ``dlrover``: the backend can relaunch a node elsewhere (false: a job of one node,
            `dlrover-run --standalone`, whose master restarts in place what it would relaunch; only for one node).
        straggler_action: ``dlrover``: the master's ``--straggler-action``: ``report`` (an event, the
            straggler stays) or ``replace`` (its node is relaunched on another host).
        straggler_factor: ``dlrover``: the master's ``--straggler-factor``: a rank whose lead or step
            time exceeds this many times the others' median is a straggler.
        ladders: ``dlrover``, a what-if: the diagnosis policy's ladders for the kinds named
            (`dlrover.diagnosis.PolicyConfig.ladders`), each a list of ``[action, budget]`` or
            ``[action, budget, scope, avoid_host]``. dlrover-master has no flag for them yet: a
            strategy that sets them is a policy to try, not what the master runs today.
        autoscale: ``dlrover``: the master's ``--autoscale``: ``off``, ``advise`` (plans are events,
            nothing changes) or ``on`` (the job starts at `min_nodes` and grows while the measured
            speed-up pays; a straggler's node is replaced).

    `budget_window` is `failure_budget_window_s` as the master takes it.
    """

    name: str
    kind: str
    storage_interval_s: float = attrs.field(default=1800.0, validator=positive_finite)
    flash_every_steps: int = attrs.field(default=0, validator=non_negative_int)
    replicated_memory: bool = False
    hang_detection: str = "nccl_timeout"
    spare_nodes: int = attrs.field(default=0, validator=non_negative_int)
    min_nodes: int = attrs.field(default=0, validator=non_negative_int)
    max_node_relaunches: int | None = attrs.field(default=None, validator=_optional_count)
    max_relaunches: int = attrs.field(default=3, validator=non_negative_int)
    max_job_failures: int | None = attrs.field(default=None, validator=_optional_count)
    failure_budget_window_s: float = attrs.field(default=86400.0, validator=non_negative_finite)
    max_process_restarts: int = attrs.field(default=3, validator=non_negative_int)
    network_check: bool = False
    backend_relaunches: bool = True
    straggler_action: str = "report"
    straggler_factor: float = attrs.field(default=2.0, validator=_slowdown)
    ladders: Mapping[str, Any] = attrs.field(factory=dict)
    autoscale: str = "off"

    @property
    def budget_window_s(self) -> float | None:
        """`failure_budget_window_s` as `LifecycleConfig.budget_window_s` takes it (None: the whole job)."""
        return self.failure_budget_window_s or None

    def policy_ladders(self) -> dict[FailureKind, tuple[LadderStep, ...]]:
        """`ladders` as the diagnosis policy takes them.

        Raises:
            ScenarioError: an unknown kind or action, or a rung that is not [action, budget(, scope, avoid_host)].
        """
        out = {}
        for kind, rungs in self.ladders.items():
            try:
                steps = tuple(LadderStep(ActionKind(r[0]), r[1], *(r[2:3] or ["node"]), *r[3:4]) for r in rungs)
                out[FailureKind(kind)] = steps
            except (ValueError, TypeError, IndexError, ConfigError) as exc:
                raise ScenarioError(f"strategy {self.name!r}: ladders.{kind}: {exc}") from None
        return out

    def __attrs_post_init__(self) -> None:
        if not self.name:
            raise ScenarioError("a strategy needs a name")
        if self.kind not in STRATEGY_KINDS:
            raise ScenarioError(f"strategy {self.name!r}: kind must be one of {STRATEGY_KINDS}, got {self.kind!r}")
        if self.hang_detection not in HANG_DETECTION:
            raise ScenarioError(
                f"strategy {self.name!r}: hang_detection must be one of {HANG_DETECTION}, got {self.hang_detection!r}"
            )
        if self.kind == "restart_job" and (
            self.flash_every_steps or self.spare_nodes or self.min_nodes or self.replicated_memory or self.network_check
        ):
            raise ScenarioError(
                f"strategy {self.name!r}: restart_job has no flash checkpoints, replicas, spares, resize or "
                "network check (flash_every_steps, replicated_memory, spare_nodes, min_nodes and network_check "
                "are dlrover's)"
            )
        if self.straggler_action not in STRAGGLER_ACTIONS:
            raise ScenarioError(
                f"strategy {self.name!r}: straggler_action must be one of {STRAGGLER_ACTIONS}, "
                f"got {self.straggler_action!r}"
            )
        if self.autoscale not in AUTOSCALE_MODES:
            raise ScenarioError(
                f"strategy {self.name!r}: autoscale must be one of {AUTOSCALE_MODES}, got {self.autoscale!r}"
            )
        if self.kind == "restart_job" and self.autoscale != "off":
            raise ScenarioError(f"strategy {self.name!r}: restart_job has no autoscaler (autoscale is dlrover's)")
        if self.kind == "restart_job" and (self.straggler_action != "report" or self.straggler_factor != 2.0):
            raise ScenarioError(
                f"strategy {self.name!r}: restart_job has no straggler detection (straggler_action and "
                "straggler_factor are dlrover's)"
            )
        if self.kind == "dlrover" and not self.flash_every_steps:
            raise ScenarioError(f"strategy {self.name!r}: a dlrover strategy needs flash_every_steps >= 1")
        if self.ladders and self.kind != "dlrover":
            raise ScenarioError(f"strategy {self.name!r}: ladders are the dlrover master's policy")
        self.policy_ladders()
        if self.min_nodes and not self.replicated_memory:
            raise ScenarioError(
                f"strategy {self.name!r}: min_nodes needs replicated_memory (a smaller world restores the lost "
                "node's shard from its replica)"
            )


@attrs.frozen
class Scenario:
    """A whole scenario: `load` or `parse` one."""

    job: Job
    failures: Failures
    costs: Costs
    strategies: tuple[Strategy, ...]
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        if not self.strategies:
            raise ScenarioError("a scenario needs at least one [[strategy]]")
        names = [s.name for s in self.strategies]
        if len(set(names)) != len(names):
            raise ScenarioError(f"strategy names must differ: {names}")
        for strategy in self.strategies:
            if not strategy.backend_relaunches and self.job.nodes > 1:
                raise ScenarioError(f"strategy {strategy.name!r}: backend_relaunches = false is for a job of one node "
                                    f"(this one has {self.job.nodes}: a node removed would leave a round that "
                                    "cannot form)")  # fmt: skip
            if strategy.min_nodes > self.job.nodes:
                raise ScenarioError(
                    f"strategy {strategy.name!r}: min_nodes {strategy.min_nodes} exceeds the job's "
                    f"{self.job.nodes} nodes"
                )


def _table(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, Mapping):
        raise ScenarioError(f"[{key}] must be a table")
    return value


def _build(cls: type[Any], raw: Mapping[str, Any], where: str) -> Any:
    known = {a.name for a in attrs.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    try:
        return cls(**raw)
    except (ConfigError, TypeError) as exc:
        raise ScenarioError(f"{where}: {exc}") from None


def parse(raw: Mapping[str, Any], base_dir: Path | None = None) -> Scenario:
    """Build a scenario from its parsed TOML.

    Raises:
        ScenarioError: a missing, unknown or bad value.
    """
    top = set(raw) - {"job", "failures", "costs", "strategy", "seed"}
    if top:
        raise ScenarioError(f"unknown top-level key(s) {', '.join(sorted(top))}")
    if "job" not in raw:
        raise ScenarioError("a scenario needs a [job] table")
    failures = dict(_table(raw, "failures"))
    trace = failures.get("trace") or None
    if trace is not None:
        if not isinstance(trace, str):
            raise ScenarioError(f"failures.trace must be a path, got {trace!r}")
        path = Path(trace)
        failures["trace"] = path if path.is_absolute() or base_dir is None else base_dir / path
    else:
        failures.pop("trace", None)
    strategies = raw.get("strategy", [])
    if not isinstance(strategies, list):
        raise ScenarioError("strategy must be an array of tables ([[strategy]])")
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ScenarioError(f"seed must be an integer, got {seed!r}")
    return Scenario(
        job=_build(Job, _table(raw, "job"), "[job]"),
        failures=_build(Failures, failures, "[failures]"),
        costs=_build(Costs, _table(raw, "costs"), "[costs]"),
        strategies=tuple(_build(Strategy, s, f"[[strategy]] {i}") for i, s in enumerate(strategies)),
        seed=seed,
    )


def load(path: str | Path) -> Scenario:
    """Read and validate a scenario file.

    Raises:
        ScenarioError: unreadable, not TOML, or a bad value.
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path} is not TOML: {exc}") from None
    return parse(raw, base_dir=path.parent)
