"""torch adapters over a real ShardService: DataLoader(num_workers=2), interrupted and resumed.

Every index must be trained exactly once across the interrupted run and the resumed one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, Dataset  # noqa: E402

from dlrover.common import ConfigError, RetryPolicy  # noqa: E402
from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource  # noqa: E402
from dlrover.shard.client import ShardClient, ShardClientConfig  # noqa: E402
from dlrover.shard.torch_data import ShardSampler  # noqa: E402

pytestmark = pytest.mark.integration

N = 200
CFG = ShardClientConfig(retry=RetryPolicy(call_timeout_s=20, total_timeout_s=60), prefetch_shards=1)


def _spec() -> DatasetSpec:
    return DatasetSpec(
        name="ds",
        source=IndexSource(N),
        batch_size=8,
        batches_per_shard=2,
        shuffle=True,
        shuffle_samples=True,
        seed=11,
        delivery=DeliveryMode.EXACTLY_ONCE,
        lease_timeout_s=120.0,
    )


class _Identity(Dataset[int]):
    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> int:
        return index


@pytest.mark.timeout(120)
def test_sampler_with_two_loader_workers_resumes_without_repeating_or_skipping(shard_server: Any, token: str) -> None:
    server, _ = shard_server
    trained: list[int] = []
    with ShardClient(server.address, token, "ds", "trainer-a", config=CFG) as client:
        client.register(_spec())
        sampler = ShardSampler(client)
        loader = DataLoader(_Identity(), batch_size=5, sampler=sampler, num_workers=2)
        it = iter(loader)
        for _ in range(11):  # 55 samples: the interruption falls inside a shard
            batch = next(it)
            trained.extend(batch.tolist())
            sampler.commit(len(batch))
        state = sampler.state_dict()
        del it  # the interruption: loader workers stop, prefetched indices are never trained
    with ShardClient(server.address, token, "ds", "trainer-b", config=CFG) as client:
        sampler = ShardSampler(client)
        sampler.load_state_dict(state)
        loader = DataLoader(_Identity(), batch_size=5, sampler=sampler, num_workers=2, persistent_workers=True)
        for _pass in range(50):
            for batch in loader:
                trained.extend(batch.tolist())
                sampler.commit(len(batch))
            if sampler.finished:
                break
        assert sampler.finished
        assert client.status().finished
        del loader
    assert len(trained) == N
    assert sorted(trained) == list(range(N))


@pytest.mark.timeout(120)
def test_iterable_dataset_with_two_forkserver_loader_workers_resumes_exactly(shard_server: Any, token: str) -> None:
    server, _ = shard_server
    with ShardClient(server.address, token, "ds", "setup", config=CFG) as client:
        client.register(_spec())
    script = Path(__file__).with_name("_iterable_trainer.py")
    env = {**os.environ, "DLROVER_JOB_TOKEN": token}
    proc = subprocess.run(
        [sys.executable, str(script), server.address, "ds"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    trained = json.loads(proc.stdout.strip().splitlines()[-1])["trained"]
    assert len(trained) == N
    assert sorted(trained) == list(range(N))


def test_state_of_another_dataset_or_version_is_refused(shard_server: Any, token: str) -> None:
    server, _ = shard_server
    with ShardClient(server.address, token, "ds", "a", config=CFG) as client:
        client.register(_spec())
        sampler = ShardSampler(client)
        state = sampler.state_dict()
        with pytest.raises(ConfigError, match="version 9"):
            sampler.load_state_dict({**state, "version": 9})
        with pytest.raises(ConfigError, match="not 'ds'"):
            sampler.load_state_dict({**state, "dataset": "other"})
        with pytest.raises(ConfigError, match="cannot commit 1 samples"):
            sampler.commit(1)


@pytest.mark.timeout(120)
def test_under_dlrover_run_committed_samples_reach_the_agents_step_slots(
    shard_server: Any, token: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlrover.common.step_slots import STEP_SLOT_ENV_VAR, STEP_SLOTS_ENV_VAR, StepSlotFile

    slots = StepSlotFile(tmp_path / "steps.slots", 1)
    monkeypatch.setenv(STEP_SLOTS_ENV_VAR, str(slots.path))
    monkeypatch.setenv(STEP_SLOT_ENV_VAR, "0")
    server, _ = shard_server
    try:
        with ShardClient(server.address, token, "ds", "trainer-s", config=CFG) as client:
            client.register(_spec())
            sampler = ShardSampler(client)
            it = iter(sampler)
            for _ in range(7):
                next(it)
            sampler.commit(4)
            sampler.commit(3)
        reading = slots.read(0)
        assert reading is not None
        assert (reading.samples, reading.step) == (7, 0)
    finally:
        slots.close()
