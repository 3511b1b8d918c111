"""Node-check pairing: which nodes probe each other, and what the results say.

A health check runs two rounds of pairwise probes (the probe itself, a small collective, lives in
dlrover-diagnosis). Round one pairs neighbours. Round two pairs the fastest nodes of round one with
the slowest, and never with a round-one partner when another choice exists, so a node that failed
or was slow in round one is probed again beside a node known to be good. Then:

- a node is faulty when it failed with every partner it had;
- a node is a straggler when its best probe time exceeds `straggler_factor` times the median.

With an odd number of nodes the extra node is paired a second time with another node (that node
runs two probes in the round, one after the other), so every node is paired in every round.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from dlrover.common import ConfigError
from dlrover.rendezvous.errors import InvalidRequestError

__all__ = [
    "CheckVerdict",
    "NodeCheckConfig",
    "Pair",
    "ProbeResult",
    "judge",
    "plan_round_one",
    "plan_round_two",
]

Pair = tuple[str, str]


def _factor(_inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 1.0 or math.isinf(value):
        raise ConfigError(f"{attribute.name} must be a finite number >= 1, got {value!r}")


@attrs.frozen
class NodeCheckConfig:
    """Verdict settings.

    Attributes:
        straggler_factor: a node whose best probe time exceeds this multiple of the median is a straggler.
    """

    straggler_factor: float = attrs.field(default=2.0, validator=_factor)


@attrs.frozen
class ProbeResult:
    """The outcome of one pair's probe.

    Attributes:
        pair: the two nodes that probed together.
        ok: whether the probe succeeded.
        elapsed_s: how long it took (ignored when it failed).
    """

    pair: Pair
    ok: bool
    elapsed_s: float = 0.0


@attrs.frozen
class CheckVerdict:
    """What two rounds of probes say about each node.

    Attributes:
        faulty: nodes that failed with every partner, sorted.
        stragglers: nodes slower than `straggler_factor` x the median, sorted.
        best_time_s: each node's fastest successful probe.
        reasons: a sentence for every faulty node, straggler and node without results.
        unchecked: nodes that have no probe result at all, sorted.
    """

    faulty: tuple[str, ...]
    stragglers: tuple[str, ...]
    best_time_s: Mapping[str, float]
    reasons: Mapping[str, str]
    unchecked: tuple[str, ...]


def _check_nodes(nodes: Sequence[str]) -> list[str]:
    ids = list(nodes)
    if len(ids) < 2:
        raise InvalidRequestError(f"a node check needs at least 2 nodes, got {len(ids)}")
    if len(set(ids)) != len(ids):
        dupes = sorted({n for n in ids if ids.count(n) > 1})
        raise InvalidRequestError(f"node ids must be unique, got duplicates {dupes}")
    if not all(isinstance(n, str) and n for n in ids):
        raise InvalidRequestError("node ids must be non-empty strings")
    return ids


def _check_results(nodes: Iterable[str], results: Iterable[ProbeResult]) -> list[ProbeResult]:
    known = set(nodes)
    checked = list(results)
    for r in checked:
        a, b = r.pair
        if a not in known or b not in known or a == b:
            raise InvalidRequestError(f"probe result {r.pair!r} names a node outside the check or the same node twice")
        if r.ok and not (math.isfinite(r.elapsed_s) and r.elapsed_s >= 0):
            raise InvalidRequestError(f"elapsed_s of {r.pair!r} must be finite and >= 0, got {r.elapsed_s!r}")
    return checked


def _best_times(results: Iterable[ProbeResult]) -> dict[str, float]:
    best: dict[str, float] = {}
    for r in results:
        if r.ok:
            for node in r.pair:
                best[node] = min(best.get(node, math.inf), r.elapsed_s)
    return best


def plan_round_one(nodes: Sequence[str]) -> list[Pair]:
    """Pair neighbours: (0, 1), (2, 3), ...; an odd last node is paired with the first.

    Raises:
        InvalidRequestError: fewer than 2 nodes, or duplicate ids.
    """
    ids = _check_nodes(nodes)
    pairs = [(ids[i], ids[i + 1]) for i in range(0, len(ids) - 1, 2)]
    if len(ids) % 2:
        pairs.append((ids[0], ids[-1]))
    return pairs


def plan_round_two(nodes: Sequence[str], round_one: Sequence[ProbeResult]) -> list[Pair]:
    """Pair the fastest nodes of round one with the slowest, avoiding round-one partners.

    Nodes that never succeeded in round one count as the slowest. Each step takes the slowest
    unpaired node and pairs it with the fastest unpaired node that was not its round-one partner
    (the fastest unpaired node when every one was). An odd node left over is paired with the
    fastest node it has not probed with yet.

    Raises:
        InvalidRequestError: fewer than 2 nodes, duplicate ids, or a result naming an unknown node.
    """
    ids = _check_nodes(nodes)
    results = _check_results(ids, round_one)
    best = _best_times(results)
    partners: dict[str, set[str]] = {n: set() for n in ids}
    for r in results:
        a, b = r.pair
        partners[a].add(b)
        partners[b].add(a)
    ranked = sorted(ids, key=lambda n: (best.get(n, math.inf), n))
    unpaired = list(ranked)
    pairs: list[Pair] = []
    while len(unpaired) >= 2:
        slow = unpaired.pop()
        fast = next((n for n in unpaired if n not in partners[slow]), unpaired[0])
        unpaired.remove(fast)
        pairs.append((fast, slow))
    if unpaired:
        odd = unpaired[0]
        taken = partners[odd] | {b if a == odd else a for a, b in pairs if odd in (a, b)}
        others = [n for n in ranked if n != odd]
        pairs.append((next((n for n in others if n not in taken), others[0]), odd))
    return pairs


def judge(nodes: Sequence[str], results: Sequence[ProbeResult], config: NodeCheckConfig | None = None) -> CheckVerdict:
    """Find the faulty nodes and the stragglers from all probe results of a check.

    Args:
        nodes: every node in the check.
        results: the probe results of both rounds.
        config: verdict settings.

    Raises:
        InvalidRequestError: a result names an unknown node, or a time is not finite.
    """
    cfg = config or NodeCheckConfig()
    ids = _check_nodes(nodes)
    checked = _check_results(ids, results)
    outcomes: dict[str, list[tuple[str, bool]]] = {n: [] for n in ids}
    for r in checked:
        a, b = r.pair
        outcomes[a].append((b, r.ok))
        outcomes[b].append((a, r.ok))
    reasons: dict[str, str] = {}
    faulty: list[str] = []
    unchecked: list[str] = []
    for node in ids:
        seen = outcomes[node]
        if not seen:
            unchecked.append(node)
            reasons[node] = "no probe result names this node"
        elif not any(ok for _, ok in seen):
            faulty.append(node)
            names = ", ".join(sorted({p for p, _ in seen}))
            reasons[node] = f"failed with every partner ({names})"
    best = _best_times(checked)
    stragglers: list[str] = []
    if best:
        median = statistics.median(best.values())
        for node, t in best.items():
            if t > cfg.straggler_factor * median:
                stragglers.append(node)
                reasons[node] = f"best probe {t:.3f} s is more than {cfg.straggler_factor} x the median {median:.3f} s"
    return CheckVerdict(
        faulty=tuple(sorted(faulty)),
        stragglers=tuple(sorted(stragglers)),
        best_time_s=best,
        reasons=reasons,
        unchecked=tuple(sorted(unchecked)),
    )
