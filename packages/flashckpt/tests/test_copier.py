"""Copier: chunked multi-threaded copies, started and waited for separately."""

from __future__ import annotations

import pytest
import torch

from dlrover.flashckpt.copier import Copier


@pytest.mark.parametrize("threads", [1, 3])
def test_started_copies_are_complete_after_wait(threads: int) -> None:
    srcs = [torch.randn(5000) for _ in range(6)] + [torch.arange(7), torch.zeros(0), torch.tensor(2.5)]
    dsts = [torch.empty_like(s) for s in srcs]
    copier = Copier(threads, chunk_bytes=4096)  # big tensors in several chunks, small ones batched
    try:
        pending = copier.start(list(zip(dsts, srcs, strict=True)))
        pending.wait()
        assert all(torch.equal(d, s) for d, s in zip(dsts, srcs, strict=True))
        pending.wait()  # a second wait has nothing left to do
    finally:
        copier.close()


def test_a_failed_copy_is_raised_only_after_every_other_copy_finished() -> None:
    # The caller unlocks its slot once `wait` returns or raises: no worker may still write then.
    # The first pair's last chunk cannot be copied (one element short); it is the fourth of about
    # eighty jobs, so most copies are still queued or running when it fails.
    srcs = [torch.randn(20_000)] + [torch.randn(20_000) for _ in range(8)]
    dsts = [torch.empty(20_001)] + [torch.empty(20_000) for _ in range(8)]
    copier = Copier(2, chunk_bytes=8192)
    try:
        pending = copier.start(list(zip(dsts, srcs, strict=True)))
        with pytest.raises(RuntimeError):
            pending.wait()
        assert all(torch.equal(d, s) for d, s in zip(dsts[1:], srcs[1:], strict=True))
    finally:
        copier.close()
