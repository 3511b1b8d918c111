"""`DiagnosisFailurePolicy`: the master's failure policy decided by dlrover.diagnosis.

The evidence an agent reports (its exit status and log tail) is classified by the diagnosis
rules; the diagnosed kind goes to the diagnosis `ActionPolicy`, whose budgets and escalation
pick the action. The master's lifecycle then enforces its own budgets on top, as for any policy.

Which kind is decided on:

- failures the master observed itself (heartbeat or start timeout, the agent process exited)
  carry no log: they are decided as `preemption` (the node vanished from outside: relaunch it);
- a reported failure is classified from its evidence; a worker killed by a signal (what the
  rules call preemption) is decided as `unknown` (a process restart), since the agent that reports
  it, and so the node, is alive; when no rule explains it, the kind the agent reported is used
  (user code error, OOM as host OOM, hardware, network as communication, hang; a plain process
  crash or unknown stays `unknown`).

The action policy counts process restarts against the node's own budget, as the lifecycle keeps
it (what its agent declared, ``dlrover-run --max-restarts``, else the configured one), and is told
when the scheduler cannot relaunch the node while its agent can restart the processes: a relaunch
rung then restarts them in place while restarts are left (see `dlrover.diagnosis.policy`).

The diagnosis action is mapped onto the master's actions: restart processes and roll back to a
checkpoint restart the processes (they resume from the newest checkpoint); relaunch (with more
memory: not sized yet) relaunches the node, avoiding its host when the decision says so; abort
stops the job with the diagnosis' reason; "no action" (a late report about a retired node)
becomes the mildest action, a process restart, bounded by the lifecycle's budget.

The action policy's counters live in memory: a restarted master starts them afresh, while the
lifecycle's journaled budgets (restarts per node, relaunches per rank, failures per job) keep
holding, so no restart can make a job loop.
"""

from __future__ import annotations

from dlrover.diagnosis import ActionKind, ActionPolicy, Evidence, RuleRegistry, classify
from dlrover.diagnosis import FailureKind as DiagnosedKind
from dlrover.master.policy import Classification, Failure, FailureAction, FailureDecision
from dlrover.master.states import OBSERVED_BY_MASTER, FailureKind

__all__ = ["REPORTED_TO_DIAGNOSED", "DiagnosisFailurePolicy"]

REPORTED_TO_DIAGNOSED: dict[FailureKind, DiagnosedKind] = {
    FailureKind.PROCESS_CRASH: DiagnosedKind.UNKNOWN,
    FailureKind.USER_CODE_ERROR: DiagnosedKind.USER_CODE,
    FailureKind.OOM: DiagnosedKind.HOST_OOM,
    FailureKind.HARDWARE: DiagnosedKind.HARDWARE,
    FailureKind.NETWORK: DiagnosedKind.COMMUNICATION,
    FailureKind.HANG: DiagnosedKind.HANG,
    FailureKind.HEARTBEAT_TIMEOUT: DiagnosedKind.PREEMPTION,
    FailureKind.START_TIMEOUT: DiagnosedKind.PREEMPTION,
    FailureKind.NODE_EXIT: DiagnosedKind.PREEMPTION,
    FailureKind.UNKNOWN: DiagnosedKind.UNKNOWN,
}
"""The diagnosis kind of each reported kind, used when the evidence explains nothing."""


_ACTIONS: dict[ActionKind, FailureAction] = {
    ActionKind.NONE: FailureAction.RESTART_PROCESSES,
    ActionKind.RESTART_PROCESSES: FailureAction.RESTART_PROCESSES,
    ActionKind.ROLLBACK_CHECKPOINT: FailureAction.RESTART_PROCESSES,
    ActionKind.RELAUNCH_NODE: FailureAction.RELAUNCH_NODE,
    ActionKind.RELAUNCH_WITH_MORE_MEMORY: FailureAction.RELAUNCH_NODE,
    ActionKind.ABORT_JOB: FailureAction.STOP_JOB,
}


