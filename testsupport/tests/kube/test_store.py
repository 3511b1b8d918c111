"""The store core on its own: object semantics, deletion and garbage collection, watch history."""

from __future__ import annotations

import random

import pytest
from dlrover_testsupport.kube import ApiError, FieldSelector, LabelSelector, ResourceType, Store
from dlrover_testsupport.kube.samples import GROUP, crd, pod

pytestmark = pytest.mark.timeout(30)


def _store(**kw: object) -> Store:
    return Store(clock=lambda: 1_000_000.0, rng=random.Random(7), **kw)  # type: ignore[arg-type]


def _rt(store: Store, plural: str, group: str = "", version: str = "v1") -> ResourceType:
    return store.resource_type(group, version, plural)


def _code(call: object) -> int:
    with pytest.raises(ApiError) as info:
        call()  # type: ignore[operator]
    return info.value.code


def test_create_fills_in_what_the_server_owns() -> None:
    store = _store()
    pods = _rt(store, "pods")
    created = store.create(pods, "default", {"metadata": {"generateName": "w-"}, "spec": {}, "status": {"x": 1}})
    meta = created["metadata"]
    assert meta["name"].startswith("w-")
    assert len(meta["name"]) == 7
    assert meta["namespace"] == "default"
    assert meta["generation"] == 1
    assert meta["creationTimestamp"] == "1970-01-12T13:46:40Z"
    assert meta["uid"]
    assert int(meta["resourceVersion"]) == store.resource_version
    assert created["status"] == {"phase": "Pending"}, "a create does not write a pod's status"
    assert (created["apiVersion"], created["kind"]) == ("v1", "Pod")
    assert _code(lambda: store.create(pods, "default", {"metadata": {"name": meta["name"]}})) == 409
    assert _code(lambda: store.create(pods, "nowhere", {"metadata": {"name": "p"}})) == 404
    assert _code(lambda: store.create(pods, "default", {"metadata": {"name": "Bad_Name"}})) == 422
    assert _code(lambda: store.create(pods, "default", {"metadata": {}})) == 422
    assert _code(lambda: store.create(pods, "default", {"kind": "Service", "metadata": {"name": "s"}})) == 400


def test_replace_needs_the_current_resource_version_and_generation_follows_the_spec() -> None:
    store = _store()
    cms = _rt(store, "configmaps")
    cm = store.create(cms, "default", {"metadata": {"name": "c"}, "data": {"a": "1"}})
    stale = dict(cm, data={"a": "2"})
    labelled = store.replace(cms, "default", "c", {**cm, "metadata": {**cm["metadata"], "labels": {"x": "y"}}})
    assert labelled["metadata"]["generation"] == 1, "a metadata change is not a spec change"
    assert _code(lambda: store.replace(cms, "default", "c", stale)) == 409
    changed = store.replace(cms, "default", "c", dict(labelled, data={"a": "3"}))
    assert changed["metadata"]["generation"] == 2
    rv = store.resource_version
    same = store.replace(cms, "default", "c", changed)
    assert same["metadata"]["resourceVersion"] == changed["metadata"]["resourceVersion"]
    assert store.resource_version == rv
    assert _code(lambda: store.replace(cms, "default", "d", changed)) == 400
    assert _code(lambda: store.replace(cms, "default", "missing", {"metadata": {}})) == 404


def test_status_writes_and_main_writes_do_not_touch_each_other() -> None:
    store = _store()
    store.create(_rt(store, "customresourcedefinitions", "apiextensions.k8s.io"), None, crd())
    widgets = _rt(store, "widgets", GROUP)
    w = store.create(widgets, "default", {"metadata": {"name": "w"}, "spec": {"n": 1}, "status": {"s": "ignored"}})
    assert "status" not in w
    after_status = store.patch(
        widgets, "default", "w", lambda o: {**o, "spec": {"n": 9}, "status": {"s": "ok"}}, status=True
    )
    assert after_status["spec"] == {"n": 1}
    assert after_status["status"] == {"s": "ok"}
    assert after_status["metadata"]["generation"] == 1
    after_main = store.patch(widgets, "default", "w", lambda o: {**o, "spec": {"n": 2}, "status": {"s": "lost"}})
    assert after_main["spec"] == {"n": 2}
    assert after_main["status"] == {"s": "ok"}
    assert after_main["metadata"]["generation"] == 2


