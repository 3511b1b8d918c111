"""The local backend: each node's agent is a subprocess of the master on this host.

Each agent runs in its own session (process group), so stopping a node signals the agent and
every process it started; SIGTERM first, SIGKILL after a grace period. `close()` stops and reaps
everything, so nothing outlives the master that exits normally. (A master killed with SIGKILL
leaves its agents running on purpose: a restarted master picks the job up again.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs

from dlrover.common import ConfigError
from dlrover.master.scheduler.base import NodeSpec, ObservedNode, ObservedState, SchedulerError

__all__ = ["LocalScheduler"]


@attrs.define
class _Proc:
    popen: subprocess.Popen[bytes]
    stop_requested_at: float | None = None
    killed: bool = False


class LocalScheduler:
    """Agents as local subprocesses.

    Args:
        command: argv of the agent; the node's environment tells it who it is.
        stop_grace_s: wait between SIGTERM and SIGKILL.
        log_dir: each node's stdout and stderr go to `<log_dir>/node-<id>.log`; discarded when None.
        monotonic: time source for the grace period (injectable for tests).
    """

    name = "local"

    def __init__(
        self,
        command: Sequence[str],
        *,
        stop_grace_s: float = 5.0,
        log_dir: str | os.PathLike[str] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not command:
            raise ConfigError("the local backend needs an agent command, got an empty one")
        if stop_grace_s < 0:
            raise ConfigError(f"stop_grace_s must be zero or positive, got {stop_grace_s!r}")
        self._command = list(command)
        self._grace = stop_grace_s
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._now = monotonic
        self._lock = threading.Lock()
        self._procs: dict[int, _Proc] = {}
        self._host = socket.gethostname()
        self._closed = False

    def launch(self, spec: NodeSpec) -> None:
        """Start the agent of `spec` in a new session.

        Raises:
            SchedulerError: the node was launched before, this host is avoided, the backend is
                closed, or the command cannot be started.
        """
        with self._lock:
            if self._closed:
                raise SchedulerError(f"cannot launch node {spec.node_id}: the local backend is closed")
            if spec.node_id in self._procs:
                raise SchedulerError(f"node {spec.node_id} was already launched")
            if self._host in spec.avoid_hosts:
                raise SchedulerError(f"cannot launch node {spec.node_id}: this host ({self._host}) is avoided")
            env = {**os.environ, **spec.env}
            try:
                if self._log_dir is not None:
                    self._log_dir.mkdir(parents=True, exist_ok=True)
                    with open(self._log_dir / f"node-{spec.node_id}.log", "ab") as log:
                        popen = subprocess.Popen(
                            self._command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            start_new_session=True,
                        )  # fmt: skip
                else:
                    popen = subprocess.Popen(
                        self._command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL, start_new_session=True,
                    )  # fmt: skip
            except OSError as exc:
                raise SchedulerError(f"cannot start node {spec.node_id} ({self._command[0]!r}): {exc}") from exc
            self._procs[spec.node_id] = _Proc(popen)

    def _signal(self, proc: _Proc, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone already
            os.killpg(proc.popen.pid, sig)

    def stop(self, node_id: int) -> None:
        """SIGTERM the node's process group; `observe` escalates to SIGKILL after the grace."""
        with self._lock:
            proc = self._procs.get(node_id)
            if proc is None or proc.stop_requested_at is not None:
                return
            proc.stop_requested_at = self._now()
            if proc.popen.poll() is None:
                self._signal(proc, signal.SIGTERM)
            else:
                # The agent is gone, but what it started may not be.
                self._signal(proc, signal.SIGKILL)

    def _state(self, proc: _Proc) -> ObservedNode:
        code = proc.popen.poll()
        node_id = -1
        if code is None:
            stopping = proc.stop_requested_at
            if stopping is not None and not proc.killed and self._now() - stopping >= self._grace:
                self._signal(proc, signal.SIGKILL)
                proc.killed = True
            return ObservedNode(node_id, ObservedState.RUNNING, None, self._host)
        if proc.stop_requested_at is not None:
            return ObservedNode(node_id, ObservedState.STOPPED, code, self._host)
        state = ObservedState.SUCCEEDED if code == 0 else ObservedState.FAILED
        return ObservedNode(node_id, state, code, self._host)

    def observe(self) -> Mapping[int, ObservedNode]:
        """Poll every agent (and escalate stops past their grace period)."""
        with self._lock:
            return {nid: attrs.evolve(self._state(p), node_id=nid) for nid, p in self._procs.items()}

    def pid(self, node_id: int) -> int | None:
        """The agent's process id (its process group id too), for diagnostics and tests."""
        with self._lock:
            proc = self._procs.get(node_id)
            return None if proc is None else proc.popen.pid

    def close(self) -> None:
        """SIGTERM every agent's group, SIGKILL after the grace, and reap them all."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            procs = list(self._procs.values())
            for proc in procs:
                if proc.stop_requested_at is None and proc.popen.poll() is None:
                    proc.stop_requested_at = self._now()
        for proc in procs:
            if proc.popen.poll() is None:
                self._signal(proc, signal.SIGTERM)
        deadline = self._now() + self._grace
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=max(deadline - self._now(), 0.0))
            # SIGKILL the group even if the agent exited: its children must not survive it.
            self._signal(proc, signal.SIGKILL)
            proc.popen.wait()
