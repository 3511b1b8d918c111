"""A bounded in-memory key-value store: the state behind the rendezvous service's KV calls.

It has the semantics of torch's c10d stores (counters stored as decimal text, compare-and-set that
creates a missing key when the expected value is empty), so `torch.distributed.Store` can be
implemented over it, but it is plain Python and knows nothing of torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from dlrover.common import ConfigError
from dlrover.rendezvous.errors import InvalidRequestError, StoreFullError

__all__ = ["KeyValueStore", "KvLimits"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _positive(_inst: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{attribute.name} must be a positive integer, got {value!r}")


@attrs.frozen
class KvLimits:
    """Bounds that keep one misbehaving client from exhausting the master's memory.

    Attributes:
        max_key_bytes: the longest key, in UTF-8 bytes.
        max_value_bytes: the largest value.
        max_keys: how many keys the store holds at most.
        max_total_bytes: the most bytes of keys and values the store holds in all.
    """

    max_key_bytes: int = attrs.field(default=1024, validator=_positive)
    max_value_bytes: int = attrs.field(default=1024 * 1024, validator=_positive)
    max_keys: int = attrs.field(default=1_000_000, validator=_positive)
    max_total_bytes: int = attrs.field(default=256 * 1024 * 1024, validator=_positive)


class KeyValueStore:
    """Keys (strings) to values (bytes), with counters and compare-and-set.

    Every method validates all of its input before it changes anything.

    Args:
        limits: size bounds.
    """

    def __init__(self, limits: KvLimits | None = None) -> None:
        self._limits = limits or KvLimits()
        self._data: dict[str, bytes] = {}
        self._bytes = 0

    def _key(self, key: object) -> str:
        if not isinstance(key, str) or not key:
            raise InvalidRequestError(f"a key must be a non-empty string, got {key!r}")
        if len(key.encode("utf-8")) > self._limits.max_key_bytes:
            raise InvalidRequestError(
                f"key {key[:40]!r}... has more than max_key_bytes={self._limits.max_key_bytes} bytes"
            )
        return key

    def _value(self, key: str, value: object) -> bytes:
        if not isinstance(value, bytes):
            raise InvalidRequestError(f"the value of key {key!r} must be bytes, got {type(value).__name__}")
        if len(value) > self._limits.max_value_bytes:
            raise InvalidRequestError(
                f"the value of key {key!r} has {len(value)} bytes, more than max_value_bytes="
                f"{self._limits.max_value_bytes}"
            )
        return value

    def _room_for(self, new_keys: int, changes: Sequence[tuple[str, bytes]] = ()) -> None:
        if len(self._data) + new_keys > self._limits.max_keys:
            raise StoreFullError(f"the store holds {len(self._data)} keys; max_keys={self._limits.max_keys} reached")
        after = self._bytes + sum(self._size_change(k, v) for k, v in dict(changes).items())
        if after > self._limits.max_total_bytes:
            raise StoreFullError(f"the store would hold {after} bytes; max_total_bytes={self._limits.max_total_bytes}")

    def _size_change(self, key: str, value: bytes) -> int:
        old = self._data.get(key)
        return len(value) - (len(old) if old is not None else -len(key.encode("utf-8")))

    def _put(self, key: str, value: bytes) -> None:
        self._bytes += self._size_change(key, value)
        self._data[key] = value

    def set(self, key: str, value: bytes) -> None:
        """Set `key` to `value`."""
        self.multi_set([key], [value])

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        """Set every key to its value, all or none.

        Raises:
            InvalidRequestError: lengths differ, or a key or value is malformed.
            StoreFullError: the new keys would pass `max_keys`.
        """
        if len(keys) != len(values):
            raise InvalidRequestError(f"multi_set got {len(keys)} keys but {len(values)} values")
        checked = [(self._key(k), self._value(k, v)) for k, v in zip(keys, values, strict=True)]
        self._room_for(len({k for k, _ in checked if k not in self._data}), checked)
        for k, v in checked:
            self._put(k, v)

    def get(self, key: str) -> bytes | None:
        """The value of `key`, or None when it is not set."""
        return self._data.get(self._key(key))

    def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values of `keys` (None for each that is not set)."""
        checked = [self._key(k) for k in keys]
        return [self._data.get(k) for k in checked]

    def add(self, key: str, amount: int) -> int:
        """Add `amount` to the counter at `key` (missing counts as 0) and return the new value.

        Raises:
            InvalidRequestError: the key holds something other than a decimal integer, or the result
                leaves the int64 range.
            StoreFullError: the key is new and the store is full.
        """
        self._key(key)
        current = self._data.get(key)
        try:
            base = 0 if current is None else int(current.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            raise InvalidRequestError(f"key {key!r} holds {current!r:.60}, not an integer counter") from None
        total = base + amount
        if not _INT64_MIN <= total <= _INT64_MAX:
            raise InvalidRequestError(f"adding {amount} to key {key!r} leaves the int64 range")
        encoded = str(total).encode("ascii")
        self._room_for(1 if current is None else 0, [(key, encoded)])
        self._put(key, encoded)
        return total

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set `key` to `desired` if it holds `expected`; return the value it holds afterwards.

        A missing key counts as holding the empty value, so `expected=b""` creates it. When the key
        is missing and `expected` is not empty, nothing changes and `expected` comes back (torch's
        stores answer the same way).
        """
        self._key(key)
        self._value(key, expected)
        self._value(key, desired)
        current = self._data.get(key)
        if current is None:
            if expected:
                return expected
            self._room_for(1, [(key, desired)])
            self._put(key, desired)
            return desired
        if current == expected:
            self._room_for(0, [(key, desired)])
            self._put(key, desired)
            return desired
        return current

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every key in `keys` is set."""
        checked = [self._key(k) for k in keys]
        return all(k in self._data for k in checked)

    def delete_key(self, key: str) -> bool:
        """Delete `key`; whether it existed."""
        key = self._key(key)
        old = self._data.pop(key, None)
        if old is None:
            return False
        self._bytes -= len(key.encode("utf-8")) + len(old)
        return True

    def num_keys(self) -> int:
        """How many keys are set."""
        return len(self._data)

    def items(self) -> dict[str, bytes]:
        """A copy of every key and its value (what a host persists to restore the store later)."""
        return dict(self._data)

    def restore(self, items: Mapping[str, bytes]) -> None:
        """Replace the whole content with `items` (a persisted copy of `items()`), all or none.

        Raises:
            InvalidRequestError: a key or value is malformed; nothing changed.
            StoreFullError: `items` exceed `max_keys` or `max_total_bytes`; nothing changed.
        """
        checked = {self._key(k): self._value(k, v) for k, v in items.items()}
        if len(checked) > self._limits.max_keys:
            raise StoreFullError(f"cannot restore {len(checked)} keys; max_keys={self._limits.max_keys}")
        total = sum(len(k.encode("utf-8")) + len(v) for k, v in checked.items())
        if total > self._limits.max_total_bytes:
            raise StoreFullError(f"cannot restore {total} bytes; max_total_bytes={self._limits.max_total_bytes}")
        self._data = checked
        self._bytes = total
