"""A node's process-restart budget, and the one rule that spends it.

Whoever keeps a node's restart count (the master journals it with the node; an `ActionPolicy`
used alone keeps its own) hands it over as a `RestartBudget`, and every decision that restarts a
node's processes, relaunches a node, or would relaunch a node that no scheduler can replace, goes
through `spend_restart`, with the facts it needs (whether a new node can come, whether anyone is
left to restart the processes in place). So the count is read in one place, the choice between
"restart in place", "relaunch" and "let the node go" is made in one place, and every message
shows the same "restart k of n".
"""

from __future__ import annotations

import attrs

from dlrover.common.validators import non_negative_int
from dlrover.diagnosis.kinds import ActionKind

__all__ = ["RelaunchBudget", "RestartBudget", "Spending", "spend_restart"]

_NO_NEW_NODE = "this job's backend starts no new node"


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
    no_restart: str = "",
) -> Spending:
    """Decide what a failed node does under its restart budget.

    The rule, the only place it is written:

    * a restart is wanted: restart while restarts are left; once they are spent, relaunch the
      node where a scheduler can start a new one, else let it go (`ActionKind.REMOVE_NODE`);
    * a relaunch is wanted: relaunch where a scheduler can start a new node; where none can,
      restart the processes in place while restarts are left (the alternative, the node's agent
      exiting with nobody to start another, would end the job with restarts unused), else let
      the node go;
    * nobody can restart the processes in place (`no_restart`: the node's agent is gone or exits
      after its report): relaunch whatever was wanted, where a new node can come, else let the
      node go; no restart is used;
    * a relaunch whose rank has no relaunches left (`relaunches` spent) lets the node go instead.

    Args:
        budget: the node's restarts, as its owner counts them.
        relaunch_possible: whether anything can start a new node for this one (False: bare metal,
            Slurm, a standalone ``dlrover-run``, while the node's agent is alive).
        relaunch_wanted: True when the caller wanted a relaunch rather than a restart.
        relaunches: the rank's relaunches, when the caller keeps them (the master journals them
            with the node); None: relaunches are not limited here.
        no_restart: why nobody can restart the node's processes in place, in words ("its agent
            exits after this report"); empty when its agent is alive to restart them.

    Returns:
        The action and its words.
    """
    spent_relaunches = relaunches.used_up() if relaunches is not None and relaunches.spent else ""
    if no_restart and not relaunch_possible:
        return Spending(ActionKind.REMOVE_NODE, f"{no_restart}, and {_NO_NEW_NODE}: the node leaves the job")
    if no_restart:
        return _relaunch_or_leave(no_restart, spent_relaunches)
    if relaunch_wanted and relaunch_possible:
        return _relaunch_or_leave("", spent_relaunches)
    if not budget.spent:
        words = budget.next_restart()
        if relaunch_wanted:
            words += f", in place: {_NO_NEW_NODE}"
        return Spending(ActionKind.RESTART_PROCESSES, words)
    if relaunch_possible:
        return _relaunch_or_leave(budget.used_up(), spent_relaunches)
    return Spending(ActionKind.REMOVE_NODE, f"{budget.used_up()}, and {_NO_NEW_NODE}: the node leaves the job")


def _relaunch_or_leave(why: str, spent_relaunches: str) -> Spending:
    """A relaunch (`why`: what led to it, if anything), or, with the rank's relaunches spent, the
    node leaves the job."""
    if spent_relaunches:
        words = f"{why}, and {spent_relaunches}" if why else spent_relaunches
        return Spending(ActionKind.REMOVE_NODE, f"{words}: the node leaves the job")
    return Spending(ActionKind.RELAUNCH_NODE, f"{why}, so the node is relaunched" if why else "the node is relaunched")
