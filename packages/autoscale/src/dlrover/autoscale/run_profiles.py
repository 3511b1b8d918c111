"""What a finished job measured about itself, kept in the profile store, and the first plan of a job that asks for
nothing.

A job master records one `RunProfile` at the end of every job: the resources and node counts it ran with, the
samples per second it measured at each node count, the peak memory of each node, the parameter count and state size
of its last committed checkpoint, and how it ended. A later job submitted without node counts or resources is sized
like the most similar earlier one (`plan_from_runs`).

Similarity uses only what is known when a job is submitted (`JobSignature`):

1. a job kind (a user's tag, `dlrover-master --job-kind`): when the new job gives one, only profiles of that kind
   are candidates;
2. then the training script (same path) counts 2 and the job name (same name) counts 1; a profile that shares
   neither with a job that gives no kind is not similar;
3. ties go to the newest profile.

A parameter-server job's profile also lists each role (`RoleProfile`: chief, parameter servers, workers,
evaluator) with its task count, resources and peak memory; its node range and throughput are its workers'. Such a
profile sizes only parameter-server jobs (`dlrover.autoscale.ps_plan`), and a profile without roles only jobs
without them.

Profiles live in their own table of the `JobProfileStore` file (schema version 2), one JSON column each: no pickle.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from collections.abc import Sequence
from typing import Any

import attrs

from dlrover.autoscale._validate import non_negative_int
from dlrover.autoscale.errors import CorruptProfileStoreError, NewerProfileStoreError, ProfileStoreError
from dlrover.autoscale.profile_store import JobProfileStore, is_corruption
from dlrover.autoscale.resources import Resources, Role
from dlrover.common import ConfigError

__all__ = [
    "JobSignature",
    "RoleProfile",
    "RunProfile",
    "RunPlanConfig",
    "RunPlan",
    "OpenedStore",
    "add_run",
    "read_runs",
    "most_similar",
    "plan_from_runs",
    "open_or_set_aside",
]


def _text(_inst: object, attribute: Any, value: object) -> None:
    if not isinstance(value, str) or len(value) > 4096:
        raise ConfigError(f"{attribute.name} must be a string of at most 4096 characters, got {value!r}")


@attrs.frozen
class JobSignature:
    """What is known of a job when it is submitted; similarity is measured on it.

    Args:
        job_name: the job's name ("" when the job was not named).
        script: the training script's path ("" when unknown).
        job_kind: a tag the user gives to say which jobs are alike ("" for none).
    """

    job_name: str = attrs.field(default="", validator=_text)
    script: str = attrs.field(default="", validator=_text)
    job_kind: str = attrs.field(default="", validator=_text)

    def describe(self) -> str:
        """E.g. `kind 'gpt-small', script '/w/train.py', name 'nightly'`."""
        parts = [f"{k} {v!r}" for k, v in (("kind", self.job_kind), ("script", self.script), ("name", self.job_name))]
        return ", ".join(p for p, v in zip(parts, (self.job_kind, self.script, self.job_name), strict=True) if v)


def _pairs(value: Any) -> tuple[tuple[int, float], ...]:
    return tuple(sorted((int(k), float(v)) for k, v in value))


def _optional_peak(_inst: object, attribute: Any, value: object) -> None:
    if value is not None and (not isinstance(value, float) or not math.isfinite(value) or value < 0):
        raise ConfigError(f"{attribute.name} must be None or a finite number >= 0, got {value!r}")


def _optional_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


@attrs.frozen
class RoleProfile:
    """One role of a parameter-server job as its master measured it.

    Args:
        role: the role (chief, ps, worker, evaluator).
        count: its tasks at the end of the job: parameter servers after any its master added; workers as the job
            was sized (one lost for good is not subtracted: the throughput by worker count says what they did).
        resources: the most any task of it was launched with (after OOM growth); None: nothing asked.
        peak_memory_mb: the most memory (resident set) any task of it reached; None: not measured.
    """

    role: Role = attrs.field(converter=Role)
    count: int = attrs.field(validator=non_negative_int)
    resources: Resources | None = None
    peak_memory_mb: float | None = attrs.field(default=None, converter=_optional_float, validator=_optional_peak)

    def to_data(self) -> dict[str, Any]:
        """The role as a JSON object."""
        return {
            "role": self.role.value,
            "count": self.count,
            "resources": None if self.resources is None else self.resources.to_json(),
            "peak_memory_mb": self.peak_memory_mb,
        }

    @classmethod
    def from_data(cls, data: Any) -> RoleProfile:
        """Read what `to_data` wrote.

        Raises:
            ConfigError: a field is missing or invalid.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"a role profile must be a JSON object, got {data!r}")
        try:
            res = data["resources"]
            return cls(
                role=data["role"],
                count=data["count"],
                resources=None if res is None else Resources.from_json(res),
                peak_memory_mb=data.get("peak_memory_mb"),
            )
        except (KeyError, ValueError, TypeError) as e:
            raise ConfigError(f"a role profile lacks or mistypes a field: {e}") from None


