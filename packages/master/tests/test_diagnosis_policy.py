"""The diagnosis-backed failure policy, alone and inside the lifecycle core."""

from __future__ import annotations

import json
import re

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlrover.common import ConfigError, DLRoverError
from dlrover.diagnosis import (
    LOST_NODE_KIND,
    NO_OOM_KILL,
    ActionKind,
    ActionPolicy,
    BudgetWindow,
    FailureKind,
    PolicyConfig,
    RelaunchBudget,
    RestartBudget,
    RuleRegistry,
)
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.diagnosis_policy import POLICY_STATE_VERSION, DiagnosisFailurePolicy
from dlrover.master.factory import default_policy
from dlrover.master.lifecycle import JobLifecycle
from dlrover.master.policy import Classification, DefaultFailurePolicy, Failure
from dlrover.master.records import NodeRecord
from dlrover.master.states import JobState, NodeState

# Built once (a third of a second each): property tests below make a policy per example.
REGISTRY = RuleRegistry.with_builtin_rules()

IMPORT_ERROR = """Traceback (most recent call last):
  File "/home/alice/proj/train.py", line 12, in <module>
    from transformers import LlamaForCausalLM, get_cosine_with_min_lr_schedule
ImportError: cannot import name 'get_cosine_with_min_lr_schedule' from 'transformers'
"""

NCCL_TIMEOUT = (
    "[rank7]:[E1121 04:18:03.337165 5122 ProcessGroupNCCL.cpp:616] [Rank 7] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=4419, OpType=_ALLGATHER_BASE, NumelIn=33554432, NumelOut=268435456, "
    "Timeout(ms)=600000) ran for 600048 milliseconds before timing out.\n"
    "terminate called after throwing an instance of 'c10::DistBackendError'\n"
    "  what():  [PG ID 0 PG GUID 0(default_pg) Rank 7] Process group watchdog thread terminated with exception: "
    "[Rank 7] Watchdog caught collective operation timeout\n"
)


def failure(
    kind: FailureKind, evidence: str, *, node_id: int = 3, exit_code: int | None = None, used: int = 0, limit: int = 3
) -> Failure:
    node = NodeRecord(node_id=node_id, rank=1, state=NodeState.RUNNING, host="host-1")
    budget = RestartBudget(used, limit, "--max-restarts")
    return Failure(node, kind, evidence, budget, RelaunchBudget(0, 3, "max_relaunches"), exit_code=exit_code)


def test_an_import_error_traceback_stops_the_job_with_the_diagnosis_as_reason() -> None:
    decision = DiagnosisFailurePolicy().decide(failure(FailureKind.UNKNOWN, IMPORT_ERROR, exit_code=1))
    assert decision.action is ActionKind.ABORT_JOB
    assert "user_code" in decision.outcome
    assert "ImportError" in decision.outcome


def test_a_collective_timeout_restarts_the_processes() -> None:
    decision = DiagnosisFailurePolicy(REGISTRY).decide(failure(FailureKind.UNKNOWN, NCCL_TIMEOUT, exit_code=-6))
    assert decision.action is ActionKind.RESTART_PROCESSES
    # One sentence: what failed, what the diagnosis found, what is done with the one budget.
    assert decision.outcome.startswith("node 3 (rank 1) failed with exit status -6 (SIGABRT): communication: ")
    assert "Watchdog caught collective operation timeout" in decision.outcome
    assert decision.outcome.endswith("; restart 1 of 3 (--max-restarts)")


def test_a_node_the_network_check_left_out_is_relaunched_on_another_host() -> None:
    from dlrover.diagnosis import NODE_CHECK_FAILED

    evidence = (
        f"{NODE_CHECK_FAILED}: the network check left this node out before training, after 0 restart(s)\n"
        "round 1 pair 0-1: failed (node 0: RuntimeError: [gloo] Timed out waiting for recv; node 1: ok)\n"
    )
    decision = DiagnosisFailurePolicy(REGISTRY).decide(failure(FailureKind.COMMUNICATION, evidence, exit_code=1))
    assert decision.action is ActionKind.RELAUNCH_NODE
    assert decision.avoid_host
    assert "hardware" in decision.outcome


