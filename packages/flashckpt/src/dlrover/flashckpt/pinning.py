"""Page-locking ("pinning") shared-memory slots for an accelerator's DMA engine.

A copy between a CUDA device and pageable host memory goes through a small pinned bounce buffer
inside the driver, one piece at a time, and blocks the calling thread. Registering the slot's
mapping with ``cudaHostRegister`` makes it pinned memory in place: the device's copy engine then
writes the snapshot straight into shared memory at the link's speed, asynchronously, and the
saver process, which maps the same pages, sees them unchanged. Nothing is copied twice and no
second host buffer is allocated.

A registration must be undone before its range is unmapped (a later mapping at the same address
would otherwise inherit a stale registration), so `ShmSegment` unpins itself in `close` and
`resize`; the stager and the memory reader only decide *whether* to pin.

`CudaHostPinner` goes through ``torch.cuda.cudart()``, the runtime bindings torch documents
under ``torch.cuda``. `FakeHostPinner` records calls for tests on machines without a GPU.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from dlrover.flashckpt.errors import FlashCkptError

__all__ = ["CudaHostPinner", "FakeHostPinner", "HostPinner", "PinError", "PinRecord"]

# cudaHostRegisterPortable: the range counts as pinned for every CUDA context in the process
# (one per device), so a rank that touches two devices copies at full speed from both.
_HOST_REGISTER_PORTABLE = 1


class PinError(FlashCkptError):
    """Host memory could not be page-locked (or unlocked) for device copies."""


class HostPinner(Protocol):
    """Page-locks host address ranges for an accelerator, and releases them."""

    def pin(self, address: int, nbytes: int) -> None:
        """Page-lock `nbytes` starting at `address`.

        Raises:
            PinError: the range cannot be pinned (the caller copies through pageable memory).
        """
        ...

    def unpin(self, address: int) -> None:
        """Release the range pinned at `address`.

        Raises:
            PinError: the runtime refused (the range was not pinned by `pin`).
        """
        ...


class CudaHostPinner:
    """Pins ranges with ``cudaHostRegister`` through ``torch.cuda.cudart()``.

    Raises:
        PinError: at construction, when torch has no usable CUDA runtime.
    """

    def __init__(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise PinError("no CUDA device is available to pin host memory for")
        self._cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]

    def pin(self, address: int, nbytes: int) -> None:
        """See `HostPinner.pin`."""
        code = int(self._cudart.cudaHostRegister(address, nbytes, _HOST_REGISTER_PORTABLE))
        if code != 0:
            raise PinError(f"cudaHostRegister of {nbytes} bytes at {address:#x} failed with cudaError {code}")

    def unpin(self, address: int) -> None:
        """See `HostPinner.unpin`."""
        code = int(self._cudart.cudaHostUnregister(address))
        if code != 0:
            raise PinError(f"cudaHostUnregister at {address:#x} failed with cudaError {code}")


@attrs.frozen
class PinRecord:
    """One call a `FakeHostPinner` saw."""

    op: str
    address: int
    nbytes: int


class FakeHostPinner:
    """An in-memory `HostPinner`: records calls, tracks what is pinned, fails when told to.

    It holds the same rules the CUDA runtime enforces: a range is pinned once, and only a pinned
    address can be unpinned.

    Args:
        fail_with: when set, every `pin` raises `PinError` with this reason.
    """

    def __init__(self, fail_with: str | None = None) -> None:
        self.fail_with = fail_with
        self.calls: list[PinRecord] = []
        self.pinned: dict[int, int] = {}

    def pin(self, address: int, nbytes: int) -> None:
        """See `HostPinner.pin`."""
        if self.fail_with is not None:
            raise PinError(self.fail_with)
        if nbytes <= 0:
            raise PinError(f"cannot pin {nbytes} bytes")
        for start, size in self.pinned.items():
            if address < start + size and start < address + nbytes:
                raise PinError(f"range at {address:#x} overlaps the range pinned at {start:#x}")
        self.pinned[address] = nbytes
        self.calls.append(PinRecord("pin", address, nbytes))

    def unpin(self, address: int) -> None:
        """See `HostPinner.unpin`."""
        if address not in self.pinned:
            raise PinError(f"{address:#x} is not pinned")
        nbytes = self.pinned.pop(address)
        self.calls.append(PinRecord("unpin", address, nbytes))
