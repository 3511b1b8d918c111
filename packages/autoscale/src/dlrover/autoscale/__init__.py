"""dlrover.autoscale: size a job's resources with OR-tools, and fix them while it runs.

- `model`: throughput samples and the fitted curve `T(n) = 1 / (a + b/n + c*n)` with a confidence measure.
- `sizing`: node requests (CPU, memory) derived from observed usage, offered to the planner as options.
- `planner`: the CP-SAT planner choosing worker/PS counts and sizes within a `ClusterQuota`.
- `heuristics`: OOM relaunch, hot PS, stragglers, pending nodes and elastic sizing, as pure functions.
- `profile_store`: past jobs in SQLite, and the initial plan of a job without resource configuration.
- `run_profiles`: what a master measured about a finished job, and the plan of a job that asks for nothing.
- `ps_plan`: the same for a parameter-server job: servers, workers and each role's resources from its profile.

Every producer returns a `ScalePlan` (launch, remove, resize) with the reason for it; none acts itself.

Names are imported lazily: `from dlrover.autoscale import Resources` (the master and every agent read the
resource vocabulary) does not load OR-tools, which only the planner needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlrover.common.lazy import lazy_exports

if TYPE_CHECKING:
    from dlrover.autoscale.errors import (
        AutoscaleError,
        CorruptProfileStoreError,
        InsufficientSamplesError,
        InvalidMetricError,
        NewerProfileStoreError,
        ProfileStoreError,
    )
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
        is_corruption,
    )
    from dlrover.autoscale.ps_plan import PsPlanConfig, PsRunPlan, plan_ps_from_runs
    from dlrover.autoscale.resources import ClusterQuota, MachineShape, Resources, Role, parse_memory_mb
    from dlrover.autoscale.run_profiles import (
        JobSignature,
        OpenedStore,
        RoleProfile,
        RunPlan,
        RunPlanConfig,
        RunProfile,
        add_run,
        most_similar,
        open_or_set_aside,
        plan_from_runs,
        read_runs,
    )
    from dlrover.autoscale.sizing import (
        PsLoadSample,
        PsOption,
        SizingConfig,
        UsageSample,
        WorkerOption,
        size_ps_options,
        size_worker_options,
    )

_EXPORTS: dict[str, str] = {
    "AutoscaleError": "dlrover.autoscale.errors",
    "InvalidMetricError": "dlrover.autoscale.errors",
    "InsufficientSamplesError": "dlrover.autoscale.errors",
    "ProfileStoreError": "dlrover.autoscale.errors",
    "CorruptProfileStoreError": "dlrover.autoscale.errors",
    "NewerProfileStoreError": "dlrover.autoscale.errors",
    "Role": "dlrover.autoscale.resources",
    "Resources": "dlrover.autoscale.resources",
    "parse_memory_mb": "dlrover.autoscale.resources",
    "MachineShape": "dlrover.autoscale.resources",
    "ClusterQuota": "dlrover.autoscale.resources",
    "NodeState": "dlrover.autoscale.plan",
    "LaunchRequest": "dlrover.autoscale.plan",
    "ResizeRequest": "dlrover.autoscale.plan",
    "ScalePlan": "dlrover.autoscale.plan",
    "diff_to_target": "dlrover.autoscale.plan",
    "ThroughputSample": "dlrover.autoscale.model",
    "ThroughputModel": "dlrover.autoscale.model",
    "fit_throughput_model": "dlrover.autoscale.model",
    "UsageSample": "dlrover.autoscale.sizing",
    "PsLoadSample": "dlrover.autoscale.sizing",
    "WorkerOption": "dlrover.autoscale.sizing",
    "PsOption": "dlrover.autoscale.sizing",
    "SizingConfig": "dlrover.autoscale.sizing",
    "size_worker_options": "dlrover.autoscale.sizing",
    "size_ps_options": "dlrover.autoscale.sizing",
    "PlannerConfig": "dlrover.autoscale.planner",
    "PlanRequest": "dlrover.autoscale.planner",
    "PlanResult": "dlrover.autoscale.planner",
    "PlanStatus": "dlrover.autoscale.planner",
    "JobShape": "dlrover.autoscale.planner",
    "ResourcePlanner": "dlrover.autoscale.planner",
    "predicted_throughput": "dlrover.autoscale.planner",
    "OomConfig": "dlrover.autoscale.heuristics",
    "OomEvent": "dlrover.autoscale.heuristics",
    "plan_oom_relaunch": "dlrover.autoscale.heuristics",
    "HotPsConfig": "dlrover.autoscale.heuristics",
    "PsCpuSeries": "dlrover.autoscale.heuristics",
    "plan_hot_ps": "dlrover.autoscale.heuristics",
    "StragglerConfig": "dlrover.autoscale.heuristics",
    "WorkerSpeedSeries": "dlrover.autoscale.heuristics",
    "plan_stragglers": "dlrover.autoscale.heuristics",
    "PendingConfig": "dlrover.autoscale.heuristics",
    "PendingNode": "dlrover.autoscale.heuristics",
    "plan_pending": "dlrover.autoscale.heuristics",
    "ElasticConfig": "dlrover.autoscale.heuristics",
    "plan_toward_target": "dlrover.autoscale.heuristics",
    "SCHEMA_VERSION": "dlrover.autoscale.profile_store",
    "JobFeatures": "dlrover.autoscale.profile_store",
    "JobOutcome": "dlrover.autoscale.profile_store",
    "JobProfile": "dlrover.autoscale.profile_store",
    "JobProfileStore": "dlrover.autoscale.profile_store",
    "InitialPlanConfig": "dlrover.autoscale.profile_store",
    "InitialPlan": "dlrover.autoscale.profile_store",
    "initial_plan": "dlrover.autoscale.profile_store",
    "is_corruption": "dlrover.autoscale.profile_store",
    "JobSignature": "dlrover.autoscale.run_profiles",
    "RunProfile": "dlrover.autoscale.run_profiles",
    "RoleProfile": "dlrover.autoscale.run_profiles",
    "PsPlanConfig": "dlrover.autoscale.ps_plan",
    "PsRunPlan": "dlrover.autoscale.ps_plan",
    "plan_ps_from_runs": "dlrover.autoscale.ps_plan",
    "RunPlanConfig": "dlrover.autoscale.run_profiles",
    "RunPlan": "dlrover.autoscale.run_profiles",
    "OpenedStore": "dlrover.autoscale.run_profiles",
    "add_run": "dlrover.autoscale.run_profiles",
    "read_runs": "dlrover.autoscale.run_profiles",
    "most_similar": "dlrover.autoscale.run_profiles",
    "plan_from_runs": "dlrover.autoscale.run_profiles",
    "open_or_set_aside": "dlrover.autoscale.run_profiles",
}

__all__ = [
    # errors
    "AutoscaleError",
    "InvalidMetricError",
    "InsufficientSamplesError",
    "ProfileStoreError",
    "CorruptProfileStoreError",
    "NewerProfileStoreError",
    # resources and plans
    "Role",
    "Resources",
    "parse_memory_mb",
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
    "is_corruption",
    # run profiles (what a master records at job end, and plans from)
    "JobSignature",
    "RunProfile",
    "RoleProfile",
    "PsPlanConfig",
    "PsRunPlan",
    "plan_ps_from_runs",
    "RunPlanConfig",
    "RunPlan",
    "OpenedStore",
    "add_run",
    "read_runs",
    "most_similar",
    "plan_from_runs",
    "open_or_set_aside",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
