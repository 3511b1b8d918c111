"""PsJobCore and the PS job's shape: launches, relaunches at the same address, chief restarts, budgets, OOM."""

from __future__ import annotations

import json

import pytest

from dlrover.autoscale import Resources, Role
from dlrover.common import ConfigError
from dlrover.master.psjob import PsJobCore, PsJobSpec, TaskKey, TaskPhase, tf_config
from dlrover.master.scheduler.base import REASON_OOM_KILLED, ObservedNode, ObservedState

CHIEF, PS0, PS1, W0, W1 = (TaskKey(Role.CHIEF, 0), TaskKey(Role.PS, 0), TaskKey(Role.PS, 1), TaskKey(Role.WORKER, 0),
                           TaskKey(Role.WORKER, 1))  # fmt: skip


def _failed(node_id: int, code: int = -9, **kw: object) -> dict[int, ObservedNode]:
    return {node_id: ObservedNode(node_id, ObservedState.FAILED, exit_code=code, **kw)}  # type: ignore[arg-type]


def _started(spec: PsJobSpec) -> PsJobCore:
    core = PsJobCore(spec)
    core.start(0.0)
    return core


def test_tasks_start_servers_first_and_the_chief_last() -> None:
    core = PsJobCore(PsJobSpec(ps=2, workers=2, evaluator=True))
    decision = core.start(0.0)
    assert [str(launch.task) for launch in decision.launches] == [
        "ps:0", "ps:1", "worker:0", "worker:1", "chief:0", "evaluator:0"
    ]  # fmt: skip
    assert [launch.node_id for launch in decision.launches] == list(range(6))
    assert decision.events[0].kind == "job_started"
    with pytest.raises(RuntimeError):
        core.start(0.0)


def test_tf_config_names_the_task_and_leaves_the_evaluator_out_of_the_cluster() -> None:
    cluster = {Role.CHIEF: ["h:1"], Role.PS: ["h:2", "h:3"], Role.WORKER: ["h:4"], Role.EVALUATOR: ["h:5"]}
    config = json.loads(tf_config(cluster, PS1))
    assert config == {"cluster": {"chief": ["h:1"], "ps": ["h:2", "h:3"], "worker": ["h:4"]},
                      "task": {"type": "ps", "index": 1}}  # fmt: skip
    assert json.loads(tf_config(cluster, TaskKey(Role.EVALUATOR, 0)))["task"] == {"type": "evaluator", "index": 0}
    with pytest.raises(ConfigError, match="worker:3 has no address"):
        tf_config(cluster, TaskKey(Role.WORKER, 3))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ps": 0}, "ps must be a positive integer"),
        ({"workers": 2, "min_workers": 3}, "min_workers"),
        ({"oom_memory_growth": 0.5}, "oom_memory_growth"),
        ({"max_task_memory_mb": 0}, "max_task_memory_mb"),
        ({"task_start_timeout_s": 0}, "task_start_timeout_s"),
        ({"max_relaunches": -1}, "max_relaunches"),
        ({"resources": {"gpu": Resources(cpu=1, memory_mb=1)}}, "not a PS-job role"),
    ],
)
def test_a_bad_spec_is_refused_with_the_value_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PsJobSpec(**kwargs)  # type: ignore[arg-type]


def test_a_lost_worker_is_relaunched_and_the_chief_keeps_training() -> None:
    core = _started(PsJobSpec(ps=2, workers=2))
    decision = core.observe(_failed(3), 1.0)
    assert [(str(x.task), x.node_id, x.relaunch_count) for x in decision.launches] == [("worker:1", 5, 1)]
    assert decision.stops == ()
    assert decision.outcome is None
    assert [e.kind for e in decision.events] == ["task_failed", "task_relaunched"]
    assert core.node_of(W1) == 5
    assert core.task_of(3) == W1
    assert core.relaunches(W1) == (1, 1)
    assert core.phase(CHIEF) is TaskPhase.LAUNCHED


def test_a_lost_parameter_server_restarts_the_chief_once_its_old_incarnation_ended() -> None:
    core = _started(PsJobSpec(ps=2, workers=2))
    core.observe({4: ObservedNode(4, ObservedState.RUNNING)}, 1.0)
    decision = core.observe(_failed(1), 1.0)
    assert [str(x.task) for x in decision.launches] == ["ps:1"]
    assert [(str(s.task), s.node_id) for s in decision.stops] == [("chief:0", 4)]
    assert core.phase(CHIEF) is TaskPhase.WAITING
    # Still running: the new chief would share its address with the old one.
    assert core.observe({4: ObservedNode(4, ObservedState.RUNNING)}, 1.0).launches == ()
    decision = core.observe({4: ObservedNode(4, ObservedState.STOPPED)}, 1.0)
    assert [(str(x.task), x.node_id) for x in decision.launches] == [("chief:0", 6)]
    assert core.relaunches(CHIEF) == (1, 0), "a chief restarted for a lost parameter server is not charged"


