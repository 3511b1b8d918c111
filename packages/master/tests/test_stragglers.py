"""Runtime stragglers: the master compares ranks' step times from heartbeat stats (manual clock)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dlrover.common import ConfigError, ManualClock
from dlrover.diagnosis import FailureKind, RankStepStats, StragglerConfig
from dlrover.master.autoscaler import AutoscalerConfig
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.journal import MemoryJournal
from dlrover.master.master import Master
from dlrover.master.scheduler.fake import FakeScheduler
from dlrover.master.states import NodeState
from dlrover.master.stragglers import StragglerFinding, StragglerWatch

pytestmark = pytest.mark.timeout(30)


class Trainer:
    """Ranks stepping at their own pace; `stats(now)` is what their agents would send."""

    def __init__(self, step_s: dict[int, float], marks_every: int = 1) -> None:
        self.step_s = dict(step_s)
        self.marks_every = marks_every  # a script marked only by its saves marks every few steps
        self.steps = dict.fromkeys(step_s, 0)
        self.last_end = dict.fromkeys(step_s, 0.0)
        self.last_mark = dict.fromkeys(step_s, (0, 0.0))

    def advance_to(self, now: float) -> None:
        for rank, step_s in self.step_s.items():
            while self.last_end[rank] + step_s <= now:
                self.last_end[rank] += step_s
                self.steps[rank] += 1
                if self.steps[rank] % self.marks_every == 0:
                    self.last_mark[rank] = (self.steps[rank], self.last_end[rank])

    def stats(self, now: float, ranks: tuple[int, ...] | None = None) -> list[RankStepStats]:
        out = []
        for r in ranks or tuple(self.step_s):
            marked, at = self.last_mark[r]
            # Its agent, which sees every mark, says how many steps they cover.
            out.append(RankStepStats(r, marked, marked, 0.0, now - at, steps_per_mark=self.marks_every))
        return out


def test_a_rank_slowed_three_times_is_found_within_a_few_heartbeats_and_reported_once() -> None:
    watch = StragglerWatch(StragglerConfig(k=2.0, window_steps=5, min_samples=3))
    trainer = Trainer({0: 0.1, 1: 0.1, 2: 0.1})
    now = 0.0
    for _ in range(10):
        now += 1.0
        trainer.advance_to(now)
        watch.observe(7, trainer.stats(now), now)
        assert watch.check(now) is None
    slowed_at = now
    trainer.step_s[2] = 0.3
    found = None
    while found is None:
        now += 1.0
        assert now - slowed_at <= 30.0, "not found within 30 s"
        trainer.advance_to(now)
        watch.observe(7, trainer.stats(now), now)
        found = watch.check(now)
    assert found.ranks == (2,)
    assert found.nodes == (7,)
    assert "rank 2 takes" in found.report.reason
    assert now - slowed_at <= 5.0
    now += 1.0
    trainer.advance_to(now)
    watch.observe(7, trainer.stats(now), now)
    assert watch.check(now) is None  # already reported


def test_the_ranks_are_judged_at_most_once_per_check_interval() -> None:
    # Every node's heartbeat brings stats; judging all the job's ranks on each would cost the master
    # one judgment per node per interval. One per interval sees every node's newest stats.
    watch = StragglerWatch(StragglerConfig(k=2.0, min_lead_excess_s=0.0), check_every_s=5.0)
    leads = {0: 0.1, 1: 0.1, 2: 0.5, 3: 0.1, 4: 0.1}

    def beat(now: float) -> None:
        stats = [RankStepStats(r, 10, 10, 0.0, 0.0, median_sync_lead_s=lead) for r, lead in leads.items()]
        watch.observe(3, stats, now)

    beat(0.0)
    first = watch.check(0.0)
    assert first is not None
    assert first.ranks == (2,)
    leads[3] = 0.5  # a second rank slows
    beat(1.0)
    assert watch.check(1.0) is None  # judged 1 s ago: not again before 5 s
    beat(4.9)
    assert watch.check(4.9) is None
    beat(5.0)
    found = watch.check(5.0)
    assert found is not None
    assert found.ranks == (3,)
    with pytest.raises(ConfigError, match="check_every_s must be a finite number >= 0"):
        StragglerWatch(StragglerConfig(), check_every_s=-1.0)


def test_equal_ranks_on_several_nodes_are_no_stragglers() -> None:
    watch = StragglerWatch(StragglerConfig(k=2.0, window_steps=5, min_samples=3))
    trainer = Trainer({0: 0.5, 1: 0.5, 2: 0.52, 3: 0.5})
    now = 0.0
    for _ in range(40):
        now += 2.0
        trainer.advance_to(now)
        watch.observe(0, trainer.stats(now, (0, 1)), now)
        watch.observe(1, trainer.stats(now, (2, 3)), now)
        assert watch.check(now) is None


def _interleaved(watch: StragglerWatch, trainer: Trainer, heartbeats: int, start: float = 0.0) -> float:
    """Two nodes (rank r on node r) heartbeating every 0.5 s, each 0.25 s after the other, the
    master judging on every heartbeat as it does; returns the time of the last one."""
    now = start
    for i in range(heartbeats):
        now += 0.25
        trainer.advance_to(now)
        node = i % 2
        watch.observe(node, trainer.stats(now, (node,)), now)
        finding = watch.check(now)
        if finding is not None:
            raise AssertionError(f"straggler at {now}: {finding.report.reason}")
    return now


def _first_finding(
    watch: StragglerWatch, trainer: Trainer, now: float, heartbeats: int, first_node: int = 0
) -> tuple[StragglerFinding | None, int]:
    """Go on as `_interleaved` does from `now` (node `first_node` first) until the master finds a
    straggler or `heartbeats` passed; the finding (None: none) and the heartbeats it took."""
    for beat in range(1, heartbeats + 1):
        now += 0.25
        trainer.advance_to(now)
        node = (beat - 1 + first_node) % 2
        watch.observe(node, trainer.stats(now, (node,)), now)
        found = watch.check(now)
        if found is not None:
            return found, beat
    return None, heartbeats


def test_ranks_stepping_together_on_nodes_heartbeating_at_different_moments_are_no_stragglers() -> None:
    # Just before node 1's heartbeat its rank's last known step end lies a heartbeat interval back:
    # measured up to now, 0.2 s steps looked like 0.5-0.7 s against the other node's 0.2 s.
    watch = StragglerWatch(StragglerConfig())
    _interleaved(watch, Trainer({0: 0.2, 1: 0.2}), heartbeats=200)


def test_ranks_marked_every_fifth_step_on_nodes_heartbeating_at_different_moments_are_no_stragglers() -> None:
    # Marked only by their checkpointer's saves: just before a mark a rank is five steps on from
    # its last one, which is not one slow step (a 0.1 s-per-step job was reported with 0.37 s).
    watch = StragglerWatch(StragglerConfig())
    _interleaved(watch, Trainer({0: 0.1, 1: 0.1}, marks_every=5), heartbeats=400)


def test_a_slowed_rank_marked_every_fifth_step_is_still_found() -> None:
    watch = StragglerWatch(StragglerConfig(window_steps=5, min_samples=3))
    trainer = Trainer({0: 0.1, 1: 0.1}, marks_every=5)
    now = _interleaved(watch, trainer, heartbeats=80)
    trainer.step_s[1] = 0.4
    found, _ = _first_finding(watch, trainer, now, heartbeats=80)
    assert found is not None
    assert found.ranks == (1,), found.report.reason


def test_a_slowed_rank_on_nodes_heartbeating_at_different_moments_is_still_found() -> None:
    watch = StragglerWatch(StragglerConfig(window_steps=5, min_samples=3))
    trainer = Trainer({0: 0.2, 1: 0.2})
    now = _interleaved(watch, trainer, heartbeats=40)
    trainer.step_s[1] = 0.8
    found, _ = _first_finding(watch, trainer, now, heartbeats=40)
    assert found is not None
    assert found.ranks == (1,), found.report.reason


def test_a_rank_stuck_in_its_step_while_its_node_heartbeats_is_found() -> None:
    watch = StragglerWatch(StragglerConfig(window_steps=5, min_samples=3))
    trainer = Trainer({0: 0.2, 1: 0.2})
    now = _interleaved(watch, trainer, heartbeats=40)
    trainer.step_s[1] = 1000.0  # its current step never ends; its agent still sends the stats
    found, _ = _first_finding(watch, trainer, now, heartbeats=20)
    assert found is not None
    assert found.ranks == (1,), found.report.reason


def test_a_forgotten_node_is_no_longer_judged() -> None:
    watch = StragglerWatch(StragglerConfig(k=2.0, window_steps=3, min_samples=2, warmup_steps=0))
    trainer = Trainer({0: 0.1, 1: 1.0})
    now = 0.0
    found = None
    while found is None:
        now += 2.0
        trainer.advance_to(now)
        watch.observe(0, trainer.stats(now, (0,)), now)
        watch.observe(1, trainer.stats(now, (1,)), now)
        found = watch.check(now)
    assert found.nodes == (1,)
    watch.forget_node(1)
    assert watch.check(now) is None


class OneHostScheduler(FakeScheduler):
    """A fake backend whose nodes all run on one host, as the local backend's."""

    @property
    def host(self) -> str:
        return "the-only-host"


