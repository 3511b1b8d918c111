"""Record-file shards read every line exactly once, by line numbers or by byte ranges."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover.common import ManualClock
from dlrover.shard import (
    DatasetSpec,
    DeliveryMode,
    InvalidShardRequestError,
    RecordFile,
    RecordFileSource,
    RecordUnit,
    ShardManager,
)
from dlrover.shard.records import read_byte_range, read_lines, read_shard_records


def _write(tmp: Path, name: str, lines: list[bytes]) -> Path:
    path = tmp / name
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def _all_records(source: RecordFileSource, spec_kw: dict[str, object]) -> list[tuple[str, bytes]]:
    spec = DatasetSpec(name="f", source=source, batch_size=2, batches_per_shard=1, shuffle=True, **spec_kw)  # type: ignore[arg-type]
    m = ShardManager(spec, ManualClock())
    got = []
    while (res := m.fetch("w", 3)).shards:
        for shard in res.shards:
            got += [(Path(r.path).name, r.data) for r in read_shard_records(source, shard)]
            m.report_done("w", shard.shard_id)
    return got


@given(
    lengths=st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=12), min_size=1, max_size=3),
    record_bytes=st.integers(1, 8),
    cross=st.booleans(),
)
def test_byte_range_shards_give_every_line_to_exactly_one_shard(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[list[int]], record_bytes: int, cross: bool
) -> None:
    tmp = tmp_path_factory.mktemp("files")
    files, expected = [], []
    for i, file_lines in enumerate(lengths):
        lines = [b"%d-%d-" % (i, j) + b"x" * n for j, n in enumerate(file_lines)]
        path = _write(tmp, f"f{i}", lines)
        files.append(RecordFile(str(path), path.stat().st_size))
        expected += [(f"f{i}", line) for line in lines]
    source = RecordFileSource(files, unit=RecordUnit.BYTE, record_bytes=record_bytes, cross_file_boundaries=cross)
    assert sorted(_all_records(source, {})) == sorted(expected)


def test_line_shards_and_exactly_once_resume_after_the_acknowledged_line(tmp_path: Path) -> None:
    a = _write(tmp_path, "a", [b"a%d" % i for i in range(5)])
    b = _write(tmp_path, "b", [b"b%d" % i for i in range(3)])
    source = RecordFileSource([RecordFile(str(a), 5), RecordFile(str(b), 3)], cross_file_boundaries=True)
    assert sorted(_all_records(source, {})) == sorted(
        [("a", b"a%d" % i) for i in range(5)] + [("b", b"b0"), ("b", b"b1"), ("b", b"b2")]
    )
    spec = DatasetSpec(name="f", source=source, batch_size=4, delivery=DeliveryMode.EXACTLY_ONCE)
    m = ShardManager(spec, ManualClock())
    m.fetch("w")  # [0, 4)
    second = m.fetch("w").shards[0]  # [4, 8): a4, b0, b1, b2
    m.report_progress("w", second.shard_id, 2)
    m.remove_worker("w")
    again = next(s for s in m.fetch("v", 2).shards if s.shard_id == second.shard_id)
    assert [r.data for r in read_shard_records(source, again)] == [b"b1", b"b2"]


def test_short_files_and_shuffled_shards_are_reported(tmp_path: Path) -> None:
    a = _write(tmp_path, "a", [b"x"])
    with pytest.raises(InvalidShardRequestError, match="has 1 lines"):
        list(read_lines(str(a), 0, 3))
    assert [r.data for r in read_byte_range(str(a), 0, 100)] == [b"x"]
    source = RecordFileSource([RecordFile(str(a), 1)])
    spec = DatasetSpec(name="f", source=source, batch_size=1, shuffle_samples=True)
    shard = ShardManager(spec, ManualClock()).fetch("w").shards[0]
    with pytest.raises(InvalidShardRequestError, match="shuffles its samples"):
        list(read_shard_records(source, shard))
