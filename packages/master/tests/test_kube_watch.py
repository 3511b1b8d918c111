"""dlrover.master.kube.watch against the test API server: list + watch, resume, relist, backoff, stop."""

# ruff: noqa: F811 (pytest fixtures imported by name are parameters of the tests)
from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from dlrover_testsupport.kube import ApiServer
from dlrover_testsupport.kube.fixtures import kube_api  # noqa: F401 (a fixture)
from dlrover_testsupport.kube.samples import pod

from dlrover.common import ConfigError, ManualClock
from dlrover.master.kube import Backoff, EventType, ListWatch, Watcher, WatchEvent, WatchSettings

kubernetes = pytest.importorskip("kubernetes")

NS = "default"
WAIT_S = 60.0


@pytest.fixture
def core(kube_api: ApiServer) -> Iterator[Any]:
    with kubernetes.client.ApiClient(kubernetes.client.Configuration(host=kube_api.url)) as api:
        yield kubernetes.client.CoreV1Api(api)


def list_pods(core: Any, **kw: Any) -> Callable[..., Any]:
    return functools.partial(core.list_namespaced_pod, NS, **kw)


class Recorder:
    """Collects a watcher's events; waits on conditions, never on time."""

    def __init__(self) -> None:
        self.events: list[WatchEvent] = []
        self._cond = threading.Condition()

    def __call__(self, event: WatchEvent) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[list[WatchEvent]], bool], what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self.events), WAIT_S):
                raise AssertionError(f"never saw {what}; saw {[(e.type, name(e)) for e in self.events]}")

    def names(self, kind: EventType) -> list[str]:
        with self._cond:
            return [name(e) for e in self.events if e.type is kind]


def name(event: WatchEvent) -> str:
    return str(event.object.get("metadata", {}).get("name", ""))


def phase_of(event: WatchEvent) -> str:
    return str(event.object.get("status", {}).get("phase", ""))


def set_phase(core: Any, pod_name: str, phase: str) -> None:
    core.patch_namespaced_pod_status(pod_name, NS, {"status": {"phase": phase}})


def fast(**kw: Any) -> WatchSettings:
    return WatchSettings(**{"backoff_initial_s": 0.01, "backoff_max_s": 0.05, **kw})


# ----------------------------------------------------------------- the pure parts


