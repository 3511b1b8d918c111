"""Contract: the official `kubernetes` client works against the test API server unchanged."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3
from dlrover_testsupport.kube import ApiServer
from dlrover_testsupport.kube.samples import GROUP, crd, pod

kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes client is part of the dev install")
from kubernetes import client, watch  # noqa: E402

pytestmark = pytest.mark.timeout(60)
NS = "default"


@pytest.fixture
def api(kube_api: ApiServer) -> Iterator[client.ApiClient]:
    with client.ApiClient(client.Configuration(host=kube_api.url)) as api_client:
        yield api_client


def _status(call: Any) -> int:
    with pytest.raises(client.ApiException) as info:
        call()
    return int(info.value.status)


def test_core_v1_pods_create_list_patch_and_delete(kube_api: ApiServer, api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    created = v1.create_namespaced_pod(
        NS, pod("", {"role": "worker"}) | {"metadata": {"generateName": "w-", "labels": {"role": "worker"}}}
    )
    name = created.metadata.name
    assert name.startswith("w-")
    assert created.metadata.uid
    assert created.status.phase == "Pending"
    v1.create_namespaced_pod(NS, pod("other", {"role": "ps"}))
    assert [p.metadata.name for p in v1.list_namespaced_pod(NS, label_selector="role=worker").items] == [name]
    assert len(v1.list_pod_for_all_namespaces().items) == 2
    patched = v1.patch_namespaced_pod(name, NS, {"metadata": {"labels": {"rank": "0"}}})
    assert patched.metadata.labels == {"role": "worker", "rank": "0"}
    patched = v1.patch_namespaced_pod(name, NS, [{"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}])
    assert patched.metadata.annotations == {"a": "b"}
    running = v1.patch_namespaced_pod_status(name, NS, {"status": {"phase": "Running"}})
    assert running.status.phase == "Running"
    on_node = v1.list_namespaced_pod(NS, field_selector="status.phase=Running").items
    assert [p.metadata.name for p in on_node] == [name]
    stale = v1.read_namespaced_pod(name, NS)
    v1.patch_namespaced_pod(name, NS, {"metadata": {"labels": {"rank": "1"}}})
    assert _status(lambda: v1.replace_namespaced_pod(name, NS, stale)) == 409
    assert _status(lambda: v1.create_namespaced_pod(NS, pod("other"))) == 409
    v1.delete_namespaced_pod(name, NS)
    assert _status(lambda: v1.read_namespaced_pod(name, NS)) == 404
    verbs = {verb for group, resource, verb in kube_api.verbs_used() if resource == "pods"}
    assert verbs == {"create", "list", "patch", "get", "update", "delete"}


def test_custom_objects_with_a_status_subresource(api: client.ApiClient) -> None:
    client.ApiextensionsV1Api(api).create_custom_resource_definition(crd())
    custom = client.CustomObjectsApi(api)
    body = {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": {"size": 1}}
    created = custom.create_namespaced_custom_object(GROUP, "v1", NS, "widgets", body)
    assert created["metadata"]["generation"] == 1, "a create answers 201 with the object"
    status = custom.patch_namespaced_custom_object_status(
        GROUP, "v1", NS, "widgets", "w1", {"status": {"phase": "Running"}}
    )
    assert status["status"] == {"phase": "Running"}
    assert status["metadata"]["generation"] == 1
    resized = custom.patch_namespaced_custom_object(GROUP, "v1", NS, "widgets", "w1", {"spec": {"size": 2}})
    assert resized["metadata"]["generation"] == 2
    assert resized["status"] == {"phase": "Running"}
    listed = custom.list_namespaced_custom_object(GROUP, "v1", NS, "widgets")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["w1"]
    # kopf's way to add a finalizer: a JSON patch guarded by a test of the resourceVersion.
    guarded = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": resized["metadata"]["resourceVersion"]},
        {"op": "add", "path": "/metadata/finalizers", "value": ["example/cleanup"]},
    ]
    json_patch = "application/json-patch+json"
    custom.patch_namespaced_custom_object(GROUP, "v1", NS, "widgets", "w1", guarded, _content_type=json_patch)
    assert (
        _status(
            lambda: custom.patch_namespaced_custom_object(
                GROUP, "v1", NS, "widgets", "w1", guarded, _content_type=json_patch
            )
        )
        == 422
    )
    custom.delete_namespaced_custom_object(GROUP, "v1", NS, "widgets", "w1")
    held = custom.get_namespaced_custom_object(GROUP, "v1", NS, "widgets", "w1")
    assert held["metadata"]["deletionTimestamp"]
    custom.patch_namespaced_custom_object(GROUP, "v1", NS, "widgets", "w1", {"metadata": {"finalizers": None}})
    assert _status(lambda: custom.get_namespaced_custom_object(GROUP, "v1", NS, "widgets", "w1")) == 404


class Observer:
    """What a controller does: list, then watch from the list's version; resume from the last
    version seen after a dropped watch, relist after 410. Runs on its own thread."""

    def __init__(self, v1: client.CoreV1Api) -> None:
        self.v1 = v1
        self.watch = watch.Watch()
        self.stopping = threading.Event()
        self.seen: list[tuple[str, str, str]] = []  # (type, name, resourceVersion)
        self.state: dict[str, str] = {}  # name -> resourceVersion
        self.changed = threading.Condition()
        self.relists = 0
        self.resumes = 0
        self.errors = 0
        self.thread = threading.Thread(target=self._run)

    def _relist(self) -> str:
        listed = self.v1.list_namespaced_pod(NS)
        with self.changed:
            self.state = {p.metadata.name: p.metadata.resource_version for p in listed.items}
            self.changed.notify_all()
        return str(listed.metadata.resource_version)

    def _run(self) -> None:
        rv = self._relist()
        while not self.stopping.is_set():
            try:
                for event in self.watch.stream(
                    self.v1.list_namespaced_pod, NS, resource_version=rv, _request_timeout=30
                ):
                    obj = event["object"]
                    rv = obj.metadata.resource_version
                    with self.changed:
                        self.seen.append((event["type"], obj.metadata.name, rv))
                        if event["type"] == "DELETED":
                            self.state.pop(obj.metadata.name, None)
                        else:
                            self.state[obj.metadata.name] = rv
                        self.changed.notify_all()
                    if self.stopping.is_set():
                        return
            except client.ApiException as e:
                if e.status == 410:
                    self._count("relists")
                    rv = self._relist()
                else:
                    self._count("errors")
            except urllib3.exceptions.HTTPError:
                self._count("resumes")

    def _count(self, counter: str) -> None:
        with self.changed:
            setattr(self, counter, getattr(self, counter) + 1)
            self.changed.notify_all()

    def wait_for(self, predicate: Any) -> None:
        with self.changed:
            ok = self.changed.wait_for(lambda: predicate(self), timeout=30)
        assert ok, f"resumes {self.resumes}, relists {self.relists}, errors {self.errors}, seen {self.seen}"

    def stop(self, v1: client.CoreV1Api) -> None:
        self.stopping.set()
        v1.create_namespaced_pod(NS, pod("wake-the-watch"))
        self.thread.join(30)
        assert not self.thread.is_alive()


def test_a_watch_resumes_after_dropped_watches_and_relists_after_410(
    kube_api: ApiServer, api: client.ApiClient
) -> None:
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(NS, pod("before"))
    observer = Observer(v1)
    observer.thread.start()
    try:
        _drop_and_relist(kube_api, v1, observer)
    finally:
        observer.stop(v1)


def _drop_and_relist(kube_api: ApiServer, v1: client.CoreV1Api, observer: Observer) -> None:
    observer.wait_for(lambda o: "before" in o.state)
    for n in range(3):
        v1.create_namespaced_pod(NS, pod(f"clean-{n}"))
        observer.wait_for(lambda o, n=n: f"clean-{n}" in o.state)
        assert kube_api.faults.drop_watches() == 1
    for n in range(3):
        v1.create_namespaced_pod(NS, pod(f"cut-{n}"))
        observer.wait_for(lambda o, n=n: f"cut-{n}" in o.state)
        kube_api.faults.drop_watches(abrupt=True)
    observer.wait_for(lambda o: o.resumes == 3)
    v1.delete_namespaced_pod("before", NS)
    observer.wait_for(lambda o: "before" not in o.state)
    created = [(t, n) for t, n, _ in observer.seen]
    expected = [("ADDED", f"clean-{n}") for n in range(3)] + [("ADDED", f"cut-{n}") for n in range(3)]
    assert created == [*expected, ("DELETED", "before")], "resumed watches lose and repeat nothing"
    versions = [int(rv) for _, _, rv in observer.seen]
    assert versions == sorted(set(versions))

    # The next watch answers 500, the two after it 410 (the client's Watch retries a 410 once by
    # itself), and what changes meanwhile is compacted away: the observer relists and ends right.
    kube_api.faults.fail_next(1, 500, when=lambda r: r.is_watch)
    kube_api.faults.fail_next(2, 410, when=lambda r: r.is_watch)
    kube_api.faults.drop_watches(abrupt=True)
    v1.create_namespaced_pod(NS, pod("while-down"))
    v1.delete_namespaced_pod("clean-0", NS)
    kube_api.faults.compact()
    observer.wait_for(lambda o: o.relists == 1 and "while-down" in o.state and "clean-0" not in o.state)
    assert observer.errors == 1
    assert set(observer.state) == {p.metadata.name for p in v1.list_namespaced_pod(NS).items}


def test_deleting_an_owner_collects_its_pods(kube_api: ApiServer, api: client.ApiClient) -> None:
    client.ApiextensionsV1Api(api).create_custom_resource_definition(crd())
    custom, v1 = client.CustomObjectsApi(api), client.CoreV1Api(api)
    job = custom.create_namespaced_custom_object(GROUP, "v1", NS, "widgets", {"metadata": {"name": "job"}})
    owner = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "name": "job",
        "uid": job["metadata"]["uid"],
        "controller": True,
    }
    for n in range(3):
        v1.create_namespaced_pod(
            NS, pod(f"worker-{n}") | {"metadata": {"name": f"worker-{n}", "ownerReferences": [owner]}}
        )
    v1.create_namespaced_service(
        NS, {"metadata": {"name": "master", "ownerReferences": [owner]}, "spec": {"ports": [{"port": 80}]}}
    )
    v1.create_namespaced_pod(NS, pod("unowned"))
    rv = v1.list_namespaced_pod(NS).metadata.resource_version
    custom.delete_namespaced_custom_object(
        GROUP, "v1", NS, "widgets", "job", body=client.V1DeleteOptions(propagation_policy="Background")
    )
    assert [p.metadata.name for p in v1.list_namespaced_pod(NS).items] == ["unowned"]
    assert v1.list_namespaced_service(NS).items == []
    deleted = [
        e["object"].metadata.name
        for e in watch.Watch().stream(v1.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=1)
    ]
    assert sorted(deleted) == ["worker-0", "worker-1", "worker-2"]


def test_injected_errors_reach_the_client(kube_api: ApiServer, api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    kube_api.faults.fail_next(1, 500, when=lambda r: r.verb == "create")
    assert _status(lambda: v1.create_namespaced_pod(NS, pod("p"))) == 500
    # The client itself retries a read answered 429 after the Retry-After the server names.
    throttle = kube_api.faults.fail_next(1, 429, when=lambda r: r.verb == "list", retry_after_s=1)
    assert v1.list_namespaced_pod(NS).items == []
    assert throttle.fired == 1
    assert [r.code for r in kube_api.requests() if r.verb == "list"] == [429, 200]
    kube_api.faults.fail_next(1, 429, when=lambda r: r.verb == "create", retry_after_s=1)
    with pytest.raises(client.ApiException) as info:
        v1.create_namespaced_pod(NS, pod("p"))
    assert info.value.status == 429
    assert info.value.headers["Retry-After"] == "1"
    assert v1.create_namespaced_pod(NS, pod("p")).metadata.name == "p"
