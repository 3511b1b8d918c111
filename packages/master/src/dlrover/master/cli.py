"""The `dlrover-master` command.

    dlrover-master --nnodes 2:4 --backend local --agent-command "dlrover-run ..." --state-dir /tmp/job
    dlrover-master status --master 127.0.0.1:50051 --token-file /tmp/job/token
    dlrover-master timeline --master 127.0.0.1:50051 --token-file /tmp/job/token --out job.svg
    dlrover-master timeline --event-log /tmp/job/events.jsonl --out job.svg
    dlrover-master events --master 127.0.0.1:50051 --token-file /tmp/job/token --after-seq 120
    dlrover-master stop --master 127.0.0.1:50051 --token-file /tmp/job/token --reason "data fixed, resubmitting"
    dlrover-master scale 3 --master 127.0.0.1:50051 --token-file /tmp/job/token --reason "more data"
    dlrover-master capacity 2 --master 127.0.0.1:50051 --token-file /tmp/job/token   # or: unbounded
    dlrover-master --nnodes 1:8 --autoscale on --agent-command "dlrover-run ..."     # or: --autoscale advise
    dlrover-master plan --backend local --agent-command "dlrover-run ... train.py" --job-kind gpt-small

Exit status of a run: 0 the job succeeded, 1 it failed, 2 bad usage, 3 it was stopped.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import TypeVar

from dlrover.common import (
    ChannelConfig,
    ConfigError,
    DefaultsHelpFormatter,
    DLRoverError,
    RetryPolicy,
    TLSConfig,
    configure_logging,
    load_token,
)
from dlrover.master.autoscaler import AutoscaleMode, AutoscalerConfig
from dlrover.master.client import MasterClient
from dlrover.master.config import (
    BACKENDS,
    FAILURE_POLICIES,
    STRAGGLER_ACTIONS,
    LifecycleConfig,
    MasterConfig,
    parse_node_range,
)
from dlrover.master.eventlog import event_to_dict, read_event_log
from dlrover.master.exits import start_failure
from dlrover.master.factory import create_master
from dlrover.master.journal import JournaledEvent
from dlrover.master.launch_retry import add_launch_retry_flags, launch_retry_settings
from dlrover.master.plan_resume import journaled_plan
from dlrover.master.profiles import (
    JobPlanChoice,
    add_profile_flags,
    defaults_instead,
    plan_job,
    resolve_profile_store,
)
from dlrover.master.psjob.cli import main as ps_job_main
from dlrover.master.resource_flags import add_resource_flags, lifecycle_resources
from dlrover.master.runtime import MasterRuntime
from dlrover.master.scheduler.base import HandsOverNodes
from dlrover.master.scheduler.kubernetes.flags import add_kubernetes_flags, kubernetes_settings
from dlrover.master.scheduler.local import parse_slots
from dlrover.master.scheduler.ray.settings import RaySettings
from dlrover.master.states import JobState
from dlrover.master.status import format_status
from dlrover.master.timeline import render_timeline

__all__ = ["build_config", "main", "planned_config"]

_T = TypeVar("_T")

_log = logging.getLogger("dlrover.master")

_DEFAULT_JOB_NAME = "dlrover-job"

EXIT_CODES = {JobState.SUCCEEDED: 0, JobState.FAILED: 1, JobState.STOPPED: 3, JobState.RUNNING: 1}


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dlrover-master", description="Run a DLRover job master.", formatter_class=DefaultsHelpFormatter
    )
    p.add_argument("--job-name", default=_DEFAULT_JOB_NAME, help="the job's name, in events and status")
    p.add_argument("--bind-address", default="127.0.0.1", help="interface to listen on (0.0.0.0: all)")
    p.add_argument("--port", type=int, default=0, help="gRPC port; 0 picks a free one")
    p.add_argument("--token", default=None, help="the job token (prefer --token-file)")
    p.add_argument("--token-file", default=None, help="a 0600 file holding the job token")
    p.add_argument("--tls-cert", default=None, help="serve TLS with this certificate (PEM)")
    p.add_argument("--tls-key", default=None, help="the certificate's private key (PEM)")
    p.add_argument("--tls-ca", default=None, help="require client certificates signed by this CA")
    _add_agent_tls_flags(p)
    p.add_argument(
        "--nnodes",
        default=None,
        help="N or MIN:MAX; not given (and no --node-* flag): planned from the most similar earlier job's profile, "
        "else 1 (see --profile-store)",
    )
    p.add_argument("--node-unit", type=int, default=1, help="the world holds a multiple of this many nodes")
    p.add_argument("--state-dir", default=None, help="journal directory; a restarted master resumes from it")
    p.add_argument("--backend", choices=BACKENDS, default="local", help="who starts the nodes' agents")
    p.add_argument("--agent-command", default="", help="the agent to run per node (local and ray backends)")
    p.add_argument("--heartbeat-interval-s", type=float, default=5.0, help="seconds between an agent's heartbeats")
    p.add_argument("--heartbeat-timeout-s", type=float, default=30.0, help="a node silent this long is taken for lost")
    p.add_argument(
        "--peer-cause-wait-s",
        type=float,
        default=None,
        help="a collective error or hang reported with no cause known, by a node with a restart left, restarts the "
        "node's workers at once and is charged only if no peer's own failure explains it within this many seconds "
        "(default: the heartbeat timeout + 10); 0 charges it at once",
    )
    p.add_argument(
        "--node-start-timeout-s",
        type=float,
        default=300.0,
        help="a launched node that has not registered this long after is taken for failed; 0 waits forever",
    )
    p.add_argument(
        "--node-pending-timeout-s",
        type=float,
        default=60.0,
        help="a launched node still not running after this long is announced (event nodes_pending): the job "
        "goes on with the nodes that run; 0 never announces",
    )
    add_launch_retry_flags(p)
    p.add_argument(
        "--capacity",
        default=None,
        help="local backend: slots (nodes that may run at once), a number or 'unbounded'; the job starts with "
        "min(max nodes, capacity) nodes and follows changes (dlrover-master capacity, --capacity-file) "
        "(default: unbounded)",
    )
    p.add_argument(
        "--capacity-file",
        default=None,
        help="local backend: a file holding the slots, re-read whenever it changes (bad content is logged and "
        "changes nothing)",
    )
    p.add_argument(
        "--insufficient-nodes-window-s",
        type=float,
        default=300.0,
        help="the job stops when it has had fewer than the minimum nodes for this long",
    )
    p.add_argument(
        "--max-process-restarts",
        type=int,
        default=3,
        help="process restarts per node for an agent that declares none (dlrover-run declares its --max-restarts)",
    )
    _add_replacement_flags(p)
    p.add_argument(
        "--max-job-failures",
        type=int,
        default=None,
        help="failures of all nodes together within --failure-budget-window before the job stops (default 20, or "
        "two per node of a job of more than 10); raise it with agents' --max-restarts",
    )
    p.add_argument("--tick-interval-s", type=float, default=1.0, help="seconds between the master's checks of timeouts")
    p.add_argument(
        "--min-tick-gap-s",
        type=float,
        default=0.05,
        help="least seconds between two checks woken early by the backend's changes (kubernetes: pod events)",
    )
    p.add_argument(
        "--node-stop-grace-s",
        type=float,
        default=30.0,
        help="seconds a node the master stops gets between SIGTERM and SIGKILL (local backend; the kubernetes "
        "backend's pod deletion grace); above the agents' "
        "--round-save-timeout plus --shutdown-grace, so a leaving node saves and stops its workers in time",
    )
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port")
    p.add_argument("--metrics-bind-address", default="127.0.0.1", help="interface the metrics are served on")
    p.add_argument(
        "--event-log", default=None, help="JSON-lines event log (default: <state-dir>/events.jsonl with --state-dir)"
    )
    p.add_argument("--max-message-bytes", type=int, default=4 * 1024 * 1024, help="largest gRPC message")
    p.add_argument("--max-workers", type=int, default=16, help="threads serving RPCs")
    _add_rendezvous_flags(p)
    p.add_argument(
        "--state-export-interval-s",
        type=float,
        default=5.0,
        help="how often rendezvous and shard state are journaled at the latest",
    )
    p.add_argument(
        "--no-journal-shard-changes",
        action="store_true",
        help="journal shard progress only every --state-export-interval-s, not before each answer",
    )
    p.add_argument(
        "--failure-policy",
        choices=FAILURE_POLICIES,
        default="diagnosis",
        help="diagnosis: classify the evidence; default: decide on the reported kind",
    )
    p.add_argument(
        "--journal-busy-timeout-s",
        type=float,
        default=5.0,
        help="a journal write waits this long for a database lock held elsewhere, then the request fails",
    )
    p.add_argument(
        "--serve-ping",
        action="store_true",
        help="also serve the no-op PingService (a baseline for benchmarks; the token is still required)",
    )
    p.add_argument(
        "--refusal-log-interval-s",
        type=float,
        default=30.0,
        help="log refused calls (bad token, malformed or oversized request) at most once per reason per this "
        "many seconds, with a count of the others (0: every one); all are counted in dlrover_refused_calls_total",
    )
    p.add_argument(
        "--straggler-factor",
        type=float,
        default=2.0,
        help="a rank whose step time (from its agent's heartbeats) exceeds this many times the others' median "
        "is reported as a straggler",
    )
    p.add_argument("--straggler-window", type=int, default=5, help="heartbeats with new steps a rank is judged over")
    p.add_argument(
        "--straggler-min-samples", type=int, default=3, help="heartbeats with new steps before a rank is judged"
    )
    p.add_argument(
        "--straggler-action",
        choices=STRAGGLER_ACTIONS,
        default="report",
        help="report: an event and a warning; replace: also relaunch the straggler's node where the backend can",
    )
    for add_flags in (
        _add_autoscale_flags,
        add_resource_flags,
        add_profile_flags,
        add_kubernetes_flags,
        _add_ray_flags,
    ):
        add_flags(p)
    p.add_argument(
        "--samples-rate-window-s",
        type=float,
        default=30.0,
        help="samples per second (status, dlrover_samples_per_second) are measured over this many recent seconds",
    )
    p.add_argument("--linger-max-s", type=float, default=10.0, help="most time to tell agents the job ended")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    return p


def _add_rendezvous_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rdzv-last-call-s",
        type=float,
        default=5.0,
        help="after the last join, wait this long for more nodes before a round completes",
    )
    p.add_argument(
        "--rdzv-join-timeout-s",
        type=float,
        default=600.0,
        help="a node waiting this long for a round is told it timed out",
    )
    p.add_argument(
        "--rdzv-planned-wait-s",
        type=float,
        default=60.0,
        help="a planned round (a resize let nodes go, a spare takes a rank) waits this long for its slow "
        "nodes, past the last call",
    )
    p.add_argument(
        "--rdzv-heartbeat-timeout-s",
        type=float,
        default=30.0,
        help="a rendezvous member silent this long is removed from its round",
    )


def _add_autoscale_flags(p: argparse.ArgumentParser) -> None:
    """The autoscaler's flags (`AutoscalerConfig`)."""
    p.add_argument(
        "--autoscale",
        choices=[m.value for m in AutoscaleMode],
        default="off",
        help="off; advise: log the autoscaler's plans as events and change nothing; on: start at the minimum "
        "node count, grow while the measured speed-up pays, give back nodes that do not, replace stragglers",
    )
    p.add_argument("--autoscale-interval-s", type=float, default=30.0, help="seconds between the autoscaler's plans")
    p.add_argument(
        "--autoscale-min-scaling-efficiency",
        type=float,
        default=0.8,
        help="add nodes while the throughput they add is at least this fraction of linear scaling (0..1]",
    )
    p.add_argument(
        "--autoscale-min-measure-s",
        type=float,
        default=60.0,
        help="steady seconds of training a node count is measured before the autoscaler trusts it",
    )
    p.add_argument(
        "--autoscale-warmup-s",
        type=float,
        default=10.0,
        help="seconds skipped after training resumed (every node reports samples again) before measuring",
    )
    p.add_argument(
        "--autoscale-cooldown-s", type=float, default=60.0, help="seconds after any resize before the next plan"
    )


