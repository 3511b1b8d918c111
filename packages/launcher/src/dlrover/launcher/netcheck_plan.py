"""The network check's decisions, as pure functions: no processes, no store, no clock.

Every agent of a rendezvous round runs the same check and must reach the same verdict, so
everything here is a function of what all agents see alike: the round's number and size, and the
probe results read back from the master's key-value store. Nodes are named by their node rank in
the round (``"0"``, ``"1"``, ...), which every agent knows without asking anyone.

A pair's probe has two sides, one per node; each node publishes its own side. The pair passed
when both sides passed, and took as long as its slower side (the slow node's matrix products hold
up its partner's collectives, so the pair's time is the time of its slower node).
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable, Mapping, Sequence

import attrs

from dlrover.diagnosis import Decision
from dlrover.launcher.decisions import Step, StepKind
from dlrover.rendezvous import CheckVerdict, NodeCheckConfig, Pair, judge, plan_round_one, plan_round_two
from dlrover.rendezvous import ProbeResult as PairProbe

__all__ = [
    "NETWORK_CHECK_FAULT_ENV_VAR",
    "CheckAction",
    "CheckOutcome",
    "PairOutcome",
    "SecondPhase",
    "SideResult",
    "after_check_report",
    "check_nodes",
    "check_round",
    "check_step",
    "combine",
    "decide",
    "decide_single",
    "describe_pairs",
    "needs_second_round",
    "pairs_of",
    "plan_second_phase",
    "round_keys_prefix",
    "settings_key",
    "side_key",
    "solo_key",
    "store_key",
    "with_solos",
]

_ERROR_CHARS = 400

NETWORK_CHECK_FAULT_ENV_VAR = "DLROVER_NETWORK_CHECK_FAULT"
"""Test hook read by the probe process (`exit`, `hang` or `slow`); see `dlrover.launcher.netcheck_probe`."""


def round_keys_prefix(round_number: int) -> str:
    """The prefix of every key the check of a round writes."""
    return f"dlrover/launcher/round/{round_number}/netcheck"


def _key_prefix(round_number: int, phase: int) -> str:
    return f"{round_keys_prefix(round_number)}/{phase}"


def solo_key(round_number: int, phase: int, node: str) -> str:
    """Where `node` publishes the result of probing itself alone in check round `phase`."""
    return f"{_key_prefix(round_number, phase)}/solo/{node}"


def settings_key(round_number: int) -> str:
    """Where the first node to check a round publishes the check's settings (write-once)."""
    return f"{round_keys_prefix(round_number)}/settings"


def side_key(round_number: int, phase: int, index: int, node: str) -> str:
    """Where `node` publishes its side of pair `index` of a check round (`phase` 1 or 2)."""
    return f"{_key_prefix(round_number, phase)}/pair/{index}/node/{node}"


def store_key(round_number: int, phase: int, index: int) -> str:
    """Where the first node of pair `index` publishes the `host:port` of the pair's TCPStore."""
    return f"{_key_prefix(round_number, phase)}/pair/{index}/store"


def check_nodes(world_size: int) -> list[str]:
    """The names of a round's nodes in the check: their node ranks, as text.

    Raises:
        ValueError: `world_size` is below 1.
    """
    if world_size < 1:
        raise ValueError(f"a round has at least one node, got world size {world_size}")
    return [str(rank) for rank in range(world_size)]


def pairs_of(pairs: Sequence[Pair], node: str) -> list[tuple[int, Pair]]:
    """The pairs `node` takes part in, with their index, in plan order.

    Every node runs its pairs in plan order, so the earliest pair not yet done always has both of
    its nodes ready for it: a node in two pairs (an odd node count) cannot deadlock the round.
    """
    return [(index, pair) for index, pair in enumerate(pairs) if node in pair]