def _master(
    action: str, *, relaunches: bool = True, autoscale: str = "off", one_host: bool = False
) -> tuple[Master, FakeScheduler, ManualClock]:
    # With the autoscaler on the job starts at its minimum: the range is 2:2 so both nodes start.
    low = 2 if autoscale == "on" else 1
    lifecycle = LifecycleConfig(nodes=NodeRange(low, 2), heartbeat_timeout_s=30.0, insufficient_nodes_window_s=60.0)
    config = MasterConfig(
        job_name="t",
        lifecycle=lifecycle,
        heartbeat_interval_s=1.0,
        straggler_action=action,
        straggler_min_samples=3,
        autoscale=AutoscalerConfig(mode=autoscale, warmup_s=1.0),
    )
    sched = (OneHostScheduler if one_host else FakeScheduler)(relaunches_nodes=relaunches)
    clock = ManualClock()
    master = Master(config, sched, MemoryJournal(), clock)
    master.start()
    master.register(0, "a", "h0")
    master.register(1, "b", "h1")
    return master, sched, clock


def _train_until_found(master: Master, clock: ManualClock) -> None:
    trainer = Trainer({0: 0.1, 1: 0.1})
    for i in range(40):
        if i == 8:
            trainer.step_s[1] = 0.3
        clock.advance(1.0)
        now = clock.now()
        trainer.advance_to(now)
        master.heartbeat(0, rank_steps=trainer.stats(now, (0,)), samples=trainer.steps[0])
        master.heartbeat(1, rank_steps=trainer.stats(now, (1,)), samples=trainer.steps[1])
        master.tick()  # the autoscaler (when on) follows the running nodes: stragglers count in steady training
        if any(e.kind == "straggler" for e in master.events(limit=1000)):
            return
    raise AssertionError("no straggler event")