def _client_parser(command: str, description: str) -> argparse.ArgumentParser:
    """A parser of the flags every command that calls a running master takes."""
    p = argparse.ArgumentParser(
        prog=f"dlrover-master {command}", description=description, formatter_class=DefaultsHelpFormatter
    )
    p.add_argument("--master", required=True, help="the master's host:port")
    _add_client_flags(p)
    return p


def _timeline_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dlrover-master timeline",
        description="Draw a job's timeline (nodes against time: steps, failures, restarts, resizes, checkpoints; "
        "goodput in the title) as SVG, from a running master or from an event log after the fact.",
        formatter_class=DefaultsHelpFormatter,
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--master", help="a running master's host:port")
    source.add_argument("--event-log", help="a job's JSON-lines event log (--event-log of dlrover-master)")
    p.add_argument("--out", required=True, help="the SVG file to write")
    p.add_argument("--title", default="", help="the job's name in the title")
    _add_client_flags(p)
    return p


def _add_agent_tls_flags(p: argparse.ArgumentParser) -> None:
    """How the local backend's agents dial a master that serves TLS (`dlrover.master.agent_tls`)."""
    p.add_argument(
        "--agent-tls-ca",
        default=None,
        help="local backend, TLS: the CA bundle its agents verify this master with (default: --tls-ca with it, "
        "else --tls-cert, right for a self-signed certificate)",
    )
    p.add_argument(
        "--agent-tls-server-name", default=None, help="local backend, TLS: the name the agents expect the cert for"
    )
    p.add_argument("--agent-tls-cert", default=None, help="local backend, mutual TLS: the agents' client certificate")
    p.add_argument("--agent-tls-key", default=None, help="local backend, mutual TLS: its private key")


