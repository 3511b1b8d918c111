"""The `dlrover-run` command line: every torchrun flag with torchrun's meaning, plus DLRover's own.

Like torchrun, each flag accepts both spellings (`--nproc-per-node` and `--nproc_per_node`) and
takes its default from a `PET_<NAME>` environment variable when one is set (`PET_NNODES=2`).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from dlrover.common import (
    MASTER_TLS_CA_ENV_VAR,
    MASTER_TLS_CERT_ENV_VAR,
    MASTER_TLS_KEY_ENV_VAR,
    MASTER_TLS_SERVER_NAME_ENV_VAR,
    ConfigError,
    DefaultsHelpFormatter,
    TLSConfig,
    master_tls_from_settings,
)
from dlrover.flashckpt.segment import DEFAULT_SHM_DIR
from dlrover.launcher.env import MASTER_ADDR_ENV_VAR
from dlrover.launcher.slurm import SlurmStep, slurm_step
from dlrover.launcher.worker_logs import LogCleanup

if TYPE_CHECKING:
    from dlrover.autoscale import Resources

DEFAULT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")  # torchrun's default

__all__ = ["LaunchConfig", "NodeRange", "build_parser", "parse_args", "parse_std_streams"]


@attrs.frozen
class NodeRange:
    """`--nnodes`: a fixed count (`2`) or an elastic range (`1:4`)."""

    min_nodes: int
    max_nodes: int

    @classmethod
    def parse(cls, text: str) -> NodeRange:
        """Parse `N` or `MIN:MAX`.

        Raises:
            ConfigError: not integers, below 1, or MIN above MAX.
        """
        parts = str(text).split(":")
        try:
            if len(parts) == 1:
                low = high = int(parts[0])
            elif len(parts) == 2:
                low, high = int(parts[0]), int(parts[1])
            else:
                raise ValueError(text)
        except ValueError:
            raise ConfigError(f"--nnodes must be N or MIN:MAX, got {text!r}") from None
        if low < 1 or high < low:
            raise ConfigError(f"--nnodes needs 1 <= MIN <= MAX, got {text!r}")
        return cls(low, high)

    def __str__(self) -> str:
        return f"{self.min_nodes}:{self.max_nodes}"


def parse_std_streams(text: str, nproc: int, flag: str) -> dict[int, int]:
    """Parse `--redirects`/`--tee`: `3` for every local rank, or `0:1,1:2` per local rank.

    Values are a bit mask: 1 is stdout, 2 is stderr, 3 both, 0 neither.

    Returns:
        local rank -> mask, for every local rank.

    Raises:
        ConfigError: a value outside 0..3, or a malformed entry.
    """
    text = str(text).strip()

    def mask(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(f"{flag} values are 0..3 (1=stdout, 2=stderr), got {value!r}") from None
        if not 0 <= number <= 3:
            raise ConfigError(f"{flag} values are 0..3 (1=stdout, 2=stderr), got {value!r}")
        return number

    if ":" not in text:
        every = mask(text or "0")
        return dict.fromkeys(range(nproc), every)
    result = dict.fromkeys(range(nproc), 0)
    for entry in text.split(","):
        rank_text, _, value = entry.partition(":")
        try:
            rank = int(rank_text)
        except ValueError:
            raise ConfigError(f"{flag} entries are LOCAL_RANK:MASK, got {entry!r}") from None
        if not 0 <= rank < nproc:
            raise ConfigError(f"{flag} names local rank {rank}, but there are {nproc} per node")
        result[rank] = mask(value)
    return result


@attrs.frozen
class LaunchConfig:
    """Everything `dlrover-run` was asked to do, validated."""

    nodes: NodeRange
    nproc_per_node: int
    entrypoint: str
    entrypoint_args: tuple[str, ...]
    run_as_module: bool = False
    no_python: bool = False
    run_path: bool = False
    standalone: bool = False
    master: str | None = None
    rdzv_backend: str = "dlrover"
    rdzv_endpoint: str = ""
    rdzv_id: str = "none"
    rdzv_conf: tuple[tuple[str, str], ...] = ()
    max_restarts: int = 0
    monitor_interval_s: float = 0.1
    role: str = "default"
    log_dir: str | None = None
    log_cleanup: LogCleanup = LogCleanup.NEVER
    log_max_mb: float = 100.0
    redirects: tuple[tuple[int, int], ...] = ()
    tee: tuple[tuple[int, int], ...] = ()
    local_ranks_filter: tuple[int, ...] = ()
    node_rank: int | None = None
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    local_addr: str | None = None
    network_check: bool = False
    exclude_straggler: bool = False
    network_check_timeout_s: float = 60.0
    network_check_results_timeout_s: float | None = None
    straggler_factor: float = 2.0
    save_at_breakpoint: bool = False
    failure_persist_hold_s: float = 0.0
    checkpoint_keep_last: int = 0
    checkpoint_keep_every: int = 0
    persist_bandwidth_mb_s: float | None = None
    node_unit: int = 1
    hang_timeout_s: float = 180.0
    hang_step_factor: float = 5.0
    hang_step_floor_s: float = 30.0
    hang_first_steps_s: float = 600.0
    hang_checkpoint_s: float = 600.0
    hang_eval_s: float = 1800.0
    hang_wait_s: float = 3600.0
    stack_dump_timeout_s: float = 10.0
    hang_busy_probe_s: float = 2.0
    runtime_straggler_factor: float = 2.0
    straggler_action: str = "report"
    auto_config: bool = False
    token: str | None = None
    token_file: str | None = None
    heartbeat_interval_s: float | None = None
    rendezvous_timeout_s: float = 600.0
    store_wait_s: float = 60.0
    master_lost_timeout_s: float = 300.0
    master_call_timeout_s: float = 5.0
    master_call_retry_s: float = 30.0
    round_save_timeout_s: float = 10.0
    waiting_check_interval_s: float = 0.25
    shutdown_grace_s: float = 10.0
    # Built by hand: no standbys. `parse_args` fills in DEFAULT_PREWARM for a Python worker.
    prewarm: tuple[str, ...] = ()
    prewarm_refill_after_s: float = 30.0
    prewarm_join_wait_s: float = 120.0
    worker_reap_timeout_s: float = 30.0
    exit_barrier_timeout_s: float = 300.0
    exit_barrier_poll_timeout_s: float = 2.0
    checkpoint_stop_timeout_s: float = 120.0
    checkpoint_shm_dir: str = DEFAULT_SHM_DIR
    resource_sample_interval_s: float = 1.0
    signals_to_handle: tuple[str, ...] = DEFAULT_SIGNALS
    duplicate_stdout_filters: tuple[str, ...] = ()
    duplicate_stderr_filters: tuple[str, ...] = ()
    virtual_local_rank: bool = False
    event_log_handler: str = "null"
    start_method: str = "spawn"
    slurm: SlurmStep | None = None  # the srun step whose environment filled in the job's nodes
    # What each node asks for (--node-cpu, --node-memory, --node-gpus, --node-gpu-type): recorded by the
    # master this agent runs (--standalone); None when no flag was given.
    node_resources: Resources | None = None
    # How this agent and its workers dial a running master (--master-tls-*, else the
    # DLROVER_MASTER_TLS_* variables); None: plaintext.
    master_tls: TLSConfig | None = None

    def worker_command(self, python: str) -> list[str]:
        """The argv that starts one worker, as torchrun builds it."""
        if self.no_python:
            return [self.entrypoint, *self.entrypoint_args]
        if self.run_as_module:
            return [python, "-u", "-m", self.entrypoint, *self.entrypoint_args]
        if self.run_path:
            code = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
            return [python, "-u", "-c", code, self.entrypoint, *self.entrypoint_args]
        return [python, "-u", self.entrypoint, *self.entrypoint_args]


class _EnvDefault(argparse.Action):
    """Takes the default from `PET_<DEST>` as torchrun does."""

    def __init__(self, option_strings: Sequence[str], dest: str, default: Any = None, **kwargs: Any) -> None:
        env_default = os.environ.get(f"PET_{dest.upper()}")
        super().__init__(option_strings, dest, default=env_default if env_default is not None else default, **kwargs)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, _o: Any = None
    ) -> None:
        setattr(namespace, self.dest, values)


class _EnvFlag(argparse.Action):
    """A boolean flag that `PET_<DEST>=1` also turns on."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        env_value = os.environ.get(f"PET_{dest.upper()}", "")
        kwargs.pop("default", None)
        super().__init__(option_strings, dest, nargs=0, default=env_value.lower() in ("1", "true", "yes"), **kwargs)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, _o: Any = None
    ) -> None:
        setattr(namespace, self.dest, True)


