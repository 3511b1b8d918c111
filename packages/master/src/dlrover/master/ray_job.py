"""Run a DLRover job on a Ray cluster from a Python script: the master in this process, its agents as actors.

    from dlrover.master import RayJob, run_on_ray

    summary = run_on_ray(["dlrover-run", "--nnodes=2", "--nproc-per-node=8", "train.py"], nnodes="2")
    print(summary.state, summary.exit_reason)

    with RayJob(command, nnodes="2:4", address="ray://head:10001", state_dir="/shared/job") as job:
        print("master at", job.address)
        summary = job.wait(timeout_s=3600)

A script that called `ray.init` itself keeps its connection: the job uses it and leaves it open. The
master serves its agents on `bind_address` (a Ray cluster on several hosts needs `0.0.0.0`); everything
else is a `MasterConfig` field and can be given as `config`.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any

from dlrover.autoscale import Resources
from dlrover.common import ConfigError, DLRoverError
from dlrover.master.config import LifecycleConfig, MasterConfig, parse_node_range
from dlrover.master.factory import create_master
from dlrover.master.master import JobStatus
from dlrover.master.runtime import MasterRuntime
from dlrover.master.scheduler.ray.settings import RaySettings

__all__ = ["RayJob", "run_on_ray"]


class RayJob:
    """A job whose master runs in this process and whose nodes are agent actors on a Ray cluster.

    Args:
        command: the agent each node runs (`dlrover-run ... script.py`), as an argv list.
        nnodes: `N` or `MIN:MAX` nodes (one per Ray node).
        address: the Ray cluster (`auto`, `host:port`, `ray://host:port`); ignored when `ray` is given.
        ray: the Ray backend's settings (address, temp dir, timeouts).
        job_name: the job's name (its actors are `dlrover-<job>-node-<id>`).
        state_dir: the master's journal directory (a restarted master resumes from it); None: in memory.
        node_resources: what each node's actor asks for (None: one CPU).
        bind_address: the interface the master serves its agents on.
        config: a whole `MasterConfig` instead of the arguments above (its backend must be `ray`).

    Raises:
        ConfigError: bad arguments, no Ray cluster, or resources no Ray node has (from `start`).
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        nnodes: str = "1",
        address: str = "auto",
        ray: RaySettings | None = None,
        job_name: str = "dlrover-job",
        state_dir: str | None = None,
        node_resources: Resources | None = None,
        bind_address: str = "127.0.0.1",
        config: MasterConfig | None = None,
    ) -> None:
        if config is None:
            config = MasterConfig(
                job_name=job_name,
                backend="ray",
                ray=ray or RaySettings(address=address),
                agent_command=list(command),
                state_dir=state_dir,
                bind_address=bind_address,
                lifecycle=LifecycleConfig(nodes=parse_node_range(nnodes, 1), node_resources=node_resources),
            )
        elif config.backend != "ray":
            raise ConfigError(f"a RayJob runs the ray backend, not {config.backend!r}")
        self._config = config
        self._runtime: MasterRuntime | None = None
        self._final: JobStatus | None = None

    @property
    def address(self) -> str:
        """The master's `host:port` (once started)."""
        return self._started().address

    def _started(self) -> MasterRuntime:
        if self._runtime is None:
            raise DLRoverError("the job has not been started")
        return self._runtime

    def start(self) -> str:
        """Start the master and launch the job's agents; returns the master's address.

        Raises:
            DLRoverError: started before, or the master cannot start (the message says why).
        """
        if self._runtime is not None:
            raise DLRoverError("the job was started before")
        runtime = create_master(self._config)
        try:
            runtime.start()
        except BaseException:
            runtime.stop()
            raise
        self._runtime = runtime
        return runtime.address

    def status(self) -> JobStatus:
        """The job's state now (after `stop`: as it ended)."""
        if self._final is not None:
            return self._final
        return self._started().master.status()

    def wait(self, timeout_s: float | None = None) -> JobStatus:
        """Block until the job ends; its final summary.

        Raises:
            TimeoutError: still running after `timeout_s` (it goes on; `stop` ends it).
        """
        runtime = self._started()
        if not runtime.wait_finished(timeout_s):
            raise TimeoutError(f"job {self._config.job_name} still runs after {timeout_s} s")
        return runtime.master.status()

    def stop(self, reason: str = "stopped by the caller") -> JobStatus:
        """End the job (if it still runs), its agents and the master; the final summary. Idempotent."""
        runtime = self._started()
        if self._final is not None:
            return self._final
        if not runtime.master.job_state.finished:
            runtime.master.stop(reason)
        runtime.stop()
        self._final = runtime.master.status()
        return self._final

    def __enter__(self) -> RayJob:
        self.start()
        return self

    def __exit__(
        self, _type: type[BaseException] | None, _value: BaseException | None, _tb: TracebackType | None
    ) -> None:
        if self._runtime is not None:
            self.stop("the job's context ended")


def run_on_ray(command: Sequence[str], *, timeout_s: float | None = None, **options: Any) -> JobStatus:
    """Run a job on Ray to its end (see `RayJob` for `options`); its final summary.

    Raises:
        TimeoutError: not ended after `timeout_s` (the job is stopped first).
    """
    job = RayJob(command, **options)
    with job:
        try:
            return job.wait(timeout_s)
        except TimeoutError:
            job.stop(f"not ended after {timeout_s} s")
            raise
