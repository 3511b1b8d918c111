"""dlrover.shard.

Dynamic data sharding: splitters, shard manager with leases and delivery semantics, progress
checkpoints, ShardService and client, torch/TensorFlow data adapters.
"""

__all__: list[str] = []
