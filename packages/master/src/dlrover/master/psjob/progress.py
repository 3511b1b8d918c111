"""How much training a restore undoes, measured where the data is handed out.

The chief of a PS job stores its data position (the shard service's progress checkpoint, `GetCheckpoint`) with
each model checkpoint and restores it (`RestoreCheckpoint`) when it starts again. The samples acknowledged
between the two are the ones trained again: the work a lost parameter server or chief cost. This servicer counts
them without any help from the training script.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable

import attrs
import grpc

from dlrover.shard import ShardRegistry
from dlrover.shard.service import ShardServicer
from dlrover.shard.v1 import shard_pb2 as pb

__all__ = ["Rewind", "RewindWatchingServicer"]

_REMEMBERED_CHECKPOINTS = 256


@attrs.frozen
class Rewind:
    """A restore of a dataset's data position.

    Attributes:
        dataset: the dataset.
        samples: samples acknowledged after the restored position was read, to be trained again; None when the
            position was not read from this master (a checkpoint of an earlier run).
        steps: `samples` in the dataset's batches (rounded up); None with `samples`.
    """

    dataset: str
    samples: int | None
    steps: int | None


class RewindWatchingServicer(ShardServicer):
    """The shard service, counting what each restore of a data position undoes.

    Args:
        registry: the datasets served.
        on_rewind: told of every successful restore (from a gRPC thread; keep it quick).
    """

    def __init__(self, registry: ShardRegistry, on_rewind: Callable[[Rewind], None]) -> None:
        super().__init__(registry)
        self._on_rewind = on_rewind
        self._base: dict[str, int] = {}  # acknowledged samples of datasets' earlier managers (before restores)
        self._read_at: OrderedDict[tuple[str, str], int] = OrderedDict()

    def acknowledged_samples(self) -> int:
        """Samples acknowledged in every dataset so far (less what restores undid): the job's training progress."""
        with self._lock:
            return sum(self._acknowledged(name) for name in self._registry.datasets())

    def _acknowledged(self, dataset: str) -> int:
        """Samples acknowledged so far (lock held): counted across restores, minus what they rewound."""
        status = self._registry.manager(dataset).status()
        return self._base.get(dataset, 0) + sum(w.samples for w in status.workers)

    def _read_checkpoint(self, registry: ShardRegistry, dataset: str) -> str:
        """The progress checkpoint of a dataset (lock held), remembering how much was acknowledged when it
        was read, whichever call read it (`GetCheckpoint`, or `FetchShards` asking for it)."""
        document = super()._read_checkpoint(registry, dataset)
        key = (dataset, hashlib.sha256(document.encode()).hexdigest())
        self._read_at[key] = self._acknowledged(dataset)
        self._read_at.move_to_end(key)
        while len(self._read_at) > _REMEMBERED_CHECKPOINTS:
            self._read_at.popitem(last=False)
        return document

    def RestoreCheckpoint(
        self, request: pb.RestoreCheckpointRequest, context: grpc.ServicerContext
    ) -> pb.RestoreCheckpointResponse:
        """Restore a progress checkpoint and say how many acknowledged samples it undid."""
        digest = hashlib.sha256(request.document.encode()).hexdigest()
        rewinds: list[Rewind] = []

        def restore(registry: ShardRegistry) -> pb.RestoreCheckpointResponse:
            # Taken for every dataset: the request may leave the name to the document.
            managers = {name: registry.manager(name) for name in registry.datasets()}
            before = {name: self._acknowledged(name) for name in managers}
            res = registry.restore(request.document, request.dataset, request.request_id)
            response = pb.RestoreCheckpointResponse(
                dataset=res.dataset, returned_to_queue=res.returned_to_queue, reason=res.reason
            )
            if registry.manager(res.dataset) is managers.get(res.dataset):
                return response  # a retry the registry answered as the first time: nothing was restored again
            at = self._read_at.get((res.dataset, digest))
            had = before.get(res.dataset, 0)
            self._base[res.dataset] = at if at is not None else had
            samples = None if at is None else max(had - at, 0)
            batch = registry.manager(res.dataset).spec.batch_size
            steps = None if samples is None else math.ceil(samples / max(batch, 1))
            rewinds.append(Rewind(res.dataset, samples, steps))
            return response

        response = self._call(context, restore)
        for rewind in rewinds:
            self._on_rewind(rewind)
        return response
