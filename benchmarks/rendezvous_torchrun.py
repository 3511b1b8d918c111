"""torchrun with torch's own c10d rendezvous beside torchrun with ours, on this machine.

    python benchmarks/rendezvous_torchrun.py            # 4 agents, 3 runs of each backend
    python benchmarks/rendezvous_torchrun.py --quick    # 2 agents, 1 run of each

N local `torchrun --nnodes=N --nproc-per-node=1` agents start at once; each worker writes the wall
time at which it started. The figure is launch -> the last worker started (agent start-up, the
rendezvous, and worker start-up), and launch -> the last agent exited. Backends alternate run by
run so that load from other processes on the machine hits both alike. c10d uses a TCPStore hosted
by one of the agents; dlrover uses a RendezvousService hosted in this process.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dlrover.common import GrpcServer, ServerConfig, generate_token
from dlrover.rendezvous import RendezvousConfig, RendezvousManager, add_rendezvous_service

WORKER = """\
import os, sys, time
from pathlib import Path
Path(sys.argv[1], "start-" + os.environ["RANK"]).write_text(repr(time.time()))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(backend: str, endpoint: str, agents: int, work: Path, env: dict[str, str]) -> tuple[float, float]:
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    script = work / "worker.py"
    script.write_text(WORKER)
    results = work / f"results-{backend}-{time.monotonic_ns()}"
    results.mkdir()
    procs = []
    t0 = time.time()
    for i in range(agents):
        conf = [f"--rdzv-conf=node_id=node-{i}"] if backend == "dlrover" else []
        cmd = [
            torchrun,
            f"--rdzv-backend={backend}",
            f"--rdzv-endpoint={endpoint}",
            "--rdzv-id=bench",
            *conf,
            f"--nnodes={agents}",
            "--nproc-per-node=1",
            "--monitor-interval=0.1",
            "--local-addr=127.0.0.1",
            "--log-dir",
            str(results / f"logs-{i}"),
            str(script),
            str(results),
        ]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        for p in procs:
            if p.wait(timeout=300) != 0:
                raise SystemExit(f"a {backend} agent failed with exit code {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    t_exit = time.time()
    starts = [float((results / f"start-{r}").read_text()) for r in range(agents)]
    return max(starts) - t0, t_exit - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 agents, one run of each backend (a smoke run)")
    parser.add_argument("--agents", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=None)
    args = parser.parse_args()
    agents = args.agents or (2 if args.quick else 4)
    repeat = args.repeat or (1 if args.quick else 3)
    token = generate_token()
    times: dict[str, list[tuple[float, float]]] = {"c10d": [], "dlrover": []}
    with tempfile.TemporaryDirectory(prefix="dlrover-bench-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "DLROVER_JOB_TOKEN": token, "OMP_NUM_THREADS": "1", "TMPDIR": tmp}
        for _ in range(repeat):
            times["c10d"].append(launch("c10d", f"127.0.0.1:{_free_port()}", agents, work, env))
            manager = RendezvousManager(RendezvousConfig(min_nodes=agents, max_nodes=agents, last_call_s=0.0))
            server = GrpcServer(ServerConfig(), token)
            add_rendezvous_service(server, manager)
            server.start()
            try:
                times["dlrover"].append(launch("dlrover", server.address, agents, work, env))
            finally:
                server.stop(0)
    print(f"torchrun launch: {agents} local agents x 1 worker, {repeat} run(s) of each backend; median (min-max)")
    print(f"{'backend':<10}{'launch -> all workers started':<34}{'launch -> all agents exited':<34}")
    for backend, runs in times.items():
        cells = []
        for column in (0, 1):
            values = [r[column] for r in runs]
            cells.append(f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})")
        print(f"{backend:<10}{cells[0]:<34}{cells[1]:<34}")


if __name__ == "__main__":
    main()
