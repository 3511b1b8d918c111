"""The agent actor: one per Ray node, it runs that node's `dlrover-run` agent as its child.

A plain class (no `ray` import); the backend makes it a Ray actor with the node's resources, pinned
to its node, never restarted by Ray (the master decides every relaunch), and threaded, so `stop`
and `ping` are answered while `wait_exit` blocks.

Nothing the agent starts may outlive the actor: Ray ends an actor's own process, not what it
started. The agent runs through `dlrover.common.orphan_guard` (the kernel SIGKILLs it when the
thread that spawned it ends) and is spawned from a thread that lives as long as the actor's process;
the agent's workers die with the agent the same way. The agent leads its own process group, so a
stop signals it and every process it started.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path

from dlrover.common.orphan_guard import guarded_argv

__all__ = ["NodeAgentActor"]


class NodeAgentActor:
    """Runs one node's agent; every method is called by the master's backend through Ray."""

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[list[str], dict[str, str], str | None, Future[subprocess.Popen[bytes]]]]
        self._requests = queue.Queue()
        self._popen: subprocess.Popen[bytes] | None = None
        self._exited = threading.Event()
        # The parent-death signal is tied to the spawning thread: this one lives as long as the process.
        self._spawner = threading.Thread(target=self._spawn_loop, name="dlrover-agent-spawner", daemon=True)
        self._spawner.start()

    def _spawn_loop(self) -> None:
        while True:
            command, env, log_path, answer = self._requests.get()
            try:
                answer.set_result(self._spawn(command, env, log_path))
            except BaseException as exc:  # handed to the caller of start, which raises it there
                answer.set_exception(exc)
                continue
            assert self._popen is not None
            self._popen.wait()
            self._exited.set()

    def _spawn(self, command: list[str], env: dict[str, str], log_path: str | None) -> subprocess.Popen[bytes]:
        argv = guarded_argv(os.getpid(), command, keep_oom_score=True)  # the agent holds the node's checkpoints
        full_env = {**os.environ, **env}
        fd = None
        if log_path is not None:
            try:
                Path(log_path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            except OSError as exc:  # this host cannot have it: the agent's output goes to the actor's log
                print(f"dlrover: cannot write the agent's log {log_path}: {exc}; it goes here", flush=True)
        if fd is None:
            # The actor's own output: Ray's worker log of this actor, in the node's session directory.
            popen = subprocess.Popen(argv, env=full_env, stdin=subprocess.DEVNULL, start_new_session=True)
        else:
            with open(fd, "ab") as log:
                popen = subprocess.Popen(
                    argv, env=full_env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
                )
        self._popen = popen
        return popen

    def start(self, command: Sequence[str], env: Mapping[str, str], log_path: str | None = None) -> int:
        """Start the agent (once); returns its pid. Call `wait_exit` only once this answered: a threaded
        actor runs calls in any order.

        Raises:
            RuntimeError: it was started before.
            OSError: the command cannot be run.
        """
        if self._popen is not None:
            raise RuntimeError("this actor's agent was started before; an actor runs one agent")
        answer: Future[subprocess.Popen[bytes]] = Future()
        self._requests.put((list(command), dict(env), log_path, answer))
        return answer.result().pid

    def wait_exit(self) -> int:
        """Block until the agent exits; its exit status (negative: the signal that ended it).

        Raises:
            RuntimeError: no agent was started.
        """
        if self._popen is None:
            raise RuntimeError("no agent was started in this actor")
        self._exited.wait()
        code = self._popen.returncode
        assert code is not None
        return int(code)

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM the agent's process group, SIGKILL it after `grace_s`; the agent's exit status
        (None when none was started)."""
        popen = self._popen
        if popen is None:
            return None
        if not self._exited.is_set():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, signal.SIGTERM)
            if not self._exited.wait(grace_s):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(popen.pid, signal.SIGKILL)
                self._exited.wait()
        return popen.returncode

    def ping(self) -> bool:
        """True: the actor answers (used to confirm an actor Ray called unreachable)."""
        return True
