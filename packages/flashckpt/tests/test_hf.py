"""The transformers Trainer callback with a tiny randomly initialised GPT-2 (no download)."""

from __future__ import annotations

import gc
import logging
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import safetensors
import torch

transformers = pytest.importorskip("transformers")

from flashckpt_testlib import SHM, same_bits  # noqa: E402

from dlrover.flashckpt import Committer, FlashCheckpointer, StagerConfig  # noqa: E402
from dlrover.flashckpt.errors import FlashCkptError, StateStructureError  # noqa: E402
from dlrover.flashckpt.hf import FlashCheckpointCallback, _untied, load_trainer_state  # noqa: E402

pytestmark = pytest.mark.timeout(120)

RESUME_PREFIX = "dlrover-hfresume-"
TOTAL_STEPS = 12  # 8 steps an epoch: 32 samples, batches of 4


def _model(seed: int = 0, dropout: float | None = None, n_embd: int = 16) -> torch.nn.Module:
    extra = {} if dropout is None else {"resid_pdrop": dropout, "embd_pdrop": dropout, "attn_pdrop": dropout}
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=n_embd, n_positions=16, vocab_size=32, **extra)
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(config)


def _resume_dirs() -> list[Path]:
    """This process's resume directories in shared memory or the temp dir (none after a test).

    Their names start with the owner's pid (`dlrover.common.owned_temp_dir`): other engineers'
    test runs may hold theirs at the same time.
    """
    mine = f"{RESUME_PREFIX}{os.getpid()}-*"
    return sorted(p for d in {SHM, tempfile.gettempdir()} for p in Path(d).glob(mine))


@pytest.fixture(autouse=True)
def _one_thread_and_no_dirs_left() -> Iterator[None]:
    # One intra-op thread: the tiny model is faster that way on a shared 2-core machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    before = set(_resume_dirs())
    try:
        yield
    finally:
        torch.set_num_threads(threads)
    assert set(_resume_dirs()) - before == set(), "resume directory left behind"


@pytest.fixture
def ckpt(job_id: str, tmp_path: Path) -> Iterator[FlashCheckpointer]:
    """A rank's checkpointer without a saver process (persists, if asked, in this process)."""
    checkpointer = FlashCheckpointer(StagerConfig(job_id=job_id, run_id="r"), str(tmp_path / "ck"), saver="none")
    yield checkpointer
    checkpointer.close(job_end=True)


class _Data(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.arange(8) * (i + 1) % 32
        return {"input_ids": ids, "labels": ids}


def test_trainer_snapshots_memory_every_step_and_storage_every_two(ckpt: FlashCheckpointer, tmp_path: Path) -> None:
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


def test_bad_intervals(ckpt: FlashCheckpointer) -> None:
    with pytest.raises(StateStructureError, match="memory_every"):
        FlashCheckpointCallback(ckpt, memory_every=0)
    with pytest.raises(StateStructureError, match="storage_every"):
        FlashCheckpointCallback(ckpt, memory_every=2, storage_every=3)


def _args(out: Path) -> Any:
    return transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=TOTAL_STEPS,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        logging_steps=1,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=7,
    )


class _Crash(Exception):
    pass


class _Steps(transformers.TrainerCallback):  # type: ignore[misc,unused-ignore]
    """Records each optimizer step; with `crash_at`, raises right after that step (and its snapshot)."""

    def __init__(self, crash_at: int = 0) -> None:
        self.crash_at = crash_at
        self.steps: list[int] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps.append(state.global_step)
        if state.global_step == self.crash_at:
            raise _Crash(f"killed after step {state.global_step}")


_FAULT_FREE: dict[float, Any] = {}


def _fault_free(dropout: float, tmp_path: Path) -> Any:
    """The trainer of an uninterrupted run (one per dropout for the whole module)."""
    if dropout not in _FAULT_FREE:
        trainer = transformers.Trainer(model=_model(0, dropout), args=_args(tmp_path / "ff"), train_dataset=_Data())
        trainer.train()
        _FAULT_FREE[dropout] = trainer
    return _FAULT_FREE[dropout]


