"""Job profiles on the master: recorded at job end, planned from at submission, stores that cannot be read set aside.

The master runs with a fake scheduler and a manual clock; the profile store is a real SQLite file.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import attrs
import pytest

from dlrover.autoscale import SCHEMA_VERSION, JobProfileStore, JobSignature, Resources, RunProfile, add_run, read_runs
from dlrover.common import ConfigError, ManualClock
from dlrover.master.cli import main
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.eventlog import read_event_log
from dlrover.master.journal import MemoryJournal
from dlrover.master.master import Master, ResourceSample
from dlrover.master.profiles import (
    PROFILE_STORE_ENV_VAR,
    ProfileRecorder,
    ThroughputBySize,
    checkpoint_sizes,
    default_profile_store,
    plan_job,
    resolve_profile_store,
    script_of,
)
from dlrover.master.scheduler.base import ObservedState
from dlrover.master.scheduler.fake import FakeScheduler
from dlrover.master.states import JobState

pytestmark = pytest.mark.timeout(60)

MIB = 1024 * 1024


def write_checkpoint(step_dir: Path, *, model_key: bool = True) -> None:
    """A committed flash checkpoint's manifests as `dlrover.flashckpt` writes them (see its ckpt_format)."""
    step_dir.mkdir(parents=True)
    prefix = "model/" if model_key else ""
    tensors = [
        {"name": f"{prefix}fc.weight", "dtype": "F32", "shape": [2, 4], "nbytes": 32, "crc32": 1},
        {"name": f"{prefix}fc.bias", "dtype": "F32", "shape": [2], "nbytes": 8, "crc32": 2},
        {"name": "optim/state/0/exp_avg", "dtype": "F32", "shape": [2, 4], "nbytes": 32, "crc32": 3},
    ]
    rank = {"format": "dlrover-flashckpt/rank", "version": 1, "step": 5, "rank": 0, "tensors": tensors}
    (step_dir / "rank_00000.json").write_text(json.dumps(rank))
    ranks = [{"rank": r, "file_bytes": 1000 + r} for r in range(2)]
    manifest = {"format": "dlrover-flashckpt/checkpoint", "version": 1, "step": 5, "world_size": 2, "ranks": ranks}
    (step_dir / "manifest.json").write_text(json.dumps(manifest))


def test_checkpoint_sizes_read_the_manifests(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "a" / "5")
    params, state, total, note = checkpoint_sizes(str(tmp_path / "a" / "5"))
    assert (params, state, total) == (10, 72, 2001)
    assert "parameters of its 'model' tensors" in note
    write_checkpoint(tmp_path / "b" / "5", model_key=False)
    assert checkpoint_sizes(str(tmp_path / "b" / "5"))[0] == 18  # no model key: every tensor counts
    params, state, total, note = checkpoint_sizes(str(tmp_path / "nowhere"))
    assert (params, state, total) == (None, None, None)
    assert note.startswith("no sizes recorded: the checkpoint's manifest")
    assert note.endswith("is not a local file")


def test_throughput_is_measured_per_node_count_from_the_first_samples_on() -> None:
    t = ThroughputBySize()
    t.observe(0.0, 0, 1)
    t.observe(1.0, 0, 1)  # start-up at one node: no samples yet, not counted
    t.observe(2.0, 100, 1)
    t.observe(3.0, 200, 1)
    t.observe(4.0, 200, 2)  # the size changed: this interval counts for neither
    t.observe(6.0, 600, 2)
    assert t.rates() == {1: 100.0, 2: 200.0}


def test_the_store_path_comes_from_the_flag_then_the_environment_then_the_default() -> None:
    env = {"XDG_CACHE_HOME": "/c"}
    assert default_profile_store(env) == "/c/dlrover/profiles.sqlite"
    assert resolve_profile_store(None, env) == "/c/dlrover/profiles.sqlite"
    assert resolve_profile_store(None, {**env, PROFILE_STORE_ENV_VAR: "/e.sqlite"}) == "/e.sqlite"
    assert resolve_profile_store("/f.sqlite", {PROFILE_STORE_ENV_VAR: "/e.sqlite"}) == "/f.sqlite"
    assert resolve_profile_store("none", env) is None
    assert resolve_profile_store(None, {PROFILE_STORE_ENV_VAR: "NONE"}) is None
    with pytest.raises(ConfigError, match=f"{PROFILE_STORE_ENV_VAR} must be a file path or 'none', got ' '"):
        resolve_profile_store(None, {PROFILE_STORE_ENV_VAR: " "})
    assert script_of(["dlrover-run", "--nnodes=1", "train.py", "x.py"]).endswith("/train.py")
    assert script_of(["python", "-m", "pkg.train"]) == ""


