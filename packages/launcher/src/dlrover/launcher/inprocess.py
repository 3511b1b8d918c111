"""Single-process pieces of the control plane: a free port, and a round store held in memory.

Product code (the gRPC control plane, the network check) uses them; so does `FakeControlPlane`.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence

from dlrover.rendezvous import KeyValueStore

__all__ = ["InMemoryRoundStore", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the usual small race applies)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class InMemoryRoundStore:
    """A `RoundStore` in memory, safe to share between threads: for tests and single-process use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kv = KeyValueStore()

    def kv_get(self, keys: Sequence[str]) -> list[bytes | None]:
        with self._lock:
            return self._kv.multi_get(list(keys))

    def kv_compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        with self._lock:
            return self._kv.compare_set(key, expected, desired)

    def kv_delete(self, key: str) -> bool:
        with self._lock:
            return self._kv.delete_key(key)

    def keys(self) -> list[str]:
        """Every key set, sorted (for tests)."""
        with self._lock:
            return sorted(self._kv.items())
