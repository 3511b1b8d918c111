"""Evidence to a failure kind, with a confidence, the lines that decided it and a reason.

Every rule of the registry is asked; the kind of the most confident match wins, ties broken by a
fixed precedence (a node fault explains the errors that follow it, not the other way round). Two
rules override confidence:

* a communication error is a consequence whenever anything else in the evidence explains it: a
  rank that crashed, was killed, ran out of memory, hit bad data or was stopped from outside
  leaves its peers with broken connections and timed-out collectives, so the other kind is the
  failure and the communication errors are its aftermath;
* when any rule found a user code error, the result is never a transient kind, because a
  transient verdict means "restart", and restarting a bug loops forever.

A rule that raises is reported in the diagnosis and skipped, never fatal.
"""

from __future__ import annotations

import attrs

from dlrover.diagnosis.evidence import Evidence
from dlrover.diagnosis.kinds import TRANSIENT_KINDS, FailureKind
from dlrover.diagnosis.registry import RuleRegistry

__all__ = ["CONSEQUENCE_KINDS", "Diagnosis", "RuleMatch", "classify", "KIND_PRECEDENCE"]

KIND_PRECEDENCE: tuple[FailureKind, ...] = (
    FailureKind.HARDWARE,
    FailureKind.DEVICE_OOM,
    FailureKind.HOST_OOM,
    FailureKind.CONFIG_ERROR,
    FailureKind.USER_CODE,
    FailureKind.DISK_FULL,
    FailureKind.DATA_ERROR,
    FailureKind.NATIVE_CRASH,
    FailureKind.NAN_LOSS,
    FailureKind.HANG,
    FailureKind.COMMUNICATION,
    FailureKind.PREEMPTION,
    FailureKind.KILLED,
    FailureKind.UNKNOWN,
)
"""Ties in confidence go to the kind listed first."""

CONSEQUENCE_KINDS: frozenset[FailureKind] = frozenset({FailureKind.COMMUNICATION})
"""Kinds that follow from any other failure in the same evidence (see `classify`)."""
_NOT_A_CAUSE = CONSEQUENCE_KINDS | {FailureKind.HANG, FailureKind.UNKNOWN}
MIN_CAUSE_CONFIDENCE = 0.45
"""Evidence weaker than this (a step that the scheduler cancelled with no reason, which also
follows a failed task) is never taken as the cause of a communication failure."""

MAX_DECIDING_LINES = 10
BINARY_LOG_FRACTION = 0.3
"""A log tail with more than this share of undecodable or control characters is called binary."""


@attrs.frozen
class RuleMatch:
    """One rule that matched, with its lines."""

    rule: str
    kind: FailureKind
    confidence: float
    lines: tuple[str, ...]


@attrs.frozen
class Diagnosis:
    """The classifier's verdict.

    Attributes:
        kind: the failure kind.
        confidence: in [0, 1]; 0 for `unknown` with no match at all.
        lines: the evidence lines that decided, most relevant last.
        reason: one or two sentences a person can act on.
        rule: the name of the deciding rule, empty when none matched.
        matches: every rule that matched, most confident first.
        rule_errors: rules that raised, with what they raised (they were skipped).
    """

    kind: FailureKind
    confidence: float
    lines: tuple[str, ...]
    reason: str
    rule: str = ""
    matches: tuple[RuleMatch, ...] = ()
    rule_errors: tuple[str, ...] = ()

    @property
    def transient(self) -> bool:
        """True when a plain restart is expected to fix it."""
        return self.kind in TRANSIENT_KINDS


def _rank(match: RuleMatch) -> tuple[float, int]:
    return (-match.confidence, KIND_PRECEDENCE.index(match.kind))


def _quote(line: str, limit: int = 160) -> str:
    return repr(line if len(line) <= limit else line[: limit - 3] + "...")


def _nothing_matched(evidence: Evidence) -> str:
    parts = []
    if evidence.exit is not None:
        parts.append(evidence.exit.describe())
    else:
        parts.append("no exit status")
    log = evidence.log
    if log is None:
        parts.append("no log")
    elif log.empty:
        parts.append("an empty log")
    elif log.binary_fraction > BINARY_LOG_FRACTION:
        parts.append(f"a log that is mostly binary ({log.binary_fraction:.0%} undecodable or control characters)")
    else:
        parts.append(f"{len(log.lines)} log lines")
    if evidence.tracebacks:
        last = evidence.tracebacks[-1]
        parts.append(f"last exception {last.exc_type}")
    return "no rule matched the evidence (" + ", ".join(parts) + ")"


def classify(evidence: Evidence, registry: RuleRegistry) -> Diagnosis:
    """Classify one failure.

    Args:
        evidence: what is known about the failure.
        registry: the rules to apply.

    Returns:
        The diagnosis; `FailureKind.UNKNOWN` with a reason when nothing matched. Never raises
        because of the evidence or a misbehaving rule.
    """
    matches: list[RuleMatch] = []
    errors: list[str] = []
    for rule in registry:
        try:
            found = tuple(str(line) for line in rule.match(evidence))
        except Exception as exc:  # a plugin's bug must not stop the diagnosis
            errors.append(f"rule {rule.name!r} raised {type(exc).__name__}: {exc}")
            continue
        if found:
            matches.append(RuleMatch(rule.name, rule.kind, float(rule.confidence), found))
    matches.sort(key=_rank)
    if not matches:
        return Diagnosis(FailureKind.UNKNOWN, 0.0, (), _nothing_matched(evidence), rule_errors=tuple(errors))
    best = matches[0]
    note = ""
    if best.kind in CONSEQUENCE_KINDS:
        cause = next((m for m in matches if m.kind not in _NOT_A_CAUSE and m.confidence >= MIN_CAUSE_CONFIDENCE), None)
        if cause is not None:
            note = (
                f"; the {best.kind.value} errors ({best.rule}) are taken as the aftermath of the "
                f"{cause.kind.value} failure"
            )
            best = cause
    if best.kind in TRANSIENT_KINDS:
        user = next((m for m in matches if m.kind is FailureKind.USER_CODE), None)
        if user is not None:
            note += (
                f"; {best.kind.value} evidence ({best.rule}) was also found, but a user code error is never "
                "treated as transient"
            )
            best = user
    same_kind = [m for m in matches if m.kind is best.kind]
    lines: list[str] = []
    for m in [best, *[m for m in same_kind if m is not best]]:
        for line in m.lines:
            if line not in lines:
                lines.append(line)
    lines = lines[:MAX_DECIDING_LINES]
    others = sorted({m.kind.value for m in matches if m.kind is not best.kind})
    reason = (
        f"{best.kind.value}: rule '{best.rule}' (confidence {best.confidence:.2f}) matched {_quote(best.lines[-1])}"
    )
    if others:
        reason += f"; other kinds matched with less weight: {', '.join(others)}"
    reason += note
    return Diagnosis(
        kind=best.kind,
        confidence=best.confidence,
        lines=tuple(lines),
        reason=reason,
        rule=best.rule,
        matches=tuple(matches),
        rule_errors=tuple(errors),
    )
