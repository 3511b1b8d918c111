"""The agent hosts the flash-checkpoint saver: real agent (fake control plane), real workers using
FlashCheckpointer. A killed worker's newest snapshot is persisted by the agent's saver (at once,
or once its successor has restored) and its successor loads it from memory; a stopped (SIGTERM'd)
agent persists the newest snapshot, stops its workers and leaves no process or shared memory
behind, for a ShardedCheckpointer's snapshot too (rank by rank, loadable as a sharded step)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from dlrover.common import ConfigError, ProcessIdentity, pid_scope, processes_mentioning
from dlrover.diagnosis import ActionKind
from dlrover.flashckpt.ckpt_format import CHECKPOINT_FORMAT, manifest_path
from dlrover.flashckpt.commit import Committer, RetentionPolicy
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.sharded import ShardedCheckpointer
from dlrover.flashckpt.storage import PosixStorage
from dlrover.launcher.agent import NODE_SHM_PREFIX, Agent, AgentConfig, AgentResult
from dlrover.launcher.control import MasterAction
from dlrover.launcher.fake_control import FakeControlPlane

WAIT_S = 90.0

WORKER = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import torch
    from dlrover.flashckpt import FlashCheckpointer, NoCheckpointError, StagerConfig

    out, mode, job, shm = sys.argv[1:5]
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    ckpt = FlashCheckpointer(
        StagerConfig(job_id=job, run_id="r", shm_dir=shm, copy_threads=1), os.path.join(out, "ckpt")
    )
    state = {"w": torch.zeros(4096), "step": 0}
    record = {"attempt": attempt, "saver_pid": ckpt.client.saver_pid, "host": os.environ.get("DLROVER_FLASHCKPT_HOST")}
    try:
        loaded = ckpt.load(target=state)
        record.update(source=loaded.source, step=loaded.step, consistent=bool((state["w"] == loaded.step).all()))
    except NoCheckpointError:
        record.update(source=None, step=0)
    with open(os.path.join(out, f"attempt{attempt}.json"), "w") as f:
        json.dump(record, f)

    def save(step, persist=False):
        state["w"].fill_(float(step))
        state["step"] = step
        assert ckpt.save(step, state, persist=persist).saved
        ckpt.stager.flush()

    if attempt == 0:
        save(1, persist=True)
        assert ckpt.wait_persisted(1, 60).committed
        save(2)
        save(3)  # newest, never asked to persist
        # Written whole, then renamed: the test stops the agent as soon as the file exists.
        with open(os.path.join(out, "ready.tmp"), "w") as f:
            f.write("3")
        os.replace(os.path.join(out, "ready.tmp"), os.path.join(out, "ready"))
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(600)  # "stop": wait for the agent's SIGTERM
    final = record["step"] + 1
    if mode == "kill":
        # Training again: the agent's saver persists the step the failure left (at once, or
        # held back until now), before the last step is persisted.
        save(final)
        from dlrover.flashckpt.commit import Committer
        from dlrover.flashckpt.storage import PosixStorage
        committer, deadline = Committer(PosixStorage(os.path.join(out, "ckpt"))), time.monotonic() + 60
        while record["step"] not in committer.steps()[0]:
            assert time.monotonic() < deadline, "the failure step was not persisted"
            time.sleep(0.05)
        final += 1
    save(final, persist=True)
    assert ckpt.wait_persisted(final, 60).committed
    ckpt.close(job_end=True)
    """
)


def _agent(
    tmp_path: Path, mode: str, control: FakeControlPlane, worker: str = WORKER, **kwargs: Any
) -> tuple[Agent, Path, str]:
    """An agent running `worker` with arguments ``OUT MODE JOB SHM``."""
    script = tmp_path / "worker.py"
    script.write_text(worker)
    out = tmp_path / "out"
    out.mkdir()
    shm = tmp_path / "shm"
    shm.mkdir()
    job = "a" + uuid.uuid4().hex[:10]
    config = AgentConfig(
        worker_argv=(sys.executable, str(script), str(out), mode, job, str(shm)),
        nproc_per_node=1,
        run_id="job1",
        monitor_interval_s=0.05,
        shutdown_grace_s=10.0,
        log_dir=tmp_path / "logs",
        redirects={0: 3},
        checkpoint_shm_dir=str(shm),
        checkpoint_stop_timeout_s=WAIT_S,
        **kwargs,
    )
    return Agent(config, control), out, job