def test_the_master_reports_a_straggler_as_an_event_and_leaves_its_node_alone() -> None:
    master, sched, clock = _master("report")
    _train_until_found(master, clock)
    event = next(e for e in master.events(limit=1000) if e.kind == "straggler")
    assert event.data["ranks"] == [1]
    assert event.data["nodes"] == [1]
    assert event.data["action"] == "report"
    # The event rounds the times to 4 digits: a rank found just over the factor may equal it there.
    assert float(event.data["step_time_s"]["1"]) >= 2 * float(event.data["step_time_s"]["0"])
    assert master.node(1).state is NodeState.RUNNING
    assert 1 not in sched.stopped


def test_replace_relaunches_the_stragglers_node_where_the_backend_relaunches() -> None:
    master, sched, clock = _master("replace")
    _train_until_found(master, clock)
    assert master.node(1).state is NodeState.RELAUNCHING
    assert 1 in sched.stopped
    assert master.node(0).state is NodeState.RUNNING


@pytest.mark.parametrize("autoscale", ["off", "on"])
def test_replace_only_reports_where_every_node_runs_on_one_host(autoscale: str) -> None:
    # The replacement would avoid the slow node's host, the only one: it could never be placed,
    # and the job would spend its relaunches on launches the backend refuses.
    master, sched, clock = _master("replace", autoscale=autoscale, one_host=True)
    _train_until_found(master, clock)
    event = next(e for e in master.events(limit=1000) if e.kind == "straggler")
    assert event.data["action"] == "report"
    assert master.node(1).state is NodeState.RUNNING
    assert 1 not in sched.stopped
    assert not [e for e in master.events(limit=1000) if e.kind == "failure"]


