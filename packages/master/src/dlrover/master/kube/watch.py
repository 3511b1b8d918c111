"""List and watch one Kubernetes collection without losing an event and without polling.

`ListWatch` lists the collection once, then watches it from the list's resourceVersion: every
later change arrives on one long-lived stream. What can go wrong with that stream is handled here
once, for the master's backend and the operator alike:

- the stream ends (its `timeoutSeconds`, a proxy, a restarted API server) or is cut: watch again
  from the last resourceVersion seen, so nothing in between is missed;
- the server no longer holds that version (410 Gone, an ERROR event with code 410, or a
  `continue` token that expired): list again and turn the difference between what was known and
  what the list says into ADDED, MODIFIED and DELETED events, so a consumer's cache ends up right
  even for changes that happened while it could not watch;
- any other failure (500, 429, a refused connection, a read timeout): wait a bounded exponential
  backoff (a 429's Retry-After honoured, up to the cap) and retry.

resourceVersions are opaque strings: they are passed back to the server and compared only for
equality, never parsed. Time comes from an injected clock and waiting from an injected sleep, so the
backoff is tested without waiting; the default sleep wakes at once on `stop()`.

Events come out of `ListWatch.events()` (an iterator) or, on a thread of its own, from `Watcher`
(a callback).
"""

from __future__ import annotations

import enum
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from dlrover.common import Clock, ConfigError, SystemClock
from dlrover.common.validators import positive
from dlrover.master.backoff import Backoff

__all__ = [
    "Backoff",
    "EventType",
    "ListWatch",
    "ListWatchStats",
    "WatchEvent",
    "WatchSettings",
    "Watcher",
    "object_key",
]

log = logging.getLogger(__name__)

ListFunc = Callable[..., Any]
"""A list method of the official client bound to its collection, e.g.
`functools.partial(CoreV1Api(api).list_namespaced_pod, "ns", label_selector="a=b")`; it must accept
the collection parameters `watch`, `resource_version`, `timeout_seconds`, `allow_watch_bookmarks`,
`limit`, `_continue`, and the client's `_preload_content` and `_request_timeout`."""


class EventType(enum.StrEnum):
    """What happened to an object, as the watch protocol names it; SYNCED marks a complete view."""

    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    SYNCED = "SYNCED"
    """Every object of a (re)list has been delivered: what a consumer holds now equals the server's
    collection at that list. A level-triggered consumer reconciles here. Its object is empty."""


@attrs.frozen
class WatchEvent:
    """One change of one object.

    Attributes:
        type: what happened.
        object: the object as JSON (a dict, as the API server sent it); for DELETED its last known
            state; empty for SYNCED.
        relisted: derived from a relist (what changed while no watch was open) rather than read
            from a watch stream.
    """

    type: EventType
    object: Mapping[str, Any] = attrs.field(factory=dict)
    relisted: bool = False


@attrs.frozen
class WatchSettings:
    """How a `ListWatch` talks to the API server. Every value is in seconds unless named otherwise.

    Attributes:
        watch_timeout_s: the `timeoutSeconds` of each watch request: the server ends the stream
            then and the watch resumes from the last resourceVersion (a real server also ends
            watches on its own, after 30-60 minutes).
        request_timeout_s: connect timeout of every request and read timeout of a list; a watch's
            read timeout is `watch_timeout_s + request_timeout_s`, so a stream that went silent
            without ending is given up and resumed.
        backoff_initial_s: the first wait after a failure.
        backoff_max_s: the most any wait lasts (the bound of the exponential backoff).
        backoff_multiplier: how much each further consecutive failure lengthens the wait.
        list_page_size: objects per list page (`limit`); 0 lists everything in one response.
    """

    watch_timeout_s: float = attrs.field(default=60.0, validator=positive)
    request_timeout_s: float = attrs.field(default=30.0, validator=positive)
    backoff_initial_s: float = attrs.field(default=0.2, validator=positive)
    backoff_max_s: float = attrs.field(default=10.0, validator=positive)
    backoff_multiplier: float = attrs.field(default=2.0)
    list_page_size: int = attrs.field(default=500)

    def __attrs_post_init__(self) -> None:
        if self.backoff_max_s < self.backoff_initial_s:
            raise ConfigError(
                f"backoff_max_s ({self.backoff_max_s}) must not be less than backoff_initial_s "
                f"({self.backoff_initial_s})"
            )
        if self.backoff_multiplier < 1:
            raise ConfigError(f"backoff_multiplier must be at least 1, not {self.backoff_multiplier!r}")
        if self.list_page_size < 0:
            raise ConfigError(f"list_page_size must not be negative, not {self.list_page_size!r}")


