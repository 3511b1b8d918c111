"""PsJobMaster with real processes on this host and no TensorFlow: stand-in tasks that record the environment the
master gave them (a server sleeps; the chief reads its data from the master's shard service and exits), so the
addresses, `TF_CONFIG`, the token, relaunches and events are checked end to end. The suite with TensorFlow itself
is `tests/tensorflow` (`nox -s tests-tensorflow`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dlrover.autoscale import JobProfileStore, Resources, Role, read_runs
from dlrover.common import ConfigError, RetryPolicy, RpcError, generate_token, write_token_file
from dlrover.master import MasterClient, UnavailableMemoryGroups, detect_memory_groups
from dlrover.master.eventlog import read_event_log
from dlrover.master.psjob import PsJobConfig, PsJobMaster, PsJobSpec, TaskKey
from dlrover.master.psjob.cli import _parser, build_config
from dlrover.master.psjob.cli import main as ps_job_main
from dlrover.master.scheduler.base import ObservedState, SchedulerError
from dlrover.master.scheduler.fake import FakeScheduler
from dlrover.master.scheduler.local import LocalScheduler
from dlrover.master.states import JobState, NodeState
from dlrover.shard import ShardClient, ShardClientConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

STAND_IN = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    out = Path(sys.argv[1])
    config = json.loads(os.environ["TF_CONFIG"])
    task = os.environ["DLROVER_PS_TASK"]
    node = os.environ["DLROVER_NODE_ID"]
    # Whole or not at all: the test kills a task as soon as its file shows, which may be before a
    # plain write's text is in it.
    (out / f".{task}-{node}.tmp").write_text(json.dumps(config))
    (out / f".{task}-{node}.tmp").replace(out / f"{task}-{node}.json")
    if config["task"]["type"] != "chief":
        time.sleep(3600)
    if (out / "await-worker-relaunch").exists():  # the relaunched worker:1 must have started before the end
        deadline = time.monotonic() + 60
        while len(list(out.glob("worker:1-*.json"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    from dlrover.common import load_token
    from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, ShardClient
    with ShardClient(os.environ["DLROVER_MASTER_ADDR"], load_token(), "d", "chief") as client:
        client.register(DatasetSpec(name="d", source=IndexSource(40), batch_size=4, batches_per_shard=1,
                                    delivery=DeliveryMode.EXACTLY_ONCE))
        if (out / "restore").exists():
            client.restore((out / "restore").read_text())
        while (shard := client.next_shard()) is not None:
            client.report_done(shard.shard_id)
            if shard.shard_id == 3 and not (out / "restore").exists():
                (out / "restore").write_text(client.checkpoint())
            if shard.shard_id == 6 and (out / "fail-once").exists():
                (out / "fail-once").unlink()
                sys.exit(5)
    """
)


def _master(tmp_path: Path, spec: PsJobSpec) -> tuple[PsJobMaster, Path]:
    out = tmp_path / "out"
    out.mkdir()
    program = tmp_path / "stand_in.py"
    program.write_text(STAND_IN)
    command = [sys.executable, str(program), str(out)]
    scheduler = LocalScheduler(command, stop_grace_s=1.0, log_dir=tmp_path / "logs")
    config = PsJobConfig(spec=spec, command=("unused",), work_dir=str(tmp_path / "job"), tick_interval_s=0.05)
    return PsJobMaster(config, scheduler=scheduler), out


def _configs(out: Path, task: str) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob(f"{task}-*.json"))]


def _wait_for(path_glob: tuple[Path, str], count: int) -> None:
    directory, pattern = path_glob
    deadline = time.monotonic() + 60
    while len(list(directory.glob(pattern))) < count:
        assert time.monotonic() < deadline, f"{pattern} never appeared {count} time(s)"
        time.sleep(0.05)