def test_replace_only_reports_where_the_backend_does_not_relaunch() -> None:
    master, sched, clock = _master("replace", relaunches=False)
    _train_until_found(master, clock)
    assert master.node(1).state is NodeState.RUNNING
    assert 1 not in sched.stopped


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"straggler_action": "shout"}, "straggler_action must be one of report, replace"),
        ({"straggler_min_samples": 9, "straggler_window": 5}, "straggler_min_samples"),
        ({"straggler_factor": 0.0}, "straggler_factor"),
    ],
)
def test_bad_straggler_settings_are_refused(kw: dict[str, object], message: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=message):
        MasterConfig(**kw)  # type: ignore[arg-type]


def test_ranks_left_out_of_their_nodes_heartbeats_are_not_reported_as_stragglers() -> None:
    watch = StragglerWatch(StragglerConfig(k=2.0, window_steps=5, min_samples=3), stale_after_s=10.0)
    trainer = Trainer({0: 0.5, 1: 0.5, 2: 0.5, 3: 0.5})
    now = 0.0
    for _ in range(10):
        now += 2.0
        trainer.advance_to(now)
        watch.observe(0, trainer.stats(now, (0, 1)), now)
        watch.observe(1, trainer.stats(now, (2, 3)), now)
        assert watch.check(now) is None
    # Node 1's processes restart: its agent heartbeats without stats for a while; node 0's go on.
    for _ in range(10):
        now += 2.0
        trainer.advance_to(now)
        watch.observe(0, trainer.stats(now, (0, 1)), now)
        watch.observe(1, [], now)
        assert watch.check(now) is None


def test_the_ranks_of_a_silent_node_are_forgotten_after_the_staleness_bound() -> None:
    watch = StragglerWatch(StragglerConfig(k=2.0, window_steps=5, min_samples=3), stale_after_s=5.0)
    trainer = Trainer({0: 0.5, 1: 0.5, 2: 0.5})
    now = 0.0
    for _ in range(10):
        now += 2.0
        trainer.advance_to(now)
        watch.observe(0, trainer.stats(now, (0, 1)), now)
        watch.observe(1, trainer.stats(now, (2,)), now)
        assert watch.check(now) is None
    now += 6.0  # node 1 fell silent
    trainer.advance_to(now)
    watch.observe(0, trainer.stats(now, (0, 1)), now)
    assert watch.check(now) is None


def test_bad_staleness_is_refused() -> None:
    with pytest.raises(ConfigError, match="stale_after_s"):
        StragglerWatch(StragglerConfig(), stale_after_s=0.0)


def test_with_the_autoscaler_on_a_straggler_is_replaced_through_the_same_relaunch_path() -> None:
    master, sched, clock = _master("report", autoscale="on")
    _train_until_found(master, clock)
    event = next(e for e in master.events(limit=1000) if e.kind == "straggler")
    assert event.data["action"] == "replace"
    assert master.node(1).state is NodeState.RELAUNCHING
    assert 1 in sched.stopped
    failure = next(e for e in master.events(limit=1000) if e.kind == "failure")
    assert "the autoscaler is on: a straggler's node is replaced" in failure.data["evidence"]