@attrs.frozen
class SideResult:
    """One node's side of one pair's probe, as published in the key-value store.

    Attributes:
        ok: whether this node's side of the probe passed.
        elapsed_s: its measured time (matrix products and timed collectives); 0 when it failed.
        error: why it failed; empty when it passed.
    """

    ok: bool
    elapsed_s: float = 0.0
    error: str = ""

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.ok, bool):
            raise ValueError(f"SideResult.ok must be a bool, got {self.ok!r}")
        if isinstance(self.elapsed_s, bool) or not isinstance(self.elapsed_s, int | float):
            raise ValueError(f"SideResult.elapsed_s must be a number, got {self.elapsed_s!r}")
        if not (math.isfinite(self.elapsed_s) and self.elapsed_s >= 0):
            raise ValueError(f"SideResult.elapsed_s must be finite and >= 0, got {self.elapsed_s!r}")

    def encode(self) -> bytes:
        """The JSON bytes stored under the side's key."""
        return json.dumps({"ok": self.ok, "elapsed_s": self.elapsed_s, "error": self.error[:_ERROR_CHARS]}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> SideResult:
        """Read a stored side; a value that is not a well-formed side counts as a failed side.

        A corrupt value is not dropped: the failure's error quotes it, so the verdict says why.
        """
        try:
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict) or set(data) != {"ok", "elapsed_s", "error"}:
                raise ValueError("wrong fields")
            if not isinstance(data["error"], str):
                raise ValueError("error is not text")
            return cls(data["ok"], data["elapsed_s"], data["error"])
        except (UnicodeDecodeError, ValueError, TypeError):
            return cls(False, 0.0, f"unreadable probe result {raw[:80]!r}")

    @classmethod
    def missing(cls, timeout_s: float) -> SideResult:
        """The side recorded for a node that published nothing within the results timeout."""
        return cls(False, 0.0, f"no result within the network check's results timeout of {timeout_s:g} s")


@attrs.frozen
class PairOutcome:
    """Both sides of one pair's probe.

    Attributes:
        phase: the check round (1 or 2).
        pair: the two nodes.
        sides: each node's side, in the pair's order.
    """

    phase: int
    pair: Pair
    sides: tuple[SideResult, SideResult]

    @property
    def ok(self) -> bool:
        """The pair passed when both of its sides passed."""
        return self.sides[0].ok and self.sides[1].ok

    @property
    def elapsed_s(self) -> float:
        """The time of the slower side; 0 when the pair failed."""
        return max(s.elapsed_s for s in self.sides) if self.ok else 0.0

    def as_probe(self) -> PairProbe:
        """The pair-level result the rendezvous' `judge` and `plan_round_two` read."""
        return PairProbe(self.pair, self.ok, self.elapsed_s)


def combine(phase: int, pairs: Sequence[Pair], sides: Mapping[tuple[int, str], SideResult]) -> list[PairOutcome]:
    """Join the published sides into pair outcomes, in plan order.

    Args:
        phase: the check round.
        pairs: the round's plan.
        sides: (pair index, node) -> that node's side; every side of every pair must be present
            (the runner records a missing one as `SideResult.missing`).

    Raises:
        KeyError: a side is absent, naming it.
    """
    outcomes = []
    for index, (a, b) in enumerate(pairs):
        for node in (a, b):
            if (index, node) not in sides:
                raise KeyError(f"round {phase} pair {index} ({a}-{b}) has no side for node {node}")
        outcomes.append(PairOutcome(phase, (a, b), (sides[(index, a)], sides[(index, b)])))
    return outcomes


def needs_second_round(verdict: CheckVerdict) -> bool:
    """Whether round one found a suspect: a pair failed, or a node looked slow.

    A failed pair cannot say which of its nodes is at fault, and one slow pair may be noise; a
    second round re-pairs every suspect with a node that did well, which settles both.
    """
    return bool(verdict.faulty or verdict.stragglers or verdict.unchecked)


@attrs.frozen
class SecondPhase:
    """What check round two probes.

    Attributes:
        pairs: new pairs, each re-pairing a suspect with a node it has not probed with yet.
        solos: suspects left without a new partner (in a round of two nodes: both nodes); each
            probes itself alone, which tells a broken node from a broken link.
    """

    pairs: tuple[Pair, ...]
    solos: tuple[str, ...]


