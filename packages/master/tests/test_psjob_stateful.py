"""A state machine over PsJobCore: whatever tasks fail, succeed or are disrupted, in any order, each task has at
most one live node, the chief's incarnations never overlap, budgets hold, and nothing is launched after the end."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dlrover.autoscale import Role
from dlrover.master.psjob import PsDecision, PsJobCore, PsJobSpec, TaskKey
from dlrover.master.scheduler.base import ObservedNode, ObservedState

_ENDS = (ObservedState.FAILED, ObservedState.SUCCEEDED, ObservedState.STOPPED)


class PsJobMachine(RuleBasedStateMachine):
    """The backend is modelled as the set of nodes running: launches add, stops and ends remove."""

    @initialize(
        ps=st.integers(1, 3),
        workers=st.integers(1, 3),
        evaluator=st.booleans(),
        budget=st.integers(0, 3),
        data=st.data(),
    )
    def start(self, ps: int, workers: int, evaluator: bool, budget: int, data: st.DataObject) -> None:
        min_workers = data.draw(st.integers(1, workers))
        self.spec = PsJobSpec(ps=ps, workers=workers, min_workers=min_workers, evaluator=evaluator,
                              max_relaunches=budget)  # fmt: skip
        self.core = PsJobCore(self.spec)
        self.live: dict[int, TaskKey] = {}
        self.stopping: set[int] = set()
        self.ended: dict[int, ObservedNode] = {}
        self.seen_ids: set[int] = set()
        self.finished = False
        self._apply(self.core.start())

    def _apply(self, decision: PsDecision) -> None:
        if self.finished:
            assert decision == PsDecision(), "a decision after the end"
        for stop in decision.stops:
            assert stop.node_id in self.live or stop.node_id in self.ended
            if stop.node_id in self.live:
                self.stopping.add(stop.node_id)
        for launch in decision.launches:
            assert launch.node_id not in self.seen_ids, "a node id launched twice"
            self.seen_ids.add(launch.node_id)
            others = [n for n, key in self.live.items() if key == launch.task and n not in self.stopping]
            assert not others, f"{launch.task} launched while node {others} still runs for it"
            if launch.task.role is Role.CHIEF:
                old = [n for n, key in self.live.items() if key == launch.task]
                assert not old, "a new chief while the old one has not ended: both would serve its address"
            self.live[launch.node_id] = launch.task
        if decision.outcome is not None:
            self.finished = True
            not_stopped = set(self.live) - self.stopping - {n for n in self.live if self.ended.get(n)}
            assert not not_stopped, f"nodes left running at the end: {not_stopped}"

    def _end(self, node_id: int, state: ObservedState, **kw: object) -> None:
        seen = ObservedNode(node_id, state, **kw)  # type: ignore[arg-type]
        self.live.pop(node_id)
        self.stopping.discard(node_id)
        self.ended[node_id] = seen
        self._apply(self.core.observe({**self.ended, **{n: ObservedNode(n, ObservedState.RUNNING) for n in self.live}}))

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data(), state=st.sampled_from(_ENDS), disruption=st.booleans())
    def a_node_ends(self, data: st.DataObject, state: ObservedState, disruption: bool) -> None:
        node_id = data.draw(st.sampled_from(sorted(self.live)))
        code = 0 if state is ObservedState.SUCCEEDED else -9
        self._end(node_id, state, exit_code=code, disruption=disruption and state is ObservedState.FAILED)

    @precondition(lambda self: bool(self.stopping))
    @rule(data=st.data())
    def a_stopped_node_ends(self, data: st.DataObject) -> None:
        self._end(data.draw(st.sampled_from(sorted(self.stopping))), ObservedState.STOPPED)

    @rule()
    def a_look_with_nothing_new(self) -> None:
        self._apply(self.core.observe({**self.ended, **{n: ObservedNode(n, ObservedState.RUNNING) for n in self.live}}))

    @invariant()
    def budgets_hold(self) -> None:
        for key in self.spec.tasks():
            assert self.core.relaunches(key)[1] <= self.spec.max_relaunches

    @invariant()
    def at_most_one_node_per_task_outside_stops(self) -> None:
        per_task: dict[TaskKey, int] = {}
        for node_id, key in self.live.items():
            if node_id not in self.stopping:
                per_task[key] = per_task.get(key, 0) + 1
        assert all(n <= 1 for n in per_task.values()), per_task

    @invariant()
    def the_outcome_is_final(self) -> None:
        assert (self.core.outcome is not None) == self.finished


TestPsJobMachine = PsJobMachine.TestCase
TestPsJobMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
