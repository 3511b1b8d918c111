"""A shard: a contiguous range of a dataset's units, with the position its worker has reached."""

from __future__ import annotations

import base64
import binascii
import random
from collections.abc import Iterable

import attrs

__all__ = ["Shard", "mix_seed", "encode_bitmap", "decode_bitmap", "bitmap_bytes"]

_MASK63 = (1 << 63) - 1


def mix_seed(*parts: int) -> int:
    """Combine integers into one 63-bit seed, the same on every platform and Python version.

    Used for per-epoch shard order and per-shard sample order, so both are reproducible from
    the dataset's seed alone (which is why a checkpoint needs no RNG state beyond the seed).
    """
    acc = 0x9E3779B97F4A7C15
    for part in parts:
        acc = ((acc ^ (part & _MASK63)) * 0x100000001B3 + 0x2545F4914F6CDD1D) & _MASK63
        acc ^= acc >> 29
    return acc


def encode_bitmap(ids: Iterable[int], base: int, size: int) -> str:
    """Ids in [base, base + size) as a base64 bitmap (bit k of byte k // 8 is id base + k).

    A million done shards of an epoch take 167 KB instead of megabytes of JSON numbers.
    """
    bits = bytearray((size + 7) // 8)
    for sid in ids:
        k = sid - base
        bits[k >> 3] |= 1 << (k & 7)
    return bitmap_text(bits)


def bitmap_text(bits: bytes | bytearray) -> str:
    """A bitmap's bytes as `encode_bitmap` writes them (base64)."""
    return base64.b64encode(bits).decode("ascii")


def bitmap_bytes(text: str, size: int) -> bytes:
    """The bytes of a bitmap of `size` bits that `encode_bitmap` or `bitmap_text` wrote.

    Raises:
        ValueError: not base64, not ``(size + 7) // 8`` bytes, or a bit set past the `size` bits.
    """
    try:
        bits = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError(f"not a base64 bitmap: {exc}") from exc
    if len(bits) != (size + 7) // 8:
        raise ValueError(f"bitmap has {len(bits)} bytes, expected {(size + 7) // 8} for {size} shards")
    if size & 7 and bits[-1] >> (size & 7):
        raise ValueError(f"bitmap sets bits beyond its {size} shards")
    return bits


def decode_bitmap(text: str, base: int, size: int) -> set[int]:
    """The ids `encode_bitmap` wrote.

    Raises:
        ValueError: not base64, or not a bitmap of `size` bits.
    """
    bits = bitmap_bytes(text, size)
    return {base + (i << 3) + b for i, byte in enumerate(bits) if byte for b in range(8) if byte >> b & 1}


@attrs.frozen(slots=True)
class Shard:
    """A unit of work: the range [start, end) of a dataset, of which `consumed` are used up.

    Units are sample indices for index sources, global line numbers or byte offsets for record
    files (see `record_segments`), and record offsets within `partition` for streams.

    Attributes:
        dataset: the dataset's name.
        shard_id: unique within the dataset and stable across re-dispatch and restore.
        epoch: the pass over the data this shard belongs to (0 for streams).
        start: first unit.
        end: one past the last unit.
        consumed: units acknowledged so far; a re-dispatched exactly-once shard starts here.
        order_seed: when set, samples are used in the order `sample_order()` shuffles with it.
        partition: the stream partition, or "" for other sources.
        attempt: which dispatch of this shard this is, from 1.
    """

    dataset: str
    shard_id: int
    epoch: int
    start: int
    end: int
    consumed: int = 0
    order_seed: int | None = None
    partition: str = ""
    attempt: int = 1

    @property
    def size(self) -> int:
        """Units in the whole shard."""
        return self.end - self.start

    @property
    def remaining(self) -> int:
        """Units not yet consumed."""
        return self.size - self.consumed

    def sample_order(self) -> list[int]:
        """Every unit of the shard in the order a worker uses them."""
        order = list(range(self.start, self.end))
        if self.order_seed is not None:
            random.Random(self.order_seed).shuffle(order)
        return order

    def remaining_samples(self) -> list[int]:
        """The units still to use, in order: `sample_order()[consumed:]`."""
        if self.order_seed is None:
            return list(range(self.start + self.consumed, self.end))
        return self.sample_order()[self.consumed :]
