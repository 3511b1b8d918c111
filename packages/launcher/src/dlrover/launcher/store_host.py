"""The torch.distributed store of a rendezvous round, hosted by the agent of node rank 0.

As torchrun does (its c10d rendezvous with `TORCHELASTIC_USE_AGENT_STORE=True`), the agent of node
rank 0 opens a fresh `TCPStore` server for every round, before it publishes `host:port`, and every
worker of the round is a client of it (`torch.distributed.rendezvous._create_c10d_store` adds no
per-attempt prefix in that mode: it expects a fresh store per attempt). Compared with worker rank 0
hosting the store inside `init_process_group`:

- the server listens before any worker of any node starts, so no client connects early and sits in
  torch's connect backoff (measured here: up to a second lost per restart);
- the server binds port 0 and the agent publishes the port it really got, so no other process can
  take the port between a pick and the bind.

`StoreHost` is the seam: `TorchStoreHost` for real jobs, `FakeStoreHost` (in memory, records every
call) for tests of the agent.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from typing import Any, Protocol

import attrs

from dlrover.common import DLRoverError
from dlrover.common.validators import positive_finite

__all__ = ["FakeStoreHost", "StoreHost", "TorchStoreHost", "TorchStoreHostConfig"]


class StoreHost(Protocol):
    """Hosts at most one round's torch.distributed store at a time.

    Call order: `prepare` once when the agent starts; then, per round, `open` (node rank 0 only,
    before the address is published) and `close` (once the round's workers have stopped, and at
    agent exit). A store is never reused across rounds: workers of a new round must not see the
    keys of the previous one.
    """

    def prepare(self) -> None:
        """Start slow set-up (imports) in the background, so the first `open` does not wait long."""
        ...

    def open(self, host: str) -> int:
        """Start a fresh store server that listens before this returns.

        Args:
            host: the address other nodes reach this node at (workers connect to `host:port`).

        Returns:
            The port the server is bound to.

        Raises:
            DLRoverError: a store is already open (close it first), or the server could not start;
                either way no store is left open by this call.
        """
        ...

    def close(self) -> None:
        """Stop the open store, if any, so its port no longer listens. Idempotent."""
        ...


@attrs.frozen
class TorchStoreHostConfig:
    """How `TorchStoreHost` starts its servers.

    Attributes:
        store_timeout_s: the `TCPStore` timeout of the server's own connection to itself (its
            start-up check); the workers' clients use their process group's timeout.
        import_timeout_s: how long `open` waits for the background import of torch.distributed.
    """

    store_timeout_s: float = attrs.field(default=60.0, validator=positive_finite)
    import_timeout_s: float = attrs.field(default=300.0, validator=positive_finite)


class TorchStoreHost:
    """`StoreHost` on `torch.distributed.TCPStore` (public API only).

    torch.distributed is imported in a background thread started by `prepare` (a second or more
    on a small host), so the import overlaps the agent's registration and first rendezvous;
    `open` waits for it. Closing drops the only reference to the server, which stops it: the
    port stops listening at once, also while clients are still connected.

    Args:
        config: timeouts.
    """

    def __init__(self, config: TorchStoreHostConfig | None = None) -> None:
        self._config = config or TorchStoreHostConfig()
        self._lock = threading.Lock()
        self._import_done = threading.Event()
        self._import_thread: threading.Thread | None = None
        self._import_error: BaseException | None = None
        self._dist: Any = None  # the torch.distributed module once imported
        self._store: Any = None  # the open TCPStore server, if any
        self._host = ""

    @property
    def config(self) -> TorchStoreHostConfig:
        """The timeouts this host runs with."""
        return self._config

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) of the open store, or None when none is open."""
        with self._lock:
            return (self._host, int(self._store.port)) if self._store is not None else None

    def prepare(self) -> None:
        """Start importing torch.distributed in a daemon thread (once; later calls do nothing)."""
        with self._lock:
            if self._import_thread is not None:
                return
            # A daemon thread: an agent that exits while the import runs must not wait for it.
            self._import_thread = threading.Thread(target=self._import, name="dlrover-store-import", daemon=True)
            self._import_thread.start()

    def _import(self) -> None:
        try:
            import torch.distributed

            self._dist = torch.distributed
        except BaseException as exc:  # reported by `open`, which is where it matters
            self._import_error = exc
        finally:
            self._import_done.set()

    def _torch_distributed(self) -> Any:
        self.prepare()
        timeout_s = self._config.import_timeout_s
        if not self._import_done.wait(timeout_s):
            raise DLRoverError(f"importing torch.distributed took longer than import_timeout_s={timeout_s} s")
        if self._import_error is not None:
            error = self._import_error
            raise DLRoverError(f"cannot host the round's store: importing torch.distributed failed: {error}")
        if not self._dist.is_available():
            raise DLRoverError("cannot host the round's store: this torch build has no torch.distributed")
        return self._dist

    def open(self, host: str) -> int:
        """Start a `TCPStore` server on port 0 and return the port it bound (see `StoreHost.open`)."""
        if not host:
            raise DLRoverError("cannot open a store on an empty host address")
        dist = self._torch_distributed()
        with self._lock:
            if self._store is not None:
                raise DLRoverError(
                    f"a store is already open on {self._host}:{self._store.port}; close it before opening another"
                )
            try:
                # Port 0: the kernel picks a free port while binding, so nothing can take it
                # between a pick and the bind. The constructor returns once the server listens.
                store = dist.TCPStore(
                    host,
                    0,
                    is_master=True,
                    wait_for_workers=False,
                    timeout=datetime.timedelta(seconds=self._config.store_timeout_s),
                )
            except (RuntimeError, ValueError, OSError) as exc:  # torch's DistError is a RuntimeError
                raise DLRoverError(f"cannot start the round's store on {host}: {exc}") from exc
            self._store, self._host = store, host
            return int(store.port)

    def close(self) -> None:
        """Drop the only reference to the open server, which stops it and frees its port."""
        with self._lock:
            self._store = None
            self._host = ""