def _roles(value: Any) -> tuple[RoleProfile, ...]:
    roles = tuple(value)
    if len({r.role for r in roles}) != len(roles):
        raise ConfigError(f"a role is profiled twice in {[r.role.value for r in roles]}")
    return roles


@attrs.frozen
class RunProfile:
    """One finished job as its master measured it.

    Args:
        signature: what was known of it at submission.
        outcome: how it ended (`succeeded`, `failed`, `stopped`).
        exit_reason: the sentence it ended with.
        node_resources: what each node was launched with (None: nothing asked).
        min_nodes: its node range's minimum.
        max_nodes: its node range's maximum.
        node_unit: nodes came and went in multiples of this.
        final_nodes: how many nodes it was sized to at the end.
        throughput: (node count, samples per second measured at that count), by node count; empty when no
            samples were reported.
        peak_memory_mb: (node id, peak host memory in MiB its agent reported), by node id.
        peak_gpu_memory_mb: (node id, peak accelerator memory in MiB), only nodes that reported any.
        parameter_count: from the last committed checkpoint's manifest (None: see `checkpoint_note`).
        state_bytes: tensor bytes one rank's state holds, from the same manifest (None: see `checkpoint_note`).
        checkpoint_bytes: bytes of every rank's files of that checkpoint together (None: see `checkpoint_note`).
        checkpoint_note: where the sizes came from, or why there are none.
        finished_at: wall-clock seconds when it was recorded.
        profile_id: its row id in the store (None before it is stored).
        roles: a parameter-server job's roles (empty for other jobs; then its nodes are its workers).
    """

    signature: JobSignature
    outcome: str
    exit_reason: str = ""
    node_resources: Resources | None = None
    min_nodes: int = 1
    max_nodes: int = 1
    node_unit: int = 1
    final_nodes: int = 1
    throughput: tuple[tuple[int, float], ...] = attrs.field(default=(), converter=_pairs)
    peak_memory_mb: tuple[tuple[int, float], ...] = attrs.field(default=(), converter=_pairs)
    peak_gpu_memory_mb: tuple[tuple[int, float], ...] = attrs.field(default=(), converter=_pairs)
    parameter_count: int | None = None
    state_bytes: int | None = None
    checkpoint_bytes: int | None = None
    checkpoint_note: str = ""
    finished_at: float = 0.0
    profile_id: int | None = None
    roles: tuple[RoleProfile, ...] = attrs.field(default=(), converter=_roles)

    def role(self, role: Role) -> RoleProfile | None:
        """Its profile of `role` (None: the job had no such role, or is not a parameter-server job)."""
        return next((r for r in self.roles if r.role is role), None)

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.min_nodes <= self.max_nodes or self.node_unit < 1 or self.final_nodes < 0:
            raise ConfigError(
                f"node counts min {self.min_nodes}, max {self.max_nodes}, unit {self.node_unit}, final "
                f"{self.final_nodes} are not a valid range"
            )
        for n, rate in self.throughput:
            if n < 1 or not math.isfinite(rate) or rate < 0:
                raise ConfigError(f"throughput ({n} nodes, {rate} samples/s) is not a node count and a rate >= 0")

    def best_node_count(self) -> int:
        """The node count it measured the most samples per second at; without measurements, its final size."""
        measured = [(rate, n) for n, rate in self.throughput if self.min_nodes <= n <= self.max_nodes and rate > 0]
        if measured:
            return max(measured)[1]
        return max(self.min_nodes, min(self.final_nodes, self.max_nodes))

    def to_json(self) -> str:
        """The profile as a JSON document (the signature and id live in their own columns)."""
        return json.dumps(
            {
                "outcome": self.outcome,
                "exit_reason": self.exit_reason,
                "node_resources": None if self.node_resources is None else self.node_resources.to_json(),
                "min_nodes": self.min_nodes,
                "max_nodes": self.max_nodes,
                "node_unit": self.node_unit,
                "final_nodes": self.final_nodes,
                "throughput": [list(p) for p in self.throughput],
                "peak_memory_mb": [list(p) for p in self.peak_memory_mb],
                "peak_gpu_memory_mb": [list(p) for p in self.peak_gpu_memory_mb],
                "parameter_count": self.parameter_count,
                "state_bytes": self.state_bytes,
                "checkpoint_bytes": self.checkpoint_bytes,
                "checkpoint_note": self.checkpoint_note,
                **({"roles": [r.to_data() for r in self.roles]} if self.roles else {}),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(
        cls, text: str, signature: JobSignature, finished_at: float, profile_id: int | None = None
    ) -> RunProfile:
        """Read what `to_json` wrote.

        Raises:
            ValueError: the document is not valid JSON or a field is missing or invalid (ConfigError is one).
        """
        data: Any = json.loads(text)
        if not isinstance(data, dict):
            raise ConfigError(f"a run profile must be a JSON object, got {type(data).__name__}")
        try:
            res = data["node_resources"]
            return cls(
                signature=signature,
                outcome=str(data["outcome"]),
                exit_reason=str(data.get("exit_reason", "")),
                node_resources=None if res is None else Resources.from_json(res),
                min_nodes=int(data["min_nodes"]),
                max_nodes=int(data["max_nodes"]),
                node_unit=int(data["node_unit"]),
                final_nodes=int(data["final_nodes"]),
                throughput=data["throughput"],
                peak_memory_mb=data["peak_memory_mb"],
                peak_gpu_memory_mb=data.get("peak_gpu_memory_mb", []),
                parameter_count=data.get("parameter_count"),
                state_bytes=data.get("state_bytes"),
                checkpoint_bytes=data.get("checkpoint_bytes"),
                checkpoint_note=str(data.get("checkpoint_note", "")),
                finished_at=finished_at,
                profile_id=profile_id,
                roles=[RoleProfile.from_data(r) for r in data.get("roles", [])],
            )
        except (KeyError, TypeError) as e:
            raise ConfigError(f"a run profile lacks or mistypes a field: {e}") from None


def add_run(store: JobProfileStore, profile: RunProfile) -> int:
    """Store a finished job's profile; returns its id.

    Raises:
        ProfileStoreError: the database refused the write (full disk, read-only file).
    """
    sig = profile.signature
    try:
        with store.connection:
            cur = store.connection.execute(
                "INSERT INTO run_profiles (job_name, job_kind, script, finished_at, profile_json)"
                " VALUES (?, ?, ?, ?, ?)",
                (sig.job_name, sig.job_kind, sig.script, float(profile.finished_at), profile.to_json()),
            )
    except sqlite3.Error as e:
        raise ProfileStoreError(f"job profile store {store.path!r} did not take the profile: {e}") from e
    assert cur.lastrowid is not None
    return cur.lastrowid


def read_runs(store: JobProfileStore) -> tuple[list[RunProfile], list[str]]:
    """Every stored run profile, oldest first, and a sentence for each row that could not be read (skipped).

    Raises:
        CorruptProfileStoreError: the table itself is damaged (SQLITE_CORRUPT, SQLITE_NOTADB).
        ProfileStoreError: the table cannot be read now (a lock held elsewhere, an I/O error).
    """
    try:
        if not store.connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'run_profiles'"
        ).fetchone():
            return [], []  # a version-1 file opened read-only: no run profiles yet
        rows = store.connection.execute(
            "SELECT id, job_name, job_kind, script, finished_at, profile_json FROM run_profiles ORDER BY id"
        ).fetchall()
    except sqlite3.Error as e:
        if is_corruption(e):
            raise CorruptProfileStoreError(f"job profile store {store.path!r} cannot be read: {e}") from e
        raise ProfileStoreError(f"job profile store {store.path!r} cannot be read now: {e}") from e
    out: list[RunProfile] = []
    bad: list[str] = []
    for pid, name, kind, script, finished, doc in rows:
        try:
            sig = JobSignature(job_name=name, script=script, job_kind=kind)
            out.append(RunProfile.from_json(doc, sig, float(finished), pid))
        except (ValueError, TypeError) as e:
            bad.append(f"run profile id={pid} ({name!r}) is unreadable and was skipped: {e}")
    return out, bad


def most_similar(
    runs: Sequence[RunProfile], signature: JobSignature, *, parameter_server: bool = False, outcome: str | None = None
) -> tuple[RunProfile, str] | None:
    """The most similar profile to a job of `signature` and why it was chosen, or None (see the module's rules).

    Only profiles of the same kind of job are candidates: of parameter-server jobs when `parameter_server`, else
    of jobs without roles; and with `outcome`, only those that ended so (e.g. `succeeded`).
    """
    best: tuple[tuple[int, float, int], RunProfile, str] | None = None
    for run in runs:
        if bool(run.roles) != parameter_server or (outcome is not None and run.outcome != outcome):
            continue
        sig = run.signature
        if signature.job_kind and sig.job_kind != signature.job_kind:
            continue
        same = []
        score = 0
        if signature.job_kind:
            same.append(f"kind {signature.job_kind!r}")
        if signature.script and sig.script == signature.script:
            score += 2
            same.append(f"script {signature.script!r}")
        if signature.job_name and sig.job_name == signature.job_name:
            score += 1
            same.append(f"name {signature.job_name!r}")
        if not same:
            continue
        key = (score, run.finished_at, run.profile_id or 0)
        if best is None or key > best[0]:
            best = (key, run, "same " + ", same ".join(same))
    return None if best is None else (best[1], best[2])


@attrs.frozen
class RunPlanConfig:
    """How a job that asks for nothing is sized.

    Args:
        default_nodes: nodes when no earlier job is similar.
        default_resources: each node's resources then (None: nothing asked, the backend's default).
        max_nodes: no plan has more nodes than this (None: no limit but the profile's own range).
    """

    default_nodes: int = 1
    default_resources: Resources | None = None
    max_nodes: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.default_nodes < 1:
            raise ConfigError(f"default_nodes must be >= 1, got {self.default_nodes!r}")
        if self.max_nodes is not None and self.max_nodes < 1:
            raise ConfigError(f"max_nodes must be None or >= 1, got {self.max_nodes!r}")


@attrs.frozen
class RunPlan:
    """The first size of a job that asked for nothing, and why.

    Args:
        nodes: how many nodes it starts with (its range's maximum).
        min_nodes: the fewest it trains with.
        node_unit: nodes come and go in multiples of this.
        resources: each node's resources (None: nothing asked).
        profile: the earlier job it came from (None: the defaults).
        reason: a sentence saying which and why.
    """

    nodes: int
    min_nodes: int
    node_unit: int
    resources: Resources | None
    profile: RunProfile | None
    reason: str

    @property
    def source(self) -> str:
        """`profile` or `defaults`."""
        return "defaults" if self.profile is None else "profile"


def plan_from_runs(
    runs: Sequence[RunProfile], signature: JobSignature, config: RunPlanConfig, *, notes: Sequence[str] = ()
) -> RunPlan:
    """The first plan of a job submitted without node counts or resources.

    From the most similar earlier profile (`most_similar`): the node count it measured the most samples per second
    at (`RunProfile.best_node_count`; its final size when it measured none), within its own range and
    `config.max_nodes`, its minimum, its node unit and its node resources. Otherwise `config`'s defaults.

    Args:
        runs: the stored profiles (`read_runs`).
        signature: the new job.
        config: defaults and limits.
        notes: sentences to append to the reason (a store set aside, rows skipped).
    """
    found = most_similar(runs, signature)
    tail = "".join(f"; {n}" for n in notes)
    if found is None:
        what = "nothing asked" if config.default_resources is None else config.default_resources.describe()
        nodes = config.default_nodes if config.max_nodes is None else min(config.default_nodes, config.max_nodes)
        about = signature.describe() or "an unnamed job"
        reason = f"no earlier job is similar to {about}: starting from the defaults, {nodes} node(s) of {what}{tail}"
        return RunPlan(nodes, nodes, 1, config.default_resources, None, reason)
    run, why = found
    nodes = run.best_node_count()
    if config.max_nodes is not None and nodes > config.max_nodes:
        nodes = max(run.node_unit, config.max_nodes // run.node_unit * run.node_unit)
    low = min(run.min_nodes, nodes)
    measured = dict(run.throughput).get(nodes)
    speed = f", {measured:.3g} samples/s measured at that size" if measured else ", no samples/s measured"
    what = "nothing asked" if run.node_resources is None else run.node_resources.describe()
    reason = (
        f"from profile {run.profile_id} of job {run.signature.job_name or '(unnamed)'!r} ({why}; it "
        f"{run.outcome}): {nodes} node(s) (range {low}..{nodes}{speed}) of {what}{tail}"
    )
    return RunPlan(nodes, low, run.node_unit if nodes % run.node_unit == 0 else 1, run.node_resources, run, reason)


@attrs.frozen
class OpenedStore:
    """A profile store as `open_or_set_aside` left it.

    Args:
        store: the open store (None: it could not be opened even after setting the file aside).
        notice: what happened when something did ("" when the file opened as it was).
        set_aside_to: where an unreadable file was moved ("" when none was).
    """

    store: JobProfileStore | None
    notice: str = ""
    set_aside_to: str = ""


def _suffix_path(path: str, label: str, wall_time: float) -> str:
    base = f"{path}.{label}-{int(wall_time)}"
    candidate, n = base, 1
    while os.path.exists(candidate):
        candidate, n = f"{base}.{n}", n + 1
    return candidate


def open_or_set_aside(path: str, wall_time: float, *, look_only: bool = False) -> OpenedStore:
    """Open the store at `path`; one that is corrupt or from a newer schema version is renamed out of the way
    (`<path>.corrupt-<time>` or `<path>.newer-<time>`, with its journal file) and a fresh store made in its place.

    Args:
        path: the store's file.
        wall_time: now, in wall-clock seconds (names the set-aside file).
        look_only: change nothing: a missing file is not created (no store, no notice), an unreadable one is not
            moved (no store, and the notice says it would be set aside). Otherwise a missing directory is made.

    Never raises for the file's content: a store that cannot be opened at all comes back as None with the reason.
    Only a damaged file (SQLITE_CORRUPT, SQLITE_NOTADB) or a newer one is set aside: a store that is locked by
    another job, read-only, or failing to read is left where it is and this run goes without it.
    """
    if look_only and not os.path.exists(path):
        return OpenedStore(None)
    parent = os.path.dirname(path)
    if not look_only and path != ":memory:" and parent and not os.path.isdir(parent):
        try:
            os.makedirs(parent, mode=0o700, exist_ok=True)  # the default lives in a cache directory made on demand
        except OSError as exc:
            return OpenedStore(None, f"job profile store {path!r}: its directory cannot be made ({exc}): no store")
    try:
        return OpenedStore(JobProfileStore(path, read_only=look_only))
    except (CorruptProfileStoreError, NewerProfileStoreError) as exc:
        if look_only:
            return OpenedStore(None, f"{exc}; a job would set it aside and start a new store")
        return _set_aside(path, exc, wall_time)
    except ProfileStoreError as exc:
        return OpenedStore(None, f"{exc}: no profile store is used")


def _set_aside(path: str, exc: ProfileStoreError, wall_time: float) -> OpenedStore:
    """Move an unreadable store out of the way and start a new one in its place."""
    label = "newer" if isinstance(exc, NewerProfileStoreError) else "corrupt"
    target = _suffix_path(path, label, wall_time)
    try:
        os.replace(path, target)
        if os.path.exists(f"{path}-journal"):
            os.replace(f"{path}-journal", f"{target}-journal")
    except OSError as move_exc:
        return OpenedStore(None, f"{exc}; it could not be set aside ({move_exc}): no profile store is used")
    notice = f"{exc}; it was set aside as {target} and a new store started"
    try:
        return OpenedStore(JobProfileStore(path), notice, target)
    except ProfileStoreError as again:
        return OpenedStore(None, f"{notice}, which cannot be opened either: {again}", target)