def _add_client_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--token", default=None, help="the job token (prefer --token-file)")
    p.add_argument("--token-file", default=None, help="a file holding the job token")
    p.add_argument("--tls-ca", default=None, help="verify the master's certificate with this CA (enables TLS)")
    p.add_argument("--tls-server-name", default=None, help="the name the master's certificate is valid for")
    p.add_argument("--timeout-s", type=float, default=10.0, help="seconds to wait for the master's answer")


def _status_parser() -> argparse.ArgumentParser:
    return _client_parser("status", "Print a running job's status.")


def _events_parser() -> argparse.ArgumentParser:
    p = _client_parser("events", "Print a running job's events, one JSON object a line (as in --event-log).")
    p.add_argument("--after-seq", type=int, default=0, help="print the events after this sequence number")
    p.add_argument("--limit", type=int, default=0, help="print at most this many events (0: all of them)")
    return p


def _stop_parser() -> argparse.ArgumentParser:
    p = _client_parser("stop", "Stop a running job: every node is stopped.")
    p.add_argument("--reason", default="stopped on request", help="why, for the event log and the status")
    return p


def _client(args: argparse.Namespace) -> MasterClient:
    """A client of the master the parsed flags name.

    Raises:
        DLRoverError: no token, or the TLS files cannot be read.
    """
    token = load_token(args.token, token_file=args.token_file)
    channel_config = None
    if args.tls_ca:
        channel_config = ChannelConfig(tls=TLSConfig(ca_file=args.tls_ca, server_name_override=args.tls_server_name))
    policy = RetryPolicy(call_timeout_s=args.timeout_s, total_timeout_s=args.timeout_s)
    return MasterClient(args.master, token, channel_config=channel_config, policy=policy)


