"""The standby chief (`dlrover.master.psjob.standby`) with real processes: node.py waits as a standby, warm, and
runs the chief's program in its own interpreter when the master hands it the chief's environment."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlrover.autoscale import Resources, Role
from dlrover.master.psjob import node as node_main
from dlrover.master.psjob.standby import STANDBY_NODE_IDS, StandbyChief
from dlrover.master.scheduler.base import NodeSpec, ObservedState
from dlrover.master.scheduler.local import LocalScheduler

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# The chief's program: says who it is, which modules were imported before it ran, then waits to be stopped.
PROGRAM = textwrap.dedent(
    """
    import json, os, sys, time
    before = "xml.dom.minidom" in sys.modules
    import xml.dom.minidom
    out = sys.argv[1]
    record = {"node": os.environ["DLROVER_NODE_ID"], "pid": os.getpid(), "argv": sys.argv,
              "warm": before, "fifo": os.environ.get("DLROVER_STANDBY_FIFO")}
    with open(os.path.join(out, "node-" + record["node"] + ".tmp"), "w") as f:
        json.dump(record, f)
    os.replace(os.path.join(out, "node-" + record["node"] + ".tmp"), os.path.join(out, "node-" + record["node"]))
    time.sleep(3600)
    """
)


CLUSTER = {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}
BIGGER = {**CLUSTER, "ps": ["127.0.0.1:2", "127.0.0.1:3"]}


def chief(node_id: int, cluster: dict[str, list[str]] = CLUSTER, memory_mb: int = 0) -> NodeSpec:
    tf_config = json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}})
    env = {"TF_CONFIG": tf_config, "DLROVER_NODE_ID": str(node_id), "DLROVER_PS_TASK": "chief:0"}
    resources = Resources(cpu=0.0, memory_mb=memory_mb) if memory_mb else None
    return NodeSpec("j", node_id, 0, env=env, role=Role.CHIEF, resources=resources)


def wait_for(path: Path) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)
    return dict(json.loads(path.read_text()))


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[LocalScheduler, StandbyChief, Path]]:
    out = tmp_path / "out"
    out.mkdir()
    program = tmp_path / "chief.py"
    program.write_text(PROGRAM)
    command = [sys.executable, node_main.__file__, "--", sys.executable, str(program), str(out)]
    scheduler = LocalScheduler(command, stop_grace_s=1.0, log_dir=tmp_path / "logs")
    standby = StandbyChief(scheduler, tmp_path / "standby")
    try:
        yield scheduler, standby, out
    finally:
        scheduler.close()
        standby.close()


def test_the_next_chief_runs_in_the_warm_standby_and_a_new_standby_waits(
    setup: tuple[LocalScheduler, StandbyChief, Path],
) -> None:
    scheduler, standby, out = setup
    assert standby.launch_chief(chief(1)) is None, "no standby yet: the first chief is a new process"
    first = wait_for(out / "node-1")
    waiting = STANDBY_NODE_IDS + 1
    assert not (out / f"node-{waiting}").exists(), "a standby does not run the program"
    deadline = time.monotonic() + 60
    while not (setup[1]._directory / f"chief-{waiting}.fifo.ready").exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    scheduler.stop(1)
    assert standby.launch_chief(chief(2)) == waiting
    second = wait_for(out / "node-2")
    # It ran in the standby's process, with the chief's environment, the program's argv, and its library warm.
    assert second["pid"] == scheduler.pid(waiting) != first["pid"]
    assert second["argv"] == first["argv"]
    assert (second["warm"], first["warm"], second["fifo"]) == (True, False, None)
    seen = standby.translate(scheduler.observe())
    assert seen[2].state is ObservedState.RUNNING
    assert seen[2].node_id == 2
    assert waiting not in seen, "the promoted standby is node 2's"
    assert STANDBY_NODE_IDS + 2 not in seen, "the new standby is nobody's"
    assert standby.backend_id(2) == waiting


def test_a_standby_for_another_cluster_or_size_is_stopped_and_the_chief_started_afresh(
    setup: tuple[LocalScheduler, StandbyChief, Path],
) -> None:
    scheduler, standby, out = setup
    standby.launch_chief(chief(1))
    wait_for(out / "node-1")
    scheduler.stop(1)
    assert standby.launch_chief(chief(2, BIGGER)) is None
    assert wait_for(out / "node-2")["pid"] == scheduler.pid(2)
    old = STANDBY_NODE_IDS + 1
    deadline = time.monotonic() + 60
    while scheduler.observe()[old].state is not ObservedState.STOPPED:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    scheduler.stop(2)
    assert standby.launch_chief(chief(3, BIGGER, memory_mb=64)) is None
