"""Reading the end of a worker's log without ever reading more than a configured tail.

Logs of long jobs grow to gigabytes; the failure is at the end. The reader seeks to
``size - max_bytes`` and reads at most ``max_bytes``, so its memory and I/O are bounded by the
configuration, not by the file. Bytes that are not UTF-8 are replaced, control characters and
terminal colour codes removed, and over-long lines cut, so binary garbage yields harmless text plus
a `binary_fraction` that tells the classifier not to trust it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import BinaryIO

import attrs

from dlrover.common.validators import positive_int

__all__ = ["LogTail", "TailConfig", "fold_case", "read_log_tail", "read_tail_from_stream", "tail_from_bytes"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# Everything below space except tab; DEL; and the replacement character that undecodable bytes become.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\ufffd]")


@attrs.frozen
class TailConfig:
    """How much of a log the reader may look at.

    Attributes:
        max_bytes: the most bytes read from the end of the file (default 256 KiB: a few thousand
            lines, enough for the last tracebacks of several ranks).
        max_lines: the most lines kept from that tail (the last ones).
        max_line_chars: lines longer than this are cut, so one giant line cannot stall a rule.
    """

    max_bytes: int = attrs.field(default=256 * 1024, validator=positive_int)
    max_lines: int = attrs.field(default=4000, validator=positive_int)
    max_line_chars: int = attrs.field(default=2000, validator=positive_int)


@attrs.frozen
class LogTail:
    """The readable end of a log.

    Attributes:
        lines: the last lines, cleaned (no control characters or colour codes), oldest first.
        source: where the log came from (a path, or a label for in-memory text).
        file_size: the size of the whole log in bytes.
        bytes_read: how many bytes were read; never more than `TailConfig.max_bytes`.
        truncated: True when the log was larger than what was read, so earlier lines are missing.
        binary_fraction: the share of characters that were undecodable or control characters; a
            high value means the "log" is mostly binary.
    """

    lines: tuple[str, ...]
    source: str = ""
    file_size: int = 0
    bytes_read: int = 0
    truncated: bool = False
    binary_fraction: float = 0.0

    @property
    def empty(self) -> bool:
        """True when the tail holds no non-blank line."""
        return not any(line.strip() for line in self.lines)


def tail_from_bytes(data: bytes, config: TailConfig, *, source: str = "", file_size: int | None = None) -> LogTail:
    """Clean a tail already in memory and split it into lines.

    Args:
        data: the raw bytes; only the last ``config.max_bytes`` are used.
        config: the limits.
        source: a label for the log.
        file_size: the size of the whole log, when `data` is only its end.

    Returns:
        The cleaned tail.
    """
    total = len(data) if file_size is None else file_size
    data = data[-config.max_bytes :]
    truncated = total > len(data)
    text = data.decode("utf-8", errors="replace")
    if truncated:
        # The first line is almost certainly cut in the middle: drop it rather than match half a line.
        newline = text.find("\n")
        text = text[newline + 1 :] if newline >= 0 else ""
    text = _ANSI.sub("", text)
    bad = len(_CONTROL.findall(text)) - text.count("\r")
    binary_fraction = (max(bad, 0) / len(text)) if text else 0.0
    lines: list[str] = []
    for raw in text.replace("\r\n", "\n").split("\n"):
        # A carriage return without newline is a progress bar redrawing: keep the final state.
        line = raw.rsplit("\r", 1)[-1]
        line = _CONTROL.sub(" ", line).rstrip()
        lines.append(line[: config.max_line_chars])
    while lines and not lines[-1]:
        lines.pop()
    kept = tuple(lines[-config.max_lines :])
    return LogTail(
        lines=kept,
        source=source,
        file_size=total,
        bytes_read=len(data),
        truncated=truncated or len(lines) > len(kept),
        binary_fraction=round(binary_fraction, 4),
    )


def read_tail_from_stream(stream: BinaryIO, config: TailConfig, *, source: str = "") -> LogTail:
    """Read at most ``config.max_bytes`` from the end of a seekable binary stream.

    Args:
        stream: an open, seekable binary file.
        config: the limits.
        source: a label for the log.

    Returns:
        The cleaned tail.
    """
    size = stream.seek(0, os.SEEK_END)
    start = max(0, size - config.max_bytes)
    stream.seek(start)
    chunks: list[bytes] = []
    remaining = size - start
    while remaining > 0:
        # read() may return less than asked; loop, but never ask for more than what is left of the tail.
        chunk = stream.read(min(remaining, 64 * 1024))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return tail_from_bytes(b"".join(chunks), config, source=source, file_size=size)


def read_log_tail(path: str | os.PathLike[str], config: TailConfig | None = None) -> LogTail:
    """Read the end of a log file, bounded by `config`.

    Args:
        path: the log file.
        config: the limits; the defaults of `TailConfig` when omitted.

    Returns:
        The cleaned tail.

    Raises:
        FileNotFoundError: if the file does not exist (a missing log is the caller's evidence to
            record, not something to guess about).
    """
    cfg = config or TailConfig()
    with Path(path).open("rb") as stream:
        return read_tail_from_stream(stream, cfg, source=str(path))


# Characters that `re.IGNORECASE` equates with an ASCII letter but `str.lower` does not map to it
# (or maps to two characters); folded first so the lower-cased text matches what IGNORECASE would.
_FOLD_SPECIAL = ("\u0130", "\u0131", "\u017f", "\u212a")
_FOLD = str.maketrans(dict.fromkeys(_FOLD_SPECIAL[:2], "i") | {"\u017f": "s", "\u212a": "k"})


def fold_case(text: str) -> str:
    """`text` lower-cased for case-insensitive scanning; empty when that would move characters."""
    if text.isascii():
        return text.lower()
    if any(special in text for special in _FOLD_SPECIAL):
        # str.translate with a mapping is slow per character: only when there is something to map.
        text = text.translate(_FOLD)
    folded = text.lower()
    return folded if len(folded) == len(text) else ""
