"""Solve time of the dlrover.autoscale resource planner on clusters of mixed machine shapes, and the
decision time of the master's autoscaler inside its loop.

    python benchmarks/autoscale_planner.py            # 1,000 and 10,000 machines, 5 runs per row
    python benchmarks/autoscale_planner.py --quick    # the same rows, 1 run each

The second table is `dlrover.master.autoscaler.Autoscaler.plan()` as the master's tick calls it for a
worker-only job of 1,000 and 10,000 nodes (range 1..N, capacity N): fit the throughput model to the
measured node counts, walk the node counts up while each step pays, ask the OR-tools planner, decide.
The peer, measured in the same run, is a plain evaluation of the fitted model over every node count
of the range (numpy, vectorised) and its argmax: the least any decision over the range could cost.

Each row plans one job on a cluster whose machines come in six shapes (four CPU sizes, two GPU sizes, 80% of each
free). Jobs: an all-reduce CPU job with a full-speed and a throttled worker size; a parameter-server job with two
worker sizes and three PS sizes (up to 128 PS); a GPU job with node_unit 8; and the all-reduce job asked for 60% of
its peak throughput at the least cost. The "-large" rows use curves that peak near 22,000 workers (the PS one with
up to 512 PS), so the machines bind instead of the curve and the model holds thousands of candidate worker counts.
Time is wall time around `ResourcePlanner.plan()` (model building included), single-threaded CP-SAT (the default),
measured with time.perf_counter.

The reference is the model itself: "of peak" is the planned throughput over the throughput the fitted curve
predicts at its peak with unlimited resources, the most any plan could reach.
"""

from __future__ import annotations

import argparse
import statistics
import time

import attrs

from dlrover.autoscale import (
    ClusterQuota,
    MachineShape,
    PlannerConfig,
    PlanRequest,
    PlanResult,
    PsOption,
    ResourcePlanner,
    Resources,
    ThroughputModel,
    WorkerOption,
)

# (name, cpu, memory GiB, gpu, share of the machines)
SHAPES = [
    ("c16", 16, 64, 0, 0.30),
    ("c32", 32, 128, 0, 0.25),
    ("c64", 64, 256, 0, 0.20),
    ("c96", 96, 384, 0, 0.10),
    ("g8", 96, 1024, 8, 0.10),
    ("g4", 48, 512, 4, 0.05),
]
FREE_FRACTION = 0.8


def cluster(machines: int) -> ClusterQuota:
    shapes = []
    left = machines
    for i, (name, cpu, mem_gib, gpu, share) in enumerate(SHAPES):
        count = left if i == len(SHAPES) - 1 else round(machines * share)
        left -= count
        free = Resources(cpu * FREE_FRACTION, int(mem_gib * 1024 * FREE_FRACTION), gpu)
        shapes.append(MachineShape(name, free, count))
    return ClusterQuota.from_machines(shapes, max_nodes=1_000_000)


def jobs(quota: ClusterQuota) -> dict[str, PlanRequest]:
    # Peaks near 2,236 workers (all-reduce) and 1,414 (PS).
    allreduce = ThroughputModel(a=2e-5, b=0.05, c=1e-8)
    ps_model = ThroughputModel(a=1e-5, b=0.02, c=1e-8)
    gpu_model = ThroughputModel(a=1e-4, b=0.5, c=1e-7)
    cpu_opts = (
        WorkerOption(Resources(8, 32 * 1024)),
        WorkerOption(Resources(4, 32 * 1024), efficiency=0.55),
    )
    reqs = {
        "allreduce-cpu": PlanRequest(model=allreduce, quota=quota, worker_options=cpu_opts),
        "ps-job": PlanRequest(
            model=ps_model,
            quota=quota,
            worker_options=(WorkerOption(Resources(4, 16 * 1024)), WorkerOption(Resources(2, 16 * 1024), 0.6)),
            ps_options=(
                PsOption(Resources(8, 32 * 1024), capacity=400.0),
                PsOption(Resources(16, 32 * 1024), capacity=800.0),
                PsOption(Resources(32, 64 * 1024), capacity=1600.0),
            ),
            max_ps=128,
        ),
        "gpu-unit8": PlanRequest(
            model=gpu_model,
            quota=quota,
            worker_options=(WorkerOption(Resources(10, 100 * 1024, gpu=1)),),
            node_unit=8,
        ),
    }
    # Peaks near 22,000 workers: bound by the machines rather than by the curve.
    large = ThroughputModel(a=2e-6, b=0.05, c=1e-10)
    reqs["allreduce-large"] = PlanRequest(model=large, quota=quota, worker_options=cpu_opts)
    reqs["ps-large"] = attrs.evolve(reqs["ps-job"], model=ThroughputModel(a=1e-6, b=0.02, c=1e-10), max_ps=512)
    peak = max(allreduce.predict(n) for n in range(1, 5000))
    reqs["allreduce-target"] = PlanRequest(
        model=allreduce, quota=quota, worker_options=cpu_opts, target_throughput=0.6 * peak
    )
    return reqs