def test_failures_the_master_saw_itself_relaunch_the_node_without_classifying() -> None:
    policy = DiagnosisFailurePolicy(REGISTRY)
    for node_id in (10, 11, 12):
        # Evidence that would read as a user error must not matter for a node the master lost.
        lost = attrs.evolve(failure(LOST_NODE_KIND, IMPORT_ERROR, node_id=node_id), observed_by_master=True)
        decision = policy.decide(lost)
        assert decision.action is ActionKind.RELAUNCH_NODE
        assert decision.kind is FailureKind.PREEMPTION
        assert "observed by the master" in decision.outcome


def test_an_unexplained_log_falls_back_to_the_reported_kind() -> None:
    policy = DiagnosisFailurePolicy(REGISTRY)
    decision = policy.decide(failure(FailureKind.HARDWARE, "the agent saw something odd", node_id=4))
    assert decision.action is ActionKind.RELAUNCH_NODE
    assert decision.avoid_host
    assert "reported as hardware" in decision.outcome
    decision = policy.decide(failure(FailureKind.USER_CODE, "exit code 1", node_id=5))
    assert decision.action is ActionKind.ABORT_JOB


def test_the_nodes_restart_budget_escalates_in_place_of_the_action_policys_own() -> None:
    # The lifecycle's budget (the node's agent's --max-restarts) decides, not the per-node limit.
    policy = DiagnosisFailurePolicy(REGISTRY, actions=ActionPolicy(PolicyConfig(max_process_restarts_per_node=1)))
    first = policy.decide(failure(FailureKind.UNKNOWN, NCCL_TIMEOUT, used=0, limit=2))
    second = policy.decide(failure(FailureKind.UNKNOWN, NCCL_TIMEOUT, used=1, limit=2))
    third = policy.decide(failure(FailureKind.UNKNOWN, NCCL_TIMEOUT, used=2, limit=2))
    assert [first.action, second.action] == [ActionKind.RESTART_PROCESSES] * 2
    assert second.reason.endswith("restart 2 of 2 (--max-restarts)")
    assert third.action is ActionKind.RELAUNCH_NODE
    assert third.avoid_host
    assert "restarted 2 of 2 times (--max-restarts), no restarts left, so the node is relaunched" in third.reason


def _crash(used: int) -> Failure:
    return attrs.evolve(failure(FailureKind.UNKNOWN, "exit code 1", used=used, limit=4), backend_relaunches=False)


def test_without_a_relaunching_scheduler_an_unexplained_crash_restarts_until_the_budget_is_spent() -> None:
    policy = DiagnosisFailurePolicy(REGISTRY)
    decisions = [policy.decide(_crash(used)) for used in range(5)]
    assert [d.action for d in decisions[:4]] == [ActionKind.RESTART_PROCESSES] * 4
    assert decisions[2].reason.endswith(
        "restart 3 of 4 (--max-restarts), in place: this job's backend starts no new node"
    )
    assert decisions[4].action is ActionKind.REMOVE_NODE
    assert "relaunch" not in decisions[4].reason


def test_a_rollback_replays_the_budgets_the_decisions_were_taken_with() -> None:
    policy = DiagnosisFailurePolicy(REGISTRY)
    for used in (0, 1):
        policy.decide(_crash(used))
    savepoint = policy.savepoint()
    policy.decide(_crash(2))
    policy.rollback(savepoint)
    # The replayed policy is where it was: its third decision is again the in-place restart.
    again = policy.decide(_crash(2))
    assert again.action is ActionKind.RESTART_PROCESSES
    assert "in place" in again.reason
    # The budget is the caller's: the action policy keeps no count of its own.
    assert policy.actions.process_restarts("3") == 0


def lifecycle(policy: DiagnosisFailurePolicy) -> JobLifecycle:
    life = JobLifecycle(LifecycleConfig(nodes=NodeRange(2, 2)), policy, 0.0)
    life.start(0.0)
    for node_id in sorted(life.nodes()):
        life.register(node_id, f"agent-{node_id}", f"host-{node_id}", 0.0)
    return life


def test_in_the_lifecycle_a_user_code_error_ends_the_job_after_one_attempt() -> None:
    life = lifecycle(DiagnosisFailurePolicy(REGISTRY))
    decision, _ = life.report_failure(0, FailureKind.UNKNOWN, IMPORT_ERROR, 1.0, exit_code=1)
    assert decision.action is ActionKind.ABORT_JOB
    assert life.job_state is JobState.FAILED
    assert "ImportError" in life.exit_reason
    assert life.job_failures == 1
    assert life.node(0).process_restarts == 0
    assert [life.node(i).state for i in (0, 1)] == [NodeState.FAILED, NodeState.REMOVED]


