"""`RayTestCluster`: a real multi-node Ray cluster on this host, for tests and benchmarks.

Built on Ray's public `ray.cluster_utils.Cluster`: a head node that runs nothing (num_cpus=0, the
driver attaches there) and worker nodes added and removed, or killed for real, by the test. Every
temporary file Ray writes lies under a directory the cluster owns, and shutting down checks that
nothing was left: no process the cluster started, nothing new in /tmp/ray or the home directory.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .procfs import ProcessInfo, alive, ancestors, descendants, process_table, with_environ

__all__ = ["FAST_HEALTH_CHECKS", "RayClusterError", "RayClusterLeakError", "RayNode", "RayTestCluster"]

# A SIGKILLed node fails every check at once (its port is closed) and shows as dead after about
# threshold x period, 2.5 s, instead of 12.7 s at Ray's defaults (PLATFORMS.md). A live raylet starved of
# CPU on a loaded 2-core host must miss five checks in a row, each given a second, before it is called
# dead: three of half a second were too few.
FAST_HEALTH_CHECKS: Mapping[str, int] = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 5,
}
# Unix socket paths are at most 107 bytes, and Ray puts its sockets at
# <temp_dir>/session_<date>_<time>_<micros>_<pid>/sockets/plasma_store (about 70 bytes after it).
_MAX_TEMP_DIR_LEN = 36
_POLL_S = 0.1


class RayClusterError(RuntimeError):
    """The test cluster could not do what was asked (start, add, wait for nodes)."""


class RayClusterLeakError(RayClusterError):
    """Shutting the cluster down found something it left behind; the message names each thing."""


@dataclass(frozen=True, eq=False)
class RayNode:
    """A worker node of a `RayTestCluster`: its Ray node id (hex) and its raylet's pid."""

    node_id: str
    raylet_pid: int
    _node: Any = field(repr=False)


def _raylet_pid(node: Any) -> int:
    from ray._private import ray_constants

    return int(node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid)


