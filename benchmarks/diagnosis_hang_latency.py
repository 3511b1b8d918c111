"""Hang and straggler detection latency, as multiples of the step time.

    python benchmarks/diagnosis_hang_latency.py [--quick]

Hangs (real processes): two worker processes report their steps through a real step slot file
(`dlrover.common.step_slots`) every ``T`` seconds, then both stop (rank 1 sleeps before a
collective; rank 0 would wait in it). The agent's side runs as `dlrover-run` does: a `StepWatch`
fed every monitor interval (0.1 s, `--monitor-interval`'s default), the default k = 5, and a floor below 5 x T so the
adaptive window is what is measured. Latency is detection time minus the last step end, divided
by ``T``; the bound is max(5 x median step, floor). The stack dumps of both processes
(faulthandler, or py-spy when installed) are timed too, and so is the agent's busy probe before it
reports (`--hang-busy-probe`, 2 s by default: the stacks dumped again that much later, compared
with `main_thread_frames`; both ranks stand still here, so the hang is reported). The peer is the
agent's CPU-idle watch: 180 s by default (``--hang-timeout``), whatever the step time, and blind to
a rank that spins in a collective.

Stragglers (simulated clock): ranks step every ``T``; at t0 rank 1 becomes 3x slower; agents
heartbeat every ``H`` seconds with their step stats and the master's `StragglerWatch` (defaults:
factor 2, window 5, 3 samples) judges after each heartbeat. Latency is reported in seconds, in
step times and in heartbeats.

Stragglers in a synchronous job (real processes, real gloo all-reduce, real step slots): two
workers step together, each marking its first synchronization point (`StepReporter.synchronizing`,
what `report_gradient_sync` does in a DDP model) before every all-reduce; after 20 steps rank 1's
own work becomes 3x longer, and so every step. The agent's side reads the slots every monitor
interval (`StepWatch`) and heartbeats every 0.5 s into the master's `StragglerWatch`. Latency is
from the slowdown to the report, in step times (the slowed ones). The peer is the same watch fed
the same stats without lead times: step times are equal in a synchronous job, so it never reports
the rank (shown as "never" within the run's 30 slowed steps).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import attrs
from benchkit import free_port

from dlrover.common.step_slots import STACK_DUMP_ENV_VAR, STEP_SLOT_ENV_VAR, STEP_SLOTS_ENV_VAR, StepSlotFile
from dlrover.diagnosis import HangConfig, RankStepStats, StragglerConfig, main_thread_frames, request_stack_dump
from dlrover.launcher.step_watch import StepWatch
from dlrover.master.stragglers import StragglerWatch

WORKER = textwrap.dedent(
    """
    import sys, time
    from dlrover.common.step_slots import StepReporter
    step_s, steps = float(sys.argv[1]), int(sys.argv[2])
    rep = StepReporter.from_env()
    for step in range(1, steps + 1):
        time.sleep(step_s)
        rep.step(step)
    time.sleep(100000)  # the hang
    """
)

MONITOR_S = 0.1
BUSY_PROBE_S = 2.0  # dlrover-run --hang-busy-probe's default

SYNC_WORKER = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist
    from dlrover.common.step_slots import StepReporter
    step_s, slow_after, out = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rep = StepReporter.from_env()
    t = torch.ones(1)
    step = 0
    while True:
        done = torch.tensor([int(os.path.exists(os.path.join(out, "stop")))])
        dist.all_reduce(done)
        if done.item():
            break
        step += 1
        slow = rank == 1 and step > slow_after
        if rank == 1 and step == slow_after + 1:
            with open(os.path.join(out, "slowed"), "w") as f:
                f.write(repr(time.monotonic()))
        time.sleep(3 * step_s if slow else step_s)  # this rank's own work
        rep.synchronizing()
        dist.all_reduce(t)
        rep.step(step)
    dist.destroy_process_group()
    """
)


