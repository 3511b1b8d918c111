"""A Hugging Face ``transformers`` Trainer callback: memory snapshots every N steps, storage every M.

    from dlrover.flashckpt.hf import FlashCheckpointCallback
    ckpt = FlashCheckpointer("/ckpt")
    callback = FlashCheckpointCallback(ckpt, memory_every=1, storage_every=100)
    trainer = Trainer(model=model, ..., callbacks=[callback])
    # A restarted job (the same script run again) goes on from the newest snapshot: memory first,
    # else storage; None when there is none, and training starts from scratch.
    trainer.train(resume_from_checkpoint=callback.prepare_resume(model))

Each snapshot, taken in ``on_step_end``, holds ``model`` (its state dict), ``optimizer``,
``scheduler`` (when the Trainer has them), ``trainer`` (the step and the whole ``TrainerState`` as
the JSON text of ``trainer_state.json``) and ``rng`` (the Python, NumPy, torch CPU and, once
initialised, CUDA generator states).

Resuming inside ``Trainer.train`` uses only what ``train(resume_from_checkpoint=DIR)`` documents:
`FlashCheckpointCallback.prepare_resume` loads the newest snapshot, checks it against the model,
and writes ``DIR`` with the two files the Trainer needs, ``trainer_state.json`` and
``model.safetensors``, in a private (0700) directory in the checkpointer's ``shm_dir`` (tmpfs).
The Trainer loads the weights, restores its state from the JSON and fast-forwards the data loader
past the batches of the steps already trained. ``DIR`` holds no ``optimizer.pt``,
``scheduler.pt`` or ``rng_state.pth`` (pickle files), so the Trainer leaves those alone; the
callback restores optimizer and scheduler in ``on_train_begin`` (they exist by then), from the
same loaded snapshot, removes ``DIR``, and restores the RNG where the Trainer would restore its
``rng_state.pth``: before the data loader is iterated when resuming at an epoch boundary, after
the first batch of the resumed step is fetched otherwise. With the same script and seeds the
resumed run then ends with the same weights and optimizer state, bit for bit, as one that never
stopped.

Limits: the snapshot is taken in ``on_step_end``, before the Trainer logs, evaluates or saves
that step, so the restored log history lacks the snapshot step's own entry, and whatever draws
from the global RNGs in between (an evaluation's data loader) is not replayed. Callback states
other than the Trainer's ``TrainerControl`` are those of the training start (callbacks do not see
each other). The fp16 loss scaler is not captured (bf16 and fp32 need none). Plain PyTorch models
only: DeepSpeed and FSDP load checkpoints their own way. With ``ignore_data_skip`` the RNG is
restored at the epoch's start (transformers restores none in that case). ``DIR`` briefly holds a
copy of the weights in host memory, one per local rank (plan that much room in ``shm_dir``); it is
removed in ``on_train_begin``, when the callback is collected or the process exits, and by the
next ``prepare_resume`` of any job once its owner was killed. Resuming needs transformers 5 (4.x
reads ``model.safetensors`` only with ``save_safetensors=True``).

Import this module only where transformers is installed (``pip install dlrover-flashckpt[hf]``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import random
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs
import numpy as np
import safetensors.torch
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from dlrover.common import owned_temp_dir, remove_dead_owners
from dlrover.flashckpt.checkpointer import FlashCheckpointer
from dlrover.flashckpt.errors import FlashCkptError, NoCheckpointError, StateStructureError
from dlrover.flashckpt.memory import LoadedState
from dlrover.flashckpt.tree import alias_key

__all__ = ["FlashCheckpointCallback", "ResumeInfo", "load_trainer_state"]

_log = logging.getLogger(__name__)

# The file names `Trainer.train(resume_from_checkpoint=...)` reads (transformers' TRAINER_STATE_NAME
# and SAFE_WEIGHTS_NAME).
_TRAINER_STATE_FILE = "trainer_state.json"
_WEIGHTS_FILE = "model.safetensors"
_RESUME_DIR_PREFIX = "dlrover-hfresume-"


@attrs.frozen
class ResumeInfo:
    """The snapshot `FlashCheckpointCallback.prepare_resume` resumes from.

    Attributes:
        step: its global step.
        source: ``memory`` or ``storage``.
        detail: where exactly it came from, for logs.
        path: the checkpoint directory handed to ``Trainer.train`` (gone once training began).
    """

    step: int
    source: str
    detail: str
    path: str


@attrs.define
class _Pending:
    """What `prepare_resume` loaded and ``on_train_begin`` still has to apply."""

    info: ResumeInfo
    optimizer: Any
    scheduler: Any
    rng: Any
    remove_dir: weakref.finalize[Any, Any]


def _trainer_state_json(state: TrainerState, control: TrainerControl | None) -> str:
    """``trainer_state.json`` as the Trainer itself would write it at this point."""
    doc = dataclasses.asdict(state)
    callbacks = doc.get("stateful_callbacks")
    if control is not None and isinstance(callbacks, dict) and isinstance(callbacks.get("TrainerControl"), dict):
        # The Trainer refreshes this entry (the only callback state a callback can see) when it saves.
        callbacks["TrainerControl"] = control.state()
    # str() for a stray non-JSON log value: a snapshot must never fail training over a log entry.
    return json.dumps(doc, sort_keys=True, default=str)


def _capture_rng() -> dict[str, Any]:
    """The global generators' states, as tensors and scalars (no pickle)."""
    version, words, gauss = random.getstate()
    rng: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(words, dtype=torch.int64), "gauss": gauss},
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    # An uninitialised CUDA was never drawn from (the restarted process seeds it the same way), and
    # reading its state would initialise it: a CUDA context on every CPU-only run on a GPU machine.
    cuda_initialized: Callable[[], bool] = torch.cuda.is_initialized  # untyped in torch
    if torch.cuda.is_available() and cuda_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def _restore_rng(rng: Mapping[str, Any]) -> None:
    py = rng["python"]
    random.setstate((int(py["version"]), tuple(int(w) for w in py["state"].tolist()), py["gauss"]))
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    cuda = rng.get("cuda")
    if cuda is not None:
        if torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
            _log.warning(
                "the snapshot holds %d CUDA generator states but %d devices are visible: CUDA RNG not restored",
                len(cuda),
                seen,
            )


