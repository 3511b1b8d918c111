"""A state machine over PsJobCore: whatever tasks start, fail, succeed, hang at start or are disrupted, several at
once or one by one, with parameter servers added on the way, a task's new node starts only after its old one ended
(both would serve its address), node ids are never reused, budgets hold, a worker left out is out of the cluster
once the restart it causes is over, and once the job has ended nothing is launched and every node is being
stopped."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dlrover.master.psjob import PsDecision, PsJobCore, PsJobSpec, TaskKey, TaskPhase
from dlrover.master.scheduler.base import ObservedNode, ObservedState

_ENDS = (ObservedState.FAILED, ObservedState.SUCCEEDED, ObservedState.STOPPED)
_TIMEOUT = 100.0


class PsJobMachine(RuleBasedStateMachine):
    """The backend: every node launched is reported, pending until it starts, then running until it ends."""

    # Budgets of 0 and a min_workers of 1 are drawn often: they lead to workers left out and the restart without
    # them, the path with the most steps.
    @initialize(ps=st.integers(1, 3), workers=st.integers(1, 3), evaluator=st.booleans(),
                budget=st.sampled_from([0, 0, 1, 3]), data=st.data())  # fmt: skip
    def start(self, ps: int, workers: int, evaluator: bool, budget: int, data: st.DataObject) -> None:
        min_workers = data.draw(st.sampled_from([1, 1, workers]))
        self.spec = PsJobSpec(ps=ps, workers=workers, min_workers=min_workers, evaluator=evaluator,
                              max_relaunches=budget, task_start_timeout_s=_TIMEOUT)  # fmt: skip
        self.core = PsJobCore(self.spec)
        self.now = 0.0
        self.live: dict[int, tuple[TaskKey, ObservedState]] = {}
        self.stopping: set[int] = set()
        self.ended: dict[int, ObservedNode] = {}
        self.seen_ids: set[int] = set()
        self.finished = False
        self._apply(self.core.start(self.now))

    def _apply(self, decision: PsDecision) -> None:
        if self.finished:
            assert decision == PsDecision(), "a decision after the end"
        for stop in decision.stops:
            assert stop.node_id in self.live or stop.node_id in self.ended, "a stop for a node never launched"
            if stop.node_id in self.live:
                self.stopping.add(stop.node_id)
        for launch in decision.launches:
            assert launch.node_id not in self.seen_ids, "a node id launched twice"
            self.seen_ids.add(launch.node_id)
            old = [n for n, (key, _state) in self.live.items() if key == launch.task]
            assert not old, f"{launch.task} launched while its node(s) {old} have not ended"
            self.live[launch.node_id] = (launch.task, ObservedState.PENDING)
        if decision.outcome is not None:
            self.finished = True
            assert set(self.live) <= self.stopping, f"nodes left running at the end: {set(self.live) - self.stopping}"

    def _look(self) -> None:
        seen = {n: ObservedNode(n, state) for n, (_key, state) in self.live.items()}
        self._apply(self.core.observe({**self.ended, **seen}, self.now))

    def _end(self, node_id: int, state: ObservedState, disruption: bool = False) -> None:
        self.live.pop(node_id)
        self.stopping.discard(node_id)
        code = 0 if state is ObservedState.SUCCEEDED else -9
        self.ended[node_id] = ObservedNode(node_id, state, exit_code=code, disruption=disruption)

    @precondition(lambda self: any(state is ObservedState.PENDING for _key, state in self.live.values()))
    @rule(data=st.data())
    def a_node_starts(self, data: st.DataObject) -> None:
        pending = sorted(n for n, (_key, state) in self.live.items() if state is ObservedState.PENDING)
        node_id = data.draw(st.sampled_from(pending))
        self.live[node_id] = (self.live[node_id][0], ObservedState.RUNNING)
        self._look()

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data(), disruption=st.booleans())
    def nodes_end_in_one_look(self, data: st.DataObject, disruption: bool) -> None:
        nodes = data.draw(st.lists(st.sampled_from(sorted(self.live)), min_size=1, max_size=3, unique=True))
        for node_id in nodes:
            state = data.draw(st.sampled_from(_ENDS))
            self._end(node_id, state, disruption and state is ObservedState.FAILED)
        self._look()

    @precondition(lambda self: bool(self.stopping))
    @rule(data=st.data())
    def a_stopped_node_ends(self, data: st.DataObject) -> None:
        self._end(data.draw(st.sampled_from(sorted(self.stopping))), ObservedState.STOPPED)
        self._look()

    @rule()
    def a_parameter_server_is_added(self) -> None:
        self._apply(self.core.add_ps("hot", self.now))

    @rule(seconds=st.sampled_from([1.0, _TIMEOUT / 2, _TIMEOUT + 1]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self._look()

    def _pending_workers(self) -> list[int]:
        return sorted(n for n, (key, state) in self.live.items()
                      if state is ObservedState.PENDING and key.role.value == "worker")  # fmt: skip

    @precondition(lambda self: bool(self._pending_workers()))
    @rule(data=st.data())
    def a_worker_never_starts_while_the_others_run(self, data: st.DataObject) -> None:
        """Every other node starts, this worker's never does: it is stopped for its start timeout, and when it has
        no relaunch left the cluster restarts without it while its node is still stopping; the worker that takes
        its number must wait for that node (the launch check catches one that does not)."""
        stuck = data.draw(st.sampled_from(self._pending_workers()))
        for node_id, (key, state) in list(self.live.items()):
            if state is ObservedState.PENDING and node_id != stuck:
                self.live[node_id] = (key, ObservedState.RUNNING)
        self._look()
        self.now += _TIMEOUT + 1
        self._look()
        for _ in range(4):
            for node_id in sorted(self.stopping - {stuck}):
                self._end(node_id, ObservedState.STOPPED)
            for node_id, (key, state) in list(self.live.items()):
                if state is ObservedState.PENDING and node_id != stuck:
                    self.live[node_id] = (key, ObservedState.RUNNING)
            self._look()

    @rule()
    def the_backend_settles(self) -> None:
        """Stopped nodes end and pending ones start, look after look: a planned restart under way completes."""
        for _ in range(6):
            for node_id in sorted(self.stopping):
                self._end(node_id, ObservedState.STOPPED)
            for node_id, (key, state) in list(self.live.items()):
                if state is ObservedState.PENDING:
                    self.live[node_id] = (key, ObservedState.RUNNING)
            self._look()
        assert self.finished or not self.core.resizing, "a planned restart never completed"

    @invariant()
    def budgets_hold(self) -> None:
        for key in self.core.spec.tasks():
            assert self.core.relaunches(key)[1] <= self.spec.max_relaunches

    @invariant()
    def no_worker_left_out_stays_in_the_cluster_once_it_restarted(self) -> None:
        if self.core.resizing or self.finished:
            return
        for key in self.core.spec.tasks():
            assert self.core.phase(key) is not TaskPhase.LEFT_OUT or key.role.value == "evaluator", key

    @invariant()
    def the_outcome_is_final(self) -> None:
        assert (self.core.outcome is not None) == self.finished


TestPsJobMachine = PsJobMachine.TestCase
TestPsJobMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
