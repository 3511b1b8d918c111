"""A DDP model marks each step's first gradient synchronization in its step slot (real DDP, gloo)."""

from __future__ import annotations

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


@pytest.fixture
def world_of_one(tmp_path: Path) -> Iterator[None]:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


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
    finally:
        dist.destroy_process_group()
    with pytest.raises(ConfigError, match="DistributedDataParallel"):
        report_gradient_sync(torch.nn.Linear(2, 2))
