"""The HTTP edge, spoken to with http.client: discovery, Status bodies, chunked watch streams,
keep-alive, fault injection, the request record, and a stop that leaks nothing."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from dlrover_testsupport.kube import ApiServer, Store
from dlrover_testsupport.kube.samples import GROUP, crd, pod

pytestmark = pytest.mark.timeout(60)


class Client:
    """One keep-alive connection to the server."""

    def __init__(self, server: ApiServer) -> None:
        url = urlsplit(server.url)
        self.conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)

    def call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Any, http.client.HTTPResponse]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type} if data is not None else {}
        self.conn.request(method, path, body=data, headers=headers)
        response = self.conn.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else None, response

    def stream(self, path: str) -> Iterator[dict[str, Any]]:
        self.conn.request("GET", path)
        response = self.conn.getresponse()
        assert response.status == 200
        assert response.getheader("Transfer-Encoding") == "chunked"
        while line := response.readline():
            yield json.loads(line)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def client(kube_api: ApiServer) -> Iterator[Client]:
    c = Client(kube_api)
    yield c
    c.close()


def test_discovery_lists_every_group_and_resource(kube_api: ApiServer, client: Client) -> None:
    assert client.call("GET", "/version")[1]["major"] == "1"
    assert client.call("GET", "/api")[1]["versions"] == ["v1"]
    core = client.call("GET", "/api/v1")[1]
    names = {r["name"] for r in core["resources"]}
    assert {"pods", "pods/status", "services", "secrets", "events", "configmaps", "namespaces"} <= names
    assert {"serviceaccounts", "nodes", "nodes/status"} <= names
    groups = {g["name"] for g in client.call("GET", "/apis")[1]["groups"]}
    assert {"rbac.authorization.k8s.io", "apiextensions.k8s.io", "coordination.k8s.io", "apps"} <= groups
    rbac = client.call("GET", "/apis/rbac.authorization.k8s.io/v1")[1]
    assert {r["name"] for r in rbac["resources"]} == {"roles", "rolebindings", "clusterroles", "clusterrolebindings"}
    assert client.call("GET", f"/apis/{GROUP}/v1")[0] == 404
    assert client.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd())[0] == 201
    assert GROUP in {g["name"] for g in client.call("GET", "/apis")[1]["groups"]}
    assert client.call("GET", f"/apis/{GROUP}")[1]["preferredVersion"]["version"] == "v1"
    served = client.call("GET", f"/apis/{GROUP}/v1")[1]["resources"]
    assert [(r["name"], r["namespaced"]) for r in served] == [("widgets", True), ("widgets/status", True)]


def test_errors_answer_a_status_body(client: Client) -> None:
    pods = "/api/v1/namespaces/default/pods"
    assert client.call("POST", pods, pod("p"))[0] == 201
    code, body, _ = client.call("POST", pods, pod("p"))
    assert (code, body["kind"], body["reason"], body["code"]) == (409, "Status", "AlreadyExists", 409)
    assert body["details"] == {"name": "p", "group": "", "kind": "pods"}
    code, body, _ = client.call("GET", f"{pods}/missing")
    assert (code, body["reason"], body["message"]) == (404, "NotFound", 'pods "missing" not found')
    code, body, _ = client.call("POST", pods, {"metadata": {"name": "UPPER"}})
    assert (code, body["reason"]) == (422, "Invalid")
    stale = {"metadata": {"name": "p", "resourceVersion": "1"}, "spec": {}}
    code, body, _ = client.call("PUT", f"{pods}/p", stale)
    assert (code, body["reason"]) == (409, "Conflict")
    code, body, _ = client.call("GET", f"{pods}?labelSelector=a%20b")
    assert (code, body["reason"]) == (400, "BadRequest")
    code, body, _ = client.call("GET", f"{pods}?fieldSelector=spec.image%3Dx")
    assert code == 400
    assert "field label not supported" in body["message"]
    code, _, _ = client.call("PATCH", f"{pods}/p", {"a": 1}, "application/apply-patch+yaml")
    assert code == 415
    test_failed = [{"op": "test", "path": "/metadata/resourceVersion", "value": "1"}]
    assert client.call("PATCH", f"{pods}/p", test_failed, "application/json-patch+json")[0] == 422
    assert client.call("GET", "/apis/nothing.example/v1/things")[0] == 404


def test_create_patch_and_delete_over_one_keep_alive_connection(kube_api: ApiServer, client: Client) -> None:
    pods = "/api/v1/namespaces/default/pods"
    code, _created, response = client.call("POST", pods, pod("p", {"a": "b"}))
    assert code == 201
    assert response.getheader("Connection") != "close"
    merged = client.call("PATCH", f"{pods}/p", {"metadata": {"labels": {"c": "d"}}}, "application/merge-patch+json")[1]
    assert merged["metadata"]["labels"] == {"a": "b", "c": "d"}
    strategic = {"spec": {"containers": [{"name": "side", "image": "x"}]}}
    patched = client.call("PATCH", f"{pods}/p", strategic, "application/strategic-merge-patch+json")[1]
    assert [c["name"] for c in patched["spec"]["containers"]] == ["main", "side"]
    status = client.call("PATCH", f"{pods}/p/status", {"status": {"phase": "Running"}}, "application/merge-patch+json")
    assert status[1]["status"]["phase"] == "Running"
    listed = client.call("GET", f"{pods}?fieldSelector=status.phase%3DRunning&labelSelector=c%3Dd")[1]
    assert [i["metadata"]["name"] for i in listed["items"]] == ["p"]
    assert int(listed["metadata"]["resourceVersion"]) >= int(status[1]["metadata"]["resourceVersion"])
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"name": "n1"}}
    assert client.call("POST", f"{pods}/p/binding", binding)[0] == 201
    assert client.call("POST", f"{pods}/p/binding", binding)[0] == 409
    assert client.call("DELETE", f"{pods}/p")[0] == 200
    assert client.call("GET", pods)[1]["items"] == []
    assert all(r.code for r in kube_api.requests())
    assert ("", "pods/status", "patch") in kube_api.verbs_used()
    assert ("", "pods/binding", "create") in kube_api.verbs_used()


def test_deletion_options_collections_and_graceful_pods() -> None:
    with ApiServer(Store(graceful_pod_deletion=True)) as server:
        client = Client(server)
        pods = "/api/v1/namespaces/default/pods"
        uid = client.call("POST", pods, pod("p", nodeName="n1"))[1]["metadata"]["uid"]
        code, body, _ = client.call("DELETE", f"{pods}/p", {"preconditions": {"uid": "other"}})
        assert (code, body["reason"]) == (409, "Conflict")
        code, body, _ = client.call("DELETE", f"{pods}/p", {"preconditions": {"uid": uid}})
        assert code == 202, "a kubelet finishes the deletion"
        assert body["metadata"]["deletionGracePeriodSeconds"] == 30
        assert client.call("DELETE", f"{pods}/p?gracePeriodSeconds=0")[0] == 200
        for name, labels in (("a", {"x": "1"}), ("b", {"x": "1"}), ("c", {"x": "2"})):
            client.call("POST", pods, pod(name, labels))
        assert client.call("DELETE", f"{pods}?labelSelector=x%3D1")[0] == 200
        assert [i["metadata"]["name"] for i in client.call("GET", pods)[1]["items"]] == ["c"]
        assert ("", "pods", "deletecollection") in server.verbs_used()
        client.close()


def test_a_watch_streams_chunked_events_and_ends_at_its_timeout(kube_api: ApiServer, client: Client) -> None:
    pods = "/api/v1/namespaces/default/pods"
    start = client.call("POST", pods, pod("a"))[1]["metadata"]["resourceVersion"]
    client.call("DELETE", f"{pods}/a")
    events = list(client.stream(f"{pods}?watch=true&resourceVersion={start}&timeoutSeconds=1"))
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("DELETED", "a")]
    assert client.call("GET", "/version")[0] == 200, "the connection is reused after a watch ends"
    kube_api.faults.compact()
    gone = list(client.stream(f"{pods}?watch=true&resourceVersion={start}&allowWatchBookmarks=true"))
    assert [(e["type"], e["object"]["code"], e["object"]["reason"]) for e in gone] == [("ERROR", 410, "Expired")]


def _watch_in_thread(server: ApiServer, path: str) -> tuple[threading.Thread, list[Any], threading.Event]:
    events: list[Any] = []
    started = threading.Event()

    def run() -> None:
        c = Client(server)
        try:
            for event in c.stream(path):
                events.append(event)
                started.set()
        except (http.client.HTTPException, OSError, ValueError) as e:  # ValueError: a cut chunk header
            events.append(e)
        finally:
            events.append("end")
            c.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, events, started


def _raw_watch(server: ApiServer, path: str) -> socket.socket:
    url = urlsplit(server.url)
    sock = socket.create_connection((url.hostname or "", url.port or 0), timeout=30)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    return sock


def _read_to_end(sock: socket.socket, data: bytes) -> bytes:
    """Read until the last chunk (the connection stays open for the next request) or EOF."""
    while not data.endswith(b"0\r\n\r\n") and (chunk := sock.recv(65536)):
        data += chunk
    sock.close()
    return data


def test_dropping_watches_ends_them_cleanly_or_cuts_them(kube_api: ApiServer, client: Client) -> None:
    pods = "/api/v1/namespaces/default/pods"
    client.call("POST", pods, pod("a"))
    for abrupt in (False, True):
        sock = _raw_watch(kube_api, f"{pods}?watch=1")
        head = b""
        while b'"ADDED"' not in head:
            head += sock.recv(65536)
        assert kube_api.faults.drop_watches(abrupt=abrupt) == 1
        data = _read_to_end(sock, head)
        # A clean end is the last chunk (a zero-length one), as after timeoutSeconds; a cut has none.
        assert data.endswith(b"0\r\n\r\n") != abrupt
        assert kube_api.open_watches() == 0


def test_injected_failures_latency_and_410(kube_api: ApiServer, client: Client) -> None:
    pods = "/api/v1/namespaces/default/pods"
    rule = kube_api.faults.fail_next(2, 429, when=lambda r: r.verb == "list", retry_after_s=3)
    code, body, response = client.call("GET", pods)
    assert (code, body["reason"], response.getheader("Retry-After")) == (429, "TooManyRequests", "3")
    assert client.call("GET", "/api/v1/namespaces/default/pods/x")[0] == 404, "only matching requests fail"
    assert client.call("GET", pods)[0] == 429
    assert client.call("GET", pods)[0] == 200
    assert rule.fired == 2
    kube_api.faults.fail_next(1, 500)
    assert client.call("POST", pods, pod("a"))[1]["reason"] == "InternalError"
    slow = kube_api.faults.add_latency(0.01, when=lambda r: r.verb == "get")
    client.call("GET", f"{pods}/a")
    kube_api.faults.remove(slow)
    assert slow.fired == 1
    kube_api.faults.fail_next(1, 410, when=lambda r: r.is_watch)
    events = list(client.stream(f"{pods}?watch=true"))
    assert [(e["type"], e["object"]["code"]) for e in events] == [("ERROR", 410)]
    assert [r.code for r in kube_api.requests()][-1] == 200
    kube_api.clear_requests()
    assert kube_api.requests() == []
    assert kube_api.verbs_used() == set()
    with pytest.raises(ValueError, match="count"):
        kube_api.faults.fail_next(0)


def test_stop_ends_watches_and_idle_connections_and_joins_every_thread() -> None:
    threads_before = set(threading.enumerate())
    server = ApiServer().start()
    idle = Client(server)
    assert idle.call("GET", "/version")[0] == 200
    thread, events, started = _watch_in_thread(server, "/api/v1/namespaces?watch=true")
    assert started.wait(30)
    server.stop()
    thread.join(30)
    assert events[-1] == "end"
    assert set(threading.enumerate()) == threads_before
    host, port = urlsplit(idle.conn.host and f"http://{idle.conn.host}:{idle.conn.port}").hostname, idle.conn.port
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host or "", port or 0), timeout=5).close()
    idle.close()
