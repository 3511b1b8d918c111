"""deploy/kubernetes: `kubectl apply -k` installs the CRD, RBAC and the operator Deployment; the
example job applies and the operator acts on it; the RBAC lets the operator create the masters'
Roles (Kubernetes allows a Role only with verbs its creator holds)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from dlrover_testsupport.kube import ApiServer
from kubernetes import client

from dlrover.master.kube.watch import WatchSettings
from dlrover.master.operator import MASTER_ROLE_RULES
from dlrover.master.operator.cli import _parser, build_settings
from dlrover.master.operator.controller import Operator, OperatorSettings

DEPLOY = Path(__file__).resolve().parents[4] / "deploy" / "kubernetes"
KUBECTL = shutil.which("kubectl")


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def _cluster_role() -> dict[str, Any]:
    return next(d for d in _docs("rbac.yaml") if d["kind"] == "ClusterRole")


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def test_the_operator_holds_every_verb_it_grants_the_masters() -> None:
    masters = _grants([rule.as_policy_rule() for rule in MASTER_ROLE_RULES])
    operator = _grants(_cluster_role()["rules"])
    assert masters <= operator, masters - operator
    assert not any(v in ("*", "escalate", "bind") for _, _, v in operator)
    assert not any(r == "*" for _, r, _ in operator)


def test_the_kustomization_lists_every_manifest_but_the_example() -> None:
    listed = set(yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"])
    present = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml", "example-elasticjob.yaml"}
    assert listed == present


def test_the_deployments_flags_are_the_operators() -> None:
    deployment = _docs("operator.yaml")[0]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["dlrover-operator"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "dlrover-operator"
    settings = build_settings(_parser().parse_args(container["args"]))
    assert settings.reconcile.master.fs_group == 1000


@pytest.fixture
def kubectl(kube_api: ApiServer, tmp_path: Path) -> Any:
    if KUBECTL is None:
        pytest.skip("kubectl is not on PATH: the manifests cannot be applied with it")
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    env = {"KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path), "PATH": os.environ.get("PATH", "")}

    def run(*args: str) -> str:
        done = subprocess.run([KUBECTL, *args], env=env, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    return run


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_kubectl_apply_k_installs_and_the_example_job_runs(kube_api: ApiServer, kubectl: Any) -> None:
    out = kubectl("apply", "-k", str(DEPLOY))
    for what in (
        "customresourcedefinition.apiextensions.k8s.io/elasticjobs.elastic.dlrover.io",
        "clusterrole.rbac.authorization.k8s.io/dlrover-operator",
        "clusterrolebinding.rbac.authorization.k8s.io/dlrover-operator",
        "serviceaccount/dlrover-operator",
        "deployment.apps/dlrover-operator",
    ):
        assert what in out
    with client.ApiClient(client.Configuration(host=kube_api.url)) as api:
        deployment = client.AppsV1Api(api).read_namespaced_deployment("dlrover-operator", "dlrover-system")
        assert deployment.spec.template.spec.containers[0].image == "dlrover:0.1.0"
        assert "elasticjob.elastic.dlrover.io/gpt-example created" in kubectl(
            "apply", "-f", str(DEPLOY / "example-elasticjob.yaml")
        )
        assert "gpt-example" in kubectl("get", "ej")
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        settings = OperatorSettings(
            namespace="default",
            status_interval_s=0.2,
            resync_interval_s=0.3,
            watch=WatchSettings(watch_timeout_s=10, backoff_initial_s=0.05, backoff_max_s=0.5),
        )
        with Operator(api, settings):

            def condition(kind: str) -> dict[str, Any] | None:
                job = custom.get_namespaced_custom_object(
                    "elastic.dlrover.io", "v1alpha1", "default", "elasticjobs", "gpt-example"
                )
                return next((c for c in (job.get("status") or {}).get("conditions", []) if c["type"] == kind), None)

            _wait(lambda: condition("Failed"))
            assert "PersistentVolumeClaim 'gpt-checkpoints' not found" in condition("Failed")["message"]  # type: ignore[index]
            for claim in ("gpt-checkpoints", "gpt-master-state"):
                core.create_namespaced_persistent_volume_claim("default", {"metadata": {"name": claim}, "spec": {}})
            _wait(lambda: core.list_namespaced_pod("default").items)
            pod = core.read_namespaced_pod("gpt-example-master", "default")
            command = pod.spec.containers[0].command
            assert command[:3] == ["dlrover-master", "--job-name", "gpt-example"]
            assert command[command.index("--nnodes") + 1] == "2:2"
        assert "MasterReady" in kubectl("get", "ej", "gpt-example", "-o", "jsonpath={.status.conditions[*].type}")


def _wait(check: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