class FakeStoreHost:
    """An in-memory `StoreHost` for tests: no sockets; every call recorded in order.

    Ports are handed out from `first_port` up, so each round's store is told apart by its port.

    Args:
        first_port: the port of the first store opened.
        fail_open: `open` raises `DLRoverError` (and opens nothing), as a server that cannot start.
        on_close: called before each close of an open store, e.g. to check the workers have stopped.

    Attributes:
        calls: ("prepare", ""), ("open", "host:port") and ("close", "host:port") in call order;
            a close with no store open is recorded as ("close", "").
    """

    def __init__(
        self,
        *,
        first_port: int = 40000,
        fail_open: bool = False,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._next_port = first_port
        self._fail_open = fail_open
        self._on_close = on_close
        self._open: str | None = None
        self.calls: list[tuple[str, str]] = []

    @property
    def is_open(self) -> bool:
        """Whether a store is open now."""
        return self._open is not None

    @property
    def opened(self) -> list[str]:
        """`host:port` of every store opened, in order."""
        return [what for call, what in self.calls if call == "open"]

    def prepare(self) -> None:
        """Record the call."""
        self.calls.append(("prepare", ""))

    def open(self, host: str) -> int:
        """Record the call and hand out the next port (see `StoreHost.open`)."""
        if not host:
            raise DLRoverError("cannot open a store on an empty host address")
        if self._open is not None:
            raise DLRoverError(f"a store is already open on {self._open}; close it before opening another")
        if self._fail_open:
            raise DLRoverError(f"cannot start the round's store on {host}: scripted failure")
        port = self._next_port
        self._next_port += 1
        self._open = f"{host}:{port}"
        self.calls.append(("open", self._open))
        return port

    def close(self) -> None:
        """Record the call; the open store, if any, is closed."""
        if self._open is not None and self._on_close is not None:
            self._on_close()
        self.calls.append(("close", self._open or ""))
        self._open = None
