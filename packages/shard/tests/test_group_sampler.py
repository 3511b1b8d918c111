"""ShardSampler with a process group: two real trainers (gloo) exchange their acknowledgements in a
collective and call the service every `sync_every` steps; killed for real, resumed from an older
step's state taken from the *other* rank's copy, every sample is trained exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.integration

from dlrover.shard._data_state import unpack_acknowledged  # noqa: E402

TRAINER = Path(__file__).with_name("_group_trainer.py")
SAMPLES = 640  # 160 shards of one batch of 4: 80 steps for two trainers, near the end from about step 50


def _run_group(
    address: str, token: str, out: Path, sync_every: int, attempt: int, *extra: str, world: int = 2
) -> list[int]:
    env = {**os.environ, "DLROVER_JOB_TOKEN": token}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(TRAINER),
                address,
                str(rank),
                str(out),
                str(sync_every),
                str(attempt),
                f"--world={world}",
                *extra,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(world)
    ]
    codes = []
    try:
        for proc in procs:
            output, _ = proc.communicate(timeout=120)
            codes.append(proc.returncode)
            if proc.returncode not in (0, -9):
                raise AssertionError(f"trainer failed ({proc.returncode}):\n{output.decode(errors='replace')}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return codes


def _trained(out: Path, attempt: int, up_to_step: int | None = None, world: int = 2) -> list[int]:
    indices: list[int] = []
    for rank in range(world):
        path = out / f"trained-r{rank}-a{attempt}.jsonl"
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if up_to_step is None or record["step"] <= up_to_step:
                indices.extend(record["indices"])
    return indices


def _backend_param(backend: str) -> Any:
    import torch

    return pytest.param(
        backend,
        marks=pytest.mark.skipif(
            backend == "nccl" and not torch.cuda.is_available(), reason="NCCL needs a CUDA device"
        ),
    )


BACKENDS = [_backend_param("gloo"), _backend_param("nccl")]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sync_every", [1, 3, 8])
@pytest.mark.parametrize(("killed", "resumed"), [(13, 10), (79, 77)])  # batched, and near the end
def test_a_group_killed_and_resumed_from_another_ranks_older_state_trains_every_sample_once(  # noqa: PLR0917 (pytest passes parametrized values by keyword)
    shard_server: Any, token: str, tmp_path: Path, sync_every: int, killed: int, resumed: int
) -> None:
    server, _servicer = shard_server
    # Attempt 0: both trainers die (SIGKILL) right after saving step `killed`'s state.
    sized = f"--samples={SAMPLES}"
    assert _run_group(server.address, token, tmp_path, sync_every, 0, sized, "--die-after", str(killed)) == [-9, -9]
    # Resume from an older step (the steps after it are lost): both ranks load rank 1's state, rank 0 restores.
    state = tmp_path / f"state-r1-s{resumed}.json"
    saved = json.loads(state.read_text())
    assert saved["version"] == 3, saved
    if killed < 40 and sync_every > 1:
        assert unpack_acknowledged(saved["acknowledged"]), saved  # the exchanged acknowledgements travel in it
    if killed > 70 and sync_every == 8:  # (near the end from step 66 there; later with shorter windows)
        assert unpack_acknowledged(saved["acknowledged"]) == [], saved  # near the end the position is read whole
    args = (sized, "--resume-from", str(resumed), str(state))
    assert _run_group(server.address, token, tmp_path, sync_every, 1, *args) == [0, 0]
    trained = _trained(tmp_path, 0, up_to_step=resumed) + _trained(tmp_path, 1)
    counts = Counter(trained)
    assert sorted(counts) == list(range(SAMPLES)), f"missing: {sorted(set(range(SAMPLES)) - set(counts))}"
    assert [i for i, n in counts.items() if n > 1] == []
    # The lost steps were trained again, not skipped.
    lost = set(_trained(tmp_path, 0)) - set(_trained(tmp_path, 0, up_to_step=resumed))
    assert lost
    assert lost <= set(_trained(tmp_path, 1))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_lone_trainer_killed_and_resumed_trains_every_sample_once(
    shard_server: Any, token: str, tmp_path: Path, backend: str
) -> None:
    """A group of one, on gloo and on NCCL (CUDA tensors, the exchange's and the fence's; one rank, as
    one GPU allows; in child processes, so this one never initialises CUDA): batched rounds, then
    the rounds near the data's end, killed and resumed from an older step."""
    server, _servicer = shard_server
    sized = (f"--samples={SAMPLES // 2}", f"--backend={backend}")
    died = _run_group(server.address, token, tmp_path, 4, 0, *sized, "--die-after", "70", world=1)
    assert died == [-9]
    resumed = 66
    state = tmp_path / f"state-r0-s{resumed}.json"
    assert _run_group(
        server.address, token, tmp_path, 4, 1, *sized, "--resume-from", str(resumed), str(state), world=1
    ) == [0]
    trained = _trained(tmp_path, 0, up_to_step=resumed, world=1) + _trained(tmp_path, 1, world=1)
    counts = Counter(trained)
    assert sorted(counts) == list(range(SAMPLES // 2)), f"missing: {sorted(set(range(SAMPLES // 2)) - set(counts))}"
    assert [i for i, n in counts.items() if n > 1] == []
    assert set(_trained(tmp_path, 0, world=1)) - set(
        _trained(tmp_path, 0, up_to_step=resumed, world=1)
    )  # lost, retrained


@pytest.mark.timeout(240)
def test_three_trainers_with_shards_of_several_batches_killed_mid_shard_train_every_sample_once(
    shard_server: Any, token: str, tmp_path: Path
) -> None:
    """Shards of three batches, so the state carries positions inside shards (acknowledgements that are
    not done) and the restore queues shards part used; three trainers, so the exchange is not a pair's."""
    server, _servicer = shard_server
    world, samples = 3, 3 * 14 * 3 * 4  # 42 shards of 3 batches of 4: 42 steps for three trainers
    common = (f"--samples={samples}", "--batches-per-shard=3")
    died = _run_group(server.address, token, tmp_path, 3, 0, *common, "--die-after", "14", world=world)
    assert died == [-9] * world
    resumed = 10  # one batch into each trainer's fourth shard
    state = tmp_path / f"state-r2-s{resumed}.json"
    saved = json.loads(state.read_text())
    assert any(not done for _sid, _consumed, done in unpack_acknowledged(saved["acknowledged"])), saved  # part used
    args = (*common, "--resume-from", str(resumed), str(state))
    assert _run_group(server.address, token, tmp_path, 3, 1, *args, world=world) == [0] * world
    trained = _trained(tmp_path, 0, up_to_step=resumed, world=world) + _trained(tmp_path, 1, world=world)
    counts = Counter(trained)
    assert sorted(counts) == list(range(samples)), f"missing: {sorted(set(range(samples)) - set(counts))}"
    assert [i for i, n in counts.items() if n > 1] == []


def _first_whole_read(out: Path, rank: int, steps: int) -> int:
    """The first step whose saved state is a whole read of the position (near the data's end)."""
    for step in range(1, steps + 1):
        saved = json.loads((out / f"state-r{rank}-s{step}.json").read_text())
        if not unpack_acknowledged(saved["acknowledged"]):
            return step
    return steps + 1


def _per_step(out: Path, world: int = 2) -> list[list[int]]:
    """The samples each step trained, over all ranks (attempt 0)."""
    steps: dict[int, list[int]] = {}
    for rank in range(world):
        for line in (out / f"trained-r{rank}-a0.jsonl").read_text().splitlines():
            record = json.loads(line)
            steps.setdefault(record["step"], []).extend(record["indices"])
    return [sorted(steps[step]) for step in sorted(steps)]


@pytest.mark.timeout(240)
def test_each_step_trains_the_same_samples_whichever_trainer_is_slower(
    shard_server: Any, token: str, tmp_path: Path
) -> None:
    """Each trainer leases its next shard in the background after a round's exchange (not when the
    step needs it): every trainer leased this step's shard before then, so each step's shards are
    the next ones in the service's order, whichever trainer asks first. Same data, one trainer slower
    than the other in each run: the same samples in every step (a run is reproducible whatever the
    pace), and each step's samples are two whole shards."""
    server, _servicer = shard_server
    runs = []
    for slow in (0, 1):
        out = tmp_path / f"slow-{slow}"
        out.mkdir()
        pace = (f"--dataset=paced-{slow}", f"--pause-rank={slow}", "--pause-s=0.02", "--samples=160")
        assert _run_group(server.address, token, out, 3, 0, *pace) == [0, 0]
        runs.append(_per_step(out))
    assert runs[0] == runs[1]
    assert len(runs[0]) == 20
    assert sorted(i for step in runs[0] for i in step) == list(range(160))


@pytest.mark.timeout(240)
def test_a_group_that_reloads_its_state_in_process_while_a_lease_ahead_is_out_trains_every_sample_once(
    shard_server: Any, token: str, tmp_path: Path
) -> None:
    """Rank 1's background lease of the next shard is still out when rank 0, past the same round,
    restores the service from the state just saved: the restore must drop that lease too. (Served
    after it, the lease would stay with rank 1, which forgets its shards when it reloads: the shard
    would come back only when its lease ran out, and the group would wait for it at the data's end.)"""
    server, servicer = shard_server
    args = ("--dataset=reload", "--samples=160", "--reload-at=5", "--slow-lease-ahead-rank=1")
    assert _run_group(server.address, token, tmp_path, 3, 0, *args) == [0, 0]
    counts = Counter(_trained(tmp_path, 0))
    assert sorted(counts) == list(range(160)), f"missing: {sorted(set(range(160)) - set(counts))}"
    assert [i for i, n in counts.items() if n > 1] == []
    with servicer.locked() as registry:
        status = registry.manager("reload").status()
    assert (status.doing, status.failed, status.finished) == (0, 0, True)


@pytest.mark.timeout(240)
def test_shards_of_several_batches_are_near_the_end_only_in_the_last_shards(
    shard_server: Any, token: str, tmp_path: Path
) -> None:
    """Shards of four batches, a sync every four steps: a trainer takes one shard between two syncs,
    so the group reads the whole position every step only once fewer than four shards are left (one
    a round, the count before, put the whole run there). Killed in that stretch and resumed from
    before it, every sample is trained once."""
    server, _servicer = shard_server
    samples = 2 * 40 * 4  # 20 shards of four batches of 4: 40 steps for two trainers
    common = (f"--samples={samples}", "--batches-per-shard=4")
    assert _run_group(server.address, token, tmp_path, 4, 0, *common, "--die-after", "38") == [-9, -9]
    first = _first_whole_read(tmp_path, 1, 38)
    assert 28 < first <= 38, first  # four shards are the last eight steps
    resumed = 30
    state = tmp_path / f"state-r1-s{resumed}.json"
    args = (*common, "--resume-from", str(resumed), str(state))
    assert _run_group(server.address, token, tmp_path, 4, 1, *args) == [0, 0]
    trained = _trained(tmp_path, 0, up_to_step=resumed) + _trained(tmp_path, 1)
    counts = Counter(trained)
    assert sorted(counts) == list(range(samples)), f"missing: {sorted(set(range(samples)) - set(counts))}"
    assert [i for i, n in counts.items() if n > 1] == []


@pytest.mark.timeout(240)
def test_the_data_s_short_last_shard_does_not_bring_the_end_near(shard_server: Any, token: str, tmp_path: Path) -> None:
    """161 samples: 10 shards of four batches of 4 and a last shard of one sample, handed out at a
    shuffled moment. Counted by the shortest shard, one trainer would take sixteen shards between
    two syncs and be near the end from the start; counted by the widest, one."""
    server, _servicer = shard_server
    common = ("--samples=161", "--batches-per-shard=4")
    assert _run_group(server.address, token, tmp_path, 4, 0, *common, world=1) == [0]
    steps = len((tmp_path / "trained-r0-a0.jsonl").read_text().splitlines())
    first = _first_whole_read(tmp_path, 0, steps)
    assert first > steps - 8, (first, steps)
    assert sorted(_trained(tmp_path, 0, world=1)) == list(range(161))


@pytest.mark.timeout(60)
def test_a_round_with_more_acknowledgements_than_one_row_carries_gathers_them_all(tmp_path: Path) -> None:
    import torch.distributed as dist

    from dlrover.shard._group_acks import GroupAcks

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        acks = GroupAcks(dist.group.WORLD, sync_every=4)
        acks.fence()
        acks.synced("read")
        acks.exchange()  # a round with nothing to say
        assert acks.acknowledged() == []
        for sid in range(12):  # over the 8 a row carries: a second, larger gather
            acks.add(sid, 3 if sid % 2 else 4, 4)
        acks.low_todo_seen = True
        acks.exchange()
        assert acks.acknowledged() == [(sid, 3, False) if sid % 2 else (sid, 4, True) for sid in range(12)]
        assert acks.near_end
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_a_group_that_never_saves_still_reaches_the_end_of_the_data(
    shard_server: Any, token: str, tmp_path: Path
) -> None:
    """No `state_dict` means no sync: the last commits must still reach the service, or the trainer
    that waits for the end of the data would wait for them forever."""
    import torch.distributed as dist

    from dlrover.common import RetryPolicy
    from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource
    from dlrover.shard.client import ShardClient, ShardClientConfig
    from dlrover.shard.torch_data import ShardSampler

    server, _servicer = shard_server
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    config = ShardClientConfig(retry=RetryPolicy(call_timeout_s=20, total_timeout_s=60), prefetch_shards=0)
    try:
        with ShardClient(server.address, token, "alone", "rank-0", config=config) as client:
            spec = DatasetSpec(
                name="alone",
                source=IndexSource(40),
                batch_size=4,
                batches_per_shard=2,
                delivery=DeliveryMode.EXACTLY_ONCE,
            )
            client.register(spec)
            sampler = ShardSampler(client, process_group=dist.group.WORLD, sync_every=8)
            trained: list[int] = []
            batch: list[int] = []
            for index in sampler:
                batch.append(index)
                if len(batch) == 4:
                    trained += batch
                    sampler.commit(len(batch))
                    batch = []
            assert sampler.finished
            assert sorted(trained) == list(range(40))
            assert client.status().finished
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_the_next_shard_is_leased_ahead_after_a_round_and_not_twice_when_no_step_drew_it(
    shard_server: Any, token: str, tmp_path: Path
) -> None:
    import torch.distributed as dist

    from dlrover.common import RetryPolicy
    from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource
    from dlrover.shard.client import ShardClient, ShardClientConfig
    from dlrover.shard.torch_data import ShardSampler

    server, servicer = shard_server
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    config = ShardClientConfig(retry=RetryPolicy(call_timeout_s=20, total_timeout_s=60), prefetch_shards=0)
    try:
        with ShardClient(server.address, token, "ahead", "rank-0", config=config) as client:
            spec = DatasetSpec(name="ahead", source=IndexSource(40), batch_size=4, delivery=DeliveryMode.EXACTLY_ONCE)
            client.register(spec)
            sampler = ShardSampler(client, process_group=dist.group.WORLD, sync_every=2)
            batches = iter(sampler)

            def step() -> None:
                assert len([next(batches) for _ in range(4)]) == 4
                sampler.commit(4)

            def leased() -> int:
                with servicer.locked() as registry:
                    return int(registry.manager("ahead").status().doing)

            # `leased()`: the shards leased now, the one trained and not reported yet among them (a sync
            # reports it done).
            step()
            sampler.state_dict()  # a sync: it leases the next shard in the same call
            assert (client.buffered, leased()) == (1, 1)
            step()
            sampler.state_dict()  # no sync: the next shard is leased in the background after the exchange
            assert (client.buffered, leased()) == (1, 2)
            sampler.state_dict()  # a sync with no step since: the shard leased ahead is the next one
            assert (client.buffered, leased()) == (1, 1)
            step()
            assert client.buffered == 0
    finally:
        dist.destroy_process_group()


_LOADING_TRAINER = """
import json, os, sys
import grpc
import torch.distributed as dist
from dlrover.common import ConfigError, RetryPolicy, RpcError
from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, ShardError
from dlrover.shard.client import ShardClient, ShardClientConfig
from dlrover.shard.torch_data import ShardSampler

address, rank, store, fault = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
config = ShardClientConfig(retry=RetryPolicy(call_timeout_s=20, total_timeout_s=60), prefetch_shards=0)
with ShardClient(address, os.environ["DLROVER_JOB_TOKEN"], fault, f"rank-{rank}", config=config) as client:
    spec = DatasetSpec(name=fault, source=IndexSource(16), batch_size=2, delivery=DeliveryMode.EXACTLY_ONCE)
    client.register(spec)
    sampler = ShardSampler(client, process_group=dist.group.WORLD, sync_every=2)
    state = sampler.state_dict()  # a sync that leases each trainer its first shard
    restores = []
    real_restore = client.restore

    def restore(document):
        restores.append(document)
        if fault == "restore-fails":
            raise RpcError("RestoreCheckpoint", grpc.StatusCode.UNAVAILABLE, "injected", 1)
        return real_restore(document)

    client.restore = restore
    if rank == 1 and fault == "refused":
        state = {**state, "dataset": "another"}
    try:
        sampler.load_state_dict(state, restore=rank == 0)
        outcome = "loaded"
    except (ConfigError, RpcError, ShardError) as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    line = {"rank": rank, "outcome": outcome, "restores": len(restores), "buffered": client.buffered}
    print(json.dumps(line), flush=True)
dist.destroy_process_group()
"""


def _load_in_two_trainers(address: str, token: str, tmp_path: Path, fault: str) -> dict[int, dict[str, Any]]:
    """Both trainers save their state, then load it (rank 0 restores) with `fault` injected; what
    each saw, by rank."""
    env = {**os.environ, "DLROVER_JOB_TOKEN": token}
    store = str(tmp_path / f"store-{fault}")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _LOADING_TRAINER, address, str(rank), store, fault],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(2)
    ]
    seen = {}
    try:
        for proc in procs:
            output, _ = proc.communicate(timeout=100)
            text = output.decode(errors="replace")
            assert proc.returncode == 0, text
            line = json.loads(text.strip().splitlines()[-1])
            seen[line["rank"]] = line
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return seen


