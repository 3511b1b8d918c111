"""A store of past jobs' profiles in embedded SQLite, and initial plans for new jobs from their nearest neighbours.

A new job arrives with no resource configuration. If past jobs of the same framework ran with similar model and
dataset sizes, the new job starts the way they ended up: their median worker count and the largest of their node
requests (starting too small costs an OOM relaunch; starting a little large costs little). Without such history it
starts from a safe default, and the plan's reason says which it was.

Rows hold plain columns for what is searched and one JSON column for the outcome: no pickle, and a corrupt row is
reported by its id rather than crashing the master. The schema is versioned in a `meta` table.
"""

from __future__ import annotations

import json
import math
import sqlite3
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from dlrover.autoscale._validate import (
    check_count,
    check_metric,
    check_positive,
    non_negative_int,
    positive_int,
    positive_number,
)
from dlrover.autoscale.errors import CorruptProfileStoreError, NewerProfileStoreError, ProfileStoreError
from dlrover.autoscale.plan import NodeState, ScalePlan, diff_to_target
from dlrover.autoscale.resources import Resources, Role
from dlrover.common import ConfigError

__all__ = [
    "SCHEMA_VERSION",
    "JobFeatures",
    "JobOutcome",
    "JobProfile",
    "JobProfileStore",
    "InitialPlanConfig",
    "InitialPlan",
    "initial_plan",
    "is_corruption",
]

_CORRUPTION_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})


def is_corruption(exc: sqlite3.Error) -> bool:
    """Whether `exc` says the file's content is damaged or not a database (SQLITE_CORRUPT, SQLITE_NOTADB).

    Every other error (a lock held by another connection, a read-only file, a failed read) says nothing about the
    content, so a store that raised it must not be treated as corrupt.
    """
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _CORRUPTION_CODES


SCHEMA_VERSION = 2
"""Version 2 added the `run_profiles` table (`dlrover.autoscale.run_profiles`); a version-1 file is upgraded."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS job_profiles (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_name TEXT NOT NULL,
    framework TEXT NOT NULL,
    model_params REAL NOT NULL,
    dataset_samples REAL NOT NULL,
    finished_at REAL NOT NULL,
    outcome_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS job_profiles_framework ON job_profiles (framework);
CREATE TABLE IF NOT EXISTS run_profiles (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_name TEXT NOT NULL,
    job_kind TEXT NOT NULL,
    script TEXT NOT NULL,
    finished_at REAL NOT NULL,
    profile_json TEXT NOT NULL
);
"""


@attrs.frozen
class JobFeatures:
    """What is known about a job before it runs, and what similarity is measured on.

    Args:
        framework: e.g. `pytorch`, `tensorflow-ps`; compared exactly (case-insensitive).
        model_params: the number of model parameters, > 0.
        dataset_samples: the number of training samples, > 0.

    Raises:
        InvalidMetricError: if a size is missing, NaN or not positive.
        ConfigError: if the framework is empty.
    """

    framework: str
    model_params: float
    dataset_samples: float

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.framework, str) or not self.framework.strip():
            raise ConfigError(f"framework must be a non-empty string, got {self.framework!r}")
        object.__setattr__(self, "framework", self.framework.strip().lower())
        check_positive("model_params", self.model_params)
        check_positive("dataset_samples", self.dataset_samples)

    def distance(self, other: JobFeatures) -> float:
        """Distance in orders of magnitude: |log10 ratio of model sizes| + |log10 ratio of dataset sizes|."""
        return abs(math.log10(self.model_params / other.model_params)) + abs(
            math.log10(self.dataset_samples / other.dataset_samples)
        )


