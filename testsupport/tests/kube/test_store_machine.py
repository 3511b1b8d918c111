"""The store as a state machine, checked against a trivially correct model.

Proven: resourceVersions strictly increase; a watch from any retained version sees every later
event, in order, and one from a compacted version (or one left behind by compaction) gets 410;
finalizers hold a deleted object (deletionTimestamp) until cleared, and no finalizer can be added
meanwhile; generation moves only when the spec changes; status and main writes are isolated.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from typing import Any

import pytest
from dlrover_testsupport.kube import ApiError, Store, Watch
from dlrover_testsupport.kube.samples import GROUP, crd
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

NAMES = st.sampled_from(["a", "b", "c"])
VALUES = st.integers(0, 2)
FINALIZERS = st.sampled_from(["x.io/one", "x.io/two"])


@dataclasses.dataclass
class Modelled:
    spec: int
    status: int | None = None
    generation: int = 1
    finalizers: list[str] = dataclasses.field(default_factory=list)
    deleting: bool = False


@dataclasses.dataclass
class OpenWatch:
    watch: Watch
    position: int  # the resourceVersion of the last event it delivered (or where it started)
    seen: list[tuple[int, str, str]] = dataclasses.field(default_factory=list)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = Store(clock=lambda: 0.0, rng=random.Random(0), history_limit=1_000_000)
        self.model: dict[str, Modelled] = {}
        self.log: list[tuple[int, str, str]] = []  # (resourceVersion, type, name) of every event
        self.watches: list[OpenWatch] = []
        self.last_rv = 0

    @initialize()
    def define_the_resource(self) -> None:
        crds = self.store.resource_type("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        self.store.create(crds, None, crd())
        self.rt = self.store.resource_type(GROUP, "v1", "widgets")
        self.start_rv = self.store.resource_version
        self.last_rv = self.start_rv

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        assert rv > self.last_rv, "resourceVersions strictly increase"
        self.last_rv = rv
        self.log.append((rv, kind, obj["metadata"]["name"]))

    def _no_event(self) -> None:
        assert self.store.resource_version == self.last_rv, "a write that changes nothing emits nothing"

    def _expect_error(self, code: int, call: Any) -> None:
        with pytest.raises(ApiError) as info:
            call()
        assert info.value.code == code
        self._no_event()

    @rule(name=NAMES, spec=VALUES)
    def create(self, name: str, spec: int) -> None:
        body = {"metadata": {"name": name}, "spec": {"v": spec}, "status": {"v": 99}}
        if name in self.model:
            self._expect_error(409, lambda: self.store.create(self.rt, "default", body))
            return
        obj = self.store.create(self.rt, "default", body)
        assert "status" not in obj
        assert obj["metadata"]["generation"] == 1
        self.model[name] = Modelled(spec)
        self._event("ADDED", obj)

    def _patch(self, name: str, change: Any, *, status: bool = False) -> dict[str, Any]:
        def apply(obj: dict[str, Any]) -> dict[str, Any]:
            new = copy.deepcopy(obj)
            change(new)
            return new

        return self.store.patch(self.rt, "default", name, apply, status=status)

    def _changed(self, name: str, before: int, obj: dict[str, Any]) -> None:
        if self.store.resource_version == before:
            self._no_event()
        else:
            self._event("MODIFIED", obj)

    @rule(name=NAMES, spec=VALUES, status=VALUES)
    def write_the_spec_with_a_status(self, name: str, spec: int, status: int) -> None:
        if name not in self.model:
            self._expect_error(404, lambda: self._patch(name, lambda o: None))
            return
        before = self.store.resource_version

        def change(o: dict[str, Any]) -> None:
            o["spec"] = {"v": spec}
            o["status"] = {"v": status}

        obj = self._patch(name, change)
        model = self.model[name]
        if spec != model.spec:
            model.generation += 1
        model.spec = spec
        self._changed(name, before, obj)

    @rule(name=NAMES, spec=VALUES, status=VALUES)
    def write_the_status_with_a_spec(self, name: str, spec: int, status: int) -> None:
        if name not in self.model:
            return
        before = self.store.resource_version

        def change(o: dict[str, Any]) -> None:
            o["spec"] = {"v": spec}
            o["status"] = {"v": status}
            o["metadata"]["labels"] = {"ignored": "yes"}

        obj = self._patch(name, change, status=True)
        self.model[name].status = status
        self._changed(name, before, obj)

    @rule(name=NAMES)
    def replace_with_a_stale_version(self, name: str) -> None:
        if name not in self.model:
            return
        body = {"metadata": {"name": name, "resourceVersion": "1"}, "spec": {"v": 100}}
        self._expect_error(409, lambda: self.store.replace(self.rt, "default", name, body))

    @rule(name=NAMES, finalizer=FINALIZERS)
    def add_a_finalizer(self, name: str, finalizer: str) -> None:
        model = self.model.get(name)
        if model is None:
            return

        def change(o: dict[str, Any]) -> None:
            o["metadata"]["finalizers"] = [*(o["metadata"].get("finalizers") or []), finalizer]

        if model.deleting and finalizer not in model.finalizers:
            self._expect_error(422, lambda: self._patch(name, change))
            return
        before = self.store.resource_version
        obj = self._patch(name, change)
        model.finalizers.append(finalizer)  # a duplicate entry is kept, as a real server keeps it
        self._changed(name, before, obj)

    @rule(name=NAMES)
    def clear_the_finalizers(self, name: str) -> None:
        model = self.model.get(name)
        if model is None:
            return
        before = self.store.resource_version
        obj = self._patch(name, lambda o: o["metadata"].pop("finalizers", None))
        had = bool(model.finalizers)
        model.finalizers = []
        if model.deleting:
            del self.model[name]
            self._event("DELETED", obj)
        elif had:
            self._event("MODIFIED", obj)
        else:
            assert self.store.resource_version == before
            self._no_event()

    @rule(name=NAMES)
    def delete(self, name: str) -> None:
        model = self.model.get(name)
        if model is None:
            self._expect_error(404, lambda: self.store.delete(self.rt, "default", name))
            return
        obj = self.store.delete(self.rt, "default", name)
        if model.finalizers:
            assert obj["metadata"]["deletionTimestamp"]
            if model.deleting:
                self._no_event()
            else:
                model.deleting = True
                self._event("MODIFIED", obj)
        else:
            del self.model[name]
            self._event("DELETED", obj)

    @rule()
    def compact(self) -> None:
        self.store.compact()

    @rule(data=st.data())
    def open_a_watch(self, data: st.DataObject) -> None:
        start = data.draw(st.integers(self.start_rv, self.store.resource_version), label="from")
        if start < self.store.compacted_resource_version:
            with pytest.raises(ApiError) as info:
                self.store.watch(self.rt, "default", resource_version=str(start))
            assert info.value.code == 410
            return
        self.watches.append(OpenWatch(self.store.watch(self.rt, "default", resource_version=str(start)), start))

    @precondition(lambda self: self.watches)
    @rule(data=st.data())
    def drain_a_watch(self, data: st.DataObject) -> None:
        open_watch = data.draw(st.sampled_from(self.watches), label="watch")
        needed = [e for e in self.log if e[0] > open_watch.position]
        if needed and needed[0][0] <= self.store.compacted_resource_version:
            with pytest.raises(ApiError) as info:
                open_watch.watch.next_events(0)
            assert info.value.code == 410
            self.watches.remove(open_watch)
            return
        events = open_watch.watch.next_events(0) or []
        got = [(int(e.obj["metadata"]["resourceVersion"]), e.type, e.obj["metadata"]["name"]) for e in events]
        assert got == needed, "a watch sees every later event, in order"
        open_watch.seen += got
        if got:
            open_watch.position = got[-1][0]

    @invariant()
    def objects_match_the_model(self) -> None:
        if not hasattr(self, "rt"):
            return
        items, _, _ = self.store.list(self.rt, "default")
        assert sorted(i["metadata"]["name"] for i in items) == sorted(self.model)
        for item in items:
            model = self.model[item["metadata"]["name"]]
            assert item["spec"] == {"v": model.spec}
            assert item.get("status") == (None if model.status is None else {"v": model.status})
            assert item["metadata"]["generation"] == model.generation
            assert item["metadata"].get("finalizers", []) == model.finalizers
            assert bool(item["metadata"].get("deletionTimestamp")) == model.deleting
            assert "labels" not in item["metadata"], "a status write changes nothing but the status"


TestStoreMachine = pytest.mark.timeout(120)(StoreMachine.TestCase)
