from __future__ import annotations

import json
import logging
import os
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import psutil
import pytest

from dlrover.common import exiting_status
from dlrover.common.step_slots import SlotReading
from dlrover.diagnosis import (
    MEMORY_RECORD,
    NO_OOM_KILL,
    ActionKind,
    Decision,
    Diagnosis,
    Evidence,
    FailureKind,
    OomWatch,
    RuleRegistry,
    classify,
)
from dlrover.launcher.agent import Agent, AgentConfig, AgentResult
from dlrover.launcher.control import FailureReport, NodeRegistration, RoundAssignment
from dlrover.launcher.env import standby_env
from dlrover.launcher.fake_control import FakeControlPlane
from dlrover.launcher.store_host import FakeStoreHost
from dlrover.launcher.workers import StandbyPool

WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    out, mode = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
            "TORCHELASTIC_RUN_ID", "DLROVER_NODE_ID", "DLROVER_JOB_ID"]
    record = {k: os.environ.get(k) for k in keys}
    record["slow_import_loaded"] = "slow_import" in sys.modules  # imported by the standby it ran in
    if mode == "gloo":
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t)
        record["sum"] = t.item()
        dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}_attempt{attempt}_pid{os.getpid()}.json"), "w") as f:
        json.dump(record, f)
    if mode == "fail_first" and attempt == 0 and rank == 1:
        print("RuntimeError: injected failure", file=sys.stderr)
        sys.exit(7)
    if mode == "always_fail" and rank == 0:
        sys.exit(3)
    if mode == "record_fail" and attempt == 0 and rank == 1:
        from torch.distributed.elastic.multiprocessing.errors import record

        @record
        def train():
            raise ValueError("boom from a function under @record")

        train()
    if mode == "oom_killed" and attempt == 0 and rank == 1:
        # As the kernel's OOM killer: count the kill in the (faked) memory cgroup, then SIGKILL.
        events = os.path.join(os.path.dirname(out), "cgroup", "memory.events")
        with open(events, "w") as f:
            f.write("oom 1\\noom_kill 1\\n")
        import signal
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "sigkilled" and attempt == 0 and rank == 1:
        import signal
        os.kill(os.getpid(), signal.SIGKILL)  # as a person or a tool: no OOM kill counted
    if mode == "sleep":
        time.sleep(600)
    if mode == "step_stall":
        from dlrover.common.step_slots import StepReporter
        reporter = StepReporter.from_env()
        def stalled_before_the_collective():
            time.sleep(600)
        for step in range(1, 11):
            if attempt == 0 and step == 6:
                if rank == 1:
                    stalled_before_the_collective()
                time.sleep(600)  # rank 0 waits for its peer
            time.sleep(0.05)
            reporter.step(step, samples=2)
    if mode == "stuck_dying" and attempt == 0:
        if rank == 1:
            import signal
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a process in its teardown
            open(os.path.join(out, "rank1_ignoring"), "w").close()
        time.sleep(600)
    if mode == "peer_fails" and attempt == 0:
        ready = os.path.join(out, "rank0_ready")
        if rank == 0:
            import signal
            def on_term(signum, frame):
                open(os.path.join(out, "rank0_sigterm"), "w").close()
                os._exit(143)
            signal.signal(signal.SIGTERM, on_term)
            open(ready, "w").close()
            time.sleep(600)
        while not os.path.exists(ready):
            time.sleep(0.01)
        sys.exit(7)
    """
)


def _agent(
    tmp_path: Path,
    mode: str,
    control: FakeControlPlane,
    read_exiting_status: Callable[[int], int | None] = exiting_status,
    oom_watch: OomWatch | None = None,
    *,
    standby: StandbyPool | None = None,
    store_host: FakeStoreHost | None = None,
    **kwargs: object,
) -> Agent:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    defaults: dict[str, object] = {
        "worker_argv": (sys.executable, str(script), str(out), mode),
        "nproc_per_node": 2,
        "run_id": "job1",
        "monitor_interval_s": 0.05,
        "shutdown_grace_s": 5.0,
        "log_dir": tmp_path / "logs",
        "redirects": {0: 3, 1: 3},
    }
    defaults.update(kwargs)
    config = AgentConfig(**defaults)  # type: ignore[arg-type]
    return Agent(
        config, control, read_exiting_status=read_exiting_status, oom_watch=oom_watch, standby=standby,
        store_host=store_host,
    )  # fmt: skip


def _records(tmp_path: Path) -> dict[str, dict[str, object]]:
    return {p.stem.rsplit("_pid", 1)[0]: json.loads(p.read_text()) for p in (tmp_path / "out").glob("*.json")}


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_workers_get_torchruns_environment_and_run_a_gloo_all_reduce(tmp_path: Path) -> None:
    control = FakeControlPlane()
    result = _agent(tmp_path, "gloo", control).run()
    assert result.exit_code == 0, result.reason
    records = _records(tmp_path)
    assert set(records) == {"rank0_attempt0", "rank1_attempt0"}
    for rank in (0, 1):
        env = records[f"rank{rank}_attempt0"]
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == "0"
        assert env["TORCHELASTIC_RUN_ID"] == "job1"
        assert env["DLROVER_JOB_ID"] == "job1"  # what a FlashCheckpointer names its memory after
        assert env["DLROVER_NODE_ID"] == "node-0"
        assert env["sum"] == 3.0
    assert control.successes == 1
    (run_dir,) = (tmp_path / "logs").glob("job1_*")  # this agent's own folder, as torchrun's
    assert (run_dir / "attempt_0" / "0" / "stdout.log").exists()


@pytest.mark.integration
def test_a_failed_worker_is_reported_with_evidence_and_restarted(tmp_path: Path) -> None:
    control = FakeControlPlane()
    result = _agent(tmp_path, "fail_first", control, max_restarts=2).run()
    assert result.exit_code == 0, result.reason
    assert result.restarts == 1
    assert len(control.failures) == 1
    report = control.failures[0]
    assert report.local_rank == 1
    assert report.exit_code == 7
    assert "injected failure" in report.evidence
    assert "its error file" not in report.evidence  # it wrote none
    records = _records(tmp_path)
    assert {"rank0_attempt1", "rank1_attempt1"} <= set(records)
    assert records["rank1_attempt1"]["TORCHELASTIC_RESTART_COUNT"] == "1"
    # The job id stays across the restart: restarted workers find their flash checkpoints.
    assert {r["DLROVER_JOB_ID"] for r in records.values()} == {"job1"}


def _sigkilled_worker_report(tmp_path: Path, mode: str, kills_before: int) -> tuple[str, Diagnosis]:
    """A worker SIGKILLed in `mode` under an agent whose memory cgroup (faked) counted `kills_before`
    OOM kills: the failure's evidence, and what the master's classifier makes of it."""
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.events").write_text(f"low 0\nhigh 0\nmax 0\noom 0\noom_kill {kills_before}\n")
    control = FakeControlPlane()
    watch = OomWatch(cgroup_root=cgroup, kmsg=tmp_path / "no-kmsg", own_cgroups=tmp_path / "no-self")
    result = _agent(tmp_path, mode, control, oom_watch=watch, max_restarts=2).run()
    assert result.exit_code == 0, result.reason
    (report,) = control.failures
    assert report.signal_name == "SIGKILL"
    evidence = Evidence.from_text(report.evidence, returncode=report.exit_code)
    return report.evidence, classify(evidence, RuleRegistry.with_builtin_rules())


@pytest.mark.integration
def test_a_sigkill_the_cgroup_did_not_count_is_reported_as_read_and_decided_as_killed(tmp_path: Path) -> None:
    evidence, diagnosis = _sigkilled_worker_report(tmp_path, "sigkilled", kills_before=2)
    assert f"{NO_OOM_KILL}: the memory cgroup's oom_kill count stayed at 2" in evidence
    # What the master makes of it: someone's SIGKILL (restart in place), not a presumed OOM kill.
    assert (diagnosis.kind, diagnosis.rule) == (FailureKind.KILLED, "sigkill-exit")


@pytest.mark.integration
def test_the_cgroups_oom_kill_record_reaches_the_failure_report(tmp_path: Path) -> None:
    evidence, diagnosis = _sigkilled_worker_report(tmp_path, "oom_killed", kills_before=0)
    assert f"{MEMORY_RECORD}: the memory cgroup's oom_kill count rose from 0 to 1" in evidence
    # What the master makes of it: an OOM kill, not a SIGKILL of unknown cause.
    assert diagnosis.kind is FailureKind.HOST_OOM


@pytest.mark.integration
@pytest.mark.parametrize("beside_logs", [True, False])
def test_what_a_worker_records_in_its_error_file_reaches_the_failure_report(tmp_path: Path, beside_logs: bool) -> None:
    # As under torchrun, every worker gets TORCHELASTIC_ERROR_FILE; torch's @record writes there.
    control = FakeControlPlane()
    where = {"log_dir": tmp_path / "logs"} if beside_logs else {"log_dir": None, "error_dir": tmp_path / "errors"}
    result = _agent(tmp_path, "record_fail", control, max_restarts=1, **where).run()
    assert result.exit_code == 0, result.reason
    (report,) = control.failures
    assert report.local_rank == 1
    _, marker, recorded = report.evidence.partition("--- its error file (torch.distributed.elastic @record) ---\n")
    assert marker, report.evidence
    assert recorded.startswith("ValueError: boom from a function under @record")
    assert "Traceback" in recorded  # the call stack @record saved
    root = tmp_path / ("logs" if beside_logs else "errors")
    (run_dir,) = root.glob("job1_*")
    assert (run_dir / "attempt_0" / "1" / "error-rank1.json").exists()


class _ReportAfterSurvivorStopped(FakeControlPlane):
    """Answers a failure report only once the surviving worker has been sent SIGTERM."""

    def __init__(self, sigterm_file: Path) -> None:
        super().__init__()
        self._sigterm_file = sigterm_file

    def report_failure(self, report: FailureReport) -> Decision:
        deadline = time.monotonic() + 60.0
        while not self._sigterm_file.exists():
            assert time.monotonic() < deadline, "the surviving worker was not stopped before the master answered"
            time.sleep(0.01)
        return super().report_failure(report)


@pytest.mark.integration
def test_the_other_workers_are_stopped_as_soon_as_one_fails_without_waiting_for_the_master(tmp_path: Path) -> None:
    # Every answer to a failure stops this node's workers, so their teardown (seconds for a
    # worker holding tens of GB) need not wait for the report's round trip.
    control = _ReportAfterSurvivorStopped(tmp_path / "out" / "rank0_sigterm")
    result = _agent(tmp_path, "peer_fails", control, max_restarts=1).run()
    assert result.exit_code == 0, result.reason
    assert [(r.local_rank, r.exit_code) for r in control.failures] == [(1, 7)]  # not rank 0's SIGTERM
    assert {"rank0_attempt1", "rank1_attempt1"} <= set(_records(tmp_path))


@pytest.mark.integration
def test_a_worker_stuck_exiting_is_reported_as_its_failure_not_as_a_hang(tmp_path: Path) -> None:
    # Rank 1 "begins to exit" with SIGKILL (as /proc would show) but is not reaped for a while,
    # longer than the hang timeout, as a worker whose memory the kernel is still freeing: the
    # agent stops rank 0 at once, waits, and reports the SIGKILL, not a hang of the aftermath.
    out = tmp_path / "out"
    ignoring = out / "rank1_ignoring"

    def rank1_pid() -> int | None:
        found = list(out.glob("rank1_attempt0_pid*.json"))
        return int(found[0].stem.rsplit("_pid", 1)[1]) if found else None

    def exiting(pid: int) -> int | None:
        return int(signal.SIGKILL) if ignoring.exists() and pid == rank1_pid() else None

    def kill_later() -> None:
        deadline = time.monotonic() + 60.0
        while not ignoring.exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(3.0)  # three hang timeouts of "teardown"
        pid = rank1_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)

    control = FakeControlPlane()
    agent = _agent(tmp_path, "stuck_dying", control, exiting, max_restarts=1, hang_timeout_s=1.0)
    killer = threading.Thread(target=kill_later)
    killer.start()
    result = agent.run()
    killer.join(60)
    assert result.exit_code == 0, result.reason
    assert [(r.local_rank, r.signal_name, r.hang) for r in control.failures] == [(1, "SIGKILL", False)]


@pytest.mark.integration
def test_a_failure_report_is_retried_while_the_master_is_unreachable(tmp_path: Path) -> None:
    control = FakeControlPlane(unreachable_reports=2)
    result = _agent(tmp_path, "fail_first", control, max_restarts=2).run()
    assert result.exit_code == 0, result.reason
    assert result.restarts == 1
    assert len(control.failures) == 1


class _SecondOfThreeUnevenNodes(FakeControlPlane):
    """This node is node rank 1 of 3 nodes that run 3, 2 and 4 workers."""

    def next_round(self, *args: object, **kwargs: object) -> RoundAssignment:
        assignment = super().next_round(*args, **kwargs)  # type: ignore[arg-type]
        return attrs.evolve(assignment, group_rank=1, group_world_size=3, first_worker_rank=3, worker_world_size=9)


@pytest.mark.integration
def test_workers_of_a_node_among_uneven_nodes_get_the_ranks_torchrun_gives(tmp_path: Path) -> None:
    control = _SecondOfThreeUnevenNodes()
    result = _agent(tmp_path, "record", control).run()
    assert result.exit_code == 0, result.reason
    records = _records(tmp_path)
    assert set(records) == {"rank3_attempt0", "rank4_attempt0"}
    for local_rank in (0, 1):
        env = records[f"rank{3 + local_rank}_attempt0"]
        assert env["LOCAL_RANK"] == str(local_rank)
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("9", "2")
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == ("1", "3")


def test_a_round_assignment_that_says_nothing_stands_for_even_nodes() -> None:
    even = RoundAssignment(1, 2, 3, "127.0.0.1", 1)
    assert even.worker_ranks(4) == (8, 12)
    uneven = attrs.evolve(even, first_worker_rank=5, worker_world_size=7)
    assert uneven.worker_ranks(4) == (5, 7)


@pytest.mark.integration
def test_restarts_are_bounded(tmp_path: Path) -> None:
    control = FakeControlPlane()
    result = _agent(tmp_path, "always_fail", control, max_restarts=1).run()
    assert result.exit_code == 1
    assert result.restarts == 1
    assert len(control.failures) == 2
    # The master keeps the count (the agent declared its budget) and its stop is the reason.
    assert control.declared_max_restarts == [1]
    assert result.reason == (
        "the master stopped the job: transient; restarted 1 of 1 times (--max-restarts), no restarts left: "
        "the job stops"
    )
    assert control.left == 1


@pytest.mark.integration
def test_the_master_can_stop_the_job_after_one_attempt(tmp_path: Path) -> None:
    control = FakeControlPlane(failure_decisions=[(ActionKind.ABORT_JOB, "user code error: ImportError")])
    result = _agent(tmp_path, "always_fail", control, max_restarts=5).run()
    assert result.exit_code == 1
    assert result.restarts == 0
    assert "ImportError" in result.reason


@pytest.mark.integration
def test_membership_change_starts_a_new_round_without_using_a_restart(tmp_path: Path) -> None:
    out = tmp_path / "out"
    announced: list[bool] = []

    def nodes_waiting() -> int:
        # One node "arrives" once both workers of the first round are up.
        if not announced and len(list(out.glob("*_attempt0_pid*.json"))) == 2:
            announced.append(True)
            return 1
        return 0

    control = FakeControlPlane(nodes_waiting=nodes_waiting)
    # A sleeping worker never finishes, so the test stops the agent once the second round started.
    agent = _agent(tmp_path, "sleep", control, max_restarts=0, shutdown_grace_s=1.0)
    result = _run_until_stopped(agent, lambda: len(list((tmp_path / "out").glob("*_attempt0_pid*.json"))) == 4)
    assert len(control.rounds) == 2
    assert result.restarts == 0
    assert result.exit_code == 143


def _alive(pid: int) -> bool:
    """The process runs (exists and is not a zombie waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.integration
def test_a_node_waiting_to_join_is_seen_between_heartbeats(tmp_path: Path) -> None:
    out = tmp_path / "out"
    announced: list[bool] = []

    def nodes_waiting() -> int:
        # One node "arrives" once both workers of the first round are up.
        if not announced and len(list(out.glob("*_attempt0_pid*.json"))) == 2:
            announced.append(True)
            return 1
        return 0

    workers_alive: list[bool] = []  # at the announcement

    class _SeesTheWorkersAtTheAnnouncement(FakeControlPlane):
        def restarting_for_round(self, nodes_waiting: int, round_number: int) -> None:
            pids = [int(f.name.rsplit("_pid", 1)[1].split(".")[0]) for f in out.glob("*_attempt0_pid*.json")]
            workers_alive.extend(_alive(pid) for pid in pids)
            super().restarting_for_round(nodes_waiting, round_number)

    # One heartbeat at the start, the next an hour later: the round can only come from the
    # check between heartbeats.
    control = _SeesTheWorkersAtTheAnnouncement(nodes_waiting=nodes_waiting, heartbeat_interval_s=3600.0)
    agent = _agent(tmp_path, "sleep", control, max_restarts=0, shutdown_grace_s=1.0, waiting_check_interval_s=0.1)
    result = _run_until_stopped(agent, lambda: len(list(out.glob("*_attempt0_pid*.json"))) == 4)
    assert len(control.rounds) == 2
    assert result.restarts == 0
    # The rendezvous heard why before the workers stopped: their peers' broken collectives that
    # follow are this restart's consequence.
    assert control.round_restarts == [(1, 1)]  # one node waits; the workers of round 1 stop
    assert workers_alive == [True, True]
    # The first round's first heartbeat, the one the check brings forward (the master's word on
    # this node comes before the round), and at most the second round's first.
    assert len(control.heartbeats) <= 3


@pytest.mark.integration
def test_the_rendezvous_paces_the_checks_for_nodes_waiting(tmp_path: Path) -> None:
    # The rendezvous of a large job asks each node to ask again only after a while: the agent's
    # own interval (10 ms here) is the shortest it asks, not what it keeps to.
    # Heartbeats every 0.2 s, each of which also asks (not paced): across four of them the agent
    # makes at most the one check between heartbeats that it makes before the first answer.
    control = FakeControlPlane(heartbeat_interval_s=0.2, waiting_retry_after_s=3600.0)
    agent = _agent(tmp_path, "sleep", control, max_restarts=0, shutdown_grace_s=1.0, waiting_check_interval_s=0.01)
    _run_until_stopped(agent, lambda: len(control.heartbeats) >= 4)
    assert control.waiting_polls.count(True) <= 1
    assert control.waiting_polls.count(False) >= 4


def _run_until_stopped(agent: Agent, condition: Callable[[], bool]) -> AgentResult:
    """Run `agent` on a thread until `condition` holds, then stop it as a signal would; its result."""
    outcome: list[AgentResult] = []
    thread = threading.Thread(target=lambda: outcome.append(agent.run()))
    thread.start()
    try:
        _wait_for(condition)
    finally:
        agent.request_stop("test over")
        thread.join(60)
    assert not thread.is_alive()
    return outcome[0]


@pytest.mark.integration
def test_master_stop_action_stops_the_workers(tmp_path: Path) -> None:
    control = FakeControlPlane(actions=[[], [(ActionKind.REMOVE_NODE, "job stopped by a person")]])
    result = _agent(tmp_path, "sleep", control, shutdown_grace_s=1.0).run()
    assert result.exit_code == 1
    assert "job stopped by a person" in result.reason


def _wait_for(condition: object, timeout_s: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="nproc_per_node"):
        AgentConfig(worker_argv=("x",), nproc_per_node=0)
    with pytest.raises(ValueError, match="monitor_interval_s"):
        AgentConfig(worker_argv=("x",), monitor_interval_s=-1)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_an_exit_or_a_stop_is_acted_on_at_once_however_long_the_monitor_interval(tmp_path: Path) -> None:
    # With an hour between looks at the workers, only the wake on a worker's exit (its pidfd)
    # lets the failure be reported and the job finish, and only the wake on `request_stop` ends
    # a run whose workers sleep: the test's timeout fails either otherwise.
    control = FakeControlPlane()
    result = _agent(tmp_path, "fail_first", control, max_restarts=2, monitor_interval_s=3600.0).run()
    assert result.exit_code == 0, result.reason
    assert result.restarts == 1
    assert control.failures[0].exit_code == 7

    second = tmp_path / "second"
    second.mkdir()
    agent = _agent(second, "sleep", FakeControlPlane(), monitor_interval_s=3600.0, shutdown_grace_s=1.0)
    stopped = _run_until_stopped(agent, lambda: len(list((second / "out").glob("*_attempt0_pid*.json"))) == 2)
    assert stopped.exit_code == 143
    agent.request_stop("after the run: the wake pipe is closed, nothing is written")


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_workers_whose_step_reports_stop_are_reported_hung_with_every_stack(tmp_path: Path) -> None:
    from dlrover.diagnosis import HangConfig

    control = FakeControlPlane(heartbeat_interval_s=0.1)
    hang = HangConfig(k=5.0, floor_s=1.0, warmup_steps=1, first_steps_allowance_s=60.0, min_step_samples=2)
    result = _agent(tmp_path, "step_stall", control, max_restarts=1, step_hang=hang, heartbeat_interval_s=0.1).run()
    assert result.exit_code == 0, result.reason
    assert result.restarts == 1
    (report,) = control.failures
    assert report.hang
    assert "no step progress from rank(s) " in report.evidence
    assert "longer than its window of 1.0 s (the floor" in report.evidence
    assert "--- stack of local rank 0 (rank 0" in report.evidence
    rank1 = report.evidence.split("--- stack of local rank 1 (rank 1")[1]
    assert "stalled_before_the_collective" in rank1
    # The heartbeats carried both workers' step stats.
    carried = [hb for hb in control.heartbeats if len(hb.rank_steps) == 2]
    assert carried
    assert max(hb.samples for hb in carried) >= 4
    assert {r.rank for r in carried[-1].rank_steps} == {0, 1}


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_workers_that_never_report_steps_are_never_judged_by_them(tmp_path: Path) -> None:
    from dlrover.diagnosis import HangConfig

    control = FakeControlPlane()
    hang = HangConfig(k=5.0, floor_s=0.1, first_steps_allowance_s=0.2)
    result = _agent(tmp_path, "gloo", control, step_hang=hang).run()
    assert result.exit_code == 0, result.reason
    assert control.failures == []


def test_a_heartbeat_during_the_save_before_a_round_acknowledges_the_step_marks_it_carried(tmp_path: Path) -> None:
    control = FakeControlPlane()
    agent = _agent(tmp_path, "ok", control)
    agent._ledger.start_attempt(0, rendezvous_start=None, rendezvous_end=None, workers_start=0.0, wall_offset=0.0)
    agent._ledger.observe(SlotReading(2, 1, 4, 3.0, "train", 1.0, 1, 1.0, 0.0, 0.0))
    assert agent._heartbeat_while_saving() is None
    (carried,) = control.heartbeats[-1].attempts
    assert [m.step for m in carried.marks] == [1]
    # The master got the mark: the next heartbeat does not send (nor the master journal) it again.
    assert agent._ledger.reports()[0].marks == ()


SLOW_IMPORT = """
import os, pathlib, time
marks = pathlib.Path(os.environ["IMPORT_MARKS"])
(marks / f"importing-{os.getpid()}").touch()
while not (marks / "gate").exists():
    time.sleep(0.01)
(marks / f"warm-{os.getpid()}").touch()
"""


class _CountWarmAtRegistration(FakeControlPlane):
    """Counts the standbys that had finished importing when the agent registered; optionally opens the gate."""

    def __init__(self, marks: Path, open_gate: bool, round_formed: bool = True) -> None:
        super().__init__()
        self._marks = marks
        self._open_gate = open_gate
        self.round_formed = round_formed
        self.warm_at_registration = -1

    def register(self, *args: object, **kwargs: object) -> NodeRegistration:
        self.warm_at_registration = len(list(self._marks.glob("warm-*")))
        if self._open_gate:
            (self._marks / "gate").touch()
        return super().register(*args, **kwargs)  # type: ignore[arg-type]


@pytest.mark.integration
@pytest.mark.timeout(180)
def _slow_standbys_agent(tmp_path: Path, control: FakeControlPlane, wait_s: float) -> tuple[Agent, Path]:
    """An agent of two workers whose standbys import `slow_import` (held until `marks/gate` exists)."""
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    (tmp_path / "slow_import.py").write_text(SLOW_IMPORT)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]), "IMPORT_MARKS": str(marks)}
    agent = _agent(tmp_path, "gloo", control, worker_argv=(sys.executable, "-u", str(script), str(tmp_path / "out"),
                   "gloo"), prewarm_modules=("slow_import",), extra_env=env, prewarm_join_wait_s=wait_s)  # fmt: skip
    return agent, marks


