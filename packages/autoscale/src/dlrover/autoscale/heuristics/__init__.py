"""Runtime heuristics: pure functions from (now, observations, config) to a `ScalePlan` with its reason."""

from dlrover.autoscale.heuristics.elastic import ElasticConfig, plan_toward_target
from dlrover.autoscale.heuristics.hot_ps import HotPsConfig, PsCpuSeries, plan_hot_ps
from dlrover.autoscale.heuristics.oom import OomConfig, OomEvent, plan_oom_relaunch
from dlrover.autoscale.heuristics.pending import PendingConfig, PendingNode, plan_pending
from dlrover.autoscale.heuristics.straggler import StragglerConfig, WorkerSpeedSeries, plan_stragglers

__all__ = [
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
]
