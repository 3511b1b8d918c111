"""The command line: `python tools/goodput_sim run|sweep|trace SCENARIO.toml ...` and `cost` (see the README)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import attrs

from dlrover.common import ConfigError

from .results import Result, simulate, table
from .scenario import Scenario, ScenarioError, load
from .trace import trace_for, write

__all__ = ["main"]


def _at_scale(scenario: Scenario, accelerators: int) -> Scenario:
    """The scenario at another size: the state per accelerator stays (a smaller job trains a
    proportionally smaller model), so do the step time (weak scaling) and the failure rate per
    accelerator; strategies' missing nodes and spares keep their share of the nodes."""
    job = attrs.evolve(
        scenario.job,
        accelerators=accelerators,
        checkpoint_gib=scenario.job.checkpoint_gib * accelerators / scenario.job.accelerators,
    )
    full = scenario.job.nodes

    def scaled(count: int) -> int:
        """`count` nodes of the scenario's size, as many of the new size (at least one)."""
        return max(1, round(count * job.nodes / full)) if count else 0

    strategies = tuple(
        attrs.evolve(
            s,
            # the nodes that may be missing, and the spares, keep their share of the job
            min_nodes=max(1, job.nodes - scaled(full - s.min_nodes)) if s.min_nodes else 0,
            spare_nodes=scaled(s.spare_nodes),
        )
        for s in scenario.strategies
    )
    return attrs.evolve(scenario, job=job, strategies=strategies)


def _run(scenario: Scenario, names: Sequence[str]) -> list[Result]:
    trace = trace_for(scenario)
    chosen = [s for s in scenario.strategies if not names or s.name in names]
    results = []
    for strategy in chosen:
        result = simulate(scenario, strategy, trace)
        print(
            f"  {strategy.name} at {scenario.job.accelerators}: goodput {100 * result.goodput:.1f}% "
            f"({result.interruptions} interruptions, {result.sim_cpu_s:.1f} s CPU)",
            file=sys.stderr,
        )
        results.append(result)
    return results


