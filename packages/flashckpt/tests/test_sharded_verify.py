"""A rank whose file check fails in any way still joins the collective with a failure flag."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from dlrover.flashckpt import dcp_site as dcp_site_mod
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.dcp_store import FileSum, verify_file
from dlrover.flashckpt.errors import StorageError
from dlrover.flashckpt.sharded import ShardedCheckpointer


def test_verify_file_wraps_a_failing_stat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gone = tmp_path / "gone.distcp"  # removed between the is_file check and the stat
    monkeypatch.setattr(Path, "is_file", lambda self: True)
    with pytest.raises(StorageError, match=r"cannot stat .*gone\.distcp"):
        verify_file(gone, {"bytes": 1, "crc32": 0})


class _RecordingGroup:
    """A one-rank group that records what each collective was given."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.gathered: list[list[int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def gather_ints(self, values: Sequence[int], width: int) -> list[list[int]]:
        self.gathered.append(list(values))
        return [list(values)]


@pytest.fixture
def ckpt(config: StagerConfig, tmp_path: Path) -> Iterator[ShardedCheckpointer]:
    c = ShardedCheckpointer(config, tmp_path / "ck")
    yield c
    c.close(remove=True)


def test_an_unexpected_verify_error_reaches_the_gather(
    ckpt: ShardedCheckpointer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for step in (1, 2):
        assert ckpt.save(step, {"w": torch.full((8,), float(step))}).saved
        ckpt.stager.flush()
        assert ckpt.persist(step).commit
    real_verify = dcp_site_mod.verify_file

    def flaky(path: Path, expected: FileSum) -> None:
        if path.parent.name == "2":
            raise PermissionError(13, "Permission denied", str(path))
        real_verify(path, expected)

    monkeypatch.setattr(dcp_site_mod, "verify_file", flaky)
    group = _RecordingGroup(ckpt._g)
    monkeypatch.setattr(ckpt, "_g", group)
    target = {"w": torch.zeros(8)}
    loaded = ckpt.load(target, from_memory=False)  # before the fix: PermissionError, no gather
    assert loaded.step == 1
    assert torch.equal(target["w"], torch.full((8,), 1.0))
    assert group.gathered[0] == [0]  # step 2: this rank reported file 0 as bad
    assert "verify_failed" in ckpt.events.kinds()
