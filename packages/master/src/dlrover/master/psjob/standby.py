"""Standby tasks: the next incarnation of the chief and of a parameter server, started ahead and kept warm.

A chief restarted after a lost parameter server waits for the relaunched server, and both spend most of the
job's downtime importing TensorFlow (and the chief its libraries) again. `StandbyTasks` keeps one more process
of each ready on the local backend: `node.py` in standby mode (`DLROVER_STANDBY_FIFO`) imports them, says it is
ready, and blocks on a FIFO. When the core launches a chief or a parameter server, the runner hands the launch
here: if the standby of that role is ready and fits (a chief's was started for the same cluster, `TF_CONFIG`, and
either's for the same resources), the FIFO gets the task's environment and the standby becomes the task at once
(a chief runs the program in its warm interpreter, a server serves at its address); the core's node id is then
an alias of the standby's backend node (observations, stops, process ids and memory records are translated).
Otherwise the task is launched as usual. The next standby of the role starts `refill_delay_s` later, so that its
own import does not slow the restart it is for; one that dies before it is used is replaced the same way, and
after `max_standby_failures` deaths in a row the role goes without.

The FIFO lies in the job's work directory, which only processes of this host can see: the Kubernetes backend
gets no standby.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import shutil
import time
from collections.abc import Collection, Mapping
from pathlib import Path

import attrs

from dlrover.autoscale import Role
from dlrover.master.psjob.node import STANDBY_FIFO_ENV_VAR
from dlrover.master.scheduler.base import NodeSpec, ObservedNode, ObservedState, SchedulerBackend, SchedulerError

__all__ = ["STANDBY_NODE_IDS", "StandbyTasks"]

_log = logging.getLogger(__name__)

STANDBY_NODE_IDS = 1 << 30
"""Standbys are backend nodes numbered from here, far above the core's own node ids."""
_ENDED = (ObservedState.SUCCEEDED, ObservedState.FAILED, ObservedState.STOPPED)


@attrs.define
class _Standby:
    node_id: int
    fifo: Path
    spec: NodeSpec


