"""Finding the log lines a pattern matches without running the pattern over every line.

Rules ask for the lines of a log tail (thousands of lines, almost none of them relevant) in which
a pattern is found. `matching_lines` answers exactly what a per-line search would, but looks only
where the pattern can match: at the lines holding one of its literal anchors
(`dlrover.diagnosis.anchors`), found with `str.find` in the case-folded text.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Sequence

import attrs

from dlrover.diagnosis.anchors import anchors_of
from dlrover.diagnosis.evidence import Evidence

__all__ = ["Scanner", "matching_lines"]


@attrs.frozen
class Scanner:
    """One pattern prepared for scanning a whole log.

    Attributes:
        per_line: the pattern as given; the judge of whether a line matches.
        whole: the same with `re.MULTILINE`, searched over the whole text when the pattern has
            no anchors.
        anchors: sets of lower-cased strings such that the lower-cased text of every match
            contains a member of each (`dlrover.diagnosis.anchors.anchors_of`), most selective
            first. The members of the set least frequent near the end of the text, found with
            `str.find` in the folded text, name the only lines the pattern needs to be tried on,
            and the other sets must be in such a line too. Empty when unknown.
    """

    per_line: re.Pattern[str]
    whole: re.Pattern[str]
    anchors: tuple[frozenset[str], ...]

    @classmethod
    def of(cls, pattern: re.Pattern[str]) -> Scanner:
        """Prepare `pattern` (prepared once per pattern and flags: a pure function of them)."""
        return _prepared(pattern)


@functools.lru_cache(maxsize=4096)
def _prepared(pattern: re.Pattern[str]) -> Scanner:
    # Parsing a pattern for its anchors and compiling its whole-text form cost more than the
    # match; rule sets are built again (each registry, each policy) from the same patterns.
    whole = re.compile(pattern.pattern, pattern.flags | re.MULTILINE)
    return Scanner(pattern, whole, anchors_of(pattern))


SAMPLE_CHARS = 16 * 1024
"""How much of the end of the text is sampled to tell a pattern's rare anchors from common ones.
A text no longer than this is not sampled: its first (most selective) anchor set is searched."""


def _rarest(anchor_sets: Sequence[frozenset[str]], folded: str) -> frozenset[str]:
    """The anchor set whose members occur least often near the end of the text (where the
    failure is): the one whose occurrences are cheapest to visit."""
    if len(anchor_sets) == 1 or len(folded) <= SAMPLE_CHARS:
        return anchor_sets[0]
    start = len(folded) - SAMPLE_CHARS
    return min(anchor_sets, key=lambda anchors: sum(folded.count(a, start) for a in anchors))


def _next_line(starts: Sequence[int], index: int, end: int) -> int:
    return starts[index + 1] if index + 1 < len(starts) else end


SKELETON_MIN_CHARS = 32 * 1024
"""A text longer than this is first searched in its skeleton (`_line_skeleton`); a shorter one
is searched directly, which costs less than building the skeleton."""
SKELETON_MAX_SHARE = 0.75
"""A skeleton longer than this share of the text (a log of lines that are all different) is not
used: searching it first would cost more than it saves."""
_ZEROED_DIGITS = bytes.maketrans(b"123456789", b"000000000")


def _line_skeleton(evidence: Evidence) -> bytes | None:
    """The folded text's distinct lines, each digit written as 0, as UTF-8: every anchor found in
    the text is in it (anchors are ASCII and hold no newline; see `dlrover.diagnosis.anchors`).

    A log tail repeats the same lines with other numbers (progress bars, step reports, rank
    prefixes), so this is usually far shorter than the text, and ruling out one of the hundreds of
    anchors that are absent from a failure's log costs a search of it, not of the whole tail.
    None when it is not much shorter than the text."""
    folded = evidence.folded_text.encode("utf-8", errors="replace").translate(_ZEROED_DIGITS)
    skeleton = b"\n".join(dict.fromkeys(folded.split(b"\n")))
    return skeleton if len(skeleton) <= SKELETON_MAX_SHARE * len(folded) else None


def _new_anchor_index(_evidence: Evidence) -> dict[str, list[int]]:
    return {}


def _searchable(evidence: Evidence) -> tuple[bytes, Sequence[int]]:
    """The folded text's UTF-8 bytes, in which anchors are searched, with where each line starts in
    them. A text with one character beyond Latin-1 (a progress bar's block) is stored with 2 or 4
    bytes a character, which every search of it walks; its UTF-8 form is mostly 1 byte a
    character, and anchors are ASCII (the same bytes in both)."""
    folded = evidence.folded_text
    data = folded.encode("utf-8", errors="replace")
    if len(data) == len(folded):  # ASCII: the offsets are the same
        return data, evidence.line_starts
    starts = [0]
    for line in data.split(b"\n")[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    return data, starts


def _find_anchor(evidence: Evidence, anchor: str) -> list[int]:
    """The lines holding `anchor` in the folded text."""
    needle = anchor.encode("ascii", errors="replace")
    if len(evidence.folded_text) > SKELETON_MIN_CHARS:
        skeleton = evidence.derived("dlrover.line_skeleton", _line_skeleton)
        if skeleton is not None and needle.translate(_ZEROED_DIGITS) not in skeleton:
            return []
    text, starts = evidence.derived("dlrover.searchable_text", _searchable)
    indices = []
    pos = text.find(needle)
    while pos >= 0:
        index = bisect.bisect_right(starts, pos) - 1
        indices.append(index)
        pos = text.find(needle, _next_line(starts, index, len(text)))
    return indices


def _anchored(evidence: Evidence, scanner: Scanner, found: set[int], index_of: dict[str, list[int]]) -> None:
    """Add to `found` the lines holding the scanner's anchors where its pattern matches.

    `index_of` holds the lines of each anchor already looked for in this evidence: several
    patterns and rules share anchors, so each is found once."""
    folded, starts, lines = evidence.folded_text, evidence.line_starts, evidence.lines()
    primary = _rarest(scanner.anchors, folded)
    others = [a for a in scanner.anchors if a is not primary]
    tried: set[int] = set()
    for anchor in primary:
        holding = index_of.get(anchor)
        if holding is None:
            holding = index_of[anchor] = _find_anchor(evidence, anchor)
        for index in holding:
            if index in tried or index in found:
                continue
            tried.add(index)
            if others:
                line = folded[starts[index] : _next_line(starts, index, len(folded))]
                if not all(any(a in line for a in other) for other in others):
                    continue
            if scanner.per_line.search(lines[index]):
                found.add(index)


def _searched(evidence: Evidence, scanner: Scanner, found: set[int]) -> None:
    """Add to `found` the lines where the scanner's pattern matches, searching the whole text."""
    text, starts, lines = evidence.text, evidence.line_starts, evidence.lines()
    pos = 0
    while pos <= len(text):
        m = scanner.whole.search(text, pos)
        if m is None:
            break
        index = bisect.bisect_right(starts, m.start()) - 1
        if index not in found and scanner.per_line.search(lines[index]):
            found.add(index)
        if index + 1 >= len(starts):
            break
        pos = starts[index + 1]


def matching_lines(evidence: Evidence, scanners: Sequence[Scanner]) -> list[int]:
    """Indices of the log lines in which any scanner's pattern is found, ascending.

    A pattern with anchors is tried only on the lines where `str.find` finds one of its anchors
    in the case-folded text: every line the pattern matches holds an anchor, so no line is missed,
    and the regex engine never walks the thousands of lines that cannot match. A pattern without
    anchors is searched over the whole text at once; each candidate line is confirmed with the
    per-line pattern and the next search starts at the following line. Either way the result is
    exactly the set of lines a per-line search would find.
    """
    found: set[int] = set()
    if not evidence.lines():
        return []
    index_of = evidence.derived("dlrover.anchor_lines", _new_anchor_index)
    for scanner in scanners:
        if scanner.anchors and evidence.folded_text:
            _anchored(evidence, scanner, found, index_of)
        else:
            _searched(evidence, scanner, found)
    return sorted(found)