def test_finalizers_hold_a_deleted_object_until_they_are_cleared() -> None:
    store = _store()
    cms = _rt(store, "configmaps")
    store.create(cms, "default", {"metadata": {"name": "c", "finalizers": ["x/y"]}})
    watch = store.watch(cms, "default", resource_version=str(store.resource_version))
    marked = store.delete(cms, "default", "c")
    assert marked["metadata"]["deletionTimestamp"]
    assert store.delete(cms, "default", "c") == marked, "a second delete changes nothing"
    assert _code(lambda: store.patch(cms, "default", "c", _with_finalizers("x/y", "a/b"))) == 422
    gone = store.patch(cms, "default", "c", _with_finalizers())
    assert _code(lambda: store.get(cms, "default", "c")) == 404
    events = watch.next_events(0)
    assert [(e.type, e.obj["metadata"]["resourceVersion"]) for e in events or []] == [
        ("MODIFIED", marked["metadata"]["resourceVersion"]),
        ("DELETED", gone["metadata"]["resourceVersion"]),
    ]


def _with_finalizers(*names: str) -> object:
    def apply(obj: dict[str, object]) -> dict[str, object]:
        meta = dict(obj["metadata"])  # type: ignore[call-overload]
        meta["finalizers"] = list(names)
        return {**obj, "metadata": meta}

    return apply


