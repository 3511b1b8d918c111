"""Ports a PS job's tasks keep for the whole job.

A task's address is fixed at the start and reused by every relaunch, and the task binds it only after its
TensorFlow import, seconds later. A port from the kernel's ephemeral range (what binding port 0 gives) could meanwhile
be taken by any outgoing connection on the host, so ports are drawn below that range, where only a program that
asks for that very port can take it.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Collection
from pathlib import Path

__all__ = ["EPHEMERAL_RANGE_FILE", "task_ports"]

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000  # well above the ports services usually listen on
_DEFAULT_EPHEMERAL_LOW = 32768  # Linux's default when the range cannot be read


def _ephemeral_low(range_file: Path) -> int:
    try:
        return int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_LOW


def task_ports(
    host: str,
    count: int,
    *,
    exclude: Collection[int] = (),
    range_file: Path = EPHEMERAL_RANGE_FILE,
    rng: random.Random | None = None,
) -> list[int]:
    """`count` distinct TCP ports on `host` that nothing listens on now, below the ephemeral range, none of
    `exclude` (ports the job's other tasks keep, free while those tasks are down).

    Falls back to ports the kernel picks (binding port 0) when the ephemeral range leaves too little room below it.

    Raises:
        OSError: not enough free ports could be found.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low, high = _LOWEST, _ephemeral_low(range_file)
    held: list[socket.socket] = []
    try:
        if high - low >= 16 * count:
            candidates = (rng or random.SystemRandom()).sample(range(low, high), min(high - low, 64 * count))
            for port in candidates:
                if port in exclude:
                    continue
                s = socket.socket(family, socket.SOCK_STREAM)
                try:
                    s.bind((host, port))
                except OSError:
                    s.close()
                    continue
                held.append(s)
                if len(held) == count:
                    break
        while len(held) < count:
            s = socket.socket(family, socket.SOCK_STREAM)
            try:
                s.bind((host, 0))
            except OSError:
                s.close()
                raise
            if s.getsockname()[1] in exclude:
                s.close()
                continue
            held.append(s)
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()