@pytest.mark.parametrize("imports_end", ["before the wait runs out", "after it"])
def test_a_node_joining_a_training_job_registers_once_its_standbys_are_warm_or_its_wait_ran_out(
    tmp_path: Path, imports_end: str, caplog: pytest.LogCaptureFixture
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    in_time = imports_end == "before the wait runs out"
    control = _CountWarmAtRegistration(marks, open_gate=not in_time)
    agent, _ = _slow_standbys_agent(tmp_path, control, 120.0 if in_time else 0.5)

    def open_gate_once_both_import() -> None:
        deadline = time.monotonic() + 120
        while len(list(marks.glob("importing-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        (marks / "gate").touch()

    opener = threading.Thread(target=open_gate_once_both_import) if in_time else None
    if opener is not None:
        opener.start()
    with caplog.at_level(logging.INFO, logger="dlrover.launcher.agent"):
        result = agent.run()
    if opener is not None:
        opener.join()
    assert result.exit_code == 0, result.reason
    assert set(_records(tmp_path)) == {"rank0_attempt0", "rank1_attempt0"}
    said = [r.getMessage() for r in caplog.records]
    if in_time:
        assert control.warm_at_registration == 2, "the node registered before its standbys were warm"
        assert any("standby workers done importing after" in m for m in said)
    else:
        assert control.warm_at_registration == 0, "the imports end only once the node registered"
        assert any("still importing after 0.5 s: joining the job anyway" in m for m in said), said


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_standbys_started_before_the_agent_become_its_workers_and_end_with_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # dlrover-run starts them before it imports the agent (`early_standbys`), under the environment the
    # agent gives its standbys but for DLRover's own variables: taken, they run without starting again.
    marks = tmp_path / "marks"
    marks.mkdir()
    (marks / "gate").touch()
    (tmp_path / "slow_import.py").write_text(SLOW_IMPORT)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]), "IMPORT_MARKS": str(marks)}
    # No torch in the workers: numpy, which torch imports, sets OPENBLAS_MAIN_FREE for the length of its own
    # import, which a standby that did not import numpy itself takes for the program's write (noted on issue 29).
    argv = (sys.executable, "-u", str(script), str(tmp_path / "out"), "plain")
    early_env = standby_env({**os.environ, **env}, nproc_per_node=2, role="default", run_id="job1", max_restarts=0)
    pool = StandbyPool(argv, ("slow_import",), early_env, size=2)
    try:
        pool.fill()
        assert pool.wait_warm(120.0)
        early = {int(p.name.split("-")[1]) for p in marks.glob("warm-*")}
        assert len(early) == 2
        agent = _agent(tmp_path, "plain", FakeControlPlane(), standby=pool, worker_argv=argv,
                       prewarm_modules=("slow_import",), extra_env=env)  # fmt: skip
        with caplog.at_level(logging.INFO, logger="dlrover.launcher.agent"):
            result = agent.run()
    finally:
        pool.close()
    assert result.exit_code == 0, result.reason
    records = {p.name.split("_pid")[0]: int(p.stem.split("_pid")[1]) for p in (tmp_path / "out").glob("*.json")}
    assert set(records) == {"rank0_attempt0", "rank1_attempt0"}
    assert set(records.values()) == early, "the workers are the standbys started before the agent"
    # A standby that started again as a fresh interpreter (for an environment variable that differs from
    # the one it imported under) keeps its pid but not what it imported.
    assert all(r["slow_import_loaded"] for r in _records(tmp_path).values()), _records(tmp_path)
    assert pool.taken == 2
    assert any("started before the agent" in r.getMessage() for r in caplog.records)
    # The pool was the agent's: its refill for the next restart ended with the agent (the leak check also sees it).
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])]