def plan_second_phase(nodes: Sequence[str], round_one: Sequence[PairOutcome], verdict: CheckVerdict) -> SecondPhase:
    """Round two's pairs and solo probes, given round one's outcomes and verdict.

    `plan_round_two` may repeat a round-one pair when a suspect has nobody new to pair with (in
    a round of two nodes it always does); repeating a probe only repeats its verdict, so such
    pairs are dropped. A faulty or unchecked node left without a new pair probes itself alone.
    """
    planned = plan_round_two(list(nodes), [p.as_probe() for p in round_one])
    seen = {frozenset(p.pair) for p in round_one}
    fresh = tuple(pair for pair in planned if frozenset(pair) not in seen)
    covered = {node for pair in fresh for node in pair}
    suspects = set(verdict.faulty) | set(verdict.unchecked)
    return SecondPhase(fresh, tuple(sorted(suspects - covered, key=int)))


def with_solos(verdict: CheckVerdict, solos: Mapping[str, SideResult]) -> tuple[CheckVerdict, tuple[str, ...]]:
    """Settle the blame of suspects that probed themselves alone; returns the verdict and warnings.

    A node whose solo probe failed is faulty, whatever its pairs said. A node that failed with
    every partner but passed alone is not: its partners (which are themselves suspects, or it
    would have had a new pair) are to blame, or the link between them. When every node of such
    a failed pair passed alone, the link failed, not a node: no node is excluded for it and a
    warning says so. Excluding both would end a two-node job over what may be a transient or
    switch-wide problem that replacements would meet as well, and excluding one would be a
    guess; if the link is really broken, the workers' first collective fails and the ordinary
    worker-failure handling (restart budgets, relaunch) takes over with real evidence.

    A node kept this way gets its solo probe's time in `best_time_s`; stragglers are not
    recomputed (a solo time is no measure of a link).
    """
    faulty = set(verdict.faulty)
    unchecked = set(verdict.unchecked)
    reasons = dict(verdict.reasons)
    best = dict(verdict.best_time_s)
    warnings = []
    for node in sorted(solos, key=int):
        side = solos[node]
        if not side.ok:
            before = reasons.get(node, "")
            faulty.add(node)
            unchecked.discard(node)
            reasons[node] = f"{before + '; ' if before else ''}its probe alone failed too: {side.error}"
        elif node in faulty or node in unchecked:
            faulty.discard(node)
            unchecked.discard(node)
            before = reasons.pop(node, "")
            best[node] = side.elapsed_s
            warnings.append(
                f"node rank {node} {before or 'had no pair result'} but passed alone in {side.elapsed_s:.4f} s: "
                "not excluded (a failed link or a failed partner, not this node); if the link is broken, "
                "the workers' collectives will fail and be handled as worker failures"
            )
    new = CheckVerdict(
        faulty=tuple(sorted(faulty)),
        stragglers=verdict.stragglers,
        best_time_s=best,
        reasons=reasons,
        unchecked=tuple(sorted(unchecked)),
    )
    return new, tuple(warnings)


def describe_pairs(pairs: Sequence[PairOutcome]) -> str:
    """One line per probed pair, with its time or both sides' errors: the check's evidence."""
    lines = []
    for p in pairs:
        a, b = p.pair
        if p.ok:
            lines.append(f"round {p.phase} pair {a}-{b}: ok in {p.elapsed_s:.4f} s")
            continue
        why = "; ".join(
            f"node {node}: {'ok in ' + format(side.elapsed_s, '.4f') + ' s' if side.ok else side.error}"
            for node, side in zip(p.pair, p.sides, strict=True)
        )
        lines.append(f"round {p.phase} pair {a}-{b}: failed ({why})")
    return "\n".join(lines)


def _ranks(nodes: Sequence[str]) -> str:
    return ", ".join(sorted(nodes, key=int))


