"""The `dlrover-run` command: torchrun's interface, DLRover's fault tolerance.

Ways to find the job's master:
- `--master HOST:PORT`: join a running `dlrover-master` (bare metal, Slurm), with the token from
  `--token`, `--token-file`, `DLROVER_JOB_TOKEN_FILE` or `DLROVER_JOB_TOKEN`.
- `--rdzv-backend=dlrover --rdzv-endpoint=HOST:PORT`: the same, spelled the torchrun way.
- `DLROVER_MASTER_ADDR`: the same, set by a master that launched this agent.
- `--standalone`, or a single-node job (`--nnodes=1`, torchrun's default) that names no master:
  start one in this process on 127.0.0.1 with a random port, as `torchrun` alone runs a
  single-node job. Its token is the one given (as above), else a fresh one. With `--log-dir`,
  it writes the job's event log there (`<job>_<unique>_events.jsonl`).
- TLS: a running master that serves TLS is dialed with `--master-tls-ca` (and
  `--master-tls-server-name`, `--master-tls-cert`/`--master-tls-key` for mutual TLS), each
  defaulting from its `DLROVER_MASTER_TLS_*` variable; the workers get the same settings in those
  variables, so their shard and rendezvous clients dial TLS too. A master this `dlrover-run`
  starts itself (the forms below and above) serves plaintext, and the settings are ignored (said).
- A multi-node torchrun command line (`--rdzv-backend=c10d --rdzv-endpoint=HOST:PORT`, or
  `--master-addr/--master-port` with `--node-rank`): the agent torchrun would have serve the
  store serves the job's master there instead (`peer_master`); every node needs the same token.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import re
import signal
import socket
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import attrs

# Only what parsing the command line and starting the standby workers need is imported here: the
# agent, gRPC and the master come once the standbys import torch beside them (`early_standbys`).
from dlrover.common import ConfigError, DLRoverError, configure_logging
from dlrover.flashckpt.job_env import safe_job_id
from dlrover.launcher.args import LaunchConfig, parse_args
from dlrover.launcher.env import JOB_ID_ENV_VAR, MASTER_ADDR_ENV_VAR, NODE_ID_ENV_VAR, standby_env
from dlrover.launcher.worker_logs import LogCleanup, default_log_root, remove_run_logs
from dlrover.launcher.workers import StandbyPool

if TYPE_CHECKING:
    from dlrover.common.tls import TLSConfig
    from dlrover.diagnosis import HangConfig
    from dlrover.launcher.agent import Agent, AgentResult
    from dlrover.launcher.grpc_control import GrpcControlPlane
    from dlrover.launcher.netcheck import NetworkCheck
    from dlrover.launcher.peer_master import HostedMaster

__all__ = ["main", "run"]

_log = logging.getLogger("dlrover.launcher")

# The private temp dirs a run makes; named after their dlrover-run so that the next one on this
# host removes those of a dlrover-run that was killed (SIGKILL skips every cleanup).
TOKEN_DIR_PREFIX = "dlrover-token-"  # noqa: S105 (a dir name, not a secret)
LOG_DIR_PREFIX = "dlrover-run-"


def _accelerator_driver_present(dev: Path = Path("/dev"), proc: Path = Path("/proc")) -> bool:
    """Whether the host has a GPU driver torch could count devices through: NVIDIA's (its device
    files or its /proc entry) or AMD's ROCm (/dev/kfd). Only stats a few paths."""
    return (
        (proc / "driver" / "nvidia").exists()
        or (dev / "nvidiactl").exists()
        or any(dev.glob("nvidia[0-9]*"))
        or (dev / "kfd").exists()
    )


