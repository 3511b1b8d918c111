"""dlrover.master: the job master.

Composes the DLRover libraries behind one authenticated gRPC server: the node lifecycle (an
explicit transition table, budgets, early-stop rules), scheduler backends (local, external,
Kubernetes, Ray), a SQLite state journal a restarted master resumes from, per-node identity,
checkpoint coordination, Prometheus metrics, a JSON-lines event log, goodput accounting with a
timeline picture, and `dlrover-master`. `RayJob` / `run_on_ray` run a job on a Ray cluster from a
Python script, the master in the script's process.
A running job grows and shrinks through one path: a `ResizeRequest` (`Master.resize`,
`dlrover-master scale`, the backend's capacity, the autoscaler) to the lifecycle core.
At its end a job's profile is recorded in the profile store; a job that asks for no node count
or resources is planned from the most similar earlier profile (`plan_job`, `dlrover-master plan`).
By default the same server hosts the job's RendezvousService and ShardService (journaled, and
released from failed nodes), and failures are decided by dlrover.diagnosis.
"""

from dlrover.master.autoscaler import (
    AutoscaleDecision,
    AutoscaleMode,
    Autoscaler,
    AutoscalerConfig,
    JobView,
    SizeMeasurement,
    ThroughputRecorder,
    efficient_node_count,
)
from dlrover.master.checkpoints import CheckpointError, CheckpointReport, CheckpointTracker
from dlrover.master.client import CheckpointStepsAnswer, HeartbeatAnswer, MasterClient, Registration, StopAnswer
from dlrover.master.config import (
    FAILURE_POLICIES,
    LifecycleConfig,
    MasterConfig,
    NodeGroup,
    NodeRange,
    parse_node_range,
)
from dlrover.master.diagnosis_policy import DiagnosisFailurePolicy
from dlrover.master.eventlog import EventLog, EventLogInUseError, read_event_log
from dlrover.master.factory import MASTER_ADDR_ENV_VAR, create_master, default_policy, resolve_token
from dlrover.master.goodput import (
    BUCKETS,
    AttemptReport,
    GoodputAccountant,
    GoodputBreakdown,
    GoodputInputError,
    SampleRate,
    StepMark,
    compute_breakdown,
)
from dlrover.master.hosting import (
    KV_STATE_FORMAT,
    SHARD_STATE_FORMAT,
    HostedKeyValueStore,
    HostedRendezvous,
    HostedShards,
    StateSink,
    node_of_worker,
)
from dlrover.master.identity import (
    NODE_CREDENTIAL_METADATA_KEY,
    NODE_ID_METADATA_KEY,
    NodeAuthenticator,
    NodeIdentityError,
    NodeImpersonationError,
    node_metadata,
)
from dlrover.master.journal import (
    Blob,
    CheckpointCommit,
    JournalBatch,
    JournaledEvent,
    JournalError,
    JournalState,
    MemoryJournal,
    SqliteJournal,
    StateJournal,
)
from dlrover.master.lifecycle import (
    HostAvoidedError,
    JobFinishedError,
    JobFullError,
    JobLifecycle,
    LifecycleError,
    NodeConflictError,
    NodeStateError,
    Savepoint,
    UnknownNodeError,
)
from dlrover.master.master import JobStatus, Master, NodeMembership, ResourceSample, SpareAware, StatefulCollaborator
from dlrover.master.metrics import MasterMetrics, MetricsEndpoint
from dlrover.master.policy import (
    Classification,
    ClassifyingPolicy,
    DefaultFailurePolicy,
    Failure,
    FailurePolicy,
    JournaledPolicy,
    StatefulPolicy,
)
from dlrover.master.profiles import (
    PROFILE_STORE_ENV_VAR,
    JobPlanChoice,
    ProfileRecorder,
    ThroughputBySize,
    build_run_profile,
    checkpoint_sizes,
    default_profile_store,
    plan_job,
    resolve_profile_store,
    signature_of,
)
from dlrover.master.ray_job import RayJob, run_on_ray
from dlrover.master.records import Action, Event, LaunchNode, LifecycleSnapshot, NodeRecord, Outcome, StopNode
from dlrover.master.rendezvous_state import export_rendezvous, restore_rendezvous
from dlrover.master.resize import ResizeError, ResizeRequest, ResizeResult, ResizeSource, choose_leaving
from dlrover.master.runtime import MasterRuntime, ServiceRegistration
from dlrover.master.scheduler import (
    AdjustableCapacity,
    CgroupMemoryGroups,
    ExternalScheduler,
    FakeMemoryGroups,
    FakeScheduler,
    LocalScheduler,
    MemoryGroups,
    MemoryRecord,
    NodeMemoryRecords,
    NodeShapeLimit,
    NodeSpec,
    ObservedNode,
    ObservedState,
    SchedulerBackend,
    SchedulerError,
    UnavailableMemoryGroups,
    detect_memory_groups,
    parse_slots,
)
from dlrover.master.servicers import AgentServicer, CheckpointServicer, JobServicer, add_master_services
from dlrover.master.statedir import (
    LOCK_FILE_NAME,
    LockHolder,
    StateDirError,
    StateDirInUseError,
    StateDirLock,
    prepare_state_dir,
)
from dlrover.master.states import (
    TRANSITIONS,
    IllegalTransitionError,
    JobState,
    NodeState,
    check_transition,
)
from dlrover.master.status import JobSummary, NodeSummary, format_status, summarize
from dlrover.master.timeline import render_timeline

