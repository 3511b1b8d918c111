"""Contract: kubectl works against the test API server (skipped where kubectl is not installed)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from dlrover_testsupport.kube import ApiServer
from dlrover_testsupport.kube.samples import GROUP, crd

pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]
KUBECTL = shutil.which("kubectl")


@pytest.fixture
def kubectl(kube_api: ApiServer, tmp_path: Path) -> Any:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed")
    env = {"KUBECONFIG": str(kube_api.write_kubeconfig(tmp_path / "kubeconfig")), "HOME": str(tmp_path)}
    env["PATH"] = str(Path(KUBECTL).parent)

    def run(*args: str, stdin: Any = None) -> str:
        done = subprocess.run(
            [KUBECTL, *args],
            env=env,
            input=None if stdin is None else json.dumps(stdin),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    return run


def test_kubectl_applies_gets_and_deletes(kube_api: ApiServer, kubectl: Any) -> None:
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c1", "labels": {"app": "x"}},
        "data": {"a": "1"},
    }
    assert "created" in kubectl("apply", "-f", "-", stdin=cm)
    cm["data"] = {"b": "2"}
    assert "configured" in kubectl("apply", "-f", "-", stdin=cm)
    got = json.loads(kubectl("get", "configmap", "c1", "-o", "json"))
    assert got["data"] == {"b": "2"}, "the second apply removed what it no longer names"
    assert "c1" in kubectl("get", "cm", "-l", "app=x")
    assert "deleted" in kubectl("delete", "configmap", "c1")
    assert kubectl("get", "cm", "-o", "name") == ""
    used = kube_api.verbs_used()
    assert {("", "configmaps", v) for v in ("get", "create", "patch", "list", "delete")} <= used


def test_kubectl_reads_custom_resources(kubectl: Any) -> None:
    kubectl("apply", "-f", "-", stdin=crd())
    widget = {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": {"size": 2}}
    kubectl("apply", "-f", "-", stdin=widget)
    assert "w1" in kubectl("get", "widgets")
    assert json.loads(kubectl("get", f"widgets.{GROUP}", "w1", "-o", "json"))["spec"] == {"size": 2}
    kubectl("delete", "widget", "w1")
    assert kubectl("get", "widgets", "-o", "name") == ""
