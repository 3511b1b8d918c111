"""Resources, quotas, machine shapes, plans and node sizing from observed usage."""

from __future__ import annotations

import math

import pytest

from dlrover.autoscale import (
    ClusterQuota,
    InsufficientSamplesError,
    InvalidMetricError,
    LaunchRequest,
    MachineShape,
    NodeState,
    PsLoadSample,
    Resources,
    Role,
    ScalePlan,
    SizingConfig,
    UsageSample,
    diff_to_target,
    parse_memory_mb,
    size_ps_options,
    size_worker_options,
)
from dlrover.common import ConfigError


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"cpu": math.nan, "memory_mb": 1}, "cpu must be a finite number, got nan"),
        ({"cpu": -1, "memory_mb": 1}, "cpu must be >= 0, got -1"),
        ({"cpu": 1, "memory_mb": 1.5}, "memory_mb must be an integer, got 1.5"),
        ({"cpu": 1, "memory_mb": 1, "gpu": -1}, "gpu must be >= 0, got -1"),
    ],
)
def test_resources_are_validated(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Resources(**kwargs)  # type: ignore[arg-type]


def test_machine_fit_and_quota_from_machines() -> None:
    shape = MachineShape("m", Resources(16, 65536, gpu=8), 10)
    assert shape.fits(Resources(4, 8192)) == 4
    assert shape.fits(Resources(1, 1024, gpu=2)) == 4
    assert shape.fits(Resources(32, 1024)) == 0
    quota = ClusterQuota.from_machines([shape, MachineShape("n", Resources(0.5, 1024), 2)], max_nodes=5)
    assert quota.cpu == pytest.approx(161.0)
    assert quota.memory_mb == 655360 + 2048
    assert quota.gpu == 80
    assert quota.max_nodes == 5
    with pytest.raises(ConfigError, match=r"names must be unique, \['m'\] repeat"):
        ClusterQuota(cpu=1, memory_mb=1, machines=[shape, shape])


def test_resources_json_round_trip_and_errors() -> None:
    r = Resources(2.5, 4096, 1)
    assert Resources.from_json(r.to_json()) == r
    with pytest.raises(ConfigError, match="lack the field 'cpu'"):
        Resources.from_json({"memory_mb": 1})


def test_accelerator_type_is_validated_matched_and_round_trips() -> None:
    h100 = Resources(8, 65536, 8, gpu_type="nvidia-h100")
    assert Resources.from_json(h100.to_json()) == h100
    assert "gpu_type" not in Resources(1, 1024, 1).to_json()  # rows written before types existed read the same
    assert h100.describe() == "8cpu/65536MiB/8gpu(nvidia-h100)"
    assert Resources(1, 1024, 1, gpu_type="nvidia-h100").fits_in(h100)
    assert Resources(1, 1024, 1).fits_in(h100)  # no type asked: any type
    a100 = Resources(1, 1024, 1, gpu_type="nvidia-a100")
    assert not a100.fits_in(h100)
    assert a100.exceeded_dimensions(h100) == ["gpu_type 'nvidia-a100' != 'nvidia-h100'"]
    assert MachineShape("h", h100, 2).fits(a100) == 0
    assert MachineShape("h", h100, 2).fits(Resources(1, 1024, 1, gpu_type="nvidia-h100")) == 8
    with pytest.raises(ConfigError, match="gpu_type 'nvidia-h100' is given with gpu=0"):
        Resources(1, 1024, gpu_type="nvidia-h100")
    with pytest.raises(ConfigError, match="'bad type!' is not an accelerator type"):
        Resources(1, 1024, 1, gpu_type="bad type!")
    with pytest.raises(ConfigError, match="gpu_type must be a string"):
        Resources(1, 1024, 1, gpu_type=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "mib"),
    [("2048", 2048), ("512Mi", 512), ("512MiB", 512), ("8Gi", 8192), ("1.5gi", 1536), ("1Ti", 1 << 20),
     ("4096Ki", 4), ("1Ki", 1), (" 300 Mi ", 300), ("0.5", 1)],
)  # fmt: skip
def test_memory_sizes_parse_to_whole_mib(text: str, mib: int) -> None:
    assert parse_memory_mb(text) == mib


