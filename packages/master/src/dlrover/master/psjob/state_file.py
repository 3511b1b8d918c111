"""A TensorFlow checkpoint directory's `checkpoint` state file: which checkpoints it names, and a copy of it that
names only complete ones.

The file is a text-format `CheckpointState` message that `tf.train.CheckpointManager` (and `Checkpoint.save`)
rewrites after each save, atomically: `model_checkpoint_path` is the newest checkpoint, the
`all_model_checkpoint_paths` lines every one kept (oldest first), each with an `all_model_checkpoint_timestamps`
line in the same order. TensorFlow 2 writes paths relative to the file's directory; a path may be absolute. Strings
are C-escaped (octal bytes of UTF-8 among them). Nothing here executes or unpickles anything.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import PurePosixPath

import attrs

__all__ = ["STATE_FILE", "StateCopy", "named_paths", "state_copy", "state_paths"]

STATE_FILE = "checkpoint"
"""The name of a checkpoint directory's state file, which names its checkpoints once they are complete."""

_PATH_LINE = re.compile(r'^(model_checkpoint_path|all_model_checkpoint_paths):\s*"((?:[^"\\]|\\.)*)"\s*$')
_TIMESTAMP_LINE = re.compile(r"^all_model_checkpoint_timestamps:")
_ESCAPE = re.compile(rb"\\([0-7]{1,3}|.)", re.DOTALL)
_NEWEST = "model_checkpoint_path"


def unescape(text: str) -> str:
    """A text-format string's value: C escapes (octal bytes of UTF-8 among them) undone."""
    simple = {b"n": b"\n", b"t": b"\t", b"r": b"\r"}

    def one(match: re.Match[bytes]) -> bytes:
        code = match.group(1)
        return bytes([int(code, 8) & 0xFF]) if code[:1].isdigit() else simple.get(code, code)

    return _ESCAPE.sub(one, text.encode("utf-8")).decode("utf-8", "replace")


def _quote(path: str) -> str:
    out = []
    for byte in path.encode("utf-8"):
        char = chr(byte)
        out.append("\\" + char if char in '"\\' else char if 0x20 <= byte < 0x7F else f"\\{byte:03o}")
    return "".join(out)


def named_paths(text: str) -> list[tuple[str, str]]:
    """(field, path as written) of each checkpoint line, in the file's order."""
    found = (_PATH_LINE.match(line) for line in text.splitlines())
    return [(m.group(1), unescape(m.group(2))) for m in found if m is not None]


def state_paths(text: str) -> tuple[str, ...]:
    """Every checkpoint a state file's text names, as written (relative to its directory unless absolute), each
    once, the newest (`model_checkpoint_path`) first."""
    named = named_paths(text)
    newest = [path for field, path in named if field == _NEWEST]
    return tuple(dict.fromkeys(newest + [path for _field, path in named]))


@attrs.frozen
class StateCopy:
    """What to write for a state file in another directory.

    Attributes:
        text: the file's new contents; None: nothing can be written now (`why`).
        newest: its newest checkpoint (relative to its directory).
        why: why nothing can be written.
        never: nothing ever can (it names checkpoints outside its directory).
    """

    text: bytes | None
    newest: str = ""
    why: str = ""
    never: bool = False


def _relative(named: str, directory: str) -> str | None:
    """`named` relative to `directory` (as written when it is); None for an absolute path outside it."""
    if not PurePosixPath(named).is_absolute():
        return named
    try:
        return PurePosixPath(named).relative_to(directory).as_posix()
    except ValueError:
        return None


def _without_stamps(lines: list[str], dropped: set[int]) -> list[str]:
    """`lines` without the timestamps of the paths at `dropped` (the n-th timestamp belongs to the n-th path)."""
    out: list[str] = []
    stamp = -1
    for line in lines:
        if _TIMESTAMP_LINE.match(line):
            stamp += 1
            if stamp in dropped:
                continue
        out.append(line)
    return out


def state_copy(text: bytes, directory: str, complete: Callable[[str], bool], *, promote: bool = False) -> StateCopy:
    """The state file `text` (of `directory`) as a copy elsewhere should have it, naming only complete checkpoints
    (`complete(relative path)`). The newest must be complete (with `promote`, the newest complete one takes its
    place); older ones that are not (`CheckpointManager` names the one it is deleting until its next write) are
    left out with their timestamps. An absolute path inside `directory` is made relative; one outside it cannot be
    copied."""
    kept: list[str] = []
    dropped: set[int] = set()  # positions among the all_model_checkpoint_paths lines
    position = -1
    newest = last_complete = ""
    newest_at = 0
    for line in text.decode("utf-8", "replace").splitlines():
        found = _PATH_LINE.match(line)
        if found is None:
            kept.append(line)
            continue
        field, written = found.group(1), unescape(found.group(2))
        named = _relative(written, directory)
        if named is None:
            return StateCopy(None, why=f"it names {written}, outside its directory", never=True)
        if field == _NEWEST:
            newest, newest_at = named, len(kept)
        else:
            position += 1
            if not complete(named):
                dropped.add(position)
                continue
            last_complete = named
        kept.append(f'{field}: "{_quote(named)}"')
    if not newest:
        return StateCopy(None, why="it names no checkpoint")
    if not complete(newest):
        if not promote or not last_complete:
            return StateCopy(None, why=f"its newest checkpoint {newest} is not complete")
        newest = last_complete
        kept[newest_at] = f'{_NEWEST}: "{_quote(newest)}"'
    return StateCopy(("\n".join(_without_stamps(kept, dropped)) + "\n").encode("utf-8"), newest)
