"""dlrover.launcher: the per-node elastic agent and the torchrun-compatible `dlrover-run` command.

Built so far: the command line (every torchrun flag plus DLRover's), the worker environment
contract, worker process management (own sessions, parent-death signal, log redirection and tee,
bounded stderr tails for diagnosis), and the agent loop with its pure decisions, talking to the
job through the `ControlPlane` protocol (an in-memory fake is included). The gRPC adapter to the
master and the `dlrover-run` entry point arrive with the rest of the dlrover-run issue.
"""

from dlrover.launcher.agent import Agent, AgentConfig, AgentResult
from dlrover.launcher.args import LaunchConfig, NodeRange, build_parser, parse_args, parse_std_streams
from dlrover.launcher.control import (
    AgentAction,
    ControlPlane,
    FailureDecision,
    FailureReport,
    NodeRegistration,
    Progress,
    RoundAssignment,
)
from dlrover.launcher.decisions import Step, StepKind
from dlrover.launcher.env import (
    CHECKPOINT_SOCKET_ENV_VAR,
    MASTER_ADDR_ENV_VAR,
    NODE_ID_ENV_VAR,
    WorkerIdentity,
    worker_env,
)
from dlrover.launcher.fake_control import FakeControlPlane
from dlrover.launcher.netcheck import (
    InMemoryRoundStore,
    NetworkCheck,
    NetworkCheckConfig,
    NetworkCheckStopped,
    RoundStore,
)
from dlrover.launcher.netcheck_plan import NETWORK_CHECK_FAULT_ENV_VAR, CheckAction, CheckOutcome
from dlrover.launcher.workers import StandbyPool, WorkerExit, WorkerGroup, WorkerSpec

__all__ = [
    "Agent",
    "AgentAction",
    "AgentConfig",
    "AgentResult",
    "ControlPlane",
    "FailureDecision",
    "FailureReport",
    "FakeControlPlane",
    "CheckAction",
    "CheckOutcome",
    "InMemoryRoundStore",
    "NETWORK_CHECK_FAULT_ENV_VAR",
    "NetworkCheck",
    "NetworkCheckConfig",
    "NetworkCheckStopped",
    "RoundStore",
    "NodeRegistration",
    "Progress",
    "RoundAssignment",
    "Step",
    "StepKind",
    "CHECKPOINT_SOCKET_ENV_VAR",
    "MASTER_ADDR_ENV_VAR",
    "NODE_ID_ENV_VAR",
    "LaunchConfig",
    "NodeRange",
    "StandbyPool",
    "WorkerExit",
    "WorkerGroup",
    "WorkerIdentity",
    "WorkerSpec",
    "build_parser",
    "parse_args",
    "parse_std_streams",
    "worker_env",
]
