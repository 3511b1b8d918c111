"""Sharded (FSDP2) checkpoints on real S3: moto's server on 127.0.0.1 through s3fs, 2-rank gloo jobs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from flashckpt_testlib import s3_bucket, s3_storage

from dlrover.flashckpt.commit import Committer, Tracker
from dlrover.flashckpt.segment import remove_run

WORKER = str(Path(__file__).with_name("flashckpt_sharded_s3_worker.py"))


@pytest.mark.integration
@pytest.mark.timeout(170)
def test_fsdp2_on_s3_reshards_falls_back_and_survives_a_failed_upload(
    s3_endpoint: str, job_id: str, tmp_path: Path
) -> None:
    bucket = s3_bucket(s3_endpoint)
    staging = tmp_path / "staging"
    staging.mkdir()
    phases = ["train:2", "restore:1", "corrupt:2", "restore:2", "failpersist:2"]
    try:
        proc = subprocess.run(
            [
                *(sys.executable, WORKER, "--job", job_id, "--endpoint", s3_endpoint, "--bucket", bucket),
                *("--staging", str(staging), "--tmp", str(tmp_path), *phases),
            ],
            capture_output=True,
            text=True,
            timeout=160,
            check=False,
        )
    finally:
        for n in range(len(phases)):
            remove_run("/dev/shm", job_id, f"s3p{n}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    trained = [e for e in events if e["event"] == "trained"]
    full = {e["step"]: e["full"] for e in trained}
    # Step 1 persisted in the foreground, step 2 in the background: both committed to S3.
    assert [e["committed"] for e in trained] == [True, None, True]
    assert full[1] != full[2] != full[3]
    storage = s3_storage(s3_endpoint, bucket)
    names = set(storage.list_dir("2"))
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "rank_00000.done", "rank_00001.done", "manifest.json"} <= names
    manifest = json.loads(storage.read_bytes("2/manifest.json"))
    assert set(manifest["files"]) == {n for n in names if n not in ("manifest.json",) and not n.endswith(".done")}

    loaded = {(e["world"], e["rank"]): e for e in events if e["event"] == "loaded"}
    assert sorted(loaded) == [(1, 0), (2, 0), (2, 1)]
    # A fresh job of ONE rank: the two-rank step 2 from S3, resharded, bit for bit.
    e = loaded[(1, 0)]
    assert (e["source"], e["step"], e["state_step"]) == ("storage", 2, 2)
    assert e["full"] == full[2]
    # After an object of step 2 was damaged in S3: both ranks name it and load step 1, bit for bit.
    corrupted = next(e["file"] for e in events if e["event"] == "corrupted")
    for r in (0, 1):
        e = loaded[(2, r)]
        assert (e["source"], e["step"], e["state_step"]) == ("storage", 1, 1)
        assert e["full"] == full[1]
        fallbacks = [reason for k, _, reason in e["events"] if k == "fallback"]
        assert any(corrupted in reason and "step 2" in reason for reason in fallbacks), fallbacks

    # The two ranks of one host share one staging copy: each file of the step they loaded was
    # downloaded once, by one of them, and each of them downloaded a share.
    downloads = {e["rank"]: e["paths"] for e in events if e["event"] == "downloads" and e["world"] == 2}
    step1 = {f"1/{n}" for n in json.loads(storage.read_bytes("1/manifest.json"))["files"]}
    mine = [set(downloads[r]) & step1 for r in (0, 1)]
    assert mine[0] | mine[1] == step1
    assert not mine[0] & mine[1]
    assert all(mine)
    alone = next(e["paths"] for e in events if e["event"] == "downloads" and e["world"] == 1)
    assert {p for p in alone if p.startswith("2/")} == {f"2/{n}" for n in manifest["files"]}

    # Rank 1's upload failed half way: step 5 is not committed, on every rank, and the tracker
    # stays at 2; nothing staged is left, the training state is untouched; without the fault the
    # same step commits over the leftovers.
    failed = {e["rank"]: e for e in events if e["event"] == "failpersist"}
    assert sorted(failed) == [0, 1]
    for e in failed.values():
        assert (e["committed"], e["tracker"], e["staging_left"], e["state_unchanged"]) == (False, 2, [], True)
        assert (e["retry_committed"], e["retry_tracker"]) == (True, 5)
    assert "injected: connection reset" in failed[1]["reason"]
    assert any(k == "persist_failed" and "injected" in reason for k, _, reason in failed[1]["events"])
    assert Committer(storage).tracker() == Tracker(5, 2)
    assert list(staging.iterdir()) == []
