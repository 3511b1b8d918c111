"""The shard manager's private bookkeeping records and request checks (internal)."""

from __future__ import annotations

from dlrover.shard.errors import InvalidShardRequestError
from dlrover.shard.shard import Shard

MAX_REQUEST_ID_CHARS = 128
MAX_WORKER_CHARS = 256


class Parked:
    """A shard that has left the fresh permutation: leased, re-queued or failed."""

    __slots__ = (
        "consumed",
        "dispatches",
        "end",
        "epoch",
        "failures",
        "order_seed",
        "partition",
        "reasons",
        "shard_id",
        "start",
    )

    def __init__(
        self, shard_id: int, epoch: int, start: int, end: int, order_seed: int | None, *, partition: str = ""
    ) -> None:
        self.shard_id = shard_id
        self.epoch = epoch
        self.start = start
        self.end = end
        self.order_seed = order_seed
        self.partition = partition
        self.consumed = 0
        self.dispatches = 0
        self.failures = 0
        self.reasons: list[str] = []

    @property
    def size(self) -> int:
        return self.end - self.start

    def to_shard(self, dataset: str) -> Shard:
        return Shard(
            dataset=dataset,
            shard_id=self.shard_id,
            epoch=self.epoch,
            start=self.start,
            end=self.end,
            consumed=self.consumed,
            order_seed=self.order_seed,
            partition=self.partition,
            attempt=max(self.dispatches, 1),
        )


class Lease:
    __slots__ = ("deadline", "parked", "version", "worker")

    def __init__(self, parked: Parked, worker: str, deadline: float, version: int) -> None:
        self.parked = parked
        self.worker = worker
        self.deadline = deadline
        self.version = version


class EpochBook:
    """Done and failed counts of an epoch that is not finished yet.

    The done shards are kept as the bitmap a data position writes (bit k of byte k // 8 is shard
    `base` + k), set as each shard is done: a position read after every step then encodes it in
    C instead of sorting and walking a set of up to millions of ids (92 ms per read at a million
    shards, 200,000 done), and an epoch's done ids take a bit each instead of a set entry.
    """

    __slots__ = ("_bits", "base", "done_count", "failed", "total")

    def __init__(self, total: int, base: int, bits: bytes | None = None) -> None:
        """`bits`: the done bitmap to start from (``(total + 7) // 8`` bytes, no bit past `total`,
        as `shard.bitmap_bytes` checks it); none done without it."""
        self.total = total
        self.base = base
        self._bits = bytearray((total + 7) // 8) if bits is None else bytearray(bits)
        if len(self._bits) != (total + 7) // 8:
            raise ValueError(f"a done bitmap of {len(self._bits)} bytes for {total} shards")
        # Counted in C: a restore of an epoch with millions of shards done takes no Python loop.
        self.done_count = int.from_bytes(self._bits, "little").bit_count()
        self.failed = 0

    @property
    def complete(self) -> bool:
        return self.done_count + self.failed >= self.total

    def add_done(self, sid: int) -> None:
        """Mark shard `sid` done (again: no change)."""
        k = sid - self.base
        if not 0 <= k < self.total:
            raise ValueError(f"shard {sid} is not one of the epoch's shards {self.base}..{self.base + self.total - 1}")
        mask = 1 << (k & 7)
        if not self._bits[k >> 3] & mask:
            self._bits[k >> 3] |= mask
            self.done_count += 1

    def is_done(self, sid: int) -> bool:
        k = sid - self.base
        return 0 <= k < self.total and bool(self._bits[k >> 3] >> (k & 7) & 1)

    def bitmap(self) -> bytes:
        """The done bitmap, ``(total + 7) // 8`` bytes (see `encode_bitmap`)."""
        return bytes(self._bits)

    def done_ids(self) -> list[int]:
        """Every done shard id, ascending; O(total), for tests and tools."""
        return [self.base + k for k in range(self.total) if self._bits[k >> 3] >> (k & 7) & 1]


class WorkerStats:
    __slots__ = ("first_seen", "last_seen", "samples", "shards_done")

    def __init__(self, now: float) -> None:
        self.samples = 0
        self.shards_done = 0
        self.first_seen = now
        self.last_seen = now


def check_worker(worker: str) -> None:
    if not isinstance(worker, str) or not worker or len(worker) > MAX_WORKER_CHARS:
        raise InvalidShardRequestError(
            f"worker id must be a non-empty string of at most {MAX_WORKER_CHARS} characters, got {worker!r}"
        )


def check_request_id(request_id: str) -> None:
    if not isinstance(request_id, str) or len(request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidShardRequestError(
            f"request id must be a string of at most {MAX_REQUEST_ID_CHARS} characters, got {request_id!r}"
        )


def check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidShardRequestError(f"{name} must be an integer, got {value!r}")
    return value
