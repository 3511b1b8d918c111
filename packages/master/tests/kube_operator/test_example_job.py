"""deploy/kubernetes/example-elasticjob.yaml on the test kubelet: the operator starts the master,
the master creates two worker pods, the GPT example trains to the end, the status says Succeeded,
and deleting the job leaves no object and no process. Part-way, one worker's training process is
SIGKILLed: its agent restarts it in place (no pod replaced) and training resumes from memory.

The example runs as written except what only an image provides: `dlrover-run` is this
interpreter's `-m dlrover.launcher.cli`, the working directory is this checkout instead of
/opt/dlrover, and it trains 20 steps instead of 240 (two CPU cores here),
with the workers' logs under the kubelet's directory."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from dlrover_testsupport.kube import KubeCluster
from ej_builders import wait_for
from kubernetes import client

from dlrover.master.kube.watch import WatchSettings
from dlrover.master.operator import MasterSettings, ReconcileSettings, crd_manifest
from dlrover.master.operator.controller import Operator, OperatorSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[4]
GROUP, VERSION, PLURAL, NS = "elastic.dlrover.io", "v1alpha1", "elasticjobs", "default"
STEPS = 20


def _example_as_run_here(log_dir: Path) -> dict[str, Any]:
    job = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "example-elasticjob.yaml").read_text())
    main = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    assert main["command"][0] == "dlrover-run"
    assert main["workingDir"] == "/opt/dlrover"
    # --log-dir: in an image the pod's ./dlrover-logs dies with it; here the working directory is
    # this checkout, which must not keep the workers' logs.
    command = [sys.executable, "-m", "dlrover.launcher.cli", f"--log-dir={log_dir}", *main["command"][1:]]
    main["command"] = [f"--steps={STEPS}" if arg.startswith("--steps=") else arg for arg in command]
    main["command"].append("--persist-every=10")
    main["workingDir"] = str(ROOT)
    with socket.socket() as s:  # the example's fixed port may be taken on a shared machine
        s.bind(("127.0.0.1", 0))
        job["spec"]["master"]["port"] = s.getsockname()[1]
    return dict(job)


def test_the_example_job_trains_gpt_to_the_end(kube_cluster: KubeCluster) -> None:
    with client.ApiClient(client.Configuration(host=kube_cluster.url)) as api:
        client.ApiextensionsV1Api(api).create_custom_resource_definition(crd_manifest())
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        for claim in ("gpt-checkpoints", "gpt-master-state"):
            core.create_namespaced_persistent_volume_claim(NS, {"metadata": {"name": claim}, "spec": {}})
        example = _example_as_run_here(kube_cluster.kubelet.root / "worker-logs")
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, example)
        kubelet = kube_cluster.kubelet
        run_dir = kubelet.root / "pvc" / NS / "gpt-checkpoints" / "gpt-example"
        progress = run_dir / "progress.jsonl"

        def records() -> list[dict[str, Any]]:
            lines = progress.read_text().splitlines()
            out = [json.loads(line) for line in lines[:-1] if line.strip()]
            with contextlib.suppress(ValueError, IndexError):  # the last line may be half written
                out.append(json.loads(lines[-1]))
            return out

        def status() -> dict[str, Any]:
            job = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "gpt-example")
            return dict(job.get("status") or {})

        def logs() -> str:
            out = [json.dumps(status(), indent=1)]
            names = {p.metadata.name for p in core.list_namespaced_pod(NS).items} | {"gpt-example-worker-0"}
            for name in sorted(names):
                try:
                    text = kubelet.read_log(NS, name)
                except KeyError:
                    continue
                out.extend(f"{name}: {line}" for line in text.splitlines()[-40:])
            return "\n".join(out)

        settings = OperatorSettings(
            namespace=NS,
            reconcile=ReconcileSettings(
                master=MasterSettings(command=(sys.executable, "-m", "dlrover.master.cli"), grace_period_s=10)
            ),
            status_interval_s=1.0,
            resync_interval_s=2.0,
            watch=WatchSettings(watch_timeout_s=30, backoff_initial_s=0.05, backoff_max_s=1.0),
        )
        with Operator(api, settings):
            wait_for(
                "two worker pods", lambda: status().get("nodes", {}).get("running") == 2, 240, explain=logs, poll_s=0.5
            )
            workers = core.list_namespaced_pod(NS, label_selector="elastic.dlrover.io/component=worker").items
            assert {p.spec.node_name for p in workers} != {None}
            pods_before = {p.metadata.name: p.metadata.uid for p in workers}

            def steps_done() -> int:
                if not progress.exists():
                    return 0
                return max((r.get("step", 0) for r in records() if r["event"] == "step"), default=0)

            wait_for("a few steps", lambda: steps_done() >= 3, 300, explain=logs, poll_s=0.5)
            # One worker's training process dies (rank 1: rank 0 writes the progress file).
            os.kill(int((run_dir / "rank1.pid").read_text()), signal.SIGKILL)
            wait_for(
                "Succeeded", lambda: status().get("phase") in ("Succeeded", "Failed"), 400, explain=logs, poll_s=0.5
            )
            assert status()["phase"] == "Succeeded", logs()
            workers = core.list_namespaced_pod(NS, label_selector="elastic.dlrover.io/component=worker").items
            assert {p.metadata.name: p.metadata.uid for p in workers} == pods_before, "a worker pod was replaced"
        done = records()
        assert done[-1]["event"] == "finished", done[-1]
        assert max(r.get("step", 0) for r in done) == STEPS
        resumed = [r for r in done if r["event"] == "resumed"]
        assert resumed, "the training was not restarted after its process was killed"
        assert all(r["source"] == "memory" and r["step"] >= 1 for r in resumed), resumed

        custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "gpt-example")
        wait_for("no pod left", lambda: not core.list_namespaced_pod(NS).items, 120, explain=logs, poll_s=0.5)
        for kind in ("service", "secret", "service_account"):
            listed = getattr(core, f"list_namespaced_{kind}")(NS, label_selector="elastic.dlrover.io/job=gpt-example")
            assert not listed.items, kind
        assert kubelet.pid("gpt-example-master", NS) is None
