"""Configuration of the job master: frozen, validated at construction, units in the names."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs

from dlrover.autoscale import Resources, Role
from dlrover.common import ConfigError, TLSConfig
from dlrover.common.validators import non_negative, non_negative_finite, non_negative_int, positive
from dlrover.diagnosis.window import BudgetWindow
from dlrover.master.autoscaler import AutoscalerConfig
from dlrover.master.launch_retry import LaunchRetrySettings
from dlrover.rendezvous import RendezvousConfig

if TYPE_CHECKING:
    from dlrover.master.profiles import JobPlanChoice
    from dlrover.master.scheduler.kubernetes.settings import KubernetesSettings
    from dlrover.master.scheduler.ray.settings import RaySettings

__all__ = [
    "BACKENDS",
    "FAILURE_POLICIES",
    "STRAGGLER_ACTIONS",
    "LifecycleConfig",
    "MasterConfig",
    "NodeGroup",
    "NodeRange",
    "parse_node_range",
]

BACKENDS = ("local", "external", "kubernetes", "ray")
FAILURE_POLICIES = ("diagnosis", "default")
STRAGGLER_ACTIONS = ("report", "replace")


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(str(v) for v in value)


def _optional_non_negative(inst: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None:
        non_negative_int(inst, attribute, value)


def _optional_positive(inst: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None:
        positive(inst, attribute, value)


@attrs.frozen
class NodeRange:
    """How many nodes the job runs with: at least `min_nodes`, at most `max_nodes`.

    Attributes:
        min_nodes: below this many running nodes the job cannot train.
        max_nodes: the master launches this many nodes (logical ranks 0..max_nodes-1).
        node_unit: nodes join and leave in multiples of this (handed to the rendezvous).
    """

    min_nodes: int = attrs.field(default=1, validator=positive)
    max_nodes: int = attrs.field(default=1, validator=positive)
    node_unit: int = attrs.field(default=1, validator=positive)

    def __attrs_post_init__(self) -> None:
        if self.min_nodes > self.max_nodes:
            raise ConfigError(f"min_nodes ({self.min_nodes}) must not exceed max_nodes ({self.max_nodes})")
        if self.node_unit > self.max_nodes:
            raise ConfigError(f"node_unit ({self.node_unit}) must not exceed max_nodes ({self.max_nodes})")


def parse_node_range(text: str, node_unit: int = 1) -> NodeRange:
    """Parse torchrun's `--nnodes` syntax: `N` or `MIN:MAX`.

    Raises:
        ConfigError: the text is not `N` or `MIN:MAX` with positive integers, MIN <= MAX.
    """
    parts = text.split(":")
    if len(parts) not in (1, 2) or not all(p.strip().isdigit() for p in parts):
        raise ConfigError(f"nnodes must be N or MIN:MAX with positive integers, got {text!r}")
    low, high = int(parts[0]), int(parts[-1])
    return NodeRange(min_nodes=low, max_nodes=high, node_unit=node_unit)


def _optional_resources(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, Resources):
        raise ConfigError(f"{attribute.name} must be dlrover.autoscale.Resources or None, got {value!r}")


def _optional_memory_mb(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{attribute.name} must be None or a whole number of MiB >= 1, got {value!r}")


@attrs.frozen
class NodeGroup:
    """One group of a job's nodes: same role, same resources, a range of counts.

    A job is a set of node groups; today the master runs one, the workers (`LifecycleConfig.worker_group`).

    Attributes:
        role: what the nodes do (`dlrover.autoscale.Role`).
        nodes: how many of them, at least and at most.
        resources: what each node is launched with; None when the job asks for nothing (the backend's default,
            and no memory limit).
    """

    role: Role = attrs.field(default=Role.WORKER, validator=attrs.validators.instance_of(Role))
    nodes: NodeRange = attrs.field(factory=NodeRange, validator=attrs.validators.instance_of(NodeRange))
    resources: Resources | None = attrs.field(default=None, validator=_optional_resources)


@attrs.frozen
class LifecycleConfig:
    """Budgets, timeouts and early-stop rules of the node lifecycle.

    Attributes:
        nodes: how many nodes the job has.
        heartbeat_timeout_s: a running node silent this long is handled as failed.
        node_start_timeout_s: a launched node that has not registered after this long is handled as
            failed; None waits forever (agents started by a person).
        max_process_restarts: training-process restarts allowed on one node before it is relaunched.
        max_relaunches: replacements allowed per logical rank within `budget_window_s`.
        max_job_failures: failures allowed in the job within `budget_window_s`; one more stops it.
            None (the default): 20, or two per node of a job of more than 10 (`job_failure_limit`):
            a job of thousands of nodes meets dozens of failures a day, each node's own budgets
            stop a node that fails again and again, and this one stops a job whose every node
            fails, twice.
        budget_window_s: how long a failure counts against the failure budgets: `max_relaunches`,
            `max_job_failures`, the failure policy's ladders and its ``max_node_relaunches`` (default
            24 hours; None: the job's whole life). A job that trains for weeks meets failures every
            few hours; the budgets stop one whose failures keep coming back, not one that met two
            weeks apart. A node's process restarts (its agent's ``--max-restarts``) count for the
            node's life, as under torchrun: a node that spends them is relaunched.
        insufficient_nodes_window_s: the job stops when fewer than `min_nodes` nodes run for this long.
        node_resources: what each worker node is launched with; None asks for nothing in particular.
        oom_memory_growth: a node killed for host OOM (`RELAUNCH_WITH_MORE_MEMORY`) is relaunched with its
            memory times this (>= 1).
        max_node_memory_mb: the most memory an OOM relaunch may grow a node to; one that ran out of memory at
            this size stops the job. None: no cap beyond what the backend can provide.
        node_pending_timeout_s: a launched node still not running after this long is announced in a
            ``nodes_pending`` event: the job goes on with the nodes that run (and says whether that
            is at least `min_nodes`); the node stays wanted and joins when it starts. None: never.
        spare_nodes: warm spares to keep beside the ranked nodes (``--spare-nodes``): nodes whose
            agents are registered and hold no rank, one of which takes over the rank of a node the
            master relaunches. They count against the backend's capacity after the ranked nodes
            (`max_nodes` does not include them); a backend that starts no node keeps none.
        spare_refill_after_s: a spare promoted to a rank is replaced once its workers trained a
            step (it reported a step newer than its first since, or samples) or this long after its
            promotion, whichever comes first: the
            next spare's start-up (an interpreter and its standbys importing torch) then takes no
            CPU from the round that restores the job where it shares a host with it (the local
            backend; a Kubernetes node with room for several pods). 0: replaced at once.
        peer_cause_wait_s: how long a collective error or hang reported with no cause known, by a
            node with a restart left, waits for one before it is charged: the node's workers restart
            at once, and a peer's own
            failure found meanwhile (a node lost at its heartbeat timeout, a crash its agent
            reports) makes it that failure's consequence, charged to nobody. None (the default):
            `heartbeat_timeout_s` + 10 s, so a peer killed outright, agent and all, is found in
            time; 0: charged at once.
    """

    nodes: NodeRange = attrs.field(factory=NodeRange)
    heartbeat_timeout_s: float = attrs.field(default=30.0, validator=positive)
    node_start_timeout_s: float | None = attrs.field(default=300.0, validator=_optional_positive)
    max_process_restarts: int = attrs.field(default=3, validator=non_negative)
    max_relaunches: int = attrs.field(default=3, validator=non_negative)
    max_job_failures: int | None = attrs.field(default=None, validator=_optional_non_negative)
    budget_window_s: float | None = attrs.field(default=86400.0)
    insufficient_nodes_window_s: float = attrs.field(default=300.0, validator=positive)
    node_resources: Resources | None = attrs.field(default=None, validator=_optional_resources)
    oom_memory_growth: float = attrs.field(default=1.5, validator=positive)
    max_node_memory_mb: int | None = attrs.field(default=None, validator=_optional_memory_mb)
    node_pending_timeout_s: float | None = attrs.field(default=60.0, validator=_optional_positive)
    spare_nodes: int = attrs.field(default=0, validator=non_negative_int)
    spare_refill_after_s: float = attrs.field(default=30.0, validator=non_negative_finite)
    peer_cause_wait_s: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(non_negative_finite)
    )

    def __attrs_post_init__(self) -> None:
        BudgetWindow(self.budget_window_s)  # refuses what is not a window, naming it
        if not math.isfinite(self.oom_memory_growth) or self.oom_memory_growth < 1:
            raise ConfigError(f"oom_memory_growth must be a finite number >= 1, got {self.oom_memory_growth!r}")
        memory = self.node_resources.memory_mb if self.node_resources is not None else 0
        if self.max_node_memory_mb is not None and memory > self.max_node_memory_mb:
            raise ConfigError(
                f"node memory {memory} MiB exceeds max_node_memory_mb {self.max_node_memory_mb}: "
                "the cap would forbid the first launch"
            )

    @property
    def job_failure_limit(self) -> int:
        """`max_job_failures`, or its default for this job's size."""
        if self.max_job_failures is not None:
            return self.max_job_failures
        return max(20, 2 * self.nodes.max_nodes)

    @property
    def peer_cause_wait(self) -> float:
        """`peer_cause_wait_s`, or its default: a heartbeat timeout and a margin for the tick that finds it."""
        return self.heartbeat_timeout_s + 10.0 if self.peer_cause_wait_s is None else self.peer_cause_wait_s

    @property
    def budget_window(self) -> BudgetWindow:
        """`budget_window_s` as the window the budgets count in."""
        return BudgetWindow(self.budget_window_s)

    @property
    def worker_group(self) -> NodeGroup:
        """The workers: `nodes` as the range, `node_resources` as each node's resources."""
        return NodeGroup(Role.WORKER, self.nodes, self.node_resources)

    @property
    def groups(self) -> tuple[NodeGroup, ...]:
        """Every node group of the job (today only the workers)."""
        return (self.worker_group,)