def config(store: Path | None, **kw: object) -> MasterConfig:
    lifecycle = LifecycleConfig(
        nodes=NodeRange(1, 1), heartbeat_timeout_s=10.0, node_resources=Resources(cpu=1, memory_mb=700)
    )
    fields: dict[str, object] = {
        "job_name": "nightly",
        "lifecycle": lifecycle,
        "heartbeat_interval_s": 1.0,
        "agent_command": ("dlrover-run", "/w/train.py"),
        "profile_store": None if store is None else str(store),
    }
    fields.update(kw)
    return MasterConfig(**fields)  # type: ignore[arg-type]


def run_one_node_job(master: Master, sched: FakeScheduler, clock: ManualClock, ckpt: str | None) -> None:
    master.start()
    master.register(0, "a", "h0")
    sched.set_state(0, ObservedState.RUNNING)
    master.tick()
    for i in range(1, 6):
        clock.advance(1.0)
        memory = (300 + 100 * i) * MIB
        master.heartbeat(0, step=i, samples=50 * i, resources=ResourceSample(memory_bytes=memory))
        master.tick()
    if ckpt is not None:
        master.record_checkpoint(5, ckpt, world_size=1)
    master.report_success(0)
    master.tick()


def test_at_job_end_the_profile_is_recorded_with_what_the_master_measured(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "ckpt" / "5")
    store = tmp_path / "p.sqlite"
    sched, clock = FakeScheduler(), ManualClock()
    cfg = config(store)
    master = Master(cfg, sched, MemoryJournal(), clock, profile_recorder=ProfileRecorder(str(store)))
    run_one_node_job(master, sched, clock, str(tmp_path / "ckpt" / "5"))
    assert master.job_state is JobState.SUCCEEDED
    master.flush_state()  # recorded once, not again at shutdown
    with JobProfileStore(str(store)) as s:
        (run,), bad = read_runs(s)
    assert bad == []
    assert run.signature == JobSignature(job_name="nightly", script="/w/train.py")
    assert (run.outcome, run.min_nodes, run.max_nodes, run.final_nodes) == ("succeeded", 1, 1, 1)
    assert run.node_resources == Resources(cpu=1, memory_mb=700)
    assert run.throughput == ((1, 50.0),)
    assert run.peak_memory_mb == ((0, 800.0),)
    assert run.peak_gpu_memory_mb == ()
    assert (run.parameter_count, run.state_bytes, run.checkpoint_bytes) == (10, 72, 2001)
    (event,) = [e for e in master.events(limit=1000) if e.kind == "profile"]
    assert event.message == f"profile {run.profile_id} recorded in {store}"
    assert event.data["parameter_count"] == 10


def test_a_job_without_a_checkpoint_says_so_and_an_unusable_store_never_fails_the_job(tmp_path: Path) -> None:
    store = tmp_path / "p.sqlite"
    store.write_bytes(b"\x00garbage" * 64)  # corrupt: set aside when the profile is recorded
    sched, clock = FakeScheduler(), ManualClock()
    master = Master(config(store), sched, MemoryJournal(), clock, profile_recorder=ProfileRecorder(str(store)))
    run_one_node_job(master, sched, clock, None)
    assert master.job_state is JobState.SUCCEEDED
    (event,) = [e for e in master.events(limit=1000) if e.kind == "profile"]
    assert "cannot be opened: file is not a database; it was set aside as" in event.message
    assert event.data["checkpoint_note"] == "no sizes recorded: the job committed no checkpoint"
    assert len(list(tmp_path.glob("p.sqlite.corrupt-*"))) == 1
    # A store that cannot even be made (its directory is a file): logged and an event, the job ends as it did.
    blocker = tmp_path / "file"
    blocker.write_text("")
    bad = str(blocker / "p.sqlite")
    sched, clock = FakeScheduler(), ManualClock()
    master = Master(config(Path(bad)), sched, MemoryJournal(), clock, profile_recorder=ProfileRecorder(bad))
    run_one_node_job(master, sched, clock, None)
    assert master.job_state is JobState.SUCCEEDED
    (event,) = [e for e in master.events(limit=1000) if e.kind == "profile"]
    assert event.message.endswith("the job's profile was not recorded")
    assert event.data["profile_id"] is None