@attrs.frozen
class JobOutcome:
    """How a past job ended up running.

    Args:
        workers: its final worker count (>= 1).
        worker: each worker's request.
        ps: its parameter-server count (0 for all-reduce).
        ps_resources: each PS's request (None when ps is 0).
        throughput: its throughput at the end, when known.
    """

    workers: int = attrs.field(validator=positive_int)
    worker: Resources
    ps: int = attrs.field(default=0, validator=non_negative_int)
    ps_resources: Resources | None = None
    throughput: float | None = None

    def __attrs_post_init__(self) -> None:
        if (self.ps > 0) != (self.ps_resources is not None):
            raise ConfigError(f"ps={self.ps} and ps_resources={self.ps_resources!r} disagree")
        if self.throughput is not None:
            check_positive("throughput", self.throughput)

    def to_json(self) -> str:
        """The outcome as a JSON document."""
        return json.dumps(
            {
                "workers": self.workers,
                "worker": self.worker.to_json(),
                "ps": self.ps,
                "ps_resources": None if self.ps_resources is None else self.ps_resources.to_json(),
                "throughput": self.throughput,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> JobOutcome:
        """Read what `to_json` wrote.

        Raises:
            ValueError: if the document is not valid JSON or lacks a field (ConfigError is a ValueError).
        """
        data: Any = json.loads(text)
        if not isinstance(data, dict):
            raise ConfigError(f"outcome must be a JSON object, got {type(data).__name__}")
        try:
            ps_res = data["ps_resources"]
            return cls(
                workers=data["workers"],
                worker=Resources.from_json(data["worker"]),
                ps=data["ps"],
                ps_resources=None if ps_res is None else Resources.from_json(ps_res),
                throughput=data.get("throughput"),
            )
        except KeyError as e:
            raise ConfigError(f"outcome lacks the field {e.args[0]!r}") from None


@attrs.frozen
class JobProfile:
    """One past job: its name, features, outcome and when it finished (wall-clock seconds)."""

    job_name: str
    features: JobFeatures
    outcome: JobOutcome
    finished_at: float = 0.0
    profile_id: int | None = None


class JobProfileStore:
    """Past jobs in an SQLite database file, or in memory with `":memory:"`.

    Not thread-safe: one store per master, used from one thread (SQLite connections are per thread).

    Args:
        path: the database file, created if absent; `":memory:"` for a store that lives as long as the object.
        read_only: open an existing file without writing anything to it (no upgrade of an older version, no
            tables created); for tools that only look.

    Raises:
        NewerProfileStoreError: the file holds a newer schema version (it is left unchanged).
        CorruptProfileStoreError: the file is damaged or not a database (SQLITE_CORRUPT, SQLITE_NOTADB).
        ProfileStoreError: the file cannot be opened or used now (a missing directory, no permission, a read-only
            file opened for writing, a lock another connection holds, an I/O error); the file is not corrupt.
    """

    def __init__(self, path: str, *, read_only: bool = False) -> None:
        self._path = path
        try:
            if read_only:
                self._db = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True)
            else:
                self._db = sqlite3.connect(path)
        except sqlite3.Error as e:
            raise ProfileStoreError(f"job profile store {path!r} cannot be opened: {e}") from e
        try:
            # The version is read before anything is written: a newer file is left exactly as it is.
            has_meta = self._db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
            ).fetchone()
            row = (
                self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() if has_meta else None
            )
            if row is not None:
                try:
                    found = int(row[0])
                except (TypeError, ValueError):
                    raise CorruptProfileStoreError(
                        f"job profile store {path!r} has schema version {row[0]!r}, which is not a number"
                    ) from None
                if found > SCHEMA_VERSION:
                    raise NewerProfileStoreError(
                        f"job profile store {path!r} has schema version {row[0]!r}; this code reads versions up to "
                        f"{SCHEMA_VERSION}"
                    )
            if read_only:
                if row is None and has_meta is None:
                    self._db.execute("SELECT count(*) FROM sqlite_master").fetchone()  # is it a database at all?
                return
            self._db.executescript(_SCHEMA)
            with self._db:
                self._db.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
        except sqlite3.Error as e:
            self._db.close()
            if is_corruption(e):
                raise CorruptProfileStoreError(f"job profile store {path!r} cannot be opened: {e}") from e
            # Locked, read-only, unreadable or an I/O error: the file may be a healthy store that another job is
            # using, so it is reported as unusable for now, never as corrupt (which would have it set aside).
            raise ProfileStoreError(f"job profile store {path!r} cannot be used now: {e}") from e
        except BaseException:
            self._db.close()
            raise

    @property
    def path(self) -> str:
        """The database file (or `":memory:"`)."""
        return self._path

    @property
    def connection(self) -> sqlite3.Connection:
        """The open database, for the modules of this package that keep their own tables in it."""
        return self._db

    def close(self) -> None:
        """Close the database."""
        self._db.close()

    def __enter__(self) -> JobProfileStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def add(self, job_name: str, features: JobFeatures, outcome: JobOutcome, finished_at: float) -> int:
        """Record a finished job and return its profile id.

        Raises:
            ConfigError: if `job_name` is empty.
            InvalidMetricError: if `finished_at` is NaN or negative.
        """
        if not job_name:
            raise ConfigError("job_name must not be empty")
        check_metric("finished_at", finished_at)
        with self._db:
            cur = self._db.execute(
                "INSERT INTO job_profiles"
                " (job_name, framework, model_params, dataset_samples, finished_at, outcome_json)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    job_name,
                    features.framework,
                    float(features.model_params),
                    float(features.dataset_samples),
                    float(finished_at),
                    outcome.to_json(),
                ),
            )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def profiles(self, framework: str) -> list[JobProfile]:
        """Every profile of `framework`, oldest first.

        Raises:
            ProfileStoreError: if a row cannot be read; the message names its id.
        """
        rows = self._db.execute(
            "SELECT id, job_name, framework, model_params, dataset_samples, finished_at, outcome_json "
            "FROM job_profiles WHERE framework = ? ORDER BY id",
            (framework.strip().lower(),),
        ).fetchall()
        out = []
        for pid, name, fw, mp, ds, fin, oj in rows:
            try:
                out.append(JobProfile(name, JobFeatures(fw, mp, ds), JobOutcome.from_json(oj), fin, pid))
            except ValueError as e:
                raise ProfileStoreError(f"job profile row id={pid} ({name!r}) is unreadable: {e}") from e
        return out

    def nearest(self, features: JobFeatures, k: int) -> list[tuple[float, JobProfile]]:
        """Up to `k` profiles of the same framework, nearest first, with their distances.

        Ties are broken by the newer job first (later finished), then the larger id.
        """
        check_count("k", k, minimum=1)
        scored = [(features.distance(p.features), p) for p in self.profiles(features.framework)]
        scored.sort(key=lambda sp: (sp[0], -sp[1].finished_at, -(sp[1].profile_id or 0)))
        return scored[:k]


