"""The planner on hand-built cases: binding constraints, infeasible quotas, plans relative to current nodes."""

from __future__ import annotations

import math

import attrs
import pytest

from dlrover.autoscale import (
    ClusterQuota,
    MachineShape,
    NodeState,
    PlannerConfig,
    PlanRequest,
    PlanStatus,
    PsOption,
    ResourcePlanner,
    Resources,
    Role,
    ThroughputModel,
    WorkerOption,
)
from dlrover.common import ConfigError

PEAKY = ThroughputModel(a=0.001, b=0.1, c=0.0002)  # peaks near 22 workers at about 100.5
LINEAR = ThroughputModel(a=0.0, b=0.1, c=0.0)  # 10 per worker, forever
W4 = WorkerOption(Resources(cpu=4, memory_mb=8192))
BIG = ClusterQuota(cpu=10_000, memory_mb=10**8, gpu=100, max_nodes=10_000)


def _plan(**kwargs: object) -> object:
    defaults: dict[str, object] = {"model": LINEAR, "quota": BIG, "worker_options": (W4,)}
    defaults.update(kwargs)
    return ResourcePlanner().plan(PlanRequest(**defaults))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "workers", "binding"),
    [
        ({"quota": ClusterQuota(cpu=64, memory_mb=10**7)}, 16, "cpu"),
        ({"quota": ClusterQuota(cpu=640, memory_mb=65536)}, 8, "memory_mb"),
        ({"quota": ClusterQuota(cpu=640, memory_mb=10**7, max_nodes=7)}, 7, "max_nodes"),
        ({"quota": ClusterQuota(cpu=640, memory_mb=10**7, max_nodes=7), "node_unit": 3}, 6, "max_nodes"),
        ({"max_workers": 10}, 10, "max_workers"),
        ({"model": PEAKY}, 22, "throughput_peak"),
        ({"model": PEAKY, "node_unit": 4}, 24, "throughput_peak"),
        (
            {
                "worker_options": (WorkerOption(Resources(cpu=1, memory_mb=1024, gpu=1)),),
                "quota": ClusterQuota(cpu=100, memory_mb=10**6, gpu=5),
            },
            5,
            "gpu",
        ),
    ],
)
def test_binding_constraint_is_named(kwargs: dict[str, object], workers: int, binding: str) -> None:
    result = _plan(**kwargs)
    assert result.status == PlanStatus.OPTIMAL  # type: ignore[attr-defined]
    assert result.shape.workers == workers  # type: ignore[attr-defined]
    assert binding in result.binding  # type: ignore[attr-defined]
    assert f"binding: {', '.join(result.binding)}" in result.reason  # type: ignore[attr-defined]


def test_mixed_machine_shapes_pack_one_role_per_machine() -> None:
    quota = ClusterQuota.from_machines(
        [MachineShape("big", Resources(16, 65536), 3), MachineShape("small", Resources(8, 16384), 5)]
    )
    result = _plan(
        quota=quota,
        ps_options=(PsOption(Resources(4, 4096), capacity=1000.0),),
        max_ps=2,
    )
    assert result.status == PlanStatus.OPTIMAL
    # 3 big machines hold 12 workers, 5 small ones 10; one PS needs one small machine -> 12 + 8 workers.
    assert result.shape.workers == 20
    assert result.shape.ps == 1
    assert sorted(result.shape.placement) == sorted(
        [("big", Role.WORKER, 12), ("small", Role.WORKER, 8), ("small", Role.PS, 1)]
    )
    assert "machines" in result.binding


def test_ps_capacity_binds_and_the_cheapest_plan_at_the_optimum_is_kept() -> None:
    result = _plan(ps_options=(PsOption(Resources(4, 4096), capacity=30.0),), max_ps=2)
    assert result.status == PlanStatus.OPTIMAL
    assert result.predicted_throughput == pytest.approx(60.0)
    # 6 workers already give 60; more would cost without adding throughput.
    assert result.shape.workers == 6
    assert result.binding[:2] == ("ps_capacity", "max_ps")


