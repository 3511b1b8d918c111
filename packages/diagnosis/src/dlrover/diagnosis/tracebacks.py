"""Finding Python tracebacks and exception lines in log text.

Distributed launchers prefix every line with the rank (``[rank3]:``, ``[default0]:``,
``[1,0]<stderr>:``) and interleave ranks, so prefixes are stripped before parsing. A traceback is
the header, its indented frame lines and the first unindented line after them, which names the
exception. Python prints a `SyntaxError` in the main script without a header, so unindented lines
that look like ``SomeError: message`` count too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

__all__ = ["PythonTraceback", "extract_tracebacks", "one_line_summary", "strip_rank_prefix"]

_RANK_PREFIX = re.compile(
    r"^\s*(?:\[(?:rank|default|local_rank)?\d+\]\s*:?\s?|\[\d+,\d+\]<std(?:err|out)>:\s?|rank\s*\d+\s*:\s"
    # srun --label ("12: Traceback ..."): a task number, a colon and one space before the text.
    r"|\d{1,5}: (?=\S|  ))",
    re.IGNORECASE,
)
# The header may follow a label on its line (torchrun's failure summary prints
# "  traceback : Traceback (most recent call last):" with the frames indented below it) or a
# Markdown quote or code marker a user pasted with it.
_HEADER = re.compile(r"(?:^|[\s:>`])(?:Original )?Traceback \(most recent call last\):\s*$")
# Pasted logs wrap lines in Markdown: a quote marker, inline code or a fence glued to the text.
_MARKUP = " \t>`"
# ... or emphasis: bold or italic markers (``**``, ``_**``, ``**_``) around an exception line. No
# Python name starts with "*", and "_" counts only glued to a "*", after it only before a capital
# (``*_pickle.UnpicklingError`` keeps its module's name).
_EMPHASIS = re.compile(r"^(?:_?\*{1,3}(?:_(?=[A-Z]))?)+")
# A dotted identifier ending like an exception class, optionally followed by ": message".
_EXC_LINE = re.compile(r"^([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*)(?::\s?(.*))?$")
_EXC_SUFFIXES = ("Error", "Exception", "Exit", "Interrupt", "Failure", "Fault")


def strip_rank_prefix(line: str) -> str:
    """Remove a launcher's per-rank prefix, if any, from one log line."""
    return _RANK_PREFIX.sub("", line, count=1)


@attrs.frozen
class PythonTraceback:
    """One exception found in a log.

    Attributes:
        exc_type: the exception's name as printed, possibly dotted (``torch.OutOfMemoryError``).
        message: the text after the colon on the exception line (first line only).
        frames: the ``File "...", line N, in f`` lines, outermost first; empty for a bare
            exception line without a traceback header.
        line_index: the index, in the lines given, of the exception line.
        exception_line: the exception line itself as it appeared (without rank prefix).
    """

    exc_type: str
    message: str
    frames: tuple[str, ...]
    line_index: int
    exception_line: str

    @property
    def exc_name(self) -> str:
        """The exception's class name without its module (``OutOfMemoryError``)."""
        return self.exc_type.rsplit(".", 1)[-1]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _looks_like_exception(name: str) -> bool:
    return name.rsplit(".", 1)[-1].endswith(_EXC_SUFFIXES) or name in {"KeyboardInterrupt", "StopIteration"}


def _parse_exception_line(line: str) -> tuple[str, str] | None:
    line = line.strip(_MARKUP)
    unmarked = _EMPHASIS.sub("", line)
    if unmarked != line:  # the closing markers too
        line = unmarked.strip(_MARKUP).rstrip("*_").rstrip(_MARKUP)
    match = _EXC_LINE.match(line)
    if match is None or not _looks_like_exception(match.group(1)):
        return None
    return match.group(1), (match.group(2) or "").strip()


def extract_tracebacks(lines: Sequence[str]) -> tuple[PythonTraceback, ...]:
    """Find every traceback and bare exception line, in the order they appear.

    Args:
        lines: log lines, oldest first (rank prefixes are allowed).

    Returns:
        One `PythonTraceback` per exception, including each link of a chained exception.
    """
    clean = [strip_rank_prefix(line) for line in lines]
    found: list[PythonTraceback] = []
    i = 0
    while i < len(clean):
        line = clean[i]
        if "Traceback" in line and _HEADER.search(line):
            base = _indent(line)
            frames: list[str] = []
            j = i + 1
            # Frame lines and source excerpts are indented deeper than the header; a blank line can
            # appear between them in interleaved output, so skip blanks instead of ending there.
            while j < len(clean) and (not clean[j].strip() or _indent(clean[j]) > base):
                stripped = clean[j].strip()
                if stripped.startswith("File "):
                    frames.append(stripped)
                j += 1
            if j < len(clean):
                parsed = _parse_exception_line(clean[j])
                if parsed is not None:
                    found.append(PythonTraceback(parsed[0], parsed[1], tuple(frames), j, clean[j].strip(_MARKUP)))
                    i = j + 1
                    continue
            i = j
            continue
        if line[:1] not in (" ", "\t"):
            parsed = _parse_exception_line(line)
            if parsed is not None:
                found.append(PythonTraceback(parsed[0], parsed[1], (), i, line.strip(_MARKUP)))
        i += 1
    return tuple(found)


_SUMMARY_PART_CHARS = 300


def _clip(text: str) -> str:
    return text if len(text) <= _SUMMARY_PART_CHARS else text[: _SUMMARY_PART_CHARS - 3] + "..."


def one_line_summary(text: str) -> str:
    """A failure's evidence (or a log tail) in one line, for a log line or a status field.

    A whole traceback belongs in one place (the worker's own output and log file); every other
    mention of a failure names it in one line: the text's first line, then the exception line of
    its last traceback (the exception that ended the program), or else its last non-empty line,
    then how many lines were left out.

    Args:
        text: the evidence, oldest line first (rank prefixes are allowed).

    Returns:
        One line, e.g. ``local rank 0 exited with exit code 1: ValueError: bad (+9 more lines)``;
        the text itself, stripped, when it is one line.
    """
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    if len(lines) <= 1:
        return _clip(lines[0].strip()) if lines else ""
    first, rest = lines[0].strip(), lines[1:]
    found = extract_tracebacks(rest)
    last = found[-1].exception_line if found else strip_rank_prefix(rest[-1]).strip()
    shown = 1 if last == first else 2
    summary = _clip(first) if shown == 1 else f"{_clip(first)}: {_clip(last)}"
    left_out = len(lines) - shown
    return f"{summary} (+{left_out} more lines)" if left_out > 0 else summary
