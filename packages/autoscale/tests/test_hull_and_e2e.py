"""The concave-hull encoding of the throughput table, and the whole path from observations to plans."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from dlrover.autoscale import (
    ClusterQuota,
    MachineShape,
    NodeState,
    OomConfig,
    OomEvent,
    PlanRequest,
    PlanStatus,
    PsLoadSample,
    ResourcePlanner,
    Resources,
    Role,
    SizingConfig,
    ThroughputModel,
    ThroughputSample,
    UsageSample,
    fit_throughput_model,
    plan_oom_relaunch,
    size_ps_options,
    size_worker_options,
)
from dlrover.autoscale.planner import concave_hull


def _chords_reproduce(values: list[int], hull: list[int]) -> bool:
    """Independent check: the floor of the chord through the surrounding hull vertices equals each value."""
    for i, v in enumerate(values):
        a = max(h for h in hull if h <= i)
        b = min(h for h in hull if h >= i)
        if a == b:
            if values[a] != v:
                return False
            continue
        chord = (values[a] * (b - a) + (values[b] - values[a]) * (i - a)) // (b - a)
        if chord != v:
            return False
    return True


@given(
    a=st.floats(0, 0.01),
    b=st.floats(0.001, 1.0),
    c=st.floats(0, 0.01),
    unit=st.integers(1, 8),
    efficiency=st.sampled_from([1.0, 0.55, 0.75]),
)
def test_the_floored_curve_up_to_its_peak_is_always_encoded_by_its_hull(
    a: float, b: float, c: float, unit: int, efficiency: float
) -> None:
    model = ThroughputModel(a=a, b=b, c=c)
    ks = np.arange(1, 400, dtype=np.int64)
    curve = model.predict_many(ks * unit)
    curve = curve[: int(np.argmax(curve)) + 1]  # the planner cuts the table at the peak
    table = np.floor(curve * efficiency * (1_000_000 / (float(curve[-1]) * efficiency))).astype(np.int64)
    hull = concave_hull(table)
    assert hull is not None
    assert _chords_reproduce([int(x) for x in table], hull)


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=30))
def test_hull_is_returned_only_when_its_chords_reproduce_the_values(values: list[int]) -> None:
    hull = concave_hull(np.array(values, dtype=np.int64))
    if hull is not None:
        assert hull[0] == 0
        assert hull[-1] == len(values) - 1
        assert _chords_reproduce(values, hull)


def test_non_concave_tables_fall_back() -> None:
    assert concave_hull(np.array([0, 1, 5, 6])) is None
    assert concave_hull(np.array([0, 10, 20, 30])) == [0, 3]


def test_observations_to_plan_to_runtime_fix() -> None:
    """Fit, size, plan within a mixed cluster, then an OOM relaunch of a planned worker."""
    rng = np.random.default_rng(3)
    truth = ThroughputModel(a=0.0005, b=0.2, c=0.0001)
    samples = [ThroughputSample(n, truth.predict(n) * float(rng.normal(1, 0.02)), ps=2) for n in (2, 4, 8, 16)]
    model = fit_throughput_model(samples)
    usage = [UsageSample(Role.WORKER, 3.1, 11000.0), UsageSample(Role.PS, 5.0, 6000.0)]
    sizing = SizingConfig(worker_cpu_fractions=(1.0, 0.5), ps_cpu_options=(8.0, 16.0))
    workers = size_worker_options(usage, sizing)
    ps = size_ps_options([PsLoadSample(2, truth.predict(16), 9.0)], usage, sizing)
    quota = ClusterQuota.from_machines(
        [MachineShape("c32", Resources(32, 131072), 6), MachineShape("c16", Resources(16, 65536), 10)]
    )
    current = tuple(NodeState(i, Role.WORKER, workers[0].resources) for i in range(16))
    result = ResourcePlanner().plan(
        PlanRequest(
            model=model, quota=quota, worker_options=workers, ps_options=ps, max_ps=4, min_ps=1, current=current
        )
    )
    assert result.status == PlanStatus.OPTIMAL
    assert result.shape is not None
    assert result.shape.ps >= 1
    assert result.predicted_throughput > model.predict(16) * 0.99  # at least what 16 workers gave
    assert "binding:" in result.reason
    # The plan keeps the 16 current workers (ids 0..15) and launches the rest.
    assert not result.plan.remove
    assert result.plan.launched(Role.WORKER) == result.shape.workers - 16
    # One of them later runs out of memory: relaunched with more, within the per-node cap.
    oom = plan_oom_relaunch(OomEvent(current[0]), OomConfig(cap_mb=65536))
    assert oom.resize[0].resources.memory_mb > current[0].resources.memory_mb
