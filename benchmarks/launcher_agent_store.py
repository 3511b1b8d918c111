"""Joining the process group after a restart: the agent's store beside worker rank 0's, on this machine.

    python benchmarks/launcher_agent_store.py           # 2 x 12 rounds (restarts) of 2 gloo workers
    python benchmarks/launcher_agent_store.py --quick   # 2 x 4 rounds

One `Agent` (in this process, with `FakeControlPlane`) runs 2 workers per round; a worker of every
round but the last exits with an error after joining, so the next round is a failure restart, as
in recovery. Each worker writes the wall time at which it had imported torch ("ready") and at which
`init_process_group("gloo")` returned ("joined"). The figure per round is the last "joined" minus
the last "ready": how long the group took to form once every worker could. With worker rank 0
hosting the store (`store_host=None`, the old scheme) a rank that is ready first connects before
anyone listens and sits in torch's connect backoff; with `TorchStoreHost` the store listens before
any worker starts. Modes alternate in blocks so that load from other processes on the machine hits
both alike; a shared machine still makes the spread wide, so compare medians of one run only.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path

from dlrover.launcher.agent import Agent, AgentConfig
from dlrover.launcher.fake_control import FakeControlPlane
from dlrover.launcher.store_host import TorchStoreHost

WORKER = """\
import json, os, sys, time
import torch, torch.distributed as dist
out, last_attempt = sys.argv[1], int(sys.argv[2])
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
ready = time.time()
dist.init_process_group("gloo")
joined = time.time()
dist.barrier()
dist.destroy_process_group()
with open(os.path.join(out, f"{attempt}-{rank}.json"), "w") as f:
    json.dump({"ready": ready, "joined": joined}, f)
if attempt < last_attempt and rank == attempt % 2:
    sys.exit(7)  # the next round is a failure restart
"""


def run_block(work: Path, rounds: int, agent_store: bool) -> list[float]:
    """Join times (s) of `rounds` consecutive rounds of one agent."""
    out = Path(tempfile.mkdtemp(dir=work))
    script = work / "worker.py"
    script.write_text(WORKER)
    config = AgentConfig(
        worker_argv=(sys.executable, str(script), str(out), str(rounds - 1)),
        nproc_per_node=2,
        max_restarts=rounds,
        run_id="bench",
        monitor_interval_s=0.02,
        shutdown_grace_s=5.0,
        log_dir=work / "logs",
        redirects={0: 3, 1: 3},
        host_checkpoint_saver=False,
    )
    store = TorchStoreHost() if agent_store else None
    result = Agent(config, FakeControlPlane(), store_host=store).run()
    if result.exit_code != 0:
        raise SystemExit(f"the benchmark job failed: {result.reason}")
    times = []
    for attempt in range(rounds):
        records = [json.loads((out / f"{attempt}-{rank}.json").read_text()) for rank in (0, 1)]
        times.append(max(r["joined"] for r in records) - max(r["ready"] for r in records))
    return times


def main() -> None:
    """Print the join time of each mode: median, p90 and max over all rounds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 rounds of each mode")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    blocks, rounds = (2, 2) if args.quick else (3, 4)
    times: dict[str, list[float]] = {"worker rank 0 (old)": [], "agent store (new)": []}
    with tempfile.TemporaryDirectory(prefix="bench-agent-store-") as tmp:
        work = Path(tmp)
        for _ in range(blocks):
            times["worker rank 0 (old)"] += run_block(work, rounds, agent_store=False)
            times["agent store (new)"] += run_block(work, rounds, agent_store=True)
    print(f"{'store hosted by':<22}{'rounds':>8}{'median s':>10}{'p90 s':>9}{'max s':>9}")
    for name, values in times.items():
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
        print(f"{name:<22}{len(values):>8}{statistics.median(values):>10.3f}{p90:>9.3f}{ordered[-1]:>9.3f}")


if __name__ == "__main__":
    main()
