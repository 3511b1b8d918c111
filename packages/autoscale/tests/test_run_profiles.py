"""Run profiles in the profile store: round trips, similarity, plans, and stores that cannot be read set aside."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import attrs
import pytest

from dlrover.autoscale import (
    SCHEMA_VERSION,
    CorruptProfileStoreError,
    JobFeatures,
    JobOutcome,
    JobProfileStore,
    JobSignature,
    NewerProfileStoreError,
    ProfileStoreError,
    Resources,
    RunPlanConfig,
    RunProfile,
    add_run,
    is_corruption,
    most_similar,
    open_or_set_aside,
    plan_from_runs,
    read_runs,
)
from dlrover.common import ConfigError

pytestmark = pytest.mark.timeout(60)


def profile(name: str = "", script: str = "", kind: str = "", **kw: object) -> RunProfile:
    fields: dict[str, object] = {
        "outcome": "succeeded",
        "node_resources": Resources(cpu=1, memory_mb=900),
        "min_nodes": 1,
        "max_nodes": 4,
        "final_nodes": 2,
        "throughput": ((1, 100.0), (2, 190.0), (3, 150.0)),
        "peak_memory_mb": ((0, 512.5), (1, 600.0)),
        "finished_at": 1000.0,
    }
    fields.update(kw)
    return RunProfile(JobSignature(job_name=name, script=script, job_kind=kind), **fields)  # type: ignore[arg-type]


def test_a_profile_round_trips_through_a_real_store(tmp_path: Path) -> None:
    original = profile(
        "nightly", "/w/train.py", "gpt", parameter_count=10, state_bytes=40, checkpoint_bytes=400,
        checkpoint_note="from the checkpoint", peak_gpu_memory_mb=((0, 70.0),),
    )  # fmt: skip
    with JobProfileStore(str(tmp_path / "p.sqlite")) as store:
        pid = add_run(store, original)
    with JobProfileStore(str(tmp_path / "p.sqlite")) as store:
        (back,), bad = read_runs(store)
    assert bad == []
    assert back == attrs.evolve(original, profile_id=pid)
    assert back.best_node_count() == 2  # the most samples/s


def test_without_throughput_the_final_size_within_the_range_is_planned() -> None:
    assert profile(throughput=(), final_nodes=3).best_node_count() == 3
    assert profile(throughput=(), final_nodes=0).best_node_count() == 1


def test_similarity_kind_filters_then_script_beats_name_then_the_newest_wins() -> None:
    by_name = profile("nightly", "/other.py", finished_at=5.0, profile_id=1)
    by_script = profile("other", "/w/train.py", finished_at=1.0, profile_id=2)
    by_both_old = profile("nightly", "/w/train.py", finished_at=2.0, profile_id=3)
    by_both_new = profile("nightly", "/w/train.py", finished_at=3.0, profile_id=4)
    kinded = profile("nightly", "/w/train.py", "gpt", finished_at=0.5, profile_id=5)
    runs = [by_name, by_script, by_both_old, by_both_new, kinded]
    chosen = most_similar(runs, JobSignature("nightly", "/w/train.py"))
    assert chosen is not None
    assert chosen[0].profile_id == 4
    assert chosen[1] == "same script '/w/train.py', same name 'nightly'"
    assert most_similar([by_name, by_script], JobSignature("nightly", "/w/train.py"))[0].profile_id == 2  # type: ignore[index]
    # A kind limits the candidates to that kind, however close the others are.
    chosen = most_similar(runs, JobSignature("nightly", "/w/train.py", "gpt"))
    assert chosen is not None
    assert chosen[0].profile_id == 5
    assert most_similar(runs, JobSignature("nightly", "/w/train.py", "bert")) is None
    # Nothing shared: not similar.
    assert most_similar(runs, JobSignature("x", "/y.py")) is None
    assert most_similar(runs, JobSignature()) is None


def test_a_plan_from_a_profile_and_from_the_defaults() -> None:
    run = profile("nightly", "/w/train.py", profile_id=7, node_resources=Resources(cpu=2, memory_mb=2048, gpu=1))
    plan = plan_from_runs([run], JobSignature("nightly"), RunPlanConfig())
    assert (plan.source, plan.nodes, plan.min_nodes, plan.resources) == ("profile", 2, 1, run.node_resources)
    assert plan.reason.startswith("from profile 7 of job 'nightly' (same name 'nightly'; it succeeded): 2 node(s)")
    assert "190 samples/s measured at that size" in plan.reason
    capped = plan_from_runs([run], JobSignature("nightly"), RunPlanConfig(max_nodes=1))
    assert capped.nodes == 1
    default = plan_from_runs([run], JobSignature("other"), RunPlanConfig(default_nodes=2), notes=("a note",))
    assert (default.source, default.nodes, default.resources) == ("defaults", 2, None)
    assert default.reason == (
        "no earlier job is similar to name 'other': starting from the defaults, 2 node(s) of nothing asked; a note"
    )


def test_invalid_profiles_are_refused_naming_the_value() -> None:
    with pytest.raises(ConfigError, match="min 3, max 2"):
        profile(min_nodes=3, max_nodes=2)
    with pytest.raises(ConfigError, match=r"\(2 nodes, nan samples/s\)"):
        profile(throughput=((2, float("nan")),))


def test_an_unreadable_row_is_skipped_with_its_id(tmp_path: Path) -> None:
    path = str(tmp_path / "p.sqlite")
    with JobProfileStore(path) as store:
        add_run(store, profile("a"))
        bad_id = add_run(store, profile("b"))
        store.connection.execute("UPDATE run_profiles SET profile_json = '{not json' WHERE id = ?", (bad_id,))
        store.connection.commit()
        runs, bad = read_runs(store)
    assert [r.signature.job_name for r in runs] == ["a"]
    assert len(bad) == 1
    assert bad[0].startswith(f"run profile id={bad_id} ('b') is unreadable and was skipped")


def test_a_version_1_store_is_upgraded_and_keeps_its_rows(tmp_path: Path) -> None:
    path = str(tmp_path / "v1.sqlite")
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema_version', '1');
        CREATE TABLE job_profiles (id INTEGER PRIMARY KEY AUTOINCREMENT, job_name TEXT NOT NULL,
            framework TEXT NOT NULL, model_params REAL NOT NULL, dataset_samples REAL NOT NULL,
            finished_at REAL NOT NULL, outcome_json TEXT NOT NULL);
        """
    )
    db.execute(
        "INSERT INTO job_profiles (job_name, framework, model_params, dataset_samples, finished_at, outcome_json)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        ("old", "pytorch", 1e9, 1e6, 1.0, JobOutcome(workers=2, worker=Resources(cpu=1, memory_mb=10)).to_json()),
    )
    db.commit()
    db.close()
    # Looking changes nothing: still version 1, no new table.
    opened = open_or_set_aside(path, 5.0, look_only=True)
    assert opened.store is not None
    assert opened.notice == ""
    assert read_runs(opened.store) == ([], [])
    opened.store.close()
    assert sqlite3.connect(path).execute("SELECT value FROM meta").fetchone() == ("1",)
    with JobProfileStore(path) as store:
        assert [p.job_name for p in store.profiles("pytorch")] == ["old"]
        add_run(store, profile("new"))
        assert [r.signature.job_name for r in read_runs(store)[0]] == ["new"]
    assert sqlite3.connect(path).execute("SELECT value FROM meta").fetchone() == (str(SCHEMA_VERSION),)
    assert JobFeatures("pytorch", 1e9, 1e6)  # the size-based store API still reads the old rows


