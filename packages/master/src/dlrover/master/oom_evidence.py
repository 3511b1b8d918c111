"""Which of a node's kernel OOM kills the master has already turned into failure evidence.

A node's memory cgroup counts OOM kills for the node's whole life (`NodeMemoryRecords`), across
in-place restarts of its processes and across a master restart that adopts the node. The master
adds the kernel's record to a failure's evidence only for kills not yet used, so a later crash of
the same node is not read as host OOM again. The counts are journaled in the same transaction as
the failure that used them: a restarted master resumes from them instead of seeing every earlier
kill as new.
"""

from __future__ import annotations

import json

import attrs

from dlrover.master.journal import Blob, JournalError

__all__ = ["OOM_EVIDENCE_BLOB", "OomEvidenceLedger"]

OOM_EVIDENCE_BLOB = "master.oom_evidence"
"""The ledger's blob name in the master's journal."""

_FORMAT = "dlrover.oom-evidence"
_VERSION = 1


@attrs.frozen
class OomEvidenceLedger:
    """Per node, the OOM kill count already used as evidence; immutable (each use makes a new one).

    Attributes:
        used: node id -> the highest kill count a journaled failure carried.
        version: grows with every change (the journal's blob version).
    """

    used: dict[int, int] = attrs.field(factory=dict)
    version: int = 0

    def unused(self, node_id: int, kills: int) -> bool:
        """Whether `kills` (the node's cgroup count now) holds kills no failure carried yet."""
        return kills > self.used.get(node_id, 0)

    def seen(self, node_id: int) -> int:
        """The kill count the node's last failure with memory evidence carried (0: none)."""
        return self.used.get(node_id, 0)

    def using(self, node_id: int, kills: int) -> OomEvidenceLedger:
        """The ledger once a failure carrying the node's count `kills` is journaled."""
        if not self.unused(node_id, kills):
            return self
        return OomEvidenceLedger({**self.used, node_id: kills}, self.version + 1)

    def to_blob(self) -> Blob:
        """The journal blob of this ledger."""
        doc = {"format": _FORMAT, "version": _VERSION, "used": {str(n): k for n, k in sorted(self.used.items())}}
        return Blob(self.version, json.dumps(doc, separators=(",", ":")))

    @classmethod
    def from_blob(cls, blob: Blob | None) -> OomEvidenceLedger:
        """The ledger a journal blob holds (an empty one for None).

        Raises:
            JournalError: the blob is not a ledger this master reads.
        """
        if blob is None:
            return cls()
        try:
            doc = json.loads(blob.data)
        except ValueError as exc:
            raise JournalError(f"OOM evidence ledger: not valid JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
            raise JournalError(f"OOM evidence ledger: not a {_FORMAT!r} document")
        if doc.get("version") != _VERSION:
            raise JournalError(f"OOM evidence ledger: version {doc.get('version')!r}; this master reads {_VERSION}")
        used = doc.get("used")
        if not isinstance(used, dict):
            raise JournalError("OOM evidence ledger: `used` must map node ids to kill counts")
        parsed: dict[int, int] = {}
        for node, kills in used.items():
            if not (isinstance(node, str) and node.isdigit()) or type(kills) is not int or kills < 0:
                raise JournalError(f"OOM evidence ledger: bad entry {node!r}: {kills!r}")
            parsed[int(node)] = kills
        return cls(parsed, blob.version)
