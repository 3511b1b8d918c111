"""Measure the diagnosis classifier on the real-world corpus (packages/diagnosis/tests/corpus_real).

The corpus is split once, before any rule is written for it, into a ``dev`` part that rule writers
may look at and a ``heldout`` part that nobody looks at while writing rules. This script scores the
current builtin rules on one part: for every entry it builds the evidence the way
``packages/diagnosis/tests/test_corpus.py`` does (the excerpt as log text, the exit status when the
excerpt shows one), classifies it, and derives the first action from a fresh default
``ActionPolicy`` for the diagnosed kind. An entry's kind is right when the diagnosed kind equals
the label; its first action is right when that action equals the labelled first action. A label
naming a kind the installed classifier lacks is marked "(proposed kind)" and can only be right in
its first action.

Usage (from the repository root, with the project's virtualenv)::

    .venv/bin/python tools/corpus_accuracy.py                  # the dev part (default)
    .venv/bin/python tools/corpus_accuracy.py --verbose        # ... and every miss
    .venv/bin/python tools/corpus_accuracy.py --check-split    # the manifest follows the split rule
    .venv/bin/python tools/corpus_accuracy.py --split heldout  # only to report a finished change

The held-out numbers must stay unseen while rules are being written: run ``--split heldout`` only
to report the result of a change whose rules are final, and never tune rules to it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = REPO / "packages" / "diagnosis" / "tests" / "corpus_real"
SPLITS = ("dev", "heldout")

HELDOUT_WARNING = (
    "WARNING: scoring the HELD-OUT split. These numbers must not guide rule writing: look at them "
    "only to report a change whose rules are final, and do not read the held-out excerpts."
)


def source_hash(source: str) -> int:
    """The split key of an entry: the SHA-256 of its source URL as an integer."""
    return int(hashlib.sha256(source.encode("utf-8")).hexdigest(), 16)


def assign_splits(entries: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The split rule, from the source URLs and labels alone; returns file name -> split.

    1. An entry is held out when the SHA-256 of its source URL, read as an integer, is 0 mod 3.
    2. Then, per labelled kind, while fewer than ceil(n / 3) of the kind's n entries are held out,
       the dev entry of that kind with the smallest hash is moved to the held-out part.

    Every source URL occurs once in the corpus, so an entry's split is its source's split.
    """
    sources = Counter(str(e["source"]) for e in entries)
    duplicated = [s for s, n in sources.items() if n > 1]
    if duplicated:
        raise ValueError(f"the split rule needs one entry per source URL; repeated: {duplicated}")
    split = {str(e["file"]): ("heldout" if source_hash(str(e["source"])) % 3 == 0 else "dev") for e in entries}
    by_kind: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for e in entries:
        by_kind[str(e["kind"])].append(e)
    for members in by_kind.values():
        need = math.ceil(len(members) / 3)
        dev = [e for e in members if split[str(e["file"])] == "dev"]
        dev.sort(key=lambda e: source_hash(str(e["source"])))
        held = len(members) - len(dev)
        for e in dev[: max(need - held, 0)]:
            split[str(e["file"])] = "heldout"
    return split


def load_manifest(corpus: Path) -> list[dict[str, Any]]:
    """The manifest's entries; each must name an existing excerpt file."""
    entries = list(json.loads((corpus / "manifest.json").read_text(encoding="utf-8"))["entries"])
    for e in entries:
        if not (corpus / e["file"]).is_file():
            raise FileNotFoundError(f"manifest names {e['file']}, which is not in {corpus}")
        if e["split"] not in SPLITS:
            raise ValueError(f"{e['file']}: split must be one of {SPLITS}, got {e['split']!r}")
    return entries


def check_split(entries: Sequence[Mapping[str, Any]]) -> int:
    """Print the split per kind and whether the manifest follows the rule; 0 when it does."""
    expected = assign_splits(entries)
    wrong = [str(e["file"]) for e in entries if e["split"] != expected[str(e["file"])]]
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for e in entries:
        counts[str(e["kind"])][str(e["split"])] += 1
    print(f"{'kind':<16}{'dev':>6}{'heldout':>9}")
    for kind in sorted(counts):
        print(f"{kind:<16}{counts[kind]['dev']:>6}{counts[kind]['heldout']:>9}")
    total = Counter(str(e["split"]) for e in entries)
    print(f"{'all':<16}{total['dev']:>6}{total['heldout']:>9}")
    if wrong:
        print(f"{len(wrong)} entries do not follow the split rule: {wrong}")
        return 1
    print("the manifest follows the split rule")
    return 0


def score(corpus: Path, entries: Sequence[Mapping[str, Any]], *, verbose: bool) -> None:
    """Classify every entry and print per-kind and overall accuracy of kinds and first actions."""
    from dlrover.diagnosis import ActionPolicy, Evidence, FailureKind, RuleRegistry, classify

    known = {k.value for k in FailureKind}
    registry = RuleRegistry.with_builtin_rules()
    rows: dict[str, list[tuple[bool, bool, str]]] = defaultdict(list)
    misses: list[str] = []
    for e in entries:
        evidence = Evidence.from_text((corpus / e["file"]).read_bytes(), returncode=e["exit_code"], node_id="node-0")
        diagnosis = classify(evidence, registry)
        action = ActionPolicy().decide("node-0", diagnosis.kind).action.value
        kind_ok = diagnosis.kind.value == e["kind"]
        action_ok = action == e["action"]
        rows[str(e["kind"])].append((kind_ok, action_ok, diagnosis.kind.value))
        if verbose and not (kind_ok and action_ok):
            misses.append(
                f"{e['file']}: label {e['kind']}/{e['action']}, got {diagnosis.kind.value}/{action}"
                f" ({diagnosis.rule or 'no rule'}: {diagnosis.reason})"
            )
    print(f"{'kind':<16}{'n':>4}{'kind ok':>9}{'kind %':>8}{'action ok':>11}{'action %':>10}  diagnosed as")
    for kind in sorted(rows):
        r = rows[kind]
        k_ok, a_ok = sum(x[0] for x in r), sum(x[1] for x in r)
        got = ", ".join(f"{name} {n}" for name, n in Counter(x[2] for x in r).most_common())
        mark = "" if kind in known else " (proposed kind)"
        print(
            f"{kind:<16}{len(r):>4}{k_ok:>9}{100 * k_ok / len(r):>7.0f}%{a_ok:>11}{100 * a_ok / len(r):>9.0f}%"
            f"  {got}{mark}"
        )
    everything = [x for r in rows.values() for x in r]
    k_all, a_all = sum(x[0] for x in everything), sum(x[1] for x in everything)
    n = len(everything)
    print(f"{'overall':<16}{n:>4}{k_all:>9}{100 * k_all / n:>7.1f}%{a_all:>11}{100 * a_all / n:>9.1f}%")
    for line in misses:
        print(line)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--split", choices=SPLITS, default="dev", help="the part to score (default: dev)")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="the corpus folder")
    parser.add_argument("--verbose", action="store_true", help="also list every entry the classifier gets wrong")
    parser.add_argument("--check-split", action="store_true", help="only check the manifest against the split rule")
    args = parser.parse_args(argv)
    entries = load_manifest(args.corpus)
    if args.check_split:
        return check_split(entries)
    if args.split == "heldout":
        print(HELDOUT_WARNING, file=sys.stderr)
    chosen = [e for e in entries if e["split"] == args.split]
    print(f"split {args.split}: {len(chosen)} of {len(entries)} entries")
    score(args.corpus, chosen, verbose=args.verbose)
    return 0


if __name__ == "__main__":
    sys.exit(main())
