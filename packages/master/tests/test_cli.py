"""`dlrover-master`: flags to config, bad flags, and `status` against a live master."""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from dlrover.common import ConfigError, default_text
from dlrover.master.cli import (
    _events_parser,
    _run_parser,
    _status_parser,
    _stop_parser,
    _timeline_parser,
    build_config,
    main,
)
from dlrover.master.client import MasterClient
from dlrover.master.config import NodeRange
from dlrover.master.diagnosis_policy import DiagnosisFailurePolicy
from dlrover.master.factory import create_master, default_policy, resolve_token
from dlrover.master.goodput import AttemptReport, StepMark
from dlrover.master.states import JobState, NodeState
from dlrover.master.status import JobSummary, NodeSummary, format_status


def test_flags_become_a_validated_config() -> None:
    args = _run_parser().parse_args(
        ["--nnodes", "2:4", "--node-unit", "2", "--port", "5000", "--backend", "external", "--heartbeat-timeout-s",
         "12", "--node-start-timeout-s", "0", "--agent-command", "dlrover-run --x 'a b'", "--max-relaunches", "1"]
    )  # fmt: skip
    cfg = build_config(args)
    assert cfg.lifecycle.nodes == NodeRange(2, 4, 2)
    assert cfg.port == 5000
    assert cfg.backend == "external"
    assert cfg.lifecycle.heartbeat_timeout_s == 12
    assert cfg.lifecycle.node_start_timeout_s is None
    assert cfg.agent_command == ("dlrover-run", "--x", "a b")
    assert cfg.lifecycle.max_relaunches == 1
    assert cfg.bind_address == "127.0.0.1"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nnodes", "4:2", "--backend", "external"], "min_nodes (4) must not exceed max_nodes (2)"),
        (["--heartbeat-timeout-s", "-1", "--backend", "external"], "heartbeat_timeout_s must be positive"),
        (["--backend", "local"], "agent_command"),
        (["--token", "short", "--backend", "external"], "16 to 512 characters"),
        (["--backend", "external", "--rdzv-last-call-s", "-1"], "rendezvous_last_call_s must be zero or positive"),
        (["--backend", "external", "--rdzv-join-timeout-s", "0"], "rendezvous_join_timeout_s must be positive"),
        (["--backend", "external", "--state-export-interval-s", "0"], "state_export_interval_s must be positive"),
        (["--backend", "external", "--nnodes", "3:3", "--node-unit", "2"], "no multiple of node_unit=2"),
        (
            ["--backend", "external", "--autoscale-min-scaling-efficiency", "1.2"],
            "min_scaling_efficiency must be a number in (0, 1], got 1.2",
        ),
        (["--backend", "external", "--autoscale-cooldown-s", "-5"], "cooldown_s must be a finite number >= 0"),
        (["--backend", "external", "--max-node-relaunches", "-1"], "max_node_relaunches"),
        (["--backend", "external", "--max-job-failures", "-1"], "max_job_failures"),
        (["--backend", "external", "--peer-cause-wait-s", "-1"], "peer_cause_wait_s"),
    ],
)
def test_bad_flags_exit_2_with_a_message(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_rendezvous_journal_and_policy_flags_reach_the_config() -> None:
    args = _run_parser().parse_args(
        ["--backend", "external", "--nnodes", "2:4", "--node-unit", "2", "--rdzv-last-call-s", "7",
         "--rdzv-join-timeout-s", "90", "--rdzv-heartbeat-timeout-s", "12", "--state-export-interval-s", "2.5",
         "--no-journal-shard-changes", "--failure-policy", "default"]
    )  # fmt: skip
    cfg = build_config(args)
    rdzv = cfg.rendezvous_config()
    assert (rdzv.min_nodes, rdzv.max_nodes, rdzv.node_unit) == (2, 4, 2)
    assert (rdzv.last_call_s, rdzv.join_timeout_s, rdzv.heartbeat_timeout_s) == (7, 90, 12)
    assert cfg.state_export_interval_s == 2.5
    assert not cfg.journal_shard_changes
    assert cfg.failure_policy == "default"
    defaults = build_config(_run_parser().parse_args(["--backend", "external"]))
    assert defaults.journal_shard_changes
    assert defaults.failure_policy == "diagnosis"
    assert defaults.lifecycle.peer_cause_wait == defaults.lifecycle.heartbeat_timeout_s + 10.0
    waits = build_config(_run_parser().parse_args(["--backend", "external", "--peer-cause-wait-s", "0"]))
    assert waits.lifecycle.peer_cause_wait == 0.0


def test_the_launch_retry_flags_reach_the_master_and_bad_ones_are_refused() -> None:
    flags = ["--backend", "external", "--launch-retries", "2", "--launch-retry-initial-s", "0.5"]
    cfg = build_config(_run_parser().parse_args([*flags, "--launch-retry-max-s", "4"]))
    assert (cfg.launch_retry.retries, cfg.launch_retry.initial_s, cfg.launch_retry.max_s) == (2, 0.5, 4.0)
    assert build_config(_run_parser().parse_args(["--backend", "external"])).launch_retry.retries == 5
    with pytest.raises(ConfigError, match=r"launch retry max_s \(0\.1\) must be at least initial_s \(0\.5\)"):
        build_config(_run_parser().parse_args([*flags, "--launch-retry-max-s", "0.1"]))


def test_the_relaunch_budget_flag_reaches_the_diagnosis_policy() -> None:
    raised = build_config(_run_parser().parse_args(["--backend", "external", "--max-node-relaunches", "500"]))
    policy = default_policy(raised)
    assert isinstance(policy, DiagnosisFailurePolicy)
    assert policy.actions.config.max_node_relaunches == 500
    defaults = default_policy(build_config(_run_parser().parse_args(["--backend", "external"])))
    assert isinstance(defaults, DiagnosisFailurePolicy)
    assert defaults.actions.config.max_node_relaunches == 16


@pytest.mark.parametrize(
    ("value", "message"),
    [("-5", "expected seconds > 0 (0: the whole job), got '-5'"), ("a day", "expected seconds (0: the whole job)")],
)
def test_a_bad_budget_window_is_refused_by_the_parser(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--backend", "external", "--failure-budget-window", value])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_failure_budgets_count_over_a_window_and_scale_with_the_job() -> None:
    small = build_config(_run_parser().parse_args(["--backend", "external", "--nnodes", "4"]))
    assert small.lifecycle.budget_window_s == 86400.0
    assert (small.lifecycle.job_failure_limit, small.node_relaunch_limit) == (20, 16)
    policy = default_policy(small)
    assert isinstance(policy, DiagnosisFailurePolicy)
    assert policy.actions.config.budget_window.seconds == 86400.0
    large = build_config(_run_parser().parse_args(["--backend", "external", "--nnodes", "2048"]))
    assert (large.lifecycle.job_failure_limit, large.node_relaunch_limit) == (4096, 32)
    argv = ["--backend", "external", "--nnodes", "2048", "--failure-budget-window", "0", "--max-job-failures", "7"]
    whole_life = build_config(_run_parser().parse_args(argv))
    assert whole_life.lifecycle.budget_window_s is None
    assert whole_life.lifecycle.job_failure_limit == 7
    policy = default_policy(whole_life)
    assert isinstance(policy, DiagnosisFailurePolicy)
    assert policy.actions.config.budget_window.seconds is None


def test_token_is_generated_once_into_the_state_dir(tmp_path: Path) -> None:
    cfg = build_config(_run_parser().parse_args(["--backend", "external", "--state-dir", str(tmp_path / "s")]))
    token, path = resolve_token(cfg)
    assert path == str(tmp_path / "s" / "token")
    assert (tmp_path / "s" / "token").stat().st_mode & 0o777 == 0o600
    assert resolve_token(cfg) == (token, path)


def test_format_status_is_readable() -> None:
    status = JobSummary(
        job_name="j",
        state=JobState.RUNNING,
        exit_reason="",
        min_nodes=1,
        max_nodes=2,
        nodes=(
            NodeSummary(node_id=0, rank=0, state=NodeState.RUNNING, host="h0", step=12),
            NodeSummary(node_id=3, rank=1, state=NodeState.PENDING, relaunch_count=1, last_failure="oom: killed"),
        ),
        committed_step=10,
        committed_path="/ckpt/10",
        goodput=0.5,
        elapsed_s=60,
        samples_per_second=123.4,
        useful_s=30,
        goodput_buckets=(("startup", 12.0), ("steps_redone", 18.0)),
    )
    text = format_status(status)
    assert "job j: running" in text
    assert "1 running of 1..2" in text
    assert "123.4 samples/s; committed checkpoint 10 at /ckpt/10" in text
    assert "goodput 50.0% over 60s" in text
    assert "useful 30.0s (50.0%); startup 12.0s (20.0%); steps_redone 18.0s (30.0%)" in text
    assert "oom: killed" in text


@pytest.mark.integration
def test_status_command_and_metrics_endpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = build_config(
        _run_parser().parse_args(
            [
                "--backend",
                "external",
                "--nnodes",
                "1:2",
                "--state-dir",
                str(tmp_path),
                "--metrics-port",
                "0",
                "--job-name",
                "status-test",
            ]
        )
    )
    runtime = create_master(cfg)
    runtime.start()
    try:
        assert main(["status", "--master", runtime.address, "--token-file", str(tmp_path / "token")]) == 0
        out = capsys.readouterr().out
        assert "job status-test: running" in out
        assert "pending" in out
        body = urllib.request.urlopen(f"http://127.0.0.1:{runtime.metrics_port}/metrics", timeout=30).read().decode()
        assert 'dlrover_nodes{job="status-test",state="pending"} 2.0' in body
        assert main(["status", "--master", runtime.address, "--token", "x" * 20, "--timeout-s", "5"]) == 1
        assert "UNAUTHENTICATED" in capsys.readouterr().err
    finally:
        runtime.stop()


@pytest.mark.integration
def test_timeline_command_draws_a_running_job_and_its_event_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = build_config(
        _run_parser().parse_args(["--backend", "external", "--nnodes", "1", "--state-dir", str(tmp_path / "s")])
    )
    runtime = create_master(cfg)
    runtime.start()
    try:
        with MasterClient(runtime.address, runtime.token) as agent:
            agent.register("a", "h")
            now = time.time()
            marks = tuple(StepMark(s, now - 3 + s * 0.5, 0.0, 4 * s) for s in range(1, 5))
            agent.heartbeat(step=4, attempts=[AttemptReport(0, 1, 0, ready_time=now - 3, marks=marks)])
            agent.commit_checkpoint(4, "/ck/4", world_size=1)
        svg = tmp_path / "live.svg"
        token = str(tmp_path / "s" / "token")
        assert main(["timeline", "--master", runtime.address, "--token-file", token, "--out", str(svg)]) == 0
        root = ET.parse(svg).getroot()
        classes = [el.get("class") for el in root.iter()]
        assert classes.count("step") == 4
        assert "checkpoint" in classes
        runtime.master.flush_state()
    finally:
        runtime.stop()
    after = tmp_path / "after.svg"
    log = str(tmp_path / "s" / "events.jsonl")
    assert main(["timeline", "--event-log", log, "--out", str(after), "--title", "job1"]) == 0
    title = ET.parse(after).getroot().find("{http://www.w3.org/2000/svg}title")
    assert title is not None
    assert (title.text or "").startswith("job1: goodput ")
    assert main(["timeline", "--event-log", str(tmp_path / "missing.jsonl"), "--out", str(after)]) == 1
    assert "dlrover-master timeline" in capsys.readouterr().err


def test_events_and_stop_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = build_config(
        _run_parser().parse_args(["--backend", "external", "--nnodes", "1", "--state-dir", str(tmp_path)])
    )
    runtime = create_master(cfg)
    runtime.start()
    where = ["--master", runtime.address, "--token-file", str(tmp_path / "token")]
    try:
        assert main(["events", *where]) == 0
        started = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [e["kind"] for e in started][:2] == ["job_start", "node_created"]
        assert [e["seq"] for e in started] == sorted(e["seq"] for e in started)
        assert set(started[0]) == {"seq", "wall_time", "kind", "message", "node_id", "rank", "data"}
        # Paged from a sequence number, at most --limit of them.
        assert main(["events", *where, "--after-seq", str(started[0]["seq"]), "--limit", "1"]) == 0
        assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == started[1:2]
        assert main(["stop", *where, "--reason", "operator test"]) == 0
        assert capsys.readouterr().out == "job stopped: operator test\n"
        assert main(["events", *where, "--after-seq", str(started[-1]["seq"])]) == 0
        after = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        ends = [e["message"] for e in after if e["kind"] == "job_end"]
        assert ends == ["job stopped: operator test"]
        # An ended job stays as it ended.
        assert main(["stop", *where, "--reason", "again"]) == 0
        assert capsys.readouterr().out == "job stopped: operator test\n"
        assert main(["events", *where, "--limit", "-1"]) == 2
        assert "must be non-negative" in capsys.readouterr().err
    finally:
        runtime.stop()


@pytest.mark.parametrize("parser", [_run_parser, _status_parser, _events_parser, _stop_parser, _timeline_parser])
def test_help_shows_every_options_default(
    parser: Callable[[], argparse.ArgumentParser], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "10000")  # argparse wraps at hyphens too: compare unwrapped lines
    built = parser()
    text = " ".join(built.format_help().split())
    for action in built._actions:  # argparse lists its actions only here
        if not action.option_strings or action.default is argparse.SUPPRESS:
            continue
        said = " ".join((action.help or "").split())
        line = " ".join(part for part in (said, default_text(action)) if part)
        assert "(default" in line, action.option_strings
        assert line in text, action.option_strings
    if parser is _run_parser:
        assert (
            "--heartbeat-timeout-s HEARTBEAT_TIMEOUT_S a node silent this long is taken for lost (default: 30.0)"
            in text
        )
        assert "--serve-ping also serve the no-op PingService" in text
        assert "(default: off)" in text


def test_autoscale_flags_reach_the_config() -> None:
    args = _run_parser().parse_args(
        ["--backend", "external", "--autoscale", "advise", "--autoscale-interval-s", "7",
         "--autoscale-min-scaling-efficiency", "0.6", "--autoscale-min-measure-s", "40", "--autoscale-warmup-s", "3",
         "--autoscale-cooldown-s", "20"]
    )  # fmt: skip
    auto = build_config(args).autoscale
    assert (auto.mode.value, auto.interval_s, auto.min_scaling_efficiency) == ("advise", 7, 0.6)
    assert (auto.min_measure_s, auto.warmup_s, auto.cooldown_s) == (40, 3, 20)
    assert build_config(_run_parser().parse_args(["--backend", "external"])).autoscale.mode.value == "off"


def test_a_state_dir_held_by_another_master_exits_75_retry_and_bad_usage_stays_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dlrover.common import ConfigError, SystemClock
    from dlrover.master.exits import EXIT_RETRY, EXIT_USAGE
    from dlrover.master.exits import start_failure as _start_failure
    from dlrover.master.operator import MASTER_EXIT_RETRY
    from dlrover.master.scheduler.base import BackendUnavailableError
    from dlrover.master.statedir import StateDirLock

    assert EXIT_RETRY == MASTER_EXIT_RETRY == 75  # the operator's copy of the master's status
    state = tmp_path / "state"
    with StateDirLock.acquire(state, job_name="other", clock=SystemClock()):
        assert main(["--backend", "external", "--state-dir", str(state), "--nnodes", "1"]) == EXIT_RETRY
    assert "is in use by" in capsys.readouterr().err
    assert _start_failure(BackendUnavailableError("the API server kept answering 503")) == EXIT_RETRY
    assert _start_failure(ConfigError("the state directory holds another job")) == EXIT_USAGE == 2
