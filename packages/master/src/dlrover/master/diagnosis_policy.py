"""`DiagnosisFailurePolicy`: the master's failure policy decided by dlrover.diagnosis.

The evidence an agent reports (its exit status and log tail) is classified by the diagnosis
rules; the diagnosed kind goes to the diagnosis `ActionPolicy`, whose ladders pick the action and
which spends the node's restart budget and its rank's relaunch budget, the lifecycle's journaled
counts handed over as a `RestartBudget` and a `RelaunchBudget`, through `spend_restart`, with the
failure's facts (whether the backend starts nodes, whether the node's agent is there to restart
its processes). The lifecycle applies the answer.

Which kind is decided on is the diagnosis package's call (`dlrover.diagnosis.diagnose_report`):
a failure the master observed itself is decided as reported (`LOST_NODE_KIND`); a reported one
is classified from its evidence, falling back to the kind the agent reported.

The reason is one sentence built here, once: what failed, what the diagnosis found, what is done
with the budget ("node 0 (rank 0) failed with exit status 1: communication: rule ... matched
'...'; restart 2 of 3 (--max-restarts)"). The lifecycle records it, answers it to the agent,
and, when it ends the job, makes it the job's exit reason.

The action policy's counters are journaled with the lifecycle's state in every decision's
transaction (`JournaledPolicy`), so a restarted master decides as the old one would have. What is
journaled is what later decisions read (`ActionPolicy.export_counters`: the live nodes' ladder
steps, the job-wide ones, the job's relaunches, the nodes let go), not the history of decisions:
its size does not grow with the job's failures. The state is versioned: version 3 is those
counters with the times of the budgets' uses; version 2, the counters as counts, is still read
(those uses count for ever); version 1, a journal written before, listed every decision's inputs and is still read,
by replaying them into a fresh action policy. The restart and relaunch counts themselves are the
lifecycle's, journaled with the nodes and handed over with every failure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from dlrover.common import DLRoverError
from dlrover.diagnosis import (
    ActionPolicy,
    Decision,
    ExitInfo,
    FailureKind,
    PolicyStateError,
    RelaunchBudget,
    RestartBudget,
    RuleRegistry,
    diagnose_report,
)
from dlrover.diagnosis.window import BudgetWindow
from dlrover.master.policy import Classification, Failure

__all__ = ["POLICY_STATE_VERSION", "DiagnosisFailurePolicy"]

POLICY_STATE_VERSION = 3
"""The version of `DiagnosisFailurePolicy.export_state`'s text (1: a list of every decision's inputs;
2: the counters as counts, before budgets kept the times of their uses; 3: with those times)."""
_COUNTER_VERSIONS = (2, 3)  # both are `ActionPolicy.export_counters`' dict, which reads either


@attrs.frozen
class _Savepoint:
    """The action policy's counters after change number `change` of one policy; equal to another
    savepoint when the counters are."""

    owner: int = attrs.field(eq=False)
    change: int = attrs.field(eq=False)
    counters: Mapping[str, Any]


class DiagnosisFailurePolicy:
    """A `FailurePolicy` that classifies the evidence and asks the diagnosis action policy.

    Pure as the protocol asks: no I/O and no clock once built (entry-point rules, if wanted, are
    loaded into `registry` by the caller beforehand). One instance per job: it keeps the action
    policy's budget counters.

    Args:
        registry: the classification rules; the built-in rules when None.
        actions: the action policy; `ActionPolicy()` (the default ladders) when None. Pass a
            fresh one: a rollback or an import rebuilds it from its configuration.
    """

    def __init__(self, registry: RuleRegistry | None = None, actions: ActionPolicy | None = None) -> None:
        self._registry = registry or RuleRegistry.with_builtin_rules()
        self._actions = actions or ActionPolicy()
        # Counts every change of the counters, never going back (a rollback is a change too), so
        # a savepoint names one state; the last one taken is kept while nothing changed.
        self._changes = 0
        self._last_savepoint: _Savepoint | None = None

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
        """The action policy's counters now (see `StatefulPolicy`); cheap while nothing changed."""
        last = self._last_savepoint
        if last is None or last.change != self._changes:
            last = _Savepoint(id(self), self._changes, self._actions.export_counters())
            self._last_savepoint = last
        return last

    def rollback(self, savepoint: object) -> None:
        """Go back to the counters of `savepoint`: the decisions since were never journaled.

        Raises:
            ValueError: `savepoint` is not one this policy took.
        """
        if not isinstance(savepoint, _Savepoint) or savepoint.owner != id(self):
            raise ValueError(f"not a savepoint of this policy: {savepoint!r}")
        if savepoint.change == self._changes:
            return
        self._actions = self._fresh(savepoint.counters)
        self._changes += 1

    def _fresh(self, counters: Mapping[str, Any]) -> ActionPolicy:
        actions = ActionPolicy(self._actions.config)
        actions.import_counters(counters)
        return actions

    def export_state(self) -> str:
        """The action policy's counters as versioned JSON (see `JournaledPolicy`)."""
        return json.dumps(
            {"version": POLICY_STATE_VERSION, "counters": self._actions.export_counters()},
            separators=(",", ":"),
            sort_keys=True,
        )

    def import_state(self, data: str) -> None:
        """Resume from `export_state`'s text, of this version, version 2, or version 1 (a journal written
        before: its decisions are replayed into a fresh action policy, same configuration).

        Raises:
            DLRoverError: `data` is not what `export_state` writes, of a version this master
                reads; nothing changed.
        """
        try:
            state = json.loads(data)
            if isinstance(state, list):
                actions = self._replay_version_1(state)
            elif isinstance(state, dict) and state.get("version") in _COUNTER_VERSIONS:
                if set(state) != {"version", "counters"}:
                    raise ValueError(f"unknown fields {sorted(set(state) - {'version', 'counters'})}")
                actions = self._fresh(state["counters"])
            elif isinstance(state, dict) and "version" in state:
                raise DLRoverError(
                    f"failure policy state version {state['version']!r} is not one this master reads "
                    f"(1 to {POLICY_STATE_VERSION}); a newer master wrote it"
                )
            else:
                raise ValueError("neither a list of decisions (version 1) nor a versioned object")
        except (KeyError, TypeError, ValueError, PolicyStateError) as exc:
            raise DLRoverError(f"corrupt failure policy state {data[:200]!r}: {exc}") from exc
        self._actions = actions
        self._changes += 1

    def _replay_version_1(self, decided: list[Any]) -> ActionPolicy:
        """An action policy fed the decisions a version-1 state lists, in order: it is
        deterministic, so it ends with the counters the policy that took them had. Their times
        were not kept: they count for ever, whatever the budget window."""
        actions = ActionPolicy(attrs.evolve(self._actions.config, budget_window=BudgetWindow()))
        for d in decided:
            relaunches = None if d["relaunches"] is None else RelaunchBudget(*_relaunches(d["relaunches"]))
            actions.decide(
                str(d["node"]),
                FailureKind(d["kind"]),
                budget=RestartBudget(int(d["used"]), int(d["limit"]), str(d["source"])),
                relaunch_possible=bool(d["relaunch_possible"]),
                relaunches=relaunches,
            )
        return self._fresh(actions.export_counters())

    def decide(self, failure: Failure) -> Decision:
        """Classify, then let the action policy decide; the reason is built here (module docstring)."""
        kind, why = self.diagnose(failure)
        node = failure.node
        # The budgets are the lifecycle's counts (the node's agent's --max-restarts, when it
        # said; the rank's relaunches): the action policy spends them and keeps no count of its own.
        decision = self._actions.decide(
            str(node.node_id),
            kind,
            budget=failure.restarts,
            relaunch_possible=failure.relaunch_possible,
            relaunches=failure.relaunches,
            no_restart=failure.no_restart,
            now=failure.wall_time,
        )
        self._changes += 1
        how = "" if failure.exit_code is None else f" with {ExitInfo(failure.exit_code).describe()}"
        reason = (
            f"node {node.node_id} (rank {node.rank}) failed{how}: {why}; {decision.outcome}"
            f"{failure.relaunch_note(decision.action)}"
        )
        return attrs.evolve(decision, outcome=reason)


def _relaunches(value: object) -> tuple[int, int, str]:
    """A journaled ``[used, limit, source]``."""
    if not isinstance(value, list) or len(value) != 3:
        raise ValueError(f"relaunches must be [used, limit, source], got {value!r}")
    used, limit, source = value
    return int(used), int(limit), str(source)
