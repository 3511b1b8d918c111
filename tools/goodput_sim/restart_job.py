"""The baseline: what a plain torchrun job does. Every failure stops the whole job; it restarts
from its newest storage checkpoint, saved (blocking) every `storage_interval_s`.

Nothing decides here but the rule below, so no master runs: the timeline is written as the events
and attempt reports the master would journal, and the master's own accounting
(`dlrover.master.goodput.compute_breakdown`) reads it, so both strategies are measured by one rule.

Per interruption, by its cause's effect:

* ``crash``: found `crash_detection_s` after it; every process restarts in place (`process_restart_s`).
* ``hang``: found when the collective times out (`nccl_timeout_s`), then as a crash.
* ``broken``: found as a crash; the restart on the faulty node fails again at once, and the job is
  resubmitted without it (`node_provision_s` before the processes start).
* ``lost``: the survivors' collective times out (`lost_node_detection_s`); resubmitted as above.
* ``preempted``: found as a crash (the processes got SIGTERM); resubmitted without the reclaimed node.
* ``user``: the job stops; a person fixes it (`human_response_s`) and resubmits it.
* ``slow``: nothing notices a straggler: every step takes `straggler_slowdown` times as long until
  its slowness passes (`straggler_lasts_s`), or a resubmission for another cause of the same node
  leaves it out. What it added to the steps kept is counted apart (the second value returned).

Every restart loads the newest storage checkpoint (`checkpoint_gib / storage_read_gib_s`) and redoes
the steps after it. An interruption that arrives while the job is down meets it once it trains again,
as in DLRover's runs. (The in-place retry on a broken node is charged its restart and detection, not a
checkpoint load: it fails before it loads.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlrover.master.goodput import GoodputBreakdown, compute_breakdown

from .scenario import CAUSES, Scenario, Strategy
from .trace import Interruption
from .training import Stretch

__all__ = ["simulate_restart_job"]

WALL0 = 1_700_000_000.0


def simulate_restart_job(
    scenario: Scenario, strategy: Strategy, trace: Sequence[Interruption]
) -> tuple[GoodputBreakdown, float]:
    """Goodput of `strategy` (kind ``restart_job``) on `trace`, and the seconds stragglers added to the
    steps kept (which the breakdown counts as useful)."""
    return _RestartJobRun(scenario, strategy).run(trace)


_DETECTION = {
    "crash": "crash_detection_s",
    "broken": "crash_detection_s",
    "hang": "nccl_timeout_s",
    "lost": "lost_node_detection_s",
    "preempted": "crash_detection_s",
    "user": "crash_detection_s",
}


class _RestartJobRun:
    """One run of the baseline: its timeline as events and attempt reports, read by the master's accounting."""

    def __init__(self, scenario: Scenario, strategy: Strategy) -> None:
        self.job, self.costs, self.strategy = scenario.job, scenario.costs, strategy
        self.save_s = self.job.checkpoint_gib / self.costs.storage_write_gib_s
        self.load_s = self.job.checkpoint_gib / self.costs.storage_read_gib_s
        self.events: list[dict[str, Any]] = [{"wall_time": WALL0, "kind": "job_start", "data": {}}]
        self.best = 0
        self.attempt = 0
        self.slow_until: dict[int, float] = {}  # trace node -> when its slowness passes
        self.straggled = 0.0
        self.times: dict[str, Any] = {}
        self.stretch = self._start(0.0, self.costs.node_provision_s, 0)

    def run(self, trace: Sequence[Interruption]) -> tuple[GoodputBreakdown, float]:
        costs, end = self.costs, self.job.duration_s
        trained_until = end
        for item in trace:
            # One that arrives while the job restarts meets it once it trains again, as in DLRover's runs: the
            # resubmitted job's nodes are new, but a node that breaks meanwhile is broken then.
            t = max(item.time_s, self.stretch.ready)
            if t >= end:
                break
            self._repace(t)
            effect = CAUSES[item.cause].effect
            if effect == "slow":
                self.slow_until.setdefault(item.node, t + costs.straggler_lasts_s)
                self._repace(t)
                continue
            self._progress(t)
            found = t + getattr(costs, _DETECTION[effect])
            if found >= end:
                trained_until = t  # training stopped; nobody noticed before the end
                break
            self.events.append({"wall_time": WALL0 + found, "kind": "failure", "data": {"cause": item.cause}})
            self._restart(found, effect, item.node, self.stretch.last_saved_step(t))
        if trained_until == end:
            self._repace(end)
            self._progress(end)
        self.events.append({"wall_time": WALL0 + end, "kind": "job_end", "data": {}})
        breakdown = compute_breakdown(sorted(self.events, key=lambda e: e["wall_time"]), WALL0 + end)
        return breakdown, self.straggled

    def _restart(self, found: float, effect: str, node: int, resume_from: int) -> None:
        costs = self.costs
        at, provision = found, 0.0
        if effect == "broken":
            # The in-place restart meets the same fault once more before the job is resubmitted.
            at += costs.process_restart_s + costs.crash_detection_s
            provision = costs.node_provision_s
        elif effect in ("lost", "preempted"):
            provision = costs.node_provision_s
        if effect in ("broken", "lost", "preempted"):
            self.slow_until.pop(node, None)  # resubmitted on other nodes: this one is left out
        if effect == "user":
            provision = costs.human_response_s + costs.node_provision_s
        self.stretch = self._start(at, provision, resume_from)

    def _slowdown(self, t: float) -> float:
        for node, until in list(self.slow_until.items()):
            if until <= t:
                del self.slow_until[node]
        return self.costs.straggler_slowdown if self.slow_until else 1.0

    def _start(self, at: float, provision: float, from_step: int) -> Stretch:
        self.attempt += 1
        workers = at + provision + self.costs.process_restart_s
        loading = self.load_s if from_step > 0 else 0.0
        pace = self._slowdown(workers + loading)
        # torchrun's static rendezvous completes as the last agent joins; the workers then start.
        self.times = {"rendezvous": (at + provision, at + provision), "workers_start": workers, "load_s": loading}
        return Stretch(
            ready=workers + loading,
            start_step=from_step,
            step_s=self.job.step_time_s * pace,
            save_s=self.save_s,
            periodic_save_s=self.strategy.storage_interval_s,
            slowdown=pace,
        )

    def _progress(self, until: float) -> None:
        """The attempt's report up to `until`; what a straggler added to the steps gained is counted."""
        stretch, times = self.stretch, self.times
        report = stretch.report(
            0,
            self.attempt,
            until,
            self.best,
            wall0=WALL0,
            rendezvous=times["rendezvous"],
            workers_start=times["workers_start"],
            load_s=times["load_s"],
        )
        self.events.append({"wall_time": WALL0 + until, "kind": "steps", "data": {"attempts": [report.to_dict()]}})
        reached = stretch.start_step + stretch.steps_by(until)
        self.straggled += stretch.straggled_s(max(0, reached - self.best))
        self.best = max(self.best, reached)

    def _paced(self, t: float) -> None:
        """From `t` the steps go on at the pace of then (nothing changes when that is the stretch's)."""
        pace = self._slowdown(t)
        if pace == self.stretch.slowdown or t < self.stretch.ready:
            return
        self._progress(t)
        self.stretch = self.stretch.continued(t, pace)

    def _repace(self, t: float) -> None:
        """`_paced` at `t`, after the pace changed where each slowness passed before it."""
        for until in sorted(u for u in self.slow_until.values() if u < t):
            self._paced(until)
        self._paced(t)