class RayTestCluster:
    """A local multi-node Ray cluster: `with RayTestCluster() as cluster: cluster.add_node()`.

    The head node gets num_cpus=0 (no task or actor lands there) and the health-check settings in
    `system_config` (default `FAST_HEALTH_CHECKS`). Processes the cluster starts get `RAY_TMPDIR`,
    `RAY_AUTH_MODE=disabled` and `RAY_USAGE_STATS_ENABLED=0` (plus `node_env`); their temporary
    files go under `temp_dir`. Give processes of your own that talk to the cluster `cluster.env`
    (e.g. `dlrover-master --ray-address cluster.address`).

    Args:
        root: the directory for Ray's temporary files; made (and removed at shutdown) under the
            system temp dir when None. Keep it short: Ray's socket paths lie below it.
        system_config: the head's `_system_config`.
        include_dashboard: start Ray's dashboard on the head (off: it costs memory and start time,
            and only `ray.util.state` and job submission need it).
        node_env: more environment for the processes of the nodes (not in `env`): what Ray starts
            there inherits it, workers and what they start included.
        start_timeout_s: how long a node may take to register.
        shutdown_grace_s: how long the cluster's processes may take to exit at shutdown before
            they are called a leak and SIGKILLed.

    Raises:
        RayClusterError: `root` is too long for Ray's socket paths.
    """

    def __init__(
        self,
        *,
        root: str | os.PathLike[str] | None = None,
        system_config: Mapping[str, Any] = FAST_HEALTH_CHECKS,
        include_dashboard: bool = False,
        node_env: Mapping[str, str] | None = None,
        start_timeout_s: float = 60.0,
        shutdown_grace_s: float = 30.0,
    ) -> None:
        if root is not None and len(os.fspath(root)) > _MAX_TEMP_DIR_LEN:
            raise RayClusterError(
                f"root {os.fspath(root)!r} is longer than {_MAX_TEMP_DIR_LEN} characters: Ray's socket paths "
                "below it would exceed the 107 bytes a Unix socket path may have"
            )
        self._given_root = None if root is None else Path(root)
        self._system_config = dict(system_config)
        self._include_dashboard = include_dashboard
        self._node_env = dict(node_env or {})
        self._start_timeout_s = start_timeout_s
        self._shutdown_grace_s = shutdown_grace_s
        self._root: Path | None = None
        self._made_root = False
        self._cluster: Any = None
        self._head_id = ""
        self._nodes: dict[str, RayNode] = {}
        self._connected = False
        self._before: dict[str, set[str]] = {}

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> RayTestCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def start(self) -> None:
        """Start the head node; returns once it is registered.

        Raises:
            RayClusterError: already started, or the head did not start.
        """
        if self._cluster is not None:
            raise RayClusterError("the cluster is already started")
        from ray.cluster_utils import Cluster

        self._before = _watched_dirs()
        if self._given_root is None:
            self._root = Path(tempfile.mkdtemp(prefix="raytc-"))
            self._made_root = True
            if len(str(self._root)) > _MAX_TEMP_DIR_LEN:
                shutil.rmtree(self._root)
                raise RayClusterError(
                    f"the system temp dir makes {self._root} longer than {_MAX_TEMP_DIR_LEN} characters (Ray's "
                    "socket paths below it would be too long): pass a short root"
                )
        else:
            self._root = self._given_root
            self._made_root = not self._root.exists()
            self._root.mkdir(parents=True, exist_ok=True)
        (self._root / "ray").mkdir(exist_ok=True)  # Ray's default temp dir under RAY_TMPDIR
        head_args = {
            "num_cpus": 0,
            "temp_dir": str(self._root),
            "include_dashboard": self._include_dashboard,
            "_system_config": self._system_config,
        }
        try:
            with self._environment():
                self._cluster = Cluster(initialize_head=True, head_node_args=head_args, shutdown_at_exit=True)
            self._head_id = str(self._cluster.head_node.node_id)
        except Exception as e:
            self._cluster = None
            with contextlib.suppress(RayClusterLeakError):
                self._check_nothing_left()
            raise RayClusterError(f"the Ray head node did not start: {e}") from e

    def shutdown(self) -> None:
        """Disconnect this process's driver, stop every node, and check nothing was left.

        Raises:
            RayClusterLeakError: a process the cluster started still ran after the grace (it is
                SIGKILLed), or something new appeared in /tmp/ray or the home directory.
        """
        if self._cluster is None:
            return
        try:
            self.disconnect()
            with self._environment():
                self._cluster.shutdown()
        finally:
            self._cluster = None
            self._nodes.clear()
            self._check_nothing_left()

    # -- what tests read ----------------------------------------------------------------------

    @property
    def address(self) -> str:
        """The GCS address: what `ray.init(address=...)` and `dlrover-master --ray-address` take."""
        return str(self._started().address)

    @property
    def temp_dir(self) -> str:
        """The directory under which Ray keeps every temporary file of this cluster."""
        self._started()
        return str(self._root)

    @property
    def head_node_id(self) -> str:
        """The head node's Ray node id (hex)."""
        self._started()
        return self._head_id

    @property
    def env(self) -> dict[str, str]:
        """The environment to add for processes that talk to this cluster (a master, a driver)."""
        return {
            "RAY_TMPDIR": str(self._root),
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
        }

    @property
    def nodes(self) -> list[RayNode]:
        """The worker nodes added and not yet removed or killed, oldest first."""
        return list(self._nodes.values())

    def alive_node_ids(self) -> set[str]:
        """The worker nodes (not the head) the cluster's node table calls alive, by Ray node id.

        Read through the cluster's own GCS connection: no driver needs to be connected.
        """
        table = self._started().global_state.node_table()
        return {str(n["NodeID"]) for n in table if n["Alive"] and n["NodeID"] != self._head_id}

    def wait_for_nodes(self, n: int, timeout_s: float = 60.0) -> set[str]:
        """Wait until exactly `n` worker nodes are alive (a killed node must first show as dead);
        returns their ids.

        Raises:
            RayClusterError: not within `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            ids = self.alive_node_ids()
            if len(ids) == n:
                return ids
            if time.monotonic() >= deadline:
                raise RayClusterError(f"{len(ids)} worker nodes alive after {timeout_s} s, not {n}: {sorted(ids)}")
            time.sleep(_POLL_S)

    def processes(self, node: RayNode) -> list[ProcessInfo]:
        """Every live process of `node`: its raylet, what the raylet started (workers, agents) and
        their descendants, also those that left the raylet's process tree (found by the
        `RAY_RAYLET_PID` Ray puts in its workers' environment, which their children inherit)."""
        table = process_table()
        pids = {node.raylet_pid, *descendants(node.raylet_pid, table)}
        pids.update(with_environ("RAY_RAYLET_PID", str(node.raylet_pid), table))
        for pid in list(pids):
            pids.update(descendants(pid, table))
        return [table[pid] for pid in sorted(pids) if pid in table]

    def node_running(self, pid: int) -> RayNode | None:
        """The live worker node among whose processes (`processes`) `pid` is; None if none."""
        for node in self._nodes.values():
            if any(p.pid == pid for p in self.processes(node)):
                return node
        return None

    # -- changing the cluster -----------------------------------------------------------------

    def add_node(
        self, num_cpus: int = 1, resources: Mapping[str, float] | None = None, memory: int | None = None
    ) -> RayNode:
        """Start a worker node with `num_cpus` CPUs, custom `resources` and `memory` (bytes, Ray's
        `memory` resource); returns once it is registered.

        Raises:
            RayClusterError: the node did not start or register within the start timeout.
        """
        return self.add_nodes(1, num_cpus=num_cpus, resources=resources, memory=memory)[0]

    def add_nodes(
        self, count: int, num_cpus: int = 1, resources: Mapping[str, float] | None = None, memory: int | None = None
    ) -> list[RayNode]:
        """Start `count` worker nodes alike (as `add_node`), all before waiting for any: faster than
        one by one; returns once every one is registered.

        Raises:
            RayClusterError: a node did not start or register within the start timeout.
        """
        cluster = self._started()
        args: dict[str, Any] = {"num_cpus": num_cpus, "temp_dir": str(self._root)}
        if resources:
            args["resources"] = dict(resources)
        if memory is not None:
            args["memory"] = memory
        started: list[Any] = []
        try:
            with self._environment():
                for _ in range(count):
                    node = cluster.add_node(wait=False, **args)
                    started.append(node)
                    self._nodes[str(node.node_id)] = RayNode(str(node.node_id), _raylet_pid(node), node)
                for node in started:
                    # A public method waits too, but only 30 s: too short for a loaded 2-core host.
                    cluster._wait_for_node(node, timeout=self._start_timeout_s)
        except Exception as e:
            raise RayClusterError(f"a Ray worker node ({args}) did not start: {e}") from e
        return [self._nodes[str(node.node_id)] for node in started]

    def remove_node(self, node: RayNode) -> None:
        """Stop `node` gracefully (SIGTERM, SIGKILL after Ray's grace), as a drained machine is.

        Raises:
            RayClusterError: `node` is not a node of this cluster.
        """
        cluster = self._started()
        self._forget(node)
        with self._environment():
            cluster.remove_node(node._node, allow_graceful=True)

    def kill_node(self, node: RayNode) -> list[ProcessInfo]:
        """Kill `node` as a machine loss does: its raylet, its agents, its worker processes and
        everything they started SIGKILLed at once, with no chance to react; returns the processes
        killed.

        Every process is stopped (SIGSTOP) first, so none can fork or clean up meanwhile, then all
        are SIGKILLed; returns once they have ended. The cluster's head sees the node die through
        its health checks (`wait_for_nodes`).

        Raises:
            RayClusterError: `node` is not a node of this cluster, or a process of it did not end
                within the start timeout.
        """
        cluster = self._started()
        self._forget(node)
        from ray._private import ray_constants

        own = {
            info.process.pid
            for kind, infos in node._node.all_processes.items()
            if kind != ray_constants.PROCESS_TYPE_REAPER
            for info in infos
        }
        frozen: dict[int, ProcessInfo] = {}
        while True:  # until no process of the node is left running unfrozen
            table = process_table()
            targets = [p for p in self.processes(node) if p.pid not in frozen]
            targets += [table[pid] for pid in own if pid in table and pid not in frozen]
            if not targets:
                break
            for info in targets:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(info.pid, signal.SIGSTOP)
                frozen[info.pid] = info
        for info in frozen.values():
            if alive(info):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(info.pid, signal.SIGKILL)
        # A SIGKILL is delivered asynchronously: return only once every one has ended.
        deadline = time.monotonic() + self._start_timeout_s
        while left := [info for info in frozen.values() if alive(info)]:
            if time.monotonic() >= deadline:
                raise RayClusterError(f"processes of node {node.node_id} survived SIGKILL: {[i.pid for i in left]}")
            time.sleep(_POLL_S / 10)
        # The node's bookkeeping in `Cluster` (its processes are dead: this only reaps them).
        with self._environment():
            cluster.remove_node(node._node, allow_graceful=False)
        _remove_machine_files(frozen.values())
        return list(frozen.values())

    # -- the test process's own driver --------------------------------------------------------

    def connect(self, namespace: str | None = None) -> None:
        """Connect this process to the cluster as a Ray driver (`ray.init`), logs not forwarded.

        Raises:
            RayClusterError: this process is already connected to a Ray cluster.
        """
        import ray

        self._started()
        if ray.is_initialized():
            raise RayClusterError("this process is already connected to a Ray cluster")
        with self._environment():
            ray.init(address=self.address, _temp_dir=str(self._root), log_to_driver=False, namespace=namespace)
        self._connected = True

    def disconnect(self) -> None:
        """End this process's driver if `connect` started it (`ray.shutdown`)."""
        if not self._connected:
            return
        import ray

        with self._environment():
            ray.shutdown()
        self._connected = False

    # -- internals ----------------------------------------------------------------------------

    def _started(self) -> Any:
        if self._cluster is None:
            raise RayClusterError("the cluster is not started")
        return self._cluster

    def _forget(self, node: RayNode) -> None:
        if self._nodes.get(node.node_id) is not node:
            raise RayClusterError(f"node {node.node_id} is not a live node of this cluster")
        del self._nodes[node.node_id]

    @contextlib.contextmanager
    def _environment(self) -> Iterator[None]:
        """This process's environment as the cluster's processes must inherit it, for the length
        of a call that starts or stops them (Ray reads RAY_TMPDIR in this process too)."""
        wanted = {**self.env, **self._node_env}
        saved = {k: os.environ.get(k) for k in wanted}
        os.environ.update(wanted)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def _check_nothing_left(self) -> None:
        """Wait (bounded) for every process that carries this cluster's RAY_TMPDIR, and what those
        started, to end, then remove the temp dir; raise naming whatever was left."""
        problems: list[str] = []
        root = str(self._root)
        exempt = ancestors()
        deadline = time.monotonic() + self._shutdown_grace_s
        while True:
            table = process_table()
            # A process that sets its title (Ray's agents) may have overwritten its environment
            # variable: what the cluster's processes started counts too.
            pids = set(with_environ("RAY_TMPDIR", root, table))
            children: dict[int, list[int]] = {}
            for info in table.values():
                children.setdefault(info.ppid, []).append(info.pid)
            todo = list(pids)
            while todo:
                for child in children.get(todo.pop(), ()):
                    if child not in pids:
                        pids.add(child)
                        todo.append(child)
            left = [table[p] for p in sorted(pids) if p not in exempt]
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)
        if left:
            problems.append(f"processes still running {self._shutdown_grace_s} s after shutdown (SIGKILLed):")
            for info in left:
                problems.append(f"  {info.pid}: {info.cmdline[:200]}")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(info.pid, signal.SIGKILL)
        after = _watched_dirs()
        for where, names in sorted(after.items()):
            new = sorted(names - self._before.get(where, set()))
            if new:
                problems.append(f"new in {where}: {', '.join(new)}")
        if self._made_root and self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
        if problems:
            raise RayClusterLeakError("the Ray test cluster left things behind:\n" + "\n".join(problems))


