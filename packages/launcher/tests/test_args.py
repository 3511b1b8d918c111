from __future__ import annotations

import argparse
import uuid

import pytest
import torch.distributed.run as torchrun

from dlrover.common import ConfigError, default_text
from dlrover.launcher import NodeRange, build_parser, parse_args, parse_std_streams
from dlrover.launcher.worker_logs import LogCleanup


def test_torchrun_flags_are_accepted_with_torchruns_meaning() -> None:
    argv = [
        "--nnodes=1:3",
        "--nproc_per_node=2",
        "--rdzv-backend=c10d",
        "--rdzv_endpoint=127.0.0.1:29400",
        "--rdzv-id=job7",
        "--rdzv-conf=join_timeout=30,store_timeout=5",
        "--max_restarts=3",
        "--monitor-interval=0.5",
        "--log-dir=/tmp/x",
        "--redirects=3",
        "--tee=0:1,1:2",
        "--node-rank=1",
        "--master-addr=10.0.0.1",
        "--master-port=1234",
        "--local-addr=127.0.0.1",
        "train.py",
        "--lr",
        "0.1",
    ]
    ours = parse_args(argv)
    theirs = torchrun.get_args_parser().parse_args(argv)
    assert str(ours.nodes) == theirs.nnodes
    assert ours.nproc_per_node == int(theirs.nproc_per_node)
    assert ours.rdzv_backend == theirs.rdzv_backend
    assert ours.rdzv_endpoint == theirs.rdzv_endpoint
    assert ours.rdzv_id == theirs.rdzv_id
    assert ours.rdzv_conf == (("join_timeout", "30"), ("store_timeout", "5"))
    assert (ours.rendezvous_timeout_s, ours.store_wait_s) == (30.0, 5.0)
    assert ours.max_restarts == int(theirs.max_restarts)
    assert ours.monitor_interval_s == float(theirs.monitor_interval)
    assert ours.log_dir == theirs.log_dir
    assert dict(ours.redirects) == {0: 3, 1: 3}
    assert dict(ours.tee) == {0: 1, 1: 2}
    assert ours.node_rank == int(theirs.node_rank)
    assert (ours.master_addr, ours.master_port) == (theirs.master_addr, int(theirs.master_port))
    assert ours.entrypoint == theirs.training_script == "train.py"
    assert list(ours.entrypoint_args) == theirs.training_script_args == ["--lr", "0.1"]


def test_worker_commands_follow_torchrun() -> None:
    assert parse_args(["-m", "pkg.train", "a"]).worker_command("py") == ["py", "-u", "-m", "pkg.train", "a"]
    assert parse_args(["--no-python", "./run.sh", "a"]).worker_command("py") == ["./run.sh", "a"]
    assert parse_args(["t.py"]).worker_command("py") == ["py", "-u", "t.py"]
    run_path = parse_args(["--run-path", "t.py", "x"]).worker_command("py")
    assert run_path[:3] == ["py", "-u", "-c"]
    assert run_path[-2:] == ["t.py", "x"]


def test_the_phase_allowances_reach_the_agents_hang_detector() -> None:
    from dlrover.launcher.cli import _step_hang

    cfg = parse_args(["--hang-checkpoint-allowance=60", "--hang-eval-allowance=70", "--hang-wait-allowance=80", "t.py"])
    hang = _step_hang(cfg)
    assert hang is not None
    assert dict(hang.phase_allowance_s) == {"checkpoint": 60.0, "eval": 70.0, "wait": 80.0}
    assert dict(_step_hang(parse_args(["t.py"])).phase_allowance_s)["wait"] == 3600.0  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="--hang-wait-allowance"):
        parse_args(["--hang-wait-allowance=nan", "t.py"])
    assert parse_args(["t.py"]).hang_busy_probe_s == 2.0
    assert parse_args(["--hang-busy-probe=0", "t.py"]).hang_busy_probe_s == 0.0
    with pytest.raises(ConfigError, match="--hang-busy-probe"):
        parse_args(["--hang-busy-probe=-1", "t.py"])


