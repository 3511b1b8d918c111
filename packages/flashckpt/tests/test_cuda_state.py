"""CUDA state end to end: device -> pinned shared memory -> device, on a real GPU.

Skipped where no CUDA device is visible (CI has none); `benchmarks/flashckpt_cuda.py` measures the
same paths. What the fakes in test_pinning.py cannot show is checked here: that the copy engine
writes into a slot the CUDA runtime has registered, that a save orders itself after the kernels
queued before it and is unaffected by those queued after, that re-registering a grown slot and a
refused registration leave no CUDA error for the next kernel, that a restarted process restores
a killed one's snapshot into device tensors, and the NCCL paths (agreement, FSDP2 on the GPU).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
import torch.distributed as dist
from flashckpt_testlib import at, same_bits, tensor_places, zeros_like_state

from dlrover.flashckpt import FlashCheckpointer, MemoryReader, Stager, torch_distributed_agree
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.memory import LoadedState
from dlrover.flashckpt.pinning import CudaHostPinner, PinError

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")

MB = 1 << 20


def _device_state(seed: int) -> dict[str, Any]:
    """Device tensors of many dtypes and shapes, views of one storage, and host leaves beside them."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = torch.device("cuda")
    base = torch.randn(64, 48, device=dev, generator=g)
    state: dict[str, Any] = {
        "model": {
            "w32": torch.randn(1024, 513, device=dev, generator=g),
            "bf16": torch.randn(777, device=dev, generator=g).to(torch.bfloat16),
            "f16": torch.randn(3, 5, 7, device=dev, generator=g).half(),
            "f64": torch.randn(9, device=dev, generator=g).double(),
            "i8": torch.randint(-128, 127, (300,), device=dev, generator=g, dtype=torch.int8),
            "i64": torch.randint(-(2**40), 2**40, (33,), device=dev, generator=g),
            "mask": torch.rand(257, device=dev, generator=g) > 0.5,
            "scalar": torch.tensor(3.25, device=dev),
            "empty": torch.empty(0, 4, device=dev),
        },
        "views": {
            "transposed": base.t(),  # not contiguous
            "rows": base[5:17],  # a storage offset
            "whole": base,
        },
        "host": {"rng": torch.get_rng_state(), "cpu": torch.arange(10, dtype=torch.float32)},
        "step": seed,
        "lr": 1e-3,
    }
    state["tied"] = state["model"]["w32"]  # one tensor at two places
    return state


