"""A TensorFlow parameter-server job under `PsJobMaster`: real TensorFlow processes (a chief, two parameter
servers, two workers) on this host, the example recommender (`examples/tf_ps/train.py`) reading its data from the
master's shard service, and tasks killed for real while it trains."""

from __future__ import annotations

import base64
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import kubernetes
import numpy as np
import pytest
from dlrover_testsupport.kube.cluster import KubeCluster
from dlrover_testsupport.kube.fixtures import kube_cluster  # noqa: F401 (a fixture)

from dlrover.autoscale import HotPsConfig, Resources, Role
from dlrover.common import generate_token, write_token_file
from dlrover.master.eventlog import read_event_log
from dlrover.master.kube import WatchSettings, names
from dlrover.master.operator import MasterSettings, ReconcileSettings, crd_manifest
from dlrover.master.operator.controller import Operator, OperatorSettings
from dlrover.master.psjob import PsJobConfig, PsJobMaster, PsJobSpec, TaskKey
from dlrover.master.psjob.tf_checkpoint import newest_checkpoint
from dlrover.master.scheduler.local import LocalScheduler

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tf_ps" / "train.py"
FIT_EXAMPLE = EXAMPLE.with_name("fit.py")
SAMPLES, BATCH, CHECKPOINT_EVERY, PAUSE_AT = 6400, 64, 20, 30
FIT_EPOCHS, FIT_PAUSE_AT = 8, 3
STEPS = SAMPLES // BATCH
# The example's checkpoints are a few MiB: the real /dev/shm holds them beside this reserve even where a container
# gives it 64 MiB.
FLASH_RESERVE_MB = 16


def _autograph_files() -> set[Path]:
    """What TensorFlow's autograph left in this machine's temp dir: the source of every function it converted,
    which a process removes only when it exits cleanly (tasks are stopped and killed by signal)."""
    return set(Path(tempfile.gettempdir()).glob("__autograph_generated_file*"))


def _assert_no_new_autograph_files(before: set[Path]) -> None:
    left = sorted(_autograph_files() - before)
    assert not left, f"the job's tasks left {len(left)} autograph file(s) in {tempfile.gettempdir()}: {left[:3]}"


