"""A text corpus generated on the spot, so the example needs no download.

It writes sentences from a small seeded grammar: varied enough that the loss falls visibly over a
few hundred steps, regular enough that a tiny model learns it.
"""

from __future__ import annotations

import random
from pathlib import Path

SUBJECTS = ["the rover", "a worker", "the master", "each node", "the checkpoint", "a shard", "the agent", "our job"]
VERBS = ["restarts", "persists", "loads", "shards", "trains", "recovers", "waits for", "reports"]
OBJECTS = ["the model", "its state", "the data", "a failed rank", "shared memory", "the next step", "every sample"]
ENDINGS = ["quickly", "from memory", "without loss", "in seconds", "again", "at last", "as planned"]


def generate(num_bytes: int, seed: int = 0) -> bytes:
    """About `num_bytes` of sentences, the same for the same seed."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < num_bytes:
        sentence = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(ENDINGS)}.\n"
        parts.append(sentence)
        size += len(sentence)
    return "".join(parts).encode("ascii")[:num_bytes]


def ensure_corpus(path: Path, num_bytes: int = 1_000_000, seed: int = 0) -> Path:
    """Write the corpus to `path` unless an identical one is already there."""
    data = generate(num_bytes, seed)
    if not path.exists() or path.read_bytes() != data:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path