@pytest.mark.parametrize(
    ("dropout", "crash_at", "source"),
    [
        (0.0, 5, "memory"),  # within an epoch: the Trainer skips 5 batches of epoch 0
        (0.0, 5, "storage"),  # memory gone (node lost): the persisted snapshot
        (0.1, 5, "memory"),  # dropout draws from the torch RNG: restored after the skipped batches
        (0.1, 8, "memory"),  # at the epoch boundary: restored before epoch 1's data loader starts
    ],
)
def test_resume_inside_train_ends_as_a_fault_free_run(
    job_id: str, tmp_path: Path, dropout: float, crash_at: int, source: str
) -> None:
    reference = _fault_free(dropout, tmp_path)
    config = StagerConfig(job_id=job_id, run_id="r")
    storage = str(tmp_path / "ck")

    ckpt = FlashCheckpointer(config, storage, saver="none")
    try:
        first = FlashCheckpointCallback(ckpt, memory_every=1, storage_every=crash_at if source == "storage" else 0)
        crash = _Steps(crash_at=crash_at)
        trainer = transformers.Trainer(
            model=_model(0, dropout), args=_args(tmp_path / "a"), train_dataset=_Data(), callbacks=[first, crash]
        )
        with pytest.raises(_Crash):
            trainer.train()
        assert first.saved_steps == list(range(1, crash_at + 1))
    finally:
        # The process dies; its snapshots stay in memory, unless the node is lost with them.
        ckpt.close(job_end=source == "storage")
    del trainer

    # The restarted process: the same script, a model initialised differently.
    ckpt = FlashCheckpointer(config, storage, saver="none")
    try:
        callback = FlashCheckpointCallback(ckpt, memory_every=1)
        steps = _Steps()
        model = _model(1, dropout)
        trainer = transformers.Trainer(
            model=model, args=_args(tmp_path / "b"), train_dataset=_Data(), callbacks=[callback, steps]
        )
        path = callback.prepare_resume(model)
        assert path is not None
        assert Path(path).parent == Path(config.shm_dir)
        assert Path(path).name.startswith(f"{RESUME_PREFIX}{os.getpid()}-")
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
        assert sorted(os.listdir(path)) == ["model.safetensors", "trainer_state.json"]
        # The tied output embedding is written once, under the input embedding's name, as
        # save_pretrained writes it; loading that name fills both.
        with safetensors.safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
            written = set(f.keys())
        assert written == set(model.state_dict()) - {"lm_head.weight"}
        assert callback.resumed is not None
        assert (callback.resumed.step, callback.resumed.source) == (crash_at, source)

        out = trainer.train(resume_from_checkpoint=path)

        assert not os.path.exists(path)
        assert trainer.model.lm_head.weight is trainer.model.transformer.wte.weight
        assert steps.steps == list(range(crash_at + 1, TOTAL_STEPS + 1))  # exactly the missing steps
        assert callback.saved_steps == steps.steps
        assert out.global_step == trainer.state.global_step == TOTAL_STEPS
        for (name, a), b in zip(reference.model.state_dict().items(), trainer.model.state_dict().values(), strict=True):
            assert same_bits(a, b), name
        assert same_bits(reference.optimizer.state_dict(), trainer.optimizer.state_dict())
        assert same_bits(reference.lr_scheduler.state_dict(), trainer.lr_scheduler.state_dict())
        # The restored log history lacks only the snapshot step's own entry (logged after on_step_end).
        losses = [(e["step"], e["loss"]) for e in trainer.state.log_history if "loss" in e]
        assert losses == [
            (e["step"], e["loss"]) for e in reference.state.log_history if "loss" in e and e["step"] != crash_at
        ]
    finally:
        ckpt.close(job_end=True)