def _on_host(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.cpu()
    if isinstance(state, dict):
        return {k: _on_host(v) for k, v in state.items()}
    return state


def _kernel_runs() -> None:
    """A kernel and a sync: raises if a CUDA error were left pending on this thread."""
    torch.ones(8, device="cuda").mul_(2)
    torch.cuda.synchronize()


def _slots_pinned(stager: Stager) -> list[bool]:
    return [seg.pinned for seg in stager._segments if seg is not None]


def test_device_state_round_trips_through_pinned_slots_bit_for_bit(config: StagerConfig) -> None:
    state = _device_state(1)
    expected = _on_host(state)
    stager = Stager(config)  # pin_host_memory=None: pinned, since the state has device tensors
    try:
        assert stager.save(1, state).saved
        stager.flush()
        assert "pin_failed" not in stager.events.kinds()
        assert isinstance(stager.pinner, CudaHostPinner)
        assert _slots_pinned(stager)
        assert all(_slots_pinned(stager))
        reader = MemoryReader(config)
        fresh = reader.load()  # without a target a snapshot comes back in host memory
        assert fresh.step == 1
        assert fresh.verified
        assert same_bits(expected, fresh.state)
        for memo in (None, {}):  # a target whose places are apart, and one that keeps the tie
            target = zeros_like_state(state, memo)
            before = [(path, t, t.data_ptr()) for path, t in tensor_places(target)]
            restored = reader.load(target=target).state
            assert same_bits(expected, _on_host(restored))
            assert all(at(restored, path) is t and t.data_ptr() == ptr for path, t, ptr in before)
        _kernel_runs()
    finally:
        stager.close()
    _kernel_runs()


def test_a_save_sees_the_kernels_queued_before_it_and_not_those_after(config: StagerConfig) -> None:
    """The copy waits for the current stream (the caller's, here a side stream) without the
    caller synchronising, and `save` returns only when the bytes are in the slot."""
    x = torch.zeros(16 * MB // 4, device="cuda")
    slow = torch.randn(8192, 8192, device="cuda")
    user_stream = torch.cuda.Stream()
    stager = Stager(config)
    try:
        stager.prepare({"x": x})
        user_stream.wait_stream(torch.cuda.current_stream())  # x and slow are written
        with torch.cuda.stream(user_stream):
            for _ in range(3):
                slow_out = slow @ slow  # keeps the stream busy well past save()'s own host work
            x.fill_(1.0)
            x[0] = slow_out[0, 0] * 0 + 1  # the last write depends on the slow kernels
            stager.save(1, {"x": x})
            x.fill_(2.0)  # queued after save returned: not in the snapshot
        user_stream.synchronize()
        stager.flush()
        loaded = MemoryReader(config).load()
        assert torch.equal(loaded.state["x"], torch.ones_like(x, device="cpu"))
        assert torch.all(x == 2.0)
    finally:
        stager.close()


def test_a_grown_device_state_is_registered_again_and_no_error_is_left_pending(config: StagerConfig) -> None:
    stager = Stager(config)
    try:
        for step in range(1, 4):
            stager.save(step, {"w": torch.full((1000,), float(step), device="cuda")})
        sizes = [seg.size for seg in stager._segments if seg is not None]
        big = {"w": torch.full((4 * MB,), 9.0, device="cuda"), "b": torch.ones(3, device="cuda")}
        stager.save(4, big)
        stager.save(5, big)  # the other slot grows too
        stager.flush()
        grown = [seg.size for seg in stager._segments if seg is not None]
        assert all(g > s for g, s in zip(grown, sizes, strict=True))
        assert all(_slots_pinned(stager))
        assert "pin_failed" not in stager.events.kinds()
        _kernel_runs()
        target = {"w": torch.zeros(4 * MB, device="cuda"), "b": torch.zeros(3, device="cuda")}
        loaded = MemoryReader(config).load(target=target)
        assert loaded.step == 5
        assert loaded.state is target
        assert torch.equal(target["w"], big["w"])
        assert torch.equal(target["b"], big["b"])
    finally:
        stager.close()
    _kernel_runs()


def test_pageable_slots_round_trip(config: StagerConfig) -> None:
    pageable = attrs.evolve(config, pin_host_memory=False)
    state = _device_state(2)
    stager = Stager(pageable)
    try:
        stager.save(1, state)
        stager.flush()
        assert stager.pinner is None
        assert not any(_slots_pinned(stager))
        target = _device_state(3)
        restored = MemoryReader(pageable).load(target=target).state
        assert same_bits(_on_host(state), _on_host(restored))
    finally:
        stager.close()


class _RegisteredTwice:
    """The real runtime, made to refuse: each range is registered, then registered again
    (cudaErrorHostMemoryAlreadyRegistered), and the first registration is released."""

    def __init__(self) -> None:
        self.real = CudaHostPinner()
        self.refusals: list[str] = []

    def pin(self, address: int, nbytes: int) -> None:
        self.real.pin(address, nbytes)
        try:
            self.real.pin(address, nbytes)
        except PinError as e:
            self.refusals.append(str(e))
            raise
        finally:
            self.real.unpin(address)

    def unpin(self, address: int) -> None:
        self.real.unpin(address)


def test_a_refused_registration_falls_back_to_pageable_copies_and_the_next_kernel_runs(config: StagerConfig) -> None:
    pinner = _RegisteredTwice()
    stager = Stager(config, pinner=pinner)
    try:
        state = _device_state(4)
        assert stager.save(1, state).saved
        _kernel_runs()  # the refusal's error was taken off the thread
        assert len(pinner.refusals) == 1
        assert stager.save(2, state).saved
        stager.flush()
        assert [e.kind for e in stager.events.snapshot()].count("pin_failed") == 1
        assert not any(_slots_pinned(stager))
        target = _device_state(5)
        loaded = MemoryReader(config).load(target=target)
        assert loaded.step == 2
        assert same_bits(_on_host(state), _on_host(loaded.state))
    finally:
        stager.close()
    _kernel_runs()


_KILLED_TRAINER = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from dlrover.flashckpt import Stager
    from dlrover.flashckpt.config import StagerConfig

    config = StagerConfig(job_id=sys.argv[1], run_id="r1", copy_threads=2)
    stager = Stager(config)
    for step in (1, 2, 3):
        torch.manual_seed(step)
        state = {"w": torch.randn(2048, 1024, device="cuda"), "step": step}
        stager.save(step, state)
    stager.flush()
    print("sealed", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.timeout(120)
def test_a_restarted_process_restores_a_killed_ones_snapshot_into_device_tensors(config: StagerConfig) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_TRAINER, config.job_id],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "sealed" in proc.stdout
    torch.manual_seed(3)
    expected = torch.randn(2048, 1024, device="cuda")
    target: dict[str, Any] = {"w": torch.zeros(2048, 1024, device="cuda"), "step": 0}
    ptr = target["w"].data_ptr()
    stager = Stager(config, owner=True)  # the restarted trainer; removes the run's slots on close
    try:
        loaded = MemoryReader(config).load(target=target)
        assert loaded.step == 3
        assert loaded.verified
        assert loaded.state["step"] == 3
        assert target["w"].data_ptr() == ptr
        assert torch.equal(target["w"], expected)
        _kernel_runs()
    finally:
        stager.close()


@pytest.fixture
def nccl_world_of_one(tmp_path: Path) -> Any:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_a_checkpointer_over_nccl_persists_and_loads_device_state(
    config: StagerConfig, tmp_path: Path, nccl_world_of_one: None
) -> None:
    state = _device_state(6)
    ckpt = FlashCheckpointer(config, str(tmp_path / "ckpt"), saver="none", agree=torch_distributed_agree())
    try:
        assert ckpt.save(1, state, persist=True).saved  # saver="none": persisted and committed here
        ckpt.save(2, state)
        target = _device_state(7)
        loaded = ckpt.load(target)
        assert (loaded.source, loaded.step) == ("memory", 2)
        assert same_bits(_on_host(state), _on_host(loaded.state))
    finally:
        ckpt.close(job_end=True)
    # A fresh run (no memory): the committed step, from storage, into device tensors.
    again = FlashCheckpointer(
        attrs.evolve(config, run_id="r2"), str(tmp_path / "ckpt"), saver="none", agree=torch_distributed_agree()
    )
    try:
        target = _device_state(8)
        loaded = again.load(target)
        assert (loaded.source, loaded.step) == ("storage", 1)
        assert same_bits(_on_host(state), _on_host(loaded.state))
    finally:
        again.close(job_end=True)
    _kernel_runs()


@pytest.mark.timeout(120)
def test_fsdp2_on_the_gpu_restores_from_memory_and_from_storage(
    config: StagerConfig, tmp_path: Path, nccl_world_of_one: None
) -> None:
    from flashckpt_sharded_worker import build

    from dlrover.flashckpt import ShardedCheckpointer, get_sharded_state, set_sharded_state

    def snapshot(model: torch.nn.Module) -> list[torch.Tensor]:
        return [p.full_tensor().detach().cpu() for p in model.parameters()]  # type: ignore[attr-defined]

    def restore(ckpt: ShardedCheckpointer, seed: int) -> tuple[LoadedState, list[torch.Tensor]]:
        """Load into a model built from another seed; the load and the restored parameters."""
        model, opt = build(1, seed, 2, "cuda")
        target = get_sharded_state(model, opt)
        target["step"] = -1
        loaded = ckpt.load(target)
        set_sharded_state(model, opt, loaded.state)
        return loaded, snapshot(model)

    storage = str(tmp_path / "dcp")
    model, opt = build(1, 0, 2, "cuda")
    ckpt = ShardedCheckpointer(config, storage, saver="none")
    try:
        for step in (1, 2):
            model(torch.randn(4, 8, device="cuda")).square().mean().backward()
            opt.step()
            opt.zero_grad()
            state = get_sharded_state(model, opt)
            state["step"] = step
            ckpt.save(step, state)
            if step == 1:
                assert ckpt.persist(1).commit
                at_step_1 = snapshot(model)
        loaded, params = restore(ckpt, 99)
        assert (loaded.source, loaded.step, loaded.state["step"]) == ("memory", 2, 2)
        assert all(torch.equal(a, b) for a, b in zip(params, snapshot(model), strict=True))
    finally:
        ckpt.close(remove=True)
    fresh = ShardedCheckpointer(attrs.evolve(config, run_id="r2"), storage, saver="none")
    try:
        loaded, params = restore(fresh, 98)
        assert (loaded.source, loaded.step, loaded.state["step"]) == ("storage", 1, 1)
        assert all(torch.equal(a, b) for a, b in zip(params, at_step_1, strict=True))
    finally:
        fresh.close(remove=True)
    _kernel_runs()
