"""The autoscaler in the master: measured throughput per node count, a plan, and the resize it asks for.

The master feeds it the samples its agents report on heartbeats (`observe_samples`), tells it when
training was disturbed (`disrupted`: a resize, a failure, a restart, a node that came or went), and
calls `tick` from its own tick. The autoscaler

1. measures samples per second per node count over *steady* stretches only: a stretch starts at a
   disruption (or a change of the running nodes), skips `warmup_s` after every running node trains
   again, and counts once it lasted `min_measure_s`;
2. fits dlrover.autoscale's throughput model to those measurements;
3. walks the node counts in the job's range upward while each step pays: the throughput one more
   `node_unit` adds (measured where measured, else predicted) is at least `min_scaling_efficiency`
   of what a node brings on average at the smaller count (1.0 is linear scaling);
4. asks the OR-tools planner (`ResourcePlanner`) for the node count with the most predicted
   throughput at most that far, within the backend's capacity;
5. returns a decision: grow, give back, or stay, with every input and the reason.

Hysteresis, so it never oscillates: nothing is planned within `cooldown_s` of a resize of any
source; a node count the autoscaler gave back (and every larger one) is never asked for again;
growth goes at most `max_growth_factor` times beyond the largest count measured; and a plan that
would only shrink the job because the model disagrees with the measurements is not taken.

Pure: time comes in as ``now``; the master applies decisions through `Master.resize`.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from dlrover.autoscale import Resources
from dlrover.common import ConfigError
from dlrover.common.validators import positive

if TYPE_CHECKING:
    from dlrover.autoscale import PlanResult, ResourcePlanner, ThroughputModel

__all__ = [
    "AutoscaleDecision",
    "AutoscaleMode",
    "Autoscaler",
    "AutoscalerConfig",
    "JobView",
    "SizeMeasurement",
    "ThroughputRecorder",
    "efficient_node_count",
]

# Measured stretches kept per node count (the newest): enough to average out noise, bounded memory.
_KEPT_STRETCHES = 8
# A node count with no stated resources is planned as nodes of this nominal size: only the count binds.
_NOMINAL_NODE = Resources(1, 1024)


class AutoscaleMode(enum.StrEnum):
    """What the autoscaler may do."""

    OFF = "off"
    """No autoscaler: the job runs the nodes it is given (and `dlrover-master scale`)."""
    ADVISE = "advise"
    """Plans are logged and recorded as events; nothing changes."""
    ON = "on"
    """Plans are applied through `Master.resize` (source `autoscaler`); the job starts at its minimum and
    grows while it pays, and a straggler's node is replaced where the backend relaunches nodes."""


def _mode(value: AutoscaleMode | str) -> AutoscaleMode:
    try:
        return AutoscaleMode(value)
    except ValueError:
        known = ", ".join(m.value for m in AutoscaleMode)
        raise ConfigError(f"autoscale mode must be one of {known}, got {value!r}") from None