def _logs(tmp_path: Path) -> str:
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted((tmp_path / "logs").rglob("*.log")))


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not in time")
        time.sleep(0.05)


def _stop_once_ready(agent: Agent, out: Path, tmp_path: Path, before_stop: Callable[[], None] | None = None) -> None:
    """Run `agent` until its worker wrote ``ready`` (then call `before_stop`), stop it as SIGTERM
    does, and check it exited 143."""
    outcome: list[AgentResult] = []
    thread = threading.Thread(target=lambda: outcome.append(agent.run()))
    thread.start()
    try:
        _wait_for(lambda: (out / "ready").exists() or not thread.is_alive(), "the worker saved step 3")
        if before_stop is not None:
            before_stop()
    finally:
        agent.request_stop("received SIGTERM")  # what dlrover-run's signal handler does
        thread.join(WAIT_S)
    assert not thread.is_alive()
    assert outcome[0].exit_code == 143, (outcome[0].reason, _logs(tmp_path))


def _assert_nothing_left(tmp_path: Path, job: str) -> None:
    assert list((tmp_path / "shm").iterdir()) == []  # segments, owner records, sockets: all gone
    assert not processes_mentioning(job)  # no worker, no detached saver


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("hold_s", [0.0, 120.0])
def test_a_killed_worker_resumes_from_memory_and_the_agent_persisted_its_newest_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, hold_s: float
) -> None:
    control = FakeControlPlane()
    agent, out, job = _agent(tmp_path, "kill", control, max_restarts=1, failure_persist_hold_s=hold_s)
    with caplog.at_level(logging.INFO, logger="dlrover.flashckpt"):
        result = agent.run()
    assert result.exit_code == 0, (result.reason, _logs(tmp_path))
    assert result.restarts == 1
    first = json.loads((out / "attempt0.json").read_text())
    second = json.loads((out / "attempt1.json").read_text())
    assert first["saver_pid"] == second["saver_pid"] == os.getpid()  # hosted by the agent
    assert first["host"] == second["host"]
    assert first["host"].startswith(str(tmp_path / "shm"))
    # The restarted worker loaded the newest step from memory, bit-consistent.
    assert (second["source"], second["step"], second["consistent"]) == ("memory", 3, True)
    # Nobody asked to persist step 3: the agent's saver did when the worker died, or (held
    # back) once its successor had restored and saved step 4 (or the hold ran out).
    committed, _ = Committer(PosixStorage(out / "ckpt")).steps()
    assert committed == [1, 3, 5]
    held = [r.getMessage() for r in caplog.records if "failure_persist_held" in r.getMessage()]
    assert len(held) == (1 if hold_s else 0), held
    if hold_s:  # released by the successor's first seal, long before the bound
        released = [r.getMessage() for r in caplog.records if "failure_persist_released" in r.getMessage()]
        assert len(released) == 1, released
        assert "train again" in released[0], released
    _assert_nothing_left(tmp_path, job)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_stopped_agent_persists_the_newest_step_and_leaves_nothing(tmp_path: Path) -> None:
    control = FakeControlPlane()
    agent, out, job = _agent(tmp_path, "stop", control)

    def another_agent_killed_meanwhile() -> None:
        # What a SIGKILLed agent on this host left while this one ran: removed when this one stops.
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        owner = ProcessIdentity.of(proc.pid)  # read while it waits for its input
        proc.communicate(b"", timeout=WAIT_S)
        scope = pid_scope()
        assert owner is not None
        assert scope is not None
        (tmp_path / "shm" / f"{NODE_SHM_PREFIX}{owner.pid}-{owner.start_ticks}-{scope}-left" / "snapshot").mkdir(
            parents=True
        )

    _stop_once_ready(agent, out, tmp_path, before_stop=another_agent_killed_meanwhile)
    tracker = Committer(PosixStorage(out / "ckpt")).tracker()
    assert tracker is not None
    assert tracker.step == 3
    _assert_nothing_left(tmp_path, job)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_agents_retention_applies_to_what_its_savers_commit(tmp_path: Path) -> None:
    # dlrover-run --checkpoint-keep-last=1: the worker persisted step 1, the stop persists step 3.
    control = FakeControlPlane()
    agent, out, job = _agent(tmp_path, "stop", control, checkpoint_retention=RetentionPolicy(keep_last=1))
    _stop_once_ready(agent, out, tmp_path)
    assert Committer(PosixStorage(out / "ckpt")).steps()[0] == [3]
    _assert_nothing_left(tmp_path, job)


