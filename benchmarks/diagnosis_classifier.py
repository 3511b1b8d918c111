"""Classification throughput of dlrover.diagnosis on its labelled failure corpus.

    python benchmarks/diagnosis_classifier.py [--quick]

Classifies every corpus log (read from memory, so disk is not measured) with the built-in rules
and prints logs/s, MB/s of log text and per-log latency percentiles, beside a peer measured in
the same run: DLRover's original approach of scanning the log for a user-supplied list of
substrings (what it does when it matches fault nodes), which does far less work and bounds what a
line-oriented classifier could reach in pure Python.

Then the time per failure on one full default-size log tail (256 KiB), for two tails: the
real-world corpus (``tests/corpus_real``, users' pasted failures) back to back, dense with error
lines, and ordinary training progress output ending in a failure. Each is timed from the raw bytes
(building the `Evidence` included: that is the per-failure cost) beside a peer on the same text in
the same run: one case-insensitive regular expression of the peer substrings, decoding the bytes
and finding every match in the whole text (a classifier must look at all of it, not stop at the
first hit); the ratio is classify's median over the peer's.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any

from dlrover.diagnosis import Evidence, HangReport, LossSample, ProbeResult, RuleRegistry, classify

CORPUS = Path(__file__).resolve().parent.parent / "packages" / "diagnosis" / "tests" / "corpus"
REAL_CORPUS = CORPUS.parent / "corpus_real"
TAIL_BYTES = 256 * 1024
PEER_STRINGS = [
    "CUDA out of memory",
    "NCCL error",
    "Watchdog caught collective operation timeout",
    "uncorrectable ECC error",
    "GPU is lost",
    "Xid",
    "No module named",
    "SyntaxError",
    "No space left on device",
    "loss is nan",
]


def evidence_of(entry: dict[str, Any], blob: bytes) -> Evidence:
    """The log plus the structured evidence the manifest records beside it."""
    hang = None
    if "hang" in entry:
        h = entry["hang"]
        hang = HangReport(True, tuple(h["stalled_ranks"]), tuple(h["stalled_for_s"]), h["window_s"], "stalled")
    return Evidence.from_text(
        blob,
        returncode=entry["exit_code"],
        losses=[LossSample(**x) for x in entry.get("losses", [])],
        probes=[ProbeResult(**x) for x in entry.get("probes", [])],
        hang=hang,
    )


def _tail(blob: bytes) -> bytes:
    return (blob * (TAIL_BYTES // len(blob) + 1))[-TAIL_BYTES:]


def _median_s(fn: Any, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def tail_rows(registry: RuleRegistry, rounds: int) -> None:
    """Per-failure time of classify on 256 KiB tails, beside a one-regex scan of the same text."""
    real = b"\n".join(p.read_bytes() for p in sorted(REAL_CORPUS.glob("*.log")))
    progress = b"".join(
        f"[rank0]: step {i} | loss {2.5 - i * 1e-4:.4f} | lr 3.0e-4 | grad_norm 0.91 | 412 tokens/s\n".encode()
        for i in range(4000)
    )
    failure = (CORPUS / "001_cuda_oom_forward.log").read_bytes()
    tails = {
        "real-world corpus, back to back": _tail(real),
        "progress output, then a CUDA OOM": _tail(progress)[: TAIL_BYTES - len(failure)] + failure,
    }
    peer = re.compile("|".join(re.escape(x) for x in PEER_STRINGS), re.IGNORECASE)
    print(f"\nper failure on a {TAIL_BYTES // 1024} KiB log tail (median of {rounds}):")
    print(f"{'tail':<36} {'classify ms':>12} {'peer regex ms':>14} {'ratio':>7}  kind")
    for name, blob in tails.items():
        kind = classify(Evidence.from_text(blob, returncode=1), registry).kind.value
        ours = _median_s(lambda b=blob: classify(Evidence.from_text(b, returncode=1), registry), rounds)
        theirs = _median_s(lambda b=blob: peer.findall(b.decode("utf-8", errors="replace")), rounds)
        print(f"{name:<36} {ours * 1e3:>12.1f} {theirs * 1e3:>14.2f} {ours / theirs:>6.0f}x  {kind}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few rounds only (CI smoke run)")
    args = parser.parse_args()
    rounds = 3 if args.quick else 30
    entries = json.loads((CORPUS / "manifest.json").read_text())["entries"]
    blobs = [(CORPUS / e["file"]).read_bytes() for e in entries]
    registry = RuleRegistry.with_builtin_rules()
    total_bytes = sum(len(b) for b in blobs)

    # Warm up (regex compilation, imports).
    for entry, blob in zip(entries, blobs, strict=True):
        classify(evidence_of(entry, blob), registry)

    latencies: list[float] = []
    correct = 0
    start = time.perf_counter()
    for _ in range(rounds):
        for entry, blob in zip(entries, blobs, strict=True):
            t0 = time.perf_counter()
            d = classify(evidence_of(entry, blob), registry)
            latencies.append(time.perf_counter() - t0)
            correct += d.kind.value == entry["kind"]
    ours_s = time.perf_counter() - start

    start = time.perf_counter()
    hits = 0
    for _ in range(rounds):
        for blob in blobs:
            text = blob.decode("utf-8", errors="replace")
            hits += any(s in text for s in PEER_STRINGS)
    peer_s = time.perf_counter() - start

    n = rounds * len(entries)
    latencies.sort()
    p50 = statistics.median(latencies) * 1e3
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1e3
    # One full default-size tail: 256 KiB made of the whole corpus back to back (dense with
    # error lines, so slower than a tail of ordinary progress output).
    corpus_blob = b"\n".join(blobs)
    tail_blob = (corpus_blob * (256 * 1024 // len(corpus_blob) + 1))[-256 * 1024 :]
    t0 = time.perf_counter()
    classify(Evidence.from_text(tail_blob, returncode=1), registry)
    full_tail_ms = (time.perf_counter() - t0) * 1e3
    print(f"corpus: {len(entries)} logs, {total_bytes / 1e3:.1f} kB, {len(registry)} rules, {rounds} rounds")
    print(f"{'method':<34} {'logs/s':>10} {'MB/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'accuracy':>9}")
    print(
        f"{'dlrover.diagnosis classify':<34} {n / ours_s:>10.0f} {rounds * total_bytes / ours_s / 1e6:>8.2f} "
        f"{p50:>8.3f} {p99:>8.3f} {correct / n:>9.1%}"
    )
    print(
        f"{'peer: substring list scan':<34} {n / peer_s:>10.0f} {rounds * total_bytes / peer_s / 1e6:>8.2f} "
        f"{'-':>8} {'-':>8} {'n/a':>9}"
    )
    print(f"one full 256 KiB tail: {full_tail_ms:.1f} ms")
    tail_rows(registry, 3 if args.quick else 15)


if __name__ == "__main__":
    main()