def test_dlrover_flags() -> None:
    cfg = parse_args(
        [
            "--standalone",
            "--save-at-breakpoint",
            "--master-lost-timeout=60",
            "--heartbeat-interval=0.5",
            "--node-unit=2",
            "--nnodes=2:4",
            "--hang-timeout=30",
            "--token-file=/run/token",
            "t.py",
        ]
    )
    assert cfg.standalone
    assert cfg.save_at_breakpoint
    assert cfg.failure_persist_hold_s == 0.0  # persist at the failure, while the workers restart
    assert parse_args(["t.py"]).failure_persist_hold_s == 0.0
    assert parse_args(["--failure-persist-hold=5", "t.py"]).failure_persist_hold_s == 5.0
    assert cfg.master_lost_timeout_s == 60.0
    assert cfg.heartbeat_interval_s == 0.5
    assert parse_args(["t.py"]).heartbeat_interval_s is None  # the master's interval applies
    assert cfg.node_unit == 2
    assert cfg.hang_timeout_s == 30.0
    # Hang detection is on by default, so a worker that never rejoins is noticed in bounded time.
    assert parse_args(["t.py"]).hang_timeout_s == 180.0
    assert parse_args(["--hang-timeout=0", "t.py"]).hang_timeout_s == 0.0
    assert cfg.token_file == "/run/token"
    assert cfg.prewarm == ("torch", "dlrover.flashckpt.checkpointer")  # standby workers by default
    assert cfg.checkpoint_stop_timeout_s == 120.0
    assert cfg.prewarm_refill_after_s == 30.0
    assert parse_args(["--prewarm-refill-after=0", "t.py"]).prewarm_refill_after_s == 0.0
    assert cfg.worker_reap_timeout_s == 30.0
    assert parse_args(["--worker-reap-timeout=5", "t.py"]).worker_reap_timeout_s == 5.0
    assert parse_args(["--checkpoint-stop-timeout=30", "t.py"]).checkpoint_stop_timeout_s == 30.0
    assert cfg.checkpoint_shm_dir == "/dev/shm"
    assert (cfg.exit_barrier_poll_timeout_s, cfg.resource_sample_interval_s) == (2.0, 1.0)
    assert cfg.signals_to_handle == ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")  # torchrun's default
    assert parse_args(["--signals-to-handle=sigterm, SIGUSR1", "t.py"]).signals_to_handle == ("SIGTERM", "SIGUSR1")
    assert parse_args(["--shutdown-timeout=3", "t.py"]).shutdown_grace_s == 3.0  # torchrun's name for it
    assert parse_args(["--shutdown_timeout=3", "--shutdown-grace=3", "t.py"]).shutdown_grace_s == 3.0
    assert parse_args(["--virtual-local-rank", "t.py"]).virtual_local_rank
    dup = parse_args(["--duplicate-stdout-filters=apple,orange,,juice,", "--duplicate_stderr_filters=x", "t.py"])
    assert (dup.duplicate_stdout_filters, dup.duplicate_stderr_filters) == (("apple", "orange,juice"), ("x",))
    assert cfg.duplicate_stdout_filters == ()
    assert parse_args(["--event-log-handler=console", "t.py"]).event_log_handler == "console"
    tuned = parse_args(["--exit-barrier-poll-timeout=0.5", "--resource-sample-interval=0", "t.py"])
    assert (tuned.exit_barrier_poll_timeout_s, tuned.resource_sample_interval_s) == (0.5, 0.0)
    assert parse_args(["--checkpoint-shm-dir=/tmp/../tmp", "t.py"]).checkpoint_shm_dir == "/tmp"
    assert parse_args(["--prewarm=torch, numpy.linalg", "t.py"]).prewarm == ("torch", "numpy.linalg")
    assert parse_args(["--prewarm=torch", "-m", "pkg.train"]).prewarm == ("torch",)


def test_the_master_call_deadlines_reach_the_agents_client() -> None:
    from dlrover.launcher.cli import _control_plane

    default = parse_args(["t.py"])
    assert (default.master_call_timeout_s, default.master_call_retry_s) == (5.0, 30.0)
    cfg = parse_args(["--master-call-timeout=20", "--master-call-retry=120", "t.py"])
    assert (cfg.master_call_timeout_s, cfg.master_call_retry_s) == (20.0, 120.0)
    for bad, flag in (("--master-call-timeout=0", "--master-call-timeout"), ("--master-call-retry=inf", "retry")):
        with pytest.raises(ConfigError, match=flag):
            parse_args([bad, "t.py"])
    with pytest.raises(ConfigError, match="must be at least --master-call-timeout=20"):
        parse_args(["--master-call-timeout=20", "--master-call-retry=10", "t.py"])

    class _Master:
        address, token = "127.0.0.1:1", "t" * 32

    control = _control_plane(cfg, _Master(), "127.0.0.1", None)  # type: ignore[arg-type]
    try:
        policy = control._master._policy
        assert (policy.call_timeout_s, policy.total_timeout_s, policy.max_attempts) == (20.0, 120.0, 5)
    finally:
        control.close()