def test_a_corrupt_store_is_set_aside_and_a_new_one_started(tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    with JobProfileStore(str(path)) as store:
        add_run(store, profile("a"))
    raw = bytearray(path.read_bytes())
    raw[0:100] = b"\xde\xad\xbe\xef" * 25  # the SQLite header is gone
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptProfileStoreError, match="cannot be opened: file is not a database"):
        JobProfileStore(str(path))
    looked = open_or_set_aside(str(path), 1234.0, look_only=True)
    assert looked.store is None
    assert looked.notice.endswith("a job would set it aside and start a new store")
    assert path.read_bytes() == bytes(raw)  # looking moved nothing
    opened = open_or_set_aside(str(path), 1234.0)
    assert opened.store is not None
    assert opened.set_aside_to == f"{path}.corrupt-1234"
    assert f"it was set aside as {path}.corrupt-1234 and a new store started" in opened.notice
    assert Path(opened.set_aside_to).read_bytes() == bytes(raw)  # kept as it was, for a person to look at
    assert read_runs(opened.store) == ([], [])
    opened.store.close()
    # A second corrupt file at the same second gets a name of its own.
    path.write_bytes(b"garbage" * 100)
    assert open_or_set_aside(str(path), 1234.0).set_aside_to == f"{path}.corrupt-1234.1"


