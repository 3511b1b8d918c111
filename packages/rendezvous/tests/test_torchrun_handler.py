"""The torchrun handler in-process against a real service: errors torch's agent understands."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

pytest.importorskip("torch")

from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStateError,
    RendezvousTimeoutError,
)

from dlrover.common import AuthError, ConfigError, GrpcServer, ManualClock, write_token_file
from dlrover.rendezvous import RendezvousClient, RendezvousServicer
from dlrover.rendezvous.torchrun import HandlerSettings, create_handler, handler_creator

Served = tuple[RendezvousServicer, GrpcServer]


def _params(endpoint: str, min_nodes: int = 2, max_nodes: int = 3, **conf: object) -> RendezvousParameters:
    return RendezvousParameters(
        backend="dlrover",
        endpoint=endpoint,
        run_id="job",
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        local_addr="127.0.0.1",
        **conf,
    )


def test_settings_come_from_rdzv_conf_and_are_validated() -> None:
    s = HandlerSettings.from_conf({"node_id": "n1", "timeout": "900", "heartbeat_interval": "2"}, environ={})
    assert (s.node_id, s.join_timeout_s, s.heartbeat_interval_s) == ("n1", 900.0, 2.0)
    assert HandlerSettings.from_conf({"join_timeout": 5}, environ={"DLROVER_NODE_ID": "env-node"}).node_id == "env-node"
    with pytest.raises(ConfigError, match="join_timeout must be positive, got '-1'"):
        HandlerSettings.from_conf({"join_timeout": "-1"}, environ={})
    with pytest.raises(ConfigError, match="store_timeout must be a number of seconds, got 'soon'"):
        HandlerSettings.from_conf({"store_timeout": "soon"}, environ={})


def test_handler_needs_an_endpoint_and_a_token(tmp_path: Path) -> None:
    assert handler_creator() is create_handler
    with pytest.raises(ConfigError, match="rdzv-endpoint"):
        create_handler(_params(""), environ={"DLROVER_JOB_TOKEN": "t" * 20})
    with pytest.raises(AuthError, match="no job token"):
        create_handler(_params("127.0.0.1:1"), environ={})
    token_file = write_token_file(tmp_path / "token", "f" * 32)
    handler = create_handler(_params("127.0.0.1:1", token_file=str(token_file), node_id="n"), environ={})
    assert (handler.get_backend(), handler.get_run_id(), handler.node_id) == ("dlrover", "job", "n")
    handler.shutdown()


@pytest.mark.integration
def test_two_handlers_rendezvous_and_share_a_store(servicer_and_server: Served, token: str, clock: ManualClock) -> None:
    servicer, server = servicer_and_server
    env = {"DLROVER_JOB_TOKEN": token}
    handlers = [
        create_handler(_params(server.address, node_id=f"n{i}", join_timeout=30, heartbeat_interval=0.2), environ=env)
        for i in range(2)
    ]
    infos: dict[int, RendezvousInfo] = {}

    def run(i: int) -> None:
        infos[i] = handlers[i].next_rendezvous()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    # Two of max 3 nodes: the round waits for the 5 s last call of the fixture's manual clock, which
    # moves once both have joined.
    both_joined = threading.Event()
    for _ in range(3000):
        with servicer.lock:
            if len(servicer.manager.waiting) == 2:
                both_joined.set()
                break
        both_joined.wait(0.01)
    assert both_joined.is_set()
    clock.advance(5.0)
    for t in threads:
        t.join(timeout=30)
    try:
        assert sorted(info.rank for info in infos.values()) == [0, 1]
        assert {info.world_size for info in infos.values()} == {2}
        boot = {(i.bootstrap_store_info.master_addr, i.bootstrap_store_info.master_port) for i in infos.values()}  # type: ignore[union-attr]
        assert len(boot) == 1
        assert next(iter(boot))[0] == "127.0.0.1"
        infos[0].store.set("hello", b"world")
        assert infos[1].store.get("hello") == b"world"
        assert handlers[0].num_nodes_waiting() == 0
        assert not handlers[0].is_closed()
    finally:
        assert all(h.shutdown() for h in handlers)


@pytest.mark.integration
def test_disagreeing_nnodes_is_a_state_error(servicer_and_server: Served, token: str) -> None:
    handler = create_handler(
        _params(servicer_and_server[1].address, 2, 8, node_id="n"), environ={"DLROVER_JOB_TOKEN": token}
    )
    try:
        with pytest.raises(RendezvousStateError, match=r"expects 2\.\.8 nodes but this rendezvous runs 2\.\.3"):
            handler.next_rendezvous()
    finally:
        handler.shutdown()


@pytest.mark.integration
def test_closed_rendezvous_and_timeouts(servicer_and_server: Served, token: str) -> None:
    env = {"DLROVER_JOB_TOKEN": token}
    address = servicer_and_server[1].address
    lonely = create_handler(_params(address, node_id="lonely", join_timeout=0.3), environ=env)
    try:
        with pytest.raises(RendezvousTimeoutError, match="1 of min 2 nodes joined"):
            lonely.next_rendezvous()
        lonely.set_closed()
        assert lonely.is_closed()
        with pytest.raises(RendezvousClosedError, match="closed"):
            lonely.next_rendezvous()
    finally:
        lonely.shutdown()


@pytest.mark.integration
def test_unreachable_service_is_a_connection_error(token: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    handler = create_handler(
        _params(f"127.0.0.1:{port}", node_id="n", call_timeout=0.5), environ={"DLROVER_JOB_TOKEN": token}
    )
    try:
        with pytest.raises(RendezvousConnectionError, match="UNAVAILABLE"):
            handler.next_rendezvous()
    finally:
        handler.shutdown()


@pytest.mark.integration
def test_num_nodes_waiting_is_cached_for_waiting_cache_seconds(
    servicer_and_server: Served, token: str, client: RendezvousClient
) -> None:
    env = {"DLROVER_JOB_TOKEN": token}
    handler_clock = ManualClock()
    handler = create_handler(
        _params(servicer_and_server[1].address, 1, 3, node_id="n", waiting_cache=2), environ=env, clock=handler_clock
    )
    try:
        assert handler.num_nodes_waiting() == 0
        client.join("late")
        handler_clock.advance(1.9)
        assert handler.num_nodes_waiting() == 0
        handler_clock.advance(0.1)
        assert handler.num_nodes_waiting() == 1
    finally:
        handler.shutdown()
