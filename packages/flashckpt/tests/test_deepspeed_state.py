"""The DeepSpeed adapter against a stand-in engine (no deepspeed needed): what is stored, what is
refused; the real ZeRO engines are in test_deepspeed.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from flashckpt_testlib import same_bits

from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.deepspeed_adapter import deepspeed_state, load_deepspeed_state
from dlrover.flashckpt.errors import StateStructureError
from dlrover.flashckpt.memory import MemoryReader
from dlrover.flashckpt.stager import Stager


class _Scaler:
    def __init__(self, scale: float) -> None:
        self.cur_scale = scale
        self.cur_iter = 0
        self.dtype = torch.float16
        self.config: object = object()  # not a scalar: not stored


class _Engine:
    """The attributes the adapter reads from a DeepSpeed engine (ZeRO stage 0: a torch optimizer)."""

    def __init__(self, seed: int, stage: int = 0) -> None:
        torch.manual_seed(seed)
        self.module = torch.nn.Linear(4, 3)
        self.optimizer: Any = torch.optim.Adam(self.module.parameters(), lr=0.1)
        self.global_steps = 0
        self.global_samples = 0
        self.skipped_steps = 0
        self.lr_scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.5)
        self._stage = stage

    def zero_optimization_stage(self) -> int:
        return self._stage

    def step(self) -> None:
        self.optimizer.zero_grad()
        self.module(torch.randn(2, 4)).sum().backward()
        self.optimizer.step()
        self.lr_scheduler.step()
        self.global_steps += 1
        self.global_samples += 2


def test_stand_in_engine_roundtrip_through_memory(config: StagerConfig) -> None:
    engine = _Engine(0)
    for _ in range(2):
        engine.step()
    stager = Stager(config)
    try:
        stager.save(2, deepspeed_state(engine))
        stager.flush()
        other = _Engine(7)
        loaded = MemoryReader(config).load()
        load_deepspeed_state(other, loaded.state)
    finally:
        stager.close()
    assert (other.global_steps, other.global_samples) == (2, 4)
    assert same_bits(dict(other.module.state_dict()), dict(engine.module.state_dict()))
    assert other.lr_scheduler.get_last_lr() == engine.lr_scheduler.get_last_lr()
    torch.manual_seed(5)
    engine.step()
    torch.manual_seed(5)
    other.step()
    assert same_bits(dict(other.module.state_dict()), dict(engine.module.state_dict()))


def test_loss_scaler_is_stored_as_scalars_and_checked() -> None:
    engine = _Engine(0)
    sd = {"loss_scaler": _Scaler(8.0), "param_slice_mappings": {"w": object()}, "x": torch.ones(1)}
    engine.optimizer = type("Opt", (), {"state_dict": lambda self: sd})()
    state = deepspeed_state(engine)
    assert state["optimizer"]["loss_scaler"] == {
        "class": "_Scaler",
        "attrs": {"cur_scale": 8.0, "cur_iter": 0, "dtype": torch.float16},
    }
    assert "param_slice_mappings" not in state["optimizer"]
    target = _Engine(1)
    target.optimizer = type("Opt", (), {"loss_scaler": object()})()
    with pytest.raises(StateStructureError, match="loss scaler"):
        load_deepspeed_state(target, state)


def test_stage_3_and_missing_parts_are_refused() -> None:
    with pytest.raises(StateStructureError, match="stage 3"):
        deepspeed_state(_Engine(0, stage=3))
    with pytest.raises(StateStructureError, match="no optimizer part"):
        load_deepspeed_state(_Engine(0), {"module": {}})
