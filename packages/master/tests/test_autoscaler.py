"""The autoscaler: steady measurements, the efficiency walk, the planner's answer, hysteresis, and
the master applying (or only advising) its plans through the one resize path. Time is injected."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlrover.common import ConfigError, ManualClock
from dlrover.master.autoscaler import (
    AutoscaleDecision,
    AutoscaleMode,
    Autoscaler,
    AutoscalerConfig,
    JobView,
    ThroughputRecorder,
    efficient_node_count,
)
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.journal import MemoryJournal, SqliteJournal, StateJournal
from dlrover.master.master import Master
from dlrover.master.scheduler import FakeScheduler

Curve = Callable[[int], float]

FAST = AutoscalerConfig(
    mode=AutoscaleMode.ON, interval_s=5.0, min_measure_s=20.0, warmup_s=2.0, cooldown_s=10.0, planner_time_limit_s=5.0
)


def linear_then_flat(knee: int, per_node: float = 10.0) -> Curve:
    return lambda n: per_node * min(n, knee)


class SimJob:
    """A job the autoscaler's decisions are applied to: nodes report samples at the rate of `curve`
    for the running count; every resize renews the node ids (the world restarts)."""

    def __init__(self, scaler: Autoscaler, curve: Curve, *, wanted: int, lo: int, hi: int, unit: int = 1) -> None:
        self.scaler, self.curve = scaler, curve
        self.wanted, self.lo, self.hi, self.unit = wanted, lo, hi, unit
        self.placeable: int | None = None
        self.now = 0.0
        self.next_id = 0
        self.samples: dict[int, float] = {}
        self.sizes: list[int] = [wanted]
        self.decisions: list[AutoscaleDecision] = []
        self._renew()

    def running(self) -> int:
        return self.wanted if self.placeable is None else min(self.wanted, self.placeable)

    def _renew(self) -> None:
        self.samples = {}
        for _ in range(self.running()):
            self.samples[self.next_id] = 0.0
            self.next_id += 1

    def view(self) -> JobView:
        return JobView(
            wanted=self.wanted,
            running=frozenset(self.samples),
            placeable=self.placeable,
            min_nodes=self.lo,
            max_nodes=self.hi,
            node_unit=self.unit,
        )

    def set_capacity(self, placeable: int | None) -> None:
        if placeable != self.placeable:
            self.placeable = placeable
            self.scaler.disrupted(self.now, resized=True)
            self._renew()

    def run(self, seconds: float, step_s: float = 1.0) -> None:
        end = self.now + seconds
        while self.now < end:
            self.now += step_s
            count = len(self.samples)
            rate = self.curve(count) / count if count else 0.0
            for node in self.samples:
                self.samples[node] += rate * step_s
                self.scaler.observe_samples(node, int(self.samples[node]), self.now)
            decision = self.scaler.tick(self.now, self.view())
            if decision is None:
                continue
            self.decisions.append(decision)
            if decision.changes:
                self.wanted = decision.target
                self.scaler.disrupted(self.now, resized=True)
                self.scaler.applied(decision, self.now)
                self.sizes.append(self.wanted)
                self._renew()


# ----------------------------------------------------------------------------- measurements


def test_a_stretch_counts_from_the_warm_up_after_every_node_trains_and_only_once_long_enough() -> None:
    rec = ThroughputRecorder(min_measure_s=10.0, warmup_s=3.0)
    rec.set_nodes(frozenset({1, 2}), 0.0)
    for t in range(0, 5):
        rec.observe(1, 0, float(t))  # node 1 waits for its round: no samples yet
        rec.observe(2, 0, float(t))
    for t in range(5, 30):
        rec.observe(1, 4 * (t - 5), float(t))
        rec.observe(2, 6 * (t - 5), float(t))
    (measured,) = rec.measurements().values()
    assert measured.nodes == 2
    assert measured.samples_per_second == pytest.approx(10.0)
    assert measured.seconds == pytest.approx(29 - 9)  # training from t=6, warm-up to t=9


def test_a_short_stretch_and_a_restart_leave_no_measurement() -> None:
    rec = ThroughputRecorder(min_measure_s=10.0, warmup_s=0.0)
    rec.set_nodes(frozenset({1}), 0.0)
    for t in range(0, 8):
        rec.observe(1, 5 * t, float(t))
    rec.observe(1, 3, 8.0)  # its workers restarted: the stretch starts over
    assert rec.steady_seconds() == 0.0
    for t in range(9, 15):
        rec.observe(1, 3 + 5 * (t - 8), float(t))
    rec.disrupted(15.0)  # a resize: too short to keep
    assert rec.measurements() == {}


def test_a_new_set_of_running_nodes_ends_the_stretch_and_keeps_it_when_steady() -> None:
    rec = ThroughputRecorder(min_measure_s=5.0, warmup_s=0.0)
    rec.set_nodes(frozenset({1}), 0.0)
    for t in range(0, 12):
        rec.observe(1, 7 * t, float(t))
    rec.set_nodes(frozenset({1, 2}), 12.0)
    rec.observe(2, 100, 13.0)  # only the stretch's own reports count
    measured = rec.measurements()
    assert list(measured) == [1]
    assert measured[1].samples_per_second == pytest.approx(7.0)


def test_a_rate_is_known_to_within_one_step_of_samples_at_either_end_of_its_stretch() -> None:
    rec = ThroughputRecorder(min_measure_s=60.0, warmup_s=0.0)
    rec.set_nodes(frozenset({1, 2}), 0.0)
    # Steps of 5 s and 100 samples per node, heard every 54 s: the totals grow by 1,000 or 1,100.
    for beat in range(12):
        t = 54.0 * beat
        rec.observe(1, 100 * int(t // 5.0), t)
        rec.observe(2, 100 * int((t + 2.5) // 5.0), t)  # half a step out of phase
    (measured,) = rec.measurements().values()
    # A step of each node over its own stretch: node 2 was heard first once both trained, so its
    # stretch starts a beat (54 s) earlier than node 1's.
    assert measured.seconds == pytest.approx(54.0 * 9)
    assert measured.resolution == pytest.approx(100 / (54.0 * 9) + 100 / (54.0 * 10))
    assert abs(measured.samples_per_second - 2 * 100 / 5.0) <= measured.resolution


@settings(max_examples=200, deadline=None)
@given(
    moves=st.lists(
        st.one_of(
            st.tuples(st.just("nodes"), st.frozensets(st.integers(1, 3), max_size=3)),
            st.tuples(st.just("observe"), st.integers(1, 4), st.integers(0, 3)),
            st.tuples(st.just("disrupted")),
        ),
        max_size=40,
    )
)
def test_training_is_steady_once_every_node_of_the_stretch_grew_and_the_warm_up_passed(
    moves: list[tuple[object, ...]],
) -> None:
    """Kept without a scan of the nodes (the master asks on every heartbeat); checked against one."""
    rec = ThroughputRecorder(min_measure_s=5.0, warmup_s=2.0)
    nodes: frozenset[int] = frozenset()
    last: dict[int, int] = {}
    grew_at: dict[int, float] = {}  # the model: when each node's total first grew since the stretch began
    totals: dict[int, int] = {}
    now = 0.0
    for move in moves:
        now += 1.0
        if move[0] == "nodes":
            new_nodes = move[1]
            assert isinstance(new_nodes, frozenset)
            if new_nodes != nodes:
                last.clear()
                grew_at.clear()
                nodes = new_nodes
            rec.set_nodes(nodes, now)
        elif move[0] == "disrupted":
            last.clear()
            grew_at.clear()
            rec.disrupted(now)
        else:
            node, change = int(str(move[1])), int(str(move[2]))
            total = totals.get(node, 0) + change if change < 3 else 0  # 3: its workers restarted
            totals[node] = total
            if node in nodes:
                before = last.get(node)
                if before is not None and total < before:
                    last.clear()
                    grew_at.clear()
                    before = None
                last[node] = total
                if before is not None and total > before:
                    grew_at.setdefault(node, now)
            rec.observe(node, total, now)
        steady = bool(nodes) and all(n in grew_at for n in nodes) and now >= max(grew_at.values()) + 2.0
        assert rec.training_steady(now) == steady


def test_the_efficiency_walk_calls_a_step_within_the_resolution_unresolved() -> None:
    estimate = {127: 21333.6, 128: 21333.3}  # one node more, and no faster as far as the measurements tell
    _, [coarse] = efficient_node_count([127, 128], estimate, 0.8, {127: 2370.0, 128: 2370.0})
    assert coarse == {"from": 127, "to": 128, "efficiency": -0.0018, "pays": False, "resolved": False}
    _, [fine] = efficient_node_count([127, 128], estimate, 0.8, {127: 1.0, 128: 1.0})
    assert not fine["pays"]
    assert fine["resolved"]


def _measured_at(resolution: float | None) -> AutoscaleDecision:
    """The plan of a job at 128 nodes that measured 127 and 128 at the same rate, to within `resolution`
    (None: a plan journaled before resolutions were)."""
    scaler = Autoscaler(FAST, 0.0)
    plan: dict[str, object] = {"measured": {"127": 21333.6, "128": 21333.3}, "measured_s": {"127": 108.0, "128": 108.0}}
    if resolution is not None:
        plan["measured_resolution"] = {"127": resolution, "128": resolution}
    scaler.replay(plan)
    view = JobView(wanted=128, running=frozenset(range(128)), placeable=None, min_nodes=127, max_nodes=128)
    return scaler.plan(100.0, view)


def test_nodes_are_not_given_back_on_a_difference_the_measurements_cannot_resolve() -> None:
    # Steps of 6 s heard for two minutes: a node's total is known to a step, 8% of the stretch's samples,
    # far more than the 0.8% one node of 128 adds. Giving it back would be for good (the ceiling).
    coarse = _measured_at(2370.0)
    assert coarse.action == "stay"
    assert coarse.target == 128
    assert "do not resolve it" in coarse.reason
    fine = _measured_at(1.0)  # measured for long enough: the node truly adds nothing
    assert fine.action == "shrink"
    assert fine.target == 127
    assert _measured_at(None).action == "stay"  # an older master's measurements resolve nothing


# ---------------------------------------------------------------------------- the decision


def test_the_efficiency_walk_stops_at_the_first_step_that_does_not_pay() -> None:
    best, steps = efficient_node_count([1, 2, 3, 4], {1: 10.0, 2: 19.0, 3: 24.0, 4: 40.0}, 0.8)
    assert best == 2
    assert [s["pays"] for s in steps] == [True, False]  # 2 -> 3 adds 5 of 9.5 per node: 0.53
    assert efficient_node_count([4], {4: 1.0}, 0.8) == (4, [])


def test_it_grows_while_the_speed_up_pays_gives_back_the_node_that_does_not_and_stays() -> None:
    scaler = Autoscaler(FAST, 0.0)
    job = SimJob(scaler, linear_then_flat(2), wanted=1, lo=1, hi=3)
    job.run(600)
    assert job.sizes == [1, 2, 3, 2]
    shrink = next(d for d in job.decisions if d.action == "shrink")
    assert shrink.target == 2
    assert shrink.data["measured"].keys() >= {"1", "2", "3"}
    last_step = shrink.data["walk"][-1]
    assert (last_step["from"], last_step["to"], last_step["pays"]) == (2, 3, False)
    assert last_step["efficiency"] == pytest.approx(0.0, abs=0.02)
    assert "give back 1 node(s), 3 -> 2" in shrink.reason
    assert scaler.ceiling == 2
    assert job.decisions[-1].action == "stay"


def test_linear_scaling_grows_to_the_top_of_the_range_doubling_at_most() -> None:
    scaler = Autoscaler(FAST, 0.0)
    job = SimJob(scaler, linear_then_flat(100), wanted=1, lo=1, hi=6)
    job.run(900)
    assert job.sizes == [1, 2, 4, 6]
    grow = [d for d in job.decisions if d.action == "grow"]
    assert grow[0].data["planner"]["status"] == "optimal"
    assert "max_workers" in grow[0].data["planner"]["binding"]


def test_the_capacity_bounds_growth_and_a_lower_capacity_is_not_a_give_back() -> None:
    scaler = Autoscaler(FAST, 0.0)
    job = SimJob(scaler, linear_then_flat(100), wanted=1, lo=1, hi=4)
    job.set_capacity(2)
    job.run(300)
    assert job.wanted == 2
    assert [d.action for d in job.decisions if d.changes] == ["grow"]
    stay = job.decisions[-1]
    assert stay.action == "stay"
    assert "the backend has room for 2" in stay.reason
    job.set_capacity(1)  # the backend takes one back: the job keeps wanting 2
    job.run(200)
    assert job.wanted == 2
    assert scaler.ceiling is None
    job.set_capacity(4)
    job.run(300)
    assert job.wanted == 4


def test_cooldown_and_measuring_are_reasons_to_wait() -> None:
    scaler = Autoscaler(FAST, 0.0)
    view = JobView(wanted=1, running=frozenset({0}), placeable=None, min_nodes=1, max_nodes=3)
    assert scaler.tick(1.0, view) is None  # before the first interval
    decision = scaler.tick(5.0, view)
    assert decision is not None
    assert decision.action == "wait"
    assert "measuring: 1 of 1 node(s) running, 0s of min_measure_s 20 steady" in decision.reason
    scaler.disrupted(6.0, resized=True)
    decision = scaler.tick(10.0, view)
    assert decision is not None
    assert "cooling down after a resize" in decision.reason


def test_an_unchanged_plan_is_published_once() -> None:
    scaler = Autoscaler(FAST, 0.0)
    wait = AutoscaleDecision("wait", 1, "measuring", {"wanted": 1})
    assert scaler.should_publish(wait)
    assert not scaler.should_publish(AutoscaleDecision("wait", 1, "measuring, 3s", {"wanted": 1}))
    assert scaler.should_publish(AutoscaleDecision("grow", 2, "pays", {"wanted": 1}))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"mode": "sometimes"}, "autoscale mode must be one of off, advise, on, got 'sometimes'"),
        ({"min_scaling_efficiency": 1.5}, "min_scaling_efficiency must be a number in (0, 1], got 1.5"),
        ({"min_scaling_efficiency": 0}, "min_scaling_efficiency must be a number in (0, 1], got 0"),
        ({"max_growth_factor": 1.0}, "max_growth_factor must be a finite number > 1, got 1.0"),
        ({"cooldown_s": -1}, "cooldown_s must be a finite number >= 0, got -1"),
        ({"interval_s": 0}, "interval_s"),
    ],
)
def test_bad_settings_are_refused_with_the_value(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        AutoscalerConfig(**kw)  # type: ignore[arg-type]


# ----------------------------------------------------------------------- property: range, capacity, no flapping

curves = st.one_of(
    st.builds(linear_then_flat, st.integers(1, 12), st.floats(0.5, 100.0)),
    st.builds(
        lambda a, b, c: lambda n: 1.0 / (a + b / n + c * n),
        st.floats(0.0, 0.05),
        st.floats(0.01, 1.0),
        st.floats(0.0, 0.02),
    ),
    # Noisy measurements: a deterministic wobble of up to +-15% per node count.
    st.builds(
        lambda knee, wobble: lambda n: 10.0 * min(n, knee) * (1 + 0.15 * math.sin(wobble * n)),
        st.integers(1, 12),
        st.floats(0.1, 10.0),
    ),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    curve=curves,
    bounds=st.tuples(st.integers(1, 4), st.integers(1, 12)).map(sorted),
    unit=st.sampled_from([1, 1, 2]),
    efficiency=st.sampled_from([0.5, 0.8, 1.0]),
    capacities=st.lists(st.one_of(st.none(), st.integers(0, 14)), min_size=1, max_size=4),
)
def test_plans_stay_in_range_and_capacity_and_never_flap(
    curve: Curve, bounds: list[int], unit: int, efficiency: float, capacities: list[int | None]
) -> None:
    lo, hi = bounds
    lo = -(-lo // unit) * unit
    if lo > hi:
        return
    config = AutoscalerConfig(
        mode="on", interval_s=5.0, min_measure_s=15.0, warmup_s=1.0, cooldown_s=5.0, min_scaling_efficiency=efficiency
    )
    scaler = Autoscaler(config, 0.0)
    job = SimJob(scaler, curve, wanted=lo, lo=lo, hi=hi, unit=unit)
    epochs: list[list[int]] = []
    for capacity in capacities:
        job.set_capacity(capacity)
        first = len(job.decisions)
        job.run(240, step_s=2.0)
        epochs.append([d.target for d in job.decisions[first:] if d.changes])
        for d in job.decisions[first:]:
            if d.changes:
                assert lo <= d.target <= hi, d
                assert d.target % unit == 0, d
            if d.action == "grow":
                assert capacity is None or d.target <= capacity, d
    # No A -> B -> A -> B anywhere, and no size given back is ever asked for again.
    sizes = job.sizes
    for i in range(len(sizes) - 3):
        assert not (sizes[i] == sizes[i + 2] and sizes[i + 1] == sizes[i + 3]), sizes
    given_back = [a for a, b in itertools.pairwise(sizes) if b < a]
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        if b < a:
            assert all(later < a for later in sizes[i + 1 :]), (sizes, given_back)


# -------------------------------------------------------------------------- the master


def autoscaled_master(mode: str, journal: StateJournal | None = None) -> tuple[Master, FakeScheduler, ManualClock]:
    lifecycle = LifecycleConfig(nodes=NodeRange(1, 3), heartbeat_timeout_s=1000.0, insufficient_nodes_window_s=600.0)
    cfg = MasterConfig(
        job_name="auto",
        lifecycle=lifecycle,
        heartbeat_interval_s=1.0,
        autoscale=AutoscalerConfig(mode=mode, interval_s=5.0, min_measure_s=20.0, warmup_s=1.0, cooldown_s=5.0),
    )
    sched, clock = FakeScheduler(), ManualClock()
    return Master(cfg, sched, journal or MemoryJournal(), clock), sched, clock


def drive(master: Master, clock: ManualClock, curve: Curve, seconds: int) -> None:
    """Register launched nodes, heartbeat every running node with samples at `curve`, tick each second."""
    totals: dict[int, float] = {}
    for _ in range(seconds):
        clock.advance(1.0)
        nodes = master.status().nodes
        for node in nodes:
            if node.state.value == "pending":
                master.register(node.node_id, f"agent-{node.node_id}", f"host-{node.node_id}")
        running = [n for n in master.status().nodes if n.state.value == "running"]
        for node in running:
            totals[node.node_id] = totals.get(node.node_id, 0.0) + curve(len(running)) / len(running)
            master.heartbeat(node.node_id, samples=int(totals[node.node_id]))
        master.tick()


def test_the_master_starts_at_the_minimum_grows_through_resize_and_gives_back_what_does_not_pay() -> None:
    master, sched, clock = autoscaled_master("on")
    master.start()
    assert sorted(sched.specs) == [0]
    drive(master, clock, linear_then_flat(2), 400)
    status = master.status()
    assert (status.wanted_nodes, status.target_nodes) == (2, 2)
    events = master.events(limit=10_000)
    resizes = [(e.data["source"], e.data["previous_target"], e.data["target"]) for e in events if e.kind == "resize"]
    assert resizes == [("autoscaler", 1, 2), ("autoscaler", 2, 3), ("autoscaler", 3, 2)]
    plans = [e for e in events if e.kind == "autoscale_plan" and e.data["applied"]]
    assert [p.data["action"] for p in plans] == ["grow", "grow", "shrink"]
    assert plans[-1].data["measured"].keys() >= {"1", "2", "3"}
    assert "model" in plans[-1].data
    assert "planner" in plans[-1].data


def test_advise_records_plans_and_changes_nothing() -> None:
    master, sched, clock = autoscaled_master("advise")
    master.start()
    assert sorted(sched.specs) == [0, 1, 2]  # advise starts the job as usual
    drive(master, clock, linear_then_flat(3), 2)
    master.resize(1, "start small")
    drive(master, clock, linear_then_flat(3), 120)
    events = master.events(limit=10_000)
    assert [e.data["source"] for e in events if e.kind == "resize"] == ["scale"]
    advice = [e for e in events if e.kind == "autoscale_plan" and e.data["action"] == "grow"]
    assert len(advice) == 1, [e.message for e in events if e.kind == "autoscale_plan"]
    assert not advice[0].data["applied"]
    assert "would grow (advise: nothing changes)" in advice[0].message
    assert advice[0].data["measured"].keys() == {"1"}
    assert master.status().wanted_nodes == 1


def test_a_restarted_master_keeps_the_measurements_and_never_asks_again_for_a_count_given_back(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    master, _sched, clock = autoscaled_master("on", SqliteJournal(path))
    master.start()
    drive(master, clock, linear_then_flat(2), 400)
    assert master.status().wanted_nodes == 2
    resumed, _sched2, clock2 = autoscaled_master("on", SqliteJournal(path))
    scaler = resumed._autoscaler
    assert scaler is not None
    assert scaler.ceiling == 2
    assert sorted(scaler.measurements()) == [1, 2, 3]
    drive(resumed, clock2, linear_then_flat(2), 200)
    resizes = [e for e in resumed.events(limit=10_000) if e.kind == "resize"]
    assert [e.data["target"] for e in resizes] == [2, 3, 2]  # nothing new after the restart