def _both(name: str) -> list[str]:
    dashed = f"--{name}"
    underscored = f"--{name.replace('-', '_')}"
    return [dashed] if dashed == underscored else [dashed, underscored]


def _option(group: argparse._ArgumentGroup, names: list[str], default: str | None, text: str = "") -> None:
    group.add_argument(*names, default=default, help=text or None, action=_EnvDefault)


def _flag(group: argparse._ArgumentGroup, names: list[str], text: str) -> None:
    group.add_argument(*names, help=text, action=_EnvFlag)


# The flags that say how to dial a running master with TLS, the variable each defaults from, and
# what it is; their values are handed to the workers in those variables (see `dlrover.common.master_tls`).
_MASTER_TLS_FLAGS = (
    (
        "--master-tls-ca",
        MASTER_TLS_CA_ENV_VAR,
        "a PEM CA bundle that verifies the master's certificate: dial the master (this agent and its workers) with TLS",
    ),
    (
        "--master-tls-server-name",
        MASTER_TLS_SERVER_NAME_ENV_VAR,
        "the name the master's certificate is valid for, when not the host dialed",
    ),
    (
        "--master-tls-cert",
        MASTER_TLS_CERT_ENV_VAR,
        "this node's client certificate (PEM) for a master that requires one",
    ),
    ("--master-tls-key", MASTER_TLS_KEY_ENV_VAR, "its private key (PEM)"),
)


def _master_tls(ns: argparse.Namespace, env: Mapping[str, str]) -> TLSConfig | None:
    """The TLS the `--master-tls-*` flags (each defaulting from its variable) ask for; None: plaintext."""
    settings: dict[str, str | None] = {}
    origins: dict[str, str] = {}
    for flag, var, _ in _MASTER_TLS_FLAGS:
        given = getattr(ns, flag[2:].replace("-", "_"))
        if given not in (None, ""):
            settings[var], origins[var] = str(given), flag
        else:
            settings[var] = env.get(var)
    return master_tls_from_settings(settings, origins)


