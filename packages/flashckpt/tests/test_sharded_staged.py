"""Sharded checkpoints on a non-POSIX `Storage` (the in-memory fake): the local staging copy, the
streamed upload and download, who uploads what, and that no staging directory survives any path."""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from flashckpt_testlib import same_bits
from hypothesis import given
from hypothesis import strategies as st

from dlrover.common import ConfigError
from dlrover.flashckpt import sharded as sharded_mod
from dlrover.flashckpt.ckpt_format import manifest_path
from dlrover.flashckpt.commit import Committer, Tracker
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.dcp_site import STAGING_PREFIX, NodeShare, StagedDcpSite, dcp_site, node_share
from dlrover.flashckpt.dcp_store import staged_owners
from dlrover.flashckpt.dcp_transfer import StagingConfig, download_file, upload_file
from dlrover.flashckpt.errors import ChecksumError, LayoutError, StateStructureError, StorageError
from dlrover.flashckpt.sharded import ShardedCheckpointer
from dlrover.flashckpt.storage import Chunk, InMemoryStorage, PosixStorage

# Single-rank tests run DCP without a process group on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

CHUNK = 64  # small: every data file goes up and comes down in several chunks


def _state(seed: float) -> dict[str, Any]:
    return {
        "model": {"0.weight": torch.full((6, 5), seed), "0.bias": torch.arange(7, dtype=torch.int16) + int(seed)},
        "optim": {"param_groups": [{"lr": seed}]},
        "step": int(seed),
    }