class _JoinsAsNodeRank1(FakeControlPlane):
    """A running job's control plane: its round has formed, and this node joins the next one as node rank 1
    (it opens no store). Records the store host's calls when the round came; with `idle_polls_until_prepare`,
    the round comes only once the agent, polled as `next_round` polls it while a spare waits, prepared the
    store host (or after 60 s)."""

    def __init__(self, store: FakeStoreHost, *, idle_polls_until_prepare: bool = False) -> None:
        super().__init__()
        self.round_formed = True
        self._store_host = store
        self._until_prepare = idle_polls_until_prepare
        self.store_calls_at_round: list[tuple[str, str]] | None = None

    def next_round(
        self,
        timeout_s: float,
        should_stop: Callable[[], bool] = lambda: False,
        open_store: Callable[[str], int] | None = None,
    ) -> RoundAssignment:
        deadline = time.monotonic() + 60
        while self._until_prepare and ("prepare", "") not in self._store_host.calls and time.monotonic() < deadline:
            should_stop()
            time.sleep(0.02)
        self.store_calls_at_round = list(self._store_host.calls)
        assignment = RoundAssignment(1, 1, 2, "127.0.0.1", 40999, agent_store=True, first_worker_rank=2,
                                     worker_world_size=4)  # fmt: skip
        self.rounds.append(assignment)
        return assignment


