"""Bounded exponential backoff, shared by the master's retries (the Kubernetes watch and requests,
launches a backend failed for a passing reason)."""

from __future__ import annotations

__all__ = ["Backoff"]


class Backoff:
    """Bounded exponential backoff: `initial * multiplier**n` for the n-th consecutive failure, at
    most `cap`. A pure counter: the caller waits, and resets it once something succeeded."""

    def __init__(self, initial_s: float, cap_s: float, multiplier: float = 2.0) -> None:
        self._initial = initial_s
        self._cap = cap_s
        self._multiplier = multiplier
        self._failures = 0

    @property
    def failures(self) -> int:
        """Consecutive failures since the last reset."""
        return self._failures

    def next_delay(self, at_least_s: float = 0.0) -> float:
        """Count one more failure and return how long to wait before retrying.

        Args:
            at_least_s: a wait the server asked for (Retry-After); honoured up to the cap.
        """
        exponent = min(self._failures, 64)  # past the cap anyway; keeps the float finite
        self._failures += 1
        delay = self._initial * self._multiplier**exponent
        return min(self._cap, max(delay, at_least_s))

    def reset(self) -> None:
        """Something succeeded: the next failure waits the initial delay again."""
        self._failures = 0
