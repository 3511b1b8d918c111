"""A parameter-server job's profile (its roles) and the plan of the next such job that asks for nothing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover.autoscale import (
    JobProfileStore,
    JobSignature,
    PsPlanConfig,
    Resources,
    Role,
    RoleProfile,
    RunPlanConfig,
    RunProfile,
    add_run,
    plan_from_runs,
    plan_ps_from_runs,
    read_runs,
)
from dlrover.common import ConfigError

pytestmark = pytest.mark.timeout(60)

SCRIPT = "/jobs/recommender/train.py"


def _ps_run(**overrides: object) -> RunProfile:
    fields: dict[str, object] = {
        "signature": JobSignature(script=SCRIPT),
        "outcome": "succeeded",
        "min_nodes": 1,
        "max_nodes": 3,
        "final_nodes": 3,
        "throughput": [(2, 900.0), (3, 1200.0)],
        "profile_id": 7,
        "finished_at": 100.0,
        "roles": [
            RoleProfile(Role.CHIEF, 1, None, 410.0),
            RoleProfile(Role.PS, 3, Resources(cpu=2, memory_mb=1024), 700.0),
            RoleProfile(Role.WORKER, 3, Resources(cpu=4, memory_mb=2048), 900.0),
        ],
    }
    fields.update(overrides)
    return RunProfile(**fields)  # type: ignore[arg-type]


def test_a_ps_profile_round_trips_through_a_real_store_with_its_roles(tmp_path: Path) -> None:
    run = _ps_run(profile_id=None)
    with JobProfileStore(str(tmp_path / "p.sqlite")) as store:
        pid = add_run(store, run)
        (stored,), bad = read_runs(store)
    assert bad == []
    assert stored.profile_id == pid
    assert stored.roles == run.roles
    assert stored.role(Role.PS) == RoleProfile(Role.PS, 3, Resources(cpu=2, memory_mb=1024), 700.0)
    assert stored.role(Role.EVALUATOR) is None


def test_the_next_job_starts_as_this_one_ended_memory_from_its_peaks() -> None:
    plan = plan_ps_from_runs([_ps_run()], JobSignature(script=SCRIPT), PsPlanConfig(memory_headroom=1.5))
    assert plan.source == "profile"
    assert (plan.ps, plan.workers, plan.min_workers, plan.evaluator) == (3, 3, 1, False)
    # ps: peak 700 x 1.5 = 1050 -> 1088 (64 MiB steps) beats the 1024 it was launched with; its CPU is kept
    assert plan.resources[Role.PS] == Resources(cpu=2, memory_mb=1088)
    # worker: peak 900 x 1.5 = 1350 -> 1408 < 2048 launched: what it ran with stays
    assert plan.resources[Role.WORKER] == Resources(cpu=4, memory_mb=2048)
    # chief: launched with nothing, peaked at 410 MiB: now asks 640 MiB (410 x 1.5 = 615 -> 640) and no CPU
    assert plan.resources[Role.CHIEF] == Resources(cpu=0, memory_mb=640)
    assert "from profile 7" in plan.reason
    assert "ps 2cpu/1088MiB (peak 700 MiB x1.5)" in plan.reason
    assert "1.2e+03 samples/s" in plan.reason


def test_servers_that_would_need_more_than_a_task_may_have_spread_the_model_over_more() -> None:
    config = PsPlanConfig(memory_headroom=1.5, max_task_memory_mb=768)
    plan = plan_ps_from_runs([_ps_run()], JobSignature(script=SCRIPT), config)
    # 3 servers x 1088 MiB = 3264 MiB of model and runtime: 5 servers of at most 768 MiB (3264 / 5 -> 704)
    assert plan.ps == 5
    assert plan.resources[Role.PS].memory_mb == 704
    assert "spread over 5 server(s) of 704 MiB" in plan.reason
    capped = plan_ps_from_runs([_ps_run()], JobSignature(script=SCRIPT), PsPlanConfig(max_task_memory_mb=768, max_ps=4))
    assert capped.ps == 4
    assert capped.resources[Role.PS].memory_mb == 768
    assert "max_ps 4 caps it" in capped.reason


def test_fewer_workers_when_the_plan_allows_fewer_and_an_evaluator_when_it_had_one() -> None:
    run = _ps_run(roles=[*_ps_run().roles, RoleProfile(Role.EVALUATOR, 1, None, None)])
    plan = plan_ps_from_runs([run], JobSignature(script=SCRIPT), PsPlanConfig(max_workers=2))
    assert (plan.workers, plan.min_workers, plan.evaluator) == (2, 1, True)
    assert Role.EVALUATOR not in plan.resources, "nothing measured, nothing asked"


def test_without_a_similar_ps_profile_the_defaults_and_kinds_of_jobs_never_mix() -> None:
    worker_job = RunProfile(JobSignature(script=SCRIPT), "succeeded", min_nodes=1, max_nodes=4, final_nodes=4)
    plan = plan_ps_from_runs([worker_job], JobSignature(script=SCRIPT), PsPlanConfig(default_ps=2, default_workers=3))
    assert plan.source == "defaults"
    assert (plan.ps, plan.workers, plan.min_workers, dict(plan.resources)) == (2, 3, 3, {})
    assert "no earlier parameter-server job is similar" in plan.reason
    torch_plan = plan_from_runs([_ps_run()], JobSignature(script=SCRIPT), RunPlanConfig())
    assert torch_plan.source == "defaults", "a PS job's profile never sizes a job without roles"


def test_bad_role_profiles_and_plan_limits_are_refused_naming_the_value() -> None:
    with pytest.raises(ConfigError, match="peak_memory_mb"):
        RoleProfile(Role.PS, 1, None, float("nan"))
    with pytest.raises(ValueError, match="'gpu-server'"):
        RoleProfile("gpu-server", 1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="profiled twice"):
        _ps_run(roles=[RoleProfile(Role.PS, 1), RoleProfile(Role.PS, 2)])
    with pytest.raises(ConfigError, match="memory_headroom must be >= 1"):
        PsPlanConfig(memory_headroom=0.9)
    with pytest.raises(ConfigError, match="max_task_memory_mb"):
        PsPlanConfig(max_task_memory_mb=0)
    with pytest.raises(ConfigError, match="a role profile lacks"):
        RunProfile.from_json('{"outcome": "x", "node_resources": null, "min_nodes": 1, "max_nodes": 1, '
                             '"node_unit": 1, "final_nodes": 1, "throughput": [], "peak_memory_mb": [], '
                             '"roles": [{"role": "ps"}]}', JobSignature(), 0.0)  # fmt: skip


@given(
    count=st.integers(1, 64),
    peak=st.floats(1, 1e6, allow_nan=False),
    launched=st.integers(0, 1_000_000),
    cap=st.none() | st.integers(64, 1_000_000),
    max_ps=st.integers(1, 64),
)
def test_a_planned_server_never_asks_less_than_its_peak_nor_more_than_the_cap(
    count: int, peak: float, launched: int, cap: int | None, max_ps: int
) -> None:
    run = _ps_run(roles=[RoleProfile(Role.PS, count, Resources(cpu=1, memory_mb=launched), peak)])
    config = PsPlanConfig(max_task_memory_mb=cap, max_ps=max_ps)
    plan = plan_ps_from_runs([run], JobSignature(script=SCRIPT), config)
    memory = plan.resources[Role.PS].memory_mb
    per_server = max(launched, math.ceil(peak * config.memory_headroom / 64) * 64)
    servers = min(count, max_ps)
    assert 1 <= plan.ps <= max_ps
    if cap is None or per_server <= cap:
        assert (plan.ps, memory) == (servers, per_server)
    else:
        assert memory <= cap
        # more servers, each under the cap, together holding what the profiled ones needed (unless max_ps stops it)
        assert plan.ps == max_ps or plan.ps * memory >= servers * per_server
