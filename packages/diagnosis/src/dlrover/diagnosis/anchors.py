"""Literal anchors of a regular expression: strings one of which every match must contain.

A classifier rule's pattern is looked for in a log tail of thousands of lines, almost none of
which can match. Python's regex engine finds a pattern that starts with a literal quickly, but a
pattern that starts with ``\\b``, a group or an alternation is tried at every position of the
text. Finding a pattern's anchors with `str.find` first (a fast substring search) and running the
pattern only on the lines that hold one makes the cost of a rule proportional to the lines that
could match, not to the size of the log.

`anchors_of` reads the pattern's parse tree and answers conservatively: a set of lower-cased
ASCII strings such that the lower-cased text of every match contains at least one of them, or
None when it cannot promise that (the caller then scans with the pattern itself). The parse tree
comes from the standard library's regex parser, which is not a public API; any surprise from it
also yields None.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

__all__ = ["MIN_ANCHOR_CHARS", "anchors_of"]

MIN_ANCHOR_CHARS = 3
"""Anchors shorter than this would propose most lines of a log; the pattern is scanned instead."""

_ZERO_WIDTH = frozenset({"AT", "ASSERT", "ASSERT_NOT"})
_REPEATS = frozenset({"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"})


def _parser() -> Any:
    """The standard library's own regex parser (``re._parser`` since Python 3.11), or None."""
    try:
        return importlib.import_module("re._parser")
    except ImportError:  # pragma: no cover - depends on the interpreter
        return None


Anchors = frozenset[str]


def _literal(code: int) -> str | None:
    char = chr(code)
    # Only ASCII: `re.IGNORECASE` equates a few non-ASCII characters with ASCII letters (the
    # Kelvin sign, the long s, the dotted and dotless i), which the folded log text maps to their
    # ASCII letters (`dlrover.diagnosis.logtail.fold_case`); other non-ASCII folds differ.
    if not char.isascii() or char == "\n":
        return None
    return char.lower()


def _selectivity(anchors: Anchors) -> tuple[int, int]:
    # The longest shortest member, then the fewest members.
    return (min(len(a) for a in anchors), -len(anchors))


def _best(candidates: list[Anchors]) -> Anchors | None:
    usable = [c for c in candidates if c]
    return max(usable, key=_selectivity) if usable else None


def _through(name: str, arg: Any) -> Anchors | None:
    """The anchors of a part every match passes through: a group, an alternation whose every
    branch has anchors, a repeat of at least once; None for anything else."""
    if name == "SUBPATTERN":
        return _sequence(arg[-1])
    if name == "ATOMIC_GROUP":
        return _sequence(arg)
    if name in _REPEATS:
        low, _high, body = arg
        return _sequence(body) if low >= 1 else None
    if name == "BRANCH":
        branches = [_sequence(alt) for alt in arg[1]]
        if branches and all(b is not None for b in branches):
            return frozenset().union(*[b for b in branches if b is not None])
    return None


def _candidates(items: Any) -> list[Anchors]:
    """Every anchor set of a sequence of parse-tree nodes: each run of adjacent literals, and the
    best anchors of each part every match passes through. Each set alone is a necessary condition."""
    candidates: list[Anchors] = []
    run: list[str] = []
    for op, arg in items:
        name = getattr(op, "name", str(op))
        char = _literal(arg) if name == "LITERAL" else None
        if char is not None:
            run.append(char)
            continue
        if name in _ZERO_WIDTH:  # the literals on either side stay adjacent in the text
            continue
        if run:  # anything else ends the run of literals
            candidates.append(frozenset({"".join(run)}))
            run = []
        inner = _through(name, arg)
        if inner:
            candidates.append(inner)
    if run:
        candidates.append(frozenset({"".join(run)}))
    return candidates


def _sequence(items: Any) -> Anchors | None:
    return _best(_candidates(items))


def anchors_of(pattern: re.Pattern[str]) -> tuple[Anchors, ...]:
    """Sets of lower-cased strings such that the lower-cased text of every match of `pattern`
    contains a member of each set, most selective set first; empty when none of useful length is
    known.

    Args:
        pattern: a compiled pattern (any flags).

    Returns:
        The anchor sets, each member at least `MIN_ANCHOR_CHARS` long; empty to mean "scan with
        the pattern".
    """
    parser = _parser()
    if parser is None or not isinstance(pattern.pattern, str):
        return ()
    try:
        found = _candidates(list(parser.parse(pattern.pattern, pattern.flags)))
    except Exception:  # the private parser changed shape: scan with the pattern instead
        return ()
    usable = [c for c in found if min(len(a) for a in c) >= MIN_ANCHOR_CHARS]
    return tuple(sorted(set(usable), key=_selectivity, reverse=True))
