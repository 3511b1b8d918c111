"""A standby chief: the chief's next incarnation, started ahead and kept warm.

A chief restarted after a lost parameter server (or its own failure, or a planned restart) spends about half of
the job's downtime importing TensorFlow and its libraries again. `StandbyChief` keeps one more chief process
ready on the local backend: it runs `node.py` in standby mode (`DLROVER_STANDBY_FIFO`), imports TensorFlow and
the program's libraries, says it is ready, and blocks on a FIFO. When the core launches the chief, the runner
hands that launch here: if the standby is ready and was started for the same cluster (`TF_CONFIG`) and
resources, its FIFO gets the new chief's environment and it runs the program at once; the core's node id is
then an alias of the standby's backend node (observations, stops, process ids and memory records are
translated). Otherwise the chief is launched as usual. Either way a new standby is started for the next time.

The FIFO lies in the job's work directory, which only processes of this host can see: the Kubernetes backend
gets no standby.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import attrs

from dlrover.master.psjob.node import STANDBY_FIFO_ENV_VAR
from dlrover.master.scheduler.base import NodeSpec, ObservedNode, SchedulerBackend, SchedulerError

__all__ = ["STANDBY_NODE_IDS", "StandbyChief"]

_log = logging.getLogger(__name__)

STANDBY_NODE_IDS = 1 << 30
"""Standby chiefs are backend nodes numbered from here, far above the core's own node ids."""


@attrs.define
class _Standby:
    node_id: int
    fifo: Path
    tf_config: str
    spec: NodeSpec


class StandbyChief:
    """Keeps one warm chief beside a PS job's chief (see the module).

    Args:
        scheduler: the local backend the tasks run on.
        directory: where the FIFOs are made (private to this master).
    """

    def __init__(self, scheduler: SchedulerBackend, directory: Path) -> None:
        self._scheduler = scheduler
        self._directory = directory
        self._next = STANDBY_NODE_IDS
        self._standby: _Standby | None = None
        self._aliases: dict[int, int] = {}  # the core's node id -> the backend node running it
        self._owners: dict[int, int] = {}  # the other way

    def backend_id(self, node_id: int) -> int:
        """The backend node that runs the core's node `node_id` (itself unless a standby took it over)."""
        return self._aliases.get(node_id, node_id)

    def translate(self, observed: Mapping[int, ObservedNode]) -> dict[int, ObservedNode]:
        """What the backend sees, by the core's node ids: a promoted standby as the node it became; the
        standby waiting is not the core's."""
        out: dict[int, ObservedNode] = {}
        waiting = self._standby.node_id if self._standby is not None else None
        for backend_id, seen in observed.items():
            if backend_id == waiting:
                continue
            node_id = self._owners.get(backend_id, backend_id)
            out[node_id] = seen if node_id == backend_id else attrs.evolve(seen, node_id=node_id)
        return out

    def launch_chief(self, spec: NodeSpec) -> int | None:
        """Start the chief `spec` describes: through the standby when it can (the standby's backend node id is
        returned), else as a new process (None). Then start a standby for the next time.

        Raises:
            SchedulerError: the backend refused the chief.
        """
        promoted = self._promote(spec)
        if promoted is None:
            self._scheduler.launch(spec)
        self._start_standby(spec)
        return promoted

    def close(self) -> None:
        """Forget the standby (the backend's close stops its process) and remove its FIFO."""
        if self._standby is not None:
            self._remove_files(self._standby)
            self._standby = None

    def _promote(self, spec: NodeSpec) -> int | None:
        standby = self._standby
        if standby is None:
            return None
        if standby.tf_config != spec.env.get("TF_CONFIG") or standby.spec.resources != spec.resources:
            self._retire("it was started for another cluster or size")
            return None
        if not Path(f"{standby.fifo}.ready").exists():
            return None  # still warming up: kept for the next time
        try:
            fd = os.open(standby.fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            self._retire("its process is gone")  # no reader at the FIFO
            return None
        try:
            os.write(fd, json.dumps({"env": dict(spec.env)}).encode())
        finally:
            os.close(fd)
        self._aliases[spec.node_id] = standby.node_id
        self._owners[standby.node_id] = spec.node_id
        self._remove_files(standby)
        self._standby = None
        return standby.node_id

    def _start_standby(self, chief: NodeSpec) -> None:
        if self._standby is not None:
            return
        self._next += 1
        node_id = self._next
        self._directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fifo = self._directory / f"chief-{node_id}.fifo"
        env = {**chief.env, "DLROVER_NODE_ID": str(node_id), STANDBY_FIFO_ENV_VAR: str(fifo)}
        spec = attrs.evolve(chief, node_id=node_id, env=env)
        try:
            os.mkfifo(fifo, 0o600)
            self._scheduler.launch(spec)
        except (OSError, SchedulerError) as exc:
            _log.warning("no standby chief: %s", exc)
            fifo.unlink(missing_ok=True)
            return
        self._standby = _Standby(node_id, fifo, chief.env.get("TF_CONFIG", ""), chief)

    def _retire(self, why: str) -> None:
        standby = self._standby
        assert standby is not None
        _log.info("the standby chief (node %d) is stopped: %s", standby.node_id, why)
        self._scheduler.stop(standby.node_id)
        self._remove_files(standby)
        self._standby = None

    @staticmethod
    def _remove_files(standby: _Standby) -> None:
        standby.fifo.unlink(missing_ok=True)
        Path(f"{standby.fifo}.ready").unlink(missing_ok=True)
