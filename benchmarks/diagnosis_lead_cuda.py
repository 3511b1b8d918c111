"""What a rank's lead time shows on CUDA: a slow GPU and a slow input pipeline (issue 27).

    python benchmarks/diagnosis_lead_cuda.py [--steps 40] [--extra-ms 20]

The master finds a straggler of a synchronous job by its lead: the time from a step's start to
its first gradient synchronization (`dlrover.diagnosis.report_gradient_sync`). One process, an
NCCL world of one, a stack of 4096-wide bf16 linear layers under DDP, its leads read from a real
step slot. Conditions, each a fresh model trained ``--steps`` steps after 5 warm-up steps:

* healthy;
* slow GPU: the forward also runs matrix products worth ``--extra-ms`` of device time (timed
  alone with CUDA events), queued as a degraded or throttled GPU would take longer;
* slow input: the step sleeps ``--extra-ms`` on the CPU before its forward (a slow loader).

each timed on the CPU alone (the device timing switched off) and with the device timing (what
`report_gradient_sync` does for a CUDA model), and each in a loop that reads its loss every step
(``loss.item()``: the CPU waits for the device) and one that never does (the CPU runs ahead).

The ratio reported is (the condition's lead - the healthy lead) / the slowness injected: 1.0
means the lead grew by all of it, 0 that it saw none. Beside them, the time per step with the
hook against torch's ``allreduce_hook`` registered alone (the peer: any Python hook), healthy,
median of ``--rounds`` rounds.

Needs a CUDA device; elsewhere it says so and exits 0 (``--dry-run-on-cpu`` runs the same code
small on the CPU with gloo, where only the CPU's timing exists, to check the script itself).
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
from dlrover.diagnosis import ddp_sync, report_gradient_sync

_WARMUP = 5


class _Model(torch.nn.Module):
    """Linear layers; `slow_products` extra matrix products in the forward make the GPU slow."""

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
        self.slow_products = 0
        self.scratch = torch.empty(0)  # set on the device by `_products_for`'s caller

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.slow_products):
            torch.mm(self.scratch[0], self.scratch[1], out=self.scratch[2])
        return self.layers(x)


def _products_for(extra_s: float, scratch: torch.Tensor) -> tuple[int, float]:
    """How many extra products make `extra_s` of device time, and the time they take."""
    for _ in range(10):
        torch.mm(scratch[0], scratch[1], out=scratch[2])
    if scratch.is_cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            torch.mm(scratch[0], scratch[1], out=scratch[2])
        end.record()
        end.synchronize()
        one = start.elapsed_time(end) / 1000.0 / 50
    else:
        began = time.perf_counter()
        for _ in range(50):
            torch.mm(scratch[0], scratch[1], out=scratch[2])
        one = (time.perf_counter() - began) / 50
    products = max(1, round(extra_s / one))
    return products, products * one


class _Setup:
    """Where the conditions train: the device, the model's size, its scratch for the products."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        cuda = device.type == "cuda"
        self.width, self.layers, self.batch = (4096, 8, 2048) if cuda else (256, 4, 64)
        self.dtype = torch.bfloat16 if cuda else torch.float32
        self.scratch = torch.rand(3, self.width, self.width, device=device, dtype=self.dtype)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def _train(
    setup: _Setup,
    reporter: StepReporter,
    slots: StepSlotFile,
    register: Callable[[DistributedDataParallel], object],
    *,
    steps: int,
    slow_products: int = 0,
    input_sleep_s: float = 0.0,
    read_loss: bool,
) -> tuple[float | None, float]:
    """(mean lead per step or None where nothing marked leads, seconds per step) of one condition."""
    torch.manual_seed(0)
    module = _Model(setup.width, setup.layers).to(device=setup.device, dtype=setup.dtype)
    module.scratch = setup.scratch
    model = DistributedDataParallel(module, device_ids=[0] if setup.device.type == "cuda" else None)
    register(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(setup.batch, setup.width, device=setup.device, dtype=setup.dtype)

    def step(slow: bool) -> None:
        if slow and input_sleep_s:
            time.sleep(input_sleep_s)
        module.slow_products = slow_products if slow else 0
        optimizer.zero_grad(set_to_none=True)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        if read_loss:
            loss.item()
        reporter.step()

    for _ in range(_WARMUP):
        step(False)
    setup.synchronize()
    before = slots.read(0)
    started = time.perf_counter()
    for _ in range(steps):
        step(True)
    setup.synchronize()
    per_step = (time.perf_counter() - started) / steps
    after = slots.read(0)
    assert before is not None
    assert after is not None
    leads = after.lead_steps - before.lead_steps
    return ((after.lead_s - before.lead_s) / leads if leads > 0 else None), per_step


def _lead(value: float | None) -> float:
    if value is None:
        raise SystemExit("the hook counted no lead: is the model training under report_gradient_sync?")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--extra-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dry-run-on-cpu", action="store_true", help="check the script on the CPU (gloo)")
    args = parser.parse_args()
    if args.dry_run_on_cpu:
        device, backend = torch.device("cpu"), "gloo"
    elif torch.cuda.is_available():
        device, backend = torch.device("cuda", 0), "nccl"
        torch.cuda.set_device(device)
    else:
        print("diagnosis_lead_cuda: no CUDA device here; nothing measured")
        return
    setup = _Setup(device)
    products, gpu_extra_s = _products_for(args.extra_ms / 1000.0, setup.scratch)
    cpu_extra_s = args.extra_ms / 1000.0
    original = ddp_sync._device_leads
    with tempfile.TemporaryDirectory(prefix="lead-cuda-") as tmp:
        store = dist.FileStore(str(Path(tmp) / "store"), 1)
        extra = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, store=store, rank=0, world_size=1, **extra)  # type: ignore[arg-type]
        slots = StepSlotFile(Path(tmp) / "slots", 1)
        reporter = StepReporter(slots.path, 0)
        try:
            name = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU (dry run)"
            print(f"{name}, torch {torch.__version__}, {backend} world of one; "
                  f"slow GPU: {products} extra products = {gpu_extra_s * 1e3:.1f} ms of device time; "
                  f"slow input: {cpu_extra_s * 1e3:.1f} ms asleep")  # fmt: skip
            print("lead per step (ms) and the share of the slowness it shows")
            print(
                f"  {'timing':<14}{'loop':<16}{'healthy':>9}{'slow GPU':>10}{'ratio':>7}{'slow input':>12}{'ratio':>7}"
            )
            for timing in ("CPU only", "CPU + device"):
                ddp_sync._device_leads = original if timing == "CPU + device" else (lambda model: None)  # type: ignore[assignment]
                for read_loss in (True, False):

                    def run(read_loss: bool = read_loss, **slow: float) -> float:
                        hook = lambda m: report_gradient_sync(m, reporter)  # noqa: E731
                        lead = _train(setup, reporter, slots, hook, steps=args.steps, read_loss=read_loss, **slow)[0]  # type: ignore[arg-type]
                        return _lead(lead)

                    healthy = run()
                    slow_gpu = run(slow_products=products)
                    slow_input = run(input_sleep_s=cpu_extra_s)
                    loop = "loss.item()" if read_loss else "never waits"
                    print(f"  {timing:<14}{loop:<16}{healthy * 1e3:9.2f}{slow_gpu * 1e3:10.2f}"
                          f"{(slow_gpu - healthy) / gpu_extra_s:7.2f}{slow_input * 1e3:12.2f}"
                          f"{(slow_input - healthy) / cpu_extra_s:7.2f}")  # fmt: skip
            ddp_sync._device_leads = original  # type: ignore[assignment]
            ways: dict[str, Callable[[DistributedDataParallel], object]] = {
                "allreduce_hook (the peer)": lambda m: m.register_comm_hook(None, allreduce_hook),
                "report_gradient_sync": lambda m: report_gradient_sync(m, reporter),
            }
            per_step: dict[str, list[float]] = {name: [] for name in ways}
            for round_number in range(args.rounds):
                for name in list(ways)[round_number % 2 :] + list(ways)[: round_number % 2]:
                    per_step[name].append(
                        _train(setup, reporter, slots, ways[name], steps=args.steps, read_loss=True)[1]
                    )
            peer = statistics.median(per_step["allreduce_hook (the peer)"])
            print(f"time per step, healthy, loss.item() each step, median of {args.rounds} rounds")
            for name, values in per_step.items():
                value = statistics.median(values)
                print(f"  {name:<28}{value * 1e3:8.3f} ms  {value / peer:.3f}x the peer")
        finally:
            ddp_sync._device_leads = original  # type: ignore[assignment]
            reporter.close()
            slots.close()
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
