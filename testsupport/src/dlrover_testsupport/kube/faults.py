"""Faults the test API server injects on request: errors, latency, dropped watches, compaction."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

__all__ = ["ApiRequest", "FaultRule", "Faults"]


@dataclasses.dataclass
class ApiRequest:
    """One request as the server understood it; `code` is the HTTP status it answered.

    `verb` is the RBAC verb (get, list, watch, create, update, patch, delete, deletecollection)
    for resource requests, and "" for discovery and other non-resource paths.
    """

    method: str
    path: str
    query: dict[str, list[str]]
    verb: str = ""
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    user_agent: str = ""
    code: int = 0
    user: str = ""  # the bearer token it carried (the test kubelet's pods: serviceaccount:<ns>:<name>)

    @property
    def is_watch(self) -> bool:
        return self.verb == "watch"

    @property
    def rbac_resource(self) -> str:
        """The resource as a Role names it: `pods`, or `pods/status` for a subresource."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


Predicate = Callable[[ApiRequest], bool]


@dataclasses.dataclass
class FaultRule:
    """An injected fault. `remaining` is None for a rule that holds until removed."""

    when: Predicate
    code: int = 0
    latency_s: float = 0.0
    remaining: int | None = None
    retry_after_s: int = 1
    fired: int = 0
    message: str = ""  # the Status message answered ("" for "injected fault: <code>")


def _any(_: ApiRequest) -> bool:
    return True


class Faults:
    """The fault injection API of one server (Python, not HTTP).

    Args:
        drop_watches: ends every open watch (`abrupt`: cut the connection mid-stream).
        compact: compacts the store's history, returning the compaction point.
    """

    def __init__(self, drop_watches: Callable[[bool], int], compact: Callable[[int | None], int]) -> None:
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []
        self._drop_watches = drop_watches
        self._compact = compact

    def fail_next(
        self, count: int, code: int = 500, *, when: Predicate | None = None, retry_after_s: int = 1, message: str = ""
    ) -> FaultRule:
        """Answer the next `count` requests that match `when` with `code` (500, 503, 429 with
        Retry-After, 410: a watch gets an ERROR event with a 410 Status, other requests a 410; 403
        and 422 as admission answers them, e.g. with a ResourceQuota's `message`)."""
        if count < 1:
            raise ValueError(f"count must be at least 1, not {count}")
        if not 400 <= code <= 599:
            raise ValueError(f"code must be an HTTP error status, not {code}")
        rule = FaultRule(when or _any, code=code, remaining=count, retry_after_s=retry_after_s, message=message)
        with self._lock:
            self._rules.append(rule)
        return rule

    def add_latency(self, seconds: float, *, when: Predicate | None = None) -> FaultRule:
        """Delay every matching request by `seconds` until the rule is removed."""
        if seconds < 0:
            raise ValueError(f"latency must not be negative, not {seconds}")
        rule = FaultRule(when or _any, latency_s=seconds)
        with self._lock:
            self._rules.append(rule)
        return rule

    def remove(self, rule: FaultRule) -> None:
        with self._lock:
            if rule in self._rules:
                self._rules.remove(rule)

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def drop_watches(self, *, abrupt: bool = False) -> int:
        """End every open watch; returns how many. A clean end (the last chunk sent) is what a
        watch timeout looks like; an abrupt one breaks the connection mid-stream."""
        return self._drop_watches(abrupt)

    def compact(self, resource_version: int | None = None) -> int:
        """Compact the history (default: all of it); watches that need older events get 410."""
        return self._compact(resource_version)

    def decide(self, request: ApiRequest) -> tuple[float, FaultRule | None]:
        """The latency to add to `request` and the failure rule it triggers, if any."""
        latency = 0.0
        failing: FaultRule | None = None
        with self._lock:
            for rule in list(self._rules):
                if not rule.when(request):
                    continue
                if rule.latency_s:
                    latency += rule.latency_s
                    rule.fired += 1
                elif failing is None and rule.remaining:
                    rule.remaining -= 1
                    rule.fired += 1
                    failing = rule
                    if rule.remaining == 0:
                        self._rules.remove(rule)
        return latency, failing