def test_standby_workers_import_torch_by_default_for_python_workers_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PET_PREWARM", raising=False)
    assert parse_args(["t.py"]).prewarm == ("torch", "dlrover.flashckpt.checkpointer")
    assert parse_args(["-m", "pkg.train"]).prewarm == ("torch", "dlrover.flashckpt.checkpointer")
    # A standby cannot run an executable or a run-path wrapper: those start fresh without a word.
    assert parse_args(["--no-python", "t.sh"]).prewarm == ()
    assert parse_args(["--run-path", "t.py"]).prewarm == ()
    # Turned off by `none` (any case) or an empty value, also through torchrun-style PET_ variables.
    assert parse_args(["--prewarm=none", "t.py"]).prewarm == ()
    assert parse_args(["--prewarm", "NONE", "t.py"]).prewarm == ()
    assert parse_args(["--prewarm=", "t.py"]).prewarm == ()
    assert parse_args(["--prewarm=none", "--no-python", "t.sh"]).prewarm == ()
    monkeypatch.setenv("PET_PREWARM", "none")
    assert parse_args(["t.py"]).prewarm == ()
    monkeypatch.setenv("PET_PREWARM", "numpy")
    assert parse_args(["t.py"]).prewarm == ("numpy",)


def test_network_check_flags() -> None:
    off = parse_args(["t.py"])
    assert not off.network_check
    assert not off.exclude_straggler
    assert (off.network_check_timeout_s, off.network_check_results_timeout_s, off.straggler_factor) == (60.0, None, 2.0)
    on = parse_args(
        [
            "--network-check",
            "--exclude_straggler",
            "--network-check-timeout=20",
            "--network_check_results_timeout=90",
            "--straggler-factor=3",
            "t.py",
        ]
    )
    assert on.network_check
    assert on.exclude_straggler
    assert (on.network_check_timeout_s, on.network_check_results_timeout_s, on.straggler_factor) == (20.0, 90.0, 3.0)


def test_network_check_flags_take_torchrun_style_environment_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NETWORK_CHECK", "1")
    monkeypatch.setenv("PET_NETWORK_CHECK_TIMEOUT", "15")
    cfg = parse_args(["t.py"])
    assert cfg.network_check
    assert cfg.network_check_timeout_s == 15.0


def test_environment_defaults_like_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NNODES", "2:3")
    monkeypatch.setenv("PET_STANDALONE", "1")
    cfg = parse_args(["t.py"])
    assert cfg.nodes == NodeRange(2, 3)
    assert cfg.standalone


def test_auto_config_uses_visible_accelerators() -> None:
    assert parse_args(["--auto-config", "t.py"], accelerators=8).nproc_per_node == 8
    assert parse_args(["--auto-config", "t.py"], accelerators=0).nproc_per_node == 1
    with pytest.raises(ConfigError, match="do not also give --nproc-per-node=4"):
        parse_args(["--auto-config", "--nproc-per-node=4", "t.py"], accelerators=8)
    assert parse_args(["t.py"]).nproc_per_node == 1  # torchrun's default
    assert parse_args(["--start-method=fork", "t.py"]).start_method == "fork"  # accepted; the agent warns