def _owned(name: str, owner: dict[str, object]) -> dict[str, object]:
    meta = owner["metadata"]
    ref = {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"], "uid": meta["uid"]}  # type: ignore[index]
    return {"metadata": {"name": name, "ownerReferences": [ref]}}


def test_deleting_an_owner_collects_its_dependents_unless_orphaned() -> None:
    store = _store()
    store.create(_rt(store, "customresourcedefinitions", "apiextensions.k8s.io"), None, crd())
    widgets, pods, secrets = _rt(store, "widgets", GROUP), _rt(store, "pods"), _rt(store, "secrets")
    job = store.create(widgets, "default", {"metadata": {"name": "job"}})
    master = store.create(pods, "default", _owned("master", job))
    store.create(secrets, "default", _owned("token", job))
    store.create(pods, "default", _owned("grandchild", master))
    other = store.create(widgets, "default", {"metadata": {"name": "other"}})
    two_owners = _owned("shared", job)
    two_owners["metadata"]["ownerReferences"].append(_owned("x", other)["metadata"]["ownerReferences"][0])  # type: ignore[index]
    store.create(secrets, "default", two_owners)
    store.delete(widgets, "default", "job")
    assert [p["metadata"]["name"] for p in store.list(pods, "default")[0]] == []
    assert [s["metadata"]["name"] for s in store.list(secrets, "default")[0]] == ["shared"]

    kept = store.create(widgets, "default", {"metadata": {"name": "kept"}})
    store.create(pods, "default", _owned("orphan", kept))
    store.delete(widgets, "default", "kept", propagation="Orphan")
    orphan = store.get(pods, "default", "orphan")
    assert "ownerReferences" not in orphan["metadata"]

    parent = store.create(widgets, "default", {"metadata": {"name": "parent"}})
    store.create(pods, "default", _owned("child", parent))
    history_from = store.resource_version
    store.delete(widgets, "default", "parent", propagation="Foreground")
    order = [(e.type, e.obj["metadata"]["name"]) for e in store.history() if e.resource_version > history_from]
    assert order == [("DELETED", "child"), ("DELETED", "parent")]


def test_deleting_a_namespace_deletes_what_is_in_it() -> None:
    store = _store()
    namespaces, pods = _rt(store, "namespaces"), _rt(store, "pods")
    store.create(namespaces, None, {"metadata": {"name": "job"}})
    store.create(pods, "job", pod("a"))
    store.create(pods, "job", {**pod("b"), "metadata": {"name": "b", "finalizers": ["hold"]}})
    store.delete(namespaces, None, "job")
    assert store.get(namespaces, None, "job")["status"]["phase"] == "Terminating"
    assert _code(lambda: store.create(pods, "job", pod("c"))) == 403
    assert [p["metadata"]["name"] for p in store.list(pods, "job")[0]] == ["b"]
    store.patch(pods, "job", "b", _with_finalizers())
    assert _code(lambda: store.get(namespaces, None, "job")) == 404


def test_a_crd_serves_its_resource_until_it_is_deleted() -> None:
    store = _store()
    crds = _rt(store, "customresourcedefinitions", "apiextensions.k8s.io")
    assert _code(lambda: _rt(store, "widgets", GROUP)) == 404
    created = store.create(crds, None, crd())
    assert {c["type"] for c in created["status"]["conditions"]} == {"Established", "NamesAccepted"}
    widgets = _rt(store, "widgets", GROUP)
    assert widgets.has_status
    assert widgets.namespaced
    assert not widgets.supports_strategic_merge
    store.create(widgets, "default", {"metadata": {"name": "w"}})
    store.delete(crds, None, f"widgets.{GROUP}")
    assert _code(lambda: _rt(store, "widgets", GROUP)) == 404
    broken = crd()
    broken["spec"]["names"].pop("plural")
    assert _code(lambda: store.create(crds, None, broken)) == 422


def test_a_watch_replays_from_its_version_and_gets_gone_after_compaction() -> None:
    store = _store()
    pods = _rt(store, "pods")
    store.create(pods, "default", pod("a", {"role": "worker"}))
    start = store.resource_version
    store.create(pods, "default", pod("b", {"role": "worker"}))
    store.patch(pods, "default", "a", lambda o: {**o, "spec": {**o["spec"], "nodeName": "n1"}})
    store.delete(pods, "default", "b")
    watch = store.watch(pods, "default", LabelSelector.parse("role=worker"), resource_version=str(start))
    assert [(e.type, e.obj["metadata"]["name"]) for e in watch.next_events(0) or []] == [
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]
    assert watch.next_events(0) == []
    listing = store.watch(pods, None, resource_version="0")
    assert [(e.type, e.obj["metadata"]["name"]) for e in listing.next_events(0) or []] == [("ADDED", "a")]
    unscheduled = store.watch(
        pods,
        "default",
        fields=FieldSelector.parse("spec.nodeName=", pods.field_selectable),
        resource_version=str(start),
    )
    assert [(e.type, e.obj["metadata"]["name"]) for e in unscheduled.next_events(0) or []] == [
        ("ADDED", "b"),
        ("DELETED", "a"),
        ("DELETED", "b"),
    ], "an object that leaves a watch's selection is DELETED for that watch"
    behind = store.watch(pods, "default", resource_version=str(start))
    store.compact()
    assert _code(lambda: behind.next_events(0)) == 410
    assert _code(lambda: store.watch(pods, "default", resource_version=str(start))) == 410
    assert _code(lambda: store.watch(pods, "default", resource_version="abc")) == 400
    current = store.watch(pods, "default", resource_version=str(store.resource_version))
    current.stop()
    assert current.next_events(1) is None


def test_history_is_compacted_past_its_limit() -> None:
    store = _store(history_limit=5)
    cms = _rt(store, "configmaps")
    for n in range(10):
        store.create(cms, "default", {"metadata": {"name": f"c{n}"}})
    assert len(store.history()) == 5
    assert store.compacted_resource_version == store.history()[0].resource_version - 1


def test_graceful_pod_deletion_waits_for_a_kubelet() -> None:
    store = _store(graceful_pod_deletion=True)
    pods = _rt(store, "pods")
    store.create(pods, "default", pod("scheduled", nodeName="n1", terminationGracePeriodSeconds=5))
    store.create(pods, "default", pod("unscheduled"))
    marked = store.delete(pods, "default", "scheduled")
    assert marked["metadata"]["deletionGracePeriodSeconds"] == 5
    assert marked["metadata"]["deletionTimestamp"] == "1970-01-12T13:46:45Z"
    store.delete(pods, "default", "scheduled", grace_period_s=0)
    store.delete(pods, "default", "unscheduled")
    assert store.list(pods, "default")[0] == []


def test_lists_page_with_limit_and_continue() -> None:
    store = _store()
    cms = _rt(store, "configmaps")
    for n in range(5):
        store.create(cms, "default", {"metadata": {"name": f"c{n}", "labels": {"odd": str(n % 2)}}})
    names: list[str] = []
    token: str | None = None
    while True:
        items, _, token = store.list(cms, "default", LabelSelector.parse("odd=0"), limit=2, continue_token=token)
        names += [i["metadata"]["name"] for i in items]
        if token is None:
            break
    assert names == ["c0", "c2", "c4"]
    assert _code(lambda: store.list(cms, "default", continue_token="%%%")) == 400