class Job:
    """One run of the example: the master in this thread, a choreographer beside it."""

    def __init__(self, tmp_path: Path, program: Path = EXAMPLE, samples: int = SAMPLES,
                 hot_ps: HotPsConfig | None = None) -> None:  # fmt: skip
        self.work = tmp_path / "job"
        self.out = tmp_path / "out"
        self.pause = tmp_path / "pause"
        if program == EXAMPLE:
            args = ["--samples", str(samples), "--batch", str(BATCH), "--checkpoint-every", str(CHECKPOINT_EVERY),
                    "--pause-at", str(PAUSE_AT)]  # fmt: skip
            self.marker = self.out / f"at-step-{PAUSE_AT}"
        else:
            args = ["--epochs", str(FIT_EPOCHS), "--pause-at", str(FIT_PAUSE_AT)]
            self.marker = self.out / f"at-epoch-{FIT_PAUSE_AT}"
        command = (sys.executable, str(program), "--out", str(self.out), "--pause-file", str(self.pause), *args)
        resources = {Role.PS: Resources(cpu=0.05, memory_mb=0)} if hot_ps is not None else {}
        spec = PsJobSpec(ps=2, workers=2, max_relaunches=2, resources=resources)
        self.config = PsJobConfig(spec=spec, command=command, work_dir=str(self.work), stop_grace_s=5.0,
                                  tick_interval_s=0.2, hot_ps=hot_ps, hot_ps_interval_s=1.0, hot_ps_warmup_s=1.0,
                                  flash_reserve_mb=FLASH_RESERVE_MB)  # fmt: skip

    def run(self, victim: TaskKey | None = None) -> PsJobMaster:
        """Run to the end; with a victim, hold at step PAUSE_AT, SIGKILL the victim there, and go on."""
        errors: list[BaseException] = []
        if victim is not None:
            self.pause.touch()
        autograph = _autograph_files()
        master = PsJobMaster(self.config)
        try:
            master.start()

            def choreograph() -> None:
                try:
                    while not self.marker.exists() and master.core.outcome is None:
                        threading.Event().wait(0.05)
                    # The standbys are warm long before a real job's first failure: wait for them here too.
                    while self.config.standby_tasks and not all(
                        list((self.work / "standby").glob(f"{role}-*.ready")) for role in ("chief", "ps")
                    ):
                        assert master.core.outcome is None, "the job ended before its standbys were ready"
                        threading.Event().wait(0.05)
                    assert victim is not None
                    node = master.core.node_of(victim)
                    scheduler = master.scheduler
                    assert isinstance(scheduler, LocalScheduler)
                    assert node is not None
                    pid = scheduler.pid(node)
                    assert pid is not None, f"{victim} has no process"
                    os.kill(pid, signal.SIGKILL)
                except BaseException as exc:
                    errors.append(exc)
                finally:
                    self.pause.unlink(missing_ok=True)

            helper = threading.Thread(target=choreograph, daemon=True) if victim is not None else None
            if helper is not None:
                helper.start()
            outcome = master.run(timeout_s=200)
            if helper is not None:
                helper.join(timeout=10)
        finally:
            master.stop()
        # The tasks' temp dir went with the job, and nothing of theirs was left in the machine's.
        assert not (self.work / "tmp").exists()
        _assert_no_new_autograph_files(autograph)
        assert not errors, errors
        assert outcome is not None, "the job did not end in time"
        assert outcome.succeeded, outcome.reason
        return master

    def events(self) -> list[dict[str, Any]]:
        return read_event_log(self.work / "events.jsonl")

    def node_log(self, node_id: int) -> str:
        log = self.work / "logs" / f"node-{node_id}.log"
        return log.read_text(errors="replace") if log.exists() else "(no log)"

    def summary(self) -> dict[str, Any]:
        summary: dict[str, Any] = json.loads((self.out / "summary.json").read_text())
        return summary

    def committed(self) -> collections.Counter[tuple[int, int]]:
        """How often each sample (shard, position) was committed, over every incarnation of the chief."""
        counts: collections.Counter[tuple[int, int]] = collections.Counter()
        for line in (self.out / "committed.jsonl").read_text().splitlines():
            for shard, position in json.loads(line)["cursors"]:
                counts[(shard, position)] += 1
        return counts


def _kinds(events: list[dict[str, Any]], task: str | None = None) -> list[str]:
    return [e["kind"] for e in events if task is None or e["data"].get("task") == task]


def _story(job: Job) -> str:
    """The job's events and the end of each failed node's log: what a failed assertion shows."""
    events = job.events()
    lines = [f"{e['kind']}: {e['message']}" for e in events]
    for node_id in sorted({e["node_id"] for e in events if e["kind"] == "task_failed" and e["node_id"] is not None}):
        lines.append(f"--- node {node_id}'s log, its end:\n{job.node_log(node_id)[-3000:]}")
    return "\n".join(lines)


