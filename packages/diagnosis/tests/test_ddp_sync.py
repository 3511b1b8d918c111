"""A DDP model marks each step's first gradient synchronization in its step slot (real DDP, gloo)."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlrover.common import ConfigError
from dlrover.common.step_slots import StepReporter, StepSlotFile

# Before the helper: it imports torch, which the package's isolation run (no extras) lacks.
torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from dlrover.diagnosis import report_gradient_sync  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _destroy_group() -> None:
    """End the default group once no DDP model holds it. A model that outlives the group takes the
    group with it when it is freed, with the interpreter lock held, and a gloo thread finishing an
    all-reduce needs that lock to free the work's Python state: both wait for ever (about once in a
    few hundred runs here). Collecting first frees the models, and their cycles, while the group
    still lives."""
    gc.collect()
    dist.destroy_process_group()


@pytest.fixture
def world_of_one(tmp_path: Path) -> Iterator[None]:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        _destroy_group()


class SlowForward(torch.nn.Module):
    """Two layers in separate gradient buckets; the forward takes `work_s`."""

    def __init__(self, work_s: float) -> None:
        super().__init__()
        self.first = torch.nn.Linear(256, 256)
        self.second = torch.nn.Linear(256, 1)
        self.work_s = work_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.work_s)
        return self.second(torch.relu(self.first(x)))


@pytest.mark.usefixtures("world_of_one")
def test_each_step_marks_its_first_gradient_bucket_and_the_lead_covers_the_ranks_work(tmp_path: Path) -> None:
    slots = StepSlotFile(tmp_path / "slots", 1)
    reporter = StepReporter(slots.path, 0)
    try:
        module = SlowForward(work_s=0.05)
        model = torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=0.1)  # several buckets
        assert report_gradient_sync(model, reporter)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        for step in range(1, 6):
            optimizer.zero_grad()
            model(torch.ones(4, 256)).sum().backward()
            optimizer.step()
            reporter.step(step)
        reading = slots.read(0)
        assert reading is not None
        # Steps 3-5 (the first two warm up): one lead each however many buckets, in group 0.
        assert reading.lead_steps == 3
        assert reading.lead_s / reading.lead_steps >= 0.05  # at least the forward's own work
        assert reading.sync_group == 0
        # The wrapped all-reduce still ran: the model trained.
        assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
        # A reporter that can no longer write stops reporting, not training.
        reporter.close()
        model(torch.ones(4, 256)).sum().backward()
        model(torch.ones(4, 256)).sum().backward()
    finally:
        reporter.close()
        slots.close()


@pytest.mark.usefixtures("world_of_one")
def test_a_hook_of_ones_own_runs_after_the_mark(tmp_path: Path) -> None:
    slots = StepSlotFile(tmp_path / "slots", 1)
    reporter = StepReporter(slots.path, 0)
    calls: list[str] = []

    def own_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP refuses postponed annotations
        calls.append(str(state))
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    try:
        model = torch.nn.parallel.DistributedDataParallel(SlowForward(work_s=0.0))
        assert report_gradient_sync(model, reporter, hook=own_hook, state="mine")
        reporter.step(1)
        reporter.step(2)
        model(torch.ones(2, 256)).sum().backward()
        assert calls
        assert set(calls) == {"mine"}
        reading = slots.read(0)
        assert reading is not None
        assert reading.lead_steps == 1
    finally:
        reporter.close()
        slots.close()


def test_without_dlrover_run_the_model_is_left_alone_and_a_plain_module_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("DLROVER_STEP_SLOTS", raising=False)
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(SlowForward(work_s=0.0))
        assert report_gradient_sync(model) is False
        model(torch.ones(2, 256)).sum().backward()  # DDP's own reduction, untouched
        del model
    finally:
        _destroy_group()
    with pytest.raises(ConfigError, match="DistributedDataParallel"):
        report_gradient_sync(torch.nn.Linear(2, 2))


class FakeDevice:
    """An accelerator's queue: work is queued at once and runs in order; an event is reached when
    the work queued before it is done (on the wall clock, so that the events complete on their own)."""

    def __init__(self) -> None:
        self.busy_until = 0.0
        self.events = 0

    def queue(self, seconds: float) -> None:
        self.busy_until = max(time.monotonic(), self.busy_until) + seconds

    def event(self) -> FakeDeviceEvent:
        return FakeDeviceEvent(self)


class FakeDeviceEvent:
    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.at: float | None = None

    def record(self) -> None:
        self.device.events += 1
        self.at = max(time.monotonic(), self.device.busy_until)

    def query(self) -> bool:
        return self.at is not None and self.at <= time.monotonic()

    def elapsed_time(self, end_event: FakeDeviceEvent) -> float:
        assert self.at is not None
        assert end_event.at is not None
        return (end_event.at - self.at) * 1000.0


class DeviceForward(SlowForward):
    """A forward that queues `device_s` of work on a fake device and returns at once, as on CUDA."""

    def __init__(self, device: FakeDevice, device_s: float) -> None:
        super().__init__(work_s=0.0)
        self.device, self.device_s = device, device_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.device.queue(self.device_s)
        return super().forward(x)


@pytest.mark.usefixtures("world_of_one")
def test_on_an_accelerator_the_lead_is_the_devices_when_it_is_longer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CUDA path with a fake device (events are all it reads): a GPU slow in its forward makes
    # the lead long although the CPU queued the work at once.
    from dlrover.diagnosis import ddp_sync
    from dlrover.diagnosis.device_leads import DeviceLeads

    device = FakeDevice()
    created: list[DeviceLeads] = []

    def fake_device_leads(model: torch.nn.Module) -> DeviceLeads:
        created.append(DeviceLeads(device.event))
        return created[-1]

    monkeypatch.setattr(ddp_sync, "_device_leads", fake_device_leads)
    slots = StepSlotFile(tmp_path / "slots", 1)
    reporter = StepReporter(slots.path, 0)
    forward_s = 0.2
    try:
        model = torch.nn.parallel.DistributedDataParallel(DeviceForward(device, forward_s))
        assert report_gradient_sync(model, reporter)
        for step in range(1, 8):
            model(torch.ones(2, 256)).sum().backward()
            reporter.step(step)
            with torch.no_grad():
                model(torch.ones(2, 256))  # an evaluation's forward opens no step
            while device.busy_until > time.monotonic():  # the test lets the device catch up
                time.sleep(0.05)
        reading = slots.read(0)
        assert reading is not None
        assert reading.lead_steps == 5  # steps 3-7
        # Every counted step but the newest has its device time written: at least its forward each.
        assert created[0].pending == 1
        assert reading.lead_s >= (reading.lead_steps - 1) * forward_s
        assert device.events == 7 + 5  # a start per training forward, a first bucket per counted step
    finally:
        reporter.close()
        slots.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_gpu_slow_in_its_forward_has_a_long_lead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A real GPU, NCCL: the forward queues extra matrix products (their device time timed with
    # CUDA events), the CPU returns at once. The CPU alone does not see the slow GPU; the lead with
    # the device's timing grows by (nearly) all of it.
    from dlrover.diagnosis import ddp_sync

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    scratch = torch.rand(3, 8192, 8192, device=device, dtype=torch.bfloat16)
    products = 20
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.mm(scratch[0], scratch[1], out=scratch[2])
    start.record()
    for _ in range(products):
        torch.mm(scratch[0], scratch[1], out=scratch[2])
    end.record()
    end.synchronize()
    slow_s = start.elapsed_time(end) / 1000.0

    class GpuForward(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(1024, 1024)
            self.products = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(self.products):
                torch.mm(scratch[0], scratch[1], out=scratch[2])
            return self.linear(x)

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=device)
    slots = StepSlotFile(tmp_path / "slots", 1)
    reporter = StepReporter(slots.path, 0)

    def lead(slow_products: int, steps: int = 12) -> float:
        module = GpuForward().to(device)
        model = torch.nn.parallel.DistributedDataParallel(module, device_ids=[0])
        assert report_gradient_sync(model, reporter)
        x = torch.ones(64, 1024, device=device)

        def train(slow: bool) -> None:
            module.products = slow_products if slow else 0
            loss = model(x).sum()
            loss.backward()
            loss.item()  # the script logs its loss: the CPU waits for the device at each step's end
            reporter.step()

        for _ in range(3):
            train(False)
        before = slots.read(0)
        for _ in range(steps):
            train(True)
        train(False)  # its lead carries the last slow step's device time
        after = slots.read(0)
        assert before is not None
        assert after is not None
        return (after.lead_s - before.lead_s) / (after.lead_steps - before.lead_steps)

    try:
        reporter.step(1)  # past the slot's first steps, which count no lead
        reporter.step(2)
        with_device = lead(products) - lead(0)
        monkeypatch.setattr(ddp_sync, "_device_leads", lambda model: None)
        cpu_only = lead(products) - lead(0)
        assert with_device >= 0.7 * slow_s, (with_device, slow_s)
        assert cpu_only < 0.5 * slow_s, (cpu_only, slow_s)
    finally:
        reporter.close()
        slots.close()
        _destroy_group()


@pytest.mark.usefixtures("world_of_one")
def test_with_gradient_accumulation_the_lead_covers_every_micro_batch_of_the_step(tmp_path: Path) -> None:
    slots = StepSlotFile(tmp_path / "slots", 1)
    reporter = StepReporter(slots.path, 0)
    try:
        model = torch.nn.parallel.DistributedDataParallel(SlowForward(work_s=0.03))
        assert report_gradient_sync(model, reporter)
        for step in range(1, 6):
            with model.no_sync():  # the first micro-batch: DDP does not synchronize
                model(torch.ones(2, 256)).sum().backward()
            model(torch.ones(2, 256)).sum().backward()
            reporter.step(step)
        reading = slots.read(0)
        assert reading is not None
        assert reading.lead_steps == 3
        assert reading.lead_s / reading.lead_steps >= 0.06  # both micro-batches' forwards
    finally:
        reporter.close()
        slots.close()
