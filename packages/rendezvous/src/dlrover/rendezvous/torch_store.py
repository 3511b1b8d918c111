"""A `torch.distributed.Store` over the rendezvous service's key-value calls.

Workers and agents exchange addresses and counters through it, and `init_process_group(store=...)`
accepts it like any c10d store. Blocking reads (`get`, `wait`) poll the service with a growing
interval up to the store's timeout, then raise `torch.distributed.DistStoreError`, as torch's own
stores do.

This module imports torch; install the `torch` extra.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

import torch.distributed as dist

# torch.distributed re-exports Store from its C extension without `__all__`, which strict mypy
# reads as private; it is the documented public base class of every c10d store.
from torch.distributed import PrefixStore, Store  # type: ignore[attr-defined]

from dlrover.common import Clock, ConfigError, SystemClock
from dlrover.rendezvous.client import RendezvousClient

__all__ = ["ServiceStore"]


def _bytes(value: str | bytes) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


class ServiceStore(Store):
    """A c10d store whose keys live in a `RendezvousService`.

    Keys are shared by everyone using the same service; `with_prefix` gives each round or job its
    own namespace.

    Keep a reference to this object while a `PrefixStore` or a process group uses it: torch reaches
    a Python store's methods through its Python object, and once that object is collected every call
    fails with "Not implemented". `with_prefix` returns a prefix store that holds the reference.

    Args:
        client: the service's client (not closed by the store).
        timeout_s: default time limit of `get` and `wait` (change it later with `set_timeout`).
        poll_interval_s: first interval between polls of a blocking read.
        max_poll_interval_s: the interval doubles up to this.
        clock: time source of the polling loop.

    Raises:
        ConfigError: a time is not positive.
    """

    def __init__(
        self,
        client: RendezvousClient,
        *,
        timeout_s: float = 300.0,
        poll_interval_s: float = 0.002,
        max_poll_interval_s: float = 0.1,
        clock: Clock | None = None,
    ) -> None:
        super().__init__()
        for name, value in (
            ("timeout_s", timeout_s),
            ("poll_interval_s", poll_interval_s),
            ("max_poll_interval_s", max_poll_interval_s),
        ):
            if not value > 0:
                raise ConfigError(f"{name} must be positive, got {value!r}")
        self._client = client
        self._poll_interval_s = poll_interval_s
        self._max_poll_interval_s = max_poll_interval_s
        self._clock = clock or SystemClock()
        self.set_timeout(timedelta(seconds=timeout_s))

    if TYPE_CHECKING:
        # Provided by the C++ base class at run time (`set_timeout` changes it); torch's stubs omit it.
        @property
        def timeout(self) -> timedelta:
            """The default time limit of blocking reads."""
            ...

    def with_prefix(self, prefix: str) -> PrefixStore:
        """A `torch.distributed.PrefixStore` over this store that keeps this store alive."""
        return _OwningPrefixStore(prefix, self)

    def set(self, key: str, value: str | bytes) -> None:
        """Set `key` to `value`."""
        self._client.kv_set([key], [_bytes(value)])

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        """Set every key to its value in one call."""
        self._client.kv_set(list(keys), [_bytes(v) for v in values])

    def get(self, key: str) -> bytes:
        """The value of `key`, waiting up to the store's timeout for it to be set.

        Raises:
            torch.distributed.DistStoreError: the key was not set in time.
        """
        return self.multi_get([key])[0]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """The values of `keys`, waiting up to the store's timeout for all of them."""
        found: list[bytes] = []

        def ready() -> bool:
            values = self._client.kv_get(list(keys))
            if any(v is None for v in values):
                return False
            found[:] = [v for v in values if v is not None]
            return True

        self._poll(ready, keys, self.timeout)
        return found

    def add(self, key: str, amount: int) -> int:
        """Add `amount` to the counter at `key`; returns its new value."""
        return self._client.kv_add(key, int(amount))

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        """Set `key` to `desired` if it holds `expected` (missing counts as empty); returns its value."""
        return self._client.kv_compare_set(key, _bytes(expected), _bytes(desired))

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        """Block until every key is set.

        Raises:
            torch.distributed.DistStoreError: not all keys were set within `timeout` (the store's
                timeout when None).
        """
        self._poll(lambda: self._client.kv_check(list(keys)), keys, timeout or self.timeout)

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every key is set, without waiting."""
        return self._client.kv_check(list(keys))

    def delete_key(self, key: str) -> bool:
        """Delete `key`; whether it existed."""
        return self._client.kv_delete(key)

    def num_keys(self) -> int:
        """How many keys the service holds (every prefix together)."""
        return self._client.kv_num_keys()

    # torch 2.13's C++ trampoline (used when a PrefixStore or a process group calls into this
    # store) looks these two up by their C++ names; the Python names above are the public API.
    deleteKey = delete_key
    getNumKeys = num_keys

    def _poll(self, ready: object, keys: Sequence[str], timeout: timedelta) -> None:
        assert callable(ready)
        limit_s = timeout.total_seconds()
        give_up_at = self._clock.now() + limit_s
        interval = self._poll_interval_s
        while not ready():
            remaining = give_up_at - self._clock.now()
            if remaining <= 0:
                raise dist.DistStoreError(f"keys {list(keys)!r} were not set within {limit_s} s")
            self._clock.sleep(min(interval, remaining))
            interval = min(interval * 2, self._max_poll_interval_s)


class _OwningPrefixStore(PrefixStore):
    """A PrefixStore that holds its Python base store, so the base outlives every call through it."""

    def __init__(self, prefix: str, base: ServiceStore) -> None:
        super().__init__(prefix, base)
        self._base = base