def test_in_the_lifecycle_a_transient_failure_restarts_processes() -> None:
    life = lifecycle(DiagnosisFailurePolicy(REGISTRY))
    decision, _ = life.report_failure(1, FailureKind.UNKNOWN, NCCL_TIMEOUT, 1.0, exit_code=-6)
    assert decision.action is ActionKind.RESTART_PROCESSES
    assert life.job_state is JobState.RUNNING
    actions, _ = life.heartbeat(1, 2.0)
    assert [a.kind for a in actions] == [ActionKind.RESTART_PROCESSES]


def test_the_failure_event_and_metrics_carry_the_kind_decided_on_and_the_kind_reported() -> None:
    from dlrover.master.journal import JournaledEvent
    from dlrover.master.metrics import MasterMetrics

    life = lifecycle(DiagnosisFailurePolicy(REGISTRY))
    decision, out = life.report_failure(1, FailureKind.UNKNOWN, NCCL_TIMEOUT, 1.0, exit_code=-6)
    (event,) = [e for e in out.events if e.kind == "failure"]
    assert decision.kind is not FailureKind.UNKNOWN
    assert event.data["kind"] == decision.kind.value
    assert event.data["reported_kind"] == FailureKind.UNKNOWN.value
    assert f"failed: {decision.kind.value}: " in event.message
    metrics = MasterMetrics("t")
    metrics.observe_events([JournaledEvent(1, 0.0, event.kind, event.message, 1, 1, event.data)])
    assert f'dlrover_failures_total{{job="t",kind="{decision.kind.value}"}} 1.0' in metrics.render().decode()


def test_in_the_lifecycle_without_a_relaunching_scheduler_the_agents_budget_decides() -> None:
    # A standalone dlrover-run --max-restarts=5 whose worker exits with status 1 every time.
    cfg = LifecycleConfig(nodes=NodeRange(1, 1))
    life = JobLifecycle(cfg, DiagnosisFailurePolicy(REGISTRY), 0.0, scheduler_relaunches=False)
    life.start(0.0)
    life.register(0, "agent-0", "host-0", 0.0, max_process_restarts=5)
    decisions = [
        life.report_failure(0, FailureKind.UNKNOWN, "exit code 1", float(i), exit_code=1, answered=True)[0]
        for i in range(1, 7)
    ]
    assert [d.action for d in decisions] == [ActionKind.RESTART_PROCESSES] * 5 + [ActionKind.ABORT_JOB]
    assert [d.outcome.rsplit("; ", 1)[-1] for d in decisions[:2]] == [
        f"restart {k} of 5 (--max-restarts)" for k in (1, 2)
    ]
    assert all(", in place: this job's backend starts no new node" in d.outcome for d in decisions[2:5])
    assert decisions[-1].outcome == life.exit_reason
    assert "restarted 5 of 5 times (--max-restarts), no restarts left" in life.exit_reason
    assert "relaunch" not in life.exit_reason
    assert life.node(0).process_restarts == 5
    assert life.node(0).state is NodeState.REMOVED


@pytest.mark.parametrize(("name", "kind"), [("diagnosis", DiagnosisFailurePolicy), ("default", DefaultFailurePolicy)])
def test_the_configured_policy_is_the_default(name: str, kind: type) -> None:
    config = MasterConfig(lifecycle=LifecycleConfig(nodes=NodeRange(1, 1)), failure_policy=name)
    assert isinstance(default_policy(config), kind)


def test_an_unknown_policy_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="failure_policy must be one of diagnosis, default, got 'smart'"):
        MasterConfig(failure_policy="smart")


# What an agent adds to a failure's evidence when it read its memory cgroup's OOM count and found no kill.
NO_KILL_RECORD = (
    f"{NO_OOM_KILL}: the memory cgroup's oom_kill count stayed at 0 while the workers ran (memory.events)\n"
)


@pytest.mark.parametrize(("signal_name", "code"), [("SIGKILL", 137), ("SIGTERM", 143)])
def test_a_killed_worker_reported_by_a_live_agent_restarts_processes(signal_name: str, code: int) -> None:
    evidence = f"local rank 1 exited with signal {signal_name} after 0 restart(s)\n{NO_KILL_RECORD}"
    decision = DiagnosisFailurePolicy(REGISTRY).decide(failure(FailureKind.UNKNOWN, evidence, exit_code=code))
    assert decision.action is ActionKind.RESTART_PROCESSES, decision.outcome
    assert "killed" in decision.outcome
    assert "the agent is alive" in decision.outcome
    assert "unknown" not in decision.outcome


