"""`StoreHost`: a contract every implementation passes, and what only the torch one can show."""

from __future__ import annotations

import datetime
import math
import socket
from collections.abc import Iterator

import psutil
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule

from dlrover.common import ConfigError, DLRoverError
from dlrover.launcher.store_host import FakeStoreHost, StoreHost, TorchStoreHost, TorchStoreHostConfig

pytestmark = pytest.mark.timeout(120)


def _is_open(host: StoreHost) -> bool:
    if isinstance(host, FakeStoreHost):
        return host.is_open
    assert isinstance(host, TorchStoreHost)
    return host.address is not None


@pytest.fixture(params=["fake", "torch"])
def store_host(request: pytest.FixtureRequest) -> Iterator[StoreHost]:
    host: StoreHost = FakeStoreHost() if request.param == "fake" else TorchStoreHost()
    host.prepare()
    try:
        yield host
    finally:
        host.close()


def test_open_returns_a_port_and_close_is_idempotent(store_host: StoreHost) -> None:
    port = store_host.open("127.0.0.1")
    assert 0 < port < 65536
    assert _is_open(store_host)
    store_host.close()
    assert not _is_open(store_host)
    store_host.close()
    assert not _is_open(store_host)


def test_a_second_open_without_close_is_refused_and_keeps_the_first(store_host: StoreHost) -> None:
    store_host.open("127.0.0.1")
    with pytest.raises(DLRoverError, match="already open"):
        store_host.open("127.0.0.1")
    assert _is_open(store_host)


def test_an_empty_host_is_refused_and_opens_nothing(store_host: StoreHost) -> None:
    with pytest.raises(DLRoverError, match="empty host"):
        store_host.open("")
    assert not _is_open(store_host)


def test_open_after_close_opens_another_store(store_host: StoreHost) -> None:
    store_host.open("127.0.0.1")
    store_host.close()
    store_host.open("127.0.0.1")
    assert _is_open(store_host)


def _connect(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10):
        pass


def _listening_ports() -> set[int]:
    """TCP ports this test process listens on."""
    return {c.laddr.port for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def _client(port: int) -> object:
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))


def test_torch_store_listens_on_the_returned_port_until_closed_even_with_a_client_connected() -> None:
    host = TorchStoreHost()
    try:
        port = host.open("127.0.0.1")
        assert host.address == ("127.0.0.1", port)
        client = _client(port)  # connects at once: the server listened before `open` returned
        client.set("k", "v")  # type: ignore[attr-defined]
        assert client.get("k") == b"v"  # type: ignore[attr-defined]
        host.close()
        with pytest.raises(ConnectionRefusedError):
            _connect(port)
        del client
    finally:
        host.close()


def test_a_fresh_torch_store_holds_none_of_the_previous_ones_keys() -> None:
    host = TorchStoreHost()
    try:
        first = _client(host.open("127.0.0.1"))
        first.set("round-1-key", "x")  # type: ignore[attr-defined]
        host.close()
        second = _client(host.open("127.0.0.1"))
        assert not second.check(["round-1-key"])  # type: ignore[attr-defined]
        del first, second
    finally:
        host.close()


def test_a_torch_store_that_cannot_start_is_a_clear_error_and_leaves_nothing_open() -> None:
    # A short timeout: the server binds, then its own client cannot resolve the host (torch tries twice).
    host = TorchStoreHost(TorchStoreHostConfig(store_timeout_s=0.2))
    host.prepare()
    try:
        before = _listening_ports()
        with pytest.raises(DLRoverError, match=r"no-such-host\.invalid"):
            host.open("no-such-host.invalid")
        assert host.address is None
        # The server it had bound before its own client gave up does not listen any more. (No
        # new port: one of an earlier test's servers may close meanwhile, so not equality.)
        assert _listening_ports() <= before
        assert host.open("127.0.0.1") > 0  # and the host is still usable
    finally:
        host.close()


def test_open_without_prepare_imports_torch_distributed_itself() -> None:
    host = TorchStoreHost()
    try:
        assert host.open("127.0.0.1") > 0
    finally:
        host.close()


@pytest.mark.parametrize("field", ["store_timeout_s", "import_timeout_s"])
@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf])
def test_config_refuses_bad_timeouts_by_name(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        TorchStoreHostConfig(**{field: value})


def test_fake_records_calls_in_order_and_checks_before_closing() -> None:
    seen: list[bool] = []
    host = FakeStoreHost(first_port=5000, on_close=lambda: seen.append(True))
    host.prepare()
    assert host.open("h") == 5000
    host.close()
    host.close()
    assert host.open("h") == 5001
    host.close()
    assert host.calls == [
        ("prepare", ""),
        ("open", "h:5000"),
        ("close", "h:5000"),
        ("close", ""),
        ("open", "h:5001"),
        ("close", "h:5001"),
    ]
    assert host.opened == ["h:5000", "h:5001"]
    assert seen == [True, True]  # only closes of an open store


def test_fake_scripted_open_failure_opens_nothing() -> None:
    host = FakeStoreHost(fail_open=True)
    with pytest.raises(DLRoverError, match="scripted"):
        host.open("h")
    assert not host.is_open
    assert host.opened == []


class StoreHostMachine(RuleBasedStateMachine):
    """Any sequence of opens and closes, against a model that holds at most one open port.

    Checked for both implementations: at most one store open; a refused open changes nothing; a
    close is idempotent; for `TorchStoreHost`, the open port accepts connections and every port
    it closed refuses them (unless a later store got the same port).
    """

    closed_ports = Bundle("closed_ports")

    def __init__(self) -> None:
        super().__init__()
        self.host: StoreHost = FakeStoreHost()
        self.model: int | None = None  # the open store's port

    @initialize(kind=st.sampled_from(["fake", "torch"]))
    def choose(self, kind: str) -> None:
        self.host = FakeStoreHost() if kind == "fake" else TorchStoreHost()
        self.host.prepare()

    @precondition(lambda self: self.model is None)
    @rule()
    def open_when_closed(self) -> None:
        port = self.host.open("127.0.0.1")
        assert 0 < port < 65536
        self.model = port

    @precondition(lambda self: self.model is not None)
    @rule()
    def open_when_open_is_refused(self) -> None:
        with pytest.raises(DLRoverError, match="already open"):
            self.host.open("127.0.0.1")

    @precondition(lambda self: self.model is not None)
    @rule(target=closed_ports)
    def close_open(self) -> int:
        port, self.model = self.model, None
        self.host.close()
        assert port is not None
        return port

    @rule()
    def close_again(self) -> None:
        if self.model is None:
            self.host.close()

    @rule(port=closed_ports)
    def a_closed_port_refuses(self, port: int) -> None:
        if isinstance(self.host, TorchStoreHost) and port != self.model:
            with pytest.raises(ConnectionRefusedError):
                _connect(port)

    @invariant()
    def open_matches_the_model(self) -> None:
        assert _is_open(self.host) is (self.model is not None)
        if isinstance(self.host, TorchStoreHost):
            assert self.host.address == (None if self.model is None else ("127.0.0.1", self.model))
            if self.model is not None:
                _connect(self.model)

    def teardown(self) -> None:
        self.host.close()


# Thirty sequences of ten steps cover this two-state machine; more only cost time.
StoreHostMachine.TestCase.settings = settings(max_examples=min(settings().max_examples, 30), stateful_step_count=10)
test_store_host_state_machine = StoreHostMachine.TestCase
