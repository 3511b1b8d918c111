"""The pure core of `SaverHost`: which runs a node's host serves and what it does with a request.

An ``ensure`` request (`SaverRequest`) names a run and how its saver must be set up; `HostRuns`
decides to start, reuse, replace or refuse, with a reason, and changes nothing until told the
decision was carried out. No threads, no sockets, no clock.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from typing import Any

import attrs

from dlrover.common import ConfigError
from dlrover.flashckpt.commit import RetentionPolicy
from dlrover.flashckpt.errors import FlashCkptError
from dlrover.flashckpt.segment import DEFAULT_SHM_DIR, validate_id
from dlrover.flashckpt.storage.location import StorageLocation

__all__ = ["EnsureAction", "EnsureDecision", "HostRuns", "SaverRequest"]


# -- the request ------------------------------------------------------------------------------------


@attrs.frozen
class SaverRequest:
    """What a stager asks the host for: the saver of one run, set up as it says.

    Attributes:
        job_id: the job.
        run_id: the run.
        world_size: ranks in the job (now: a resize changes it).
        storage_dir: where checkpoints go: the absolute path of a POSIX directory, or an fsspec
            URL such as ``s3://bucket/prefix`` (see `StorageLocation`).
        coordinator: whether this node's saver moves the tracker.
        shm_dir: absolute path of the directory holding the run's segments.
        num_slots: slots per rank.
        storage_options: for a URL, the fsspec filesystem's options (may hold credentials: kept
            out of the repr and of every reason string); for a POSIX directory, `PosixStorage`'s
            write settings that differ from their defaults.
        keep_last: retention the job asks for: keep the last N committed steps (0: the host's
            own `SaverHostConfig.retention`).
        keep_every: and every K-th step (0: none besides the last N).
    """

    job_id: str
    run_id: str
    world_size: int
    storage_dir: str
    coordinator: bool = True
    shm_dir: str = DEFAULT_SHM_DIR
    num_slots: int = 2
    storage_options: Mapping[str, Any] = attrs.field(factory=dict, repr=False)
    keep_last: int = 0
    keep_every: int = 0

    def __attrs_post_init__(self) -> None:
        for kind, value in (("job", self.job_id), ("run", self.run_id)):
            validate_id(kind, value)
        _check_int("world_size", self.world_size, 1)
        _check_int("num_slots", self.num_slots, 2)
        _check_int("keep_last", self.keep_last, 0)
        _check_int("keep_every", self.keep_every, 0)
        try:
            RetentionPolicy.from_counts(self.keep_last, self.keep_every)
        except ConfigError as e:
            raise FlashCkptError(str(e)) from None
        if not isinstance(self.coordinator, bool):
            raise FlashCkptError(f"coordinator must be true or false, got {self.coordinator!r}")
        if not isinstance(self.shm_dir, str) or not os.path.isabs(self.shm_dir) or "\0" in self.shm_dir:
            raise FlashCkptError(f"shm_dir must be an absolute path, got {self.shm_dir!r}")
        self.location  # noqa: B018 (validates storage_dir and storage_options)
        if not os.path.isdir(self.shm_dir):
            raise FlashCkptError(f"shm_dir {self.shm_dir!r} is not a directory")

    @property
    def location(self) -> StorageLocation:
        """Where the run's checkpoints go.

        Raises:
            FlashCkptError: `storage_dir` or `storage_options` is invalid.
        """
        return StorageLocation(self.storage_dir, self.storage_options)

    @property
    def key(self) -> tuple[str, str]:
        """The run this request is about."""
        return self.job_id, self.run_id

    @classmethod
    def from_message(cls, msg: Mapping[str, Any]) -> SaverRequest:
        """Read an ``ensure`` message.

        Raises:
            FlashCkptError: a field is missing or invalid (the message names it).
        """
        optional = {"storage_options", "keep_last", "keep_every"}
        missing = [f.name for f in attrs.fields(cls) if f.name not in msg and f.name not in optional]
        if missing:
            raise FlashCkptError(f"'ensure' needs {missing}, got fields {sorted(msg)}")
        return cls(**{f.name: msg[f.name] for f in attrs.fields(cls) if f.name in msg})

    def to_message(self) -> dict[str, Any]:
        """The ``ensure`` message for this request."""
        return {"type": "ensure", **attrs.asdict(self)}


def _check_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise FlashCkptError(f"{name} must be an integer >= {minimum}, got {value!r}")


# -- the pure core ----------------------------------------------------------------------------------


class EnsureAction(enum.Enum):
    """What the host does with an ``ensure`` request."""

    START = "started"
    REUSE = "reused"
    REPLACE = "replaced"
    REFUSE = "refused"


@attrs.frozen
class EnsureDecision:
    """A decision about one request, and why."""

    action: EnsureAction
    reason: str


class HostRuns:
    """The runs a host serves, and the decision for each request (no threads, no sockets).

    Args:
        max_runs: the most runs served at once (a bound on the host's threads and sockets).
    """

    def __init__(self, max_runs: int) -> None:
        if not isinstance(max_runs, int) or isinstance(max_runs, bool) or max_runs < 1:
            raise ConfigError(f"max_runs must be a positive integer, got {max_runs!r}")
        self.max_runs = max_runs
        self._runs: dict[tuple[str, str], SaverRequest] = {}

    def decide(self, request: SaverRequest) -> EnsureDecision:
        """Start, reuse, replace or refuse; changes nothing (see `apply`)."""
        current = self._runs.get(request.key)
        run = f"run {request.job_id}/{request.run_id}"
        if current is None:
            if len(self._runs) >= self.max_runs:
                return EnsureDecision(
                    EnsureAction.REFUSE, f"{run}: the host already serves {len(self._runs)} runs (max_runs)"
                )
            return EnsureDecision(
                EnsureAction.START,
                f"{run}: no saver yet; starting one for world size {request.world_size}",
            )
        for name in ("storage_dir", "shm_dir", "num_slots", "keep_last", "keep_every"):
            ours, theirs = getattr(current, name), getattr(request, name)
            if ours != theirs:
                return EnsureDecision(
                    EnsureAction.REFUSE,
                    f"{run} is served with {name}={ours!r}; the request names {theirs!r} (ranks disagree?)",
                )
        if dict(current.storage_options) != dict(request.storage_options):
            return EnsureDecision(
                EnsureAction.REFUSE, f"{run} is served with other storage options than the request's (not shown)"
            )
        if (current.world_size, current.coordinator) != (request.world_size, request.coordinator):
            return EnsureDecision(
                EnsureAction.REPLACE,
                f"{run}: world size {current.world_size} -> {request.world_size}, coordinator "
                f"{current.coordinator} -> {request.coordinator}: a new saver replaces the old one",
            )
        return EnsureDecision(EnsureAction.REUSE, f"{run}: its saver runs already")

    def apply(self, request: SaverRequest, decision: EnsureDecision) -> None:
        """Record a carried-out START, REUSE or REPLACE (a REFUSE changes nothing)."""
        if decision.action is not EnsureAction.REFUSE:
            self._runs[request.key] = request

    def forget(self, key: tuple[str, str]) -> SaverRequest | None:
        """Drop a run (its saver stopped); returns what it was."""
        return self._runs.pop(key, None)

    def runs(self) -> dict[tuple[str, str], SaverRequest]:
        """The runs served now."""
        return dict(self._runs)