def test_a_rank_whose_steps_start_over_is_judged_afresh() -> None:
    watch = StragglerWatch(StragglerConfig(k=2.0, window_steps=5, min_samples=3), stale_after_s=30.0)
    trainer = Trainer({0: 0.1, 1: 0.1})
    for t in range(1, 10):
        trainer.advance_to(float(t))
        watch.observe(0, trainer.stats(float(t), (0,)), float(t))
        watch.observe(1, trainer.stats(float(t), (1,)), float(t))
    # Rank 1's process restarted (a new round) and took 5 s to start: its first new step is no straggle.
    watch.observe(1, [RankStepStats(1, 1, 1, 0.0, 0.0)], 15.0)
    trainer.advance_to(15.0)
    watch.observe(0, trainer.stats(15.0, (0,)), 15.0)
    assert watch.check(15.0) is None


class SyncTrainer:
    """A synchronous job: each rank works its own time, then every rank waits for the slowest in
    the all-reduce; their agents report equal step times and their own lead times."""

    def __init__(self, work_s: dict[int, float]) -> None:
        self.work_s = dict(work_s)
        self.steps = 0
        self.last_end = 0.0

    def advance_to(self, now: float) -> None:
        while self.last_end + max(self.work_s.values()) <= now:
            self.last_end += max(self.work_s.values())
            self.steps += 1

    def stats(self, now: float, ranks: tuple[int, ...], groups: dict[int, int] | None = None) -> list[RankStepStats]:
        return [
            RankStepStats(
                r,
                self.steps,
                self.steps,
                0.0,
                now - self.last_end,
                median_sync_lead_s=self.work_s[r],
                sync_group=(groups or {}).get(r, 0),
            )
            for r in ranks
        ]


def test_a_rank_slowed_three_times_in_a_synchronous_job_is_found_within_30_s_by_its_lead() -> None:
    watch = StragglerWatch(StragglerConfig())
    trainer = SyncTrainer({0: 0.1, 1: 0.1, 2: 0.1, 3: 0.1})
    now = 0.0
    for i in range(80):  # two nodes of two ranks, heartbeating in turn
        now += 0.25
        trainer.advance_to(now)
        node = i % 2
        watch.observe(node, trainer.stats(now, (2 * node, 2 * node + 1)), now)
        assert watch.check(now) is None
    slowed_at = now
    trainer.work_s[3] = 0.3
    found = None
    while found is None:
        now += 0.25
        assert now - slowed_at <= 30.0, "not found within 30 s"
        trainer.advance_to(now)
        node = int(now / 0.25) % 2
        watch.observe(node, trainer.stats(now, (2 * node, 2 * node + 1)), now)
        found = watch.check(now)
    assert found.ranks == (3,)
    assert found.nodes == (1,)
    assert "before it synchronizes" in found.report.reason
    # The shrink order sees the slow node by its lead, not by the equal step times.
    times = watch.node_paces(now)
    assert times[1] == pytest.approx(0.3)
    assert times[0] == pytest.approx(0.1)


def test_leads_compare_within_the_group_that_synchronizes_together() -> None:
    # Two pipeline stages, each a data-parallel group of two ranks: stage 0's ranks (0, 1) wait
    # longer before their first gradient bucket by design. Nobody straggles; a rank slow within
    # its own stage does.
    watch = StragglerWatch(StragglerConfig())
    groups = {0: 0, 1: 0, 2: 2, 3: 2}
    trainer = SyncTrainer({0: 0.4, 1: 0.4, 2: 0.1, 3: 0.1})
    now = 0.0
    for _ in range(40):
        now += 0.5
        trainer.advance_to(now)
        watch.observe(0, trainer.stats(now, (0, 1, 2, 3), groups), now)
        assert watch.check(now) is None
    trainer.work_s[3] = 0.3
    now += 0.5
    trainer.advance_to(now)
    watch.observe(0, trainer.stats(now, (0, 1, 2, 3), groups), now)
    found = watch.check(now)
    assert found is not None
    assert found.ranks == (3,)