def _add_ray_flags(p: argparse.ArgumentParser) -> None:
    # Defaults None: a flag given to another backend is refused; RaySettings holds the defaults.
    defaults = RaySettings()
    g = p.add_argument_group("ray backend (--backend ray)")
    g.add_argument(
        "--ray-address",
        default=None,
        help="the Ray cluster: its head's host:port (a Ray node must run on this host), ray://host:port (Ray "
        "Client, from any host), or auto (RAY_ADDRESS, else the cluster started on this host); default auto",
    )
    g.add_argument("--ray-namespace", default=None, help="the Ray namespace of the job's actors (dlrover-<job>)")
    g.add_argument(
        "--ray-temp-dir",
        default=None,
        help="the temp dir of this host's Ray node (its ray start --temp-dir) when not Ray's default",
    )
    g.add_argument(
        "--ray-log-dir",
        default=None,
        help="each agent writes node-<id>.log here on its Ray node's host; default: the actor's Ray log",
    )
    g.add_argument(
        "--ray-connect-timeout-s",
        type=float,
        default=None,
        help=f"how long the start waits for the cluster's head (default {defaults.connect_timeout_s:g})",
    )
    g.add_argument(
        "--ray-agent-cpus",
        type=float,
        default=None,
        help=f"CPUs each agent actor asks for when no --node-cpu is given (default {defaults.agent_cpus:g}: keeps "
        "agents off a zero-CPU head)",
    )
    g.add_argument(
        "--ray-death-confirm-s",
        type=float,
        default=None,
        help="how long an agent actor Ray calls dead while its node lives waits for the node table to say the "
        "node died (a lost node, not charged) before it counts as the node's failure; keep it above the "
        f"cluster's node health check (default {defaults.death_confirm_s:g})",
    )
    g.add_argument(
        "--ray-poll-interval-s",
        type=float,
        default=None,
        help=f"how often the cluster's node table is re-read (default {defaults.poll_interval_s:g})",
    )
    g.add_argument(
        "--ray-call-timeout-s",
        type=float,
        default=None,
        help="how long a call to an agent actor may take beyond what it waits for itself "
        f"(default {defaults.call_timeout_s:g})",
    )
    g.add_argument(
        "--ray-master-address",
        default=None,
        help="host:port the agents dial (default: the master's address; with --bind-address 0.0.0.0, the "
        "address of the Ray node this master is attached to)",
    )