def _write(out: Path | None, name: str, results: Sequence[Result]) -> None:
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps([r.to_dict() for r in results], indent=1) + "\n")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="goodput_sim", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="every strategy of a scenario on one trace: a table")
    sweep = sub.add_parser("sweep", help="goodput against scale and against the storage interval: tables and plots")
    trace = sub.add_parser("trace", help="write the scenario's trace (JSON lines) to replay or edit")
    for cmd in (run, sweep, trace):
        cmd.add_argument("scenario", type=Path)
        cmd.add_argument("--seed", type=int, default=None, help="the trace's seed (default: the scenario's)")
        cmd.add_argument("--days", type=float, default=None, help="run this long instead (default: the scenario's)")
    for cmd in (run, sweep):
        cmd.add_argument("--strategy", action="append", default=[], help="only this strategy (repeatable)")
        cmd.add_argument("--out", type=Path, default=None, help="write results (JSON) and plots here")
    run.add_argument("--accelerators", type=int, default=None, help="the job's size (default: the scenario's)")
    sweep.add_argument(
        "--scales", default="128,1024,4096,16384", help="comma-separated accelerator counts (default %(default)s)"
    )
    sweep.add_argument(
        "--intervals-min",
        default="10,30,60,180",
        help="storage checkpoint intervals for the interval plot, minutes, at the largest scale (default %(default)s)",
    )
    trace.add_argument("--out", type=Path, required=True, help="the trace file to write")
    cost = sub.add_parser("cost", help="the master's CPU per call at a node count, beside a no-op gRPC call")
    cost.add_argument("--nodes", type=int, default=10_000, help="nodes (default %(default)s)")
    check = sub.add_parser("validate", help="a real job's goodput beside its simulation, calibrated from the job")
    check.add_argument("--event-log", type=Path, required=True, help="the master's event log of the run")
    check.add_argument("--steps", type=Path, required=True, help="rank 0's per-step log (JSON lines)")
    check.add_argument("--kills", type=Path, required=True, help='the kills\' wall times (JSON lines: {"t": ...})')
    check.add_argument("--save-every", type=int, required=True, help="steps between the job's flash checkpoints")
    check.add_argument("--world", type=int, default=2, help="the job's workers (default %(default)s)")
    check.add_argument("--max-restarts", type=int, required=True, help="the job's dlrover-run --max-restarts")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2: a bad scenario, trace or flag)."""
    args = _parser().parse_args(argv)
    # The simulated master logs what a real one would (a straggler found, a node relaunched) for every
    # simulated event: the table counts its decisions instead. Errors still show.
    logging.getLogger("dlrover").setLevel(logging.ERROR)
    if args.command == "validate":
        return _validate(args)
    if args.command == "cost":
        return _cost(args)
    try:
        scenario = load(args.scenario)
        if args.seed is not None:
            scenario = attrs.evolve(scenario, seed=args.seed)
        if args.days is not None:
            scenario = attrs.evolve(scenario, job=attrs.evolve(scenario.job, days=args.days))
        if args.command == "trace":
            trace = trace_for(scenario)
            write(args.out, trace)
            print(f"{len(trace)} interruptions written to {args.out}")
            return 0
        if args.command == "run":
            if args.accelerators is not None:
                scenario = _at_scale(scenario, args.accelerators)
            results = _run(scenario, args.strategy)
            print(table(results))
            _write(args.out, "run", results)
            return 0
        return _sweep(scenario, args)
    except ConfigError as exc:  # a ScenarioError, or a value refused while the scenario was changed
        print(f"goodput_sim: {exc}", file=sys.stderr)
        return 2


def _cost(args: argparse.Namespace) -> int:
    if args.nodes < 1:
        print("goodput_sim: --nodes must be at least 1", file=sys.stderr)
        return 2
    from .master_cost import measure

    print(measure(args.nodes).table())
    return 0


def _validate(args: argparse.Namespace) -> int:
    from dlrover.common import DLRoverError
    from dlrover.master.eventlog import read_event_log

    from .validate import calibrate, compare, read_jsonl

    try:
        if args.save_every < 1 or args.world < 1 or args.max_restarts < 0:
            raise ScenarioError("--save-every and --world must be at least 1, --max-restarts at least 0")
        # (A master that crashed may have left a torn last line: the event log's own reader skips it.)
        events, steps = read_event_log(args.event_log), read_jsonl(args.steps)
        kills = [float(k["t"]) for k in read_jsonl(args.kills)]
        calibration = calibrate(events, steps, kills, save_every=args.save_every, world=args.world,
                                max_restarts=args.max_restarts)  # fmt: skip
        comparison = compare(calibration)
    except (DLRoverError, OSError, KeyError, TypeError, ValueError) as exc:
        print(f"goodput_sim: {exc}", file=sys.stderr)
        return 2
    print(", ".join(f"{name} {value:.3f} s" for name, value in calibration.measured.items()))
    print(comparison.table())
    print(f"difference: {100 * comparison.difference:+.1f} points")
    return 0


def _sweep(scenario: Scenario, args: argparse.Namespace) -> int:
    from .plots import plot_breakdown, plot_interval, plot_scale

    try:
        scales = sorted({int(x) for x in args.scales.split(",") if x.strip()})
        intervals = sorted({float(x) for x in args.intervals_min.split(",") if x.strip()})
    except ValueError as exc:
        raise ScenarioError(f"--scales and --intervals-min take comma-separated numbers: {exc}") from None
    if not scales or not intervals or min(scales) < 1 or min(intervals) <= 0:
        raise ScenarioError("--scales and --intervals-min need at least one number each, all > 0")
    by_scale: list[Result] = []
    for accelerators in scales:
        by_scale += _run(_at_scale(scenario, accelerators), args.strategy)
    largest = _at_scale(scenario, scales[-1])
    points: list[tuple[float, Result]] = []
    for minutes in intervals:
        varied = attrs.evolve(
            largest, strategies=tuple(attrs.evolve(s, storage_interval_s=60 * minutes) for s in largest.strategies)
        )
        points += [(minutes, r) for r in _run(varied, args.strategy)]
    at_largest = [r for r in by_scale if r.accelerators == scales[-1]]
    print("## goodput by scale\n\n" + table(by_scale))
    print("\n## at the largest scale, by storage interval\n")
    print(table([attrs.evolve(r, strategy=f"{r.strategy}, {m:g} min") for m, r in points]))
    print("\n## the master's CPU per call at the largest scale\n")
    for r in at_largest:
        for call, cost in r.master.items():
            print(f"- {r.strategy}: {call}: {1e6 * cost['cpu_s_per_call']:.0f} us x {int(cost['calls'])}")
    if args.out is not None:
        _write(args.out, "sweep_scale", by_scale)
        _write(args.out, "sweep_interval", [attrs.evolve(r, strategy=f"{r.strategy}@{m:g}min") for m, r in points])
        days = f"{scenario.job.days:g} days"
        written = [
            plot_scale(by_scale, args.out / "goodput_by_scale.png", f"Goodput by scale ({days}, same failure rate)"),
            plot_interval(
                points,
                args.out / "goodput_by_interval.png",
                f"Goodput by storage checkpoint interval at {scales[-1]} accelerators",
            ),
            plot_breakdown(
                at_largest, args.out / "lost_time_largest.png", f"Where the time went at {scales[-1]} accelerators"
            ),
        ]
        print("\n" + "\n".join(f"wrote {p}" for p in written))
    return 0
