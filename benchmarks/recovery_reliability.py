"""Recovery reliability: the SIGKILL of `recovery_downtime.py`, repeated; every run must recover (issue 9).

Scenarios, each a fresh job per run (2 ranks, gloo, a small state, checkpoint every step):

* ``kill``: SIGKILL rank 1 in steady state; recovered when both ranks complete a step after
  the restart. ``dlrover-run`` + flash checkpoints ``--runs`` times (default 20), and
  ``torchrun --max-restarts`` + ``torch.save`` as a peer ``--peer-runs`` times.
* ``stall``: as ``kill``, but the restarted rank 1 sleeps instead of joining the process group
  (a worker that cannot join). Its peer waits in ``init_process_group``, whose default timeout
  is 30 minutes. ``dlrover-run --hang-timeout`` should notice (neither worker uses CPU), restart
  the workers and recover; the time from the stall to the new workers' start is reported. The
  peers are ``torchrun`` and ``dlrover-run`` without ``--hang-timeout`` (its default, off).

Outcomes: ``recovered``; ``hang`` (no step and no exit within the bound: a result, then torn
down); ``failed`` (the launcher gave up). Every run's processes, ``/dev/shm/dlrover-fc.*``
segments and temp dirs are removed and checked.

    python benchmarks/recovery_reliability.py            # 20 + 3 kills, 1 + 1 + 1 stalls
    python benchmarks/recovery_reliability.py --quick    # 3 + 2 kills, 1 + 1 + 0 stalls
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recovery_downtime import Trial, run_trial, shm_leftovers

STALL_ENV = {"BENCH_STALL_RANK_ON_RESTART": "1"}


@dataclass
class Tally:
    """Outcomes of one launcher-scenario row."""

    name: str
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
            f"| {self.name} | {n} | {self.outcomes.count('recovered')} | {self.outcomes.count('hang')} "
            f"| {self.outcomes.count('failed')} | {med} | {mx} | {act} |"
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="3 + 2 kills, 1 + 1 stalls")
    p.add_argument("--runs", type=int, default=20, help="dlrover-run kills")
    p.add_argument("--peer-runs", type=int, default=3, help="torchrun kills")
    p.add_argument("--stall-runs", type=int, default=1, help="stall runs per launcher (0: none)")
    p.add_argument("--size-mb", type=int, default=64, help="state per rank")
    p.add_argument("--hang-timeout-s", type=float, default=10.0, help="dlrover-run --hang-timeout for stalls")
    p.add_argument("--recover-timeout-s", type=float, default=45.0, help="bound on one recovery")
    p.add_argument("--stall-bound-s", type=float, default=45.0, help="bound on a stall run's recovery")
    args = p.parse_args(argv)
    if args.quick:
        args.runs, args.peer_runs, args.stall_runs = 3, 2, 1
    hang_flag = [f"--hang-timeout={args.hang_timeout_s}"]
    plan: list[tuple[Tally, str, str, list[str], dict[str, str], float, int]] = [
        (Tally("dlrover-run + flash, kill"), "dlrover-run", "flash", [], {}, args.recover_timeout_s, args.runs),
        (Tally("torchrun + disk, kill"), "torchrun", "disk", [], {}, args.recover_timeout_s, args.peer_runs),
        (
            Tally(f"dlrover-run --hang-timeout={args.hang_timeout_s:g} + flash, stall"),
            "dlrover-run",
            "flash",
            hang_flag,
            STALL_ENV,
            args.stall_bound_s,
            args.stall_runs,
        ),
        (Tally("torchrun + disk, stall"), "torchrun", "disk", [], STALL_ENV, args.stall_bound_s, args.stall_runs),
        (
            Tally("dlrover-run (no --hang-timeout) + flash, stall"),
            "dlrover-run",
            "flash",
            [],
            STALL_ENV,
            args.stall_bound_s,
            0 if args.quick else min(1, args.stall_runs),
        ),
    ]
    print(f"# recovery reliability: {args.size_mb} MB/rank, 2 ranks, gloo")
    leaks: list[str] = []
    # Interleave the rows so every launcher sees the same machine load over time.
    longest = max(n for *_, n in plan)
    for i in range(longest):
        for tally, launcher, mode, extra, env, bound, n in plan:
            if i >= n:
                continue
            t = run_trial(launcher, mode, args.size_mb, recover_timeout_s=bound, extra=extra, env=env)
            kind = tally.add(t)
            leaks += t.leaks
            rec = f"{t.downtime_s:.2f}s" if t.downtime_s is not None else "-"
            act = _act_time(t)
            acted = f" act={act:.2f}s" if act is not None else ""
            print(f"  {tally.name:<48} run {i:>2}: {kind:<9} {rec}{acted} {t.stuck_at} {t.loaded}", flush=True)
            for leak in t.leaks:
                print(f"    left behind: {leak}", flush=True)
            if kind == "failed" and t.tail:
                print("    " + t.tail.replace("\n", "\n    ")[:1500], flush=True)
    print(
        "\n| launcher + checkpoint, scenario | runs | recovered | hung | failed | recovery s (median) "
        "| recovery s (max) | stall -> new workers s (median) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for tally, *_ in plan:
        if tally.outcomes:
            print(tally.row())
    for tally, *_ in plan:
        for note in tally.notes:
            print(f"  {tally.name}: {note}")
    left = shm_leftovers()
    print(f"\nleaks during runs: {leaks or 'none'}; /dev/shm bench segments now: {left or 'none'}")
    ours = [t for t, launcher, *_ in plan if launcher == "dlrover-run" and "no --hang-timeout" not in t.name]
    all_ours_ok = all(o == "recovered" for t in ours for o in t.outcomes)
    return 0 if all_ours_ok and not leaks and not left else 1


if __name__ == "__main__":
    sys.exit(main())
