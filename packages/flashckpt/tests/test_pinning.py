"""Pinned slots: when the stager and the reader page-lock shared memory, and that every
registration is released before its mapping goes.

The CUDA runtime is not on these machines: `FakeHostPinner` holds the runtime's rules (a range is
pinned once; only a pinned address can be unpinned) and every implementation passes the same
contract test; `CudaHostPinner` runs it where a CUDA device is visible.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from dlrover.common import ConfigError
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.memory import MemoryReader
from dlrover.flashckpt.pinning import (
    CudaErrorPending,
    CudaHostPinner,
    FakeHostPinner,
    HostPinner,
    PinError,
    _last_error_reader,
    cudart_paths,
)
from dlrover.flashckpt.segment import ShmSegment, segment_path
from dlrover.flashckpt.stager import Stager


def _state(v: float, n: int = 1000) -> dict[str, object]:
    return {"w": torch.full((n,), v), "step": int(v)}


def _fake() -> HostPinner:
    return FakeHostPinner()


def _cuda() -> HostPinner:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible: CudaHostPinner is exercised on GPU machines only")
    return CudaHostPinner()


@pytest.mark.parametrize("make", [_fake, _cuda], ids=["fake", "cuda"])
def test_pinner_contract(make: Callable[[], HostPinner], config: StagerConfig) -> None:
    pinner = make()
    path = segment_path(config.shm_dir, config.job_id, config.run_id, 0, 0)
    seg = ShmSegment.create(path, 1 << 20)
    try:
        address = seg.u8.data_ptr()
        pinner.pin(address, seg.size)
        with pytest.raises(PinError):
            pinner.pin(address, seg.size)  # pinned twice
        pinner.unpin(address)
        with pytest.raises(PinError):
            pinner.unpin(address)  # no longer pinned
        # The segment unpins itself before unmapping.
        seg.pin(pinner)
        seg.pin(pinner)  # already pinned: nothing to do
        assert seg.pinned
        seg.close()
        assert not seg.pinned
        with pytest.raises(PinError):
            pinner.unpin(address)
        if isinstance(pinner, CudaHostPinner):
            # The refusals above left no error pending on this thread for the next kernel to raise.
            torch.ones(1, device="cuda").add_(1)
            torch.cuda.synchronize()
    finally:
        seg.close()
        path.unlink(missing_ok=True)


def test_cuda_runtime_libraries_are_found_in_the_process_maps() -> None:
    maps = "\n".join(
        [
            "7f00-7f10 r-xp 00000000 08:01 11 /usr/lib/libc.so.6",
            "7f10-7f20 r-xp 00000000 08:01 12 /venv/nvidia/cuda_runtime/lib/libcudart.so.12",
            "7f20-7f30 r--p 00010000 08:01 12 /venv/nvidia/cuda_runtime/lib/libcudart.so.12",
            "7f30-7f40 r-xp 00000000 08:01 13 /venv/torch/lib/libcudart-9335f6a2.so.12 (deleted)",
            "7f40-7f50 rw-p 00000000 00:00 0 ",
            "7f50-7f60 r-xp 00000000 08:01 14 /opt/libcudart_static_helper.a",
            "7f60-7f70 r-xp 00000000 08:01 15 /opt/rocm/lib/libamdhip64.so.6",
        ]
    )
    # A runtime another library brought (mapped first here) comes after the ones torch ships.
    maps = "7e00-7e10 r-xp 00000000 08:01 10 /opt/cupy/libcudart.so.11.0\n" + maps
    assert cudart_paths(maps) == [
        "/venv/nvidia/cuda_runtime/lib/libcudart.so.12",
        "/venv/torch/lib/libcudart-9335f6a2.so.12",
        "/opt/cupy/libcudart.so.11.0",
        "/opt/rocm/lib/libamdhip64.so.6",
    ]


def test_cpu_state_pins_nothing_by_default(config: StagerConfig) -> None:
    pinner = FakeHostPinner()
    stager = Stager(config, pinner=pinner)
    try:
        stager.prepare(_state(0))
        stager.save(1, _state(1))
        stager.flush()
        assert pinner.calls == []
    finally:
        stager.close()


def test_pinned_slots_are_pinned_once_and_released_before_unmapping(config: StagerConfig) -> None:
    pinner = FakeHostPinner()
    stager = Stager(attrs_evolve(config, pin_host_memory=True), pinner=pinner)
    try:
        stager.prepare(_state(0))
        assert sorted(pinner.pinned.values()) == [seg.size for seg in _segments(stager)]
        assert len(pinner.pinned) == config.num_slots
        for step in range(1, 5):
            stager.save(step, _state(step))
        assert [c.op for c in pinner.calls] == ["pin"] * config.num_slots  # saving pins nothing more
        # A bigger state grows the slot it goes into: the old mapping is unpinned first, the new pinned.
        stager.save(5, _state(5, n=500_000))
        stager.flush()
        ops = [c.op for c in pinner.calls[config.num_slots :]]
        assert ops == ["unpin", "pin"]
        assert pinner.calls[-1].nbytes > pinner.calls[-2].nbytes
        loaded = MemoryReader(config).load()
        assert loaded.step == 5
        assert torch.equal(loaded.state["w"], torch.full((500_000,), 5.0))
    finally:
        stager.close()
    assert pinner.pinned == {}  # close released every registration


def test_a_refused_pin_is_reported_and_saving_goes_on(config: StagerConfig) -> None:
    pinner = FakeHostPinner(fail_with="out of lockable memory")
    stager = Stager(attrs_evolve(config, pin_host_memory=True), pinner=pinner)
    try:
        stager.prepare(_state(0))
        stager.save(1, _state(1))
        stager.flush()
        events = [e for e in stager.events.snapshot() if e.kind == "pin_failed"]
        assert len(events) == 1  # reported once, then pinning is off for this stager
        assert "out of lockable memory" in events[0].reason
        assert MemoryReader(config).load().step == 1
    finally:
        stager.close()


class _RuntimeThatCannotClear:
    """A pinner whose runtime refuses, with no way to take the error off the thread."""

    def __init__(self, refuse: str) -> None:
        self.refuse = refuse
        self.pins = 0

    def pin(self, address: int, nbytes: int) -> None:
        self.pins += 1
        if self.refuse == "pin":
            raise CudaErrorPending("cudaHostRegister failed with cudaError 2; nothing clears it")

    def unpin(self, address: int) -> None:
        if self.refuse == "unpin":
            raise CudaErrorPending("cudaHostUnregister failed with cudaError 1; nothing clears it")


def test_an_uncleared_runtime_error_fails_one_save_and_pinning_stops(config: StagerConfig) -> None:
    pinner = _RuntimeThatCannotClear("pin")
    stager = Stager(attrs_evolve(config, pin_host_memory=True), pinner=pinner)
    try:
        with pytest.raises(CudaErrorPending, match="nothing clears it"):
            stager.save(1, _state(1))
        assert stager.save(2, _state(2)).saved  # through pageable memory, not pinned again
        stager.flush()
        assert pinner.pins == 1
        assert MemoryReader(config).load().step == 2
    finally:
        stager.close()


def test_an_uncleared_unpin_error_still_unmaps_and_removes_every_slot(config: StagerConfig) -> None:
    stager = Stager(attrs_evolve(config, pin_host_memory=True), pinner=_RuntimeThatCannotClear("unpin"))
    stager.prepare(_state(0))
    stager.save(1, _state(1))
    stager.close()  # logs each refusal and goes on
    for slot in range(config.num_slots):
        assert not segment_path(config.shm_dir, config.job_id, config.run_id, 0, slot).exists()


def test_pinning_off_never_pins(config: StagerConfig) -> None:
    pinner = FakeHostPinner()
    stager = Stager(attrs_evolve(config, pin_host_memory=False), pinner=pinner)
    try:
        stager.save(1, _state(1))
        stager.flush()
    finally:
        stager.close()
    assert pinner.calls == []


def test_a_stager_adopting_a_pinned_mapping_does_not_pin_it_again(config: StagerConfig) -> None:
    pinner = FakeHostPinner()
    pinned = attrs_evolve(config, pin_host_memory=True)
    first = Stager(pinned, pinner=pinner)
    try:
        first.save(1, _state(1))
        first.flush()
    finally:
        first.close(remove=False)  # a crashed process leaves its snapshots
    assert pinner.pinned == {}
    # A restarted process: its reader mapped (and, for CUDA targets, pinned) the slot it loaded
    # from, and hands the mapping to the stager.
    pinner.calls.clear()
    second = Stager(pinned, pinner=pinner, owner=True)
    try:
        slot = MemoryReader(pinned).snapshots()[0].slot
        seg = ShmSegment.attach(segment_path(config.shm_dir, config.job_id, config.run_id, 0, slot))
        seg.pin(pinner)
        assert second.adopt(slot, seg)
        second.prepare(_state(0))
        second.save(2, _state(2))
        second.flush()
        assert [c.op for c in pinner.calls] == ["pin"] * config.num_slots  # the adopted slot once, the other once
    finally:
        second.close()
    assert pinner.pinned == {}


def test_config_rejects_a_non_bool_pin_choice(job_id: str) -> None:
    with pytest.raises(ConfigError, match="pin_host_memory"):
        StagerConfig(job_id=job_id, run_id="r1", pin_host_memory="yes")  # type: ignore[arg-type]


def _segments(stager: Stager) -> list[ShmSegment]:
    return [seg for seg in stager._segments if seg is not None]


def attrs_evolve(config: StagerConfig, **changes: object) -> StagerConfig:
    import attrs

    return attrs.evolve(config, **changes)


def test_a_refusal_is_cleared_through_the_runtime_torch_loaded() -> None:
    class BoundRuntime:
        cleared = 0

        def cudaGetLastError(self) -> int:
            self.cleared += 1
            return 712

    runtime = BoundRuntime()
    reader = _last_error_reader(runtime)
    assert reader is not None
    assert reader() == 712
    assert runtime.cleared == 1
    # Without a binding, the runtime is looked up among the libraries mapped here; a CPU-only
    # process maps none, and the pinner then refuses to go on rather than leave an error pending.
    if not cudart_paths(Path("/proc/self/maps").read_text()):
        assert _last_error_reader(object()) is None


def test_an_uncleared_unpin_error_during_a_resize_is_raised_with_the_segment_mapped(config: StagerConfig) -> None:
    # Mid-training (a slot grows), a pending CUDA error is this call's to report, not the next kernel's.
    path = segment_path(config.shm_dir, config.job_id, config.run_id, 0, 0)
    seg = ShmSegment.create(path, 1 << 20)
    try:
        seg.pin(_RuntimeThatCannotClear("unpin"))
        with pytest.raises(CudaErrorPending, match="nothing clears it"):
            seg.resize(2 << 20)
        assert seg.size == 2 << 20
        assert not seg.pinned
        seg.u8[-1] = 7  # the new mapping is usable
    finally:
        seg.close()
        path.unlink(missing_ok=True)


def test_slots_allocated_in_the_background_are_pinned_there_not_on_the_next_save(config: StagerConfig) -> None:
    pinner = FakeHostPinner()
    stager = Stager(attrs_evolve(config, pin_host_memory=True, prefault_in_background=True), pinner=pinner)
    try:
        stager.save(1, _state(1))  # no prepare: the first save allocates and pins its own slot
        stager.flush()  # ... and the prefault thread the others
        assert len(pinner.pinned) == config.num_slots
        pins = len(pinner.calls)
        for step in range(2, 2 + config.num_slots):
            stager.save(step, _state(step))
        stager.flush()
        assert len(pinner.calls) == pins  # no save paid for page-locking
        assert all(seg.pinned for seg in _segments(stager))
    finally:
        stager.close()
    assert pinner.pinned == {}


def test_a_pin_refused_in_the_background_is_reported_and_pinning_stops(config: StagerConfig) -> None:
    class RefusesSecond(FakeHostPinner):
        def pin(self, address: int, nbytes: int) -> None:
            if self.pinned:
                raise PinError("out of lockable memory (test)")
            super().pin(address, nbytes)

    pinner = RefusesSecond()
    stager = Stager(attrs_evolve(config, pin_host_memory=True, prefault_in_background=True), pinner=pinner)
    try:
        stager.save(1, _state(1))
        stager.flush()
        (event,) = [e for e in stager.events.snapshot() if e.kind == "pin_failed"]
        assert event.reason.startswith("slot 1: out of lockable memory (test)")
        for step in range(2, 5):
            assert stager.save(step, _state(step)).saved  # through pageable memory
        stager.flush()
        assert MemoryReader(config).load().step == 4
        assert len(pinner.pinned) == 1
    finally:
        stager.close()
