"""dlrover.launcher: the per-node elastic agent and the torchrun-compatible `dlrover-run` command.

Built so far: the command line (every torchrun flag plus DLRover's), the worker environment
contract, and worker process management (own sessions, parent-death signal, log redirection and
tee, bounded stderr tails for diagnosis). The agent loop that ties them to the master arrives
with the rest of the dlrover-run issue.
"""

from dlrover.launcher.args import LaunchConfig, NodeRange, build_parser, parse_args, parse_std_streams
from dlrover.launcher.env import (
    CHECKPOINT_SOCKET_ENV_VAR,
    MASTER_ADDR_ENV_VAR,
    NODE_ID_ENV_VAR,
    WorkerIdentity,
    worker_env,
)
from dlrover.launcher.workers import WorkerExit, WorkerGroup, WorkerSpec

__all__ = [
    "CHECKPOINT_SOCKET_ENV_VAR",
    "MASTER_ADDR_ENV_VAR",
    "NODE_ID_ENV_VAR",
    "LaunchConfig",
    "NodeRange",
    "WorkerExit",
    "WorkerGroup",
    "WorkerIdentity",
    "WorkerSpec",
    "build_parser",
    "parse_args",
    "parse_std_streams",
    "worker_env",
]