# DLRover names what a process owns in shared memory and the temp dir after it:
# `dlrover-<kind>-<pid>-<start ticks>-...` (see dlrover.common.tempdirs).
_OWNED_NAME = re.compile(r"^dlrover-[a-z]+-(\d+)-(\d+)-")


def _remove_machine_files(killed: Iterable[ProcessInfo]) -> None:
    """Remove what the killed processes owned in /dev/shm and the temp dir. A lost machine's memory and disk go
    with it; here every Ray node shares one host, so the dead node's files would stay for the survivors (a
    real replacement host never sees them)."""
    owners = {(info.pid, info.start_ticks) for info in killed}
    for where in (Path("/dev/shm"), Path(tempfile.gettempdir())):  # noqa: S108 (a machine's own files)
        try:
            entries = list(os.scandir(where))
        except OSError:
            continue
        for entry in entries:
            match = _OWNED_NAME.match(entry.name)
            if match is None or (int(match.group(1)), int(match.group(2))) not in owners:
                continue
            path = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()


def _watched_dirs() -> dict[str, set[str]]:
    """The entries of the places Ray writes to when not told otherwise."""
    home = Path.home()
    found: dict[str, set[str]] = {}
    for where in (Path(tempfile.gettempdir()) / "ray", Path("/tmp/ray"), home, home / ".cache", home / ".config"):  # noqa: S108
        with contextlib.suppress(OSError):
            found[str(where)] = set(os.listdir(where))
        found.setdefault(str(where), set())
    return found
