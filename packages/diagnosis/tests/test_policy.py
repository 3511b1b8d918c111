"""The action policy: defaults, budgets, escalation and a stateful model check."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule

from dlrover.common import ConfigError
from dlrover.diagnosis import (
    DEFAULT_LADDERS,
    ActionKind,
    ActionPolicy,
    BudgetWindow,
    FailureKind,
    LadderStep,
    PolicyConfig,
    PolicyStateError,
    RelaunchBudget,
    RestartBudget,
    spend_restart,
)

K = FailureKind
A = ActionKind


def test_user_code_and_data_errors_abort_at_once_with_advice() -> None:
    policy = ActionPolicy()
    d = policy.decide("n0", K.USER_CODE)
    assert d.action is A.ABORT_JOB
    assert "bug" in d.reason
    assert policy.aborted
    assert policy.decide("n1", K.COMMUNICATION).action is A.ABORT_JOB


def test_communication_restarts_then_relaunches_avoiding_host_then_retires_node() -> None:
    policy = ActionPolicy()
    actions = [policy.decide("n0", K.COMMUNICATION) for _ in range(4)]
    assert [d.action for d in actions] == [A.RESTART_PROCESSES] * 3 + [A.RELAUNCH_NODE]
    assert actions[-1].avoid_host
    assert [d.outcome for d in actions[:3]] == [f"restart {k} of 3 (max_process_restarts_per_node)" for k in (1, 2, 3)]
    assert "already tried: restart_processes x3" in actions[-1].reason
    late = policy.decide("n0", K.COMMUNICATION)
    assert late.action is A.NONE
    assert "already let go (relaunch_node for communication)" in late.reason


def test_restarts_of_different_kinds_on_one_node_escalate() -> None:
    policy = ActionPolicy(PolicyConfig(max_process_restarts_per_node=2))
    assert policy.decide("n0", K.COMMUNICATION).action is A.RESTART_PROCESSES
    assert policy.decide("n0", K.HANG).action is A.RESTART_PROCESSES
    d = policy.decide("n0", K.UNKNOWN)
    assert d.action is A.RELAUNCH_NODE
    assert d.escalated
    assert d.avoid_host
    assert "restarted 2 of 2 times (max_process_restarts_per_node), no restarts left" in d.reason
    assert d.reason.endswith("so the node is relaunched on another host")
    # Another node is unaffected.
    assert policy.decide("n1", K.UNKNOWN).action is A.RESTART_PROCESSES


def test_job_scoped_budget_is_shared_by_nodes() -> None:
    policy = ActionPolicy()
    assert policy.decide("a", K.NAN_LOSS).action is A.ROLLBACK_CHECKPOINT
    assert policy.decide("b", K.NAN_LOSS).action is A.ROLLBACK_CHECKPOINT
    d = policy.decide("c", K.NAN_LOSS)
    assert d.action is A.ABORT_JOB
    assert "learning rate" in d.reason


def test_relaunch_limit_aborts() -> None:
    policy = ActionPolicy(PolicyConfig(max_node_relaunches=1))
    assert policy.decide("a", K.HARDWARE).action is A.RELAUNCH_NODE
    d = policy.decide("b", K.HARDWARE)
    assert d.action is A.ABORT_JOB
    assert "limit 1" in d.reason


def test_host_oom_relaunches_with_more_memory() -> None:
    d = ActionPolicy().decide("a", K.HOST_OOM)
    assert d.action is A.RELAUNCH_WITH_MORE_MEMORY


def test_preemption_relaunches_without_avoiding_host() -> None:
    d = ActionPolicy().decide("a", K.PREEMPTION)
    assert d.action is A.RELAUNCH_NODE
    assert not d.avoid_host


def test_config_overrides_one_kind_and_keeps_the_rest() -> None:
    cfg = PolicyConfig(ladders={K.USER_CODE: (LadderStep(A.RESTART_PROCESSES, 1),)})
    assert cfg.ladders[K.USER_CODE][0].action is A.RESTART_PROCESSES
    assert cfg.ladders[K.HARDWARE] == DEFAULT_LADDERS[K.HARDWARE]
    policy = ActionPolicy(cfg)
    assert policy.decide("a", K.USER_CODE).action is A.RESTART_PROCESSES
    assert policy.decide("a", K.USER_CODE).action is A.ABORT_JOB


def test_bad_config_and_input_are_rejected_without_state_change() -> None:
    with pytest.raises(ConfigError, match="de-escalate"):
        PolicyConfig(ladders={K.HANG: (LadderStep(A.RELAUNCH_NODE, 1), LadderStep(A.RESTART_PROCESSES, 1))})
    with pytest.raises(ConfigError, match="budget"):
        LadderStep(A.RESTART_PROCESSES, 0)
    with pytest.raises(ConfigError, match="abort follows"):
        LadderStep(A.ABORT_JOB, 1)
    with pytest.raises(ConfigError, match="max_node_relaunches"):
        PolicyConfig(max_node_relaunches=-1)
    policy = ActionPolicy()
    with pytest.raises(ConfigError, match="node_id"):
        policy.decide("", K.HANG)
    with pytest.raises(ConfigError, match="kind"):
        policy.decide("a", "hang")  # type: ignore[arg-type]
    assert policy.process_restarts("a") == 0
    assert not policy.aborted


def test_a_callers_restart_budget_replaces_the_per_node_limit_and_is_not_counted_twice() -> None:
    # The master passes the node's journaled count against its agent's --max-restarts and counts
    # the restart itself: the policy keeps no second count of it.
    policy = ActionPolicy(PolicyConfig(max_process_restarts_per_node=1))
    decisions = [
        policy.decide("n0", K.COMMUNICATION, budget=RestartBudget(used, 5, "--max-restarts")) for used in (0, 1, 2)
    ]
    assert [d.action for d in decisions] == [A.RESTART_PROCESSES] * 3
    assert [d.outcome for d in decisions] == [f"restart {k} of 5 (--max-restarts)" for k in (1, 2, 3)]
    assert policy.process_restarts("n0") == 0
    # The ladder's relaunch follows its restarts where a scheduler can relaunch.
    assert policy.decide("n0", K.COMMUNICATION, budget=RestartBudget(3, 5)).action is A.RELAUNCH_NODE
    spent = policy.decide("n1", K.UNKNOWN, budget=RestartBudget(2, 2, "--max-restarts"))
    assert (spent.action, spent.escalated, spent.avoid_host) == (A.RELAUNCH_NODE, True, True)
    assert "restarted 2 of 2 times (--max-restarts), no restarts left" in spent.reason


def test_without_a_relaunch_a_relaunch_rung_restarts_in_place_then_the_node_leaves() -> None:
    policy = ActionPolicy()
    decisions = [
        policy.decide("n0", K.UNKNOWN, budget=RestartBudget(used, 5), relaunch_possible=False) for used in range(5)
    ]
    # unknown: restart x2, then its relaunch rung restarts in place, as far as the budget goes.
    assert [d.action for d in decisions] == [A.RESTART_PROCESSES] * 5
    assert decisions[1].outcome == "restart 2 of 5"
    assert decisions[2].outcome == "restart 3 of 5, in place: this job's backend starts no new node"
    assert policy.relaunches == 0
    # Spent, with nothing to start a new node: the node leaves the job, said as such.
    last = policy.decide("n0", K.UNKNOWN, budget=RestartBudget(5, 5, "--max-restarts"), relaunch_possible=False)
    assert last.action is A.REMOVE_NODE
    assert last.outcome == (
        "restarted 5 of 5 times (--max-restarts), no restarts left, and this job's backend starts no new node: "
        "the node leaves the job"
    )
    assert not last.avoid_host
    assert policy.relaunches == 0
    assert policy.decide("n0", K.UNKNOWN, budget=RestartBudget(0, 5)).action is A.NONE


def test_without_a_relaunch_a_restart_rung_with_no_restarts_left_removes_the_node() -> None:
    policy = ActionPolicy()
    d = policy.decide("n0", K.COMMUNICATION, budget=RestartBudget(3, 3), relaunch_possible=False)
    assert d.action is A.REMOVE_NODE
    assert "relaunch" not in d.reason


def test_without_a_relaunch_hardware_restarts_in_place_and_user_code_still_aborts() -> None:
    policy = ActionPolicy()
    hardware = policy.decide("n0", K.HARDWARE, budget=RestartBudget(0, 1), relaunch_possible=False)
    assert hardware.action is A.RESTART_PROCESSES
    assert not hardware.avoid_host
    spent = policy.decide("n0", K.HARDWARE, budget=RestartBudget(1, 1), relaunch_possible=False)
    assert spent.action is A.REMOVE_NODE
    user = policy.decide("n1", K.USER_CODE, budget=RestartBudget(0, 5), relaunch_possible=False)
    assert user.action is A.ABORT_JOB
    assert "bug" in user.reason


def test_a_bad_restart_budget_is_refused_and_counts_nothing() -> None:
    policy = ActionPolicy()
    with pytest.raises(ConfigError, match="used"):
        RestartBudget(-1, 3)
    with pytest.raises(ConfigError, match="budget"):
        policy.decide("n0", K.UNKNOWN, budget=2)  # type: ignore[arg-type]
    assert policy.process_restarts("n0") == 0


def test_a_killed_process_restarts_then_relaunches_on_any_host() -> None:
    policy = ActionPolicy()
    decisions = [policy.decide("n0", K.KILLED) for _ in range(3)]
    assert [d.action for d in decisions] == [A.RESTART_PROCESSES] * 2 + [A.RELAUNCH_NODE]
    assert not decisions[-1].avoid_host


@settings(max_examples=300, deadline=None)
@given(
    used=st.integers(0, 8),
    limit=st.integers(0, 8),
    relaunch_possible=st.booleans(),
    relaunch_wanted=st.booleans(),
)
def test_spending_a_restart_follows_the_one_rule(
    used: int, limit: int, relaunch_possible: bool, relaunch_wanted: bool
) -> None:
    budget = RestartBudget(used, limit, "--max-restarts")
    spending = spend_restart(budget, relaunch_possible=relaunch_possible, relaunch_wanted=relaunch_wanted)
    # A restart is taken only while one is left, and it is always named "restart k of n" with
    # k the restart it is; a spent budget is always named with the same count.
    assert spending.restarts == (used < limit and not (relaunch_wanted and relaunch_possible))
    if spending.restarts:
        assert spending.words.startswith(f"restart {used + 1} of {limit} (--max-restarts)")
    elif spending.action is not A.RELAUNCH_NODE or not relaunch_wanted:
        assert spending.words.startswith(f"restarted {used} of {limit} times (--max-restarts), no restarts left")
    # Nothing is relaunched where nothing can start a node, and no node leaves with restarts left.
    assert spending.action is not A.RELAUNCH_NODE or relaunch_possible
    assert spending.action is not A.REMOVE_NODE or (budget.spent and not relaunch_possible)
    if not relaunch_possible:
        assert "relaunch" not in spending.words


NODES = ["n0", "n1", "n2"]


class PolicyMachine(RuleBasedStateMachine):
    """Random failure streams against a counting model that predicts every action.

    Invariants: budgets are never exceeded within their window, escalation never goes back for a
    (node, kind) while no use expires, a relaunched node is retired, and abort is final.
    """

    nodes = Bundle("nodes")

    @initialize(
        restarts=st.integers(0, 4),
        relaunches=st.integers(0, 4),
        comm_budget=st.integers(1, 3),
        nan_budget=st.integers(1, 3),
        agent_budget=st.none() | st.integers(0, 5),
        relaunch_possible=st.booleans(),
        window=st.none() | st.sampled_from([10.0, 100.0]),
    )
    def setup(
        self,
        *,
        restarts: int,
        relaunches: int,
        comm_budget: int,
        nan_budget: int,
        agent_budget: int | None,
        relaunch_possible: bool,
        window: float | None,
    ) -> None:
        # agent_budget: the restarts every node's agent allows, passed with the model's count as a
        # `RestartBudget` (None: the policy counts against its own limit); relaunch_possible:
        # whether a scheduler can replace nodes.
        self.agent_budget = agent_budget
        self.relaunch_possible = relaunch_possible
        self.config = PolicyConfig(
            ladders={
                K.COMMUNICATION: (
                    LadderStep(A.RESTART_PROCESSES, comm_budget),
                    LadderStep(A.RELAUNCH_NODE, 1, avoid_host=True),
                ),
                K.NAN_LOSS: (LadderStep(A.ROLLBACK_CHECKPOINT, nan_budget, "job"),),
            },
            max_process_restarts_per_node=restarts,
            max_node_relaunches=relaunches,
            budget_window=BudgetWindow(window),
        )
        self.window = window
        self.policy = ActionPolicy(self.config)
        self.counter = 0
        self.now = 1_700_000_000.0
        # The model: every use's time, kept for ever.
        self.restarts: dict[str, int] = {}
        self.relaunched_at: list[float] = []
        self.retired: set[str] = set()
        self.aborted = False
        self.step_uses: dict[tuple[str, K, int], list[float]] = {}
        self.last_severity: dict[tuple[str, K], int] = {}
        self.expired = False  # a use has left the window: a ladder may start from its top again

    def within(self, times: list[float]) -> int:
        return len(times) if self.window is None else sum(1 for t in times if t > self.now - self.window)

    @rule(target=nodes)
    def new_node(self) -> str:
        self.counter += 1
        return f"node-{self.counter}"

    def restart_limit(self) -> int:
        return self.config.max_process_restarts_per_node if self.agent_budget is None else self.agent_budget

    def predict(self, node: str, kind: K) -> tuple[A, int | None, bool]:
        """The model: walk the ladder from the top with plain counters; returns (action, rung
        used, whether a relaunch rung restarted in place)."""
        if self.aborted:
            return A.ABORT_JOB, None, False
        if node in self.retired:
            return A.NONE, None, False
        rung = None
        for i, step in enumerate(self.config.ladders[kind]):
            if step.needs_new_node and not self.relaunch_possible:
                continue  # a rung only worth a new node is passed over where none can start
            if self.within(self.step_uses.get((node if step.scope == "node" else "*", kind, i), [])) < step.budget:
                rung = i
                break
        if rung is None:
            return A.ABORT_JOB, None, False
        action = self.config.ladders[kind][rung].action
        can_relaunch = self.within(self.relaunched_at) < self.config.max_node_relaunches
        restarts_left = self.restart_limit() - self.restarts.get(node, 0)
        if action in (A.RELAUNCH_NODE, A.RELAUNCH_WITH_MORE_MEMORY):
            if not self.relaunch_possible:
                return (A.RESTART_PROCESSES, None, True) if restarts_left > 0 else (A.REMOVE_NODE, None, False)
        elif restarts_left <= 0:  # a restart or a rollback with no restarts left
            if not self.relaunch_possible:
                return A.REMOVE_NODE, None, False
            action, rung = A.RELAUNCH_NODE, None
        if action in (A.RELAUNCH_NODE, A.RELAUNCH_WITH_MORE_MEMORY) and not can_relaunch:
            action, rung = A.ABORT_JOB, None
        return action, rung, False

    def apply(self, node: str, kind: K) -> None:
        expected, rung, in_place = self.predict(node, kind)
        budget = None if self.agent_budget is None else RestartBudget(self.restarts.get(node, 0), self.agent_budget)
        d = self.policy.decide(node, kind, budget=budget, relaunch_possible=self.relaunch_possible, now=self.now)
        assert d.reason
        assert d.action is expected, (d, expected)
        if self.aborted or node in self.retired:
            return
        # A restart in place of a relaunch is the one step back a ladder takes, and a window that
        # let uses expire starts it again from the top.
        if not in_place and not self.expired:
            prev = self.last_severity.get((node, kind), 0)
            assert d.action.severity >= prev, (d, prev)
            self.last_severity[(node, kind)] = d.action.severity
        if d.action in (A.RESTART_PROCESSES, A.ROLLBACK_CHECKPOINT):
            self.restarts[node] = self.restarts.get(node, 0) + 1
        elif d.action in (A.RELAUNCH_NODE, A.RELAUNCH_WITH_MORE_MEMORY):
            self.relaunched_at.append(self.now)
            self.retired.add(node)
        elif d.action is A.REMOVE_NODE:
            self.retired.add(node)
        elif d.action is A.ABORT_JOB:
            self.aborted = True
        if rung is not None:
            step = self.config.ladders[kind][rung]
            key = (node if step.scope == "node" else "*", kind, rung)
            self.step_uses.setdefault(key, []).append(self.now)

    @rule(node=nodes, kind=st.sampled_from(list(K)))
    def fail(self, node: str, kind: K) -> None:
        self.apply(node, kind)

    @rule(seconds=st.sampled_from([1.0, 9.0, 50.0, 200.0]))
    def time_passes(self, seconds: float) -> None:
        before = [t for times in [*self.step_uses.values(), self.relaunched_at] for t in times]
        self.now += seconds
        if self.window is not None and any(t <= self.now - self.window for t in before):
            self.expired = True

    @precondition(lambda self: bool(self.retired) and not self.aborted)
    @rule(data=st.data(), kind=st.sampled_from(list(K)))
    def late_report_about_a_relaunched_node(self, data: st.DataObject, kind: K) -> None:
        node = data.draw(st.sampled_from(sorted(self.retired)))
        assert self.policy.decide(node, kind, now=self.now).action is A.NONE

    @precondition(lambda self: self.aborted)
    @rule(node=nodes, kind=st.sampled_from(list(K)))
    def anything_after_abort_aborts(self, node: str, kind: K) -> None:
        assert self.policy.decide(node, kind, now=self.now).action is A.ABORT_JOB

    @invariant()
    def budgets_hold(self) -> None:
        if not hasattr(self, "policy"):
            return
        for node, n in self.restarts.items():
            assert n <= self.restart_limit()
            # One count: the policy's own only when no caller keeps one, and only while the node is
            # in the job (a node let go has its counters dropped: nothing decides on them again).
            kept = self.agent_budget is None and node not in self.retired
            assert self.policy.process_restarts(node) == (n if kept else 0)
        assert self.within(self.relaunched_at) <= self.config.max_node_relaunches
        assert self.policy.relaunches == len(self.relaunched_at)
        assert self.policy.aborted == self.aborted
        for (_scope, kind, index), uses in self.step_uses.items():
            assert self.within(uses) <= self.config.ladders[kind][index].budget
        # What the policy keeps never grows with the decisions: the newest uses a budget reads.
        counters = self.policy.export_counters()
        for _node, kind_name, index, times in counters["used"]:
            assert len(times) <= self.config.ladders[K(kind_name)][index].budget
        assert len(counters["relaunched_at"]) <= self.config.max_node_relaunches


PolicyMachine.TestCase.settings = settings(PolicyMachine.TestCase.settings, stateful_step_count=30)
TestPolicyMachine = PolicyMachine.TestCase


def test_a_relaunch_with_no_relaunches_left_for_the_rank_lets_the_node_go() -> None:
    spent = RelaunchBudget(2, 2, "max_relaunches")
    left = RelaunchBudget(1, 2, "max_relaunches")
    wanted = spend_restart(RestartBudget(0, 3), relaunch_possible=True, relaunch_wanted=True, relaunches=spent)
    assert wanted.action is ActionKind.REMOVE_NODE
    assert wanted.words == "relaunched 2 of 2 times (max_relaunches), no relaunches left: the node leaves the job"
    escalated = spend_restart(RestartBudget(3, 3), relaunch_possible=True, relaunches=spent)
    assert escalated.action is ActionKind.REMOVE_NODE
    assert "no restarts left, and relaunched 2 of 2 times" in escalated.words
    assert spend_restart(RestartBudget(0, 3), relaunch_possible=True, relaunch_wanted=True, relaunches=left).action is (
        ActionKind.RELAUNCH_NODE
    )
    # Where no new node can start, the restarts in place come first, as before.
    in_place = spend_restart(RestartBudget(0, 3), relaunch_possible=False, relaunch_wanted=True, relaunches=spent)
    assert in_place.action is ActionKind.RESTART_PROCESSES


def test_the_action_policy_spends_the_ranks_relaunches_through_the_same_rule() -> None:
    policy = ActionPolicy()
    spent = RelaunchBudget(1, 1, "max_relaunches")
    decision = policy.decide("n0", FailureKind.HARDWARE, relaunches=spent)
    assert decision.action is ActionKind.REMOVE_NODE
    assert policy.relaunches == 0
    with pytest.raises(ConfigError, match="RelaunchBudget"):
        policy.decide("n1", FailureKind.HARDWARE, relaunches=1)  # type: ignore[arg-type]


@given(
    used=st.integers(0, 4),
    limit=st.integers(0, 4),
    relaunch_possible=st.booleans(),
    relaunch_wanted=st.booleans(),
    relaunches_spent=st.booleans(),
)
def test_with_no_agent_to_restart_the_processes_no_restart_is_ever_decided(
    used: int, limit: int, relaunch_possible: bool, relaunch_wanted: bool, relaunches_spent: bool
) -> None:
    relaunches = RelaunchBudget(2 if relaunches_spent else 1, 2, "max_relaunches")
    spending = spend_restart(
        RestartBudget(used, limit),
        relaunch_possible=relaunch_possible,
        relaunch_wanted=relaunch_wanted,
        relaunches=relaunches,
        no_restart="its agent exits after this report",
    )
    assert not spending.restarts
    assert spending.words.startswith("its agent exits after this report")
    relaunched = relaunch_possible and not relaunches_spent
    assert spending.action is (A.RELAUNCH_NODE if relaunched else A.REMOVE_NODE)


def test_a_restart_rung_with_no_agent_to_restart_relaunches_anywhere_and_counts_the_relaunch() -> None:
    policy = ActionPolicy(PolicyConfig(max_node_relaunches=1))
    leaving = "its agent exits after this report"
    d = policy.decide("n0", K.COMMUNICATION, budget=RestartBudget(0, 3), no_restart=leaving)
    assert (d.action, d.avoid_host, d.escalated) == (A.RELAUNCH_NODE, False, True)
    assert d.outcome == "its agent exits after this report, so the node is relaunched"
    assert policy.relaunches == 1
    # The job's relaunch budget holds for these relaunches as for any.
    d = policy.decide("n1", K.COMMUNICATION, budget=RestartBudget(0, 3), no_restart=leaving)
    assert d.action is A.ABORT_JOB
    assert "already relaunched 1 nodes (limit 1)" in d.outcome


def test_a_node_let_go_keeps_one_line_of_counters_and_late_reports_about_it_need_nothing() -> None:
    policy = ActionPolicy()
    for _ in range(3):
        policy.decide("n0", K.COMMUNICATION)
    assert [u[0] for u in policy.export_counters()["used"]] == ["n0"]
    assert policy.decide("n0", K.COMMUNICATION).action is A.RELAUNCH_NODE  # own restarts spent
    counters = policy.export_counters()
    assert (counters["used"], counters["own_restarts"]) == ([], {})
    assert counters["retired"] == [["n0", "relaunch_node for communication"]]
    assert policy.process_restarts("n0") == 0
    assert policy.decide("n0", K.HANG).action is A.NONE


def test_counters_survive_an_export_and_an_import_and_bad_ones_change_nothing() -> None:
    policy = ActionPolicy()
    policy.decide("n0", K.NAN_LOSS)
    policy.decide("n1", K.HANG)
    policy.decide("n2", K.HARDWARE)
    counters = policy.export_counters()
    restored = ActionPolicy()
    restored.import_counters(counters)
    assert restored.export_counters() == counters
    assert restored.decide("n1", K.HANG) == policy.decide("n1", K.HANG)
    before = restored.export_counters()
    for bad in (
        {},
        {**counters, "relaunches": -1},
        {**counters, "used": [["n0", "no-such-kind", 0, 1]]},
        {**counters, "retired": [["", "x"]]},
        {**counters, "retired": {"n0": "x"}},
        {**counters, "retired": [["n0", "x"], ["n0", "y"]]},
        {**counters, "used": ["n0hw"]},
        {**counters, "abort_reason": 3},
        {**counters, "extra": 1},
    ):
        with pytest.raises(PolicyStateError, match="not the counters of an action policy"):
            restored.import_counters(bad)
        assert restored.export_counters() == before


def test_only_the_newest_nodes_let_go_are_remembered() -> None:
    policy = ActionPolicy(PolicyConfig(retired_nodes_kept=2))
    for node in ("n0", "n1", "n2"):
        assert policy.decide(node, K.HARDWARE).action is A.RELAUNCH_NODE
    assert [n for n, _ in policy.export_counters()["retired"]] == ["n1", "n2"]
    assert policy.decide("n2", K.HARDWARE).action is A.NONE
    # n0 was forgotten: a report about it is decided as any node's.
    assert policy.decide("n0", K.HARDWARE).action is A.RELAUNCH_NODE


def test_a_budget_window_forgets_failures_older_than_it() -> None:
    # A 16,384-GPU job meets a failure every few hours: a native crash on one node three weeks after
    # the first is a new crash, not the same one coming back.
    day = 86400.0
    policy = ActionPolicy(PolicyConfig(budget_window=BudgetWindow(day), max_node_relaunches=2))
    t0 = 1_700_000_000.0
    first = policy.decide("n0", K.NATIVE_CRASH, now=t0)
    assert first.action is A.RESTART_PROCESSES
    assert policy.decide("n0", K.NATIVE_CRASH, now=t0 + 21 * day).action is A.RESTART_PROCESSES
    again = policy.decide("n0", K.NATIVE_CRASH, now=t0 + 21 * day + 3600)
    assert again.action is A.RELAUNCH_NODE
    assert again.avoid_host
    assert "relaunch_node 1 of 1, job per 24h" in again.outcome


def test_a_native_crash_that_follows_the_job_to_a_new_host_stops_it() -> None:
    # A crash that comes back on one node points to its host, and the node moves; one that comes back
    # on its replacement too is in the code: the relaunch rung is the job's, so the job stops there.
    day = 86400.0
    policy = ActionPolicy(PolicyConfig(budget_window=BudgetWindow(day)))
    t0 = 1_700_000_000.0
    assert policy.decide("n0", K.NATIVE_CRASH, now=t0).action is A.RESTART_PROCESSES
    assert policy.decide("n0", K.NATIVE_CRASH, now=t0 + 60).action is A.RELAUNCH_NODE
    assert policy.decide("n1", K.NATIVE_CRASH, now=t0 + 600).action is A.RESTART_PROCESSES
    stop = policy.decide("n1", K.NATIVE_CRASH, now=t0 + 660)
    assert stop.action is A.ABORT_JOB
    assert "budgets spent (restart_processes x1, relaunch_node x1 per 24h)" in stop.outcome
    assert "a bug in native code is likely" in stop.outcome


def test_where_no_node_can_be_started_a_native_crash_back_on_its_node_stops_the_job() -> None:
    # The relaunch rung tests another host: without one it is passed over, not turned into restarts
    # in place on the host it blames (as a hang's or a communication error's relaunch rung is).
    policy = ActionPolicy()
    first = policy.decide("n0", K.NATIVE_CRASH, relaunch_possible=False)
    assert first.action is A.RESTART_PROCESSES
    stop = policy.decide("n0", K.NATIVE_CRASH, relaunch_possible=False)
    assert stop.action is A.ABORT_JOB
    assert "budgets spent (restart_processes x1)" in stop.outcome
    assert "the crash site above names the library" in stop.outcome
    # A hang's relaunch rung (after two restarts) still restarts in place there.
    hangs = ActionPolicy()
    third = [hangs.decide("n0", K.HANG, relaunch_possible=False) for _ in range(3)][-1]
    assert third.action is A.RESTART_PROCESSES
    assert "in place" in third.outcome


def test_only_a_relaunch_rung_needs_a_new_node() -> None:
    with pytest.raises(ConfigError, match="only a relaunch needs a new node"):
        LadderStep(A.RESTART_PROCESSES, 1, needs_new_node=True)


def test_a_budget_window_bounds_the_jobs_relaunches_per_window() -> None:
    hour = 3600.0
    policy = ActionPolicy(PolicyConfig(budget_window=BudgetWindow(hour), max_node_relaunches=2))
    t0 = 1_700_000_000.0
    assert policy.decide("n0", K.HARDWARE, now=t0).action is A.RELAUNCH_NODE
    assert policy.decide("n1", K.HARDWARE, now=t0 + 600).action is A.RELAUNCH_NODE
    # The first relaunch left the window: one more may come, and only one.
    assert policy.decide("n2", K.HARDWARE, now=t0 + hour + 1).action is A.RELAUNCH_NODE
    stop = policy.decide("n3", K.HARDWARE, now=t0 + hour + 2)
    assert stop.action is A.ABORT_JOB
    assert "already relaunched 2 nodes (limit 2 per 1h)" in stop.outcome
    assert policy.relaunches == 3


def test_a_windowed_budget_needs_the_time_of_each_failure() -> None:
    policy = ActionPolicy(PolicyConfig(budget_window=BudgetWindow(60.0)))
    with pytest.raises(ConfigError, match="decide needs `now`"):
        policy.decide("n0", K.HANG)
    with pytest.raises(ConfigError, match="now must be a finite number"):
        policy.decide("n0", K.HANG, now=float("nan"))
    assert policy.export_counters()["used"] == []
    for bad in (0, -1.0, float("inf"), "1h", True):
        with pytest.raises(ConfigError, match="a budget window must be None"):
            PolicyConfig(budget_window=BudgetWindow(bad))  # type: ignore[arg-type]


def test_counters_written_before_budgets_kept_times_still_count() -> None:
    # A journal of an older master: use counts, ladder positions, a bare relaunch count.
    older = {
        "used": [["n0", "native_crash", 0, 1], ["*job*", "nan_loss", 0, 2]],
        "position": [["n0", "native_crash", 0]],
        "own_restarts": {"n0": 1},
        "relaunches": 5,
        "retired": [],
        "abort_reason": None,
    }
    policy = ActionPolicy(PolicyConfig(budget_window=BudgetWindow(60.0), max_node_relaunches=4))
    policy.import_counters(older)
    far = 1_800_000_000.0  # long after any window: uses of unknown time still count
    assert policy.decide("n0", K.NATIVE_CRASH, now=far).action is A.ABORT_JOB
    counters = policy.export_counters()
    assert counters["relaunched_at"] == [None] * 4
    assert ["*job*", "nan_loss", 0, [None, None]] in counters["used"]