@attrs.frozen
class InitialPlanConfig:
    """How a new job's first plan is chosen.

    Args:
        neighbours: how many nearest past jobs to combine.
        max_distance: past jobs farther than this (orders of magnitude, see `JobFeatures.distance`) are ignored.
        default_workers: workers of the safe default.
        default_worker: the request of each worker of the safe default.
        default_ps: parameter servers of the safe default for PS frameworks.
        default_ps_resources: the request of each PS of the safe default.
        node_unit: the worker count is rounded to a multiple of this.
    """

    neighbours: int = attrs.field(default=3, validator=positive_int)
    max_distance: float = attrs.field(default=2.0, validator=positive_number)
    default_workers: int = attrs.field(default=1, validator=positive_int)
    default_worker: Resources = attrs.field(factory=lambda: Resources(cpu=4.0, memory_mb=16 * 1024))
    default_ps: int = attrs.field(default=1, validator=non_negative_int)
    default_ps_resources: Resources = attrs.field(factory=lambda: Resources(cpu=4.0, memory_mb=8 * 1024))
    node_unit: int = attrs.field(default=1, validator=positive_int)


@attrs.frozen
class InitialPlan:
    """A new job's first size, the plan to launch it, and why.

    Args:
        outcome: the chosen size (same shape as a past job's outcome).
        from_history: whether it came from past jobs (False: the safe default).
        neighbours: the past jobs it came from, with their distances.
        plan: launch actions from `current` nodes (usually none).
    """

    outcome: JobOutcome
    from_history: bool
    neighbours: tuple[tuple[float, str], ...]
    plan: ScalePlan

    @property
    def reason(self) -> str:
        """Why this size."""
        return self.plan.reason


