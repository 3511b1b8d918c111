"""The `dlrover` rendezvous backend for stock `torchrun`.

    torchrun --rdzv-backend=dlrover --rdzv-endpoint=HOST:PORT --nnodes=MIN:MAX ... train.py

`HOST:PORT` is a `RendezvousService` (hosted by the DLRover master, or by anything that calls
`add_rendezvous_service`). The package registers this backend under the `torchrun.handlers`
entry-point group, which torch 2.13 reads when it builds its handler registry, so no torch code is
patched and only the public `torch.distributed.elastic.rendezvous` API is used.

The job token is never put on the command line (other users can read it in `ps`): it comes from
`--rdzv-conf token_file=PATH` (a 0600 file), else the file named by `DLROVER_JOB_TOKEN_FILE`, else
`DLROVER_JOB_TOKEN`. Other `--rdzv-conf` keys (seconds unless said otherwise):

- `node_id`: this node's id (default `DLROVER_NODE_ID`, else `<hostname>-<pid>`); a node that keeps
  its id across restarts keeps its rank;
- `join_timeout` (default the launcher's `timeout`, else 600): how long `next_rendezvous` waits;
- `heartbeat_interval` (5): how often the agent tells the service it is alive;
- `store_timeout` (300): default time limit of blocking store reads;
- `call_timeout` (10): deadline of each RPC;
- `waiting_cache` (1): how long an answer of `num_nodes_waiting` is reused (torch asks every tick);
- `topology_key` (empty): the node's switch or rack, for a topology-aware rank order.

This module imports torch; install the `torch` extra.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStateError,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)

from dlrover.common import Clock, ConfigError, RetryPolicy, RpcError, SystemClock, load_token
from dlrover.rendezvous.client import RendezvousClient
from dlrover.rendezvous.errors import RendezvousTimeoutError as _WaitTimeout
from dlrover.rendezvous.results import NodeParams, PollState
from dlrover.rendezvous.torch_store import ServiceStore

__all__ = ["BACKEND_NAME", "DLRoverRendezvousHandler", "HandlerSettings", "create_handler", "handler_creator"]

BACKEND_NAME = "dlrover"
NODE_ID_ENV_VAR = "DLROVER_NODE_ID"

_log = logging.getLogger(__name__)


def _seconds(conf: Mapping[str, Any], key: str, default: float) -> float:
    raw = conf.get(key, default)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"rdzv-conf {key} must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise ConfigError(f"rdzv-conf {key} must be positive, got {raw!r}")
    return value


@attrs.frozen
class HandlerSettings:
    """How the torchrun handler talks to the service (see the module docstring for rdzv-conf keys).

    Attributes:
        node_id: this node's id.
        join_timeout_s: how long `next_rendezvous` waits to be admitted.
        heartbeat_interval_s: how often the agent sends a heartbeat.
        store_timeout_s: default time limit of blocking store reads.
        call_timeout_s: deadline of each RPC.
        poll_interval_s: first interval between polls while waiting for a round, when the
            rendezvous does not pace them (then it doubles up to 1 s; see `PollResult.retry_after_s`).
        waiting_cache_s: how long an answer of `num_nodes_waiting` is reused.
        topology_key: the node's switch or rack.
    """

    node_id: str
    join_timeout_s: float = 600.0
    heartbeat_interval_s: float = 5.0
    store_timeout_s: float = 300.0
    call_timeout_s: float = 10.0
    poll_interval_s: float = 0.05
    waiting_cache_s: float = 1.0
    topology_key: str = ""

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> HandlerSettings:
        """Read the settings from torchrun's `--rdzv-conf` values.

        Raises:
            ConfigError: a value is not a positive number.
        """
        env = os.environ if environ is None else environ
        node_id = str(conf.get("node_id") or env.get(NODE_ID_ENV_VAR) or f"{socket.gethostname()}-{os.getpid()}")
        join_default = _seconds(conf, "timeout", 600.0)
        return cls(
            node_id=node_id,
            join_timeout_s=_seconds(conf, "join_timeout", join_default),
            heartbeat_interval_s=_seconds(conf, "heartbeat_interval", 5.0),
            store_timeout_s=_seconds(conf, "store_timeout", 300.0),
            call_timeout_s=_seconds(conf, "call_timeout", 10.0),
            waiting_cache_s=_seconds(conf, "waiting_cache", 1.0),
            topology_key=str(conf.get("topology_key", "")),
        )


class DLRoverRendezvousHandler(RendezvousHandler):
    """A torchrun `RendezvousHandler` backed by a `RendezvousService`.

    Args:
        client: the service's client (closed by `shutdown`).
        run_id: the job's run id (torchrun's `--rdzv-id`).
        min_nodes: the node's `--nnodes` minimum; the service rejects a disagreeing node.
        max_nodes: the node's `--nnodes` maximum.
        settings: ids, intervals and timeouts.
        local_addr: the address workers of rank 0 publish for their own store (torchrun's `--local-addr`).
        clock: time source of the join deadline and of the `num_nodes_waiting` cache.
    """

    def __init__(
        self,
        client: RendezvousClient,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        *,
        settings: HandlerSettings,
        local_addr: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._client = client
        self._clock = clock or SystemClock()
        self._waiting_cache: tuple[float, int] | None = None
        self._run_id = run_id
        self._params = NodeParams(min_nodes=min_nodes, max_nodes=max_nodes)
        self._settings = settings
        self._local_addr = local_addr
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    @property
    def node_id(self) -> str:
        """This node's id in the rendezvous."""
        return self._settings.node_id

    def get_backend(self) -> str:
        """`"dlrover"`."""
        return BACKEND_NAME

    def get_run_id(self) -> str:
        """The job's run id."""
        return self._run_id

    def next_rendezvous(self) -> RendezvousInfo:
        """Join, wait until a round admits this node, and return its rank and a store for the round.

        Raises:
            RendezvousClosedError: the rendezvous is closed.
            RendezvousConnectionError: the service could not be reached.
            RendezvousStateError: the service rejected the join (for example `--nnodes` disagrees).
            RendezvousTimeoutError: no round admitted the node within `join_timeout_s`.
        """
        node = self._settings.node_id
        give_up_at = self._clock.now() + self._settings.join_timeout_s
        try:
            while True:
                joined = self._client.join(node, params=self._params, topology_key=self._settings.topology_key)
                if not joined.accepted:
                    if "closed" in joined.reason:
                        raise RendezvousClosedError(joined.reason)
                    raise RendezvousStateError(f"node {node!r} was not accepted: {joined.reason}")
                result = self._client.wait_assigned(
                    node,
                    timeout_s=max(give_up_at - self._clock.now(), 0.0),
                    poll_interval_s=self._settings.poll_interval_s,
                )
                if result.state is PollState.ASSIGNED:
                    self._waiting_cache = None
                    break
                if result.state is PollState.CLOSED:
                    raise RendezvousClosedError(result.reason)
                if result.state is PollState.TIMED_OUT or self._clock.now() >= give_up_at:
                    raise RendezvousTimeoutError(result.reason)
                # NOT_WAITING: dropped between the join and the poll (a round formed without it, or it
                # expired); join again, within the same overall time limit.
                _log.info("node %s joins again: %s", node, result.reason)
        except _WaitTimeout as exc:
            raise RendezvousTimeoutError(str(exc)) from exc
        except RpcError as exc:
            raise RendezvousConnectionError(f"rendezvous service {self._client.target}: {exc}") from exc
        self._start_heartbeat()
        base = ServiceStore(self._client, timeout_s=self._settings.store_timeout_s)
        store = base.with_prefix(f"dlrover/{self._run_id}/round-{result.round}")
        bootstrap = RendezvousStoreInfo.build(result.rank, store, local_addr=self._local_addr)
        _log.info(
            "node %s has rank %d of %d in round %d: %s",
            node,
            result.rank,
            result.world_size,
            result.round,
            result.reason,
        )
        return RendezvousInfo(store, result.rank, result.world_size, bootstrap)

    def is_closed(self) -> bool:
        """Whether the rendezvous is closed."""
        try:
            return self._client.status().closed
        except RpcError as exc:
            raise RendezvousConnectionError(str(exc)) from exc

    def set_closed(self) -> None:
        """Close the rendezvous for every node."""
        try:
            self._client.close_rendezvous()
        except RpcError as exc:
            raise RendezvousConnectionError(str(exc)) from exc

    def num_nodes_waiting(self) -> int:
        """Nodes waiting to join (at least 1 when this node's round dissolved); also a heartbeat.

        torch's agent asks on every monitor tick (0.1 s by default); the answer is reused for
        `waiting_cache` seconds so a thousand agents do not turn into ten thousand calls a second.
        """
        now = self._clock.now()
        cached = self._waiting_cache
        if cached is not None and now - cached[0] < self._settings.waiting_cache_s:
            return cached[1]
        try:
            count = self._client.num_nodes_waiting(self._settings.node_id)
        except RpcError as exc:
            raise RendezvousConnectionError(str(exc)) from exc
        self._waiting_cache = (now, count)
        return count

    def shutdown(self) -> bool:
        """Stop heartbeats, leave the rendezvous and close the channel; True when all went well.

        The rendezvous itself stays open: the master, not one agent, decides when a job is over.
        """
        if self._stop.is_set():
            return True
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=self._settings.call_timeout_s * 2)
        ok = True
        try:
            self._client.leave(self._settings.node_id)
        except RpcError as exc:
            # FAILED_PRECONDITION: the node had already left or expired, which is what we want.
            ok = exc.code.name == "FAILED_PRECONDITION"
            if not ok:
                _log.warning("node %s could not leave the rendezvous: %s", self._settings.node_id, exc)
        finally:
            self._client.close()
        return ok

    def _start_heartbeat(self) -> None:
        if self._heartbeat is not None:
            return
        self._heartbeat = threading.Thread(
            target=self._beat, name=f"dlrover-rdzv-heartbeat-{self._settings.node_id}", daemon=True
        )
        self._heartbeat.start()

    def _beat(self) -> None:
        while not self._stop.wait(self._settings.heartbeat_interval_s):
            try:
                answer = self._client.heartbeat(self._settings.node_id)
                if not answer.known:
                    _log.warning("rendezvous does not know node %s: %s", self._settings.node_id, answer.reason)
            except RpcError as exc:
                _log.warning("heartbeat of node %s failed: %s", self._settings.node_id, exc)


def create_handler(
    params: RendezvousParameters, environ: Mapping[str, str] | None = None, clock: Clock | None = None
) -> DLRoverRendezvousHandler:
    """Build the handler from torchrun's parameters (and, in tests, a clock and an environment).

    Raises:
        ConfigError: the endpoint is empty or a `--rdzv-conf` value is malformed.
        AuthError: no usable job token was found.
    """
    endpoint = (params.endpoint or "").strip()
    if not endpoint:
        raise ConfigError("the dlrover rendezvous needs --rdzv-endpoint=HOST:PORT of a RendezvousService")
    conf = params.config
    settings = HandlerSettings.from_conf(conf, environ)
    token = load_token(token_file=conf.get("token_file") or None, environ=environ)
    policy = RetryPolicy(call_timeout_s=settings.call_timeout_s, total_timeout_s=max(30.0, settings.call_timeout_s))
    client = RendezvousClient(endpoint, token, policy=policy)
    return DLRoverRendezvousHandler(
        client,
        params.run_id,
        params.min_nodes,
        params.max_nodes,
        settings=settings,
        local_addr=params.local_addr,
        clock=clock,
    )


def handler_creator() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """The `torchrun.handlers` entry point: torch calls it and registers what it returns."""
    return create_handler