def test_target_throughput_at_least_cost_picks_the_cheaper_size() -> None:
    fast = WorkerOption(Resources(cpu=8, memory_mb=8192), efficiency=1.0)
    lean = WorkerOption(Resources(cpu=2, memory_mb=8192), efficiency=0.5)
    result = _plan(worker_options=(fast, lean), target_throughput=100.0)
    assert result.status == PlanStatus.OPTIMAL
    # fast: 10 workers x (8 cpu + 8 GiB) = 100 cost units; lean: 20 x (2 cpu + 8 GiB) = 80.
    assert result.shape.worker == lean
    assert result.shape.workers == 20
    assert result.predicted_throughput >= 100.0
    assert "throttled to 50% speed" in result.reason


def test_plan_is_relative_to_current_nodes() -> None:
    current = [NodeState(i, Role.WORKER, Resources(4, 8192)) for i in range(5)]
    current.append(NodeState(7, Role.WORKER, Resources(2, 8192)))
    result = _plan(current=tuple(current), max_workers=4)
    plan = result.plan
    assert plan.remove == (4, 7)  # the newest go first
    assert plan.launch == ()
    assert plan.resize == ()
    grow = _plan(current=tuple(current), max_workers=8)
    assert grow.plan.launched(Role.WORKER) == 2
    assert [r.node_id for r in grow.plan.resize] == [7]  # the odd-sized worker is relaunched at the planned size


@pytest.mark.parametrize(
    ("kwargs", "binding", "words"),
    [
        ({"quota": ClusterQuota(cpu=2, memory_mb=10**6)}, "cpu", "cpu quota 2 is smaller"),
        ({"quota": ClusterQuota(cpu=64, memory_mb=4096)}, "memory_mb", "memory_mb quota 4096"),
        ({"quota": ClusterQuota(cpu=64, memory_mb=10**6, max_nodes=0)}, "max_nodes", "max_nodes=0"),
        (
            {"worker_options": (WorkerOption(Resources(1, 1024, gpu=2)),), "quota": ClusterQuota(64, 10**6, gpu=1)},
            "gpu",
            "gpu quota 1",
        ),
        (
            {"quota": ClusterQuota(cpu=64, memory_mb=10**6, max_node=Resources(2, 65536))},
            "max_node",
            "exceeds the per-node limit (cpu 4 > 2)",
        ),
        (
            {"quota": ClusterQuota.from_machines([MachineShape("tiny", Resources(2, 65536), 10)])},
            "max_node",
            "fits on no machine shape",
        ),
        ({"min_workers": 3, "max_workers": 3, "node_unit": 2}, "node_unit", "no multiple of node_unit=2"),
        ({"model": PEAKY, "target_throughput": 150.0}, "throughput_peak", "exceeds the model's peak"),
        (
            {"ps_options": (PsOption(Resources(4, 4096), capacity=10.0),), "max_ps": 2, "target_throughput": 50.0},
            "max_ps",
            "needs at least 5 parameter servers",
        ),
        (
            {
                "min_workers": 2,
                "quota": ClusterQuota(
                    cpu=100,
                    memory_mb=10**6,
                    machines=[MachineShape("a", Resources(4, 65536), 1), MachineShape("b", Resources(2, 65536), 8)],
                ),
            },
            "machines",
            "does not pack",
        ),
        (
            {"quota": ClusterQuota(cpu=40, memory_mb=10**6), "target_throughput": 150.0},
            "target_throughput",
            "the most it allows is 100",
        ),
    ],
)
def test_infeasible_requests_say_why_and_never_raise(kwargs: dict[str, object], binding: str, words: str) -> None:
    result = _plan(**kwargs)
    assert result.status == PlanStatus.INFEASIBLE
    assert not result.ok
    assert binding in result.binding, result
    assert words in result.reason, result.reason
    assert result.plan.is_empty
    assert words in result.plan.reason


