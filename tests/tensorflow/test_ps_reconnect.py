"""A chief that starts the moment a relaunched parameter server listens again trains: the workers' calls to that
server wait for their channel to reconnect instead of failing (`dlrover.master.psjob.node.WORKER_FAIL_FAST`).

The servers run as the PS job's nodes do (`node.py`); two small coordinators stand in for the chief's incarnations.
With TensorFlow's default the second coordinator failed in 4 of 4 tries here, in the gRPC reconnect backoff of the
worker's channel to the server that came back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dlrover.master.psjob import node
from dlrover.master.psjob.ports import task_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NODE = Path(node.__file__)
DOWN_S = 3.0  # how long the parameter server stays down: the worker's channel backs off meanwhile

# The coordinator: connects, then trains until killed (`--steps 0`, going on through errors) or for `--steps`
# steps; with `--go FILE` it imports TensorFlow first and connects only once FILE exists, as a warm standby does.
COORDINATOR = """
import argparse, os, sys, time
import tensorflow as tf
p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=0)
p.add_argument("--go", default="")
p.add_argument("--ready", default="")
args = p.parse_args()
while args.go and not os.path.exists(args.go):
    time.sleep(0.005)
strategy = tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    a = tf.Variable(tf.zeros([4]))
    b = tf.Variable(tf.zeros([4]))  # round-robin placement: one variable on each parameter server

@tf.function
def step():
    def replica():
        a.assign_add(tf.ones([4]))
        b.assign_add(tf.ones([4]))
        return a[0] + b[0]
    return strategy.run(replica)

done = 0
while args.steps == 0 or done < args.steps:
    try:
        coordinator.schedule(step)
        coordinator.join()
    except tf.errors.UnavailableError:
        if args.steps:
            raise
        time.sleep(0.05)  # a parameter server is down: keep the worker calling it, as a training loop would
        continue
    done += 1
    if done == 20 and args.ready:
        open(args.ready, "w").close()
print(f"trained {done} steps", flush=True)
os._exit(0)  # (the coordinator's teardown can block: see examples/tf_ps/chief_exit.py)
"""


class Cluster:
    """Two parameter servers and a worker started by `node.py`, a chief address, and their logs."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        ports = task_ports("127.0.0.1", 4)
        self.cluster = {
            "ps": [f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"],
            "worker": [f"127.0.0.1:{ports[2]}"],
            "chief": [f"127.0.0.1:{ports[3]}"],
        }
        self.script = tmp_path / "coordinator.py"
        self.script.write_text(COORDINATOR)
        self.processes: list[subprocess.Popen[bytes]] = []
        # The coordinator ends with os._exit and the servers are killed: TensorFlow's autograph files (removed
        # only at a clean exit) go in the test's own temp dir, not the machine's.
        self.tmpdir = tmp_path / "tmp"
        self.tmpdir.mkdir()

    def env(self, role: str, index: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "GRPC_FAIL_FAST"}
        env["TF_CONFIG"] = json.dumps({"cluster": self.cluster, "task": {"type": role, "index": index}})
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        env["TMPDIR"] = str(self.tmpdir)
        return env

    def start(self, name: str, args: list[str], role: str, index: int) -> subprocess.Popen[bytes]:
        with open(self.tmp / f"{name}.log", "wb") as log:
            process = subprocess.Popen(args, env=self.env(role, index), stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(process)
        return process

    def server(self, name: str, role: str, index: int) -> subprocess.Popen[bytes]:
        return self.start(name, [sys.executable, str(NODE)], role, index)

    def coordinator(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        return self.start(name, [sys.executable, str(self.script), *args], "chief", 0)

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def wait_for(self, what: str, done: Callable[[], bool], process: subprocess.Popen[bytes], name: str) -> None:
        deadline = time.monotonic() + 120
        while not done():
            tail = self.log(name)[-3000:]
            assert process.poll() is None, f"{name} exited ({process.returncode}) before {what}:\n{tail}"
            assert time.monotonic() < deadline, f"{name}: no {what} in 120 s:\n{tail}"
            time.sleep(0.005)

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


def test_a_chief_started_as_a_relaunched_parameter_server_listens_trains(cluster: Cluster) -> None:
    cluster.server("ps0", "ps", 0)
    ps1 = cluster.server("ps1", "ps", 1)
    cluster.server("worker0", "worker", 0)
    first_ready = cluster.tmp / "first-ready"
    first = cluster.coordinator("first", "--ready", str(first_ready))
    cluster.wait_for("20 steps", first_ready.exists, first, "first")
    go = cluster.tmp / "go"
    second = cluster.coordinator("second", "--steps", "100", "--go", str(go))

    ps1.send_signal(signal.SIGKILL)
    ps1.wait(timeout=30)
    time.sleep(DOWN_S)  # the worker's calls to the lost server fail and its channel backs off meanwhile
    first.send_signal(signal.SIGKILL)  # as the master stops the chief of a lost parameter server
    first.wait(timeout=30)
    relaunched = cluster.server("ps1-relaunched", "ps", 1)
    cluster.wait_for("serving", lambda: "serving at" in cluster.log("ps1-relaunched"), relaunched, "ps1-relaunched")
    go.touch()  # the second coordinator connects the moment the server listens

    assert second.wait(timeout=120) == 0, cluster.log("second")[-4000:]
    assert "trained 100 steps" in cluster.log("second")


def test_only_the_workers_wait_and_a_job_may_choose_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default is set for workers only, and never over a value the job gave."""
    seen: list[str | None] = []

    class Server:
        def __init__(self, *args: object, **kwargs: object) -> None:
            seen.append(os.environ.get("GRPC_FAIL_FAST"))

        def join(self) -> None:
            pass

    import tensorflow as tf

    monkeypatch.setattr(tf.distribute, "Server", Server)
    cluster = {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}
    monkeypatch.delenv("GRPC_FAIL_FAST", raising=False)
    node.run_server(cluster, "ps", 0)
    node.run_server(cluster, "worker", 0)
    monkeypatch.setenv("GRPC_FAIL_FAST", "use_caller")
    node.run_server(cluster, "worker", 0)
    assert seen == [None, node.WORKER_FAIL_FAST, "use_caller"]