class RecordingStorage(InMemoryStorage):
    """The in-memory fake, counting writes per path and the chunk sizes of each; its `fail_at`-th
    write (1-based; 0: never) raises after its first chunk, i.e. in the middle of an upload."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: dict[str, int] = {}
        self.chunk_sizes: dict[str, list[int]] = {}
        self.fail_at = 0
        self.count = 0
        self.failed: list[str] = []

    def write_file(self, path: str, chunks: Iterable[Chunk]) -> int:
        self.count += 1
        self.writes[path] = self.writes.get(path, 0) + 1
        sizes = self.chunk_sizes.setdefault(path, [])
        failing = self.count == self.fail_at
        if failing:
            self.failed.append(path)

        def counted() -> Iterator[Chunk]:
            for chunk in chunks:
                sizes.append(len(memoryview(chunk).cast("B")))
                yield chunk
                if failing:
                    raise StorageError(f"injected: connection reset writing {path}")

        return super().write_file(path, counted())


@pytest.fixture
def staging(tmp_path: Path) -> Path:
    path = tmp_path / "staging"
    path.mkdir()
    return path


@pytest.fixture
def storage() -> RecordingStorage:
    return RecordingStorage()


@pytest.fixture
def ckpt(config: StagerConfig, storage: RecordingStorage, staging: Path) -> Iterator[ShardedCheckpointer]:
    c = ShardedCheckpointer(config, storage=storage, staging=StagingConfig(parent_dir=str(staging), chunk_bytes=CHUNK))
    yield c
    c.close(remove=True)


def _save(c: ShardedCheckpointer, step: int, persist: bool = True) -> None:
    assert c.save(step, _state(float(step))).saved
    c.stager.flush()
    if persist:
        decision = c.persist(step)
        assert decision.commit, decision.reason


def _dcp_objects(storage: InMemoryStorage, step: int) -> list[str]:
    return [n for n in storage.list_dir(str(step)) if n != "manifest.json" and not n.endswith(".done")]


# -- the checkpointer on a staged storage ----------------------------------------------------------


def test_roundtrip_through_the_storage_bit_for_bit_and_no_staging_left(
    ckpt: ShardedCheckpointer, storage: RecordingStorage, staging: Path
) -> None:
    _save(ckpt, 1)
    assert list(staging.iterdir()) == []
    _save(ckpt, 2)
    _save(ckpt, 3, persist=False)
    assert ckpt.root is None  # nothing on a POSIX path
    # Every DCP file went up once, streamed in chunks of at most CHUNK bytes, and the manifest's
    # checksums are those of the stored bytes.
    names = _dcp_objects(storage, 2)
    assert ".metadata" in names
    assert any(n.endswith(".distcp") for n in names)
    man = json.loads(storage.read_bytes(manifest_path(2)))
    assert sorted(man["files"]) == sorted(names)
    for name in names:
        path = f"2/{name}"
        data = storage.read_bytes(path)
        assert man["files"][name] == {"bytes": len(data), "crc32": zlib.crc32(data)}
        assert storage.writes[path] == 1
        assert max(storage.chunk_sizes[path]) <= CHUNK
    assert max(len(storage.chunk_sizes[f"2/{n}"]) for n in names) > 1
    target = _state(0.0)
    loaded = ckpt.load(target, from_memory=False)
    assert (loaded.source, loaded.step, loaded.verified) == ("storage", 2, True)
    assert "<RecordingStorage>/2" in loaded.detail
    assert same_bits(target, _state(2.0))
    assert list(staging.iterdir()) == []
    # Refusals (not in memory; not newer than the tracker) and a background persist leave none either.
    assert "not in memory" in ckpt.persist(9).reason
    assert "not newer" in ckpt.persist(2).reason
    assert ckpt.persist_async(3).result(timeout=60).commit
    assert list(staging.iterdir()) == []


@pytest.mark.parametrize("fail_at", [1, 2, 3, 4, 5], ids=["metadata", "data", "done", "manifest", "tracker"])
def test_a_storage_failing_mid_write_keeps_the_previous_step_and_no_staging(
    ckpt: ShardedCheckpointer, storage: RecordingStorage, staging: Path, fail_at: int
) -> None:
    _save(ckpt, 1)
    state = _state(2.0)
    assert ckpt.save(2, state).saved
    ckpt.stager.flush()
    before = {k: v.clone() for k, v in state["model"].items()}
    storage.count, storage.fail_at = 0, fail_at
    decision = ckpt.persist(2)
    assert not decision.commit
    assert "injected: connection reset" in decision.reason
    assert any(e.kind == "persist_failed" for e in ckpt.events.snapshot())
    # Writes in order: .metadata, the data file, the done marker, the manifest, the tracker.
    order = [".metadata", "__0_0.distcp", "rank_00000.done", "manifest.json"]
    assert storage.failed == [f"2/{order[fail_at - 1]}" if fail_at <= len(order) else "tracker.json"]
    if fail_at <= len(order):
        assert not storage.exists(storage.failed[0])  # no partial object
    assert Committer(storage).tracker() == Tracker(1, 1)
    assert list(staging.iterdir()) == []
    assert all(torch.equal(state["model"][k], v) for k, v in before.items())  # training state untouched
    target = _state(0.0)
    assert ckpt.load(target, from_memory=False).step == 1
    assert same_bits(target, _state(1.0))
    storage.fail_at = 0  # the fault is gone: the same step commits over the leftovers
    assert ckpt.persist(2).commit
    assert ckpt.load(target, from_memory=False).step == 2
    assert list(staging.iterdir()) == []


def test_a_failing_dcp_write_removes_the_staging_dir(
    ckpt: ShardedCheckpointer, storage: RecordingStorage, staging: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _save(ckpt, 1)
    _save(ckpt, 2, persist=False)
    seen: list[Path] = []

    def broken_save(state: Any, *, storage_writer: Any, **_kw: Any) -> None:
        local = Path(storage_writer.path)
        seen.append(local)
        (local / "__0_0.distcp").write_bytes(b"half")  # a partial file in the staging dir
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sharded_mod, "dcp_save", broken_save)
    decision = ckpt.persist(2)
    assert not decision.commit
    assert "No space left" in decision.reason
    assert seen
    assert seen[0].parent == staging
    assert seen[0].name.startswith(STAGING_PREFIX)
    assert list(staging.iterdir()) == []
    assert not storage.list_dir("2")  # nothing was uploaded
    assert Committer(storage).tracker() == Tracker(1, 1)


def test_a_missing_staging_parent_is_reported_and_changes_nothing(
    ckpt: ShardedCheckpointer, storage: RecordingStorage, staging: Path
) -> None:
    _save(ckpt, 1)
    _save(ckpt, 2, persist=False)
    staging.rmdir()  # e.g. a local disk that went away after start-up
    decision = ckpt.persist(2)
    assert not decision.commit
    assert "staging directory" in decision.reason
    assert Committer(storage).tracker() == Tracker(1, 1)
    target = _state(0.0)
    with pytest.raises(StorageError, match="staging directory"):
        ckpt.load(target, from_memory=False)
    assert same_bits(target, _state(0.0))


def test_a_corrupt_object_falls_back_warning_with_its_name(
    ckpt: ShardedCheckpointer, storage: RecordingStorage, staging: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _save(ckpt, 1)
    _save(ckpt, 2)
    name = sorted(n for n in _dcp_objects(storage, 2) if n.endswith(".distcp"))[0]
    raw = bytearray(storage.read_bytes(f"2/{name}"))
    raw[len(raw) // 2] ^= 0x01
    storage.write_file(f"2/{name}", [bytes(raw)])
    target = _state(0.0)
    with caplog.at_level(logging.WARNING, logger="dlrover.flashckpt"):
        loaded = ckpt.load(target, from_memory=False)
    assert loaded.step == 1
    assert same_bits(target, _state(1.0))
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(f"2/{name}" in m and "fallback" in m for m in warned), warned
    assert list(staging.iterdir()) == []


def test_a_failing_download_falls_back(
    ckpt: ShardedCheckpointer, storage: RecordingStorage, staging: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _save(ckpt, 1)
    _save(ckpt, 2)
    real = storage.read_into

    def flaky(path: str, offset: int, buf: memoryview) -> None:
        if path.startswith("2/") and offset > 0:
            raise StorageError(f"cannot read {path}: connection reset")
        real(path, offset, buf)

    monkeypatch.setattr(storage, "read_into", flaky)
    target = _state(0.0)
    assert ckpt.load(target, from_memory=False).step == 1
    assert same_bits(target, _state(1.0))
    assert list(staging.iterdir()) == []


def test_a_structure_change_raises_and_removes_the_staging_dir(ckpt: ShardedCheckpointer, staging: Path) -> None:
    _save(ckpt, 1)
    target = _state(0.0)
    target["model"]["extra"] = torch.zeros(2)
    with pytest.raises(StateStructureError, match="another state structure"):
        ckpt.load(target, from_memory=False)
    assert same_bits(target["model"]["0.weight"], torch.zeros(6, 5))
    assert list(staging.iterdir()) == []


def test_bad_configuration_is_refused(config: StagerConfig, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="chunk_bytes"):
        StagingConfig(chunk_bytes=0)
    with pytest.raises(ConfigError, match="parent_dir"):
        StagingConfig(parent_dir="")
    with pytest.raises(ConfigError, match="exactly one of storage_dir or storage"):
        ShardedCheckpointer(config)
    with pytest.raises(ConfigError, match="exactly one of storage_dir or storage"):
        ShardedCheckpointer(config, tmp_path, storage=InMemoryStorage())
    with pytest.raises(ConfigError, match="Storage protocol"):
        ShardedCheckpointer(config, storage=object())  # type: ignore[arg-type]
    missing = str(tmp_path / "nope")
    with pytest.raises(ConfigError, match="nope"):
        ShardedCheckpointer(config, storage=InMemoryStorage(), staging=StagingConfig(parent_dir=missing))
    # A node saver writes to a POSIX directory; a bad mode is named as such.
    with pytest.raises(ConfigError, match="'sometimes'"):
        ShardedCheckpointer(config, storage=InMemoryStorage(), saver="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="saver='auto' needs storage_dir"):
        ShardedCheckpointer(config, storage=InMemoryStorage(), saver="auto")
    with pytest.raises(ConfigError, match="writes to a POSIX storage_dir"):
        ShardedCheckpointer(config, storage=InMemoryStorage(), saver="connect")


def test_posix_storage_is_written_in_place(config: StagerConfig, tmp_path: Path) -> None:
    site = dcp_site(PosixStorage(tmp_path / "ck"))
    assert site.shared
    assert site.sync_files
    c = ShardedCheckpointer(config, storage=PosixStorage(tmp_path / "ck"))
    try:
        _save(c, 1)
        assert c.root == tmp_path / "ck"
        assert (tmp_path / "ck" / "1" / ".metadata").is_file()
    finally:
        c.close(remove=True)


# -- who uploads what ------------------------------------------------------------------------------


@given(
    world=st.integers(1, 5),
    extra=st.lists(st.sampled_from([".metadata", "other", "__9_0.distcp"]), unique=True),
    data=st.data(),
)
def test_every_staged_file_gets_exactly_one_uploader_among_its_holders(world: int, extra: list[str], data: Any) -> None:
    # Each rank holds its own data files; the shared ones (DCP's .metadata on the coordinator, or
    # names a later DCP may pick) are held by some non-empty set of ranks.
    listings: list[list[str]] = [[f"__{r}_0.distcp", f"__{r}_1.distcp"] for r in range(world)]
    for name in extra:
        for r in data.draw(st.sets(st.integers(0, world - 1), min_size=1)):
            listings[r].append(name)
    owners = staged_owners(listings, world)
    assert set(owners) == {n for listing in listings for n in listing}
    for name, rank in owners.items():
        assert name in listings[rank]  # only a rank holding a file can upload it
    for r in range(world):
        assert owners[f"__{r}_0.distcp"] == r == owners[f"__{r}_1.distcp"]


def test_staged_owners_refuses_a_listing_per_rank_mismatch() -> None:
    with pytest.raises(LayoutError, match="2 ranks"):
        staged_owners([["a"]], 2)


def test_simulated_ranks_upload_each_file_once(tmp_path: Path) -> None:
    # Three ranks' staging dirs as DCP leaves them; each uploads what `staged_owners` gives it.
    world = 3
    storage = RecordingStorage()
    site = StagedDcpSite(storage, StagingConfig(chunk_bytes=CHUNK))
    dirs = [tmp_path / f"r{r}" for r in range(world)]
    listings: list[list[str]] = []
    for r, d in enumerate(dirs):
        d.mkdir()
        (d / f"__{r}_0.distcp").write_bytes(bytes([r]) * 300)
        names = [f"__{r}_0.distcp"]
        if r < 2:  # held by two ranks, e.g. written to every rank's dir
            (d / ".metadata").write_bytes(b"meta" * 10)
            names.append(".metadata")
        listings.append(sorted(names))
    owners = staged_owners(listings, world)
    sums = {}
    for r, d in enumerate(dirs):
        sums.update(site.publish(7, d, [n for n, o in owners.items() if o == r]))
    assert storage.writes == {"7/.metadata": 1, "7/__0_0.distcp": 1, "7/__1_0.distcp": 1, "7/__2_0.distcp": 1}
    assert sorted(site.listed(7)) == sorted(sums)
    for name, s in sums.items():
        assert s == {"bytes": storage.size(f"7/{name}"), "crc32": zlib.crc32(storage.read_bytes(f"7/{name}"))}


# -- streaming one file ----------------------------------------------------------------------------


def test_upload_streams_and_checksums(tmp_path: Path) -> None:
    storage = RecordingStorage()
    src = tmp_path / "f"
    src.write_bytes(bytes(range(256)) * 3)
    assert upload_file(storage, src, "1/f", 100) == {"bytes": 768, "crc32": zlib.crc32(src.read_bytes())}
    assert storage.chunk_sizes["1/f"] == [100] * 7 + [68]
    with pytest.raises(StorageError, match="cannot upload"):
        upload_file(storage, tmp_path / "missing", "1/g", 100)
    assert not storage.exists("1/g")


def test_download_verifies_before_anything_is_left(tmp_path: Path) -> None:
    storage = InMemoryStorage()
    data = bytes(range(200))
    storage.write_file("1/f", [data])
    good = {"bytes": len(data), "crc32": zlib.crc32(data)}
    download_file(storage, "1/f", tmp_path / "ok", good, 64)
    assert (tmp_path / "ok").read_bytes() == data
    with pytest.raises(ChecksumError, match=r"1/f does not match"):
        download_file(storage, "1/f", tmp_path / "bad", {"bytes": len(data), "crc32": good["crc32"] ^ 1}, 64)
    with pytest.raises(ChecksumError, match=r"1/f has 200 bytes, the manifest says 201"):
        download_file(storage, "1/f", tmp_path / "short", {"bytes": 201, "crc32": 0}, 64)
    with pytest.raises(ChecksumError, match=r"1/gone is missing"):
        download_file(storage, "1/gone", tmp_path / "gone", good, 64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok"]  # nothing unverified was left


def test_a_manifest_cannot_send_a_download_outside_the_step(tmp_path: Path) -> None:
    site = StagedDcpSite(InMemoryStorage(), StagingConfig())
    for name in ("../x", "a/b", "", ".."):
        with pytest.raises(LayoutError, match="not a file name"):
            site.fetch(1, tmp_path, name, {"bytes": 0, "crc32": 0})


@given(st.lists(st.sampled_from([b"host-a", b"host-b", b"host-c"]), min_size=1, max_size=9))
def test_node_shares_split_every_node_among_its_ranks(keys: list[bytes]) -> None:
    shares = [node_share(keys, r) for r in range(len(keys))]
    for key in set(keys):
        ranks = [r for r, k in enumerate(keys) if k == key]
        mine = [shares[r] for r in ranks]
        assert {s.leader for s in mine} == {ranks[0]}  # the node's lowest rank leads
        assert sorted(s.index for s in mine) == list(range(len(ranks)))  # each file gets one fetcher
        assert {s.size for s in mine} == {len(ranks)}
    assert node_share([b"x", b"y", b"x"], 2) == NodeShare(leader=0, index=1, size=2)


def test_node_keys_name_the_staging_directory_itself(tmp_path: Path) -> None:
    one, other = tmp_path / "one", tmp_path / "other"
    one.mkdir()
    other.mkdir()
    (tmp_path / "link").symlink_to(one)
    site = StagedDcpSite(InMemoryStorage(), StagingConfig(parent_dir=str(one)))
    same = StagedDcpSite(InMemoryStorage(), StagingConfig(parent_dir=str(tmp_path / "link")))
    apart = StagedDcpSite(InMemoryStorage(), StagingConfig(parent_dir=str(other)))
    assert site.node_key() == same.node_key() != apart.node_key()
    assert same.joined("dlrover-fc-dcp-1-x").resolve() == one / "dlrover-fc-dcp-1-x"
    for name in ("../x", "a/b", "", ".."):
        with pytest.raises(LayoutError, match="not a file name"):
            site.joined(name)