def test_two_parameter_servers_lost_together_restart_the_chief_once() -> None:
    core = _started(PsJobSpec(ps=2, workers=1))
    decision = core.observe({**_failed(0), **_failed(1)}, 1.0)
    assert sorted(str(x.task) for x in decision.launches) == ["ps:0", "ps:1"]
    assert len(decision.stops) == 1


def test_the_chief_succeeding_ends_the_job_and_stops_the_servers() -> None:
    core = _started(PsJobSpec(ps=1, workers=1))
    decision = core.observe({2: ObservedNode(2, ObservedState.SUCCEEDED, exit_code=0)}, 1.0)
    assert decision.outcome is not None
    assert decision.outcome.succeeded
    assert sorted(s.node_id for s in decision.stops) == [0, 1]
    assert core.observe(_failed(0), 1.0) == type(decision)(), "nothing is decided after the end"


def test_a_failing_chief_is_relaunched_until_its_budget_is_spent() -> None:
    core = _started(PsJobSpec(ps=1, workers=1, max_relaunches=1))
    decision = core.observe(_failed(2, code=1), 1.0)
    assert [str(x.task) for x in decision.launches] == ["chief:0"]
    decision = core.observe(_failed(3, code=1), 1.0)
    assert decision.outcome is not None
    assert not decision.outcome.succeeded
    assert "chief:0 exited with status 1 after 1 relaunches" in decision.outcome.reason


def test_a_disruption_is_relaunched_without_charging_the_budget() -> None:
    core = _started(PsJobSpec(ps=1, workers=1, max_relaunches=0))
    decision = core.observe(_failed(1, reason="Preempted", disruption=True), 1.0)
    assert [str(x.task) for x in decision.launches] == ["worker:0"]
    assert core.relaunches(W0) == (1, 0)


def test_a_worker_past_its_budget_is_left_out_while_enough_run() -> None:
    core = _started(PsJobSpec(ps=1, workers=2, min_workers=1, max_relaunches=0))
    decision = core.observe(_failed(2), 1.0)
    assert decision.launches == ()
    assert decision.outcome is None
    assert core.phase(W1) is TaskPhase.LEFT_OUT
    assert [e.kind for e in decision.events] == ["task_failed", "task_left_out", "cluster_restarting"]


def test_the_cluster_restarts_without_a_left_out_worker_and_the_others_are_numbered_again() -> None:
    # ps 0, workers 1-3, chief 4; worker:1 (node 2) fails past its budget while two others still run
    core = _steady(PsJobSpec(ps=1, workers=3, min_workers=1, max_relaunches=1))
    running = {n: ObservedNode(n, ObservedState.RUNNING) for n in range(5)}
    core.observe({**running, 3: ObservedNode(3, ObservedState.FAILED, exit_code=1)}, 2.0)  # worker:2 relaunched
    running = {
        **running,
        3: ObservedNode(3, ObservedState.FAILED, exit_code=1),
        5: ObservedNode(5, ObservedState.RUNNING),
    }
    core.observe({**running, 2: ObservedNode(2, ObservedState.FAILED, exit_code=1)}, 3.0)  # worker:1 relaunched
    running = {
        **running,
        2: ObservedNode(2, ObservedState.FAILED, exit_code=1),
        6: ObservedNode(6, ObservedState.RUNNING),
    }
    decision = core.observe({**running, 6: ObservedNode(6, ObservedState.FAILED, exit_code=1)}, 4.0)
    assert [e.kind for e in decision.events] == ["task_failed", "task_left_out", "cluster_restarting"]
    assert [(s.node_id, s.graceful) for s in decision.stops] == [(4, True)], "the chief first, to checkpoint"
    assert core.resizing
    assert "a resize is under way" in core.add_ps("hot", 4.0).events[0].message
    running = {**running, 6: ObservedNode(6, ObservedState.FAILED, exit_code=1)}
    decision = core.observe({**running, 4: ObservedNode(4, ObservedState.STOPPED)}, 5.0)
    assert sorted(s.node_id for s in decision.stops) == [0, 1, 5]
    ended = {n: ObservedNode(n, ObservedState.STOPPED) for n in range(7)}
    decision = core.observe(ended, 6.0)
    assert [str(x.task) for x in decision.launches] == ["ps:0", "worker:0", "worker:1", "chief:0"]
    assert [e.kind for e in decision.events] == ["cluster_restarted"]
    assert decision.events[0].data == {"ps": 1, "workers": 2, "renumbered": {"worker:2": "worker:1"}}
    assert not core.resizing
    assert core.spec.workers == 2
    # worker:2, now worker:1, kept its budget: one relaunch charged of one
    assert core.relaunches(W1) == (2, 1)
    assert core.relaunches(W0) == (1, 0)


