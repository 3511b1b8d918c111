"""The three patch formats, against the RFCs' own examples and the simplified strategic merge."""

from __future__ import annotations

import pytest
from dlrover_testsupport.kube import PatchConflict, PatchError, json_merge_patch, json_patch, strategic_merge_patch

pytestmark = pytest.mark.timeout(30)


def test_merge_patch_follows_rfc_7386() -> None:
    target = {"title": "Goodbye!", "author": {"givenName": "John", "familyName": "Doe"}, "tags": ["a", "b"]}
    patch = {"title": "Hello!", "phoneNumber": "+01", "author": {"familyName": None}, "tags": ["example"]}
    assert json_merge_patch(target, patch) == {
        "title": "Hello!",
        "author": {"givenName": "John"},
        "tags": ["example"],
        "phoneNumber": "+01",
    }
    assert target["author"] == {"givenName": "John", "familyName": "Doe"}, "the target is not changed"
    assert json_merge_patch({"a": "b"}, ["c"]) == ["c"]


def test_json_patch_applies_every_operation() -> None:
    doc = {"metadata": {"finalizers": ["a"]}, "spec": {"x": 1, "y": [1, 2]}}
    ops = [
        {"op": "test", "path": "/spec/x", "value": 1},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "b"},
        {"op": "replace", "path": "/spec/x", "value": 2},
        {"op": "remove", "path": "/spec/y/0"},
        {"op": "copy", "from": "/spec/x", "path": "/spec/z"},
        {"op": "move", "from": "/spec/z", "path": "/spec/w"},
        {"op": "add", "path": "/metadata/labels", "value": {"a/b": "c"}},
        {"op": "add", "path": "/metadata/labels/a~1c", "value": "d"},
    ]
    assert json_patch(doc, ops) == {
        "metadata": {"finalizers": ["a", "b"], "labels": {"a/b": "c", "a/c": "d"}},
        "spec": {"x": 2, "y": [2], "w": 2},
    }
    assert doc["spec"] == {"x": 1, "y": [1, 2]}, "the document is not changed"


def test_a_failed_json_patch_test_is_a_conflict_and_a_malformed_patch_an_error() -> None:
    with pytest.raises(PatchConflict, match="testing value"):
        json_patch(
            {"metadata": {"resourceVersion": "5"}}, [{"op": "test", "path": "/metadata/resourceVersion", "value": "4"}]
        )
    with pytest.raises(PatchConflict):
        json_patch({"a": 1}, [{"op": "remove", "path": "/b"}])
    with pytest.raises(PatchConflict):
        json_patch({"a": [1]}, [{"op": "replace", "path": "/a/3", "value": 1}])
    with pytest.raises(PatchError):
        json_patch({}, {"op": "add"})
    with pytest.raises(PatchError):
        json_patch({}, [{"op": "frobnicate", "path": "/a"}])
    with pytest.raises(PatchError):
        json_patch({}, [{"op": "add", "path": "a", "value": 1}])


def test_strategic_merge_merges_keyed_lists_and_follows_directives() -> None:
    pod = {
        "metadata": {"finalizers": ["a"], "labels": {"x": "1"}},
        "spec": {
            "containers": [
                {"name": "main", "image": "v1", "env": [{"name": "A", "value": "1"}]},
                {"name": "side", "image": "s1"},
            ],
            "tolerations": [{"key": "t"}],
        },
    }
    patch = {
        "metadata": {"finalizers": ["b", "a"], "labels": {"x": None, "y": "2"}},
        "spec": {
            "$setElementOrder/containers": [{"name": "main"}, {"name": "side"}],
            "containers": [
                {"name": "main", "env": [{"name": "B", "value": "2"}]},
                {"name": "side", "$patch": "delete"},
                {"name": "new", "image": "n1"},
            ],
            "tolerations": [{"key": "u"}],
        },
    }
    assert strategic_merge_patch(pod, patch) == {
        "metadata": {"finalizers": ["a", "b"], "labels": {"y": "2"}},
        "spec": {
            "containers": [
                {"name": "main", "image": "v1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
                {"name": "new", "image": "n1"},
            ],
            "tolerations": [{"key": "u"}],
        },
    }
    removed = strategic_merge_patch(pod, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}})
    assert removed["metadata"]["finalizers"] == []
    replaced = strategic_merge_patch(pod, {"spec": {"$patch": "replace", "containers": []}})
    assert replaced["spec"] == {"containers": []}
    service = {"spec": {"ports": [{"port": 80, "name": "http"}]}}
    merged = strategic_merge_patch(service, {"spec": {"ports": [{"port": 443, "name": "https"}]}})
    assert [p["port"] for p in merged["spec"]["ports"]] == [80, 443]
    with pytest.raises(PatchError):
        strategic_merge_patch(pod, {"spec": {"containers": [{"image": "no name"}]}})
