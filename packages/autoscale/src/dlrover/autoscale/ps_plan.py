"""The first size of a parameter-server job submitted without counts or resources, from an earlier job's profile.

A parameter-server job's profile (`RunProfile` with `roles`) says how many parameter servers and workers it ended
with (after any server its master added), what each role was launched with (after any OOM growth), and the most
memory any task of each role reached. The most similar one (`most_similar`, same rules as other jobs) sizes the new
job:

- parameter servers: as many as it ended with; each with the memory it peaked at times `memory_headroom` (rounded
  up to `memory_step_mb`), or what it was launched with when that was more. Servers hold the model's variables, so
  this is the model's size per server plus TensorFlow's own; when one server would need more than
  `max_task_memory_mb`, the model is spread over more servers (at most `max_ps`), each needing less;
- workers: the count it measured the most samples per second at (its final count when it measured none), within
  its range and `max_workers`;
- chief and evaluator: one each as it had, memory sized the same way;
- CPU: what each role was launched with (a host that does not enforce CPU measures no need for more).

Without a similar profile: `default_ps` servers and `default_workers` workers, nothing asked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from dlrover.autoscale._validate import positive_int, positive_number
from dlrover.autoscale.resources import Resources, Role
from dlrover.autoscale.run_profiles import JobSignature, RoleProfile, RunProfile, most_similar
from dlrover.common import ConfigError

__all__ = ["PsPlanConfig", "PsRunPlan", "plan_ps_from_runs"]


def _optional_positive_int(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ConfigError(f"{attribute.name} must be None or an integer >= 1, got {value!r}")


@attrs.frozen
class PsPlanConfig:
    """How a parameter-server job that asks for nothing is sized.

    Args:
        default_ps: parameter servers when no earlier job is similar.
        default_workers: workers then.
        memory_headroom: a role's measured peak memory is multiplied by this for its request (> 1: the next run
            may use a little more; an OOM kill costs a relaunch).
        memory_step_mb: requests are rounded up to a multiple of this.
        max_task_memory_mb: no task is asked more memory than this; parameter servers that would need more are
            more servers instead (None: no limit).
        max_ps: the most parameter servers a plan has.
        max_workers: the most workers (None: the profile's own range).
    """

    default_ps: int = attrs.field(default=1, validator=positive_int)
    default_workers: int = attrs.field(default=1, validator=positive_int)
    memory_headroom: float = attrs.field(default=1.5, validator=positive_number)
    memory_step_mb: int = attrs.field(default=64, validator=positive_int)
    max_task_memory_mb: int | None = attrs.field(default=None, validator=_optional_positive_int)
    max_ps: int = attrs.field(default=16, validator=positive_int)
    max_workers: int | None = attrs.field(default=None, validator=_optional_positive_int)

    def __attrs_post_init__(self) -> None:
        if self.memory_headroom < 1:
            raise ConfigError(f"memory_headroom must be >= 1 (a request below the peak is an OOM), got "
                              f"{self.memory_headroom!r}")  # fmt: skip
        if self.default_ps > self.max_ps:
            raise ConfigError(f"default_ps {self.default_ps} is over max_ps {self.max_ps}")


@attrs.frozen
class PsRunPlan:
    """A parameter-server job's first size, and why.

    Args:
        ps: parameter servers.
        workers: workers it starts with.
        min_workers: the fewest it trains with.
        evaluator: whether it runs an evaluator.
        resources: each role's request (a role absent: nothing asked).
        profile: the earlier job it came from (None: the defaults).
        reason: a sentence saying which and why.
    """

    ps: int
    workers: int
    min_workers: int
    evaluator: bool
    resources: Mapping[Role, Resources]
    profile: RunProfile | None
    reason: str

    @property
    def source(self) -> str:
        """`profile` or `defaults`."""
        return "defaults" if self.profile is None else "profile"


def _round_up(value: float, step: int) -> int:
    return max(step, math.ceil(value / step) * step)


def _sized(role: RoleProfile, config: PsPlanConfig) -> tuple[Resources | None, str]:
    """A role's request from its profile, and how its memory was chosen."""
    launched = role.resources
    asked = launched.memory_mb if launched is not None else 0
    measured = 0 if role.peak_memory_mb is None else _round_up(role.peak_memory_mb * config.memory_headroom,
                                                               config.memory_step_mb)  # fmt: skip
    memory = max(asked, measured)
    if measured and measured >= asked:
        how = f"peak {role.peak_memory_mb:.0f} MiB x{config.memory_headroom:g}"
    elif asked:
        how = "as launched" + ("" if role.peak_memory_mb is None else f", peak {role.peak_memory_mb:.0f} MiB")
    else:
        how = "nothing measured"
    cpu = launched.cpu if launched is not None else 0.0
    if not memory and not cpu:
        return None, how
    return Resources(cpu=cpu, memory_mb=memory), how


def _spread_servers(ps: int, request: Resources | None, config: PsPlanConfig) -> tuple[int, Resources | None, str]:
    """More servers, each asking less, when one would need more than `max_task_memory_mb`."""
    cap = config.max_task_memory_mb
    if request is None or cap is None or request.memory_mb <= cap:
        return ps, request, ""
    total = ps * request.memory_mb
    count = min(config.max_ps, math.ceil(total / cap))
    each = min(cap, _round_up(total / count, config.memory_step_mb))
    note = (f"; one server would need {request.memory_mb} MiB, over the {cap} MiB a task may have, so the model is "
            f"spread over {count} server(s) of {each} MiB")  # fmt: skip
    if count * each < total:
        note += f" (max_ps {config.max_ps} caps it: {total - count * each} MiB short, an OOM relaunch may follow)"
    return count, attrs.evolve(request, memory_mb=each), note


def plan_ps_from_runs(
    runs: Sequence[RunProfile], signature: JobSignature, config: PsPlanConfig, *, notes: Sequence[str] = ()
) -> PsRunPlan:
    """The first plan of a parameter-server job submitted without counts or resources (see the module's rules).

    Args:
        runs: the stored profiles (`read_runs`); only parameter-server jobs' are candidates.
        signature: the new job.
        config: defaults and limits.
        notes: sentences to append to the reason (a store set aside, rows skipped).
    """
    tail = "".join(f"; {n}" for n in notes)
    found = most_similar(runs, signature, parameter_server=True)
    if found is None:
        about = signature.describe() or "an unnamed job"
        reason = (f"no earlier parameter-server job is similar to {about}: starting from the defaults, "
                  f"{config.default_ps} PS and {config.default_workers} worker(s), nothing asked{tail}")  # fmt: skip
        return PsRunPlan(config.default_ps, config.default_workers, config.default_workers, False, {}, None, reason)
    run, why = found
    resources: dict[Role, Resources] = {}
    said: list[str] = []
    ps = config.default_ps
    for role_profile in run.roles:
        request, how = _sized(role_profile, config)
        role = role_profile.role
        spread = ""
        if role is Role.PS:
            ps, request, spread = _spread_servers(min(max(role_profile.count, 1), config.max_ps), request, config)
        if request is not None:
            resources[role] = request
        what = "nothing asked" if request is None else request.describe()
        said.append(f"{role.value} {what} ({how}){spread}")
    workers = run.best_node_count()
    if config.max_workers is not None:
        workers = min(workers, config.max_workers)
    measured = dict(run.throughput).get(workers)
    speed = f", {measured:.3g} samples/s measured at that count" if measured else ", no samples/s measured"
    evaluator = (run.role(Role.EVALUATOR) or RoleProfile(Role.EVALUATOR, 0)).count > 0
    reason = (
        f"from profile {run.profile_id} of job {run.signature.job_name or '(unnamed)'!r} ({why}; it {run.outcome}): "
        f"{ps} PS and {workers} worker(s){speed}; " + "; ".join(said) + tail
    )
    return PsRunPlan(ps, workers, min(run.min_nodes, workers), evaluator, resources, run, reason)
