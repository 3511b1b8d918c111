"""FlashCheckpointer in one process (saver='none'): memory first, storage after the memory is gone."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from flashckpt_testlib import our_files

from dlrover.common import ConfigError
from dlrover.flashckpt import FlashCheckpointer, StagerConfig
from dlrover.flashckpt.ckpt_format import safetensors_path
from dlrover.flashckpt.commit import Committer, RetentionPolicy
from dlrover.flashckpt.errors import FlashCkptError, NoCheckpointError
from dlrover.flashckpt.memory import MemoryReader
from dlrover.flashckpt.saver_link import coordinator_node
from dlrover.flashckpt.segment import ShmSegment


def _state(step: int) -> dict[str, object]:
    return {"model": {"w": torch.full((4, 4), float(step))}, "step": step}


def test_memory_then_storage(job_id: str, tmp_path: Path) -> None:
    cfg = StagerConfig(job_id=job_id, run_id="r")
    ckpt = FlashCheckpointer(cfg, str(tmp_path), saver="none", retention=RetentionPolicy(keep_last=1))
    try:
        state = _state(0)
        ckpt.prepare(state)
        with pytest.raises(NoCheckpointError):
            ckpt.load()
        for step in (1, 2, 3):
            state = _state(step)
            ckpt.save(step, state, persist=step != 3)
        assert Committer(ckpt.storage).steps() == ([2], [])
        target = _state(0)
        loaded = ckpt.load(target=target)
        assert (loaded.source, loaded.step) == ("memory", 3)
        assert torch.equal(target["model"]["w"], torch.full((4, 4), 3.0))  # type: ignore[index]
        with pytest.raises(FlashCkptError, match="no saver"):
            ckpt.wait_persisted(2)
    finally:
        ckpt.close(job_end=True)
    # The job ended: its memory is gone, so a new process falls back to storage.
    again = FlashCheckpointer(cfg, str(tmp_path), saver="none")
    try:
        target = _state(0)
        loaded = again.load(target=target)
        assert (loaded.source, loaded.step) == ("storage", 2)
        assert target["step"] == 2
    finally:
        again.close(job_end=True)


def _tied_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(64, 32), "head": torch.nn.Linear(32, 64, bias=False)})
    model["head"].weight = model["emb"].weight
    return model


def test_tied_weights_are_stored_once_and_stay_tied(job_id: str, tmp_path: Path) -> None:
    from safetensors import safe_open

    model = _tied_model(0)
    state = {"model": model.state_dict(), "step": 1}
    ckpt = FlashCheckpointer(StagerConfig(job_id=job_id, run_id="r"), str(tmp_path), saver="none")
    try:
        ckpt.save(1, state, persist=True)
        with safe_open(str(tmp_path / safetensors_path(1, 0)), "pt") as f:
            assert list(f.keys()) == ["model/emb.weight"]  # one copy on disk, under the first name
        fresh = ckpt.load().state["model"]
        assert fresh["head.weight"] is fresh["emb.weight"]
        assert torch.equal(fresh["emb.weight"], model["emb"].weight)
        restored = _tied_model(1)
        ckpt.load(target={"model": restored.state_dict(), "step": 0})
        assert restored["head"].weight is restored["emb"].weight
        assert torch.equal(restored["emb"].weight, model["emb"].weight)
    finally:
        ckpt.close(job_end=True)
    again = FlashCheckpointer(StagerConfig(job_id=job_id, run_id="r"), str(tmp_path), saver="none")
    try:
        loaded = again.load()
        assert loaded.source == "storage"
        assert loaded.state["model"]["head.weight"] is loaded.state["model"]["emb.weight"]
        untied = torch.nn.ModuleDict({"emb": torch.nn.Embedding(64, 32), "head": torch.nn.Linear(32, 64, bias=False)})
        again.load(target={"model": untied.state_dict(), "step": 0})
        assert torch.equal(untied["head"].weight, model["emb"].weight)
        assert torch.equal(untied["emb"].weight, model["emb"].weight)
    finally:
        again.close(job_end=True)


def test_a_tie_the_snapshot_does_not_hold_keeps_the_first_value_and_says_so(
    job_id: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    untied = torch.nn.ModuleDict({"emb": torch.nn.Embedding(64, 32), "head": torch.nn.Linear(32, 64, bias=False)})
    ckpt = FlashCheckpointer(StagerConfig(job_id=job_id, run_id="r"), str(tmp_path), saver="none")
    try:
        ckpt.save(1, {"model": untied.state_dict()}, persist=True)
        for source in ("memory", "storage"):
            tied = _tied_model(3)
            if source == "storage":
                ckpt.close(job_end=True)  # the memory goes: storage it is
                ckpt = FlashCheckpointer(StagerConfig(job_id=job_id, run_id="r"), str(tmp_path), saver="none")
            with caplog.at_level(logging.WARNING, logger="dlrover.flashckpt"):
                loaded = ckpt.load(target={"model": tied.state_dict()})
            assert loaded.source == source
            assert torch.equal(tied["emb"].weight, untied["emb"].weight)  # the first name's value, in both
            assert any("'model/head.weight' (kept 'model/emb.weight')" in r.getMessage() for r in caplog.records)
            caplog.clear()
        assert any(e.kind == "tie_conflict" for e in ckpt.events.snapshot())
    finally:
        ckpt.close(job_end=True)


def test_close_keeps_memory_and_only_job_end_removes_it(job_id: str, tmp_path: Path) -> None:
    cfg = StagerConfig(job_id=job_id, run_id="r")
    first = FlashCheckpointer(cfg, str(tmp_path), saver="none")
    first.save(4, _state(4))
    first.close()  # a plain close (a process about to restart): the snapshot stays
    assert our_files(job_id) != []
    second = FlashCheckpointer(cfg, str(tmp_path), saver="none")
    try:
        target = _state(0)
        loaded = second.load(target=target)
        assert (loaded.source, loaded.step) == ("memory", 4)
        assert torch.equal(target["model"]["w"], torch.full((4, 4), 4.0))  # type: ignore[index]
    finally:
        second.close(job_end=True)
    assert our_files(job_id) == []


def test_a_restored_slot_is_mapped_once_for_the_load_and_the_saves_after(
    job_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A restarted process maps the slot it loads from; its stager takes that mapping over rather
    # than mapping (and pre-faulting) the same bytes again for the saves that follow.
    cfg = StagerConfig(job_id=job_id, run_id="r")
    first = FlashCheckpointer(cfg, str(tmp_path), saver="none")
    for step in (3, 4):
        first.save(step, _state(step))
    first.close()
    attached: list[str] = []
    attach = ShmSegment.attach

    def counting(path: Path) -> ShmSegment:
        attached.append(Path(path).name)
        return attach(path)

    monkeypatch.setattr(ShmSegment, "attach", counting)
    second = FlashCheckpointer(cfg, str(tmp_path), saver="none")
    try:
        target = _state(0)
        assert second.load(target=target).step == 4
        for step in (5, 6, 7):
            assert second.save(step, _state(step)).saved
        second.stager.flush()
        assert sorted(attached) == sorted(set(attached))  # no slot was mapped twice
        assert len(attached) == 2
        monkeypatch.undo()
        check = _state(0)
        assert MemoryReader(cfg).load(target=check).step == 7  # the adopted slot took the saves
        assert torch.equal(check["model"]["w"], torch.full((4, 4), 7.0))  # type: ignore[index]
        assert sorted(s.step for s in MemoryReader(cfg).snapshots()) == [6, 7]
    finally:
        second.close(job_end=True)
    assert our_files(job_id) == []


def test_bad_construction(job_id: str, tmp_path: Path) -> None:
    cfg = StagerConfig(job_id=job_id, run_id="r")
    with pytest.raises(ConfigError, match="storage_dir or storage"):
        FlashCheckpointer(cfg, saver="none")
    with pytest.raises(ConfigError, match="'sometimes'"):
        FlashCheckpointer(cfg, str(tmp_path / "x"), saver="sometimes")  # type: ignore[arg-type]
    assert not (tmp_path / "x").exists()  # nothing was created for a refused configuration


def test_several_ranks_without_agree_agree_over_the_default_group_once_it_exists(job_id: str, tmp_path: Path) -> None:
    # Built before init_process_group is fine; loading without a process group names what is missing.
    ckpt = FlashCheckpointer(StagerConfig(job_id=job_id, run_id="r", world_size=2), str(tmp_path / "x"), saver="none")
    try:
        with pytest.raises(ConfigError, match=r"world size 2 \(from the StagerConfig\).*init_process_group"):
            ckpt.load()
    finally:
        ckpt.close(job_end=True)


def test_damaged_memory_snapshot_falls_back_to_storage(job_id: str, tmp_path: Path) -> None:
    from dlrover.flashckpt.segment import ShmSegment, segment_path
    from dlrover.flashckpt.slotio import read_header

    cfg = StagerConfig(job_id=job_id, run_id="r")
    ckpt = FlashCheckpointer(cfg, str(tmp_path), saver="none")
    try:
        ckpt.save(1, _state(1), persist=True)
        ckpt.save(2, _state(2))
        ckpt.stager.flush()
        seg = ShmSegment.attach(segment_path(cfg.shm_dir, job_id, "r", 0, 1))
        header = read_header(seg)
        assert header is not None
        assert header.step == 2
        seg.mm[header.data_off] ^= 0xFF
        seg.close()
        loaded = ckpt.load(target=_state(0))
        assert (loaded.source, loaded.step) == ("storage", 1)
        assert any(e.kind == "fallback" and "step 2" in e.reason for e in ckpt.events.snapshot())
    finally:
        ckpt.close(job_end=True)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"GROUP_RANK": "0", "RANK": "5", "LOCAL_RANK": "1"}, True),  # torchrun / dlrover-run: the node rank
        ({"GROUP_RANK": "2", "RANK": "1", "LOCAL_RANK": "1"}, False),
        ({"RANK": "3", "LOCAL_RANK": "3"}, True),  # DeepSpeed's launcher: rank 0 is on this node
        ({"RANK": "8", "LOCAL_RANK": "0"}, False),
        ({"SLURM_NODEID": "0"}, True),  # srun alone
        ({"SLURM_NODEID": "1"}, False),
        ({}, True),  # one process, one node
        ({"GROUP_RANK": "", "RANK": "x", "SLURM_NODEID": "3"}, False),  # malformed values are skipped
    ],
)
def test_the_node_of_rank_0_coordinates_whatever_the_launcher(env: dict[str, str], expected: bool) -> None:
    coordinates, why = coordinator_node(env)
    assert coordinates is expected
    assert why


def test_under_dlrover_run_every_save_marks_a_step_in_the_agents_step_slots(
    job_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlrover.common.step_slots import STEP_SLOT_ENV_VAR, STEP_SLOTS_ENV_VAR, StepSlotFile

    slots = StepSlotFile(tmp_path / "steps.slots", 2)
    monkeypatch.setenv(STEP_SLOTS_ENV_VAR, str(slots.path))
    monkeypatch.setenv(STEP_SLOT_ENV_VAR, "1")
    ckpt = FlashCheckpointer(StagerConfig(job_id=job_id, run_id="r"), str(tmp_path / "store"), saver="none")
    try:
        ckpt.save(3, _state(3))
        ckpt.save(7, _state(7))
        reading = slots.read(1)
        assert reading is not None
        assert reading.step == 7
        assert slots.read(0) is None
        # Persisting in the training process is a checkpoint phase, back to training after it.
        ckpt.save(9, _state(9), persist=True)
        after = slots.read(1)
        assert after is not None
        assert (after.step, after.phase) == (9, "train")
        assert after.phase_since_s >= after.step_end_s
        assert after.seq >= reading.seq + 6  # the step, into checkpoint, back to train
    finally:
        ckpt.close(job_end=True)
        slots.close()


def test_a_save_during_eval_returns_to_eval(job_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dlrover.common.step_slots import STEP_SLOT_ENV_VAR, STEP_SLOTS_ENV_VAR, StepReporter, StepSlotFile

    slots = StepSlotFile(tmp_path / "steps.slots", 1)
    monkeypatch.setenv(STEP_SLOTS_ENV_VAR, str(slots.path))
    monkeypatch.setenv(STEP_SLOT_ENV_VAR, "0")
    script = StepReporter.from_env()  # the training script's own writer of the same slot
    assert script is not None
    ckpt = FlashCheckpointer(StagerConfig(job_id=job_id, run_id="r"), str(tmp_path / "store"), saver="none")
    try:
        script.step(4)
        script.phase("eval")
        before = slots.read(0)
        assert before is not None
        ckpt.save(4, _state(4), persist=True)
        during_eval = slots.read(0)
        assert during_eval is not None
        assert during_eval.phase == "eval"  # the eval's hang allowance still applies
        assert during_eval.seq >= before.seq + 8  # into a checkpoint phase and back out, for the copy and the persist
        script.phase("train")
        ckpt.save(5, _state(5))
        after = slots.read(0)
        assert after is not None
        assert (after.step, after.phase) == (5, "train")
    finally:
        ckpt.close(job_end=True)
        script.close()
        slots.close()


def test_save_requested_answers_the_agents_request_once_until_a_save_serves_it(
    job_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlrover.common.step_slots import STEP_SLOT_ENV_VAR, STEP_SLOTS_ENV_VAR, StepSlotFile

    slots = StepSlotFile(tmp_path / "steps.slots", 1)
    slots.request_save()  # a request made before this worker started is not for it
    monkeypatch.setenv(STEP_SLOTS_ENV_VAR, str(slots.path))
    monkeypatch.setenv(STEP_SLOT_ENV_VAR, "0")
    ckpt = FlashCheckpointer(StagerConfig(job_id=job_id, run_id="r"), str(tmp_path / "store"), saver="none")
    try:
        # Until the script asks, the agent does not count on an answer (it stops it at once).
        before = slots.read(0)
        assert before is None or not before.polls_save_requests
        assert not ckpt.save_requested()
        assert slots.read(0).polls_save_requests  # type: ignore[union-attr]
        assert not ckpt.round_pending()
        ckpt.save(1, _state(1))
        assert not ckpt.round_pending()  # the old request was not this worker's to answer
        assert slots.read(0).served_request == 0  # type: ignore[union-attr]
        slots.request_save()
        assert ckpt.save_requested()
        assert ckpt.save_requested()  # asking changes nothing; a save does
        ckpt.save(2, _state(2))
        assert not ckpt.save_requested()
        assert ckpt.round_pending()
        assert slots.read(0).served_request == 2  # type: ignore[union-attr]  # what the agent waits for
        assert slots.request_save() == 3
        assert ckpt.save_requested()
    finally:
        ckpt.close(job_end=True)
        slots.close()


def test_save_requested_is_false_outside_dlrover_run(
    job_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlrover.common.step_slots import STEP_SLOTS_ENV_VAR

    monkeypatch.delenv(STEP_SLOTS_ENV_VAR, raising=False)
    ckpt = FlashCheckpointer(StagerConfig(job_id=job_id, run_id="r"), str(tmp_path / "store"), saver="none")
    try:
        assert not ckpt.save_requested()
    finally:
        ckpt.close(job_end=True)
