"""A state machine over mirror_once: whatever the chief saves (max_to_keep dropping old checkpoints, saves that
crash half-way, a chief killed between CheckpointManager's two writes of the state file) and however passes end
(cut short by a failing write, racing a save during the copies or between the state files' read and the listing),
storage's state file only ever names checkpoints whose every file storage holds as they were saved, and it never
loses one once it has it; a pass with nothing in between leaves storage holding the source's files."""

from __future__ import annotations

import shutil
import tempfile
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
        self.saved: dict[str, dict[str, bytes]] = {}  # checkpoint name -> its files as saved
        self.number = 0
        self.had_state = False

    def teardown(self) -> None:
        checkpoint_mirror._copy = _REAL_COPY
        checkpoint_mirror._listing = _REAL_LISTING
        shutil.rmtree(self.root)

    def _save(self, payload: bytes, keep: int) -> None:
        self.number += 1
        self.saved[f"ckpt-{self.number}"] = save(self.src, self.number, keep=keep, payload=payload)

    @rule(payload=st.binary(max_size=64), keep=st.integers(1, 3))
    def chief_saves(self, payload: bytes, keep: int) -> None:
        self._save(payload, keep)

    @rule()
    def a_save_crashes_half_way(self) -> None:
        temp = self.src / f"ckpt-{self.number + 1}_temp"
        temp.mkdir(exist_ok=True)
        (temp / "part-00000-of-00002.data-00000-of-00001").write_bytes(b"half")
        (self.src / "checkpoint.tmp9c").write_text('model_checkpoint_path: "nowhere"\n')

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
        copies = 0

        def failing(src: Path, dst: Path) -> int:
            nonlocal copies
            copies += 1
            if copies > after:
                raise OSError(28, "No space left on device")
            return _REAL_COPY(src, dst)

        checkpoint_mirror._copy = failing
        try:
            mirror_once(self.src, self.dst, memo=self.memo)
        except OSError:
            pass
        finally:
            checkpoint_mirror._copy = _REAL_COPY

    @rule(after=st.integers(0, 6), payload=st.binary(max_size=16), keep=st.integers(1, 2))
    def a_pass_racing_a_save_during_the_copies(self, after: int, payload: bytes, keep: int) -> None:
        copies = 0

        def racing(src: Path, dst: Path) -> int:
            nonlocal copies
            copies += 1
            if copies == after + 1:
                self._save(payload, keep)
            return _REAL_COPY(src, dst)

        checkpoint_mirror._copy = racing
        try:
            mirror_once(self.src, self.dst, memo=self.memo)
        finally:
            checkpoint_mirror._copy = _REAL_COPY

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
            assert not self.had_state, "storage lost its state file"
            return
        self.had_state = True
        held = files_of(self.dst)
        for name in state_paths(state.read_text()):
            for file, content in self.saved[name].items():
                assert held.get(file) == content, f"{file} of {name}, named by storage's state file"

    @invariant()
    def no_partial_copy_is_left(self) -> None:
        assert not list(self.dst.rglob("*.dlrover-partial"))


TestMirrorMachine = pytest.mark.timeout(300)(MirrorMachine.TestCase)
MirrorMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=25, deadline=None)
