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
under ``torch.cuda``. A refused registration also stays the calling thread's pending runtime
error, which torch's check after the next kernel launch (``cudaGetLastError``) would raise as that
kernel's failure; so a refusal is taken off the thread at once, through the runtime library torch
loaded, before the caller falls back to pageable memory. `FakeHostPinner` records calls for tests
on machines without a GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import attrs

from dlrover.flashckpt.errors import FlashCkptError

__all__ = [
    "CudaErrorPending",
    "CudaHostPinner",
    "FakeHostPinner",
    "HostPinner",
    "PinError",
    "PinRecord",
    "cudart_paths",
]

# cudaHostRegisterPortable: the range counts as pinned for every CUDA context in the process
# (one per device), so a rank that touches two devices copies at full speed from both.
_HOST_REGISTER_PORTABLE = 1


class PinError(FlashCkptError):
    """Host memory could not be page-locked (or unlocked) for device copies."""


class CudaErrorPending(FlashCkptError):
    """The CUDA runtime refused a call and its error could not be cleared: the next CUDA call
    of this thread would fail with it, so going on without pinning is not safe."""


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

    Args:
        device: the CUDA device whose context makes the calls (the device of the tensors copied
            through the pinned memory). Default: the calling thread's current device; a thread
            that never used CUDA would create a context on device 0 for it.

    Raises:
        PinError: at construction, when torch has no usable CUDA runtime.
    """

    def __init__(self, device: int | None = None) -> None:
        import torch

        if not torch.cuda.is_available():
            raise PinError("no CUDA device is available to pin host memory for")
        try:
            self._cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        except (RuntimeError, AssertionError) as e:  # e.g. CUDA cannot be initialised in a forked child
            raise PinError(f"the CUDA runtime is not usable here: {e}") from None
        self._device = device
        self._get_last_error = _last_error_reader(self._cudart)

    def pin(self, address: int, nbytes: int) -> None:
        """See `HostPinner.pin`.

        Raises:
            CudaErrorPending: the runtime refused and its error could not be taken off the thread.
        """
        code = self._call(self._cudart.cudaHostRegister, address, nbytes, _HOST_REGISTER_PORTABLE)
        if code != 0:
            raise PinError(f"cudaHostRegister of {nbytes} bytes at {address:#x} failed with cudaError {code}")

    def unpin(self, address: int) -> None:
        """See `HostPinner.unpin`.

        Raises:
            CudaErrorPending: the runtime refused and its error could not be taken off the thread.
        """
        code = self._call(self._cudart.cudaHostUnregister, address)
        if code != 0:
            raise PinError(f"cudaHostUnregister at {address:#x} failed with cudaError {code}")

    def _call(self, fn: Callable[..., Any], *args: Any) -> int:
        import torch

        scope = torch.cuda.device(self._device) if self._device is not None else contextlib.nullcontext()
        with scope:
            code = int(fn(*args))
            if code != 0:
                if self._get_last_error is None:
                    raise CudaErrorPending(
                        f"a CUDA runtime call failed with cudaError {code}, and no cudaGetLastError was found "
                        "in this process to clear it; set pin_host_memory=False to copy through pageable memory"
                    )
                self._get_last_error()
        return code


# The runtime libraries whose last error a refused call leaves pending (CUDA; ROCm's HIP, which
# torch.cuda stands for in a ROCm build), and the function that reads and clears it.
_RUNTIMES = (("libcudart", "cudaGetLastError"), ("libamdhip64", "hipGetLastError"))


def cudart_paths(maps: str) -> list[str]:
    """The GPU runtime libraries mapped in a process, from its ``/proc/<pid>/maps`` text.

    Copies that torch ships with its wheel (under ``torch/lib`` or ``nvidia/``) come first: another
    library (CuPy, TensorRT) may map a runtime of its own, whose errors are not torch's.
    """
    paths: list[str] = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        path = fields[5].removesuffix(" (deleted)")
        name = os.path.basename(path)
        if any(name.startswith(lib) for lib, _ in _RUNTIMES) and ".so" in name and path not in paths:
            paths.append(path)
    return sorted(paths, key=lambda p: not ("/torch/lib/" in p or "/nvidia/" in p))


def _last_error_reader(cudart: Any) -> Callable[[], int] | None:
    """``cudaGetLastError`` of the runtime torch uses, or None where it cannot be reached."""
    bound = getattr(cudart, "cudaGetLastError", None)
    if bound is not None:
        return lambda: int(bound())
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for path in cudart_paths(maps):
        symbol = next(fn for lib, fn in _RUNTIMES if os.path.basename(path).startswith(lib))
        try:
            # RTLD_NOLOAD: the library torch already loaded, never a second copy with its own state.
            fn = getattr(ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY), symbol)
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int
        fn.argtypes = []
        return lambda: int(fn())
    return None


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