def _check_model(step: int, saved: Any, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The snapshot's model tensors, once they match `model`'s state dict name for name."""
    if not isinstance(saved, Mapping):
        raise StateStructureError(f"the snapshot of step {step} has no model state dict (got {type(saved).__name__})")
    live = model.state_dict()
    problems = []
    missing = [k for k in live if k not in saved]
    unexpected = [k for k in saved if k not in live]
    if missing:
        problems.append(f"{len(missing)} model keys missing from the snapshot ({', '.join(missing[:5])})")
    if unexpected:
        problems.append(f"{len(unexpected)} snapshot keys the model lacks ({', '.join(map(str, unexpected[:5]))})")
    for name, want in live.items():
        if name not in saved:
            continue
        got = saved[name]
        if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
            problems.append(f"{name} is not a tensor in the snapshot or the model")
        elif got.shape != want.shape or got.dtype != want.dtype:
            saw, wanted = f"{tuple(got.shape)} {got.dtype}", f"{tuple(want.shape)} {want.dtype}"
            problems.append(f"{name} is {saw} in the snapshot, {wanted} in the model")
    if problems:
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise StateStructureError(f"the snapshot of step {step} does not match the model: {shown}")
    return _untied({name: saved[name] for name in live}, live)


def _untied(weights: dict[str, torch.Tensor], live: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`weights` made contiguous, with each tied weight under its first name only.

    A weight tied in the snapshot (one tensor under two names) is written once, as Hugging Face's
    own ``save_pretrained`` does (``safetensors`` refuses shared tensors): loading into the first
    name fills the other, provided the model ties them too; a name whose model tensor is apart is
    kept.
    """
    kept: dict[int, str] = {}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        first = kept.setdefault(id(tensor), name)
        if first != name and alias_key(live[name]) is not None and alias_key(live[name]) == alias_key(live[first]):
            continue
        out[name] = tensor.contiguous() if first == name else tensor.clone(memory_format=torch.contiguous_format)
    return out


def _saved_trainer_state(step: int, saved: Mapping[str, Any]) -> str:
    """The snapshot's ``trainer_state.json`` text, checked to be a TrainerState of `step`."""
    trainer = saved.get("trainer")
    text = trainer.get("state") if isinstance(trainer, Mapping) else None
    if not isinstance(text, str):
        raise StateStructureError(
            f"the snapshot of step {step} holds no trainer state (it was not written by this FlashCheckpointCallback)"
        )
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise StateStructureError(f"the trainer state in the snapshot of step {step} is not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("global_step") != step:
        found = doc.get("global_step") if isinstance(doc, dict) else doc
        raise StateStructureError(f"the trainer state in the snapshot of step {step} is of step {found!r}")
    return text


class FlashCheckpointCallback(TrainerCallback):  # type: ignore[misc,unused-ignore]  # Any without transformers
    """Snapshots the Trainer's state into shared memory, and to storage every `storage_every` steps.

    Also resumes a restarted Trainer from the newest snapshot: see `prepare_resume`.

    Args:
        checkpointer: the rank's `FlashCheckpointer`.
        memory_every: steps between memory snapshots (>= 1).
        storage_every: steps between persisted snapshots (0: never; a multiple of `memory_every`).

    Attributes:
        saved_steps: the steps this callback snapshotted, in order.
        resumed: the snapshot `prepare_resume` resumes from (None until it found one).

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
        self.resumed: ResumeInfo | None = None
        self._pending: _Pending | None = None
        self._rng: tuple[Any, Literal["epoch", "step"]] | None = None

    def prepare_resume(self, model: torch.nn.Module) -> str | None:
        """Load the newest snapshot and write the checkpoint directory ``Trainer.train`` resumes from.

        Call it after building the Trainer (with this callback) and pass the result on:
        ``trainer.train(resume_from_checkpoint=callback.prepare_resume(model))``. The directory
        holds only ``trainer_state.json`` and ``model.safetensors``; the optimizer, scheduler and
        RNG states stay in this callback, which applies them when training begins and then
        removes the directory.

        Args:
            model: the model given to the Trainer; the snapshot's weights must match its state
                dict (names, shapes and dtypes).

        Returns:
            The directory, or None when there is no snapshot (logged; training starts afresh).

        Raises:
            StateStructureError: the snapshot does not match `model`, or was not written by this
                callback; nothing is written.
            FlashCkptError: a resume is already prepared and training has not begun.
        """
        if self._pending is not None:
            raise FlashCkptError(
                f"a resume from step {self._pending.info.step} is already prepared: start training with it first"
            )
        shm_dir = self.checkpointer.config.shm_dir
        # Directories of earlier processes killed before their training began (SIGKILL skips exit handlers).
        remove_dead_owners(_RESUME_DIR_PREFIX, shm_dir)
        try:
            loaded: LoadedState = self.checkpointer.load()
        except NoCheckpointError as e:
            _log.info("no flash checkpoint to resume from, training starts from scratch: %s", e)
            return None
        step, saved = loaded.step, loaded.state
        if not isinstance(saved, Mapping):
            raise StateStructureError(f"the snapshot of step {step} is a {type(saved).__name__}, not a mapping")
        weights = _check_model(step, saved.get("model"), model)
        state_json = _saved_trainer_state(step, saved)

        stack = contextlib.ExitStack()
        try:
            path = stack.enter_context(owned_temp_dir(_RESUME_DIR_PREFIX, shm_dir))
            safetensors.torch.save_file(weights, str(path / _WEIGHTS_FILE), metadata={"format": "pt"})
            (path / _TRAINER_STATE_FILE).write_text(state_json, encoding="utf-8")
        except BaseException:
            stack.close()
            raise
        info = ResumeInfo(step, loaded.source, loaded.detail, str(path))
        # Removed in on_train_begin; if training never begins, when this callback is collected or at exit.
        remove_dir = weakref.finalize(self, stack.close)
        self._pending = _Pending(info, saved.get("optimizer"), saved.get("scheduler"), saved.get("rng"), remove_dir)
        self.resumed = info
        _log.info("resuming the Trainer from step %d (%s: %s) through %s", step, loaded.source, loaded.detail, path)
        return str(path)

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any = None,
        **kwargs: Any,
    ) -> None:
        """Apply a prepared resume: optimizer and scheduler now, the RNG when the first step starts."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        step = pending.info.step
        # The Trainer has read the directory by now: only rng_state.pth, which it never holds, is looked for later.
        pending.remove_dir()
        if state.global_step != step:
            raise FlashCkptError(
                f"prepare_resume() prepared step {step} but the Trainer starts at step {state.global_step}: "
                "pass its result to trainer.train(resume_from_checkpoint=...)"
            )
        if pending.optimizer is not None:
            if optimizer is None:
                raise FlashCkptError(f"the snapshot of step {step} holds an optimizer state but the Trainer has none")
            try:
                optimizer.load_state_dict(pending.optimizer)
            except (ValueError, KeyError) as e:
                raise StateStructureError(f"the snapshot of step {step} does not fit the optimizer: {e}") from e
        if pending.scheduler is not None and lr_scheduler is not None:
            lr_scheduler.load_state_dict(pending.scheduler)
        if args.fp16:
            _log.warning("fp16: the loss scale is not in flash snapshots and restarts from its initial value")
        if pending.rng is not None:
            # Where Trainer._run_epoch would load rng_state.pth: before the epoch's data loader is
            # iterated when no batch is skipped, else once the resumed step's batches are fetched.
            # The epoch is a whole number exactly at an epoch boundary (its fraction is step / batches).
            at_boundary = args.ignore_data_skip or float(state.epoch or 0.0).is_integer()
            self._rng = (pending.rng, "epoch" if at_boundary else "step")
        else:
            _log.warning("the snapshot of step %d holds no RNG state: random draws will differ", step)

    def on_epoch_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Restore the RNG of a resume at an epoch boundary."""
        if self._rng is not None and self._rng[1] == "epoch":
            _restore_rng(self._rng[0])
            self._rng = None

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Restore the RNG of a resume within an epoch."""
        if self._rng is not None:
            _restore_rng(self._rng[0])
            self._rng = None

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
            "trainer": {"global_step": step, "state": _trainer_state_json(state, control)},
            "rng": _capture_rng(),
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

    For a training loop of one's own; a Trainer resumes with `FlashCheckpointCallback.prepare_resume`.

    Returns:
        The trainer state (the fields of ``TrainerState``: global step, epoch, log history, ...)
        and where the snapshot came from.

    Raises:
        NoCheckpointError: nothing to load.
        StateStructureError: the model does not match the snapshot (nothing changed).
    """
    loaded = checkpointer.load()
    saved = loaded.state
    # Checked first: load_state_dict would copy the matching tensors before it reports a mismatch.
    _check_model(loaded.step, saved["model"], model)
    # In place: the snapshot's model tensors are copied into the live parameters.
    model.load_state_dict(saved["model"])
    if optimizer is not None and "optimizer" in saved:
        optimizer.load_state_dict(saved["optimizer"])
    if scheduler is not None and "scheduler" in saved:
        scheduler.load_state_dict(saved["scheduler"])
    trainer: dict[str, Any] = saved["trainer"]
    text = trainer.get("state")
    # Snapshots of earlier versions hold the step, epoch and log history directly.
    return (json.loads(text) if isinstance(text, str) else trainer), loaded
