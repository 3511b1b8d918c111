"""The goodput simulator's data (tools/goodput_sim/data_feed.py): the master's real shard service hands
out the job's data, every checkpoint holds its data position, and a restore hands it back. The check
that a position at step `s` holds exactly `s` steps' units, against the real service, across worlds of
every size, readers of several nodes, departures and restores; and that a wrong position is caught."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from goodput_sim.data_feed import DATASET, DataFeed, DataLossError  # noqa: E402
from goodput_sim.dlrover_run import DLRoverRun  # noqa: E402
from goodput_sim.scenario import parse  # noqa: E402
from goodput_sim.trace import Interruption  # noqa: E402

from dlrover.common import ManualClock  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def feed(full: int = 8, per_reader: int = 1, shard_steps: int = 3) -> DataFeed:
    data = DataFeed(
        ManualClock(0.0, 1_700_000_000.0),
        full=full,
        nodes_per_reader=per_reader,
        shard_steps=shard_steps,
        lease_timeout_s=1e9,
    )
    data.register()
    return data


def test_a_smaller_world_trains_the_same_units_a_step_and_a_restore_goes_back_to_a_position() -> None:
    data = feed(full=8, per_reader=2, shard_steps=3)
    data.start_attempt([10, 11, 12, 13, 14], 0, restore=False)  # 5 of 8 nodes: 3 readers, uneven shares
    data.settle(17, restorable={0, 12})
    data.check(17)
    assert data.acknowledged(data.positions[12]) == 12 * 8
    assert sorted(data.positions) == [0, 12, 17]

    data.start_attempt([20, 21, 22, 23, 24, 25, 26, 27], 12, restore=True)  # the whole job, from step 12
    assert sorted(data.positions) == [0, 12]  # step 17 of the old attempt is trained again, on other data
    data.settle(30, restorable={12, 25})
    data.check(30)
    assert data.restores == 1
    assert sorted(data.positions) == [12, 25, 30]  # older than every restorable step: forgotten


def test_the_master_returning_a_departed_nodes_shards_loses_nothing_once_the_position_is_restored() -> None:
    data = feed(full=4, shard_steps=5)
    data.start_attempt([1, 2, 3, 4], 0, restore=False)
    data.settle(7, restorable={0, 6})
    released = data.hosted.release(3, "node 3 was relaunched")  # the master's departure path
    assert list(released) == [DATASET]
    assert len(released[DATASET]) == 1  # the shard its reader held
    data.start_attempt([1, 2, 4, 5], 6, restore=True)
    data.settle(11, restorable={6})
    data.check(11)


def test_a_data_position_that_does_not_hold_its_steps_stops_the_run() -> None:
    data = feed(full=4, shard_steps=2)
    data.start_attempt([1, 2, 3, 4], 0, restore=False)
    data.settle(5, restorable={0, 3})
    with data.hosted.locked() as registry:  # a data path that went back without the checkpoint
        registry.restore(data.positions[3], DATASET)
    with pytest.raises(DataLossError, match=r"at step 5 holds 12 units acknowledged, expected 20"):
        data.check(5)
    with pytest.raises(DataLossError, match="no data position was read at step 4"):
        data.start_attempt([1, 2, 3, 4], 4, restore=True)


class DataMachine(RuleBasedStateMachine):
    """Attempts of random worlds train, settle and restore; every position read holds its steps."""

    def __init__(self) -> None:
        super().__init__()
        self.full = 6
        self.data = feed(full=self.full, per_reader=2, shard_steps=2)
        self.next_node = 100
        self.world: list[int] = []
        self.step = 0

    def _members(self, size: int) -> list[int]:
        members = list(range(self.next_node, self.next_node + size))
        self.next_node += size
        return members

    @precondition(lambda self: not self.world)
    @rule(size=st.integers(1, 6))
    def first_round(self, size: int) -> None:
        self.world = self._members(size)
        self.data.start_attempt(self.world, 0, restore=False)

    @precondition(lambda self: bool(self.world))
    @rule(steps=st.integers(0, 9), saved=st.sets(st.integers(0, 9), max_size=3))
    def train(self, steps: int, saved: set[int]) -> None:
        reached = self.step + steps
        restorable = {s for s in self.data.positions if s <= self.step} | {self.step + k for k in saved if k <= steps}
        self.data.settle(reached, restorable)
        self.step = reached
        self.data.check(reached)

    @precondition(lambda self: bool(self.world))
    @rule(data=st.data(), size=st.integers(1, 6), departed=st.booleans())
    def restore(self, data: st.DataObject, size: int, departed: bool) -> None:
        if departed:
            self.data.hosted.release(self.world[0], "the node left")
        step = data.draw(st.sampled_from(sorted(self.data.positions)))
        self.world = self._members(size)
        self.data.start_attempt(self.world, step, restore=True)
        self.step = step

    @invariant()
    def positions_hold_their_steps(self) -> None:
        for step, document in self.data.positions.items():
            assert self.data.acknowledged(document) == step * self.full


TestDataMachine = DataMachine.TestCase
TestDataMachine.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)


def test_a_simulated_run_restores_the_data_position_at_every_round() -> None:
    sc = parse(
        {
            "job": {
                "accelerators": 64,
                "days": 1.0,
                "step_time_s": 10.0,
                "checkpoint_gib": 64.0,
                "model_parallel_nodes": 3,  # 8 nodes: readers of 3, 3 and 2 nodes
                "shard_steps": 7,
            },
            "costs": {"node_provision_s": 200.0, "process_restart_s": 30.0, "storage_write_gib_s": 4.0},
            "strategy": [
                {
                    "name": "everything on",
                    "kind": "dlrover",
                    "flash_every_steps": 2,
                    "storage_interval_s": 1800.0,
                    "replicated_memory": True,
                    "min_nodes": 7,
                    "max_node_relaunches": 100,
                }
            ],
        }
    )
    trace = [
        Interruption(10_000.0, 3, "software"),  # restarted in place
        Interruption(20_000.0, 5, "gpu"),  # relaunched: the others go on without it, then a planned round
        Interruption(40_000.0, 1, "host_maintenance"),  # lost: the master's heartbeat timeout finds it
        Interruption(60_000.0, 6, "nccl_hang"),
    ]
    run = DLRoverRun(sc, sc.strategies[0])
    run.run(trace)  # its end checks the data position at the last step reached
    assert not run.stopped
    assert run.data.restores >= 5  # one per round after the first: each interruption, and the planned round
    reached = run._settle_data()
    assert reached * 8 == run.data.acknowledged(run.data.positions[reached])


AUTOSCALED = {
    "name": "autoscaled",
    "kind": "dlrover",
    "flash_every_steps": 1,
    "storage_interval_s": 1800.0,
    "replicated_memory": True,
    "min_nodes": 6,
    "max_node_relaunches": 100,
    "autoscale": "on",
}


def autoscaled_run(**strategy: object) -> DLRoverRun:
    sc = parse(
        {
            "job": {"accelerators": 64, "days": 1.0, "step_time_s": 10.0, "checkpoint_gib": 64.0, "shard_steps": 7},
            "costs": {"node_provision_s": 200.0, "process_restart_s": 30.0, "storage_write_gib_s": 4.0},
            "strategy": [{**AUTOSCALED, **strategy}],
        }
    )
    return DLRoverRun(sc, sc.strategies[0])


def test_with_the_autoscaler_on_the_job_starts_at_its_minimum_and_grows_to_the_top_where_each_node_pays() -> None:
    run = autoscaled_run()
    run.run([Interruption(40_000.0, 2, "gpu")])
    assert not run.stopped
    sizes = [int(e.data["target"]) for e in run.master.events(after_seq=0, limit=10_000) if e.kind == "resize"]
    assert sizes == [8]  # from 6 (the minimum), once: linear scaling pays, and nothing is given back
    assert run.decisions["replacement up: planned round"] >= 1  # the grown nodes joined a planned round
    assert "resize: nodes let go, planned round" not in run.decisions
    assert len(run.members) == 8


def scaled_down_mid_attempt(run: DLRoverRun) -> list[float]:
    """Have a person scale `run` from 8 to 6 nodes a few minutes into training, after a settle left the
    readers holding partly acknowledged shards; returns when (filled in as the run goes)."""
    original = run._scale_tick
    ticks: list[float] = []
    shrunk: list[float] = []

    def tick_with_a_scale_request(t: float) -> None:
        ticks.append(t)
        if len(ticks) == 2:
            run._settle_data()  # the readers hold partly acknowledged shards, as after any earlier settle
        if len(ticks) == 3:
            assert len(run.members) == 8
            run.master.resize(6, "a person's dlrover-master scale 6")
            shrunk.append(t)
        original(t)

    run._scale_tick = tick_with_a_scale_request  # type: ignore[method-assign]
    return shrunk


def test_nodes_the_master_lets_go_leave_at_a_planned_round_that_redoes_no_step() -> None:
    run = autoscaled_run(autoscale="advise", min_nodes=6)
    shrunk = scaled_down_mid_attempt(run)
    breakdown = run.run([])
    assert shrunk
    assert run.decisions["resize: nodes let go, planned round"] == 1
    assert len(run.members) == 6
    assert run.data.restores == 1  # the planned round restored the sealed step's data position
    assert breakdown.buckets["steps_redone"] == 0.0


def test_a_report_refused_inside_a_master_call_stops_the_run() -> None:
    """The master only logs what a membership library raises: the simulation raises it after the call."""
    run = autoscaled_run(autoscale="advise", min_nodes=6)
    membership = run.master._master._membership
    membership.append(membership.pop(0))  # the acknowledging hook after the shard service: the wrong order
    scaled_down_mid_attempt(run)
    with pytest.raises(DataLossError, match="report was refused"):
        run.run([])


def test_with_no_last_call_a_smaller_world_still_forms_with_every_node_that_joined() -> None:
    sc = parse(
        {
            "job": {"accelerators": 64, "days": 1.0, "step_time_s": 10.0, "checkpoint_gib": 64.0},
            "costs": {"node_provision_s": 200.0, "rendezvous_last_call_s": 0.0},
            "strategy": [{**AUTOSCALED, "autoscale": "off", "min_nodes": 6}],
        }
    )
    run = DLRoverRun(sc, sc.strategies[0])
    run.run([Interruption(20_000.0, 5, "gpu")])  # 7 nodes go on without it, then the replacement joins
    assert not run.stopped
    assert len(run.members) == 8
    assert run.decisions["replacement up: planned round"] == 1


def test_a_warm_spare_the_autoscaler_gives_a_rank_joins_the_world_at_a_planned_round() -> None:
    run = autoscaled_run(spare_nodes=1, min_nodes=7)  # the growth 7 -> 8 promotes the spare, launching no rank
    run.run([])
    assert len(run.members) == 8
    assert run.decisions == {"replacement up: planned round": 1}
