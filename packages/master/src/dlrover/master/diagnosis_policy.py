"""`DiagnosisFailurePolicy`: the master's failure policy decided by dlrover.diagnosis.

The evidence an agent reports (its exit status and log tail) is classified by the diagnosis
rules; the diagnosed kind goes to the diagnosis `ActionPolicy`, whose ladders pick the action and
which spends the node's restart budget, the lifecycle's journaled count handed over as a
`RestartBudget`, through `spend_restart`. The lifecycle checks the answer against the same rule.

Which kind is decided on:

- failures the master observed itself (heartbeat or start timeout, the agent process exited)
  carry no log: they are decided as `preemption` (the node vanished from outside: relaunch it);
- a reported failure is classified from its evidence. A worker killed from outside (what the
  rules call killed or preemption) whose agent is alive to report it is decided as `killed`: the
  node itself is fine, so its processes restart. When no rule explains the evidence, the kind
  the agent reported is used (user code error, OOM as host OOM, hardware, network as
  communication, hang; a plain process crash or unknown stays `unknown`).

The reason is one sentence built here, once: what failed, what the diagnosis found, what is done
with the budget ("node 0 (rank 0) failed with exit status 1: communication: rule ... matched
'...'; restart 2 of 3 (--max-restarts)"). The lifecycle records it, answers it to the agent,
and, when it ends the job, makes it the job's exit reason.

The action policy's ladder counters live in memory: a restarted master starts them afresh, while
the lifecycle's journaled budgets (restarts per node, relaunches per rank, failures per job) keep
holding, so no restart can make a job loop.
"""

from __future__ import annotations

from dlrover.diagnosis import ActionPolicy, Evidence, ExitInfo, RestartBudget, RuleRegistry, classify
from dlrover.diagnosis import FailureKind as DiagnosedKind
from dlrover.master.policy import FAILURE_ACTIONS, Classification, Failure, FailureDecision
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
        # Every decision's input, to replay on a rollback: node, kind, restart budget, relaunch possible.
        self._decided: list[tuple[str, DiagnosedKind, RestartBudget, bool]] = []

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
            return kind, f"{reported.value} observed by the master, decided as {kind.value} ({text})"
        evidence = Evidence.from_text(text, returncode=exit_code, node_id=str(node_id))
        diagnosis = classify(evidence, self._registry)
        if diagnosis.kind is DiagnosedKind.UNKNOWN:
            kind = REPORTED_TO_DIAGNOSED[reported]
            return kind, f"reported as {reported.value}; the log explains no more ({diagnosis.reason})"
        if diagnosis.kind is DiagnosedKind.KILLED:
            return DiagnosedKind.KILLED, f"{diagnosis.lines[-1]}; the agent is alive (rule '{diagnosis.rule}')"
        if diagnosis.kind is DiagnosedKind.PREEMPTION:
            # A worker stopped from outside whose agent is alive to report it: the node itself
            # was not taken away, so replacing it would waste a healthy node.
            how = ExitInfo(exit_code).describe() if exit_code is not None else "a stop from outside"
            return DiagnosedKind.KILLED, f"killed ({how}) while the agent is alive ({diagnosis.reason})"
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
        for node_id, kind, budget, relaunch_possible in self._decided:
            self._actions.decide(node_id, kind, budget=budget, relaunch_possible=relaunch_possible)

    def decide(self, failure: Failure) -> FailureDecision:
        """Classify, then let the action policy decide; the reason is built here (module docstring)."""
        kind, why = self.diagnose(failure)
        node = failure.node
        # The node's budget is the lifecycle's count (its agent's --max-restarts, when it said):
        # the action policy spends it and keeps no count of its own.
        budget, relaunch_possible = failure.restarts, failure.relaunch_possible
        decision = self._actions.decide(str(node.node_id), kind, budget=budget, relaunch_possible=relaunch_possible)
        self._decided.append((str(node.node_id), kind, budget, relaunch_possible))
        how = "" if failure.exit_code is None else f" with {ExitInfo(failure.exit_code).describe()}"
        reason = f"node {node.node_id} (rank {node.rank}) failed{how}: {why}; {decision.outcome}"
        return FailureDecision(FAILURE_ACTIONS[decision.action], reason, avoid_host=decision.avoid_host)
