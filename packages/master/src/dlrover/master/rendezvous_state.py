"""Export and restore a `RendezvousManager`'s state as JSON, so a restarted master keeps rounds and ranks.

Format (version 1)::

    {
      "format": "dlrover.master.rendezvous",
      "version": 1,
      "round_number": 3,              # the latest completed round; never goes back
      "closed": false,
      "reopened": false,              # a member joined again while its round was in force
      "current": {"number": 3, "members": ["0", "1"], "reason": "...",
                  "local_world_sizes": [4, 2]} | null,   # workers of each member, by rank
      "last_ranks": {"0": 0, "1": 1}, # who had which rank: a rejoining node keeps its rank
      "waiting": [["2", "topology-key", 4], ...],   # join order; the last: its local world size
      "dropped": {"5": "round 2 dissolved: ..."}, # nodes told to join again, and why
      "finished": ["1"]               # members of the current round whose processes succeeded
    }

What is not kept: times. Monotonic readings of the previous master mean nothing to the next
one, so on restore every member (but a finished one, which is never expected to call again) and
waiting node counts as just seen and waiting nodes as just joined (the same fresh start the node
lifecycle gives live nodes). ``finished`` and ``local_world_sizes`` may be absent, and a waiting
entry may lack its local world size (documents written before they existed): a round restored
without them has no worker layout, so its members rendezvous again.

The rendezvous library has no export of its own yet; this module reads and writes the manager's
fields directly and is the only place that does. `tests/test_rendezvous_state.py` round-trips
every field through the public API, so a change in the library fails a test here, not a job.
"""

from __future__ import annotations

import json
from typing import Any

from dlrover.master.journal import JournalError
from dlrover.rendezvous import MAX_LOCAL_WORLD_SIZE, MAX_NODE_ID_CHARS, RendezvousManager, Round
from dlrover.rendezvous.manager import _Waiter

__all__ = ["RENDEZVOUS_STATE_FORMAT", "RENDEZVOUS_STATE_VERSION", "export_rendezvous", "restore_rendezvous"]

RENDEZVOUS_STATE_FORMAT = "dlrover.master.rendezvous"
RENDEZVOUS_STATE_VERSION = 1


