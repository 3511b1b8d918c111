"""Recovery reliability: the SIGKILL of `recovery_downtime.py`, repeated; every run must recover (issue 9).

Scenarios, each a fresh job per run (2 ranks, gloo, checkpoint every step), at each state size
(default 256 MB and 1 GB per rank, as the issue asks):

* ``kill``: SIGKILL rank 1 in steady state; recovered when both ranks complete a step after
  the restart. ``dlrover-run`` + flash checkpoints ``--runs`` times (default 20), and
  ``torchrun --max-restarts`` + ``torch.save`` as a peer ``--peer-runs`` times.
* ``stall``: as ``kill``, but the restarted rank 1 sleeps instead of joining the process group
  (a worker that cannot join). Its peer waits in ``init_process_group``, whose default timeout
  is 30 minutes. ``dlrover-run --hang-timeout`` should notice (neither worker uses CPU), restart
  the workers and recover; the time from the stall to the new workers' start is reported. The
  peers are ``torchrun`` and ``dlrover-run --hang-timeout=0`` (detection off; its default, 180 s,
  is beyond the stall bound, so the flag is given to say what the row measures).

Outcomes: ``recovered``; ``hang`` (no step and no exit within the bound: a result, then torn
down); ``failed`` (the launcher gave up). Every run's processes, shared memory and temp dirs are
removed and checked.

The goal (issue 9): the same kill repeated 20 times, every run recovers, at 256 MB and 1 GB per
rank. The last line says ``GOAL PASS`` when ``dlrover-run`` + flash recovered every kill at both
sizes with at least 20 kills each, else ``GOAL MISS`` and why (``--quick`` covers neither).

    python benchmarks/recovery_reliability.py            # per size: 20 + 3 kills, 1 + 1 + 1 stalls
    python benchmarks/recovery_reliability.py --quick    # 64 MB: 3 + 2 kills, 1 + 1 + 0 stalls
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recovery_downtime import GOAL_SIZES_MB, Trial, run_trial, shm_leftovers, sizes_text

STALL_ENV = {"BENCH_STALL_RANK_ON_RESTART": "1"}
GOAL_RUNS = 20  # issue 9's goal covers the same sizes as the downtime benchmark's (GOAL_SIZES_MB)
OURS_KILL = "dlrover-run + flash, kill"


@dataclass
class Tally:
    """Outcomes of one launcher-scenario row at one state size."""

    name: str
    size_mb: int
    outcomes: list[str] = field(default_factory=list)
    recover_s: list[float] = field(default_factory=list)
    act_s: list[float] = field(default_factory=list)  # stall -> the agent's new workers start
    notes: list[str] = field(default_factory=list)

    def add(self, t: Trial) -> str:
        if t.outcome == "ok":
            kind = "recovered"
            assert t.downtime_s is not None
            self.recover_s.append(t.downtime_s)
        elif t.outcome.startswith("hang"):
            kind = "hang"
        else:
            kind = "failed"
        self.outcomes.append(kind)
        act = _act_time(t)
        if act is not None:
            self.act_s.append(act)
        if kind != "recovered":
            self.notes.append(f"{t.outcome} at {t.stuck_at}")
        return kind

    def row(self) -> str:
        n = len(self.outcomes)
        rec = self.recover_s
        med = f"{statistics.median(rec):.2f}" if rec else "-"
        mx = f"{max(rec):.2f}" if rec else "-"
        act = f"{statistics.median(self.act_s):.2f}" if self.act_s else "-"
        return (
            f"| {self.size_mb} MB | {self.name} | {n} | {self.outcomes.count('recovered')} "
            f"| {self.outcomes.count('hang')} | {self.outcomes.count('failed')} | {med} | {mx} | {act} |"
        )


def _act_time(t: Trial) -> float | None:
    """Seconds from the restarted rank 1 stalling to the next attempt's first worker starting."""
    if t.events is None:
        return None
    lines = t.events.by_rank.get(1, [])
    stall = next((x for x in lines if x[0] == "stalling"), None)
    if stall is None:
        return None
    nxt = [x[3] for r in range(2) for x in t.events.by_rank.get(r, []) if x[0] == "start" and x[1] > stall[1]]
    return min(nxt) - stall[3] if nxt else None