def test_a_sigkilled_worker_whose_agent_lives_is_said_to_be_killed_not_unknown() -> None:
    evidence = f"local rank 1 exited with signal SIGKILL\n{NO_KILL_RECORD}"
    decision = DiagnosisFailurePolicy(REGISTRY).decide(failure(FailureKind.UNKNOWN, evidence, exit_code=-9))
    assert decision.action is ActionKind.RESTART_PROCESSES
    assert decision.outcome == (
        "node 3 (rank 1) failed with exit status -9 (SIGKILL): killed by SIGKILL (signal 9): "
        "out of memory on the host or killed by someone; the agent is alive (rule 'sigkill-exit'); "
        "restart 1 of 3 (--max-restarts)"
    )


def test_a_sigkilled_worker_with_no_oom_record_read_is_taken_for_an_oom_kill() -> None:
    """No record could be read (no memory cgroup the agent can see): an unexplained SIGKILL is the OOM
    killer's far more often than anyone's (see `dlrover.diagnosis.oomrecord`), so more memory."""
    evidence = "local rank 1 exited with signal SIGKILL\n"
    decision = DiagnosisFailurePolicy(REGISTRY).decide(failure(FailureKind.UNKNOWN, evidence, exit_code=-9))
    assert (decision.kind, decision.action) == (FailureKind.HOST_OOM, ActionKind.RELAUNCH_WITH_MORE_MEMORY)
    assert "no OOM record read" in decision.outcome


FAILURES = {
    "communication": (FailureKind.UNKNOWN, NCCL_TIMEOUT, 1),
    "unexplained": (FailureKind.UNKNOWN, "exit code 1", 1),
    "killed": (FailureKind.UNKNOWN, f"local rank 0 exited with signal SIGKILL\n{NO_KILL_RECORD}", -9),
    "hang": (FailureKind.HANG, "no CPU progress", None),
    "hardware": (FailureKind.HARDWARE, "the agent saw something odd", 1),
}


@settings(max_examples=80, deadline=None)
@given(
    budget=st.integers(0, 4),
    failures=st.lists(st.sampled_from(sorted(FAILURES)), min_size=1, max_size=10),
    scheduler_relaunches=st.booleans(),
)
def test_every_decision_counts_a_nodes_restarts_one_way(
    budget: int, failures: list[str], scheduler_relaunches: bool
) -> None:
    """The node's journaled count is the only count: each restart is "restart k of n" with k the
    count after it and n the agent's budget; a spent budget is said with the same numbers; and
    where nothing starts a node, nothing is said to be relaunched or created."""
    cfg = LifecycleConfig(nodes=NodeRange(1, 1), max_relaunches=2, max_job_failures=100)
    life = JobLifecycle(cfg, DiagnosisFailurePolicy(REGISTRY), 0.0, scheduler_relaunches=scheduler_relaunches)
    life.start(0.0)
    life.register(0, "agent", "host-0", 0.0, max_process_restarts=budget)
    now = 0.0
    for name in failures:
        if life.job_state.finished:
            break
        node = life.current_nodes()[0]
        if node.state is not NodeState.RUNNING:
            life.register(
                node.node_id, f"agent-{node.node_id}", f"host-{node.node_id}", now, max_process_restarts=budget
            )
            node = life.node(node.node_id)
        kind, evidence, code = FAILURES[name]
        now += 1.0
        decision, out = life.report_failure(node.node_id, kind, evidence, now, exit_code=code, answered=True)
        after = life.node(node.node_id)
        counts = [(int(k), int(n)) for k, n in re.findall(r"\brestart (\d+) of (\d+)", decision.outcome)]
        spent = [(int(k), int(n)) for k, n in re.findall(r"\brestarted (\d+) of (\d+) times", decision.outcome)]
        if decision.action is ActionKind.RESTART_PROCESSES:
            assert after.process_restarts == node.process_restarts + 1 <= budget
            assert counts == [(after.process_restarts, budget)], decision.outcome
        else:
            assert after.process_restarts == node.process_restarts
            assert counts == [], decision.outcome
            assert spent in ([], [(node.process_restarts, budget)]), decision.outcome
        if not scheduler_relaunches:
            # An agent that reported the failure and goes on: nothing here starts another node.
            assert "relaunch" not in decision.outcome
            assert not any(e.kind in ("node_created", "relaunch") for e in out.events)
        if life.job_state is JobState.FAILED:
            assert decision.action is ActionKind.ABORT_JOB
            assert decision.outcome == life.exit_reason


