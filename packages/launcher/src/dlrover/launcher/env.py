"""The environment a worker process starts with: torchrun's contract, plus DLRover's additions."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from dlrover.common import ConfigError
from dlrover.flashckpt.job_env import HOST_SOCKET_ENV_VAR, JOB_ID_ENV_VAR
from dlrover.launcher.env_names import PER_ROUND_ENV_VARS

__all__ = [
    "CHECKPOINT_SOCKET_ENV_VAR",
    "JOB_ID_ENV_VAR",
    "MASTER_ADDR_ENV_VAR",
    "NODE_ID_ENV_VAR",
    "PER_ROUND_ENV_VARS",
    "WorkerIdentity",
    "standby_env",
    "worker_env",
]

MASTER_ADDR_ENV_VAR = "DLROVER_MASTER_ADDR"
NODE_ID_ENV_VAR = "DLROVER_NODE_ID"
CHECKPOINT_SOCKET_ENV_VAR = HOST_SOCKET_ENV_VAR
"""Names the agent's flash-checkpoint saver host to workers (``DLROVER_FLASHCKPT_HOST``)."""
# JOB_ID_ENV_VAR (``DLROVER_JOB_ID``) names the job to workers: stable for as long as the agent
# runs, so restarted workers find their snapshots (`AgentConfig.job_id`).


@attrs.frozen
class WorkerIdentity:
    """Where one worker stands in the job, in torchrun's terms.

    Attributes:
        rank: global rank across the job.
        local_rank: rank on this node.
        world_size: workers in the job.
        local_world_size: workers on this node.
        group_rank: this node's rank among nodes.
        group_world_size: nodes in the job.
        role_rank: rank among workers of the same role (one role here: equals `rank`).
        role_world_size: workers of that role (equals `world_size`).
        role_name: the role's name.
    """

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    group_rank: int
    group_world_size: int
    role_rank: int
    role_world_size: int
    role_name: str = "default"


def worker_env(
    base: Mapping[str, str],
    identity: WorkerIdentity,
    *,
    master_addr: str,
    master_port: int,
    run_id: str,
    restart_count: int,
    max_restarts: int,
    agent_store: bool = False,
    extra: Mapping[str, str] | None = None,
    virtual_local_rank: bool = False,
) -> dict[str, str]:
    """The full environment of one worker process.

    Starts from `base` (normally the agent's own environment), then sets every variable torchrun
    sets, then DLRover's `extra` ones (master address, token file, the checkpoint saver host's
    socket, node id).
    `agent_store` says that the agent of node rank 0 hosts the store at `master_addr:master_port`
    (`TORCHELASTIC_USE_AGENT_STORE=True`): torch then makes every rank a client of it; otherwise
    worker rank 0 starts it. Like torchrun, it sets `OMP_NUM_THREADS=1` when several workers share a node and the user
    did not choose a value, so they do not oversubscribe the cores.

    With `virtual_local_rank` (torchrun's ``--virtual-local-rank``) every worker sees only its
    own GPU, as device 0: ``LOCAL_RANK=0`` and ``CUDA_VISIBLE_DEVICES`` the local rank's entry of
    `base`'s list (or the local rank itself when `base` sets none).

    Raises:
        ConfigError: (`virtual_local_rank`) the local rank has no entry in `base`'s list.
    """
    env = dict(base)
    env.update(
        {
            "RANK": str(identity.rank),
            "LOCAL_RANK": str(identity.local_rank),
            "WORLD_SIZE": str(identity.world_size),
            "LOCAL_WORLD_SIZE": str(identity.local_world_size),
            "GROUP_RANK": str(identity.group_rank),
            "GROUP_WORLD_SIZE": str(identity.group_world_size),
            "ROLE_RANK": str(identity.role_rank),
            "ROLE_WORLD_SIZE": str(identity.role_world_size),
            "ROLE_NAME": identity.role_name,
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
            "TORCHELASTIC_RUN_ID": run_id,
            # torch reads exactly "True" (`str(True)`), as torchrun writes it.
            "TORCHELASTIC_USE_AGENT_STORE": str(bool(agent_store)),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            "PYTHONUNBUFFERED": base.get("PYTHONUNBUFFERED", "1"),
        }
    )
    if identity.local_world_size > 1 and "OMP_NUM_THREADS" not in base:
        env["OMP_NUM_THREADS"] = "1"
    if virtual_local_rank:
        env["LOCAL_RANK"] = "0"
        env["CUDA_VISIBLE_DEVICES"] = _own_device(base.get("CUDA_VISIBLE_DEVICES"), identity.local_rank)
    env.update(extra or {})
    return env


def _own_device(visible: str | None, local_rank: int) -> str:
    if visible is None:
        return str(local_rank)
    devices = [d.strip() for d in visible.split(",")]
    if local_rank >= len(devices):
        raise ConfigError(
            f"--virtual-local-rank: local rank {local_rank} has no device in CUDA_VISIBLE_DEVICES={visible!r}"
        )
    return devices[local_rank]


def standby_env(
    base: Mapping[str, str],
    *,
    nproc_per_node: int,
    role: str,
    run_id: str,
    max_restarts: int,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment a node's standby workers import under: a worker's (`worker_env`) without what a
    worker learns only when a standby is taken (`PER_ROUND_ENV_VARS`), so no module reads a stand-in.

    A taken standby replaces it with its worker's own; only a name outside the worker contract that
    differs makes it start again (see `dlrover.launcher.env_guard`), so `extra` (DLRover's ``DLROVER_*``
    variables) may be left out when they are not known yet.
    """
    identity = WorkerIdentity(
        rank=0,
        local_rank=0,
        world_size=nproc_per_node,
        local_world_size=nproc_per_node,
        group_rank=0,
        group_world_size=1,
        role_rank=0,
        role_world_size=nproc_per_node,
        role_name=role,
    )
    env = worker_env(
        base,
        identity,
        master_addr="",
        master_port=0,
        run_id=run_id,
        restart_count=0,
        max_restarts=max_restarts,
        extra=extra,
    )
    for name in PER_ROUND_ENV_VARS:
        env.pop(name, None)
    return env