def reliability_goal(kills: list[Tally]) -> list[str]:
    """The goal's verdict from the ``dlrover-run + flash, kill`` rows: one line per size, then one
    ``GOAL PASS`` or ``GOAL MISS`` line (a pass needs the goal's sizes and run count covered)."""
    lines = [
        f"goal (issue 9): {OURS_KILL}: {GOAL_RUNS} of {GOAL_RUNS} recovered at each of {sizes_text(GOAL_SIZES_MB)}"
    ]
    for t in kills:
        ok = t.outcomes.count("recovered")
        verdict = "PASS" if ok == len(t.outcomes) >= GOAL_RUNS else "MISS"
        lines.append(f"  {t.size_mb} MB: {ok} of {len(t.outcomes)} recovered  {verdict}")
    failed = [t.size_mb for t in kills if t.outcomes.count("recovered") < len(t.outcomes)]
    few = [t.size_mb for t in kills if len(t.outcomes) < GOAL_RUNS]
    missing = [s for s in GOAL_SIZES_MB if s not in {t.size_mb for t in kills if t.outcomes}]
    if failed:
        lines.append(f"GOAL MISS: a run did not recover at {sizes_text(failed)}")
    elif few or missing:
        why = [f"fewer than {GOAL_RUNS} runs at {sizes_text(few)}"] if few else []
        why += [f"not run at {sizes_text(missing)}"] if missing else []
        lines.append(f"GOAL MISS: {'; '.join(why)} (every run that ran recovered)")
    else:
        lines.append(f"GOAL PASS: every run recovered at {sizes_text(t.size_mb for t in kills)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a smoke run: 64 MB, 3 + 2 kills, 1 + 1 stalls")
    p.add_argument("--runs", type=int, default=GOAL_RUNS, help="dlrover-run kills per size")
    p.add_argument("--peer-runs", type=int, default=3, help="torchrun kills per size")
    p.add_argument("--stall-runs", type=int, default=1, help="stall runs per launcher and size (0: none)")
    p.add_argument("--sizes", default="256,1024", help="MB of state per rank, comma-separated")
    p.add_argument("--hang-timeout-s", type=float, default=10.0, help="dlrover-run --hang-timeout for stalls")
    p.add_argument("--recover-timeout-s", type=float, default=60.0, help="bound on one recovery")
    p.add_argument("--stall-bound-s", type=float, default=60.0, help="bound on a stall run's recovery")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.quick:
        sizes, args.runs, args.peer_runs, args.stall_runs = [64], 3, 2, 1
    plan: list[tuple[Tally, str, str, list[str], dict[str, str], float, int]] = []
    for size in sizes:
        plan += [
            (Tally(OURS_KILL, size), "dlrover-run", "flash", [], {}, args.recover_timeout_s, args.runs),
            (Tally("torchrun + disk, kill", size), "torchrun", "disk", [], {}, args.recover_timeout_s, args.peer_runs),
            (
                Tally(f"dlrover-run --hang-timeout={args.hang_timeout_s:g} + flash, stall", size),
                "dlrover-run",
                "flash",
                [f"--hang-timeout={args.hang_timeout_s}"],
                STALL_ENV,
                args.stall_bound_s,
                args.stall_runs,
            ),
            (
                Tally("torchrun + disk, stall", size),
                "torchrun",
                "disk",
                [],
                STALL_ENV,
                args.stall_bound_s,
                args.stall_runs,
            ),
            (
                Tally("dlrover-run --hang-timeout=0 (off) + flash, stall", size),
                "dlrover-run",
                "flash",
                ["--hang-timeout=0"],
                STALL_ENV,
                args.stall_bound_s,
                0 if args.quick else min(1, args.stall_runs),
            ),
        ]
    print(f"# recovery reliability: {sizes_text(sizes)} per rank, 2 ranks, gloo")
    leaks: list[str] = []
    trials: list[Trial] = []
    # Interleave the rows of a size so every launcher sees the same machine load over time.
    for size in sizes:
        rows = [r for r in plan if r[0].size_mb == size]
        for i in range(max(n for *_, n in rows)):
            for tally, launcher, mode, extra, env, bound, n in rows:
                if i >= n:
                    continue
                t = run_trial(launcher, mode, size, recover_timeout_s=bound, extra=extra, env=env)
                trials.append(t)
                kind = tally.add(t)
                leaks += t.leaks
                rec = f"{t.downtime_s:.2f}s" if t.downtime_s is not None else "-"
                act = _act_time(t)
                acted = f" act={act:.2f}s" if act is not None else ""
                print(
                    f"  {size:>5} MB {tally.name:<50} run {i:>2}: {kind:<9} {rec}{acted} {t.stuck_at} {t.loaded}",
                    flush=True,
                )
                for leak in t.leaks:
                    print(f"    left behind: {leak}", flush=True)
                if kind == "failed" and t.tail:
                    print("    " + t.tail.replace("\n", "\n    ")[:1500], flush=True)
    print(
        "\n| state/rank | launcher + checkpoint, scenario | runs | recovered | hung | failed | recovery s (median) "
        "| recovery s (max) | stall -> new workers s (median) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for tally, *_ in plan:
        if tally.outcomes:
            print(tally.row())
    for tally, *_ in plan:
        for note in tally.notes:
            print(f"  {tally.size_mb} MB {tally.name}: {note}")
    left = shm_leftovers(g for t in trials for g in t.shm_globs)
    print(f"\nleaks during runs: {leaks or 'none'}; this run's shared memory now: {left or 'none'}")
    print("\n" + "\n".join(reliability_goal([t for t, *_ in plan if t.name == OURS_KILL])))
    # Detection off is expected to hang; every other dlrover-run row must recover.
    ours = [t for t, launcher, _, extra, *_ in plan if launcher == "dlrover-run" and "--hang-timeout=0" not in extra]
    all_ours_ok = all(o == "recovered" for t in ours for o in t.outcomes)
    return 0 if all_ours_ok and not leaks and not left else 1


if __name__ == "__main__":
    sys.exit(main())