@pytest.mark.parametrize(
    ("text", "match"),
    [("8G", "not understood"), ("", "not understood"), ("-1Gi", "not understood"), ("lots", "not understood"),
     ("1e3", "not understood"), ("0", "below 1 MiB"), ("0Ki", "below 1 MiB")],
)  # fmt: skip
def test_malformed_memory_sizes_are_refused_naming_the_value(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        parse_memory_mb(text)
    assert repr(text) in str(info.value)


def test_roles_cover_parameter_server_jobs() -> None:
    assert [r.value for r in Role] == ["worker", "ps", "chief", "evaluator"]


def test_diff_to_target_keeps_oldest_and_resizes_changed() -> None:
    nodes = [NodeState(i, Role.WORKER, Resources(4, 8192)) for i in (3, 1, 2)]
    nodes.append(NodeState(9, Role.PS, Resources(8, 8192)))
    plan = diff_to_target(nodes, [(Role.WORKER, 2, Resources(4, 8192)), (Role.PS, 2, Resources(8, 16384))], "why")
    assert plan.remove == (3,)
    assert plan.launch == (LaunchRequest(Role.PS, 1, Resources(8, 16384)),)
    assert [r.node_id for r in plan.resize] == [9]
    assert plan.reason == "why"
    assert ScalePlan.empty("nothing").is_empty
    with pytest.raises(ValueError, match="node ids repeat"):
        diff_to_target([nodes[0], nodes[0]], [], "x")
    with pytest.raises(ValueError, match="appears twice"):
        diff_to_target([], [(Role.WORKER, 1, Resources(1, 1)), (Role.WORKER, 1, Resources(1, 1))], "x")


def test_worker_sizing_from_usage() -> None:
    usage = [UsageSample(Role.WORKER, cpu, 6000.0) for cpu in (2.0, 2.5, 3.0, 3.0)]
    usage.append(UsageSample(Role.PS, 10.0, 60000.0))  # other roles do not count
    config = SizingConfig(
        cpu_headroom=0.2, memory_headroom=0.2, cpu_step=0.5, memory_step_mb=512, worker_cpu_fractions=(1.0, 0.5)
    )
    full, half = size_worker_options(usage, config)
    assert full.resources == Resources(4.0, 7680)  # 3.0 * 1.2 = 3.6 -> 4.0; 6000 * 1.2 = 7200 -> 7680
    assert full.efficiency == 1.0
    assert half.resources.cpu == 2.0
    assert half.efficiency == pytest.approx(2.0 / 3.0)  # 2 CPU for a worker that uses 3


def test_ps_sizing_from_load() -> None:
    load = [PsLoadSample(2, 100.0, 8.0), PsLoadSample(2, 200.0, 12.0)]  # 0.08 and 0.06 CPU per unit
    options = size_ps_options(
        load, [UsageSample(Role.PS, 4.0, 3000.0)], SizingConfig(cpu_headroom=0.25, ps_cpu_options=(4.0, 8.0))
    )
    assert [o.resources.cpu for o in options] == [4.0, 8.0]
    assert options[0].capacity == pytest.approx(4.0 / (0.08 * 1.25))
    assert options[0].resources.memory_mb == 4096  # 3000 * 1.2 = 3600, rounded up to 512 MiB steps


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: UsageSample(Role.WORKER, math.nan, 1.0), InvalidMetricError, "worker cpu_used is NaN"),
        (lambda: UsageSample(Role.WORKER, 1.0, -5.0), InvalidMetricError, "worker memory_used_mb must be >= 0"),
        (lambda: UsageSample(Role.WORKER, 1.0, None), InvalidMetricError, "worker memory_used_mb is missing"),
        (lambda: PsLoadSample(0, 1.0, 1.0), InvalidMetricError, "ps_count must be >= 1, got 0"),
        (lambda: PsLoadSample(1, 0.0, 1.0), InvalidMetricError, "PS load throughput must be > 0"),
        (lambda: size_worker_options([], SizingConfig()), InsufficientSamplesError, "0 worker usage samples"),
        (lambda: size_ps_options([], [], SizingConfig()), InsufficientSamplesError, "0 PS load samples"),
        (lambda: SizingConfig(worker_cpu_fractions=(1.5,)), ConfigError, "worker_cpu_fractions must be in"),
        (lambda: SizingConfig(ps_cpu_options=()), ConfigError, "ps_cpu_options must not be empty"),
    ],
)
def test_bad_usage_is_rejected(make: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        make()  # type: ignore[operator]


def test_every_public_name_resolves_lazily_to_its_modules_own() -> None:
    import dlrover.autoscale
    from dlrover.common.lazy import lazy_export_problems

    assert lazy_export_problems(dlrover.autoscale, dlrover.autoscale._EXPORTS) == []


@pytest.mark.timeout(120)
def test_the_resource_vocabulary_and_the_oom_heuristic_load_no_solver() -> None:
    # The master and every agent read Role and Resources; OR-tools takes half a second to import.
    from dlrover.common.lazy import modules_loaded_by

    statement = "from dlrover.autoscale import Resources, Role, parse_memory_mb, plan_oom_relaunch"
    assert modules_loaded_by(statement, ("ortools", "pandas")) == []
