from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from dlrover.common import ManualClock, generate_token
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.factory import create_master
from dlrover.master.runtime import MasterRuntime
from dlrover.master.scheduler.external import ExternalScheduler

MakeRuntime = Callable[..., MasterRuntime]


@pytest.fixture(autouse=True, scope="session")
def _own_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Masters that run with an environment stripped of DLROVER_* variables keep their default profile store
    ($XDG_CACHE_HOME/dlrover) in this session's own directory, never the user's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(autouse=True)
def _own_profile_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's masters record and plan from a store of their own, never the user's ~/.cache one."""
    store = tmp_path_factory.mktemp("profiles") / "profiles.sqlite"
    monkeypatch.setenv("DLROVER_PROFILE_STORE", str(store))


@pytest.fixture
def make_runtime() -> Iterator[MakeRuntime]:
    """Start masters on 127.0.0.1:0 with a manual clock (no timeouts fire unless a test advances it)."""
    started: list[MasterRuntime] = []

    def make(nodes: int = 2, *, max_message_bytes: int = 64 * 1024, **kw: object) -> MasterRuntime:
        cfg = MasterConfig(
            job_name="fuzz",
            lifecycle=LifecycleConfig(nodes=NodeRange(1, nodes), node_start_timeout_s=None),
            token=generate_token(),
            backend="external",
            tick_interval_s=3600.0,
            max_message_bytes=max_message_bytes,
            **kw,  # type: ignore[arg-type]
        )
        runtime = create_master(cfg, scheduler=ExternalScheduler(), clock=ManualClock())
        started.append(runtime)
        runtime.start()
        return runtime

    yield make
    for runtime in started:
        runtime.stop()
