"""The HTTP edge of the test API server: Kubernetes REST paths, discovery and watch streams.

A stdlib `ThreadingHTTPServer` speaking HTTP/1.1 with keep-alive; watches stream newline-delimited
JSON events in chunked transfer encoding. Every request is translated into one `Store` call, after
the fault rules (`Faults`) had their say, and recorded (`requests()`), so a test can compare the
verbs its code used with the Role it ships.
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .errors import ApiError, status_body
from .faults import ApiRequest, FaultRule, Faults
from .patches import PatchConflict, PatchError, json_merge_patch, json_patch, strategic_merge_patch
from .resources import ResourceType
from .selectors import FieldSelector, LabelSelector, SelectorError
from .store import Store, Watch

__all__ = ["ApiServer"]

SERVER_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-dlrover-testsupport",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_HEALTH = ("healthz", "livez", "readyz")
_PATCHES = {
    "application/merge-patch+json": json_merge_patch,
    "application/json-patch+json": json_patch,
    "application/strategic-merge-patch+json": strategic_merge_patch,
}


class _HTTPServer(ThreadingHTTPServer):
    """Keeps the sockets of its open connections, so stopping can close idle keep-alive ones
    (their threads would otherwise wait for the client's next request)."""

    daemon_threads = False
    block_on_close = True

    def __init__(self, address: tuple[str, int], api: ApiServer) -> None:
        self.api = api
        self.open_sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client killed mid-request (a SIGKILLed pod, an agent that lost its node) resets its
        # connection; that is what the tests do on purpose, not a server fault worth a traceback.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _Dropped(Exception):
    """The client went away mid-response."""


class ApiServer:
    """A Kubernetes API server for tests, on 127.0.0.1 and a free port; a context manager.

    Args:
        store: the objects it serves (a fresh `Store` by default).
        host: the address to bind.
        port: 0 picks a free one.
        default_watch_timeout_s: how long a watch without `timeoutSeconds` streams before it ends
            cleanly (clients then resume from their last resourceVersion).
        idle_connection_timeout_s: how long a keep-alive connection may sit unused.

    Attributes:
        pod_logs: what answers `GET pods/<name>/log`: (namespace, pod, container or None) -> the
            log text, raising KeyError for a container that never ran (a `Kubelet`'s `read_log`;
            `KubeCluster` sets it). None: the subresource answers 404.
    """

    def __init__(
        self,
        store: Store | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        default_watch_timeout_s: float = 300.0,
        idle_connection_timeout_s: float = 60.0,
    ) -> None:
        self.store = store if store is not None else Store()
        self.faults = Faults(self._drop_watches, self._compact)
        self._host = host
        self._port = port
        self.default_watch_timeout_s = default_watch_timeout_s
        self.idle_connection_timeout_s = idle_connection_timeout_s
        self._http: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._watches: dict[Watch, bool] = {}  # open watch -> cut abruptly when stopped
        self._requests: list[ApiRequest] = []
        self._stopping = False
        self.pod_logs: Callable[[str, str, str | None], str] | None = None

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> ApiServer:
        if self._http is not None:
            raise RuntimeError("the test API server is already running")
        self._stopping = False
        self._http = _HTTPServer((self._host, self._port), self)
        self._thread = threading.Thread(target=self._http.serve_forever, name="kube-test-api", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end every watch and connection, and join every thread."""
        http, thread = self._http, self._thread
        if http is None or thread is None:
            return
        http.shutdown()
        with self._lock:
            self._stopping = True
            watches = list(self._watches)
        for watch in watches:
            watch.stop()
        with http.sockets_lock:
            sockets = list(http.open_sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        http.server_close()
        thread.join()
        self._http = self._thread = None

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._http is None:
            raise RuntimeError("the test API server is not running")
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    def write_kubeconfig(self, path: Path, *, namespace: str = "default") -> Path:
        """A kubeconfig (JSON, which is YAML) for kubectl and `kubernetes.config.load_kube_config`."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": namespace}}],
            "current-context": "test",
        }
        path.write_text(json.dumps(config, indent=2))
        return path

    # ----------------------------------------------------------------- what tests inspect

    def requests(self) -> list[ApiRequest]:
        """Every request answered so far, in order."""
        with self._lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def verbs_used(self) -> set[tuple[str, str, str]]:
        """(group, resource or resource/subresource, verb) of every resource request so far."""
        return {(r.group, r.rbac_resource, r.verb) for r in self.requests() if r.verb}

    def open_watches(self) -> int:
        with self._lock:
            return len(self._watches)

    # ----------------------------------------------------------------- faults

    def _drop_watches(self, abrupt: bool) -> int:
        with self._lock:
            watches = list(self._watches)
            for watch in watches:
                self._watches[watch] = abrupt
        for watch in watches:
            watch.stop()
        return len(watches)

    def _compact(self, resource_version: int | None) -> int:
        return self.store.compact(resource_version)

    def _record(self, request: ApiRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _register(self, watch: Watch) -> bool:
        with self._lock:
            if self._stopping:
                return False
            self._watches[watch] = False
            return True

    def _unregister(self, watch: Watch) -> bool:
        """Forget a watch; returns whether it was to be cut abruptly."""
        with self._lock:
            return self._watches.pop(watch, False)


def _discovery_groups(types: list[ResourceType]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for rt in types:
        if rt.group and rt.version not in groups.setdefault(rt.group, []):
            groups[rt.group].append(rt.version)
    return groups


def _api_group(name: str, versions: list[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": entries, "preferredVersion": entries[0]}


def _openapi_v3(types: list[ResourceType], group_version: list[str]) -> dict[str, Any] | None:
    """OpenAPI v3 discovery with one schema per kind that accepts any object.

    kubectl looks a kind's schema up before `apply` (to validate and to compute its patch); a
    schema that preserves unknown fields lets it proceed. The server validates nothing.
    """
    by_path: dict[str, list[ResourceType]] = {}
    for rt in types:
        path = f"apis/{rt.group}/{rt.version}" if rt.group else "api/v1"
        by_path.setdefault(path, []).append(rt)
    if not group_version:
        return {"paths": {p: {"serverRelativeURL": f"/openapi/v3/{p}"} for p in by_path}}
    served = by_path.get("/".join(group_version))
    if served is None:
        return None
    schemas = {
        f"{rt.group or 'core'}.{rt.version}.{rt.kind}": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "x-kubernetes-group-version-kind": [{"group": rt.group, "version": rt.version, "kind": rt.kind}],
        }
        for rt in served
    }
    # A PATCH operation per kind that names the fieldValidation parameter tells kubectl to leave
    # validation to the server (which accepts the parameter and validates nothing).
    paths = {
        f"/{'/'.join(group_version)}/{'namespaces/{namespace}/' if rt.namespaced else ''}{rt.plural}/{{name}}": {
            "patch": {
                "x-kubernetes-group-version-kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
                "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
                "responses": {},
            }
        }
        for rt in served
    }
    return {
        "openapi": "3.0.0",
        "info": {"title": "dlrover test API server", "version": SERVER_VERSION["gitVersion"]},
        "paths": paths,
        "components": {"schemas": schemas},
    }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer
    _raw_body = b""
    _request: ApiRequest | None = None
    _recorded = False

    # The base class logs every request to stderr; the server records them instead.
    def log_message(self, format: str, *args: Any) -> None:
        return

    def setup(self) -> None:
        super().setup()
        # An idle keep-alive connection (or a stuck client) releases its thread after this long.
        self.connection.settimeout(self.server.api.idle_connection_timeout_s)
        # An answer is written as headers, then body: with Nagle on, the body waits for the client's
        # delayed ACK of the headers (40 ms on Linux), which capped every client at ~22 requests/s.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @property
    def api(self) -> ApiServer:
        return self.server.api

    # ----------------------------------------------------------------- plumbing

    def _read_body(self) -> Any:
        if not self._raw_body:
            return None
        try:
            return json.loads(self._raw_body)
        except ValueError as e:
            raise ApiError.bad_request(f"the request body is not JSON: {e}") from None

    def send_response(self, code: int, message: str | None = None) -> None:
        # Recorded before the client can read the answer: a test that asserts on the requests
        # right after its call returned must find this one there.
        request = self._request
        if request is not None and not self._recorded:
            request.code = code
            self.api._record(request)
            self._recorded = True
        super().send_response(code, message)

    def _send_json(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, error: ApiError) -> None:
        headers = {}
        if error.retry_after_s is not None:
            headers["Retry-After"] = str(error.retry_after_s)
        self._send_json(error.code, error.status(), headers)

    def _chunk(self, data: bytes) -> None:
        try:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        except OSError as e:
            raise _Dropped from e

    def _handle(self, method: str) -> None:
        # The body is read whatever the answer, so the next request on this connection starts clean.
        length = int(self.headers.get("Content-Length") or 0)
        self._raw_body = self.rfile.read(length) if length > 0 else b""
        split = urlsplit(self.path)
        request = ApiRequest(
            method=method,
            path=split.path,
            query=parse_qs(split.query, keep_blank_values=True),
            user_agent=self.headers.get("User-Agent", ""),
            user=self._bearer(),
        )
        self._request, self._recorded = request, False
        try:
            route = self._route(request)
            latency, rule = self.api.faults.decide(request)
            if latency:
                time.sleep(latency)
            if rule is not None:
                self._inject(request, rule)
            else:
                request.code = route(request)
        except ApiError as error:
            request.code = error.code
            self._send_error(error)
        except _Dropped:
            request.code = request.code or 499
            self.close_connection = True
        finally:
            if not self._recorded:  # no answer was sent (a dropped connection)
                self.api._record(request)
            self._request = None

    def _bearer(self) -> str:
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        return token.strip() if scheme.lower() == "bearer" else ""

    def _inject(self, request: ApiRequest, rule: FaultRule) -> None:
        if rule.code == 410 and request.is_watch:
            self._start_stream()
            self._send_watch_error(ApiError.gone("too old resource version (injected)"))
            self._chunk(b"")
            request.code = 200
            return
        reasons = {
            403: "Forbidden", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
            503: "ServiceUnavailable", 410: "Expired",
        }  # fmt: skip
        retry = rule.retry_after_s if rule.code in (429, 503) else None
        message = rule.message or f"injected fault: {rule.code}"
        raise ApiError(rule.code, reasons.get(rule.code, "Unknown"), message, retry_after_s=retry)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # ----------------------------------------------------------------- routing

    def _route(self, request: ApiRequest) -> Any:
        parts = [p for p in request.path.split("/") if p]
        if request.method == "GET":
            doc = self._discovery(parts)
            if doc is not None:
                return lambda _: self._answer(200, doc)
        if parts[:2] == ["api", "v1"] and len(parts) > 2:
            group, version, rest = "", "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) > 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({request.path})")
        namespace = ""
        if rest[0] == "namespaces" and len(rest) >= 3 and not (len(rest) == 3 and rest[2] in ("status", "finalize")):
            namespace, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({request.path})")
        request.group, request.version, request.namespace = group, version, namespace
        request.resource = rest[0]
        request.name = rest[1] if len(rest) > 1 else ""
        request.subresource = rest[2] if len(rest) > 2 else ""
        request.verb = self._verb(request)
        rt = self.api.store.resource_type(group, version, request.resource)
        # A namespaced object needs its namespace in the path, a cluster-scoped one must have none;
        # only a namespaced collection may be read across namespaces.
        if (not rt.namespaced and namespace) or (rt.namespaced and not namespace and request.name):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({request.path})")
        return lambda req: self._serve(rt, req)

    @staticmethod
    def _verb(request: ApiRequest) -> str:
        """The RBAC verb of a resource request."""
        if request.method == "GET" and not request.name:
            return "watch" if request.query.get("watch", [""])[0] in ("true", "1") else "list"
        if request.method == "DELETE" and not request.name:
            return "deletecollection"
        return {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch"}.get(request.method, "delete")

    def _discovery(self, parts: list[str]) -> dict[str, Any] | None:
        types = self.api.store.resource_types()
        if parts == ["version"]:
            return SERVER_VERSION
        if len(parts) == 1 and parts[0] in _HEALTH:
            return {"status": "ok"}
        if parts[:2] == ["openapi", "v3"]:
            return _openapi_v3(types, parts[2:])
        return self._api_discovery(parts, types)

    def _api_discovery(self, parts: list[str], types: list[ResourceType]) -> dict[str, Any] | None:
        if parts == ["api"]:
            host, port = self.server.server_address[:2]
            cidrs = [{"clientCIDR": "0.0.0.0/0", "serverAddress": f"{host!s}:{port}"}]
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": cidrs}
        groups = _discovery_groups(types)
        if parts == ["apis"]:
            listed = [_api_group(name, versions) for name, versions in groups.items()]
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": listed}
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in groups:
            return {"kind": "APIGroup", "apiVersion": "v1", **_api_group(parts[1], groups[parts[1]])}
        group_version = ("", "v1") if parts == ["api", "v1"] else None
        if len(parts) == 3 and parts[0] == "apis":
            group_version = (parts[1], parts[2])
        if group_version is None:
            return None
        served = [rt for rt in types if (rt.group, rt.version) == group_version]
        if not served:
            return None
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": served[0].group_version,
            "resources": [entry for rt in served for entry in rt.discovery()],
        }

    def _answer(self, code: int, body: Any) -> int:
        self._send_json(code, body)
        return code

    # ----------------------------------------------------------------- resources

    def _serve(self, rt: ResourceType, request: ApiRequest) -> int:
        namespace = request.namespace or None
        status = request.subresource == "status"
        if request.subresource not in ("", "status", "binding", "log") or (status and not rt.has_status):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({request.path})")
        if request.subresource == "log":
            if rt.group_resource != ("", "pods") or request.method != "GET":
                raise ApiError(405, "MethodNotAllowed", "only GET pods/<name>/log is served")
            return self._log(rt, request)
        if request.subresource == "binding":
            if rt.group_resource != ("", "pods") or request.method != "POST":
                raise ApiError(405, "MethodNotAllowed", "only POST pods/<name>/binding is served")
            return self._bind(rt, request)
        if request.name:
            return self._serve_object(rt, request, namespace, status)
        return self._serve_collection(rt, request, namespace)

    def _serve_object(self, rt: ResourceType, request: ApiRequest, namespace: str | None, status: bool) -> int:
        store = self.api.store
        if request.method == "GET":
            return self._answer(200, store.get(rt, namespace, request.name))
        if request.method == "PUT":
            return self._answer(200, store.replace(rt, namespace, request.name, self._read_body(), status=status))
        if request.method == "PATCH":
            return self._answer(200, self._patch(rt, request, namespace, status))
        if request.method == "DELETE":
            return self._delete(rt, request, namespace)
        raise ApiError(405, "MethodNotAllowed", f"{request.method} is not allowed on {request.path}")

    def _serve_collection(self, rt: ResourceType, request: ApiRequest, namespace: str | None) -> int:
        store = self.api.store
        if request.method == "POST":
            return self._answer(201, store.create(rt, namespace, self._read_body()))
        if request.method not in ("GET", "DELETE"):
            raise ApiError(405, "MethodNotAllowed", f"{request.method} is not allowed on {request.path}")
        labels, fields = self._selectors(rt, request)
        if request.is_watch:
            return self._watch(rt, request, namespace, labels, fields)
        if request.method == "DELETE":
            items, _, _ = store.list(rt, namespace, labels, fields)
            for item in items:
                with contextlib.suppress(ApiError):  # gone meanwhile, e.g. collected with its owner
                    store.delete(rt, item["metadata"].get("namespace"), item["metadata"]["name"])
            return self._answer(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
        limit = self._int_query(request, "limit")
        continue_token = self._query(request, "continue")
        items, rv, token = store.list(rt, namespace, labels, fields, limit=limit or None, continue_token=continue_token)
        meta: dict[str, Any] = {"resourceVersion": rv}
        if token:
            meta["continue"] = token
        return self._answer(
            200, {"kind": f"{rt.kind}List", "apiVersion": rt.group_version, "metadata": meta, "items": items}
        )

    @staticmethod
    def _query(request: ApiRequest, name: str) -> str | None:
        values = request.query.get(name)
        return values[0] if values else None

    def _int_query(self, request: ApiRequest, name: str) -> int | None:
        value = self._query(request, name)
        if value in (None, ""):
            return None
        try:
            return int(value or "")
        except ValueError:
            raise ApiError.bad_request(f"{name} must be an integer, not {value!r}") from None

    def _selectors(self, rt: ResourceType, request: ApiRequest) -> tuple[LabelSelector, FieldSelector]:
        try:
            labels = LabelSelector.parse(self._query(request, "labelSelector"))
            fields = FieldSelector.parse(self._query(request, "fieldSelector"), rt.field_selectable)
        except SelectorError as e:
            raise ApiError.bad_request(str(e)) from None
        return labels, fields

    def _patch(self, rt: ResourceType, request: ApiRequest, namespace: str | None, status: bool) -> dict[str, Any]:
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        apply_patch = _PATCHES.get(content_type)
        if apply_patch is None or (apply_patch is strategic_merge_patch and not rt.supports_strategic_merge):
            accepted = sorted(t for t in _PATCHES if rt.supports_strategic_merge or "strategic" not in t)
            message = "the body of the request was in an unknown format - accepted media types include: "
            message += ", ".join(accepted)
            raise ApiError(415, "UnsupportedMediaType", message)
        body = self._read_body()

        def apply(current: dict[str, Any]) -> Any:
            try:
                return apply_patch(current, body)
            except PatchConflict as e:
                raise ApiError(422, "Invalid", str(e), resource=rt, name=request.name) from None
            except PatchError as e:
                raise ApiError.bad_request(str(e)) from None

        return self.api.store.patch(rt, namespace, request.name, apply, status=status)

    def _delete(self, rt: ResourceType, request: ApiRequest, namespace: str | None) -> int:
        options = self._read_body() or {}
        if not isinstance(options, dict):
            raise ApiError.bad_request("DeleteOptions must be a JSON object")
        preconditions = options.get("preconditions") or {}
        propagation = options.get("propagationPolicy") or self._query(request, "propagationPolicy")
        if options.get("orphanDependents") is True:
            propagation = "Orphan"
        grace = options.get("gracePeriodSeconds")
        if grace is None:
            grace = self._int_query(request, "gracePeriodSeconds")
        result = self.api.store.delete(
            rt,
            namespace,
            request.name,
            propagation=propagation,
            grace_period_s=grace,
            precondition_uid=preconditions.get("uid"),
            precondition_rv=preconditions.get("resourceVersion"),
        )
        # 202: deletion started but the object is still there (finalizers, a graceful pod).
        gone = not self.api.store.holds(rt, namespace, request.name, result["metadata"]["uid"])
        return self._answer(200 if gone else 202, result)

    def _log(self, rt: ResourceType, request: ApiRequest) -> int:
        self.api.store.get(rt, request.namespace or None, request.name)  # 404 for no such pod
        reader = self.api.pod_logs
        if reader is None:
            raise ApiError(404, "NotFound", f"no kubelet serves the logs of pod {request.name}")
        container = self._query(request, "container")
        try:
            text = reader(request.namespace, request.name, container)
        except KeyError as e:
            raise ApiError.bad_request(f"pod {request.name}: {e.args[0] if e.args else e}") from None
        tail = self._int_query(request, "tailLines")
        if tail is not None and tail >= 0:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[len(lines) - tail :]) if tail else ""
        data = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        return 200

    def _bind(self, rt: ResourceType, request: ApiRequest) -> int:
        body = self._read_body() or {}
        target = (body.get("target") or {}).get("name") if isinstance(body, dict) else None
        if not target:
            raise ApiError.invalid(rt, request.name, "target.name: Required value")

        def bind(pod: dict[str, Any]) -> dict[str, Any]:
            if (pod.get("spec") or {}).get("nodeName"):
                why = f"pod {request.name} is already assigned to node {pod['spec']['nodeName']!r}"
                raise ApiError.conflict(rt, request.name, why)
            bound = copy.deepcopy(pod)
            bound.setdefault("spec", {})["nodeName"] = target
            return bound

        self.api.store.patch(rt, request.namespace or None, request.name, bind)
        return self._answer(
            201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        )

    # ----------------------------------------------------------------- watching

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _send_event(self, kind: str, obj: dict[str, Any]) -> None:
        self._chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

    def _send_watch_error(self, error: ApiError) -> None:
        self._send_event("ERROR", status_body(error.code, error.reason, error.message))

    def _watch(
        self,
        rt: ResourceType,
        request: ApiRequest,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
    ) -> int:
        timeout = self._int_query(request, "timeoutSeconds")
        duration = float(timeout) if timeout and timeout > 0 else self.api.default_watch_timeout_s
        try:
            watch = self.api.store.watch(rt, namespace, labels, fields, self._query(request, "resourceVersion"))
        except ApiError as error:
            if error.code != 410:
                raise
            self._start_stream()
            self._send_watch_error(error)
            self._chunk(b"")
            return 200
        if not self.api._register(watch):
            watch.stop()
        self._start_stream()
        try:
            for events in self._events(watch, duration):
                for event in events:
                    self._send_event(event.type, event.obj)
        except ApiError as error:
            self._send_watch_error(error)
        finally:
            abrupt = self.api._unregister(watch)
            watch.stop()
        if abrupt:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return 200
        self._chunk(b"")
        return 200

    @staticmethod
    def _events(watch: Watch, duration_s: float) -> Iterator[list[Any]]:
        deadline = time.monotonic() + duration_s
        while (remaining := deadline - time.monotonic()) > 0:
            events = watch.next_events(remaining)
            if events is None:
                return
            yield events