__all__ = [
    # autoscaler
    "AutoscaleDecision",
    "AutoscaleMode",
    "Autoscaler",
    "AutoscalerConfig",
    "JobView",
    "SizeMeasurement",
    "ThroughputRecorder",
    "efficient_node_count",
    # composition
    "Master",
    "MasterConfig",
    "MasterRuntime",
    "ServiceRegistration",
    "SpareAware",
    "StatefulCollaborator",
    "create_master",
    "run_on_ray",
    "resolve_token",
    "default_policy",
    "FAILURE_POLICIES",
    "MASTER_ADDR_ENV_VAR",
    "JobStatus",
    "ResourceSample",
    # lifecycle core
    "JobLifecycle",
    "LifecycleConfig",
    "NodeGroup",
    "NodeRange",
    "parse_node_range",
    "NodeState",
    "JobState",
    "TRANSITIONS",
    "check_transition",
    "NodeRecord",
    "Action",
    "Event",
    "LaunchNode",
    "StopNode",
    "Outcome",
    "LifecycleSnapshot",
    "LifecycleError",
    "IllegalTransitionError",
    "UnknownNodeError",
    "NodeStateError",
    "NodeConflictError",
    "JobFinishedError",
    "JobFullError",
    "HostAvoidedError",
    "Savepoint",
    # resizing
    "ResizeRequest",
    "ResizeResult",
    "ResizeSource",
    "ResizeError",
    "choose_leaving",
    # job profiles: recorded at job end, planned from at submission
    "PROFILE_STORE_ENV_VAR",
    "JobPlanChoice",
    "ProfileRecorder",
    "ThroughputBySize",
    "build_run_profile",
    "checkpoint_sizes",
    "default_profile_store",
    "plan_job",
    "resolve_profile_store",
    "signature_of",
    # failure policy seam
    "FailurePolicy",
    "JournaledPolicy",
    "DefaultFailurePolicy",
    "Failure",
    "Classification",
    "ClassifyingPolicy",
    "StatefulPolicy",
    "DiagnosisFailurePolicy",
    # hosted libraries (rendezvous, shards)
    "HostedRendezvous",
    "HostedShards",
    "HostedKeyValueStore",
    "KV_STATE_FORMAT",
    "NodeMembership",
    "StateSink",
    "node_of_worker",
    "SHARD_STATE_FORMAT",
    "export_rendezvous",
    "restore_rendezvous",
    # checkpoints
    "CheckpointTracker",
    "CheckpointReport",
    "CheckpointError",
    # journal
    "StateJournal",
    "SqliteJournal",
    "MemoryJournal",
    "JournalBatch",
    "JournalState",
    "JournaledEvent",
    "CheckpointCommit",
    "Blob",
    "JournalError",
    # the state directory
    "StateDirLock",
    "StateDirError",
    "StateDirInUseError",
    "LockHolder",
    "LOCK_FILE_NAME",
    "prepare_state_dir",
    # identity
    "NodeAuthenticator",
    "NodeIdentityError",
    "NodeImpersonationError",
    "node_metadata",
    "NODE_ID_METADATA_KEY",
    "NODE_CREDENTIAL_METADATA_KEY",
    # schedulers
    "SchedulerBackend",
    "SchedulerError",
    "NodeSpec",
    "ObservedNode",
    "ObservedState",
    "FakeScheduler",
    "LocalScheduler",
    "ExternalScheduler",
    "NodeShapeLimit",
    "NodeMemoryRecords",
    "MemoryRecord",
    "MemoryGroups",
    "CgroupMemoryGroups",
    "UnavailableMemoryGroups",
    "FakeMemoryGroups",
    "detect_memory_groups",
    "AdjustableCapacity",
    "parse_slots",
    # transport
    "AgentServicer",
    "CheckpointServicer",
    "JobServicer",
    "add_master_services",
    "MasterClient",
    "Registration",
    "RayJob",
    "HeartbeatAnswer",
    "CheckpointStepsAnswer",
    "StopAnswer",
    # observability
    "MasterMetrics",
    "MetricsEndpoint",
    "EventLog",
    "EventLogInUseError",
    "read_event_log",
    "JobSummary",
    "NodeSummary",
    "summarize",
    "format_status",
    "render_timeline",
    # goodput
    "BUCKETS",
    "AttemptReport",
    "GoodputAccountant",
    "GoodputBreakdown",
    "GoodputInputError",
    "SampleRate",
    "StepMark",
    "compute_breakdown",
]
