"""A simulated agent for the local backend's integration tests.

It registers with the node id the master gave it, then heartbeats every `SIM_INTERVAL_S`. The
first incarnation of rank `SIM_SILENT_RANK` goes silent after registering (it stays alive but
stops heartbeating), as a hung agent would. It obeys a STOP_NODE action by exiting 0. Like a real
agent it rides out a master restart: an unreachable master is retried for up to two minutes, and
its identity (node id and credential) stays valid across the restart. With `SIM_PID_DIR` set it
writes its pid to `<dir>/<node id>` so a test can check on it.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import grpc

from dlrover.common import RpcError, load_token
from dlrover.master.client import MasterClient


def main() -> int:
    node_id = int(os.environ["DLROVER_NODE_ID"])
    rank = int(os.environ["DLROVER_NODE_RANK"])
    relaunches = int(os.environ["DLROVER_NODE_RELAUNCH_COUNT"])
    interval = float(os.environ.get("SIM_INTERVAL_S", "0.2"))
    silent = rank == int(os.environ.get("SIM_SILENT_RANK", "-1")) and relaunches == 0
    pid_dir = os.environ.get("SIM_PID_DIR")
    if pid_dir:
        with open(os.path.join(pid_dir, str(node_id)), "w") as f:
            f.write(str(os.getpid()))
    with MasterClient(os.environ["DLROVER_MASTER_ADDR"], load_token()) as client:
        client.register(f"sim-{node_id}", socket.gethostname(), node_id=node_id)
        if silent:
            time.sleep(600)  # hung: alive, silent; the master must notice and stop us
            return 1
        step = 0
        unreachable_since: float | None = None
        while True:
            step += 1
            try:
                reply = client.heartbeat(step=step, samples=step * 8)
            except RpcError as exc:
                if exc.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                unreachable_since = unreachable_since or time.monotonic()
                if time.monotonic() - unreachable_since > 120:
                    raise
                time.sleep(interval)
                continue
            unreachable_since = None
            if any(a.kind.ends_node for a in reply.actions):
                return 0
            time.sleep(interval)


if __name__ == "__main__":
    sys.exit(main())
