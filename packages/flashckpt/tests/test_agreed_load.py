"""Every rank of a multi-rank `FlashCheckpointer.load` ends on the same step.

The ranks run on threads of one process; their agree function is an in-process collective with
the rule of `torch_distributed_agree` (the newest step in every rank's list, each list cut to
`num_slots` steps), so the tests need no process group. `test_ddp.py` runs the real one over gloo.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from dlrover.flashckpt import FlashCheckpointer, InMemoryStorage, StagerConfig
from dlrover.flashckpt.ckpt_format import safetensors_path
from dlrover.flashckpt.commit import Committer
from dlrover.flashckpt.dist import common_newest
from dlrover.flashckpt.errors import FlashCkptError, NoCheckpointError, StateStructureError, StorageError
from dlrover.flashckpt.payloads import payload_from_state
from dlrover.flashckpt.persist import persist_rank
from dlrover.flashckpt.segment import ShmSegment, segment_path
from dlrover.flashckpt.slotio import read_header
from dlrover.flashckpt.storage_loader import StorageReader

WORLD = 2


class ThreadCollective:
    """`torch_distributed_agree`'s rule for ranks that are threads: gather every list, then answer."""

    def __init__(self, world: int) -> None:
        self._barrier = threading.Barrier(world, timeout=30)
        self._lists: list[list[int]] = [[] for _ in range(world)]
        self.calls = 0

    def agree_for(self, rank: int) -> Callable[[list[int]], int | None]:
        def agree(steps: list[int]) -> int | None:
            self._lists[rank] = sorted(steps, reverse=True)
            self._barrier.wait()
            answer = common_newest(self._lists)
            if rank == 0:
                self.calls += 1
            self._barrier.wait()  # nobody overwrites a list before every rank has read them
            return answer

        return agree


def _state(step: int, rank: int) -> dict[str, Any]:
    return {"w": torch.full((64,), float(step * 10 + rank)), "step": step}


class Job:
    """Storage with steps committed by both ranks, and one checkpointer per rank on it."""

    def __init__(self, job_id: str, shm: Path, storages: list[InMemoryStorage] | None = None) -> None:
        self.job_id, self.shm = job_id, shm
        self.storage = InMemoryStorage()
        self.storages = storages or [self.storage] * WORLD  # each rank's view of storage
        collective = ThreadCollective(WORLD)
        self.ckpts: list[FlashCheckpointer] = []
        try:
            for rank in range(WORLD):
                config = StagerConfig(job_id=job_id, run_id="r", rank=rank, world_size=WORLD, shm_dir=str(shm))
                self.ckpts.append(
                    FlashCheckpointer(
                        config, storage=self.storages[rank], saver="none", agree=collective.agree_for(rank)
                    )
                )
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for c in self.ckpts:
            c.close(job_end=True)

    def commit(self, *steps: int, into: InMemoryStorage | None = None) -> None:
        storage = into or self.storage
        for step in steps:
            for rank in range(WORLD):
                persist_rank(storage, payload_from_state(step, rank, WORLD, _state(step, rank)))
            assert Committer(storage).try_commit(step, WORLD).commit

    def damage_file(self, step: int, rank: int) -> None:
        f = safetensors_path(step, rank)
        self.storage.corrupt(f, self.storage.size(f) - 3)

    def snapshot(self, step: int) -> None:
        """Every rank saves `step` in memory only."""
        for rank, c in enumerate(self.ckpts):
            c.save(step, _state(step, rank))
            c.stager.flush()

    def load(self, targets: list[Any]) -> list[Any]:
        """Every rank loads into its target at once; the states, or the exceptions raised."""
        return _on_every_rank(lambda r: self.ckpts[r].load(target=targets[r]))

    def fallbacks(self, rank: int) -> list[str]:
        return [e.reason for e in self.ckpts[rank].events.snapshot() if e.kind == "fallback"]


def _on_every_rank(fn: Callable[[int], Any]) -> list[Any]:
    """fn(rank) on one thread per rank; the results, or the exceptions raised, in rank order."""

    def guarded(rank: int) -> Any:
        try:
            return fn(rank)
        except Exception as e:
            return e

    with ThreadPoolExecutor(WORLD) as pool:
        return list(pool.map(guarded, range(WORLD)))


@pytest.fixture
def job(job_id: str, tmp_path: Path) -> Iterator[Job]:
    shm = tmp_path / "shm"
    shm.mkdir()
    j = Job(job_id, shm)
    yield j
    j.close()


