"""A node's process-restart budget, and the one rule that spends it.

Whoever keeps a node's restart count (the master journals it with the node; an `ActionPolicy`
used alone keeps its own) hands it over as a `RestartBudget`, and every decision that restarts a
node's processes, or would relaunch a node that no scheduler can replace, goes through
`spend_restart`. So the count is read in one place, the choice between "restart in place",
"relaunch" and "let the node go" is made in one place, and every message shows the same
"restart k of n".
"""

from __future__ import annotations

import attrs

from dlrover.common.validators import non_negative_int
from dlrover.diagnosis.kinds import ActionKind

__all__ = ["RelaunchBudget", "RestartBudget", "Spending", "spend_restart"]


@attrs.frozen
class RestartBudget:
    """The process restarts one node has taken and may take.

    Attributes:
        used: restarts already decided for the node.
        limit: restarts it may take in all (``dlrover-run --max-restarts``).
        source: what set `limit`, named in the words (``"--max-restarts"``); empty names nothing.
    """

    used: int = attrs.field(validator=non_negative_int)
    limit: int = attrs.field(validator=non_negative_int)
    source: str = ""

    @property
    def left(self) -> int:
        """Restarts still allowed (never negative)."""
        return max(self.limit - self.used, 0)

    @property
    def spent(self) -> bool:
        """True when no restart is left."""
        return self.left == 0

    def _source(self) -> str:
        return f" ({self.source})" if self.source else ""

    def next_restart(self) -> str:
        """Words for the restart about to be taken: ``"restart 2 of 3 (--max-restarts)"``."""
        return f"restart {self.used + 1} of {self.limit}{self._source()}"

    def used_up(self) -> str:
        """Words for a spent budget: ``"restarted 3 of 3 times (--max-restarts), no restarts left"``."""
        return f"restarted {self.used} of {self.limit} times{self._source()}, no restarts left"


@attrs.frozen
class RelaunchBudget:
    """The relaunches one rank (one logical node) has taken and may take.

    Attributes:
        used: relaunches already decided for the rank.
        limit: relaunches it may take in all (the master's ``max_relaunches``).
        source: what set `limit`, named in the words; empty names nothing.
    """

    used: int = attrs.field(validator=non_negative_int)
    limit: int = attrs.field(validator=non_negative_int)
    source: str = ""

    @property
    def spent(self) -> bool:
        """True when no relaunch is left."""
        return self.used >= self.limit

    def used_up(self) -> str:
        """Words for a spent budget: ``"relaunched 3 of 3 times (max_relaunches), no relaunches left"``."""
        source = f" ({self.source})" if self.source else ""
        return f"relaunched {self.used} of {self.limit} times{source}, no relaunches left"


@attrs.frozen
class Spending:
    """What `spend_restart` decided.

    Attributes:
        action: `ActionKind.RESTART_PROCESSES` (a restart is used), `ActionKind.RELAUNCH_NODE`
            or `ActionKind.REMOVE_NODE` (the node goes; no restart is used).
        words: what happens, with the budget: ``"restart 2 of 3"``, ``"restarted 3 of 3 times,
            no restarts left, ..."``. A relaunch's words say only why; the caller adds where.
    """

    action: ActionKind
    words: str

    @property
    def restarts(self) -> bool:
        """True when the decision uses one of the node's restarts."""
        return self.action is ActionKind.RESTART_PROCESSES


def spend_restart(
    budget: RestartBudget,
    *,
    relaunch_possible: bool,
    relaunch_wanted: bool = False,
    relaunches: RelaunchBudget | None = None,
) -> Spending:
    """Decide what a failed node does under its restart budget.

    The rule, the only place it is written:

    * a restart is wanted: restart while restarts are left; once they are spent, relaunch the
      node where a scheduler can start a new one, else let it go (`ActionKind.REMOVE_NODE`);
    * a relaunch is wanted: relaunch where a scheduler can start a new node; where none can,
      restart the processes in place while restarts are left (the alternative, the node's agent
      exiting with nobody to start another, would end the job with restarts unused), else let
      the node go;
    * a relaunch whose rank has no relaunches left (`relaunches` spent) lets the node go instead.

    Args:
        budget: the node's restarts, as its owner counts them.
        relaunch_possible: whether anything can start a new node for this one (False: bare metal,
            Slurm, a standalone ``dlrover-run``, while the node's agent is alive).
        relaunch_wanted: True when the caller wanted a relaunch rather than a restart.
        relaunches: the rank's relaunches, when the caller keeps them (the master journals them
            with the node); None: relaunches are not limited here.

    Returns:
        The action and its words.
    """
    no_new_node = "this job's backend starts no new node"
    spent_relaunches = relaunches.used_up() if relaunches is not None and relaunches.spent else ""
    if relaunch_wanted and relaunch_possible:
        if spent_relaunches:
            return Spending(ActionKind.REMOVE_NODE, f"{spent_relaunches}: the node leaves the job")
        return Spending(ActionKind.RELAUNCH_NODE, "the node is relaunched")
    if not budget.spent:
        words = budget.next_restart()
        if relaunch_wanted:
            words += f", in place: {no_new_node}"
        return Spending(ActionKind.RESTART_PROCESSES, words)
    if relaunch_possible:
        if spent_relaunches:
            return Spending(
                ActionKind.REMOVE_NODE, f"{budget.used_up()}, and {spent_relaunches}: the node leaves the job"
            )
        return Spending(ActionKind.RELAUNCH_NODE, f"{budget.used_up()}, so the node is relaunched")
    return Spending(ActionKind.REMOVE_NODE, f"{budget.used_up()}, and {no_new_node}: the node leaves the job")