def test_the_action_policys_counters_are_journaled_and_survive_a_master_restart() -> None:
    # The job may relaunch one node in all (the action policy's budget); the first relaunch is
    # decided before a master restart, the second after it: it must not be granted again.
    from dlrover.master.journal import _snapshot, job_fields

    def policy() -> DiagnosisFailurePolicy:
        return DiagnosisFailurePolicy(REGISTRY, actions=ActionPolicy(PolicyConfig(max_node_relaunches=1)))

    cfg = LifecycleConfig(nodes=NodeRange(1, 2))
    life = JobLifecycle(cfg, policy(), 0.0)
    life.start(0.0)
    life.register(0, "agent-0", "host-0", 0.0)
    life.register(1, "agent-1", "host-1", 0.0)
    first, _ = life.report_failure(0, FailureKind.HARDWARE, "ECC error", 1.0)
    assert first.action is ActionKind.RELAUNCH_NODE

    # What the journal keeps of the job, read back by a new master with a fresh policy.
    snap = life.snapshot()
    restored_snap = _snapshot(job_fields(snap), snap.nodes)
    assert restored_snap is not None
    assert restored_snap.policy_state == snap.policy_state
    restored_policy = policy()
    restored = JobLifecycle(cfg, restored_policy, 2.0, restored_snap)
    assert restored_policy.actions.relaunches == 1

    second, _ = restored.report_failure(1, FailureKind.HARDWARE, "ECC error", 3.0)
    assert second.action is ActionKind.ABORT_JOB
    assert "already relaunched 1 nodes (limit 1)" in second.outcome


def test_a_corrupt_journaled_policy_state_is_refused_with_a_reason() -> None:
    policy = DiagnosisFailurePolicy(REGISTRY)
    policy.decide(failure(FailureKind.UNKNOWN, NCCL_TIMEOUT, exit_code=1))
    before = policy.export_state()
    for corrupt in ('[{"node": "0"}]', "{", '{"version": 2}', '{"version": 2, "counters": {"used": 3}}', "7"):
        with pytest.raises(DLRoverError, match="corrupt failure policy state"):
            policy.import_state(corrupt)
        assert policy.export_state() == before
    with pytest.raises(DLRoverError, match="failure policy state version 4 is not one this master reads"):
        policy.import_state('{"version": 4, "counters": {}}')
    assert policy.export_state() == before


CONFIGS = [
    PolicyConfig(),
    PolicyConfig(max_node_relaunches=2),
    PolicyConfig(max_process_restarts_per_node=1),
    PolicyConfig(retired_nodes_kept=1),
    PolicyConfig(max_node_relaunches=2, budget_window=BudgetWindow(60.0)),
]


@st.composite
def failures(draw: st.DrawFn, *, agent_can_restart: bool = False) -> Failure:
    """A failure with any facts: its node, diagnosed kind, budgets, backend, whether its agent stays."""
    observed = False if agent_can_restart else draw(st.booleans())
    kind = LOST_NODE_KIND if observed else draw(st.sampled_from(FailureKind))
    running = True if agent_can_restart else draw(st.booleans())
    node = NodeRecord(
        node_id=draw(st.integers(0, 5)), rank=0, state=NodeState.RUNNING if running else NodeState.PENDING
    )
    limit = draw(st.integers(0, 4))
    return Failure(
        node,
        kind,
        "x",
        RestartBudget(draw(st.integers(0, limit)), limit, "--max-restarts"),
        RelaunchBudget(draw(st.integers(0, 3)), 3, "max_relaunches"),
        classification=None if observed else Classification(kind, f"classified as {kind.value}"),
        backend_relaunches=draw(st.booleans()),
        observed_by_master=observed,
        agent_exits=False if agent_can_restart else draw(st.booleans()),
        wall_time=draw(st.sampled_from([1000.0, 1030.0, 1100.0])),  # some within the window of 60 s, some not
    )


