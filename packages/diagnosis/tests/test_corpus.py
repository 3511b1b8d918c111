"""The classifier and the default policy against the labelled failure corpus in corpus/.

The corpus holds logs written for this project in the shapes real jobs print (rank prefixes,
torchrun summaries, NCCL chatter, progress bars, fp16 overflow noise), some with structured
evidence beside them. The bar: at least 95 % right, and no user code error ever called transient.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dlrover.diagnosis import (
    NO_OOM_KILL,
    TRANSIENT_KINDS,
    ActionKind,
    ActionPolicy,
    Evidence,
    FailureKind,
    HangReport,
    LossSample,
    ProbeResult,
    RuleRegistry,
    classify,
)

CORPUS = Path(__file__).parent / "corpus"


def _entries() -> list[dict[str, Any]]:
    return list(json.loads((CORPUS / "manifest.json").read_text())["entries"])


def _evidence(entry: dict[str, Any]) -> Evidence:
    hang = None
    if "hang" in entry:
        h = entry["hang"]
        hang = HangReport(
            True,
            tuple(h["stalled_ranks"]),
            tuple(h["stalled_for_s"]),
            h["window_s"],
            f"no step progress from rank(s) {h['stalled_ranks']} for over {h['window_s']} s",
        )
    log = (CORPUS / entry["file"]).read_bytes()
    if entry.get("oom_records") == "no_kill":  # the agent read its OOM records: they show no kill
        log += f"\n{NO_OOM_KILL}: the memory cgroup's oom_kill count stayed at 0 while the workers ran\n".encode()
    return Evidence.from_text(
        log,
        returncode=entry["exit_code"],
        node_id="node-0",
        losses=[LossSample(**loss) for loss in entry.get("losses", [])],
        probes=[ProbeResult(**p) for p in entry.get("probes", [])],
        hang=hang,
    )


def test_corpus_is_big_and_varied() -> None:
    entries = _entries()
    assert len(entries) >= 60
    kinds = Counter(e["kind"] for e in entries)
    assert set(kinds) == {k.value for k in FailureKind}, "every kind appears in the corpus"
    assert all(n >= 3 for n in kinds.values()), kinds
    for e in entries:
        assert (CORPUS / e["file"]).is_file(), e["file"]
        FailureKind(e["kind"])
        ActionKind(e["action"])


def test_classifier_accuracy_on_corpus() -> None:
    registry = RuleRegistry.with_builtin_rules()
    entries = _entries()
    wrong = []
    for entry in entries:
        diagnosis = classify(_evidence(entry), registry)
        assert diagnosis.reason, entry["file"]
        if diagnosis.kind.value != entry["kind"]:
            wrong.append(f"{entry['file']}: expected {entry['kind']}, got {diagnosis.kind.value} ({diagnosis.reason})")
    accuracy = 1 - len(wrong) / len(entries)
    assert accuracy >= 0.95, "\n".join(wrong)


def test_no_user_code_error_is_classified_transient() -> None:
    registry = RuleRegistry.with_builtin_rules()
    for entry in _entries():
        if entry["kind"] != FailureKind.USER_CODE.value:
            continue
        diagnosis = classify(_evidence(entry), registry)
        assert diagnosis.kind not in TRANSIENT_KINDS, (entry["file"], diagnosis.reason)
        assert not diagnosis.transient


def test_decisive_lines_come_from_the_evidence() -> None:
    registry = RuleRegistry.with_builtin_rules()
    for entry in _entries():
        evidence = _evidence(entry)
        diagnosis = classify(evidence, registry)
        if diagnosis.kind is FailureKind.UNKNOWN and not diagnosis.rule:
            assert diagnosis.lines == ()
            continue
        assert diagnosis.lines, entry["file"]
        log_lines = set(evidence.lines())
        structured = [line for line in diagnosis.lines if line not in log_lines]
        # Lines not in the log are sentences rules wrote about structured evidence.
        assert all(
            any(word in line for word in ("exit status", "loss", "probe", "progress", "memory")) for line in structured
        ), (entry["file"], structured)


@pytest.mark.parametrize("entry", _entries(), ids=lambda e: e["file"])
def test_default_policy_picks_the_labelled_action(entry: dict[str, Any]) -> None:
    policy = ActionPolicy()
    decision = policy.decide("node-0", FailureKind(entry["kind"]))
    assert decision.action.value == entry["action"], decision.reason