@pytest.mark.timeout(120)
def test_a_state_one_trainer_refuses_is_refused_by_the_whole_group_and_nothing_is_restored(
    shard_server: Any, token: str, tmp_path: Path
) -> None:
    server, _servicer = shard_server
    seen = _load_in_two_trainers(server.address, token, tmp_path, "refused")
    assert "another trainer of the group refused its state" in seen[0]["outcome"], seen
    assert seen[1]["outcome"].startswith("ConfigError: "), seen
    assert "'another'" in seen[1]["outcome"], "its own reason: the dataset its state names"
    assert seen[0]["restores"] == 0, "rank 0 restored a state the group refused"
    assert seen[1]["buffered"] == 1, "rank 1 kept the shard it holds"


@pytest.mark.timeout(120)
def test_a_restore_that_fails_leaves_the_other_trainers_leases_as_they_were(
    shard_server: Any, token: str, tmp_path: Path
) -> None:
    server, _servicer = shard_server
    seen = _load_in_two_trainers(server.address, token, tmp_path, "restore-fails")
    assert seen[0]["outcome"].startswith("RpcError: "), seen
    assert seen[1]["outcome"].startswith("ShardError: another trainer of the group could not restore"), seen
    assert seen[1]["buffered"] == 1, "rank 1 kept the shard it holds: no restore dropped its lease"
