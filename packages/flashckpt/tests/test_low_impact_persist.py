"""What keeps checkpointing from slowing training: a fast CRC-32 identical to zlib's, a sealing
thread at low priority, a persist rate cap, chunked writeback, and a detached saver that lowers its
whole session (autogroup) rather than only its niceness."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dlrover.common import ConfigError, ManualClock
from dlrover.flashckpt.checksum import CRC32_BACKEND, crc32, crc32_region
from dlrover.flashckpt.client import DetachedSaverSpec, SaverClient
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.host import SaverHostConfig
from dlrover.flashckpt.memory import MemoryReader
from dlrover.flashckpt.pacing import (
    PERSIST_MB_S_PER_CPU,
    Pacer,
    cpu_quota,
    default_persist_bandwidth_mb_s,
    pace_delay,
    usable_cpus,
)
from dlrover.flashckpt.payloads import payload_from_state
from dlrover.flashckpt.persist import persist_rank
from dlrover.flashckpt.saver import Saver, SaverConfig
from dlrover.flashckpt.stager import SealedNotice, Stager
from dlrover.flashckpt.storage import Chunk, InMemoryStorage, PosixStorage
from dlrover.flashckpt.storage_loader import StorageReader

# -- checksum ---------------------------------------------------------------------------------------


def test_backend_is_named() -> None:
    assert CRC32_BACKEND in ("isal", "zlib")


@given(st.binary(max_size=5000), st.integers(0, 2**32 - 1), st.integers(0, 5000), st.integers(0, 5000))
def test_crc32_equals_zlib_whatever_the_backend(data: bytes, seed: int, a: int, b: int) -> None:
    # Every checkpoint on disk and every slot in memory holds zlib's CRC-32: a faster backend must
    # give the same values, including when continuing a running CRC over pieces.
    assert crc32(data, seed) == zlib.crc32(data, seed)
    start, end = sorted((min(a, len(data)), min(b, len(data))))
    assert crc32_region(data, start, end - start, seed) == zlib.crc32(data[start:end], seed)
    assert crc32(data[end:], crc32(data[:end])) == zlib.crc32(data)


def test_without_isal_zlib_computes_the_same_values() -> None:
    code = (
        "import sys, zlib\n"
        "sys.modules['isal'] = None  # as if not installed\n"
        "from dlrover.flashckpt.checksum import CRC32_BACKEND, crc32_region\n"
        "data = bytes(range(256)) * 100\n"
        "print(CRC32_BACKEND, crc32_region(data, 3, 5000) == zlib.crc32(data[3:5003]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["zlib", "True"]


def test_crc32_region_spans_chunks() -> None:
    data = os.urandom((16 << 20) + 12345)  # one byte past the internal 16 MB piece and then some
    assert crc32_region(data, 7, len(data) - 7) == zlib.crc32(data[7:])


# -- pacing -----------------------------------------------------------------------------------------


def test_pace_delay_decisions() -> None:
    assert pace_delay(10**9, 0.0, 0)[0] == 0.0  # no cap
    assert pace_delay(100, 1.0, 100)[0] == 0.0  # exactly on the cap
    assert pace_delay(100, 2.0, 100)[0] == 0.0  # behind the cap
    delay, reason = pace_delay(300, 1.0, 100)
    assert delay == pytest.approx(2.0)
    assert "due" in reason
    for bad in ((-1, 0.0, 1.0), (1, -1.0, 1.0), (1, 0.0, -1.0)):
        with pytest.raises(ValueError, match="non-negative"):
            pace_delay(*bad)


@given(st.lists(st.integers(0, 10**7), max_size=30), st.floats(1e3, 1e9))
def test_pacer_average_never_exceeds_cap(writes: list[int], rate: float) -> None:
    clock = ManualClock()
    pacer = Pacer(rate, clock)
    done = 0
    for n in writes:
        done += n
        pacer.wrote(n)
        # Once the pacer returns, the bytes written so far took at least bytes/rate seconds
        # (up to float rounding of the clock's sum of pauses).
        assert clock.now() >= done / rate - 1e-9
    # ...and no longer than needed: it never pauses past the due time.
    assert clock.now() == pytest.approx(done / rate, rel=1e-6, abs=1e-9)


def test_pacer_rejects_bad_values() -> None:
    with pytest.raises(ConfigError, match="-1"):
        Pacer(-1, ManualClock())
    with pytest.raises(ValueError, match="-5"):
        Pacer(10, ManualClock()).wrote(-5)


def test_paced_persist_writes_the_same_checkpoint_and_takes_bytes_over_rate() -> None:
    state = {"w": torch.arange(300_000, dtype=torch.float32), "b": torch.ones(7), "step": 3}
    plain, paced = InMemoryStorage(), InMemoryStorage()
    persist_rank(plain, payload_from_state(3, 0, 1, state))
    clock = ManualClock()
    pacer = Pacer(1e6, clock)  # 1 MB/s: 1.2 MB of tensors take 1.2 s of the manual clock
    persist_rank(paced, payload_from_state(3, 0, 1, state), pacer=pacer)
    assert clock.now() == pytest.approx((300_000 * 4 + 7 * 4) / 1e6)
    for name in ("3/rank_00000.safetensors", "3/rank_00000.json", "3/rank_00000.done"):
        assert paced.read_bytes(name) == plain.read_bytes(name)


def test_the_default_cap_is_a_share_per_cpu_the_saver_may_run_on() -> None:
    assert default_persist_bandwidth_mb_s(1) == PERSIST_MB_S_PER_CPU
    assert default_persist_bandwidth_mb_s(96) == 96 * PERSIST_MB_S_PER_CPU
    assert default_persist_bandwidth_mb_s() == PERSIST_MB_S_PER_CPU * usable_cpus()
    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))
    for bad in (0, -2, True, 1.5):
        with pytest.raises(ValueError, match="cpus must be an int >= 1"):
            default_persist_bandwidth_mb_s(bad)  # type: ignore[arg-type]


@pytest.mark.timeout(60)
def test_the_default_cap_follows_the_cpus_a_process_is_confined_to() -> None:
    # Narrowed to one CPU as a cpuset, taskset or a launcher's binding would.
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "from dlrover.flashckpt.pacing import default_persist_bandwidth_mb_s as d; print(d())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=50)
    assert float(out.stdout) == PERSIST_MB_S_PER_CPU


def _cgroup(tmp_path: Path, proc_line: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(proc_line)
    return root, proc


def test_the_cpu_quota_is_read_from_cgroup_v2_and_v1(tmp_path: Path) -> None:
    # v2: the tightest cpu.max along the cgroup's path; "max" is no limit.
    root, proc = _cgroup(
        tmp_path / "v2",
        "0::/kubepods/pod1/ctr\n",
        {
            "kubepods/cpu.max": "max 100000",
            "kubepods/pod1/cpu.max": "250000 100000",
            "kubepods/pod1/ctr/cpu.max": "max",
        },
    )
    assert cpu_quota(root, proc) == 2.5
    # A cgroup namespace shows the container's own cgroup as "/".
    root, proc = _cgroup(tmp_path / "ns", "0::/\n", {"cpu.max": "150000 100000\n"})
    assert cpu_quota(root, proc) == 1.5
    # v1: cfs_quota_us over cfs_period_us under the cpu controller's mount; -1 is no limit.
    root, proc = _cgroup(
        tmp_path / "v1",
        "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/\n",
        {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "400000", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000"},
    )
    assert cpu_quota(root, proc) == 4.0
    unlimited = {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}
    root, proc = _cgroup(tmp_path / "none", "1:cpu:/\n0::/\n", unlimited)
    assert cpu_quota(root, proc) is None
    assert cpu_quota(tmp_path / "missing", tmp_path / "no-such-file") is None
    root, proc = _cgroup(tmp_path / "bad", "0::/\n", {"cpu.max": "lots 100000"})
    assert cpu_quota(root, proc) is None  # unreadable: no limit known
    # A group outside this namespace's view ("/../.."): no directory under the mount is it, so
    # another group's limit (here one named like its last part) is never read as this one's.
    root, proc = _cgroup(tmp_path / "outside", "0::/../../other\n", {"other/cpu.max": "50000 100000"})
    assert cpu_quota(root, proc) is None


def test_bandwidth_configs_are_validated(job_id: str, tmp_path: Path) -> None:
    expected = default_persist_bandwidth_mb_s()
    assert SaverConfig(job_id=job_id, run_id="r").persist_bandwidth_mb_s == expected
    assert SaverHostConfig(socket_path=str(tmp_path / "h.sock")).persist_bandwidth_mb_s == expected
    assert DetachedSaverSpec(job_id, "r", 1, str(tmp_path)).persist_bandwidth_mb_s == expected
    assert SaverConfig(job_id=job_id, run_id="r", persist_bandwidth_mb_s=0).persist_bandwidth_mb_s == 0  # no cap
    for bad in (-1.0, float("inf")):
        with pytest.raises(ConfigError, match="persist_bandwidth_mb_s"):
            SaverConfig(job_id=job_id, run_id="r", persist_bandwidth_mb_s=bad)
        with pytest.raises(ConfigError, match="persist_bandwidth_mb_s"):
            SaverHostConfig(socket_path=str(tmp_path / "h.sock"), persist_bandwidth_mb_s=bad)
        with pytest.raises(ConfigError, match="persist_bandwidth_mb_s"):
            DetachedSaverSpec(job_id, "r", 1, str(tmp_path), persist_bandwidth_mb_s=bad)


# -- the sealing thread -----------------------------------------------------------------------------


def test_sealing_thread_runs_at_low_priority_and_training_threads_do_not(job_id: str) -> None:
    seen: list[int] = []

    def on_sealed(_notice: SealedNotice) -> None:  # runs on the sealing thread
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    stager = Stager(StagerConfig(job_id=job_id, run_id="r"), on_sealed=on_sealed)
    try:
        stager.save(1, {"w": torch.ones(1000)})
        stager.flush(60)
        assert seen == [min(19, base + 19)]
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
        # Verification on load still works: the snapshot is sealed with zlib-compatible CRCs.
        loaded = MemoryReader(stager.config).load()
        assert torch.equal(loaded.state["w"], torch.ones(1000))
        assert loaded.verified
    finally:
        stager.close()


def test_seal_nice_zero_keeps_priority_and_bad_values_are_refused(job_id: str) -> None:
    seen: list[int] = []
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    stager = Stager(
        StagerConfig(job_id=job_id, run_id="r", seal_nice=0),
        on_sealed=lambda _n: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())),
    )
    try:
        stager.save(1, {"w": torch.ones(10)})
        stager.flush(60)
        assert seen == [base]
    finally:
        stager.close()
    for bad in (-1, 20, True, 1.5):
        with pytest.raises(ConfigError, match="seal_nice"):
            StagerConfig(job_id=job_id, run_id="r", seal_nice=bad)  # type: ignore[arg-type]


# -- writeback --------------------------------------------------------------------------------------


@given(st.lists(st.integers(0, 70_000), max_size=12), st.sampled_from([0, 4096, 65536]))
def test_windowed_writeback_writes_exactly_the_chunks(sizes: list[int], window: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        storage = PosixStorage(d, writeback_window_bytes=window)
        chunks = [os.urandom(n) for n in sizes]
        assert storage.write_file("a/f.bin", chunks) == sum(sizes)
        assert storage.read_bytes("a/f.bin") == b"".join(chunks)
        assert sorted(os.listdir(Path(d) / "a")) == ["f.bin"]


def test_windowed_writeback_checkpoint_loads(tmp_path: Path) -> None:
    storage = PosixStorage(tmp_path, writeback_window_bytes=4096)
    state = {"w": torch.randn(50_000), "step": 1}
    persist_rank(storage, payload_from_state(1, 0, 1, state))
    from dlrover.flashckpt.commit import Committer

    assert Committer(storage).try_commit(1, 1).commit
    assert torch.equal(StorageReader(storage).load(0, 1).state["w"], state["w"])


def test_writeback_window_is_validated(tmp_path: Path) -> None:
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="writeback_window_bytes"):
            PosixStorage(tmp_path, writeback_window_bytes=bad)  # type: ignore[arg-type]


# -- the detached saver's session -------------------------------------------------------------------

_LOWER = """
import os, sys
from pathlib import Path
from dlrover.flashckpt.priority import lower_process_priority
ok, why = lower_process_priority(int(sys.argv[1]), Path(sys.argv[2]))
print(ok, os.getpriority(os.PRIO_PROCESS, 0), why, sep="|")
"""


def _lower_in_child(nice: int, autogroup: Path) -> tuple[str, int, str]:
    # A child process: niceness cannot be lowered again, so the test process must keep its own.
    out = subprocess.run(
        [sys.executable, "-c", _LOWER, str(nice), str(autogroup)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        start_new_session=True,
    ).stdout.strip()
    ok, value, why = out.split("|", 2)
    return ok, int(value), why


def test_lower_process_priority_sets_niceness_and_autogroup(tmp_path: Path) -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    fake = tmp_path / "autogroup"
    fake.write_text("")
    ok, value, why = _lower_in_child(19, fake)
    assert (ok, value) == ("True", min(19, base + 19))
    assert fake.read_text() == f"{value}\n"
    assert "autogroup" in why
    ok, value, why = _lower_in_child(5, tmp_path / "missing")
    assert (ok, value) == ("False", min(19, base + 5))
    assert "does not exist" in why
    ok, value, why = _lower_in_child(0, fake)
    assert (ok, value) == ("False", base)
    assert "unchanged" in why


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="kernel without autogroup scheduling")
def test_lower_process_priority_reaches_the_real_autogroup() -> None:
    code = _LOWER + "print(Path('/proc/self/autogroup').read_text().strip())\n"
    out = subprocess.run(
        [sys.executable, "-c", code, "19", "/proc/self/autogroup"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        start_new_session=True,  # a session (and autogroup) of its own, as the detached saver has
    ).stdout.splitlines()
    ok, value, why = out[0].split("|", 2)
    # Writing needs only ownership of the process; a refusal is reported, never raised.
    if ok == "True":
        assert out[1].endswith(f"nice {value}")
    else:
        assert "cannot set" in why


def test_lower_process_priority_refuses_bad_values() -> None:
    from dlrover.flashckpt.priority import lower_process_priority

    for bad in (-1, 20, True):
        with pytest.raises(ValueError, match="nice"):
            lower_process_priority(bad)  # type: ignore[arg-type]


# -- the persist worker -----------------------------------------------------------------------------


class _BrokenStorage(InMemoryStorage):
    """A storage failing in a way no storage should (a bug), not with a `StorageError`."""

    def write_file(self, path: str, chunks: Iterable[Chunk]) -> int:
        raise RuntimeError("a bug in a storage backend")


def test_unexpected_persist_error_is_answered_not_left_waiting(job_id: str) -> None:
    saver = Saver(SaverConfig(job_id=job_id, run_id="r", lock_timeout_s=60), _BrokenStorage())
    saver.start()
    client = SaverClient(saver.socket_path, 0, 1)
    stager = Stager(StagerConfig(job_id=job_id, run_id="r", seal_in_background=False), on_sealed=client.notify_sealed)
    try:
        assert stager.save(1, {"w": torch.ones(10)}).saved
        client.request_persist(1)
        outcome = client.wait_persisted(1, 60)  # before the fix: no answer, a TimeoutError here
        assert not outcome.ok
        assert "a bug in a storage backend" in outcome.reason
        assert "persist_failed" in saver.events.kinds()
    finally:
        stager.close()
        client.close()
        saver.stop(remove_memory=True)
