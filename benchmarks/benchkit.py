"""Small helpers the benchmarks share: number formatting, medians, a free port.

Not a benchmark itself (``nox -s bench`` runs ``benchmarks/*_*.py``; this name has no underscore).
Benchmarks run as scripts, so ``benchmarks/`` is first on ``sys.path`` and ``import benchkit`` works.
"""

from __future__ import annotations

import socket
import statistics
from collections.abc import Iterable

__all__ = ["fmt", "free_port", "median"]


def fmt(x: float | None) -> str:
    """A seconds (or ratio) cell: two decimals, ``-`` for nothing measured."""
    return "-" if x is None else f"{x:.2f}"


def median(xs: Iterable[float | None]) -> float | None:
    """The median of the measured values (None entries skipped); None when nothing was measured."""
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
