"""An in-process informer on the test API server's store: list, then watch from the list's
version, relisting after a 410 (the history was compacted past it), on a thread of its own."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .errors import ApiError
from .store import Store, Watch, WatchEvent

__all__ = ["Informer"]


class Informer:
    """Feeds `deliver` ("relist", objects) after each list and ("events", [WatchEvent]) as they
    come, for one core/v1 resource across namespaces, until `stop`.

    Args:
        store: the store to watch.
        plural: the core/v1 resource ("pods", "nodes", ...).
        deliver: called on the informer's thread with (kind, payload).
        wait_s: how long one wait for events lasts (the watch is stopped directly by `stop`).
    """

    def __init__(self, store: Store, plural: str, deliver: Callable[[str, Any], None], *, wait_s: float = 30.0) -> None:
        self._store = store
        self._rt = store.resource_type("", "v1", plural)
        self._deliver = deliver
        self._wait_s = wait_s
        self._lock = threading.Lock()
        self._watch: Watch | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"kubelet-watch-{plural}")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the watch and join the thread."""
        with self._lock:
            self._stopping = True
            watch = self._watch
        if watch is not None:
            watch.stop()
        self._thread.join()

    def _run(self) -> None:
        while True:
            items, rv, _ = self._store.list(self._rt, None)
            self._deliver("relist", items)
            try:
                watch = self._store.watch(self._rt, None, resource_version=rv)
            except ApiError as e:
                if e.code == 410:
                    continue
                raise
            with self._lock:
                if self._stopping:
                    watch.stop()
                    return
                self._watch = watch
            if not self._follow(watch):
                return

    def _follow(self, watch: Watch) -> bool:
        """Deliver the watch's events; True when it must relist, False when it was stopped."""
        while True:
            try:
                events: list[WatchEvent] | None = watch.next_events(self._wait_s)
            except ApiError as e:
                if e.code != 410:
                    raise
                return True
            if events is None:
                return False  # stopped, or the store was closed
            if events:
                self._deliver("events", events)