_RAY_FLAGS = {
    "ray_address": "address",
    "ray_namespace": "namespace",
    "ray_temp_dir": "temp_dir",
    "ray_log_dir": "log_dir",
    "ray_connect_timeout_s": "connect_timeout_s",
    "ray_agent_cpus": "agent_cpus",
    "ray_death_confirm_s": "death_confirm_s",
    "ray_poll_interval_s": "poll_interval_s",
    "ray_call_timeout_s": "call_timeout_s",
    "ray_master_address": "master_address",
}
"""Each --ray-* flag's RaySettings field."""


def _ray_settings(args: argparse.Namespace) -> RaySettings | None:
    """The ray backend's settings from its flags; None for another backend.

    Raises:
        ConfigError: a --ray-* flag given to another backend, or a bad value.
    """
    given = {field: getattr(args, flag) for flag, field in _RAY_FLAGS.items() if getattr(args, flag) is not None}
    if args.backend != "ray":
        if given:
            flags = ", ".join(f"--{flag.replace('_', '-')}" for flag in _RAY_FLAGS if getattr(args, flag) is not None)
            raise ConfigError(f"--ray-* flags are for --backend ray, not --backend {args.backend}: {flags}")
        return None
    return RaySettings(**given, stop_grace_s=args.node_stop_grace_s)


def _add_replacement_flags(p: argparse.ArgumentParser) -> None:
    """How nodes are replaced: relaunches per rank, and the warm spares that take a relaunched node's rank."""
    p.add_argument(
        "--max-relaunches", type=int, default=3, help="relaunches of each rank's node within --failure-budget-window"
    )
    p.add_argument(
        "--failure-budget-window",
        type=_budget_window,
        default=86400.0,
        metavar="SECONDS",
        help="how long a failure counts against --max-job-failures, --max-relaunches, --max-node-relaunches and "
        "the failure policy's ladders (default 86400, a day; 0: the job's whole life). A job that trains for "
        "weeks stops for failures that keep coming back, not for two that came weeks apart",
    )
    p.add_argument(
        "--spare-nodes",
        type=_spare_count,
        default=0,
        help="warm spare nodes kept beside the ranked ones (not counted in --nnodes): registered agents with "
        "their standby workers ready and no rank; one takes over the rank of a node the master relaunches, "
        "and another is launched in the background. They take the backend's capacity after the ranked nodes "
        "(a backend that launches nodes: local, kubernetes, ray)",
    )
    p.add_argument(
        "--spare-refill-after-s",
        type=float,
        default=30.0,
        help="a spare that took a rank is replaced once its workers trained a step, or this many seconds after it "
        "took the rank, whichever comes first, so the next spare's start-up takes no CPU from the round that "
        "restores the job on a host they share; 0 replaces it at once",
    )
    p.add_argument(
        "--max-node-relaunches",
        type=int,
        default=None,
        help="node relaunches within --failure-budget-window before the next one stops the job (the diagnosis "
        "policy; default 16, or one per 64 nodes of a larger job). At the failure rate Meta reported for Llama 3 "
        "a node is relaunched about once per 2,500 GPU-days",
    )