def test_a_rank_marking_every_step_that_stops_is_found_at_the_next_heartbeat() -> None:
    # Its agent says its marks cover one step each: the unfinished step counts whole, however
    # many steps a heartbeat covers (a stall is not divided by the five steps between heartbeats).
    watch = StragglerWatch(StragglerConfig(window_steps=5, min_samples=3))
    trainer = Trainer({0: 0.1, 1: 0.1})
    now = _interleaved(watch, trainer, heartbeats=80)
    trainer.step_s[1] = 1000.0
    found, beats = _first_finding(watch, trainer, now, heartbeats=3, first_node=1)
    assert found is not None, "a stalled rank is found at its node's next heartbeat or the one after"
    assert beats <= 3
    assert found.ranks == (1,)


class StragglerWatchMachine(RuleBasedStateMachine):
    """Heartbeats from nodes whose ranks move between them (a new round), restart, stop reporting or
    are forgotten: the watch's index of each node's ranks stays the inverse of each rank's node, and
    a check names only ranks it still watches."""

    def __init__(self) -> None:
        super().__init__()
        self.watch = StragglerWatch(StragglerConfig(k=2.0, window_steps=3, min_samples=1), stale_after_s=20.0)
        self.now = 0.0
        self.steps: dict[int, int] = {}

    @rule(
        node=st.integers(0, 3),
        ranks=st.sets(st.integers(0, 11), max_size=5),
        advance=st.floats(0.0, 10.0),
        restart=st.booleans(),
        lead=st.floats(0.0, 2.0),
    )
    def heartbeat(self, node: int, ranks: set[int], advance: float, restart: bool, lead: float) -> None:
        self.now += advance
        stats = []
        for rank in sorted(ranks):
            self.steps[rank] = 0 if restart else self.steps.get(rank, 0) + 1
            stats.append(RankStepStats(rank, self.steps[rank], 0, 0.0, 0.1, median_sync_lead_s=lead))
        self.watch.observe(node, stats, self.now)

    @rule(node=st.integers(0, 3))
    def forget_node(self, node: int) -> None:
        self.watch.forget_node(node)
        assert node not in self.watch._ranks_of

    @rule()
    def check(self) -> None:
        found = self.watch.check(self.now)
        if found is not None:
            assert set(found.ranks) <= set(self.watch._node_of)

    @invariant()
    def each_nodes_ranks_are_the_ranks_placed_on_it(self) -> None:
        inverse: dict[int, set[int]] = {}
        for rank, node in self.watch._node_of.items():
            inverse.setdefault(node, set()).add(rank)
        assert self.watch._ranks_of == inverse


TestStragglerWatchMachine = StragglerWatchMachine.TestCase
TestStragglerWatchMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_a_master_on_a_one_host_backend_relaunches_a_failed_node_there_instead_of_avoiding_it() -> None:
    # A hardware fault's relaunch avoids the host where the backend has others; on a one-host backend the
    # replacement must start on the only host there is (it used to fail to launch, three times).
    lifecycle = LifecycleConfig(nodes=NodeRange(2, 2), heartbeat_timeout_s=30.0)
    sched = OneHostScheduler()
    master = Master(MasterConfig(job_name="t", lifecycle=lifecycle), sched, MemoryJournal(), ManualClock())
    master.start()
    master.register(0, "a", "the-only-host")
    master.register(1, "b", "the-only-host")
    decision = master.report_failure(0, FailureKind.HARDWARE, "GPU has fallen off the bus")
    assert decision.action.value == "relaunch_node"
    assert not decision.avoid_host
    assert "host 'the-only-host' is not avoided" in decision.outcome
    assert "host_avoided" not in [e.kind for e in master.events(limit=1000)]
    (replacement,) = [spec for node_id, spec in sched.specs.items() if node_id >= 2]
    assert replacement.avoid_hosts == frozenset()
    master.register(replacement.node_id, "c", "the-only-host")  # not refused
