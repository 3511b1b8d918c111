"""A state machine over the real stager and reader: double buffering never loses the newest snapshot.

Rules save snapshots, hold slots the way a saver or reader does, and crash a writer half way;
the model is the list of completed steps. Invariants: the reader returns exactly the newest
completed step with its contents; no half-written snapshot is ever read; a skip is never silent.
"""

from __future__ import annotations

import uuid

import attrs
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.layout import SlotState
from dlrover.flashckpt.memory import MemoryReader
from dlrover.flashckpt.segment import ShmSegment, remove_run, segment_path
from dlrover.flashckpt.slotio import read_header, write_header
from dlrover.flashckpt.slots import BusyPolicy, SlotView, rank_slots
from dlrover.flashckpt.slots import SlotState as _S
from dlrover.flashckpt.stager import Stager


class DoubleBuffering(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.cfg = StagerConfig(
            job_id="sm" + uuid.uuid4().hex[:12],
            run_id="r",
            busy_policy=BusyPolicy.SKIP,
            seal_in_background=False,
        )
        self.stager = Stager(self.cfg)
        self.reader = MemoryReader(self.cfg)
        self.completed: list[int] = []  # model: steps whose save completed, in order
        self.held: dict[int, ShmSegment] = {}
        self.step = 0
        self.skips = 0

    def _seg(self, slot: int) -> ShmSegment:
        return ShmSegment.attach(segment_path(self.cfg.shm_dir, self.cfg.job_id, self.cfg.run_id, 0, slot))

    @rule(size=st.integers(1, 64))
    def save(self, size: int) -> None:
        self.step += 1
        result = self.stager.save(self.step, {"v": torch.full((size,), float(self.step)), "step": self.step})
        if result.saved:
            self.completed.append(self.step)
            assert result.slot not in self.held
        else:
            self.skips += 1
            # Only when every slot but the newest is held.
            assert len(self.held) >= 1

    @precondition(lambda self: len(self.held) < 2 and self.completed)
    @rule(slot=st.integers(0, 1))
    def hold(self, slot: int) -> None:
        self.stager.flush()  # the slots a save allocates in the background exist from here on
        if slot in self.held or not segment_path(self.cfg.shm_dir, self.cfg.job_id, "r", 0, slot).exists():
            return
        seg = self._seg(slot)
        assert seg.try_lock(exclusive=False)
        self.held[slot] = seg

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        slot = data.draw(st.sampled_from(sorted(self.held)))
        seg = self.held.pop(slot)
        seg.unlock()
        seg.close()

    @precondition(lambda self: len(self.completed) >= 1)
    @rule()
    def crash_mid_write(self) -> None:
        """A writer died half way: the slot it was writing (never the newest) says WRITING."""
        self.stager.flush()
        views = []
        for slot in range(2):
            path = segment_path(self.cfg.shm_dir, self.cfg.job_id, "r", 0, slot)
            if not path.exists():
                continue
            seg = self._seg(slot)
            h = read_header(seg)
            seg.close()
            if h is not None:
                views.append(SlotView(slot, h.state, h.seq, h.step))
        candidates = [c for c in rank_slots(views).candidates if c not in self.held]
        if not candidates:
            return
        seg = self._seg(candidates[0])
        h = read_header(seg)
        if h is not None:
            self.step += 1
            write_header(seg, attrs.evolve(h, state=SlotState.WRITING, seq=h.seq + 1000, step=self.step))
            seg.mm[h.data_off] ^= 0x5A  # half-written bytes
        seg.close()

    @invariant()
    def newest_completed_is_loadable(self) -> None:
        if not hasattr(self, "stager") or not self.completed:
            return
        # Reading needs the newest slot, which no rule ever holds for writing.
        loaded = self.reader.load()
        assert loaded.step == self.completed[-1]
        assert loaded.state["step"] == loaded.step
        assert torch.all(loaded.state["v"] == float(loaded.step))
        assert all(s.step in self.completed for s in self.reader.snapshots())
        assert self.stager.events.kinds().count("save_skipped") == self.skips

    def teardown(self) -> None:
        if not hasattr(self, "stager"):
            return
        for seg in self.held.values():
            seg.unlock()
            seg.close()
        self.stager.close()
        remove_run(self.cfg.shm_dir, self.cfg.job_id, "r")


DoubleBuffering.TestCase.settings = settings(DoubleBuffering.TestCase.settings, stateful_step_count=12)
TestDoubleBuffering = DoubleBuffering.TestCase


@given(
    st.lists(st.tuples(st.sampled_from(list(_S)), st.integers(0, 50)), min_size=1, max_size=4, unique_by=lambda x: x[1])
)
def test_rank_slots_never_offers_the_newest(slots: list[tuple[_S, int]]) -> None:
    views = [SlotView(i, state, seq, seq) for i, (state, seq) in enumerate(slots)]
    choice = rank_slots(views)
    complete = [v for v in views if v.state in (_S.COMPLETE, _S.SEALED)]
    if complete:
        newest = max(complete, key=lambda v: v.seq)
        assert newest.index not in choice.candidates
        assert len(choice.candidates) == len(views) - 1
        assert f"step {newest.step}" in choice.reason
    else:
        assert sorted(choice.candidates) == list(range(len(views)))
