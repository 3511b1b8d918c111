"""dlrover.autoscale: size a job's resources with OR-tools, and fix them while it runs.

- `model`: throughput samples and the fitted curve `T(n) = 1 / (a + b/n + c*n)` with a confidence measure.
- `sizing`: node requests (CPU, memory) derived from observed usage, offered to the planner as options.
- `planner`: the CP-SAT planner choosing worker/PS counts and sizes within a `ClusterQuota`.
- `heuristics`: OOM relaunch, hot PS, stragglers, pending nodes and elastic sizing, as pure functions.
- `profile_store`: past jobs in SQLite, and the initial plan of a job without resource configuration.

Every producer returns a `ScalePlan` (launch, remove, resize) with the reason for it; none acts itself.
"""

from dlrover.autoscale.errors import AutoscaleError, InsufficientSamplesError, InvalidMetricError, ProfileStoreError
from dlrover.autoscale.heuristics import (
    ElasticConfig,
    HotPsConfig,
    OomConfig,
    OomEvent,
    PendingConfig,
    PendingNode,
    PsCpuSeries,
    StragglerConfig,
    WorkerSpeedSeries,
    plan_hot_ps,
    plan_oom_relaunch,
    plan_pending,
    plan_stragglers,
    plan_toward_target,
)
from dlrover.autoscale.model import ThroughputModel, ThroughputSample, fit_throughput_model
from dlrover.autoscale.plan import LaunchRequest, NodeState, ResizeRequest, ScalePlan, diff_to_target
from dlrover.autoscale.planner import (
    JobShape,
    PlannerConfig,
    PlanRequest,
    PlanResult,
    PlanStatus,
    ResourcePlanner,
    predicted_throughput,
)
from dlrover.autoscale.profile_store import (
    SCHEMA_VERSION,
    InitialPlan,
    InitialPlanConfig,
    JobFeatures,
    JobOutcome,
    JobProfile,
    JobProfileStore,
    initial_plan,
)
from dlrover.autoscale.resources import ClusterQuota, MachineShape, Resources, Role
from dlrover.autoscale.sizing import (
    PsLoadSample,
    PsOption,
    SizingConfig,
    UsageSample,
    WorkerOption,
    size_ps_options,
    size_worker_options,
)

__all__ = [
    # errors
    "AutoscaleError",
    "InvalidMetricError",
    "InsufficientSamplesError",
    "ProfileStoreError",
    # resources and plans
    "Role",
    "Resources",
    "MachineShape",
    "ClusterQuota",
    "NodeState",
    "LaunchRequest",
    "ResizeRequest",
    "ScalePlan",
    "diff_to_target",
    # job model and sizing
    "ThroughputSample",
    "ThroughputModel",
    "fit_throughput_model",
    "UsageSample",
    "PsLoadSample",
    "WorkerOption",
    "PsOption",
    "SizingConfig",
    "size_worker_options",
    "size_ps_options",
    # planner
    "PlannerConfig",
    "PlanRequest",
    "PlanResult",
    "PlanStatus",
    "JobShape",
    "ResourcePlanner",
    "predicted_throughput",
    # heuristics
    "OomConfig",
    "OomEvent",
    "plan_oom_relaunch",
    "HotPsConfig",
    "PsCpuSeries",
    "plan_hot_ps",
    "StragglerConfig",
    "WorkerSpeedSeries",
    "plan_stragglers",
    "PendingConfig",
    "PendingNode",
    "plan_pending",
    "ElasticConfig",
    "plan_toward_target",
    # profile store
    "SCHEMA_VERSION",
    "JobFeatures",
    "JobOutcome",
    "JobProfile",
    "JobProfileStore",
    "InitialPlanConfig",
    "InitialPlan",
    "initial_plan",
]
