"""Failure traces: when which node meets which cause. Drawn from a scenario's rate and mix
(`draw`: a Poisson process over the job's accelerators, reproducible from the seed) or replayed
from a JSON-lines file (`read`, one ``{"time_s": 3600.0, "cause": "gpu", "node": 17}`` per line,
which `write` produces). Every strategy of a run meets the same trace."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs

from .scenario import CAUSES, Scenario, ScenarioError

__all__ = ["Interruption", "draw", "read", "trace_for", "write"]


@attrs.frozen(order=True)
class Interruption:
    """One interruption: `cause` (a key of `CAUSES`) meets node index `node` (0-based among the job's
    nodes at full size) `time_s` seconds after the job started."""

    time_s: float
    node: int
    cause: str


def draw(
    rate_per_gpu_day: float, mix: dict[str, float], *, accelerators: int, per_node: int, duration_s: float, seed: int
) -> list[Interruption]:
    """A Poisson trace: interruptions at `rate_per_gpu_day` per accelerator, each on a node drawn
    uniformly and with a cause drawn by `mix`'s shares."""
    rng = random.Random(seed)
    per_s = rate_per_gpu_day * accelerators / 86400.0
    causes = [c for c, share in mix.items() if share > 0]
    weights = [mix[c] for c in causes]
    nodes = accelerators // per_node
    out: list[Interruption] = []
    t = 0.0
    if per_s <= 0:
        return out
    while True:
        t += rng.expovariate(per_s)
        if t >= duration_s:
            return out
        out.append(Interruption(t, rng.randrange(nodes), rng.choices(causes, weights)[0]))


def read(path: Path, nodes: int) -> list[Interruption]:
    """Read a JSON-lines trace.

    Raises:
        ScenarioError: unreadable, or a line that is not an interruption of a known cause on one of
            the job's `nodes` (the line is named).
    """
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ScenarioError(f"cannot read trace {path}: {exc}") from None
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            item = Interruption(float(raw["time_s"]), int(raw["node"]), str(raw["cause"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ScenarioError(f"{path}:{number}: not an interruption ({exc!r}): {line[:120]}") from None
        if item.cause not in CAUSES:
            raise ScenarioError(f"{path}:{number}: unknown cause {item.cause!r}")
        if not 0 <= item.node < nodes:
            raise ScenarioError(f"{path}:{number}: node {item.node} is not one of the job's {nodes} nodes")
        if not math.isfinite(item.time_s) or item.time_s < 0:
            raise ScenarioError(f"{path}:{number}: time_s must be a finite number >= 0")
        out.append(item)
    return sorted(out)


def write(path: Path, trace: Iterable[Interruption]) -> None:
    """Write `trace` in `read`'s format."""
    path.write_text("".join(json.dumps(attrs.asdict(i)) + "\n" for i in trace))


def trace_for(scenario: Scenario) -> Sequence[Interruption]:
    """The scenario's trace: replayed from its file, else drawn from its rate and mix."""
    job, failures = scenario.job, scenario.failures
    if failures.trace is not None:
        return [i for i in read(failures.trace, job.nodes) if i.time_s < job.duration_s]
    return draw(
        failures.rate_per_gpu_day,
        dict(failures.mix),
        accelerators=job.accelerators,
        per_node=job.accelerators_per_node,
        duration_s=job.duration_s,
        seed=scenario.seed,
    )