def test_a_left_out_worker_whose_node_still_stops_keeps_its_address_until_it_has_ended() -> None:
    spec = PsJobSpec(ps=1, workers=2, min_workers=1, max_relaunches=0, task_start_timeout_s=10.0)
    core = _started(spec)  # ps 0, workers 1-2, chief 3
    core.observe({n: ObservedNode(n, ObservedState.RUNNING) for n in (0, 1, 3)}, 1.0)
    pending = {
        **{n: ObservedNode(n, ObservedState.RUNNING) for n in (0, 1, 3)},
        2: ObservedNode(2, ObservedState.PENDING),
    }
    decision = core.observe(pending, 20.0)  # worker:1 never started: stopped, left out
    assert (2, False) in [(s.node_id, s.graceful) for s in decision.stops]
    core.observe({**pending, 3: ObservedNode(3, ObservedState.STOPPED)}, 21.0)  # the chief ended: cluster held
    ended = {n: ObservedNode(n, ObservedState.STOPPED) for n in (0, 1, 3)}
    decision = core.observe({**ended, 2: ObservedNode(2, ObservedState.PENDING)}, 22.0)
    assert decision.launches == (), "worker:1's node still holds the address the next worker:1 would take"
    decision = core.observe({**ended, 2: ObservedNode(2, ObservedState.STOPPED)}, 23.0)
    assert [str(x.task) for x in decision.launches] == ["ps:0", "worker:0", "chief:0"]


def test_a_task_killed_for_memory_comes_back_with_more_up_to_the_cap() -> None:
    spec = PsJobSpec(ps=1, workers=1, resources={Role.PS: Resources(cpu=1, memory_mb=1000)}, max_task_memory_mb=1800)
    core = _started(spec)
    decision = core.observe(_failed(0, reason=REASON_OOM_KILLED), 1.0)
    assert [x.resources.memory_mb for x in decision.launches if x.resources] == [1500]
    assert "oom_more_memory" in [e.kind for e in decision.events]
    decision = core.observe(_failed(3, reason=REASON_OOM_KILLED), 1.0)
    assert [x.resources.memory_mb for x in decision.launches if x.resources] == [1800]
    decision = core.observe(_failed(4, reason=REASON_OOM_KILLED), 1.0)
    assert decision.outcome is not None
    assert "out of memory at 1800 MiB" in decision.outcome.reason


def test_an_oom_without_a_memory_request_comes_back_as_it_was() -> None:
    core = _started(PsJobSpec(ps=1, workers=1))
    decision = core.observe(_failed(1, reason=REASON_OOM_KILLED), 1.0)
    assert [x.resources for x in decision.launches] == [None]
    assert "oom_no_limit" in [e.kind for e in decision.events]


def test_a_server_that_exits_zero_is_a_failure() -> None:
    core = _started(PsJobSpec(ps=1, workers=1))
    decision = core.observe({1: ObservedNode(1, ObservedState.SUCCEEDED, exit_code=0)}, 1.0)
    assert [str(x.task) for x in decision.launches] == ["worker:0"]
    assert "which a server never does" in decision.events[0].message


def test_a_chief_that_succeeds_while_a_restart_is_on_its_way_ends_the_job() -> None:
    core = _started(PsJobSpec(ps=1, workers=1))
    decision = core.observe({**_failed(0), 2: ObservedNode(2, ObservedState.SUCCEEDED, exit_code=0)}, 1.0)
    assert decision.outcome is not None, decision
    assert decision.outcome.succeeded
    assert decision.launches == (), "nothing starts after the end, not even the lost server's relaunch"
    # The worker, and the chief's stop sent before its end was seen.
    assert {s.node_id for s in decision.stops} <= {1, 2}


