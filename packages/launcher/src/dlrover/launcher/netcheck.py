"""`dlrover-run --network-check`: probe the round's nodes in pairs before any worker starts.

After a rendezvous round completes, every agent of the round runs `NetworkCheck.run`:

1. Round one pairs neighbours (`dlrover.rendezvous.plan_round_one` over the node ranks: every
   agent computes the same plan). Each pair's first node picks a port, publishes `host:port` in
   the master's key-value store and hosts the pair's TCPStore; each node runs its side of the
   probe (`python -m dlrover.launcher.netcheck_probe`: matrix products, all-reduce, all-gather)
   in a child process killed after `probe_timeout_s`, and publishes its side's result.
2. When round one found a suspect (a failed pair, a slow one), round two re-pairs the suspects
   with nodes that did well (`plan_round_two`), never repeating a round-one pair; a faulty node
   left without a new partner (both nodes of a two-node round) probes itself alone, which tells
   a broken node from a broken link (`netcheck_plan.plan_second_phase`, `with_solos`).
3. Every agent reads all results back and computes `judge`: the faulty nodes (failed with every
   partner) and the stragglers. `dlrover.launcher.netcheck_plan.decide` says what this node does.

Before any probe, each node publishes the check's settings under a write-once key of the round;
a node whose settings differ from what is there refuses (`NetworkCheckSettingsMismatch`).

Keys live under `dlrover/launcher/round/<round>/netcheck/`, so no round reads another's results;
each node deletes the keys it wrote at the start of its next check. Every store call is retried
while the master is unreachable, up to a bound (`NetworkCheckStoreLost` after it).
Every result is written once (compare-and-set on an absent key). An agent that waits in vain for
a node's result until `results_timeout_s` writes a "missing" result in its place the same way, so
every agent reads the same value for every key and reaches the same verdict, even when a late
result races the timeout.

A round of one node probes itself alone (a world of one: the matrix products and the
collectives' code path), which catches obviously broken compute.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, Protocol, TypeVar

import attrs

from dlrover.common import Clock, ConfigError, DLRoverError, SystemClock, format_host_port
from dlrover.launcher.control import RoundAssignment
from dlrover.launcher.inprocess import InMemoryRoundStore, free_port
from dlrover.launcher.netcheck_members import MemberReport, may_skip, member_key, membership_digest
from dlrover.launcher.netcheck_plan import (
    CheckAction,
    CheckOutcome,
    PairOutcome,
    SideResult,
    check_round,
    combine,
    decide_single,
    describe_pairs,
    pairs_of,
    settings_key,
    side_key,
    solo_key,
    store_key,
)
from dlrover.rendezvous import Pair

__all__ = [
    "InMemoryRoundStore",
    "NetworkCheck",
    "NetworkCheckConfig",
    "NetworkCheckSettingsMismatch",
    "NetworkCheckStopped",
    "NetworkCheckStoreLost",
    "RoundStore",
]

_log = logging.getLogger(__name__)
_STDERR_TAIL = 2000
_T = TypeVar("_T")


def _never() -> bool:
    return False


def _nothing() -> None:
    return None


def _positive_finite(_inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"NetworkCheckConfig.{attribute.name} must be a finite number > 0, got {value!r}")


def _results_timeout(inst: NetworkCheckConfig, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is None:
        return
    _positive_finite(inst, attribute, value)
    if value < inst.probe_timeout_s:
        raise ConfigError(
            f"NetworkCheckConfig.results_timeout_s ({value!r}) must be at least probe_timeout_s "
            f"({inst.probe_timeout_s!r}): nodes wait for each other's probes"
        )


def _factor(_inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value >= 1):
        raise ConfigError(f"NetworkCheckConfig.{attribute.name} must be a finite number >= 1, got {value!r}")


def _count(_inst: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"NetworkCheckConfig.{attribute.name} must be an integer >= 1, got {value!r}")


@attrs.frozen
class NetworkCheckConfig:
    """How the network check runs. Every node of a job must use the same settings.

    Attributes:
        probe_timeout_s: the longest one probe may take once its pair's store address is
            known (what is left of its process's torch import included: processes start
            ahead, while their node waits); also the probe's process-group timeout. A probe
            still running then is killed and its side fails (`--network-check-timeout`).
        results_timeout_s: how long a node waits, from the start of a check round, for every
            node's results; a node with none by then counts as failed. None: twice
            `probe_timeout_s` (a node probes at most twice per round) plus 60 s for nodes
            that reach the check later than others (`--network-check-results-timeout`).
        straggler_factor: a node whose best probe time is over this multiple of the median is a
            straggler (`--straggler-factor`).
        exclude_stragglers: whether a straggler leaves the job like a faulty node
            (`--exclude-straggler`); otherwise it is only named in the log.
        poll_interval_s: the longest pause between two reads of the store while waiting.
        matmul_size: side of the probe's square matrices.
        collective_numel: float32 elements in each of the probe's all-reduces and all-gathers.
        store_retry_s: how long the check keeps retrying a store read or write while the
            master cannot be reached (it may be restarting) before it gives up; the agent
            passes its `master_lost_timeout_s` to `NetworkCheck.run` instead.
    """

    probe_timeout_s: float = attrs.field(default=60.0, validator=_positive_finite)
    results_timeout_s: float | None = attrs.field(default=None, validator=_results_timeout)
    straggler_factor: float = attrs.field(default=2.0, validator=_factor)
    exclude_stragglers: bool = False
    poll_interval_s: float = attrs.field(default=0.5, validator=_positive_finite)
    matmul_size: int = attrs.field(default=256, validator=_count)
    collective_numel: int = attrs.field(default=262_144, validator=_count)
    store_retry_s: float = attrs.field(default=300.0, validator=_positive_finite)

    def settings(self) -> bytes:
        """The settings every node of a round must share, as canonical JSON (published per round)."""
        shared = {
            # 2: nodes exchange `MemberReport`s before probing; a node that does not would probe
            # while the others wait for its report, so mixed versions must refuse each other.
            "protocol": 2,
            "probe_timeout_s": self.probe_timeout_s,
            "results_wait_s": self.results_wait_s,
            "straggler_factor": self.straggler_factor,
            "exclude_stragglers": self.exclude_stragglers,
            "matmul_size": self.matmul_size,
            "collective_numel": self.collective_numel,
        }
        return json.dumps(shared, sort_keys=True).encode()

    @property
    def results_wait_s(self) -> float:
        """The results timeout in effect."""
        if self.results_timeout_s is not None:
            return self.results_timeout_s
        return 2 * self.probe_timeout_s + 60.0


class RoundStore(Protocol):
    """The part of the master's key-value store the check uses (`GrpcControlPlane` has it).

    Implementations raise `DLRoverError` subclasses when the store cannot be reached.
    """

    def kv_get(self, keys: Sequence[str]) -> list[bytes | None]:
        """The value of each key, None for each that is not set."""
        ...

    def kv_compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set `key` to `desired` if it holds `expected` (absent counts as b""); returns what it holds."""
        ...

    def kv_delete(self, key: str) -> bool:
        """Delete `key`; whether it was set."""
        ...