def test_backoff_grows_exponentially_up_to_its_cap_and_resets() -> None:
    backoff = Backoff(0.5, 3.0, 2.0)
    assert [backoff.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff.failures == 5
    backoff.reset()
    assert backoff.next_delay() == 0.5


def test_backoff_honours_a_server_wait_up_to_its_cap() -> None:
    backoff = Backoff(0.5, 3.0)
    assert backoff.next_delay(at_least_s=2.0) == 2.0
    assert backoff.next_delay(at_least_s=60.0) == 3.0


def test_backoff_never_overflows() -> None:
    backoff = Backoff(1.0, 5.0, 10.0)
    for _ in range(2000):
        delay = backoff.next_delay()
    assert delay == 5.0


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"watch_timeout_s": 0}, "watch_timeout_s"),
        ({"request_timeout_s": -1}, "request_timeout_s"),
        ({"backoff_initial_s": 2, "backoff_max_s": 1}, "backoff_max_s"),
        ({"backoff_multiplier": 0.5}, "backoff_multiplier"),
        ({"list_page_size": -1}, "list_page_size"),
    ],
)
def test_bad_settings_are_refused_naming_the_value(kwargs: dict[str, float], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        WatchSettings(**kwargs)


# ----------------------------------------------------------------- against the test API server


def test_lists_then_watches_every_change_in_order(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("a"))
    core.create_namespaced_pod(NS, pod("b"))
    recorder = Recorder()
    watcher = Watcher(ListWatch(list_pods(core), settings=fast()), recorder).start()
    try:
        assert watcher.wait_synced(WAIT_S)
        assert sorted(recorder.names(EventType.ADDED)) == ["a", "b"]
        core.create_namespaced_pod(NS, pod("c"))
        set_phase(core, "a", "Running")
        core.delete_namespaced_pod("b", NS)
        recorder.wait_for(lambda ev: any(e.type is EventType.DELETED for e in ev), "b deleted")
        after_sync = [(e.type, name(e)) for e in recorder.events[3:]]
        assert after_sync == [(EventType.ADDED, "c"), (EventType.MODIFIED, "a"), (EventType.DELETED, "b")]
        assert not any(e.relisted for e in recorder.events)
        assert sorted(watcher.list_watch.objects()) == ["default/a", "default/c"]
    finally:
        watcher.stop()
    assert watcher.error is None


def test_only_the_selected_objects_are_seen(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("mine", {"job": "x"}))
    core.create_namespaced_pod(NS, pod("other", {"job": "y"}))
    recorder = Recorder()
    watcher = Watcher(ListWatch(list_pods(core, label_selector="job=x"), settings=fast()), recorder).start()
    try:
        assert watcher.wait_synced(WAIT_S)
        core.create_namespaced_pod(NS, pod("mine-2", {"job": "x"}))
        core.create_namespaced_pod(NS, pod("other-2", {"job": "y"}))
        core.create_namespaced_pod(NS, pod("mine-3", {"job": "x"}))
        recorder.wait_for(lambda ev: "mine-3" in [name(e) for e in ev], "mine-3")
        assert recorder.names(EventType.ADDED) == ["mine", "mine-2", "mine-3"]
    finally:
        watcher.stop()


def test_a_list_in_pages_sees_every_object(core: Any, kube_api: ApiServer) -> None:
    for i in range(7):
        core.create_namespaced_pod(NS, pod(f"p{i}"))
    recorder = Recorder()
    watcher = Watcher(ListWatch(list_pods(core), settings=fast(list_page_size=3)), recorder).start()
    try:
        assert watcher.wait_synced(WAIT_S)
        assert sorted(recorder.names(EventType.ADDED)) == [f"p{i}" for i in range(7)]
        lists = [r for r in kube_api.requests() if r.verb == "list" and r.resource == "pods"]
        assert len(lists) == 3
    finally:
        watcher.stop()


@pytest.mark.parametrize("abrupt", [False, True])
def test_dropped_watches_resume_without_losing_an_event(core: Any, kube_api: ApiServer, abrupt: bool) -> None:
    recorder = Recorder()
    watcher = Watcher(ListWatch(list_pods(core), settings=fast()), recorder).start()
    phases = ["Pending", "Running", "Succeeded"]
    try:
        assert watcher.wait_synced(WAIT_S)
        for i in range(6):
            core.create_namespaced_pod(NS, pod(f"p{i}"))
            kube_api.faults.drop_watches(abrupt=abrupt)
            for phase in phases[1:]:
                set_phase(core, f"p{i}", phase)
                kube_api.faults.drop_watches(abrupt=abrupt)
        recorder.wait_for(lambda ev: sum(phase_of(e) == "Succeeded" for e in ev) == 6, "every pod succeeded")
        for i in range(6):
            seen = [(e.type, phase_of(e)) for e in recorder.events if name(e) == f"p{i}"]
            # Every change of every pod, once and in order: a resumed watch starts where the last ended.
            assert seen == [
                (EventType.ADDED, "Pending"),
                (EventType.MODIFIED, "Running"),
                (EventType.MODIFIED, "Succeeded"),
            ]
        stats = watcher.list_watch.stats
        assert stats.resumes >= 1
        assert stats.lists == 1
    finally:
        watcher.stop()
    assert watcher.error is None


def test_a_410_relists_and_reports_what_changed_meanwhile(core: Any, kube_api: ApiServer) -> None:
    """Changes made while no watch can be resumed (the history compacted) come out of the relist."""
    for pod_name in ("gone", "kept", "changed"):
        core.create_namespaced_pod(NS, pod(pod_name))
    raw_list = list_pods(core)
    first_watch = threading.Event()

    def list_then_change(**kw: Any) -> Any:
        if kw.get("watch") and not first_watch.is_set():
            first_watch.set()
            # While this watch is being opened: changes it would have seen, then a compaction that
            # takes away the version it starts from.
            core.delete_namespaced_pod("gone", NS)
            set_phase(core, "changed", "Running")
            core.create_namespaced_pod(NS, pod("new"))
            kube_api.faults.compact()
        return raw_list(**kw)

    events = ListWatch(list_then_change, settings=fast())
    seen: list[WatchEvent] = []
    for event in events.events():
        seen.append(event)
        if event.type is EventType.SYNCED and events.stats.lists == 2:
            events.stop()
    relisted = [(e.type, name(e)) for e in seen if e.relisted]
    assert sorted(relisted) == [(EventType.ADDED, "new"), (EventType.DELETED, "gone"), (EventType.MODIFIED, "changed")]
    assert events.stats.gone == 1
    assert events.stats.relists == 1
    assert sorted(events.objects()) == ["default/changed", "default/kept", "default/new"]


def test_an_injected_410_on_a_watch_relists_and_watches_on(core: Any, kube_api: ApiServer) -> None:
    recorder = Recorder()
    watcher = Watcher(ListWatch(list_pods(core), settings=fast()), recorder).start()
    try:
        assert watcher.wait_synced(WAIT_S)
        rule = kube_api.faults.fail_next(2, 410, when=lambda r: r.is_watch)
        kube_api.faults.drop_watches()
        core.create_namespaced_pod(NS, pod("after"))
        stats = watcher.list_watch.stats
        recorder.wait_for(lambda ev: stats.relists == 2, "two relists")
        recorder.wait_for(lambda ev: "after" in [name(e) for e in ev], "the pod created around the 410")
        assert rule.fired == 2
        assert stats.gone == 2
        # One ADDED for it however it arrived (watch or relist), never two.
        assert recorder.names(EventType.ADDED).count("after") == 1
    finally:
        watcher.stop()


def test_failed_lists_and_watches_back_off_exponentially(core: Any, kube_api: ApiServer) -> None:
    delays: list[float] = []
    events = ListWatch(
        list_pods(core),
        settings=WatchSettings(backoff_initial_s=0.5, backoff_max_s=1.5),
        clock=ManualClock(),
        sleep=delays.append,
    )
    code = 500  # 503 and 429 carry a Retry-After the client honours by itself first
    kube_api.faults.fail_next(3, code, when=lambda r: r.verb == "list")
    core.create_namespaced_pod(NS, pod("a"))
    stream = events.events()
    assert (next(stream).type, next(stream).type) == (EventType.ADDED, EventType.SYNCED)
    assert delays == [0.5, 1.0, 1.5]
    assert events.stats.failures == 3
    # Success reset the backoff: the next failures start again at the initial wait.
    kube_api.faults.fail_next(2, code, when=lambda r: r.is_watch)
    core.create_namespaced_pod(NS, pod("b"))
    event = next(stream)
    assert (event.type, name(event)) == (EventType.ADDED, "b")
    assert delays == [0.5, 1.0, 1.5, 0.5, 1.0]
    events.stop()
    assert list(stream) == []


def test_too_many_requests_is_retried(core: Any, kube_api: ApiServer) -> None:
    delays: list[float] = []
    events = ListWatch(list_pods(core), settings=fast(), clock=ManualClock(), sleep=delays.append)
    # More 429s than the client's own retries (it honours Retry-After 3 times by itself).
    rule = kube_api.faults.fail_next(6, 429, when=lambda r: r.verb == "list", retry_after_s=0)
    stream = events.events()
    assert next(stream).type is EventType.SYNCED
    assert rule.fired == 6
    assert events.stats.failures >= 1
    assert len(delays) == events.stats.failures
    events.stop()


def test_a_watch_that_ends_at_once_backs_off_instead_of_spinning(core: Any) -> None:
    delays: list[float] = []
    raw = list_pods(core)
    short = [0]

    def short_watches(**kw: Any) -> Any:
        if kw.get("watch") and short[0] < 2:
            short[0] += 1
            kw["timeout_seconds"] = 1  # the server ends it empty; by the manual clock it lasted no time
        return raw(**kw)

    def sleep(seconds: float) -> None:
        delays.append(seconds)
        if len(delays) == 2:
            core.create_namespaced_pod(NS, pod("late"))

    events = ListWatch(short_watches, settings=fast(), clock=ManualClock(), sleep=sleep)
    stream = events.events()
    assert next(stream).type is EventType.SYNCED
    event = next(stream)
    assert (event.type, name(event)) == (EventType.ADDED, "late")
    assert delays == [0.01, 0.02]
    assert events.stats.resumes == 2
    events.stop()


def test_stop_ends_a_watch_blocked_in_a_read(core: Any, kube_api: ApiServer) -> None:
    recorder = Recorder()
    watcher = Watcher(ListWatch(list_pods(core), settings=fast(watch_timeout_s=3600)), recorder).start()
    assert watcher.wait_synced(WAIT_S)
    # The watch is open and idle: stop() must end it without waiting for its hour.
    while kube_api.open_watches() == 0:
        threading.Event().wait(0.01)
    watcher.stop(timeout_s=WAIT_S)
    assert not watcher.running
    assert watcher.error is None


def test_stop_ends_a_backoff_wait(core: Any, kube_api: ApiServer) -> None:
    kube_api.faults.fail_next(1000, 500, when=lambda r: r.verb == "list")
    watcher = Watcher(
        ListWatch(list_pods(core), settings=WatchSettings(backoff_initial_s=3600, backoff_max_s=3600)), Recorder()
    )
    watcher.start()
    while watcher.list_watch.stats.failures == 0:
        threading.Event().wait(0.01)
    watcher.stop(timeout_s=WAIT_S)
    assert not watcher.running
    assert not watcher.wait_synced(0)


def test_a_failing_handler_stops_the_watcher_and_is_reported(core: Any) -> None:
    core.create_namespaced_pod(NS, pod("a"))

    def handler(event: WatchEvent) -> None:
        raise RuntimeError("handler broke")

    watcher = Watcher(ListWatch(list_pods(core), settings=fast()), handler).start()
    assert not watcher.wait_synced(WAIT_S)
    watcher.stop(timeout_s=WAIT_S)
    assert isinstance(watcher.error, RuntimeError)
    assert not watcher.running


def test_custom_objects_are_watched_too(kube_api: ApiServer) -> None:
    from dlrover_testsupport.kube import samples

    with kubernetes.client.ApiClient(kubernetes.client.Configuration(host=kube_api.url)) as api:
        kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(samples.crd())
        custom = kubernetes.client.CustomObjectsApi(api)
        crd = samples.crd()
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        version = crd["spec"]["versions"][0]["name"]
        kind = crd["spec"]["names"]["kind"]
        body = {"apiVersion": f"{group}/{version}", "kind": kind, "metadata": {"name": "one"}, "spec": {}}
        custom.create_namespaced_custom_object(group, version, NS, plural, body)
        recorder = Recorder()
        lister = functools.partial(custom.list_namespaced_custom_object, group, version, NS, plural)
        watcher = Watcher(ListWatch(lister, settings=fast()), recorder).start()
        try:
            assert watcher.wait_synced(WAIT_S)
            custom.delete_namespaced_custom_object(group, version, NS, plural, "one")
            recorder.wait_for(lambda ev: ev[-1].type is EventType.DELETED, "the custom object deleted")
            assert [(e.type, name(e)) for e in recorder.events] == [
                (EventType.ADDED, "one"),
                (EventType.SYNCED, ""),
                (EventType.DELETED, "one"),
            ]
        finally:
            watcher.stop()