def _budget_window(text: str) -> float | None:
    """``--failure-budget-window``: seconds > 0, or 0 for the job's whole life (None)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (0: the whole job), got {text!r}") from None
    if value == 0:
        return None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0 (0: the whole job), got {text!r}")
    return value


def _spare_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--spare-nodes must be a whole number of nodes, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"--spare-nodes must be 0 or more, got {value}")
    return value


def _non_negative_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of nodes") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a node count must be non-negative, got {value}")
    return value


def _slots_arg(text: str) -> int | None:
    try:
        return parse_slots(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _scale_parser() -> argparse.ArgumentParser:
    p = _client_parser("scale", "Grow or shrink a running job to N nodes (within its range).")
    p.add_argument("nodes", type=_non_negative_count, help="the node count wanted")
    p.add_argument("--reason", default="", help="why, kept in the job's events")
    return p


def _capacity_parser() -> argparse.ArgumentParser:
    p = _client_parser("capacity", "Set the local backend's capacity in slots while the job runs.")
    p.add_argument("slots", type=_slots_arg, help="nodes that may run at once, or 'unbounded'")
    return p


def build_config(args: argparse.Namespace) -> MasterConfig:
    """A `MasterConfig` from parsed run flags.

    Raises:
        ConfigError: a flag's value is invalid (the message names it).
    """
    tls = None
    if args.tls_cert or args.tls_key or args.tls_ca:
        tls = TLSConfig(cert_file=args.tls_cert, key_file=args.tls_key, ca_file=args.tls_ca)
    agent_tls = None
    agent_flags = (args.agent_tls_ca, args.agent_tls_cert, args.agent_tls_key, args.agent_tls_server_name)
    if any(agent_flags):
        if bool(args.agent_tls_cert) != bool(args.agent_tls_key):
            raise ConfigError("--agent-tls-cert and --agent-tls-key must be given together")
        agent_tls = TLSConfig(
            ca_file=args.agent_tls_ca,
            cert_file=args.agent_tls_cert,
            key_file=args.agent_tls_key,
            server_name_override=args.agent_tls_server_name,
        )
    lifecycle = LifecycleConfig(
        nodes=parse_node_range(args.nnodes if args.nnodes is not None else "1", args.node_unit),
        heartbeat_timeout_s=args.heartbeat_timeout_s,
        node_start_timeout_s=args.node_start_timeout_s or None,
        max_process_restarts=args.max_process_restarts,
        max_relaunches=args.max_relaunches,
        max_job_failures=args.max_job_failures,
        budget_window_s=args.failure_budget_window,
        insufficient_nodes_window_s=args.insufficient_nodes_window_s,
        **lifecycle_resources(args),
        node_pending_timeout_s=args.node_pending_timeout_s or None,
        spare_nodes=args.spare_nodes,
        spare_refill_after_s=args.spare_refill_after_s,
        peer_cause_wait_s=args.peer_cause_wait_s,
    )
    kubernetes = kubernetes_settings(args, tls_cert=args.tls_cert, stop_grace_s=args.node_stop_grace_s)
    job_name = args.job_name
    if kubernetes is not None and job_name == _DEFAULT_JOB_NAME:
        job_name = kubernetes.job  # the ElasticJob names the job
    return MasterConfig(
        job_name=job_name,
        kubernetes=kubernetes,
        ray=_ray_settings(args),
        lifecycle=lifecycle,
        bind_address=args.bind_address,
        port=args.port,
        token=args.token,
        token_file=args.token_file,
        tls=tls,
        agent_tls=agent_tls,
        max_message_bytes=args.max_message_bytes,
        max_workers=args.max_workers,
        state_dir=args.state_dir,
        backend=args.backend,
        agent_command=shlex.split(args.agent_command),
        heartbeat_interval_s=args.heartbeat_interval_s,
        tick_interval_s=args.tick_interval_s,
        min_tick_gap_s=args.min_tick_gap_s,
        node_stop_grace_s=args.node_stop_grace_s,
        metrics_port=args.metrics_port,
        metrics_bind_address=args.metrics_bind_address,
        event_log=args.event_log,
        rendezvous_last_call_s=args.rdzv_last_call_s,
        rendezvous_join_timeout_s=args.rdzv_join_timeout_s,
        rendezvous_planned_wait_s=args.rdzv_planned_wait_s,
        rendezvous_heartbeat_timeout_s=args.rdzv_heartbeat_timeout_s,
        state_export_interval_s=args.state_export_interval_s,
        journal_shard_changes=not args.no_journal_shard_changes,
        failure_policy=args.failure_policy,
        max_node_relaunches=args.max_node_relaunches,
        serve_ping=args.serve_ping,
        journal_busy_timeout_s=args.journal_busy_timeout_s,
        refusal_log_interval_s=args.refusal_log_interval_s,
        straggler_factor=args.straggler_factor,
        straggler_window=args.straggler_window,
        straggler_min_samples=args.straggler_min_samples,
        straggler_action=args.straggler_action,
        samples_rate_window_s=args.samples_rate_window_s,
        local_slots=parse_slots(args.capacity, source="--capacity") if args.capacity is not None else None,
        capacity_file=args.capacity_file,
        autoscale=AutoscalerConfig(
            mode=args.autoscale,
            interval_s=args.autoscale_interval_s,
            min_scaling_efficiency=args.autoscale_min_scaling_efficiency,
            min_measure_s=args.autoscale_min_measure_s,
            warmup_s=args.autoscale_warmup_s,
            cooldown_s=args.autoscale_cooldown_s,
        ),
        profile_store=resolve_profile_store(args.profile_store),
        job_kind=args.job_kind,
        launch_retry=launch_retry_settings(args),
    )


def _resources_given(args: argparse.Namespace) -> bool:
    return any(v is not None for v in (args.node_cpu, args.node_memory, args.node_gpus, args.node_gpu_type))


def planned_config(
    args: argparse.Namespace, wall_time: float, *, look_only: bool = False
) -> tuple[MasterConfig, JobPlanChoice]:
    """`build_config`, then sized from the profile store when neither --nnodes nor a --node-* flag was given
    (`dlrover.master.profiles.plan_job`; explicit flags always win). `look_only` leaves the store as it is.
    A master restarted on the state directory of a planned job resumes with that job's plan
    (`dlrover.master.plan_resume.journaled_plan`); `look_only` always plans afresh.

    Raises:
        ConfigError: a flag's value is invalid (the message names it).
    """
    config = build_config(args)
    if not look_only and args.nnodes is None and not _resources_given(args):
        # A restarted master resumes with the size its job was planned with, not a new plan.
        resumed = journaled_plan(config)
        if resumed is not None:
            return resumed
    return plan_job(
        config,
        nodes_given=args.nnodes is not None,
        resources_given=_resources_given(args),
        wall_time=wall_time,
        look_only=look_only,
    )


def _plan(argv: Sequence[str]) -> int:
    parser = _run_parser()
    parser.prog = "dlrover-master plan"
    parser.description = (
        "Print the node count and resources a job with these flags would get, and where they came from, "
        "without starting it."
    )
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        config, choice = planned_config(args, time.time(), look_only=True)
    except DLRoverError as exc:
        print(f"dlrover-master plan: {exc}", file=sys.stderr)
        return 2
    nodes = config.lifecycle.nodes
    resources = config.lifecycle.node_resources
    print(f"nodes: {nodes.min_nodes}:{nodes.max_nodes} (node unit {nodes.node_unit})")
    print(f"node resources: {'nothing asked' if resources is None else resources.describe()}")
    print(f"from: {choice.source}" + (f" (profile {choice.profile_id})" if choice.profile_id is not None else ""))
    if choice.store_notice:
        print(f"profile store: {choice.store_notice}")
    print(f"why: {choice.reason}")
    return 0


def _ask_master(command: str, args: argparse.Namespace, call: Callable[[MasterClient], _T]) -> _T | None:
    """`call` on a client of the master the flags name; None (the reason printed) when it fails."""
    try:
        with _client(args) as client:
            return call(client)
    except DLRoverError as exc:
        print(f"dlrover-master {command}: {exc}", file=sys.stderr)
        return None


def _status(argv: Sequence[str]) -> int:
    summary = _ask_master("status", _status_parser().parse_args(argv), lambda client: client.job_status())
    if summary is None:
        return 1
    print(format_status(summary))
    return 0


_EVENTS_PAGE = 1000  # the most JobService.ListEvents answers at once


def _paged_events(client: MasterClient, after_seq: int = 0, limit: int = 0) -> Iterator[JournaledEvent]:
    """The job's events after `after_seq`, at most `limit` (0: all), paged through ListEvents."""
    after, given = after_seq, 0
    while not limit or given < limit:
        want = _EVENTS_PAGE if not limit else min(_EVENTS_PAGE, limit - given)
        page = client.list_events(after, want)
        yield from page
        given += len(page)
        if len(page) < want:
            return
        after = page[-1].seq


