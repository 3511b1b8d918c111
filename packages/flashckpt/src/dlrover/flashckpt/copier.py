"""Copy many tensors into or out of host memory: host pairs on several threads, CUDA pairs by DMA.

`torch.Tensor.copy_` releases the GIL, so a few Python threads copying disjoint chunks use several
cores. Big contiguous tensors are split into chunks; small ones are batched so that thread hand-off
costs stay small against the bytes moved.

A pair with a CUDA tensor on either side is queued, non-blocking, on a side stream of that device,
which first waits for the device's current stream (so the copy sees every kernel queued before it,
such as the optimizer step). Into or out of pinned host memory (`dlrover.flashckpt.pinning`) the
copy engine then moves the bytes while the host threads copy the CPU tensors; `copy` returns only
after the side streams are synchronized, so the caller may change its tensors at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import torch

__all__ = ["Copier", "PendingCopy"]

T = TypeVar("T")
R = TypeVar("R")

_Job = list[tuple[torch.Tensor, torch.Tensor]]


class Copier:
    """A reusable pool of copy threads.

    Args:
        threads: worker threads (1 copies on the calling thread).
        chunk_bytes: size of the pieces large tensors are split into, and of small-tensor batches.
    """

    def __init__(self, threads: int, chunk_bytes: int) -> None:
        self._threads = threads
        self._chunk_bytes = chunk_bytes
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="flashckpt-copy") if threads > 1 else None
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def _jobs(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[_Job]:
        jobs: list[_Job] = []
        batch: _Job = []
        batch_bytes = 0
        for dst, src in pairs:
            nbytes = src.numel() * src.element_size()
            if nbytes >= 2 * self._chunk_bytes and src.is_contiguous() and dst.is_contiguous():
                flat_dst, flat_src = dst.reshape(-1), src.reshape(-1)
                step = max(1, self._chunk_bytes // src.element_size())
                for start in range(0, flat_src.numel(), step):
                    jobs.append([(flat_dst[start : start + step], flat_src[start : start + step])])
                continue
            batch.append((dst, src))
            batch_bytes += nbytes
            if batch_bytes >= self._chunk_bytes:
                jobs.append(batch)
                batch, batch_bytes = [], 0
        if batch:
            jobs.append(batch)
        return jobs

    def copy(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Copy each ``src`` into its ``dst`` (same shape and dtype); returns when all are done.

        Args:
            pairs: (destination, source) tensors.
        """
        self.start(pairs).wait()

    def start(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> PendingCopy:
        """Begin copying each ``src`` into its ``dst``; the caller may do other work, then must `wait`.

        Host pairs go to the worker threads (a single batch runs here, before this returns: a
        hand-off would cost more than it hides) and device pairs to the side streams.

        Args:
            pairs: (destination, source) tensors.
        """
        host = [(dst, src) for dst, src in pairs if not (dst.is_cuda or src.is_cuda)]
        pending = PendingCopy(pairs)
        try:
            self._queue_device_copies([(dst, src) for dst, src in pairs if dst.is_cuda or src.is_cuda], pending.streams)
            jobs = self._jobs(host)
            if self._pool is None or len(jobs) <= 1:
                for job in jobs:
                    _run(job)
            else:
                for job in jobs:  # one at a time: a failed submit leaves the earlier ones to wait for
                    pending.futures.append(self._pool.submit(_run, job))
        except BaseException:
            pending.wait()  # nothing may still be writing once the caller gives the memory up
            raise
        return pending

    def _queue_device_copies(
        self, pairs: list[tuple[torch.Tensor, torch.Tensor]], queued: list[torch.cuda.Stream]
    ) -> None:
        """Queue every pair on its device's side stream, appending each stream used to `queued`."""
        by_device: dict[torch.device, _Job] = {}
        for dst, src in pairs:
            by_device.setdefault(src.device if src.is_cuda else dst.device, []).append((dst, src))
        for device, job in by_device.items():
            stream = self._streams.get(device)
            if stream is None:
                stream = self._streams[device] = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
            stream.wait_stream(torch.cuda.current_stream(device))
            queued.append(stream)
            with torch.cuda.stream(stream), torch.no_grad():
                for dst, src in job:
                    dst.copy_(src, non_blocking=True)

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``[fn(x) for x in items]`` on the pool's threads (for work that releases the GIL, like CRC-32)."""
        if self._pool is None or len(items) <= 1:
            return [fn(x) for x in items]
        return list(self._pool.map(fn, items))

    def close(self) -> None:
        """Stop the worker threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class PendingCopy:
    """Copies under way: `wait` returns once every one has finished (also when one failed).

    It holds the tensors it copies until then, so no source or destination is freed (and its
    memory reused) while a worker thread or a device stream still reads or writes it.
    """

    def __init__(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.pairs = pairs
        self.futures: list[Future[None]] = []
        self.streams: list[torch.cuda.Stream] = []

    def wait(self) -> None:
        """Wait for every copy, then raise the first error any of them met."""
        error: BaseException | None = None
        for f in self.futures:
            while True:
                try:
                    f.result()
                    break
                except BaseException as e:  # the others still write into the caller's memory: wait for them
                    error = error or e
                    if f.done():  # else an interrupt (a signal handler's exception) cut the wait short
                        break
        for stream in self.streams:
            try:
                stream.synchronize()
            except BaseException as e:  # another device's stream may still be copying
                error = error or e
        self.futures, self.streams, self.pairs = [], [], []
        if error is not None:
            raise error


def _run(job: _Job) -> None:
    with torch.no_grad():
        for dst, src in job:
            dst.copy_(src)
