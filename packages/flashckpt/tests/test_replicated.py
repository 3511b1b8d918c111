"""`FlashCheckpointer(replicated=True)`: a DDP state restored from the newest copy any rank holds.

The multi-rank cases run real gloo process groups; each rank has a shared-memory directory of its
own, as ranks on separate nodes do, so a rank sees only what its "node" staged.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flashckpt_testlib import replica_state, same_bits, zeros_like_state

from dlrover.flashckpt import Committer, FlashCheckpointer, PosixStorage, StagerConfig, Tracker
from dlrover.flashckpt.segment import ShmSegment, segment_path
from dlrover.flashckpt.slotio import read_header

WORKER = str(Path(__file__).with_name("flashckpt_replicated_worker.py"))


def _stage(
    shm: Path, job: str, rank: int, world: int, *, seed: int, steps: list[int], storage: Path, persist: bool = False
) -> None:
    """Save `steps` of ``replica_state(seed, step)`` as `rank` of `world` into `shm` (and storage)."""
    shm.mkdir(parents=True, exist_ok=True)
    cfg = StagerConfig(job_id=job, run_id="r", rank=rank, world_size=world, shm_dir=str(shm))
    ckpt = FlashCheckpointer(cfg, str(storage), saver="none", replicated=True)
    for step in steps:
        ckpt.save(step, replica_state(seed, step), persist=persist)
    ckpt.stager.flush()
    ckpt.close()  # the snapshots stay in memory


def _target() -> dict[str, Any]:
    state = zeros_like_state(replica_state(0, 0), memo={})
    state["counts"] = np.zeros(5, dtype=np.int64)
    return state


def _run(
    tmp: Path,
    job: str,
    world: int,
    *,
    target: str = "in-place",
    expect: tuple[int, int] = (0, 0),
    chunk_bytes: int = 0,
) -> dict[int, dict[str, Any]]:
    """Run `world` worker ranks, rank r with shared memory ``tmp/shm<r>``; their reports by rank."""
    procs = []
    for rank in range(world):
        (tmp / f"shm{rank}").mkdir(exist_ok=True)
        cmd = [
            sys.executable, WORKER, f"--rank={rank}", f"--world={world}", f"--init=file://{tmp / 'pg.init'}",
            f"--job={job}", f"--shm={tmp / f'shm{rank}'}", f"--storage={tmp / 'ck'}", f"--target={target}",
            f"--expect-seed={expect[0]}", f"--expect-step={expect[1]}", f"--chunk-bytes={chunk_bytes}",
        ]  # fmt: skip
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    reports = {}
    for proc in procs:
        out, err = proc.communicate(timeout=100)
        assert proc.returncode == 0, err[-3000:]
        report = json.loads(out.strip().splitlines()[-1])
        reports[report["rank"]] = report
    return reports


def test_a_rank_renumbered_by_a_shrink_restores_the_snapshot_its_node_saved_under_its_old_rank(
    job_id: str, tmp_path: Path
) -> None:
    shm = tmp_path / "shm"
    _stage(shm, job_id, rank=1, world=2, seed=7, steps=[1, 2], storage=tmp_path / "ck")
    _stage(shm, job_id, rank=0, world=2, seed=7, steps=[1], storage=tmp_path / "ck")
    ckpt = FlashCheckpointer(
        StagerConfig(job_id=job_id, run_id="r", shm_dir=str(shm)), str(tmp_path / "ck"), saver="none", replicated=True
    )
    target = _target()
    loaded = ckpt.load(target=target)
    assert (loaded.step, loaded.source, loaded.verified) == (2, "memory", True)
    assert loaded.state is target
    assert same_bits(replica_state(7, 2), target)
    ckpt.close(job_end=True)
    assert list(shm.iterdir()) == []  # the whole run's memory goes at the job's end, old ranks' included


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("target", "chunk_bytes"),
    # A staging buffer of 997 bytes cuts tensors across pieces and packs small ones into one.
    [("in-place", 0), ("fresh", 0), ("fresh", 997), ("noncontiguous", 997)],
)
def test_a_rank_that_joined_with_no_snapshot_receives_it_from_one_that_has_it(
    job_id: str, tmp_path: Path, target: str, chunk_bytes: int
) -> None:
    _stage(tmp_path / "shm0", job_id, rank=0, world=1, seed=5, steps=[1, 2, 3], storage=tmp_path / "ck")
    reports = _run(tmp_path, job_id, world=2, target=target, expect=(5, 3), chunk_bytes=chunk_bytes)
    for r in reports.values():
        assert (r["step"], r["source"], r["verified"], r["equal"], r["tied"]) == (3, "memory", True, True, True)
        assert r["in_place"]
    assert "received" not in reports[0]["detail"]
    assert reports[1]["detail"].endswith("received from rank 0")


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_damaged_copy_is_replaced_by_a_peers_and_the_newest_step_anywhere_wins(job_id: str, tmp_path: Path) -> None:
    _stage(tmp_path / "shm0", job_id, rank=0, world=3, seed=9, steps=[3, 4], storage=tmp_path / "ck")
    _stage(tmp_path / "shm1", job_id, rank=1, world=3, seed=9, steps=[3, 4], storage=tmp_path / "ck")
    _stage(tmp_path / "shm2", job_id, rank=2, world=3, seed=9, steps=[2, 3], storage=tmp_path / "ck")
    seg = ShmSegment.attach(segment_path(tmp_path / "shm0", job_id, "r", 0, 1))
    header = read_header(seg)
    assert header is not None
    assert header.step == 4
    seg.mm[header.data_off + 3] ^= 0xFF
    seg.close()

    reports = _run(tmp_path, job_id, world=3, expect=(9, 4))
    for r in reports.values():
        assert (r.get("step"), r.get("source"), r.get("equal")) == (4, "memory", True), r
    # Rank 1 alone holds a good step 4 (rank 0's is damaged, rank 2's newest is 3): it sends it.
    assert reports[0]["detail"].endswith("received from rank 1")
    assert "received" not in reports[1]["detail"]
    assert reports[2]["detail"].endswith("received from rank 1")


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_with_nothing_in_memory_a_checkpoint_of_another_world_size_loads_from_storage(
    job_id: str, tmp_path: Path
) -> None:
    # Committed by two ranks into storage; their memory is on other "nodes" (gone).
    for rank in (0, 1):
        _stage(tmp_path / "gone", job_id, rank=rank, world=2, seed=3, steps=[6], storage=tmp_path / "ck", persist=True)
    assert Committer(PosixStorage(tmp_path / "ck")).tracker() == Tracker(6, 2)
    for path in (tmp_path / "gone").iterdir():
        path.unlink()

    reports = _run(tmp_path, job_id, world=3, expect=(3, 6))
    for r in reports.values():
        assert (r["step"], r["source"], r["equal"], r["in_place"]) == (6, "storage", True, True)
    assert [r["detail"].endswith("received from rank 0") for _, r in sorted(reports.items())] == [False, True, True]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_state_that_does_not_fit_fails_on_every_rank_and_no_rank_hangs(job_id: str, tmp_path: Path) -> None:
    _stage(tmp_path / "shm0", job_id, rank=0, world=1, seed=5, steps=[1], storage=tmp_path / "ck")
    reports = _run(tmp_path, job_id, world=2, target="mismatch")  # rank 1's target differs
    for r in reports.values():
        assert r["error"] == "StateStructureError", r
        assert "[47, 16]" in r["reason"]
    assert "rank 1's state does not match" in reports[0]["reason"]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_copy_that_fails_while_receiving_fails_every_rank_and_no_rank_hangs(job_id: str, tmp_path: Path) -> None:
    _stage(tmp_path / "shm0", job_id, rank=0, world=1, seed=5, steps=[1], storage=tmp_path / "ck")
    reports = _run(tmp_path, job_id, world=2, target="unwritable", chunk_bytes=997)  # rank 1's momentum
    assert reports[1]["error"] == "RuntimeError", reports  # its own error: the expanded tensor's
    assert reports[0]["error"] == "FlashCkptError", reports
    assert "rank 1 failed" in reports[0]["reason"]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_when_every_rank_holds_the_step_each_restores_its_own_copy(job_id: str, tmp_path: Path) -> None:
    for rank in (0, 1):
        _stage(tmp_path / f"shm{rank}", job_id, rank=rank, world=2, seed=4, steps=[5, 6], storage=tmp_path / "ck")
    reports = _run(tmp_path, job_id, world=2, expect=(4, 6))
    for rank, r in reports.items():
        assert (r["step"], r["source"], r["equal"], r["in_place"]) == (6, "memory", True, True)
        assert f".r{rank}.s" in r["detail"]
        assert "received" not in r["detail"]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_with_no_checkpoint_anywhere_every_rank_says_so(job_id: str, tmp_path: Path) -> None:
    reports = _run(tmp_path, job_id, world=2)
    for r in reports.values():
        assert r["error"] == "NoCheckpointError", r
        assert "no loadable committed checkpoint" in r["reason"]


def test_replicated_refuses_an_agree_function_too(job_id: str, tmp_path: Path) -> None:
    from dlrover.common import ConfigError
    from dlrover.flashckpt import agree_single

    cfg = StagerConfig(job_id=job_id, run_id="r", shm_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="not both"):
        FlashCheckpointer(cfg, str(tmp_path / "ck"), saver="none", replicated=True, agree=agree_single)


def test_a_multi_rank_config_without_a_process_group_is_refused_at_load(job_id: str, tmp_path: Path) -> None:
    cfg = StagerConfig(job_id=job_id, run_id="r", rank=0, world_size=2, shm_dir=str(tmp_path))
    ckpt = FlashCheckpointer(cfg, str(tmp_path / "ck"), saver="none", replicated=True)
    try:
        with pytest.raises(Exception, match=r"initialise torch\.distributed"):
            ckpt.load()
    finally:
        ckpt.close(job_end=True)
