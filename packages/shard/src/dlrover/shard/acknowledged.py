"""A data position completed with the acknowledgements made after it was read.

A group of trainers that saves its data position with every step need not read it from the
service after every step's acknowledgements. Each trainer keeps the position it read last and the
acknowledgements the whole group made since (`ShardSampler` with a process group exchanges them
with a collective it runs anyway); `apply_acknowledged` turns the two into the position a read
after those acknowledgements would have given, and that is what a restore sends the service.

Positions within a shard are absolute and only move forward, so an acknowledgement the read
already held changes nothing, and the result does not depend on when the position was read.
"""

from __future__ import annotations

from collections.abc import Sequence

from dlrover.common import SystemClock
from dlrover.shard.errors import InvalidShardRequestError
from dlrover.shard.manager import ShardManager, check_acknowledgements
from dlrover.shard.progress import decode_progress, encode_progress

__all__ = ["apply_acknowledged"]


def apply_acknowledged(document: str | bytes, acknowledged: Sequence[tuple[int, int, bool]]) -> str:
    """The progress checkpoint `document` with `acknowledged` applied (a version 1 document).

    Args:
        document: a data position (a version 1 progress checkpoint, `ShardClient.checkpoint`).
        acknowledged: `(shard_id, consumed, done)` acknowledgements made after it was read: a shard
            at `consumed` samples, or done. A shard it shows queued moves forward; a shard not yet
            handed out then is taken in dispatch order (those passed on the way stay queued, as
            the shards others held are; at-most-once sets them aside in the failed set, and a
            shard acknowledged in part too); a shard it shows done stays done, and one in its
            failed set stays there (the service gave up on it while its holder trained part of it).

    Raises:
        InvalidShardRequestError: the document is not a version 1 progress checkpoint, or an
            acknowledgement is malformed, names a shard twice or one the dataset lacks, or a
            position outside the shard.
    """
    spec, state = decode_progress(document)
    if "leases" in state:
        raise InvalidShardRequestError(
            "progress checkpoint: a document that keeps leases (a service's own journal) is no data position"
        )
    entries = check_acknowledgements(acknowledged)
    manager, _ = ShardManager.from_state(spec, state, SystemClock())
    manager._settle_acknowledgements(entries)
    return encode_progress(manager)
