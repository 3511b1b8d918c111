"""A restarted master keeps the size its job was planned with.

A job submitted without node counts or resources is sized from the profile store at its start
(`dlrover.master.profiles.plan_job`). The store changes while the job runs (other jobs end and
record profiles), so planning again when the master restarts could give another size: the
journal would then hold "another job" and the master could not resume. The plan a job started
with is in its journal (the job record's identity and the `initial_plan` event); this module
reads it back so the restarted master resumes with exactly that.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from dlrover.autoscale import Resources
from dlrover.common import DLRoverError
from dlrover.master.config import MasterConfig, NodeRange
from dlrover.master.journal import DB_FILE_NAME, JournalError, SqliteJournal
from dlrover.master.profiles import JobPlanChoice

__all__ = ["INITIAL_PLAN_EVENT", "journaled_plan"]

INITIAL_PLAN_EVENT = "initial_plan"
"""The event a master journals once at start, saying where the job's size came from."""

_PLANNED_SOURCES = ("profile", "defaults")


def journaled_plan(config: MasterConfig) -> tuple[MasterConfig, JobPlanChoice] | None:
    """`config` sized as the job in `config.state_dir` was planned at its start, or None when that
    directory holds no journal of a job that was planned (a new job, or one sized by flags).

    Raises:
        JournalError: the journal exists but cannot be read, or its plan is not one this master
            reads (a restart must not silently size the job afresh).
    """
    if not config.state_dir or not (Path(config.state_dir) / DB_FILE_NAME).exists():
        return None
    journal = SqliteJournal(config.state_dir)
    try:
        job = journal.load().job
        identity = None if job is None else job.get("job_identity")
        if not isinstance(identity, dict) or identity.get("job_name") != config.job_name:
            return None  # another job's directory: the master itself refuses it, naming why
        plan = _first_plan_event(journal)
    finally:
        journal.close()
    if plan is None or plan.get("source") not in _PLANNED_SOURCES:
        return None
    try:
        nodes = NodeRange(
            min_nodes=int(identity["min_nodes"]),
            max_nodes=int(identity["max_nodes"]),
            node_unit=int(identity["node_unit"]),
        )
        raw = plan.get("resources")
        resources = None if raw is None else Resources.from_json(raw)
        profile_id = plan.get("profile_id")
        choice = JobPlanChoice(
            str(plan["source"]),
            f"resumed with the plan the job started with ({plan['source']}): "
            f"{nodes.min_nodes}:{nodes.max_nodes} node(s)"
            + ("" if resources is None else f" of {resources.to_json()}"),
            None if profile_id is None else int(profile_id),
            int(plan["nodes"]),
            resources,
        )
    except (KeyError, TypeError, ValueError, DLRoverError) as exc:
        raise JournalError(f"the journaled initial plan in {config.state_dir} cannot be read: {exc}") from exc
    lifecycle = attrs.evolve(config.lifecycle, nodes=nodes, node_resources=resources)
    return attrs.evolve(config, lifecycle=lifecycle, initial_plan=choice), choice


def _first_plan_event(journal: SqliteJournal) -> dict[str, Any] | None:
    after = 0
    while True:
        page = journal.events(after_seq=after, limit=1000)
        if not page:
            return None
        for event in page:
            if event.kind == INITIAL_PLAN_EVENT:
                return dict(event.data)
        after = page[-1].seq