def test_nothing_is_launched_in_the_look_that_ends_the_job() -> None:
    core = _started(PsJobSpec(ps=1, workers=2))
    decision = core.observe({**_failed(1), 3: ObservedNode(3, ObservedState.SUCCEEDED, exit_code=0)}, 1.0)
    assert decision.outcome is not None
    assert decision.outcome.succeeded
    assert decision.launches == ()
    assert sorted(s.node_id for s in decision.stops) == [0, 2], "only nodes that run are stopped"


def test_an_evaluator_that_finishes_is_done_and_not_relaunched() -> None:
    core = _started(PsJobSpec(ps=1, workers=1, evaluator=True))
    decision = core.observe({3: ObservedNode(3, ObservedState.SUCCEEDED, exit_code=0)}, 1.0)
    assert decision.launches == ()
    assert [e.kind for e in decision.events] == ["task_succeeded"]
    assert core.phase(TaskKey(Role.EVALUATOR, 0)) is TaskPhase.SUCCEEDED


def test_a_worker_out_of_memory_at_the_cap_is_left_out_while_enough_run() -> None:
    spec = PsJobSpec(ps=1, workers=2, min_workers=1, resources={Role.WORKER: Resources(cpu=1, memory_mb=100)},
                     max_task_memory_mb=100)  # fmt: skip
    core = _started(spec)
    decision = core.observe(_failed(1, reason=REASON_OOM_KILLED), 1.0)
    assert decision.outcome is None
    assert decision.launches == ()
    assert [e.kind for e in decision.events] == ["task_failed", "task_left_out", "cluster_restarting"]
    assert "ran out of memory at 100 MiB" in decision.events[1].message


def test_role_memory_above_the_cap_is_refused() -> None:
    with pytest.raises(ConfigError, match="ps memory 200 MiB exceeds max_task_memory_mb 100"):
        PsJobSpec(resources={Role.PS: Resources(cpu=1, memory_mb=200)}, max_task_memory_mb=100)


def test_a_task_that_never_starts_is_stopped_and_relaunched_once_its_node_ended() -> None:
    core = PsJobCore(PsJobSpec(ps=1, workers=1, task_start_timeout_s=10))
    core.start(0.0)
    running = {n: ObservedNode(n, ObservedState.RUNNING) for n in (0, 2)}
    pending = {1: ObservedNode(1, ObservedState.PENDING)}
    assert core.observe({**running, **pending}, 10.0).stops == ()
    decision = core.observe({**running, **pending}, 10.5)
    assert [(str(s.task), s.node_id) for s in decision.stops] == [("worker:0", 1)]
    assert decision.launches == (), "the new node waits for the old one, which would hold the same address"
    assert "did not start within 10 s" in decision.events[0].message
    decision = core.observe({**running, 1: ObservedNode(1, ObservedState.STOPPED)}, 11.0)
    assert [(str(x.task), x.node_id) for x in decision.launches] == [("worker:0", 3)]
    assert core.relaunches(W0) == (1, 1)


def test_an_old_node_the_backend_no_longer_reports_counts_as_ended() -> None:
    core = _started(PsJobSpec(ps=1, workers=1))
    core.observe(_failed(0), 1.0)  # the chief (node 2) is told to stop
    decision = core.observe({}, 2.0)
    assert [(str(x.task), x.node_id) for x in decision.launches] == [("chief:0", 4)]


def test_the_chiefs_restart_and_a_relaunch_are_told_apart_in_the_events() -> None:
    core = _started(PsJobSpec(ps=1, workers=1))
    core.observe(_failed(0), 1.0)
    decision = core.observe({2: ObservedNode(2, ObservedState.STOPPED)}, 2.0)
    assert [e.kind for e in decision.events] == ["task_restarted"]


def _steady(spec: PsJobSpec) -> PsJobCore:
    core = _started(spec)
    count = len(spec.tasks())
    core.observe({n: ObservedNode(n, ObservedState.RUNNING) for n in range(count)}, 1.0)
    return core


def test_adding_a_parameter_server_stops_the_chief_then_the_cluster_then_starts_it_bigger() -> None:
    core = _steady(PsJobSpec(ps=2, workers=1))  # ps 0-1, worker 2, chief 3
    running = {n: ObservedNode(n, ObservedState.RUNNING) for n in range(4)}
    decision = core.add_ps("ps 0 hot", 2.0)
    assert [(str(s.task), s.node_id) for s in decision.stops] == [("chief:0", 3)]
    assert [e.kind for e in decision.events] == ["ps_adding"]
    assert core.observe(running, 3.0).stops == (), "the servers run until the chief has checkpointed and ended"
    decision = core.observe({**running, 3: ObservedNode(3, ObservedState.STOPPED, exit_code=143)}, 4.0)
    assert sorted(s.node_id for s in decision.stops) == [0, 1, 2]
    assert decision.launches == ()
    ended = {n: ObservedNode(n, ObservedState.STOPPED) for n in range(4)}
    assert core.observe({**ended, 2: ObservedNode(2, ObservedState.RUNNING)}, 5.0).launches == ()
    decision = core.observe(ended, 6.0)
    assert [str(x.task) for x in decision.launches] == ["ps:0", "ps:1", "ps:2", "worker:0", "chief:0"]
    assert [e.kind for e in decision.events] == ["ps_added"]
    assert core.spec.ps == 3
    assert core.relaunches(TaskKey(Role.PS, 0)) == (1, 0), "a planned restart is not charged"


