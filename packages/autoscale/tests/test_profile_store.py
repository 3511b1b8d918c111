"""The job profile store (SQLite, JSON columns, versioned schema) and initial plans from the nearest past jobs."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from dlrover.autoscale import (
    SCHEMA_VERSION,
    InitialPlanConfig,
    InvalidMetricError,
    JobFeatures,
    JobOutcome,
    JobProfileStore,
    NodeState,
    ProfileStoreError,
    Resources,
    Role,
    initial_plan,
)
from dlrover.common import ConfigError

CONFIG = InitialPlanConfig(neighbours=3, max_distance=2.0, default_workers=2, node_unit=1)


def _outcome(workers: int, cpu: float = 4, mem: int = 8192, ps: int = 0) -> JobOutcome:
    return JobOutcome(
        workers=workers,
        worker=Resources(cpu, mem),
        ps=ps,
        ps_resources=Resources(8, 16384) if ps else None,
        throughput=100.0,
    )


@pytest.fixture
def store() -> JobProfileStore:
    s = JobProfileStore(":memory:")
    yield s  # type: ignore[misc]
    s.close()


def test_empty_history_gives_the_safe_default_with_the_reason(store: JobProfileStore) -> None:
    result = initial_plan(store, JobFeatures("pytorch", 1e9, 1e7), uses_ps=False, config=CONFIG)
    assert not result.from_history
    assert result.outcome.workers == 2
    assert result.outcome.worker == CONFIG.default_worker
    assert "no past pytorch job" in result.reason
    assert "safe default" in result.reason
    assert result.plan.launched(Role.WORKER) == 2


def test_ps_default_includes_parameter_servers(store: JobProfileStore) -> None:
    result = initial_plan(store, JobFeatures("tensorflow-ps", 1e8, 1e7), uses_ps=True, config=CONFIG)
    assert result.outcome.ps == 1
    assert result.plan.launched(Role.PS) == 1
    assert "1 PS of" in result.reason


def test_nearest_jobs_decide_and_other_frameworks_are_ignored(store: JobProfileStore) -> None:
    store.add("near-a", JobFeatures("pytorch", 1e9, 1e7), _outcome(8, cpu=4, mem=8192), finished_at=1.0)
    store.add("near-b", JobFeatures("pytorch", 2e9, 1e7), _outcome(16, cpu=8, mem=4096), finished_at=2.0)
    store.add("near-c", JobFeatures("pytorch", 1e9, 3e7), _outcome(12, cpu=2, mem=16384), finished_at=3.0)
    store.add("far", JobFeatures("pytorch", 1e12, 1e7), _outcome(256), finished_at=4.0)
    store.add("other-fw", JobFeatures("tensorflow", 1e9, 1e7), _outcome(64), finished_at=5.0)
    result = initial_plan(store, JobFeatures("PyTorch", 1.1e9, 1e7), uses_ps=False, config=CONFIG)
    assert result.from_history
    assert [name for _d, name in result.neighbours] == ["near-a", "near-b", "near-c"]
    assert result.outcome.workers == 12  # median of 8, 16, 12
    assert result.outcome.worker == Resources(8, 16384)  # the largest of each amount, to start safe
    assert "near-a (distance" in result.reason


def test_jobs_beyond_max_distance_fall_back_to_the_default(store: JobProfileStore) -> None:
    store.add("far", JobFeatures("pytorch", 1e12, 1e10), _outcome(256), finished_at=1.0)
    result = initial_plan(store, JobFeatures("pytorch", 1e9, 1e7), uses_ps=False, config=CONFIG)
    assert not result.from_history
    assert "within distance 2" in result.reason


def test_worker_count_is_rounded_to_node_unit(store: JobProfileStore) -> None:
    store.add("a", JobFeatures("pytorch", 1e9, 1e7), _outcome(7), finished_at=1.0)
    result = initial_plan(store, JobFeatures("pytorch", 1e9, 1e7), uses_ps=False, config=InitialPlanConfig(node_unit=4))
    assert result.outcome.workers == 8


def test_initial_plan_is_relative_to_existing_nodes(store: JobProfileStore) -> None:
    store.add("a", JobFeatures("pytorch", 1e9, 1e7), _outcome(3), finished_at=1.0)
    current = [NodeState(0, Role.WORKER, Resources(4, 8192))]
    result = initial_plan(store, JobFeatures("pytorch", 1e9, 1e7), uses_ps=False, config=CONFIG, current=current)
    assert result.plan.launched(Role.WORKER) == 2


def test_profiles_survive_reopening_a_file(tmp_path: Path) -> None:
    path = str(tmp_path / "profiles.db")
    with JobProfileStore(path) as s:
        pid = s.add("job", JobFeatures("pytorch", 1e9, 1e7), _outcome(4, ps=2), finished_at=10.0)
    with JobProfileStore(path) as s:
        [profile] = s.profiles("pytorch")
    assert profile.profile_id == pid
    assert profile.outcome == _outcome(4, ps=2)
    assert profile.features == JobFeatures("pytorch", 1e9, 1e7)
    # Stored as JSON text a person (or another language) can read: no pickle.
    db = sqlite3.connect(path)
    try:
        (text,) = db.execute("SELECT outcome_json FROM job_profiles").fetchone()
        (version,) = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    finally:
        db.close()
    assert text.startswith("{")
    assert '"workers": 4' in text
    assert version == str(SCHEMA_VERSION)


def test_unknown_schema_version_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "profiles.db")
    JobProfileStore(path).close()
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.close()
    with pytest.raises(ProfileStoreError, match="schema version '99'"):
        JobProfileStore(path)


def test_a_corrupt_row_is_reported_by_id(store: JobProfileStore, tmp_path: Path) -> None:
    path = str(tmp_path / "profiles.db")
    with JobProfileStore(path) as s:
        s.add("good", JobFeatures("pytorch", 1e9, 1e7), _outcome(4), finished_at=1.0)
        bad = s.add("bad", JobFeatures("pytorch", 1e9, 1e7), _outcome(4), finished_at=2.0)
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE job_profiles SET outcome_json = '{not json' WHERE id = ?", (bad,))
    db.close()
    with JobProfileStore(path) as s, pytest.raises(ProfileStoreError, match=f"row id={bad} \\('bad'\\)"):
        s.profiles("pytorch")


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ProfileStoreError, match="cannot be opened"):
        JobProfileStore(str(path))


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (("pytorch", math.nan, 1e7), InvalidMetricError, "model_params is NaN"),
        (("pytorch", -1.0, 1e7), InvalidMetricError, "model_params must be >= 0, got -1.0"),
        (("pytorch", 1e9, 0.0), InvalidMetricError, "dataset_samples must be > 0"),
        (("pytorch", 1e9, None), InvalidMetricError, "dataset_samples is missing"),
        (("", 1e9, 1e7), ConfigError, "framework must be a non-empty string"),
    ],
)
def test_bad_features_are_rejected(args: tuple[object, ...], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        JobFeatures(*args)  # type: ignore[arg-type]


def test_bad_outcomes_and_rows_change_nothing(store: JobProfileStore) -> None:
    with pytest.raises(ConfigError, match="ps=2 and ps_resources=None disagree"):
        JobOutcome(workers=2, worker=Resources(1, 1024), ps=2)
    with pytest.raises(InvalidMetricError, match="finished_at is NaN"):
        store.add("x", JobFeatures("pytorch", 1e9, 1e7), _outcome(2), finished_at=math.nan)
    with pytest.raises(ConfigError, match="job_name must not be empty"):
        store.add("", JobFeatures("pytorch", 1e9, 1e7), _outcome(2), finished_at=1.0)
    assert store.profiles("pytorch") == []


def test_nearest_breaks_ties_by_the_newest(store: JobProfileStore) -> None:
    f = JobFeatures("pytorch", 1e9, 1e7)
    store.add("old", f, _outcome(2), finished_at=1.0)
    store.add("new", f, _outcome(4), finished_at=2.0)
    [(d, p)] = store.nearest(f, 1)
    assert d == 0.0
    assert p.job_name == "new"
