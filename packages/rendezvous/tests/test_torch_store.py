"""ServiceStore against the contract torch's own stores keep, and a real gloo group through it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from dlrover.common import ConfigError, GrpcServer, RpcError  # noqa: E402
from dlrover.rendezvous import RendezvousClient, RendezvousServicer  # noqa: E402
from dlrover.rendezvous.torch_store import ServiceStore  # noqa: E402

pytestmark = pytest.mark.integration

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture(params=["hash", "service", "prefixed-service"])
def store(request: pytest.FixtureRequest, client: RendezvousClient) -> Iterator[object]:
    """Each store kind under the same contract: torch's HashStore is the reference."""
    if request.param == "hash":
        yield dist.HashStore()
    elif request.param == "service":
        yield ServiceStore(client, timeout_s=5.0)
    else:
        yield ServiceStore(client, timeout_s=5.0).with_prefix("round-1")


def test_set_get_add_and_counts(store: object) -> None:
    s = store
    s.set("a", "1")  # type: ignore[attr-defined]
    s.set("b", b"\x00\xff")  # type: ignore[attr-defined]
    assert s.get("a") == b"1"  # type: ignore[attr-defined]
    assert s.get("b") == b"\x00\xff"  # type: ignore[attr-defined]
    assert s.add("n", 2) == 2  # type: ignore[attr-defined]
    assert s.add("n", 3) == 5  # type: ignore[attr-defined]
    assert s.get("n") == b"5"  # type: ignore[attr-defined]
    assert s.num_keys() >= 3  # type: ignore[attr-defined]
    assert s.check(["a", "n"])  # type: ignore[attr-defined]
    assert not s.check(["a", "missing"])  # type: ignore[attr-defined]
    assert s.delete_key("a")  # type: ignore[attr-defined]
    assert not s.delete_key("a")  # type: ignore[attr-defined]
    assert not s.check(["a"])  # type: ignore[attr-defined]


def test_compare_set(store: object) -> None:
    s = store
    assert s.compare_set("k", "x", "y") == b"x"  # type: ignore[attr-defined]
    assert s.compare_set("k", "", "first") == b"first"  # type: ignore[attr-defined]
    assert s.compare_set("k", "wrong", "second") == b"first"  # type: ignore[attr-defined]
    assert s.compare_set("k", "first", "second") == b"second"  # type: ignore[attr-defined]


def test_multi_get_and_set(store: object) -> None:
    s = store
    s.multi_set(["x", "y"], ["1", "2"])  # type: ignore[attr-defined]
    assert s.multi_get(["x", "y"]) == [b"1", b"2"]  # type: ignore[attr-defined]


def test_wait_and_get_time_out_with_dist_store_error(store: object) -> None:
    s = store
    s.set_timeout(timedelta(milliseconds=300))  # type: ignore[attr-defined]
    with pytest.raises(dist.DistStoreError):
        s.wait(["never"], timedelta(milliseconds=200))  # type: ignore[attr-defined]
    with pytest.raises(dist.DistStoreError):
        s.get("never")  # type: ignore[attr-defined]
    s.set("now", "here")  # type: ignore[attr-defined]
    s.wait(["now"])  # type: ignore[attr-defined]


def test_prefixes_separate_rounds(client: RendezvousClient) -> None:
    base = ServiceStore(client, timeout_s=1.0)
    one, two = base.with_prefix("round-1"), dist.PrefixStore("round-2", base)
    one.set("MASTER_PORT", "1000")
    two.set("MASTER_PORT", "2000")
    assert one.get("MASTER_PORT") == b"1000"
    assert two.get("MASTER_PORT") == b"2000"


def test_bad_values_raise_and_timeouts_are_validated(client: RendezvousClient) -> None:
    with pytest.raises(ConfigError, match="timeout_s"):
        ServiceStore(client, timeout_s=0)
    s = ServiceStore(client, timeout_s=1.0)
    s.set("text", "abc")
    with pytest.raises(RpcError, match="not an integer counter"):
        s.add("text", 1)
    assert s.get("text") == b"abc"


@pytest.mark.timeout(90)
def test_gloo_process_group_initialises_through_the_store(
    servicer_and_server: tuple[RendezvousServicer, GrpcServer], token: str
) -> None:
    address = servicer_and_server[1].address
    env = {**os.environ, "DLROVER_JOB_TOKEN": token}
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPTS / "store_allreduce.py"), address, str(rank), "2"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=75)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out
        assert "SUM 3" in out, out