def test_checkpoint_retention_and_persist_rate_flags() -> None:
    cfg = parse_args(
        ["--checkpoint-keep-last=3", "--checkpoint-keep-every=100", "--persist-bandwidth-mb-s=200", "t.py"]
    )
    assert (cfg.checkpoint_keep_last, cfg.checkpoint_keep_every, cfg.persist_bandwidth_mb_s) == (3, 100, 200.0)
    defaults = parse_args(["t.py"])
    assert (defaults.checkpoint_keep_last, defaults.persist_bandwidth_mb_s) == (0, None)  # auto: the agent's CPUs
    assert parse_args(["--persist-bandwidth-mb-s=auto", "t.py"]).persist_bandwidth_mb_s is None
    assert parse_args(["--persist-bandwidth-mb-s=AUTO", "t.py"]).persist_bandwidth_mb_s is None
    with pytest.raises(ConfigError, match=r"must be a number, got 'fast' \(or auto\)"):
        parse_args(["--persist-bandwidth-mb-s=fast", "t.py"])
    assert parse_args(["--persist-bandwidth-mb-s=0", "t.py"]).persist_bandwidth_mb_s == 0.0  # no cap
    with pytest.raises(ConfigError, match="--checkpoint-keep-every needs --checkpoint-keep-last"):
        parse_args(["--checkpoint-keep-every=10", "t.py"])
    with pytest.raises(ConfigError, match="--persist-bandwidth-mb-s"):
        parse_args(["--persist-bandwidth-mb-s=-1", "t.py"])
    # torchrun's "auto": one per accelerator, else one per usable CPU.
    assert parse_args(["--nproc-per-node=auto", "t.py"], accelerators=4, cpus=16).nproc_per_node == 4
    assert parse_args(["--nproc-per-node=auto", "t.py"], accelerators=0, cpus=16).nproc_per_node == 16
    assert parse_args(["--nproc-per-node=cpu", "t.py"], cpus=6).nproc_per_node == 6
    with pytest.raises(ConfigError, match="no GPU"):
        parse_args(["--nproc-per-node=gpu", "t.py"], accelerators=0)


