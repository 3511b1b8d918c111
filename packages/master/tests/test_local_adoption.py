"""The local backend adopts the agents a previous master launched (pid and start time from the journal)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dlrover.master.journal import JournalError
from dlrover.master.scheduler.base import NodeSpec, ObservedState
from dlrover.master.scheduler.local import LOCAL_STATE_FORMAT, LocalScheduler

pytestmark = pytest.mark.integration

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def wait_for(predicate: Callable[[], bool], timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s}s")
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_new_backend_observes_and_stops_the_agents_the_old_one_launched() -> None:
    old = LocalScheduler(SLEEPER, stop_grace_s=5.0)
    new = LocalScheduler(SLEEPER, stop_grace_s=5.0)
    try:
        old.launch(NodeSpec("j", 0, 0))
        old.launch(NodeSpec("j", 1, 1))
        version, data = old.export_state()
        assert json.loads(data)["format"] == LOCAL_STATE_FORMAT
        pids = {n: old.pid(n) for n in (0, 1)}
        new.import_state(version, data)  # the old master is gone; its agents are not
        assert new.adopted() == frozenset({0, 1})
        assert {n: o.state for n, o in new.observe().items()} == {0: ObservedState.RUNNING, 1: ObservedState.RUNNING}
        with pytest.raises(Exception, match="already launched"):
            new.launch(NodeSpec("j", 0, 0))  # never a duplicate
        new.stop(0)
        wait_for(lambda: not alive(pids[0]), what="the adopted agent stopped")  # type: ignore[arg-type]
        assert new.observe()[0].state is ObservedState.STOPPED
        os.kill(pids[1], signal.SIGKILL)  # type: ignore[arg-type]
        wait_for(lambda: new.observe()[1].state is not ObservedState.RUNNING, what="the death seen")
        seen = new.observe()[1]
        assert (seen.state, seen.exit_code) == (ObservedState.FAILED, None)  # not our child: status unknown
        assert new.export_state()[0] > version
    finally:
        new.close()
        old.close()


def test_a_reused_pid_is_never_taken_for_the_agent_nor_signalled() -> None:
    bystander = LocalScheduler(SLEEPER, stop_grace_s=5.0)
    new = LocalScheduler(SLEEPER, stop_grace_s=0.1)
    try:
        bystander.launch(NodeSpec("j", 0, 0))
        pid = bystander.pid(0)
        assert pid is not None
        # The journal says node 0 was this pid, started at another time: the pid was reused.
        doc = {"format": LOCAL_STATE_FORMAT, "version": 1, "nodes": {"0": {"pid": pid, "start_time": 1.0}}}
        new.import_state(1, json.dumps(doc))
        assert new.observe()[0].state is ObservedState.FAILED
        new.stop(0)
        new.close()
        assert alive(pid)
        assert bystander.observe()[0].state is ObservedState.RUNNING
    finally:
        new.close()
        bystander.close()


def test_close_waits_for_adopted_agents_and_kills_those_that_ignore_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "open(sys.argv[1], 'w').close(); time.sleep(600)"
    )
    old = LocalScheduler([sys.executable, "-c", code, str(ready)], stop_grace_s=0.2)
    new = LocalScheduler(SLEEPER, stop_grace_s=0.2)
    try:
        old.launch(NodeSpec("j", 0, 0))
        pid = old.pid(0)
        assert pid is not None
        wait_for(ready.exists, what="the agent ignoring SIGTERM")
        new.import_state(*old.export_state())
        new.close()  # SIGTERM is ignored: SIGKILL after the grace, and close returns once it is gone
        assert not alive(pid)
    finally:
        new.close()
        old.close()


def test_corrupt_state_is_refused_and_adopts_nothing() -> None:
    new = LocalScheduler(SLEEPER)
    for bad in ("[]", "not json", json.dumps({"format": LOCAL_STATE_FORMAT, "version": 1, "nodes": {"x": {}}})):
        with pytest.raises(JournalError, match="local scheduler state"):
            new.import_state(1, bad)
    assert new.observe() == {}
    new.close()
