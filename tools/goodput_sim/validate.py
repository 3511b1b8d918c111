"""A real job beside its simulation: the simulator's model of a DLRover job checked against one that ran here.

A job under `dlrover-run` whose workers were killed at known times leaves the master's event log (from which the
master's own accounting computes its goodput) and rank 0's per-step log (one JSON line per step: `step`, `start`,
`end`, `attempt`). `calibrate` turns them into a one-node scenario whose costs are what that run measured:

- a flash save's cost: the master's `checkpoint_save` bucket over the saves rank 0's per-step log shows;
- the step time: the median time from one step's end to the next's in the same attempt, less a save's cost
  after a step that saved;
- per failure: detection, restart (with the rendezvous) and restore, the run's own buckets over its failures;
- the start: the run's `startup` bucket (the simulated node comes up that much less the restart before its first
  round, which costs a restart);

and its trace the kills themselves (cause `killed`: a SIGKILL from outside, which the master restarts in
place). The simulation
then runs the real master over that trace (`dlrover_run`); what it decides (restart in place from memory, which
checkpoint a round restores, how many steps are redone, where each second goes) is the model under test. The
comparison is over the time from the job's start to its last step: a simulated job runs until its time is over,
so the real job's shutdown is left out of both.

    python tools/goodput_sim validate --event-log EVENTS.jsonl --steps STEPS.jsonl --kills KILLS.jsonl --save-every 5

The costs come from the run compared, so what agrees is the model's structure, not a forecast of costs: a
restart's cost on a loaded 2-core machine varies by seconds between runs, more than the whole comparison's
tolerance (`tests/test_goodput_sim_validation.py` runs a job here and asserts agreement within 3 points).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from dlrover.common import DLRoverError
from dlrover.master.eventlog import read_event_log
from dlrover.master.goodput import BUCKETS, compute_breakdown

from .results import Result, simulate
from .scenario import Costs, Failures, Job, Scenario, ScenarioError, Strategy
from .trace import Interruption

__all__ = ["Calibration", "Comparison", "calibrate", "compare", "read_jsonl"]

_SHARD_GIB = 1e-3  # the simulated state's size: the save and load costs are given as speeds over it
_CAUSE = "killed"


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file (blank lines and a torn last line skipped).

    Raises:
        ScenarioError: another line is not JSON, or an entry is not an object (the message names it).
    """
    try:
        values = read_event_log(path)  # the event log's reader: a torn last line (a writer killed) is skipped
    except DLRoverError as exc:
        raise ScenarioError(str(exc)) from None
    for number, value in enumerate(values, 1):
        if not isinstance(value, dict):
            raise ScenarioError(f"{path}: entry {number} is not a JSON object")
    return values


@attrs.frozen
class Calibration:
    """A real run turned into a scenario: the scenario, its strategy and trace, and what the run measured.

    Attributes:
        scenario: one node of `world` accelerators, the run's costs, the window as its duration.
        strategy: the `dlrover` strategy the run used (flash every `save_every` steps).
        trace: the kills, as interruptions of cause `killed` on the node.
        real_useful_s: the master's useful time of the run.
        real_buckets: the master's buckets of the run, shutdown left out.
        window_s: from the job's start to its last step's end.
        measured: the costs measured, by name (seconds).
    """

    scenario: Scenario
    strategy: Strategy
    trace: tuple[Interruption, ...]
    real_useful_s: float
    real_buckets: Mapping[str, float]
    window_s: float
    measured: Mapping[str, float]

    @property
    def real_goodput(self) -> float:
        return self.real_useful_s / self.window_s


def _step_costs(steps: Sequence[Mapping[str, Any]], save_every: int, save_total_s: float) -> tuple[float, float]:
    """(step time, a flash save's cost) from rank 0's per-step log and the master's `checkpoint_save` bucket
    (`save_total_s`), shared by the saves the log shows (every step whose number `save_every` divides)."""
    saves = sum(1 for s in steps if int(s["step"]) % save_every == 0)
    save_s = max(save_total_s / saves, 1e-6) if saves else 1e-6
    gaps: list[float] = []
    ordered = sorted(steps, key=lambda s: float(s["end"]))
    for before, after in itertools.pairwise(ordered):
        if after["attempt"] == before["attempt"] and int(after["step"]) == int(before["step"]) + 1:
            gaps.append(float(after["end"]) - float(before["end"]) - (save_s if int(before["step"]) % save_every == 0
                                                                       else 0.0))  # fmt: skip
    if not gaps:
        raise ScenarioError("the per-step log holds no two consecutive steps of one attempt")
    # The median: a step slowed by a neighbour's burst on a shared host says nothing of the step.
    return statistics.median(gaps), save_s


