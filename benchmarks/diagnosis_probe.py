"""Duration of the node health probe between two local gloo ranks.

    python benchmarks/diagnosis_probe.py [--quick]

Starts two `python -m dlrover.diagnosis.probe_main` processes against a TCPStore hosted here,
as the agent does for a pair of nodes, and reports the end-to-end wall time (process start,
torch import, group set-up, probe, tear-down) and the probe's own phases. The all-reduce's
effective bandwidth is compared with a single-process memory copy of the same tensor measured in
the same run: the physical ceiling for ranks that share one host.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import timedelta

import torch
from torch.distributed import TCPStore

NUMEL = 262_144


def one_run(size: int, rounds: int) -> tuple[float, list[dict[str, float]]]:
    store = TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=120))
    cmd = [sys.executable, "-m", "dlrover.diagnosis.probe_main", "--store-port", str(store.port), "--backend", "gloo"]
    cmd += ["--matmul-size", str(size), "--rounds", str(rounds), "--collective-numel", str(NUMEL)]
    start = time.perf_counter()
    procs = [subprocess.Popen([*cmd, "--rank", str(r)], stdout=subprocess.PIPE, text=True) for r in (0, 1)]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        if p.returncode != 0:
            raise SystemExit(f"probe rank failed with {p.returncode}: {out}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return time.perf_counter() - start, results


def copy_gbps(numel: int) -> float:
    src = torch.ones(numel)
    dst = torch.empty_like(src)
    for _ in range(10):
        dst.copy_(src)
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        dst.copy_(src)
    return n * numel * 4 / (time.perf_counter() - t0) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one run, small sizes")
    args = parser.parse_args()
    runs = 1 if args.quick else 5
    size, rounds = (128, 2) if args.quick else (256, 4)
    walls, phases = [], []
    for _ in range(runs):
        wall, results = one_run(size, rounds)
        walls.append(wall)
        phases.extend(results)
    med = {k: statistics.median(r[k] for r in phases) for k in ("matmul_s", "allreduce_s", "allgather_s")}
    ar_gbps = rounds * NUMEL * 4 / med["allreduce_s"] / 1e9
    print(f"two gloo ranks on 127.0.0.1, matmul {size}x{size} x{rounds}, collectives {NUMEL * 4 // 1024} KiB x{rounds}")
    print(f"{'measure':<40} {'median':>12}")
    print(f"{'end to end (spawn .. results), s':<40} {statistics.median(walls):>12.2f}")
    print(f"{'probe phases total, s':<40} {sum(med.values()):>12.4f}")
    for k, v in med.items():
        print(f"{'  ' + k:<40} {v:>12.4f}")
    print(f"{'all-reduce effective GB/s':<40} {ar_gbps:>12.3f}")
    print(f"{'peer: local memcpy GB/s (same tensor)':<40} {copy_gbps(NUMEL):>12.3f}")


if __name__ == "__main__":
    main()
