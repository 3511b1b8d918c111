"""The transformers Trainer callback with a tiny randomly initialised GPT-2 (no download)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from dlrover.flashckpt import Committer, FlashCheckpointer, StagerConfig  # noqa: E402
from dlrover.flashckpt.errors import StateStructureError  # noqa: E402
from dlrover.flashckpt.hf import FlashCheckpointCallback, load_trainer_state  # noqa: E402


def _model() -> torch.nn.Module:
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=16, vocab_size=32)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


class _Data(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.arange(8) * (i + 1) % 32
        return {"input_ids": ids, "labels": ids}


def test_trainer_snapshots_memory_every_step_and_storage_every_two(job_id: str, tmp_path: Path) -> None:
    ckpt = FlashCheckpointer(StagerConfig(job_id=job_id, run_id="r"), str(tmp_path / "ck"), saver="none")
    try:
        callback = FlashCheckpointCallback(ckpt, memory_every=1, storage_every=2)
        model = _model()
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"),
            max_steps=4,
            per_device_train_batch_size=4,
            learning_rate=1e-2,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            logging_steps=1,
            dataloader_num_workers=0,
        )
        trainer = transformers.Trainer(model=model, args=args, train_dataset=_Data(), callbacks=[callback])
        trainer.train()
        assert callback.saved_steps == [1, 2, 3, 4]
        committed, _ = Committer(ckpt.storage).steps()
        assert committed == [2, 4]

        fresh = _model()
        torch.manual_seed(1)
        for p in fresh.parameters():
            p.data.normal_()
        # A restarted job: a new Trainer builds its optimizer (same parameter groups), then loads.
        trainer2 = transformers.Trainer(model=fresh, args=args, train_dataset=_Data())
        opt = trainer2.create_optimizer()
        trainer_state, loaded = load_trainer_state(ckpt, fresh, opt)
        assert (loaded.source, loaded.step, trainer_state["global_step"]) == ("memory", 4, 4)
        # on_step_end runs before the Trainer logs that step: steps 1-3 are in the history.
        assert [round(e["epoch"], 3) for e in trainer_state["log_history"]] == [0.125, 0.25, 0.375]
        for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
            assert torch.equal(a, b), name
        before = trainer.optimizer.state_dict()["state"]
        after = opt.state_dict()["state"]
        assert before.keys() == after.keys()
        for k in before:
            assert torch.equal(before[k]["exp_avg"], after[k]["exp_avg"])
    finally:
        ckpt.close(job_end=True)


def test_bad_intervals(job_id: str, tmp_path: Path) -> None:
    ckpt = FlashCheckpointer(StagerConfig(job_id=job_id, run_id="r"), str(tmp_path), saver="none")
    try:
        with pytest.raises(StateStructureError, match="memory_every"):
            FlashCheckpointCallback(ckpt, memory_every=0)
        with pytest.raises(StateStructureError, match="storage_every"):
            FlashCheckpointCallback(ckpt, memory_every=2, storage_every=3)
    finally:
        ckpt.close(job_end=True)
