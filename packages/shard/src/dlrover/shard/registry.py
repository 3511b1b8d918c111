"""The dataset registry: one shard manager per dataset, addressed by name.

This is the object a service hosts. Like the managers, it is a pure state machine with an
injected clock and is not thread-safe.
"""

from __future__ import annotations

from collections import OrderedDict

import attrs

from dlrover.common import Clock
from dlrover.shard.config import DatasetSpec, ShardManagerConfig
from dlrover.shard.errors import InvalidShardRequestError, ShardStateError, UnknownDatasetError
from dlrover.shard.manager import MAX_REQUEST_ID_CHARS, ShardManager
from dlrover.shard.progress import decode_progress, encode_progress
from dlrover.shard.results import RegisterResult, RestoreResult

__all__ = ["ShardRegistry"]


def _differences(old: DatasetSpec, new: DatasetSpec) -> list[str]:
    return [
        f"{a.name}: {getattr(old, a.name)!r} != {getattr(new, a.name)!r}"
        for a in attrs.fields(DatasetSpec)
        if getattr(old, a.name) != getattr(new, a.name)
    ]


class ShardRegistry:
    """Datasets by name, each with its shard manager.

    Args:
        clock: the time source of every manager.
        config: settings shared by every manager.
    """

    def __init__(self, clock: Clock, config: ShardManagerConfig | None = None) -> None:
        self._clock = clock
        self._config = config or ShardManagerConfig()
        self._managers: dict[str, ShardManager] = {}
        self._restores: OrderedDict[str, RestoreResult] = OrderedDict()

    @property
    def config(self) -> ShardManagerConfig:
        """The settings shared by every manager."""
        return self._config

    def datasets(self) -> list[str]:
        """Registered dataset names, sorted."""
        return sorted(self._managers)

    def register(self, spec: DatasetSpec) -> RegisterResult:
        """Register a dataset; registering the identical spec again is a no-op.

        Raises:
            ShardStateError: a dataset of that name exists with a different spec.
        """
        old = self._managers.get(spec.name)
        if old is not None:
            if old.spec == spec:
                return RegisterResult(False, f"dataset {spec.name!r} is already registered with this spec")
            diff = "; ".join(_differences(old.spec, spec))
            raise ShardStateError(f"dataset {spec.name!r} is already registered with a different spec ({diff})")
        self._managers[spec.name] = ShardManager(spec, self._clock, self._config)
        return RegisterResult(True, f"dataset {spec.name!r} registered")

    def manager(self, name: str) -> ShardManager:
        """The manager of dataset `name`.

        Raises:
            UnknownDatasetError: no such dataset.
        """
        try:
            return self._managers[name]
        except KeyError:
            raise UnknownDatasetError(
                f"dataset {name!r} is not registered (registered: {sorted(self._managers)})"
            ) from None

    def remove_worker(self, worker: str, reason: str = "worker left") -> dict[str, list[int]]:
        """Take back every shard `worker` holds in every dataset.

        Returns:
            dataset name -> ids of the shards returned.
        """
        return {name: m.remove_worker(worker, reason) for name, m in sorted(self._managers.items())}

    def checkpoint(self, name: str, *, include_leases: bool = False) -> str:
        """The progress checkpoint of dataset `name` (see `dlrover.shard.progress`).

        Args:
            name: the dataset.
            include_leases: keep the leases and their holders (for a service journaling its own
                state, so that a restart keeps workers training on what they hold).

        Raises:
            UnknownDatasetError: no such dataset.
        """
        return encode_progress(self.manager(name), include_leases=include_leases)

    def restore(self, document: str | bytes, dataset: str = "", request_id: str = "") -> RestoreResult:
        """Replace a dataset's state with a progress checkpoint, registering it if needed.

        Leases held now are dropped: their holders' next reports are rejected. A retried call
        with the same non-empty `request_id` returns the first call's result without restoring
        again, so a retry cannot undo progress made after the first restore.

        Args:
            document: the checkpoint.
            dataset: when not empty, the dataset the caller expects the checkpoint to be for.
            request_id: makes retries harmless.

        Raises:
            InvalidShardRequestError: the document is malformed, of another version, or of another
                dataset than `dataset`.
            ShardStateError: the dataset is registered with a different spec.
        """
        if not isinstance(request_id, str) or len(request_id) > MAX_REQUEST_ID_CHARS:
            raise InvalidShardRequestError(f"request id must be a string of at most {MAX_REQUEST_ID_CHARS} characters")
        if request_id and request_id in self._restores:
            return self._restores[request_id]
        spec, state = decode_progress(document)
        if dataset and spec.name != dataset:
            raise InvalidShardRequestError(f"the checkpoint is of dataset {spec.name!r}, not {dataset!r}")
        old = self._managers.get(spec.name)
        if old is not None and old.spec != spec:
            raise ShardStateError(
                f"checkpoint of dataset {spec.name!r} has a different spec than the registered one "
                f"({'; '.join(_differences(old.spec, spec))})"
            )
        manager, in_flight = ShardManager.from_state(spec, state, self._clock, self._config)
        self._managers[spec.name] = manager
        if "leases" in state:
            reason = f"dataset {spec.name!r} restored; {in_flight} shard(s) stay leased to the workers holding them"
            in_flight = 0
        else:
            reason = f"dataset {spec.name!r} restored; {in_flight} shard(s) leased at the checkpoint are queued again"
        result = RestoreResult(spec.name, in_flight, reason)
        if request_id:
            self._restores[request_id] = result
            while len(self._restores) > self._config.request_cache_size:
                self._restores.popitem(last=False)
        return result
