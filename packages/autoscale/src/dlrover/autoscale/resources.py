"""Resource amounts, node roles, machine shapes and the cluster quota a job is planned within.

Two meanings of "node" meet here. A *job node* is one process group the scheduler starts for the job (a pod on
Kubernetes, an actor on Ray); it requests `Resources`. A *machine* is a host of the cluster that job nodes are
packed onto; `MachineShape` describes how much a group of identical machines has free. The quota limits job nodes
in aggregate; the machines, when given, also limit how they pack.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterable
from typing import Any

import attrs

from dlrover.autoscale._validate import non_negative_int, non_negative_number
from dlrover.common import ConfigError

__all__ = ["Role", "Resources", "MachineShape", "ClusterQuota", "cpu_to_milli", "parse_memory_mb"]


class Role(str, enum.Enum):
    """The role of a job node.

    `WORKER` trains (every job has workers); `PS`, `CHIEF` and `EVALUATOR` are the other node groups of a
    TensorFlow parameter-server job: parameter servers, the chief worker and the evaluator.
    """

    WORKER = "worker"
    PS = "ps"
    CHIEF = "chief"
    EVALUATOR = "evaluator"


_GPU_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,63}")

_MEMORY = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*")
_MEMORY_UNITS_MIB = {
    "": 1.0,
    "mi": 1.0,
    "mib": 1.0,
    "ki": 1 / 1024,
    "kib": 1 / 1024,
    "gi": 1024.0,
    "gib": 1024.0,
    "ti": 1024.0 * 1024,
    "tib": 1024.0 * 1024,
}


def parse_memory_mb(text: str) -> int:
    """A memory size as whole MiB: `512Mi`, `8Gi`, `1.5Gi`, `1Ti`, `4096Ki`, or a plain number of MiB (`2048`).

    Units are binary (Ki, Mi, Gi, Ti, optionally with a trailing `B`, any case); a size that is not a whole number
    of MiB is rounded up. Decimal units (`G`, `M`) are refused rather than guessed.

    Raises:
        ConfigError: `text` is not such a size, or is below 1 MiB; the message names it.
    """
    match = _MEMORY.fullmatch(str(text))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _MEMORY_UNITS_MIB:
        raise ConfigError(
            f"memory size {text!r} is not understood: give MiB as a number (2048) or a number with a binary unit "
            "(512Mi, 8Gi, 1.5Gi, 1Ti)"
        )
    mib = math.ceil(float(match.group(1)) * _MEMORY_UNITS_MIB[unit])
    if mib < 1:
        raise ConfigError(f"memory size {text!r} is below 1 MiB")
    return mib


def _gpu_type(_inst: object, attribute: Any, value: Any) -> None:
    if not isinstance(value, str):
        raise ConfigError(f"{attribute.name} must be a string, got {value!r}")
    if value and not _GPU_TYPE.fullmatch(value):
        raise ConfigError(
            f"{attribute.name} {value!r} is not an accelerator type: 1-64 letters, digits, '.', '_', '/' or '-', "
            "starting with a letter or digit (e.g. nvidia-h100)"
        )


def cpu_to_milli(cpu: float) -> int:
    """CPU cores as integer millicores, the unit the solver and the scheduler count in."""
    return round(cpu * 1000)


@attrs.frozen
class Resources:
    """What one job node requests, or what one machine has free.

    Args:
        cpu: CPU cores (fractions allowed; the solver counts millicores).
        memory_mb: memory in MiB.
        gpu: whole GPUs (accelerators).
        gpu_type: the accelerator type (e.g. `nvidia-h100`); empty for any type. Only with `gpu` > 0.

    Raises:
        ConfigError: if a value is negative, NaN or of the wrong type, or an accelerator type is given without
            accelerators.
    """

    cpu: float = attrs.field(validator=non_negative_number)
    memory_mb: int = attrs.field(validator=non_negative_int)
    gpu: int = attrs.field(default=0, validator=non_negative_int)
    gpu_type: str = attrs.field(default="", validator=_gpu_type, kw_only=True)

    def __attrs_post_init__(self) -> None:
        if self.gpu_type and self.gpu == 0:
            raise ConfigError(f"gpu_type {self.gpu_type!r} is given with gpu=0: a type needs accelerators")

    @property
    def cpu_milli(self) -> int:
        """CPU in integer millicores."""
        return cpu_to_milli(self.cpu)

    def type_matches(self, limit: Resources) -> bool:
        """Whether `limit`'s accelerators are of the type this request asks for (any type when either is empty)."""
        return not (self.gpu and self.gpu_type and limit.gpu_type and self.gpu_type != limit.gpu_type)

    def fits_in(self, limit: Resources) -> bool:
        """Whether every amount of this request is within `limit` (and its accelerators are of the type asked)."""
        return (
            self.cpu_milli <= limit.cpu_milli
            and self.memory_mb <= limit.memory_mb
            and self.gpu <= limit.gpu
            and self.type_matches(limit)
        )

    def exceeded_dimensions(self, limit: Resources) -> list[str]:
        """The names of the amounts of this request that exceed `limit`, with both values."""
        out = []
        if self.cpu_milli > limit.cpu_milli:
            out.append(f"cpu {self.cpu:g} > {limit.cpu:g}")
        if self.memory_mb > limit.memory_mb:
            out.append(f"memory_mb {self.memory_mb} > {limit.memory_mb}")
        if self.gpu > limit.gpu:
            out.append(f"gpu {self.gpu} > {limit.gpu}")
        if not self.type_matches(limit):
            out.append(f"gpu_type {self.gpu_type!r} != {limit.gpu_type!r}")
        return out

    def describe(self) -> str:
        """A short human-readable form, e.g. `4cpu/8192MiB/1gpu` or `8cpu/65536MiB/8gpu(nvidia-h100)`."""
        kind = f"({self.gpu_type})" if self.gpu_type else ""
        gpu = f"/{self.gpu}gpu{kind}" if self.gpu else ""
        return f"{self.cpu:g}cpu/{self.memory_mb}MiB{gpu}"

    def to_json(self) -> dict[str, float | int | str]:
        """A JSON-ready dict; `from_json` reads it back (`gpu_type` only when set, so older readers still read it)."""
        data: dict[str, float | int | str] = {"cpu": self.cpu, "memory_mb": self.memory_mb, "gpu": self.gpu}
        if self.gpu_type:
            data["gpu_type"] = self.gpu_type
        return data

    @classmethod
    def from_json(cls, data: object) -> Resources:
        """Read what `to_json` wrote.

        Raises:
            ConfigError: if `data` is not a dict with valid `cpu`, `memory_mb`, `gpu` and `gpu_type`.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"resources must be a JSON object, got {data!r}")
        try:
            return cls(
                cpu=data["cpu"], memory_mb=data["memory_mb"], gpu=data.get("gpu", 0), gpu_type=data.get("gpu_type", "")
            )
        except KeyError as e:
            raise ConfigError(f"resources {data!r} lack the field {e.args[0]!r}") from None


@attrs.frozen
class MachineShape:
    """A group of identical machines and what each has free for this job.

    Args:
        name: a label used in explanations (e.g. `cpu-32c`).
        free: the resources free on each machine of this group.
        count: how many such machines there are.
    """

    name: str = attrs.field(validator=attrs.validators.min_len(1))
    free: Resources
    count: int = attrs.field(validator=non_negative_int)

    def fits(self, request: Resources) -> int:
        """How many job nodes of `request` one machine of this shape can host (zero when none fits)."""
        ratios = []
        for need, have in ((request.cpu_milli, self.free.cpu_milli), (request.memory_mb, self.free.memory_mb)):
            if need > 0:
                ratios.append(have // need)
        if request.gpu > 0:
            if not request.type_matches(self.free):
                return 0
            ratios.append(self.free.gpu // request.gpu)
        if not ratios:
            # A request of nothing packs without limit; the quota's node count still bounds it.
            return 1 << 30
        return max(0, min(ratios))


def _machines(items: Iterable[MachineShape]) -> tuple[MachineShape, ...]:
    return tuple(items)


def _check_machines(_inst: object, _attribute: Any, value: tuple[MachineShape, ...]) -> None:
    names = [m.name for m in value]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"machine shape names must be unique, {dupes} repeat")


@attrs.frozen
class ClusterQuota:
    """What a job may use in total, per node, and where its nodes can be placed.

    Args:
        cpu: total CPU cores across all of the job's nodes.
        memory_mb: total memory in MiB.
        gpu: total GPUs.
        max_nodes: the most job nodes (workers plus parameter servers).
        max_node: the largest request one job node may make (per-node limit); None for no limit.
        machines: the machines job nodes are packed onto, by shape; empty to plan against the totals only.

    Raises:
        ConfigError: if an amount is negative or NaN, or machine shape names repeat.
    """

    cpu: float = attrs.field(validator=non_negative_number)
    memory_mb: int = attrs.field(validator=non_negative_int)
    gpu: int = attrs.field(default=0, validator=non_negative_int)
    max_nodes: int = attrs.field(default=1 << 20, validator=non_negative_int)
    max_node: Resources | None = None
    machines: tuple[MachineShape, ...] = attrs.field(default=(), converter=_machines, validator=_check_machines)

    @property
    def cpu_milli(self) -> int:
        """Total CPU in integer millicores."""
        return cpu_to_milli(self.cpu)

    @classmethod
    def from_machines(cls, machines: tuple[MachineShape, ...] | list[MachineShape], **limits: Any) -> ClusterQuota:
        """A quota whose totals are the sum of the machines' free resources, unless given in `limits`."""
        ms = tuple(machines)
        totals: dict[str, Any] = {
            "cpu": sum(m.free.cpu_milli * m.count for m in ms) / 1000,
            "memory_mb": sum(m.free.memory_mb * m.count for m in ms),
            "gpu": sum(m.free.gpu * m.count for m in ms),
        }
        totals.update(limits)
        return cls(machines=ms, **totals)
