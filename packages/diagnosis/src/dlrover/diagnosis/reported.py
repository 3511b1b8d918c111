"""The kind of a failure as it is reported, before and after its evidence is read.

The master and the agent decide nothing about kinds themselves: they say what they saw (a worker
hung, the network check failed, the master lost the node) and this module names the kind. So the
failure kinds are named in this package and in the protocol's mirror of them only, and adding a
kind touches nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlrover.diagnosis.evidence import Evidence
from dlrover.diagnosis.exitinfo import ExitInfo
from dlrover.diagnosis.kinds import ActionKind, FailureKind

if TYPE_CHECKING:
    from dlrover.diagnosis.registry import RuleRegistry

__all__ = [
    "LOST_NODE_KIND",
    "OOM_RECORD_KIND",
    "KINDS_NOT_FROM_DATA",
    "PEER_CONSEQUENCE_KINDS",
    "SLOW_NODE_KIND",
    "diagnose_report",
    "kind_decided_alone",
    "reported_kind",
]

LOST_NODE_KIND = FailureKind.PREEMPTION
"""The kind of a failure the master observed from outside the node, with no agent to report it
(no heartbeat, never registered, the agent process exited, the launch failed): the node vanished,
so it is replaced; there is no process output to diagnose."""

OOM_RECORD_KIND = FailureKind.HOST_OOM
"""The kind of a node the master saw vanish while the kernel's own record (its memory cgroup's
``oom_kill`` count, a `MEMORY_RECORD` evidence line) says the OOM killer ended one of its processes:
no agent reported it, but the record says why."""

KINDS_NOT_FROM_DATA = frozenset(
    {
        FailureKind.COMMUNICATION,
        FailureKind.HARDWARE,
        FailureKind.PREEMPTION,
        FailureKind.DISK_FULL,
        FailureKind.CONFIG_ERROR,
    }
)
"""The kinds a sample being trained cannot cause (a network, the host, a stop from outside, the storage, the
launch's settings): the data shards the failed processes held are handed out again without counting an attempt
against them (`max_attempts`), so that crash loops of the platform never send good data to the failed set. Any
other kind (user code, a data error, a native crash, an OOM, a NaN loss, a kill whose records show no OOM kill,
unknown) may be the samples', and counts. A hang counts too: one pathological sample can stall its rank's input
pipeline, and the shard handed out first again after each restart would otherwise hang the job until its restart
budget ran out instead of going to the failed set after `max_attempts`."""

PEER_CONSEQUENCE_KINDS = frozenset({FailureKind.COMMUNICATION, FailureKind.HANG})
"""The kinds a node's workers fail with when a peer's departure or restart breaks their collectives
(a connection closed by the peer, a collective that never completes). Decided on workers whose round
was already over, they are that change's consequence, not a fault of the node (the master spends no
budget on them); any other kind (user code, a native crash, ...) is the node's own."""

SLOW_NODE_KIND = FailureKind.HARDWARE
"""The kind of a failure the master decides itself for a node it replaces because its ranks
straggle (``straggler_action replace``): a slow host is avoided, as a faulty one is."""


def reported_kind(*, hung: bool = False, node_check_failed: bool = False) -> FailureKind:
    """The kind an agent reports for a worker failure, before anyone reads the log.

    Args:
        hung: the worker stopped making progress without exiting.
        node_check_failed: the network check left the node out before training.

    Returns:
        `FailureKind.COMMUNICATION` for a failed node check, `FailureKind.HANG` for a hang, else
        `FailureKind.UNKNOWN`: the master classifies the evidence.
    """
    if node_check_failed:
        return FailureKind.COMMUNICATION
    if hung:
        return FailureKind.HANG
    return FailureKind.UNKNOWN


def kind_decided_alone(kind: FailureKind) -> tuple[ActionKind, bool]:
    """The action a kind asks for when nothing but the kind is known (no ladder, no evidence).

    A user code error aborts the job (restarting runs the same bug again); a fault that stays with
    the node relaunches it on another host; a lost node is relaunched anywhere; anything else
    restarts the processes.

    Returns:
        The action, and whether a relaunch must avoid the node's host.
    """
    if kind is FailureKind.USER_CODE:
        return ActionKind.ABORT_JOB, False
    if kind is FailureKind.HARDWARE:
        return ActionKind.RELAUNCH_NODE, True
    if kind is LOST_NODE_KIND:
        return ActionKind.RELAUNCH_NODE, False
    return ActionKind.RESTART_PROCESSES, False


def diagnose_report(
    reported: FailureKind,
    text: str,
    *,
    registry: RuleRegistry,
    exit_code: int | None = None,
    node_id: str = "",
    observed_by_master: bool = False,
) -> tuple[FailureKind, str]:
    """The kind to decide a reported failure on, and why.

    - a failure the master observed itself carries no log: it is decided as reported;
    - otherwise the evidence is classified. A worker killed from outside (what the rules call
      killed or preemption) whose agent is alive to report it is decided as `killed`: the node
      itself is fine, so its processes restart. When no rule explains the evidence, the kind the
      agent reported is used.

    Args:
        reported: the kind the reporter named (see `reported_kind`, `LOST_NODE_KIND`).
        text: the evidence (a log tail, a traceback, what the master observed).
        registry: the classification rules.
        exit_code: the failed process's exit status, when known.
        node_id: the node, for the evidence.
        observed_by_master: the failure was seen from outside the node (no agent report).

    Returns:
        The kind and a reason in words.
    """
    if observed_by_master:
        return reported, f"observed by the master, decided as {reported.value} ({text})"
    # Here, not at the top: an agent names the kind it reports, and must not load the rules for it.
    from dlrover.diagnosis.classifier import classify

    evidence = Evidence.from_text(text, returncode=exit_code, node_id=node_id)
    diagnosis = classify(evidence, registry)
    if diagnosis.kind is FailureKind.UNKNOWN:
        return reported, f"reported as {reported.value}; the log explains no more ({diagnosis.reason})"
    if diagnosis.kind is FailureKind.KILLED:
        return FailureKind.KILLED, f"{diagnosis.lines[-1]}; the agent is alive (rule '{diagnosis.rule}')"
    if diagnosis.kind is FailureKind.PREEMPTION:
        # A worker stopped from outside whose agent is alive to report it: the node itself was
        # not taken away, so replacing it would waste a healthy node.
        how = ExitInfo(exit_code).describe() if exit_code is not None else "a stop from outside"
        return FailureKind.KILLED, f"killed ({how}) while the agent is alive ({diagnosis.reason})"
    return diagnosis.kind, diagnosis.reason