def test_accelerators_are_counted_only_for_the_flags_that_need_the_count() -> None:
    # Counting imports torch where a GPU driver is present: dlrover-run starts its standbys first.
    counted: list[bool] = []

    def count() -> int:
        counted.append(True)
        return 8

    assert parse_args(["--nproc-per-node=2", "t.py"], accelerators=count).nproc_per_node == 2
    assert parse_args(["t.py"], accelerators=count).nproc_per_node == 1
    assert counted == []
    for flags in (["--nproc-per-node=gpu"], ["--nproc-per-node=auto"], ["--auto-config"]):
        assert parse_args([*flags, "t.py"], accelerators=count).nproc_per_node == 8
    assert len(counted) == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nnodes=3:2", "t.py"], "3:2"),
        (["--nnodes=0", "t.py"], "'0'"),
        (["--nnodes=a:b", "t.py"], "a:b"),
        (["--nproc-per-node=0", "t.py"], "nproc-per-node"),
        (["--max-restarts=-1", "t.py"], "max-restarts"),
        (["-m", "--no-python", "t.py"], "-m and --no-python"),
        (["--standalone", "--master=h:1", "t.py"], "--master"),
        (["--nnodes=3", "--node-unit=2", "t.py"], "node-unit"),
        (["--rdzv-conf=novalue", "t.py"], "novalue"),
        (["--rdzv-conf=read_timeout=5", "t.py"], "read_timeout=5 is not understood.*join_timeout"),
        (["--rdzv-conf=store_timeout=inf", "t.py"], "--rdzv-conf store_timeout must be a finite number"),
        (["--exclude-straggler", "t.py"], "--exclude-straggler needs --network-check"),
        (["--network-check", "--network-check-timeout=0", "t.py"], "--network-check-timeout must be at least"),
        (["--network-check", "--network-check-timeout=inf", "t.py"], "--network-check-timeout must be a finite"),
        (["--network-check-timeout=nan", "t.py"], "--network-check-timeout must be a finite"),
        (
            ["--network-check", "--network-check-timeout=30", "--network-check-results-timeout=10", "t.py"],
            "--network-check-results-timeout=10 must be at least --network-check-timeout=30",
        ),
        (["--network-check", "--straggler-factor=0.5", "t.py"], "--straggler-factor must be at least 1"),
        (["--network-check", "--straggler-factor=x", "t.py"], "--straggler-factor must be a number, got 'x'"),
        (["--redirects=7", "t.py"], "'7'"),
        (["--tee=5:1", "t.py"], "local rank 5"),
        (["--prewarm=torch;rm", "t.py"], "module names or none, got 'torch;rm'"),
        (["--prewarm=torch,none", "t.py"], "module names or none, got 'none'"),
        (["--checkpoint-stop-timeout=0", "t.py"], "checkpoint-stop-timeout"),
        (["--checkpoint-shm-dir=/no/such/dir", "t.py"], "--checkpoint-shm-dir must be an existing directory"),
        (["--exit-barrier-poll-timeout=0", "t.py"], "--exit-barrier-poll-timeout must be at least"),
        (["--signals-to-handle=SIGTERM,SIGNOPE", "t.py"], "'SIGNOPE' is not a signal name"),
        (["--signals-to-handle=SIGKILL", "t.py"], "SIGKILL cannot be handled"),
        (["--shutdown-grace=5", "--shutdown-timeout=7", "t.py"], "the same setting: give one"),
        (["--logs-specs=mine", "t.py"], "LogsSpecs plug-ins are not supported"),
        (["--numa-binding=node", "t.py"], "--numa-binding=node is not supported"),
        (["--resource-sample-interval=-1", "t.py"], "--resource-sample-interval must be at least 0"),
        (["--checkpoint-stop-timeout=inf", "t.py"], "checkpoint-stop-timeout must be a finite number"),
        (["--prewarm-refill-after=-1", "t.py"], "--prewarm-refill-after must be at least 0"),
        (["--worker-reap-timeout=-1", "t.py"], "--worker-reap-timeout must be at least 0"),
        (["--failure-persist-hold=-1", "t.py"], "--failure-persist-hold must be at least 0"),
        (["--save-at-breakpoint", "--failure-persist-hold=5", "t.py"], "give one of them"),
        (["--failure-persist-hold=inf", "t.py"], "--failure-persist-hold must be a finite"),
        (["--prewarm=torch", "--no-python", "t.sh"], "cannot be used with --no-python"),
        (["--prewarm=torch", "--run-path", "t.py"], "cannot be used with --run-path"),
    ],
)
def test_bad_flags_are_named(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args(argv)


def test_std_stream_masks() -> None:
    assert parse_std_streams("2", 3, "--tee") == {0: 2, 1: 2, 2: 2}
    assert parse_std_streams("1:3", 3, "--tee") == {0: 0, 1: 3, 2: 0}


def test_a_standalone_job_without_an_id_gets_a_fresh_run_id_as_under_torchrun() -> None:
    from dlrover.launcher.cli import _run_id

    first = _run_id(parse_args(["--standalone", "t.py"]))
    assert first != _run_id(parse_args(["--standalone", "t.py"]))
    assert str(uuid.UUID(first)) == first
    assert _run_id(parse_args(["--standalone", "--rdzv-id=mine", "t.py"])) == "mine"
    assert _run_id(parse_args(["t.py"])) == "none"  # torchrun's default outside --standalone


def test_the_workers_job_id_is_the_run_id_else_the_masters_address_and_a_given_one_wins() -> None:
    from dlrover.flashckpt import safe_job_id
    from dlrover.launcher.cli import _job_id

    uuid_run = str(uuid.uuid4())
    assert _job_id(uuid_run, "127.0.0.1:5000", {}) == uuid_run
    assert _job_id("my.job", "127.0.0.1:5000", {}) == safe_job_id("my.job")
    # No --rdzv-id in a multi-node job: the same on every node, and another for another master.
    joined = _job_id("none", "10.0.0.1:5000", {"DLROVER_JOB_NAME": "train"})
    assert joined == _job_id("none", "10.0.0.1:5000", {"DLROVER_JOB_NAME": "train"})
    assert joined != _job_id("none", "10.0.0.1:5001", {"DLROVER_JOB_NAME": "train"})
    assert joined.startswith("train-10-0-0-1-5000-")
    assert _job_id(uuid_run, "x:1", {"DLROVER_JOB_ID": "given_1"}) == "given_1"
    with pytest.raises(ConfigError, match="DLROVER_JOB_ID='a b'"):
        _job_id(uuid_run, "x:1", {"DLROVER_JOB_ID": "a b"})


@pytest.mark.parametrize("bad", ["", ".", "..", "/abs", "a/b"])
def test_a_run_id_that_is_not_a_folder_name_is_refused(bad: str) -> None:
    # It names the folder of the job's logs and error files.
    with pytest.raises(ConfigError, match="--rdzv-id"):
        parse_args([f"--rdzv-id={bad}", "t.py"])


def test_flags_that_have_no_effect_here_are_named_not_dropped_silently(caplog: pytest.LogCaptureFixture) -> None:
    from dlrover.launcher.cli import _warn_ignored_flags

    with caplog.at_level("WARNING", logger="dlrover.launcher"):
        _warn_ignored_flags(parse_args(["--master-addr=10.0.0.1", "--master-port=29500", "t.py"]))
        _warn_ignored_flags(parse_args(["--master=h:1", "--node-unit=2", "--nnodes=2:4", "t.py"]))
        _warn_ignored_flags(parse_args(["--event-log-handler=console", "t.py"]))
        _warn_ignored_flags(parse_args(["--duplicate-stderr-filters=x", "--tee=1", "t.py"]))
    text = caplog.text
    assert "--duplicate-stderr-filters: no effect, as under torchrun, unless --tee" in text
    assert "--event-log-handler=console: no effect under dlrover-run" in text
    assert "--master-addr, --master-port: no effect under dlrover-run" in text
    assert "--node-unit=2: no effect when joining a running master" in text
    caplog.clear()
    with caplog.at_level("WARNING", logger="dlrover.launcher"):
        _warn_ignored_flags(parse_args(["--standalone", "--node-unit=1", "t.py"]))
        # A static multi-node command line: they name where the nodes meet (node rank 0 hosts).
        _warn_ignored_flags(parse_args(["--nnodes=2", "--node-rank=1", "--master-addr=h", "--master-port=9", "t.py"]))
    assert caplog.text == ""


def _options_without_a_shown_default(parser: argparse.ArgumentParser) -> list[str]:
    """The options whose line in the parser's help says no default (empty: all say one)."""
    text = " ".join(parser.format_help().split())
    missing = []
    for action in parser._actions:  # argparse lists its actions only here
        if not action.option_strings or action.default is argparse.SUPPRESS:
            continue
        said = " ".join((action.help or "").split())
        shown = default_text(action)
        line = " ".join(part for part in (said, shown) if part)
        if "(default" not in line or line not in text:
            missing.append(action.option_strings[0])
    return missing


def test_help_shows_every_options_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "10000")  # argparse wraps at hyphens too: compare unwrapped lines
    parser = build_parser()
    assert _options_without_a_shown_default(parser) == []
    text = " ".join(parser.format_help().split())
    for shown in (
        "--shutdown-grace SHUTDOWN_GRACE, --shutdown_grace SHUTDOWN_GRACE seconds workers get to exit after the stop "
        "signal (SIGTERM, or the one the agent received) before SIGKILL (default: 10.0)",
        "--max-restarts MAX_RESTARTS, --max_restarts MAX_RESTARTS worker restarts after failures before the node "
        "gives up (default: 0)",
        "--hang-timeout HANG_TIMEOUT, --hang_timeout HANG_TIMEOUT",
        "--network-check, --network_check check nodes' health before training (default: off)",
        "--log-cleanup LOG_CLEANUP, --log_cleanup LOG_CLEANUP when the agent removes its folder of worker logs as it "
        "exits: never, on-success or always (default: never)",
        "(default: ./dlrover-logs, or $XDG_STATE_HOME/dlrover/logs where that cannot be written)",
        "(default: SIGTERM,SIGINT,SIGHUP,SIGQUIT)",
    ):
        assert shown in text


