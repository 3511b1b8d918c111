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
* ``user``: the job stops; a person fixes it (`human_response_s`) and resubmits it.

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


def simulate_restart_job(scenario: Scenario, strategy: Strategy, trace: Sequence[Interruption]) -> GoodputBreakdown:
    """Goodput of `strategy` (kind ``restart_job``) on `trace`."""
    job, costs = scenario.job, scenario.costs
    save_s = job.checkpoint_gib / costs.storage_write_gib_s
    load_s = job.checkpoint_gib / costs.storage_read_gib_s
    events: list[dict[str, Any]] = [{"wall_time": WALL0, "kind": "job_start", "data": {}}]
    end = job.duration_s
    best = 0
    attempt = 0

    def start(at: float, provision: float, from_step: int) -> tuple[Stretch, dict[str, Any]]:
        nonlocal attempt
        attempt += 1
        workers = at + provision + costs.process_restart_s
        loading = load_s if from_step > 0 else 0.0
        stretch = Stretch(
            ready=workers + loading,
            start_step=from_step,
            step_s=job.step_time_s,
            save_s=save_s,
            periodic_save_s=strategy.storage_interval_s,
        )
        # torchrun's static rendezvous completes as the last agent joins; the workers then start.
        return stretch, {"rendezvous": (at + provision, at + provision), "workers_start": workers, "load_s": loading}

    def account(stretch: Stretch, times: dict[str, Any], until: float) -> None:
        report = stretch.report(
            0,
            attempt,
            until,
            best,
            wall0=WALL0,
            rendezvous=times["rendezvous"],
            workers_start=times["workers_start"],
            load_s=times["load_s"],
        )
        events.append({"wall_time": WALL0 + until, "kind": "steps", "data": {"attempts": [report.to_dict()]}})

    stretch, times = start(0.0, costs.node_provision_s, 0)
    trained_until = end
    for item in trace:
        # One that arrives while the job restarts meets it once it trains again, as in DLRover's runs: the
        # resubmitted job's nodes are new, but a node that breaks meanwhile is broken then.
        t = max(item.time_s, stretch.ready)
        if t >= end:
            break
        effect = CAUSES[item.cause].effect
        detect = {
            "crash": costs.crash_detection_s,
            "broken": costs.crash_detection_s,
            "hang": costs.nccl_timeout_s,
            "lost": costs.lost_node_detection_s,
            "user": costs.crash_detection_s,
        }[effect]
        account(stretch, times, t)
        best = max(best, stretch.start_step + stretch.steps_by(t))
        found = t + detect
        if found >= end:
            trained_until = t  # training stopped; nobody noticed before the end
            break
        events.append({"wall_time": WALL0 + found, "kind": "failure", "data": {"cause": item.cause}})
        resume_from = stretch.last_saved_step(t)
        at, provision = found, 0.0
        if effect == "broken":
            # The in-place restart meets the same fault once more before the job is resubmitted.
            at += costs.process_restart_s + costs.crash_detection_s
            provision = costs.node_provision_s
        elif effect == "lost":
            provision = costs.node_provision_s
        elif effect == "user":
            provision = costs.human_response_s + costs.node_provision_s
        stretch, times = start(at, provision, resume_from)
    if trained_until == end:
        account(stretch, times, end)
    events.append({"wall_time": WALL0 + end, "kind": "job_end", "data": {}})
    return compute_breakdown(sorted(events, key=lambda e: e["wall_time"]), WALL0 + end)
