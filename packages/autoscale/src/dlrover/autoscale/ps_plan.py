"""The first size of a parameter-server job submitted without counts or resources, from an earlier job's profile.

A parameter-server job's profile (`RunProfile` with `roles`) says how many parameter servers and workers it ended
with (after any server its master added), what each role was launched with (after any OOM growth), the most memory
any task of each role reached, and the bytes of its newest checkpoint. The most similar profile of a job that
succeeded (`most_similar`, same rules as other jobs; a stopped or failed run may have ended before it peaked) sizes
the new job:

- each role's memory: its peak times `memory_headroom`, rounded up to `memory_step_mb`, or what it was launched
  with when that was more; never more than `max_task_memory_mb` (the reason says when that cut it);
- parameter servers: as many as it ended with (at most `max_ps`). A server's memory is TensorFlow's own (its
  peak less its share of the checkpoint) plus its share of the model's state (the checkpoint's bytes over the
  servers), so fewer servers than it ran with each need more, and when one would need more than
  `max_task_memory_mb` the state is spread over more servers, each needing less. Without the checkpoint's bytes a
  server's whole peak counts as its share;
- workers: the count it measured the most samples per second at (its final count when it measured none), within
  its range and `max_workers`;
- chief and evaluator: as it had them;
- CPU: what each role was launched with (a host that does not enforce CPU measures no need for more).

Without a similar profile: `default_ps` servers and `default_workers` workers, nothing asked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs

from dlrover.autoscale._validate import positive_int, positive_number
from dlrover.autoscale.resources import Resources, Role
from dlrover.autoscale.run_profiles import JobSignature, RoleProfile, RunProfile, most_similar
from dlrover.common import ConfigError

__all__ = ["PsPlanConfig", "PsRunPlan", "plan_ps_from_runs"]


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
    max_task_memory_mb: int | None = attrs.field(default=None, validator=attrs.validators.optional(positive_int))
    max_ps: int = attrs.field(default=16, validator=positive_int)
    max_workers: int | None = attrs.field(default=None, validator=attrs.validators.optional(positive_int))

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
    """A role's request from its profile (the same count of tasks), and how its memory was chosen."""
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
    cap = config.max_task_memory_mb
    if cap is not None and memory > cap:
        how += f", cut to the {cap} MiB a task may have from {memory} MiB"
        memory = cap
    cpu = launched.cpu if launched is not None else 0.0
    if not memory and not cpu:
        return None, how
    return Resources(cpu=cpu, memory_mb=memory), how


def _servers(role: RoleProfile, run: RunProfile, config: PsPlanConfig) -> tuple[int, Resources | None, str]:
    """How many parameter servers, each asking what, and how that was chosen."""
    count = max(role.count, 1)
    uncapped = attrs.evolve(config, max_task_memory_mb=None)
    request, how = _sized(role, uncapped)
    cap = config.max_task_memory_mb
    first = min(count, config.max_ps)
    fits = request is None or cap is None or request.memory_mb <= cap
    if request is None or role.peak_memory_mb is None or (first == count and fits):
        capped, how = _sized(role, config)
        return first, capped, how
    mib = 1024 * 1024
    state = (run.state_bytes or 0) / mib
    share = state / count if state else role.peak_memory_mb
    runtime = max(role.peak_memory_mb - share, 0.0)  # TensorFlow's own, whatever the server holds
    total = share * count

    def need(servers: int) -> int:
        return _round_up((runtime + total / servers) * config.memory_headroom, config.memory_step_mb)

    servers = first
    while cap is not None and need(servers) > cap and servers < config.max_ps:
        servers += 1
    memory = need(servers)
    basis = (f"TensorFlow's {runtime:.0f} MiB and a 1/{servers} share of {total:.0f} MiB of state"
             if state else f"a 1/{servers} share of {count} x {role.peak_memory_mb:.0f} MiB peak")  # fmt: skip
    how = f"{basis}, x{config.memory_headroom:g}"
    if cap is not None and memory > cap:
        how += (f"; {memory} MiB each at max_ps {config.max_ps}, cut to the {cap} MiB a task may have (an OOM "
                "relaunch may follow)")  # fmt: skip
        memory = cap
    elif servers != count:
        how += f"; {servers} server(s) instead of the {count} it ran with"
    return servers, attrs.evolve(request, memory_mb=memory), how


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
    found = most_similar(runs, signature, parameter_server=True, outcome="succeeded")
    if found is None:
        about = signature.describe() or "an unnamed job"
        reason = (f"no earlier parameter-server job that succeeded is similar to {about}: starting from the defaults, "
                  f"{config.default_ps} PS and {config.default_workers} worker(s), nothing asked{tail}")  # fmt: skip
        return PsRunPlan(config.default_ps, config.default_workers, config.default_workers, False, {}, None, reason)
    run, why = found
    resources: dict[Role, Resources] = {}
    said: list[str] = []
    ps = config.default_ps
    for role_profile in run.roles:
        role = role_profile.role
        if role is Role.PS:
            ps, request, how = _servers(role_profile, run, config)
        else:
            request, how = _sized(role_profile, config)
        if request is not None:
            resources[role] = request
        what = "nothing asked" if request is None else request.describe()
        said.append(f"{role.value} {what} ({how})")
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