def _samples_gpus(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the agent's heartbeats carry GPU samples: a GPU driver is present and the job does
    not hide every device (``CUDA_VISIBLE_DEVICES`` empty or ``-1``: a CPU job on a shared GPU host,
    which has no GPU of its own to sample; `dlrover.diagnosis.sample_gpus` reads only the GPUs the
    variable names)."""
    hidden = environ.get("CUDA_VISIBLE_DEVICES")
    return _accelerator_driver_present() and not (hidden is not None and hidden.strip() in ("", "-1"))


def _visible_accelerators() -> int:
    # Importing torch takes this process seconds of CPU before the node can register, on the path
    # of every node start (a grown node's and a replacement's included): skipped where no driver
    # could show torch a device.
    if not _accelerator_driver_present():
        return 0
    try:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def _named_master(cfg: LaunchConfig) -> str:
    """The address of the running master this agent joins; empty when none is named."""
    # A master's local backend starts agents with DLROVER_MASTER_ADDR set.
    return (
        cfg.master
        or (cfg.rdzv_endpoint if cfg.rdzv_backend == "dlrover" else "")
        or os.environ.get(MASTER_ADDR_ENV_VAR, "")
    )


def _runs_own_master(cfg: LaunchConfig) -> bool:
    """Whether this `dlrover-run` starts its job's master itself (`--standalone`, or a single-node
    job that names none, as `torchrun` alone runs one)."""
    return cfg.standalone or (not _named_master(cfg) and cfg.nodes.max_nodes == 1)


def _given_token(cfg: LaunchConfig) -> tuple[str | None, str | None]:
    """The job token given (`--token`, `--token-file` or the environment) and the file it was
    read from; (None, None) when none was given.

    Raises:
        AuthError: the token given is unusable.
    """
    from dlrover.common import find_token

    found = find_token(cfg.token, token_file=cfg.token_file)
    if found is None:
        return None, None
    token, path = found
    return token, None if path is None else str(path)


@attrs.frozen
class _JobMaster:
    """Where this agent finds its job's master.

    Attributes:
        address: the master's ``host:port``.
        token: the job token.
        token_file: the file holding it (None: not in a file the workers can read).
        hosted: the master this agent serves for its peers (torchrun's multi-node forms).
    """

    address: str
    token: str
    token_file: str | None
    hosted: HostedMaster | None = None


def _event_log_path(cfg: LaunchConfig, job_name: str) -> str | None:
    """Where an embedded master writes the job's event log: a new file in `--log-dir`, named after
    the job (``<job>_<unique>_events.jsonl``), so runs sharing the folder never mix their events;
    None without a log dir."""
    if not cfg.log_dir:
        return None
    Path(cfg.log_dir).mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", job_name)  # an --rdzv-id may hold a path separator
    fd, path = tempfile.mkstemp(prefix=f"{name}_", suffix="_events.jsonl", dir=cfg.log_dir)
    os.close(fd)
    return path


@contextmanager
def _master_for(cfg: LaunchConfig) -> Iterator[_JobMaster]:
    """The job's master: an embedded one, one this agent serves for its peers, or the one named."""
    from dlrover.common import load_token
    from dlrover.launcher.peer_master import embedded_lifecycle, peer_endpoint, peer_master

    given, given_file = _given_token(cfg)
    if _runs_own_master(cfg):
        from dlrover.master import MasterConfig, create_master

        # The external backend starts no node: the master restarts a failed node's workers in
        # place, up to the --max-restarts its agent declares, and then stops the job.
        job_name = cfg.rdzv_id if cfg.rdzv_id != "none" else "standalone"
        config = MasterConfig(
            job_name=job_name,
            backend="external",
            lifecycle=embedded_lifecycle(cfg),
            token=given,
            event_log=_event_log_path(cfg, job_name),
            straggler_factor=cfg.runtime_straggler_factor,
            straggler_action=cfg.straggler_action,
        )
        with create_master(config) as runtime:
            _log.info("standalone master listening on %s", runtime.address)
            if config.event_log:
                _log.info("the master's event log (JSON lines): %s", config.event_log)
            yield _JobMaster(runtime.address, runtime.token, given_file)
        return
    target = _named_master(cfg)
    endpoint = None if target else peer_endpoint(cfg)
    if not target and endpoint is None:
        raise ConfigError(
            f"a job of --nnodes={cfg.nodes} needs a master for its nodes to meet at: --master HOST:PORT "
            "(a running dlrover-master), --rdzv-backend=dlrover --rdzv-endpoint=HOST:PORT, or "
            "DLROVER_MASTER_ADDR; a node's own address as torchrun takes it (--rdzv-backend=c10d "
            "--rdzv-endpoint=HOST:PORT, or --master-addr/--master-port with --node-rank); or --standalone "
            "for one machine"
        )
    if given is None:
        if endpoint is not None:
            raise ConfigError(
                f"the nodes meet at {endpoint.address} ({endpoint.backend}), where this job's master runs, and "
                "every RPC to it is authenticated: give every node the same job token (--token-file on a shared "
                "filesystem, or DLROVER_JOB_TOKEN)"
            )
        given = load_token()  # raises, naming where a token may come from
    if endpoint is None:
        yield _JobMaster(target, given, given_file)
        return
    with peer_master(cfg, endpoint, given) as hosted:
        yield _JobMaster(endpoint.address, given, given_file, hosted)


def _master_tls(cfg: LaunchConfig, master: _JobMaster) -> TLSConfig | None:
    """The TLS this agent and its workers dial the job's master with; None: plaintext.

    They apply to a running master named to this agent (`--master`, `--rdzv-backend=dlrover`,
    DLROVER_MASTER_ADDR). A master run by `dlrover-run` itself (embedded, or served by one node
    of a torchrun-style job for its peers, this one or another) listens in plaintext, so TLS
    settings given for it are ignored, and said so.
    """
    if cfg.master_tls is None:
        return None
    if _runs_own_master(cfg) or not _named_master(cfg):
        _log.warning(
            "--master-tls-* / DLROVER_MASTER_TLS_* ignored: the job's master at %s is run by dlrover-run and "
            "serves plaintext; they apply when joining a running dlrover-master that serves TLS",
            master.address,
        )
        return None
    return cfg.master_tls


def _launched_node_id() -> int | None:
    """The node id a master's scheduler launched this agent as (DLROVER_NODE_ID), if any."""
    text = os.environ.get(NODE_ID_ENV_VAR, "")
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{NODE_ID_ENV_VAR} must be an integer node id, got {text!r}") from None


def _network_check(cfg: LaunchConfig, control: GrpcControlPlane, local_addr: str) -> NetworkCheck | None:
    """The `--network-check` runner over the master's key-value store, or None when it is off."""
    if not cfg.network_check:
        return None
    from dlrover.launcher.netcheck import NetworkCheck, NetworkCheckConfig

    config = NetworkCheckConfig(
        probe_timeout_s=cfg.network_check_timeout_s,
        results_timeout_s=cfg.network_check_results_timeout_s,
        straggler_factor=cfg.straggler_factor,
        exclude_stragglers=cfg.exclude_straggler,
    )
    return NetworkCheck(config, control, local_addr=local_addr)


def _run_id(cfg: LaunchConfig) -> str:
    """TORCHELASTIC_RUN_ID: `--rdzv-id`; as under torchrun, a fresh uuid for a standalone job
    that was given none."""
    return str(uuid.uuid4()) if cfg.standalone and cfg.rdzv_id == "none" else cfg.rdzv_id


def _job_id(run_id: str, master_address: str, env: Mapping[str, str]) -> str:
    """DLROVER_JOB_ID for the workers: the one this agent was given, else the run id, else (no
    `--rdzv-id` outside `--standalone`) one derived from the master's address and the job's name:
    the same on every node, and unique while the job's master runs.

    Raises:
        ConfigError: a given DLROVER_JOB_ID that cannot name shared memory.
    """
    given = env.get(JOB_ID_ENV_VAR, "")
    if given:
        if safe_job_id(given) != given:
            raise ConfigError(f"{JOB_ID_ENV_VAR}={given!r} must be 1-64 characters of [A-Za-z0-9_-]")
        return given
    if run_id != "none":
        return safe_job_id(run_id)
    return safe_job_id(f"{env.get('DLROVER_JOB_NAME') or 'dlrover'}-{master_address}")


def _warn_ignored_flags(cfg: LaunchConfig) -> None:
    """Say which torchrun-style flags given have no effect here, rather than drop them silently."""
    ignored = [
        flag
        for flag, given in (("--master-addr", cfg.master_addr != "127.0.0.1"), ("--master-port", cfg.master_port))
        if given
    ]
    # In a static multi-node command line they name where the nodes meet (see peer_master).
    static = not _runs_own_master(cfg) and not _named_master(cfg) and cfg.rdzv_backend in ("static", "dlrover")
    if ignored and not static:
        _log.warning(
            "%s: no effect under dlrover-run; node rank 0's agent hosts each round's torch.distributed store "
            "on an address and port it picks, and MASTER_ADDR/MASTER_PORT tell the workers where",
            ", ".join(ignored),
        )
    for flag, filters, bit in (
        ("--duplicate-stdout-filters", cfg.duplicate_stdout_filters, 1),
        ("--duplicate-stderr-filters", cfg.duplicate_stderr_filters, 2),
    ):
        if filters and not any(mask & bit for _, mask in cfg.tee):
            _log.warning("%s: no effect, as under torchrun, unless --tee includes that stream", flag)
    if cfg.event_log_handler not in ("null", ""):
        _log.warning(
            "--event-log-handler=%s: no effect under dlrover-run; the master keeps the job's event log",
            cfg.event_log_handler,
        )
    if cfg.start_method != "spawn":
        _log.warning(
            "--start-method=%s: no effect under dlrover-run; every worker is a new process (as with spawn)",
            cfg.start_method,
        )
    if cfg.node_unit != 1 and not _runs_own_master(cfg):
        _log.warning(
            "--node-unit=%d: no effect when joining a running master; its own --node-unit applies", cfg.node_unit
        )


def _log_root(cfg: LaunchConfig) -> tuple[Path | None, Path | None]:
    """Where the workers' logs go (`--log-dir`, else the default root of `worker_logs`), and the
    default root when that is it; (None, None) when no default root can be written (said)."""
    if cfg.log_dir:
        return Path(cfg.log_dir), None
    root, problems = default_log_root(Path.cwd(), os.environ)
    if root is None:
        _log.warning("worker logs are not kept (give --log-dir): %s", "; ".join(problems))
    return root, root


def _finish_logs(
    run_dir: Path | None, cleanup: LogCleanup, result: AgentResult | None, default_root: Path | None
) -> str:
    """Apply `--log-cleanup` to this agent's log folder; where the logs are, in words."""
    if run_dir is None:
        return ""
    succeeded = result is not None and result.exit_code == 0
    if cleanup.removes(succeeded) and remove_run_logs(run_dir, default_root):
        return f"worker logs removed (--log-cleanup={cleanup.value})"
    return f"worker logs in {run_dir}"


def _say_slurm_step(cfg: LaunchConfig) -> None:
    """Where an srun step's job master runs, when this agent is one of the step's nodes."""
    if cfg.slurm is None:
        return
    from dlrover.launcher.peer_master import peer_endpoint

    endpoint = peer_endpoint(cfg)  # the static form srun's step made
    if endpoint is not None:
        _log.info(
            "srun step %s of %d nodes: this is node %d; the job's master runs on %s:%s (the step's first node)",
            cfg.slurm.run_id,
            cfg.slurm.num_nodes,
            cfg.slurm.node_id,
            endpoint.host,
            endpoint.port,
        )


def _control_plane(cfg: LaunchConfig, master: _JobMaster, local_addr: str, tls: TLSConfig | None) -> GrpcControlPlane:
    """This agent's connection to the job's master."""
    from dlrover.common import ChannelConfig, RetryPolicy
    from dlrover.launcher.grpc_control import GrpcControlPlane, default_node_name

    return GrpcControlPlane(
        master.address,
        master.token,
        node_name=os.environ.get("DLROVER_NODE_NAME") or default_node_name(cfg.node_rank),
        host=socket.gethostname(),
        local_addr=local_addr,
        min_nodes=cfg.nodes.min_nodes,
        max_nodes=cfg.nodes.max_nodes,
        node_id=_launched_node_id(),
        store_wait_s=cfg.store_wait_s,
        poll_timeout_s=cfg.exit_barrier_poll_timeout_s,
        connect_timeout_s=cfg.rendezvous_timeout_s,
        channel_config=ChannelConfig(tls=tls),
        policy=RetryPolicy(call_timeout_s=cfg.master_call_timeout_s, total_timeout_s=cfg.master_call_retry_s),
    )


def _stop_on_signals(cfg: LaunchConfig, agent: Agent, master: _JobMaster) -> None:
    """Handle `cfg.signals_to_handle` as torchrun does: stop the workers with the signal received."""
    received: list[signal.Signals] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        # Said the moment it arrives: stopping takes up to the grace period and a persist.
        if received:
            _log.warning("received %s while already stopping (after %s)", sig.name, received[0].name)
        else:
            _log.warning(
                "received %s: stopping the workers (they get %s, then SIGKILL after the %g s grace period, "
                "--shutdown-grace), persisting the newest in-memory checkpoint if any, then exiting with %d",
                sig.name,
                sig.name,
                cfg.shutdown_grace_s,
                128 + sig,
            )
        received.append(sig)
        # As torchrun: the workers get the signal the agent received.
        agent.request_stop(f"received {sig.name}", sig)
        if master.hosted is not None:
            master.hosted.request_stop()

    for name in cfg.signals_to_handle:
        signal.signal(signal.Signals[name], on_signal)


def run(cfg: LaunchConfig, *, sample_gpus: bool = False, standby: StandbyPool | None = None) -> AgentResult:
    """Run this node's share of the job described by `cfg`; with `sample_gpus`, heartbeats carry
    the GPUs' use (through nvidia-ml-py, when installed). `standby`: the node's standby workers,
    already started (`early_standbys`); the agent takes them over, and they are closed whatever the exit."""
    from dlrover.common import TOKEN_FILE_ENV_VAR, master_tls_env, owned_temp_dir, remove_dead_owners, write_token_file
    from dlrover.flashckpt.commit import RetentionPolicy
    from dlrover.flashckpt.pacing import persist_bandwidth_or_default
    from dlrover.launcher.agent import Agent, AgentConfig
    from dlrover.launcher.store_host import TorchStoreHost, TorchStoreHostConfig

    with ExitStack() as stack:
        if standby is not None:
            # Closed by the agent when it ends; here too for a start that fails before the agent exists.
            stack.callback(standby.close, cfg.shutdown_grace_s)
        _warn_ignored_flags(cfg)
        _say_slurm_step(cfg)
        for prefix in (TOKEN_DIR_PREFIX, LOG_DIR_PREFIX):
            remove_dead_owners(prefix)
        master = stack.enter_context(_master_for(cfg))
        target, token, token_file = master.address, master.token, master.token_file
        local_addr = cfg.local_addr or ("127.0.0.1" if _runs_own_master(cfg) else socket.getfqdn())
        tls = _master_tls(cfg, master)
        control = _control_plane(cfg, master, local_addr, tls)
        stack.callback(control.close)
        # Workers reach the master too (shard client, checkpoint coordination): they read the
        # token from a file, the one given or else a private 0600 copy, never from the command
        # line or the environment.
        if not token_file:
            private = stack.enter_context(owned_temp_dir(TOKEN_DIR_PREFIX))
            token_file = str(write_token_file(private / "token", token))
        log_dir, default_root = _log_root(cfg)
        kept = log_dir is not None
        if log_dir is None and any(mask for _, mask in (*cfg.redirects, *cfg.tee)):
            log_dir = stack.enter_context(owned_temp_dir(LOG_DIR_PREFIX))
        # Workers' @record error files (TORCHELASTIC_ERROR_FILE) go beside the logs, or here.
        error_dir = None
        if log_dir is None:
            try:
                error_dir = stack.enter_context(owned_temp_dir(LOG_DIR_PREFIX))
            except OSError as exc:
                _log.warning("workers get no TORCHELASTIC_ERROR_FILE: no temp dir for it (%s)", exc)
        run_id = _run_id(cfg)
        agent = Agent(
            AgentConfig(
                worker_argv=tuple(cfg.worker_command(sys.executable)),
                nproc_per_node=cfg.nproc_per_node,
                max_restarts=cfg.max_restarts,
                run_id=run_id,
                job_id=_job_id(run_id, target, os.environ),
                role=cfg.role,
                monitor_interval_s=cfg.monitor_interval_s,
                shutdown_grace_s=cfg.shutdown_grace_s,
                log_dir=log_dir,
                error_dir=error_dir,
                redirects=dict(cfg.redirects),
                tee=dict(cfg.tee),
                local_ranks_filter=cfg.local_ranks_filter,
                hang_timeout_s=cfg.hang_timeout_s,
                step_hang=_step_hang(cfg),
                stack_dump_timeout_s=cfg.stack_dump_timeout_s,
                hang_busy_probe_s=cfg.hang_busy_probe_s,
                heartbeat_interval_s=cfg.heartbeat_interval_s,
                rendezvous_timeout_s=cfg.rendezvous_timeout_s,
                master_lost_timeout_s=cfg.master_lost_timeout_s,
                round_save_timeout_s=cfg.round_save_timeout_s,
                waiting_check_interval_s=cfg.waiting_check_interval_s,
                prewarm_modules=cfg.prewarm,
                prewarm_refill_after_s=cfg.prewarm_refill_after_s,
                prewarm_join_wait_s=cfg.prewarm_join_wait_s,
                worker_reap_timeout_s=cfg.worker_reap_timeout_s,
                exit_barrier_timeout_s=cfg.exit_barrier_timeout_s,
                checkpoint_stop_timeout_s=cfg.checkpoint_stop_timeout_s,
                checkpoint_shm_dir=cfg.checkpoint_shm_dir,
                resource_sample_interval_s=cfg.resource_sample_interval_s,
                virtual_local_rank=cfg.virtual_local_rank,
                duplicate_filters=(cfg.duplicate_stdout_filters, cfg.duplicate_stderr_filters),
                log_max_bytes=int(cfg.log_max_mb * 1e6),
                failure_persist_hold_s=cfg.failure_persist_hold_s,
                checkpoint_retention=RetentionPolicy.from_counts(cfg.checkpoint_keep_last, cfg.checkpoint_keep_every),
                persist_bandwidth_mb_s=persist_bandwidth_or_default(cfg.persist_bandwidth_mb_s),
                # The TLS variables are always set (empty: plaintext), so workers dial as this
                # agent does, whatever they would inherit.
                extra_env={
                    MASTER_ADDR_ENV_VAR: target,
                    TOKEN_FILE_ENV_VAR: str(Path(token_file).resolve()),
                    **master_tls_env(tls),
                },
            ),
            control,
            network_check=_network_check(cfg, control, local_addr),
            # As torchrun: node rank 0's agent hosts each round's store; workers are all clients.
            # `--rdzv-conf store_timeout=` bounds both the wait for its address and its start-up.
            store_host=TorchStoreHost(TorchStoreHostConfig(store_timeout_s=cfg.store_wait_s)),
            sample_gpus=sample_gpus,
            standby=standby,
        )

        _stop_on_signals(cfg, agent, master)
        result: AgentResult | None = None
        try:
            result = agent.run()
            if master.hosted is not None and result.exit_code == 0:
                master.hosted.wait_job_end(cfg.exit_barrier_timeout_s)
        finally:
            logs = _finish_logs(agent.run_dir if kept else None, cfg.log_cleanup, result, default_root)
        assert result is not None  # agent.run returned
        return attrs.evolve(result, logs=logs)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `dlrover-run`; returns its exit status.

    The summary line (``finished with exit code N ...``) is the last thing it prints, once the
    workers, the standbys, the checkpoint savers and the embedded master have all stopped. Called
    as the process's own entry point (`argv` None: the ``dlrover-run`` command, ``python -m``), the
    process then ends right after the interpreter's exit handlers, skipping the teardown of the
    modules it imported (torch's takes 0.5 to 2 s), so that the line is also where it exits.
    """
    configure_logging()
    status = _ExitStatus()
    if argv is None:
        # Registered before torch is imported, so it runs after torch's exit handlers.
        atexit.register(status.end_process)
    status.code = _main(argv)
    return status.code


def _main(argv: list[str] | None) -> int:
    try:
        # Counted only where the flags size the node by it: counting imports torch where a GPU driver
        # is present, seconds (about 4 on an H200 host) on this process's path to registering its node,
        # which every node start pays (a grown node's, a replacement's). The GPUs' sampling needs no
        # count: NVML, which it reads through, finds the devices (or says why there are none).
        cfg = parse_args(argv, accelerators=functools.cache(_visible_accelerators))
        if cfg.token is not None:
            _log.warning("--token is visible to every user of this host (ps, /proc); prefer --token-file")
        standby = early_standbys(cfg)
        result = run(cfg, sample_gpus=_samples_gpus(), standby=standby)
    except (ConfigError, DLRoverError) as exc:
        print(f"dlrover-run: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    _log.info(
        "finished with exit code %d after %d restart(s) in %d round(s): %s%s",
        result.exit_code,
        result.restarts,
        result.rounds,
        result.reason,
        f"; {result.logs}" if result.logs else "",
    )
    return result.exit_code


class _ExitStatus:
    """The status `dlrover-run` exits with, and the exit handler that ends the process with it."""

    def __init__(self) -> None:
        self.code = 1  # an exception escaped `main`: as the interpreter's status for one

    def end_process(self) -> None:
        logging.shutdown()  # flushes the log handlers, as the interpreter's own exit handler would
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(self.code)


def early_standbys(cfg: LaunchConfig) -> StandbyPool | None:
    """This node's standby workers (``--prewarm``), started before `dlrover-run` imports its agent.

    A node that starts (a job's first, a grown or a replacement node) waits for its workers' imports
    (torch's: over a second) before it can train; started first, they run beside the agent's own
    imports and its start instead of after them. They import under the environment the agent gives
    its standbys, but for DLRover's own variables, which are not known yet and which a taken standby
    receives with its worker's environment. None: no prewarm, a program a standby cannot run (the
    agent says so), or the processes could not be started (said; the agent tries again).
    """
    if not cfg.prewarm:
        return None
    from dlrover.launcher._standby import runnable

    program = tuple(cfg.worker_command(sys.executable))
    if not runnable(program):
        return None
    env = standby_env(
        os.environ,
        nproc_per_node=cfg.nproc_per_node,
        role=cfg.role,
        run_id=cfg.rdzv_id,
        max_restarts=cfg.max_restarts,
    )
    pool = StandbyPool(program, cfg.prewarm, env, size=cfg.nproc_per_node)
    try:
        pool.fill()
    except OSError as exc:
        _log.warning("could not start standby workers before the agent (%s); the agent starts them", exc)
        pool.close(0.0)
        return None
    except BaseException:
        pool.close(0.0)
        raise
    return pool


def _step_hang(cfg: LaunchConfig) -> HangConfig | None:
    """The agent's step-report hang detector from the flags; None when --hang-step-factor is 0."""
    if cfg.hang_step_factor <= 0:
        return None
    from dlrover.diagnosis import HangConfig

    return HangConfig(
        k=cfg.hang_step_factor,
        floor_s=cfg.hang_step_floor_s,
        first_steps_allowance_s=cfg.hang_first_steps_s,
        phase_allowance_s={"checkpoint": cfg.hang_checkpoint_s, "eval": cfg.hang_eval_s, "wait": cfg.hang_wait_s},
    )


if __name__ == "__main__":
    sys.exit(main())
