"""Stateful properties: the profile store against a list, and elastic steps against their invariants."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dlrover.autoscale import (
    ElasticConfig,
    JobFeatures,
    JobOutcome,
    JobProfileStore,
    NodeState,
    Resources,
    Role,
    plan_toward_target,
)

FRAMEWORKS = ["pytorch", "tensorflow"]


class ProfileStoreMachine(RuleBasedStateMachine):
    """Adds past jobs and queries the nearest; the model is a plain list sorted by the documented order."""

    def __init__(self) -> None:
        super().__init__()
        self.store = JobProfileStore(":memory:")
        self.model: list[tuple[str, JobFeatures, JobOutcome, float, int]] = []
        self.clock = 0.0

    @rule(
        framework=st.sampled_from(FRAMEWORKS),
        model_exp=st.integers(6, 12),
        data_exp=st.integers(4, 9),
        workers=st.integers(1, 64),
        finished_later=st.booleans(),
    )
    def add(self, framework: str, model_exp: int, data_exp: int, workers: int, finished_later: bool) -> None:
        if finished_later:
            self.clock += 1.0
        features = JobFeatures(framework, 10.0**model_exp, 10.0**data_exp)
        outcome = JobOutcome(workers=workers, worker=Resources(4, 8192))
        name = f"job-{len(self.model)}"
        pid = self.store.add(name, features, outcome, finished_at=self.clock)
        self.model.append((name, features, outcome, self.clock, pid))

    @precondition(lambda self: bool(self.model))
    @rule(
        framework=st.sampled_from(FRAMEWORKS),
        model_exp=st.integers(6, 12),
        data_exp=st.integers(4, 9),
        k=st.integers(1, 5),
    )
    def nearest(self, framework: str, model_exp: int, data_exp: int, k: int) -> None:
        query = JobFeatures(framework, 10.0**model_exp, 10.0**data_exp)
        got = [(round(d, 9), p.job_name) for d, p in self.store.nearest(query, k)]
        mine = [m for m in self.model if m[1].framework == framework]
        mine.sort(key=lambda m: (query.distance(m[1]), -m[3], -m[4]))
        want = [(round(query.distance(m[1]), 9), m[0]) for m in mine[:k]]
        assert got == want

    @invariant()
    def everything_stored_is_read_back(self) -> None:
        for fw in FRAMEWORKS:
            stored = [(p.job_name, p.features, p.outcome) for p in self.store.profiles(fw)]
            assert stored == [(m[0], m[1], m[2]) for m in self.model if m[1].framework == fw]

    def teardown(self) -> None:
        self.store.close()


ProfileStoreMachine.TestCase.settings = settings(stateful_step_count=15)
TestProfileStore = ProfileStoreMachine.TestCase


@given(
    target_units=st.integers(1, 10),
    unit=st.integers(1, 4),
    min_workers=st.integers(1, 8),
    start=st.integers(0, 40),
    steps=st.lists(st.tuples(st.integers(0, 10), st.integers(0, 12)), min_size=1, max_size=12),
)
def test_elastic_steps_keep_node_unit_and_never_pass_the_target(
    target_units: int, unit: int, min_workers: int, start: int, steps: list[tuple[int, int]]
) -> None:
    """Each step: some workers are preempted, the cluster has some room, the heuristic acts."""
    target = target_units * unit
    min_workers = min(min_workers, target)
    config = ElasticConfig(max_launch_per_plan=6)
    alive = [NodeState(i, Role.WORKER, Resources(4, 8192)) for i in range(start)]
    next_id = start
    aligned_target = target // unit * unit
    for wanted_preempt, room in steps:
        preempt = min(wanted_preempt, len(alive))
        alive = alive[: len(alive) - preempt]
        before = len(alive)
        plan = plan_toward_target(
            target_workers=target,
            worker_resources=Resources(4, 8192),
            alive=alive,
            preempted=preempt,
            free_slots=room,
            min_workers=min_workers,
            node_unit=unit,
            config=config,
        )
        assert plan.reason
        launched = plan.launched(Role.WORKER)
        assert launched <= min(room, config.max_launch_per_plan)
        assert not (launched and plan.remove)
        removed = set(plan.remove)
        assert removed <= {n.node_id for n in alive}
        # The newest go first: no kept worker is newer than a removed one.
        kept = [n.node_id for n in alive if n.node_id not in removed]
        if removed and kept:
            assert max(kept) < min(removed)
        alive = [n for n in alive if n.node_id not in removed]
        alive += [NodeState(next_id + i, Role.WORKER, Resources(4, 8192)) for i in range(launched)]
        next_id += launched
        after = len(alive)
        if after > before:
            assert after % unit == 0
            assert after <= aligned_target
        elif after < before:
            assert after % unit == 0
            if before > aligned_target:
                assert after == aligned_target  # shrinking to the plan
            else:
                assert after == before // unit * unit  # shrinking to align after preemption
                assert after >= min_workers
