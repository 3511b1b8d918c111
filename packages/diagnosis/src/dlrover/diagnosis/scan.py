"""Finding the log lines a pattern matches without running the pattern over every line.

Rules ask for the lines of a log tail (thousands of lines, almost none of them relevant) in which
a pattern is found. `matching_lines` answers exactly what a per-line search would, but looks only
where the pattern can match: at the lines holding one of its literal anchors
(`dlrover.diagnosis.anchors`), found with `str.find` in the case-folded text.
"""

from __future__ import annotations

import bisect
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
        """Prepare `pattern`."""
        whole = re.compile(pattern.pattern, pattern.flags | re.MULTILINE)
        return cls(pattern, whole, anchors_of(pattern))


SAMPLE_CHARS = 16 * 1024
"""How much of the end of the text is sampled to tell a pattern's rare anchors from common ones."""


def _rarest(anchor_sets: Sequence[frozenset[str]], folded: str) -> frozenset[str]:
    """The anchor set whose members occur least often near the end of the text (where the
    failure is): the one whose occurrences are cheapest to visit."""
    if len(anchor_sets) == 1:
        return anchor_sets[0]
    start = max(0, len(folded) - SAMPLE_CHARS)
    return min(anchor_sets, key=lambda anchors: sum(folded.count(a, start) for a in anchors))


def _next_line(starts: Sequence[int], index: int, end: int) -> int:
    return starts[index + 1] if index + 1 < len(starts) else end


def _anchor_lines(evidence: Evidence, anchor: str) -> list[int]:
    """The lines holding `anchor` in the folded text, found once per evidence: several patterns
    and rules share anchors."""

    def find(ev: Evidence) -> list[int]:
        folded, starts = ev.folded_text, ev.line_starts
        indices = []
        pos = folded.find(anchor)
        while pos >= 0:
            index = bisect.bisect_right(starts, pos) - 1
            indices.append(index)
            pos = folded.find(anchor, _next_line(starts, index, len(folded)))
        return indices

    return evidence.derived("dlrover.anchor:" + anchor, find)


def _anchored(evidence: Evidence, scanner: Scanner, found: set[int]) -> None:
    """Add to `found` the lines holding the scanner's anchors where its pattern matches."""
    folded, starts, lines = evidence.folded_text, evidence.line_starts, evidence.lines()
    primary = _rarest(scanner.anchors, folded)
    others = [a for a in scanner.anchors if a is not primary]
    tried: set[int] = set()
    for anchor in primary:
        for index in _anchor_lines(evidence, anchor):
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
    for scanner in scanners:
        if scanner.anchors and evidence.folded_text:
            _anchored(evidence, scanner, found)
        else:
            _searched(evidence, scanner, found)
    return sorted(found)