def _fraction(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigError(f"{attribute.name} must be a number in (0, 1], got {value!r}")


def _growth(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 < value < math.inf:
        raise ConfigError(f"{attribute.name} must be a finite number > 1, got {value!r}")


def _non_negative_finite(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ConfigError(f"{attribute.name} must be a finite number >= 0, got {value!r}")


@attrs.frozen
class AutoscalerConfig:
    """How the autoscaler measures and decides.

    Attributes:
        mode: `off`, `advise` or `on` (`AutoscaleMode`).
        interval_s: seconds between two plans.
        min_scaling_efficiency: one more node_unit of nodes is worth it while the throughput it adds is
            at least this fraction of linear scaling (of the average throughput per node before it).
        min_measure_s: steady seconds a node count must be measured before it is trusted.
        warmup_s: seconds skipped after training resumed (every running node reports samples again)
            before a measurement starts: restored checkpoints, warm caches.
        cooldown_s: seconds after any resize before the autoscaler plans again.
        max_growth_factor: growth goes at most this many times beyond the largest node count measured
            (and at least one node_unit).
        planner_time_limit_s: the most seconds the OR-tools planner may spend on one plan.
    """

    mode: AutoscaleMode = attrs.field(default=AutoscaleMode.OFF, converter=_mode)
    interval_s: float = attrs.field(default=30.0, validator=positive)
    min_scaling_efficiency: float = attrs.field(default=0.8, validator=_fraction)
    min_measure_s: float = attrs.field(default=60.0, validator=positive)
    warmup_s: float = attrs.field(default=10.0, validator=_non_negative_finite)
    cooldown_s: float = attrs.field(default=60.0, validator=_non_negative_finite)
    max_growth_factor: float = attrs.field(default=2.0, validator=_growth)
    planner_time_limit_s: float = attrs.field(default=1.0, validator=positive)


@attrs.frozen
class SizeMeasurement:
    """Throughput measured at one node count.

    Attributes:
        nodes: the node count.
        samples_per_second: the duration-weighted mean over the steady stretches measured.
        seconds: the steady seconds measured in all.
        stretches: how many stretches it comes from.
        resolution: how far the rate may be off (samples per second) because the nodes' running totals
            advance a step's samples at a time: up to one step at either end of every stretch, over
            the seconds measured. Two node counts whose rates differ by less than their resolutions
            together were not told apart.
    """

    nodes: int
    samples_per_second: float
    seconds: float
    stretches: int
    resolution: float = 0.0


@attrs.frozen
class _Point:
    time: float
    samples: int


class ThroughputRecorder:
    """Samples per second per node count, from steady stretches of training only.

    A stretch holds one set of running nodes with no disruption. Each node's rate is taken between
    its own reports (so heartbeats that arrive out of phase add no error), and the job's rate is the
    sum over its nodes. A node whose running total goes down restarted its workers: the stretch
    starts again. A node's total grows a step's samples at a time, so a rate over a stretch is known
    to within about one step at either end: the measurement's `resolution`, which a short stretch of
    long steps makes coarse. A node's step is taken as the larger of the greatest common divisor of
    its increments between reports (a whole number of steps each; more than one step where every
    report came the same number of steps after the last) and their spread (a step where reports
    drift across step boundaries; the noise itself where steps differ in samples).

    Args:
        min_measure_s: steady seconds before a stretch counts.
        warmup_s: seconds skipped once every node of the stretch trains again.
    """

    def __init__(self, min_measure_s: float, warmup_s: float) -> None:
        self._min_measure_s = min_measure_s
        self._warmup_s = warmup_s
        self._nodes: frozenset[int] = frozenset()
        self._since = 0.0  # when the stretch began (its disruption)
        self._last: dict[int, _Point] = {}  # each node's newest report in this stretch
        self._training_at: dict[int, float] = {}  # when each node's total first grew in this stretch
        self._all_training_at: float | None = None  # when the last of them did (every node trains)
        self._first: dict[int, _Point] = {}  # each node's first report after the warm-up
        self._quantum: dict[int, int] = {}  # each node's step of samples: the gcd of its increments
        self._increments: dict[int, tuple[int, int]] = {}  # each node's smallest and largest increment
        # nodes -> [(rate, seconds, resolution)] of closed stretches
        self._done: dict[int, list[tuple[float, float, float]]] = {}

    @property
    def stretch_nodes(self) -> frozenset[int]:
        """The running nodes of the current stretch."""
        return self._nodes

    @property
    def stretch_started(self) -> float:
        """When the current stretch began."""
        return self._since

    def disrupted(self, now: float) -> None:
        """Training was disturbed at `now`: the current stretch ends (kept if it was steady long enough)."""
        self._close(now)

    def set_nodes(self, nodes: frozenset[int], now: float) -> None:
        """The running nodes at `now`; a different set ends the stretch."""
        if nodes != self._nodes:
            self._close(now)
            self._nodes = frozenset(nodes)

    def observe(self, node_id: int, samples: int, now: float) -> None:
        """Node `node_id` reported `samples` consumed in total at `now`."""
        if node_id not in self._nodes:
            return
        last = self._last.get(node_id)
        if last is not None and samples < last.samples:
            self._close(now)  # its workers restarted: the whole job stalled with them
            last = None
        self._last[node_id] = _Point(now, samples)
        if last is None:
            return
        if samples > last.samples:
            grown = samples - last.samples
            self._quantum[node_id] = math.gcd(self._quantum.get(node_id, 0), grown)
            low, high = self._increments.get(node_id, (grown, grown))
            self._increments[node_id] = (min(low, grown), max(high, grown))
        if samples > last.samples and node_id not in self._training_at:
            self._training_at[node_id] = now
            # Only the stretch's nodes get here and none twice: the set is whole once the counts match.
            if len(self._training_at) == len(self._nodes):
                self._all_training_at = now
        start = self._measure_from()
        if start is not None and now >= start and node_id not in self._first:
            self._first[node_id] = _Point(now, samples)

    def _measure_from(self) -> float | None:
        """When measuring starts: `warmup_s` after every node of the stretch trains again. O(1): the master
        asks on every heartbeat, and a scan of the nodes made a round of heartbeats O(nodes²)."""
        if self._all_training_at is None:
            return None
        return self._all_training_at + self._warmup_s

    def current(self) -> tuple[float, float, float] | None:
        """(samples per second, steady seconds, resolution) of the current stretch; None until every node
        has two reports after the warm-up."""
        if not self._nodes:
            return None
        rate, seconds, resolution = 0.0, math.inf, 0.0
        for node in self._nodes:
            first, last = self._first.get(node), self._last.get(node)
            if first is None or last is None or last.time <= first.time:
                return None
            rate += (last.samples - first.samples) / (last.time - first.time)
            seconds = min(seconds, last.time - first.time)
            # The nodes step together, so their errors add up rather than average out.
            low, high = self._increments.get(node, (0, 0))
            resolution += max(self._quantum.get(node, 0), high - low) / (last.time - first.time)
        return (rate, seconds, resolution) if rate > 0 else None

    def training_steady(self, now: float) -> bool:
        """Whether every node of the stretch trains again and the warm-up after that has passed."""
        start = self._measure_from()
        return start is not None and now >= start

    def steady_seconds(self) -> float:
        """Steady seconds measured in the current stretch so far (0 before measuring started)."""
        now = self.current()
        return 0.0 if now is None else now[1]

    def _close(self, now: float) -> None:
        measured = self.current()
        if measured is not None and measured[1] >= self._min_measure_s:
            kept = self._done.setdefault(len(self._nodes), [])
            kept.append(measured)
            del kept[:-_KEPT_STRETCHES]
        self._since = now
        self._last.clear()
        self._first.clear()
        self._training_at.clear()
        self._all_training_at = None
        self._quantum.clear()
        self._increments.clear()

    def seed(self, measured: Mapping[int, tuple[float, float, float]]) -> None:
        """Start from earlier measurements (node count -> (samples per second, seconds, resolution)),
        replacing what was kept: a restarted master resumes from its journaled plan."""
        self._done = {
            n: [(rate, seconds, max(resolution, 0.0))]
            for n, (rate, seconds, resolution) in measured.items()
            if rate > 0 and seconds > 0
        }

    def measurements(self) -> dict[int, SizeMeasurement]:
        """Every node count measured long enough, the current stretch included once it qualifies."""
        stretches = {n: list(v) for n, v in self._done.items()}
        measured = self.current()
        if measured is not None and measured[1] >= self._min_measure_s:
            stretches.setdefault(len(self._nodes), []).append(measured)
        out: dict[int, SizeMeasurement] = {}
        for nodes, items in sorted(stretches.items()):
            seconds = sum(s for _, s, _ in items)
            rate = sum(r * s for r, s, _ in items) / seconds
            # Each stretch is off by at most its own resolution; weighted as the rates are.
            resolution = sum(e * s for _, s, e in items) / seconds
            out[nodes] = SizeMeasurement(nodes, rate, seconds, len(items), resolution)
        return out


@attrs.frozen
class JobView:
    """What the autoscaler needs to know about the job at one tick.

    Attributes:
        wanted: the node count the job wants now (`JobLifecycle.wanted_nodes`).
        running: the ids of the nodes running now.
        placeable: how many nodes the backend can hold now, the job's included (None: no known limit).
        min_nodes: the worker group's range, lower end.
        max_nodes: its upper end.
        node_unit: nodes come and go in multiples of this.
        resources: what each node is launched with (None: nothing stated).
        resizable: whether the job can be resized now (started, not finishing).
    """

    wanted: int
    running: frozenset[int]
    placeable: int | None
    min_nodes: int
    max_nodes: int
    node_unit: int = 1
    resources: Resources | None = None
    resizable: bool = True


@attrs.frozen
class AutoscaleDecision:
    """One plan of the autoscaler.

    Attributes:
        action: `grow`, `shrink` (give nodes back), `stay`, or `wait` (not enough measured yet, a
            cool-down, or no feasible plan).
        target: the node count to resize to (`grow` and `shrink`); else the wanted count.
        reason: why, in a sentence.
        data: the inputs: measured throughput per node count, the fitted model, the efficiency walk,
            the capacity, the range, the ceiling and the planner's answer.
    """

    action: str
    target: int
    reason: str
    data: Mapping[str, Any] = attrs.field(factory=dict)

    @property
    def changes(self) -> bool:
        """Whether it asks for a resize."""
        return self.action in ("grow", "shrink")


def _sizes(view: JobView, upper: int) -> list[int]:
    unit = view.node_unit
    low = -(-view.min_nodes // unit) * unit
    return list(range(low, min(view.max_nodes, upper) + 1, unit))


def efficient_node_count(
    sizes: list[int],
    estimate: Mapping[int, float],
    min_efficiency: float,
    resolution: Mapping[int, float] | None = None,
) -> tuple[int, list[dict[str, Any]]]:
    """The largest of `sizes` reached by steps that each pay, walking up from the smallest.

    A step from n to n' pays when ``(T(n') - T(n)) / (n' - n) >= min_efficiency * T(n) / n``: the nodes
    it adds bring at least that fraction of what a node brings on average at n. A step that does not
    pay by the estimates but would within their resolutions is *unresolved*: the walk stops there
    too, but the step was not found not to pay.

    Args:
        sizes: candidate node counts, ascending (at least one).
        estimate: throughput per candidate (measured or predicted).
        min_efficiency: the fraction of linear scaling a step must reach.
        resolution: how far each estimate may be off (a measurement's `SizeMeasurement.resolution`;
            missing: exact).

    Returns:
        The count, and each step judged (from, to, its efficiency, whether it pays, whether that is
        resolved).
    """
    resolution = resolution or {}
    best = sizes[0]
    steps: list[dict[str, Any]] = []
    for low, high in itertools.pairwise(sizes):
        t_low, t_high = estimate[low], estimate[high]
        per_node = t_low / low
        efficiency = ((t_high - t_low) / (high - low)) / per_node if per_node > 0 else 0.0
        pays = efficiency >= min_efficiency
        # The best case within the resolutions: the larger count as fast as it may be, the smaller as slow
        # (which also lowers what a node brings on average there).
        e_low, e_high = resolution.get(low, 0.0), resolution.get(high, 0.0)
        floor_low = t_low - e_low
        best_case = ((t_high + e_high - floor_low) / (high - low)) / (floor_low / low) if floor_low > 0 else math.inf
        resolved = pays or best_case < min_efficiency
        steps.append({"from": low, "to": high, "efficiency": round(efficiency, 4), "pays": pays, "resolved": resolved})
        if not pays:
            break
        best = high
    return best, steps


class Autoscaler:
    """The autoscaler's state and decisions (see the module docstring).

    Args:
        config: how it measures and decides.
        now: the current time (the first plan comes `interval_s` later).
        planner: the OR-tools planner; one with `planner_time_limit_s` when None.
    """

    def __init__(self, config: AutoscalerConfig, now: float, planner: ResourcePlanner | None = None) -> None:
        from dlrover.autoscale import PlannerConfig, ResourcePlanner

        self._config = config
        self._planner = planner or ResourcePlanner(PlannerConfig(time_limit_s=config.planner_time_limit_s))
        self._recorder = ThroughputRecorder(config.min_measure_s, config.warmup_s)
        self._next_plan = now + config.interval_s
        self._last_resize: float | None = None
        self._ceiling: int | None = None  # the largest node count still allowed (below every one given back)
        self._last_published: tuple[str, int, int] | None = None

    @property
    def config(self) -> AutoscalerConfig:
        """The configuration in force."""
        return self._config

    @property
    def ceiling(self) -> int | None:
        """The largest node count the autoscaler may still ask for (None: the range's top)."""
        return self._ceiling

    def measurements(self) -> dict[int, SizeMeasurement]:
        """Throughput measured per node count so far."""
        return self._recorder.measurements()

    def observe_samples(self, node_id: int, samples: int, now: float) -> None:
        """A node's running total of samples, from its heartbeat."""
        self._recorder.observe(node_id, samples, now)

    def training_steady(self, now: float) -> bool:
        """Whether the job trains steadily at `now`: every running node reports samples again since
        the last disruption, and `warmup_s` has passed since. The master judges stragglers only then."""
        return self._recorder.training_steady(now)

    def disrupted(self, now: float, *, resized: bool = False) -> None:
        """Training was disturbed at `now` (`resized`: by a resize, which starts the cool-down)."""
        self._recorder.disrupted(now)
        if resized:
            self._last_resize = now

    def applied(self, decision: AutoscaleDecision, now: float) -> None:
        """The master carried out `decision`: a node count given back is never asked for again."""
        if decision.action == "shrink":
            given_back = int(decision.data["wanted"])
            limit = given_back - 1
            self._ceiling = limit if self._ceiling is None else min(self._ceiling, limit)
        self._last_resize = now

    def replay(self, data: Mapping[str, Any]) -> None:
        """Resume from a journaled ``autoscale_plan`` event's data (a restarted master replays them in
        order): its measurements, and the ceiling below every count given back. Malformed data is
        skipped (it was written by this module; nothing else writes that kind)."""
        try:
            rates = {int(n): float(t) for n, t in dict(data.get("measured", {})).items()}
            seconds = {int(n): float(t) for n, t in dict(data.get("measured_s", {})).items()}
            resolutions = {int(n): float(t) for n, t in dict(data.get("measured_resolution", {})).items()}
            if rates:
                # A plan journaled before resolutions were kept says nothing of its own: taken as known to no
                # better than its whole rate, so it never resolves a step that would give nodes back.
                self._recorder.seed(
                    {
                        n: (rates[n], seconds.get(n, self._config.min_measure_s), resolutions.get(n, rates[n]))
                        for n in rates
                    }
                )
            if data.get("applied") and data.get("action") == "shrink":
                limit = int(data["wanted"]) - 1
                self._ceiling = limit if self._ceiling is None else min(self._ceiling, limit)
        except (TypeError, ValueError, KeyError):
            return

    def should_publish(self, decision: AutoscaleDecision) -> bool:
        """Whether `decision` differs from the last one published (an unchanged plan is not repeated)."""
        key = (decision.action, decision.target, int(decision.data.get("wanted", -1)))
        if key == self._last_published:
            return False
        self._last_published = key
        return True

    def tick(self, now: float, view: JobView) -> AutoscaleDecision | None:
        """Follow the running nodes, and plan when `interval_s` has passed; None between plans."""
        self._recorder.set_nodes(view.running, now)
        if now < self._next_plan:
            return None
        self._next_plan = now + self._config.interval_s
        return self.plan(now, view)

    def plan(self, now: float, view: JobView) -> AutoscaleDecision:
        """Decide now (see the module docstring); changes nothing but the planning cadence."""
        base: dict[str, Any] = {
            "mode": self._config.mode.value,
            "wanted": view.wanted,
            "running": len(view.running),
            "placeable": view.placeable,
            "min_nodes": view.min_nodes,
            "max_nodes": view.max_nodes,
            "node_unit": view.node_unit,
            "ceiling": self._ceiling,
            "min_scaling_efficiency": self._config.min_scaling_efficiency,
        }
        measured = self._recorder.measurements()
        base["measured"] = {str(n): round(m.samples_per_second, 4) for n, m in measured.items()}
        base["measured_s"] = {str(n): round(m.seconds, 1) for n, m in measured.items()}
        base["measured_resolution"] = {str(n): round(m.resolution, 4) for n, m in measured.items()}

        def wait(reason: str) -> AutoscaleDecision:
            return AutoscaleDecision("wait", view.wanted, reason, base)

        if not view.resizable:
            return wait("the job is not resizable now (not started, or finishing)")
        if self._last_resize is not None and now - self._last_resize < self._config.cooldown_s:
            left = self._config.cooldown_s - (now - self._last_resize)
            return wait(f"cooling down after a resize ({left:.0f}s of cooldown_s {self._config.cooldown_s:g} left)")
        running = len(view.running)
        expected = view.wanted if view.placeable is None else min(view.wanted, view.placeable)
        if running != expected or running not in measured:
            steady = self._recorder.steady_seconds()
            return wait(
                f"measuring: {running} of {expected} node(s) running, {steady:.0f}s of "
                f"min_measure_s {self._config.min_measure_s:g} steady so far"
            )
        return self._decide(view, measured, base)

    def _decide(
        self, view: JobView, measured: Mapping[int, SizeMeasurement], base: dict[str, Any]
    ) -> AutoscaleDecision:
        from dlrover.autoscale import ThroughputSample, fit_throughput_model

        model = fit_throughput_model([ThroughputSample(n, m.samples_per_second) for n, m in measured.items()])
        base["model"] = {
            "a": model.a,
            "b": model.b,
            "c": model.c,
            "confidence": round(model.confidence, 4),
            "note": model.note,
        }
        largest = max(measured)
        explore = max(largest + view.node_unit, math.floor(largest * self._config.max_growth_factor))
        upper = min(explore, self._ceiling if self._ceiling is not None else view.max_nodes)
        sizes = _sizes(view, upper)
        if not sizes:
            return AutoscaleDecision("wait", view.wanted, "no node count of the range lies under the ceiling", base)
        estimate = {n: measured[n].samples_per_second if n in measured else model.predict(n) for n in sizes}
        # A count only the model predicts is not known at all: a step to or from it never gives nodes back.
        resolution = {n: measured[n].resolution if n in measured else math.inf for n in sizes}
        efficient, steps = efficient_node_count(sizes, estimate, self._config.min_scaling_efficiency, resolution)
        base["walk"] = steps
        base["efficient_nodes"] = efficient
        result = self._planner.plan(self._request(view, model, efficient))
        base["planner"] = {
            "status": result.status.value,
            "workers": result.shape.workers if result.shape else None,
            "binding": list(result.binding),
            "reason": result.reason,
            "solver_wall_time_s": round(result.solver_wall_time_s, 4),
        }
        if result.shape is None:
            return AutoscaleDecision("wait", view.wanted, f"no plan: {result.reason}", base)
        return self._choose(view, result, efficient, base)

    def _request(self, view: JobView, model: ThroughputModel, efficient: int) -> Any:
        from dlrover.autoscale import ClusterQuota, PlanRequest, WorkerOption

        node = view.resources or _NOMINAL_NODE
        limit = view.max_nodes if view.placeable is None else min(view.placeable, view.max_nodes)
        # The quota holds `limit` nodes of the job's size: the node count (range, capacity) binds, not a total.
        quota = ClusterQuota(
            cpu=node.cpu_milli * limit / 1000, memory_mb=node.memory_mb * limit, gpu=node.gpu * limit, max_nodes=limit
        )
        return PlanRequest(
            model=model,
            quota=quota,
            worker_options=(WorkerOption(node),),
            min_workers=view.min_nodes,
            max_workers=efficient,
            node_unit=view.node_unit,
        )

    def _choose(self, view: JobView, result: PlanResult, efficient: int, base: dict[str, Any]) -> AutoscaleDecision:
        assert result.shape is not None
        planned = result.shape.workers
        wanted = view.wanted
        capacity_binds = "max_nodes" in result.binding and planned < efficient
        target = max(planned, min(wanted, efficient)) if capacity_binds else planned
        why = (
            f"measured {_fmt(base['measured'])} samples/s per node count, model {base['model']['note']}; "
            f"steps pay up to {efficient} node(s) at min_scaling_efficiency {self._config.min_scaling_efficiency:g}; "
            f"the planner chose {planned} ({', '.join(result.binding)})"
        )
        last_step = base["walk"][-1] if base["walk"] else None
        stopped = last_step is not None and not last_step["pays"]
        if target < wanted and last_step is not None and stopped and not last_step["resolved"]:
            # Noise must not give nodes back: once given back a count is never asked for again.
            low, high = last_step["from"], last_step["to"]
            reason = (
                f"stay at {wanted} node(s): {why}; the step {low} -> {high} does not pay by the measurements, "
                f"but they do not resolve it (within {_fmt(base['measured_resolution'])} samples/s): nothing is "
                "given back until they do (a count measured again sharpens its rate)"
            )
            return AutoscaleDecision("stay", wanted, reason, base)
        if target < wanted and (efficient >= wanted or not stopped):
            # Only the fitted curve (or the exploration bound) says fewer: no step was found not to
            # pay below the wanted count, so nothing is given back.
            reason = f"stay at {wanted} node(s): {why}; the model alone says fewer"
            return AutoscaleDecision("stay", wanted, reason, base)
        if target > wanted:
            room = "" if view.placeable is None else f", room for {view.placeable}"
            return AutoscaleDecision("grow", target, f"grow {wanted} -> {target} node(s){room}: {why}", base)
        if target < wanted:
            return AutoscaleDecision(
                "shrink", target, f"give back {wanted - target} node(s), {wanted} -> {target}: {why}", base
            )
        if capacity_binds:
            why += f"; the backend has room for {view.placeable}"
        return AutoscaleDecision("stay", wanted, f"stay at {wanted} node(s): {why}", base)


def _fmt(measured: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{n}: {t:g}" for n, t in measured.items()) + "}"
