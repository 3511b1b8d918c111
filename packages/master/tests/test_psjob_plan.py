"""A PS job sized from the flags, or from the profile store when it gives none; and the profile it records."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import attrs
import pytest

from dlrover.autoscale import (
    JobProfileStore,
    JobSignature,
    Resources,
    Role,
    RoleProfile,
    RunProfile,
    add_run,
    read_runs,
)
from dlrover.common import ConfigError
from dlrover.master.eventlog import read_event_log
from dlrover.master.psjob import PsJobSpec
from dlrover.master.psjob.cli import _parser, build_config
from dlrover.master.psjob.cli import main as ps_job_main
from dlrover.master.psjob.plan import build_ps_profile, ps_signature
from dlrover.master.psjob.tf_checkpoint import sizes_of

pytestmark = pytest.mark.timeout(60)

CHECKPOINT = Path(__file__).parent / "data" / "tf_checkpoint" / "ps" / "ckpt-100"


def _store_with(tmp_path: Path, *runs: RunProfile) -> str:
    path = str(tmp_path / "profiles.sqlite")
    with JobProfileStore(path) as store:
        for run in runs:
            add_run(store, run)
    return path


def _earlier_job(script: str) -> RunProfile:
    return RunProfile(
        JobSignature(script=script),
        "succeeded",
        min_nodes=2,
        max_nodes=2,
        final_nodes=2,
        throughput=[(2, 500.0)],
        finished_at=1.0,
        roles=[
            RoleProfile(Role.CHIEF, 1, None, 300.0),
            RoleProfile(Role.PS, 3, Resources(cpu=1, memory_mb=512), 400.0),
            RoleProfile(Role.WORKER, 2, None, 250.0),
        ],
    )


def _args(tmp_path: Path, *flags: str) -> list[str]:
    return [*flags, "--work-dir", str(tmp_path / "job"), "--", "python", str(tmp_path / "train.py")]


def test_a_job_that_gives_no_size_starts_as_the_last_run_of_its_script_ended(tmp_path: Path) -> None:
    store = _store_with(tmp_path, _earlier_job(str(tmp_path / "train.py")), _earlier_job("/other/train.py"))
    config = build_config(_parser().parse_args(_args(tmp_path, "--profile-store", store)), wall_time=10.0)
    spec = config.spec
    assert (spec.ps, spec.workers, spec.min_workers, spec.evaluator) == (3, 2, 2, False)
    assert spec.resources[Role.PS] == Resources(cpu=1, memory_mb=640)  # peak 400 MiB x1.5 -> 640
    assert spec.resources[Role.CHIEF].memory_mb == 512  # 300 x1.5 = 450, rounded up to 64 MiB steps
    assert config.initial_plan is not None
    assert config.initial_plan.source == "profile"
    assert config.initial_plan.profile_id == 1
    assert config.profile_store == store


def test_any_size_flag_means_no_profile_is_consulted(tmp_path: Path) -> None:
    store = _store_with(tmp_path, _earlier_job(str(tmp_path / "train.py")))
    config = build_config(_parser().parse_args(_args(tmp_path, "--profile-store", store, "--worker-memory", "1Gi")))
    assert (config.spec.ps, config.spec.workers) == (1, 1)
    assert config.initial_plan is not None
    assert config.initial_plan.source == "flags"
    assert "--worker-cpu/memory" in config.initial_plan.reason


def test_without_a_store_or_a_similar_job_the_defaults(tmp_path: Path) -> None:
    none = build_config(_parser().parse_args(_args(tmp_path, "--profile-store", "none")))
    assert none.initial_plan is not None
    assert (none.initial_plan.source, none.spec.ps, none.spec.workers, none.profile_store) == ("defaults", 1, 1, None)
    assert "no profile store is used" in none.initial_plan.reason
    store = _store_with(tmp_path, _earlier_job("/other/train.py"))
    other = build_config(_parser().parse_args(_args(tmp_path, "--profile-store", store)))
    assert other.initial_plan is not None
    assert other.initial_plan.source == "defaults"


def test_a_corrupt_store_is_set_aside_and_the_job_starts_from_the_defaults(tmp_path: Path) -> None:
    store = tmp_path / "profiles.sqlite"
    store.write_bytes(b"not a database" * 100)
    config = build_config(_parser().parse_args(_args(tmp_path, "--profile-store", str(store))), wall_time=5.0)
    assert config.initial_plan is not None
    assert config.initial_plan.source == "defaults"
    assert "set aside" in config.initial_plan.store_notice
    assert any(".corrupt" in name for name in os.listdir(tmp_path))


def test_the_state_ratio_needs_a_server_memory_to_weigh_against(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--ps-state-ratio needs --ps-memory"):
        build_config(_parser().parse_args(_args(tmp_path, "--profile-store", "none", "--ps-state-ratio", "0.5")))
    config = build_config(_parser().parse_args(_args(tmp_path, "--ps-memory", "1Gi", "--ps-state-ratio", "0.5")))
    assert config.ps_state_ratio == 0.5


def test_the_profile_of_a_finished_job_names_every_role_and_the_models_size(tmp_path: Path) -> None:
    spec = PsJobSpec(ps=3, workers=2, min_workers=1, resources={Role.PS: Resources(cpu=1, memory_mb=512)})
    profile = build_ps_profile(
        ps_signature("ps-job", ["python", "/w/train.py"]),
        spec,
        outcome="succeeded",
        exit_reason="chief:0 exited 0",
        launched={Role.PS: [Resources(cpu=1, memory_mb=512), Resources(cpu=1, memory_mb=768)]},
        peak_memory_mb={Role.PS: 700.0, Role.WORKER: 200.0, Role.CHIEF: None},
        workers_at_end=2,
        throughput={1: 100.0, 2: 180.0},
        checkpoint=sizes_of(CHECKPOINT),
        checkpoint_note="from the test",
        wall_time=9.0,
    )
    assert profile.signature == JobSignature(script="/w/train.py"), "the default job name is no name"
    assert [r.role for r in profile.roles] == [Role.CHIEF, Role.PS, Role.WORKER]
    assert profile.role(Role.PS) == RoleProfile(Role.PS, 3, Resources(cpu=1, memory_mb=768), 700.0)
    assert profile.role(Role.CHIEF) == RoleProfile(Role.CHIEF, 1, None, None)
    assert profile.parameter_count == 1351
    assert profile.checkpoint_bytes == 12517
    assert (profile.min_nodes, profile.max_nodes, profile.final_nodes) == (1, 2, 2)
    with JobProfileStore(str(tmp_path / "p.sqlite")) as store:
        add_run(store, profile)
        (stored,), _ = read_runs(store)
    assert stored.roles == profile.roles


def test_the_evaluator_follows_the_plan_unless_a_flag_says(tmp_path: Path) -> None:
    with_evaluator = _earlier_job(str(tmp_path / "train.py"))
    with_evaluator = attrs.evolve(with_evaluator, roles=[*with_evaluator.roles, RoleProfile(Role.EVALUATOR, 1)])
    store = _store_with(tmp_path, with_evaluator)
    assert build_config(_parser().parse_args(_args(tmp_path, "--profile-store", store))).spec.evaluator
    told = build_config(_parser().parse_args(_args(tmp_path, "--profile-store", store, "--no-evaluator")))
    assert not told.spec.evaluator
    assert told.initial_plan is not None
    assert told.initial_plan.source == "profile", "an evaluator flag does not size the job"


@pytest.mark.integration  # runs the job: real task processes
def test_a_planned_size_no_node_here_could_give_falls_back_to_the_defaults(tmp_path: Path) -> None:
    program = tmp_path / "ends.py"
    program.write_text("")
    huge = attrs.evolve(
        _earlier_job(str(program)), roles=[RoleProfile(Role.CHIEF, 1, Resources(cpu=0, memory_mb=1 << 30))]
    )
    store = _store_with(tmp_path, huge)
    work = tmp_path / "job"
    argv = ["--profile-store", store, "--work-dir", str(work), "--", sys.executable, str(program)]
    # The chief's program ends at once; the servers fail here (no TensorFlow in this venv), so whichever the
    # master sees first ends the job: what is checked is how it was sized.
    assert ps_job_main(argv) in (0, 1)
    plan = next(e for e in read_event_log(work / "events.jsonl") if e["kind"] == "initial_plan")
    assert plan["data"]["source"] == "defaults"
    assert "the planned size cannot be used (chief resources" in plan["message"]
    assert plan["data"]["resources"] == {}
