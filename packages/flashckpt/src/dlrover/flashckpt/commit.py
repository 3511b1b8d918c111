"""The commit protocol: when every rank's files are done, the coordinator moves the tracker.

Order of writes for step S: each rank writes its safetensors file and JSON manifest, then its done
marker; the coordinator, seeing a done marker from every rank, writes ``S/manifest.json`` and then
``tracker.json``. Each write is atomic, so a crash at any point leaves the tracker at the previous
complete checkpoint, and a step without ``manifest.json`` is never loaded.

`decide_commit` and `select_removals` are pure; `Committer` applies them to a `Storage`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterable

import attrs

from dlrover.common import ConfigError
from dlrover.flashckpt.ckpt_format import (
    CHECKPOINT_FORMAT,
    FORMAT_VERSION,
    TRACKER_FORMAT,
    TRACKER_PATH,
    done_path,
    dump_json,
    load_json,
    manifest_path,
    rank_manifest_path,
    safetensors_path,
    step_dir,
)
from dlrover.flashckpt.errors import FlashCkptError, LayoutError, StorageError
from dlrover.flashckpt.storage.base import Storage

_log = logging.getLogger(__name__)

__all__ = [
    "CommitDecision",
    "Committer",
    "RetentionPolicy",
    "Tracker",
    "decide_commit",
    "select_removals",
]

_DONE_RE = re.compile(r"^rank_(\d{5,})\.done$")


@attrs.frozen
class Tracker:
    """The committed checkpoint the tracker names."""

    step: int
    world_size: int


@attrs.frozen
class CommitDecision:
    """Whether a step may be committed now, and why (not).

    Attributes:
        commit: commit now.
        reason: a sentence saying why.
        waiting_for: ranks whose done marker is missing (a later check may commit).
    """

    commit: bool
    reason: str
    waiting_for: tuple[int, ...] = ()


def decide_commit(step: int, world_size: int, done: Iterable[int], tracker: Tracker | None) -> CommitDecision:
    """Decide whether `step` can be committed.

    Args:
        step: the candidate step.
        world_size: ranks that must be done.
        done: ranks whose done marker exists.
        tracker: the currently committed checkpoint.
    """
    if tracker is not None and step <= tracker.step:
        return CommitDecision(False, f"step {step} is not newer than the committed step {tracker.step}")
    missing = sorted(set(range(world_size)) - set(done))
    if missing:
        shown = missing[:8]
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        return CommitDecision(False, f"step {step} waits for ranks {shown}{more}", tuple(missing))
    return CommitDecision(True, f"every one of {world_size} ranks finished step {step}")


@attrs.frozen
class RetentionPolicy:
    """Which committed checkpoints to keep.

    Attributes:
        keep_last: the newest N committed steps are kept (at least 1).
        keep_every: steps divisible by K are kept forever (None: none).
    """

    keep_last: int = attrs.field(default=3)
    keep_every: int | None = None

    @keep_last.validator
    def _check_last(self, _attr: object, value: int) -> None:
        if value < 1:
            raise ConfigError(f"keep_last must be >= 1, got {value!r}")

    def __attrs_post_init__(self) -> None:
        if self.keep_every is not None and self.keep_every < 1:
            raise ConfigError(f"keep_every must be >= 1 or None, got {self.keep_every!r}")

    @classmethod
    def from_counts(cls, keep_last: int, keep_every: int) -> RetentionPolicy | None:
        """The policy two counts name where a policy travels as ints (a message, a command line):
        ``keep_last`` 0 keeps every checkpoint (None), ``keep_every`` 0 keeps no K-th steps.

        Raises:
            ConfigError: a negative count, or ``keep_every`` without ``keep_last``.
        """
        if keep_last < 0 or keep_every < 0:
            raise ConfigError(f"retention counts must be >= 0, got keep_last={keep_last}, keep_every={keep_every}")
        if not keep_last:
            if keep_every:
                raise ConfigError("keep_every needs keep_last (retention keeps the last N, and every K-th step)")
            return None
        return cls(keep_last, keep_every or None)

    @staticmethod
    def counts(policy: RetentionPolicy | None) -> tuple[int, int]:
        """``(keep_last, keep_every)`` as `from_counts` reads them back."""
        return (0, 0) if policy is None else (policy.keep_last, policy.keep_every or 0)


def select_removals(
    committed: list[int], partial: list[int], tracker_step: int | None, policy: RetentionPolicy
) -> list[int]:
    """Steps whose directories can go.

    Args:
        committed: steps with a manifest.json.
        partial: step directories without one (unfinished writes).
        tracker_step: the step the tracker names (never removed).
        policy: what to keep.

    Returns:
        Committed steps outside the policy, and partial steps older than the tracker (a partial
        step newer than the tracker may still be being written).
    """
    eligible = sorted(s for s in committed if tracker_step is None or s <= tracker_step)
    keep = set(eligible[-policy.keep_last :])
    if policy.keep_every is not None:
        keep |= {s for s in eligible if s % policy.keep_every == 0}
    if tracker_step is not None:
        keep.add(tracker_step)
    newer = {s for s in committed if tracker_step is not None and s > tracker_step}
    gone = [s for s in committed if s not in keep and s not in newer]
    if tracker_step is not None:
        gone += [s for s in partial if s < tracker_step]
    return sorted(gone)


class Committer:
    """Reads and moves the tracker of one checkpoint directory.

    Args:
        storage: the checkpoint directory.
        retention: applied after each commit (None keeps everything).
    """

    def __init__(self, storage: Storage, retention: RetentionPolicy | None = None) -> None:
        self.storage = storage
        self.retention = retention

    def tracker(self) -> Tracker | None:
        """The committed checkpoint, or None when nothing was committed.

        Raises:
            LayoutError: the tracker exists but is malformed.
        """
        if not self.storage.exists(TRACKER_PATH):
            return None
        doc = load_json(self.storage.read_bytes(TRACKER_PATH), TRACKER_FORMAT, TRACKER_PATH)
        try:
            return Tracker(int(doc["step"]), int(doc["world_size"]))
        except (KeyError, TypeError, ValueError):
            raise LayoutError(f"{TRACKER_PATH} lacks step or world_size") from None

    def steps(self) -> tuple[list[int], list[int]]:
        """(committed steps, partial steps) found in storage, ascending."""
        committed: list[int] = []
        partial: list[int] = []
        for name in self.storage.list_dir(""):
            if name.isdigit():
                step = int(name)
                (committed if self.storage.exists(manifest_path(step)) else partial).append(step)
        return sorted(committed), sorted(partial)

    def done_ranks(self, step: int) -> set[int]:
        """Ranks whose done marker for `step` exists."""
        ranks = set()
        for name in self.storage.list_dir(step_dir(step)):
            m = _DONE_RE.match(name)
            if m:
                ranks.add(int(m.group(1)))
        return ranks

    def newer_tracker(self, step: int) -> int | None:
        """The tracker's step if it is at or past `step` now (another writer committed since the
        caller decided), else None; read right before a tracker write, so that the tracker never
        moves back. An unreadable tracker counts as none."""
        try:
            tracker = self.tracker()
        except FlashCkptError:
            return None
        return tracker.step if tracker is not None and tracker.step >= step else None

    def move_tracker(self, step: int, world_size: int) -> int | None:
        """Point the tracker at `step` (of `world_size` ranks) unless a step at or past it is committed.

        The re-read and the write happen under the storage's commit lock where it has one
        (`CommitLocking`), so two writers committing at once never move the tracker back.

        Returns:
            None when the tracker now names `step`; else the committed step that kept it (the
            tracker is then unchanged).

        Raises:
            StorageError: the lock or the tracker write failed (the tracker is unchanged).
        """
        # getattr, not isinstance: a wrapper that delegates through __getattr__ keeps the lock
        # (isinstance on a runtime Protocol looks attributes up statically from Python 3.12 on).
        commit_lock = getattr(self.storage, "commit_lock", None)
        with commit_lock() if commit_lock is not None else contextlib.nullcontext():
            newer = self.newer_tracker(step)
            if newer is not None:
                return newer
            tracker = {"format": TRACKER_FORMAT, "version": FORMAT_VERSION, "step": step, "world_size": world_size}
            self.storage.write_file(TRACKER_PATH, [dump_json(tracker)])
        return None

    def per_rank_done(self, step: int) -> set[int]:
        """Ranks whose done marker for `step` is a per-rank persist's (`persist.persist_rank`)."""
        done = set()
        for rank in self.done_ranks(step):
            try:
                doc = load_json_any(self.storage.read_bytes(done_path(step, rank)), done_path(step, rank))
            except FlashCkptError:
                continue
            if _is_rank_done(doc):
                done.add(rank)
        return done

    def try_commit(self, step: int, world_size: int) -> CommitDecision:
        """Commit `step` if every rank is done and it is newer than the tracker.

        Raises:
            StorageError: writing the manifest or tracker failed (the tracker is unchanged).
        """
        decision = decide_commit(step, world_size, self.done_ranks(step), self.tracker())
        if not decision.commit:
            return decision
        ranks = []
        dones = [
            load_json_any(self.storage.read_bytes(done_path(step, r)), done_path(step, r)) for r in range(world_size)
        ]
        # A done marker of another kind (a sharded DCP persist of the same step, cut short by the
        # failure a node saver is persisting) does not vouch for this rank's per-rank files: wait
        # for the saver to replace it, as for a missing one.
        foreign = tuple(r for r, d in enumerate(dones) if not _is_rank_done(d))
        if foreign:
            return CommitDecision(
                False,
                f"step {step}: the done markers of ranks {list(foreign)} are not per-rank persists' (yet)",
                waiting_for=foreign,
            )
        for rank, done in enumerate(dones):
            ranks.append(
                {
                    "rank": rank,
                    "file": safetensors_path(step, rank).split("/")[-1],
                    "manifest": rank_manifest_path(step, rank).split("/")[-1],
                    "file_bytes": done.get("file_bytes"),
                    "manifest_crc32": done.get("manifest_crc32"),
                }
            )
        doc = {
            "format": CHECKPOINT_FORMAT,
            "version": FORMAT_VERSION,
            "step": step,
            "world_size": world_size,
            "ranks": ranks,
        }
        self.storage.write_file(manifest_path(step), [dump_json(doc)])
        newer = self.move_tracker(step, world_size)
        if newer is not None:
            return CommitDecision(False, f"step {step} is complete, but step {newer} was committed meanwhile")
        if self.retention is not None:
            try:
                self.apply_retention()
            except StorageError as exc:
                # The step is committed (the tracker moved); failing to delete old steps only
                # costs space, and the next commit tries again.
                _log.warning("step %d committed, but removing old checkpoints failed: %s", step, exc)
                return attrs.evolve(decision, reason=f"{decision.reason}; retention failed: {exc}")
        return decision

    def apply_retention(self) -> list[int]:
        """Remove the step directories the retention policy does not keep; returns them."""
        if self.retention is None:
            return []
        tracker = self.tracker()
        committed, partial = self.steps()
        gone = select_removals(committed, partial, tracker.step if tracker else None, self.retention)
        for step in gone:
            self.storage.remove_tree(step_dir(step))
        return gone


def _is_rank_done(done: dict[str, object]) -> bool:
    """Whether a done marker is `persist.persist_rank`'s (sizes and checksum of the rank's files)."""
    return "format" not in done and all(
        isinstance(done.get(k), int) and not isinstance(done.get(k), bool) for k in ("file_bytes", "manifest_crc32")
    )


def load_json_any(raw: bytes, what: str) -> dict[str, object]:
    """Parse a JSON object (a done marker).

    Raises:
        StorageError: the document is not a JSON object.
    """
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StorageError(f"{what} is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise StorageError(f"{what} is not a JSON object")
    return doc
