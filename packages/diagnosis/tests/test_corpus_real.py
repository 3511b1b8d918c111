"""The real-world corpus in corpus_real/: well formed, split by its documented rule, and the
classifier's accuracy on each part (kinds and first actions), printed and held to the measured
floors. The held-out part was scored once, after the rules were final (see the corpus README).
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dlrover.diagnosis import ActionKind, FailureKind

CORPUS = Path(__file__).parent / "corpus_real"
SCORER = Path(__file__).resolve().parents[3] / "tools" / "corpus_accuracy.py"
LAUNCHERS = {"torchrun", "deepspeed", "accelerate", "lightning", "megatron", "slurm", "kubernetes", "other"}
FIELDS = ["file", "source", "project", "launcher", "kind", "action", "exit_code", "signal", "justification", "split"]


def _manifest() -> dict[str, Any]:
    return dict(json.loads((CORPUS / "manifest.json").read_text(encoding="utf-8")))


def _scorer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("corpus_accuracy", SCORER)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_entry_is_complete_and_points_at_its_excerpt() -> None:
    manifest = _manifest()
    assert manifest["version"] == 1
    entries = manifest["entries"]
    assert len(entries) >= 150
    files = {p.name for p in CORPUS.glob("*.log")}
    assert files == {e["file"] for e in entries}, "every excerpt is in the manifest and nothing else is"
    for e in entries:
        assert list(e) == FIELDS, e["file"]
        assert e["source"].startswith("https://github.com/" + e["project"] + "/"), e["file"]
        assert e["launcher"] in LAUNCHERS, e["file"]
        FailureKind(e["kind"])
        ActionKind(e["action"])
        assert e["exit_code"] is None or isinstance(e["exit_code"], int), e["file"]
        assert e["signal"] is None or e["signal"].startswith("SIG"), e["file"]
        assert e["justification"].strip(), e["file"]
        text = (CORPUS / e["file"]).read_bytes()
        assert 0 < len(text) <= 20_000, e["file"]


def test_every_label_carries_the_default_policys_first_action() -> None:
    from dlrover.diagnosis import ActionPolicy

    for e in _manifest()["entries"]:
        decision = ActionPolicy().decide("node-0", FailureKind(e["kind"]))
        assert decision.action.value == e["action"], e["file"]


def test_split_follows_the_documented_rule_and_holds_out_a_third() -> None:
    entries = _manifest()["entries"]
    expected = _scorer().assign_splits(entries)
    assert {e["file"]: e["split"] for e in entries} == expected
    held = Counter(e["kind"] for e in entries if e["split"] == "heldout")
    total = Counter(e["kind"] for e in entries)
    assert sum(held.values()) >= len(entries) / 3
    for kind, n in total.items():
        assert held[kind] >= math.ceil(n / 3), kind


# ---- accuracy, per part ----------------------------------------------------------------------

ISSUE_GOAL = 0.95
"""Issue 27's goal for kinds and first actions on each part."""

FLOORS = {
    # Dev: measured when the fifth round of rules was final (see the corpus README's "Fifth round
    # rules"): 280 entries, 247 kinds (88.2 %) and 262 first actions (93.6 %); the fourth round's
    # were 242 and 260. The dev misses left are excerpts whose log does not hold the cause the
    # thread found: collective timeouts the thread calls a hang; faulty GPUs or
    # InfiniBand seen as an application Xid or a connection reset; configuration errors seen only
    # as an abort, a Slurm time limit or a host that does not resolve.
    # Held out: scored once with the fifth round's rules final (156 entries: 122 kinds, 78.2 %,
    # and 138 first actions, 88.5 %; the fourth round's were 120 and 136; see the corpus README).
    # With the fifth round's 43 entries added (the corpus README's "Fifth round"), scored with the
    # same rules: dev 310 entries, 266 kinds (85.8 %) and 285 first actions (91.9 %); held out
    # 169 entries, 133 (78.7 %) and 148 (87.6 %).
    # A SIGKILL is someone else's only where the agent read its OOM records and they show no kill
    # (`NO_OOM_KILL`); with none read it is presumed an OOM kill (the corpus README's "A SIGKILL
    # with no record read"): dev 270 (87.1 %) and 289 (93.2 %); held out, scored once after,
    # 135 (79.9 %) and 150 (88.8 %).
    "dev": (270 / 310, 289 / 310),
    "heldout": (135 / 169, 150 / 169),
}


def _score(split: str) -> tuple[float, float, list[str]]:
    from dlrover.diagnosis import ActionPolicy, Evidence, RuleRegistry, classify

    registry = RuleRegistry.with_builtin_rules()
    entries = [e for e in _manifest()["entries"] if e["split"] == split]
    kinds = actions = 0
    misses = []
    for e in entries:
        evidence = Evidence.from_text((CORPUS / e["file"]).read_bytes(), returncode=e["exit_code"], node_id="node-0")
        diagnosis = classify(evidence, registry)
        action = ActionPolicy().decide("node-0", diagnosis.kind).action.value
        kinds += diagnosis.kind.value == e["kind"]
        actions += action == e["action"]
        if diagnosis.kind.value != e["kind"] or action != e["action"]:
            misses.append(f"{e['file']}: {e['kind']}/{e['action']} -> {diagnosis.kind.value}/{action}")
    return kinds / len(entries), actions / len(entries), misses


@pytest.mark.parametrize("split", ["dev", "heldout"])
def test_accuracy_per_part(split: str) -> None:
    kind_accuracy, action_accuracy, misses = _score(split)
    print(
        f"\ncorpus_real {split}: kinds {kind_accuracy:.1%}, first actions {action_accuracy:.1%} (goal {ISSUE_GOAL:.0%})"
    )
    kind_floor, action_floor = FLOORS[split]
    assert kind_accuracy >= kind_floor - 1e-9, "\n".join(misses)
    assert action_accuracy >= action_floor - 1e-9, "\n".join(misses)