class CheckAction(enum.Enum):
    """What a node does after the check."""

    TRAIN = "train"
    """Start the workers of this round."""
    EXCLUDE_SELF = "exclude_self"
    """Report this node to the master and exit, without training."""
    NEW_ROUND = "new_round"
    """Another node was left out: rendezvous again without it."""


@attrs.frozen
class CheckOutcome:
    """What the check decided for one node.

    Attributes:
        action: what to do.
        reason: why, in a sentence.
        evidence: for EXCLUDE_SELF, what to report to the master (the reason and every probe).
        verdict: the verdict of a multi-node check; None for a single-node probe.
        warnings: what the check found but did not act on (a failed link between nodes that
            each passed alone); also part of `reason`.
    """

    action: CheckAction
    reason: str
    evidence: str = ""
    verdict: CheckVerdict | None = None
    warnings: tuple[str, ...] = ()


def decide(
    me: str,
    round_number: int,
    verdict: CheckVerdict,
    pairs: Sequence[PairOutcome],
    *,
    exclude_stragglers: bool,
    warnings: Sequence[str] = (),
    solos: Mapping[str, SideResult] | None = None,
) -> CheckOutcome:
    """What node `me` does, given the verdict every node of the round computed alike.

    A faulty node leaves; so does a straggler under `--exclude-straggler`. The others start a new
    round when anyone leaves (training must not start with a world that counts a departing node),
    else they train. Stragglers that are kept are named in the reason, so the log shows them.

    Args:
        me: this node's name (its node rank).
        round_number: the rendezvous round checked.
        verdict: `judge` over every pair of the check.
        pairs: those pairs, for the evidence.
        exclude_stragglers: whether stragglers leave too.
        warnings: findings not acted on (see `with_solos`), added to the reason.
        solos: nodes that probed themselves alone, with their results, for the evidence.
    """
    table = describe_pairs(pairs)
    for node in sorted(solos or {}, key=int):
        side = (solos or {})[node]
        table += f"\nnode {node} alone: {'ok in ' + format(side.elapsed_s, '.4f') + ' s' if side.ok else side.error}"
    warned = tuple(warnings)
    note = "".join(f"; warning: {w}" for w in warned)
    head = f"network check of round {round_number}"
    if me in verdict.faulty:
        reason = f"{head}: node rank {me} is faulty: {verdict.reasons[me]}{note}"
        return CheckOutcome(CheckAction.EXCLUDE_SELF, reason, f"{reason}\n{table}", verdict, warned)
    if exclude_stragglers and me in verdict.stragglers:
        reason = f"{head}: node rank {me} is a straggler (--exclude-straggler): {verdict.reasons[me]}{note}"
        return CheckOutcome(CheckAction.EXCLUDE_SELF, reason, f"{reason}\n{table}", verdict, warned)
    leaving = set(verdict.faulty) | (set(verdict.stragglers) if exclude_stragglers else set())
    if leaving:
        whys = "; ".join(f"node rank {n}: {verdict.reasons[n]}" for n in sorted(leaving, key=int))
        reason = f"{head} left out node rank(s) {_ranks(list(leaving))} ({whys}): rendezvous again without them"
        return CheckOutcome(CheckAction.NEW_ROUND, reason + note, verdict=verdict, warnings=warned)
    reason = f"{head} passed on all {len(verdict.best_time_s) + len(verdict.unchecked)} nodes"
    if verdict.stragglers:
        kept = "; ".join(f"node rank {n}: {verdict.reasons[n]}" for n in sorted(verdict.stragglers, key=int))
        reason += f"; straggler(s) kept, as --exclude-straggler is off: {kept}"
    return CheckOutcome(CheckAction.TRAIN, reason + note, verdict=verdict, warnings=warned)


