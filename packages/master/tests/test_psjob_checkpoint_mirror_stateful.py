"""A state machine over mirror_once: whatever the chief saves (max_to_keep dropping old checkpoints, saves that
crash half-way, a chief killed between CheckpointManager's two writes of the state file, a checkpoint saved again
under its name) and however passes end (cut short by a failing write, racing a save during the copies or between
the state files' read and the listing), storage's state file only ever names checkpoints whose every file storage
holds as one save wrote them, and it keeps naming one once it has (but for the moment a checkpoint saved again is
replaced, when it is the only one); a pass with nothing in between leaves storage holding the source's files."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from dlrover_testsupport.tf_checkpoints import files_of, save, state_text
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dlrover.master.psjob import checkpoint_mirror
from dlrover.master.psjob.checkpoint_mirror import MirrorMemo, mirror_once
from dlrover.master.psjob.state_file import state_paths

_REAL_COPY = checkpoint_mirror._copy
_REAL_LISTING = checkpoint_mirror._listing


class MirrorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="mirror-machine-"))
        self.src, self.dst = self.root / "memory", self.root / "storage"
        self.src.mkdir()
        self.memo = MirrorMemo()
        self.saved: dict[str, list[dict[str, bytes]]] = {}  # checkpoint name -> its files as each save wrote them
        self.number = 0
        self.had_state = False
        self.resaved = False

    def teardown(self) -> None:
        checkpoint_mirror._copy = _REAL_COPY
        checkpoint_mirror._listing = _REAL_LISTING
        shutil.rmtree(self.root)

    def _save(self, payload: bytes, keep: int, *, again: bool = False) -> None:
        self.number += 0 if again else 1
        files = save(self.src, self.number, keep=keep, payload=payload)
        self.saved.setdefault(f"ckpt-{self.number}", []).append(files)

    @rule(payload=st.binary(max_size=64), keep=st.integers(1, 3))
    def chief_saves(self, payload: bytes, keep: int) -> None:
        self._save(payload, keep)

    @rule()
    def a_save_crashes_half_way(self) -> None:
        temp = self.src / f"ckpt-{self.number + 1}_temp"
        temp.mkdir(exist_ok=True)
        (temp / "part-00000-of-00002.data-00000-of-00001").write_bytes(b"half")
        (self.src / "checkpoint.tmp9c").write_text('model_checkpoint_path: "nowhere"\n')

    @precondition(lambda self: self.number >= 1)
    @rule(payload=st.binary(min_size=1, max_size=16), keep=st.integers(1, 3))
    def the_chief_saves_its_newest_again_under_its_name(self, payload: bytes, keep: int) -> None:
        self.resaved = True
        self._save(payload, keep, again=True)

    @precondition(lambda self: self.number >= 1)
    @rule(after=st.integers(0, 6), payload=st.binary(min_size=1, max_size=16))
    def a_pass_racing_a_save_again_under_the_same_name(self, after: int, payload: bytes) -> None:
        self.resaved = True
        self._pass_with(after, lambda: self._save(payload, 3, again=True))

    @rule()
    def a_final_pass(self) -> None:
        mirror_once(self.src, self.dst, memo=self.memo, final=True)

    @precondition(lambda self: self.number >= 2)
    @rule(payload=st.binary(max_size=16))
    def the_chief_dies_inside_checkpoint_managers_sweep(self, payload: bytes) -> None:
        """The state file names the checkpoint being deleted, whose files are (partly) gone."""
        kept = [f"ckpt-{n}" for n in sorted(int(p.name[5:-6]) for p in self.src.glob("ckpt-*.index"))]
        self._save(payload, keep=len(kept) + 1)
        named = [*kept, f"ckpt-{self.number}"]
        (self.src / "checkpoint").write_text(state_text(named))
        for path in self.src.glob(f"{named[0]}.*"):
            if not path.name.endswith(".index"):
                path.unlink()

    @rule()
    def a_whole_pass(self) -> None:
        mirror_once(self.src, self.dst, memo=self.memo)
        held, source = files_of(self.dst), files_of(self.src)
        for name, content in source.items():
            if "_temp" not in name and ".tmp" not in name and name != "checkpoint":
                assert held.get(name) == content, name

    @rule(after=st.integers(0, 6))
    def a_pass_cut_short(self, after: int) -> None:
        def fail() -> None:
            raise OSError(28, "No space left on device")

        with contextlib.suppress(OSError):
            self._pass_with(after, fail)

    def _pass_with(self, after: int, action: Callable[[], None]) -> None:
        """A pass during which `action` happens before the copy after the first `after` copies."""
        copies = 0

        def copy(src: Path, dst: Path, listed: os.stat_result) -> tuple[int, bool]:
            nonlocal copies
            copies += 1
            if copies == after + 1:
                action()
            return _REAL_COPY(src, dst, listed)

        checkpoint_mirror._copy = copy
        try:
            mirror_once(self.src, self.dst, memo=self.memo)
        finally:
            checkpoint_mirror._copy = _REAL_COPY

    @rule(after=st.integers(0, 6), payload=st.binary(max_size=16), keep=st.integers(1, 2))
    def a_pass_racing_a_save_during_the_copies(self, after: int, payload: bytes, keep: int) -> None:
        self._pass_with(after, lambda: self._save(payload, keep))

    @rule(payload=st.binary(max_size=16), keep=st.integers(1, 2))
    def a_pass_racing_a_save_between_the_state_read_and_the_listing(self, payload: bytes, keep: int) -> None:
        listings = 0

        def racing(root: Path, *args: object) -> object:
            nonlocal listings
            if root == self.src:
                listings += 1
                if listings == 2:  # the first lists the state files, the second everything
                    self._save(payload, keep)
            return _REAL_LISTING(root, *args)  # type: ignore[arg-type]

        checkpoint_mirror._listing = racing  # type: ignore[assignment]
        try:
            mirror_once(self.src, self.dst, memo=self.memo)
        finally:
            checkpoint_mirror._listing = _REAL_LISTING

    @invariant()
    def storage_names_only_complete_checkpoints_as_saved(self) -> None:
        state = self.dst / "checkpoint"
        if not state.exists():
            assert self.resaved or not self.had_state, "storage lost its state file"
            return
        self.had_state = True
        held = files_of(self.dst)
        for name in state_paths(state.read_text()):
            versions = self.saved[name]
            files = versions[0].keys()
            assert {f: held.get(f) for f in files} in versions, f"{name}, named by storage's state file"

    @invariant()
    def no_partial_copy_is_left(self) -> None:
        assert not list(self.dst.rglob("*.dlrover-partial"))


TestMirrorMachine = pytest.mark.timeout(300)(MirrorMachine.TestCase)
MirrorMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=25, deadline=None)
