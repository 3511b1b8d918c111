"""Checkpoint directories laid out as TensorFlow writes them, for the mirror's and flash checkpoints' tests (the
files' contents are arbitrary: neither reads an index)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

SHARDS = 2


def state_text(names: list[str]) -> str:
    """A `checkpoint` state file naming `names`, newest last (as `CheckpointManager` writes it)."""
    lines = [f'model_checkpoint_path: "{names[-1]}"'] + [f'all_model_checkpoint_paths: "{n}"' for n in names]
    return "\n".join(lines) + "\n"


def save(directory: Path, number: int, *, keep: int = 2, payload: bytes | None = None) -> dict[str, bytes]:
    """Save checkpoint `ckpt-<number>` the way TensorFlow does (data and index renamed into place from a `_temp`
    directory, then the state file through a `.tmp` name), keeping the newest `keep`; its files' contents."""
    directory.mkdir(parents=True, exist_ok=True)
    prefix = f"ckpt-{number}"
    body = payload if payload is not None else f"{prefix} ".encode() * 100
    files = {f"{prefix}.data-{i:05d}-of-{SHARDS:05d}": body + bytes([i]) for i in range(SHARDS)}
    files[f"{prefix}.index"] = b"index of " + prefix.encode()
    temp = directory / f"{prefix}_temp"
    temp.mkdir(exist_ok=True)
    for name, content in files.items():
        (temp / name).write_bytes(content)
        os.replace(temp / name, directory / name)
    shutil.rmtree(temp)  # (a save that crashed left its part files there)
    kept = sorted((int(p.name[5:-6]) for p in directory.glob("ckpt-*.index")), reverse=True)[:keep]
    names = [f"ckpt-{n}" for n in sorted(kept)]
    (directory / "checkpoint.tmp0f").write_text(state_text(names))
    os.replace(directory / "checkpoint.tmp0f", directory / "checkpoint")
    for old in directory.glob("ckpt-*"):
        if old.is_file() and old.name.split(".")[0] not in names:
            old.unlink()
    return files


def files_of(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (relative paths) and its contents."""
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}