def _timeline(argv: Sequence[str]) -> int:
    args = _timeline_parser().parse_args(argv)
    try:
        if args.event_log is not None:
            events = read_event_log(args.event_log)
            now = None
        else:
            with _client(args) as client:
                events = [event_to_dict(e) for e in _paged_events(client)]
                status = client.job_status()
            # A running job's timeline ends now (its elapsed time as the master counts it).
            start = next((float(str(e["wall_time"])) for e in events if e["kind"] == "job_start"), None)
            now = start + status.elapsed_s if start is not None and status.state is JobState.RUNNING else None
        svg = render_timeline(events, title=args.title, now_wall=now)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(svg)
    except (DLRoverError, OSError, ValueError) as exc:
        print(f"dlrover-master timeline: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out} ({len(events)} events)")
    return 0


def _events(argv: Sequence[str]) -> int:
    args = _events_parser().parse_args(argv)
    if args.after_seq < 0 or args.limit < 0:
        print("dlrover-master events: --after-seq and --limit must be non-negative", file=sys.stderr)
        return 2

    def print_all(client: MasterClient) -> bool:
        for event in _paged_events(client, args.after_seq, args.limit):
            print(json.dumps(event_to_dict(event), sort_keys=True))
        return True

    return 0 if _ask_master("events", args, print_all) else 1


def _stop(argv: Sequence[str]) -> int:
    args = _stop_parser().parse_args(argv)
    answer = _ask_master("stop", args, lambda client: client.stop_job(args.reason))
    if answer is None:
        return 1
    # An ended job keeps the state it ended in: the line says which.
    print(f"job {answer.state.value}: {answer.exit_reason}")
    return 0


