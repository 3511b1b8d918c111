"""Owned temp dirs (dlrover.common.tempdirs): removed on exit, and by a later sweep once the owner is gone."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from dlrover.common import ProcessIdentity, owned_temp_dir, pid_scope, remove_dead_owners

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not os.path.exists("/proc/self/ns/pid"), reason="needs Linux /proc"),
]

PREFIX = "dlrover-test-"
WAIT_S = 30.0


@pytest.fixture(scope="module")
def dead() -> ProcessIdentity:
    """The identity of a real process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    identity = ProcessIdentity.of(proc.pid)
    proc.communicate(b"", timeout=WAIT_S)
    assert identity is not None
    assert not identity.alive()
    return identity


def _named(root: Path, owner: ProcessIdentity, scope: int | None = None, rest: str = "abc123_x") -> Path:
    scope = pid_scope() if scope is None else scope
    return root / f"{PREFIX}{owner.pid}-{owner.start_ticks}-{scope}-{rest}"


def _dir_of(root: Path, owner: ProcessIdentity, **kwargs: object) -> Path:
    path = _named(root, owner, **kwargs)  # type: ignore[arg-type]
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "token").write_text("secret")
    return path


# -- owned_temp_dir --------------------------------------------------------------------------------


def test_an_owned_dir_is_private_named_after_this_process_and_removed_on_exit(tmp_path: Path) -> None:
    me = ProcessIdentity.current()
    assert me is not None
    with owned_temp_dir(PREFIX, dir=tmp_path) as path:
        assert path.parent == tmp_path
        assert path.name.startswith(f"{PREFIX}{me.pid}-{me.start_ticks}-{pid_scope()}-")
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
        (path / "nested").mkdir()
        (path / "nested" / "file").write_text("x")
        assert remove_dead_owners(PREFIX, dir=tmp_path) == []  # its owner, this process, is alive
        assert path.is_dir()
    assert not path.exists()


