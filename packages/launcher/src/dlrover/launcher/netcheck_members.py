"""When the network check may skip its probes: the same nodes just passed them together. Pure.

The check costs every node its probes (seconds) before any worker starts, and a restart after a
worker failure pays them again for the same machines and links. So at the start of a round's
check every node publishes its node id and, if its previous check probed and passed without a
warning, the membership of that check (`MemberReport`, under `member_key`), and reads every other
node's. The probes are skipped when every node of the round reports a pass with exactly this
round's set of nodes (`may_skip`). Each node decides from the same keys, so all skip or all probe.

A pass is good for one skip (the check that uses it records none), so a node that keeps failing
is probed again at the restart after next rather than burning every restart. A node whose agent
restarted remembers no pass, and a node that joined, left or was replaced changes the set: either
makes every node probe.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import attrs

from dlrover.launcher.netcheck_plan import round_keys_prefix

__all__ = ["MemberReport", "member_key", "membership_digest", "may_skip"]


def member_key(round_number: int, node: str) -> str:
    """Where node `node` (its node rank in the round) publishes its `MemberReport` (write-once)."""
    return f"{round_keys_prefix(round_number)}/member/{node}"


def membership_digest(node_ids: Sequence[str]) -> str:
    """A name for a set of nodes, the same whatever their order."""
    return hashlib.sha256(json.dumps(sorted(node_ids)).encode()).hexdigest()


@attrs.frozen
class MemberReport:
    """One node's entry in the membership exchange.

    Attributes:
        node_id: the node's id with the master.
        passed: `membership_digest` of the nodes of its previous check, if that check probed and
            passed without a warning; "" otherwise.
    """

    node_id: str
    passed: str = ""

    def encode(self) -> bytes:
        """Canonical JSON, as published in the master's store."""
        return json.dumps({"node_id": self.node_id, "passed": self.passed}, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> MemberReport | None:
        """The report in `raw`, or None for anything else (the missing marker, damage)."""
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, ValueError):
            return None
        if not isinstance(doc, dict) or set(doc) != {"node_id", "passed"}:
            return None
        node_id, passed = doc["node_id"], doc["passed"]
        if not isinstance(node_id, str) or not node_id or not isinstance(passed, str):
            return None
        return cls(node_id, passed)


def may_skip(reports: Sequence[MemberReport | None]) -> str | None:
    """The digest of the round's nodes when every one passed a check with exactly them, else None.

    Args:
        reports: every node's report, by node rank; None where a node's report is missing.
    """
    if not reports or any(r is None for r in reports):
        return None
    ids = [r.node_id for r in reports if r is not None]
    if len(set(ids)) != len(ids):
        return None  # two nodes under one id: nothing here can be trusted
    digest = membership_digest(ids)
    return digest if all(r is not None and r.passed == digest for r in reports) else None