def _max_resources(rs: Sequence[Resources]) -> Resources:
    return Resources(
        cpu=max(r.cpu_milli for r in rs) / 1000, memory_mb=max(r.memory_mb for r in rs), gpu=max(r.gpu for r in rs)
    )


def _plan(outcome: JobOutcome, current: Sequence[NodeState], reason: str) -> ScalePlan:
    targets = [(Role.WORKER, outcome.workers, outcome.worker)]
    if outcome.ps_resources is not None:
        targets.append((Role.PS, outcome.ps, outcome.ps_resources))
    return diff_to_target(current, targets, reason)


def initial_plan(
    store: JobProfileStore,
    features: JobFeatures,
    uses_ps: bool,
    config: InitialPlanConfig,
    current: Sequence[NodeState] = (),
) -> InitialPlan:
    """The first plan of a job with no resource configuration.

    Args:
        store: past jobs.
        features: the new job's framework, model and dataset sizes.
        uses_ps: whether the job has parameter servers.
        config: neighbour count, distance cut-off and the safe default.
        current: nodes the job already has (usually none).

    Returns:
        From the nearest past jobs when there are any within `max_distance`, otherwise the safe default; the
        plan's reason says which and why.

    Raises:
        ProfileStoreError: if a stored profile is unreadable.
    """
    near = [(d, p) for d, p in store.nearest(features, config.neighbours) if d <= config.max_distance]
    if uses_ps:
        near = [(d, p) for d, p in near if p.outcome.ps > 0]
    if not near:
        ps = max(1, config.default_ps) if uses_ps else 0
        default = JobOutcome(
            workers=-(-config.default_workers // config.node_unit) * config.node_unit,
            worker=config.default_worker,
            ps=ps,
            ps_resources=config.default_ps_resources if ps else None,
        )
        why = (
            f"no past {features.framework} job within distance {config.max_distance:g} of "
            f"{features.model_params:.3g} parameters / {features.dataset_samples:.3g} samples"
        )
        reason = f"{why}: starting from the safe default, {default.workers} worker(s) of {default.worker.describe()}"
        if ps:
            reason += f" and {ps} PS of {config.default_ps_resources.describe()}"
        return InitialPlan(default, False, (), _plan(default, current, reason))
    workers = round(statistics.median(p.outcome.workers for _d, p in near))
    workers = max(config.node_unit, round(workers / config.node_unit) * config.node_unit)
    worker = _max_resources([p.outcome.worker for _d, p in near])
    ps = 0
    ps_res = None
    if uses_ps:
        ps = max(1, round(statistics.median(p.outcome.ps for _d, p in near)))
        ps_res = _max_resources([p.outcome.ps_resources for _d, p in near if p.outcome.ps_resources is not None])
    outcome = JobOutcome(workers=workers, worker=worker, ps=ps, ps_resources=ps_res)
    names = ", ".join(f"{p.job_name} (distance {d:.2f})" for d, p in near)
    reason = (
        f"from the {len(near)} nearest past {features.framework} job(s) {names}: median worker count {workers}, "
        f"largest worker request {worker.describe()}"
    )
    if ps_res is not None:
        reason += f", {ps} PS of {ps_res.describe()}"
    return InitialPlan(outcome, True, tuple((d, p.job_name) for d, p in near), _plan(outcome, current, reason))