def test_adding_a_parameter_server_waits_for_a_steady_job() -> None:
    core = _started(PsJobSpec(ps=1, workers=1))
    decision = core.add_ps("hot", 1.0)
    assert decision.stops == ()
    assert [e.kind for e in decision.events] == ["ps_add_deferred"]
    core = _steady(PsJobSpec(ps=1, workers=1))
    core.add_ps("hot", 2.0)
    again = core.add_ps("hot", 3.0)
    assert again.stops == ()
    assert "a resize is under way" in again.events[0].message


def test_a_server_lost_during_the_resize_waits_for_the_cluster_and_the_chief_loses_its_grace() -> None:
    core = _steady(PsJobSpec(ps=2, workers=1))  # ps 0-1, worker 2, chief 3
    core.add_ps("hot", 2.0)
    decision = core.observe({**_failed(0), 3: ObservedNode(3, ObservedState.RUNNING)}, 3.0)
    assert decision.launches == (), "it starts again with the cluster"
    assert [e.kind for e in decision.events] == ["task_failed", "task_held"]
    assert [(s.node_id, s.graceful) for s in decision.stops] == [(3, False)], "nothing left for the chief to save"
    assert core.relaunches(PS0) == (0, 1), "charged all the same"
    running = {n: ObservedNode(n, ObservedState.RUNNING) for n in (1, 2)}
    decision = core.observe(
        {**running, 0: ObservedNode(0, ObservedState.FAILED), 3: ObservedNode(3, ObservedState.FAILED)}, 4.0
    )
    assert sorted(s.node_id for s in decision.stops) == [1, 2]
    ended = {n: ObservedNode(n, ObservedState.STOPPED) for n in range(4)}
    decision = core.observe(ended, 5.0)
    assert [str(x.task) for x in decision.launches] == ["ps:0", "ps:1", "ps:2", "worker:0", "chief:0"]


def test_a_task_failing_in_the_look_the_chief_ended_starts_again_with_the_cluster() -> None:
    core = _steady(PsJobSpec(ps=1, workers=2))  # ps 0, workers 1-2, chief 3
    core.add_ps("hot", 2.0)
    running = {n: ObservedNode(n, ObservedState.RUNNING) for n in range(4)}
    decision = core.observe({**running, **_failed(1), 3: ObservedNode(3, ObservedState.STOPPED)}, 3.0)
    assert decision.launches == ()
    assert sorted(s.node_id for s in decision.stops) == [0, 2], "the cluster is held; worker:0's node has ended"
    ended = {n: ObservedNode(n, ObservedState.STOPPED) for n in range(4)}
    decision = core.observe(ended, 5.0)
    assert [str(x.task) for x in decision.launches] == ["ps:0", "ps:1", "worker:0", "worker:1", "chief:0"]


def test_an_evaluator_that_finished_during_the_resize_stays_done() -> None:
    core = _steady(PsJobSpec(ps=1, workers=1, evaluator=True))  # ps 0, worker 1, chief 2, evaluator 3
    core.add_ps("hot", 2.0)
    running = {n: ObservedNode(n, ObservedState.RUNNING) for n in range(4)}
    core.observe({**running, 2: ObservedNode(2, ObservedState.STOPPED)}, 3.0)
    decision = core.observe({**running, 2: ObservedNode(2, ObservedState.STOPPED),
                             3: ObservedNode(3, ObservedState.SUCCEEDED, exit_code=0)}, 4.0)  # fmt: skip
    assert "task_succeeded" in [e.kind for e in decision.events]
    ended = {n: ObservedNode(n, ObservedState.STOPPED) for n in range(3)}
    decision = core.observe({**ended, 3: ObservedNode(3, ObservedState.SUCCEEDED, exit_code=0)}, 5.0)
    assert "evaluator:0" not in [str(x.task) for x in decision.launches]