def _warm_standby_agent(tmp_path: Path, control: FakeControlPlane, mode: str, store: FakeStoreHost,
                        **kwargs: object) -> Agent:  # fmt: skip
    """An agent of two workers with standbys that import `slow_import` (let through at once)."""
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    (marks / "gate").touch()
    (tmp_path / "slow_import.py").write_text(SLOW_IMPORT)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]), "IMPORT_MARKS": str(marks)}
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    argv = (sys.executable, "-u", str(script), str(tmp_path / "out"), mode)
    return _agent(tmp_path, mode, control, store_host=store, worker_argv=argv, prewarm_modules=("slow_import",),
                  extra_env=env, **kwargs)  # fmt: skip


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_node_joining_a_running_job_imports_for_the_store_only_once_its_workers_run(tmp_path: Path) -> None:
    # Its imports would take the CPU from the round every node waits on; it hosts no store in that round.
    store = FakeStoreHost()
    control = _JoinsAsNodeRank1(store)
    agent = _warm_standby_agent(tmp_path, control, "sleep", store, prewarm_refill_after_s=0.2)
    outcome: list[AgentResult] = []
    thread = threading.Thread(target=lambda: outcome.append(agent.run()))
    thread.start()
    try:
        _wait_for(lambda: ("prepare", "") in store.calls)
    finally:
        agent.request_stop("test over")
        thread.join(60)
    assert control.store_calls_at_round == [], "the store's import started before the node's round"
    assert store.opened == []
    assert [r.exit_code for r in outcome] == [128 + signal.SIGTERM]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_node_that_waits_idle_for_its_round_imports_for_the_store_meanwhile(tmp_path: Path) -> None:
    # A warm spare may take over node rank 0 and open the store: it imports while it waits, not then.
    store = FakeStoreHost()
    control = _JoinsAsNodeRank1(store, idle_polls_until_prepare=True)
    result = _warm_standby_agent(tmp_path, control, "ok", store, store_import_idle_wait_s=0.3).run()
    assert result.exit_code == 0, result.reason
    assert control.store_calls_at_round == [("prepare", "")]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_nodes_of_a_starting_job_join_at_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    control = _CountWarmAtRegistration(marks, open_gate=True, round_formed=False)
    agent, _ = _slow_standbys_agent(tmp_path, control, 120.0)
    with caplog.at_level(logging.INFO, logger="dlrover.launcher.agent"):
        result = agent.run()
    assert result.exit_code == 0, result.reason
    assert control.warm_at_registration == 0, "registered while its standbys imported (they wait for it)"
    assert not [r for r in caplog.records if "standby workers" in r.getMessage() and "import" in r.getMessage()
                and "joining" in r.getMessage()]  # fmt: skip


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_stop_while_standbys_import_ends_the_node_before_it_registers(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    control = _CountWarmAtRegistration(marks, open_gate=False)
    agent, _ = _slow_standbys_agent(tmp_path, control, 120.0)

    def stop_once_both_import() -> None:
        deadline = time.monotonic() + 120
        while len(list(marks.glob("importing-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        agent.request_stop("test over")

    stopper = threading.Thread(target=stop_once_both_import)
    stopper.start()
    result = agent.run()
    stopper.join()
    assert result.exit_code == 143, result.reason
    assert control.registrations == [], "a node stopped before it was ready never registered"
    assert not list(marks.glob("warm-*"))
