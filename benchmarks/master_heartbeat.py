"""N simulated agents heartbeating once a second against one `dlrover-master`.

    python benchmarks/master_heartbeat.py            # 1,000 agents, 30 s measured
    python benchmarks/master_heartbeat.py --quick    # 50 agents, 10 s measured

The master runs as its own process (`python -m dlrover.master.cli --backend external`), so its CPU
time and memory are its own: read from /proc through psutil at the start and end of the measured
window. Agents are asyncio tasks in `--client-procs` separate processes sharing `--channels`
channels per process; each registers (getting its node credential), then sends a heartbeat with
resources and step progress every second on a fixed schedule with a random phase. Latency is the
round trip seen by the agent (time.perf_counter). A warm-up period is excluded.

Every agent registers at the same moment, as a job's nodes do at its start; the registrations'
latency is printed beside the agent's 5 s call deadline (`dlrover-run --master-call-timeout`), the
time after which an attempt counts as failed and is retried with the same registration key.

The peer for comparison is the offered load: N heartbeats per second. If achieved < offered, the
master (or the clients sharing its cores) could not keep up. Clients run on the same machine and
compete with the master for CPU, so this is a lower bound on the master's capacity.

Baseline in the same run: the master also serves dlrover.common's no-op PingService
(`--serve-ping`), and every agent sends one Ping (same token and node metadata) half a second
after every `--ping-every`-th heartbeat (default 10: a tenth of the heartbeat rate, so the
baseline barely adds load), so both see the same server, load and machine noise. The ratio of heartbeat
to Ping latency is what the master's own work costs over the bare authenticated gRPC path. With
`--ping-every 0` only heartbeats are sent (the offered load of earlier runs).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import psutil

from dlrover.common import AUTH_METADATA_KEY, RetryPolicy, load_token
from dlrover.common.v1 import ping_pb2, ping_pb2_grpc
from dlrover.master.identity import node_metadata
from dlrover.master.v1 import agent_pb2, agent_pb2_grpc


@dataclasses.dataclass
class _Window:
    start_at: float
    warm_until: float
    end_at: float
    latencies: list[float]
    errors: list[str]
    ping_latencies: list[float]
    ping_every: int  # 0: no pings
    register_latencies: list[float] = dataclasses.field(default_factory=list)


async def _ping(stub: ping_pb2_grpc.PingServiceStub, md: tuple[tuple[str, str], ...], at: float, w: _Window) -> None:
    delay = at - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    if time.monotonic() >= w.end_at:
        return
    t0 = time.perf_counter()
    try:
        await stub.Ping(ping_pb2.PingRequest(), metadata=md, timeout=30)
    except grpc.aio.AioRpcError as exc:
        w.errors.append(f"ping {exc.code().name}")
        return
    if time.monotonic() >= w.warm_until:
        w.ping_latencies.append(time.perf_counter() - t0)


async def _agent(
    stub: agent_pb2_grpc.AgentServiceStub,
    pinger: ping_pb2_grpc.PingServiceStub,
    token_md: tuple[str, str],
    index: int,
    w: _Window,
) -> None:
    name = f"bench-{os.getpid()}-{index}"
    # Every agent registers at once, as a job's nodes do at its start, with a key as `MasterClient` sends.
    registration = agent_pb2.RegisterNodeRequest(node_name=name, host="bench", registration_key=secrets.token_hex(16))
    t0 = time.perf_counter()
    reg = await stub.RegisterNode(registration, metadata=(token_md,))
    w.register_latencies.append(time.perf_counter() - t0)
    md = (token_md, *node_metadata(reg.node_id, reg.node_credential))
    step = 0
    start_at, warm_until, end_at, latencies, errors = w.start_at, w.warm_until, w.end_at, w.latencies, w.errors
    next_at = start_at + random.random()  # a random phase within the first second
    pings: set[asyncio.Task[None]] = set()
    while True:
        delay = next_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if time.monotonic() >= end_at:
            await asyncio.gather(*pings)
            return
        if w.ping_every and (step + index) % w.ping_every == 0:  # staggered: no bursts
            # Half a period later, the baseline: it must not wait for the heartbeat's answer.
            task = asyncio.create_task(_ping(pinger, md, next_at + 0.5, w))
            pings.add(task)
            task.add_done_callback(pings.discard)
        step += 1
        request = agent_pb2.HeartbeatRequest(
            node_id=reg.node_id,
            resources=agent_pb2.ResourceSample(cpu_percent=50.0, memory_bytes=1 << 30),
            progress=agent_pb2.StepProgress(step=step, samples=step * 32),
        )
        t0 = time.perf_counter()
        try:
            await stub.Heartbeat(request, metadata=md, timeout=30)
        except grpc.aio.AioRpcError as exc:
            errors.append(exc.code().name)
            continue
        finally:
            next_at += 1.0
        if time.monotonic() >= warm_until:
            latencies.append(time.perf_counter() - t0)


async def _client(args: argparse.Namespace) -> dict[str, object]:
    token = load_token(token_file=args.token_file)
    token_md = (AUTH_METADATA_KEY, f"Bearer {token}")
    channels = [grpc.aio.insecure_channel(args.addr) for _ in range(args.channels)]
    stubs = [agent_pb2_grpc.AgentServiceStub(c) for c in channels]  # type: ignore[no-untyped-call]
    pingers = [ping_pb2_grpc.PingServiceStub(c) for c in channels]  # type: ignore[no-untyped-call]
    latencies: list[float] = []
    ping_latencies: list[float] = []
    errors: list[str] = []
    now = time.monotonic()
    start_at = now + args.register_s
    warm_until = start_at + args.warmup_s
    end_at = warm_until + args.duration_s
    window = _Window(start_at, warm_until, end_at, latencies, errors, ping_latencies, args.ping_every)
    await asyncio.gather(
        *(_agent(stubs[i % len(stubs)], pingers[i % len(stubs)], token_md, i, window) for i in range(args.agents))
    )
    for c in channels:
        await c.close()
    return {
        "latencies": latencies,
        "errors": errors,
        "ping_latencies": ping_latencies,
        "register_latencies": window.register_latencies,
    }


def client_main(args: argparse.Namespace) -> None:
    print(json.dumps(asyncio.run(_client(args))), flush=True)


def _start_master(state: Path, agents: int, workers: int) -> tuple[subprocess.Popen[bytes], str]:
    log = state / "master.log"
    out = open(log, "wb")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlrover.master.cli", "--backend", "external", "--nnodes", f"{agents}:{agents}",
         "--state-dir", str(state / "state"), "--heartbeat-timeout-s", "60", "--heartbeat-interval-s", "1",
         "--node-start-timeout-s", "0", "--log-level", "WARNING", "--max-workers", str(workers), "--serve-ping"],
        stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    out.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.findall(r"listening on (\S+)", log.read_text(errors="replace"))
        if found:
            return proc, found[-1]
        if proc.poll() is not None:
            raise SystemExit(f"the master exited: {log.read_text()}")
        time.sleep(0.05)
    raise SystemExit("the master did not start in 60 s")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="50 agents, 10 s")
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--register-s", type=float, default=15.0, help="time allowed for every agent to register")
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--master-workers", type=int, default=16, help="the master's RPC threads")
    parser.add_argument("--channels", type=int, default=8, help="channels per client process")
    parser.add_argument(
        "--ping-every", type=int, default=10, help="one Ping per this many heartbeats per agent (0: no Ping)"
    )
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--addr", help=argparse.SUPPRESS)
    parser.add_argument("--token-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client_main(args)
        return
    if args.quick:
        args.agents, args.duration_s, args.warmup_s, args.register_s = 50, 10.0, 2.0, 5.0
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        master, addr = _start_master(state, args.agents, args.master_workers)
        clients: list[subprocess.Popen[str]] = []
        try:
            mproc = psutil.Process(master.pid)
            share = [
                args.agents // args.client_procs + (i < args.agents % args.client_procs)
                for i in range(args.client_procs)
            ]
            for n in share:
                clients.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            __file__,
                            "--client",
                            "--addr",
                            addr,
                            "--token-file",
                            str(state / "state" / "token"),
                            "--agents",
                            str(n),
                            "--duration-s",
                            str(args.duration_s),
                            "--warmup-s",
                            str(args.warmup_s),
                            "--register-s",
                            str(args.register_s),
                            "--channels",
                            str(args.channels),
                            "--ping-every",
                            str(args.ping_every),
                        ],
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                )
            time.sleep(args.register_s + args.warmup_s)
            cpu0 = sum(mproc.cpu_times()[:2])
            t0 = time.monotonic()
            rss_peak = 0
            while any(c.poll() is None for c in clients) and time.monotonic() - t0 < args.duration_s:
                rss_peak = max(rss_peak, mproc.memory_info().rss)
                time.sleep(0.5)
            cpu1 = sum(mproc.cpu_times()[:2])
            t1 = time.monotonic()
            rss_peak = max(rss_peak, mproc.memory_info().rss)
            latencies: list[float] = []
            ping_latencies: list[float] = []
            register_latencies: list[float] = []
            errors: list[str] = []
            for c in clients:
                out, _ = c.communicate(timeout=args.duration_s + 120)
                result = json.loads(out.strip().splitlines()[-1])
                latencies += result["latencies"]
                ping_latencies += result["ping_latencies"]
                register_latencies += result["register_latencies"]
                errors += result["errors"]
        finally:
            for c in clients:
                if c.poll() is None:
                    c.kill()
                    c.wait()
            os.killpg(master.pid, signal.SIGTERM)
            try:
                master.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(master.pid, signal.SIGKILL)
                master.wait()
    achieved = len(latencies) / args.duration_s
    deadline_s = RetryPolicy().call_timeout_s  # an agent's, unless --master-call-timeout says otherwise
    rows = [
        ("agents", f"{args.agents}"),
        ("offered heartbeats/s", f"{args.agents:.0f}"),
        ("offered Pings/s", f"{args.agents / args.ping_every:.0f}" if args.ping_every else "0"),
        ("achieved heartbeats/s", f"{achieved:.0f}"),
        ("errors", f"{len(errors)} {sorted(set(errors))}" if errors else "0"),
        ("latency p50 (ms)", f"{_pct(latencies, 0.50) * 1e3:.2f}"),
        ("latency p99 (ms)", f"{_pct(latencies, 0.99) * 1e3:.2f}"),
        ("latency max (ms)", f"{max(latencies, default=float('nan')) * 1e3:.2f}"),
        ("latency mean (ms)", f"{statistics.fmean(latencies) * 1e3:.2f}" if latencies else "nan"),
        ("Ping baseline p50 (ms)", f"{_pct(ping_latencies, 0.50) * 1e3:.2f}" if ping_latencies else "not sent"),
        ("Ping baseline p99 (ms)", f"{_pct(ping_latencies, 0.99) * 1e3:.2f}" if ping_latencies else "not sent"),
        ("registration, all at once: p50 (ms)", f"{_pct(register_latencies, 0.50) * 1e3:.1f}"),
        ("registration, all at once: max (ms)", f"{max(register_latencies, default=float('nan')) * 1e3:.1f}"),
        (
            f"registration max / {deadline_s:g} s call deadline",
            f"{max(register_latencies, default=float('nan')) / deadline_s:.2f}x",
        ),
        ("heartbeat / Ping p50", f"{_pct(latencies, 0.5) / _pct(ping_latencies, 0.5):.2f}x" if ping_latencies else "-"),
        (
            "heartbeat / Ping p99",
            f"{_pct(latencies, 0.99) / _pct(ping_latencies, 0.99):.2f}x" if ping_latencies else "-",
        ),
        ("master CPU (% of one core)", f"{(cpu1 - cpu0) / (t1 - t0) * 100:.1f}"),
        ("master CPU per RPC (us)", f"{(cpu1 - cpu0) / max(len(latencies) + len(ping_latencies), 1) * 1e6:.0f}"),
        ("master RSS peak (MiB)", f"{rss_peak / 2**20:.1f}"),
        ("master RPC threads", f"{args.master_workers}"),
        ("host CPUs", f"{os.cpu_count()}"),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"master heartbeat benchmark ({args.duration_s:g} s measured after {args.warmup_s:g} s warm-up)")
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")


if __name__ == "__main__":
    main()