def stored(store: Path, **kw: object) -> int:
    fields: dict[str, object] = {
        "outcome": "succeeded",
        "node_resources": Resources(cpu=1, memory_mb=900),
        "min_nodes": 1,
        "max_nodes": 3,
        "final_nodes": 3,
        "throughput": ((1, 100.0), (2, 180.0), (3, 200.0)),
        "finished_at": 10.0,
    }
    fields.update(kw)
    with JobProfileStore(str(store)) as s:
        return add_run(s, RunProfile(JobSignature("nightly", "/w/train.py"), **fields))  # type: ignore[arg-type]


def test_a_job_that_asks_for_nothing_is_planned_from_the_most_similar_profile_and_flags_win(tmp_path: Path) -> None:
    store = tmp_path / "p.sqlite"
    pid = stored(store)
    cfg = config(store, lifecycle=LifecycleConfig())
    planned, choice = plan_job(cfg, nodes_given=False, resources_given=False, wall_time=1.0)
    assert (choice.source, choice.profile_id, choice.nodes) == ("profile", pid, 3)
    assert planned.lifecycle.nodes == NodeRange(1, 3, 1)
    assert planned.lifecycle.node_resources == Resources(cpu=1, memory_mb=900)
    assert planned.initial_plan == choice
    # The local backend's slots are a limit.
    _, capped = plan_job(attrs.evolve(cfg, local_slots=2), nodes_given=False, resources_given=False, wall_time=1.0)
    assert capped.nodes == 2
    # Explicit flags always win.
    same, flags = plan_job(cfg, nodes_given=True, resources_given=False, wall_time=1.0)
    assert same == attrs.evolve(cfg, initial_plan=flags)
    assert flags.source == "flags"
    # Another kind: the defaults.
    kinded = attrs.evolve(cfg, job_kind="bert")
    planned, choice = plan_job(kinded, nodes_given=False, resources_given=False, wall_time=1.0)
    assert (choice.source, planned.lifecycle.nodes.max_nodes, planned.lifecycle.node_resources) == ("defaults", 1, None)


def test_a_newer_store_is_set_aside_at_start_and_the_master_says_so(tmp_path: Path) -> None:
    store = tmp_path / "p.sqlite"
    stored(store)
    db = sqlite3.connect(store)
    with db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    db.close()
    cfg = config(store, lifecycle=LifecycleConfig())
    planned, choice = plan_job(cfg, nodes_given=False, resources_given=False, wall_time=77.0)
    assert choice.source == "defaults"
    assert f"has schema version '{SCHEMA_VERSION + 1}'" in choice.store_notice
    assert (tmp_path / "p.sqlite.newer-77").exists()
    master = Master(planned, FakeScheduler(), MemoryJournal(), ManualClock())
    master.start()
    events = {e.kind: e for e in master.events(limit=1000)}
    assert events["profile_store"].message.startswith("job profile store: job profile store")
    assert "set aside as" in events["profile_store"].message
    assert events["initial_plan"].data["source"] == "defaults"
    assert events["initial_plan"].message.startswith("initial plan: no earlier job is similar to")


def test_dlrover_master_plan_prints_the_plan_and_its_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "p.sqlite"
    pid = stored(store)
    common = ["--job-name", "nightly", "--agent-command", "dlrover-run /w/train.py", "--profile-store", str(store)]
    assert main(["plan", *common]) == 0
    out = capsys.readouterr().out
    assert "nodes: 1:3 (node unit 1)\nnode resources: 1cpu/900MiB\n" in out
    assert f"from: profile (profile {pid})\n" in out
    assert f"why: from profile {pid} of job 'nightly' (same script '/w/train.py', same name 'nightly'" in out
    assert main(["plan", *common, "--nnodes", "2", "--node-memory", "2Gi"]) == 0
    out = capsys.readouterr().out
    assert "nodes: 2:2" in out
    assert "node resources: 0cpu/2048MiB" in out
    assert "from: flags" in out
    # A corrupt store: plan says a job would set it aside, and leaves it as it is.
    store.write_bytes(b"not a database" * 50)
    assert main(["plan", *common]) == 0
    out = capsys.readouterr().out
    assert "from: defaults" in out
    assert "cannot be opened: file is not a database; a job would set it aside and start a new store" in out
    assert store.read_bytes() == b"not a database" * 50
    # Malformed flags: exit 2 and the value named.
    assert main(["plan", *common, "--node-memory", "8G"]) == 2
    assert "--node-memory: memory size '8G' is not understood" in capsys.readouterr().err
    assert main(["plan", "--profile-store", ""]) == 2
    assert "--profile-store must be a file path or 'none', got ''" in capsys.readouterr().err


