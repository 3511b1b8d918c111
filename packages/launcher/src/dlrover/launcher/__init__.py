"""dlrover.launcher: the per-node elastic agent and the torchrun-compatible `dlrover-run` command.

`dlrover.launcher.cli` is the `dlrover-run` entry point. The parts: the command line (`parse_args`:
every torchrun flag plus DLRover's), the worker environment contract (`worker_env`), worker
processes (`WorkerGroup`, `StandbyPool`), the agent loop (`Agent`) with its pure decisions, talking
to the job through the `ControlPlane` protocol (`FakeControlPlane` in memory, the gRPC one in
`dlrover.launcher.grpc_control`), the round's torch.distributed store that node rank 0's agent
hosts (`StoreHost`: `TorchStoreHost`, `FakeStoreHost`), and the network check (`NetworkCheck`).

Names are imported lazily: a worker process started through `dlrover.common.orphan_guard` or
`dlrover.launcher._standby` imports this package, and must not pay for gRPC and the agent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlrover.common.lazy import lazy_exports

if TYPE_CHECKING:
    from dlrover.launcher.agent import Agent, AgentConfig, AgentResult
    from dlrover.launcher.args import LaunchConfig, NodeRange, build_parser, parse_args, parse_std_streams
    from dlrover.launcher.control import (
        ControlPlane,
        FailureReport,
        MasterAction,
        NodeRegistration,
        Progress,
        ResourceUsage,
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
    from dlrover.launcher.env_guard import (
        EnvGuard,
        EnvWriteAction,
        EnvWriteDecision,
        also_imports,
        decide_env_write,
        import_time_sensitive,
        reads_environment_at_import,
        side_effect_of,
    )
    from dlrover.launcher.fake_control import FakeControlPlane
    from dlrover.launcher.netcheck import (
        InMemoryRoundStore,
        NetworkCheck,
        NetworkCheckConfig,
        NetworkCheckSettingsMismatch,
        NetworkCheckStopped,
        NetworkCheckStoreLost,
        RoundStore,
    )
    from dlrover.launcher.netcheck_plan import NETWORK_CHECK_FAULT_ENV_VAR, CheckAction, CheckOutcome
    from dlrover.launcher.resource_usage import ProcessTreeSampler
    from dlrover.launcher.store_host import FakeStoreHost, StoreHost, TorchStoreHost, TorchStoreHostConfig
    from dlrover.launcher.workers import StandbyPool, WorkerExit, WorkerGroup, WorkerSpec

_EXPORTS: dict[str, str] = {
    "Agent": "dlrover.launcher.agent",
    "AgentConfig": "dlrover.launcher.agent",
    "AgentResult": "dlrover.launcher.agent",
    "LaunchConfig": "dlrover.launcher.args",
    "NodeRange": "dlrover.launcher.args",
    "build_parser": "dlrover.launcher.args",
    "parse_args": "dlrover.launcher.args",
    "parse_std_streams": "dlrover.launcher.args",
    "ControlPlane": "dlrover.launcher.control",
    "FailureReport": "dlrover.launcher.control",
    "MasterAction": "dlrover.launcher.control",
    "NodeRegistration": "dlrover.launcher.control",
    "Progress": "dlrover.launcher.control",
    "ResourceUsage": "dlrover.launcher.control",
    "RoundAssignment": "dlrover.launcher.control",
    "ProcessTreeSampler": "dlrover.launcher.resource_usage",
    "Step": "dlrover.launcher.decisions",
    "StepKind": "dlrover.launcher.decisions",
    "CHECKPOINT_SOCKET_ENV_VAR": "dlrover.launcher.env",
    "MASTER_ADDR_ENV_VAR": "dlrover.launcher.env",
    "NODE_ID_ENV_VAR": "dlrover.launcher.env",
    "WorkerIdentity": "dlrover.launcher.env",
    "worker_env": "dlrover.launcher.env",
    "EnvGuard": "dlrover.launcher.env_guard",
    "EnvWriteAction": "dlrover.launcher.env_guard",
    "EnvWriteDecision": "dlrover.launcher.env_guard",
    "decide_env_write": "dlrover.launcher.env_guard",
    "also_imports": "dlrover.launcher.env_guard",
    "import_time_sensitive": "dlrover.launcher.env_guard",
    "reads_environment_at_import": "dlrover.launcher.env_guard",
    "side_effect_of": "dlrover.launcher.env_guard",
    "FakeControlPlane": "dlrover.launcher.fake_control",
    "InMemoryRoundStore": "dlrover.launcher.netcheck",
    "NetworkCheck": "dlrover.launcher.netcheck",
    "NetworkCheckConfig": "dlrover.launcher.netcheck",
    "NetworkCheckSettingsMismatch": "dlrover.launcher.netcheck",
    "NetworkCheckStopped": "dlrover.launcher.netcheck",
    "NetworkCheckStoreLost": "dlrover.launcher.netcheck",
    "RoundStore": "dlrover.launcher.netcheck",
    "NETWORK_CHECK_FAULT_ENV_VAR": "dlrover.launcher.netcheck_plan",
    "CheckAction": "dlrover.launcher.netcheck_plan",
    "CheckOutcome": "dlrover.launcher.netcheck_plan",
    "FakeStoreHost": "dlrover.launcher.store_host",
    "StoreHost": "dlrover.launcher.store_host",
    "TorchStoreHost": "dlrover.launcher.store_host",
    "TorchStoreHostConfig": "dlrover.launcher.store_host",
    "StandbyPool": "dlrover.launcher.workers",
    "WorkerExit": "dlrover.launcher.workers",
    "WorkerGroup": "dlrover.launcher.workers",
    "WorkerSpec": "dlrover.launcher.workers",
}

__all__ = [
    "EnvGuard",
    "EnvWriteAction",
    "EnvWriteDecision",
    "decide_env_write",
    "also_imports",
    "import_time_sensitive",
    "reads_environment_at_import",
    "side_effect_of",
    "Agent",
    "AgentConfig",
    "AgentResult",
    "ControlPlane",
    "FailureReport",
    "FakeControlPlane",
    "FakeStoreHost",
    "StoreHost",
    "TorchStoreHost",
    "TorchStoreHostConfig",
    "CheckAction",
    "CheckOutcome",
    "InMemoryRoundStore",
    "NETWORK_CHECK_FAULT_ENV_VAR",
    "NetworkCheck",
    "NetworkCheckConfig",
    "NetworkCheckSettingsMismatch",
    "NetworkCheckStopped",
    "NetworkCheckStoreLost",
    "RoundStore",
    "MasterAction",
    "NodeRegistration",
    "ProcessTreeSampler",
    "Progress",
    "ResourceUsage",
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


if not TYPE_CHECKING:  # so mypy checks every imported name against the imports above
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