def test_every_task_gets_its_address_and_a_relaunch_keeps_it(tmp_path: Path) -> None:
    master, out = _master(tmp_path, PsJobSpec(ps=2, workers=2))
    (out / "fail-once").touch()
    (out / "await-worker-relaunch").touch()
    with master:
        _wait_for((out, "worker:1-*.json"), 1)
        worker = master.core.node_of(TaskKey(Role.WORKER, 1))
        assert isinstance(master.scheduler, LocalScheduler)
        assert worker is not None
        os.kill(master.scheduler.pid(worker) or 0, signal.SIGKILL)
        outcome = master.run(timeout_s=60)
    assert outcome is not None
    assert outcome.succeeded, outcome
    cluster = {role.value: list(addresses) for role, addresses in master.cluster.items() if addresses}
    assert len({a for addresses in cluster.values() for a in addresses}) == 5, "every task has its own port"
    for task in ("ps:0", "ps:1", "worker:0", "worker:1", "chief:0"):
        configs = _configs(out, task)
        role, index = task.split(":")
        assert configs
        assert all(c == {"cluster": cluster, "task": {"type": role, "index": int(index)}} for c in configs)
    assert len(_configs(out, "worker:1")) == 2
    assert len(_configs(out, "chief:0")) == 2
    kinds = [(e["kind"], e["data"].get("task")) for e in read_event_log(master.event_log)]
    assert ("task_relaunched", "worker:1") in kinds
    assert ("task_relaunched", "chief:0") in kinds
    # The relaunched chief restored the data position of shard 3: shards 4-6 (12 samples, 3 steps) again.
    rewound = [e["data"] for e in read_event_log(master.event_log) if e["kind"] == "data_rewound"]
    assert rewound == [{"dataset": "d", "samples": 12, "steps": 3}]
    observed = master.scheduler.observe().values()
    assert all(n.state.value != "running" for n in observed), "every task was stopped"


def test_the_job_service_tells_the_status_and_events_and_stops_the_job(tmp_path: Path) -> None:
    master, out = _master(tmp_path, PsJobSpec(ps=2, workers=1))
    (out / "await-worker-relaunch").touch()  # the chief holds (no worker is relaunched) until stopped
    token = (tmp_path / "job" / "token").read_text().strip()
    with master, MasterClient(master.address, token) as client:
        _wait_for((out, "chief:0-*.json"), 1)
        while any(n.state is not NodeState.RUNNING for n in client.job_status().nodes):
            master.tick()
        status = client.job_status()
        assert (status.job_name, status.state, status.min_nodes, status.max_nodes) == (
            "ps-job", JobState.RUNNING, 4, 4)  # fmt: skip
        assert sorted((n.name, n.rank) for n in status.nodes) == [("chief:0", 0), ("ps:0", 0), ("ps:1", 1),
                                                                  ("worker:0", 0)]  # fmt: skip
        assert [e.kind for e in client.list_events()][:2] == ["flash_checkpoints", "job_started"]
        with pytest.raises(RpcError, match=r"FAILED_PRECONDITION.*not resized by a node count"):
            client.resize(3)
        answer = client.stop_job("the data is wrong")
        assert (answer.state, answer.exit_reason) == (JobState.STOPPED, "the data is wrong")
        assert master.run(timeout_s=30) is None
        assert client.job_status().state is JobState.STOPPED
        assert client.list_events(after_seq=1)[-1].kind == "job_stopping"
    assert all(n.state.value != "running" for n in master.scheduler.observe().values()), "every task was stopped"


