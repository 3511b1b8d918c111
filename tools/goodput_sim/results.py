"""What one strategy reached on one trace, and the table that compares strategies."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from dlrover.master.goodput import BUCKETS, GoodputBreakdown

from .dlrover_run import DLRoverRun
from .restart_job import simulate_restart_job
from .scenario import Scenario, Strategy
from .trace import Interruption

__all__ = ["STOPPED", "STRAGGLING", "Result", "simulate", "table"]

STOPPED = "stopped"
"""The bucket of the time after a job stopped before the scenario's end (its budget ran out)."""
STRAGGLING = "straggling"
"""The bucket of what stragglers added to the steps kept: the master's accounting counts a slow step
as useful, the simulation knows how long it would have taken."""


@attrs.frozen
class Result:
    """One strategy on one trace.

    Attributes:
        strategy: the strategy's name.
        accelerators: the job's size.
        days: how long the job ran (the scenario's).
        interruptions: the trace's interruptions within the run.
        useful_s: seconds of steps kept, at the pace they would have had without stragglers.
        buckets: seconds lost, by the master's buckets, plus `STRAGGLING` and `STOPPED`.
        stopped: why the job stopped before the end ("" when it ran to the end).
        decisions: the master's decisions, counted by "kind: action" (dlrover strategies).
        sim_cpu_s: the simulation's CPU time.
        master: the master's CPU time per call, by call ("heartbeat": seconds per call, ...), and calls.
    """

    strategy: str
    accelerators: int
    days: float
    interruptions: int
    useful_s: float
    buckets: Mapping[str, float]
    stopped: str = ""
    decisions: Mapping[str, int] = attrs.field(factory=dict)
    sim_cpu_s: float = 0.0
    master: Mapping[str, Mapping[str, float]] = attrs.field(factory=dict)

    @property
    def goodput(self) -> float:
        """Useful time over the whole run (a job that stopped early counts its rest as lost)."""
        return self.useful_s / (self.days * 86400.0)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form written by the command line (every attribute, and `goodput`)."""
        return {**attrs.asdict(self), "goodput": self.goodput}


def _result(
    scenario: Scenario,
    strategy: Strategy,
    trace: Sequence[Interruption],
    breakdown: GoodputBreakdown,
    cpu_s: float,
    *,
    straggled_s: float,
    **extra: Any,
) -> Result:
    duration = scenario.job.duration_s
    buckets = {b: breakdown.buckets[b] for b in BUCKETS}
    straggled_s = min(straggled_s, breakdown.useful_s)
    buckets[STRAGGLING] = straggled_s
    buckets[STOPPED] = max(0.0, duration - breakdown.elapsed_s)
    return Result(
        strategy=strategy.name,
        accelerators=scenario.job.accelerators,
        days=scenario.job.days,
        interruptions=sum(1 for i in trace if i.time_s < duration),
        useful_s=breakdown.useful_s - straggled_s,
        buckets=buckets,
        sim_cpu_s=cpu_s,
        **extra,
    )


def simulate(scenario: Scenario, strategy: Strategy, trace: Sequence[Interruption]) -> Result:
    """Run `strategy` of `scenario` on `trace`."""
    started = time.process_time()
    if strategy.kind == "restart_job":
        breakdown, straggled_s = simulate_restart_job(scenario, strategy, trace)
        cpu_s = time.process_time() - started
        return _result(scenario, strategy, trace, breakdown, cpu_s, straggled_s=straggled_s)
    run = DLRoverRun(scenario, strategy)
    breakdown = run.run(trace)
    return _result(
        scenario,
        strategy,
        trace,
        breakdown,
        time.process_time() - started,
        straggled_s=run.straggled_s,
        stopped=run.stopped,
        decisions=dict(sorted(run.decisions.items())),
        master=run.master_costs(),
    )


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def table(results: Sequence[Result]) -> str:
    """A Markdown table: goodput and the share of the run each bucket took, one row per result."""
    shown = [b for b in (*BUCKETS, STRAGGLING, STOPPED) if any(r.buckets.get(b, 0.0) > 0 for r in results)]
    head = ["strategy", "accelerators", "days", "interruptions", "goodput", *shown]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        total = r.days * 86400.0
        cells = [r.strategy, str(r.accelerators), f"{r.days:g}", str(r.interruptions), _pct(r.goodput)]
        cells += [_pct(r.buckets.get(b, 0.0) / total) for b in shown]
        rows.append("| " + " | ".join(cells) + " |")
    stops = [f"- {r.strategy} at {r.accelerators}: stopped: {r.stopped}" for r in results if r.stopped]
    return "\n".join(rows + (["", *stops] if stops else []))
