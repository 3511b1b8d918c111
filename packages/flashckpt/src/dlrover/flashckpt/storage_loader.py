"""Load a rank's state from the newest committed checkpoint, falling back past damaged ones.

Candidates are the committed steps (those with a ``manifest.json``) not newer than the tracker,
newest first. A missing or truncated file, or a tensor whose CRC-32 differs, makes the loader warn
(naming the file) and try the previous committed checkpoint. Tensors are verified before any byte
reaches the caller's state, so a damaged checkpoint changes nothing.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import torch

from dlrover.common import Clock, SystemClock
from dlrover.flashckpt.checksum import crc32
from dlrover.flashckpt.ckpt_format import (
    CHECKPOINT_FORMAT,
    RANK_FORMAT,
    load_json,
    manifest_path,
    rank_manifest_path,
    safetensors_path,
)
from dlrover.flashckpt.commit import Committer
from dlrover.flashckpt.dtypes import dtype_from_name
from dlrover.flashckpt.errors import (
    ChecksumError,
    LayoutError,
    NoCheckpointError,
    StorageError,
    WorldSizeError,
)
from dlrover.flashckpt.events import EventLog, FlashEvent
from dlrover.flashckpt.layout import TensorSpec
from dlrover.flashckpt.memory import LoadedState
from dlrover.flashckpt.restore import apply_values, match_targets, tie_conflicts
from dlrover.flashckpt.safetensors_format import parse_header
from dlrover.flashckpt.storage.base import Storage
from dlrover.flashckpt.tree import build_tree

__all__ = ["RankFile", "StorageReader", "parse_step_manifest", "read_rank_file", "read_step_manifest", "verify_tensor"]

_log = logging.getLogger(__name__)

_CHUNK = 16 << 20


@attrs.frozen
class RankFile:
    """One rank's files of a committed plain-format step, their manifest checked.

    Attributes:
        rank: the rank.
        path: its safetensors file.
        data_start: where the file's data section starts.
        tree: its state's JSON tree.
        specs: its tensors (offsets relative to `data_start`).
        crcs: each tensor's CRC-32.
    """

    rank: int
    path: str
    data_start: int
    tree: dict[str, Any]
    specs: tuple[TensorSpec, ...]
    crcs: tuple[int, ...]


def read_step_manifest(storage: Storage, step: int) -> dict[str, Any]:
    """A committed plain-format step's manifest.

    Raises:
        LayoutError: it is not one (another format, malformed).
        StorageError: it cannot be read.
    """
    return parse_step_manifest(storage.read_bytes(manifest_path(step)), step)


def parse_step_manifest(raw: bytes, step: int) -> dict[str, Any]:
    """`read_step_manifest` of bytes already read.

    Raises:
        LayoutError: they are not a plain-format step manifest.
    """
    return load_json(raw, CHECKPOINT_FORMAT, manifest_path(step))


def read_rank_file(storage: Storage, step: int, rank: int, man: dict[str, Any]) -> RankFile:
    """Rank `rank`'s manifest of `step`, checked against the step's manifest `man`, and its file's size and header.

    Raises:
        ChecksumError: the rank manifest does not match its CRC-32, or the file has another size.
        LayoutError: `man` lists no such rank, or a document or header is malformed.
        StorageError: a file cannot be read.
    """
    entries = {e.get("rank"): e for e in man.get("ranks", []) if isinstance(e, dict)}
    entry = entries.get(rank)
    if entry is None:
        raise LayoutError(f"{manifest_path(step)} lists no rank {rank}")
    rpath = rank_manifest_path(step, rank)
    raw = storage.read_bytes(rpath)
    if crc32(raw) != entry.get("manifest_crc32"):
        raise ChecksumError(f"{rpath} does not match its checksum in {manifest_path(step)}")
    doc = load_json(raw, RANK_FORMAT, rpath)
    specs = tuple(TensorSpec.from_json(t) for t in doc["tensors"])
    crcs = tuple(int(t["crc32"]) for t in doc["tensors"])
    fpath = safetensors_path(step, rank)
    size = storage.size(fpath)
    if size != doc.get("file_bytes"):
        raise ChecksumError(f"{fpath} has {size} bytes, its manifest says {doc.get('file_bytes')} (truncated?)")
    data_start = int(doc["data_start"])
    start, _ = parse_header(storage.read_bytes(fpath, 0, data_start))
    if start != data_start:
        raise LayoutError(f"{fpath}: header ends at {start}, the manifest says {data_start}")
    return RankFile(rank, fpath, data_start, doc["tree"], specs, crcs)


def verify_tensor(storage: Storage, rf: RankFile, index: int) -> None:
    """Check tensor `index` of a rank's file against its CRC-32, reading it a chunk at a time.

    Raises:
        ChecksumError: it does not match (the message names the tensor and the file).
        StorageError: it cannot be read.
    """
    spec, value = rf.specs[index], 0
    for off in range(0, spec.nbytes, _CHUNK):
        n = min(_CHUNK, spec.nbytes - off)
        value = crc32(storage.read_bytes(rf.path, rf.data_start + spec.offset + off, n), value)
    if value != rf.crcs[index]:
        raise ChecksumError(f"tensor {spec.name!r} in {rf.path} does not match its checksum")


class StorageReader:
    """Loads committed checkpoints for one rank.

    Args:
        storage: the checkpoint directory.
        events: where fallbacks are recorded (a new log when None).
        clock: time source for event timestamps.
    """

    def __init__(self, storage: Storage, events: EventLog | None = None, clock: Clock | None = None) -> None:
        self.storage = storage
        self.events = events or EventLog()
        self._clock = clock or SystemClock()
        self._committer = Committer(storage)

    def _warn(self, step: int, reason: str) -> None:
        self.events.record(FlashEvent("fallback", step, reason, self._clock.wall_time()))

    def candidates(self) -> list[int]:
        """Committed steps to try, newest first (never newer than the tracker)."""
        committed, _ = self._committer.steps()
        try:
            tracker = self._committer.tracker()
        except (LayoutError, StorageError) as e:
            self._warn(-1, f"the tracker is unreadable ({e}); trying every committed step")
            tracker = None
        if tracker is not None and tracker.step not in committed:
            self._warn(tracker.step, f"the tracker names step {tracker.step}, which is missing or incomplete")
        limit = tracker.step if tracker is not None else None
        return sorted((s for s in committed if limit is None or s <= limit), reverse=True)

    def load(
        self,
        rank: int,
        world_size: int,
        target: Any | None = None,
        step: int | None = None,
        any_world_size: bool = False,
    ) -> LoadedState:
        """Load `rank`'s state from the newest good committed checkpoint (or from `step`).

        Args:
            rank: whose files to read.
            world_size: the job's world size; a checkpoint of another size is refused.
            target: an existing state to restore into in place, or None for fresh tensors.
            step: load only this step.
            any_world_size: accept a checkpoint of any world size that has `rank`'s files (a
                replicated state, which every rank saved alike, fits any number of ranks).

        Raises:
            NoCheckpointError: no committed checkpoint could be loaded (reasons listed).
            WorldSizeError: the checkpoint was saved by a different number of ranks.
            StateStructureError: `target` does not match the checkpoint (nothing changed).
        """
        steps = [step] if step is not None else self.candidates()
        reasons = []
        for s in steps:
            try:
                return self._load_step(s, rank, None if any_world_size else world_size, target)
            except (ChecksumError, LayoutError, StorageError) as e:
                reasons.append(f"step {s}: {e}")
                # With one step asked for, the caller decides what comes next (and says so).
                then = "" if step is not None else "; trying the previous one"
                self._warn(s, f"checkpoint step {s} is unusable: {e}{then}")
        raise NoCheckpointError(
            "no loadable committed checkpoint" + (": " + "; ".join(reasons) if reasons else " in storage")
        )

    def _load_step(self, step: int, rank: int, world_size: int | None, target: Any | None) -> LoadedState:
        man = read_step_manifest(self.storage, step)
        if world_size is not None and man.get("world_size") != world_size:
            raise WorldSizeError(
                f"checkpoint step {step} was saved by {man.get('world_size')} ranks; this job has {world_size} "
                "and plain state dicts cannot be resharded (use the DCP adapter for sharded state)"
            )
        rf = read_rank_file(self.storage, step, rank, man)
        fpath, data_start, tree, specs = rf.path, rf.data_start, rf.tree, rf.specs
        if target is not None:
            plan = match_targets(target, tree, specs)
            self._read_in_place(rf, plan.places)
            state = apply_values(target, tree)
            conflict = tie_conflicts(
                plan, specs, lambda j, i: (specs[j].nbytes, rf.crcs[j]) != (specs[i].nbytes, rf.crcs[i])
            )
            if conflict is not None:
                _log.warning("restoring step %d from %s: %s", step, fpath, conflict)
                self.events.record(FlashEvent("tie_conflict", step, conflict, self._clock.wall_time()))
        else:
            tensors = []
            for spec, crc in zip(specs, rf.crcs, strict=True):
                t = torch.empty(spec.shape, dtype=dtype_from_name(spec.dtype))
                self._read_tensor(fpath, data_start, spec, t)
                if _crc_tensor(t) != crc:
                    raise ChecksumError(f"tensor {spec.name!r} in {fpath} does not match its checksum")
                tensors.append(t)
            state = build_tree(tree, tensors)
        return LoadedState(state, step, "storage", True, f"{fpath} (step {step})")

    def _read_in_place(self, rf: RankFile, places: list[list[torch.Tensor]]) -> None:
        """Verify every tensor of the file, then read each into its places (the first read, the others copied)."""
        for i in range(len(rf.specs)):
            verify_tensor(self.storage, rf, i)
        for spec, targets in zip(rf.specs, places, strict=True):
            if not targets:
                continue  # its memory is an earlier tensor's place (tied in the state, saved apart)
            self._read_tensor(rf.path, rf.data_start, spec, targets[0])
            with torch.no_grad():
                for t in targets[1:]:
                    t.copy_(targets[0])

    def _read_tensor(self, fpath: str, data_start: int, spec: TensorSpec, t: torch.Tensor) -> None:
        if spec.nbytes == 0:
            return
        direct = t.device.type == "cpu" and t.is_contiguous()
        buf = t if direct else torch.empty(spec.shape, dtype=t.dtype)
        raw = buf.detach().reshape(-1).view(torch.uint8).numpy()
        self.storage.read_into(fpath, data_start + spec.offset, raw.data)
        if not direct:
            with torch.no_grad():
                t.copy_(buf)


def _crc_tensor(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    return crc32(t.detach().reshape(-1).view(torch.uint8).numpy().data)
