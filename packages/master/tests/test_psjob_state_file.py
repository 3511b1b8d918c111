"""state_file: the checkpoints a TensorFlow state file names, and its copy naming only complete ones."""

from __future__ import annotations

import pytest

from dlrover.master.psjob.state_file import state_copy, state_paths

pytestmark = pytest.mark.timeout(30)

MANAGER_STATE = (
    b'model_checkpoint_path: "ckpt-3"\n'
    b'all_model_checkpoint_paths: "ckpt-1"\n'
    b'all_model_checkpoint_paths: "ckpt-2"\n'
    b'all_model_checkpoint_paths: "ckpt-3"\n'
    b"all_model_checkpoint_timestamps: 1.5\n"
    b"all_model_checkpoint_timestamps: 2.5\n"
    b"all_model_checkpoint_timestamps: 3.5\n"
    b"last_preserved_timestamp: 0.5\n"
)


def test_the_paths_a_state_file_names_newest_first_each_once_escapes_undone() -> None:
    assert state_paths(MANAGER_STATE.decode()) == ("ckpt-3", "ckpt-1", "ckpt-2")
    assert state_paths('model_checkpoint_path: "caf\\303\\251/ckpt-1"\n') == ("café/ckpt-1",)
    assert state_paths("garbage\n") == ()


def test_a_copy_names_only_complete_checkpoints_and_keeps_their_timestamps_in_step() -> None:
    copy = state_copy(MANAGER_STATE, "/shm/job", lambda name: name != "ckpt-1")
    assert copy.newest == "ckpt-3"
    assert copy.text == (
        b'model_checkpoint_path: "ckpt-3"\n'
        b'all_model_checkpoint_paths: "ckpt-2"\n'
        b'all_model_checkpoint_paths: "ckpt-3"\n'
        b"all_model_checkpoint_timestamps: 2.5\n"
        b"all_model_checkpoint_timestamps: 3.5\n"
        b"last_preserved_timestamp: 0.5\n"
    )
    assert state_copy(MANAGER_STATE, "/shm/job", lambda _name: True).text == MANAGER_STATE


def test_an_incomplete_newest_is_nothing_to_write_unless_the_newest_complete_one_may_take_its_place() -> None:
    not_three = state_copy(MANAGER_STATE, "/shm/job", lambda name: name != "ckpt-3")
    assert not_three.text is None
    assert "ckpt-3 is not complete" in not_three.why
    assert not not_three.never
    promoted = state_copy(MANAGER_STATE, "/shm/job", lambda name: name != "ckpt-3", promote=True)
    assert promoted.newest == "ckpt-2"
    assert promoted.text is not None
    assert promoted.text.startswith(b'model_checkpoint_path: "ckpt-2"\n')
    assert b'"ckpt-3"' not in promoted.text
    assert state_copy(MANAGER_STATE, "/shm/job", lambda _name: False, promote=True).text is None


def test_absolute_paths_inside_the_directory_become_relative_and_others_are_never_copied() -> None:
    inside = state_copy(b'model_checkpoint_path: "/shm/job/ckpt-7"\n', "/shm/job", lambda _name: True)
    assert inside.text == b'model_checkpoint_path: "ckpt-7"\n'
    outside = state_copy(b'model_checkpoint_path: "/data/ckpt-7"\n', "/shm/job", lambda _name: True)
    assert outside.text is None
    assert outside.never
    assert state_copy(b"last_preserved_timestamp: 1.0\n", "/shm/job", lambda _name: True).why == (
        "it names no checkpoint"
    )


def test_names_needing_escapes_are_written_as_tensorflow_reads_them() -> None:
    text = b'model_checkpoint_path: "/shm/job/caf\\303\\251 \\"q\\".ckpt-1"\n'
    copy = state_copy(text, "/shm/job", lambda _name: True)
    assert copy.newest == 'café "q".ckpt-1'
    assert copy.text == b'model_checkpoint_path: "caf\\303\\251 \\"q\\".ckpt-1"\n'
