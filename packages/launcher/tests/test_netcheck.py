"""`--network-check` for real: probe processes with gloo on 127.0.0.1, agents against a real master.

Faults are injected at a seam, the probe process itself (`DLROVER_NETWORK_CHECK_FAULT`): the probe
of the faulty node really crashes, hangs or multiplies larger matrices. No test asserts on time:
only on verdicts, reports and which workers ran.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import attrs
import psutil
import pytest

from dlrover.common import DLRoverError
from dlrover.launcher.agent import Agent, AgentConfig, AgentResult
from dlrover.launcher.control import RoundAssignment
from dlrover.launcher.fake_control import FakeControlPlane
from dlrover.launcher.grpc_control import GrpcControlPlane
from dlrover.launcher.netcheck import (
    InMemoryRoundStore,
    NetworkCheck,
    NetworkCheckConfig,
    NetworkCheckSettingsMismatch,
    NetworkCheckStopped,
    RoundStore,
)
from dlrover.launcher.netcheck_members import MemberReport, member_key, membership_digest
from dlrover.launcher.netcheck_plan import (
    NETWORK_CHECK_FAULT_ENV_VAR,
    CheckAction,
    CheckOutcome,
    SideResult,
    settings_key,
    side_key,
    solo_key,
)
from dlrover.master import MasterClient, MasterConfig, MasterRuntime, create_master
from dlrover.master.config import LifecycleConfig, NodeRange

WORKER = textwrap.dedent(
    """
    import json, os, sys
    out, name = sys.argv[1], sys.argv[2]
    keys = ["RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE"]
    with open(os.path.join(out, f"{name}_{os.getpid()}.json"), "w") as f:
        json.dump({k: os.environ[k] for k in keys}, f)
    """
)

# Generous: the probe process imports torch, which is slow on a loaded machine. A healthy probe
# never comes near it; only the hang test waits it out, with its own short value.
# Small collectives keep a healthy probe short next to the slow fault's large matrix products.
CHECK = NetworkCheckConfig(probe_timeout_s=90.0, results_timeout_s=240.0, poll_interval_s=0.2, collective_numel=16_384)


def _env(fault: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != NETWORK_CHECK_FAULT_ENV_VAR}
    if fault:
        env[NETWORK_CHECK_FAULT_ENV_VAR] = fault
    return env


def _probe_processes() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if any("netcheck_probe" in part for part in child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


def _run_threads(
    targets: Mapping[str, Callable[[], object]], timeout_s: float, stop: Callable[[], None] | None = None
) -> dict[str, object]:
    """Run each target in a thread of its own and wait up to `timeout_s` for all of them.

    Targets still running then are ended by `stop` (they are waited for once more, so that they
    clean up: an agent removes its shared memory on the way out) before the test fails.
    """
    results: dict[str, object] = {}
    errors: list[BaseException] = []

    def call(name: str, fn: Callable[[], object]) -> None:
        try:
            results[name] = fn()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=item, daemon=True) for item in targets.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    stuck = [name for name, t in zip(targets, threads, strict=True) if t.is_alive()]
    if stuck and stop is not None:
        stop()
        for t in threads:
            t.join(45)
    assert not stuck, f"node(s) {stuck} never finished"
    assert not errors, errors
    return results


# -- the store the check publishes through ---------------------------------------------------------


def _master(nodes: NodeRange, last_call_s: float) -> MasterConfig:
    return MasterConfig(
        backend="external",
        lifecycle=LifecycleConfig(nodes=nodes, heartbeat_timeout_s=30.0, node_start_timeout_s=None),
        heartbeat_interval_s=0.5,
        tick_interval_s=0.1,
        rendezvous_last_call_s=last_call_s,
    )


@pytest.fixture
def master() -> Iterator[MasterRuntime]:
    # 2 to 3 nodes, with a last call long enough for all three agents (threads of this test) to
    # make the first round.
    with create_master(_master(NodeRange(2, 3), 3.0)) as runtime:
        yield runtime


@pytest.fixture
def pair_master() -> Iterator[MasterRuntime]:
    with create_master(_master(NodeRange(2, 2), 0.1)) as runtime:
        yield runtime


def _plane(runtime: MasterRuntime, name: str) -> GrpcControlPlane:
    return GrpcControlPlane(
        runtime.address,
        runtime.token,
        node_name=name,
        host="localhost",
        local_addr="127.0.0.1",
        min_nodes=runtime.master.config.lifecycle.nodes.min_nodes,
        max_nodes=runtime.master.config.lifecycle.nodes.max_nodes,
    )


def _contract(store: RoundStore) -> None:
    assert store.kv_get(["netcheck-contract/a", "netcheck-contract/b"]) == [None, None]
    assert store.kv_compare_set("netcheck-contract/a", b"", b"first") == b"first"
    # Written once: a second writer gets the first value back and changes nothing.
    assert store.kv_compare_set("netcheck-contract/a", b"", b"second") == b"first"
    assert store.kv_get(["netcheck-contract/a", "netcheck-contract/b"]) == [b"first", None]


@pytest.mark.parametrize("make", [InMemoryRoundStore, FakeControlPlane])
def test_in_memory_stores_keep_the_round_store_contract(make: Callable[[], RoundStore]) -> None:
    _contract(make())


@pytest.mark.integration
def test_the_masters_store_keeps_the_round_store_contract(master: MasterRuntime) -> None:
    plane = _plane(master, "contract")
    try:
        _contract(plane)
    finally:
        plane.close()


# -- one node: the probe alone ---------------------------------------------------------------------


def _single_agent(tmp_path: Path, fault: str, config: NetworkCheckConfig) -> tuple[AgentResult, FakeControlPlane]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    control = FakeControlPlane()
    check = NetworkCheck(config, control, local_addr="127.0.0.1", environ=_env(fault))
    agent = Agent(
        AgentConfig(worker_argv=(sys.executable, str(script), str(out), "solo"), monitor_interval_s=0.05),
        control,
        environ=_env(fault),
        network_check=check,
    )
    return agent.run(), control


@pytest.mark.integration
def test_a_single_node_probes_itself_and_then_trains(tmp_path: Path) -> None:
    result, control = _single_agent(tmp_path, "", CHECK)
    assert result.exit_code == 0, result.reason
    assert control.failures == []
    assert len(list((tmp_path / "out").glob("solo_*.json"))) == 1


@pytest.mark.integration
def test_a_hung_probe_is_killed_at_the_timeout_and_its_node_reported_and_not_trained(tmp_path: Path) -> None:
    result, control = _single_agent(tmp_path, "hang", NetworkCheckConfig(probe_timeout_s=3.0))
    assert result.exit_code == 1
    assert "network check" in result.reason
    (report,) = control.failures
    assert report.network_check
    assert "did not finish within --network-check-timeout 3 s" in report.evidence
    assert control.left == 1
    assert list((tmp_path / "out").glob("*.json")) == [], "a node that failed the check must not train"
    assert _probe_processes() == [], "the hung probe outlived the check"
    # No worker ran, so these heartbeats kept the node alive during the check.
    assert control.heartbeats


@pytest.mark.integration
def test_a_stop_request_during_the_check_kills_the_probe_and_ends_the_agent(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    control = FakeControlPlane()
    check = NetworkCheck(
        NetworkCheckConfig(probe_timeout_s=100.0), control, local_addr="127.0.0.1", environ=_env("hang")
    )
    agent = Agent(
        AgentConfig(worker_argv=(sys.executable, str(script), str(tmp_path), "solo")),
        control,
        network_check=check,
    )
    stopped = threading.Event()

    def stop_once_probing() -> None:
        for _ in range(600):
            if _probe_processes():
                agent.request_stop("test stop")
                stopped.set()
                return
            threading.Event().wait(0.1)

    stopper = threading.Thread(target=stop_once_probing, daemon=True)
    stopper.start()
    result = agent.run()
    stopper.join(5)
    assert stopped.is_set(), "the probe process never appeared"
    assert (result.exit_code, result.reason) == (128 + 15, "test stop")
    assert control.failures == []
    assert _probe_processes() == []
    assert list(tmp_path.glob("solo_*.json")) == []


@pytest.mark.integration
def test_dlrover_run_reports_a_node_that_fails_the_check_and_exits_without_training(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cmd = [sys.executable, "-m", "dlrover.launcher.cli", "--standalone", "--network-check"]
    proc = subprocess.run(
        [*cmd, "--network-check-timeout=90", str(script), str(tmp_path), "cli"],
        cwd=tmp_path,  # where worker logs would go without --log-dir
        env=_env("exit"),
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-4000:]
    assert "this node's probe failed" in output
    assert "reported to the master" in output
    assert list(tmp_path.glob("cli_*.json")) == []


# -- several nodes: pairs, two check rounds, one verdict -------------------------------------------


def _check_nodes(
    faults: Mapping[int, str],
    config: NetworkCheckConfig,
    world: int = 3,
    store: InMemoryRoundStore | None = None,
    checks: dict[int, NetworkCheck] | None = None,
) -> dict[int, CheckOutcome]:
    store = store or InMemoryRoundStore()
    checks = {} if checks is None else checks

    def node(rank: int) -> Callable[[], object]:
        check = NetworkCheck(config, store, local_addr="127.0.0.1", environ=_env(faults.get(rank, "")))
        checks[rank] = check
        return lambda: check.run(RoundAssignment(5, rank, world, "127.0.0.1", 1))

    results = _run_threads({str(rank): node(rank) for rank in range(world)}, timeout_s=300)
    return {int(name): outcome for name, outcome in results.items()}  # type: ignore[misc]


class _FlakyStore(InMemoryRoundStore):
    """A store whose first writes fail as if the master were briefly unreachable."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def kv_compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        if self.failures > 0:
            self.failures -= 1
            raise DLRoverError("the master is unreachable (scripted)")
        return super().kv_compare_set(key, expected, desired)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_node_that_never_reports_is_recorded_missing_once_for_every_node() -> None:
    store = _FlakyStore(failures=2)
    # The node that is there probes alone in check round two, within probe_timeout_s: a real
    # process that imports torch, which took over 10 s on a loaded 2-core CI machine. The
    # absent node costs as much twice (the pair's host waits probe_timeout_s for it, and the
    # results timeout cannot be shorter; then the solo round waits for it again), so the test
    # lasts about a minute.
    config = NetworkCheckConfig(probe_timeout_s=30.0, results_timeout_s=30.0, poll_interval_s=0.1)
    check = NetworkCheck(config, store, local_addr="127.0.0.1", environ=_env())
    # Node rank 1 of the round never shows up.
    outcome = check.run(RoundAssignment(8, 0, 2, "127.0.0.1", 1))
    assert store.failures == 0, "the scripted write failures never happened"
    # The node that is there passed alone; the absent one is the one left out.
    assert outcome.action is CheckAction.NEW_ROUND
    assert "no result within the network check's results timeout of 30 s" in outcome.reason
    # The absent node's results, arriving late, cannot replace what every node has read.
    late = SideResult(True, 0.01).encode()
    for key in (side_key(8, 1, 0, "1"), solo_key(8, 2, "1")):
        assert not SideResult.decode(store.kv_compare_set(key, b"", late)).ok
    # Round two would only have repeated the pair: it was not probed again.
    assert store.kv_get([side_key(8, 2, 0, "0")]) == [None]
    assert _probe_processes() == []


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_of_two_nodes_only_the_one_whose_probe_crashes_leaves_and_its_partner_cleans_up() -> None:
    store = InMemoryRoundStore()
    checks: dict[int, NetworkCheck] = {}
    outcomes = _check_nodes({1: "exit"}, CHECK, world=2, store=store, checks=checks)
    assert outcomes[1].action is CheckAction.EXCLUDE_SELF, outcomes[1].reason
    assert "alone failed" in outcomes[1].reason
    assert outcomes[0].action is CheckAction.NEW_ROUND, outcomes[0].reason
    assert outcomes[0].verdict == outcomes[1].verdict
    assert _probe_processes() == []
    # Node 0's next check (refused here at once: other settings were published for round 6)
    # first deletes every key node 0 wrote in round 5. Node 1 left the job, so its own two
    # results stay: the leak is bounded by the nodes that leave, not by the rounds.
    store.kv_compare_set(settings_key(6), b"", b"{}")
    with pytest.raises(NetworkCheckSettingsMismatch):
        checks[0].run(RoundAssignment(6, 0, 2, "127.0.0.1", 1))
    assert store.keys() == sorted([side_key(5, 1, 0, "1"), solo_key(5, 2, "1"), settings_key(6)])


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_slow_node_is_found_as_a_straggler_and_left_out_with_exclude_straggler() -> None:
    outcomes = _check_nodes({2: "slow"}, attrs.evolve(CHECK, exclude_stragglers=True))
    verdicts = [o.verdict for o in outcomes.values()]
    assert all(v == verdicts[0] for v in verdicts), "the nodes disagree"
    assert verdicts[0] is not None
    assert verdicts[0].faulty == ()
    assert verdicts[0].stragglers == ("2",)
    assert outcomes[2].action is CheckAction.EXCLUDE_SELF
    assert "straggler" in outcomes[2].evidence
    assert outcomes[0].action is outcomes[1].action is CheckAction.NEW_ROUND
    assert _probe_processes() == []