def test_resume_weights_drop_a_tie_only_where_the_model_keeps_it() -> None:
    tied_model, apart_model = torch.nn.ModuleDict(), torch.nn.ModuleDict()
    for m in (tied_model, apart_model):
        m["emb"] = torch.nn.Embedding(4, 2)
        m["head"] = torch.nn.Linear(2, 4, bias=False)
    tied_model["head"].weight = tied_model["emb"].weight
    shared = torch.arange(8.0).reshape(4, 2)
    snapshot = {"emb.weight": shared, "head.weight": shared}  # a fresh load keeps the tie: one tensor

    tied = _untied(snapshot, tied_model.state_dict())
    assert list(tied) == ["emb.weight"]
    apart = _untied(snapshot, apart_model.state_dict())
    assert list(apart) == ["emb.weight", "head.weight"]
    assert apart["head.weight"].data_ptr() != apart["emb.weight"].data_ptr()  # safetensors refuses shared memory
    assert torch.equal(apart["head.weight"], shared)


def test_no_snapshot_means_training_from_scratch(
    ckpt: FlashCheckpointer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    callback = FlashCheckpointCallback(ckpt)
    with caplog.at_level(logging.INFO, logger="dlrover.flashckpt.hf"):
        assert callback.prepare_resume(_model()) is None
    assert "training starts from scratch" in caplog.text
    assert callback.resumed is None


def _snapshot_of_step_one(ckpt: FlashCheckpointer, tmp_path: Path, model: torch.nn.Module) -> None:
    """What the callback saves after step 1, without running a Trainer."""
    callback = FlashCheckpointCallback(ckpt)
    state = transformers.TrainerState(global_step=1, epoch=0.125)
    callback.on_step_end(_args(tmp_path), state, transformers.TrainerControl(), model=model)
    assert callback.saved_steps == [1]


def test_a_snapshot_of_another_model_is_refused_and_nothing_is_written(ckpt: FlashCheckpointer, tmp_path: Path) -> None:
    _snapshot_of_step_one(ckpt, tmp_path, _model(n_embd=16))
    callback = FlashCheckpointCallback(ckpt)
    with pytest.raises(StateStructureError, match=r"transformer\.wte\.weight is \(32, 16\).* \(32, 8\)"):
        callback.prepare_resume(_model(n_embd=8))
    assert callback.resumed is None
    assert _resume_dirs() == []

    # A snapshot that is not the callback's (no trainer state) is refused too.
    model = _model()
    ckpt.save(2, {"model": model.state_dict()})
    with pytest.raises(StateStructureError, match="step 2 holds no trainer state"):
        callback.prepare_resume(model)


def test_training_without_the_prepared_directory_is_refused(ckpt: FlashCheckpointer, tmp_path: Path) -> None:
    model = _model()
    _snapshot_of_step_one(ckpt, tmp_path, model)
    callback = FlashCheckpointCallback(ckpt)
    trainer = transformers.Trainer(model=model, args=_args(tmp_path), train_dataset=_Data(), callbacks=[callback])
    path = callback.prepare_resume(model)
    assert path is not None
    assert os.path.isdir(path)
    # Forgetting resume_from_checkpoint would pair a fresh model with the restored optimizer.
    with pytest.raises(FlashCkptError, match="prepared step 1 but the Trainer starts at step 0"):
        trainer.train()
    assert not os.path.exists(path)


def test_the_directory_goes_when_training_never_begins(ckpt: FlashCheckpointer, tmp_path: Path) -> None:
    model = _model()
    _snapshot_of_step_one(ckpt, tmp_path, model)
    callback = FlashCheckpointCallback(ckpt)
    path = callback.prepare_resume(model)
    assert path is not None
    assert os.path.isdir(path)
    with pytest.raises(FlashCkptError, match="already prepared"):
        callback.prepare_resume(model)
    del callback
    gc.collect()
    assert not os.path.exists(path)
