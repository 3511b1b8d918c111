"""The resource planner: a CP-SAT model that sizes a job within its quota.

Decisions: the number of workers (a multiple of node_unit), the number of parameter servers, one size for all
workers and one for all PS (chosen among `WorkerOption`s and `PsOption`s), and how many of each go on each machine
shape. The predicted job throughput is

    min(efficiency(worker size) * T(workers), PS count * capacity(PS size))

with `T` the fitted `ThroughputModel`. Two objectives are offered: the most throughput (ties broken by the least
cost), or the least cost that reaches a target throughput.

Placement is conservative: a machine hosts nodes of one role and one size only. This is always a feasible
placement (so a plan never asks for what cannot be scheduled) at the price of sometimes using fewer machines' worth
of spare room than a mixed packing would.

The throughput curve enters the model as a table over the candidate worker counts (an element constraint). The
table stops at the curve's peak: beyond it more workers predict less throughput at more cost, so no optimum lies
there, and on what remains the curve is non-decreasing, which makes a throughput target a simple lower bound on the
worker count.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
import numpy as np
from ortools.sat.python import cp_model

from dlrover.autoscale._validate import non_negative_number, positive_int, positive_number
from dlrover.autoscale.model import ThroughputModel
from dlrover.autoscale.plan import NodeState, ScalePlan, diff_to_target
from dlrover.autoscale.resources import ClusterQuota, MachineShape, Resources, Role
from dlrover.autoscale.sizing import PsOption, WorkerOption
from dlrover.common import ConfigError

__all__ = [
    "PlannerConfig",
    "PlanRequest",
    "PlanStatus",
    "JobShape",
    "PlanResult",
    "ResourcePlanner",
    "predicted_throughput",
    "ps_needed",
]


class PlanStatus(str, enum.Enum):
    """How a planning attempt ended."""

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"  # a plan, but the time limit stopped the proof that it is the best
    INFEASIBLE = "infeasible"  # no job within the quota; the result's reason says which limit
    UNKNOWN = "unknown"  # the time limit passed before any plan was found


def _linearization_level(_inst: object, attribute: Any, value: Any) -> None:
    if isinstance(value, bool) or value not in (0, 1, 2):
        raise ConfigError(f"{attribute.name} must be 0, 1 or 2, got {value!r}")


@attrs.frozen
class PlannerConfig:
    """Solver limits and the prices that define a plan's cost.

    Args:
        time_limit_s: the most seconds one plan() may spend in the solver (split across its solves).
        num_search_workers: CP-SAT search threads; 1 makes results reproducible.
        linearization_level: CP-SAT's LP relaxation level (0-2); 2 adds the cuts that let one thread prove a
            large PS job optimal in a fraction of a second, where level 1 walks up one worker at a time.
        cost_per_cpu: price of one CPU core.
        cost_per_memory_gb: price of one GiB of memory.
        cost_per_gpu: price of one GPU.
        cost_per_node: price of each node, whatever its size.
        throughput_resolution: the best candidate's throughput maps to this many integer units in the model.
        max_worker_candidates: the most candidate worker counts modelled; beyond, the largest counts are dropped
            and the explanation says so.
    """

    time_limit_s: float = attrs.field(default=5.0, validator=positive_number)
    num_search_workers: int = attrs.field(default=1, validator=positive_int)
    linearization_level: int = attrs.field(default=2, validator=_linearization_level)
    cost_per_cpu: float = attrs.field(default=1.0, validator=non_negative_number)
    cost_per_memory_gb: float = attrs.field(default=0.25, validator=non_negative_number)
    cost_per_gpu: float = attrs.field(default=10.0, validator=non_negative_number)
    cost_per_node: float = attrs.field(default=0.0, validator=non_negative_number)
    throughput_resolution: int = attrs.field(default=1_000_000, validator=positive_int)
    max_worker_candidates: int = attrs.field(default=200_000, validator=positive_int)

    def node_cost(self, resources: Resources) -> int:
        """The cost of one node of `resources`, in integer thousandths of the price unit."""
        return round(
            1000
            * (
                resources.cpu_milli / 1000 * self.cost_per_cpu
                + resources.memory_mb / 1024 * self.cost_per_memory_gb
                + resources.gpu * self.cost_per_gpu
                + self.cost_per_node
            )
        )


def _worker_options(items: Iterable[WorkerOption]) -> tuple[WorkerOption, ...]:
    return tuple(items)


def _ps_options(items: Iterable[PsOption]) -> tuple[PsOption, ...]:
    return tuple(items)


def _nodes(items: Iterable[NodeState]) -> tuple[NodeState, ...]:
    return tuple(items)


def _check_options(_inst: object, attribute: Any, value: Any) -> None:
    if len(set(value)) != len(value):
        raise ConfigError(f"{attribute.name} repeat an option: {value!r}")


@attrs.frozen
class PlanRequest:
    """What to plan for.

    Args:
        model: the job's throughput model.
        quota: what the job may use.
        worker_options: the sizes a worker may be given (at least one).
        ps_options: the sizes a parameter server may be given; empty for all-reduce jobs.
        min_workers: the fewest workers the job runs with (rounded up to a multiple of node_unit).
        max_workers: the most workers; None for no limit beyond the quota.
        node_unit: the worker count must be a multiple of this.
        min_ps: the fewest parameter servers.
        max_ps: the most parameter servers; 0 for all-reduce jobs.
        target_throughput: None to maximise throughput; a value to reach it at the least cost.
        current: the job's nodes now, to express the result as a `ScalePlan`.

    Raises:
        ConfigError: if the bounds contradict each other or a PS job has no PS option.
    """

    model: ThroughputModel
    quota: ClusterQuota
    worker_options: tuple[WorkerOption, ...] = attrs.field(converter=_worker_options, validator=_check_options)
    ps_options: tuple[PsOption, ...] = attrs.field(default=(), converter=_ps_options, validator=_check_options)
    min_workers: int = attrs.field(default=1, validator=positive_int)
    max_workers: int | None = None
    node_unit: int = attrs.field(default=1, validator=positive_int)
    min_ps: int = 0
    max_ps: int = 0
    target_throughput: float | None = None
    current: tuple[NodeState, ...] = attrs.field(default=(), converter=_nodes)

    def __attrs_post_init__(self) -> None:
        if not self.worker_options:
            raise ConfigError("worker_options must hold at least one option")
        if self.max_workers is not None and (isinstance(self.max_workers, bool) or self.max_workers < 1):
            raise ConfigError(f"max_workers must be >= 1 or None, got {self.max_workers!r}")
        if not 0 <= self.min_ps <= self.max_ps:
            raise ConfigError(f"need 0 <= min_ps <= max_ps, got min_ps={self.min_ps}, max_ps={self.max_ps}")
        if self.max_ps > 0 and not self.ps_options:
            raise ConfigError(f"max_ps={self.max_ps} but ps_options is empty: a PS job needs at least one PS size")
        if self.target_throughput is not None:
            t = self.target_throughput
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
                raise ConfigError(f"target_throughput must be a finite number > 0, got {t!r}")

    @property
    def is_ps_job(self) -> bool:
        """Whether the job has parameter servers."""
        return self.max_ps > 0


@attrs.frozen
class JobShape:
    """The job a plan arrives at.

    Args:
        workers: the worker count.
        worker: the worker size.
        ps: the parameter-server count.
        ps_option: the PS size (None for all-reduce jobs).
        placement: (machine shape, role, node count) for each shape used; empty when planned against totals only.
    """

    workers: int
    worker: WorkerOption
    ps: int = 0
    ps_option: PsOption | None = None
    placement: tuple[tuple[str, Role, int], ...] = ()

    def total(self) -> Resources:
        """What all the job's nodes request together."""
        ps = self.ps_option.resources if self.ps_option else Resources(0, 0)
        w = self.worker.resources
        return Resources(
            cpu=(w.cpu_milli * self.workers + ps.cpu_milli * self.ps) / 1000,
            memory_mb=w.memory_mb * self.workers + ps.memory_mb * self.ps,
            gpu=w.gpu * self.workers + ps.gpu * self.ps,
        )


