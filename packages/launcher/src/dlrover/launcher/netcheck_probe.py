"""``python -m dlrover.launcher.netcheck_probe``: one node's side of a network-check probe.

The agent starts one such process per probe it will run (so a collective that hangs can be
killed) as soon as it knows how many it needs; the process imports torch while the agent waits
for the pair's store address, then reads one JSON line from stdin saying where to meet its peer::

    {"rank": 0, "world_size": 2, "store_host": "10.0.0.1", "store_port": 29531, "store_master": true}

It forms a process group through that TCPStore (hosting it when ``store_master``), runs
`dlrover.diagnosis.run_paired_probe` (matrix products, all-reduce and all-gather: gloo on CPU,
nccl with CUDA) and prints one JSON line: ``{"ok": ..., "elapsed_s": ..., "error": ...}``.
Exit status 0 when the probe passed, 1 when it ran and failed, 2 on bad arguments, 0 without
output when stdin closes before a request (the agent did not need it after all).

``--parent-pid`` arms Linux's parent-death signal first thing, as `dlrover.common.orphan_guard` does for
workers, so a probe never outlives a killed agent.

Test hook: ``DLROVER_NETWORK_CHECK_FAULT`` makes this process misbehave for real, so tests can
prove that the check finds a bad node without patching anything:

- ``exit``: exit with status 1 at once, printing nothing (a probe that crashes);
- ``hang``: sleep until killed (a collective that never returns; the agent's timeout kills it);
- ``slow``: multiply matrices 8 times larger (512 times the arithmetic: a slow node).

Any other non-empty value is refused (exit status 2), so a typo does not pass for a healthy node.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from dlrover.common.orphan_guard import ORPHANED_EXIT_CODE, arm_parent_death_signal
from dlrover.launcher.netcheck_plan import NETWORK_CHECK_FAULT_ENV_VAR as FAULT_ENV_VAR

__all__ = ["main"]

_FAULTS = ("exit", "hang", "slow")
_SLOW_SCALE = 8


def _inject(fault: str) -> str | None:
    """Apply the test hook; returns an error for an unknown value."""
    if fault == "exit":
        print(f"{FAULT_ENV_VAR}=exit: the probe crashes", file=sys.stderr, flush=True)
        sys.exit(1)
    if fault == "hang":
        print(f"{FAULT_ENV_VAR}=hang: the probe never returns", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    if fault not in ("", "slow"):
        return f"{FAULT_ENV_VAR} must be one of {', '.join(_FAULTS)}, got {fault!r}"
    return None


def _request(line: str) -> dict[str, Any]:
    data = json.loads(line)
    types = {"rank": int, "world_size": int, "store_host": str, "store_port": int, "store_master": bool}
    if not isinstance(data, dict) or set(data) != set(types):
        raise ValueError(f"a probe request has the fields {sorted(types)}, got {line.strip()[:200]!r}")
    for name, kind in types.items():
        if not isinstance(data[name], kind) or (kind is int and isinstance(data[name], bool)):
            raise ValueError(f"probe request field {name} must be {kind.__name__}, got {data[name]!r}")
    return data


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, wait for the request, run the probe, print its side; returns the exit status."""
    parser = argparse.ArgumentParser(description="one side of a dlrover-run network-check probe")
    parser.add_argument("--timeout-s", type=float, required=True, help="process-group timeout")
    parser.add_argument("--matmul-size", type=int, default=256)
    parser.add_argument("--collective-numel", type=int, default=262_144)
    parser.add_argument("--parent-pid", type=int, default=None, help="die with this process")
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        arm_parent_death_signal()
        if os.getppid() != args.parent_pid:
            return ORPHANED_EXIT_CODE
    fault = os.environ.get(FAULT_ENV_VAR, "")
    bad = _inject(fault)
    if bad is not None:
        print(bad, file=sys.stderr)
        return 2
    # Imported after the hook (an injected crash or hang costs no torch import) and before the
    # request arrives (the import overlaps with the agent's wait for the pair's store address).
    import torch.distributed  # noqa: F401

    from dlrover.common import ConfigError
    from dlrover.diagnosis import ProbeConfig, ProbeError, run_paired_probe

    line = sys.stdin.readline()
    if not line.strip():
        return 0
    try:
        request = _request(line)
        config = ProbeConfig(
            matmul_size=args.matmul_size * (_SLOW_SCALE if fault == "slow" else 1),
            collective_numel=args.collective_numel,
            timeout_s=args.timeout_s,
        )
        result = run_paired_probe(
            request["rank"],
            request["world_size"],
            request["store_host"],
            request["store_port"],
            config,
            is_store_master=request["store_master"],
        )
    except (ProbeError, ConfigError, ValueError) as exc:
        print(f"bad probe request: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"ok": result.ok, "elapsed_s": result.total_s, "error": result.error}), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