def test_a_file_damaged_on_one_rank_moves_every_rank_to_the_previous_step(job: Job) -> None:
    job.commit(1, 2)
    job.damage_file(2, 0)
    targets = [_state(0, r) for r in range(WORLD)]
    loaded = job.load(targets)
    assert [(x.source, x.step) for x in loaded] == [("storage", 1), ("storage", 1)]
    for rank, target in enumerate(targets):
        assert torch.equal(target["w"], _state(1, rank)["w"])
    # Both ranks say why: rank 0 names its damaged file, rank 1 that another rank could not load.
    assert any("rank_00000.safetensors" in reason for reason in job.fallbacks(0))
    assert any("another rank" in reason for reason in job.fallbacks(1))


def test_ranks_whose_listings_differ_by_many_steps_load_the_newest_step_all_list(job_id: str, tmp_path: Path) -> None:
    # Each rank reads its own copy of storage; rank 0's holds four steps rank 1's never got.
    storages = [InMemoryStorage(), InMemoryStorage()]
    shm = tmp_path / "shm"
    shm.mkdir()
    job = Job(job_id, shm, storages)
    try:
        job.commit(1, 2, 3, 4, 5, 6, into=storages[0])
        job.commit(1, 2, into=storages[1])
        targets = [_state(0, r) for r in range(WORLD)]
        loaded = job.load(targets)
        assert [(x.source, x.step) for x in loaded] == [("storage", 2), ("storage", 2)]
        for rank, target in enumerate(targets):
            assert torch.equal(target["w"], _state(2, rank)["w"])
    finally:
        job.close()


def test_a_snapshot_damaged_on_one_rank_sends_every_rank_to_storage(job: Job) -> None:
    job.commit(1)
    job.snapshot(2)
    seg = ShmSegment.attach(segment_path(str(job.shm), job.job_id, "r", 1, 0))
    header = read_header(seg)
    assert header is not None
    assert header.step == 2
    seg.mm[header.data_off] ^= 0xFF
    seg.close()
    targets = [_state(0, r) for r in range(WORLD)]
    loaded = job.load(targets)
    assert [(x.source, x.step) for x in loaded] == [("storage", 1), ("storage", 1)]
    for rank, target in enumerate(targets):
        assert torch.equal(target["w"], _state(1, rank)["w"])  # rank 0's memory copy was overwritten


def test_memory_is_used_when_every_rank_holds_the_step(job: Job) -> None:
    job.commit(1)
    job.snapshot(2)
    loaded = job.load([_state(0, r) for r in range(WORLD)])
    assert [(x.source, x.step) for x in loaded] == [("memory", 2), ("memory", 2)]


def test_every_rank_raises_when_one_cannot_use_any_step(job: Job) -> None:
    job.commit(1)
    wrong = {"w": torch.zeros(3), "step": 0}  # rank 1's model does not fit the checkpoint
    results = job.load([_state(0, 0), wrong])
    assert isinstance(results[1], StateStructureError)
    assert isinstance(results[0], FlashCkptError)
    assert "another rank" in str(results[0])


def test_every_rank_raises_no_checkpoint_when_none_is_loadable_everywhere(job: Job) -> None:
    job.commit(1)
    job.damage_file(1, 1)
    results = job.load([_state(0, r) for r in range(WORLD)])
    assert all(isinstance(r, NoCheckpointError) for r in results), results


def test_an_error_from_outside_flashckpt_on_one_rank_fails_every_rank_instead_of_hanging(
    job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not a flashckpt error (say torch refusing a copy): rank 0 must not wait for a verdict
    # rank 1 never sends.
    job.commit(1)
    real_load = StorageReader.load

    def load(self: StorageReader, rank: int, *args: Any, **kwargs: Any) -> Any:
        if rank == 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real_load(self, rank, *args, **kwargs)

    monkeypatch.setattr(StorageReader, "load", load)
    results = job.load([_state(0, r) for r in range(WORLD)])
    assert isinstance(results[1], RuntimeError)
    assert "illegal memory access" in str(results[1])
    assert isinstance(results[0], FlashCkptError)
    assert "another rank" in str(results[0])


class _UnlistableStorage(InMemoryStorage):
    def list_dir(self, path: str) -> list[str]:
        raise StorageError(f"listing {path!r}: permission denied")


def test_a_rank_that_cannot_list_storage_fails_every_rank_instead_of_hanging(job_id: str, tmp_path: Path) -> None:
    shared = InMemoryStorage()
    shm = tmp_path / "shm"
    shm.mkdir()
    job = Job(job_id, shm, [shared, _UnlistableStorage()])
    try:
        job.commit(1, into=shared)
        results = job.load([_state(0, r) for r in range(WORLD)])
        assert isinstance(results[1], StorageError)
        assert "permission denied" in str(results[1])
        assert isinstance(results[0], NoCheckpointError)
    finally:
        job.close()
