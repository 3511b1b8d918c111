"""The failure kinds the classifier returns and the actions the policy can pick."""

from __future__ import annotations

import enum

__all__ = ["NODE_CHECK_FAILED", "TRANSIENT_KINDS", "ActionKind", "FailureKind"]

NODE_CHECK_FAILED = "dlrover node check failed"
"""Starts the evidence of a node that a pre-training node check (``dlrover-run --network-check``)
left out. The check already compared the node with its peers, so the fault is taken to stay with
the node (hardware): replace it on another host rather than retry in place."""


class FailureKind(enum.Enum):
    """Why a training process or node failed.

    The value is the stable string used in manifests, logs and on the wire.
    """

    USER_CODE = "user_code"
    """A bug in the training script (ImportError, SyntaxError, TypeError, shape mismatch): restarting cannot fix it."""
    HOST_OOM = "host_oom"
    """The host ran out of memory (kernel OOM killer, cgroup limit, MemoryError)."""
    DEVICE_OOM = "device_oom"
    """An accelerator ran out of memory (CUDA out of memory)."""
    COMMUNICATION = "communication"
    """A collective or store connection failed or timed out (NCCL watchdog, gloo reset): usually transient."""
    HARDWARE = "hardware"
    """A fault that stays with the node: ECC errors, Xid, a lost GPU, a failed health probe, device residue."""
    HANG = "hang"
    """Ranks stopped making step progress without exiting."""
    NAN_LOSS = "nan_loss"
    """The loss became NaN or infinite."""
    PREEMPTION = "preemption"
    """The node is being taken away (SIGTERM, a spot or maintenance notice): transient."""
    KILLED = "killed"
    """A process was killed by SIGKILL while the host's OOM records, read, show no kill: someone (a
    person, a tool) or an OOM killer they do not count killed it. Its node is usually fine, so a
    restart is expected to fix it. (A SIGKILL with no record read is taken for `HOST_OOM`.)"""
    DATA_ERROR = "data_error"
    """Input data is broken: corrupt or truncated files (a checkpoint without its zip directory,
    ``invalid load key``), undecodable records, an unreadable storage volume."""
    NATIVE_CRASH = "native_crash"
    """A process died in native code: SIGSEGV, SIGABRT from ``std::terminate`` or glibc, a worker
    killed by a segmentation fault, a GPU kernel's illegal memory access. Usually a bug in a
    library, an extension or the environment, sometimes intermittent: one restart, then a person.
    Not a communication error (the surviving ranks' NCCL errors are its consequences)."""
    DISK_FULL = "disk_full"
    """A write failed because a file system or quota is full (``ENOSPC``, ``EDQUOT``, a failed
    checkpoint write, a pod evicted for disk pressure). The data is fine, but the directory stays
    full across restarts: a person frees space or raises the quota."""
    CONFIG_ERROR = "config_error"
    """The job's launch configuration cannot work: a port already in use, a rendezvous address or
    network interface that is wrong, more processes per node than GPUs, an unconfigured launcher,
    a missing setting. Retrying with the same settings fails the same way."""
    UNKNOWN = "unknown"
    """No rule explained the evidence well enough."""


TRANSIENT_KINDS: frozenset[FailureKind] = frozenset(
    {FailureKind.COMMUNICATION, FailureKind.PREEMPTION, FailureKind.KILLED}
)
"""Kinds that a plain retry is expected to fix. A user code error is never one of them."""


class ActionKind(enum.Enum):
    """What the job should do about a failure, from least to most disruptive (see `severity`)."""

    NONE = "none"
    """Nothing: for example a late report about a node that was already relaunched."""
    RESTART_PROCESSES = "restart_processes"
    """Restart the training processes on the node; the node and its host stay."""
    ROLLBACK_CHECKPOINT = "rollback_checkpoint"
    """Restart from the last good checkpoint (NaN loss)."""
    RELAUNCH_NODE = "relaunch_node"
    """Replace the node, avoiding its host when the decision says so."""
    RELAUNCH_WITH_MORE_MEMORY = "relaunch_with_more_memory"
    """Replace the node with one that has more host memory."""
    REMOVE_NODE = "remove_node"
    """Let the node go without a replacement: it has no process restarts left and nothing can
    start a new node for it (see `dlrover.diagnosis.spend_restart`). Never a ladder step."""
    ABORT_JOB = "abort_job"
    """Stop the job; the decision's reason says what a person must fix."""

    @property
    def severity(self) -> int:
        """An order on actions: escalation never moves to a lower severity for the same node and kind."""
        return _SEVERITY[self]

    @property
    def restarts_processes(self) -> bool:
        """True when the node stays and its training processes restart (a rollback restarts them
        too: they resume from the newest good checkpoint). Such an action spends a restart."""
        return self in (ActionKind.RESTART_PROCESSES, ActionKind.ROLLBACK_CHECKPOINT)

    @property
    def relaunches_node(self) -> bool:
        """True when the node is replaced by a new one."""
        return self in (ActionKind.RELAUNCH_NODE, ActionKind.RELAUNCH_WITH_MORE_MEMORY)

    @property
    def ends_node(self) -> bool:
        """True when the node's agent stops: it is relaunched, removed, or the job ends."""
        return self.relaunches_node or self in (ActionKind.REMOVE_NODE, ActionKind.ABORT_JOB)


_SEVERITY = {
    ActionKind.NONE: 0,
    ActionKind.RESTART_PROCESSES: 1,
    ActionKind.ROLLBACK_CHECKPOINT: 2,
    ActionKind.RELAUNCH_NODE: 3,
    ActionKind.RELAUNCH_WITH_MORE_MEMORY: 3,
    ActionKind.REMOVE_NODE: 3,
    ActionKind.ABORT_JOB: 4,
}