@attrs.frozen
class MasterConfig:
    """Everything `create_master` needs.

    Attributes:
        job_name: names the job in events, metrics and node credentials.
        lifecycle: budgets, timeouts, early-stop rules.
        bind_address: interface the gRPC server listens on (loopback by default).
        port: gRPC port; 0 picks a free one.
        token: the job token; None loads it from `token_file`, the environment, or the state
            directory, else generates one.
        token_file: a 0600 file holding the token.
        tls: serve TLS with these files.
        agent_tls: how the agents the local backend starts dial this master when it serves TLS
            (``--agent-tls-*``); a field left None takes the default of `dlrover.master.agent_tls`
            (CA: the ``--tls-ca`` of a mutual-TLS master, else the master's own certificate).
            Only for the local backend.
        max_message_bytes: largest request the server accepts.
        max_workers: threads serving RPCs.
        state_dir: where the journal (and a generated token) live; None keeps state in memory only.
        backend: `local` (agents as subprocesses), `external` (agents register themselves),
            `kubernetes` (worker pods of an ElasticJob; needs `kubernetes`) or `ray` (an agent actor per
            Ray node; needs `ray`).
        agent_command: the command the local and Ray backends run per node (argv list).
        heartbeat_interval_s: how often agents are told to heartbeat.
        tick_interval_s: how often the master checks timeouts and the scheduler.
        min_tick_gap_s: the least time between two checks woken early by a backend that reports its
            changes (the Kubernetes backend's pod events): a burst of events is one check per gap.
        node_stop_grace_s: how long the local backend waits after SIGTERM before SIGKILL: above
            the agents' round-save timeout plus their workers' shutdown grace (10 s each by
            default), so a stopped node's workers save and stop before the kill.
        metrics_port: Prometheus endpoint port; None serves no endpoint, 0 picks a free port.
        metrics_bind_address: interface of the metrics endpoint.
        event_log: path of the JSON-lines event log; None puts it in the state directory (or
            writes none without one).
        progress_event_interval_s: at most one step-progress event per this many seconds.
        rendezvous_last_call_s: after the last join, how long a round with at least `min_nodes`
            waits for more nodes before it completes.
        rendezvous_join_timeout_s: a node waiting this long without being admitted is told so.
        rendezvous_planned_wait_s: how long a planned round (a resize let nodes go, or a spare
            takes a failed node's rank: the master knows which nodes restart for it) waits for a
            slow one of them, past the last call, before it forms without it.
        rendezvous_heartbeat_timeout_s: a rendezvous member silent this long is removed from it.
        state_export_interval_s: how often the rendezvous and shard state are exported to the
            journal when nothing forced an export earlier (see `journal_shard_changes`).
        journal_shard_changes: journal the shard state after every request that changed it,
            before answering (an acknowledged sample is never lost by a master restart); when
            False, or without a `state_dir` (an in-memory journal does not outlive the master),
            shard progress reaches the journal only every `state_export_interval_s`.
        journal_busy_timeout_s: how long a journal write waits for a lock another process holds on
            the database before it fails (the request then gets UNAVAILABLE and changes nothing).
        serve_ping: also serve dlrover.common's no-op PingService (token required, like every
            RPC): the baseline benchmarks compare the master's RPCs with.
        failure_policy: `diagnosis` (classify the evidence and use dlrover.diagnosis' action
            policy) or `default` (`DefaultFailurePolicy`, decided on the reported kind alone).
        max_node_relaunches: the diagnosis policy's node relaunches within the budget window
            (`LifecycleConfig.budget_window_s`) before the next one stops the job
            (`PolicyConfig.max_node_relaunches`). None (the default): 16, or one per 64 nodes of
            a larger job (`node_relaunch_limit`). At the Llama 3 report's rate (419 interruptions
            in 54 days on 16,384 GPUs, about 85% of them a node replaced) a 2,048-node job
            relaunches six or seven nodes a day, and 32 a day stops it.
        refusal_log_interval_s: refused calls (a wrong or missing token, a malformed or oversized
            request...) are logged at most once per reason per this many seconds, with a count
            of those not logged; every one is counted in `dlrover_refused_calls_total`.
        straggler_factor: a rank whose recent step time exceeds this many times the other ranks'
            median is a straggler (compared from the step stats agents send on heartbeats).
        straggler_window: the heartbeats with new steps a rank's step time is the median over;
            with `straggler_min_samples` it bounds how soon a slowed rank is found (about
            `straggler_min_samples` heartbeat intervals after it slowed, its unfinished step
            counting as soon as it runs long).
        straggler_min_samples: heartbeats with new steps needed before a rank is judged.
        straggler_action: `report` (an event and a warning) or `replace` (also relaunch the
            straggler's node, where the scheduler backend relaunches nodes; else report only).
        samples_rate_window_s: samples per second (status, `dlrover_samples_per_second`) are
            measured over this many recent seconds of the samples the workers report.
        local_slots: the local backend's capacity in slots (nodes that may run at once); None:
            unbounded. The job starts with min(max_nodes, slots) nodes and follows changes.
        capacity_file: the local backend re-reads its slots from this file whenever it changes.
        autoscale: the autoscaler (`dlrover.master.autoscaler`): `off` (the default), `advise` (plans
            are events, nothing changes) or `on` (the job starts at its minimum, grows while the
            measured speed-up pays, gives back nodes that do not, and a straggler's node is
            replaced as with `straggler_action` ``replace``).
        profile_store: the job profile store (SQLite file) the job's profile is recorded in at its end; None records
            none (`dlrover.master.profiles.resolve_profile_store` gives the CLI's default).
        job_kind: a tag saying which earlier jobs are like this one (similarity of profiles); "" for none.
        initial_plan: where the node counts and resources came from (`dlrover.master.profiles.plan_job`); the
            master announces it at start. None: nothing was planned.
        kubernetes: the Kubernetes backend's namespace, ElasticJob, kubeconfig and timeouts
            (`dlrover.master.scheduler.kubernetes.KubernetesSettings`); only with backend `kubernetes`.
        ray: the Ray backend's cluster address, temp dir and timeouts
            (`dlrover.master.scheduler.ray.RaySettings`); only with backend `ray` (None there: the defaults,
            `auto` for the address).
        launch_retry: how a launch the backend failed for a passing reason (a plain `SchedulerError`: the
            API server away, a refused fork) is tried again before it counts as the node's failure
            (`dlrover.master.launch_retry`): by default 5 more times, 2 s apart and doubling up to 30 s.
    """

    job_name: str = "dlrover-job"
    lifecycle: LifecycleConfig = attrs.field(factory=LifecycleConfig)
    bind_address: str = "127.0.0.1"
    port: int = attrs.field(default=0)
    token: str | None = attrs.field(default=None, repr=False)
    token_file: str | None = None
    tls: TLSConfig | None = None
    agent_tls: TLSConfig | None = None
    max_message_bytes: int = attrs.field(default=4 * 1024 * 1024, validator=positive)
    max_workers: int = attrs.field(default=16, validator=positive)
    state_dir: str | None = None
    backend: str = "local"
    agent_command: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    heartbeat_interval_s: float = attrs.field(default=5.0, validator=positive)
    tick_interval_s: float = attrs.field(default=1.0, validator=positive)
    min_tick_gap_s: float = attrs.field(default=0.05, validator=non_negative)
    node_stop_grace_s: float = attrs.field(default=30.0, validator=non_negative)
    metrics_port: int | None = None
    metrics_bind_address: str = "127.0.0.1"
    event_log: str | None = None
    progress_event_interval_s: float = attrs.field(default=10.0, validator=non_negative)
    rendezvous_last_call_s: float = attrs.field(default=5.0, validator=non_negative)
    rendezvous_join_timeout_s: float = attrs.field(default=600.0, validator=positive)
    rendezvous_planned_wait_s: float = attrs.field(default=60.0, validator=non_negative)
    rendezvous_heartbeat_timeout_s: float = attrs.field(default=30.0, validator=positive)
    state_export_interval_s: float = attrs.field(default=5.0, validator=positive)
    journal_shard_changes: bool = True
    journal_busy_timeout_s: float = attrs.field(default=5.0, validator=positive)
    serve_ping: bool = False
    failure_policy: str = "diagnosis"
    max_node_relaunches: int | None = attrs.field(default=None, validator=_optional_non_negative)
    refusal_log_interval_s: float = attrs.field(default=30.0, validator=non_negative_finite)
    straggler_factor: float = attrs.field(default=2.0, validator=positive)
    straggler_window: int = attrs.field(default=5, validator=positive)
    straggler_min_samples: int = attrs.field(default=3, validator=positive)
    straggler_action: str = "report"
    samples_rate_window_s: float = attrs.field(default=30.0, validator=positive)
    local_slots: int | None = attrs.field(default=None, validator=_optional_non_negative)
    capacity_file: str | None = None
    autoscale: AutoscalerConfig = attrs.field(factory=AutoscalerConfig)
    profile_store: str | None = None
    job_kind: str = ""
    initial_plan: JobPlanChoice | None = None
    kubernetes: KubernetesSettings | None = None
    ray: RaySettings | None = None
    launch_retry: LaunchRetrySettings = attrs.field(
        factory=LaunchRetrySettings, validator=attrs.validators.instance_of(LaunchRetrySettings)
    )

    @property
    def node_relaunch_limit(self) -> int:
        """`max_node_relaunches`, or its default for this job's size."""
        if self.max_node_relaunches is not None:
            return self.max_node_relaunches
        return max(16, self.lifecycle.nodes.max_nodes // 64)

    def _check_ray(self) -> None:
        if self.backend != "ray" and self.ray is not None:
            raise ConfigError(f"Ray settings are for the ray backend, not the {self.backend} backend")
        if self.ray is not None:
            from dlrover.master.scheduler.ray.settings import RaySettings

            if not isinstance(self.ray, RaySettings):
                raise ConfigError(f"ray must be a RaySettings, got {self.ray!r}")
        if self.backend == "ray" and not self.agent_command:
            raise ConfigError("the ray backend needs agent_command (the agent each node's actor runs)")

    def _check_kubernetes(self) -> None:
        if self.backend == "kubernetes" and self.kubernetes is None:
            raise ConfigError(
                "the kubernetes backend needs its namespace and ElasticJob (--kube-namespace, --kube-job)"
            )
        if self.backend != "kubernetes" and self.kubernetes is not None:
            raise ConfigError(f"Kubernetes settings are for the kubernetes backend, not the {self.backend} backend")
        if self.kubernetes is not None:
            from dlrover.master.scheduler.kubernetes.settings import KubernetesSettings

            if not isinstance(self.kubernetes, KubernetesSettings):
                raise ConfigError(f"kubernetes must be a KubernetesSettings, got {self.kubernetes!r}")

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.autoscale, AutoscalerConfig):
            raise ConfigError(f"autoscale must be an AutoscalerConfig, got {self.autoscale!r}")
        if self.profile_store is not None and not self.profile_store.strip():
            raise ConfigError(f"profile_store must be a file path or None, got {self.profile_store!r}")
        if len(self.job_kind) > 256 or not self.job_kind.isprintable():
            raise ConfigError(f"job_kind must be at most 256 printable characters, got {self.job_kind!r}")
        if not self.job_name or len(self.job_name) > 128 or not self.job_name.isprintable():
            raise ConfigError(f"job_name must be 1..128 printable characters, got {self.job_name!r}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {self.port!r}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be in 0..65535, got {self.metrics_port!r}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        self._check_kubernetes()
        self._check_ray()
        if self.backend != "local" and (self.local_slots is not None or self.capacity_file is not None):
            raise ConfigError(
                f"a capacity in slots (local_slots {self.local_slots!r}, capacity_file {self.capacity_file!r}) is "
                f"for the local backend; the {self.backend} backend reports its own"
            )
        if self.failure_policy not in FAILURE_POLICIES:
            raise ConfigError(
                f"failure_policy must be one of {', '.join(FAILURE_POLICIES)}, got {self.failure_policy!r}"
            )
        if self.straggler_action not in STRAGGLER_ACTIONS:
            raise ConfigError(
                f"straggler_action must be one of {', '.join(STRAGGLER_ACTIONS)}, got {self.straggler_action!r}"
            )
        if self.straggler_min_samples > self.straggler_window:
            raise ConfigError(
                f"straggler_min_samples ({self.straggler_min_samples}) must not exceed "
                f"straggler_window ({self.straggler_window})"
            )
        self.rendezvous_config()  # refuses node ranges the rendezvous cannot form rounds for
        if self.heartbeat_interval_s >= self.lifecycle.heartbeat_timeout_s:
            raise ConfigError(
                f"heartbeat_interval_s ({self.heartbeat_interval_s}) must be shorter than "
                f"heartbeat_timeout_s ({self.lifecycle.heartbeat_timeout_s})"
            )

    def rendezvous_config(self) -> RendezvousConfig:
        """The rendezvous parameters of this job: nnodes and node_unit from `lifecycle.nodes`.

        Raises:
            ConfigError: no multiple of node_unit lies within [min_nodes, max_nodes].
        """
        nodes = self.lifecycle.nodes
        return RendezvousConfig(
            min_nodes=nodes.min_nodes,
            max_nodes=nodes.max_nodes,
            node_unit=nodes.node_unit,
            last_call_s=self.rendezvous_last_call_s,
            join_timeout_s=self.rendezvous_join_timeout_s,
            planned_wait_s=self.rendezvous_planned_wait_s,
            heartbeat_timeout_s=self.rendezvous_heartbeat_timeout_s,
        )
