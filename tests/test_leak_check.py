"""The root conftest's leak check tells this session's processes, and those a wider fixture holds,
by their ancestry too: a process that sets its title may overwrite the environment variables that
mark it (Ray's agents do, and which ones they lose depends on the order of their environment)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

pytestmark = pytest.mark.timeout(120)

# Starts a child whose environment holds none of the markers, prints its pid and waits for stdin
# to close; the child ends when its parent does (it waits for its own stdin, the parent's pipe).
_PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], env={}, stdin=subprocess.PIPE)
print(child.pid, flush=True)
sys.stdin.read()
child.stdin.close()
child.wait()
"""


@pytest.fixture
def root_conftest(request: pytest.FixtureRequest) -> ModuleType:
    root = os.path.join(str(request.config.rootpath), "conftest.py")
    for plugin in request.config.pluginmanager.get_plugins():
        if getattr(plugin, "__file__", None) == root:
            return plugin  # type: ignore[no-any-return]
    raise AssertionError(f"the root conftest {root} is not loaded")


@pytest.fixture
def parent_and_unmarked_child(request: pytest.FixtureRequest) -> Iterator[tuple[int, int]]:
    env = dict(os.environ)
    if request.param:
        env["PYTEST_DLROVER_HELD_BY_FIXTURE"] = "1"
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        yield parent.pid, child
    finally:
        assert parent.stdin is not None
        parent.stdin.close()
        try:
            parent.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.kill(parent.pid, signal.SIGKILL)
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


@pytest.mark.parametrize("parent_and_unmarked_child", [True], indirect=True)
def test_a_child_of_a_held_process_is_held_whatever_its_environment_shows(
    root_conftest: ModuleType, parent_and_unmarked_child: tuple[int, int]
) -> None:
    parent, child = parent_and_unmarked_child
    ours, _ = root_conftest._scan_processes()
    assert {parent, child} <= {pid for pid, _, _ in ours}
    assert {parent, child} <= root_conftest._held_now


@pytest.mark.parametrize("parent_and_unmarked_child", [False], indirect=True)
def test_a_child_of_this_sessions_process_is_this_sessions_but_not_held(
    root_conftest: ModuleType, parent_and_unmarked_child: tuple[int, int]
) -> None:
    parent, child = parent_and_unmarked_child
    ours, _ = root_conftest._scan_processes()
    assert {parent, child} <= {pid for pid, _, _ in ours}
    assert not {parent, child} & root_conftest._held_now