def hang_latency(step_s: float, steps: int, workdir: Path) -> tuple[float, float, float, str, float]:
    """(latency / T, window / T, dump seconds, dump method) for one run."""
    slots = StepSlotFile(workdir / "steps.slots", 2)
    procs = []
    try:
        for local in range(2):
            env = {
                **os.environ,
                STEP_SLOTS_ENV_VAR: str(slots.path),
                STEP_SLOT_ENV_VAR: str(local),
                STACK_DUMP_ENV_VAR: str(workdir / f"stacks-{local}.txt"),
            }
            procs.append(subprocess.Popen([sys.executable, "-c", WORKER, str(step_s), str(steps)], env=env))
        watch = StepWatch({0: 0, 1: 1}, HangConfig(k=5.0, floor_s=step_s, warmup_steps=1, min_step_samples=3))
        while True:
            now = time.monotonic()
            watch.observe(slots.read_all(), now)
            verdict = watch.check(now)
            if verdict is not None and verdict.hung:
                break
            time.sleep(MONITOR_S)
        # From the first rank's last step end: the stall the detector measured.
        last_end = min(r.step_end_s for r in slots.read_all().values())
        latency = now - last_end
        started = time.monotonic()
        methods = set()
        first = []
        for local, proc in enumerate(procs):
            dump = request_stack_dump(proc.pid, dump_path=workdir / f"stacks-{local}.txt", timeout_s=10.0)
            assert dump.ok, dump.reason
            methods.add(dump.method)
            first.append(main_thread_frames(dump.text))
        dump_s = time.monotonic() - started
        # The agent's busy probe: the same dumps BUSY_PROBE_S later, compared frame by frame.
        time.sleep(BUSY_PROBE_S)
        for local, proc in enumerate(procs):
            again = request_stack_dump(proc.pid, dump_path=workdir / f"stacks-{local}.txt", timeout_s=10.0)
            assert main_thread_frames(again.text) == first[local], "a stalled rank's main thread moved"
        to_report_s = time.monotonic() - started
        return latency / step_s, verdict.window_s / step_s, dump_s, ",".join(sorted(methods)), to_report_s
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        slots.close()


def straggler_latency(step_s: float, heartbeat_s: float) -> tuple[float, int]:
    """(seconds from the slowdown to the report, heartbeats) under a simulated clock."""
    watch = StragglerWatch(StragglerConfig(k=2.0, window_steps=5, min_samples=3))
    ranks = (0, 1, 2, 3)
    steps = dict.fromkeys(ranks, 0)
    last_end = dict.fromkeys(ranks, 0.0)
    now, beats, slowed_at = 0.0, 0, None
    while True:
        previous = now
        now += heartbeat_s
        for rank in ranks:
            while True:
                # Steps rank 1 begins after the slowdown are 3x longer.
                slow = rank == 1 and slowed_at is not None and last_end[rank] >= slowed_at
                pace_s = 3 * step_s if slow else step_s
                if last_end[rank] + pace_s > now:
                    break
                last_end[rank] += pace_s
                steps[rank] += 1
        if slowed_at is None and previous >= max(20 * step_s, 10 * heartbeat_s):
            slowed_at = last_end[1]  # rank 1 slows from its next step on
        stats = [RankStepStats(r, steps[r], steps[r], 0.0, now - last_end[r]) for r in ranks]
        watch.observe(0, stats, now)
        found = watch.check(now)
        if slowed_at is not None:
            beats += 1
        if found is not None:
            assert found.ranks == (1,), found
            assert slowed_at is not None, "a straggler before the slowdown"
            return now - slowed_at, beats


