"""A Hugging Face ``transformers`` Trainer callback: memory snapshots every N steps, storage every M.

    from dlrover.flashckpt.hf import FlashCheckpointCallback
    ckpt = FlashCheckpointer(StagerConfig(job_id="j", run_id="r"), storage_dir="/ckpt")
    trainer = Trainer(..., callbacks=[FlashCheckpointCallback(ckpt, memory_every=1, storage_every=100)])

Each snapshot holds ``model`` (its state dict), ``optimizer``, ``scheduler`` (when the Trainer has
them) and ``trainer`` (global step, epoch and the log history, as JSON values). `load_trainer_state`
restores the model in place and the optimizer and scheduler through their ``load_state_dict``.

Not done yet: resuming inside ``Trainer.train`` (fast-forwarding the data loader to the restored
step), which transformers only does from its own checkpoint directories. Import this module only
where transformers is installed (``pip install dlrover-flashckpt[hf]``).
"""

from __future__ import annotations

import json
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from dlrover.flashckpt.checkpointer import FlashCheckpointer
from dlrover.flashckpt.errors import StateStructureError
from dlrover.flashckpt.memory import LoadedState

__all__ = ["FlashCheckpointCallback", "load_trainer_state"]


def _json_safe(value: Any) -> Any:
    """The log history as plain JSON values (it holds only numbers and strings)."""
    return json.loads(json.dumps(value, default=str))


class FlashCheckpointCallback(TrainerCallback):  # type: ignore[misc,unused-ignore]  # Any without transformers
    """Snapshots the Trainer's state into shared memory, and to storage every `storage_every` steps.

    Args:
        checkpointer: the rank's `FlashCheckpointer`.
        memory_every: steps between memory snapshots (>= 1).
        storage_every: steps between persisted snapshots (0: never; a multiple of `memory_every`).

    Raises:
        StateStructureError: a bad interval (the message names it).
    """

    def __init__(self, checkpointer: FlashCheckpointer, memory_every: int = 1, storage_every: int = 0) -> None:
        if memory_every < 1:
            raise StateStructureError(f"memory_every must be >= 1, got {memory_every}")
        if storage_every < 0 or (storage_every and storage_every % memory_every):
            raise StateStructureError(
                f"storage_every must be 0 or a multiple of memory_every ({memory_every}), got {storage_every}"
            )
        self.checkpointer = checkpointer
        self.memory_every = memory_every
        self.storage_every = storage_every
        self.saved_steps: list[int] = []

    def on_step_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any = None,
        **kwargs: Any,
    ) -> None:
        """Snapshot after the optimizer step of every `memory_every`-th step."""
        step = int(state.global_step)
        if model is None or step % self.memory_every:
            return
        snapshot: dict[str, Any] = {
            "model": model.state_dict(),
            "trainer": {
                "global_step": step,
                "epoch": float(state.epoch or 0.0),
                "log_history": _json_safe(state.log_history),
            },
        }
        if optimizer is not None:
            snapshot["optimizer"] = optimizer.state_dict()
        if lr_scheduler is not None:
            snapshot["scheduler"] = lr_scheduler.state_dict()
        persist = bool(self.storage_every) and step % self.storage_every == 0
        if self.checkpointer.save(step, snapshot, persist=persist).saved:
            self.saved_steps.append(step)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Wait until the last snapshot is sealed."""
        self.checkpointer.stager.flush()


def load_trainer_state(
    checkpointer: FlashCheckpointer,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
) -> tuple[dict[str, Any], LoadedState]:
    """Restore the newest snapshot: the model in place, optimizer and scheduler via ``load_state_dict``.

    Returns:
        The ``trainer`` entry (global step, epoch, log history) and where the state came from.

    Raises:
        NoCheckpointError: nothing to load.
        StateStructureError: the model does not match the snapshot (nothing changed).
    """
    loaded = checkpointer.load()
    saved = loaded.state
    # In place: the snapshot's model tensors are copied into the live parameters.
    model.load_state_dict(saved["model"])
    if optimizer is not None and "optimizer" in saved:
        optimizer.load_state_dict(saved["optimizer"])
    if scheduler is not None and "scheduler" in saved:
        scheduler.load_state_dict(saved["scheduler"])
    trainer_state: dict[str, Any] = saved["trainer"]
    return trainer_state, loaded
