"""Runtime heuristics, table-driven: each row is (observations, config) -> expected plan and words of the reason."""

from __future__ import annotations

import math

import pytest

from dlrover.autoscale import (
    ElasticConfig,
    HotPsConfig,
    InvalidMetricError,
    LaunchRequest,
    NodeState,
    OomConfig,
    OomEvent,
    PendingConfig,
    PendingNode,
    PsCpuSeries,
    ResizeRequest,
    Resources,
    Role,
    StragglerConfig,
    WorkerSpeedSeries,
    plan_hot_ps,
    plan_oom_relaunch,
    plan_pending,
    plan_stragglers,
    plan_toward_target,
)
from dlrover.common import ConfigError


def worker(i: int, cpu: float = 4, mem: int = 8192) -> NodeState:
    return NodeState(i, Role.WORKER, Resources(cpu, mem))


def ps(i: int, cpu: float = 8, mem: int = 8192) -> NodeState:
    return NodeState(i, Role.PS, Resources(cpu, mem))


# ---------------------------------------------------------------- OOM

OOM = OomConfig(growth_factor=1.5, max_step_mb=8192, min_step_mb=1024, cap_mb=32768, max_relaunches=3)


@pytest.mark.parametrize(
    ("memory_mb", "relaunches", "peak", "new_memory", "words"),
    [
        (8192, 0, None, 12288, "relaunching with 12288 MiB"),  # x1.5
        (2048, 0, None, 3072, "relaunching with 3072 MiB"),  # x1.5 (1024 step == min step)
        (1024, 0, None, 2048, "relaunching with 2048 MiB"),  # x1.5 is +512, below min_step_mb: +1024
        (20480, 0, None, 28672, "relaunching with 28672 MiB"),  # x1.5 is +10240, above max_step_mb: +8192
        (28672, 1, None, 32768, "(capped)"),  # +8192 would pass cap_mb
        (8192, 0, 20000.0, 21024, "relaunching with 21024 MiB"),  # the observed peak is above one step
        (32768, 0, None, None, "already at the cap cap_mb=32768"),
        (8192, 3, None, None, "after 3 OOM relaunches (max_relaunches=3)"),
    ],
)
def test_oom_relaunch(memory_mb: int, relaunches: int, peak: float | None, new_memory: int | None, words: str) -> None:
    node = worker(5, mem=memory_mb)
    plan = plan_oom_relaunch(OomEvent(node, relaunches, peak), OOM)
    assert words in plan.reason
    assert "worker 5" in plan.reason
    if new_memory is None:
        assert plan.is_empty
    else:
        assert plan.resize == (ResizeRequest(5, Role.WORKER, Resources(4, new_memory)),)
        assert not plan.launch
        assert not plan.remove


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"growth_factor": 0.5}, "growth_factor must be >= 1"),
        ({"growth_factor": math.nan}, "growth_factor must be a finite number"),
        ({"cap_mb": 0}, "cap_mb must be >= 1"),
        ({"max_step_mb": -1}, "max_step_mb must be an integer|max_step_mb must be >= 0"),
    ],
)
def test_oom_config_is_validated(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        OomConfig(**kwargs)  # type: ignore[arg-type]


def test_oom_event_rejects_nan_peak() -> None:
    with pytest.raises(InvalidMetricError, match="peak_memory_mb is NaN"):
        OomEvent(worker(1), 0, math.nan)


# ---------------------------------------------------------------- hot PS

HOT = HotPsConfig(hot_cpu_ratio=0.9, hot_duration_s=300, cpu_growth_factor=1.5, cpu_step=1, max_node_cpu=16, max_ps=3)


def _series(node: NodeState, values: list[float], start: float = 0.0, step: float = 100.0) -> PsCpuSeries:
    return PsCpuSeries(node, [(start + i * step, v) for i, v in enumerate(values)])


@pytest.mark.parametrize(
    ("series", "ps_count", "resize", "launch", "words"),
    [
        # Hot (>= 90% of 8 CPU) for the whole 300 s window: grow to 12 CPU.
        ([_series(ps(1), [7.5, 7.6, 7.9, 7.8])], 1, [(1, 12.0)], 0, "PS 1 hot"),
        # Hot only for the last 200 s: not yet.
        ([_series(ps(1), [3.0, 3.0, 7.9, 7.8])], 1, [], 0, "no PS used >= 90%"),
        # Samples cover less than the window: not yet (we cannot say it was hot for 300 s).
        ([_series(ps(1), [7.9, 7.9], start=250)], 1, [], 0, "no PS used"),
        # At the per-node limit (16 CPU): split, adding one PS of the same size.
        ([_series(ps(1, cpu=16), [15.0, 15.5, 15.9, 15.2])], 1, [], 1, "adding one PS"),
        # At the per-node limit and at max_ps: nothing more.
        ([_series(ps(1, cpu=16), [15.0, 15.5, 15.9, 15.2])], 3, [], 0, "nothing more to do"),
        # Two PS, one hot: only that one grows; 12 * 1.5 = 18 is capped at 16.
        (
            [_series(ps(1, cpu=12), [11.5, 11.5, 11.5, 11.5]), _series(ps(2), [2.0, 2.0, 2.0, 2.0])],
            2,
            [(1, 16.0)],
            0,
            "PS 1 hot",
        ),
    ],
)
def test_hot_ps(
    series: list[PsCpuSeries], ps_count: int, resize: list[tuple[int, float]], launch: int, words: str
) -> None:
    plan = plan_hot_ps(now_s=300.0, series=series, ps_count=ps_count, config=HOT)
    assert words in plan.reason
    assert [(r.node_id, r.resources.cpu) for r in plan.resize] == resize
    assert plan.launched(Role.PS) == launch
    assert not plan.remove


def test_hot_ps_series_rejects_bad_samples() -> None:
    with pytest.raises(InvalidMetricError, match=r"ps 1 cpu\[1\] value is NaN"):
        _series(ps(1), [1.0, math.nan])
    with pytest.raises(InvalidMetricError, match=r"must be >= 0, got -2.0"):
        _series(ps(1), [-2.0])
    with pytest.raises(ConfigError, match="needs a PS node"):
        _series(worker(1), [1.0])


# ---------------------------------------------------------------- stragglers

STRAG = StragglerConfig(slow_ratio=0.7, persist_s=600, min_peers=3, max_replacements=1)


def _speeds(node: NodeState, values: list[float], start: float = 0.0) -> WorkerSpeedSeries:
    return WorkerSpeedSeries(node, [(start + i * 200.0, v) for i, v in enumerate(values)])


FAST = [10.0, 10.0, 10.0, 10.0]


@pytest.mark.parametrize(
    ("series", "removed", "words"),
    [
        # Worker 3 at 5/s against a median of 10/s for all of 600 s: replaced.
        ([_speeds(worker(1), FAST), _speeds(worker(2), FAST), _speeds(worker(3), [5.0] * 4)], [3], "worker 3 ran"),
        # Slow only in one window sample: not persistent.
        (
            [_speeds(worker(1), FAST), _speeds(worker(2), FAST), _speeds(worker(3), [5.0, 9.0, 5.0, 5.0])],
            [],
            "no worker",
        ),
        # Too few workers with a full window to judge.
        ([_speeds(worker(1), FAST), _speeds(worker(3), [5.0] * 4)], [], "min_peers=3"),
        # Two stragglers, one replacement per plan: the slowest goes first.
        (
            [
                _speeds(worker(1), FAST),
                _speeds(worker(2), FAST),
                _speeds(worker(4), FAST),
                _speeds(worker(3), [5.0] * 4),
                _speeds(worker(5), [2.0] * 4),
            ],
            [5],
            "1 more straggler(s) left for later",
        ),
        # Speeds within 70% of the median: nobody.
        ([_speeds(worker(1), FAST), _speeds(worker(2), FAST), _speeds(worker(3), [7.5] * 4)], [], "no worker"),
    ],
)
def test_stragglers(series: list[WorkerSpeedSeries], removed: list[int], words: str) -> None:
    plan = plan_stragglers(now_s=600.0, series=series, config=STRAG)
    assert words in plan.reason
    assert list(plan.remove) == removed
    assert plan.launched(Role.WORKER) == len(removed)
    for launch in plan.launch:
        assert launch.resources == Resources(4, 8192)  # a replacement of the same size


# ---------------------------------------------------------------- pending

PEND = PendingConfig(
    pending_timeout_s=300, shrink_factor=0.5, min_request=Resources(2, 4096), cpu_step=1, memory_step_mb=1024
)


@pytest.mark.parametrize(
    "case",
    [
        # Not overdue yet.
        ([PendingNode(worker(9), 100.0)], 4, 1, 1, [], [], "no node pending longer"),
        # Overdue, can shrink: 4 CPU / 8 GiB -> 2 CPU / 4 GiB.
        ([PendingNode(worker(9), 0.0)], 4, 1, 1, [(9, 2.0, 4096)], [], "asking for 2cpu/4096MiB"),
        # Overdue at the smallest request: the job shrinks (4 running + 1 pending -> 4).
        ([PendingNode(worker(9, 2, 4096), 0.0)], 4, 1, 1, [], [9], "shrinking the job to 4"),
        # node_unit 2: 3 running + 2 pending, one stuck -> keep 4, drop the stuck one only... 3+2-1=4 is aligned.
        (
            [PendingNode(worker(8, 2, 4096), 0.0), PendingNode(worker(9), 350.0)],
            3,
            1,
            2,
            [],
            [8],
            "shrinking the job to 4",
        ),
        # node_unit 2: 4 running + 2 pending, one stuck -> 5 is not aligned: drop the newest other pending too.
        (
            [PendingNode(worker(8, 2, 4096), 0.0), PendingNode(worker(9), 350.0)],
            4,
            1,
            2,
            [],
            [8, 9],
            "shrinking the job to 4",
        ),
        # Shrinking would go below min_workers: wait.
        ([PendingNode(worker(9, 2, 4096), 0.0)], 1, 2, 1, [], [], "fewer than min_workers=2: waiting"),
        # A PS at the smallest request cannot be dropped.
        ([PendingNode(ps(9, 2, 4096), 0.0)], 4, 1, 1, [], [], "a PS cannot be dropped"),
        # A PS that can shrink does.
        ([PendingNode(ps(9, 8, 8192), 0.0)], 4, 1, 1, [(9, 4.0, 4096)], [], "ps 9 pending 400s"),
    ],
)
def test_pending(case: tuple[list[PendingNode], int, int, int, list[tuple[int, float, int]], list[int], str]) -> None:
    pending, running, min_workers, unit, resize, remove, words = case
    plan = plan_pending(
        now_s=400.0, pending=pending, running_workers=running, min_workers=min_workers, node_unit=unit, config=PEND
    )
    assert words in plan.reason
    assert [(r.node_id, r.resources.cpu, r.resources.memory_mb) for r in plan.resize] == resize
    assert list(plan.remove) == remove


def test_pending_rejects_bad_input() -> None:
    with pytest.raises(InvalidMetricError, match="node 9 pending_since_s is NaN"):
        PendingNode(worker(9), math.nan)
    with pytest.raises(InvalidMetricError, match="node_unit must be >= 1, got 0"):
        plan_pending(now_s=1.0, pending=[], running_workers=1, min_workers=1, node_unit=0, config=PEND)
    with pytest.raises(ConfigError, match="pending node ids repeat"):
        plan_pending(
            now_s=1.0,
            pending=[PendingNode(worker(1), 0.0), PendingNode(worker(1), 0.0)],
            running_workers=1,
            min_workers=1,
            node_unit=1,
            config=PEND,
        )


# ---------------------------------------------------------------- elastic

ELASTIC = ElasticConfig(max_launch_per_plan=8)
W = Resources(4, 8192)


@pytest.mark.parametrize(
    "case",
    [
        # Room for everything: grow to the target.
        (8, 4, 0, 100, 1, 1, 4, [], "growing to 8"),
        # Room for 3, node_unit 2: grow by 2 only.
        (8, 4, 0, 3, 1, 2, 2, [], "growing to 6"),
        # Bounded step: at most 8 per plan.
        (32, 4, 0, 100, 1, 1, 8, [], "growing to 12"),
        # At the target: nothing.
        (4, 4, 0, 100, 1, 1, 0, [], "at the planned size"),
        # No room at all: nothing, and the reason says so.
        (8, 4, 0, 0, 1, 2, 0, [], "no room to add node_unit=2"),
        # More alive than planned: remove the newest.
        (2, 4, 0, 0, 1, 1, 0, [2, 3], "removing 2"),
        # Preempted to 5 with node_unit 2 and no room: shrink to 4.
        (8, 5, 3, 0, 1, 2, 0, [4], "3 worker(s) preempted; 5 workers alive and no room"),
        # Preempted to 5 with node_unit 2 and room for 1: replace, back to 6.
        (8, 5, 3, 1, 1, 2, 1, [], "growing to 6"),
        # Preempted to 1 with node_unit 2 and no room; aligned 0 < min_workers: wait.
        (8, 1, 3, 0, 1, 2, 0, [], "waiting for capacity"),
    ],
)
def test_toward_target(case: tuple[int, int, int, int, int, int, int, list[int], str]) -> None:
    target, alive, preempted, free, min_workers, unit, launch, remove, words = case
    plan = plan_toward_target(
        target_workers=target,
        worker_resources=W,
        alive=[worker(i) for i in range(alive)],
        preempted=preempted,
        free_slots=free,
        min_workers=min_workers,
        node_unit=unit,
        config=ELASTIC,
    )
    assert words in plan.reason
    assert plan.launched(Role.WORKER) == launch
    if launch:
        assert plan.launch == (LaunchRequest(Role.WORKER, launch, W),)
    assert list(plan.remove) == remove
    # Whatever it does, the result is a multiple of node_unit or unchanged.
    after = alive + launch - len(remove)
    assert after == alive or after % unit == 0


def test_toward_target_rejects_bad_input() -> None:
    with pytest.raises(ConfigError, match="target_workers=5 must be a multiple of node_unit=2"):
        plan_toward_target(
            target_workers=5,
            worker_resources=W,
            alive=[],
            preempted=0,
            free_slots=1,
            min_workers=1,
            node_unit=2,
            config=ELASTIC,
        )
    with pytest.raises(InvalidMetricError, match="free_slots must be >= 0, got -1"):
        plan_toward_target(
            target_workers=4,
            worker_resources=W,
            alive=[],
            preempted=0,
            free_slots=-1,
            min_workers=1,
            node_unit=1,
            config=ELASTIC,
        )
    with pytest.raises(ConfigError, match="alive must hold workers only"):
        plan_toward_target(
            target_workers=4,
            worker_resources=W,
            alive=[ps(1)],
            preempted=0,
            free_slots=1,
            min_workers=1,
            node_unit=1,
            config=ELASTIC,
        )