def test_a_job_trains_to_the_end_and_its_loss_falls(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.run()
    summary = job.summary()
    assert summary["steps"] == STEPS
    assert summary["restored_step"] is None
    assert summary["last_loss"] < 0.85 * summary["first_loss"], summary
    assert summary["updates_applied"] == STEPS
    assert summary["embedding_shards"] == 2, "one shard of each embedding per parameter server"
    committed = job.committed()
    assert len(committed) == SAMPLES
    assert set(committed.values()) == {1}
    events = job.events()
    kinds = [k for k in _kinds(events) if k != "checkpoint_sizes"]
    assert kinds == ["flash_checkpoints", "job_started", "job_succeeded", "flash_removed"]
    # The chief saved to memory; at the end storage holds the last checkpoint and the memory directory is gone.
    memory = _memory_dir(events)
    assert summary["checkpoint_dir"] == str(memory)
    assert newest_checkpoint(job.work / "checkpoints") == job.work / "checkpoints" / f"ckpt-{STEPS}"
    assert not memory.exists()


def _memory_dir(events: list[dict[str, Any]]) -> Path:
    (chosen, *_) = [e["data"] for e in events if e["kind"] == "flash_checkpoints"]
    assert chosen["in_memory"], chosen
    return Path(chosen["memory_dir"])


def test_a_killed_worker_is_relaunched_and_every_sample_is_trained_once(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.run(victim=TaskKey(Role.WORKER, 1))
    events = job.events()
    assert _kinds(events, "worker:1") == ["task_failed", "task_relaunched"], _story(job)
    assert "chief_restarting" not in _kinds(events)
    assert "data_rewound" not in _kinds(events)
    summary = job.summary()
    assert summary["steps"] == STEPS
    assert summary["restored_step"] is None
    committed = job.committed()
    assert len(committed) == SAMPLES
    assert set(committed.values()) == {1}
    # TensorFlow's coordinator retries a step that was on the lost worker; one whose update had already reached
    # the parameter servers is applied again (at least once for updates): said, never hidden.
    assert STEPS <= summary["updates_applied"] <= STEPS + 2


def test_a_worker_lost_for_good_leaves_the_cluster_and_every_sample_is_trained_once(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.config = attrs.evolve(job.config, spec=attrs.evolve(job.config.spec, min_workers=1, max_relaunches=0),
                              stop_grace_s=60.0)  # the planned stop waits for the chief's checkpoint  # fmt: skip
    master = job.run(victim=TaskKey(Role.WORKER, 1))
    events = job.events()
    kinds = _kinds(events)
    assert kinds.index("task_left_out") < kinds.index("cluster_restarting") < kinds.index("cluster_restarted")
    assert len(master.cluster[Role.WORKER]) == 1
    summary = job.summary()
    assert summary["steps"] == STEPS
    # The chief checkpointed at the planned stop's SIGTERM: the restarted one redid nothing.
    assert [e["data"]["samples"] for e in events if e["kind"] == "data_rewound"] == [0]
    committed = job.committed()
    assert len(committed) == SAMPLES
    assert set(committed.values()) == {1}


def _assert_resumed_from_the_checkpoint(job: Job) -> None:
    events = job.events()
    rewound = [e for e in events if e["kind"] == "data_rewound"]
    lost = PAUSE_AT - CHECKPOINT_EVERY
    assert [(e["data"]["samples"], e["data"]["steps"]) for e in rewound] == [(lost * BATCH, lost)]
    summary = job.summary()
    assert summary["restored_step"] == CHECKPOINT_EVERY
    assert summary["steps"] == STEPS
    assert summary["updates_applied"] == STEPS - CHECKPOINT_EVERY
    committed = job.committed()
    # Every sample trained; those of the lost steps twice (once before the loss, once after the restore).
    assert len(committed) == SAMPLES
    assert sum(n - 1 for n in committed.values()) == lost * BATCH


def test_a_killed_parameter_server_is_relaunched_and_the_chief_restores_the_checkpoint(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.run(victim=TaskKey(Role.PS, 1))
    events = job.events()
    assert _kinds(events, "ps:1") == ["task_failed", "task_relaunched"], _story(job)
    assert _kinds(events, "chief:0") == ["chief_restarting", "task_restarted"], _story(job)
    # The relaunched server and the restarted chief ran in the standbys, TensorFlow already imported.
    promoted = [e["data"]["role"] for e in events if e["kind"] == "standby_promoted"]
    assert sorted(promoted) == ["chief", "ps"]
    _assert_resumed_from_the_checkpoint(job)
    # ... restoring the checkpoint from memory.
    assert job.summary()["checkpoint_dir"] == str(_memory_dir(events))


def test_a_killed_chief_is_relaunched_and_resumes_from_the_checkpoint(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.run(victim=TaskKey(Role.CHIEF, 0))
    assert _kinds(job.events(), "chief:0") == ["task_failed", "task_relaunched"], _story(job)
    _assert_resumed_from_the_checkpoint(job)


def test_a_master_killed_mid_job_is_replaced_and_the_chief_resumes_from_the_checkpoint_in_memory(
    tmp_path: Path,
) -> None:
    """SIGKILL the master (its tasks die with it, and it removes nothing): the next master on the same work and
    checkpoint directories adopts the memory directory, whose newest checkpoint the new chief restores."""
    job = Job(tmp_path)
    command = [sys.executable, "-m", "dlrover.master.cli", "ps-job", f"--work-dir={job.work}", "--ps=2",
               "--workers=2", "--stop-grace=5", f"--flash-reserve={FLASH_RESERVE_MB}", "--",
               *job.config.command]  # fmt: skip
    log = tmp_path / "master.log"
    job.pause.touch()
    with open(log, "w") as out:
        first = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 150
        while not job.marker.exists():
            assert first.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, f"the job did not reach step {PAUSE_AT}"
            time.sleep(0.05)
    finally:
        first.kill()
        first.wait(timeout=30)
    memory = _memory_dir(job.events())
    assert (memory / f"ckpt-{CHECKPOINT_EVERY}.index").exists(), "the killed master left its memory directory"
    job.pause.unlink()
    job.marker.unlink()
    with open(log, "a") as out:
        second = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=200, check=False)
    assert second.returncode == 0, log.read_text()[-4000:]
    chosen = [e for e in job.events() if e["kind"] == "flash_checkpoints"]
    assert "adopted from this job's previous master" in chosen[1]["message"]
    summary = job.summary()
    assert summary["restored_step"] == CHECKPOINT_EVERY
    assert summary["checkpoint_dir"] == str(memory)
    assert summary["steps"] == STEPS
    assert len(job.committed()) == SAMPLES
    assert not memory.exists()
    assert newest_checkpoint(job.work / "checkpoints") == job.work / "checkpoints" / f"ckpt-{STEPS}"


def test_model_fit_resumes_from_its_backup_after_a_lost_parameter_server(tmp_path: Path) -> None:
    job = Job(tmp_path, FIT_EXAMPLE)
    job.run(victim=TaskKey(Role.PS, 1))
    events = job.events()
    assert _kinds(events, "ps:1") == ["task_failed", "task_relaunched"], _story(job)
    assert _kinds(events, "chief:0") == ["chief_restarting", "task_restarted"], _story(job)
    summary = job.summary()
    # BackupAndRestore saved at the end of the epoch the job was held at; the new chief starts at the next one.
    assert summary["first_epoch"] == FIT_PAUSE_AT + 1
    # Its backups (BackupAndRestore, in the master's checkpoint directory) tell the master the model's size.
    sizes = [e["data"] for e in events if e["kind"] == "checkpoint_sizes"]
    assert sizes, "the master read BackupAndRestore's checkpoints"
    assert sizes[-1]["parameter_count"] > 0
    first = json.loads((job.out / "epoch-0.json").read_text())
    assert summary["last_loss"] < 0.85 * first["loss"], (first, summary)


def test_a_hot_parameter_server_adds_one_and_training_goes_on_from_the_checkpoint(tmp_path: Path) -> None:
    # Requests of 0.05 CPU make the servers hot as soon as they train: the heuristic splits the load. The job has
    # far more samples than it needs; it ends (--until-file) once the restarted chief has trained on three servers.
    hot = HotPsConfig(hot_cpu_ratio=0.5, hot_duration_s=2.0, max_node_cpu=0.05, max_ps=3)
    job = Job(tmp_path, samples=100 * SAMPLES, hot_ps=hot)
    until = tmp_path / "until"
    job.config = attrs.evolve(job.config, command=(*job.config.command, "--until-file", str(until)),
                              stop_grace_s=60.0)  # a planned stop waits for the chief's checkpoint  # fmt: skip
    errors: list[BaseException] = []

    def end_after_the_resize() -> None:
        try:
            deadline = time.monotonic() + 200
            while time.monotonic() < deadline:
                added = (job.work / "events.jsonl").exists() and "ps_added" in _kinds(job.events())
                ledger = job.out / "committed.jsonl"
                first = json.loads(ledger.read_text().splitlines()[0])["node"] if added and ledger.exists() else None
                lines = ledger.read_text().splitlines() if first is not None else []
                if any(json.loads(line)["node"] != first for line in lines):
                    until.touch()
                    return
                time.sleep(0.1)
        except BaseException as exc:
            errors.append(exc)
        finally:
            until.touch()

    helper = threading.Thread(target=end_after_the_resize, daemon=True)
    helper.start()
    master = job.run()
    helper.join(timeout=10)
    assert not errors, errors
    events = job.events()
    assert [k for k in _kinds(events) if k in ("ps_adding", "ps_added")] == ["ps_adding", "ps_added"]
    assert len(master.cluster[Role.PS]) == 3
    assert _kinds(events, "ps:2") == [], "the new server was started with the cluster, not relaunched"
    summary = job.summary()
    # The chief checkpointed at the SIGTERM of the planned stop: the restart redid nothing.
    assert summary["restored_step"] is not None
    assert summary["restored_step"] > 0
    assert [e["data"]["samples"] for e in events if e["kind"] == "data_rewound"] == [0]
    assert set(job.committed().values()) == {1}
    assert summary["embedding_shards"] == 3, "the embeddings restored re-sharded over the three servers"


def test_the_model_is_measured_and_the_next_run_given_no_size_is_sized_from_the_profile(tmp_path: Path) -> None:
    import tensorflow as tf

    from dlrover.autoscale import JobProfileStore, read_runs
    from dlrover.master.psjob.cli import main as ps_job_main

    store = tmp_path / "profiles.sqlite"
    first = Job(tmp_path / "first", samples=SAMPLES // 2)
    first.config = attrs.evolve(first.config, profile_store=str(store))
    first.run()
    sizes = [e["data"] for e in first.events() if e["kind"] == "checkpoint_sizes"]
    assert sizes, "the master read the chief's checkpoints"
    newest = sizes[-1]
    variables = tf.train.list_variables(newest["prefix"])
    model = [shape for name, shape in variables if name.startswith("model/")]
    assert newest["parameter_count"] == sum(int(np.prod(shape)) for shape in model), "the reader agrees with TF"
    assert len(newest["shard_bytes"]) == 3, "a data file per server and the chief's"
    with JobProfileStore(str(store)) as opened:
        (profile,), _ = read_runs(opened)
    assert {r.role: r.count for r in profile.roles} == {Role.CHIEF: 1, Role.PS: 2, Role.WORKER: 2}
    assert all(r.peak_memory_mb is not None and r.peak_memory_mb > 50 for r in profile.roles), profile.roles
    assert profile.parameter_count == newest["parameter_count"]

    # The same program again, given no counts or resources: sized from the first run's profile.
    work, out = tmp_path / "second", tmp_path / "second-out"
    status = ps_job_main(["--profile-store", str(store), "--work-dir", str(work), "--stop-grace", "5", "--",
                          sys.executable, str(EXAMPLE), "--out", str(out), "--samples", str(SAMPLES // 10),
                          "--batch", str(BATCH)])  # fmt: skip
    assert status == 0
    events = read_event_log(work / "events.jsonl")
    plan = next(e for e in events if e["kind"] == "initial_plan")
    assert plan["data"]["source"] == "profile"
    assert (plan["data"]["ps"], plan["data"]["workers"]) == (2, 2)
    ps_peak = next(r for r in profile.roles if r.role is Role.PS).peak_memory_mb
    assert ps_peak is not None
    assert plan["data"]["resources"]["ps"]["memory_mb"] >= 1.5 * ps_peak, "servers asked their peak and headroom"
    assert json.loads((out / "summary.json").read_text())["steps"] == SAMPLES // 10 // BATCH
    with JobProfileStore(str(store)) as opened:
        assert len(read_runs(opened)[0]) == 2, "the second run recorded its own profile"


def test_a_server_whose_port_is_taken_exits_98_and_says_so() -> None:
    from dlrover.master.psjob import ADDRESS_IN_USE_EXIT_CODE, node

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        address = f"127.0.0.1:{holder.getsockname()[1]}"
        config = json.dumps(
            {"cluster": {"ps": [address], "chief": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 0}}
        )
        done = subprocess.run([sys.executable, node.__file__], env={**os.environ, "TF_CONFIG": config},
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == ADDRESS_IN_USE_EXIT_CODE, done.stderr[-2000:]
    assert f"ps:0 cannot listen at {address}" in done.stderr


# ---------------------------------------------------------------- on Kubernetes

KUBE_NS, KUBE_JOB = "default", "rec"


class KubeJob(Job):
    """The example as an ElasticJob on the test Kubernetes cluster, run by `dlrover-master ps-job --backend
    kubernetes` (a process, as the operator's master pod runs it): every task is a pod of the test kubelet, made
    from its role's template; the parameter servers' and workers' templates give no command, so they run
    TensorFlow's server."""

    def __init__(self, cluster: KubeCluster, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.cluster = cluster
        self.tmp = tmp_path
        self.log = tmp_path / "master.log"
        self.victim_pods: list[Any] = []
        self.chief_pod: Any = None

    def node_log(self, node_id: int) -> str:
        """The log of the node's pod, from the test kubelet (which keeps a deleted pod's)."""
        tasks = {e["data"]["task"] for e in self.events() if e["node_id"] == node_id and "task" in e["data"]}
        if len(tasks) != 1:
            return f"(node {node_id} belongs to no one task: {sorted(tasks)})"
        role, index = tasks.pop().split(":")
        try:
            return self.cluster.kubelet.read_log(KUBE_NS, names.task_pod_name(KUBE_JOB, role, int(index), node_id))
        except Exception as exc:  # a diagnostic only: say why there is none
            return f"(no log: {exc!r})"

    def _submit(self) -> list[str]:
        """Create the job's Secret and ElasticJob; the master's command line."""
        api = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=self.cluster.url))
        with api:
            token = generate_token()
            secret = {"metadata": {"name": names.token_secret_name(KUBE_JOB)},
                      "data": {"token": base64.b64encode(token.encode()).decode()}}  # fmt: skip
            kubernetes.client.CoreV1Api(api).create_namespaced_secret(KUBE_NS, secret)
            kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(crd_manifest())
            server = {"spec": {"containers": [{"name": "main", "image": "rec"}]}}
            chief = {"spec": {"containers": [{"name": "main", "image": "rec", "command": list(self.config.command)}]}}
            job = {"apiVersion": names.api_version(), "kind": names.CRD_KIND, "metadata": {"name": KUBE_JOB},
                   "spec": {"replicaSpecs": {"chief": {"template": chief}, "ps": {"template": server},
                                             "worker": {"template": server}}}}  # fmt: skip
            kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
                names.CRD_GROUP, names.CRD_VERSION, KUBE_NS, names.CRD_PLURAL, job
            )
        token_file = write_token_file(self.tmp / "token", token)
        kubeconfig = self.cluster.write_kubeconfig(self.tmp / "kubeconfig")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        spec = self.config.spec
        return [sys.executable, "-m", "dlrover.master.cli", "ps-job", "--backend=kubernetes",
                f"--kube-namespace={KUBE_NS}", f"--kube-job={KUBE_JOB}", f"--kubeconfig={kubeconfig}",
                f"--kube-master-address=127.0.0.1:{port}", f"--port={port}", f"--token-file={token_file}",
                f"--ps={spec.ps}", f"--workers={spec.workers}", f"--max-relaunches={spec.max_relaunches}",
                f"--work-dir={self.work}", f"--checkpoint-dir={self.work / 'checkpoints'}", "--stop-grace=5",
                "--kube-backoff-max-s=1"]  # fmt: skip

    def run_on_kube(self, victim: TaskKey) -> None:
        """Run to the end, holding at step PAUSE_AT to SIGKILL the victim's container there."""
        self.pause.touch()
        autograph = _autograph_files()
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLROVER_") and k != "KUBECONFIG"}
        with open(self.log, "w") as log:
            proc = subprocess.Popen(self._submit(), env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 150
            while not self.marker.exists():
                assert proc.poll() is None, self.log.read_text()[-4000:]
                assert time.monotonic() < deadline, f"the job did not reach step {PAUSE_AT}"
                time.sleep(0.05)
            (first,) = self._running_pods(victim)
            (self.chief_pod,) = self._running_pods(TaskKey(Role.CHIEF, 0))
            self.cluster.kubelet.kill_process(first.metadata.name, KUBE_NS)
            self.pause.unlink()
            while not [p for p in self._running_pods(victim) if p.metadata.name != first.metadata.name]:
                assert proc.poll() is None, self.log.read_text()[-4000:]
                assert time.monotonic() < deadline + 60, f"{victim} was not relaunched"
                time.sleep(0.05)
            self.victim_pods = [first, *self._running_pods(victim)]
            code = proc.wait(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert code == 0, self.log.read_text()[-6000:]
        # A pod's temp dir is its own, as a container's /tmp is: its tasks left nothing in the machine's.
        _assert_no_new_autograph_files(autograph)

    def _running_pods(self, task: TaskKey) -> list[Any]:
        with kubernetes.client.ApiClient(kubernetes.client.Configuration(host=self.cluster.url)) as api:
            selector = f"{names.ROLE_LABEL}={task.role.value},{names.RANK_LABEL}={task.index}"
            pods = kubernetes.client.CoreV1Api(api).list_namespaced_pod(KUBE_NS, label_selector=selector).items
        return [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]


def test_on_kubernetes_a_killed_parameter_server_comes_back_at_its_dns_name_and_the_chief_restores(
    kube_cluster: KubeCluster,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    job = KubeJob(kube_cluster, tmp_path)
    job.run_on_kube(victim=TaskKey(Role.PS, 1))
    events = job.events()
    assert _kinds(events, "ps:1") == ["task_failed", "task_relaunched"], _story(job)
    assert _kinds(events, "chief:0") == ["chief_restarting", "task_restarted"], _story(job)
    _assert_resumed_from_the_checkpoint(job)
    # Every task is named by its DNS name in every TF_CONFIG; the lost server's new pod has the same name.
    env = {e.name: e.value for e in job.chief_pod.spec.containers[0].env}
    cluster = json.loads(env["TF_CONFIG"])["cluster"]
    assert [a.rsplit(":", 1)[0] for a in cluster["ps"]] == [f"{KUBE_JOB}-ps-{i}.{KUBE_JOB}-tasks.{KUBE_NS}.svc"
                                                            for i in range(2)]  # fmt: skip
    first, again = job.victim_pods
    assert first.metadata.name != again.metadata.name
    assert first.spec.hostname == again.spec.hostname == f"{KUBE_JOB}-ps-1"


def test_the_operator_runs_a_ps_elastic_job_and_a_replaced_master_starts_it_again_from_the_checkpoint(
    kube_cluster: KubeCluster,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    """The whole product path: an ElasticJob with chief, ps and worker roles; the operator starts `dlrover-master
    ps-job` in a pod, which runs the tasks' pods; the master's pod is SIGKILLed at step 30; the operator replaces it,
    the new master stops the tasks its predecessor left and starts the job again; the chief restores its newest
    checkpoint from the checkpoint volume and the job ends Succeeded."""
    job = Job(tmp_path)  # the example's command and its held step
    job.pause.touch()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = {"spec": {"containers": [{"name": "main", "image": "rec"}]}}
    chief = {"spec": {"containers": [{"name": "main", "image": "rec", "command": list(job.config.command)}]}}
    body = {
        "apiVersion": names.api_version(), "kind": names.CRD_KIND, "metadata": {"name": KUBE_JOB},
        "spec": {
            "replicaSpecs": {"chief": {"template": chief},
                             "ps": {"template": server, "minReplicas": 2, "maxReplicas": 2},
                             "worker": {"template": server, "minReplicas": 2, "maxReplicas": 2}},
            "checkpoint": {"volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}},
            "master": {"port": port},
        },
    }  # fmt: skip
    settings = OperatorSettings(
        namespace=KUBE_NS,
        reconcile=ReconcileSettings(master=MasterSettings(command=(sys.executable, "-m", "dlrover.master.cli"),
                                                          ps_extra_args=("--stop-grace", "5"), grace_period_s=5)),
        status_interval_s=0.5, resync_interval_s=2.0, retry_interval_s=0.5, master_call_timeout_s=5.0,
        watch=WatchSettings(watch_timeout_s=20, request_timeout_s=10, backoff_initial_s=0.05, backoff_max_s=1.0),
    )  # fmt: skip
    with kubernetes.client.ApiClient(kubernetes.client.Configuration(host=kube_cluster.url)) as api:
        core, custom = kubernetes.client.CoreV1Api(api), kubernetes.client.CustomObjectsApi(api)
        kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(crd_manifest())
        core.create_namespaced_persistent_volume_claim(KUBE_NS, {"metadata": {"name": "ckpt"}, "spec": {}})
        custom.create_namespaced_custom_object(names.CRD_GROUP, names.CRD_VERSION, KUBE_NS, names.CRD_PLURAL, body)

        def status() -> dict[str, Any]:
            obj = custom.get_namespaced_custom_object(names.CRD_GROUP, names.CRD_VERSION, KUBE_NS, names.CRD_PLURAL,
                                                      KUBE_JOB)  # fmt: skip
            return dict(obj.get("status") or {})

        def wait(what: str, check: Any, timeout_s: float = 150) -> None:
            deadline = time.monotonic() + timeout_s
            while not check():
                assert time.monotonic() < deadline, f"{what}: {status()}"
                time.sleep(0.1)

        master = names.master_name(KUBE_JOB)
        with Operator(api, settings):
            wait(f"step {PAUSE_AT}", job.marker.exists)
            # The operator mirrors the master's JobService (polled every 0.5 s: it may lag the job a little).
            wait("the status mirrored", lambda: status().get("phase") == "Running"
                 and status().get("nodes", {}).get("running") == 5)  # fmt: skip
            first = core.read_namespaced_pod(master, KUBE_NS).metadata.uid
            kube_cluster.kubelet.kill_process(master, KUBE_NS)
            job.pause.unlink()
            wait("the master replaced", lambda: status().get("masterRestarts") == 1)
            wait("the job succeeded", lambda: status().get("phase") == "Succeeded", timeout_s=200)
            assert core.read_namespaced_pod(master, KUBE_NS).metadata.uid != first
    summary = job.summary()
    assert summary["steps"] == STEPS
    assert summary["restored_step"] is not None, "the new master's chief restored the checkpoint"
    assert summary["restored_step"] >= CHECKPOINT_EVERY
    committed = job.committed()
    assert len(committed) == SAMPLES, "every sample was trained"