def test_candidate_cap_is_reported() -> None:
    result = ResourcePlanner(PlannerConfig(max_worker_candidates=5)).plan(
        PlanRequest(model=LINEAR, quota=BIG, worker_options=(W4,))
    )
    assert result.shape.workers == 5
    assert "max_worker_candidates" in result.binding


def test_extrapolation_beyond_observed_counts_is_said() -> None:
    model = ThroughputModel(a=0.0, b=0.1, c=0.0, max_observed_workers=4)
    result = _plan(model=model, max_workers=8)
    assert "extrapolated beyond the largest observed worker count 4" in result.reason


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"worker_options": ()}, "worker_options must hold at least one"),
        ({"worker_options": (W4, W4)}, "repeat an option"),
        ({"min_ps": 2, "max_ps": 1}, "min_ps=2, max_ps=1"),
        ({"max_ps": 1}, "ps_options is empty"),
        ({"target_throughput": math.nan}, "target_throughput must be a finite number > 0, got nan"),
        ({"target_throughput": -1.0}, "got -1.0"),
        ({"max_workers": 0}, "max_workers must be >= 1"),
        ({"node_unit": 0}, "node_unit must be >= 1"),
    ],
)
def test_bad_requests_are_config_errors(kwargs: dict[str, object], match: str) -> None:
    defaults: dict[str, object] = {"model": LINEAR, "quota": BIG, "worker_options": (W4,)}
    defaults.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        PlanRequest(**defaults)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"time_limit_s": 0}, "time_limit_s must be > 0"),
        ({"time_limit_s": math.inf}, "finite"),
        ({"num_search_workers": 0}, "num_search_workers must be >= 1"),
        ({"cost_per_cpu": -1.0}, "cost_per_cpu must be >= 0"),
        ({"linearization_level": 3}, "linearization_level must be 0, 1 or 2, got 3"),
    ],
)
def test_planner_config_is_validated(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        PlannerConfig(**kwargs)  # type: ignore[arg-type]


def test_solver_time_limit_is_passed_and_a_tiny_one_never_raises() -> None:
    quota = ClusterQuota.from_machines(
        [MachineShape(f"s{i}", Resources(8 + 8 * i, 32768 * (1 + i % 3), gpu=i % 2), 100) for i in range(6)]
    )
    req = PlanRequest(
        model=PEAKY,
        quota=quota,
        worker_options=(W4, WorkerOption(Resources(2, 4096), 0.6)),
        ps_options=(PsOption(Resources(4, 4096), 20.0), PsOption(Resources(8, 4096), 40.0)),
        max_ps=8,
    )
    result = ResourcePlanner(PlannerConfig(time_limit_s=1e-6)).plan(req)
    assert result.status in (PlanStatus.UNKNOWN, PlanStatus.FEASIBLE, PlanStatus.OPTIMAL)
    if result.status == PlanStatus.UNKNOWN:
        assert "time_limit_s=1e-06" in result.reason
        assert result.plan.is_empty


def test_same_request_same_plan() -> None:
    """One search worker (the default) makes plans reproducible: the master can re-plan without churn."""
    quota = ClusterQuota.from_machines(
        [MachineShape("big", Resources(16, 65536), 7), MachineShape("small", Resources(8, 16384), 9)]
    )
    req = PlanRequest(
        model=PEAKY,
        quota=quota,
        worker_options=(W4, WorkerOption(Resources(2, 8192), 0.6)),
        ps_options=(PsOption(Resources(4, 4096), 40.0), PsOption(Resources(8, 8192), 80.0)),
        max_ps=4,
    )
    first = ResourcePlanner().plan(req)
    second = ResourcePlanner().plan(req)
    assert first.status == PlanStatus.OPTIMAL
    assert attrs.evolve(first, solver_wall_time_s=0.0) == attrs.evolve(second, solver_wall_time_s=0.0)
