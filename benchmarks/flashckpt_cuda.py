"""Flash checkpoint of CUDA tensors: device -> pinned shared memory, and back.

Each row is beside the physical limit measured in the same run: a raw copy of the same tensors
between the device and a warm pinned host buffer (``torch.empty(..., pin_memory=True)``), which
is what the copy engine can do over this link.

* blocking save, first and steady, with the slots pinned (default for CUDA state) and with
  ``pin_host_memory=False`` (the driver's pageable path), beside the raw device -> pinned copy;
* restore from memory into the existing device tensors (mapping, registering and, by default,
  verifying the slot: what a restarted process pays) beside the raw pinned -> device copy;
* the first and second save of a script that never calls `prepare` (the second slot is
  allocated and pinned in the background after the first save).

Needs a CUDA device; elsewhere it says so and exits 0.

    python benchmarks/flashckpt_cuda.py               # 256 MB, 1 GB and 4 GB
    python benchmarks/flashckpt_cuda.py --sizes 256   # MB
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from typing import Any

import attrs
import torch

from dlrover.flashckpt import MemoryReader, Stager, StagerConfig, remove_run

MB = 1 << 20


def make_state(total_bytes: int, device: torch.device) -> dict[str, Any]:
    """16 MB matrices plus small tensors and scalars on `device` (about `total_bytes`)."""
    big = 16 * MB
    n = max(1, total_bytes // big)
    state: dict[str, Any] = {f"layer{i}.weight": torch.randn(big // 4, device=device) for i in range(n)}
    state["small"] = {f"bias{i}": torch.randn(256, device=device) for i in range(64)}
    state["meta"] = {"step": 0}
    return state


def tensors_of(state: dict[str, Any]) -> list[torch.Tensor]:
    out = [v for v in state.values() if isinstance(v, torch.Tensor)]
    return out + list(state["small"].values())


def timed(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def best(fn: Callable[[], object], reps: int) -> float:
    return min(timed(fn) for _ in range(reps))


def bench(size_mb: int, reps: int) -> list[tuple[str, float, float]]:
    device = torch.device("cuda", torch.cuda.current_device())
    state = make_state(size_mb * MB, device)
    tensors = tensors_of(state)
    pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]

    def raw_d2h() -> None:
        for dst, src in zip(pinned, tensors, strict=True):
            dst.copy_(src, non_blocking=True)

    def raw_h2d() -> None:
        for dst, src in zip(tensors, pinned, strict=True):
            dst.copy_(src, non_blocking=True)

    raw_d2h()  # warm the buffers and the copy engine
    d2h = best(raw_d2h, reps)
    h2d = best(raw_h2d, reps)
    rows = bench_stager(size_mb, state, None, reps=reps, d2h=d2h, h2d=h2d)
    rows += bench_unprepared(size_mb, state, d2h=d2h)
    rows += bench_stager(size_mb, state, False, reps=reps, d2h=d2h, h2d=h2d)
    rows.append((f"{size_mb} MB raw device -> pinned copy (limit)", d2h, 1.0))
    rows.append((f"{size_mb} MB raw pinned -> device copy (limit)", h2d, 1.0))
    return rows


def bench_stager(
    size_mb: int, state: dict[str, Any], pin: bool | None, *, reps: int, d2h: float, h2d: float
) -> list[tuple[str, float, float]]:
    label = "pageable slots" if pin is False else "pinned slots"
    config = StagerConfig(job_id="bcuda" + uuid.uuid4().hex[:8], run_id="r1", pin_host_memory=pin)
    stager = Stager(config)
    try:
        prepare_s = timed(lambda: stager.prepare(state))  # pins and pre-faults, before any save
        first_save = timed(lambda: stager.save(1, state))
        stager.flush()
        steadies = []
        for step in range(2, 2 + reps):
            steadies.append(timed(lambda: stager.save(step, state)))  # noqa: B023 (called at once)
            stager.flush()  # sealing (the CRC pass) is not the save's; a training step outlasts it
        steady = min(steadies)
        if "pin_failed" in stager.events.kinds():
            label = "pin refused: pageable slots"
        rows = [
            (f"{size_mb} MB save, first ({label})", first_save, first_save / d2h),
            (f"{size_mb} MB save, steady ({label})", steady, steady / d2h),
            (f"{size_mb} MB prepare ({label}), once", prepare_s, prepare_s / d2h),
        ]
        # A restarted process's load: it maps the slot (and, unless pageable, registers it with
        # the driver, which a stager then adopts), verifies the checksums and copies.
        for verify in (True, False):
            reader = MemoryReader(attrs.evolve(config, verify_on_load=verify))
            restore = best(lambda: reader.load(target=state), reps)  # noqa: B023 (called at once)
            what = "CRC verified" if verify else "no CRC"
            rows.append((f"{size_mb} MB restore into device tensors ({label}, {what})", restore, restore / h2d))
        return rows
    finally:
        stager.close()
        remove_run(config.shm_dir, config.job_id, config.run_id)


def bench_unprepared(size_mb: int, state: dict[str, Any], *, d2h: float) -> list[tuple[str, float, float]]:
    """A script that never calls `prepare`: the first save allocates and pins its slot; the
    other slot is allocated and pinned in the background, so the second save costs a steady one."""
    config = StagerConfig(job_id="bcuda" + uuid.uuid4().hex[:8], run_id="r1")
    stager = Stager(config)
    try:
        first = timed(lambda: stager.save(1, state))
        stager.flush()  # the background allocation: a training step outlasts it
        second = timed(lambda: stager.save(2, state))
        stager.flush()
        return [
            (f"{size_mb} MB save, first without prepare (pinned slots)", first, first / d2h),
            (f"{size_mb} MB save, second without prepare (pinned slots)", second, second / d2h),
        ]
    finally:
        stager.close()
        remove_run(config.shm_dir, config.job_id, config.run_id)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096], help="state sizes in MB")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("flashckpt_cuda: no CUDA device visible; nothing measured")
        return 0
    print(f"device: {torch.cuda.get_device_name()}")
    print(f"{'what':<72} {'seconds':>9} {'x limit':>8}")
    for size in args.sizes:
        for what, seconds, ratio in bench(size, args.reps):
            print(f"{what:<72} {seconds:9.4f} {ratio:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
