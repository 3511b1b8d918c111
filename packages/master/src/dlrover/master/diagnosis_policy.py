"""`DiagnosisFailurePolicy`: the master's failure policy decided by dlrover.diagnosis.

The evidence an agent reports (its exit status and log tail) is classified by the diagnosis
rules; the diagnosed kind goes to the diagnosis `ActionPolicy`, whose ladders pick the action and
which spends the node's restart budget, the lifecycle's journaled count handed over as a
`RestartBudget`, through `spend_restart`. The lifecycle checks the answer against the same rule.

Which kind is decided on is the diagnosis package's call (`dlrover.diagnosis.diagnose_report`):
a failure the master observed itself is decided as reported (`LOST_NODE_KIND`); a reported one
is classified from its evidence, falling back to the kind the agent reported.

The reason is one sentence built here, once: what failed, what the diagnosis found, what is done
with the budget ("node 0 (rank 0) failed with exit status 1: communication: rule ... matched
'...'; restart 2 of 3 (--max-restarts)"). The lifecycle records it, answers it to the agent,
and, when it ends the job, makes it the job's exit reason.

The action policy's counters (ladder steps taken, relaunches of the job) are journaled with the
lifecycle's state in every decision's transaction (`JournaledPolicy`): the inputs of the
decisions that stand, which a restarted master replays into a fresh action policy, so it decides
as the old one would have. The lifecycle's own journaled budgets (restarts per node, relaunches
per rank, failures per job) hold as well.
"""

from __future__ import annotations

import json

import attrs

from dlrover.common import DLRoverError
from dlrover.diagnosis import (
    ActionPolicy,
    Decision,
    ExitInfo,
    FailureKind,
    RelaunchBudget,
    RestartBudget,
    RuleRegistry,
    diagnose_report,
)
from dlrover.master.policy import Classification, Failure

__all__ = ["DiagnosisFailurePolicy"]


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
        # Every decision's input, to replay on a rollback or a master restart: node, kind, restart
        # budget, relaunch possible, the rank's relaunches.
        self._decided: list[tuple[str, FailureKind, RestartBudget, bool, RelaunchBudget | None]] = []

    @property
    def actions(self) -> ActionPolicy:
        """The action policy and its counters."""
        return self._actions

    def classify(self, node_id: int, kind: FailureKind, evidence: str, exit_code: int | None) -> Classification:
        """The diagnosis of a failure's full evidence (pure: the master runs it outside its lock)."""
        diagnosed, why = diagnose_report(
            kind, evidence, registry=self._registry, exit_code=exit_code, node_id=str(node_id)
        )
        return Classification(diagnosed, why)

    def diagnose(self, failure: Failure) -> tuple[FailureKind, str]:
        """The kind decided on for `failure`, and why (its `classification`, when it has one)."""
        if failure.classification is not None and not failure.observed_by_master:
            return failure.classification.kind, failure.classification.reason
        return diagnose_report(
            failure.kind,
            failure.evidence,
            registry=self._registry,
            exit_code=failure.exit_code,
            node_id=str(failure.node.node_id),
            observed_by_master=failure.observed_by_master,
        )

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
        self._actions = self._replay(self._decided)

    def _replay(
        self, decided: list[tuple[str, FailureKind, RestartBudget, bool, RelaunchBudget | None]]
    ) -> ActionPolicy:
        actions = ActionPolicy(self._actions.config)
        for node_id, kind, budget, relaunch_possible, relaunches in decided:
            actions.decide(node_id, kind, budget=budget, relaunch_possible=relaunch_possible, relaunches=relaunches)
        return actions

    def export_state(self) -> str:
        """The inputs of the decisions taken so far, as JSON (see `JournaledPolicy`)."""
        return json.dumps(
            [
                {
                    "node": node_id,
                    "kind": kind.value,
                    "used": budget.used,
                    "limit": budget.limit,
                    "source": budget.source,
                    "relaunch_possible": relaunch_possible,
                    "relaunches": None
                    if relaunches is None
                    else [relaunches.used, relaunches.limit, relaunches.source],
                }
                for node_id, kind, budget, relaunch_possible, relaunches in self._decided
            ],
            separators=(",", ":"),
        )

    def import_state(self, data: str) -> None:
        """Replay the decisions `export_state` wrote into a fresh action policy (same configuration).

        Raises:
            DLRoverError: `data` is not what `export_state` writes; nothing changed.
        """
        try:
            decided = [
                (
                    str(d["node"]),
                    FailureKind(d["kind"]),
                    RestartBudget(int(d["used"]), int(d["limit"]), str(d["source"])),
                    bool(d["relaunch_possible"]),
                    None if d["relaunches"] is None else RelaunchBudget(*_relaunches(d["relaunches"])),
                )
                for d in json.loads(data)
            ]
            actions = self._replay(decided)
        except (KeyError, TypeError, ValueError, DLRoverError) as exc:
            raise DLRoverError(f"corrupt failure policy state {data[:200]!r}: {exc}") from exc
        self._actions, self._decided = actions, decided

    def decide(self, failure: Failure) -> Decision:
        """Classify, then let the action policy decide; the reason is built here (module docstring)."""
        kind, why = self.diagnose(failure)
        node = failure.node
        # The node's budget is the lifecycle's count (its agent's --max-restarts, when it said):
        # the action policy spends it and keeps no count of its own.
        budget, relaunch_possible, relaunches = failure.restarts, failure.relaunch_possible, failure.relaunches
        decision = self._actions.decide(
            str(node.node_id), kind, budget=budget, relaunch_possible=relaunch_possible, relaunches=relaunches
        )
        self._decided.append((str(node.node_id), kind, budget, relaunch_possible, relaunches))
        how = "" if failure.exit_code is None else f" with {ExitInfo(failure.exit_code).describe()}"
        reason = f"node {node.node_id} (rank {node.rank}) failed{how}: {why}; {decision.outcome}"
        return attrs.evolve(decision, outcome=reason)


def _relaunches(value: object) -> tuple[int, int, str]:
    """A journaled ``[used, limit, source]``."""
    if not isinstance(value, list) or len(value) != 3:
        raise ValueError(f"relaunches must be [used, limit, source], got {value!r}")
    used, limit, source = value
    return int(used), int(limit), str(source)


def _relaunches_json(relaunches: RelaunchBudget | None) -> list[object] | None:
    return None if relaunches is None else [relaunches.used, relaunches.limit, relaunches.source]