# -- agents against a real master ------------------------------------------------------------------


def _agents(
    master: MasterRuntime,
    tmp_path: Path,
    faults: Mapping[str, str],
    names: list[str],
    *,
    worker: str = WORKER,
    max_restarts: int = 0,
) -> dict[str, AgentResult]:
    script = tmp_path / "worker.py"
    script.write_text(worker)
    out = tmp_path / "out"
    out.mkdir()
    planes = {name: _plane(master, name) for name in names}

    def agent(name: str) -> Callable[[], object]:
        env = _env(faults.get(name, ""))
        check = NetworkCheck(CHECK, planes[name], local_addr="127.0.0.1", environ=env)
        config = AgentConfig(
            worker_argv=(sys.executable, str(script), str(out), name),
            run_id="netcheck",
            monitor_interval_s=0.05,
            shutdown_grace_s=5.0,
            rendezvous_timeout_s=240.0,
            max_restarts=max_restarts,
        )
        agents[name] = Agent(config, planes[name], environ=env, network_check=check)
        return agents[name].run

    agents: dict[str, Agent] = {}

    def stop() -> None:
        for running in agents.values():
            running.request_stop("the test's timeout")

    try:
        results = _run_threads({name: agent(name) for name in names}, timeout_s=300, stop=stop)
    finally:
        for plane in planes.values():
            plane.close()
    return {name: r for name, r in results.items() if isinstance(r, AgentResult)}


