"""Names of the worker environment, in a module that imports nothing.

A standby worker (`dlrover.launcher._standby`) needs them before the program runs, where importing
`dlrover.launcher.env` (and the checkpoint host behind it) would cost a quarter of a second.
"""

from __future__ import annotations

__all__ = ["PER_ROUND_ENV_VARS"]

PER_ROUND_ENV_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
)
"""Worker variables that depend on the round and the worker, not only on the node (set by
`worker_env`, and ``TORCHELASTIC_ERROR_FILE`` by `WorkerGroup`): a standby gets them only when taken."""
