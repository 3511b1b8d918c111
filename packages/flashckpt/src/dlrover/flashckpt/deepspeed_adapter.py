"""DeepSpeed engines (ZeRO stage 0-2) as flash-checkpointable states, and back.

`deepspeed_state` turns an engine's state into a nested state the stager copies into shared memory
(tensors plus JSON values, no pickle); `load_deepspeed_state` applies a restored one through the
engine's own ``module.load_state_dict`` and ``optimizer.load_state_dict`` (the calls DeepSpeed's
``load_checkpoint`` makes), so DeepSpeed rebuilds its fp32 partitions and bit16 weights itself::

    ckpt.save(step, deepspeed_state(engine))                  # each rank: its own ZeRO partition
    loaded = ckpt.load()                                   # after a restart, same world size
    load_deepspeed_state(engine, loaded.state)

What is stored of the ZeRO optimizer's ``state_dict()``: every tensor and JSON-able value; the
loss scaler object as its class name and scalar attributes (restored onto the live scaler); the
``param_slice_mappings`` entry is left out (DeepSpeed derives it from the partitioning and never
reads it back). Each rank holds its own partition, so a snapshot loads on the same data-parallel
size only; ZeRO's ``elastic_checkpoint`` mode and stage 3 are refused with a clear error.

DeepSpeed is imported by the caller (this module never imports it), so the package does not
depend on it.
"""

from __future__ import annotations

import enum
from typing import Any

import torch

from dlrover.flashckpt.errors import StateStructureError

__all__ = ["deepspeed_state", "load_deepspeed_state"]

_LOSS_SCALER = "loss_scaler"
_DROPPED = ("param_slice_mappings",)
_SCALARS = (type(None), bool, int, float, str, torch.dtype)
_ENGINE_COUNTERS = ("global_steps", "global_samples", "skipped_steps")


def _check_supported(engine: Any) -> Any:
    opt = engine.optimizer
    stage = int(engine.zero_optimization_stage()) if _is_zero(engine) else 0
    if stage > 2:
        raise StateStructureError(f"ZeRO stage {stage} is not supported (stages 0, 1 and 2 are)")
    if getattr(opt, "elastic_checkpoint", False):
        raise StateStructureError("ZeRO elastic_checkpoint is not supported: its load merges every rank's file")
    return opt


def _is_zero(engine: Any) -> bool:
    return hasattr(engine, "zero_optimization_stage") and int(engine.zero_optimization_stage()) > 0


def _encode_scaler(scaler: Any) -> dict[str, Any]:
    attrs = {k: v for k, v in vars(scaler).items() if isinstance(v, _SCALARS)}
    return {"class": type(scaler).__name__, "attrs": attrs}


def _plain(value: Any) -> Any:
    # ZeroStageEnum and similar enums: stored as their value (the tree has no enum node).
    return value.value if isinstance(value, enum.Enum) else value


def deepspeed_state(engine: Any) -> dict[str, Any]:
    """This rank's state of a DeepSpeed engine, ready for `Stager.save` / `FlashCheckpointer.save`.

    Args:
        engine: the engine from ``deepspeed.initialize``.

    Returns:
        ``{"module", "optimizer", "engine", "lr_scheduler"}``; tensors are the engine's own (the
        stager copies them), so take a new one for every save.

    Raises:
        StateStructureError: ZeRO stage 3 or elastic checkpoints.
    """
    opt = _check_supported(engine)
    state: dict[str, Any] = {"module": engine.module.state_dict()}
    if opt is not None:
        sd = opt.state_dict()
        optim: dict[str, Any] = {}
        for key, value in sd.items():
            if key in _DROPPED:
                continue
            optim[key] = _encode_scaler(value) if key == _LOSS_SCALER else _plain(value)
        state["optimizer"] = optim
    state["engine"] = {k: int(getattr(engine, k)) for k in _ENGINE_COUNTERS if hasattr(engine, k)}
    scheduler = getattr(engine, "lr_scheduler", None)
    state["lr_scheduler"] = scheduler.state_dict() if scheduler is not None else None
    return state


def load_deepspeed_state(engine: Any, state: dict[str, Any]) -> None:
    """Apply a state from `deepspeed_state` (restored from memory or storage) to `engine`.

    Raises:
        StateStructureError: the state lacks a part the engine has, or its loss scaler is of
            another class; the engine is unchanged then.
    """
    opt = _check_supported(engine)
    if opt is not None and "optimizer" not in state:
        raise StateStructureError("the state has no optimizer part but the engine has an optimizer")
    sd: dict[str, Any] | None = None
    if opt is not None:
        sd = dict(state["optimizer"])
        saved = sd.get(_LOSS_SCALER)
        live = getattr(opt, "loss_scaler", None)
        if saved is not None:
            if live is None or saved.get("class") != type(live).__name__:
                raise StateStructureError(
                    f"the state's loss scaler is a {saved.get('class')!r}, the engine's a {type(live).__name__!r}"
                )
            for name, value in saved.get("attrs", {}).items():
                setattr(live, name, value)
            sd[_LOSS_SCALER] = live
    engine.module.load_state_dict(state["module"])
    if opt is not None and sd is not None:
        if _is_zero(engine):
            # ZeRO's loader takes every saved rank's dict, indexed by data-parallel rank; with the
            # same size and a non-elastic checkpoint it reads only this rank's entry.
            world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
            opt.load_state_dict([sd] * world, load_optimizer_states=True, load_from_fp32_weights=True)
        else:
            opt.load_state_dict(sd)
    for name, value in state.get("engine", {}).items():
        setattr(engine, name, value)
    scheduler = getattr(engine, "lr_scheduler", None)
    if scheduler is not None and state.get("lr_scheduler") is not None:
        scheduler.load_state_dict(state["lr_scheduler"])