def test_a_master_replacing_another_stops_its_tasks_first_and_numbers_its_nodes_above_theirs(tmp_path: Path) -> None:
    scheduler = FakeScheduler()
    for node_id in (3, 7):  # what a replaced master left running (a Kubernetes backend lists them)
        scheduler.set_state(node_id, ObservedState.RUNNING)
    config = PsJobConfig(spec=PsJobSpec(), command=("x",), work_dir=str(tmp_path / "job"))
    with PsJobMaster(config, scheduler=scheduler) as master:
        assert scheduler.stopped == [3, 7]
        assert sorted(scheduler.specs) == [8, 9, 10], "ps, worker and chief, above the predecessor's nodes"
        (left,) = [e for e in read_event_log(master.event_log) if e["kind"] == "predecessor_tasks"]
        assert left["data"]["nodes"] == [3, 7]
    # A master after it on the same work directory numbers its events on.
    with PsJobMaster(config, scheduler=FakeScheduler()) as after:
        seqs = [e["seq"] for e in read_event_log(after.event_log)]
    assert seqs == sorted(set(seqs)), "no event number twice"


def test_a_predecessor_task_that_does_not_end_keeps_the_master_from_starting(tmp_path: Path) -> None:
    class Stubborn(FakeScheduler):
        def stop(self, node_id: int) -> None:
            self.stopped.append(node_id)  # and it keeps running

    scheduler = Stubborn()
    scheduler.set_state(0, ObservedState.RUNNING)
    config = PsJobConfig(spec=PsJobSpec(), command=("x",), work_dir=str(tmp_path / "job"), stop_grace_s=0.1,
                         predecessor_margin_s=0.1, replacement_poll_s=0.01)  # fmt: skip
    master = PsJobMaster(config, scheduler=scheduler)
    with pytest.raises(SchedulerError, match=r"previous master's nodes \[0\] did not end"):
        master.start()
    master.stop()
    assert scheduler.specs == {}, "nothing was launched"


def test_the_shard_service_refuses_a_call_without_the_token(tmp_path: Path) -> None:
    master, _out = _master(tmp_path, PsJobSpec())
    with master:
        config = ShardClientConfig(retry=RetryPolicy(max_attempts=1, total_timeout_s=5))
        client = ShardClient(master.address, "x" * 32, "d", "intruder", config=config)
        try:
            with pytest.raises(RpcError, match="UNAUTHENTICATED"):
                client.status()
        finally:
            client.close()
    assert (tmp_path / "job" / "token").stat().st_mode & 0o777 == 0o600


def test_a_chief_that_keeps_failing_fails_the_job_with_the_reason(tmp_path: Path) -> None:
    master, _out = _master(tmp_path, PsJobSpec(max_relaunches=1))
    program = tmp_path / "stand_in.py"
    program.write_text("import os, sys, time\nif 'chief' in os.environ['DLROVER_PS_TASK']: sys.exit(7)\ntime.sleep(60)")
    with master:
        outcome = master.run(timeout_s=60)
    assert outcome is not None
    assert not outcome.succeeded
    assert outcome.reason == "chief:0 exited with status 7 after 1 relaunches"


def test_the_cli_builds_the_job_and_refuses_bad_values(tmp_path: Path) -> None:
    args = _parser().parse_args(["--ps", "2", "--workers", "3", "--min-workers", "2", "--ps-memory", "2Gi",
                                 "--work-dir", str(tmp_path), "--", "python", "train.py", "--epochs", "2"])  # fmt: skip
    config = build_config(args)
    assert config.command == ("python", "train.py", "--epochs", "2")
    assert (config.spec.ps, config.spec.workers, config.spec.min_workers) == (2, 3, 2)
    assert config.spec.resources[Role.PS].memory_mb == 2048
    assert config.spec.task_start_timeout_s == 600.0
    assert config.launch_retry.retries == 5
    retried = ["--launch-retries", "2", "--launch-retry-initial-s", "0.5", "--work-dir", "w", "--", "x"]
    assert build_config(_parser().parse_args(retried)).launch_retry.retries == 2
    with pytest.raises(ConfigError, match="launch retries must be a whole number >= 0, got -1"):
        build_config(_parser().parse_args(["--launch-retries", "-1", "--work-dir", "w", "--", "x"]))
    assert (
        build_config(
            _parser().parse_args(["--task-start-timeout", "0", "--work-dir", "w", "--", "x"])
        ).spec.task_start_timeout_s
        is None
    )
    with pytest.raises(ConfigError, match="--worker-memory: memory size '2G'"):
        build_config(_parser().parse_args(["--worker-memory", "2G", "--work-dir", str(tmp_path), "--", "x"]))
    with pytest.raises(ConfigError, match="--hot-ps on needs --ps-cpu"):
        build_config(_parser().parse_args(["--hot-ps", "on", "--work-dir", str(tmp_path), "--", "x"]))
    hot = build_config(
        _parser().parse_args(["--hot-ps", "on", "--ps-cpu", "2", "--work-dir", str(tmp_path), "--", "x"])
    )
    assert hot.hot_ps is not None
    assert hot.hot_ps.max_node_cpu == 2, "this host does not enforce CPU: a hot server is split, never grown"
    assert ps_job_main(["--ps", "0", "--work-dir", str(tmp_path / "j"), "--", "x"]) == 2
    assert ps_job_main(["--work-dir", str(tmp_path / "k")]) == 2


