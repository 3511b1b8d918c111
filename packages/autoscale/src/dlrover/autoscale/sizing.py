"""Sizing job nodes from observed usage: the CPU and memory options the planner chooses among.

A worker's request is its observed peak memory and high-percentile CPU plus headroom, rounded up to the
scheduler's granularity. Smaller CPU options are offered too, with an *efficiency*: a worker given a fraction of the
CPU it uses is assumed to run at that fraction of its speed (CPU throttling is proportional). A parameter server's
*capacity* is the job throughput one PS of a given CPU request can serve, from the observed CPU the PS fleet used
per unit of throughput.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import attrs
import numpy as np

from dlrover.autoscale._validate import (
    check_count,
    check_metric,
    check_positive,
    non_negative_number,
    positive_int,
    positive_number,
)
from dlrover.autoscale.errors import InsufficientSamplesError
from dlrover.autoscale.resources import Resources, Role
from dlrover.common import ConfigError

__all__ = [
    "UsageSample",
    "PsLoadSample",
    "WorkerOption",
    "PsOption",
    "SizingConfig",
    "size_worker_options",
    "size_ps_options",
]


@attrs.frozen
class UsageSample:
    """CPU and memory one node used over a sampling window.

    Raises:
        InvalidMetricError: if a value is missing, NaN or negative.
    """

    role: Role
    cpu_used: float
    memory_used_mb: float

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.role, Role):
            raise ConfigError(f"role must be a Role, got {self.role!r}")
        check_metric(f"{self.role.value} cpu_used", self.cpu_used)
        check_metric(f"{self.role.value} memory_used_mb", self.memory_used_mb)


@attrs.frozen
class PsLoadSample:
    """The CPU all parameter servers used together while the job ran at a throughput.

    Raises:
        InvalidMetricError: if a value is missing, NaN, negative, or the throughput or PS count is zero.
    """

    ps_count: int
    throughput: float
    total_cpu_used: float

    def __attrs_post_init__(self) -> None:
        check_count("ps_count", self.ps_count, minimum=1)
        check_positive("PS load throughput", self.throughput)
        check_metric("PS total_cpu_used", self.total_cpu_used)


@attrs.frozen
class WorkerOption:
    """One size a worker may be given, and the fraction of full speed a worker of that size runs at.

    Args:
        resources: the request.
        efficiency: in (0, 1]; 1 when the request covers what the worker uses.
    """

    resources: Resources
    efficiency: float = attrs.field(default=1.0, validator=positive_number)

    def __attrs_post_init__(self) -> None:
        if self.efficiency > 1:
            raise ConfigError(f"efficiency must be <= 1, got {self.efficiency}")


@attrs.frozen
class PsOption:
    """One size a parameter server may be given, and the job throughput one PS of that size can serve.

    Args:
        resources: the request.
        capacity: throughput one PS serves; None when PS load does not limit throughput.
    """

    resources: Resources
    capacity: float | None = attrs.field(default=None)

    def __attrs_post_init__(self) -> None:
        if self.capacity is not None:
            check_positive("PS capacity", self.capacity)


def _floats(items: Iterable[float]) -> tuple[float, ...]:
    return tuple(items)


def _round_up(value: float, step: float) -> float:
    return math.ceil(value / step - 1e-9) * step


@attrs.frozen
class SizingConfig:
    """How node requests are derived from observed usage.

    Args:
        cpu_headroom: fraction added to the observed CPU.
        memory_headroom: fraction added to the observed peak memory.
        cpu_quantile: which quantile of observed CPU a worker must be able to sustain.
        cpu_step: CPU requests are multiples of this many cores.
        memory_step_mb: memory requests are multiples of this many MiB.
        min_cpu: the smallest CPU request.
        min_memory_mb: the smallest memory request.
        worker_cpu_fractions: worker CPU options as fractions of the full request (1.0 is always offered).
        ps_cpu_options: CPU requests offered for parameter servers.
    """

    cpu_headroom: float = attrs.field(default=0.2, validator=non_negative_number)
    memory_headroom: float = attrs.field(default=0.2, validator=non_negative_number)
    cpu_quantile: float = attrs.field(default=0.95, validator=non_negative_number)
    cpu_step: float = attrs.field(default=0.5, validator=positive_number)
    memory_step_mb: int = attrs.field(default=512, validator=positive_int)
    min_cpu: float = attrs.field(default=1.0, validator=positive_number)
    min_memory_mb: int = attrs.field(default=1024, validator=positive_int)
    worker_cpu_fractions: tuple[float, ...] = attrs.field(default=(1.0,), converter=_floats)
    ps_cpu_options: tuple[float, ...] = attrs.field(default=(4.0, 8.0, 16.0), converter=_floats)

    def __attrs_post_init__(self) -> None:
        if not 0 < self.cpu_quantile <= 1:
            raise ConfigError(f"cpu_quantile must be in (0, 1], got {self.cpu_quantile}")
        for f in self.worker_cpu_fractions:
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
                raise ConfigError(f"worker_cpu_fractions must be in (0, 1], got {f!r}")
        if not self.ps_cpu_options:
            raise ConfigError("ps_cpu_options must not be empty")
        for c in self.ps_cpu_options:
            if isinstance(c, bool) or not isinstance(c, (int, float)) or not c > 0 or math.isinf(c):
                raise ConfigError(f"ps_cpu_options must be finite and > 0, got {c!r}")

    def memory_request(self, peak_mb: float) -> int:
        """The memory request for an observed peak: headroom, rounded up, at least the minimum."""
        return max(self.min_memory_mb, int(_round_up(peak_mb * (1 + self.memory_headroom), self.memory_step_mb)))

    def cpu_request(self, used: float) -> float:
        """The CPU request for observed use: headroom, rounded up, at least the minimum."""
        return max(self.min_cpu, _round_up(used * (1 + self.cpu_headroom), self.cpu_step))


def _of_role(usage: Sequence[UsageSample], role: Role) -> list[UsageSample]:
    return [u for u in usage if u.role == role]


def size_worker_options(usage: Sequence[UsageSample], config: SizingConfig, gpu: int = 0) -> tuple[WorkerOption, ...]:
    """Worker sizes to offer the planner, from observed worker usage.

    Args:
        usage: observations; those of other roles are ignored.
        config: headroom, granularity and the CPU fractions to offer.
        gpu: GPUs each worker needs (usage does not change it).

    Returns:
        One option per distinct CPU request, the full-speed one first.

    Raises:
        InsufficientSamplesError: if there is no worker observation.
    """
    mine = _of_role(usage, Role.WORKER)
    if not mine:
        raise InsufficientSamplesError("cannot size workers from 0 worker usage samples; at least 1 is needed")
    cpu_used = float(np.quantile([u.cpu_used for u in mine], config.cpu_quantile))
    memory = config.memory_request(max(u.memory_used_mb for u in mine))
    full = config.cpu_request(cpu_used)
    out: list[WorkerOption] = []
    for fraction in sorted({1.0, *config.worker_cpu_fractions}, reverse=True):
        cpu = max(config.min_cpu, _round_up(full * fraction, config.cpu_step))
        # Below what it uses, a worker is throttled in proportion; the headroom itself is not speed.
        efficiency = 1.0 if cpu_used <= 0 else min(1.0, cpu / cpu_used)
        option = WorkerOption(Resources(cpu=cpu, memory_mb=memory, gpu=gpu), efficiency=efficiency)
        if option.resources not in [o.resources for o in out]:
            out.append(option)
    return tuple(out)


def size_ps_options(
    load: Sequence[PsLoadSample], usage: Sequence[UsageSample], config: SizingConfig
) -> tuple[PsOption, ...]:
    """Parameter-server sizes to offer the planner, each with the throughput one PS of it can serve.

    The CPU one unit of throughput costs is the highest ratio observed (the safe side), plus headroom.

    Raises:
        InsufficientSamplesError: if there is no PS load observation.
    """
    if not load:
        raise InsufficientSamplesError("cannot size parameter servers from 0 PS load samples; at least 1 is needed")
    cpu_per_throughput = max(s.total_cpu_used / s.throughput for s in load) * (1 + config.cpu_headroom)
    ps_usage = _of_role(usage, Role.PS)
    memory = config.memory_request(max((u.memory_used_mb for u in ps_usage), default=0.0))
    out = []
    for cpu in sorted(set(config.ps_cpu_options)):
        capacity = None if cpu_per_throughput <= 0 else cpu / cpu_per_throughput
        out.append(PsOption(Resources(cpu=cpu, memory_mb=memory), capacity=capacity))
    return tuple(out)
