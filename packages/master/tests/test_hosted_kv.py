"""The rendezvous key-value store hosted by the master is journaled and restored (the `rendezvous_kv` blob)."""

from __future__ import annotations

import json
from typing import NoReturn

import pytest

from dlrover.common import ManualClock
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.hosting import KV_STATE_FORMAT, HostedRendezvous
from dlrover.master.journal import JournalError, MemoryJournal
from dlrover.master.master import Master
from dlrover.master.scheduler.fake import FakeScheduler
from dlrover.rendezvous import KeyValueStore, KvLimits, RendezvousManager
from dlrover.rendezvous.v1 import rendezvous_pb2 as rpb

KEY = "dlrover/launcher/round/1/store_addr"


class Context:
    """Enough of a servicer context for calls that succeed."""

    def abort(self, code: object, message: str) -> NoReturn:
        raise AssertionError(f"aborted {code}: {message}")


def config() -> MasterConfig:
    return MasterConfig(
        job_name="kv",
        lifecycle=LifecycleConfig(nodes=NodeRange(1, 2)),
        heartbeat_interval_s=1.0,
        state_export_interval_s=5.0,
    )


def job(journal: MemoryJournal, clock: ManualClock, kv: KeyValueStore | None = None) -> tuple[Master, HostedRendezvous]:
    cfg = config()
    rendezvous = HostedRendezvous(RendezvousManager(cfg.rendezvous_config()), clock, kv)
    collaborators = [rendezvous, rendezvous.kv_state]
    master = Master(cfg, FakeScheduler(), journal, clock, collaborators=collaborators, membership=[rendezvous])
    rendezvous.attach(master)
    master.start()
    return master, rendezvous


def kv_set(rendezvous: HostedRendezvous, key: str, value: bytes) -> None:
    rendezvous.servicer.KvSet(rpb.KvSetRequest(keys=[key], values=[value]), Context())  # type: ignore[arg-type]


def kv_get(rendezvous: HostedRendezvous, key: str) -> bytes | None:
    reply = rendezvous.servicer.KvGet(rpb.KvGetRequest(keys=[key]), Context())  # type: ignore[arg-type]
    return reply.values[0] if reply.found[0] else None


def test_the_store_is_journaled_on_the_export_cadence_and_restored_by_a_restarted_master() -> None:
    journal, clock = MemoryJournal(), ManualClock()
    master, rendezvous = job(journal, clock)
    kv_set(rendezvous, KEY, b"10.0.0.1:29500")
    kv_set(rendezvous, "binary", bytes(range(256)))
    assert journal.blob("rendezvous_kv") is None or KEY not in journal.blob("rendezvous_kv").data  # type: ignore[union-attr]
    clock.advance(5.0)
    master.tick()  # the export cadence
    blob = journal.blob("rendezvous_kv")
    assert blob is not None
    assert json.loads(blob.data)["format"] == KV_STATE_FORMAT
    # A restarted master (SIGKILLed: nothing flushed) serves what the journal holds.
    _, resumed = job(journal, ManualClock())
    assert kv_get(resumed, KEY) == b"10.0.0.1:29500"
    assert kv_get(resumed, "binary") == bytes(range(256))


def test_an_idle_store_is_not_exported_again_and_a_write_is() -> None:
    journal, clock = MemoryJournal(), ManualClock()
    _, rendezvous = job(journal, clock)
    state = rendezvous.kv_state
    first = state.export_state()
    assert state.export_state() == first
    kv_set(rendezvous, "a", b"1")
    second = state.export_state()
    assert second[0] > first[0]
    kv_set(rendezvous, "a", b"1")  # a write that changes nothing keeps the version
    assert state.export_state()[0] == second[0]


def test_flush_at_shutdown_journals_the_latest_writes() -> None:
    journal, clock = MemoryJournal(), ManualClock()
    master, rendezvous = job(journal, clock)
    kv_set(rendezvous, KEY, b"x")
    master.flush_state()
    _, resumed = job(journal, ManualClock())
    assert kv_get(resumed, KEY) == b"x"


def test_a_corrupt_or_oversized_blob_is_refused_and_changes_nothing() -> None:
    journal, clock = MemoryJournal(), ManualClock()
    master, rendezvous = job(journal, clock)
    kv_set(rendezvous, "big", b"y" * 100)
    master.flush_state()
    small = KeyValueStore(KvLimits(max_total_bytes=50))
    small.set("keep", b"1")
    target = HostedRendezvous(RendezvousManager(config().rendezvous_config()), clock, small)
    blob = journal.blob("rendezvous_kv")
    assert blob is not None
    with pytest.raises(JournalError, match="max_total_bytes=50"):
        target.kv_state.import_state(blob.version, blob.data)
    for bad in (
        "not json",
        '{"format": "other", "version": 1, "items": {}}',
        json.dumps({"format": KV_STATE_FORMAT, "version": 1, "items": {"k": "@@not base64@@"}}),
    ):
        with pytest.raises(JournalError, match="key-value store state"):
            target.kv_state.import_state(1, bad)
    assert small.items() == {"keep": b"1"}