class StandbyTasks:
    """Keeps a warm standby of each of `roles` beside a PS job's tasks (see the module).

    Args:
        scheduler: the local backend, running `node.py`.
        directory: where the FIFOs are made (private to this master; emptied first: a master killed before
            left its own there).
        roles: which roles get a standby (chief, ps).
        refill_delay_s: how long after a role's launch its next standby starts.
        max_standby_failures: a role whose standbys died this many times in a row before use gets no more.
        go_timeout_s: the longest the master waits to hand a standby its task (it reads at once).
    """

    def __init__(
        self,
        scheduler: SchedulerBackend,
        directory: Path,
        roles: Collection[Role] = (Role.CHIEF, Role.PS),
        *,
        refill_delay_s: float = 10.0,
        max_standby_failures: int = 3,
        go_timeout_s: float = 1.0,
    ) -> None:
        self._scheduler = scheduler
        self._directory = directory
        shutil.rmtree(directory, ignore_errors=True)
        self._roles = frozenset(roles)
        self._refill_delay_s = refill_delay_s
        self._max_failures = max_standby_failures
        self._go_timeout_s = go_timeout_s
        self._next = STANDBY_NODE_IDS
        self._standbys: dict[Role, _Standby] = {}
        self._due: dict[Role, tuple[float, NodeSpec]] = {}  # the next standby of a role: when, made like what
        self._failures: dict[Role, int] = {}
        self._aliases: dict[int, int] = {}  # the core's node id -> the backend node running it
        self._owners: dict[int, int] = {}  # the other way
        self.notes: list[str] = []
        """What happened to standbys that the job's events should say (taken by the runner)."""

    def backend_id(self, node_id: int) -> int:
        """The backend node that runs the core's node `node_id` (itself unless a standby took it over)."""
        return self._aliases.get(node_id, node_id)

    def translate(self, observed: Mapping[int, ObservedNode], now: float) -> dict[int, ObservedNode]:
        """What the backend sees, by the core's node ids: a promoted standby as the node it became; standbys
        (waiting, or stopped unused) are nobody's. A waiting standby seen ended is replaced later."""
        for role, standby in list(self._standbys.items()):
            seen = observed.get(standby.node_id)
            if seen is not None and seen.state in _ENDED:
                why = f"({seen.state.value}, exit code {seen.exit_code})"
                self._lost(
                    role, f"the {role.value} standby (node {standby.node_id}) ended before it was used {why}", now
                )
        out: dict[int, ObservedNode] = {}
        for backend_id, seen in observed.items():
            node_id = self._owners.get(backend_id, backend_id)
            if node_id >= STANDBY_NODE_IDS:
                continue
            out[node_id] = seen if node_id == backend_id else attrs.evolve(seen, node_id=node_id)
        return out

    def launch(self, spec: NodeSpec, now: float) -> int | None:
        """Start the task `spec` describes: through its role's standby when it can (the standby's backend node id
        is returned), else as a new process (None); its role's next standby is due `refill_delay_s` later.

        Raises:
            SchedulerError: the backend refused the task.
        """
        promoted = self._promote(spec) if spec.role in self._roles else None
        if promoted is None:
            self._scheduler.launch(spec)
        if spec.role in self._roles and spec.role not in self._standbys:
            # (A later time already due stands: the wait after a standby that died doubles.)
            due = max(now + self._refill_delay_s, self._due.get(spec.role, (0.0, spec))[0])
            self._due[spec.role] = (due, spec)
        return promoted

    def refill(self, now: float) -> None:
        """Start each standby that is due."""
        for role, (due, spec) in list(self._due.items()):
            if now >= due and role not in self._standbys:
                del self._due[role]
                self._start(role, spec)

    def close(self) -> None:
        """Forget the standbys (the backend's close stops their processes) and remove their FIFOs."""
        self._standbys.clear()
        self._due.clear()
        shutil.rmtree(self._directory, ignore_errors=True)

    def _fits(self, standby: _Standby, spec: NodeSpec) -> bool:
        same_cluster = spec.role is not Role.CHIEF or standby.spec.env.get("TF_CONFIG") == spec.env.get("TF_CONFIG")
        return same_cluster and standby.spec.resources == spec.resources

    def _promote(self, spec: NodeSpec) -> int | None:
        standby = self._standbys.get(spec.role)
        if standby is None:
            return None
        if not self._fits(standby, spec):
            self._retire(spec.role, "it was started for another cluster or size")
            return None
        if not Path(f"{standby.fifo}.ready").exists():
            return None  # still warming up: kept for the next time
        try:
            fd = os.open(standby.fifo, os.O_WRONLY | os.O_NONBLOCK)  # no reader (a dead standby): ENXIO at once
        except OSError as exc:
            gone = exc.errno == errno.ENXIO
            self._retire(spec.role, "its process is gone" if gone else f"its FIFO cannot be opened ({exc})")
            return None
        try:
            self._tell(fd, json.dumps({"env": dict(spec.env)}).encode())
        except OSError as exc:  # it died while being told (EPIPE), or stopped reading
            self._retire(spec.role, f"telling it failed ({exc})")
            return None
        finally:
            os.close(fd)
        self._aliases[spec.node_id] = standby.node_id
        self._owners[standby.node_id] = spec.node_id
        self._remove_files(standby)
        del self._standbys[spec.role]
        self._failures.pop(spec.role, None)
        return standby.node_id

    def _tell(self, fd: int, data: bytes) -> None:
        """Write all of `data` to the FIFO the standby reads to its end, never blocking the master for more than
        `go_timeout_s` (a standby stopped mid-read).

        Raises:
            OSError: it could not be written (EPIPE: the standby is gone; ETIMEDOUT: it did not read).
        """
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        deadline = time.monotonic() + self._go_timeout_s
        while data:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                raise OSError(errno.ETIMEDOUT, "the standby did not read its go")
            try:
                data = data[os.write(fd, data) :]
            except BlockingIOError:
                continue

    def _start(self, role: Role, like: NodeSpec) -> None:
        failures = self._failures.get(role, 0)
        if failures >= self._max_failures:
            return
        self._next += 1
        node_id = self._next
        self._directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fifo = self._directory / f"{role.value}-{node_id}.fifo"
        env = {**like.env, "DLROVER_NODE_ID": str(node_id), STANDBY_FIFO_ENV_VAR: str(fifo),
               "DLROVER_PS_TASK": f"standby-{role.value}"}  # fmt: skip
        spec = attrs.evolve(like, node_id=node_id, env=env)
        try:
            os.mkfifo(fifo, 0o600)
            self._scheduler.launch(spec)
        except (OSError, SchedulerError) as exc:
            self.notes.append(f"no {role.value} standby: {exc}")
            fifo.unlink(missing_ok=True)
            return
        self._standbys[role] = _Standby(node_id, fifo, like)

    def _retire(self, role: Role, why: str) -> None:
        standby = self._standbys.pop(role)
        self.notes.append(f"the {role.value} standby (node {standby.node_id}) is not used and stopped: {why}")
        self._scheduler.stop(standby.node_id)
        self._remove_files(standby)

    def _lost(self, role: Role, why: str, now: float) -> None:
        """A standby that ended unused: another later (the wait doubling), unless too many did in a row."""
        standby = self._standbys.pop(role)
        self._remove_files(standby)
        self._failures[role] = failures = self._failures.get(role, 0) + 1
        if failures >= self._max_failures:
            why += f"; {failures} in a row: the job goes on without a {role.value} standby"
        else:
            self._due[role] = (now + self._refill_delay_s * 2**failures, standby.spec)
        self.notes.append(why)

    @staticmethod
    def _remove_files(standby: _Standby) -> None:
        standby.fifo.unlink(missing_ok=True)
        Path(f"{standby.fifo}.ready").unlink(missing_ok=True)
