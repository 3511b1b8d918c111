"""The standby chief (`dlrover.master.psjob.standby`) with real processes: node.py waits as a standby, warm, and
runs the chief's program in its own interpreter when the master hands it the chief's environment."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlrover.autoscale import Resources, Role
from dlrover.master.psjob import node as node_main
from dlrover.master.psjob.standby import STANDBY_NODE_IDS, StandbyTasks
from dlrover.master.scheduler.base import NodeSpec, ObservedState
from dlrover.master.scheduler.local import LocalScheduler

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# The chief's program: says who it is, then waits to be stopped.
PROGRAM = textwrap.dedent(
    """
    import json, os, sys, time
    out = sys.argv[1]
    record = {"node": os.environ["DLROVER_NODE_ID"], "pid": os.getpid(), "argv": sys.argv,
              "fifo": os.environ.get("DLROVER_STANDBY_FIFO")}
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


def wait_ready(directory: Path, node_id: int) -> None:
    deadline = time.monotonic() + 60
    while not (directory / f"chief-{node_id}.fifo.ready").exists():
        assert time.monotonic() < deadline, "the standby never said it was ready"
        time.sleep(0.02)


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[LocalScheduler, StandbyTasks, Path]]:
    out = tmp_path / "out"
    out.mkdir()
    program = tmp_path / "chief.py"
    program.write_text(PROGRAM)
    command = [sys.executable, node_main.__file__, "--", sys.executable, str(program), str(out)]
    scheduler = LocalScheduler(command, stop_grace_s=1.0, log_dir=tmp_path / "logs")
    (tmp_path / "standby").mkdir()
    (tmp_path / "standby" / "chief-7.fifo.ready").touch()  # a killed master's leftovers
    standby = StandbyTasks(scheduler, tmp_path / "standby", (Role.CHIEF,), refill_delay_s=5.0,
                           max_standby_failures=2)  # fmt: skip
    assert not (tmp_path / "standby").exists(), "emptied: a leftover could pass for a ready standby"
    try:
        yield scheduler, standby, tmp_path / "standby"
    finally:
        scheduler.close()
        standby.close()


def test_the_next_chief_runs_in_the_warm_standby(setup: tuple[LocalScheduler, StandbyTasks, Path]) -> None:
    scheduler, standby, directory = setup
    out = directory.parent / "out"
    assert standby.launch(chief(1), now=0.0) is None, "no standby yet: the first chief is a new process"
    first = wait_for(out / "node-1")
    waiting = STANDBY_NODE_IDS + 1
    standby.refill(now=4.0)
    assert not directory.exists(), "not before its delay: its import would slow the chief's start"
    standby.refill(now=5.0)
    wait_ready(directory, waiting)
    assert not (out / f"node-{waiting}").exists(), "a standby does not run the program"
    scheduler.stop(1)
    assert standby.launch(chief(2), now=10.0) == waiting
    second = wait_for(out / "node-2")
    # It ran in the standby's process, with the chief's environment, the program's argv, its library warm.
    assert second["pid"] == scheduler.pid(waiting) != first["pid"]
    assert second["argv"] == first["argv"]
    assert second["fifo"] is None, "the standby's own variable is gone"
    standby.refill(now=15.0)  # the next one
    seen = standby.translate(scheduler.observe(), now=15.0)
    assert seen[2].state is ObservedState.RUNNING
    assert seen[2].node_id == 2
    assert waiting not in seen, "the promoted standby is node 2's"
    assert STANDBY_NODE_IDS + 2 not in seen, "a waiting standby is nobody's"
    assert standby.backend_id(2) == waiting


def test_a_standby_for_another_cluster_or_size_is_stopped_and_the_chief_started_afresh(
    setup: tuple[LocalScheduler, StandbyTasks, Path],
) -> None:
    scheduler, standby, directory = setup
    out = directory.parent / "out"
    standby.launch(chief(1), now=0.0)
    wait_for(out / "node-1")
    standby.refill(now=5.0)
    scheduler.stop(1)
    assert standby.launch(chief(2, BIGGER), now=6.0) is None
    assert wait_for(out / "node-2")["pid"] == scheduler.pid(2)
    assert any("not used and stopped: it was started for another cluster" in note for note in standby.notes)
    old = STANDBY_NODE_IDS + 1
    deadline = time.monotonic() + 60
    while scheduler.observe()[old].state is not ObservedState.STOPPED:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    standby.refill(now=11.0)
    scheduler.stop(2)
    assert standby.launch(chief(3, BIGGER, memory_mb=64), now=12.0) is None


def test_a_standby_that_dies_unused_is_replaced_later_until_too_many_did(
    setup: tuple[LocalScheduler, StandbyTasks, Path],
) -> None:
    scheduler, standby, directory = setup
    standby.launch(chief(1), now=0.0)
    for attempt, (start, died) in enumerate(((5.0, 6.0), (26.0, 27.0)), start=1):
        standby.refill(now=start)
        node_id = STANDBY_NODE_IDS + attempt
        wait_ready(directory, node_id)
        pid = scheduler.pid(node_id)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while scheduler.observe()[node_id].state is ObservedState.RUNNING:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        standby.translate(scheduler.observe(), now=died)
        assert f"standby (node {node_id}) ended before it was used" in standby.notes[-1]
        standby.refill(now=died + 1.0)  # too early: the wait doubles after each death (10 s, then 20 s)
        assert not (directory / f"chief-{node_id + 1}.fifo").exists()
    assert "the job goes on without a chief standby" in standby.notes[-1]
    standby.refill(now=1000.0)
    assert not list(directory.glob("*.fifo")), "no more standbys"


def test_the_warm_up_imports_the_installed_libraries_the_program_imports_first(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    (tmp_path / "mine.py").write_text("raise RuntimeError('the program's own module must not be imported')\n")
    script.write_text('"""A program."""\nfrom __future__ import annotations\nimport mine\nimport xml.dom.pulldom\n'
                      'import os\nos.environ["X"] = "1"  # may configure what the next imports read\n'
                      'import xml.sax.saxutils\n')  # fmt: skip
    assert node_main._leading_imports(str(script)) == {"mine", "xml.dom.pulldom", "os"}
    for name in ("xml.dom.pulldom", "mine"):
        sys.modules.pop(name, None)
    node_main._warm_up(str(script))
    assert "xml.dom.pulldom" in sys.modules
    assert "mine" not in sys.modules, "not an installed library: the program's own"


def test_the_warm_up_leaves_a_module_of_the_programs_that_shadows_an_installed_one(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    (tmp_path / "colorsys.py").write_text("SHADOW = True\n")  # a standard-library name
    script.write_text("import colorsys\n")
    sys.modules.pop("colorsys", None)
    node_main._warm_up(str(script))
    assert "colorsys" not in sys.modules, "the program's own colorsys.py, not the standard library's, is its import"
