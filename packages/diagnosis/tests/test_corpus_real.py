"""The real-world corpus in corpus_real/ is well formed and split by its documented rule.

These tests read the manifest only; they never classify the excerpts, so they reveal nothing about
the held-out part's scores (tools/corpus_accuracy.py scores the dev part).
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

from dlrover.diagnosis import ActionKind, FailureKind

CORPUS = Path(__file__).parent / "corpus_real"
SCORER = Path(__file__).resolve().parents[3] / "tools" / "corpus_accuracy.py"
PROPOSED_KINDS = {"native_crash", "disk_full", "config_error"}
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
        assert e["kind"] in {k.value for k in FailureKind} | PROPOSED_KINDS, e["file"]
        ActionKind(e["action"])
        assert e["exit_code"] is None or isinstance(e["exit_code"], int), e["file"]
        assert e["signal"] is None or e["signal"].startswith("SIG"), e["file"]
        assert e["justification"].strip(), e["file"]
        text = (CORPUS / e["file"]).read_bytes()
        assert 0 < len(text) <= 20_000, e["file"]


def test_existing_kinds_carry_the_default_policys_first_action() -> None:
    from dlrover.diagnosis import ActionPolicy

    for e in _manifest()["entries"]:
        if e["kind"] in PROPOSED_KINDS:
            continue
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
