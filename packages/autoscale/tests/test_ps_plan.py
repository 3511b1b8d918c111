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
    # No checkpoint bytes: a server's whole 700 MiB peak is its share, 2100 MiB in all; 5 servers of 420 MiB x1.5
    assert plan.ps == 5
    assert plan.resources[Role.PS].memory_mb == 640
    assert "5 server(s) instead of the 3 it ran with" in plan.reason
    capped = plan_ps_from_runs([_ps_run()], JobSignature(script=SCRIPT), PsPlanConfig(max_task_memory_mb=768, max_ps=4))
    assert capped.ps == 4
    assert capped.resources[Role.PS].memory_mb == 768
    assert "cut to the 768 MiB a task may have (an OOM relaunch may follow)" in capped.reason


def test_tensorflows_own_memory_is_not_divided_only_the_models_state_is() -> None:
    # 900 MiB of checkpoint over 3 servers: 300 MiB each of their 700 MiB peak; 400 MiB is TensorFlow's own.
    run = _ps_run(state_bytes=900 * 1024 * 1024)
    plan = plan_ps_from_runs([run], JobSignature(script=SCRIPT), PsPlanConfig(max_task_memory_mb=768))
    # (400 + 900 / n) x 1.5 <= 768 first at n = 9: 750 -> 768
    assert (plan.ps, plan.resources[Role.PS].memory_mb) == (9, 768)
    assert "TensorFlow's 400 MiB and a 1/9 share of 900 MiB of state" in plan.reason
    fewer = plan_ps_from_runs([run], JobSignature(script=SCRIPT), PsPlanConfig(max_ps=2))
    # two servers hold the state three did: (400 + 450) x 1.5 = 1275 -> 1280 each
    assert (fewer.ps, fewer.resources[Role.PS].memory_mb) == (2, 1280)


def test_only_a_job_that_succeeded_sizes_the_next_and_no_role_asks_more_than_a_task_may_have() -> None:
    stopped = _ps_run(outcome="stopped", finished_at=200.0, profile_id=8,
                      roles=[RoleProfile(Role.PS, 1, None, 30.0), RoleProfile(Role.WORKER, 1, None, 30.0)])  # fmt: skip
    plan = plan_ps_from_runs([_ps_run(), stopped], JobSignature(script=SCRIPT), PsPlanConfig(max_task_memory_mb=1024))
    assert plan.profile is not None
    assert plan.profile.profile_id == 7, "the newer run was stopped, perhaps before it peaked"
    assert plan.resources[Role.WORKER].memory_mb == 1024
    assert "cut to the 1024 MiB a task may have from 2048 MiB" in plan.reason


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
    assert "no earlier parameter-server job that succeeded is similar" in plan.reason
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
    assert 1 <= plan.ps <= max_ps
    if cap is not None:
        assert memory <= cap
    if count <= max_ps and (cap is None or per_server <= cap):
        assert (plan.ps, memory) == (count, per_server), "it fits as it ran"
    elif not (cap is not None and plan.ps == max_ps and memory == cap):
        # more or fewer servers: together they hold what the profiled ones peaked at
        assert plan.ps * memory >= count * peak
