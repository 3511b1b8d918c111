"""`srun dlrover-run ...`: a multi-node job from the Slurm step's own environment.

``srun -N4 dlrover-run --nproc-per-node=8 --token-file=/shared/token train.py`` starts one agent
per node, each with the step's variables (``SLURM_STEP_NUM_NODES``, ``SLURM_NODEID``,
``SLURM_STEP_NODELIST``, ``SLURM_JOB_ID``, ``SLURM_STEP_ID``). A command line that names no master
and no meeting point then runs as torchrun's static form would with every value filled in: the
job spans the step's nodes, the agent on the step's first node (``SLURM_NODEID=0``) serves the
job's master at ``<first node>:<--master-port or 29500>``, the others join it there, and the run
id is ``<job id>.<step id>``. Under torchrun the same ``srun`` line would silently start one
single-node job per node. As with every multi-node form, the nodes need the same job token
(``--token-file`` on a shared filesystem).

Everything here is pure: the environment comes in as a mapping.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import attrs

from dlrover.common import ConfigError

__all__ = ["SlurmStep", "expand_hostlist", "slurm_step"]

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_MAX_HOSTS = 1_000_000


@attrs.frozen
class SlurmStep:
    """The Slurm step this process runs in.

    Attributes:
        job_id: ``SLURM_JOB_ID``.
        step_id: ``SLURM_STEP_ID`` (empty outside a step).
        num_nodes: nodes of the step.
        node_id: this node's index within the step (0 for the first).
        first_host: the step's first node, where the job's master runs.
    """

    job_id: str
    step_id: str
    num_nodes: int
    node_id: int
    first_host: str

    @property
    def run_id(self) -> str:
        """A run id unique to the step: ``<job id>.<step id>``."""
        return f"{self.job_id}.{self.step_id}" if self.step_id else self.job_id


def _int(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name, "")
    return int(text) if text.isdigit() else None


def slurm_step(env: Mapping[str, str]) -> SlurmStep | None:
    """The multi-node Slurm step of this environment, or None outside one (or on one node).

    Raises:
        ConfigError: the step's variables contradict each other or its node list is malformed.
    """
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id:
        return None
    num_nodes = _int(env, "SLURM_STEP_NUM_NODES") or _int(env, "SLURM_NNODES")
    node_id = _int(env, "SLURM_NODEID")
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    if num_nodes is None or num_nodes < 2 or node_id is None or not nodelist:
        return None
    if node_id >= num_nodes:
        raise ConfigError(f"SLURM_NODEID={node_id} is not below the step's {num_nodes} nodes")
    hosts = expand_hostlist(nodelist)
    if len(hosts) != num_nodes:
        raise ConfigError(f"the Slurm node list {nodelist!r} names {len(hosts)} nodes, the step has {num_nodes}")
    return SlurmStep(job_id, env.get("SLURM_STEP_ID", ""), num_nodes, node_id, hosts[0])


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list (``node[01-03,7],gpu-a[1-2]-ib``) as host names, in order.

    Raises:
        ConfigError: unbalanced brackets, a bad range, or an empty list.
    """
    hosts: list[str] = []
    for item in _split_top_level(text):
        hosts += _expand_one(item, text)
        if len(hosts) > _MAX_HOSTS:
            raise ConfigError(f"the Slurm node list {text!r} names more than {_MAX_HOSTS} hosts")
    if not hosts:
        raise ConfigError(f"the Slurm node list {text!r} names no host")
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ConfigError(f"the Slurm node list {text!r} nests brackets")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"the Slurm node list {text!r} closes a bracket it never opened")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ConfigError(f"the Slurm node list {text!r} leaves a bracket open")
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_one(item: str, whole: str) -> list[str]:
    """Expand one host pattern, whose bracket groups multiply (``r[1-2]n[1-2]`` -> 4 hosts)."""
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    prefix, spec, rest = item[:open_at], item[open_at + 1 : close_at], item[close_at + 1 :]
    tails = _expand_one(rest, whole) if rest else [""]
    names = []
    for part in spec.split(","):
        m = _RANGE.match(part.strip())
        if m is None:
            raise ConfigError(f"the Slurm node list {whole!r} has a bad range {part!r}")
        low, high = m.group(1), m.group(2) or m.group(1)
        if int(high) < int(low):
            raise ConfigError(f"the Slurm node list {whole!r} has a descending range {part!r}")
        if int(high) - int(low) > _MAX_HOSTS:
            raise ConfigError(f"the Slurm node list {whole!r} has a range of more than {_MAX_HOSTS} hosts")
        width = len(low) if low.startswith("0") else 0  # zero padding is kept: node[01-03]
        for n in range(int(low), int(high) + 1):
            names += [f"{prefix}{n:0{width}d}{tail}" for tail in tails]
            if len(names) > _MAX_HOSTS:  # groups multiply: bound the product, not only each range
                raise ConfigError(f"the Slurm node list {whole!r} names more than {_MAX_HOSTS} hosts")
    return names