def check_round(
    round_number: int,
    world_size: int,
    me: str,
    probe: Callable[[int, Sequence[Pair]], list[PairOutcome]],
    *,
    straggler_factor: float = 2.0,
    exclude_stragglers: bool = False,
    solo: Callable[[int, Sequence[str]], Mapping[str, SideResult]] | None = None,
) -> CheckOutcome:
    """The whole check of a round of two or more nodes, given a way to probe a plan's pairs.

    Round one probes neighbours; when it found a suspect, round two re-pairs the suspects with
    nodes that did well, and suspects left without a new partner probe themselves alone
    (`plan_second_phase`); `judge` reads both rounds, `with_solos` the solo probes, and `decide`
    says what `me` does. Deterministic given
    what `probe` returns, which is what lets every agent reach the same verdict: `probe` returns
    the pairs' outcomes as read back from the shared store.

    Args:
        round_number: the rendezvous round.
        world_size: nodes in the round (at least 2).
        me: this node's name.
        probe: runs this node's part of check round `phase` over `pairs` and returns every pair's
            outcome, in plan order.
        straggler_factor: see `NodeCheckConfig`.
        exclude_stragglers: whether stragglers leave too.
        solo: runs this node's part of the solo probes of check round `phase` (when it is named)
            and returns every named node's result, read back from the shared store. None: no
            solo probes, and a suspect without a new partner keeps its round-one verdict.
    """
    nodes = check_nodes(world_size)
    config = NodeCheckConfig(straggler_factor=straggler_factor)
    pairs = probe(1, plan_round_one(nodes))
    verdict = judge(nodes, [p.as_probe() for p in pairs], config)
    warnings: tuple[str, ...] = ()
    solos: Mapping[str, SideResult] = {}
    if needs_second_round(verdict):
        second = plan_second_phase(nodes, pairs, verdict)
        if second.pairs:
            pairs = pairs + probe(2, second.pairs)
            verdict = judge(nodes, [p.as_probe() for p in pairs], config)
        if second.solos and solo is not None:
            solos = solo(2, second.solos)
            verdict, warnings = with_solos(verdict, solos)
    return decide(
        me, round_number, verdict, pairs, exclude_stragglers=exclude_stragglers, warnings=warnings, solos=solos
    )


def decide_single(round_number: int, side: SideResult) -> CheckOutcome:
    """What the only node of a round does after probing itself (matrix products, a world of one)."""
    head = f"network check of round {round_number} (one node, probed alone)"
    if side.ok:
        return CheckOutcome(CheckAction.TRAIN, f"{head} passed in {side.elapsed_s:.4f} s")
    reason = f"{head}: this node's probe failed: {side.error}"
    return CheckOutcome(CheckAction.EXCLUDE_SELF, reason, reason)


def check_step(outcome: CheckOutcome) -> Step | None:
    """The agent's next step after a check: None to go on and train.

    EXCLUDE_SELF becomes REPORT_FAILURE (report, then exit); NEW_ROUND a restart that does not
    count against `--max-restarts` (the node did nothing wrong).
    """
    if outcome.action is CheckAction.TRAIN:
        return None
    if outcome.action is CheckAction.NEW_ROUND:
        return Step(StepKind.RESTART, outcome.reason)
    return Step(StepKind.REPORT_FAILURE, outcome.reason)


def after_check_report(outcome: CheckOutcome, answer: Decision | None, error: str = "") -> Step:
    """The step after reporting a node the check left out: always exit, so no training starts.

    Whatever the master answers, this node's agent exits with status 1: the node must not train,
    and the master (or the scheduler that sees the agent exit) relaunches or replaces it.

    Args:
        outcome: the check's outcome for this node.
        answer: the master's decision (its `outcome`: the reason); None when the report could not
            be delivered.
        error: why it could not be delivered.
    """
    if answer is None:
        return Step(StepKind.EXIT, f"{outcome.reason}; the report did not reach the master: {error}", exit_code=1)
    return Step(
        StepKind.EXIT,
        f"{outcome.reason}; reported to the master, which answered {answer.action.value}: {answer.outcome}",
        exit_code=1,
    )
