"""The operator's contract with an API server, run against the test API server and, when
`DLROVER_TEST_KUBECONFIG` names a kubeconfig, against that real cluster too (in
`DLROVER_TEST_KUBE_NAMESPACE`, default `default`): the CRD installs, a job gets its objects (all
owned by it), a spec the schema cannot refuse gets a `Failed` condition naming the field and no
object, and deleting the job removes what it owned (the cluster's garbage collector on a real one).
The master pods need not run (the image may not exist there): nothing here waits for them."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from dlrover_testsupport.kube import ApiServer
from ej_builders import elastic_job, wait_for
from kubernetes import client

from dlrover.master.kube import load_api_client
from dlrover.master.kube.watch import WatchSettings
from dlrover.master.operator import MasterSettings, ReconcileSettings, crd_manifest
from dlrover.master.operator.controller import Operator, OperatorSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REAL_CLUSTER_ENV_VAR = "DLROVER_TEST_KUBECONFIG"
GROUP, VERSION, PLURAL = "elastic.dlrover.io", "v1alpha1", "elasticjobs"
OWNED = ("pod", "service", "secret", "service_account", "role", "role_binding")


@pytest.fixture(params=["test-api-server", "real-cluster"])
def api(request: pytest.FixtureRequest) -> Iterator[tuple[Any, str]]:
    """An API client and the namespace to work in."""
    if request.param == "real-cluster":
        kubeconfig = os.environ.get(REAL_CLUSTER_ENV_VAR)
        if not kubeconfig:
            pytest.skip(f"no real cluster: set {REAL_CLUSTER_ENV_VAR} to a kubeconfig to run the contract against one")
        with contextlib.closing(load_api_client(kubeconfig)) as real:
            yield real, os.environ.get("DLROVER_TEST_KUBE_NAMESPACE", "default")
        return
    with ApiServer() as server, client.ApiClient(client.Configuration(host=server.url)) as local:
        yield local, "default"


@pytest.fixture
def operator(api: tuple[Any, str]) -> Iterator[tuple[Any, str]]:
    api_client, namespace = api
    extensions = client.ApiextensionsV1Api(api_client)
    try:
        extensions.create_custom_resource_definition(crd_manifest())
    except client.exceptions.ApiException as exc:
        if exc.status != 409:  # a real cluster may have it installed already
            raise
    wait_for("the CRD established", lambda: _established(extensions))
    settings = OperatorSettings(
        namespace=namespace,
        reconcile=ReconcileSettings(master=MasterSettings(image="dlrover:contract")),
        status_interval_s=0.5,
        resync_interval_s=1.0,
        retry_interval_s=0.5,
        watch=WatchSettings(watch_timeout_s=20, request_timeout_s=20, backoff_initial_s=0.1, backoff_max_s=2.0),
    )
    with Operator(api_client, settings):
        yield api


def _established(extensions: Any) -> bool:
    crd = extensions.read_custom_resource_definition(crd_manifest()["metadata"]["name"])
    return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))


def _owned(api_client: Any, namespace: str, name: str) -> dict[str, Any]:
    core, rbac = client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client)
    found: dict[str, Any] = {}
    for kind in OWNED:
        target = f"{name}-token" if kind == "secret" else f"{name}-master"
        reader = getattr(rbac if kind.startswith("role") else core, f"read_namespaced_{kind}")
        try:
            found[kind] = reader(target, namespace)
        except client.exceptions.ApiException as exc:
            if exc.status != 404:
                raise
            found[kind] = None
    return found


def _job_name(stem: str) -> str:
    return f"{stem}-{os.getpid()}-{time.monotonic_ns() % 10**6}"


def _create(api_client: Any, namespace: str, job: dict[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in job.items() if k != "status"}
    body["metadata"] = {"name": job["metadata"]["name"]}
    custom = client.CustomObjectsApi(api_client)
    return dict(custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body))


def _condition(api_client: Any, namespace: str, name: str, kind: str) -> dict[str, Any] | None:
    job = client.CustomObjectsApi(api_client).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition["type"] == kind:
            return dict(condition)
    return None


def test_a_job_gets_its_objects_owned_by_it_and_loses_them_with_it(operator: tuple[Any, str]) -> None:
    api_client, namespace = operator
    name = _job_name("contract")
    job = _create(api_client, namespace, elastic_job(name, namespace))
    try:
        objs = wait_for("every object", lambda: (o := _owned(api_client, namespace, name)) and all(o.values()) and o)
        for kind, obj in objs.items():
            refs = [(r.kind, r.name, r.uid, r.controller) for r in obj.metadata.owner_references]
            assert refs == [("ElasticJob", name, job["metadata"]["uid"], True)], kind
        token = objs["secret"]
        assert set(token.data or {}) == {"token"}
        pod = objs["pod"].spec.containers[0]
        secret_env = [e for e in pod.env if e.value_from is not None and e.value_from.secret_key_ref is not None]
        assert [e.name for e in secret_env] == ["DLROVER_JOB_TOKEN"]
        assert all(e.value is None for e in secret_env)
    finally:
        client.CustomObjectsApi(api_client).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    wait_for("nothing left", lambda: not any(_owned(api_client, namespace, name).values()))


def test_a_spec_the_schema_cannot_refuse_fails_naming_the_field(operator: tuple[Any, str]) -> None:
    api_client, namespace = operator
    name = _job_name("contract-bad")
    job = elastic_job(name, namespace)
    job["spec"]["replicaSpecs"]["worker"].update(minReplicas=3, maxReplicas=2)
    _create(api_client, namespace, job)
    try:
        failed = wait_for("Failed", lambda: _condition(api_client, namespace, name, "Failed"))
        assert failed["status"] == "True"
        assert "minReplicas" in failed["message"]
        assert not any(_owned(api_client, namespace, name).values())
    finally:
        client.CustomObjectsApi(api_client).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