@attrs.define
class ListWatchStats:
    """What a `ListWatch` did: proof in tests that a fault was met and survived.

    Attributes:
        lists: complete lists (the first and every relist).
        relists: lists after the first (after a 410).
        watches: watch requests opened.
        resumes: watches reopened from a resourceVersion after a stream ended or broke.
        gone: 410 answers met (each leads to a relist).
        failures: failed requests that were retried after a backoff.
        events: events delivered (SYNCED not counted).
    """

    lists: int = 0
    relists: int = 0
    watches: int = 0
    resumes: int = 0
    gone: int = 0
    failures: int = 0
    events: int = 0


def object_key(obj: Mapping[str, Any]) -> str:
    """`namespace/name` (or `name` for a cluster-scoped object): how a cache keys an object."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") or ""
    name = meta.get("name") or ""
    return f"{namespace}/{name}" if namespace else str(name)


class _Gone(Exception):
    """The server no longer holds the version asked for: relist."""


class _Failed(Exception):
    """A request failed in a way worth retrying after a backoff."""

    def __init__(self, message: str, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def _resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


class ListWatch:
    """List, then watch, one collection; yields its events until stopped.

    Args:
        list_func: the client's list method bound to the collection (see `ListFunc`).
        settings: timeouts and backoff.
        clock: measures how long a stream lasted (default: the system clock).
        sleep: waits between retries (default: waits on the stop signal, so `stop()` ends a
            wait at once); tests inject one that records the delays.
        name: what is watched, for logs (`pods in ns/x`).
    """

    def __init__(
        self,
        list_func: ListFunc,
        *,
        settings: WatchSettings | None = None,
        clock: Clock | None = None,
        sleep: Callable[[float], None] | None = None,
        name: str = "objects",
    ) -> None:
        self._list_func = list_func
        self._settings = settings or WatchSettings()
        self._clock = clock or SystemClock()
        self._stopping = threading.Event()
        self._sleep = sleep or self._wait_unless_stopped
        self._name = name
        self._backoff = Backoff(
            self._settings.backoff_initial_s, self._settings.backoff_max_s, self._settings.backoff_multiplier
        )
        self._lock = threading.Lock()
        self._response: Any = None
        self._objects: dict[str, Mapping[str, Any]] = {}
        self._resource_version = ""
        self.stats = ListWatchStats()

    @property
    def resource_version(self) -> str:
        """The last resourceVersion seen (where a resumed watch starts); empty before the first list."""
        return self._resource_version

    @property
    def stopped(self) -> bool:
        """Whether `stop()` was called."""
        return self._stopping.is_set()

    def objects(self) -> dict[str, Mapping[str, Any]]:
        """The objects known now, by `object_key` (a copy), as of the last event yielded."""
        with self._lock:
            return dict(self._objects)

    def stop(self) -> None:
        """End `events()`: a wait ends at once and an open request is shut down. Idempotent;
        callable from any thread."""
        self._stopping.set()
        with self._lock:
            response = self._response
        if response is not None:
            _shutdown(response)

    def events(self) -> Iterator[WatchEvent]:
        """Every change to the collection from now on, until `stop()`: first an ADDED per object
        and a SYNCED, then what the watch streams bring (and, after a 410, what a relist shows).
        """
        need_list = True
        while not self._stopping.is_set():
            try:
                if need_list:
                    items, version = self._list()
                    yield from self._relist_events(items)
                    self._resource_version = version
                    self.stats.lists += 1
                    self.stats.relists += self.stats.lists > 1
                    self._backoff.reset()
                    need_list = False
                    yield WatchEvent(EventType.SYNCED)
                else:
                    yield from self._watch_once()
            except _Gone as exc:
                self.stats.gone += 1
                log.info("watch of %s: %s; listing again", self._name, exc)
                if need_list:  # a list's `continue` token expired: list again, after a backoff
                    self._retry_later(_Failed(str(exc)))
                need_list = True
            except _Failed as exc:
                self._retry_later(exc)

    def _retry_later(self, exc: _Failed) -> None:
        if self._stopping.is_set():
            return
        self.stats.failures += 1
        delay = self._backoff.next_delay(exc.retry_after_s)
        log.warning("listing or watching %s failed (%s); retrying in %.2f s", self._name, exc, delay)
        self._sleep(delay)

    def _wait_unless_stopped(self, seconds: float) -> None:
        self._stopping.wait(seconds)

    def _list(self) -> tuple[list[Mapping[str, Any]], str]:
        settings = self._settings
        items: list[Mapping[str, Any]] = []
        token = ""
        version = ""
        while True:
            kwargs: dict[str, Any] = {}
            if settings.list_page_size:
                kwargs["limit"] = settings.list_page_size
            if token:
                kwargs["_continue"] = token
            body = self._request(kwargs, (settings.request_timeout_s, settings.request_timeout_s))
            try:
                page = json.loads(body)
                meta = page.get("metadata") or {}
                items.extend(page.get("items") or [])
            except (ValueError, AttributeError) as exc:
                raise _Failed(f"the list answer is not a list: {exc}") from exc
            # The first page's version is the snapshot's: later pages continue that snapshot.
            version = version or str(meta.get("resourceVersion") or "")
            token = str(meta.get("continue") or "")
            if not token:
                return items, version

    def _relist_events(self, items: list[Mapping[str, Any]]) -> Iterator[WatchEvent]:
        listed = {object_key(item): item for item in items}
        with self._lock:
            known = dict(self._objects)
        relisted = self.stats.lists > 0
        for key, gone in known.items():
            now = listed.get(key)
            if now is None or _uid(now) != _uid(gone):
                yield self._apply(EventType.DELETED, gone, relisted=relisted)
        for key, new in listed.items():
            before = known.get(key)
            if before is None or _uid(new) != _uid(before):
                yield self._apply(EventType.ADDED, new, relisted=relisted)
            elif _resource_version(new) != _resource_version(before):
                yield self._apply(EventType.MODIFIED, new, relisted=relisted)

    def _apply(self, kind: EventType, obj: Mapping[str, Any], *, relisted: bool = False) -> WatchEvent:
        key = object_key(obj)
        with self._lock:
            if kind is EventType.DELETED:
                self._objects.pop(key, None)
            else:
                self._objects[key] = obj
        self.stats.events += 1
        return WatchEvent(kind, obj, relisted)

    def _watch_once(self) -> Iterator[WatchEvent]:
        settings = self._settings
        kwargs = {
            "watch": True,
            "resource_version": self._resource_version,
            "timeout_seconds": max(1, round(settings.watch_timeout_s)),
            "allow_watch_bookmarks": True,
        }
        if self.stats.watches:
            self.stats.resumes += 1
        self.stats.watches += 1
        started = self._clock.now()
        delivered = 0
        read_timeout_s = settings.watch_timeout_s + settings.request_timeout_s
        for raw in self._stream(kwargs, (settings.request_timeout_s, read_timeout_s)):
            kind = raw.get("type")
            obj = raw.get("object") or {}
            if kind == "ERROR":
                code = obj.get("code")
                if code == 410:
                    raise _Gone(f"resourceVersion {self._resource_version} is gone: {obj.get('message', '')}")
                raise _Failed(f"the watch ended with an error {code}: {obj.get('message', '')}")
            version = _resource_version(obj)
            if kind == "BOOKMARK":
                self._resource_version = version or self._resource_version
                continue
            if kind not in (EventType.ADDED, EventType.MODIFIED, EventType.DELETED):
                raise _Failed(f"the watch sent an event of unknown type {kind!r}")
            self._resource_version = version or self._resource_version
            delivered += 1
            self._backoff.reset()
            yield self._apply(EventType(kind), obj)
        # A stream that ends at once with nothing in it, again and again (a proxy that closes
        # every watch), must not become a busy loop: count it as a failure.
        if not delivered and self._clock.now() - started < settings.backoff_initial_s:
            raise _Failed("the watch ended at once without an event")

    def _request(self, kwargs: dict[str, Any], timeout: tuple[float, float]) -> bytes:
        response = self._open(kwargs, timeout)
        try:
            return bytes(response.data)
        except Exception as exc:
            raise self._translate(exc) from exc
        finally:
            self._release(response)

    def _stream(self, kwargs: dict[str, Any], timeout: tuple[float, float]) -> Iterator[dict[str, Any]]:
        response = self._open(kwargs, timeout)
        try:
            buffered = b""
            for chunk in response.stream(amt=None, decode_content=False):
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield _decode_event(line)
            if buffered.strip():
                yield _decode_event(buffered)
        except (_Gone, _Failed):
            raise
        except Exception as exc:
            if self._stopping.is_set():
                return
            raise self._translate(exc) from exc
        finally:
            self._release(response)

    def _open(self, kwargs: dict[str, Any], timeout: tuple[float, float]) -> Any:
        try:
            response = self._list_func(_preload_content=False, _request_timeout=timeout, **kwargs)
        except Exception as exc:
            raise self._translate(exc) from exc
        with self._lock:
            self._response = response
        if self._stopping.is_set():
            _shutdown(response)
        return response

    def _release(self, response: Any) -> None:
        with self._lock:
            if self._response is response:
                self._response = None
        response.release_conn()

    def _translate(self, exc: Exception) -> Exception:
        """A request's exception as what the loop does about it; programming errors pass through."""
        from kubernetes.client.exceptions import ApiException  # lazy: the k8s extra
        from urllib3.exceptions import HTTPError

        if isinstance(exc, ApiException):
            if exc.status == 410:
                return _Gone(f"410 Gone: {exc.reason}")
            return _Failed(f"{exc.status} {exc.reason}", _retry_after(exc))
        if isinstance(exc, (HTTPError, OSError, ValueError)):
            return _Failed(f"{type(exc).__name__}: {exc}")
        return exc