def _scale(argv: Sequence[str]) -> int:
    args = _scale_parser().parse_args(argv)
    result = _ask_master("scale", args, lambda client: client.resize(args.nodes, args.reason or "dlrover-master scale"))
    if result is None:
        return 1
    print(result.message)
    return 0


def _capacity(argv: Sequence[str]) -> int:
    args = _capacity_parser().parse_args(argv)
    # set_capacity answers None for an unbounded backend: box it so a failure stays tellable apart.
    answer = _ask_master("capacity", args, lambda client: (client.set_capacity(args.slots),))
    if answer is None:
        return 1
    (free,) = answer
    slots = "unbounded" if args.slots is None else f"{args.slots} slot(s)"
    room = "no limit" if free is None else f"{free} free slot(s)"
    print(f"capacity set to {slots}; the backend now has {room}")
    return 0


def _create_planned(args: argparse.Namespace) -> MasterRuntime:
    """The master of a job sized by `planned_config`, said in the log.

    Raises:
        DLRoverError: the configuration cannot be served.
    """
    config, choice = planned_config(args, time.time())
    try:
        runtime = create_master(config)
    except ConfigError as exc:
        if choice.source != "profile":
            raise
        # A profile from another host may ask for more than this backend has: the job still starts.
        config = defaults_instead(config, f"the plan from profile {choice.profile_id} cannot run here: {exc}")
        assert config.initial_plan is not None
        choice = config.initial_plan
        _log.warning("%s", choice.reason)
        runtime = create_master(config)
    if choice.source != "flags":
        _log.info("initial plan (%s): %s", choice.source, choice.reason)
    return runtime


def _run(argv: Sequence[str]) -> int:
    args = _run_parser().parse_args(argv)
    configure_logging(args.log_level)
    if args.token is not None:
        _log.warning("--token is visible to every user of this host (ps, /proc); prefer --token-file")
    try:
        runtime = _create_planned(args)
    except DLRoverError as exc:
        print(f"dlrover-master: {exc}", file=sys.stderr)
        return start_failure(exc)
    stop_requested = threading.Event()
    signalled: list[int] = []
    hand_over = False

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        signalled.append(signum)
        stop_requested.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        runtime.start()
        where = f"token file {runtime.token_file}" if runtime.token_file else "the token given"
        # The address on stdout lets scripts (and tests) find a master started on port 0.
        print(f"dlrover-master listening on {runtime.address} ({where})", flush=True)
        if runtime.metrics_port is not None:
            print(f"dlrover-master metrics on {args.metrics_bind_address}:{runtime.metrics_port}", flush=True)
        while not stop_requested.wait(0.5):
            if runtime.master.job_state.finished:
                break
        if not runtime.master.job_state.finished and isinstance(runtime.scheduler, HandsOverNodes):
            # A master pod deleted or evicted gets SIGTERM: the job is not over, its pods keep running, and the
            # master that replaces this one resumes from the journal (a job is stopped through `stop`, a
            # suspend or the ElasticJob's deletion, not by the master's own pod going away).
            hand_over = True
            print(
                "dlrover-master: stopped by a signal; the job goes on: its nodes keep running for the master "
                "that replaces this one",
                flush=True,
            )
            return 128 + (signalled[0] if signalled else signal.SIGTERM)
        if not runtime.master.job_state.finished:
            runtime.master.stop("the master received a stop signal")
        else:
            # Linger so agents' next heartbeats are answered with REMOVE_NODE instead of silence.
            stop_requested.wait(min(2 * args.heartbeat_interval_s, args.linger_max_s))
        status = runtime.master.status()
        print(f"job {status.state.value}: {status.exit_reason}", flush=True)
        return EXIT_CODES[status.state]
    except DLRoverError as exc:
        print(f"dlrover-master: {exc}", file=sys.stderr)
        return start_failure(exc)
    finally:
        # A master that fails (at start, or later) with its job unfinished leaves a backend's nodes that
        # outlive it to the master that replaces it, as on SIGTERM: its failure is not the job's end.
        runtime.stop(hand_over=hand_over or not runtime.master.job_state.finished)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


_COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "status": _status,
    "timeline": _timeline,
    "events": _events,
    "stop": _stop,
    "scale": _scale,
    "capacity": _capacity,
    "plan": _plan,
    "run": _run,
    "ps-job": ps_job_main,
}
"""The subcommands; anything else runs a job (`run` is the default)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `dlrover-master`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in _COMMANDS:
        return _COMMANDS[args[0]](args[1:])
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