def test_a_profile_that_asks_more_than_this_backend_has_falls_back_to_the_defaults(tmp_path: Path) -> None:
    store = tmp_path / "p.sqlite"
    script = tmp_path / "missing_train.py"  # the node's agent fails at once: the job ends quickly
    with JobProfileStore(str(store)) as s:
        sig = JobSignature("huge", str(script))
        add_run(s, RunProfile(sig, "succeeded", node_resources=Resources(cpu=4096, memory_mb=1024)))
    log = tmp_path / "events.jsonl"
    code = main([
        "--backend", "local", "--job-name", "huge", "--agent-command", f"{sys.executable} {script}",
        "--profile-store", str(store), "--event-log", str(log), "--max-relaunches", "0", "--linger-max-s", "0",
        "--tick-interval-s", "0.1", "--heartbeat-interval-s", "0.5",
    ])  # fmt: skip
    assert code == 1  # the agent's script does not exist; what matters is that the job started
    (plan,) = [e for e in read_event_log(log) if e["kind"] == "initial_plan"]
    assert plan["data"]["source"] == "defaults"
    assert plan["message"].startswith("initial plan: the plan from profile 1 cannot run here: node_resources")
    assert plan["message"].endswith("starting from the defaults instead, 1 node(s) of nothing asked")


def test_a_restarted_master_resumes_with_the_plan_its_job_started_with_not_a_new_one(tmp_path: Path) -> None:
    from dlrover.master.cli import _run_parser, planned_config
    from dlrover.master.journal import SqliteJournal

    store, state = tmp_path / "p.sqlite", tmp_path / "state"
    stored(store)
    argv = ["--job-name", "nightly", "--agent-command", "dlrover-run /w/train.py", "--profile-store", str(store),
            "--state-dir", str(state)]  # fmt: skip
    first, choice = planned_config(_run_parser().parse_args(argv), 1.0)
    assert (choice.source, first.lifecycle.nodes, first.lifecycle.node_resources) == (
        "profile", NodeRange(1, 3, 1), Resources(cpu=1, memory_mb=900)
    )  # fmt: skip
    journal = SqliteJournal(state)
    master = Master(first, FakeScheduler(), journal, ManualClock())
    master.start()
    journal.close()  # the master dies
    # Meanwhile a later job of the same kind recorded another size: a new plan would differ...
    stored(store, max_nodes=5, final_nodes=5, node_resources=Resources(cpu=2, memory_mb=1800), finished_at=20.0)
    _, fresh = planned_config(_run_parser().parse_args(argv), 2.0, look_only=True)
    assert fresh.resources == Resources(cpu=2, memory_mb=1800)
    # ... but the restarted master resumes with the plan its journal holds, so the job is the same.
    resumed, again = planned_config(_run_parser().parse_args(argv), 2.0)
    assert (resumed.lifecycle.nodes, resumed.lifecycle.node_resources) == (
        NodeRange(1, 3, 1),
        first.lifecycle.node_resources,
    )
    assert (again.source, again.profile_id, again.nodes) == ("profile", choice.profile_id, 3)
    assert again.reason.startswith("resumed with the plan the job started with (profile): 1:3 node(s)")
    journal = SqliteJournal(state)
    try:
        restarted = Master(resumed, FakeScheduler(), journal, ManualClock())  # the same job: no ConfigError
        assert restarted.restored
    finally:
        journal.close()
    # Flags still win over the journal (the master itself then says whether the job is the same).
    flagged, by_flags = planned_config(_run_parser().parse_args([*argv, "--nnodes", "2"]), 2.0)
    assert (by_flags.source, flagged.lifecycle.nodes.max_nodes) == ("flags", 2)
