"""``python -m dlrover.diagnosis.probe_main``: run one rank of a paired health probe, print JSON.

The launcher (or a test) starts one such process per rank with the same store address; each
prints its `ProbeResult` as one JSON line on stdout. Exit status 0 when the probe passed, 1 when
it ran and failed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import attrs

from dlrover.diagnosis.errors import ProbeError
from dlrover.diagnosis.probe import ProbeConfig, run_paired_probe

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run the probe, print the result as JSON; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--store-host", default="127.0.0.1")
    parser.add_argument("--store-port", type=int, required=True)
    parser.add_argument("--store-master", action="store_true", help="host the TCPStore in this process")
    parser.add_argument("--node-id", default="")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default=None)
    parser.add_argument("--matmul-size", type=int, default=256)
    parser.add_argument("--collective-numel", type=int, default=262_144)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--timeout-s", type=float, default=30.0)
    args = parser.parse_args(argv)
    try:
        config = ProbeConfig(
            matmul_size=args.matmul_size,
            matmul_rounds=args.rounds,
            collective_numel=args.collective_numel,
            collective_rounds=args.rounds,
            timeout_s=args.timeout_s,
            backend=args.backend,
        )
        result = run_paired_probe(
            args.rank,
            args.world_size,
            args.store_host,
            args.store_port,
            config,
            is_store_master=args.store_master,
            node_id=args.node_id,
        )
    except (ProbeError, ValueError) as exc:
        print(json.dumps({"error": str(exc)}), file=sys.stderr)
        return 2
    print(json.dumps(attrs.asdict(result)), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