SHARDED_WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    from dlrover.flashckpt import StagerConfig
    from dlrover.flashckpt.sharded import ShardedCheckpointer

    out, _, job, shm = sys.argv[1:5]
    ckpt = ShardedCheckpointer(
        StagerConfig(job_id=job, run_id="r", shm_dir=shm, copy_threads=1), os.path.join(out, "ckpt")
    )
    state = {"model": {"w": torch.zeros(4096)}, "step": 0}
    for step in (1, 2, 3):  # memory only: nobody asks to persist
        state["model"]["w"].fill_(float(step))
        state["step"] = step
        assert ckpt.save(step, state).saved
        ckpt.stager.flush()
    # Written whole, then renamed: the test stops the agent as soon as the file exists, then reads it.
    with open(os.path.join(out, "ready.tmp"), "w") as f:
        json.dump({"saver_pid": ckpt.client.saver_pid}, f)
    os.replace(os.path.join(out, "ready.tmp"), os.path.join(out, "ready"))
    time.sleep(600)  # wait for the agent's SIGTERM
    """
)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_stopped_agent_persists_a_sharded_checkpointers_newest_step_rank_by_rank(tmp_path: Path) -> None:
    control = FakeControlPlane()
    agent, out, job = _agent(tmp_path, "stop", control, worker=SHARDED_WORKER)
    _stop_once_ready(agent, out, tmp_path)  # a preemption: the workers go, step 3 is only in memory
    assert json.loads((out / "ready").read_text())["saver_pid"] == os.getpid()  # the agent's saver
    # The agent's saver persisted step 3 from memory in the per-rank format, and it loads as a
    # sharded step (here one rank's plain tensors) into a fresh state.
    storage = PosixStorage(out / "ckpt")
    tracker = Committer(storage).tracker()
    assert tracker is not None
    assert tracker.step == 3
    assert json.loads(storage.read_bytes(manifest_path(3)))["format"] == CHECKPOINT_FORMAT
    reader = ShardedCheckpointer(
        StagerConfig(job_id=job + "x", run_id="r", shm_dir=str(tmp_path / "shm")), out / "ckpt"
    )
    try:
        state = {"model": {"w": torch.zeros(4096)}, "step": 0}
        loaded = reader.load(state, from_memory=False)
        assert (loaded.source, loaded.step, state["step"]) == ("storage", 3, 3)
        assert bool((state["model"]["w"] == 3.0).all())
    finally:
        reader.close(remove=True)
    _assert_nothing_left(tmp_path, job)


def test_the_checkpoint_settings_are_validated() -> None:
    with pytest.raises(ConfigError, match="checkpoint_stop_timeout_s"):
        AgentConfig(worker_argv=("x",), checkpoint_stop_timeout_s=0)


PREWARM_WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    from dlrover.flashckpt import FlashCheckpointer, StagerConfig

    out, job, shm = sys.argv[1:4]
    script = os.path.abspath(sys.argv[0]).encode()

    def standbys():
        found = 0
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                try:
                    cmdline = open(f"/proc/{entry}/cmdline", "rb").read()
                except OSError:
                    continue
                found += b"dlrover.launcher._standby" in cmdline and script in cmdline
        return found

    record = {"before_save": standbys()}
    ckpt = FlashCheckpointer(
        StagerConfig(job_id=job, run_id="r", shm_dir=shm, copy_threads=1), os.path.join(out, "ckpt")
    )
    ckpt.save(1, {"w": torch.ones(1024)})
    ckpt.stager.flush()  # sealed: the agent hears this worker is training
    deadline = time.monotonic() + 60
    while not standbys() and time.monotonic() < deadline:
        time.sleep(0.05)
    record["after_save"] = standbys()
    with open(os.path.join(out, "standbys.json"), "w") as f:
        json.dump(record, f)
    ckpt.close(job_end=True)
    """
)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_standbys_for_the_next_restart_start_once_the_workers_have_checkpointed(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(PREWARM_WORKER)
    out = tmp_path / "out"
    out.mkdir()
    shm = tmp_path / "shm"
    shm.mkdir()
    job = "p" + uuid.uuid4().hex[:10]
    config = AgentConfig(
        worker_argv=(sys.executable, "-u", str(script), str(out), job, str(shm)),
        nproc_per_node=1,
        run_id="job1",
        monitor_interval_s=0.05,
        log_dir=tmp_path / "logs",
        redirects={0: 3},
        checkpoint_shm_dir=str(shm),
        checkpoint_stop_timeout_s=WAIT_S,
        prewarm_modules=("json",),
        prewarm_refill_after_s=600.0,  # only the checkpoint can trigger the refill in time
    )
    result = Agent(config, FakeControlPlane()).run()
    assert result.exit_code == 0, (result.reason, _logs(tmp_path))
    record = json.loads((out / "standbys.json").read_text())
    # The worker came from the standby started with the agent; the next one was started only
    # after the worker had sealed a checkpoint, not while it was starting.
    assert record == {"before_save": 0, "after_save": 1}
    assert not processes_mentioning(str(script))
    _assert_nothing_left(tmp_path, job)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_heartbeats_carry_the_newest_sealed_step_and_the_nodes_resource_use(tmp_path: Path) -> None:
    # No progress source is given: the agent's default reads its saver host and its process tree.
    control = FakeControlPlane(heartbeat_interval_s=0.05)
    agent, _, job = _agent(tmp_path, "stop", control)
    outcome: list[AgentResult] = []
    thread = threading.Thread(target=lambda: outcome.append(agent.run()))
    thread.start()
    try:
        # The worker sealed steps 1, 2 and 3, then sleeps: a heartbeat reports step 3.
        _wait_for(lambda: any(h.step == 3 for h in control.heartbeats) or not thread.is_alive(), "step 3 reported")
    finally:
        agent.request_stop("test over")
        thread.join(WAIT_S)
    assert not thread.is_alive()
    assert outcome[0].exit_code == 143, (outcome[0].reason, _logs(tmp_path))
    steps = [h.step for h in control.heartbeats]
    assert 3 in steps, steps
    assert steps == sorted(steps)  # progress never goes back within a run
    assert all(h.resources is not None for h in control.heartbeats)
    reported = next(h.resources for h in control.heartbeats if h.step == 3)
    assert reported is not None
    # The agent and a worker that imported torch: well over a few megabytes resident.
    assert reported.memory_bytes > 16 << 20
    assert reported.cpu_percent >= 0.0
    _assert_nothing_left(tmp_path, job)


ROUND_WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    from dlrover.flashckpt import FlashCheckpointer, NoCheckpointError, StagerConfig

    out, mode, job, shm = sys.argv[1:5]
    ckpt = FlashCheckpointer(
        StagerConfig(job_id=job, run_id="r", shm_dir=shm, copy_threads=1), os.path.join(out, "ckpt")
    )
    state = {"w": torch.zeros(16), "step": 0}
    if os.path.exists(os.path.join(out, "trained")):  # restarted (a new round counts no restart)
        loaded = ckpt.load(target=state)
        with open(os.path.join(out, "resumed.json"), "w") as f:
            json.dump({"step": loaded.step, "source": loaded.source}, f)
        ckpt.close(job_end=True)
        sys.exit(0)
    step = 0
    while step < 500:
        step += 1
        state["w"].fill_(float(step))
        state["step"] = step
        requested = mode not in ("ignore", "periodic") and ckpt.save_requested()
        if requested and mode == "crash":
            sys.exit(3)  # fails while the agent waits for the save before the round
        # Recorded before the save: once a requested save is sealed the agent may stop this
        # process at once, before a line written after the save.
        with open(os.path.join(out, "trained"), "a") as f:
            f.write(f"{step} {int(requested)}\\n")
        if requested or step == 1 or mode == "periodic":  # else: steps trained and not saved
            ckpt.save(step, state)
        if step == 3:
            open(os.path.join(out, "ready"), "w").close()
        if requested:
            time.sleep(600)  # wait for the agent's restart: no step after the save is trained
        time.sleep(1.0 if mode == "slow" else 0.1)  # "slow": the request waits a while for its step
    """
)


def _one_node_waiting_once_ready(out_dir: Path) -> tuple[Callable[[], int], list[int]]:
    """A fake rendezvous's `nodes_waiting`: one node asks to join once the worker has trained a
    few steps (it wrote ``ready``), once; and the list that says it did."""
    told: list[int] = []

    def nodes_waiting() -> int:
        if not told and (out_dir / "ready").exists():
            told.append(1)
            return 1
        return 0

    return nodes_waiting, told


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("round_save_timeout_s", [30.0, 0.0])
def test_before_a_planned_round_the_agent_has_its_workers_save_so_the_round_redoes_no_step(
    tmp_path: Path, round_save_timeout_s: float
) -> None:
    nodes_waiting, _told = _one_node_waiting_once_ready(tmp_path / "out")  # a planned round
    control = FakeControlPlane(nodes_waiting=nodes_waiting, heartbeat_interval_s=0.05)
    agent, out, _job = _agent(
        tmp_path, "round", control, worker=ROUND_WORKER, round_save_timeout_s=round_save_timeout_s
    )
    result = agent.run()
    assert result.exit_code == 0, (result.reason, _logs(tmp_path))
    resumed = json.loads((out / "resumed.json").read_text())
    trained = [line.split() for line in (out / "trained").read_text().splitlines()]
    if round_save_timeout_s:
        # The last step trained before the round was saved on request, and the round resumed from it.
        assert trained[-1][1] == "1", trained
        assert (resumed["step"], resumed["source"]) == (int(trained[-1][0]), "memory")
    else:
        # Off: nobody asks, and the steps since the last save are trained again.
        assert all(requested == "0" for _step, requested in trained)
        assert resumed["step"] == 1
        assert len(trained) >= 3


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_worker_that_fails_during_the_save_before_a_round_is_reported_and_excuses_no_peer(tmp_path: Path) -> None:
    nodes_waiting, _told = _one_node_waiting_once_ready(tmp_path / "out")
    control = FakeControlPlane(nodes_waiting=nodes_waiting, heartbeat_interval_s=0.05)
    agent, out, _job = _agent(
        tmp_path, "crash", control, worker=ROUND_WORKER, round_save_timeout_s=30.0, max_restarts=1
    )
    result = agent.run()
    assert result.exit_code == 0, (result.reason, _logs(tmp_path))
    # Its failure went to the master (not folded into the round's restart), and the rendezvous was
    # not told that this node restarts for the round: its peers' collective errors stay their own.
    assert [f.exit_code for f in control.failures] == [3], control.failures
    assert control.round_restarts == []
    assert (out / "resumed.json").exists()


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_workers_that_save_every_step_without_polling_answer_with_their_next_seal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A script that never asks save_requested() (a sharded checkpointer's, one on its own
    # schedule) answers the request with the first snapshot it seals after it: the round does not
    # wait out --round-save-timeout.
    nodes_waiting, _told = _one_node_waiting_once_ready(tmp_path / "out")
    control = FakeControlPlane(nodes_waiting=nodes_waiting, heartbeat_interval_s=0.05)
    agent, out, _job = _agent(tmp_path, "periodic", control, worker=ROUND_WORKER, round_save_timeout_s=150.0)
    with caplog.at_level(logging.INFO, logger="dlrover.launcher.agent"):
        result = agent.run()
    assert result.exit_code == 0, (result.reason, _logs(tmp_path))
    assert any("every worker sealed step" in r.getMessage() for r in caplog.records), _logs(tmp_path)
    assert not any("sealed no flash checkpoint" in r.getMessage() for r in caplog.records)
    assert json.loads((out / "resumed.json").read_text())["source"] == "memory"


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_workers_that_never_answer_the_save_request_are_restarted_after_the_timeout_while_the_agent_heartbeats(
    tmp_path: Path,
) -> None:
    out_dir = tmp_path / "out"
    told: list[float] = []
    beats: list[float] = []

    def nodes_waiting() -> int:
        if not told and (out_dir / "ready").exists():
            told.append(time.monotonic())
            return 1
        return 0

    control = FakeControlPlane(nodes_waiting=nodes_waiting, heartbeat_interval_s=0.05)
    heartbeat = control.heartbeat

    def counted(progress: Any) -> Any:
        beats.append(time.monotonic())
        return heartbeat(progress)

    control.heartbeat = counted  # type: ignore[method-assign]
    rounds: list[float] = []
    next_round = control.next_round

    def recorded(*args: Any, **kwargs: Any) -> Any:
        rounds.append(time.monotonic())
        return next_round(*args, **kwargs)

    control.next_round = recorded  # type: ignore[method-assign]
    agent, out, _job = _agent(tmp_path, "ignore", control, worker=ROUND_WORKER, round_save_timeout_s=2.0)
    result = agent.run()
    assert result.exit_code == 0, (result.reason, _logs(tmp_path))
    assert json.loads((out / "resumed.json").read_text())["step"] == 1
    # The node kept heartbeating while it waited for a save that never came, before the new round.
    assert len(rounds) == 2
    during = [t for t in beats if told[0] < t < rounds[1]]
    assert len(during) >= 2, (told, rounds, len(beats))


def _actions_once_ready(
    control: FakeControlPlane, out_dir: Path, action: MasterAction, then: Callable[[], None] | None = None
) -> list[float]:
    """Make `control` answer one heartbeat with `action` once the worker wrote ``ready`` (and call
    `then` as it answers); returns when it did (empty until then)."""
    told: list[float] = []
    heartbeat = control.heartbeat

    def answer(progress: Any) -> Any:
        asked = heartbeat(progress)
        if not told and (out_dir / "ready").exists():
            told.append(time.monotonic())
            if then is not None:
                then()
            return [action]
        return asked

    control.heartbeat = answer  # type: ignore[method-assign]
    return told


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("planned", [True, False])
def test_a_restart_the_master_marks_as_a_planned_rounds_saves_first_and_one_for_a_failure_does_not(
    tmp_path: Path, planned: bool
) -> None:
    control = FakeControlPlane(heartbeat_interval_s=0.05)
    action = MasterAction(ActionKind.RESTART_PROCESSES, "planned round: node 2 left the job", planned_round=planned)
    told = _actions_once_ready(control, tmp_path / "out", action)
    agent, out, _job = _agent(tmp_path, "round", control, worker=ROUND_WORKER, round_save_timeout_s=30.0)
    result = agent.run()
    assert result.exit_code == 0, (result.reason, _logs(tmp_path))
    assert told
    resumed = json.loads((out / "resumed.json").read_text())
    trained = [line.split() for line in (out / "trained").read_text().splitlines()]
    if planned:
        # A shrink's planned round: the last step trained was saved on request and resumed from.
        assert trained[-1][1] == "1", trained
        assert (resumed["step"], resumed["source"]) == (int(trained[-1][0]), "memory")
    else:
        # A restart for a failure waits for nothing: the steps since step 1 are trained again.
        assert all(requested == "0" for _step, requested in trained)
        assert resumed["step"] == 1


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("then", ["restart", "removal"])
def test_the_resizes_own_step_arriving_during_the_save_for_a_dissolved_round_waits_for_that_save(
    tmp_path: Path, then: str
) -> None:
    # A shrink dissolves the rendezvous round as it queues the staying nodes' planned restart: an
    # agent that learns of the round first (nodes waiting) asks for the save, and the master's
    # restart (or this node's removal) comes with a heartbeat during it. That is the same round:
    # the agent still waits for the save, or the workers restart before their next step saves it
    # and the whole job trains those steps again. The worker's steps take a second; heartbeats
    # come every 0.05 s.
    nodes_waiting, told = _one_node_waiting_once_ready(tmp_path / "out")
    control = FakeControlPlane(nodes_waiting=nodes_waiting, heartbeat_interval_s=0.05)
    heartbeat = control.heartbeat
    answered: list[int] = []
    kind = ActionKind.RESTART_PROCESSES if then == "restart" else ActionKind.REMOVE_NODE
    resize = MasterAction(kind, "planned round: node 2 left the job", planned_round=True)

    def answer(progress: Any) -> Any:
        asked = heartbeat(progress)
        if told and not answered:
            answered.append(1)
            return [resize]
        return asked

    control.heartbeat = answer  # type: ignore[method-assign]
    agent, out, _job = _agent(tmp_path, "slow", control, worker=ROUND_WORKER, round_save_timeout_s=60.0)
    result = agent.run()
    assert answered
    trained = [line.split() for line in (out / "trained").read_text().splitlines()]
    assert trained[-1][1] == "1", (trained, _logs(tmp_path))
    if then == "restart":
        assert result.exit_code == 0, (result.reason, _logs(tmp_path))
        resumed = json.loads((out / "resumed.json").read_text())
        assert (resumed["step"], resumed["source"]) == (int(trained[-1][0]), "memory")
    else:
        # Removed: the step reached is sealed and persisted as the node leaves.
        assert result.exit_code == 1, (result.reason, _logs(tmp_path))
        tracker = Committer(PosixStorage(out / "ckpt")).tracker()
        assert tracker is not None
        assert tracker.step == int(trained[-1][0]), (tracker, trained)


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "removed, then SIGTERM"])
def test_a_node_stopped_or_removed_for_a_shrink_has_polling_workers_save_first_and_persists_that_step(
    tmp_path: Path, how: str
) -> None:
    control = FakeControlPlane(heartbeat_interval_s=0.05)
    removed = how.startswith("removed")
    sig = signal.SIGINT if how == "SIGINT" else signal.SIGTERM
    agent, out, job = _agent(tmp_path, "round", control, worker=ROUND_WORKER, round_save_timeout_s=30.0)
    if removed:
        # The master's answer to a heartbeat of a node a shrink let go, and the backend's SIGTERM
        # right behind it: the save goes on.
        leave = MasterAction(ActionKind.REMOVE_NODE, "node 2 is removed", planned_round=True)
        _actions_once_ready(control, out, leave, then=lambda: agent.request_stop("received SIGTERM"))
    outcome: list[AgentResult] = []
    thread = threading.Thread(target=lambda: outcome.append(agent.run()))
    thread.start()
    try:
        _wait_for(lambda: (out / "ready").exists() or not thread.is_alive(), "the worker trained 3 steps")
    finally:
        if not removed:
            agent.request_stop(f"received {sig.name}", sig)  # what dlrover-run's signal handler does
        thread.join(WAIT_S)
    assert not thread.is_alive()
    assert outcome[0].exit_code == (1 if removed else 128 + sig), (outcome[0].reason, _logs(tmp_path))
    trained = [line.split() for line in (out / "trained").read_text().splitlines()]
    tracker = Committer(PosixStorage(out / "ckpt")).tracker()
    assert tracker is not None
    if sig is signal.SIGTERM:
        # A backend stopping the node (a shrink's leaving node): the step reached is sealed and
        # persisted at the stop, so the job's next round redoes none of it.
        assert trained[-1][1] == "1", trained
        assert tracker.step == int(trained[-1][0]), (tracker, trained)
    else:
        # SIGINT (a person at the terminal) stops at once: the newest snapshot is step 1's.
        assert all(requested == "0" for _step, requested in trained)
        assert tracker.step == 1
    _assert_nothing_left(tmp_path, job)