def _node_resources(ns: argparse.Namespace) -> Resources | None:
    """The node resources the flags ask for (None when none was given), checked as dlrover-master checks them."""
    given = (ns.node_cpu, ns.node_memory, ns.node_gpus, ns.node_gpu_type)
    if all(v in (None, "") for v in given):
        return None
    # Here, not at the top: the master's modules are loaded only by a run that asks for resources.
    from dlrover.master.resource_flags import resources_from_flags

    return resources_from_flags(*(None if v in (None, "") else str(v) for v in given))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: torchrun's flags first, then DLRover's."""
    p = argparse.ArgumentParser(
        prog="dlrover-run",
        description="Run a torchrun-style training script with fault tolerance, flash checkpoints and diagnosis.",
        formatter_class=DefaultsHelpFormatter,
    )
    _add_torchrun_options(p.add_argument_group("torchrun-compatible options"))
    _add_dlrover_options(p.add_argument_group("DLRover options"))
    p.add_argument("training_script", help="the script, module or executable to run")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


def _add_torchrun_options(tr: argparse._ArgumentGroup) -> None:
    _option(tr, ["--nnodes"], None, "N, or MIN:MAX for an elastic job (default: 1, or the srun step's nodes)")
    _option(tr, _both("nproc-per-node"), None, "workers per node: N, auto, cpu or gpu (default: 1)")
    _option(tr, _both("rdzv-backend"), "dlrover", "dlrover (a running dlrover-master), c10d or static")
    _option(tr, _both("rdzv-endpoint"), "", "HOST[:PORT] where the nodes meet")
    _option(tr, _both("rdzv-id"), "none", "the job's run id (TORCHELASTIC_RUN_ID; a fresh uuid with --standalone)")
    _option(tr, _both("rdzv-conf"), "", "key1=v1,key2=v2")
    _flag(tr, ["--standalone"], "run master, agent and workers on this machine")
    _option(tr, _both("max-restarts"), "0", "worker restarts after failures before the node gives up")
    _option(tr, _both("monitor-interval"), "0.1", "seconds between worker checks")
    _option(tr, _both("start-method"), "spawn", "accepted for compatibility; workers are always new processes")
    _option(tr, ["--role"], "default", "the workers' role name")
    _flag(tr, ["-m", "--module"], "run the entrypoint as a module (python -m)")
    _flag(tr, _both("no-python"), "run the entrypoint as an executable")
    _flag(tr, _both("run-path"), "run the entrypoint with runpy.run_path")
    _option(
        tr,
        _both("log-dir"),
        None,
        "root of the workers' stdout.log, stderr.log and error files, in a folder of this agent's own "
        "(<run id>_<unique>/attempt_<n>/<local rank>/) that outlives the run (default: ./dlrover-logs, or "
        "$XDG_STATE_HOME/dlrover/logs where that cannot be written)",
    )
    _option(tr, ["-r", "--redirects"], "0", "0..3 or LOCAL_RANK:MASK,... (1=stdout, 2=stderr)")
    _option(tr, ["-t", "--tee"], "0", "0..3 or LOCAL_RANK:MASK,... (1=stdout, 2=stderr)")
    _option(tr, _both("local-ranks-filter"), "", "local ranks whose output is shown")
    _option(tr, _both("node-rank"), None, "this node's rank (default: given by the rendezvous)")
    _option(tr, _both("master-addr"), None, "with --node-rank: where node rank 0's agent serves (default: 127.0.0.1)")
    _option(tr, _both("master-port"), None, "with --master-addr: the port it serves on (default: 29500 in that form)")
    _option(
        tr,
        _both("local-addr"),
        None,
        "this node's address for the others (default: 127.0.0.1 for a job of one node, else this host's name)",
    )
    _option(
        tr,
        _both("signals-to-handle"),
        ",".join(DEFAULT_SIGNALS),
        "signals the agent handles by stopping: the workers get the same signal, SIGKILL after the grace period",
    )
    _option(
        tr,
        _both("shutdown-timeout"),
        None,
        "torchrun's name for --shutdown-grace (default: TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else --shutdown-grace)",
    )
    _flag(tr, _both("virtual-local-rank"), "LOCAL_RANK=0 for every worker, which sees only its own GPU")
    _option(
        tr,
        _both("duplicate-stdout-filters"),
        "",
        "comma-separated substrings (,, for a comma): tee'd stdout lines holding one are also appended to "
        "filtered_stdout.log in the attempt's log folder",
    )
    _option(tr, _both("duplicate-stderr-filters"), "", "as --duplicate-stdout-filters, for stderr")
    _option(tr, _both("event-log-handler"), "null", "no effect here: the master keeps the job's event log")
    _option(tr, _both("logs-specs"), None, "refused: dlrover-run's log layout is fixed (see --log-dir)")
    _option(tr, _both("numa-binding"), None, "refused: not supported by dlrover-run (bind with numactl)")


def _add_dlrover_options(ours: argparse._ArgumentGroup) -> None:
    _option(ours, ["--master"], None, "HOST:PORT of a running dlrover-master to join")
    _flag(ours, _both("network-check"), "check nodes' health before training")
    _flag(ours, _both("exclude-straggler"), "leave out nodes the network check finds slow (needs --network-check)")
    _option(
        ours,
        _both("network-check-timeout"),
        "60",
        "seconds one probe of the network check may run (process start included) before it is killed and fails",
    )
    _option(
        ours,
        _both("network-check-results-timeout"),
        None,
        "seconds a node waits for the other nodes' probe results in each check round before counting the "
        "missing ones as failed (default: twice --network-check-timeout plus 60)",
    )
    _option(
        ours,
        _both("straggler-factor"),
        "2.0",
        "the network check calls a node a straggler when its best probe time is over this multiple of the median",
    )
    _flag(
        ours,
        _both("save-at-breakpoint"),
        "persist the newest in-memory flash checkpoint as soon as a worker fails, while the workers restart "
        "(the default; DLRover's flag, accepted so its command lines run unchanged)",
    )
    _option(
        ours,
        _both("failure-persist-hold"),
        "0",
        "seconds the flash checkpoint saver may hold back the persist a worker failure triggers, so that on a "
        "node with few cores it does not slow the restarted workers' restore from memory: it starts once every "
        "restarted worker of the node has saved a checkpoint again, or after this long, or when the node's ranks "
        "change or the agent exits; the workers' next-but-one save may then wait for it; 0: at once",
    )
    _option(
        ours,
        _both("checkpoint-keep-last"),
        "0",
        "flash checkpoints in storage: the node's savers keep the last N committed steps (0: all; a job's own "
        "RetentionPolicy wins)",
    )
    _option(ours, _both("checkpoint-keep-every"), "0", "and every K-th step too (needs --checkpoint-keep-last)")
    _option(
        ours,
        _both("persist-bandwidth-mb-s"),
        "auto",
        "cap on the rate (MB/s) at which the node's savers write a checkpoint to storage, bounding what a "
        "background persist takes from training on a node with few free cores; auto: 256 per CPU the agent "
        "may use; 0: none (disk speed)",
    )
    _option(ours, _both("node-unit"), "1", "the world holds a multiple of this many nodes")
    _option(
        ours,
        _both("hang-timeout"),
        "180",
        "seconds a worker may go without using CPU before it counts as hung and is restarted (a worker stopped, "
        "deadlocked, or stuck joining after a restart); 0: off",
    )
    _option(
        ours,
        _both("hang-step-factor"),
        "5",
        "workers that report their steps (dlrover.diagnosis.StepReporter, FlashCheckpointer.save) are hung when "
        "stalled longer than this many times the median training time between their step marks (or --hang-step-floor); "
        "their stacks are dumped into the failure evidence and they are restarted; 0: off",
    )
    _option(ours, _both("hang-step-floor"), "30", "seconds: the shortest stall that counts as a hang")
    _option(ours, _both("hang-first-steps"), "600", "seconds the first steps of each worker may take")
    _option(ours, _both("hang-checkpoint-allowance"), "600", "seconds a worker may stay in its checkpoint phase")
    _option(ours, _both("hang-eval-allowance"), "1800", "seconds a worker may stay in its eval phase")
    _option(
        ours,
        _both("hang-wait-allowance"),
        "3600",
        "seconds a worker may stay in its wait phase (holding training on purpose)",
    )
    _option(ours, _both("stack-dump-timeout"), "10", "seconds to wait for each hung worker's stack dump")
    _option(
        ours,
        _both("hang-busy-probe"),
        "2",
        "before a step-report hang is reported, dump the stacks again this many seconds later; a worker "
        "whose main thread moved is busy, not hung (0: report at once)",
    )
    _option(
        ours,
        _both("runtime-straggler-factor"),
        "2",
        "--standalone: the master reports a rank whose step time exceeds this many times the others' median",
    )
    _option(
        ours,
        _both("straggler-action"),
        "report",
        "--standalone: report (an event and a warning) or replace (relaunch the node, where the backend can)",
    )
    _flag(ours, _both("auto-config"), "workers per node from the visible accelerators")
    _option(ours, _both("node-cpu"), None, "--standalone: CPU cores each node asks for (recorded by the master)")
    _option(
        ours,
        _both("node-memory"),
        None,
        "--standalone: memory each node asks for, MiB (2048) or with a binary unit (512Mi, 8Gi); recorded by the "
        "master (enforced by dlrover-master's local backend, not by a standalone run)",
    )
    _option(ours, _both("node-gpus"), None, "--standalone: accelerators each node asks for")
    _option(ours, _both("node-gpu-type"), None, "--standalone: their type (e.g. nvidia-h100)")
    _option(ours, ["--token"], None, "the job token (prefer --token-file)")
    _option(ours, _both("token-file"), None, "a 0600 file holding the job token")
    for flag, var, text in _MASTER_TLS_FLAGS:
        _option(ours, _both(flag[2:]), None, f"{text} (default: ${var})")
    _option(ours, _both("heartbeat-interval"), None, "seconds between heartbeats (default: the master's choice)")
    _option(ours, _both("master-lost-timeout"), "300", "seconds workers keep training while the master is unreachable")
    _option(
        ours,
        _both("master-call-timeout"),
        "5",
        "seconds one call to the master may take before it counts as failed (a master busy registering a large "
        "job's nodes at once may need more)",
    )
    _option(
        ours,
        _both("master-call-retry"),
        "30",
        "seconds within which a call that can be repeated (registering included) is tried up to 5 times while the "
        "master is unreachable or slow; at least --master-call-timeout",
    )
    _option(
        ours,
        _both("waiting-check-interval"),
        "0.25",
        "between heartbeats, ask at most this often whether nodes wait to join (one small RPC per node; the "
        "rendezvous asks a large job's nodes to ask less often), so a growth (onto a warm spare too) starts its "
        "round within about this long; 0: with each heartbeat only",
    )
    _option(
        ours,
        _both("round-save-timeout"),
        "10",
        "before a planned round (nodes joining or leaving) and before stopping the workers on SIGTERM, ask the "
        "workers for a flash checkpoint (FlashCheckpointer.save_requested) and wait at most this many seconds "
        "for every one to seal it; 0: at once",
    )
    _option(
        ours,
        _both("shutdown-grace"),
        "10.0",
        "seconds workers get to exit after the stop signal (SIGTERM, or the one the agent received) before SIGKILL",
    )
    _option(
        ours,
        _both("log-cleanup"),
        "never",
        "when the agent removes its folder of worker logs as it exits: never, on-success or always",
    )
    _option(
        ours,
        _both("log-max-mb"),
        "100",
        "cap in MB on each worker's stdout.log and stderr.log: one that reaches it is renamed to <name>.1 "
        "(replacing an older one) and a new file started, so the newest output is kept; 0: no cap",
    )
    _option(
        ours,
        _both("checkpoint-stop-timeout"),
        "120",
        "seconds the agent's checkpoint savers get at exit to finish persisting (after a failure or a stop: "
        "the newest in-memory snapshot) before the job's shared memory is removed",
    )
    _option(
        ours,
        _both("checkpoint-shm-dir"),
        DEFAULT_SHM_DIR,
        "the shared-memory directory (a tmpfs) for the workers' flash checkpoints and the agent's saver "
        "host; workers find it in DLROVER_FLASHCKPT_SHM_DIR",
    )
    _option(
        ours,
        ["--prewarm"],
        None,
        "comma-separated modules that standby interpreters import ahead of time, one per local rank, so the "
        "workers and every restart skip that import (default: torch,dlrover.flashckpt.checkpointer, for a "
        "`python SCRIPT` or `-m MODULE` "
        "worker; an executable or --run-path starts fresh); each standby holds its imports' memory while it "
        "waits; a variable the script sets before its own import of them makes the standby restart as a fresh "
        "interpreter (or, after the script's first side effect, warn); none: start every worker fresh",
    )
    _option(
        ours,
        _both("prewarm-refill-after"),
        "30",
        "with --prewarm, the standbys for the next restart are started once every worker of the node has "
        "saved a flash checkpoint since it started (it is training again), or this many seconds after the "
        "start, or when the workers stop, whichever comes first, so they do not take CPU from workers that "
        "are restoring; 0 starts them with the workers",
    )
    _option(
        ours,
        _both("prewarm-join-wait"),
        "120",
        "with --prewarm, a node joining a job that has formed a round registers and joins only once its standbys "
        "finished their imports, "
        "waiting at most this many seconds (under the master's --node-start-timeout-s, 300 by default): a node "
        "that joins a running job makes the running nodes stop "
        "for a new round, which would otherwise wait while its workers import; 0 joins at once",
    )
    _option(
        ours,
        _both("worker-reap-timeout"),
        "30",
        "a failing worker stops the node's other workers at once and is reported once it has exited; one "
        "that the kernel still has not let go (its memory being freed) this many seconds after it began to "
        "exit is reported with the status it was exiting with",
    )
    _option(
        ours,
        _both("exit-barrier-timeout"),
        "300",
        "when this node's workers succeed and its agent hosts the round's torch.distributed store (node rank "
        "0), the longest it keeps the store open for the workers of nodes still training, as torchrun's exit "
        "barrier does; 0 closes it at once. On the node serving the master of a torchrun-style multi-node "
        "command line, also the longest it serves the other nodes after its own workers finished",
    )
    _option(
        ours,
        _both("exit-barrier-poll-timeout"),
        "2",
        "deadline of each look the exit barrier takes at the master (one attempt; the barrier polls)",
    )
    _option(
        ours,
        _both("resource-sample-interval"),
        "1",
        "seconds between samples of the workers' CPU, memory and GPU use sent with heartbeats (at most one "
        "sample per interval; 0: every heartbeat)",
    )


def _straggler_action(value: Any) -> str:
    if value not in ("report", "replace"):
        raise ConfigError(f"--straggler-action must be report or replace, got {value!r}")
    return str(value)


def _number(value: Any, flag: str, kind: type[int] | type[float], minimum: float) -> Any:
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} must be a number, got {value!r}") from None
    if number < minimum:
        raise ConfigError(f"{flag} must be at least {minimum}, got {value!r}")
    return number


def _finite(value: Any, flag: str, minimum: float) -> float:
    number = float(_number(value, flag, float, minimum))
    if not math.isfinite(number):
        raise ConfigError(f"{flag} must be a finite number, got {value!r}")
    return number


def _rate_or_auto(value: Any, flag: str) -> float | None:
    """A finite rate >= 0, or None for ``auto`` (the component's own default)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None
    try:
        return _finite(value, flag, 0.0)
    except ConfigError as e:
        raise ConfigError(f"{e} (or auto)") from None


def _shutdown_grace(ns: argparse.Namespace) -> float:
    """`--shutdown-grace`, or torchrun's `--shutdown-timeout` (or TORCH_ELASTIC_SHUTDOWN_TIMEOUT)."""
    grace = float(_number(ns.shutdown_grace, "--shutdown-grace", float, 0.0))
    given = ns.shutdown_timeout if ns.shutdown_timeout is not None else os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
    if given in (None, ""):
        return grace
    timeout = float(_number(given, "--shutdown-timeout", float, 0.0))
    if ns.shutdown_grace != "10.0" and float(ns.shutdown_grace) != timeout:
        raise ConfigError(
            f"--shutdown-grace={ns.shutdown_grace} and --shutdown-timeout={given} are the same setting: give one"
        )
    return timeout


def _filters(text: str | None) -> tuple[str, ...]:
    """`--duplicate-*-filters`: comma-separated substrings, a doubled comma standing for a comma."""
    if not text:
        return ()
    marker = "\0"
    return tuple(part.replace(marker, ",") for part in str(text).replace(",,", marker).split(",") if part)


def _signals(text: str) -> tuple[str, ...]:
    """`--signals-to-handle`: signal names, checked (SIGKILL and SIGSTOP cannot be handled)."""
    names = tuple(name.strip().upper() for name in str(text).split(",") if name.strip())
    for name in names:
        if name not in signal.Signals.__members__:
            raise ConfigError(f"--signals-to-handle: {name!r} is not a signal name (e.g. SIGTERM,SIGUSR1)")
        if name in ("SIGKILL", "SIGSTOP"):
            raise ConfigError(f"--signals-to-handle: {name} cannot be handled")
    return names


def _directory(value: str, flag: str) -> str:
    """An existing directory, made absolute (workers and the saver host resolve it alike)."""
    path = os.path.abspath(str(value))
    if not os.path.isdir(path):
        raise ConfigError(f"{flag} must be an existing directory, got {value!r}")
    return path


def _run_id(value: str) -> str:
    """`--rdzv-id`, checked: it names the job's log and error-file folder."""
    text = str(value)
    if not text or text in (".", "..") or "/" in text or "\0" in text:
        raise ConfigError(f"--rdzv-id must be a name without '/', got {value!r}")
    return text


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity, as torchrun counts them), else all of them."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _nproc(value: str | None, auto_config: bool, count_accelerators: Callable[[], int], cpus: int) -> int:
    text = "1" if value is None else str(value).lower()
    # Counted only where the flags need the count: counting may import torch (seconds).
    accelerators = count_accelerators() if auto_config or text in ("auto", "gpu") else 0
    if auto_config:
        if value is not None:
            raise ConfigError(
                f"--auto-config sets the workers per node from the visible accelerators; do not also give "
                f"--nproc-per-node={value}"
            )
        return accelerators if accelerators > 0 else 1
    if text == "auto":  # as torchrun: one per accelerator, else one per usable CPU
        return accelerators if accelerators > 0 else max(cpus, 1)
    if text == "gpu":
        if accelerators == 0:
            raise ConfigError("--nproc-per-node=gpu, but no GPU is visible")
        return accelerators
    if text == "cpu":
        return max(cpus, 1)
    return int(_number(text, "--nproc-per-node", int, 1))