def _decode_event(line: bytes) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except ValueError as exc:
        raise _Failed(f"the watch sent a line that is not JSON: {exc}") from exc
    if not isinstance(event, dict):
        raise _Failed(f"the watch sent {type(event).__name__}, not an event object")
    return event


def _retry_after(exc: Any) -> float:
    headers = getattr(exc, "headers", None) or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return max(0.0, float(value)) if value is not None else 0.0
    except ValueError:
        return 0.0


def _shutdown(response: Any) -> None:
    # shutdown() (urllib3 >= 2.3) unblocks a read in progress on another thread; close() alone
    # does not on Linux.
    try:
        if hasattr(response, "shutdown"):
            response.shutdown()
        else:
            response.close()
    except Exception as exc:  # a response already closed or broken: nothing left to end
        log.debug("shutting down a response: %s", exc)


class Watcher:
    """Runs a `ListWatch` on a thread of its own and hands each event to `handler`.

    The handler runs on the watcher's thread, one event at a time, in order. If it raises, the
    watcher stops (a consumer that missed an event would hold a wrong view) and `error` holds the
    exception.

    Args:
        list_watch: what to watch.
        handler: called with every event.
        name: the thread's name.
    """

    def __init__(
        self, list_watch: ListWatch, handler: Callable[[WatchEvent], None], *, name: str = "kube-watch"
    ) -> None:
        self._list_watch = list_watch
        self._handler = handler
        self._synced = threading.Event()
        self._wake = threading.Event()  # synced, or ended without syncing
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name)
        self._started = False

    @property
    def list_watch(self) -> ListWatch:
        """What is watched (its `stats`, `objects()`, `resource_version`)."""
        return self._list_watch

    @property
    def error(self) -> BaseException | None:
        """What ended the watcher early (the handler's exception), None while it runs or after a clean stop."""
        return self._error

    @property
    def running(self) -> bool:
        """Whether the thread was started and has not ended."""
        return self._started and not self._done.is_set()

    def start(self) -> Watcher:
        """Start the thread; returns self."""
        self._started = True
        self._thread.start()
        return self

    def wait_synced(self, timeout_s: float) -> bool:
        """Wait until the first list has been delivered (or the watcher ended); True if it was."""
        self._wake.wait(timeout_s)
        return self._synced.is_set()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop watching and join the thread. Idempotent.

        Raises:
            TimeoutError: the thread did not end within `timeout_s` (a handler that blocks).
        """
        self._list_watch.stop()
        if self._started and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise TimeoutError(f"the watcher thread {self._thread.name} did not end within {timeout_s} s")

    def _run(self) -> None:
        try:
            for event in self._list_watch.events():
                self._handler(event)
                if event.type is EventType.SYNCED:
                    self._synced.set()
                    self._wake.set()
        except Exception as exc:
            self._error = exc
            log.exception("the handler of %s failed; the watch stops", self._thread.name)
            self._list_watch.stop()
        finally:
            self._done.set()
            self._wake.set()
