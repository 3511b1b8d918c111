"""From a failure kind to an action, with budgets and escalation.

Each kind has a *ladder*: steps of (action, budget, scope). A decision takes the first step of the
kind's ladder whose budget is not spent; when the ladder is exhausted the job is aborted with a
reason. Ladder budgets are counted per node (``scope="node"``) or for the whole job
(``scope="job"``): they say when a kind has been tried enough ways.

A node's *process restarts* are one budget for all kinds, a `RestartBudget`: the caller that keeps
it (the master journals it with the node: its agent's ``--max-restarts``) passes it to
`ActionPolicy.decide`; without one the policy counts restarts itself against
``max_process_restarts_per_node``. Every restart (a restart rung, a rollback, a restart in place)
is spent through `spend_restart`, the one rule for it:

* with no restarts left, a restart becomes a node relaunch that avoids the host, or, where nothing
  can start a new node (bare metal, Slurm, a standalone job: ``relaunch_possible=False``), the
  node leaves the job (`ActionKind.REMOVE_NODE`);
* where nothing can start a new node, a relaunch rung restarts the processes in place while the
  node has restarts left; the rung's own budget is not used by such a restart, so it is the next
  step once the restarts run out;
* where nobody can restart the processes in place (the node's agent is gone or exits after its
  report: ``no_restart``), a restart or rollback rung becomes a relaunch (on any host: nothing
  says the host is bad), counted like every relaunch; the rung is not used;
* at most ``max_node_relaunches`` relaunches per job; the one after that aborts.

Every budget here counts its uses over `PolicyConfig.budget_window` (a trailing window, wall
seconds passed to `ActionPolicy.decide` as ``now``; the whole job by default): a job that runs for
weeks is stopped by failures that keep coming back, not by two that came weeks apart.

A relaunched or removed node id is retired: a late report about it gets `ActionKind.NONE` (a
replacement node comes back under a new id), and its per-node counters, which no later decision
reads, are dropped. Once the job is aborted every decision is to abort. So the counters
(`export_counters`) hold the live nodes' ladder steps, the job-wide ones, and one line per node
let go (the newest ``retired_nodes_kept``), however many decisions the job took.

Defaults (`DEFAULT_LADDERS`), chosen so that about three failures in four end in a cheap restart
and nothing loops:

============== ====================================================================
kind           ladder
============== ====================================================================
user_code      abort at once (a restart runs the same bug again)
host_oom       relaunch with more memory x2 (job), then abort
device_oom     restart processes x1 (node; fragmentation can be transient), then abort
communication  restart processes x3 (node), relaunch node avoiding host x1 (node), abort
hardware       relaunch node avoiding host x1 (node), then abort
hang           restart processes x2 (node), relaunch node avoiding host x1 (node), abort
nan_loss       roll back to the last good checkpoint x2 (job), then abort
preemption     relaunch node on any host x1 (node), then abort
killed         restart processes x2 (node), relaunch node on any host x1 (node), abort
data_error     abort at once (the data needs a person)
native_crash   restart processes x1 (node; an intermittent crash clears), relaunch node avoiding
               host x1 (job; a crash that comes back on one node points to its host; passed over
               where nothing starts a new node), abort
disk_full      abort at once (the directory stays full across restarts)
config_error   abort at once (the same settings fail the same way)
unknown        restart processes x2 (node), relaunch node avoiding host x1 (node), abort
============== ====================================================================
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from dlrover.common import ConfigError
from dlrover.common.validators import non_negative_int
from dlrover.diagnosis.budget import RelaunchBudget, RestartBudget, spend_restart
from dlrover.diagnosis.errors import DiagnosisError
from dlrover.diagnosis.kinds import ActionKind, FailureKind
from dlrover.diagnosis.window import BudgetWindow, UseTimes, use_times_from_json

__all__ = ["ActionPolicy", "Decision", "DEFAULT_LADDERS", "LadderStep", "PolicyConfig", "PolicyStateError"]

Scope = Literal["node", "job"]
_JOB = "*job*"


@attrs.frozen
class LadderStep:
    """One rung of a kind's ladder.

    Attributes:
        action: what to do; never `ActionKind.NONE` or `ActionKind.ABORT_JOB` (abort is what
            follows the last rung).
        budget: how many times this rung may be used within its scope (>= 1).
        scope: ``"node"``: the budget is per node; ``"job"``: shared by all nodes.
        avoid_host: for relaunches, whether the replacement must land on another host.
        needs_new_node: for relaunches, whether the rung is only worth taking on a new node:
            where nothing can start one (bare metal, Slurm, a standalone job) it is passed over,
            instead of becoming restarts in place as other relaunch rungs do (`spend_restart`).
    """

    action: ActionKind
    budget: int
    scope: Scope = "node"
    avoid_host: bool = False
    needs_new_node: bool = False

    def __attrs_post_init__(self) -> None:
        if self.action in (ActionKind.NONE, ActionKind.ABORT_JOB, ActionKind.REMOVE_NODE):
            raise ConfigError(
                f"a ladder step cannot be {self.action.value!r}: abort follows the last step, and a node is "
                "removed only when its restarts are spent where nothing can start a new one"
            )
        if not isinstance(self.budget, int) or isinstance(self.budget, bool) or self.budget < 1:
            raise ConfigError(f"LadderStep.budget must be an integer >= 1, got {self.budget!r}")
        if self.needs_new_node and self.action not in (ActionKind.RELAUNCH_NODE, ActionKind.RELAUNCH_WITH_MORE_MEMORY):
            raise ConfigError(f"only a relaunch needs a new node, not {self.action.value!r}")
        if self.scope not in ("node", "job"):
            raise ConfigError(f"LadderStep.scope must be 'node' or 'job', got {self.scope!r}")

    def usable(self, relaunch_possible: bool) -> bool:
        """Whether the rung can be taken where a new node can (or cannot) be started."""
        return relaunch_possible or not self.needs_new_node


_R, _RB, _RN, _RM = (
    ActionKind.RESTART_PROCESSES,
    ActionKind.ROLLBACK_CHECKPOINT,
    ActionKind.RELAUNCH_NODE,
    ActionKind.RELAUNCH_WITH_MORE_MEMORY,
)

DEFAULT_LADDERS: Mapping[FailureKind, tuple[LadderStep, ...]] = types.MappingProxyType(
    {
        FailureKind.USER_CODE: (),
        FailureKind.HOST_OOM: (LadderStep(_RM, 2, "job", avoid_host=True),),
        FailureKind.DEVICE_OOM: (LadderStep(_R, 1),),
        FailureKind.COMMUNICATION: (LadderStep(_R, 3), LadderStep(_RN, 1, avoid_host=True)),
        FailureKind.HARDWARE: (LadderStep(_RN, 1, avoid_host=True),),
        FailureKind.HANG: (LadderStep(_R, 2), LadderStep(_RN, 1, avoid_host=True)),
        FailureKind.NAN_LOSS: (LadderStep(_RB, 2, "job"),),
        FailureKind.PREEMPTION: (LadderStep(_RN, 1, avoid_host=False),),
        FailureKind.KILLED: (LadderStep(_R, 2), LadderStep(_RN, 1, avoid_host=False)),
        FailureKind.DATA_ERROR: (),
        FailureKind.NATIVE_CRASH: (LadderStep(_R, 1), LadderStep(_RN, 1, "job", avoid_host=True, needs_new_node=True)),
        FailureKind.DISK_FULL: (),
        FailureKind.CONFIG_ERROR: (),
        FailureKind.UNKNOWN: (LadderStep(_R, 2), LadderStep(_RN, 1, avoid_host=True)),
    }
)
"""The default ladder of every kind (see the module docstring for the table)."""

_ABORT_ADVICE = {
    FailureKind.USER_CODE: "the training script has a bug; fix it and resubmit (restarting would run the same bug)",
    FailureKind.DATA_ERROR: "the input data is broken (corrupt or truncated file); fix it and resubmit",
    FailureKind.DISK_FULL: "a file system or quota is full; free space or raise the quota and resubmit",
    FailureKind.CONFIG_ERROR: "the launch configuration cannot work; fix the setting the log names and resubmit",
    FailureKind.NATIVE_CRASH: (
        "native crashes keep coming back after a restart (and, where nodes can move, after a node was moved to "
        "another host): a bug in native code is likely; the crash site above names the library"
    ),
    FailureKind.DEVICE_OOM: "the model does not fit in device memory; reduce the batch size or shard the model",
    FailureKind.HOST_OOM: "the job runs out of host memory even with more; reduce host memory use",
    FailureKind.NAN_LOSS: "the loss keeps diverging after rollbacks; lower the learning rate or check the data",
}


def _ladders(value: Mapping[FailureKind, tuple[LadderStep, ...]]) -> Mapping[FailureKind, tuple[LadderStep, ...]]:
    merged = dict(DEFAULT_LADDERS)
    for kind, ladder in dict(value).items():
        if not isinstance(kind, FailureKind):
            raise ConfigError(f"ladder keys must be FailureKind, got {kind!r}")
        merged[kind] = tuple(ladder)
    for kind, ladder in merged.items():
        for step in ladder:
            if not isinstance(step, LadderStep):
                raise ConfigError(f"ladder of {kind.value!r} holds {step!r}, not a LadderStep")
        severities = [s.action.severity for s in ladder]
        if severities != sorted(severities):
            raise ConfigError(f"ladder of {kind.value!r} must not de-escalate: {[s.action.value for s in ladder]}")
    return types.MappingProxyType(merged)


@attrs.frozen
class PolicyConfig:
    """The action policy's settings.

    Attributes:
        ladders: per kind, the steps to take; kinds left out keep `DEFAULT_LADDERS`. A ladder may
            not go down in severity.
        max_process_restarts_per_node: restarts on one node before the next restart is escalated
            to a node relaunch that avoids the host (default 3).
        max_node_relaunches: relaunches of any kind per job before the job is aborted (default 16).
        retired_nodes_kept: how many of the nodes let go are remembered, the newest (default
            1024), so a late report about one needs no action; a report about one let go before
            them is decided as any node's. It bounds the counters however long the job runs.
        budget_window: how long a use counts against a rung's budget and `max_node_relaunches`
            (default: the whole job). With a window, `ActionPolicy.decide` needs ``now``.
    """

    ladders: Mapping[FailureKind, tuple[LadderStep, ...]] = attrs.field(
        default=DEFAULT_LADDERS, converter=_ladders, eq=False
    )
    max_process_restarts_per_node: int = attrs.field(default=3, validator=non_negative_int)
    max_node_relaunches: int = attrs.field(default=16, validator=non_negative_int)
    retired_nodes_kept: int = attrs.field(default=1024, validator=non_negative_int)
    budget_window: BudgetWindow = attrs.field(
        factory=BudgetWindow, validator=attrs.validators.instance_of(BudgetWindow)
    )


@attrs.frozen
class Decision:
    """What to do about one diagnosed failure.

    Attributes:
        action: the action.
        kind: the failure kind decided on.
        node_id: the node the failure was on.
        outcome: what is done and why, with the budgets (``"restart 2 of 3"``, ``"restarted 3 of
            3 times, no restarts left, ..."``, what a person must fix); `reason` prefixes the kind
            and the node.
        avoid_host: for relaunches, whether to avoid the node's host.
        escalated: True when a job-wide rule raised the action above the kind's ladder.
    """

    action: ActionKind
    kind: FailureKind
    node_id: str
    outcome: str
    avoid_host: bool = False
    escalated: bool = False

    @property
    def reason(self) -> str:
        """The outcome in a sentence of its own: ``"communication on node n0: restart 1 of 3"``."""
        return f"{self.kind.value} on node {self.node_id}: {self.outcome}"


class PolicyStateError(DiagnosisError):
    """Counters given to `ActionPolicy.import_counters` are not what `export_counters` writes."""


class ActionPolicy:
    """Decides actions and keeps the ladder counters of one job.

    Args:
        config: ladders and limits; `PolicyConfig()` when omitted.
    """

    def __init__(self, config: PolicyConfig | None = None) -> None:
        self._config = config or PolicyConfig()
        # When each rung was used (within its scope), the newest `budget` uses.
        self._used: dict[tuple[str, FailureKind, int], UseTimes] = {}
        # Restarts per node, only for decisions whose caller keeps no budget of its own.
        self._own_restarts: dict[str, int] = {}
        self._relaunches = 0
        self._relaunched_at: UseTimes = ()  # the newest `max_node_relaunches` relaunches
        self._now: float | None = None  # the time of the decision being taken
        self._retired: dict[str, str] = {}
        self._abort_reason: str | None = None

    @property
    def config(self) -> PolicyConfig:
        """The settings in use."""
        return self._config

    @property
    def aborted(self) -> bool:
        """True once any decision aborted the job."""
        return self._abort_reason is not None

    @property
    def relaunches(self) -> int:
        """Relaunches decided so far in this job (all of them, whatever the window)."""
        return self._relaunches

    def process_restarts(self, node_id: str) -> int:
        """Process restarts this policy counted for `node_id`: those decided without a caller's
        `RestartBudget` (a caller that passes one keeps the count itself); 0 once the node was
        let go (its counters are dropped then)."""
        return self._own_restarts.get(node_id, 0)

    def own_budget(self, node_id: str) -> RestartBudget:
        """The restart budget this policy keeps for `node_id` when the caller keeps none."""
        limit = self._config.max_process_restarts_per_node
        return RestartBudget(self._own_restarts.get(node_id, 0), limit, "max_process_restarts_per_node")

    def decide(
        self,
        node_id: str,
        kind: FailureKind,
        *,
        budget: RestartBudget | None = None,
        relaunch_possible: bool = True,
        relaunches: RelaunchBudget | None = None,
        no_restart: str = "",
        now: float | None = None,
    ) -> Decision:
        """Pick the action for a failure of `kind` on `node_id` and count it against the budgets.

        Args:
            node_id: the node the failure happened on (non-empty).
            kind: the diagnosed kind.
            budget: the node's process restarts, when the caller keeps them (the master: the
                node's journaled count against its agent's ``--max-restarts``); the caller counts
                a restart this decision takes. None: this policy counts them itself against
                `PolicyConfig.max_process_restarts_per_node` (see `own_budget`).
            relaunch_possible: False where nothing can start a new node while the node's agent
                is alive to restart its processes (see `spend_restart`).
            relaunches: the relaunches of the node's rank, when the caller keeps them (the
                master: the rank's journaled count against ``max_relaunches``); a relaunch with
                none left lets the node go (`spend_restart`).
            no_restart: why nobody can restart the node's processes in place (its agent is gone,
                or exits after this report), in words; empty when its agent can. A restart is
                then a relaunch (`spend_restart`).
            now: when the failure happened (wall seconds): the uses of the budgets are counted
                within `PolicyConfig.budget_window` of it. Needed when a window is set.

        Returns:
            The decision, with its outcome in words.

        Raises:
            ConfigError: if `node_id` is empty, `kind` is not a `FailureKind`, `budget` is not
                a `RestartBudget`, or `now` is missing where a window is set; nothing is counted.
        """
        if not isinstance(node_id, str) or not node_id:
            raise ConfigError(f"node_id must be a non-empty string, got {node_id!r}")
        if not isinstance(kind, FailureKind):
            raise ConfigError(f"kind must be a FailureKind, got {kind!r}")
        if budget is not None and not isinstance(budget, RestartBudget):
            raise ConfigError(f"budget must be None or a RestartBudget, got {budget!r}")
        if relaunches is not None and not isinstance(relaunches, RelaunchBudget):
            raise ConfigError(f"relaunches must be None or a RelaunchBudget, got {relaunches!r}")
        if now is not None and (isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now)):
            raise ConfigError(f"now must be a finite number of wall seconds, got {now!r}")
        if now is None and self._config.budget_window.seconds is not None:
            raise ConfigError(
                f"the budgets count uses within {self._config.budget_window.seconds:g}s: decide needs `now`"
            )
        if self._abort_reason is not None:
            return Decision(ActionKind.ABORT_JOB, kind, node_id, f"the job was already aborted: {self._abort_reason}")
        if node_id in self._retired:
            return Decision(
                ActionKind.NONE,
                kind,
                node_id,
                f"node {node_id} was already let go ({self._retired[node_id]}); "
                "a late report about its old processes needs no action",
            )
        own = budget is None
        self._now = now
        decision = self._climb(
            node_id,
            kind,
            budget or self.own_budget(node_id),
            relaunch_possible=relaunch_possible,
            relaunches=relaunches,
            no_restart=no_restart,
        )
        if own and decision.action in (ActionKind.RESTART_PROCESSES, ActionKind.ROLLBACK_CHECKPOINT):
            self._own_restarts[node_id] = self._own_restarts.get(node_id, 0) + 1
        return decision

    def _climb(
        self,
        node_id: str,
        kind: FailureKind,
        budget: RestartBudget,
        *,
        relaunch_possible: bool,
        relaunches: RelaunchBudget | None,
        no_restart: str,
    ) -> Decision:
        """Take the first rung of `kind`'s ladder with budget left, or abort when none has."""
        ladder = self._config.ladders[kind]
        # Budgets only refill (a window passing), so the first rung with budget left is the one.
        index = 0
        while index < len(ladder) and (
            self._uses(node_id, kind, index, ladder[index]) >= ladder[index].budget
            or not ladder[index].usable(relaunch_possible)
        ):
            index += 1
        if index >= len(ladder):
            return self._abort(kind, node_id, self._exhausted_reason(kind, ladder, relaunch_possible))
        step = ladder[index]
        relaunch = step.action in (ActionKind.RELAUNCH_NODE, ActionKind.RELAUNCH_WITH_MORE_MEMORY)
        spending = spend_restart(
            budget,
            relaunch_possible=relaunch_possible,
            relaunch_wanted=relaunch,
            relaunches=relaunches,
            no_restart=no_restart,
        )
        if spending.action is ActionKind.REMOVE_NODE:
            self._retire(node_id, f"removed for {kind.value}")
            return Decision(ActionKind.REMOVE_NODE, kind, node_id, spending.words)
        if relaunch and spending.restarts:
            # Not counted against the rung: it stays the next step once the restarts run out.
            return Decision(ActionKind.RESTART_PROCESSES, kind, node_id, spending.words)
        if not relaunch and no_restart:
            # Nobody is left to restart the processes: only a new node can take the rank. The host
            # is not to blame, so the new node may land anywhere.
            return self._relaunch(kind, node_id, ActionKind.RELAUNCH_NODE, False, spending.words, escalated=True)
        if not relaunch and not spending.restarts:
            # The node's restarts are spent: the job-wide rule escalates to a relaunch elsewhere.
            words = f"{spending.words} on another host"
            return self._relaunch(kind, node_id, ActionKind.RELAUNCH_NODE, True, words, escalated=True)
        return self._take(node_id, kind, ladder, index, spending.words)

    def _take(
        self, node_id: str, kind: FailureKind, ladder: tuple[LadderStep, ...], index: int, words: str
    ) -> Decision:
        """Use rung `index` of `ladder` (`words`: what the restart budget says about it)."""
        step = ladder[index]
        key = self._key(node_id, kind, index, step)
        used = self._uses(node_id, kind, index, step) + 1
        count = f"{step.action.value} {used} of {step.budget}, {step.scope}{self._config.budget_window.per()}"
        if step.action in (ActionKind.RELAUNCH_NODE, ActionKind.RELAUNCH_WITH_MORE_MEMORY):
            host = "on another host" if step.avoid_host else "on any host"
            what = "with more memory " if step.action is ActionKind.RELAUNCH_WITH_MORE_MEMORY else ""
            tried = f"; {self._tried(kind, node_id, ladder, index)}" if index else ""
            words = f"the node is relaunched {what}{host} ({count}){tried}"
            decision = self._relaunch(kind, node_id, step.action, step.avoid_host, words, escalated=False)
            if decision.action is step.action and step.scope == "job":
                # A node-scope rung needs no count: the relaunch let its node go.
                self._use(key, step)
            return decision
        self._use(key, step)
        if step.action is ActionKind.ROLLBACK_CHECKPOINT:
            words = f"roll back to the newest good checkpoint ({count}): {words}"
        return Decision(step.action, kind, node_id, words)

    def _tried(self, kind: FailureKind, node_id: str, ladder: tuple[LadderStep, ...], index: int) -> str:
        done = ", ".join(f"{s.action.value} x{self._uses(node_id, kind, i, s)}" for i, s in enumerate(ladder[:index]))
        return f"already tried: {done}"

    def _uses(self, node_id: str, kind: FailureKind, index: int, step: LadderStep) -> int:
        """Uses of rung `index` that count now."""
        return self._config.budget_window.count(self._used.get(self._key(node_id, kind, index, step), ()), self._now)

    def _use(self, key: tuple[str, FailureKind, int], step: LadderStep) -> None:
        self._used[key] = BudgetWindow.add(self._used.get(key, ()), self._now, step.budget)

    @staticmethod
    def _key(node_id: str, kind: FailureKind, index: int, step: LadderStep) -> tuple[str, FailureKind, int]:
        return (node_id if step.scope == "node" else _JOB, kind, index)

    def _exhausted_reason(self, kind: FailureKind, ladder: tuple[LadderStep, ...], relaunch_possible: bool) -> str:
        advice = _ABORT_ADVICE.get(kind, "the failure keeps coming back; a person must look at it")
        usable = [s for s in ladder if s.usable(relaunch_possible)]
        if not usable:
            return f"{advice}: the job stops"
        spent = ", ".join(f"{s.action.value} x{s.budget}" for s in usable)
        return f"budgets spent ({spent}{self._config.budget_window.per()}); {advice}: the job stops"

    def _abort(self, kind: FailureKind, node_id: str, reason: str) -> Decision:
        self._abort_reason = f"{kind.value} on node {node_id}: {reason}"
        return Decision(ActionKind.ABORT_JOB, kind, node_id, reason)

    def _relaunch(
        self, kind: FailureKind, node_id: str, action: ActionKind, avoid_host: bool, words: str, *, escalated: bool
    ) -> Decision:
        window, limit = self._config.budget_window, self._config.max_node_relaunches
        counted = window.count(self._relaunched_at, self._now)
        if counted >= limit:
            return self._abort(
                kind,
                node_id,
                f"{words}; but the job already relaunched {counted} nodes (limit {limit}{window.per()}): the job stops",
            )
        self._relaunches += 1
        self._relaunched_at = window.add(self._relaunched_at, self._now, limit)
        self._retire(node_id, f"{action.value} for {kind.value}")
        return Decision(action, kind, node_id, words, avoid_host=avoid_host, escalated=escalated)

    def _retire(self, node_id: str, why: str) -> None:
        """Let `node_id` go: later reports about it need no action, and its counters are dropped
        (a decision about a retired node reads none of them)."""
        self._retired[node_id] = why
        while len(self._retired) > self._config.retired_nodes_kept:
            del self._retired[next(iter(self._retired))]  # the oldest: dicts keep insertion order
        self._used = {k: v for k, v in self._used.items() if k[0] != node_id}
        self._own_restarts.pop(node_id, None)

    def export_counters(self) -> dict[str, Any]:
        """Everything later decisions read, as a JSON-serialisable dict: when ladder steps were
        used (per live node and job-wide, the newest of each), the restarts this policy counts
        itself, the job's relaunches (all, and when the newest were), the nodes let go and why,
        and the abort reason.

        Its size depends on the live nodes and the nodes let go, not on how many decisions were
        taken. `import_counters` of it into a policy with the same configuration decides as this
        one would.
        """
        return {
            "used": sorted(
                ([node, kind.value, index, list(times)] for (node, kind, index), times in self._used.items()),
                key=lambda row: row[:3],
            ),
            "own_restarts": dict(sorted(self._own_restarts.items())),
            "relaunches": self._relaunches,
            "relaunched_at": list(self._relaunched_at),
            # In the order they were let go: the oldest is forgotten first.
            "retired": [[node, why] for node, why in self._retired.items()],
            "abort_reason": self._abort_reason,
        }

    def import_counters(self, counters: Mapping[str, Any]) -> None:
        """Resume from `export_counters`' dict (replacing this policy's counters).

        Counters written before budgets kept times (a rung's use count, the relaunch count alone,
        ladder positions) are read too: those uses count as taken at an unknown time, for ever.

        Raises:
            PolicyStateError: `counters` is not what `export_counters` writes; nothing changed.
        """
        try:
            used = {(_node(n), FailureKind(k), _count(i)): _uses(u) for n, k, i, u in _rows(counters["used"], 4)}
            _rows(counters.get("position", []), 3)  # older counters: the first rung with budget left is found anew
            own = {_node(n): _count(c) for n, c in dict(counters["own_restarts"]).items()}
            relaunches = _count(counters["relaunches"])
            if "relaunched_at" in counters:
                relaunched_at = use_times_from_json(counters["relaunched_at"])
            else:
                relaunched_at = (None,) * min(relaunches, self._config.max_node_relaunches)
            retired = {_node(n): why for n, why in _rows(counters["retired"], 2) if isinstance(why, str)}
            if len(retired) != len(counters["retired"]):
                raise ValueError("retired must list distinct nodes, each with why it was let go")
            for forgotten in list(retired)[: max(len(retired) - self._config.retired_nodes_kept, 0)]:
                del retired[forgotten]
            abort = counters["abort_reason"]
            if abort is not None and not isinstance(abort, str):
                raise ValueError(f"abort_reason must be a string or null, got {abort!r}")
            known = {"used", "position", "own_restarts", "relaunches", "relaunched_at", "retired", "abort_reason"}
            unknown = set(counters) - known
            if unknown:
                raise ValueError(f"unknown fields {sorted(unknown)}")
        except (KeyError, TypeError, ValueError) as exc:
            raise PolicyStateError(f"not the counters of an action policy: {exc!r}") from exc
        self._used, self._own_restarts = used, own
        self._relaunches, self._relaunched_at = relaunches, relaunched_at
        self._retired, self._abort_reason = retired, abort


def _rows(value: object, width: int) -> list[list[Any]]:
    if not isinstance(value, list) or not all(isinstance(row, list) and len(row) == width for row in value):
        raise ValueError(f"expected a list of {width}-item lists, got {value!r}"[:300])
    return value


def _uses(value: object) -> UseTimes:
    """A rung's use times, or (older counters) its use count: as many uses at unknown times."""
    if isinstance(value, list):
        return use_times_from_json(value)
    return (None,) * _count(value)


def _node(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"a node id must be a non-empty string, got {value!r}")
    return value


def _count(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"a count must be a non-negative integer, got {value!r}")
    return value