def test_every_torchrun_option_parses_here_and_the_help_change_did_not_touch_parsing() -> None:
    ours = {s for a in build_parser()._actions for s in a.option_strings}
    theirs = {s for a in torchrun.get_args_parser()._actions for s in a.option_strings}
    assert theirs <= ours, sorted(theirs - ours)
    assert build_parser().parse_args(["--nproc_per_node=2", "--max-restarts", "3", "t.py", "-x"]).max_restarts == "3"


def test_log_flags() -> None:
    cfg = parse_args(["t.py"])
    assert (cfg.log_dir, cfg.log_cleanup, cfg.log_max_mb) == (None, LogCleanup.NEVER, 100.0)
    cfg = parse_args(["--log-cleanup=on_success", "--log-max-mb=0.5", "t.py"])
    assert (cfg.log_cleanup, cfg.log_max_mb) == (LogCleanup.ON_SUCCESS, 0.5)
    assert parse_args(["--log-cleanup", "ALWAYS", "t.py"]).log_cleanup is LogCleanup.ALWAYS
    with pytest.raises(ConfigError, match=r"--log-cleanup must be one of never, on-success, always, got 'sometimes'"):
        parse_args(["--log-cleanup=sometimes", "t.py"])
    with pytest.raises(ConfigError, match=r"--log-max-mb must be at least 0\.0"):
        parse_args(["--log-max-mb=-1", "t.py"])