def test_an_owned_dir_is_removed_when_the_block_raises(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"), owned_temp_dir(PREFIX, dir=tmp_path) as path:
        raise RuntimeError("boom")
    assert not path.exists()


def test_a_dir_already_removed_by_someone_else_ends_the_block_quietly(tmp_path: Path) -> None:
    with owned_temp_dir(PREFIX, dir=tmp_path) as path:
        path.rmdir()
    assert list(tmp_path.iterdir()) == []


def test_the_system_temp_dir_is_the_default(
    tmp_path: Path, dead: ProcessIdentity, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # what $TMPDIR sets, without the cache
    with owned_temp_dir(PREFIX) as path:
        assert path.parent == tmp_path
    stale = _dir_of(tmp_path, dead)
    assert remove_dead_owners(PREFIX) == [stale]


def test_without_a_known_identity_the_dir_is_removed_on_exit_but_never_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ProcessIdentity, "current", classmethod(lambda cls: None))
    with owned_temp_dir(PREFIX, dir=tmp_path) as path:
        assert "-" not in path.name[len(PREFIX) :]  # mkdtemp's random part alone: does not parse
        monkeypatch.setattr(ProcessIdentity, "alive", lambda self: False)
        assert remove_dead_owners(PREFIX, dir=tmp_path) == []
        assert path.is_dir()
    assert not path.exists()


@pytest.mark.parametrize("prefix", ["", "a/b", "../x", "with space", "x" * 65])
def test_a_bad_prefix_is_refused_naming_it(tmp_path: Path, prefix: str) -> None:
    with pytest.raises(ValueError, match="temp dir prefix"), owned_temp_dir(prefix, dir=tmp_path):
        pass
    with pytest.raises(ValueError, match="temp dir prefix"):
        remove_dead_owners(prefix, dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


# -- remove_dead_owners ----------------------------------------------------------------------------


def test_a_dead_owner_s_dir_is_removed_and_logged_a_live_owner_s_kept(
    tmp_path: Path, dead: ProcessIdentity, caplog: pytest.LogCaptureFixture
) -> None:
    me = ProcessIdentity.current()
    assert me is not None
    stale = _dir_of(tmp_path, dead)
    live = _dir_of(tmp_path, me)
    with caplog.at_level(logging.INFO, logger="dlrover.common.tempdirs"):
        assert remove_dead_owners(PREFIX, dir=tmp_path) == [stale]
    assert not stale.exists()
    assert (live / "sub" / "token").read_text() == "secret"
    assert f"removed {stale}" in caplog.text
    assert remove_dead_owners(PREFIX, dir=tmp_path) == []  # nothing left to do


def test_a_reused_pid_does_not_keep_the_dead_owner_s_dir(tmp_path: Path) -> None:
    me = ProcessIdentity.current()
    assert me is not None
    stale = _dir_of(tmp_path, ProcessIdentity(me.pid, me.start_ticks + 1))  # same pid, other process
    assert remove_dead_owners(PREFIX, dir=tmp_path) == [stale]


@pytest.mark.parametrize(
    "name",
    [
        "dlrover-test-abcdefgh",  # an old-style name: owner unknown
        "dlrover-test-12-34-x-y",
        "dlrover-test--34-56-y",
        "dlrover-test-12-34-56-",
        "dlrover-test-12-34-56",
        "xdlrover-test-12-34-56-y",
        "dlrover-other-12-34-56-y",  # another prefix is never this sweep's business
    ],
)
def test_a_name_that_does_not_parse_is_left_alone(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name = name.replace("56", str(pid_scope()))
    (tmp_path / name).mkdir()
    monkeypatch.setattr(ProcessIdentity, "alive", lambda self: False)  # every parsed owner is dead
    assert remove_dead_owners(PREFIX, dir=tmp_path) == []
    assert (tmp_path / name).is_dir()


def test_a_dir_of_another_host_or_pid_namespace_is_left_alone(tmp_path: Path, dead: ProcessIdentity) -> None:
    scope = pid_scope()
    assert scope is not None
    other = _dir_of(tmp_path, dead, scope=scope + 1)
    assert remove_dead_owners(PREFIX, dir=tmp_path) == []
    assert other.is_dir()


def test_a_symlink_is_neither_removed_nor_followed(tmp_path: Path, dead: ProcessIdentity) -> None:
    target = tmp_path / "target"
    (target / "inner").mkdir(parents=True)
    (target / "inner" / "keep").write_text("keep")
    root = tmp_path / "tmp"
    root.mkdir()
    link = _named(root, dead)
    link.symlink_to(target, target_is_directory=True)
    assert remove_dead_owners(PREFIX, dir=root) == []
    assert link.is_symlink()
    assert (target / "inner" / "keep").read_text() == "keep"


def test_a_symlink_inside_a_removed_dir_is_not_followed(tmp_path: Path, dead: ProcessIdentity) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    root = tmp_path / "tmp"
    root.mkdir()
    stale = _dir_of(root, dead)
    (stale / "link").symlink_to(outside, target_is_directory=True)
    assert remove_dead_owners(PREFIX, dir=root) == [stale]
    assert (outside / "keep").read_text() == "keep"


def test_a_file_with_a_dead_owner_s_name_is_left_alone(tmp_path: Path, dead: ProcessIdentity) -> None:
    path = _named(tmp_path, dead)
    path.write_text("not a dir")
    assert remove_dead_owners(PREFIX, dir=tmp_path) == []
    assert path.read_text() == "not a dir"


def test_a_dir_of_another_user_is_left_alone(
    tmp_path: Path, dead: ProcessIdentity, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale = _dir_of(tmp_path, dead)
    monkeypatch.setattr(os, "getuid", lambda: stale.stat().st_uid + 1)  # the sweeper is someone else
    assert remove_dead_owners(PREFIX, dir=tmp_path) == []
    assert stale.is_dir()
    monkeypatch.undo()
    assert remove_dead_owners(PREFIX, dir=tmp_path) == [stale]


def test_a_dir_removed_by_another_sweep_meanwhile_is_skipped_without_error(
    tmp_path: Path, dead: ProcessIdentity, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale = _dir_of(tmp_path, dead)
    real_alive = ProcessIdentity.alive

    def alive_and_meanwhile_removed(self: ProcessIdentity) -> bool:
        # Another sweep wins the race between this one's checks and its removal.
        (stale / "sub" / "token").unlink()
        (stale / "sub").rmdir()
        stale.rmdir()
        return real_alive(self)

    monkeypatch.setattr(ProcessIdentity, "alive", alive_and_meanwhile_removed)
    assert remove_dead_owners(PREFIX, dir=tmp_path) == []


def test_a_missing_temp_dir_is_a_warning_not_an_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="dlrover.common.tempdirs"):
        assert remove_dead_owners(PREFIX, dir=tmp_path / "missing") == []
    assert "cannot list" in caplog.text


_SWEEPER = textwrap.dedent(
    """
    import json, sys
    from dlrover.common import remove_dead_owners
    sys.stdin.readline()  # start together
    print(json.dumps([str(p) for p in remove_dead_owners(sys.argv[1], dir=sys.argv[2])]), flush=True)
    """
)


@pytest.mark.timeout(120)
def test_concurrent_sweeps_remove_each_dir_once_and_never_raise(tmp_path: Path, dead: ProcessIdentity) -> None:
    stale = {_dir_of(tmp_path, dead, rest=f"r{i}") for i in range(60)}
    for path in stale:
        for j in range(5):
            (path / f"f{j}").write_text("x")
    sweepers = [
        subprocess.Popen(
            [sys.executable, "-c", _SWEEPER, PREFIX, str(tmp_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = [proc.communicate("go\n", timeout=90) for proc in sweepers]
    for proc, (_, err) in zip(sweepers, results, strict=True):
        assert proc.returncode == 0, err
    removed = [Path(p) for out, _ in results for p in json.loads(out)]
    assert sorted(removed) == sorted(stale)  # every dir reported by exactly one sweeper
    assert list(tmp_path.iterdir()) == []