class DiagnosisFailurePolicy:
    """A `FailurePolicy` that classifies the evidence and asks the diagnosis action policy.

    Pure as the protocol asks: no I/O and no clock once built (entry-point rules, if wanted, are
    loaded into `registry` by the caller beforehand). One instance per job: it keeps the action
    policy's budget counters.

    Args:
        registry: the classification rules; the built-in rules when None.
        actions: the action policy; `ActionPolicy()` (the default ladders) when None. Pass a
            fresh one: a rollback rebuilds it from its configuration and this policy's decisions.
    """

    def __init__(self, registry: RuleRegistry | None = None, actions: ActionPolicy | None = None) -> None:
        self._registry = registry or RuleRegistry.with_builtin_rules()
        self._actions = actions or ActionPolicy()
        # Every decision's input, to replay on a rollback: node, kind, restarts left, relaunch possible.
        self._decided: list[tuple[str, DiagnosedKind, int, bool]] = []

    @property
    def actions(self) -> ActionPolicy:
        """The action policy and its counters."""
        return self._actions

    def classify(self, node_id: int, kind: FailureKind, evidence: str, exit_code: int | None) -> Classification:
        """The diagnosis of a failure's full evidence (pure: the master runs it outside its lock)."""
        diagnosed, why = self._diagnose(node_id, kind, evidence, exit_code)
        return Classification(diagnosed.value, why)

    def diagnose(self, failure: Failure) -> tuple[DiagnosedKind, str]:
        """The kind decided on for `failure`, and why (its `classification`, when it has one)."""
        if failure.classification is not None:
            try:
                return DiagnosedKind(failure.classification.kind), failure.classification.reason
            except ValueError:
                pass  # classified by another policy: read the evidence ourselves
        return self._diagnose(failure.node.node_id, failure.kind, failure.evidence, failure.exit_code)

    def _diagnose(
        self, node_id: int, reported: FailureKind, text: str, exit_code: int | None
    ) -> tuple[DiagnosedKind, str]:
        if reported in OBSERVED_BY_MASTER:
            kind = REPORTED_TO_DIAGNOSED[reported]
            return kind, f"{reported.value} observed by the master ({text})"
        evidence = Evidence.from_text(text, returncode=exit_code, node_id=str(node_id))
        diagnosis = classify(evidence, self._registry)
        if diagnosis.kind is DiagnosedKind.UNKNOWN:
            kind = REPORTED_TO_DIAGNOSED[reported]
            return kind, f"reported as {reported.value}; the log explains no more ({diagnosis.reason})"
        if diagnosis.kind is DiagnosedKind.PREEMPTION:
            # A killed worker whose agent is alive to report it: the node itself was not
            # preempted, so replacing it would waste a healthy node. Restart the processes.
            return DiagnosedKind.UNKNOWN, f"a worker was killed but its agent is alive ({diagnosis.reason})"
        return diagnosis.kind, diagnosis.reason

    def savepoint(self) -> object:
        """How many decisions were taken so far (see `StatefulPolicy`)."""
        return len(self._decided)

    def rollback(self, savepoint: object) -> None:
        """Forget the decisions taken after `savepoint`: they were never journaled.

        The action policy has no way to undo a decision, so a fresh one (same configuration) is
        fed the decisions that stand, in order: it is deterministic, so it ends in the same state.
        """
        if not isinstance(savepoint, int) or not 0 <= savepoint <= len(self._decided):
            raise ValueError(f"not a savepoint of this policy: {savepoint!r}")
        if savepoint == len(self._decided):
            return
        del self._decided[savepoint:]
        self._actions = ActionPolicy(self._actions.config)
        for node_id, kind, restarts_left, relaunch_possible in self._decided:
            self._actions.decide(node_id, kind, restarts_left=restarts_left, relaunch_possible=relaunch_possible)

    def decide(self, failure: Failure) -> FailureDecision:
        """Classify, then let the action policy decide; see the module docstring for the mapping."""
        kind, why = self.diagnose(failure)
        node_id = str(failure.node.node_id)
        # The lifecycle's budget is the node's own (its agent's --max-restarts, when it said), so
        # the action policy counts against it rather than against a limit of its own.
        restarts_left, relaunch_possible = failure.process_restarts_left, failure.relaunch_possible
        decision = self._actions.decide(node_id, kind, restarts_left=restarts_left, relaunch_possible=relaunch_possible)
        self._decided.append((node_id, kind, restarts_left, relaunch_possible))
        action = _ACTIONS[decision.action]
        reason = f"{decision.reason} [diagnosed {kind.value}: {why}]"
        if decision.action is ActionKind.ROLLBACK_CHECKPOINT:
            reason = f"roll back: the processes restart from the newest checkpoint; {reason}"
        return FailureDecision(action, reason, avoid_host=decision.avoid_host)