def test_a_store_of_a_newer_version_is_set_aside_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    with JobProfileStore(str(path)) as store:
        add_run(store, profile("a"))
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    db.close()
    before = path.read_bytes()
    with pytest.raises(NewerProfileStoreError, match=f"schema version '{SCHEMA_VERSION + 1}'"):
        JobProfileStore(str(path))
    assert path.read_bytes() == before  # the newer file is not touched by a failed open
    opened = open_or_set_aside(str(path), 99.0)
    assert opened.set_aside_to == f"{path}.newer-99"
    assert Path(opened.set_aside_to).read_bytes() == before
    assert opened.store is not None
    opened.store.close()


def test_a_missing_directory_is_made_and_a_store_that_cannot_be_made_is_no_store(tmp_path: Path) -> None:
    made = open_or_set_aside(str(tmp_path / "cache" / "dlrover" / "p.sqlite"), 1.0)
    assert made.store is not None
    assert made.notice == ""
    made.store.close()
    assert (tmp_path / "cache" / "dlrover" / "p.sqlite").is_file()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    opened = open_or_set_aside(str(blocker / "p.sqlite"), 1.0)
    assert opened.store is None
    assert "its directory cannot be made" in opened.notice
    assert open_or_set_aside(str(tmp_path / "absent.sqlite"), 1.0, look_only=True).store is None
    assert not (tmp_path / "absent.sqlite").exists()


def test_a_locked_store_is_not_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    with JobProfileStore(str(path)) as store:
        add_run(store, profile("a"))
    before = path.read_bytes()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another job holds the store
    try:
        with pytest.raises(ProfileStoreError, match="database is locked") as raised:
            JobProfileStore(str(path))
        assert not isinstance(raised.value, CorruptProfileStoreError)
        opened = open_or_set_aside(str(path), 1234.0)
        assert opened.store is None
        assert opened.set_aside_to == ""
        assert "no profile store is used" in opened.notice
    finally:
        holder.rollback()
        holder.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.sqlite"]  # nothing renamed
    assert path.read_bytes() == before
    reopened = open_or_set_aside(str(path), 1234.0)
    assert reopened.store is not None
    assert [r.signature.job_name for r in read_runs(reopened.store)[0]] == ["a"]
    reopened.store.close()


def test_a_read_only_store_is_not_set_aside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "p.sqlite"
    with JobProfileStore(str(path)) as store:
        add_run(store, profile("a"))
    before = path.read_bytes()
    # File permissions do not stop root, so the file is opened the way SQLite opens one it may not write: read-only.
    connect = sqlite3.connect

    def read_only_connect(database: str, *args: object, **kwargs: object) -> sqlite3.Connection:
        return connect(Path(database).resolve().as_uri() + "?mode=ro", uri=True)

    monkeypatch.setattr(sqlite3, "connect", read_only_connect)
    with pytest.raises(ProfileStoreError, match="readonly database") as raised:
        JobProfileStore(str(path))
    assert not isinstance(raised.value, CorruptProfileStoreError)
    opened = open_or_set_aside(str(path), 1234.0)
    assert opened.store is None
    assert opened.set_aside_to == ""
    assert "no profile store is used" in opened.notice
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.sqlite"]  # nothing renamed
    assert path.read_bytes() == before


def test_only_damage_counts_as_corruption() -> None:
    damaged = sqlite3.connect(":memory:")
    try:
        with pytest.raises(sqlite3.Error) as not_a_db:
            damaged.execute("SELECT 1 FROM no_such_table")
    finally:
        damaged.close()
    assert not is_corruption(not_a_db.value)  # a missing table is a query error, not a damaged file
    assert not is_corruption(sqlite3.OperationalError("no code"))