def model_peak(req: PlanRequest) -> float:
    best_eff = max(o.efficiency for o in req.worker_options)
    peak_n = req.model.peak_workers
    n = int(min(peak_n, 10**6)) if peak_n != float("inf") else 10**6
    return best_eff * max(req.model.predict(max(1, n)), req.model.predict(n + 1))


def run(name: str, machines: int, req: PlanRequest, repeats: int, planner: ResourcePlanner) -> list[str]:
    times = []
    result: PlanResult | None = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = planner.plan(req)
        times.append(time.perf_counter() - t0)
    assert result is not None
    shape = result.shape
    workers = str(shape.workers) if shape else "-"
    ps = str(shape.ps) if shape else "-"
    of_peak = f"{result.predicted_throughput / model_peak(req):.1%}" if shape else "-"
    return [
        f"{machines:,}",
        name,
        result.status.value,
        workers,
        ps,
        of_peak,
        ",".join(result.binding)[:28],
        f"{statistics.median(times) * 1000:.0f}",
        f"{max(times) * 1000:.0f}",
    ]


def loop_rows(sizes: list[int], repeats: int) -> list[list[str]]:
    """The autoscaler's decision time at each size, beside a plain model evaluation over the range."""
    import numpy as np

    from dlrover.master.autoscaler import AutoscaleMode, Autoscaler, AutoscalerConfig, JobView

    rows = []
    curves = {
        "peak beyond N": lambda n, big: 1.0 / (1e-6 + 1.0 / n + 1e-4 * n / big**2),
        "peak at N/3": lambda n, big: 1.0 / (1e-6 + 1.0 / n + 9.0 * n / big**2),
    }
    for big in sizes:
        for name, curve in curves.items():
            config = AutoscalerConfig(mode=AutoscaleMode.ON, interval_s=1.0, min_measure_s=10.0, warmup_s=0.0)
            scaler = Autoscaler(config, 0.0)
            now, next_id = 0.0, 0
            measured = [max(1, big // 8), max(1, big // 4)]
            for n in measured:
                nodes = frozenset(range(next_id, next_id + n))
                next_id += n
                view = JobView(wanted=n, running=nodes, placeable=big, min_nodes=1, max_nodes=big)
                scaler.disrupted(now)
                scaler.tick(now, view)
                per_node = curve(n, big) / n
                for when in (now, now + 1.0, now + 2.0, now + 22.0):  # training starts, then 20 steady seconds
                    for node in nodes:
                        scaler.observe_samples(node, int(per_node * 1000 * (when - now)), when)
                now += 30.0
            times, peer_times = [], []
            decision = None
            for _ in range(repeats):
                t0 = time.perf_counter()
                decision = scaler.plan(now, view)
                times.append(time.perf_counter() - t0)
                assert "model" in decision.data, decision.reason
                model = decision.data["model"]
                t0 = time.perf_counter()
                ns = np.arange(1, big + 1, dtype=np.float64)
                predicted = 1.0 / (model["a"] + model["b"] / ns + model["c"] * ns)
                int(np.argmax(predicted))
                peer_times.append(time.perf_counter() - t0)
            assert decision is not None
            median, peer = statistics.median(times), statistics.median(peer_times)
            rows.append(
                [
                    f"{big:,}",
                    name,
                    f"{measured[-1]} -> {decision.target}",
                    decision.action,
                    str(decision.data.get("planner", {}).get("status", "-")),
                    f"{median * 1000:.1f}",
                    f"{max(times) * 1000:.1f}",
                    f"{peer * 1000:.2f}",
                    f"{median / peer:.0f}x",
                ]
            )
    return rows


def print_table(rows: list[list[str]], right_from: int) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = [c.rjust(w) if i >= right_from else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        print("  ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one run per row instead of five")
    parser.add_argument("--sizes", default="1000,10000", help="comma-separated machine counts")
    parser.add_argument("--time-limit-s", type=float, default=10.0, help="solver time limit per plan()")
    args = parser.parse_args()
    repeats = 1 if args.quick else 5
    planner = ResourcePlanner(PlannerConfig(time_limit_s=args.time_limit_s))
    header = ["machines", "job", "status", "workers", "ps", "of peak", "binding", "median ms", "max ms"]
    rows = [header]
    for machines in (int(s) for s in args.sizes.split(",")):
        quota = cluster(machines)
        for name, req in jobs(quota).items():
            rows.append(run(name, machines, req, repeats, planner))
    print_table(rows, 7)
    print(f"\n{repeats} run(s) per row, time limit {args.time_limit_s:g} s, 1 CP-SAT search worker")
    print("\nThe master's autoscaler: one decision (fit, efficiency walk, planner) inside its loop")
    loop_header = ["nodes", "curve", "measured -> plan", "action", "planner", "median ms", "max ms", "peer ms", "ratio"]
    print_table([loop_header, *loop_rows([int(s) for s in args.sizes.split(",")], repeats)], 5)
    print("peer: the fitted model evaluated over every node count of the range and its argmax (numpy)")


if __name__ == "__main__":
    main()
