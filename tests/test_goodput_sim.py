"""The goodput simulator (tools/goodput_sim): the real master decides, simulated agents carry its
decisions out on a virtual clock; the baseline restarts the whole job. Small jobs and single
interruptions whose cost follows from the scenario's numbers, the real classifier on every cause's
excerpt, bad input, and the command line with its plots."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from goodput_sim.results import STOPPED, STRAGGLING, Result, simulate, table  # noqa: E402
from goodput_sim.scenario import CAUSES, Scenario, ScenarioError, load, parse  # noqa: E402
from goodput_sim.trace import Interruption, draw, read, write  # noqa: E402
from goodput_sim.training import Stretch  # noqa: E402

from dlrover.diagnosis import FailureKind  # noqa: E402
from dlrover.master.diagnosis_policy import DiagnosisFailurePolicy  # noqa: E402

pytestmark = pytest.mark.timeout(300)

LLAMA3 = ROOT / "tools" / "goodput_sim" / "scenarios" / "llama3.toml"
COSTS = {
    "node_provision_s": 200.0,
    "process_restart_s": 30.0,
    "crash_detection_s": 5.0,
    "heartbeat_timeout_s": 60.0,
    "nccl_timeout_s": 600.0,
    "adaptive_hang_floor_s": 60.0,
    "flash_save_gib_s": 10.0,
    "memory_load_gib_s": 2.0,
    "replica_gib_s": 1.0,
    "storage_read_gib_s": 8.0,
    "storage_write_gib_s": 4.0,
    "rendezvous_last_call_s": 5.0,
}
BASELINE = {"name": "restart the job", "kind": "restart_job", "storage_interval_s": 3600.0}
IN_PLACE = {
    "name": "in place",
    "kind": "dlrover",
    "flash_every_steps": 1,
    "storage_interval_s": 3600.0,
    "max_node_relaunches": 100,
}
RESIZE = {**IN_PLACE, "name": "resize", "replicated_memory": True, "min_nodes": 7, "hang_detection": "adaptive"}
SPARE = {**IN_PLACE, "name": "spare", "replicated_memory": True, "spare_nodes": 1}
DEFAULTS = {**IN_PLACE, "name": "defaults", "max_node_relaunches": 16}
# 64 accelerators (8 nodes), 10 s steps, 64 GiB of state: 1 GiB per accelerator.
STEP_S, SHARD_GIB = 10.0, 1.0


def scenario(*strategies: dict[str, Any], **job: Any) -> Scenario:
    return parse(
        {
            "job": {"accelerators": 64, "days": 1.0, "step_time_s": STEP_S, "checkpoint_gib": 64.0, **job},
            "costs": COSTS,
            "strategy": list(strategies),
        }
    )


def run(strategy: dict[str, Any], trace: list[Interruption], **job: Any) -> Result:
    sc = scenario(strategy, **job)
    return simulate(sc, sc.strategies[0], trace)


def lost(result: Result) -> float:
    return sum(result.buckets.values())


def test_every_second_of_a_run_is_useful_or_in_a_bucket() -> None:
    trace = [Interruption(10_000.0, 3, "software"), Interruption(30_000.0, 5, "gpu")]
    for strategy in (BASELINE, IN_PLACE, RESIZE, SPARE):
        result = run(strategy, trace)
        assert math.isclose(result.useful_s + lost(result), 86_400.0, rel_tol=1e-9), strategy["name"]
        assert all(v >= 0 for v in result.buckets.values())


def test_without_interruptions_only_the_start_and_the_saves_are_lost() -> None:
    dlrover = run(IN_PLACE, [])
    # The agents run after node_provision_s, the workers after process_restart_s: then steps, each
    # blocked SHARD_GIB / flash_save_gib_s by its flash checkpoint.
    assert dlrover.buckets["startup"] == pytest.approx(230.0)
    flash_s = SHARD_GIB / COSTS["flash_save_gib_s"]
    assert dlrover.buckets["checkpoint_save"] / dlrover.useful_s == pytest.approx(flash_s / STEP_S, rel=1e-3)
    baseline = run(BASELINE, [])
    assert baseline.buckets["startup"] == pytest.approx(230.0)
    save_s = 64.0 / COSTS["storage_write_gib_s"]  # the whole state, every hour of training
    assert baseline.buckets["checkpoint_save"] == pytest.approx(save_s * 23, rel=0.05)


def test_a_crash_restarts_in_place_from_memory_and_the_baseline_redoes_what_it_did_not_save() -> None:
    trace = [Interruption(10_000.0, 3, "software")]
    dlrover = run(IN_PLACE, trace)
    assert dlrover.decisions == {"native_crash: restart_processes": 1}
    assert dlrover.buckets["steps_redone"] == 0.0  # flash every step: the step in progress is all
    assert dlrover.buckets["restart"] == pytest.approx(COSTS["process_restart_s"])
    assert dlrover.buckets["checkpoint_load"] == pytest.approx(SHARD_GIB / COSTS["memory_load_gib_s"])
    # Detection, plus the part of the step in progress when it crashed.
    assert COSTS["crash_detection_s"] <= dlrover.buckets["failure_detection"] < COSTS["crash_detection_s"] + STEP_S
    baseline = run(BASELINE, trace)
    assert baseline.buckets["steps_redone"] > 2000.0  # back to the hourly storage checkpoint
    assert baseline.buckets["checkpoint_load"] == pytest.approx(64.0 / COSTS["storage_read_gib_s"])
    assert dlrover.goodput > baseline.goodput


def test_a_lost_machine_is_found_by_the_masters_heartbeat_timeout_and_replaced() -> None:
    trace = [Interruption(10_000.0, 3, "host_maintenance")]
    waiting = run(IN_PLACE, trace)
    assert waiting.decisions == {"lost node: relaunch_node": 1}
    detect = waiting.buckets["failure_detection"]
    assert COSTS["heartbeat_timeout_s"] < detect < COSTS["heartbeat_timeout_s"] + STEP_S + 1.0
    # Every rank waits for the replacement, then rolls back to the hourly persisted checkpoint.
    assert waiting.buckets["restart"] == pytest.approx(COSTS["node_provision_s"] + COSTS["process_restart_s"])
    assert waiting.buckets["steps_redone"] > 2000.0
    spare = run(SPARE, trace)
    # A warm spare takes the rank at once and fetches the lost shard from a peer's replica.
    assert spare.buckets["restart"] == pytest.approx(COSTS["process_restart_s"])
    assert spare.buckets["steps_redone"] == 0.0
    replica = SHARD_GIB / COSTS["replica_gib_s"] + SHARD_GIB / COSTS["memory_load_gib_s"]
    assert spare.buckets["checkpoint_load"] == pytest.approx(replica)
    resized = run(RESIZE, trace)
    # The others go on without it, and take it back at a planned round once it is up.
    assert resized.decisions == {"lost node: relaunch_node": 1, "replacement up: planned round": 1}
    assert resized.buckets["steps_redone"] == 0.0
    assert resized.buckets["rendezvous"] == pytest.approx(COSTS["rendezvous_last_call_s"])
    assert waiting.goodput < resized.goodput <= spare.goodput


def test_a_broken_nic_is_restarted_by_the_policys_ladder_until_the_node_is_replaced() -> None:
    result = run(IN_PLACE, [Interruption(10_000.0, 3, "nic")])
    # The real ladder: a communication error is restarted in place three times, then the node goes.
    assert result.decisions == {"communication: restart_processes": 3, "communication: relaunch_node": 1}


def test_the_network_check_finds_a_broken_nic_before_training_and_the_node_leaves() -> None:
    trace = [Interruption(10_000.0, 3, "nic")]
    plain = run(IN_PLACE, trace)
    checked = run({**IN_PLACE, "network_check": True}, trace)
    # The restart after the fault skips the probes (the same nodes passed them at the start): the
    # NIC fails the workers again. The next round probes: the node fails its probe, reports it, its
    # agent exits, and it is replaced on another host, without a third restart of every node.
    assert plain.decisions == {"communication: restart_processes": 3, "communication: relaunch_node": 1}
    assert checked.decisions == {
        "communication: restart_processes": 2,
        "network check: hardware: relaunch_node": 1,
    }
    assert checked.buckets["restart"] < plain.buckets["restart"]
    # What the probes cost: every round of changed nodes (the start, the world without the node,
    # the replacement's planned round) waits for them before its workers start.
    quiet = run({**IN_PLACE, "network_check": True}, [])
    assert quiet.buckets["startup"] == pytest.approx(230.0 + 20.0)
    # Silent data corruption computes wrong numbers without an error: the probe passes it.
    sdc = run({**IN_PLACE, "network_check": True}, [Interruption(10_000.0, 3, "silent_data_corruption")])
    assert not any(d.startswith("network check") for d in sdc.decisions)


def test_a_hang_is_found_by_the_detector_the_strategy_runs() -> None:
    trace = [Interruption(10_000.0, 3, "nccl_hang")]
    nccl = run(IN_PLACE, trace)
    adaptive = run(RESIZE, trace)
    assert nccl.decisions == {"communication: restart_processes": 1}  # the watchdog's own timeout
    assert adaptive.decisions == {"hang: restart_processes": 1}  # the agent's hang report
    assert nccl.buckets["failure_detection"] >= COSTS["nccl_timeout_s"]
    floor = max(5 * STEP_S, COSTS["adaptive_hang_floor_s"])
    assert floor <= adaptive.buckets["failure_detection"] < floor + STEP_S


def test_the_relaunch_budget_stops_a_job_that_relaunches_too_many_nodes_in_a_day() -> None:
    trace = [Interruption(1000.0 + 2000.0 * i, i % 8, "gpu") for i in range(20)]
    result = run(DEFAULTS, trace)
    assert "limit 16 per 24h" in result.stopped
    assert result.decisions == {"hardware: relaunch_node": 16, "hardware: abort_job": 1}
    assert result.buckets[STOPPED] > 40_000.0
    raised = run(IN_PLACE, trace)
    assert not raised.stopped
    assert raised.decisions == {"hardware: relaunch_node": 20}


def test_the_same_failures_spread_over_weeks_leave_every_budget_standing() -> None:
    # Twenty relaunches (and a rank relaunched three times) in 20 days: never more than one a day.
    trace = [Interruption(1000.0 + 86_400.0 * i, i % 8, "gpu") for i in range(20)]
    result = run(DEFAULTS, trace, days=21.0)
    assert not result.stopped
    assert result.decisions == {"hardware: relaunch_node": 20}
    whole_life = run({**DEFAULTS, "failure_budget_window_s": 0}, trace, days=21.0)
    assert "already relaunched 16 nodes (limit 16)" in whole_life.stopped


def test_a_native_crash_back_on_a_node_moves_it_and_back_on_its_replacement_stops_the_job() -> None:
    twice = [Interruption(10_000.0, 3, "software"), Interruption(50_000.0, 3, "software")]
    moved = run(IN_PLACE, twice)
    assert moved.decisions == {"native_crash: restart_processes": 1, "native_crash: relaunch_node": 1}
    assert not moved.stopped
    # The rank's replacement crashes twice as well: the crash follows the job, not a host.
    four_times = [*twice, Interruption(60000.0, 3, "software"), Interruption(62000.0, 3, "software")]
    stopped = run(IN_PLACE, four_times)
    assert stopped.decisions == {
        "native_crash: restart_processes": 2,
        "native_crash: relaunch_node": 1,
        "native_crash: abort_job": 1,
    }
    assert "budgets spent (restart_processes x1, relaunch_node x1 per 24h)" in stopped.stopped
    hourly = run({**IN_PLACE, "failure_budget_window_s": 3600.0}, twice)
    assert hourly.decisions == {"native_crash: restart_processes": 2}
    assert not hourly.stopped
    restart_only = run({**IN_PLACE, "ladders": {"native_crash": [["restart_processes", 1]]}}, twice)
    assert restart_only.decisions == {"native_crash: restart_processes": 1, "native_crash: abort_job": 1}


def test_a_lost_machine_past_the_relaunch_budget_stops_the_job_as_the_master_decided() -> None:
    trace = [Interruption(10_000.0 + 5_000.0 * i, i, "host_maintenance") for i in range(4)]
    result = run({**IN_PLACE, "max_node_relaunches": 1}, trace)
    assert result.decisions == {"lost node: relaunch_node": 1, "lost node: abort_job": 1}
    assert "limit 1" in result.stopped


def test_two_interruptions_close_together_cost_what_each_does_alone() -> None:
    # The NIC fault lands while the world trains without the lost machine: neither leaves a stale repeat
    # failure or a second planned round behind for the other's node.
    lost = Interruption(10_000.0, 3, "host_maintenance")
    nic = Interruption(10_250.0, 5, "nic")
    both = run(RESIZE, [lost, nic]).decisions
    alone = [run(RESIZE, [lost]).decisions, run(RESIZE, [nic]).decisions]
    assert both == {k: alone[0].get(k, 0) + alone[1].get(k, 0) for k in {*alone[0], *alone[1]}}


def test_time_after_a_failure_nobody_noticed_before_the_end_is_not_useful() -> None:
    hung = run(BASELINE, [Interruption(86_400.0 - 500.0, 3, "nccl_hang")])
    clean = run(BASELINE, [])
    assert hung.useful_s == pytest.approx(clean.useful_s - 500.0, abs=STEP_S)


def test_a_save_counts_once_it_finished_and_a_step_ends_before_the_save_after_it() -> None:
    stretch = Stretch(ready=0.0, start_step=0, step_s=10.0, save_every=1, save_s=2.0)
    assert stretch.steps_by(10.5) == 1
    assert stretch.last_saved_step(10.5) == 0  # the save after step 1 runs until 12
    assert stretch.last_saved_step(12.0) == 1
    assert (stretch.end_of(1), stretch.end_of(2)) == (10.0, 22.0)
    marks = stretch.marks(23.0, best=0, wall0=0.0)
    assert [(m.step, m.end_time, m.save_s) for m in marks] == [(1, 10.0, 0.0), (2, 22.0, 2.0)]


def test_a_preempted_node_is_relaunched_at_once_and_the_baseline_resubmits_without_it() -> None:
    trace = [Interruption(10_000.0, 3, "preemption")]
    dlrover = run(IN_PLACE, trace)
    assert dlrover.decisions == {"preempted node: relaunch_node": 1}
    # Found by the platform's report within the agent's detection time (not a heartbeat timeout, as a
    # lost machine is), then the replacement is waited for.
    replacement = COSTS["node_provision_s"] + COSTS["process_restart_s"]
    for result in (dlrover, run(BASELINE, trace)):
        waited = result.buckets["failure_detection"] + result.buckets["restart"]
        assert replacement <= waited <= replacement + COSTS["crash_detection_s"] + STEP_S


def test_every_cause_excerpt_is_read_as_its_kind_by_the_real_classifier() -> None:
    policy = DiagnosisFailurePolicy()
    # The crash causes each as the kind its log says; a SIGKILL from outside (no log of its own) as killed.
    crashes = {"software": FailureKind.NATIVE_CRASH, "dependency": FailureKind.COMMUNICATION,
               "killed": FailureKind.KILLED, "host_oom": FailureKind.HOST_OOM,
               "nan_loss": FailureKind.NAN_LOSS}  # fmt: skip
    for cause in CAUSES.values():
        if not cause.evidence:
            assert cause.effect in ("lost", "slow")  # a machine that is gone, or a slow one, leaves no log
            continue
        kind = policy.classify(1, FailureKind.UNKNOWN, cause.evidence, cause.exit_code).kind
        if cause.effect == "broken":
            assert kind in {FailureKind.HARDWARE, FailureKind.COMMUNICATION}, cause.name
        elif cause.effect == "hang":
            assert kind is FailureKind.COMMUNICATION, cause.name  # what the NCCL watchdog writes
        elif cause.effect == "user":
            assert kind is FailureKind.USER_CODE, cause.name
        elif cause.effect == "preempted":
            continue  # the platform reports it: an observation the master decides on, not a log to read
        else:
            assert kind is crashes[cause.name], cause.name


def test_a_drawn_trace_is_reproducible_and_has_the_asked_rate(tmp_path: Path) -> None:
    rate, accelerators, days = 1e-3, 4096, 100.0
    mix = {"gpu": 3.0, "software": 1.0}
    trace = draw(rate, mix, accelerators=accelerators, per_node=8, duration_s=days * 86400.0, seed=7)
    assert trace == draw(rate, mix, accelerators=accelerators, per_node=8, duration_s=days * 86400.0, seed=7)
    expected = rate * accelerators * days  # 409.6: a Poisson count, within 5 standard deviations
    assert abs(len(trace) - expected) < 5 * math.sqrt(expected)
    gpu = sum(1 for i in trace if i.cause == "gpu")
    assert abs(gpu / len(trace) - 0.75) < 0.1
    assert all(0 <= i.node < accelerators // 8 for i in trace)
    path = tmp_path / "trace.jsonl"
    write(path, trace)
    assert read(path, accelerators // 8) == trace


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"job": {"accelerators": 60}}, "multiple of accelerators_per_node"),
        ({"job": {"accelerators": 64, "step_time_s": -1}}, "step_time_s must be a finite number > 0"),
        ({"job": {"accelerators": 64, "gpus": 8}}, "unknown key"),
        ({"failures": {"rate_per_gpu_day": 1e-3, "mix": {"cosmic_rays": 1.0}}}, "unknown cause 'cosmic_rays'"),
        ({"failures": {"rate_per_gpu_day": 1e-3}}, "must give some cause a share"),
        ({"strategy": [{**IN_PLACE, "flash_every_steps": 0}]}, "needs flash_every_steps"),
        ({"strategy": [{**IN_PLACE, "min_nodes": 6}]}, "min_nodes needs replicated_memory"),
        ({"strategy": [{**BASELINE, "spare_nodes": 2}]}, "restart_job has no"),
        ({"strategy": [{**RESIZE, "min_nodes": 9}]}, "exceeds the job's 8 nodes"),
        ({"strategy": [IN_PLACE, IN_PLACE]}, "names must differ"),
        ({"strategy": []}, "at least one"),
        ({"strategy": [{**IN_PLACE, "ladders": {"gremlins": [["restart_processes", 1]]}}]}, "ladders.gremlins"),
        ({"strategy": [{**IN_PLACE, "ladders": {"hang": [["abort_job", 1]]}}]}, "ladders.hang"),
        ({"strategy": [{**BASELINE, "ladders": {"hang": [["restart_processes", 1]]}}]}, "dlrover master's policy"),
        ({"strategy": [{**IN_PLACE, "straggler_action": "shoot"}]}, "straggler_action must be one of"),
        ({"strategy": [{**BASELINE, "straggler_action": "replace"}]}, "restart_job has no straggler detection"),
        ({"strategy": [{**IN_PLACE, "straggler_factor": 1.0}]}, "straggler_factor must be a finite number > 1"),
        ({"job": {"accelerators": 64, "sync_lead_share": 1.5}}, r"sync_lead_share must be a number in \[0, 1\]"),
        ({"costs": {"straggler_slowdown": 0.5}}, "straggler_slowdown must be a finite number > 1"),
    ],
)
def test_a_bad_scenario_is_refused_naming_the_value(change: dict[str, Any], message: str) -> None:
    raw: dict[str, Any] = {"job": {"accelerators": 64}, "strategy": [IN_PLACE], **change}
    with pytest.raises(ScenarioError, match=message):
        parse(raw)


def test_a_bad_trace_line_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text('{"time_s": 10, "node": 1, "cause": "gpu"}\n{"time_s": 20, "node": 99, "cause": "gpu"}\n')
    with pytest.raises(ScenarioError, match=r"trace.jsonl:2: node 99 is not one of the job's 8 nodes"):
        read(path, 8)


def test_the_llama3_scenario_loads_with_the_reported_rate_and_mix() -> None:
    sc = load(LLAMA3)
    assert sc.job.accelerators == 16_384
    assert sc.failures.rate_per_gpu_day * 16_384 * 54 == pytest.approx(419, rel=1e-3)
    assert sum(sc.failures.mix.values()) == 419
    broken_or_lost = sum(n for c, n in sc.failures.mix.items() if CAUSES[c].effect in ("broken", "lost"))
    assert broken_or_lost / 419 > 0.78  # 78% hardware, and host maintenance


def test_the_stragglers_scenario_adds_as_many_stragglers_as_gpu_failures_to_the_llama3_mix() -> None:
    sc, llama = load(LLAMA3.parent / "stragglers.toml"), load(LLAMA3)
    mix = dict(sc.failures.mix)
    assert mix.pop("straggler") == mix["gpu"]
    assert mix == dict(llama.failures.mix)
    share = sum(mix.values()) / (sum(mix.values()) + mix["gpu"])
    assert sc.failures.rate_per_gpu_day * share == pytest.approx(llama.failures.rate_per_gpu_day, rel=0.02)
    strategies = {s.name: s for s in sc.strategies}
    assert strategies["DLRover defaults"].straggler_factor == 2.0  # the master's default: a 1.5x one goes unseen
    assert strategies["DLRover: everything on"].straggler_action == "replace"
    assert strategies["DLRover: everything on"].straggler_factor < sc.costs.straggler_slowdown


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "goodput_sim"), *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
        check=False,
    )


def test_the_command_line_runs_sweeps_draws_its_plots_and_refuses_bad_input(tmp_path: Path) -> None:
    small = tmp_path / "small.toml"
    small.write_text(
        LLAMA3.read_text()
        .replace("accelerators = 16384", "accelerators = 256")
        .replace("min_nodes = 2032", "min_nodes = 30")
    )
    ran = _cli("run", str(small), "--days", "20", "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "| DLRover: everything on | 256 | 20 |" in ran.stdout
    results = json.loads((tmp_path / "run" / "run.json").read_text())
    assert {r["strategy"] for r in results} == {
        "torchrun: restart the job, storage every 30 min",
        "DLRover defaults",
        "DLRover: everything on",
        "DLRover: everything on, 4 warm spares",
    }
    dlrover = next(r for r in results if r["strategy"] == "DLRover: everything on")
    assert dlrover["master"]["heartbeat"]["calls"] > 0
    swept = _cli(
        "sweep",
        str(small),
        "--days",
        "5",
        "--scales",
        "64,256",
        "--intervals-min",
        "30,120",
        "--strategy",
        "DLRover: everything on",
        "--strategy",
        "torchrun: restart the job, storage every 30 min",
        "--out",
        str(tmp_path / "sweep"),
        cwd=tmp_path,
    )
    assert swept.returncode == 0, swept.stderr
    for png in ("goodput_by_scale.png", "goodput_by_interval.png", "lost_time_largest.png"):
        assert (tmp_path / "sweep" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## goodput by scale" in swept.stdout
    traced = _cli("trace", str(small), "--out", str(tmp_path / "t.jsonl"), cwd=tmp_path)
    assert traced.returncode == 0, traced.stderr
    assert read(tmp_path / "t.jsonl", 32)
    bad = tmp_path / "bad.toml"
    bad.write_text('[job]\naccelerators = 10\n[[strategy]]\nname = "x"\nkind = "restart_job"\n')
    refused = _cli("run", str(bad), cwd=tmp_path)
    assert refused.returncode == 2
    assert "multiple of accelerators_per_node" in refused.stderr
    negative = _cli("run", str(small), "--days", "-1", cwd=tmp_path)  # refused while the scenario is changed
    assert negative.returncode == 2
    assert "days must be a finite number > 0" in negative.stderr
    assert not list(tmp_path.glob("*.png"))  # nothing written beside what was asked


def test_the_cost_command_measures_the_masters_calls_beside_a_noop_grpc_call(tmp_path: Path) -> None:
    measured = _cli("cost", "--nodes", "40", cwd=tmp_path)
    assert measured.returncode == 0, measured.stderr
    rows = {line.split(" | ")[0].strip("| "): line for line in measured.stdout.splitlines()[2:]}
    assert set(rows) == {
        "register",
        "heartbeat",
        "heartbeat, new step",
        "heartbeat, 8 ranks' step stats",
        "heartbeat, samples, autoscaler on",
        "tick",
        "failure, relaunch journaled",
        "spare promotion, per node handed its round",
        "rendezvous round, every node",
        "shard exchange, journaled, one at a time",
        "shard exchange, journaled, 16 at once",
        "shard journal base (every lease)",
        "shard journal base, of which under the shard lock",
        "shard exchange, base compaction amortized",
        "grpc_noop_call",
    }
    assert rows["grpc_noop_call"].endswith("| 1.00x |")
    assert _cli("cost", "--nodes", "0", cwd=tmp_path).returncode == 2
    assert not list(tmp_path.iterdir())  # the journal's temporary directory is gone


def test_the_table_names_every_bucket_with_time_in_it() -> None:
    result = run(DEFAULTS, [Interruption(1000.0 + 2000.0 * i, i % 8, "gpu") for i in range(20)])
    text = table([result])
    assert "| defaults | 64 | 1 | 20 |" in text
    assert STOPPED in text.splitlines()[0]
    assert "stopped: " in text


def test_validate_refuses_runs_it_cannot_calibrate_naming_what_is_wrong(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    steps = tmp_path / "steps.jsonl"
    kills = tmp_path / "kills.jsonl"
    events.write_text(json.dumps({"kind": "job_start", "wall_time": 0.0, "seq": 1, "message": "", "data": {}}) + "\n")
    steps.write_text(json.dumps({"step": 1, "start": 0.0, "end": 0.1, "attempt": 0}) + "\n")
    kills.write_text("not json\n{}\n")
    args = ["validate", "--event-log", str(events), "--steps", str(steps), "--kills", str(kills), "--max-restarts",
            "2", "--save-every", "1"]  # fmt: skip
    done = _cli(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert "kills.jsonl:1 is not JSON" in done.stderr
    kills.write_text(json.dumps({"t": 0.05}) + "\n")
    done = _cli(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert "needs a job_start event, steps, failure events and kill times" in done.stderr
    done = _cli(*args[:-1], "0", cwd=tmp_path)
    assert done.returncode == 2
    assert "--save-every" in done.stderr
    kills.write_text(json.dumps({"t": 1e300}) + "\n")
    events.write_text("".join(json.dumps(e) + "\n" for e in (
        {"kind": "job_start", "wall_time": 0.0, "seq": 1, "message": "", "data": {}},
        {"kind": "failure", "wall_time": 0.08, "seq": 2, "message": "", "data": {}})))  # fmt: skip
    steps.write_text("".join(json.dumps({"step": n, "start": n / 10, "end": n / 10 + 0.1, "attempt": 0}) + "\n"
                             for n in range(3)))  # fmt: skip
    done = _cli(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert "lie outside the run" in done.stderr


def test_a_host_oom_relaunches_the_node_with_more_memory_and_a_third_nan_loss_stops_the_job() -> None:
    oom = run(IN_PLACE, [Interruption(10_000.0, 3, "host_oom")])
    assert oom.decisions == {"host_oom: relaunch_with_more_memory": 1}
    # The node is replaced: every rank waits for it, then rolls back to the hourly persisted checkpoint.
    assert oom.buckets["restart"] == pytest.approx(COSTS["node_provision_s"] + COSTS["process_restart_s"])
    assert oom.buckets["steps_redone"] > 2000.0
    assert not oom.stopped
    nan = run(IN_PLACE, [Interruption(t, 0, "nan_loss") for t in (10_000.0, 20_000.0, 30_000.0)])
    assert nan.decisions == {"nan_loss: rollback_checkpoint": 2, "nan_loss: abort_job": 1}
    assert "loss" in nan.stopped
    assert nan.buckets["stopped"] == pytest.approx(86_400.0 - 30_000.0, abs=STEP_S + 60.0)


def test_a_rank_out_of_relaunches_is_let_go_and_the_master_stops_a_job_that_needs_every_node() -> None:
    # A rank relaunched three times in a day has no relaunch left (--max-relaunches 3 per day): the
    # fourth fault lets its node go, the job cannot form a round of every node, and the master stops
    # it once its insufficient-nodes window passed.
    trace = [Interruption(10_000.0 + 5_000.0 * i, 3, "gpu") for i in range(4)]
    result = run(IN_PLACE, trace)
    assert result.decisions == {"hardware: relaunch_node": 3, "hardware: remove_node": 1}
    assert "insufficient nodes" in result.stopped
    # Going on without the node is allowed where min_nodes says so.
    going_on = run(RESIZE, trace)
    assert not going_on.stopped


# -- stragglers ------------------------------------------------------------------------------------

SLOW = {"straggler_slowdown": 2.0, "straggler_lasts_s": 7200.0, "heartbeat_interval_s": 5.0}
FINDS = {**IN_PLACE, "name": "finds", "straggler_factor": 1.5}  # the master's detector sees a 2x lead


def run_slow(strategy: dict[str, Any], trace: list[Interruption], **job: Any) -> Result:
    sc = parse(
        {
            "job": {"accelerators": 64, "days": 1.0, "step_time_s": STEP_S, "checkpoint_gib": 64.0, **job},
            "costs": {**COSTS, **SLOW},
            "strategy": [strategy],
        }
    )
    return simulate(sc, sc.strategies[0], trace)


def test_a_straggler_nobody_replaces_slows_every_step_while_it_lasts() -> None:
    # Half of each slowed step is the straggler's: 7,200 s of slowness cost 3,600 s of steps.
    trace = [Interruption(10_000.0, 3, "straggler")]
    clean = run_slow(BASELINE, [])
    for strategy in (BASELINE, IN_PLACE, {**FINDS, "name": "reported"}):
        result = run_slow(strategy, trace)
        assert result.buckets[STRAGGLING] == pytest.approx(3600.0, abs=2 * STEP_S), strategy["name"]
        assert math.isclose(result.useful_s + lost(result), 86_400.0, rel_tol=1e-9)
        if strategy["kind"] == "restart_job":
            assert result.useful_s == pytest.approx(clean.useful_s - 3600.0, abs=2 * STEP_S)
    # With the default factor (2) a rank exactly twice as slow is not over it: the real detector is strict.
    assert run_slow(IN_PLACE, trace).decisions == {"straggler: slowed": 1, "straggler: not found": 1}
    # With a factor of 1.5 the master finds it, and reports it: `report`, the master's default action.
    assert run_slow({**FINDS, "name": "reported"}, trace).decisions["straggler: found (report)"] == 1


def test_a_straggler_the_master_finds_is_replaced_within_a_few_steps() -> None:
    trace = [Interruption(10_000.0, 3, "straggler")]
    replaced = run_slow({**FINDS, "straggler_action": "replace", "replicated_memory": True}, trace)
    assert replaced.decisions["straggler: found (replace)"] == 1
    assert replaced.decisions["straggler: relaunch_node"] == 1
    # Found once its agent's lead median shows it (three slowed steps of 20 s) and a heartbeat or two carried
    # it; then the node is relaunched as after a fault: every rank restarts, the new node restores its shard
    # from a peer's replica.
    assert replaced.buckets[STRAGGLING] <= 3 * 2 * STEP_S / 2 + 2 * SLOW["heartbeat_interval_s"]
    assert replaced.buckets["restart"] > 0
    assert replaced.buckets["steps_redone"] < 2 * STEP_S
    assert replaced.goodput > run_slow(IN_PLACE, trace).goodput + 0.03
    # Without replicas every rank rolls back to the newest storage checkpoint (persisted hourly from memory).
    rolled_back = run_slow({**FINDS, "straggler_action": "replace"}, trace)
    assert rolled_back.decisions["straggler: relaunch_node"] == 1
    assert 2 * STEP_S < rolled_back.buckets["steps_redone"] <= 3600.0 + STEP_S


def test_the_agents_stay_alive_when_their_step_stats_stop_and_a_fault_follows() -> None:
    # While a straggler is watched the agents beat with their ranks' stats and the plain liveness
    # beats leave them out; once its slowness ends those stop, and a fault soon after must not find
    # every agent silent past the heartbeat timeout.
    for gap in [float(g) for g in range(0, 121, 10)]:
        ends = 10_000.0 + SLOW["straggler_lasts_s"]
        trace = [Interruption(10_000.0, 3, "straggler"), Interruption(ends + gap, 5, "software")]
        result = run_slow(IN_PLACE, trace)
        assert not [d for d in result.decisions if d.startswith("lost node")], (gap, result.decisions)
        assert result.decisions["native_crash: restart_processes"] == 1


def test_a_straggler_whose_step_opens_with_a_collective_is_not_found_by_its_lead() -> None:
    # FSDP and ZeRO-3 gather parameters as the step starts: every rank's lead is ~0 and says nothing.
    trace = [Interruption(10_000.0, 3, "straggler")]
    result = run_slow({**FINDS, "straggler_action": "replace"}, trace, sync_lead_share=0.0)
    assert result.decisions == {"straggler: slowed": 1, "straggler: not found": 1}
    assert result.buckets[STRAGGLING] == pytest.approx(3600.0, abs=2 * STEP_S)


def test_a_straggler_stays_through_an_in_place_restart_and_leaves_with_its_node() -> None:
    slowed = [Interruption(10_000.0, 3, "straggler")]
    # A crash elsewhere restarts every process in place: the slow node is still in the world.
    # (Its slowness passes at its time whatever the job does: the restart's minute trains no slowed step.)
    crash = run_slow(IN_PLACE, [*slowed, Interruption(12_000.0, 5, "software")])
    assert 3600.0 - 120.0 < crash.buckets[STRAGGLING] < 3600.0 - 20.0
    # The slow node itself breaks: its replacement is a healthy node, the slowness ends with it.
    broken = run_slow(IN_PLACE, [*slowed, Interruption(12_000.0, 3, "gpu")])
    assert broken.buckets[STRAGGLING] == pytest.approx(1000.0, abs=2 * STEP_S)
    baseline = run_slow(BASELINE, [*slowed, Interruption(12_000.0, 3, "gpu")])
    assert baseline.buckets[STRAGGLING] == pytest.approx(1000.0, abs=2 * STEP_S)
    for result in (crash, broken, baseline):
        assert math.isclose(result.useful_s + lost(result), 86_400.0, rel_tol=1e-9)
    # The restarted processes report afresh: the master judges the straggler again, and reports it again.
    reported = run_slow({**FINDS, "name": "reported"}, [*slowed, Interruption(12_000.0, 5, "software")])
    assert reported.decisions["straggler: found (report)"] == 2


def test_a_continued_stretch_goes_on_from_the_last_step_at_its_new_pace() -> None:
    stretch = Stretch(ready=0.0, start_step=0, step_s=10.0)
    slowed = stretch.continued(25.0, 2.0)  # steps 1 and 2 ended at 10 and 20
    assert (slowed.ready, slowed.start_step, slowed.step_s, slowed.slowdown) == (20.0, 2, 20.0, 2.0)
    assert slowed.straggled_s(3) == pytest.approx(30.0)  # each 20 s step would have taken 10
    back = slowed.continued(65.0, 1.0)  # steps 3 and 4 ended at 40 and 60
    assert (back.ready, back.start_step, back.step_s, back.slowdown) == (60.0, 4, 10.0, 1.0)
    assert back.straggled_s(5) == 0.0


def test_a_continued_stretch_keeps_its_save_cadence_and_what_was_saved() -> None:
    # A save of 2 s after every third step: steps end at 10, 20, 30 (saved by 32), 42, 52.
    stretch = Stretch(ready=0.0, start_step=0, step_s=10.0, save_every=3, save_s=2.0)
    slowed = stretch.continued(45.0, 2.0)  # from step 4's end; step 4 is not saved yet
    assert (slowed.ready, slowed.start_step, slowed.unsaved_steps, slowed.saved_s_before) == (42.0, 4, 1, 2.0)
    assert slowed.last_saved_step(45.0) == 3  # not the step it went on from
    assert [slowed.end_of(i) for i in (1, 2, 3)] == [62.0, 82.0, 104.0]  # step 6's save blocks 82-84
    assert (slowed.last_saved_step(83.0), slowed.last_saved_step(84.0)) == (3, 6)
    assert (slowed.steps_by(61.0), slowed.steps_by(62.0), slowed.steps_by(90.0)) == (0, 1, 2)
    assert (slowed.last_saved_step(35.0), slowed.last_saved_step(31.0)) == (3, 0)  # before it: the one it continued
    marks = slowed.marks(104.0, best=4, wall0=0.0)
    assert [(m.step, m.end_time, m.save_s) for m in marks] == [(5, 62.0, 2.0), (7, 104.0, 4.0)]
    # Continued right after a step that a save follows: it goes on after the save.
    after_save = stretch.continued(31.0, 2.0)
    assert (after_save.ready, after_save.start_step, after_save.unsaved_steps) == (32.0, 3, 0)
    assert after_save.last_saved_step(32.0) == 3
