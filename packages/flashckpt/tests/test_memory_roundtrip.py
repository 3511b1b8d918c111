"""load(save(s)) == s bit for bit through shared memory, and through storage along the saver's own
path (slot -> rank files on disk -> load), for random nested states."""

from __future__ import annotations

import math
import tempfile
import uuid
from typing import Any

import numpy as np
import pytest
import torch
from flashckpt_testlib import assert_restores, our_files, same_bits, tied_states
from hypothesis import given
from hypothesis import strategies as st

from dlrover.flashckpt.commit import Committer
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.memory import MemoryReader
from dlrover.flashckpt.payloads import payload_from_slot
from dlrover.flashckpt.persist import persist_rank
from dlrover.flashckpt.segment import ShmSegment, segment_path
from dlrover.flashckpt.slotio import read_header
from dlrover.flashckpt.stager import Stager
from dlrover.flashckpt.storage import PosixStorage
from dlrover.flashckpt.storage_loader import StorageReader


def _config(job: str) -> StagerConfig:
    return StagerConfig(job_id=job, run_id="p", copy_threads=2, copy_chunk_bytes=64)


@given(state=tied_states())
def test_memory_roundtrip_bit_for_bit(state: Any) -> None:
    job = "h" + uuid.uuid4().hex[:12]
    cfg = _config(job)
    stager = Stager(cfg)
    try:
        result = stager.save(7, state)
        assert result.saved
        stager.flush()
        reader = MemoryReader(cfg)
        fresh = reader.load()
        assert fresh.step == 7
        assert fresh.verified
        assert_restores(state, lambda target: reader.load(target=target).state)
    finally:
        stager.close()
    assert our_files(job) == []


@given(state=tied_states())
def test_storage_roundtrip_through_the_savers_path_bit_for_bit(state: Any) -> None:
    """What a node saver does: read the sealed slot (checksums verified while streaming), write the
    rank files into a POSIX directory, commit; then load them back."""
    job = "h" + uuid.uuid4().hex[:12]
    cfg = _config(job)
    stager = Stager(cfg)
    try:
        slot = stager.save(9, state).slot
        stager.flush()
        seg = ShmSegment.attach(segment_path(cfg.shm_dir, job, "p", 0, slot))
        try:
            header = read_header(seg)
            assert header is not None
            with tempfile.TemporaryDirectory() as d:
                storage = PosixStorage(d)
                persist_rank(storage, payload_from_slot(seg, header, 0, 1))
                assert Committer(storage).try_commit(9, 1).commit
                assert_restores(state, lambda target: StorageReader(storage).load(0, 1, target=target).state)
        finally:
            seg.close()
    finally:
        stager.close()
    assert our_files(job) == []


def test_typical_training_state_roundtrip(config: StagerConfig) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    state = {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.default_rng(3).bit_generator.state},
        "np_legacy": np.random.RandomState(5).get_state(),
        "data": {"epoch": 2, "offset": 1234, "loss": float("nan")},
    }
    stager = Stager(config)
    try:
        stager.prepare(state)
        stager.save(100, state)
        stager.flush()
        loaded = MemoryReader(config).load()
        assert loaded.step == 100
        assert same_bits(state["model"], dict(loaded.state["model"]))
        assert same_bits(state["np_legacy"], loaded.state["np_legacy"])
        assert same_bits(state["optim"], loaded.state["optim"])
        # Restore into a fresh model and optimizer in place, then compare.
        model2 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)
        model2(torch.randn(4, 8)).sum().backward()
        opt2.step()
        target = {"model": model2.state_dict(), "optim": opt2.state_dict()}
        weight = model2[0].weight
        ptr = weight.data_ptr()
        MemoryReader(config).load(target={**target, **{k: state[k] for k in ("rng", "np_legacy", "data")}})
        assert weight.data_ptr() == ptr
        assert torch.equal(weight, model[0].weight)
        opt2.load_state_dict(target["optim"])
        assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    finally:
        stager.close()


@pytest.mark.parametrize("seal_in_background", [True, False])
def test_sealing_modes(job_id: str, seal_in_background: bool) -> None:
    cfg = StagerConfig(job_id=job_id, run_id="r", seal_in_background=seal_in_background)
    stager = Stager(cfg)
    try:
        stager.save(1, {"w": torch.arange(10.0)})
        stager.flush()
        snaps = MemoryReader(cfg).snapshots()
        assert [(s.step, s.sealed) for s in snaps] == [(1, True)]
    finally:
        stager.close()


@given(states=st.lists(tied_states(), min_size=2, max_size=4))
def test_consecutive_saves_each_load_bit_for_bit(states: list[Any]) -> None:
    """Saves one after another (the manifest reuses the text of entries that repeat): each loads
    as it was saved, a zero's sign included."""
    job = "h" + uuid.uuid4().hex[:12]
    cfg = _config(job)
    stager = Stager(cfg)
    try:
        for step, state in enumerate([*states, {"loss": 0.0, "lr": 1.5}, {"loss": -0.0, "lr": 1.5}]):
            assert stager.save(step, state).saved
            stager.flush()
            reader = MemoryReader(cfg)
            assert reader.load().step == step
            assert_restores(state, lambda target, reader=reader: reader.load(target=target).state)
        assert math.copysign(1.0, MemoryReader(cfg).load().state["loss"]) == -1.0
    finally:
        stager.close()
    assert our_files(job) == []