@attrs.frozen
class PlanResult:
    """The outcome of planning.

    Args:
        status: optimal, feasible (time limit), infeasible or unknown.
        shape: the planned job; None unless status is optimal or feasible.
        predicted_throughput: the model's throughput for `shape` (0 without one).
        cost: `shape`'s cost in thousandths of the price unit (0 without one).
        binding: short names of the limits that stop the plan from growing (or that make it infeasible).
        reason: a sentence explaining the plan or why there is none.
        plan: the actions from the request's current nodes to `shape`; empty (with the reason) without one.
        solver_wall_time_s: seconds the solver reported spending.
    """

    status: PlanStatus
    shape: JobShape | None
    predicted_throughput: float
    cost: int
    binding: tuple[str, ...]
    reason: str
    plan: ScalePlan
    solver_wall_time_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether there is a plan."""
        return self.shape is not None


def predicted_throughput(
    request: PlanRequest, workers: int, worker: WorkerOption, ps: int, ps_opt: PsOption | None
) -> float:
    """The planner's throughput for a candidate: the worker curve, capped by what the PS can serve."""
    t = worker.efficiency * request.model.predict(workers)
    if request.is_ps_job:
        if ps_opt is None or ps == 0:
            return 0.0
        if ps_opt.capacity is not None:
            t = min(t, ps * ps_opt.capacity)
    return t