def _records(tmp_path: Path, name: str) -> list[dict[str, str]]:
    return [json.loads(p.read_text()) for p in (tmp_path / "out").glob(f"{name}_*.json")]


@pytest.mark.integration
@pytest.mark.timeout(360)
def test_two_agents_pass_the_check_and_train(pair_master: MasterRuntime, tmp_path: Path) -> None:
    master = pair_master
    results = _agents(master, tmp_path, {}, ["a", "b"])
    assert {n: r.exit_code for n, r in results.items()} == {"a": 0, "b": 0}, results
    for name in ("a", "b"):
        assert [r["WORLD_SIZE"] for r in _records(tmp_path, name)] == ["2"]
    with MasterClient(master.address, master.token) as client:
        assert all(not n.last_failure for n in client.job_status().nodes)
    assert _probe_processes() == []


@pytest.mark.integration
@pytest.mark.timeout(360)
def test_a_node_whose_probe_crashes_is_reported_and_left_out_and_the_others_train(
    master: MasterRuntime, tmp_path: Path
) -> None:
    results = _agents(master, tmp_path, {"bad": "exit"}, ["good1", "bad", "good2"])
    assert results["bad"].exit_code == 1
    assert "faulty" in results["bad"].reason
    assert _records(tmp_path, "bad") == [], "the faulty node must not train"
    for name in ("good1", "good2"):
        assert results[name].exit_code == 0, results[name].reason
        # They trained once, in the round without the faulty node.
        assert [r["WORLD_SIZE"] for r in _records(tmp_path, name)] == ["2"]
    with MasterClient(master.address, master.token) as client:
        nodes = {n.name: n for n in client.job_status().nodes}
        events = client.list_events(limit=1000)
    # The master read the report as a fault that stays with the node: it relaunches the node
    # (the replacement takes its place in the job's record) and avoids its host.
    timeline = "\n".join(f"{e.kind}: {e.message}" for e in events)
    # Reported as a communication failure, decided on as a fault of the node's hardware.
    decided = "hardware: dlrover node check failed"
    failures = [e for e in events if e.kind == "failure" and decided in e.message]
    assert failures, timeline
    assert failures[0].data["reported_kind"] == "communication"
    assert any(e.kind == "host_avoided" for e in events), timeline
    assert any(e.kind == "relaunch" and "rule 'node-check-failed'" in e.message for e in events), timeline
    assert not nodes["good1"].last_failure
    assert not nodes["good2"].last_failure
    assert _probe_processes() == []