class NetworkCheckStopped(DLRoverError):
    """The agent was asked to stop while the check ran; its probe process was killed."""


class NetworkCheckStoreLost(DLRoverError):
    """The master's store stayed unreachable for longer than the check's retry bound."""


class NetworkCheckSettingsMismatch(ConfigError):
    """This node's check settings differ from those the round's first node published."""


class _ProbeProcess:
    """One probe child: its own session, a parent-death signal, output in anonymous temp files.

    It starts at once and imports torch; `go` tells it where its pair meets.
    """

    def __init__(self, python: str, args: Sequence[str], env: Mapping[str, str]) -> None:
        argv = [python, "-m", "dlrover.launcher.netcheck_probe", "--parent-pid", str(os.getpid()), *args]
        self._out: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self._err: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        try:
            self._proc = subprocess.Popen(
                argv,
                env=dict(env),
                stdin=subprocess.PIPE,
                stdout=self._out,
                stderr=self._err,
                start_new_session=True,
            )
        except BaseException:
            self._out.close()
            self._err.close()
            raise

    def go(self, rank: int, world_size: int, host: str, port: int, *, master: bool) -> None:
        """Send the probe its request; a process that already died is seen by `poll`."""
        request = {"rank": rank, "world_size": world_size, "store_host": host, "store_port": port}
        line = json.dumps({**request, "store_master": master}) + "\n"
        assert self._proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, OSError):
            self._proc.stdin.write(line.encode())
            self._proc.stdin.close()

    def poll(self) -> SideResult | None:
        """This side's result once the process has exited; None while it runs."""
        code = self._proc.poll()
        if code is None:
            return None
        self._out.seek(0)
        lines = [line for line in self._out.read().decode("utf-8", "replace").splitlines() if line.strip()]
        if code in (0, 1) and lines:
            side = SideResult.decode(lines[-1].encode())
            if not side.error.startswith("unreadable probe result"):
                return side
        self._err.seek(0)
        tail = self._err.read()[-_STDERR_TAIL:].decode("utf-8", "replace").strip()
        if code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        return SideResult(False, 0.0, f"the probe process {how}" + (f": {tail}" if tail else ""))

    def kill(self) -> None:
        """Kill the probe and everything it started, and reap it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()

    def close(self) -> None:
        """Kill the process if it still runs, reap it, and drop its pipe and output files."""
        if self._proc.poll() is None:
            self.kill()
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        self._out.close()
        self._err.close()


class NetworkCheck:
    """Runs the network check of one node, round after round.

    Args:
        config: timeouts and verdict settings.
        store: the master's key-value store.
        local_addr: the address other nodes reach this node at (the pair's TCPStore listens there).
        environ: the environment of the probe processes (normally the agent's own).
        clock: time source of every timeout.
        python: the interpreter that runs the probes.
    """

    def __init__(
        self,
        config: NetworkCheckConfig,
        store: RoundStore,
        *,
        local_addr: str,
        environ: Mapping[str, str] | None = None,
        clock: Clock | None = None,
        python: str = sys.executable,
    ) -> None:
        if not local_addr:
            raise ConfigError("the network check needs this node's address (local_addr), got ''")
        self._config = config
        self._store = store
        self._local_addr = local_addr
        self._environ = {**(os.environ if environ is None else environ), "PYTHONUNBUFFERED": "1"}
        self._clock = clock or SystemClock()
        self._python = python
        self._should_stop: Callable[[], bool] = _never
        self._keepalive: Callable[[], None] = _nothing
        self._spares: list[_ProbeProcess] = []
        self._store_retry_s = config.store_retry_s
        # Keys this node wrote in its last check, deleted at the start of its next one: by then
        # every node of that round has read the verdict (a new round completes only once its
        # nodes are done with the last one), and the master journals its whole store.
        self._written: list[str] = []
        self._writing: list[str] = []
        # `membership_digest` of the nodes of the last check this node passed ("" none): the
        # same nodes, all having passed together, skip the next check (netcheck_members).
        self._passed = ""

    @property
    def config(self) -> NetworkCheckConfig:
        """The settings in use."""
        return self._config

    def run(
        self,
        assignment: RoundAssignment,
        *,
        should_stop: Callable[[], bool] = _never,
        keepalive: Callable[[], None] = _nothing,
        store_retry_s: float | None = None,
        node_id: str = "",
    ) -> CheckOutcome:
        """Check the nodes of `assignment`'s round; every node of the round must call this.

        The probes are skipped when every node of the round passed the probes together in its
        previous check (a restart after a worker failure), at most once per such pass: see
        `dlrover.launcher.netcheck_members`.

        Args:
            assignment: the completed round, as this node sees it.
            should_stop: polled while waiting; when it turns true the check ends at once.
            keepalive: called while waiting, so the agent can keep heartbeating the master.
            store_retry_s: how long to retry the master's store while it cannot be reached
                (the agent's `master_lost_timeout_s`); None: `config.store_retry_s`.
            node_id: this node's id with the master (the agent's). Every node of a round must
                pass one, or every node "", which turns the exchange off and probes every round.

        Returns:
            What this node does next, and why.

        Raises:
            NetworkCheckStopped: `should_stop()` turned true; no probe process is left running.
            NetworkCheckStoreLost: the master's store stayed unreachable past the retry bound.
            NetworkCheckSettingsMismatch: the round's first node published other settings.
        """
        self._should_stop, self._keepalive = should_stop, keepalive
        if store_retry_s is not None and not (math.isfinite(store_retry_s) and store_retry_s >= 0):
            raise ConfigError(f"store_retry_s must be a finite number >= 0, got {store_retry_s!r}")
        self._store_retry_s = self._config.store_retry_s if store_retry_s is None else store_retry_s
        # A pass is good for one skip: it is cleared here whatever happens next, and only a check
        # whose probes ran and found nothing to warn about records a new one.
        passed, self._passed = self._passed, ""
        try:
            self._delete_previous()
            if assignment.group_world_size > 1:
                self._check_settings(assignment.round)
            members, absent, skip = self._exchange_members(assignment, node_id, passed)
            n = assignment.group_world_size
            if absent:
                # Every node read the same missing markers: all start a new round without them,
                # rather than wait for them a second time in the probes.
                outcome = CheckOutcome(
                    CheckAction.NEW_ROUND,
                    f"network check of round {assignment.round}: node(s) {', '.join(absent)} did not report "
                    f"within the network check's results timeout of {self._config.results_wait_s:g} s; "
                    "a new round without them",
                )
            elif skip:
                outcome = CheckOutcome(
                    CheckAction.TRAIN,
                    f"network check of round {assignment.round} skipped: its {n} node(s) passed the check "
                    "together in the round before and none joined or left since",
                )
            else:
                outcome = self._probe(assignment)
                if outcome.action is CheckAction.TRAIN and not outcome.warnings:
                    self._passed = members
        finally:
            self._should_stop, self._keepalive = _never, _nothing
            for spare in self._spares:
                spare.close()
            self._spares = []
            self._written, self._writing = self._written + self._writing, []
        for warning in outcome.warnings:
            _log.warning("network check of round %d: %s", assignment.round, warning)
        _log.info("%s", outcome.reason)
        return outcome

    def _exchange_members(self, assignment: RoundAssignment, node_id: str, passed: str) -> tuple[str, list[str], bool]:
        """Publish this node's `MemberReport` and read every node's.

        Returns:
            (this round's `membership_digest`, "" unless every report was read; the node ranks
            whose report is missing or damaged; whether every node skips the probes).
        """
        if not node_id:
            return "", [], False
        deadline = self._clock.now() + self._config.results_wait_s
        self._write_once(
            member_key(assignment.round, str(assignment.group_rank)), MemberReport(node_id, passed).encode()
        )
        keys = [member_key(assignment.round, str(node)) for node in range(assignment.group_world_size)]
        reports = [MemberReport.decode(value) for value in self._collect_keys(keys, deadline)]
        absent = [str(node) for node, report in enumerate(reports) if report is None]
        members = "" if absent else membership_digest([r.node_id for r in reports if r is not None])
        return members, absent, may_skip(reports) is not None

    def _probe(self, assignment: RoundAssignment) -> CheckOutcome:
        """Probe the round's nodes: alone for a round of one, else in pairs."""
        if assignment.group_world_size > 1:
            return self._check_pairs(assignment)
        proc = self._spawn()
        try:
            proc.go(0, 1, "127.0.0.1", free_port("127.0.0.1"), master=True)
            side = self._await(proc)
        finally:
            proc.close()
        return decide_single(assignment.round, side)

    def _delete_previous(self) -> None:
        """Delete the keys this node wrote in its previous check (see `__init__`)."""
        left = []
        for key in self._written:
            try:
                self._store.kv_delete(key)
            except DLRoverError as exc:
                # Only journal size is at stake: try again at the next check.
                _log.warning("could not delete the network check key %s: %s", key, exc)
                left.append(key)
        self._written = left

    def _check_settings(self, round_number: int) -> None:
        """Refuse to check a round whose first node published other settings than this node's."""
        mine = self._config.settings()
        held = self._write_once(settings_key(round_number), mine)
        if held != mine:
            raise NetworkCheckSettingsMismatch(
                f"this node's network check settings {mine.decode()} differ from the ones of round "
                f"{round_number}'s other nodes {held.decode('utf-8', 'replace')}: every node must run "
                "dlrover-run with the same --network-check-timeout, --network-check-results-timeout, "
                "--straggler-factor and --exclude-straggler"
            )

    def _check_pairs(self, assignment: RoundAssignment) -> CheckOutcome:
        me = str(assignment.group_rank)

        def probe(phase: int, pairs: Sequence[Pair]) -> list[PairOutcome]:
            return self._phase(assignment.round, phase, pairs, me)

        def solo(phase: int, nodes: Sequence[str]) -> dict[str, SideResult]:
            return self._solo(assignment.round, phase, nodes, me)

        return check_round(
            assignment.round,
            assignment.group_world_size,
            me,
            probe,
            straggler_factor=self._config.straggler_factor,
            exclude_stragglers=self._config.exclude_stragglers,
            solo=solo,
        )

    def _solo(self, round_number: int, phase: int, nodes: Sequence[str], me: str) -> dict[str, SideResult]:
        """Probe this node alone if it is named, publish that, and read every named node's result."""
        deadline = self._clock.now() + self._config.results_wait_s
        _log.info("network check of round %d, check round %d: nodes %s probe alone", round_number, phase, nodes)
        if me in nodes:
            proc = self._spares.pop() if self._spares else self._spawn()
            try:
                proc.go(0, 1, "127.0.0.1", free_port("127.0.0.1"), master=True)
                side = self._await(proc)
            finally:
                proc.close()
            self._write_once(solo_key(round_number, phase, me), side.encode())
        values = self._collect_keys([solo_key(round_number, phase, node) for node in nodes], deadline)
        return {node: SideResult.decode(value) for node, value in zip(nodes, values, strict=True)}

    def _spawn(self) -> _ProbeProcess:
        cfg = self._config
        args = (
            "--timeout-s",
            repr(cfg.probe_timeout_s),
            "--matmul-size",
            str(cfg.matmul_size),
            "--collective-numel",
            str(cfg.collective_numel),
        )
        return _ProbeProcess(self._python, args, self._environ)

    def _phase(self, round_number: int, phase: int, pairs: Sequence[Pair], me: str) -> list[PairOutcome]:
        deadline = self._clock.now() + self._config.results_wait_s
        _log.info("network check of round %d, check round %d: pairs %s", round_number, phase, pairs)
        mine = pairs_of(pairs, me)
        # One process per probe, all started now: their torch imports overlap with each other
        # and with the waits for the pairs' store addresses.
        procs: list[_ProbeProcess] = []
        try:
            for _ in mine:
                procs.append(self._spares.pop() if self._spares else self._spawn())
            for (index, pair), proc in zip(mine, procs, strict=True):
                side = self._run_side(proc, round_number, phase, index, pair, me=me, deadline=deadline)
                published = side.encode()
                held = self._write_once(side_key(round_number, phase, index, me), published)
                if held != published:
                    _log.warning(
                        "this node's result of pair %s came after the results timeout and was recorded as missing",
                        pair,
                    )
            if phase == 1:
                # One more process for a possible round two, started once this node's own probes
                # are done (so it disturbs none of them): round two then begins warm. It is
                # killed at the end of the check if round two is not needed.
                self._spares.append(self._spawn())
        finally:
            for proc in procs:
                proc.close()
        outcomes = combine(phase, pairs, self._collect(round_number, phase, pairs, deadline))
        _log.info("network check of round %d, check round %d:\n%s", round_number, phase, describe_pairs(outcomes))
        return outcomes

    def _run_side(
        self, proc: _ProbeProcess, round_number: int, phase: int, index: int, pair: Pair, *, me: str, deadline: float
    ) -> SideResult:
        first, second = pair
        partner = second if me == first else first
        partner_key = side_key(round_number, phase, index, partner)
        address_key = store_key(round_number, phase, index)
        if me == first:
            dead = proc.poll()
            if dead is not None:
                # Publishing an address nobody will listen on would only make the partner wait.
                return dead
            address = format_host_port(self._local_addr, free_port(self._local_addr))
            held = self._write_once(address_key, address.encode()).decode("utf-8", "replace")
        else:
            found = self._wait_for_address(proc, address_key, partner_key, partner, deadline)
            if isinstance(found, SideResult):
                return found
            held = found
        host, _, port_text = held.rpartition(":")
        try:
            port = int(port_text)
        except ValueError:
            return SideResult(False, 0.0, f"the pair's store address {held!r} is not host:port")
        proc.go(0 if me == first else 1, 2, host.strip("[]"), port, master=me == first)
        return self._await(proc, partner_key=partner_key, partner=partner)

    def _wait_for_address(
        self, proc: _ProbeProcess, address_key: str, partner_key: str, partner: str, deadline: float
    ) -> str | SideResult:
        interval = 0.02
        while True:
            dead = proc.poll()
            if dead is not None:
                return dead
            address, partner_side = self._read([address_key, partner_key])
            if address is not None:
                return address.decode("utf-8", "replace")
            if partner_side is not None:
                why = SideResult.decode(partner_side).error
                return SideResult(False, 0.0, f"partner node {partner} finished without hosting the probe: {why}")
            if self._clock.now() >= deadline:
                return SideResult(
                    False,
                    0.0,
                    f"partner node {partner} did not publish the pair's store address within the results "
                    f"timeout of {self._config.results_wait_s:g} s",
                )
            interval = self._pause(interval)

    def _await(self, proc: _ProbeProcess, *, partner_key: str = "", partner: str = "") -> SideResult:
        """Wait for a probe that has its request, up to `probe_timeout_s`; kill it if need be."""
        cfg = self._config
        started = self._clock.now()
        next_look = started
        while True:
            side = proc.poll()
            if side is not None:
                return side
            now = self._clock.now()
            if now - started >= cfg.probe_timeout_s:
                proc.kill()
                return SideResult(
                    False, 0.0, f"the probe did not finish within --network-check-timeout {cfg.probe_timeout_s:g} s"
                )
            if self._should_stop():
                raise NetworkCheckStopped("stopped during the network check")
            if partner_key and now >= next_look:
                # A failed partner fails the pair whatever this side does: stop waiting on it.
                next_look = now + cfg.poll_interval_s
                (raw,) = self._read([partner_key])
                if raw is not None and not (theirs := SideResult.decode(raw)).ok:
                    proc.kill()
                    return SideResult(False, 0.0, f"stopped: partner node {partner}'s side failed: {theirs.error}")
            self._keepalive()
            self._clock.sleep(0.05)

    def _collect(
        self, round_number: int, phase: int, pairs: Sequence[Pair], deadline: float
    ) -> dict[tuple[int, str], SideResult]:
        wanted = [(index, node) for index, pair in enumerate(pairs) for node in pair]
        values = self._collect_keys([side_key(round_number, phase, index, node) for index, node in wanted], deadline)
        return dict(zip(wanted, (SideResult.decode(value) for value in values), strict=True))

    def _collect_keys(self, keys: Sequence[str], deadline: float) -> list[bytes]:
        """Wait for every key; at the deadline, write the missing marker into those still absent."""
        interval = 0.02
        while True:
            values = self._read(keys)
            if all(v is not None for v in values):
                return [v for v in values if v is not None]
            if self._clock.now() >= deadline:
                # Whatever is in the store after this is what every node reads: a late result
                # loses to the marker, and the verdict stays the same everywhere.
                marker = SideResult.missing(self._config.results_wait_s).encode()
                return [v if v is not None else self._write_once(k, marker) for k, v in zip(keys, values, strict=True)]
            interval = self._pause(interval)

    def _read(self, keys: Sequence[str]) -> list[bytes | None]:
        return self._retrying(f"read {keys[0]}", lambda: self._store.kv_get(keys))

    def _write_once(self, key: str, value: bytes) -> bytes:
        """Set an absent key; returns what it holds. Retried: a repeat cannot change what was written."""
        self._writing.append(key)
        return self._retrying(f"write {key}", lambda: self._store.kv_compare_set(key, b"", value))

    def _retrying(self, what: str, call: Callable[[], _T]) -> _T:
        """Run a store call, retrying with backoff while the master is unreachable, up to the bound."""
        lost_since: float | None = None
        wait = 0.25
        while True:
            try:
                return call()
            except DLRoverError as exc:
                now = self._clock.now()
                lost_since = now if lost_since is None else lost_since
                lost_s = now - lost_since
                if lost_s >= self._store_retry_s:
                    raise NetworkCheckStoreLost(
                        f"the network check could not {what} for {lost_s:.1f} s, giving up after "
                        f"{self._store_retry_s:g} s without the master: {exc}"
                    ) from exc
                _log.warning("network check: could not %s (master unreachable for %.1f s): %s", what, lost_s, exc)
                if self._should_stop():
                    raise NetworkCheckStopped("stopped during the network check") from exc
                self._keepalive()
                self._clock.sleep(min(wait, self._store_retry_s - lost_s))
                wait = min(wait * 2, 5.0)

    def _pause(self, interval: float) -> float:
        if self._should_stop():
            raise NetworkCheckStopped("stopped during the network check")
        self._keepalive()
        self._clock.sleep(interval)
        return min(interval * 2, self._config.poll_interval_s)