_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


DEFAULT_PREWARM = ("torch", "dlrover.flashckpt.checkpointer")
"""What standbys import when `--prewarm` is not given and the worker program is runnable by one.

The module of `FlashCheckpointer` (its client, stager and loaders: 0.04 s to import after torch
on an idle 2-core machine, 0.2 s in a restarting job there) reads no environment variable at
import, so a script may set any before importing it (see `env_guard`).
"""


def _prewarm(text: str | None, modes: list[str]) -> tuple[str, ...]:
    non_runnable = {"--no-python", "--run-path"} & set(modes)
    if text is None:
        # The default: a standby cannot run an executable or a run-path wrapper, so those start fresh.
        return () if non_runnable else DEFAULT_PREWARM
    if str(text).strip().lower() == "none":
        return ()
    modules = tuple(m.strip() for m in str(text).split(",") if m.strip())
    for name in modules:
        # `none` among modules is a mistake, not a module to import (which would fail in every standby).
        if not _MODULE_NAME.fullmatch(name) or name.lower() == "none":
            raise ConfigError(f"--prewarm takes comma-separated module names or none, got {name!r}")
    if modules and non_runnable:
        raise ConfigError(f"--prewarm needs a Python script or -m module; it cannot be used with {modes[0]}")
    return modules


def _conf(text: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for entry in filter(None, (e.strip() for e in str(text).split(","))):
        key, sep, val = entry.partition("=")
        if not sep or not key:
            raise ConfigError(f"--rdzv-conf entries are key=value, got {entry!r}")
        pairs.append((key, val))
    return tuple(pairs)


# torchrun --rdzv-conf keys that mean something to the dlrover backend, and the settings they feed.
_RDZV_CONF_TIMEOUTS = {"join_timeout": "rendezvous_timeout_s", "timeout": "rendezvous_timeout_s"}
_RDZV_CONF_STORE = {"store_timeout": "store_wait_s"}
# Keys of torch's c10d backend that have no meaning here; refused so nobody believes they apply.
_RDZV_CONF_KNOWN = {*_RDZV_CONF_TIMEOUTS, *_RDZV_CONF_STORE}


def _rdzv_timeouts(conf: tuple[tuple[str, str], ...]) -> dict[str, float]:
    settings: dict[str, float] = {}
    for key, value in conf:
        target = _RDZV_CONF_TIMEOUTS.get(key) or _RDZV_CONF_STORE.get(key)
        if target is None:
            raise ConfigError(
                f"--rdzv-conf {key}={value} is not understood by dlrover-run; it knows "
                + ", ".join(sorted(_RDZV_CONF_KNOWN))
            )
        flag = f"--rdzv-conf {key}"
        # The store timeout also becomes the TCPStore's own timeout, which must be finite.
        settings[target] = (
            _finite(value, flag, 0.001) if key in _RDZV_CONF_STORE else float(_number(value, flag, float, 0.001))
        )
    return settings


def _slurm_defaults(ns: argparse.Namespace, env: Mapping[str, str]) -> SlurmStep | None:
    """Fill in a multi-node job from the srun step (`dlrover.launcher.slurm`) when the command line
    names neither the nodes nor where they meet; returns the step used, or None."""
    named = (
        ns.nnodes is not None
        or ns.standalone
        or ns.master
        or ns.rdzv_endpoint
        or ns.rdzv_backend != "dlrover"
        or ns.node_rank not in (None, "")
        or ns.master_addr is not None
        or env.get(MASTER_ADDR_ENV_VAR)
    )
    step = None if named else slurm_step(env)
    if step is None:
        return None
    ns.nnodes = str(step.num_nodes)
    ns.rdzv_backend = "static"
    ns.master_addr = step.first_host
    ns.node_rank = str(step.node_id)
    if ns.rdzv_id == "none":
        ns.rdzv_id = step.run_id
    return step


def parse_args(
    argv: Sequence[str] | None = None,
    *,
    accelerators: int | Callable[[], int] = 0,
    cpus: int | None = None,
    env: Mapping[str, str] | None = None,
) -> LaunchConfig:
    """Parse and validate a `dlrover-run` command line.

    Args:
        argv: the arguments after the program name.
        accelerators: visible GPUs, for `--nproc-per-node=auto|gpu` and `--auto-config`; or what counts
            them, called only for those flags.
        cpus: usable CPUs, for `--nproc-per-node=cpu|auto` (default: this process's affinity).
        env: the environment, for the Slurm step and the ``DLROVER_MASTER_TLS_*`` defaults of the
            `--master-tls-*` flags (default: this process's).

    Raises:
        ConfigError: any flag is out of range or contradicts another; the message names it.
    """
    ns = build_parser().parse_args(argv)
    slurm = _slurm_defaults(ns, os.environ if env is None else env)
    nodes = NodeRange.parse(ns.nnodes or "1:1")
    count = accelerators if callable(accelerators) else lambda: accelerators
    nproc = _nproc(ns.nproc_per_node, ns.auto_config, count, cpus or _usable_cpus())
    modes = [name for name, on in (("-m", ns.module), ("--no-python", ns.no_python), ("--run-path", ns.run_path)) if on]
    if len(modes) > 1:
        raise ConfigError(f"{' and '.join(modes)} cannot be used together")
    if ns.standalone and ns.master:
        raise ConfigError("--standalone starts its own master; do not also give --master")
    if ns.exclude_straggler and not ns.network_check:
        raise ConfigError("--exclude-straggler needs --network-check: stragglers are found by the network check")
    if ns.logs_specs:
        raise ConfigError(
            f"--logs-specs={ns.logs_specs}: torch's LogsSpecs plug-ins are not supported; dlrover-run writes "
            "<log-dir>/<run id>_<unique>/attempt_<n>/<local rank>/{stdout,stderr}.log (see --log-dir, --redirects, "
            "--tee)"
        )
    if ns.numa_binding:
        raise ConfigError(
            f"--numa-binding={ns.numa_binding} is not supported by dlrover-run (torch implements it with private "
            "functions); bind the workers yourself, e.g. --no-python with numactl"
        )
    check_timeout_s = _finite(ns.network_check_timeout, "--network-check-timeout", 0.001)
    results_timeout_s = (
        None
        if ns.network_check_results_timeout in (None, "")
        else _finite(ns.network_check_results_timeout, "--network-check-results-timeout", 0.001)
    )
    if results_timeout_s is not None and results_timeout_s < check_timeout_s:
        raise ConfigError(
            f"--network-check-results-timeout={ns.network_check_results_timeout} must be at least "
            f"--network-check-timeout={ns.network_check_timeout}: nodes wait for each other's probes"
        )
    straggler_factor = _finite(ns.straggler_factor, "--straggler-factor", 1.0)
    node_unit = int(_number(ns.node_unit, "--node-unit", int, 1))
    if nodes.max_nodes % node_unit and nodes.min_nodes == nodes.max_nodes:
        raise ConfigError(f"--nnodes={nodes} is not a multiple of --node-unit={node_unit}")
    node_rank = None if ns.node_rank in (None, "") else int(_number(ns.node_rank, "--node-rank", int, 0))
    master_port = None if ns.master_port in (None, "") else int(_number(ns.master_port, "--master-port", int, 1))
    failure_persist_hold_s = _finite(ns.failure_persist_hold, "--failure-persist-hold", 0.0)
    if ns.save_at_breakpoint and failure_persist_hold_s:
        raise ConfigError(
            f"--save-at-breakpoint persists at once, --failure-persist-hold={ns.failure_persist_hold} holds "
            "the persist back: give one of them"
        )
    keep_last = int(_number(ns.checkpoint_keep_last, "--checkpoint-keep-last", int, 0))
    keep_every = int(_number(ns.checkpoint_keep_every, "--checkpoint-keep-every", int, 0))
    if keep_every and not keep_last:
        raise ConfigError("--checkpoint-keep-every needs --checkpoint-keep-last (keep the last N, and every K-th step)")
    filters = tuple(int(_number(r, "--local-ranks-filter", int, 0)) for r in str(ns.local_ranks_filter).split(",") if r)
    call_timeout_s = _finite(ns.master_call_timeout, "--master-call-timeout", 0.001)
    call_retry_s = _finite(ns.master_call_retry, "--master-call-retry", 0.001)
    if call_retry_s < call_timeout_s:
        raise ConfigError(
            f"--master-call-retry={ns.master_call_retry} must be at least --master-call-timeout="
            f"{ns.master_call_timeout}: a call is retried within it"
        )
    return LaunchConfig(
        nodes=nodes,
        nproc_per_node=nproc,
        entrypoint=ns.training_script,
        entrypoint_args=tuple(ns.training_script_args),
        run_as_module=ns.module,
        no_python=ns.no_python,
        run_path=ns.run_path,
        standalone=ns.standalone,
        master=ns.master,
        rdzv_backend=ns.rdzv_backend,
        rdzv_endpoint=ns.rdzv_endpoint,
        rdzv_id=_run_id(ns.rdzv_id),
        rdzv_conf=_conf(ns.rdzv_conf),
        max_restarts=int(_number(ns.max_restarts, "--max-restarts", int, 0)),
        monitor_interval_s=float(_number(ns.monitor_interval, "--monitor-interval", float, 0.001)),
        role=ns.role,
        log_dir=ns.log_dir,
        log_cleanup=LogCleanup.parse(ns.log_cleanup),
        log_max_mb=_finite(ns.log_max_mb, "--log-max-mb", 0.0),
        redirects=tuple(sorted(parse_std_streams(ns.redirects, nproc, "--redirects").items())),
        tee=tuple(sorted(parse_std_streams(ns.tee, nproc, "--tee").items())),
        local_ranks_filter=filters,
        node_rank=node_rank,
        master_addr=ns.master_addr or "127.0.0.1",
        master_port=master_port,
        local_addr=ns.local_addr,
        network_check=ns.network_check,
        exclude_straggler=ns.exclude_straggler,
        network_check_timeout_s=check_timeout_s,
        network_check_results_timeout_s=results_timeout_s,
        straggler_factor=straggler_factor,
        save_at_breakpoint=ns.save_at_breakpoint,
        failure_persist_hold_s=failure_persist_hold_s,
        checkpoint_keep_last=keep_last,
        checkpoint_keep_every=keep_every,
        persist_bandwidth_mb_s=_rate_or_auto(ns.persist_bandwidth_mb_s, "--persist-bandwidth-mb-s"),
        node_unit=node_unit,
        hang_timeout_s=float(_number(ns.hang_timeout, "--hang-timeout", float, 0.0)),
        hang_step_factor=_finite(ns.hang_step_factor, "--hang-step-factor", 0.0),
        hang_step_floor_s=_finite(ns.hang_step_floor, "--hang-step-floor", 0.001),
        hang_first_steps_s=_finite(ns.hang_first_steps, "--hang-first-steps", 0.001),
        hang_checkpoint_s=_finite(ns.hang_checkpoint_allowance, "--hang-checkpoint-allowance", 0.001),
        hang_eval_s=_finite(ns.hang_eval_allowance, "--hang-eval-allowance", 0.001),
        hang_wait_s=_finite(ns.hang_wait_allowance, "--hang-wait-allowance", 0.001),
        stack_dump_timeout_s=_finite(ns.stack_dump_timeout, "--stack-dump-timeout", 0.001),
        hang_busy_probe_s=_finite(ns.hang_busy_probe, "--hang-busy-probe", 0.0),
        runtime_straggler_factor=_finite(ns.runtime_straggler_factor, "--runtime-straggler-factor", 1.0),
        straggler_action=_straggler_action(ns.straggler_action),
        auto_config=ns.auto_config,
        token=ns.token,
        token_file=ns.token_file,
        heartbeat_interval_s=(
            None
            if ns.heartbeat_interval in (None, "")
            else float(_number(ns.heartbeat_interval, "--heartbeat-interval", float, 0.01))
        ),
        master_lost_timeout_s=float(_number(ns.master_lost_timeout, "--master-lost-timeout", float, 0.0)),
        master_call_timeout_s=call_timeout_s,
        master_call_retry_s=call_retry_s,
        round_save_timeout_s=_finite(ns.round_save_timeout, "--round-save-timeout", 0.0),
        waiting_check_interval_s=_finite(ns.waiting_check_interval, "--waiting-check-interval", 0.0),
        **_rdzv_timeouts(_conf(ns.rdzv_conf)),
        shutdown_grace_s=_shutdown_grace(ns),
        signals_to_handle=_signals(ns.signals_to_handle),
        duplicate_stdout_filters=_filters(ns.duplicate_stdout_filters),
        duplicate_stderr_filters=_filters(ns.duplicate_stderr_filters),
        virtual_local_rank=ns.virtual_local_rank,
        event_log_handler=str(ns.event_log_handler),
        start_method=str(ns.start_method),
        prewarm=_prewarm(ns.prewarm, modes),
        prewarm_refill_after_s=_finite(ns.prewarm_refill_after, "--prewarm-refill-after", 0.0),
        prewarm_join_wait_s=_finite(ns.prewarm_join_wait, "--prewarm-join-wait", 0.0),
        worker_reap_timeout_s=_finite(ns.worker_reap_timeout, "--worker-reap-timeout", 0.0),
        exit_barrier_timeout_s=_finite(ns.exit_barrier_timeout, "--exit-barrier-timeout", 0.0),
        exit_barrier_poll_timeout_s=_finite(ns.exit_barrier_poll_timeout, "--exit-barrier-poll-timeout", 0.001),
        resource_sample_interval_s=_finite(ns.resource_sample_interval, "--resource-sample-interval", 0.0),
        checkpoint_stop_timeout_s=_finite(ns.checkpoint_stop_timeout, "--checkpoint-stop-timeout", 0.001),
        checkpoint_shm_dir=_directory(ns.checkpoint_shm_dir, "--checkpoint-shm-dir"),
        slurm=slurm,
        node_resources=_node_resources(ns),
        master_tls=_master_tls(ns, os.environ if env is None else env),
    )
