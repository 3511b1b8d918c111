"""What `report_gradient_sync` costs a DDP training step (issue 27's runtime stragglers).

    python benchmarks/diagnosis_ddp_hook.py [--quick]

The GPT example's model (`examples/gpt/model.py`) under DDP in one process (gloo, world of one,
one torch thread so the machine's other load moves the numbers least), trained three ways in turn,
round after round so each sees the same load: DDP without a hook (its reducer's own all-reduce),
torch's ``allreduce_hook`` registered as a Python communication hook (the peer: what any Python
hook costs), and `report_gradient_sync`'s hook (a step slot mark before that same all-reduce).
Each round trains ``--steps`` steps after 5 warm-up steps, marking every step in a real step slot
file as `dlrover-run`'s workers do; CPU seconds per step (``time.process_time``), median over the
rounds, each round in another order. The ratio to the peer is the price of the mark itself, which
is microseconds a bucket: on this machine the runs' spread (about 10 %) is far larger, so the
ratio says the hook costs less than that spread, not how much less.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from dlrover.common.step_slots import StepReporter, StepSlotFile
from dlrover.diagnosis import report_gradient_sync

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "gpt"))
from model import CharGPT


def _cpu_per_step(model: DistributedDataParallel, reporter: StepReporter, steps: int) -> float:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs = torch.randint(0, 60, (16, 64))
    targets = torch.randint(0, 60, (16, 64))

    def one() -> None:
        optimizer.zero_grad(set_to_none=True)
        _, loss = model(inputs, targets)
        loss.backward()
        optimizer.step()
        reporter.step()

    for _ in range(5):
        one()
    started = time.process_time()
    for _ in range(steps):
        one()
    return (time.process_time() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    rounds, steps = (3, 20) if args.quick else (args.rounds, args.steps)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="ddp-hook-") as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(str(Path(tmp) / "store"), 1), rank=0, world_size=1)
        slots = StepSlotFile(Path(tmp) / "slots", 1)
        reporter = StepReporter(slots.path, 0)
        try:
            ways: dict[str, Callable[[DistributedDataParallel], object]] = {
                "no hook (DDP's own all-reduce)": lambda m: None,
                "allreduce_hook (the peer)": lambda m: m.register_comm_hook(None, allreduce_hook),
                "report_gradient_sync": lambda m: report_gradient_sync(m, reporter),
            }
            cpu: dict[str, list[float]] = {name: [] for name in ways}
            names = list(ways)
            for round_number in range(rounds):
                # Each round in another order: no way always runs first or last.
                for name in names[round_number % 3 :] + names[: round_number % 3]:
                    hook = ways[name]
                    torch.manual_seed(0)
                    model = DistributedDataParallel(CharGPT(context=64, width=128, layers=4, heads=4))
                    hook(model)
                    cpu[name].append(_cpu_per_step(model, reporter, steps))
            reading = slots.read(0)
            assert reading is not None
            assert reading.lead_steps > 0, "the hook marked no lead"
        finally:
            reporter.close()
            slots.close()
            dist.destroy_process_group()
    peer = statistics.median(cpu["allreduce_hook (the peer)"])
    print(f"CPU per step, {rounds} rounds of {steps} steps, medians (range)")
    for name, values in cpu.items():
        median = statistics.median(values)
        print(f"  {name:<32} {median * 1e3:7.2f} ms ({min(values) * 1e3:.1f}..{max(values) * 1e3:.1f})  "
              f"{median / peer:.3f}x the peer")  # fmt: skip


if __name__ == "__main__":
    main()