class _Infeasible(Exception):
    """Raised inside planning to leave with an infeasible result; never escapes `plan()`."""

    def __init__(self, reason: str, binding: tuple[str, ...]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.binding = binding


@attrs.frozen
class _Candidates:
    worker_options: tuple[WorkerOption, ...]
    ps_options: tuple[PsOption, ...]
    k_lo: int
    k_hi: int
    p_min: int
    peak_cut: bool
    candidate_cut: bool
    notes: tuple[str, ...]


def _usable(opts: Sequence[WorkerOption | PsOption], role: Role, quota: ClusterQuota, notes: list[str]) -> list[int]:
    keep = []
    for i, o in enumerate(opts):
        r = o.resources
        if quota.max_node is not None and not r.fits_in(quota.max_node):
            notes.append(
                f"{role.value} size {r.describe()} exceeds the per-node limit "
                f"({', '.join(r.exceeded_dimensions(quota.max_node))})"
            )
            continue
        if quota.machines and not any(m.fits(r) > 0 and m.count > 0 for m in quota.machines):
            notes.append(f"{role.value} size {r.describe()} fits on no machine shape")
            continue
        keep.append(i)
    return keep


def _bound(total: int, per: int) -> int | None:
    return None if per <= 0 else total // per


class ResourcePlanner:
    """Plans a job's size with CP-SAT; every outcome is a `PlanResult`, never a solver exception.

    Args:
        config: solver limits and prices.
    """

    def __init__(self, config: PlannerConfig | None = None) -> None:
        self._config = config or PlannerConfig()

    @property
    def config(self) -> PlannerConfig:
        """The planner's configuration."""
        return self._config

    def plan(self, request: PlanRequest) -> PlanResult:
        """Choose worker and PS counts and sizes for `request`.

        Returns:
            A result with a plan and the binding limits, or an infeasible/unknown result with the reason.
        """
        try:
            cands = self._candidates(request)
            return self._solve(request, cands)
        except _Infeasible as e:
            return PlanResult(
                status=PlanStatus.INFEASIBLE,
                shape=None,
                predicted_throughput=0.0,
                cost=0,
                binding=e.binding,
                reason=e.reason,
                plan=ScalePlan.empty(f"no plan: {e.reason}"),
            )

    # -- candidates and pre-checks: every infeasibility we can name is named here, before the solver runs --

    def _candidates(self, req: PlanRequest) -> _Candidates:
        quota = req.quota
        notes: list[str] = []
        w_idx = _usable(req.worker_options, Role.WORKER, quota, notes)
        if not w_idx:
            raise _Infeasible("no worker size is usable: " + "; ".join(notes), ("max_node",))
        ps_idx = _usable(req.ps_options, Role.PS, quota, notes) if req.is_ps_job else []
        if req.is_ps_job and not ps_idx:
            raise _Infeasible("no parameter-server size is usable: " + "; ".join(notes), ("max_node",))
        wopts = tuple(req.worker_options[i] for i in w_idx)
        popts = tuple(req.ps_options[i] for i in ps_idx)
        unit = req.node_unit
        k_lo = -(-req.min_workers // unit)
        n_min = k_lo * unit
        if req.max_workers is not None and n_min > req.max_workers:
            raise _Infeasible(
                f"no multiple of node_unit={unit} lies in "
                f"[min_workers={req.min_workers}, max_workers={req.max_workers}]",
                ("node_unit",),
            )
        p_min = req.min_ps
        if req.target_throughput is not None and req.is_ps_job:
            p_min = max(p_min, self._ps_needed(req.target_throughput, popts, req.max_ps))
        elif req.is_ps_job:
            p_min = max(p_min, 1)  # with no PS a PS job has no throughput
        self._check_smallest_fits(req, wopts, popts, n_min, p_min)

        # Upper bound on the worker count from every limit, so the throughput table is finite.
        bounds = []
        if req.max_workers is not None:
            bounds.append(req.max_workers)
        bounds.append(quota.max_nodes - p_min)
        for dim in ("cpu_milli", "memory_mb", "gpu"):
            total = (
                getattr(quota, dim) - p_min * min(getattr(o.resources, dim) for o in popts)
                if popts
                else getattr(quota, dim)
            )
            b = [_bound(total, getattr(o.resources, dim)) for o in wopts]
            if all(x is not None for x in b):
                bounds.append(max(x for x in b if x is not None))
        if quota.machines:
            bounds.append(sum(max(m.fits(o.resources) for o in wopts) * m.count for m in quota.machines))
        k_hi = max(k_lo, min(bounds) // unit)
        candidate_cut = k_hi - k_lo + 1 > self._config.max_worker_candidates
        if candidate_cut:
            k_hi = k_lo + self._config.max_worker_candidates - 1
        ks = np.arange(k_lo, k_hi + 1, dtype=np.int64)
        curve = req.model.predict_many(ks * unit)
        peak = int(np.argmax(curve))  # first maximum: on a tie the fewer workers cost less
        peak_cut = peak < len(ks) - 1
        if peak_cut:
            k_hi = k_lo + peak
        return _Candidates(wopts, popts, k_lo, k_hi, p_min, peak_cut, candidate_cut, tuple(notes))

    @staticmethod
    def _ps_needed(target: float, popts: Sequence[PsOption], max_ps: int) -> int:
        best = min(ps_needed(target, o) for o in popts)
        if best > max_ps:
            raise _Infeasible(
                f"target throughput {target:g} needs at least {best} parameter servers, more than max_ps={max_ps}",
                ("max_ps",),
            )
        return best

    @staticmethod
    def _check_smallest_fits(
        req: PlanRequest, wopts: Sequence[WorkerOption], popts: Sequence[PsOption], n_min: int, p_min: int
    ) -> None:
        quota = req.quota
        smallest = f"{n_min} worker(s)" + (f" and {p_min} PS" if p_min else "")
        if n_min + p_min > quota.max_nodes:
            raise _Infeasible(
                f"node quota max_nodes={quota.max_nodes} is smaller than the smallest job ({smallest})", ("max_nodes",)
            )
        for dim, label, scale in (("cpu_milli", "cpu", 1000), ("memory_mb", "memory_mb", 1), ("gpu", "gpu", 1)):
            need = n_min * min(getattr(o.resources, dim) for o in wopts)
            if popts:
                need += p_min * min(getattr(o.resources, dim) for o in popts)
            have = getattr(quota, dim)
            if need > have:
                raise _Infeasible(
                    f"{label} quota {have / scale:g} is smaller than what the smallest job ({smallest}) "
                    f"needs: {need / scale:g}",
                    (label,),
                )
        peak = req.model.peak_workers
        if req.target_throughput is not None and math.isfinite(peak):
            # The curve is unimodal, so its best multiple of node_unit is one of the two around the peak. Other
            # limits (max_workers, the quota) are the solver's to find; this names the one no quota can fix.
            unit = req.node_unit
            near = {max(n_min, unit * math.floor(peak / unit)), max(n_min, unit * math.ceil(peak / unit))}
            best = max(o.efficiency for o in wopts) * max(req.model.predict(n) for n in near)
            if best < req.target_throughput:
                raise _Infeasible(
                    f"target throughput {req.target_throughput:g} exceeds the model's peak {best:g} "
                    f"(at about {peak:.0f} workers)",
                    ("throughput_peak",),
                )

    # -- the CP-SAT model --

    def _solve(self, req: PlanRequest, c: _Candidates) -> PlanResult:
        cfg = self._config
        built = _CpModel(req, c, cfg.throughput_resolution, cfg.node_cost)
        solver, status, wall = self._run(built, req.target_throughput is None)
        if status == cp_model.INFEASIBLE:
            return self._infeasible_after_solve(req, wall)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return PlanResult(
                status=PlanStatus.UNKNOWN,
                shape=None,
                predicted_throughput=0.0,
                cost=0,
                binding=("time_limit_s",),
                reason=(
                    f"the solver found no plan within time_limit_s={cfg.time_limit_s:g} "
                    f"(status {solver.status_name(status)})"
                ),
                plan=ScalePlan.empty("no plan: solver time limit"),
                solver_wall_time_s=wall,
            )
        shape = built.shape(solver)
        throughput = predicted_throughput(req, shape.workers, shape.worker, shape.ps, shape.ps_option)
        total_cost = cfg.node_cost(shape.worker.resources) * shape.workers
        if shape.ps_option is not None:
            total_cost += cfg.node_cost(shape.ps_option.resources) * shape.ps
        binding = self._binding(req, c, shape)
        plan_status = PlanStatus.OPTIMAL if status == cp_model.OPTIMAL else PlanStatus.FEASIBLE
        reason = _explain(req, c, shape, _Outcome(throughput, total_cost, binding, plan_status))
        targets = [(Role.WORKER, shape.workers, shape.worker.resources)]
        if shape.ps_option is not None:
            targets.append((Role.PS, shape.ps, shape.ps_option.resources))
        return PlanResult(
            status=plan_status,
            shape=shape,
            predicted_throughput=throughput,
            cost=total_cost,
            binding=binding,
            reason=reason,
            plan=diff_to_target(req.current, targets, reason),
            solver_wall_time_s=wall,
        )

    def _new_solver(self, time_limit_s: float) -> cp_model.CpSolver:
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = time_limit_s
        solver.parameters.num_search_workers = self._config.num_search_workers
        solver.parameters.linearization_level = self._config.linearization_level
        return solver

    def _run(self, built: _CpModel, maximise: bool) -> tuple[cp_model.CpSolver, Any, float]:
        """Solve; when maximising, solve again for the least cost at the best throughput found."""
        cfg = self._config
        solver = self._new_solver(cfg.time_limit_s)
        status = solver.solve(built.model)
        wall = float(solver.wall_time)
        if not maximise or status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return solver, status, wall
        built.fix_throughput_minimise_cost(solver)
        # The second pass gets what is left of the budget, and at least a moment to confirm the hint.
        second = self._new_solver(max(0.1, cfg.time_limit_s - wall))
        second_status = second.solve(built.model)
        wall += float(second.wall_time)
        if second_status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return solver, status, wall
        # Optimal only if both passes proved it.
        return second, (cp_model.FEASIBLE if status == cp_model.FEASIBLE else second_status), wall

    def _infeasible_after_solve(self, req: PlanRequest, wall: float) -> PlanResult:
        if req.target_throughput is not None:
            best = self.plan(attrs.evolve(req, target_throughput=None))
            if best.ok:
                reason = (
                    f"no plan within the quota reaches target throughput {req.target_throughput:g}; "
                    f"the most it allows is {best.predicted_throughput:g} ({best.reason})"
                )
                binding = ("target_throughput", *best.binding)
            else:
                reason = best.reason
                binding = best.binding
        else:
            reason = "the smallest job does not pack onto the available machines"
            binding = ("machines",)
        return PlanResult(
            status=PlanStatus.INFEASIBLE,
            shape=None,
            predicted_throughput=0.0,
            cost=0,
            binding=binding,
            reason=reason,
            plan=ScalePlan.empty(f"no plan: {reason}"),
            solver_wall_time_s=wall,
        )

    # -- explanations --

    def _binding(self, req: PlanRequest, c: _Candidates, shape: JobShape) -> tuple[str, ...]:
        """The limits that stop one more node_unit of workers (or one more PS, when PS bound) from helping."""
        if req.target_throughput is not None:
            return ("target_throughput",)
        unit = req.node_unit
        out: list[str] = []
        ps = shape.ps_option
        worker_t = shape.worker.efficiency * req.model.predict(shape.workers)
        # PS-bound when the PS serve no more than the workers produce: more workers would not help.
        ps_bound = ps is not None and ps.capacity is not None and shape.ps * ps.capacity <= worker_t * (1 + 1e-9)
        if ps is not None and ps_bound:
            out.append("ps_capacity")
            if shape.ps + 1 > req.max_ps:
                out.append("max_ps")
            grow, step_nodes, role = ps.resources, 1, Role.PS
        else:
            w = shape.worker.resources
            grow = Resources(cpu=w.cpu_milli * unit / 1000, memory_mb=w.memory_mb * unit, gpu=w.gpu * unit)
            at_top = shape.workers == c.k_hi * unit
            if req.max_workers is not None and shape.workers + unit > req.max_workers:
                out.append("max_workers")
            # At the curve's peak, or where the next node_unit adds less than the model's resolution.
            flat = req.model.predict(shape.workers + unit) <= req.model.predict(shape.workers) * (1 + 1e-6)
            if (c.peak_cut and at_top) or flat:
                out.append("throughput_peak")
            if c.candidate_cut and at_top:
                out.append("max_worker_candidates")
            step_nodes, role = unit, Role.WORKER
        out += _quota_binding(req.quota, shape, grow, step_nodes)
        if req.quota.machines and _spare_slots(req.quota, shape, role) < step_nodes:
            out.append("machines")
        if not out:
            out.append("none found (the solver stopped at its time limit)")
        return tuple(out)


def _quota_binding(quota: ClusterQuota, shape: JobShape, grow: Resources, step_nodes: int) -> list[str]:
    total = shape.total()
    out = []
    if total.cpu_milli + grow.cpu_milli > quota.cpu_milli:
        out.append("cpu")
    if total.memory_mb + grow.memory_mb > quota.memory_mb:
        out.append("memory_mb")
    if total.gpu + grow.gpu > quota.gpu:
        out.append("gpu")
    if shape.workers + shape.ps + step_nodes > quota.max_nodes:
        out.append("max_nodes")
    return out


def _spare_slots(quota: ClusterQuota, shape: JobShape, role: Role) -> int:
    """Room for more nodes of `role`'s size: in partly used machines of that group plus free machines."""
    size = {Role.WORKER: shape.worker.resources}
    if shape.ps_option is not None:
        size[Role.PS] = shape.ps_option.resources
    by_name = {s.name: s for s in quota.machines}
    used = dict.fromkeys(by_name, 0)
    spare = 0
    for name, r, count in shape.placement:
        fit = by_name[name].fits(size[r])
        machines_used = -(-count // fit)
        used[name] += machines_used
        if r == role:
            spare += machines_used * fit - count
    for s in quota.machines:
        spare += max(0, s.count - used[s.name]) * s.fits(size[role])
    return spare


@attrs.frozen
class _Outcome:
    throughput: float
    cost: int
    binding: tuple[str, ...]
    status: PlanStatus


def _explain(req: PlanRequest, c: _Candidates, shape: JobShape, out: _Outcome) -> str:
    parts = [f"{shape.workers} worker(s) of {shape.worker.resources.describe()}"]
    if shape.worker.efficiency < 1:
        parts[0] += f" (throttled to {shape.worker.efficiency:.0%} speed)"
    if shape.ps_option is not None:
        parts.append(f"{shape.ps} PS of {shape.ps_option.resources.describe()}")
    goal = (
        "most predicted throughput"
        if req.target_throughput is None
        else f"least cost reaching {req.target_throughput:g}"
    )
    text = (
        f"{' and '.join(parts)}: {goal}, predicted throughput {out.throughput:.4g} "
        f"(model confidence {req.model.confidence:.2f}), cost {out.cost / 1000:g}; "
        f"binding: {', '.join(out.binding)}"
    )
    if req.model.max_observed_workers and shape.workers > req.model.max_observed_workers:
        text += f"; extrapolated beyond the largest observed worker count {req.model.max_observed_workers}"
    if out.status == PlanStatus.FEASIBLE:
        text += "; the time limit stopped the solver before it proved this optimal"
    if c.notes:
        text += "; skipped: " + "; ".join(c.notes)
    return text


_Placed = list[tuple[MachineShape, cp_model.IntVar]]


class _CpModel:
    """The CP-SAT model of one request; `shape()` reads a solution back."""

    def __init__(
        self, req: PlanRequest, c: _Candidates, resolution: int, node_cost: Callable[[Resources], int]
    ) -> None:
        self.req = req
        self.c = c
        m = self.model = cp_model.CpModel()
        unit = req.node_unit
        ks = np.arange(c.k_lo, c.k_hi + 1, dtype=np.int64)
        self.curve = req.model.predict_many(ks * unit)
        top = float(self.curve[-1]) * max(o.efficiency for o in c.worker_options)
        self.scale = resolution / top
        self.t_hi = resolution
        self.idx = m.new_int_var(0, len(ks) - 1, "k_index")
        self.n_total = unit * c.k_lo + unit * self.idx
        self.machines = [s for s in req.quota.machines if s.count > 0]
        self._machine_use: dict[str, list[cp_model.IntVar]] = {s.name: [] for s in self.machines}

        n_hi = int(ks[-1]) * unit
        self.u = [m.new_bool_var(f"worker_size_{i}") for i in range(len(c.worker_options))]
        m.add_exactly_one(self.u)
        self.w_counts, self.w_place = self._role(c.worker_options, self.u, n_hi, "w")
        m.add(sum(self.w_counts) == self.n_total)

        p_hi = min(req.max_ps, req.quota.max_nodes)
        self.v = [m.new_bool_var(f"ps_size_{j}") for j in range(len(c.ps_options))]
        self.p_total: cp_model.IntVar | int = 0
        self.p_counts: list[cp_model.IntVar] = []
        self.p_place: list[_Placed] = []
        if req.is_ps_job:
            m.add_exactly_one(self.v)
            self.p_counts, self.p_place = self._role(c.ps_options, self.v, p_hi, "p")
            # At least one PS (or what the target needs): with none a PS job has no throughput.
            p_total = m.new_int_var(c.p_min, p_hi, "ps")
            m.add(p_total == sum(self.p_counts))
            self.p_total = p_total
        # One role and size per machine: the machines each group uses add up to at most what a shape has.
        for s in self.machines:
            if self._machine_use[s.name]:
                m.add(sum(self._machine_use[s.name]) <= s.count)
        self._quota(node_cost)
        self.t = m.new_int_var(0, self.t_hi, "throughput")
        if req.target_throughput is None:
            self._maximise()
        else:
            self._reach(req.target_throughput)

    def _role(
        self, options: Sequence[WorkerOption | PsOption], on: list[cp_model.IntVar], hi: int, tag: str
    ) -> tuple[list[cp_model.IntVar], list[_Placed]]:
        m = self.model
        counts, places = [], []
        for i, o in enumerate(options):
            count = m.new_int_var(0, hi, f"{tag}{i}_count")
            m.add(count <= hi * on[i])
            placed: _Placed = []
            if self.machines:
                for s in self.machines:
                    fit = min(s.fits(o.resources), hi)
                    if fit <= 0:
                        continue
                    x = m.new_int_var(0, min(hi, fit * s.count), f"{tag}{i}_on_{s.name}")
                    y = m.new_int_var(0, s.count, f"{tag}{i}_machines_{s.name}")
                    m.add(x <= fit * y)
                    m.add(y <= s.count * on[i])
                    self._machine_use[s.name].append(y)
                    placed.append((s, x))
                m.add(count == sum(x for _s, x in placed))
            counts.append(count)
            places.append(placed)
        return counts, places

    def _quota(self, node_cost: Callable[[Resources], int]) -> None:
        quota = self.req.quota
        pairs = [(o.resources, cnt) for o, cnt in zip(self.c.worker_options, self.w_counts, strict=True)]
        pairs += [(o.resources, cnt) for o, cnt in zip(self.c.ps_options, self.p_counts, strict=True)]
        m = self.model
        m.add(sum(r.cpu_milli * cnt for r, cnt in pairs) <= quota.cpu_milli)
        m.add(sum(r.memory_mb * cnt for r, cnt in pairs) <= quota.memory_mb)
        m.add(sum(r.gpu * cnt for r, cnt in pairs) <= quota.gpu)
        m.add(self.n_total + self.p_total <= quota.max_nodes)
        self.cost = sum(node_cost(r) * cnt for r, cnt in pairs)

    def _maximise(self) -> None:
        m = self.model
        for i, o in enumerate(self.c.worker_options):
            # Floor, so the model never promises more than the curve predicts.
            table = np.floor(self.curve * o.efficiency * self.scale).astype(np.int64)
            hull = concave_hull(table)
            if hull is not None:
                # t <= the table, as the chords of its concave hull: a few linear constraints the LP relaxation
                # sees, where an element constraint over thousands of entries costs CP-SAT seconds of presolve.
                for a, b in itertools.pairwise(hull):
                    va, vb = int(table[a]), int(table[b])
                    m.add((b - a) * self.t <= va * (b - a) + (vb - va) * (self.idx - a)).only_enforce_if(self.u[i])
                m.add(self.t <= int(table[hull[-1]])).only_enforce_if(self.u[i])
            else:
                ti = m.new_int_var(0, self.t_hi, f"w{i}_throughput")
                m.add_element(self.idx, [int(x) for x in table], ti)
                m.add(self.t <= ti).only_enforce_if(self.u[i])
        for j, po in enumerate(self.c.ps_options):
            if po.capacity is not None and po.capacity * self.scale < self.t_hi:
                m.add(self.t <= math.floor(po.capacity * self.scale) * self.p_counts[j]).only_enforce_if(self.v[j])
        m.maximize(self.t)

    def _reach(self, target: float) -> None:
        m = self.model
        # The curve is non-decreasing over the candidates (it stops at its peak), so reaching the target is a
        # lower bound on the worker count, computed here in floating point exactly as predicted_throughput does.
        for i, o in enumerate(self.c.worker_options):
            meets = np.nonzero(self.curve * o.efficiency >= target)[0]
            if len(meets) == 0:
                m.add(self.u[i] == 0)
            else:
                m.add(self.idx >= int(meets[0])).only_enforce_if(self.u[i])
        for j, po in enumerate(self.c.ps_options):
            m.add(self.p_counts[j] >= ps_needed(target, po)).only_enforce_if(self.v[j])
        m.minimize(self.cost)

    def fix_throughput_minimise_cost(self, solver: cp_model.CpSolver) -> None:
        """Turn the model into: keep the throughput `solver` found, minimise cost; hint the found solution."""
        m = self.model
        m.add(self.t >= solver.value(self.t))
        m.minimize(self.cost)
        for var in (self.idx, *self.u, *self.v, *self.w_counts, *self.p_counts):
            m.add_hint(var, solver.value(var))

    def shape(self, solver: cp_model.CpSolver) -> JobShape:
        """The job in the solution `solver` holds."""
        wi = next(i for i, b in enumerate(self.u) if solver.boolean_value(b))
        placement = [(s.name, Role.WORKER, int(solver.value(x))) for s, x in self.w_place[wi] if solver.value(x)]
        ps, popt = 0, None
        if self.req.is_ps_job:
            pj = next(j for j, b in enumerate(self.v) if solver.boolean_value(b))
            popt = self.c.ps_options[pj]
            ps = int(solver.value(self.p_counts[pj]))
            placement += [(s.name, Role.PS, int(solver.value(x))) for s, x in self.p_place[pj] if solver.value(x)]
        return JobShape(
            workers=int(solver.value(self.n_total)),
            worker=self.c.worker_options[wi],
            ps=ps,
            ps_option=popt,
            placement=tuple(placement),
        )


def concave_hull(values: np.ndarray) -> list[int] | None:
    """The vertices of the upper concave hull of `values` (by index), when its chords reproduce every value.

    The throughput curve is concave up to beyond its peak (for `1/(a + b/n + c n)` the inflection lies at
    `sqrt(3) * peak`), so the floored table's hull sits less than one unit above it and rounding the chords down
    gives back each entry exactly. When that fails (a coarse node_unit past the inflection) the caller falls back
    to an element constraint. Returns None in that case.
    """
    n = len(values)
    hull: list[int] = []
    for i in range(n):
        # Pop while the last vertex lies on or below the chord from the one before it to i.
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (int(values[b]) - int(values[a])) * (i - a) <= (int(values[i]) - int(values[a])) * (b - a):
                hull.pop()
            else:
                break
        hull.append(i)
    xs = np.arange(n, dtype=np.int64)
    seg = np.searchsorted(np.array(hull[1:], dtype=np.int64), xs, side="left") if n > 1 else np.zeros(1, np.int64)
    left = np.array(hull, dtype=np.int64)[np.minimum(seg, len(hull) - 1)]
    right = np.array(hull, dtype=np.int64)[np.minimum(seg + 1, len(hull) - 1)]
    width = np.maximum(right - left, 1)
    chord = (values[left] * width + (values[right] - values[left]) * (xs - left)) // width
    return hull if bool(np.all(chord == values)) else None


def ps_needed(target: float, option: PsOption) -> int:
    """The fewest parameter servers of `option` whose capacity reaches `target` throughput (>= 1)."""
    if option.capacity is None:
        return 1
    need = max(1, math.ceil(target / option.capacity))
    # Correct float rounding either way so the result agrees with predicted_throughput's `ps * capacity`.
    while need > 1 and (need - 1) * option.capacity >= target:
        need -= 1
    while need * option.capacity < target:
        need += 1
    return need