def test_the_cli_refuses_what_the_kubernetes_backend_cannot_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("DLROVER_JOB_TOKEN", "DLROVER_JOB_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    kube = ["--backend", "kubernetes", "--kube-namespace", "ml", "--kube-job", "rec", "--work-dir", str(tmp_path)]
    cases = [
        ([*kube, "--", "python", "train.py"], "the chief runs the command of its template"),
        (["--backend", "kubernetes", "--work-dir", str(tmp_path)], "needs --kube-namespace and --kube-job"),
        (["--kube-job", "rec", "--work-dir", str(tmp_path), "--", "x"], "are for --backend kubernetes"),
        ([*kube, "--kube-node-state-mb", "64"], "--kube-node-state-mb: not for a parameter-server job"),
        ([*kube, "--kube-tls-secret", "tls"], "--kube-tls-secret: not for a parameter-server job"),
        ([*kube, "--flash-root", "/mnt/shm"], "--flash-root: not for a parameter-server job on kubernetes"),
        (kube, "--backend kubernetes needs --checkpoint-dir"),
    ]
    for argv, message in cases:
        assert ps_job_main(argv) == 2
        assert message in capsys.readouterr().err
    # Bound to every interface there (the pods dial it); the token is the pods' Secret's, which must be given.
    with pytest.raises(ConfigError, match="needs the job token its pods read"):
        build_config(_parser().parse_args(kube), command=["python", "train.py"])
    token_file = write_token_file(tmp_path / "token", generate_token())
    config = build_config(_parser().parse_args([*kube, "--token-file", str(token_file)]), command=["python", "t.py"])
    assert (config.bind_address, config.command) == ("0.0.0.0", ("python", "t.py"))
    assert config.token == token_file.read_text().strip()
    local = build_config(_parser().parse_args(["--work-dir", str(tmp_path), "--", "x"]))
    assert (local.bind_address, local.token) == ("127.0.0.1", None)
    tuned = build_config(_parser().parse_args(["--work-dir", str(tmp_path), "--standby-refill", "3",
                                                "--predecessor-margin", "7", "--", "x"]))  # fmt: skip
    assert (tuned.standby_refill_s, tuned.predecessor_margin_s) == (3.0, 7.0)
    assert (local.flash_root, local.flash_reserve_mb) == ("/dev/shm", 1024)
    flash = build_config(_parser().parse_args(["--work-dir", str(tmp_path), "--flash-root", "off", "--", "x"]))
    assert flash.flash_root is None


def _node(env: dict[str, str], *program: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "dlrover.master.psjob.node", "--", *program]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_the_node_entry_becomes_the_chiefs_program_and_refuses_a_bad_config() -> None:
    chief = json.dumps({"cluster": {"chief": ["127.0.0.1:1"]}, "task": {"type": "chief", "index": 0}})
    env = {**os.environ, "TF_CONFIG": chief}
    assert _node(env, sys.executable, "-c", "import sys; sys.exit(7)").returncode == 7
    missing = _node({k: v for k, v in os.environ.items() if k != "TF_CONFIG"}, "true")
    assert missing.returncode == 2
    assert "TF_CONFIG is not set" in missing.stderr
    broken = _node({**env, "TF_CONFIG": "{not json"}, "true")
    assert broken.returncode != 0
    assert "TF_CONFIG is not a task's configuration" in broken.stderr
    assert _node(env).returncode == 2, "the chief without a program"


OOM_STAND_IN = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    out = Path(sys.argv[1])
    task, node = os.environ["DLROVER_PS_TASK"], os.environ["DLROVER_NODE_ID"]
    (out / f"{task}-{node}.json").write_text(os.environ["TF_CONFIG"])
    if task == "ps:0":
        if len(list(out.glob("ps:0-*.json"))) == 1:
            hog = bytearray(1024 * 1024 * 1024)  # 1 GiB, every page touched, in a 128 MiB group
            for i in range(0, len(hog), 4096):
                hog[i] = 1
        time.sleep(3600)
    if task == "chief:0":
        deadline = time.monotonic() + 60
        while len(list(out.glob("ps:0-*.json"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        sys.exit(0)
    time.sleep(3600)
    """
)


def test_a_task_killed_for_memory_comes_back_with_more(tmp_path: Path) -> None:
    groups = detect_memory_groups()
    if isinstance(groups, UnavailableMemoryGroups):
        pytest.skip(f"memory cgroups are not usable on this host: {groups.reason}")
    out = tmp_path / "out"
    out.mkdir()
    program = tmp_path / "oom.py"
    program.write_text(OOM_STAND_IN)
    scheduler = LocalScheduler([sys.executable, str(program), str(out)], stop_grace_s=1.0,
                               log_dir=tmp_path / "logs", memory_groups=groups)  # fmt: skip
    spec = PsJobSpec(resources={Role.PS: Resources(cpu=0, memory_mb=128)})
    config = PsJobConfig(spec=spec, command=("unused",), work_dir=str(tmp_path / "job"), tick_interval_s=0.05)
    with PsJobMaster(config, scheduler=scheduler) as master:
        outcome = master.run(timeout_s=90)
    assert outcome is not None
    assert outcome.succeeded, outcome
    events = read_event_log(master.event_log)
    grown = [e["data"] for e in events if e["kind"] == "oom_more_memory"]
    assert grown == [{"old_memory_mb": 128, "memory_mb": 192, "task": "ps:0"}]
    failed = [e for e in events if e["kind"] == "task_failed" and e["data"]["task"] == "ps:0"]
    assert [e["data"]["reason"] for e in failed] == ["OOMKilled"]


HOLDING_STAND_IN = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    out = Path(sys.argv[1])
    task = os.environ["DLROVER_PS_TASK"]
    ballast = b"x" * (64 << 20)  # 64 MiB resident before the task says it is up: the master's peak must see it
    (out / f"{task}-{os.environ['DLROVER_NODE_ID']}.config").write_text(os.environ["TF_CONFIG"])
    (out / f"{task}-{os.environ['DLROVER_NODE_ID']}.up").write_text(os.environ["DLROVER_CHECKPOINT_DIR"])
    while not (out / "done").exists() or not task.startswith("chief"):
        time.sleep(0.05)
    """
)


def test_a_checkpoint_too_big_for_its_servers_adds_one_and_the_profile_is_recorded(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    program = tmp_path / "holding.py"
    program.write_text(HOLDING_STAND_IN)
    scheduler = LocalScheduler([sys.executable, str(program), str(out)], stop_grace_s=1.0, log_dir=tmp_path / "logs")
    store = tmp_path / "profiles.sqlite"
    # The fixture's largest server file is 5,684 bytes: over 0.001 of a 1 MiB server (1,048 bytes).
    spec = PsJobSpec(ps=2, resources={Role.PS: Resources(cpu=0, memory_mb=1)})
    config = PsJobConfig(spec=spec, command=("python", "/w/train.py"), work_dir=str(tmp_path / "job"),
                         tick_interval_s=0.05, checkpoint_poll_s=0.05, ps_state_ratio=0.001, max_ps=4,
                         profile_store=str(store))  # fmt: skip
    master = PsJobMaster(config, scheduler=scheduler)
    with master:
        _wait_for((out, "*.up"), 4)
        assert {p.read_text() for p in out.glob("*.up")} == {str(master.checkpoint_dir)}
        fixture = Path(__file__).parent / "data" / "tf_checkpoint" / "ps"
        for name in ("ckpt-100.index", "checkpoint"):
            shutil.copy(fixture / name, master.checkpoint_dir / name)
        while master.core.spec.ps < 3 or master.core.resizing:
            master.tick()
            time.sleep(0.05)
        _wait_for((out, "ps:2-*.up"), 1)
        # The next checkpoint's largest share is no smaller (the fixture again, as step 120): a fourth server
        # would not help either, so none is added and the job is told to give the servers more memory.
        shutil.copy(fixture / "ckpt-100.index", master.checkpoint_dir / "ckpt-120.index")
        (master.checkpoint_dir / "checkpoint").write_text('model_checkpoint_path: "ckpt-120"\n')
        while "ps_advice" not in [e["kind"] for e in read_event_log(master.event_log)]:
            master.tick()
            time.sleep(0.05)
        (out / "done").touch()
        outcome = master.run(timeout_s=60)
    assert outcome is not None
    assert outcome.succeeded, outcome
    events = read_event_log(master.event_log)
    sizes = [e["data"] for e in events if e["kind"] == "checkpoint_sizes"]
    assert len(sizes) == 2, "each checkpoint read once"
    assert (sizes[0]["parameter_count"], sizes[0]["shard_bytes"]) == (1351, [5144, 8, 5684])
    adding = next(e for e in events if e["kind"] == "ps_adding")
    assert "one parameter server holds 0.01 MiB of the model's state, over 0.001 of its 1 MiB" in adding["message"]
    assert [e["data"]["ps"] for e in events if e["kind"] == "ps_added"] == [3]
    advice = [e["message"] for e in events if e["kind"] == "ps_advice"]
    assert len(advice) == 1
    assert "the last server added did not make it smaller: give the servers more memory" in advice[0]
    recorded = [e for e in events if e["kind"] == "profile_recorded"]
    assert len(recorded) == 1
    with JobProfileStore(str(store)) as opened:
        (profile,), _ = read_runs(opened)
    assert profile.outcome == "succeeded"
    assert profile.signature.script == "/w/train.py"
    assert profile.parameter_count == 1351
    ps = profile.role(Role.PS)
    assert ps is not None
    assert ps.count == 3
    assert ps.peak_memory_mb is not None
    assert ps.peak_memory_mb >= 64, "the 64 MiB each server holds is in its peak"


def test_a_worker_left_out_is_out_of_every_tf_config_after_the_restart_it_causes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    program = tmp_path / "holding.py"
    program.write_text(HOLDING_STAND_IN)
    scheduler = LocalScheduler([sys.executable, str(program), str(out)], stop_grace_s=1.0, log_dir=tmp_path / "logs")
    spec = PsJobSpec(ps=1, workers=3, min_workers=1, max_relaunches=0)
    store = tmp_path / "profiles.sqlite"
    config = PsJobConfig(spec=spec, command=("python", "/w/train.py"), work_dir=str(tmp_path / "job"),
                         tick_interval_s=0.05, profile_store=str(store))  # fmt: skip
    master = PsJobMaster(config, scheduler=scheduler)
    with master:
        _wait_for((out, "*.up"), 5)
        worker = master.core.node_of(TaskKey(Role.WORKER, 1))
        assert worker is not None
        first_cluster = {role: list(addresses) for role, addresses in master.cluster.items()}
        os.kill(master.scheduler.pid(worker) or 0, signal.SIGKILL)  # type: ignore[attr-defined]
        while master.core.spec.workers != 2 or master.core.resizing:
            master.tick()
            time.sleep(0.05)
        _wait_for((out, "*.up"), 5 + 4)  # ps, two workers and the chief started again
        (out / "done").touch()
        outcome = master.run(timeout_s=60)
    assert outcome is not None
    assert outcome.succeeded, outcome
    kinds = [e["kind"] for e in read_event_log(master.event_log)]
    assert kinds.index("task_left_out") < kinds.index("cluster_restarting") < kinds.index("cluster_restarted")
    assert master.cluster[Role.WORKER] == first_cluster[Role.WORKER][:2], "the first two addresses are kept"
    restarted = [p for p in out.glob("*.config") if int(p.stem.rsplit("-", 1)[1]) >= 5]
    assert sorted(p.stem.rsplit("-", 1)[0] for p in restarted) == ["chief:0", "ps:0", "worker:0", "worker:1"]
    for path in restarted:
        assert json.loads(path.read_text())["cluster"]["worker"] == master.cluster[Role.WORKER]
    with JobProfileStore(str(store)) as opened:
        (profile,), _ = read_runs(opened)
    # Sized with 3 workers, ended with 2: the next run is not sized down for a worker lost for good.
    assert (profile.max_nodes, profile.final_nodes) == (3, 2)
    worker = profile.role(Role.WORKER)
    assert worker is not None
    assert worker.count == 3


def test_checkpoints_go_to_memory_only_where_every_task_shares_it_and_no_server_is_memory_limited(
    tmp_path: Path,
) -> None:
    command = (sys.executable, "-c", "import time; time.sleep(60)")

    def chosen(config: PsJobConfig, scheduler: FakeScheduler | None = None) -> tuple[dict[str, object], Path]:
        master = PsJobMaster(config, scheduler=scheduler)
        try:
            master.start()
            live = master.live_checkpoint_dir
        finally:
            master.stop()
        event = next(e for e in read_event_log(master.event_log) if e["kind"] == "flash_checkpoints")
        return {"in_memory": event["data"]["in_memory"], "message": event["message"]}, live

    # A stand-in for /dev/shm (whose room this test cannot know): the choice does not look at what it is.
    shm = tmp_path / "shm"
    shm.mkdir()
    plain = PsJobConfig(spec=PsJobSpec(), command=command, work_dir=str(tmp_path / "a"), flash_root=str(shm),
                        flash_reserve_mb=0)  # fmt: skip
    decided, live = chosen(plain)
    assert decided["in_memory"] is True
    assert live.parent == shm
    assert not live.exists(), "removed when the job ended"
    given = PsJobConfig(spec=PsJobSpec(), command=command, work_dir=str(tmp_path / "b"))
    decided, live = chosen(given, FakeScheduler())
    assert decided["in_memory"] is False
    assert "share no memory" in str(decided["message"])
    assert live == tmp_path / "b" / "checkpoints"
    off = PsJobConfig(spec=PsJobSpec(), command=command, work_dir=str(tmp_path / "c"), flash_root=None)
    assert chosen(off)[0]["in_memory"] is False
    if isinstance(detect_memory_groups(), UnavailableMemoryGroups):
        return  # the servers' memory is not enforced on this host: memory is used (checked above)
    limited = PsJobConfig(spec=PsJobSpec(resources={Role.PS: Resources(cpu=0, memory_mb=512)}), command=command,
                          work_dir=str(tmp_path / "d"), flash_root=str(shm), flash_reserve_mb=0)  # fmt: skip
    decided, _live = chosen(limited)
    assert decided["in_memory"] is False
    assert "the ps's to 512 MiB" in str(decided["message"])


def test_a_launch_the_backend_fails_for_a_while_is_tried_again_and_charges_nothing(tmp_path: Path) -> None:
    from dlrover.common import ManualClock
    from dlrover.master import LaunchRetrySettings

    clock = ManualClock()
    scheduler = FakeScheduler()
    scheduler.fail_launches = 2  # the API server answers 503 to the first two creates
    config = PsJobConfig(spec=PsJobSpec(max_relaunches=0), command=("x",), work_dir=str(tmp_path / "job"),
                         launch_retry=LaunchRetrySettings(retries=3, initial_s=1.0, max_s=4.0))  # fmt: skip
    with PsJobMaster(config, scheduler=scheduler, clock=clock) as master:
        assert len(scheduler.specs) == 1, "one of the three tasks got through; two wait"
        clock.advance(1.0)
        decision = master.tick()
        assert decision.outcome is None
        assert sorted(scheduler.specs) == sorted(scheduler.launch_attempts[-3:]) == [0, 1, 2]
        events = read_event_log(master.event_log)
    retries = [e for e in events if e["kind"] == "launch_retry"]
    assert len(retries) == 2
    assert "launches are failing" in retries[0]["message"]
    assert not [e for e in events if e["kind"] in ("task_failed", "launch_failed")]


def test_a_launch_that_keeps_failing_is_the_tasks_failure_and_the_job_ends_with_the_reason(tmp_path: Path) -> None:
    from dlrover.common import ManualClock
    from dlrover.master import LaunchRetrySettings

    clock = ManualClock()
    scheduler = FakeScheduler()
    scheduler.fail_launches = True  # the backend never launches again
    config = PsJobConfig(spec=PsJobSpec(max_relaunches=1), command=("x",), work_dir=str(tmp_path / "job"),
                         launch_retry=LaunchRetrySettings(retries=1, initial_s=1.0, max_s=1.0))  # fmt: skip
    with PsJobMaster(config, scheduler=scheduler, clock=clock) as master:
        outcome = None
        for _ in range(50):
            clock.advance(1.0)
            outcome = master.tick().outcome
            if outcome is not None:
                break
        events = read_event_log(master.event_log)
    assert outcome is not None, [e["kind"] for e in events]
    assert not outcome.succeeded
    assert outcome.reason.endswith("failed (LaunchFailed) after 1 relaunches"), outcome.reason
    failed = [e["message"] for e in events if e["kind"] == "launch_failed"]
    assert failed
    assert "could not launch it (2 tries): cannot launch node" in failed[0], failed
    assert scheduler.specs == {}


def test_a_launch_waiting_for_its_retry_is_never_sent_once_its_node_is_stopped(tmp_path: Path) -> None:
    from dlrover.common import ManualClock
    from dlrover.master import LaunchRetrySettings
    from dlrover.master.psjob.core import PsDecision, Stop

    clock = ManualClock()
    scheduler = FakeScheduler()
    scheduler.fail_launches = 1  # the first task's create is refused once
    config = PsJobConfig(spec=PsJobSpec(max_relaunches=0), command=("x",), work_dir=str(tmp_path / "job"),
                         launch_retry=LaunchRetrySettings(retries=3, initial_s=1.0, max_s=4.0))  # fmt: skip
    with PsJobMaster(config, scheduler=scheduler, clock=clock) as master:
        (waiting,) = [n for n in scheduler.launch_attempts if n not in scheduler.specs]
        task = next(key for key in master._core.spec.tasks() if master._core.node_of(key) == waiting)
        # The core holds the task (a resize) before the retry is due: its node is stopped.
        master._apply(PsDecision(stops=(Stop(task, waiting, "held for a resize"),)))
        clock.advance(2.0)
        master._retry_launches(clock.now())
        assert waiting not in scheduler.specs, "a stopped node's launch went out after all"
