"""Node health probe: a short matmul plus all-reduce and all-gather timing over torch.distributed.

Run between paired nodes (the pairing comes from dlrover-rendezvous): each pair forms a
two-rank process group, each rank multiplies matrices on its device, then both time a few
all-reduce and all-gather rounds and check the results. gloo on CPU, nccl when CUDA is available.
A probe never raises because the node is bad: the failure is the result (``ok=False`` with the
error), which the classifier's ``health-probe-failed`` rule reads.

torch is an optional dependency (extra ``torch``) imported only when a probe runs.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import attrs

from dlrover.common import Clock, ConfigError, SystemClock
from dlrover.diagnosis.errors import ProbeError
from dlrover.diagnosis.evidence import ProbeResult

__all__ = ["ProbeConfig", "pick_backend", "run_paired_probe", "run_probe"]


def _positive_int(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"ProbeConfig.{attribute.name} must be an integer >= 1, got {value!r}")


def _positive_float(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"ProbeConfig.{attribute.name} must be a finite number > 0, got {value!r}")


def _backend(_inst: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value not in (None, "gloo", "nccl"):
        raise ConfigError(f"ProbeConfig.backend must be 'gloo', 'nccl' or None (auto), got {value!r}")


@attrs.frozen
class ProbeConfig:
    """How big and how long a probe is.

    Attributes:
        matmul_size: side of the square matrices multiplied (default 256).
        matmul_rounds: multiplications timed (default 4).
        collective_numel: float32 elements per all-reduce / all-gather (default 262144, 1 MiB).
        collective_rounds: rounds of each collective timed (default 4).
        timeout_s: process-group timeout: a peer that does not answer within it fails the probe
            (default 30 s).
        backend: ``"gloo"``, ``"nccl"``, or None to pick nccl when CUDA is available, else gloo.
    """

    matmul_size: int = attrs.field(default=256, validator=_positive_int)
    matmul_rounds: int = attrs.field(default=4, validator=_positive_int)
    collective_numel: int = attrs.field(default=262_144, validator=_positive_int)
    collective_rounds: int = attrs.field(default=4, validator=_positive_int)
    timeout_s: float = attrs.field(default=30.0, validator=_positive_float)
    backend: str | None = attrs.field(default=None, validator=_backend)


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ProbeError("the node health probe needs torch (install dlrover-diagnosis[torch])") from exc
    return torch


def pick_backend(config: ProbeConfig) -> str:
    """The backend a probe will use: the configured one, else nccl with CUDA, else gloo.

    Raises:
        ProbeError: if torch is not installed.
    """
    if config.backend is not None:
        return config.backend
    torch = _import_torch()
    return "nccl" if torch.cuda.is_available() else "gloo"


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_probe(config: ProbeConfig, *, clock: Clock | None = None, node_id: str = "") -> ProbeResult:
    """Probe this rank within the already initialized default process group.

    Args:
        config: sizes and rounds.
        clock: times the phases; `SystemClock` when omitted.
        node_id: recorded in the result.

    Returns:
        The result; ``ok=False`` with the error when a step failed or a result was wrong.

    Raises:
        ProbeError: if torch is missing or no process group is initialized (a usage error, not a
            node fault).
    """
    torch = _import_torch()
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        raise ProbeError("run_probe needs an initialized torch.distributed process group")
    clk = clock or SystemClock()
    rank, world = int(dist.get_rank()), int(dist.get_world_size())
    backend = str(dist.get_backend())
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    timings = {"matmul_s": 0.0, "allreduce_s": 0.0, "allgather_s": 0.0}
    try:
        gen = torch.Generator(device="cpu").manual_seed(1234 + rank)
        a = torch.rand(config.matmul_size, config.matmul_size, generator=gen).to(device)
        b = torch.rand(config.matmul_size, config.matmul_size, generator=gen).to(device)
        _sync(torch, device)
        start = clk.now()
        for _ in range(config.matmul_rounds):
            c = a @ b
        _sync(torch, device)
        timings["matmul_s"] = clk.now() - start
        if not bool(torch.isfinite(c).all()):
            raise ProbeError("the matrix product holds non-finite values")
        # Warm-up round so connection set-up is not billed to the timed rounds.
        probe = torch.full((config.collective_numel,), float(rank + 1), device=device)
        dist.all_reduce(probe)
        start = clk.now()
        for _ in range(config.collective_rounds):
            probe.fill_(float(rank + 1))
            dist.all_reduce(probe)
        _sync(torch, device)
        timings["allreduce_s"] = clk.now() - start
        expected = world * (world + 1) / 2
        if not bool((probe == expected).all()):
            raise ProbeError(f"all-reduce returned {float(probe[0])!r}, expected {expected!r}")
        mine = torch.full((config.collective_numel,), float(rank), device=device)
        gathered = [torch.empty_like(mine) for _ in range(world)]
        start = clk.now()
        for _ in range(config.collective_rounds):
            dist.all_gather(gathered, mine)
        _sync(torch, device)
        timings["allgather_s"] = clk.now() - start
        for peer, tensor in enumerate(gathered):
            if not bool((tensor == float(peer)).all()):
                raise ProbeError(f"all-gather returned wrong data for rank {peer}")
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        return ProbeResult(
            rank,
            world,
            False,
            matmul_s=timings["matmul_s"],
            allreduce_s=timings["allreduce_s"],
            allgather_s=timings["allgather_s"],
            backend=backend,
            error=error,
            node_id=node_id,
        )
    return ProbeResult(
        rank,
        world,
        True,
        matmul_s=timings["matmul_s"],
        allreduce_s=timings["allreduce_s"],
        allgather_s=timings["allgather_s"],
        backend=backend,
        node_id=node_id,
    )


def run_paired_probe(
    rank: int,
    world_size: int,
    store_host: str,
    store_port: int,
    config: ProbeConfig | None = None,
    *,
    is_store_master: bool = False,
    node_id: str = "",
    clock: Clock | None = None,
) -> ProbeResult:
    """Form a process group through a TCPStore, probe, and tear the group down.

    Args:
        rank: this process's rank in the probe group.
        world_size: the group size (2 for a pair).
        store_host: the TCPStore's host.
        store_port: the TCPStore's port.
        config: sizes, rounds, timeout and backend.
        is_store_master: whether this process hosts the store (otherwise it connects to it).
        node_id: recorded in the result.
        clock: times the phases.

    Returns:
        The result; a peer that never shows up gives ``ok=False`` after ``config.timeout_s``.

    Raises:
        ProbeError: on bad arguments or when torch is missing; nothing is started then.
    """
    cfg = config or ProbeConfig()
    if not (0 <= rank < world_size):
        raise ProbeError(f"rank must be in [0, world_size={world_size}), got {rank!r}")
    if not (0 < store_port < 65536):
        raise ProbeError(f"store_port must be in 1..65535, got {store_port!r}")
    torch = _import_torch()
    dist = torch.distributed
    backend = pick_backend(cfg)
    if backend == "nccl":
        # One GPU per rank of the pair; LOCAL_RANK-style placement is the launcher's job.
        torch.cuda.set_device(rank % max(1, torch.cuda.device_count()))
    timeout = timedelta(seconds=cfg.timeout_s)
    try:
        # The hosting rank must not wait in the constructor for the others: a client built
        # without a world size never counts itself in, so that wait would last the whole
        # timeout. init_process_group below meets the peers through the store anyway.
        store = dist.TCPStore(
            store_host,
            store_port,
            world_size if is_store_master else None,
            is_store_master,
            timeout=timeout,
            wait_for_workers=False,
        )
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    except Exception as exc:
        return ProbeResult(
            rank, world_size, False, backend=backend, error=f"{type(exc).__name__}: {exc}", node_id=node_id
        )
    try:
        return run_probe(cfg, clock=clock, node_id=node_id)
    finally:
        dist.destroy_process_group()