def calibrate(
    events: Iterable[Mapping[str, Any]],
    steps: Sequence[Mapping[str, Any]],
    kill_wall_times: Sequence[float],
    *,
    save_every: int,
    world: int,
    max_restarts: int,
) -> Calibration:
    """The scenario of a run (see the module).

    Raises:
        ScenarioError: the inputs do not describe a one-node run with a start, steps, and one failure for each
            kill, every kill within it.
    """
    events = list(events)
    start = next((float(e["wall_time"]) for e in events if e.get("kind") == "job_start"), None)
    failed_at = sorted(float(e["wall_time"]) for e in events if e.get("kind") == "failure")
    kills = sorted(float(k) for k in kill_wall_times)
    if start is None or not steps or not failed_at or not kills:
        raise ScenarioError("the run needs a job_start event, steps, failure events and kill times")
    nodes = sum(1 for e in events if e.get("kind") == "node_created")
    if nodes > 1:
        raise ScenarioError(f"the run had {nodes} nodes: validate models a job on one node")
    window = max(float(s["end"]) for s in steps) - start
    outside = [k - start for k in kills if not (math.isfinite(k) and 0.0 <= k - start < window)]
    if outside:
        raise ScenarioError(f"kills at {outside} s lie outside the run (0 to {window:.3f} s after its start)")
    if len(kills) != len(failed_at):
        raise ScenarioError(f"{len(kills)} kills but {len(failed_at)} failure events: each kill must be one failure")
    real = compute_breakdown(events)
    count = len(kills)
    start_s = real.buckets.get("startup", 0.0)

    def per_kill(name: str) -> float:
        # (The first attempt's rendezvous and load are in these too, spread over the kills: the accounting
        # attributes them per attempt, and the events up to the first kill do not hold them all yet.)
        return real.buckets.get(name, 0.0) / count

    step_s, save_s = _step_costs(steps, save_every, real.buckets.get("checkpoint_save", 0.0))
    restart_s = per_kill("restart") + per_kill("rendezvous")
    load_s = max(per_kill("checkpoint_load"), 1e-6)
    # From each kill to the master's failure event: the master's own bucket starts at the last step mark, so it
    # holds the step the kill cut short, which the simulation counts from the kill itself.
    detect_s = statistics.fmean(min((f for f in failed_at if f >= k), default=k) - k for k in kills)
    measured = {
        "step_time_s": step_s,
        "flash_save_s": save_s,
        "crash_detection_s": detect_s,
        "process_restart_s": restart_s,
        "checkpoint_load_s": load_s,
        "startup_s": start_s,
    }
    if start_s < restart_s:  # the simulated start costs a restart at least: said, not hidden
        measured["startup_unmodelled_s"] = start_s - restart_s
    costs = Costs(
        process_restart_s=restart_s,
        crash_detection_s=detect_s,
        node_provision_s=max(0.0, start_s - restart_s),
        rendezvous_last_call_s=0.0,
        flash_save_gib_s=_SHARD_GIB / save_s,
        memory_load_gib_s=_SHARD_GIB / load_s,
    )
    job = Job(accelerators=world, accelerators_per_node=world, step_time_s=step_s,
              checkpoint_gib=_SHARD_GIB * world, days=window / 86400.0)  # fmt: skip
    strategy = Strategy(name="dlrover, in place", kind="dlrover", flash_every_steps=save_every,
                        storage_interval_s=10 * window, max_node_relaunches=1000,
                        max_process_restarts=max_restarts, backend_relaunches=False)  # fmt: skip
    scenario = Scenario(job=job, failures=Failures(rate_per_gpu_day=0.0), costs=costs, strategies=(strategy,))
    trace = tuple(Interruption(k - start, 0, _CAUSE) for k in kills)
    kept = {name: seconds for name, seconds in real.buckets.items() if name != "shutdown"}
    return Calibration(scenario, strategy, trace, real.useful_s, kept, window, measured)


@attrs.frozen
class Comparison:
    """The real run and its simulation, side by side."""

    calibration: Calibration
    simulated: Result

    @property
    def simulated_goodput(self) -> float:
        """The simulation's useful time over its run to the end of its last step (its `shutdown` bucket, the step
        it was in when its time ran out, left out as the real job's shutdown is)."""
        sim = self.simulated
        return float(sim.useful_s) / (self.calibration.window_s - float(sim.buckets.get("shutdown", 0.0)))

    @property
    def difference(self) -> float:
        """Simulated goodput less the real one (a fraction: 0.01 is one point)."""
        return self.simulated_goodput - self.calibration.real_goodput

    def table(self) -> str:
        """A markdown table: goodput and each bucket with time in it, real beside simulated, as shares."""
        cal, sim = self.calibration, self.simulated
        real_total = cal.window_s
        sim_total = cal.window_s - sim.buckets.get("shutdown", 0.0)
        rows = [("goodput", cal.real_goodput, self.simulated_goodput)]
        for name in BUCKETS:
            if name == "shutdown":
                continue
            real_s, sim_s = cal.real_buckets.get(name, 0.0), sim.buckets.get(name, 0.0)
            if real_s or sim_s:
                rows.append((name, real_s / real_total, sim_s / sim_total))
        lines = ["| | real | simulated |", "|---|---|---|"]
        lines += [f"| {name} | {100 * real:.1f}% | {100 * simulated:.1f}% |" for name, real, simulated in rows]
        return "\n".join(lines)


def compare(calibration: Calibration) -> Comparison:
    """Simulate the calibrated scenario over the run's kills."""
    return Comparison(calibration, simulate(calibration.scenario, calibration.strategy, list(calibration.trace)))
