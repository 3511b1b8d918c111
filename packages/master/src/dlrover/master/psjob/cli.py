"""`dlrover-master ps-job`: run a TensorFlow parameter-server job on this host or on Kubernetes.

    dlrover-master ps-job --ps 2 --workers 2 --work-dir /tmp/job -- python train.py --out /tmp/job/out
    dlrover-master ps-job --backend kubernetes --kube-namespace ml --kube-job rec --ps 2 --workers 2 --work-dir /state

On this host (`--backend local`) every task is a process listening on 127.0.0.1 at a port it keeps for the whole
job; the chief runs the program after `--`; parameter servers and workers run TensorFlow's server. On Kubernetes
every task is a pod made from its role's template in the ElasticJob (`spec.replicaSpecs.{chief,ps,worker,
evaluator}`), with the DNS name `<job>-<role>-<index>.<job>-tasks.<namespace>.svc` for the whole job; the chief runs
its template's command, and a parameter server or worker whose template gives no command runs TensorFlow's server.
The master uses the job token its pods read from the Secret `<job>-token` (`--token-file`, else
`$DLROVER_JOB_TOKEN_FILE` or `$DLROVER_JOB_TOKEN`).

The job ends when the chief's program exits 0 (exit status 0) or when a task fails past its relaunches (exit status
1); SIGTERM or SIGINT stops it (exit status 3), `dlrover-master stop` too. On Kubernetes a signal is the master's pod
going away, not the job's end: its tasks are stopped and it exits 128 + the signal, for the master that replaces it
to start the job again. A master that cannot start exits 2 (bad flags or spec) or 75 (a passing reason: the
cluster could not be reached, a predecessor's tasks did not end in time; start it again later). Its events are in
`<work-dir>/events.jsonl`; on this host each task's output is in `<work-dir>/logs/`.

A job given none of `--ps`, `--workers`, `--min-workers` and the `--{role}-cpu/memory` flags is sized from the
profile of the most similar earlier PS job in the profile store (`--profile-store`), else it runs one parameter
server and one worker asking for nothing; every job records its own profile there when it ends.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

import attrs

from dlrover.autoscale import HotPsConfig, PsPlanConfig, Resources, Role
from dlrover.common import ConfigError, DLRoverError, configure_logging, find_token, load_token
from dlrover.master.exits import start_failure
from dlrover.master.launch_retry import add_launch_retry_flags, launch_retry_settings
from dlrover.master.profiles import add_profile_flags, resolve_profile_store
from dlrover.master.psjob.flash import DEFAULT_FLASH_ROOT
from dlrover.master.psjob.plan import DEFAULT_PS_JOB_NAME, PsPlanChoice, plan_ps_job, ps_signature
from dlrover.master.psjob.runner import PsJobConfig, PsJobMaster
from dlrover.master.psjob.spec import PS_ROLES, PsJobSpec
from dlrover.master.resource_flags import memory_flag, resources_from_flags
from dlrover.master.scheduler.base import SchedulerBackend
from dlrover.master.scheduler.kubernetes.flags import add_kubernetes_flags, kubernetes_settings

__all__ = ["main"]

EXIT_STOPPED = 3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dlrover-master ps-job",
        description="Run a TensorFlow parameter-server job (chief, parameter servers, workers) on this host or on "
        "Kubernetes.",
        epilog="Everything after -- is the chief's program, e.g. -- python train.py --epochs 2 (local backend; on "
        "Kubernetes the chief runs its template's command)",
    )
    p.add_argument("--backend", choices=("local", "kubernetes"), default="local", help="who runs the tasks")
    p.add_argument(
        "--bind-address",
        default=None,
        help="the interface the master serves on (default: 127.0.0.1 locally, 0.0.0.0 on kubernetes)",
    )
    p.add_argument("--token-file", default=None,
                   help="a 0600 file holding the job token (kubernetes: the token of the Secret <job>-token, which "
                   "the pods read; default $DLROVER_JOB_TOKEN_FILE or $DLROVER_JOB_TOKEN); locally a new token is "
                   "made unless this is given")  # fmt: skip
    p.add_argument("--ps", type=int, default=None, help="parameter servers (default: planned, else 1)")
    p.add_argument("--workers", type=int, default=None, help="workers (default: planned, else 1)")
    p.add_argument("--min-workers", type=int, default=None,
                   help="the job goes on while this many workers run (default: --workers)")  # fmt: skip
    p.add_argument("--evaluator", action=argparse.BooleanOptionalAction, default=None,
                   help="also run the program as an evaluator (default: as a planned job had, else not)")  # fmt: skip
    p.add_argument("--max-relaunches", type=int, default=3, help="relaunches per task (default 3)")
    p.add_argument("--standby-tasks", action=argparse.BooleanOptionalAction, default=None,
                   help="keep the next chief and parameter server started, TensorFlow imported, so a relaunched one "
                   "starts at once (default: on locally; the kubernetes backend has none)")  # fmt: skip
    p.add_argument("--standby-refill", type=float, default=10.0,
                   help="seconds after a chief's or server's launch before its role's next standby starts")  # fmt: skip
    p.add_argument("--predecessor-margin", type=float, default=30.0,
                   help="kubernetes: seconds past --stop-grace a replaced master's tasks may take to end")  # fmt: skip
    p.add_argument("--lost-pod-margin", type=float, default=30.0,
                   help="kubernetes: seconds past its deletion's grace after which a stopped task's pod on a lost node "
                   "counts as ended (and is deleted with no grace)")  # fmt: skip
    p.add_argument("--work-dir", required=True, help="the job's token, event log and task logs")
    p.add_argument("--job-name", default=DEFAULT_PS_JOB_NAME)
    p.add_argument("--port", type=int, default=0, help="the master's gRPC port (default: any free one)")
    p.add_argument("--tick-interval", type=float, default=0.2, help="seconds between looks at the tasks")
    p.add_argument("--stop-grace", type=float, default=5.0, help="seconds a stopped task has before SIGKILL")
    add_launch_retry_flags(p)
    p.add_argument(
        "--task-start-timeout",
        type=float,
        default=600.0,
        help="seconds a launched task may take to start running before it is relaunched (0: forever)",
    )
    p.add_argument("--oom-memory-growth", type=float, default=1.5,
                   help="a task killed for memory comes back with its memory times this")  # fmt: skip
    p.add_argument("--max-task-memory", default=None, help="the most memory an OOM relaunch may grow a task to")
    for role in PS_ROLES:
        p.add_argument(f"--{role.value}-cpu", default=None, help=f"CPU cores per {role.value} task")
        p.add_argument(
            f"--{role.value}-memory",
            default=None,
            help=f"memory per {role.value} task (2048, 512Mi, 8Gi); enforced where the host allows",
        )
    p.add_argument("--hot-ps", choices=("off", "on"), default="off",
                   help="add a parameter server when one stays hot (needs --ps-cpu); the job restarts from the "
                   "chief's checkpoint with the model re-partitioned")  # fmt: skip
    p.add_argument("--hot-ps-cpu-ratio", type=float, default=0.9, help="CPU used / --ps-cpu at which a PS is hot")
    p.add_argument("--hot-ps-duration", type=float, default=300.0, help="seconds a PS must stay hot")
    p.add_argument("--hot-ps-interval", type=float, default=10.0, help="seconds between looks at the PS load")
    p.add_argument("--hot-ps-warmup", type=float, default=60.0, help="seconds of a PS's start its CPU is not counted")
    p.add_argument("--hot-ps-idle", type=float, default=10.0,
                   help="seconds without acknowledged samples after which the job counts as not training")  # fmt: skip
    p.add_argument("--max-ps", type=int, default=16,
                   help="the most parameter servers --hot-ps, --ps-state-ratio or a plan may grow to")  # fmt: skip
    p.add_argument("--checkpoint-dir", default=None,
                   help="the storage the chief's TensorFlow checkpoints persist in (default: <work-dir>/checkpoints); "
                   "the chief saves where $DLROVER_CHECKPOINT_DIR says: a memory directory copied here in the "
                   "background (--flash-root), else here; the master reads the model's size from the newest "
                   "one")  # fmt: skip
    p.add_argument("--flash-root", default=DEFAULT_FLASH_ROOT,
                   help="local backend: the memory file system the chief saves its checkpoints in while it has room "
                   "for them, each copied to --checkpoint-dir in the background ('off': straight to "
                   "--checkpoint-dir; default /dev/shm)")  # fmt: skip
    p.add_argument("--flash-reserve", type=int, default=1024,
                   help="MiB --flash-root keeps free beyond room for the checkpoints (default 1024)")  # fmt: skip
    p.add_argument("--flash-last-copy-timeout", type=float, default=600.0,
                   help="seconds the last copy of the checkpoints in memory to --checkpoint-dir may take (at the "
                   "end, or before the chief moves to storage); past it they are kept in memory (default "
                   "600)")  # fmt: skip
    p.add_argument("--ps-state-ratio", type=float, default=None,
                   help="add a parameter server when a checkpoint shows one holding more of the model's state than "
                   "this fraction of --ps-memory (default: never)")  # fmt: skip
    add_profile_flags(p, sized_by="none of --ps, --workers, --min-workers and --{role}-cpu/memory")
    p.add_argument("--log-level", default=None)
    add_kubernetes_flags(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- PROGRAM [ARGS...]: what the chief runs")
    return p


def _size(
    args: argparse.Namespace, command: list[str], profile_store: str | None, cap: int | None, wall_time: float
) -> tuple[int, int, int, bool, dict[Role, Resources], PsPlanChoice]:
    """(ps, workers, min_workers, evaluator, resources, where they came from): the flags', or a plan's when the job
    gave none of them."""
    resources: dict[Role, Resources] = {}
    for role in PS_ROLES:
        cpu, memory = getattr(args, f"{role.value}_cpu"), getattr(args, f"{role.value}_memory")
        given = resources_from_flags(cpu, memory, None, None, prefix=f"--{role.value}")
        if given is not None:
            resources[role] = given
    counts = {"--ps": args.ps, "--workers": args.workers, "--min-workers": args.min_workers}
    flags = [name for name, value in counts.items() if value is not None]
    flags += [f"--{role.value}-cpu/memory" for role in resources]
    if flags:
        workers = 1 if args.workers is None else args.workers
        reason = f"sized by the flags given ({', '.join(flags)}); no profile was consulted"
        return (1 if args.ps is None else args.ps, workers, workers if args.min_workers is None else args.min_workers,
                bool(args.evaluator), resources, PsPlanChoice("flags", reason))  # fmt: skip
    config = PsPlanConfig(max_task_memory_mb=cap, max_ps=args.max_ps)
    signature = ps_signature(args.job_name, command, args.job_kind)
    plan, choice = plan_ps_job(profile_store, signature, config, wall_time=wall_time)
    evaluator = plan.evaluator if args.evaluator is None else args.evaluator
    return plan.ps, plan.workers, plan.min_workers, evaluator, dict(plan.resources), choice


def _defaults_instead(spec: PsJobSpec, choice: PsPlanChoice, why: str) -> tuple[PsJobSpec, PsPlanChoice]:
    """The defaults (one server, one worker, nothing asked) for a job whose planned size cannot be used."""
    reason = f"{why}; starting from the defaults instead, 1 PS and 1 worker(s), nothing asked"
    defaults = attrs.evolve(spec, ps=1, workers=1, min_workers=1, resources={})
    return defaults, PsPlanChoice("defaults", reason, None, choice.store_notice)


def _given_command(args: argparse.Namespace) -> list[str]:
    command = list(args.command)
    return command[1:] if command[:1] == ["--"] else command


def _token(args: argparse.Namespace) -> str | None:
    """The job token the flags give (on kubernetes also the environment's: the token of the pods' Secret)."""
    if args.backend == "kubernetes":
        found = find_token(None, token_file=args.token_file)
        if found is None:
            raise ConfigError("--backend kubernetes needs the job token its pods read from the Secret <job>-token: "
                              "--token-file, $DLROVER_JOB_TOKEN_FILE or $DLROVER_JOB_TOKEN")  # fmt: skip
        return found[0]
    return None if args.token_file is None else load_token(token_file=args.token_file)


def build_config(
    args: argparse.Namespace, *, command: Sequence[str] | None = None, wall_time: float | None = None
) -> PsJobConfig:
    """The job `args` describe; sized from the profile store when they give no counts or resources.

    Args:
        args: the parsed flags.
        command: the chief's program; None: the one after `--`.
        wall_time: now (the profiles' age).

    Raises:
        ConfigError: a value is malformed or contradicts another; the message names the flag.
    """
    command = _given_command(args) if command is None else list(command)
    cap = None if args.max_task_memory is None else memory_flag(args.max_task_memory, "--max-task-memory")
    profile_store = resolve_profile_store(args.profile_store)
    now = time.time() if wall_time is None else wall_time
    ps, workers, min_workers, evaluator, resources, choice = _size(args, command, profile_store, cap, now)
    # The budgets first, without the size: a bad flag is the flag's error, never a reason to drop a plan.
    spec = PsJobSpec(
        evaluator=evaluator,
        max_relaunches=args.max_relaunches,
        oom_memory_growth=args.oom_memory_growth,
        max_task_memory_mb=cap,
        task_start_timeout_s=args.task_start_timeout or None,
    )
    try:
        spec = attrs.evolve(spec, ps=ps, workers=workers, min_workers=min_workers, resources=resources)
    except ConfigError as exc:
        if choice.source != "profile":
            raise
        spec, choice = _defaults_instead(spec, choice, f"the planned size cannot be used ({exc})")
    ps_resources = spec.resources.get(Role.PS)
    if args.ps_state_ratio is not None and (ps_resources is None or not ps_resources.memory_mb):
        raise ConfigError("--ps-state-ratio needs --ps-memory: a server's share of the model is weighed against it")
    hot_ps = None
    if args.hot_ps == "on":
        ps_cpu = resources[Role.PS].cpu if Role.PS in resources else 0.0
        if ps_cpu <= 0:
            raise ConfigError("--hot-ps on needs --ps-cpu: a parameter server is hot against its CPU request")
        # This host does not enforce CPU, so a bigger request would change nothing: a hot server is split instead.
        hot_ps = HotPsConfig(hot_cpu_ratio=args.hot_ps_cpu_ratio, hot_duration_s=args.hot_ps_duration,
                             max_node_cpu=ps_cpu, max_ps=args.max_ps)  # fmt: skip
    return PsJobConfig(
        spec=spec,
        hot_ps=hot_ps,
        hot_ps_interval_s=args.hot_ps_interval,
        hot_ps_warmup_s=args.hot_ps_warmup,
        hot_ps_idle_s=args.hot_ps_idle,
        command=tuple(command),
        work_dir=args.work_dir,
        job_name=args.job_name,
        bind_address=args.bind_address or ("0.0.0.0" if args.backend == "kubernetes" else "127.0.0.1"),  # noqa: S104
        standby_tasks=args.backend == "local" if args.standby_tasks is None else args.standby_tasks,
        standby_refill_s=args.standby_refill,
        predecessor_margin_s=args.predecessor_margin,
        token=_token(args),
        port=args.port,
        tick_interval_s=args.tick_interval,
        stop_grace_s=args.stop_grace,
        launch_retry=launch_retry_settings(args),
        checkpoint_dir=args.checkpoint_dir,
        flash_root=None if args.flash_root == "off" else args.flash_root,
        flash_reserve_mb=args.flash_reserve,
        last_copy_timeout_s=args.flash_last_copy_timeout,
        ps_state_ratio=args.ps_state_ratio,
        max_ps=args.max_ps,
        profile_store=profile_store,
        job_kind=args.job_kind,
        initial_plan=choice,
    )


def _kubernetes_backend(args: argparse.Namespace) -> tuple[SchedulerBackend, list[str]]:
    """The Kubernetes backend of the ElasticJob the flags name, and the chief's command (its template's).

    Raises:
        ConfigError: the flags or the ElasticJob cannot run a parameter-server job.
        SchedulerError: the cluster cannot be reached.
    """
    if _given_command(args):
        raise ConfigError("on kubernetes the chief runs the command of its template (spec.replicaSpecs.chief), not "
                          "one after --")  # fmt: skip
    # The worker jobs' Kubernetes flags that mean nothing here: refused rather than ignored.
    if args.standby_tasks:
        raise ConfigError("--standby-tasks: a standby is told to start through a FIFO in the master's work "
                          "directory, which pods cannot see: the local backend only")  # fmt: skip
    defaults = _parser()
    unused = [f"--{dest.replace('_', '-')}" for dest in ("kube_node_state_mb", "kube_gpu_resource",
                                                          "kube_gpu_type_label", "kube_tls_secret", "flash_root",
                                                          "flash_reserve", "flash_last_copy_timeout")
              if getattr(args, dest) != defaults.get_default(dest)
              and (dest, getattr(args, dest)) != ("flash_root", "off")]  # fmt: skip
    if unused:
        raise ConfigError(f"{', '.join(unused)}: not for a parameter-server job on kubernetes (its tasks ask only "
                          "cpu and memory, share no memory to save checkpoints in, and its master serves no "
                          "TLS)")  # fmt: skip
    settings = kubernetes_settings(args, tls_cert=None, stop_grace_s=args.stop_grace, tf_tasks=True)
    assert settings is not None
    settings = attrs.evolve(settings, lost_pod_margin_s=args.lost_pod_margin)
    if args.checkpoint_dir is None:
        raise ConfigError("--backend kubernetes needs --checkpoint-dir: storage the master and the chief both see at "
                          "that path (the ElasticJob's spec.checkpoint.volume is mounted at /checkpoints in every "
                          "task); the default, under --work-dir, is the master's own")  # fmt: skip
    from dlrover.master.scheduler.kubernetes.backend import KubernetesScheduler  # the k8s extra

    scheduler = KubernetesScheduler.from_cluster(settings)
    try:
        command = scheduler.templates.command_of("chief")
        if args.job_name == DEFAULT_PS_JOB_NAME:
            args.job_name = settings.job  # the ElasticJob names the job
    except BaseException:
        scheduler.close()
        raise
    return scheduler, command


def _master(args: argparse.Namespace) -> PsJobMaster:
    """The job's master on the backend the flags choose (its planned size, else the defaults, where a node could
    not hold the plan)."""
    scheduler: SchedulerBackend | None = None
    command = None
    if args.backend == "kubernetes":
        scheduler, command = _kubernetes_backend(args)
    elif any(getattr(args, name) is not None for name in ("kube_namespace", "kube_job")):
        raise ConfigError("--kube-namespace and --kube-job are for --backend kubernetes")
    try:
        config = build_config(args, command=command)
        try:
            return PsJobMaster(config, scheduler=scheduler)
        except ConfigError as exc:  # a planned size no node of the backend could give
            if config.initial_plan is None or config.initial_plan.source != "profile":
                raise
            spec, choice = _defaults_instead(
                config.spec, config.initial_plan, f"the planned size cannot be used ({exc})"
            )
            return PsJobMaster(attrs.evolve(config, spec=spec, initial_plan=choice), scheduler=scheduler)
    except BaseException:
        if scheduler is not None:
            scheduler.close()
        raise


def main(argv: Sequence[str]) -> int:
    """Entry point of `dlrover-master ps-job`."""
    args = _parser().parse_args(list(argv))
    try:
        configure_logging(args.log_level)
        master = _master(args)
    except DLRoverError as exc:
        print(f"dlrover-master ps-job: {exc}", file=sys.stderr)
        return start_failure(exc)
    cancel = threading.Event()
    signalled: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        signalled.append(signum)
        cancel.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        master.start()
        print(f"dlrover-master ps-job: serving on {master.address}; events in {master.event_log}", flush=True)
        outcome = master.run(cancel=cancel)
    except DLRoverError as exc:
        print(f"dlrover-master ps-job: {exc}", file=sys.stderr)
        return start_failure(exc)
    finally:
        master.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if outcome is None and master.stop_reason is None and args.backend == "kubernetes":
        # The master's pod was deleted or evicted: the job is not over; the master that replaces this one starts
        # it again from the chief's checkpoint (an ended job is stopped through `stop`, a suspend or its deletion).
        print("dlrover-master ps-job: stopped by a signal; the job goes on under the master that replaces this one",
              flush=True)  # fmt: skip
        return 128 + (signalled[0] if signalled else signal.SIGTERM)
    if outcome is None:
        print(f"job stopped: {master.stop_reason or 'the master received a stop signal'}", flush=True)
        return EXIT_STOPPED
    print(f"job {'succeeded' if outcome.succeeded else 'failed'}: {outcome.reason}", flush=True)
    return 0 if outcome.succeeded else 1
