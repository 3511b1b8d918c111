"""The size of a PS job: from its flags, or, when it gives none, from the profile of the most similar earlier one.

A PS job submitted with none of `--ps`, `--workers`, `--min-workers` and the role resource flags is sized by
`dlrover.autoscale.plan_ps_from_runs` from the profile store (the same store, rules of similarity and set-aside
handling as other jobs: `dlrover.master.profiles`). Its master records its own profile at the end
(`build_ps_profile`), so the next run of the same script starts the way this one ended: with the parameter servers
it grew to, the memory each role peaked at, and the worker count it trained fastest with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from dlrover.autoscale import (
    JobSignature,
    PsPlanConfig,
    PsRunPlan,
    Resources,
    Role,
    RoleProfile,
    RunProfile,
    plan_ps_from_runs,
)
from dlrover.master.profiles import read_profiles, script_of
from dlrover.master.psjob.spec import PS_ROLES, PsJobSpec
from dlrover.master.psjob.tf_checkpoint import CheckpointSizes

__all__ = ["DEFAULT_PS_JOB_NAME", "PsPlanChoice", "build_ps_profile", "plan_ps_job", "ps_signature"]

DEFAULT_PS_JOB_NAME = "ps-job"
_MIB = 1024 * 1024


@attrs.frozen
class PsPlanChoice:
    """Where a PS job's counts and resources came from; its master announces it at start (`initial_plan` event).

    Attributes:
        source: `flags`, `profile` or `defaults`.
        reason: the sentence saying which and why.
        profile_id: the profile it came from (None otherwise).
        store_notice: what happened to the profile store ("" when it opened as it was, or none was read).
    """

    source: str
    reason: str
    profile_id: int | None = None
    store_notice: str = ""

    def to_data(self, spec: PsJobSpec) -> dict[str, Any]:
        """The event's data: the choice and the size it gave."""
        return {
            "source": self.source,
            "profile_id": self.profile_id,
            "ps": spec.ps,
            "workers": spec.workers,
            "min_workers": spec.min_workers,
            "evaluator": spec.evaluator,
            "resources": {role.value: r.to_json() for role, r in spec.resources.items()},
            "store_notice": self.store_notice,
        }


def ps_signature(job_name: str, command: Sequence[str], job_kind: str = "") -> JobSignature:
    """What is known of a PS job at submission: its name (unless the default), the chief's script and its kind."""
    name = "" if job_name == DEFAULT_PS_JOB_NAME else job_name
    return JobSignature(job_name=name, script=script_of(command), job_kind=job_kind)


def plan_ps_job(
    profile_store: str | None,
    signature: JobSignature,
    config: PsPlanConfig,
    *,
    wall_time: float,
    look_only: bool = False,
) -> tuple[PsRunPlan, PsPlanChoice]:
    """The size of a PS job that gave no counts or resources, from the store at `profile_store` (None: none).

    A store that cannot be read never stops the job: it is set aside and the defaults are used, and the choice's
    `store_notice` says so.
    """
    runs, notes, notice = read_profiles(profile_store, wall_time, look_only=look_only)
    plan = plan_ps_from_runs(runs, signature, config, notes=notes)
    profile_id = None if plan.profile is None else plan.profile.profile_id
    return plan, PsPlanChoice(plan.source, plan.reason, profile_id, notice)


def _largest(resources: Sequence[Resources]) -> Resources | None:
    return max(resources, key=lambda r: (r.memory_mb, r.cpu_milli, r.gpu)) if resources else None


def build_ps_profile(
    signature: JobSignature,
    spec: PsJobSpec,
    *,
    outcome: str,
    exit_reason: str,
    launched: Mapping[Role, Sequence[Resources]],
    peak_memory_mb: Mapping[Role, float | None],
    workers_at_end: int,
    throughput: Mapping[int, float],
    checkpoint: CheckpointSizes | None,
    checkpoint_note: str,
    wall_time: float,
) -> RunProfile:
    """A finished PS job's profile.

    Args:
        signature: what was known of it at submission.
        spec: its spec at the end (after any parameter server was added).
        outcome: `succeeded`, `failed` or `stopped`.
        exit_reason: why it ended.
        launched: what each role's tasks were launched with (OOM growth included); the largest is kept.
        peak_memory_mb: the most memory a task of each role reached (None: not measured).
        workers_at_end: how many workers ran at the end.
        throughput: samples per second by running worker count.
        checkpoint: the sizes of its newest checkpoint (None: none was read).
        checkpoint_note: where those came from, or why there are none.
        wall_time: now.
    """
    roles = [
        RoleProfile(
            role,
            spec.count(role),
            _largest(launched.get(role, ())) or spec.resources.get(role),
            peak_memory_mb.get(role),
        )
        for role in PS_ROLES
        if spec.count(role)
    ]
    return RunProfile(
        signature=signature,
        outcome=outcome,
        exit_reason=exit_reason,
        node_resources=spec.resources.get(Role.WORKER),
        min_nodes=spec.min_workers,
        max_nodes=spec.workers,
        final_nodes=max(0, min(workers_at_end, spec.workers)),
        throughput=tuple(throughput.items()),
        parameter_count=None if checkpoint is None else checkpoint.parameter_count,
        state_bytes=None if checkpoint is None else checkpoint.total_bytes,
        checkpoint_bytes=None if checkpoint is None else checkpoint.total_bytes,
        checkpoint_note=checkpoint_note,
        finished_at=wall_time,
        roles=roles,
    )
