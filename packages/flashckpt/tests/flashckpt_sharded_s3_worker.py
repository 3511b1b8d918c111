"""FSDP2 (``fully_shard``, CPU, gloo) jobs checkpointing to S3 (moto on 127.0.0.1) for test_sharded_s3.py.

The driver runs phases in order; every phase is a fresh job (its own run id: nothing in shared
memory) of WORLD ranks forked from it, each rank with its own s3fs client:

* ``train:WORLD``: trains 3 steps (see `flashckpt_sharded_worker.train`): steps 1 and 2 persisted
  to S3, through a staging directory under ``--staging``.
* ``restore:WORLD``: a model built from another seed loads the newest good step from S3.
* ``corrupt:STEP``: flips a byte in the middle of the first DCP data object of that step.
* ``failpersist:WORLD``: stages a step 5; rank 1's storage fails in the middle of uploading its
  first file; reports the decision, the tracker, the staging directory and whether the training
  state changed; then persists step 5 again without the fault.

Each line on stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from flashckpt_sharded_worker import build, digest, emit, restore, run_ranks, train
from flashckpt_testlib import s3_storage

from dlrover.flashckpt.commit import Committer
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.dcp_transfer import StagingConfig
from dlrover.flashckpt.errors import StorageError
from dlrover.flashckpt.sharded import ShardedCheckpointer, get_sharded_state
from dlrover.flashckpt.storage import Chunk, FsspecStorage

FSDP2 = 2  # the shared worker's model under fully_shard; the object-store path does not depend on it

UPLOAD_CHUNK = 512  # small, so that a data file goes up in several chunks and can fail half way


class FailingUpload:
    """A `Storage` whose `fail_at`-th `write_file` raises after its first chunk (mid-upload)."""

    def __init__(self, inner: FsspecStorage, fail_at: int) -> None:
        self.inner = inner
        self.root = inner.root
        self.fail_at = fail_at
        self.writes = 0

    def write_file(self, path: str, chunks: Iterable[Chunk]) -> int:
        self.writes += 1
        if self.writes != self.fail_at:
            return self.inner.write_file(path, chunks)

        def broken() -> Iterator[Chunk]:
            for n, chunk in enumerate(chunks):
                if n == 1:
                    raise StorageError(f"injected: connection reset uploading {path}")
                yield chunk

        return self.inner.write_file(path, broken())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CountingReads:
    """A `Storage` that records the objects this rank downloaded (`read_into`: data, not manifests)."""

    def __init__(self, inner: FsspecStorage) -> None:
        self.inner = inner
        self.root = inner.root
        self.read_paths: set[str] = set()

    def read_into(self, path: str, offset: int, out: Any) -> None:
        self.read_paths.add(path)
        self.inner.read_into(path, offset, out)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def run_rank(mode: str, rank: int, world: int, *, init: str, sink: Path, a: argparse.Namespace, phase: int) -> None:
    """One rank of one phase (a forked child of the driver)."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    cfg = StagerConfig(job_id=a.job, run_id=f"s3p{phase}", rank=rank, world_size=world, copy_threads=1)
    storage: Any = s3_storage(a.endpoint, a.bucket)
    if mode == "failpersist" and rank == 1:
        storage = FailingUpload(storage, fail_at=1)
    if mode == "restore":
        storage = CountingReads(storage)
    staging = StagingConfig(parent_dir=a.staging, chunk_bytes=UPLOAD_CHUNK)
    ckpt = ShardedCheckpointer(cfg, storage=storage, group=dist.new_group(backend="gloo"), staging=staging)
    try:
        if mode == "train":
            train(ckpt, world, rank, sink, FSDP2)
        elif mode == "restore":
            restore(ckpt, world, rank, sink, FSDP2)
            emit(sink, event="downloads", world=world, rank=rank, paths=sorted(storage.read_paths))
        else:
            fail_persist(ckpt, storage, world, rank, sink=sink, staging=a.staging)
        dist.barrier()
    finally:
        ckpt.close(remove=True)
    dist.destroy_process_group()


def fail_persist(ckpt: ShardedCheckpointer, storage: Any, world: int, rank: int, *, sink: Path, staging: str) -> None:
    model, opt = build(world, 5, FSDP2)
    state = get_sharded_state(model, opt)
    state["step"] = 5
    assert ckpt.save(5, state).saved
    ckpt.stager.flush()
    before = digest(model, opt)
    decision = ckpt.persist(5)
    after = digest(model, opt)
    tracker = Committer(storage).tracker()
    left = sorted(os.listdir(staging))
    dist.barrier()  # every rank has looked before anyone persists again
    if isinstance(storage, FailingUpload):
        storage.fail_at = 0  # the fault is gone
    retry = ckpt.persist(5)
    emit(
        sink,
        event="failpersist",
        rank=rank,
        committed=decision.commit,
        reason=decision.reason,
        tracker=None if tracker is None else tracker.step,
        staging_left=left,
        state_unchanged=before == after,
        events=[[e.kind, e.step, e.reason] for e in ckpt.events.snapshot()],
        retry_committed=retry.commit,
        retry_tracker=Committer(storage).tracker().step,  # type: ignore[union-attr]
    )


def corrupt(a: argparse.Namespace, step: int) -> None:
    """Flip one byte in the middle of the first DCP data object of `step`."""
    storage = s3_storage(a.endpoint, a.bucket)
    name = sorted(n for n in storage.list_dir(str(step)) if n.endswith(".distcp"))[0]
    path = f"{step}/{name}"
    raw = bytearray(storage.read_bytes(path))
    raw[len(raw) // 2] ^= 0xFF
    storage.write_file(path, [bytes(raw)])
    emit(None, event="corrupted", file=path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--job", required=True)
    p.add_argument("--endpoint", required=True)
    p.add_argument("--bucket", required=True)
    p.add_argument("--staging", required=True)
    p.add_argument("--tmp", required=True)
    p.add_argument("--timeout-s", type=float, default=100.0)
    p.add_argument("phases", nargs="+", help="train:WORLD, restore:WORLD, corrupt:STEP or failpersist:WORLD")
    a = p.parse_args()
    torch.set_num_threads(1)
    # Imported once before the ranks fork (it starts no thread): about a second less per phase.
    import s3fs  # noqa: F401

    for n, phase in enumerate(a.phases):
        mode, arg = phase.split(":")
        if mode == "corrupt":
            # In a forked child: the driver keeps no s3fs client (and no thread) into later forks.
            run_ranks(_corrupt_rank, (a, int(arg)), 1, tmp=Path(a.tmp), n=n, timeout_s=a.timeout_s)
            continue
        run_ranks(run_rank, (mode,), int(arg), tmp=Path(a.tmp), n=n, timeout_s=a.timeout_s, a=a, phase=n)


def _corrupt_rank(a: argparse.Namespace, step: int, _rank: int, _world: int, *, init: str, sink: Path) -> None:
    corrupt(a, step)


if __name__ == "__main__":
    main()