# Node a's first worker fails once node b's first worker has started: the restart that a's failure
# brings must find b's marker written, or b's worker after the restart would take itself for the
# first one and train until the test's timeout (b's interpreter may start seconds after a's on a
# loaded machine, and the restart stops it wherever it is).
FAILING_ONCE_WORKER = textwrap.dedent(
    """
    import os, sys, time
    out, name = sys.argv[1], sys.argv[2]
    first = os.path.join(out, f"{name}_ran")
    if os.path.exists(first):
        sys.exit(0)  # the round after the restart: done
    open(first, "w").close()
    if name == "a":
        partner = os.path.join(out, "b_ran")
        for _ in range(3000):
            if os.path.exists(partner):
                break
            time.sleep(0.1)
        sys.exit("a worker failure")
    time.sleep(600)  # node b's first worker trains until the restart stops it
    """
)


@pytest.mark.integration
@pytest.mark.timeout(360)
def test_a_restart_after_a_worker_failure_skips_the_probes_of_the_nodes_that_passed(
    pair_master: MasterRuntime, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dlrover.launcher.netcheck")
    results = _agents(pair_master, tmp_path, {}, ["a", "b"], worker=FAILING_ONCE_WORKER, max_restarts=1)
    assert {n: r.exit_code for n, r in results.items()} == {"a": 0, "b": 0}, results
    assert results["a"].restarts == 1
    checks = [r.getMessage() for r in caplog.records if r.getMessage().startswith("network check of round")]
    probed = [m for m in checks if m.startswith("network check of round 1 passed on all 2 nodes")]
    skipped = [m for m in checks if m.startswith("network check of round 2 skipped")]
    # Both nodes probed in the first round, and skipped the probes in the round after the failure.
    assert len(probed) == 2, checks
    assert len(skipped) == 2, checks
    assert _probe_processes() == []


def _round(checks: Mapping[int, NetworkCheck], number: int, ids: Sequence[str]) -> dict[int, CheckOutcome]:
    """Round `number` of the nodes `ids` (by node rank), each checking with its own NetworkCheck."""

    def node(rank: int) -> Callable[[], object]:
        assignment = RoundAssignment(number, rank, len(ids), "127.0.0.1", 1)
        return lambda: checks[rank].run(assignment, node_id=ids[rank])

    results = _run_threads({str(rank): node(rank) for rank in range(len(ids))}, timeout_s=300)
    return {int(name): outcome for name, outcome in results.items()}  # type: ignore[misc]


def _probed(store: InMemoryRoundStore, number: int) -> bool:
    return store.kv_get([side_key(number, 1, 0, "0")]) != [None]


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_the_same_nodes_skip_the_probes_once_after_passing_together_and_probe_when_one_changes() -> None:
    store = InMemoryRoundStore()
    checks = {rank: NetworkCheck(CHECK, store, local_addr="127.0.0.1", environ=_env()) for rank in (0, 1)}

    def expect(outcomes: dict[int, CheckOutcome], number: int, *, skipped: bool) -> None:
        assert all(o.action is CheckAction.TRAIN for o in outcomes.values()), outcomes
        assert all(("skipped" in o.reason) is skipped for o in outcomes.values()), outcomes
        assert _probed(store, number) is not skipped

    expect(_round(checks, 5, ["node-a", "node-b"]), 5, skipped=False)
    # A restart after a worker failure: the same two nodes, in swapped node ranks. No probes.
    expect(_round({0: checks[1], 1: checks[0]}, 6, ["node-b", "node-a"]), 6, skipped=True)
    # A pass is good for one skip: a node that keeps failing is probed at the restart after next.
    expect(_round(checks, 7, ["node-a", "node-b"]), 7, skipped=False)
    # node-b is replaced by node-c (a fresh agent): every node probes, then may skip once.
    checks[1] = NetworkCheck(CHECK, store, local_addr="127.0.0.1", environ=_env())
    expect(_round(checks, 8, ["node-a", "node-c"]), 8, skipped=False)
    expect(_round(checks, 9, ["node-a", "node-c"]), 9, skipped=True)
    expect(_round(checks, 10, ["node-a", "node-c"]), 10, skipped=False)
    # A node whose agent restarted under the same id remembers no pass: every node probes.
    checks[0] = NetworkCheck(CHECK, store, local_addr="127.0.0.1", environ=_env())
    expect(_round(checks, 11, ["node-a", "node-c"]), 11, skipped=False)
    assert _probe_processes() == []


def _member(store: InMemoryRoundStore, number: int, node: str) -> MemberReport | None:
    (raw,) = store.kv_get([member_key(number, node)])
    assert raw is not None
    return MemberReport.decode(raw)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_node_without_a_member_report_makes_every_node_start_a_new_round_without_probing() -> None:
    store = InMemoryRoundStore()
    config = NetworkCheckConfig(probe_timeout_s=5.0, results_timeout_s=5.0, poll_interval_s=0.1)
    check = NetworkCheck(config, store, local_addr="127.0.0.1", environ=_env())
    # Node rank 1 of the round never shows up.
    outcome = check.run(RoundAssignment(8, 0, 2, "127.0.0.1", 1), node_id="node-a")
    assert outcome.action is CheckAction.NEW_ROUND
    assert "node(s) 1 did not report" in outcome.reason
    assert not _probed(store, 8)
    # Its report, arriving late, cannot replace the marker every node read.
    late = MemberReport("node-b").encode()
    assert MemberReport.decode(store.kv_compare_set(member_key(8, "1"), b"", late)) is None
    assert _probe_processes() == []


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_check_that_is_stopped_forgets_the_pass_it_had() -> None:
    store = InMemoryRoundStore()
    check = NetworkCheck(CHECK, store, local_addr="127.0.0.1", environ=_env())
    alone = check.run(RoundAssignment(1, 0, 1, "127.0.0.1", 1), node_id="node-a")
    assert alone.action is CheckAction.TRAIN
    assert "skipped" not in alone.reason
    assert _member(store, 1, "0") == MemberReport("node-a", "")
    # Stopped while waiting for the other node's report in a round of two.
    with pytest.raises(NetworkCheckStopped):
        check.run(RoundAssignment(2, 0, 2, "127.0.0.1", 1), should_stop=lambda: True, node_id="node-a")
    assert _member(store, 2, "0") == MemberReport("node-a", membership_digest(["node-a"]))
    # The pass was spent on round 2's report: alone again, the node probes.
    again = check.run(RoundAssignment(3, 0, 1, "127.0.0.1", 1), node_id="node-a")
    assert again.action is CheckAction.TRAIN
    assert "skipped" not in again.reason
    assert _member(store, 3, "0") == MemberReport("node-a", "")


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_node_that_failed_the_check_makes_every_node_check_next_time() -> None:
    store = InMemoryRoundStore()
    checks = {rank: NetworkCheck(CHECK, store, local_addr="127.0.0.1", environ=_env()) for rank in (0, 1)}
    checks[1] = NetworkCheck(CHECK, store, local_addr="127.0.0.1", environ=_env("exit"))
    first = _round(checks, 5, ["node-a", "node-b"])
    assert first[1].action is CheckAction.EXCLUDE_SELF, first
    # Had node-b stayed (it does not: it reports itself and exits), nobody passed: no skip.
    checks[1] = NetworkCheck(CHECK, store, local_addr="127.0.0.1", environ=_env())
    second = _round(checks, 6, ["node-a", "node-b"])
    assert all(o.action is CheckAction.TRAIN and "skipped" not in o.reason for o in second.values()), second
    assert _probed(store, 6)
    # node-a kept no pass from the failed round (its report would have named it).
    assert _member(store, 6, "0") == MemberReport("node-a", "")
