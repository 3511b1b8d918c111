"""Hot parameter servers: more CPU while the per-node limit allows, otherwise one more PS to split the load."""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from dlrover.autoscale._validate import at_least_one, fraction, positive_int, positive_number
from dlrover.autoscale.heuristics._series import as_series, validate_series, window
from dlrover.autoscale.plan import LaunchRequest, NodeState, ResizeRequest, ScalePlan
from dlrover.autoscale.resources import Role
from dlrover.common import ConfigError

__all__ = ["HotPsConfig", "PsCpuSeries", "plan_hot_ps"]


@attrs.frozen
class HotPsConfig:
    """When a parameter server counts as hot and what is done about it.

    Args:
        hot_cpu_ratio: CPU used / CPU requested at or above which a PS is hot.
        hot_duration_s: it must stay hot this long.
        cpu_growth_factor: a hot PS's CPU request is multiplied by this...
        cpu_step: ...rounded up to a multiple of this many cores...
        max_node_cpu: ...up to this per-node limit; beyond it the load is split across one more PS.
        max_ps: the most parameter servers the job may have.
    """

    hot_cpu_ratio: float = attrs.field(default=0.9, validator=fraction)
    hot_duration_s: float = attrs.field(default=300.0, validator=positive_number)
    cpu_growth_factor: float = attrs.field(default=1.5, validator=at_least_one)
    cpu_step: float = attrs.field(default=1.0, validator=positive_number)
    max_node_cpu: float = attrs.field(default=32.0, validator=positive_number)
    max_ps: int = attrs.field(default=16, validator=positive_int)


@attrs.frozen
class PsCpuSeries:
    """CPU a parameter server used over time.

    Args:
        node: the PS.
        samples: (time_s, cpu cores used) pairs, any order.

    Raises:
        ConfigError: if `node` is not a PS.
        InvalidMetricError: if a sample is NaN or negative.
    """

    node: NodeState
    samples: tuple[tuple[float, float], ...] = attrs.field(converter=as_series)

    def __attrs_post_init__(self) -> None:
        if self.node.role != Role.PS:
            raise ConfigError(f"PsCpuSeries needs a PS node, got {self.node.role.value} {self.node.node_id}")
        object.__setattr__(self, "samples", validate_series(f"ps {self.node.node_id} cpu", self.samples))


def plan_hot_ps(now_s: float, series: Sequence[PsCpuSeries], ps_count: int, config: HotPsConfig) -> ScalePlan:
    """Give hot parameter servers more CPU, or split the load when they cannot grow.

    Args:
        now_s: the current time on the clock the samples use.
        series: every PS's CPU use.
        ps_count: how many PS the job has now.
        config: thresholds and limits.

    Returns:
        Resizes for hot PS that can grow, one new PS when some cannot, or an empty plan with the reason.
    """
    hot: list[tuple[NodeState, float]] = []
    for s in series:
        req = s.node.resources.cpu
        values = window(s.samples, now_s, config.hot_duration_s)
        if values is None or req <= 0:
            continue
        if min(values) >= config.hot_cpu_ratio * req:
            hot.append((s.node, min(values) / req))
    if not hot:
        return ScalePlan.empty(f"no PS used >= {config.hot_cpu_ratio:.0%} of its CPU for {config.hot_duration_s:g}s")
    resize = []
    stuck = []
    reasons = []
    for node, ratio in hot:
        r = node.resources
        grown = min(
            config.max_node_cpu, math.ceil(r.cpu * config.cpu_growth_factor / config.cpu_step) * config.cpu_step
        )
        if grown > r.cpu:
            resize.append(ResizeRequest(node.node_id, Role.PS, attrs.evolve(r, cpu=grown)))
            reasons.append(
                f"PS {node.node_id} hot ({ratio:.0%} of {r.cpu:g} CPU for {config.hot_duration_s:g}s) -> {grown:g} CPU"
            )
        else:
            stuck.append((node, ratio))
    launch = []
    if stuck:
        ids = ", ".join(str(n.node_id) for n, _ in stuck)
        if ps_count < config.max_ps:
            template = stuck[0][0].resources
            launch.append(LaunchRequest(Role.PS, 1, template))
            reasons.append(
                f"PS {ids} hot at the per-node limit max_node_cpu={config.max_node_cpu:g}: "
                "adding one PS to split the load"
            )
        else:
            reasons.append(
                f"PS {ids} hot at the per-node limit max_node_cpu={config.max_node_cpu:g} "
                f"and the job has max_ps={config.max_ps}: nothing more to do"
            )
    return ScalePlan(launch=launch, resize=resize, reason="; ".join(reasons))
