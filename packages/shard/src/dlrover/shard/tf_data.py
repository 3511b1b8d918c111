"""TensorFlow adapter (optional extra `tf`): a `tf.data.Dataset` of sample indices from ShardService.

TensorFlow is imported only when `make_tf_dataset` is called. The dataset is built with the public
`tf.data.Dataset.from_generator`; each iteration opens its own `ShardClient`, yields the indices
of the shards it leases, and reports a shard done once all of its indices were handed to
TensorFlow. tf.data prefetches, so this acknowledges at hand-out (at-least-once with respect to
training when a worker dies between hand-out and training); use `ShardSampler`-style commits
through `ShardClient.report_progress` where exactly-once relative to the model is required.

Not exercised by this package's tests (TensorFlow is not installed in the test environment).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from dlrover.shard.client import ShardClient

__all__ = ["make_tf_dataset", "shard_indices"]


def shard_indices(client_factory: Callable[[], ShardClient]) -> Iterator[int]:
    """Every index of every shard a fresh client leases, reporting each shard done after its last index.

    This is the generator behind `make_tf_dataset`, usable without TensorFlow.
    """
    client = client_factory()
    try:
        while (shard := client.next_shard()) is not None:
            yield from shard.remaining_samples()
            client.report_done(shard.shard_id)
    finally:
        client.close()


def make_tf_dataset(client_factory: Callable[[], ShardClient]) -> Any:
    """A `tf.data.Dataset` of int64 sample indices drawn from the shard service.

    Args:
        client_factory: makes a `ShardClient`; called once per iteration of the dataset, so
            each pass (and each `tf.distribute` replica) has its own connection.

    Returns:
        A `tf.data.Dataset` with element spec `tf.TensorSpec((), tf.int64)`; map it to samples
        with `dataset.map(...)`.

    Raises:
        ImportError: TensorFlow is not installed (`pip install dlrover-shard[tf]`).
    """
    import tensorflow as tf  # the optional extra, imported only here

    return tf.data.Dataset.from_generator(
        lambda: shard_indices(client_factory),
        output_signature=tf.TensorSpec(shape=(), dtype=tf.int64),
    )
