"""Where a torchrun multi-node command line has its nodes meet, and which agent serves the master."""

from __future__ import annotations

import socket

import pytest

from dlrover.common import ConfigError
from dlrover.launcher.args import parse_args
from dlrover.launcher.peer_master import PeerEndpoint, is_local_host, peer_endpoint


def _endpoint(*flags: str) -> PeerEndpoint | None:
    return peer_endpoint(parse_args([*flags, "train.py"]))


def test_c10d_names_the_endpoint_with_torchruns_default_port() -> None:
    assert _endpoint("--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=head:1234") == PeerEndpoint(
        "head", 1234, "c10d"
    )
    assert _endpoint("--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=head") == PeerEndpoint("head", 29400, "c10d")
    ipv6 = _endpoint("--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=[::1]:99")
    assert ipv6 == PeerEndpoint("::1", 99, "c10d")
    assert ipv6.address == "[::1]:99"


def test_the_static_form_is_master_addr_and_port_and_node_rank_0_serves() -> None:
    assert _endpoint("--nnodes=2", "--node-rank=1", "--master-addr=head", "--master-port=7000") == PeerEndpoint(
        "head", 7000, "static", 1
    )
    # torchrun's defaults: 127.0.0.1 and port 29500.
    assert _endpoint("--nnodes=2", "--node-rank=0", "--rdzv-backend=static") == PeerEndpoint(
        "127.0.0.1", 29500, "static", 0
    )
    assert _endpoint("--nnodes=2", "--node-rank=0", "--rdzv-backend=static", "--rdzv-endpoint=h:5") == PeerEndpoint(
        "h", 5, "static", 0
    )


def test_a_dlrover_master_or_no_endpoint_is_no_peer_endpoint() -> None:
    assert _endpoint("--nnodes=2", "--rdzv-backend=dlrover", "--rdzv-endpoint=m:1") is None
    assert _endpoint("--nnodes=2") is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rdzv-backend=etcd", "--rdzv-endpoint=e:2379"], "etcd server"),
        (["--rdzv-backend=c10d"], "needs --rdzv-endpoint"),
        (["--rdzv-backend=c10d", "--rdzv-endpoint=h:port"], "must be a number"),
        (["--rdzv-backend=c10d", "--rdzv-endpoint=h:70000"], "from 1 to 65535"),
        (["--rdzv-backend=c10d", "--rdzv-endpoint=:5"], "names no host"),
        (["--master-port=7000"], "needs --node-rank"),
    ],
)
def test_unusable_endpoints_are_refused_clearly(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _endpoint("--nnodes=2", *flags)


def test_local_hosts_are_those_a_socket_here_can_bind() -> None:
    assert is_local_host("127.0.0.1")
    assert is_local_host("localhost")
    assert is_local_host(socket.gethostname())
    assert not is_local_host("192.0.2.1")  # TEST-NET-1: documentation only, never assigned
    assert not is_local_host("no-such-host.invalid")


def test_the_served_masters_wait_for_the_jobs_end_is_bounded_and_ends_on_a_stop() -> None:
    import threading

    from dlrover.launcher.peer_master import HostedMaster
    from dlrover.master import MasterConfig, create_master
    from dlrover.master.config import LifecycleConfig, NodeRange

    config = MasterConfig(backend="external", lifecycle=LifecycleConfig(nodes=NodeRange(2, 2)))
    with create_master(config) as runtime:
        hosted = HostedMaster(runtime, linger_s=0.1, address=runtime.address)
        assert not hosted.wait_job_end(timeout_s=0.3, poll_s=0.05)  # the job goes on: bounded
        stopper = threading.Timer(0.2, hosted.request_stop)  # as a SIGTERM's handler does
        stopper.start()
        try:
            assert not hosted.wait_job_end(timeout_s=600, poll_s=0.05)
        finally:
            stopper.cancel()


def test_the_node_that_serves_listens_on_every_interface_and_the_others_do_not_serve(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from dlrover.common import generate_token
    from dlrover.launcher.peer_master import peer_master

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    flags = ["--nnodes=2", "--master-addr=localhost", f"--master-port={port}"]
    token = generate_token()
    not_rank_0 = parse_args([*flags, "--node-rank=1", "t.py"])
    other = _endpoint(*flags, "--node-rank=1")
    assert other is not None
    with peer_master(not_rank_0, other, token) as served:
        assert served is None
    rank_0 = parse_args([*flags, "--node-rank=0", "t.py"])
    endpoint = _endpoint(*flags, "--node-rank=0")
    assert endpoint is not None
    with caplog.at_level("WARNING", logger="dlrover.launcher"), peer_master(rank_0, endpoint, token) as hosted:
        assert hosted is not None
        # Bound to every interface, not only to what the endpoint's name resolves to here.
        for address in {"127.0.0.1", *(info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None))}:
            if ":" not in address:
                socket.create_connection((address, port), timeout=5).close()
    assert "a loopback address" in caplog.text  # localhost: the other hosts could not reach it
