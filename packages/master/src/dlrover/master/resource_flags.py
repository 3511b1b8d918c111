"""The node resource flags shared by `dlrover-master` and `dlrover-run --standalone`.

    --node-cpu 4 --node-memory 8Gi --node-gpus 1 --node-gpu-type nvidia-h100 --max-node-memory 32Gi

All are optional: a job that gives none asks for nothing (the backend's default; no memory limit). Memory sizes
are MiB as a plain number (`2048`) or a number with a binary unit (`512Mi`, `8Gi`, `1.5Gi`, `1Ti`); see
`dlrover.autoscale.parse_memory_mb`.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from dlrover.autoscale import Resources, parse_memory_mb
from dlrover.common import ConfigError

__all__ = ["add_resource_flags", "lifecycle_resources", "memory_flag", "resources_from_flags"]


def add_resource_flags(parser: argparse.ArgumentParser) -> None:
    """Add the node resource flags (strings, checked by `resources_from_flags`) to `parser`."""
    parser.add_argument("--node-cpu", default=None, help="CPU cores per node (fractions allowed); default: none asked")
    parser.add_argument(
        "--node-memory",
        default=None,
        help="memory per node: MiB (2048) or with a binary unit (512Mi, 8Gi); the local backend enforces it with a "
        "memory cgroup per node where the host allows; default: none asked, no limit",
    )
    parser.add_argument("--node-gpus", default=None, help="accelerators per node; default: none")
    parser.add_argument(
        "--node-gpu-type", default=None, help="the accelerator type (e.g. nvidia-h100); needs --node-gpus"
    )
    parser.add_argument(
        "--max-node-memory",
        default=None,
        help="the most memory a node relaunched after a host OOM may grow to (same units as --node-memory); one "
        "that runs out of memory at it stops the job; default: what the backend's largest node has",
    )
    parser.add_argument(
        "--oom-memory-growth",
        default="1.5",
        help="a node killed for host OOM is relaunched with its memory times this (>= 1)",
    )


def _number(text: str, flag: str, kind: type[int] | type[float]) -> float:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        noun = "a whole number" if kind is int else "a number"
        raise ConfigError(f"{flag} must be {noun}, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{flag} must be a finite number >= 0, got {text!r}")
    return value


def resources_from_flags(
    cpu: str | None, memory: str | None, gpus: str | None, gpu_type: str | None, *, prefix: str = "--node"
) -> Resources | None:
    """The node resources the flags ask for; None when no flag was given.

    `prefix` is what the flags' names start with (`--node` for `--node-cpu`, ...; `--ps` for `--ps-cpu`, ...), so an
    error names the flag that was given.

    Raises:
        ConfigError: a value is malformed or contradicts another; the message names the flag and the value.
    """
    if cpu is None and memory is None and gpus is None and gpu_type is None:
        return None
    try:
        memory_mb = parse_memory_mb(memory) if memory is not None else 0
    except ConfigError as exc:
        raise ConfigError(f"{prefix}-memory: {exc}") from None
    gpu = int(_number(gpus, f"{prefix}-gpus", int)) if gpus is not None else 0
    if gpu_type and not gpu:
        raise ConfigError(f"{prefix}-gpu-type {gpu_type!r} needs {prefix}-gpus of at least 1")
    try:
        return Resources(
            cpu=_number(cpu, f"{prefix}-cpu", float) if cpu is not None else 0.0,
            memory_mb=memory_mb,
            gpu=gpu,
            gpu_type=gpu_type or "",
        )
    except ConfigError as exc:
        raise ConfigError(f"{prefix}-*: {exc}") from None


def memory_flag(text: str, flag: str) -> int:
    """A memory size flag's value in MiB (see `dlrover.autoscale.parse_memory_mb`).

    Raises:
        ConfigError: the size is not understood; the message names the flag.
    """
    try:
        return parse_memory_mb(text)
    except ConfigError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def lifecycle_resources(args: argparse.Namespace) -> dict[str, Any]:
    """The `LifecycleConfig` fields the resource flags of `args` set (see `add_resource_flags`).

    Raises:
        ConfigError: a value is malformed; the message names the flag and the value.
    """
    cap = None if args.max_node_memory is None else memory_flag(args.max_node_memory, "--max-node-memory")
    growth = _number(args.oom_memory_growth, "--oom-memory-growth", float)
    if growth < 1:
        raise ConfigError(f"--oom-memory-growth must be >= 1, got {args.oom_memory_growth!r}")
    return {
        "node_resources": resources_from_flags(args.node_cpu, args.node_memory, args.node_gpus, args.node_gpu_type),
        "oom_memory_growth": growth,
        "max_node_memory_mb": cap,
    }
