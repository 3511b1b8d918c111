"""`tensor_stream.pieces` and `spans`: the pieces of the byte stream cover every tensor's bytes
exactly once, in order, and a large tensor's pieces hold nothing else; `broadcast_stream` in a
one-rank group copies every byte and reports a failed copy."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from dlrover.flashckpt.collectives import RankGroup
from dlrover.flashckpt.tensor_stream import broadcast_stream, pieces, spans


@given(st.lists(st.integers(0, 50), max_size=12), st.integers(1, 64), st.integers(1, 40))
def test_pieces_cover_each_tensors_bytes_once_in_order(sizes: list[int], chunk: int, alone: int) -> None:
    cut = pieces(sizes, chunk, alone)
    position = 0
    for start, length in cut:  # back to back, none empty, none over the staging size
        assert start == position
        assert 0 < length <= chunk
        position += length
    assert position == sum(sizes)
    seen: list[list[int]] = [[] for _ in sizes]
    for start, length in cut:
        parts = spans(sizes, start, length)
        if any(sizes[index] >= alone for index, *_ in parts):
            assert len(parts) == 1  # a large tensor's pieces hold nothing else: it can move in place
        at_expected = 0
        for index, offset, at, n in spans(sizes, start, length):
            assert n > 0
            assert at == at_expected  # the piece is filled front to back, without gaps
            at_expected += n
            seen[index].extend(range(offset, offset + n))
        assert at_expected == length
    assert seen == [list(range(size)) for size in sizes]


def test_one_rank_stream_copies_every_byte_and_returns_a_failed_copy() -> None:
    tensors = [torch.arange(10, dtype=torch.int32), torch.empty(0), torch.tensor(3.5), torch.ones(3, 7)]
    sizes = [t.numel() * t.element_size() for t in tensors]
    out = bytearray()

    def read(index: int, offset: int, piece: torch.Tensor) -> None:
        data = tensors[index].reshape(-1).view(torch.uint8)
        piece.copy_(data[offset : offset + piece.numel()])
        out.extend(piece.numpy().tobytes())

    group = RankGroup(None)  # no process group: a group of one rank, the sender
    assert broadcast_stream(group, 0, sizes, torch.empty(5, dtype=torch.uint8), read=read) is None
    assert bytes(out) == b"".join(t.reshape(-1).view(torch.uint8).numpy().tobytes() for t in tensors)

    def failing(index: int, offset: int, piece: torch.Tensor) -> None:
        raise RuntimeError(f"cannot copy tensor {index}")

    failure = broadcast_stream(group, 0, sizes, torch.empty(5, dtype=torch.uint8), read=failing)
    assert isinstance(failure, RuntimeError)
    assert "tensor 0" in str(failure)