def version_1_state(decided: list[Failure]) -> str:
    """What the policy journaled before version 2: every decision's inputs."""
    return json.dumps(
        [
            {
                "node": str(f.node.node_id),
                "kind": f.kind.value,
                "used": f.restarts.used,
                "limit": f.restarts.limit,
                "source": f.restarts.source,
                "relaunch_possible": f.relaunch_possible,
                "relaunches": [f.relaunches.used, f.relaunches.limit, f.relaunches.source],
            }
            for f in decided
        ]
    )


@settings(max_examples=120, deadline=None)
@given(
    config=st.sampled_from(CONFIGS),
    before=st.lists(failures(), max_size=30),
    after=st.lists(failures(), max_size=30),
)
def test_a_policy_restored_from_its_state_decides_exactly_as_the_original(
    config: PolicyConfig, before: list[Failure], after: list[Failure]
) -> None:
    original = DiagnosisFailurePolicy(REGISTRY, ActionPolicy(config))
    for f in before:
        original.decide(f)
    restored = DiagnosisFailurePolicy(REGISTRY, ActionPolicy(config))
    restored.import_state(original.export_state())
    assert restored.export_state() == original.export_state()
    for f in after:
        assert restored.decide(f) == original.decide(f)
    assert restored.export_state() == original.export_state()


@settings(max_examples=60, deadline=None)
@given(
    config=st.sampled_from(CONFIGS),
    before=st.lists(failures(agent_can_restart=True), max_size=30),
    after=st.lists(failures(), max_size=30),
)
def test_a_version_1_state_is_read_and_decides_as_the_policy_that_wrote_it(
    config: PolicyConfig, before: list[Failure], after: list[Failure]
) -> None:
    # Version 1 held the inputs of decisions about agents that could restart their processes (the
    # lifecycle turned the others' answers afterwards): replayed, they give the same counters.
    original = DiagnosisFailurePolicy(REGISTRY, ActionPolicy(config))
    for f in before:
        original.decide(f)
    restored = DiagnosisFailurePolicy(REGISTRY, ActionPolicy(config))
    restored.import_state(version_1_state(before))
    assert json.loads(restored.export_state())["version"] == POLICY_STATE_VERSION
    for f in after:
        assert restored.decide(f) == original.decide(f)


def test_a_version_2_state_is_read_and_its_uses_count_for_ever() -> None:
    # Version 2 journaled the counters as counts: one native crash restarted on node 3.
    version_2 = json.dumps(
        {
            "version": 2,
            "counters": {
                "used": [["3", "native_crash", 0, 1]],
                "position": [["3", "native_crash", 0]],
                "own_restarts": {},
                "relaunches": 0,
                "retired": [],
                "abort_reason": None,
            },
        }
    )
    config = PolicyConfig(budget_window=BudgetWindow(60.0))
    restored = DiagnosisFailurePolicy(REGISTRY, ActionPolicy(config))
    restored.import_state(version_2)
    crash = attrs.evolve(failure(FailureKind.NATIVE_CRASH, "Segmentation fault"), wall_time=1e9)
    # Long after any window the restart still counts: the ladder's next rung is taken.
    assert restored.decide(crash).action is ActionKind.RELAUNCH_NODE
    assert json.loads(restored.export_state())["version"] == POLICY_STATE_VERSION
    with pytest.raises(ConfigError, match="decide needs `now`"):
        DiagnosisFailurePolicy(REGISTRY, ActionPolicy(config)).decide(attrs.evolve(crash, wall_time=None))


def test_the_journaled_state_does_not_grow_with_the_decisions() -> None:
    # A node restarted in place again and again (the external backend, a large --max-restarts):
    # version 1 grew by a decision's inputs each time; the counters stay as they are.
    policy = DiagnosisFailurePolicy(REGISTRY)
    node = NodeRecord(node_id=0, rank=0, state=NodeState.RUNNING)
    sizes = []
    for used in range(1000):
        hardware = Classification(FailureKind.HARDWARE, "ECC")
        f = Failure(
            node,
            FailureKind.HARDWARE,
            "ECC",
            RestartBudget(used, 10_000, "--max-restarts"),
            RelaunchBudget(0, 3, "max_relaunches"),
            classification=hardware,
            backend_relaunches=False,
        )
        assert policy.decide(f).action is ActionKind.RESTART_PROCESSES
        if used in (9, 999):
            sizes.append(len(policy.export_state()))
    assert sizes[0] == sizes[1]
