"""`create_master(config)`: build a master and everything it needs from a `MasterConfig`."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from dlrover.common import (
    TOKEN_ENV_VAR,
    TOKEN_FILE_ENV_VAR,
    Clock,
    ConfigError,
    ServerConfig,
    SystemClock,
    add_ping_service,
    generate_token,
    load_token,
    write_token_file,
)
from dlrover.diagnosis import ActionPolicy, PolicyConfig
from dlrover.master.agent_tls import agent_tls_env
from dlrover.master.config import MasterConfig
from dlrover.master.diagnosis_policy import DiagnosisFailurePolicy
from dlrover.master.eventlog import EventLog
from dlrover.master.hosting import HostedRendezvous, HostedShards
from dlrover.master.identity import NodeAuthenticator
from dlrover.master.journal import MemoryJournal, SqliteJournal, StateJournal
from dlrover.master.master import LoggedCollaborator, Master, NodeMembership, StatefulCollaborator
from dlrover.master.metrics import MasterMetrics
from dlrover.master.policy import DefaultFailurePolicy, FailurePolicy
from dlrover.master.profiles import ProfileRecorder
from dlrover.master.runtime import MasterRuntime, ServiceRegistration
from dlrover.master.scheduler.base import MASTER_ADDR_ENV_VAR, HandsOverNodes, SchedulerBackend, check_node_fits
from dlrover.master.scheduler.cgroups import detect_memory_groups
from dlrover.master.scheduler.external import ExternalScheduler
from dlrover.master.scheduler.local import LocalScheduler
from dlrover.master.statedir import StateDirLock
from dlrover.rendezvous import RendezvousManager
from dlrover.shard import ShardRegistry

__all__ = ["MASTER_ADDR_ENV_VAR", "create_master", "default_policy", "resolve_token"]

_log = logging.getLogger(__name__)

TOKEN_FILE_NAME = "token"  # noqa: S105 (a file name, not a secret)
NODE_SECRET_FILE_NAME = "node-secret"  # noqa: S105 (a file name, not a secret)
EVENT_LOG_NAME = "events.jsonl"


def resolve_token(config: MasterConfig) -> tuple[str, str | None]:
    """The job token and the file agents read it from (None when it is not in a file).

    Order: `config.token`; `config.token_file`; the environment; `<state_dir>/token` from an
    earlier run (so a restarted master accepts the agents it had); a fresh token, written to
    `<state_dir>/token` (mode 0600) when there is a state directory.

    Raises:
        AuthError: a token was given but is unusable, or a token file is unsafe.
    """
    if config.token is not None:
        return load_token(config.token), None
    if config.token_file is not None:
        return load_token(token_file=config.token_file), config.token_file
    if os.environ.get(TOKEN_FILE_ENV_VAR) or os.environ.get(TOKEN_ENV_VAR):
        return load_token(), os.environ.get(TOKEN_FILE_ENV_VAR) or None
    if config.state_dir is not None:
        state = Path(config.state_dir)
        state.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = state / TOKEN_FILE_NAME
        if path.exists():
            return load_token(token_file=path), str(path)
        token = generate_token()
        write_token_file(path, token)
        return token, str(path)
    return generate_token(), None


def resolve_node_secret(config: MasterConfig) -> str:
    """The key of node credentials: `<state_dir>/node-secret` (created 0600 on first start), or
    a fresh in-memory secret for a master without a state directory (it cannot resume anyway).
    """
    if config.state_dir is None:
        return generate_token()
    path = Path(config.state_dir) / NODE_SECRET_FILE_NAME
    if path.exists():
        return load_token(token_file=path)
    Path(config.state_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    secret = generate_token()
    write_token_file(path, secret)
    return secret


def _scheduler(config: MasterConfig) -> SchedulerBackend:
    if config.backend == "external":
        return ExternalScheduler()
    if config.backend == "kubernetes" and config.kubernetes is not None:
        # Lazily: the official client is the `k8s` extra. Reads the ElasticJob and lists its pods.
        from dlrover.master.scheduler.kubernetes import KubernetesScheduler

        return KubernetesScheduler.from_cluster(config.kubernetes)
    log_dir = Path(config.state_dir) / "logs" if config.state_dir else None
    if config.backend == "ray":
        # Lazily: Ray is the `ray` extra. Connects to the cluster and checks a node can hold an agent.
        from dlrover.master.scheduler.ray import RayScheduler, RaySettings

        return RayScheduler.connect(
            config.agent_command,
            config.ray or RaySettings(),
            job_name=config.job_name,
            node_resources=config.lifecycle.node_resources,
        )
    if not config.agent_command:
        raise ConfigError("the local backend needs agent_command (the agent to run per node)")
    # One child memory cgroup per node where this host allows it; else the master says why at start.
    return LocalScheduler(
        config.agent_command,
        stop_grace_s=config.node_stop_grace_s,
        log_dir=log_dir,
        memory_groups=detect_memory_groups(),
        slots=config.local_slots,
        capacity_file=config.capacity_file,
    )


def _agent_tls_env(config: MasterConfig) -> dict[str, str]:
    """The TLS variables of the agents the master starts (`dlrover.master.agent_tls`): the local
    backend's only, as its agents share the master's host and so its file paths.

    Raises:
        ConfigError: agent TLS settings for another backend, or as `agent_tls_env`.
    """
    if config.backend != "local":
        if config.agent_tls is not None:
            raise ConfigError(f"--agent-tls-* are for the local backend's agents, not the {config.backend} backend's")
        return {}
    return agent_tls_env(config.tls, config.agent_tls)


def default_policy(config: MasterConfig) -> FailurePolicy:
    """The failure policy `config.failure_policy` names (`diagnosis` unless told otherwise)."""
    if config.failure_policy == "default":
        return DefaultFailurePolicy()
    actions = PolicyConfig(max_node_relaunches=config.node_relaunch_limit, budget_window=config.lifecycle.budget_window)
    return DiagnosisFailurePolicy(actions=ActionPolicy(actions))


def _release_unstarted(backend: SchedulerBackend) -> None:
    """Release the backend of a master that could not be built. Nodes that outlive a master may be a
    running job's (a replacement master refused at start): they are left to the next master, which adopts
    them, rather than taken down."""
    if isinstance(backend, HandsOverNodes):
        backend.detach()
    else:
        backend.close()


def create_master(
    config: MasterConfig,
    *,
    scheduler: SchedulerBackend | None = None,
    clock: Clock | None = None,
    policy: FailurePolicy | None = None,
    collaborators: Sequence[StatefulCollaborator] = (),
    extra_services: Sequence[ServiceRegistration] = (),
    host_libraries: bool = True,
) -> MasterRuntime:
    """Build a master with its journal, scheduler, metrics, event log and server (not started).

    With a state directory, the master first locks it (`dlrover.master.statedir`): a second
    master on a directory another one holds is refused with `StateDirInUseError`, naming the
    holder, before it reads or writes anything there. The runtime holds the lock until `stop()`.

    By default the server also hosts the job's RendezvousService (rounds from `config`'s nnodes,
    node_unit and rendezvous timeouts) and ShardService, on the same address and token as
    AgentService; both are journaled and restored, and let go of nodes the master fails or
    removes (see `dlrover.master.hosting`). They are `runtime.rendezvous` and `runtime.shards`.

    Args:
        config: the configuration.
        scheduler: overrides the backend named in `config`.
        clock: the time source (the system clock by default).
        policy: the failure policy; when None, the one `config.failure_policy` names (the
            diagnosis policy by default, `DefaultFailurePolicy` for `default`).
        collaborators: more libraries whose state is journaled.
        extra_services: more services hosted on the master's server.
        host_libraries: host the rendezvous and shard services (False: an embedder hosts its own).

    Returns:
        A runtime; `start()` it (or use it as a context manager).

    Raises:
        StateDirInUseError: another master holds `config.state_dir`.
        ConfigError, AuthError, JournalError: the configuration cannot be served (a
            `StateDirError` when the state directory is unusable; a `ConfigError` naming the value when
            the node resources exceed what any node of the backend can have).
    """
    the_clock = clock or SystemClock()
    # Before anything in the state directory is read or written: a second master on a live
    # directory must leave its journal, event log, token and secret exactly as they are.
    state_lock = (
        StateDirLock.acquire(config.state_dir, job_name=config.job_name, clock=the_clock) if config.state_dir else None
    )
    journal: StateJournal | None = None
    event_log: EventLog | None = None
    backend: SchedulerBackend | None = None
    holder: list[MasterRuntime] = []

    def agent_env() -> dict[str, str]:
        env = {
            MASTER_ADDR_ENV_VAR: holder[0].address if holder else "",
            "DLROVER_JOB_NAME": config.job_name,
            **tls_env,
        }
        if token_file is not None:
            env[TOKEN_FILE_ENV_VAR] = str(Path(token_file).resolve())
        else:
            env[TOKEN_ENV_VAR] = token
        return env

    try:
        token, token_file = resolve_token(config)
        tls_env = _agent_tls_env(config)
        journal = (
            SqliteJournal(config.state_dir, busy_timeout_s=config.journal_busy_timeout_s)
            if config.state_dir
            else MemoryJournal()
        )
        log_path = config.event_log or (str(Path(config.state_dir) / EVENT_LOG_NAME) if config.state_dir else None)
        event_log = EventLog(log_path) if log_path else None
        backend = scheduler or _scheduler(config)
        # Before anything is launched: resources no node of this backend can ever have are refused.
        check_node_fits(backend, config.lifecycle.node_resources)
        rendezvous: HostedRendezvous | None = None
        shards: HostedShards | None = None
        hosted: list[HostedRendezvous | HostedShards] = []
        if host_libraries:
            rendezvous = HostedRendezvous(RendezvousManager(config.rendezvous_config()), the_clock)
            # Journaling before each answer makes an acknowledged sample survive a master restart;
            # an in-memory journal (no state dir) dies with the master, so it would only cost every
            # shard request an export of the whole progress (the standalone master's heaviest work).
            shards = HostedShards(
                ShardRegistry(the_clock),
                journal_every_change=config.journal_shard_changes and config.state_dir is not None,
            )
            _log.info(
                "shard progress is journaled %s",
                "before each answer" if shards.journals_every_change else "on the state export cadence",
            )
            hosted = [rendezvous, shards]
        membership: list[NodeMembership] = list(hosted)
        journaled: list[StatefulCollaborator | LoggedCollaborator] = [*hosted]
        if rendezvous is not None:
            journaled.append(rendezvous.kv_state)
        if isinstance(backend, StatefulCollaborator):
            journaled.append(backend)  # the local backend's processes, re-adopted after a restart
        master = Master(
            config,
            backend,
            journal,
            the_clock,
            policy=policy or default_policy(config),
            collaborators=[*journaled, *collaborators],
            metrics=MasterMetrics(config.job_name),
            event_log=event_log,
            agent_env=agent_env,
            membership=membership,
            profile_recorder=ProfileRecorder(config.profile_store) if config.profile_store else None,
        )
        for library in hosted:
            library.attach(master)
        runtime = MasterRuntime(
            master,
            token=token,
            server_config=ServerConfig(
                bind_address=config.bind_address,
                port=config.port,
                max_workers=config.max_workers,
                max_message_bytes=config.max_message_bytes,
                tls=config.tls,
                refusal_log_interval_s=config.refusal_log_interval_s,
            ),
            authenticator=NodeAuthenticator(resolve_node_secret(config), config.job_name),
            scheduler=backend,
            journal=journal,
            tick_interval_s=config.tick_interval_s,
            min_tick_gap_s=config.min_tick_gap_s,
            extra_services=[
                *(library.register for library in hosted),
                *((add_ping_service,) if config.serve_ping else ()),
                *extra_services,
            ],
            rendezvous=rendezvous,
            shards=shards,
            metrics_bind_address=config.metrics_bind_address,
            metrics_port=config.metrics_port,
            event_log=event_log,
            token_file=token_file,
            state_lock=state_lock,
            clock=the_clock,
        )
    except BaseException:
        # Nothing started yet; release what was opened so a refused configuration leaks nothing.
        if journal is not None:
            journal.close()
        if event_log is not None:
            event_log.close()
        if backend is not None and scheduler is None:
            _release_unstarted(backend)
        if state_lock is not None:
            state_lock.release()
        raise
    holder.append(runtime)
    return runtime
