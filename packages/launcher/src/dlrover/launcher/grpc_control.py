"""`ControlPlane` over gRPC: the master's AgentService and its RendezvousService.

Ids: the master numbers nodes (int); the rendezvous and the shard service know a node by the
decimal string of that number, so one id follows a node everywhere.

The round's torch.distributed store (MASTER_ADDR/MASTER_PORT) is made known by the agent of node
rank 0 once a round completes. As torchrun does, that agent hosts a fresh store for the round:
`next_round(..., open_store=...)` calls `open_store(local_addr)`, which returns the port of a
server bound to port 0 that already listens, and only then publishes the address in the
rendezvous key-value store under the round's key (`store_address_key`), so no worker of any node
can start before the store listens and no other process can take the port in between. Without
`open_store` (tests with fake workers) it publishes a port that was free a moment ago, for worker
rank 0 to host the store. The published value says which it is (`agent_store`), so every node
sets `TORCHELASTIC_USE_AGENT_STORE` alike. The other agents wait for that key. A new round gets a
new key, so a stale address is never reused.

A node whose workers of a round succeeded sets `finished_key(round, its rank)` before it reports
success to the master; node rank 0's agent reads those marks (`finished_ranks`) to keep the
round's store open until every node is done with it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable, Sequence

import grpc

from dlrover.common import (
    ChannelConfig,
    Clock,
    ConfigError,
    DLRoverError,
    RetryPolicy,
    RpcError,
    SystemClock,
    master_channel_config,
    parse_host_port,
)
from dlrover.diagnosis import NODE_CHECK_FAILED, ActionKind, Decision, PeerExcuse, reported_kind
from dlrover.launcher.control import (
    FailureReport,
    MasterAction,
    NodeRegistration,
    Progress,
    RoundAssignment,
)
from dlrover.launcher.inprocess import free_port
from dlrover.master import MasterClient, ResourceSample
from dlrover.rendezvous import NodeParams, PollResult, PollState, RendezvousClient, WaitingCount

__all__ = [
    "GrpcControlPlane",
    "decode_store_address",
    "default_node_name",
    "encode_store_address",
    "finished_key",
    "store_address_key",
]

_EVIDENCE_LIMIT = 60 * 1024
# How often a spare polls the rendezvous: how soon it learns that it took over a rank.
_SPARE_POLL_INTERVAL_S = 0.25

_log = logging.getLogger(__name__)


def _never() -> bool:
    return False


def store_address_key(round_number: int) -> str:
    """The key under which node rank 0 publishes the store address of a round."""
    return f"dlrover/launcher/round/{round_number}/store_addr"


def finished_key(round_number: int, group_rank: int) -> str:
    """The key a node sets once its workers of a round succeeded (see `ControlPlane.finished_ranks`)."""
    return f"dlrover/launcher/round/{round_number}/finished/{group_rank}"


def encode_store_address(host: str, port: int, agent_store: bool) -> bytes:
    """The value node rank 0 publishes under `store_address_key`: JSON, host, port and who hosts it."""
    return json.dumps({"host": host, "port": port, "agent_store": agent_store}, sort_keys=True).encode()


def decode_store_address(value: bytes) -> tuple[str, int, bool]:
    """(host, port, agent_store) of a value written by `encode_store_address`.

    Raises:
        DLRoverError: the value is not such a record; the message quotes it.
    """
    try:
        record = json.loads(value.decode())
        host, port, agent_store = record["host"], record["port"], record["agent_store"]
    except (UnicodeDecodeError, ValueError, TypeError, KeyError) as exc:
        raise DLRoverError(f"node rank 0 published a malformed store address {value!r}: {exc}") from None
    if (
        not isinstance(host, str)
        or not host
        or isinstance(port, bool)
        or not isinstance(port, int)
        or not 0 < port < 65536
        or not isinstance(agent_store, bool)
    ):
        raise DLRoverError(f"node rank 0 published a malformed store address {value!r}")
    return host, port, agent_store


class GrpcControlPlane:
    """One node's view of a running `dlrover-master`.

    Args:
        target: the master's `host:port`.
        token: the job token.
        node_name: a name that stays the same when this agent restarts on the same node.
        host: this node's host name, as the master records it.
        local_addr: the address other nodes reach this node's store at.
        min_nodes: this node's `--nnodes` minimum (checked against the rendezvous).
        max_nodes: its maximum.
        policy: deadlines and retries of every call.
        node_id: the id a master's scheduler launched this agent as; None lets the master choose.
        store_wait_s: how long non-zero ranks wait for rank 0 to publish the store address.
        connect_timeout_s: how long `register` waits for the master to accept a connection.
        poll_timeout_s: deadline of each `finished_ranks` and ``nodes_waiting(once=True)`` call
            (one attempt: the exit barrier polls them).
        spare_poll_interval_s: how often a warm spare asks whether it takes a rank (a spare waits
            with no join timeout; the master holds it out of rounds until then).
        clock: time source of every wait.
        channel_config: how to dial the master (TLS); None: `master_channel_config()`, as the
            ``DLROVER_MASTER_TLS_*`` variables say.
    """

    def __init__(
        self,
        target: str,
        token: str,
        *,
        node_name: str,
        host: str,
        local_addr: str,
        min_nodes: int,
        max_nodes: int,
        policy: RetryPolicy | None = None,
        node_id: int | None = None,
        store_wait_s: float = 60.0,
        poll_timeout_s: float = 2.0,
        connect_timeout_s: float = 600.0,
        spare_poll_interval_s: float = _SPARE_POLL_INTERVAL_S,
        clock: Clock | None = None,
        channel_config: ChannelConfig | None = None,
    ) -> None:
        if not target:
            raise ConfigError("the master's address is empty")
        # Built first: a bad timeout is refused before any channel is open.
        once = RetryPolicy(call_timeout_s=poll_timeout_s, total_timeout_s=poll_timeout_s, max_attempts=1)
        if not spare_poll_interval_s > 0:
            raise ConfigError(f"spare_poll_interval_s must be positive, got {spare_poll_interval_s!r}")
        self._spare_poll_interval_s = spare_poll_interval_s
        # Read once, so a bad setting is refused before any channel is open.
        channel = channel_config if channel_config is not None else master_channel_config()
        self._master = MasterClient(target, token, policy=policy, channel_config=channel)
        self._rdzv = RendezvousClient(target, token, policy=policy, channel_config=channel)
        # The exit barrier polls with its own loop: one short attempt per poll, so that neither
        # its deadline nor a stop waits out the retries of a master that cannot be reached.
        self._poll_rdzv = RendezvousClient(target, token, policy=once, channel_config=channel)
        self._announces_unsupported = False  # the master answered UNIMPLEMENTED to AnnounceRestart
        self._target = target
        self._connect_timeout_s = connect_timeout_s
        self._node_name = node_name
        self._host = host
        self._local_addr = local_addr
        self._params = NodeParams(min_nodes, max_nodes)
        self._store_wait_s = store_wait_s
        self._node_id = ""
        self._local_world_size = 0  # set by `register`
        self._peer_excuses: tuple[PeerExcuse, ...] = ()  # the last heartbeat answer's
        self._launched_as = node_id
        self._clock = clock or SystemClock()
        self._heartbeat_interval_s = 2.0

    def register(
        self, local_world_size: int, should_stop: Callable[[], bool] = _never, *, max_restarts: int | None = None
    ) -> NodeRegistration:
        # The master may start beside the agents (one serves it for a torchrun-style command
        # line): wait for it to accept a connection, as torchrun's agents wait for the store
        # (gRPC's own reconnect backoff grows to minutes). Registering is then retried within
        # the client's policy: the client's registration key makes a repeat the same one.
        self._wait_for_master(should_stop)
        # Told to the rendezvous with every join, so each round places this node's workers.
        self._local_world_size = local_world_size
        response = self._master.register(
            self._node_name,
            self._host,
            node_id=self._launched_as,
            local_world_size=local_world_size,
            max_restarts=max_restarts,
        )
        self._node_id = str(response.node_id)
        self._heartbeat_interval_s = float(response.heartbeat_interval_s) or 2.0
        return NodeRegistration(self._node_id, self._heartbeat_interval_s)

    def _wait_for_master(self, should_stop: Callable[[], bool]) -> None:
        """Until a TCP connection to the master's address succeeds (a plain connect every half
        second: gRPC's own reconnect backoff grows to minutes), the bound, or a stop."""
        try:
            address = parse_host_port(self._target)
        except ValueError:
            return  # not host:port (a gRPC URI): registering reports what is wrong
        give_up_at = self._clock.now() + self._connect_timeout_s
        last_error: OSError | None = None
        while True:
            try:
                with socket.create_connection(address, timeout=min(1.0, self._connect_timeout_s)):
                    return
            except OSError as exc:
                last_error = exc
            if should_stop():
                raise DLRoverError("stopped while waiting for the master to accept a connection")
            if self._clock.now() >= give_up_at:
                raise DLRoverError(
                    f"the master at {self._target} did not accept a connection in {self._connect_timeout_s} s: "
                    f"{last_error}"
                )
            self._clock.sleep(0.5)

    def next_round(
        self,
        timeout_s: float,
        should_stop: Callable[[], bool] = _never,
        open_store: Callable[[str], int] | None = None,
    ) -> RoundAssignment:
        """Join the next round and wait for it and its store address (see `ControlPlane.next_round`)."""
        joined = self._rdzv.join(self._node_id, params=self._params, local_world_size=self._local_world_size)
        if not joined.accepted:
            raise DLRoverError(f"the rendezvous refused node {self._node_id}: {joined.reason}")
        result = self._wait_assigned(timeout_s, should_stop)
        if result.state is not PollState.ASSIGNED:
            raise DLRoverError(f"node {self._node_id} got no rank in round {result.round}: {result.reason}")
        if result.worker_world_size <= 0:
            # Guessing (every node runs as many workers as this one) would give wrong ranks on
            # nodes with another --nproc-per-node.
            raise DLRoverError(
                f"round {result.round} has no worker layout: a node of it did not say how many workers it runs "
                "(an agent or master of an older version?), so this node cannot tell its workers their RANK "
                "and WORLD_SIZE"
            )
        key = store_address_key(result.round)
        if result.rank == 0:
            if open_store is not None:
                # Listening before it is published: no worker of any node can start before it.
                value = encode_store_address(self._local_addr, open_store(self._local_addr), True)
            else:
                value = encode_store_address(self._local_addr, free_port(self._local_addr), False)
            self._rdzv.kv_set([key], [value])
        else:
            value = self._wait_for_key(key, should_stop)
        host, port, agent_store = decode_store_address(value)
        return RoundAssignment(
            result.round,
            result.rank,
            result.world_size,
            host,
            port,
            agent_store=agent_store,
            first_worker_rank=result.first_worker_rank,
            worker_world_size=result.worker_world_size,
        )

    def _wait_assigned(self, timeout_s: float, should_stop: Callable[[], bool]) -> PollResult:
        # The node keeps heartbeating the master while it waits, so a long wait for late or
        # relaunched peers is not mistaken for a dead node.
        give_up_at = self._clock.now() + timeout_s
        next_heartbeat = self._clock.now()
        interval = 0.05
        while True:
            result = self._rdzv.poll(self._node_id)
            if result.state is not PollState.WAITING:
                return result
            if should_stop():
                raise DLRoverError(f"stopped while waiting for a round: {result.reason}")
            now = self._clock.now()
            # The master paces the waiting nodes (`retry_after_s`): a small job's see a completed
            # round at once, a large job's together poll at a bounded rate. A master that does
            # not pace gets the backoff.
            wait = result.retry_after_s if result.retry_after_s > 0 else interval
            if result.spare:
                # A spare node (`dlrover-master --spare-nodes`) waits for a rank as long as the
                # master holds it in reserve, and polls often enough to take one over quickly,
                # but no more often than that however few nodes wait.
                give_up_at = now + timeout_s
                interval = min(interval, self._spare_poll_interval_s)
                wait = self._spare_poll_interval_s if result.retry_after_s > 0 else interval
            if now >= give_up_at:
                raise DLRoverError(f"node {self._node_id} got no round within {timeout_s} s: {result.reason}")
            if now >= next_heartbeat:
                next_heartbeat = now + self._heartbeat_interval_s
                try:
                    self._master.heartbeat()
                except DLRoverError as exc:
                    _log.warning("heartbeat while waiting for a round failed: %s", exc)
            # Never past the next heartbeat: the master judges a waiting node by its beats.
            self._clock.sleep(max(min(wait, give_up_at - now, next_heartbeat - now), 0.0))
            interval = min(interval * 2, 1.0)

    def _wait_for_key(self, key: str, should_stop: Callable[[], bool]) -> bytes:
        # Rank 0 publishes right after its own poll answers, so this wait is short; it is bounded
        # so a rank 0 that died in between is noticed instead of waited on forever.
        give_up_at = self._clock.now() + self._store_wait_s
        interval = 0.02
        while True:
            (value,) = self._rdzv.kv_get([key])
            if value is not None:
                return value
            if should_stop():
                raise DLRoverError(f"stopped while waiting for node rank 0's store address ({key})")
            if self._clock.now() >= give_up_at:
                raise DLRoverError(f"node rank 0 did not publish its store address ({key}) in {self._store_wait_s} s")
            self._clock.sleep(interval)
            interval = min(interval * 2, 0.5)

    def nodes_waiting(self, *, once: bool = False) -> int:
        return (self._poll_rdzv if once else self._rdzv).num_nodes_waiting(self._node_id)

    def round_has_formed(self, should_stop: Callable[[], bool] = _never) -> bool:
        # Asked once the master accepts connections, on the polling channel (one attempt): a call
        # that failed on the registering channel would leave it in gRPC's reconnect backoff, and
        # registering would then spend its attempts waiting that out. A stop or a master that never listens
        # is the caller's to handle, as with `register` (not a second wait after this one).
        self._wait_for_master(should_stop)
        try:
            return self._poll_rdzv.waiting_check().rounds_formed > 0
        except DLRoverError as exc:
            _log.debug("could not ask whether the job has formed a round: %s", exc)
            return False

    def waiting_check(self) -> WaitingCount:
        return self._poll_rdzv.waiting_check(self._node_id)

    def restarting_for_round(self, nodes_waiting: int, round_number: int) -> None:
        if self._announces_unsupported:
            return
        try:
            self._poll_rdzv.announce_restart(self._node_id, nodes_waiting, round_number)
        except RpcError as exc:
            if exc.code is not grpc.StatusCode.UNIMPLEMENTED:
                raise
            self._announces_unsupported = True  # an older master: said once, not asked at every growth
            _log.warning("the master cannot be told that workers restart for a new round (%s)", exc)

    def heartbeat(self, progress: Progress) -> Sequence[tuple[ActionKind, str] | MasterAction]:
        step = progress.step if progress.step >= 0 else None
        usage = progress.resources
        resources = (
            None
            if usage is None
            else ResourceSample(
                cpu_percent=usage.cpu_percent,
                memory_bytes=usage.memory_bytes,
                gpu_percent=usage.gpu_percent,
                gpu_memory_bytes=usage.gpu_memory_bytes,
            )
        )
        response = self._master.heartbeat(
            step=step,
            samples=progress.samples,
            resources=resources,
            rank_steps=progress.rank_steps,
            attempts=progress.attempts,
            excuses=progress.excuses,
        )
        self._peer_excuses = response.peer_excuses
        return [MasterAction(a.kind, a.reason, a.planned_round) for a in response.actions]

    def peer_excuses(self) -> tuple[PeerExcuse, ...]:
        return self._peer_excuses

    def report_failure(self, report: FailureReport) -> Decision:
        # No restart count here: the master keeps the node's count, and its answer names it.
        if report.hang:
            header = f"local rank {report.local_rank} hung\n"
        else:
            how = f"signal {report.signal_name}" if report.signal_name else f"exit code {report.exit_code}"
            header = f"local rank {report.local_rank} exited with {how}\n"
        if report.network_check:
            header = f"{NODE_CHECK_FAILED}: the network check left this node out before training\n"
        evidence = header + report.evidence[-(_EVIDENCE_LIMIT - len(header)) :]
        kind = reported_kind(hung=report.hang, node_check_failed=report.network_check)
        # A node the network check left out exits whatever the answer: the master must not count
        # on it restarting its processes.
        return self._master.report_failure(kind, evidence, exit_code=report.exit_code, agent_exits=report.network_check)

    def commit_checkpoint(self, step: int, path: str, world_size: int) -> None:
        self._master.commit_checkpoint(step, path, world_size=world_size)

    def report_success(self, assignment: RoundAssignment) -> None:
        key = finished_key(assignment.round, assignment.group_rank)
        try:
            # Before the master hears it: a master that ends the job on this report may be gone
            # before node rank 0 reads the mark.
            self._rdzv.kv_set([key], [b"1"])
        except DLRoverError as exc:
            _log.warning(
                "could not mark node rank %d finished in round %d (%s): node rank 0 keeps the round's store "
                "open until its exit barrier times out",
                assignment.group_rank,
                assignment.round,
                exc,
            )
        self._master.report_success()

    def finished_ranks(self, assignment: RoundAssignment) -> frozenset[int]:
        ranks = range(assignment.group_world_size)
        values = self._poll_rdzv.kv_get([finished_key(assignment.round, rank) for rank in ranks])
        return frozenset(rank for rank, value in zip(ranks, values, strict=True) if value is not None)

    def kv_get(self, keys: Sequence[str]) -> list[bytes | None]:
        """Read keys of the master's rendezvous key-value store (None for each key not set)."""
        return self._rdzv.kv_get(keys)

    def kv_compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Compare-and-set in the master's key-value store; returns the value the key holds after."""
        return self._rdzv.kv_compare_set(key, expected, desired)

    def kv_delete(self, key: str) -> bool:
        """Delete a key of the master's key-value store; whether it was set."""
        return self._rdzv.kv_delete(key)

    def leave(self) -> None:
        try:
            self._rdzv.leave(self._node_id)
        except RpcError as exc:
            # The master removes a node it fails or relaunches from the rendezvous itself; a
            # node that is no longer there has nothing left to leave.
            if exc.code not in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
                raise

    def close(self) -> None:
        """Close every channel."""
        self._master.close()
        self._rdzv.close()
        self._poll_rdzv.close()


def default_node_name(node_rank: int | None) -> str:
    """This agent's name: the host and the node rank when one was given, else the host and pid.

    Two agents on one host (two "nodes" in a test, or several slots) must not share a name: the
    master refuses a second registration of a name it already holds.
    """
    host = socket.gethostname()
    return f"{host}-node{node_rank}" if node_rank is not None else f"{host}-{os.getpid()}"