def sync_straggler_latency(step_s: float, heartbeat_s: float, workdir: Path) -> tuple[float | None, float | None]:
    """(latency / slowed step time by lead time, the same without lead times, None: never) for one
    synchronous run; the run ends 30 slowed steps after the slowdown at most."""
    out = Path(tempfile.mkdtemp(prefix="sync-", dir=workdir))
    slots = StepSlotFile(out / "steps.slots", 2)
    port = free_port()
    procs = []
    try:
        for rank in range(2):
            env = {
                **os.environ,
                STEP_SLOTS_ENV_VAR: str(slots.path),
                STEP_SLOT_ENV_VAR: str(rank),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": "2",
            }
            cmd = [sys.executable, "-c", SYNC_WORKER, str(step_s), "20", str(out)]
            procs.append(subprocess.Popen(cmd, env=env))
        steps = StepWatch({0: 0, 1: 1}, None)
        config = StragglerConfig(k=2.0, window_steps=5, min_samples=3)
        by_lead, by_step_time = StragglerWatch(config), StragglerWatch(config)
        found: dict[str, float] = {}
        next_beat = time.monotonic()
        while True:
            now = time.monotonic()
            steps.observe(slots.read_all(), now)
            slowed = float((out / "slowed").read_text()) if (out / "slowed").exists() else None
            if now >= next_beat:
                next_beat = now + heartbeat_s
                stats = steps.stats(now)
                by_lead.observe(0, stats, now)
                by_step_time.observe(0, [attrs.evolve(s, median_sync_lead_s=0.0) for s in stats], now)
                for name, watch in (("lead", by_lead), ("step", by_step_time)):
                    finding = watch.check(now)
                    if finding is not None and name not in found:
                        assert slowed is not None, f"a straggler before the slowdown: {finding.report.reason}"
                        assert finding.ranks == (1,), finding.report.reason
                        found[name] = now
            if slowed is not None and now - slowed > 30 * 3 * step_s:
                break
            assert any(p.poll() is None for p in procs), "the workers ended"
            time.sleep(MONITOR_S)
        assert slowed is not None
        slowed_step_s = 3 * step_s
        lead = (found["lead"] - slowed) / slowed_step_s if "lead" in found else None
        by_steps = (found["step"] - slowed) / slowed_step_s if "step" in found else None
        return lead, by_steps
    finally:
        (out / "stop").touch()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        slots.close()
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer step times and repeats")
    args = parser.parse_args()
    step_times = (0.05, 0.2) if args.quick else (0.05, 0.2, 0.5, 1.0)
    repeats = 1 if args.quick else 3
    print("Hang detection (real processes, real step slots; k=5, monitor interval 0.1 s)")
    print(f"{'step T (s)':>10} {'latency/T (median)':>19} {'window/T':>9} {'dump 2 ranks (s)':>17} {'method':>13} "
          f"{'+ busy probe (s)':>17} {'CPU-idle watch/T':>17}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="hangbench-") as tmp:
        for step_s in step_times:
            runs = [hang_latency(step_s, 20, Path(tmp)) for _ in range(repeats)]
            latency = statistics.median(r[0] for r in runs)
            window = statistics.median(r[1] for r in runs)
            dump_s = statistics.median(r[2] for r in runs)
            report_s = statistics.median(r[4] for r in runs)
            print(
                f"{step_s:>10.2f} {latency:>19.2f} {window:>9.2f} {dump_s:>17.3f} {runs[0][3]:>13} "
                f"{report_s:>17.3f} {180.0 / step_s:>17.0f}"
            )
    print()
    print("Straggler detection (simulated clock; rank 1 of 4 slowed 3x; factor 2, window 5, 3 samples)")
    print(f"{'step T (s)':>10} {'heartbeat (s)':>13} {'latency (s)':>12} {'latency/T':>10} {'heartbeats':>11}")
    for step_s in (0.1, 1.0):
        for heartbeat_s in (0.5, 2.0, 5.0):
            seconds, beats = straggler_latency(step_s, heartbeat_s)
            print(f"{step_s:>10.2f} {heartbeat_s:>13.1f} {seconds:>12.1f} {seconds / step_s:>10.1f} {beats:>11d}")
    print()
    print("Stragglers in a synchronous job (real gloo all-reduce; rank 1 of 2 slowed 3x; heartbeat 0.5 s)")
    print(f"{'step T (s)':>10} {'by lead time (slowed steps)':>28} {'by step time alone':>19}")
    with tempfile.TemporaryDirectory(prefix="syncbench-") as tmp:
        for step_s in (0.05, 0.2) if args.quick else (0.05, 0.2, 0.5):
            runs = [sync_straggler_latency(step_s, 0.5, Path(tmp)) for _ in range(repeats)]
            leads = [r[0] for r in runs if r[0] is not None]
            alone = [r[1] for r in runs if r[1] is not None]
            lead_text = f"{statistics.median(leads):.1f}" if leads else "never"
            alone_text = f"{statistics.median(alone):.1f}" if alone else "never"
            print(f"{step_s:>10.2f} {lead_text:>28} {alone_text:>19}")


if __name__ == "__main__":
    main()
