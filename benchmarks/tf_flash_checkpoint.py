"""Flash checkpoints of a TensorFlow parameter-server job: what a save costs the chief in memory and in storage.

A chief (this process), two parameter servers and a worker (processes of this host) under
`ParameterServerStrategy` hold a model of two embedding tables (`--mib` MiB in all, one on each server).
`tf.train.CheckpointManager` saves it, each server writing its own share, into:

* ``memory``: a directory in /dev/shm, what `dlrover-master ps-job` gives the chief (`--flash-root`); the master
  then copies each checkpoint to storage in the background (`checkpoint_mirror.mirror_once`, timed here too);
* ``storage``: a directory on the disk (`--storage`), what the chief saves to without DLRover. TensorFlow does not
  flush its files, so the page cache absorbs the write: ``storage+fsync`` adds the flush that makes it durable.

Each save is timed as the chief sees it (`manager.save()`), and a restore (`checkpoint.restore`, the servers
reading their shares, then one value read back) from each. The ratios are against a durable save to storage, the
cost a chief pays without flash checkpoints; the background copy is against `cp` of the same files with a flush,
the disk's own limit. On this machine storage is a local disk; a network file system (what jobs on many hosts
save to) makes the storage rows slower and leaves the memory rows as they are.

    python benchmarks/tf_flash_checkpoint.py              # 256 MiB, 5 saves each
    python benchmarks/tf_flash_checkpoint.py --mib 1024 --saves 3

Needs TensorFlow (the `tests-tensorflow` session's venv); without it, it says so and measures nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchkit import fmt, free_port, median

from dlrover.master.psjob.checkpoint_mirror import mirror_once
from dlrover.master.psjob.flash import DEFAULT_FLASH_ROOT

ROOT = Path(__file__).resolve().parents[1]


def _filesystem(path: Path) -> str:
    """The type of the file system `path` is on (from /proc/mounts)."""
    best, kind = "", "?"
    resolved = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        _dev, mount, fstype, *_ = line.split()
        if resolved.startswith(mount) and len(mount) > len(best):
            best, kind = mount, fstype
    return kind


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_with_flush(files: list[Path], into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for path in files:
        shutil.copyfile(path, into / path.name)
    _fsync_tree(into)


def serve(cluster: dict[str, list[str]], job: str, index: int) -> None:
    import tensorflow as tf

    spec = tf.train.ClusterSpec(cluster)
    tf.distribute.Server(spec, job_name=job, task_index=index, protocol="grpc", start=True).join()


def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    import tensorflow as tf

    # The strategy needs a worker; the saves and restores involve only the chief and the servers.
    cluster = {"chief": [f"127.0.0.1:{free_port()}"], "ps": [f"127.0.0.1:{free_port()}" for _ in range(2)],
               "worker": [f"127.0.0.1:{free_port()}"]}  # fmt: skip
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    servers = [subprocess.Popen([sys.executable, __file__, "--serve", json.dumps(cluster), job, str(i)], env=env)
               for job, i in (("ps", 0), ("ps", 1), ("worker", 0))]  # fmt: skip
    try:
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc"
        )
        strategy = tf.distribute.ParameterServerStrategy(resolver)
        rows = args.mib * 1024 * 1024 // 2 // (64 * 4)
        with strategy.scope():  # one table per server, 64 float32 columns
            tables = [tf.Variable(tf.random.uniform([rows, 64]), name=f"table{i}") for i in range(2)]
        checkpoint = tf.train.Checkpoint(tables=tables)
        memory = Path(tempfile.mkdtemp(prefix="dlrover-bench-flash-", dir=args.flash_root))
        storage = Path(tempfile.mkdtemp(prefix="dlrover-bench-storage-", dir=args.storage))
        mirrored = Path(tempfile.mkdtemp(prefix="dlrover-bench-mirror-", dir=args.storage))
        peer = Path(tempfile.mkdtemp(prefix="dlrover-bench-cp-", dir=args.storage))
        times: dict[str, list[float]] = {k: [] for k in ("memory", "storage", "storage+fsync", "restore memory",
                                                         "restore storage", "mirror", "cp+fsync")}  # fmt: skip
        try:
            managers = {d: tf.train.CheckpointManager(checkpoint, str(d), max_to_keep=2) for d in (memory, storage)}
            for n in range(args.saves):
                for way, directory in (("memory", memory), ("storage", storage), ("storage+fsync", storage)):
                    began = time.perf_counter()
                    managers[directory].save()
                    if way == "storage+fsync":
                        _fsync_tree(directory)
                    times[way].append(time.perf_counter() - began)
                began = time.perf_counter()
                mirror_once(memory, mirrored)
                times["mirror"].append(time.perf_counter() - began)
                files = sorted(memory.glob(f"{Path(managers[memory].latest_checkpoint).name}.*"))
                began = time.perf_counter()
                _copy_with_flush(files, peer / str(n))
                times["cp+fsync"].append(time.perf_counter() - began)
                shutil.rmtree(peer / str(n))
                for way, directory in (("restore memory", memory), ("restore storage", storage)):
                    began = time.perf_counter()
                    checkpoint.restore(managers[directory].latest_checkpoint).assert_consumed()
                    float(tables[0][0, 0].numpy())
                    times[way].append(time.perf_counter() - began)
            size = sum(p.stat().st_size for p in files)
            print(f"  checkpoint of {size / 2**20:.0f} MiB; memory on {_filesystem(memory)}, storage on "
                  f"{_filesystem(storage)}", flush=True)  # fmt: skip
        finally:
            for directory in (memory, storage, mirrored, peer):
                shutil.rmtree(directory, ignore_errors=True)
        return times
    finally:
        for server in servers:
            server.kill()
            server.wait(timeout=30)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--serve"]:
        serve(json.loads(argv[1]), argv[2], int(argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="the model's size")
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--flash-root", default=DEFAULT_FLASH_ROOT)
    parser.add_argument("--storage", default=str(ROOT), help="a directory on the storage to compare with")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("tensorflow") is None:
        print("tf_flash_checkpoint: not measured: tensorflow is not installed here (use the venv of "
              "`nox -s tests-tensorflow`)")  # fmt: skip
        return 0
    times = measure(args)
    durable = median(times["storage+fsync"])
    cp = median(times["cp+fsync"])
    print(f"\nTensorFlow PS checkpoint of a {args.mib} MiB model, chief + 2 parameter servers (median of "
          f"{args.saves}); ratio against a durable save to storage, the copy against cp with a flush")  # fmt: skip
    print("| what | seconds | ratio |")
    print("|---|---|---|")
    for what, peer in (("memory", durable), ("storage", durable), ("storage+fsync", durable),
                       ("restore memory", median(times["restore storage"])), ("restore storage", None),
                       ("mirror", cp), ("cp+fsync", None)):  # fmt: skip
        value = median(times[what])
        ratio = None if value is None or peer is None else value / peer
        print(f"| {what} | {fmt(value)} | {fmt(ratio)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