def export_rendezvous(manager: RendezvousManager) -> str:
    """The manager's rounds, ranks, waiting list and drop reasons as JSON (keys sorted).

    Not thread-safe: hold the lock the rendezvous service uses.
    """
    current = manager.current_round
    waiting = [
        [node, manager._waiting[node].topology_key, manager._waiting[node].local_world_size] for node in manager.waiting
    ]
    doc = {
        "format": RENDEZVOUS_STATE_FORMAT,
        "version": RENDEZVOUS_STATE_VERSION,
        "round_number": manager.round_number,
        "closed": manager.closed,
        "reopened": manager._reopened,
        "current": None
        if current is None
        else {
            "number": current.number,
            "members": list(current.members),
            "reason": current.reason,
            "local_world_sizes": list(current.local_world_sizes),
        },
        "last_ranks": dict(manager._last_ranks),
        "waiting": waiting,
        "dropped": dict(manager._dropped),
        "finished": sorted(manager.finished),
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _bad(message: str) -> JournalError:
    return JournalError(f"rendezvous state: {message}")


def _node(value: object, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NODE_ID_CHARS:
        raise _bad(f"{where} must be a node id (1..{MAX_NODE_ID_CHARS} characters), got {value!r}")
    return value


def _int(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _bad(f"{where} must be a non-negative integer, got {value!r}")
    return value


def _parse(text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise _bad(f"not valid JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != RENDEZVOUS_STATE_FORMAT:
        raise _bad(f"format must be {RENDEZVOUS_STATE_FORMAT!r}")
    if doc.get("version") != RENDEZVOUS_STATE_VERSION:
        raise _bad(f"version {doc.get('version')!r} is not supported (this build reads {RENDEZVOUS_STATE_VERSION})")
    return doc


def _round(raw: object, round_number: int, manager: RendezvousManager, now: float) -> Round | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("members"), list) or not raw["members"]:
        raise _bad(f"current must be null or a round with members, got {raw!r}")
    members = tuple(_node(m, "current.members[]") for m in raw["members"])
    if len(set(members)) != len(members):
        raise _bad(f"current.members has duplicates: {members!r}")
    if _int(raw.get("number"), "current.number") != round_number:
        raise _bad(f"current.number {raw.get('number')!r} is not round_number {round_number}")
    reason = raw.get("reason")
    sizes_raw = raw.get("local_world_sizes", [])
    if not isinstance(sizes_raw, list) or (sizes_raw and len(sizes_raw) != len(members)):
        raise _bad(f"current.local_world_sizes must be a list with one size per member, got {sizes_raw!r}")
    sizes = tuple(_size(v, "current.local_world_sizes[]") for v in sizes_raw)
    return Round(round_number, members, now, manager.config, reason if isinstance(reason, str) else "", sizes)


def _size(value: object, where: str) -> int:
    size = _int(value, where)
    if size > MAX_LOCAL_WORLD_SIZE:
        raise _bad(f"{where} must be at most {MAX_LOCAL_WORLD_SIZE}, got {size}")
    return size


def _waiting(raw: list[Any]) -> list[tuple[str, str, int]]:
    waiting: list[tuple[str, str, int]] = []
    for entry in raw:
        if not isinstance(entry, list) or len(entry) not in (2, 3) or not isinstance(entry[1], str):
            raise _bad(f"waiting entries must be [node id, topology key, local world size], got {entry!r}")
        size = _size(entry[2], "waiting[][2]") if len(entry) == 3 else 0
        waiting.append((_node(entry[0], "waiting[]"), entry[1], size))
    if len({entry[0] for entry in waiting}) != len(waiting):
        raise _bad(f"waiting lists a node twice: {waiting!r}")
    return waiting


def restore_rendezvous(manager: RendezvousManager, text: str, now: float) -> None:
    """Load an `export_rendezvous` document into a manager that has seen no call yet.

    Everything is validated before the manager is touched, so a corrupt document changes nothing.

    Raises:
        JournalError: the document is malformed, of another version, or inconsistent.
    """
    doc = _parse(text)
    round_number = _int(doc.get("round_number"), "round_number")
    closed, reopened = doc.get("closed"), doc.get("reopened")
    if not isinstance(closed, bool) or not isinstance(reopened, bool):
        raise _bad(f"closed and reopened must be booleans, got {closed!r} and {reopened!r}")
    current = _round(doc.get("current"), round_number, manager, now)
    last_ranks_raw, dropped_raw, waiting_raw = doc.get("last_ranks"), doc.get("dropped"), doc.get("waiting")
    if not isinstance(last_ranks_raw, dict) or not isinstance(dropped_raw, dict) or not isinstance(waiting_raw, list):
        raise _bad("last_ranks and dropped must be objects and waiting a list")
    last_ranks = {_node(k, "last_ranks key"): _int(v, f"last_ranks[{k!r}]") for k, v in last_ranks_raw.items()}
    dropped = {_node(k, "dropped key"): str(v) for k, v in dropped_raw.items()}
    waiting = _waiting(waiting_raw)
    finished_raw = doc.get("finished", [])
    if not isinstance(finished_raw, list):
        raise _bad(f"finished must be a list, got {finished_raw!r}")
    finished = {_node(n, "finished[]") for n in finished_raw}
    if finished - set(current.members if current is not None else ()):
        raise _bad(f"finished names nodes outside the current round: {sorted(finished)!r}")
    if finished & {entry[0] for entry in waiting}:
        raise _bad(f"finished names nodes that are waiting: {sorted(finished)!r}")
    if manager.round_number or manager.tracked or manager.current_round is not None:
        raise _bad("restore needs a fresh manager")
    # The document is sound: apply it.
    manager._round_number = round_number
    manager._current = current
    manager._last_ranks = last_ranks
    manager._dropped = dropped
    manager._closed = closed
    manager._finished = set(finished)
    if current is not None:
        for member in current.members:
            if member not in finished:
                manager._last_seen[member] = now
    # Waiting nodes wait on, as if they had just joined; a round they complete forms on the next
    # call, as it would have on the old master.
    for node, key, size in waiting:
        manager._waiting[node] = _Waiter(joined_at=now, topology_key=key, local_world_size=size)
        manager._last_seen[node] = now
    manager._last_join_at = now if waiting else None
    manager._reopened = reopened
