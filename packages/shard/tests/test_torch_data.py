"""torch adapters over a real ShardService: DataLoader(num_workers=2), interrupted and resumed.

Every index must be trained exactly once across the interrupted run and the resumed one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import grpc
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, Dataset  # noqa: E402

from dlrover.common import ConfigError, RetryPolicy  # noqa: E402
from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource  # noqa: E402
from dlrover.shard.client import ShardClient, ShardClientConfig  # noqa: E402
from dlrover.shard.torch_data import ShardSampler  # noqa: E402

pytestmark = pytest.mark.integration

N = 200
CFG = ShardClientConfig(retry=RetryPolicy(call_timeout_s=20, total_timeout_s=60), prefetch_shards=1)


def _spec() -> DatasetSpec:
    return DatasetSpec(
        name="ds",
        source=IndexSource(N),
        batch_size=8,
        batches_per_shard=2,
        shuffle=True,
        shuffle_samples=True,
        seed=11,
        delivery=DeliveryMode.EXACTLY_ONCE,
        lease_timeout_s=120.0,
    )


class _Identity(Dataset[int]):
    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> int:
        return index


@pytest.mark.timeout(120)
def test_sampler_with_two_loader_workers_resumes_without_repeating_or_skipping(shard_server: Any, token: str) -> None:
    server, _ = shard_server
    trained: list[int] = []
    with ShardClient(server.address, token, "ds", "trainer-a", config=CFG) as client:
        client.register(_spec())
        sampler = ShardSampler(client)
        loader = DataLoader(_Identity(), batch_size=5, sampler=sampler, num_workers=2)
        it = iter(loader)
        for _ in range(11):  # 55 samples: the interruption falls inside a shard
            batch = next(it)
            trained.extend(batch.tolist())
            sampler.commit(len(batch))
        state = sampler.state_dict()
        del it  # the interruption: loader workers stop, prefetched indices are never trained
    with ShardClient(server.address, token, "ds", "trainer-b", config=CFG) as client:
        sampler = ShardSampler(client)
        sampler.load_state_dict(state)
        loader = DataLoader(_Identity(), batch_size=5, sampler=sampler, num_workers=2, persistent_workers=True)
        for _pass in range(50):
            for batch in loader:
                trained.extend(batch.tolist())
                sampler.commit(len(batch))
            if sampler.finished:
                break
        assert sampler.finished
        assert client.status().finished
        del loader
    assert len(trained) == N
    assert sorted(trained) == list(range(N))


@pytest.mark.timeout(120)
def test_iterable_dataset_with_two_forkserver_loader_workers_resumes_exactly(shard_server: Any, token: str) -> None:
    server, _ = shard_server
    with ShardClient(server.address, token, "ds", "setup", config=CFG) as client:
        client.register(_spec())
    script = Path(__file__).with_name("_iterable_trainer.py")
    env = {**os.environ, "DLROVER_JOB_TOKEN": token}
    proc = subprocess.run(
        [sys.executable, str(script), server.address, "ds"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    trained = json.loads(proc.stdout.strip().splitlines()[-1])["trained"]
    assert len(trained) == N
    assert sorted(trained) == list(range(N))


@pytest.mark.timeout(120)
def test_a_loop_breaking_out_of_a_prefetching_loader_loses_and_repeats_nothing(shard_server: Any, token: str) -> None:
    """The loader had drawn batches ahead (two workers) when the loop broke out mid-shard: the next pass hands
    out again what was drawn and never trained, then the rest of that shard."""
    server, _ = shard_server
    trained: list[int] = []
    with ShardClient(server.address, token, "ds", "trainer-b", config=CFG) as client:
        client.register(_spec())
        sampler = ShardSampler(client, wait_s=0.3)
        loader = DataLoader(_Identity(), batch_size=5, sampler=sampler, num_workers=2)
        for _pass in range(50):
            for i, batch in enumerate(loader):
                trained.extend(batch.tolist())
                sampler.commit(len(batch))
                if _pass < 3 and i == 4:
                    break  # 25 samples: inside the second shard, batches drawn ahead
            if sampler.finished:
                break
        assert sampler.finished
        assert client.status().finished
    assert sorted(trained) == list(range(N))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_drop_last_loader_trains_every_sample_once_but_the_last_partial_batch(
    shard_server: Any, token: str, num_workers: int
) -> None:
    """Passes end at the end of the data; each drops its last, partial batch. The next pass hands those samples
    out again (to be trained in the next full batch); at the end of the data they are acknowledged as dropped."""
    server, _ = shard_server
    trained: list[int] = []
    with ShardClient(server.address, token, "ds", "trainer-d", config=CFG) as client:
        client.register(_spec())
        sampler = ShardSampler(client, wait_s=0.3, drop_last=True)
        loader = DataLoader(_Identity(), batch_size=7, sampler=sampler, num_workers=num_workers, drop_last=True)
        for _pass in range(50):
            for i, batch in enumerate(loader):
                trained.extend(batch.tolist())
                sampler.commit(len(batch))
                if _pass == 0 and i == 9:
                    break  # a partial pass too: 70 samples
            if sampler.finished:
                break
        assert sampler.finished
        assert client.status().finished
    assert len(trained) == len(set(trained)) == N - N % 7
    assert set(trained) <= set(range(N))


@pytest.mark.timeout(60)
def test_without_drop_last_the_sampler_keeps_the_samples_a_drop_last_loader_leaves_and_says_so(
    shard_server: Any, token: str, caplog: pytest.LogCaptureFixture
) -> None:
    server, _ = shard_server
    with ShardClient(server.address, token, "ds", "trainer-k", config=CFG) as client:
        client.register(_spec())
        sampler = ShardSampler(client, wait_s=0.2)
        loader = DataLoader(_Identity(), batch_size=7, sampler=sampler, drop_last=True)
        trained = 0
        for _pass in range(50):  # a pass may end early on a slow machine (no shard within wait_s)
            for batch in loader:
                trained += len(batch)
                sampler.commit(len(batch))
            if "give ShardSampler drop_last=True" in caplog.text:
                break
        assert trained == N - N % 7
        assert client.status().todo == 0
        assert not sampler.finished
        assert not client.status().finished  # nothing acknowledged that was not trained
        assert "give ShardSampler drop_last=True" in caplog.text
        # A loop that trains them after all (drop_last off) finishes the data.
        for _pass in range(3):
            for batch in DataLoader(_Identity(), batch_size=7, sampler=sampler):
                trained += len(batch)
                sampler.commit(len(batch))
            if sampler.finished:
                break
        assert sampler.finished
        assert trained == N


class _SlowIdentity(_Identity):
    """Loader workers take a while per sample, so the sampler runs out of indices before a batch is trained."""

    def __getitem__(self, index: int) -> int:
        time.sleep(0.02)
        return index


@pytest.mark.timeout(120)
def test_a_break_whose_read_ahead_reached_the_end_of_the_data_trains_what_was_drawn(
    shard_server: Any, token: str
) -> None:
    """The loop breaks out with the loader's read-ahead at the end of the data. The next pass hands out again
    only samples drawn before, and ends (no shard comes) before its slow loader has delivered the batches the
    loop goes on to train and commit: those are trained, and only the last partial batch is dropped."""
    server, _ = shard_server
    trained: list[int] = []
    with ShardClient(server.address, token, "ds", "trainer-r", config=CFG) as client:
        client.register(_spec())
        sampler = ShardSampler(client, wait_s=0.1, drop_last=True)
        loader = DataLoader(_SlowIdentity(), batch_size=7, sampler=sampler, num_workers=2, drop_last=True)
        for _pass in range(50):
            for batch in loader:
                trained.extend(batch.tolist())
                sampler.commit(len(batch))  # raises if a drawn sample had been acknowledged as dropped
                if _pass == 0 and len(trained) >= N - 20:
                    break  # 182 trained; the loader (2 workers x 2 batches ahead) drew the other 18
            if sampler.finished:
                break
        assert sampler.finished
        assert client.status().finished
    assert len(trained) == len(set(trained)) == N - N % 7


@pytest.mark.timeout(120)
def test_two_trainers_each_left_with_a_partial_batch_both_finish(shard_server: Any, token: str) -> None:
    """Each trainer's drop_last loader keeps dropping its own leftover: each acknowledges its own as dropped,
    then waits for the other's, and both see the end of the data."""
    server, _ = shard_server
    trained: dict[str, list[int]] = {"t1": [], "t2": []}
    errors: list[BaseException] = []
    with ShardClient(server.address, token, "ds", "setup", config=CFG) as setup:
        setup.register(_spec())

        def train(worker: str) -> None:
            try:
                with ShardClient(server.address, token, "ds", worker, config=CFG) as client:
                    sampler = ShardSampler(client, wait_s=0.2, drop_last=True)
                    loader = DataLoader(_Identity(), batch_size=7, sampler=sampler, drop_last=True)
                    for _pass in range(200):
                        for batch in loader:
                            trained[worker].extend(batch.tolist())
                            sampler.commit(len(batch))
                        if sampler.finished:
                            return
                    raise AssertionError(f"{worker} did not finish")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=train, args=(worker,)) for worker in trained]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(100)
        assert not any(thread.is_alive() for thread in threads)
        assert not errors, errors
        assert setup.status().finished
    both = trained["t1"] + trained["t2"]
    assert len(both) == len(set(both))
    assert all(len(mine) % 7 == 0 for mine in trained.values())
    assert N - 2 * 6 <= len(both) <= N


@pytest.mark.timeout(120)
def test_samples_of_a_shard_whose_lease_ended_are_not_handed_out_again(shard_server: Any, token: str) -> None:
    """The loop broke out with samples drawn ahead, and then the service took the trainer's leases back (its
    lease ran out during a long pause; here: removed): the next pass does not train what it no longer holds,
    and the service hands those shards out again from the committed position."""
    server, _ = shard_server
    trained: list[int] = []
    on_demand = attrs.evolve(CFG, prefetch_shards=0)
    with (
        ShardClient(server.address, token, "ds", "trainer-l", config=on_demand) as client,
        ShardClient(server.address, token, "ds", "operator", config=CFG) as operator,
    ):
        client.register(_spec())
        sampler = ShardSampler(client, wait_s=0.3)
        loader = DataLoader(_Identity(), batch_size=5, sampler=sampler, num_workers=2)
        for i, batch in enumerate(loader):
            trained.extend(batch.tolist())
            sampler.commit(len(batch))
            if i == 1:
                break  # 10 trained; the loader drew ahead into the next shard
        assert operator.remove_worker("trainer-l", reason="lease lapsed")["ds"]
        for _pass in range(50):
            for batch in loader:
                trained.extend(batch.tolist())
                sampler.commit(len(batch))  # a sample of a lost lease would be refused here
            if sampler.finished:
                break
        client.flush_reports(timeout_s=30)
        assert sampler.finished
        assert client.status().finished
    assert sorted(trained) == list(range(N))


@pytest.mark.timeout(60)
def test_a_lost_lease_that_came_back_to_the_same_worker_is_not_taken_for_the_one_it_lost(
    shard_server: Any, token: str
) -> None:
    """The service took the trainer's lease back and then leased the same shard to the same worker
    name again (another dispatch, from the committed position): the samples drawn under the lost
    lease are not handed out again, since the new dispatch hands them out."""
    server, _ = shard_server
    on_demand = attrs.evolve(CFG, prefetch_shards=0)
    with (
        ShardClient(server.address, token, "ds", "trainer-r", config=on_demand) as client,
        ShardClient(server.address, token, "ds", "trainer-r", config=on_demand) as same_worker,
        ShardClient(server.address, token, "ds", "operator", config=CFG) as operator,
    ):
        client.register(_spec())
        sampler = ShardSampler(client, wait_s=0.3)
        first_pass = iter(sampler)
        drawn = [next(first_pass) for _ in range(3)]
        sampler.commit(1)
        client.flush_reports(timeout_s=30)
        assert operator.remove_worker("trainer-r", reason="lease lapsed")["ds"]
        back = same_worker.next_shard()
        assert back is not None
        assert back.attempt == 2
        assert back.consumed == 1
        assert drawn[1] in back.remaining_samples()
        second_pass = iter(sampler)
        taken = [next(second_pass) for _ in range(3)]
        assert not set(taken) & set(drawn), "samples of the lost dispatch were handed out again"
        assert not set(taken) & set(back.remaining_samples())


@pytest.mark.timeout(60)
def test_the_lost_dispatch_of_a_shard_is_put_down_and_its_newer_dispatch_stays_in_use(
    shard_server: Any, token: str
) -> None:
    server, _ = shard_server
    on_demand = attrs.evolve(CFG, prefetch_shards=0)
    with (
        ShardClient(server.address, token, "ds", "trainer-d", config=on_demand) as client,
        ShardClient(server.address, token, "ds", "operator", config=CFG) as operator,
    ):
        client.register(_spec())
        first = client.next_shard()
        assert first is not None
        assert operator.remove_worker("trainer-d", reason="lease lapsed")["ds"]
        again = client.next_shard()  # re-queued shards go first: the same shard, its second dispatch
        assert again is not None
        assert (again.shard_id, again.attempt) == (first.shard_id, 2)
        assert not client.holds(first)
        assert client.holds(again)
        assert client._in_use[again.shard_id][0].attempt == 2  # not put down with the lost dispatch


@pytest.mark.timeout(60)
def test_an_iterator_left_suspended_hands_out_nothing_once_a_new_pass_starts(shard_server: Any, token: str) -> None:
    server, _ = shard_server
    with ShardClient(server.address, token, "ds", "trainer-s", config=CFG) as client:
        client.register(_spec())
        sampler = ShardSampler(client, wait_s=0.3)
        old = iter(sampler)
        first = [next(old) for _ in range(3)]
        new = iter(sampler)
        assert [next(new) for _ in range(3)] == first  # uncommitted: handed out again by the new pass
        assert next(old, None) is None
        newer = iter(sampler)
        sampler.load_state_dict(sampler.state_dict())
        assert next(new, None) is None
        assert next(newer, None) is not None  # an iterator not started yet starts after the load


def test_state_of_another_dataset_or_version_is_refused(shard_server: Any, token: str) -> None:
    server, _ = shard_server
    with ShardClient(server.address, token, "ds", "a", config=CFG) as client:
        client.register(_spec())
        sampler = ShardSampler(client)
        state = sampler.state_dict()
        with pytest.raises(ConfigError, match="version 9"):
            sampler.load_state_dict({**state, "version": 9})
        with pytest.raises(ConfigError, match="not 'ds'"):
            sampler.load_state_dict({**state, "dataset": "other"})
        with pytest.raises(ConfigError, match="cannot commit 1 samples"):
            sampler.commit(1)


@pytest.mark.timeout(120)
def test_under_dlrover_run_committed_samples_reach_the_agents_step_slots(
    shard_server: Any, token: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlrover.common.step_slots import STEP_SLOT_ENV_VAR, STEP_SLOTS_ENV_VAR, StepSlotFile

    slots = StepSlotFile(tmp_path / "steps.slots", 1)
    monkeypatch.setenv(STEP_SLOTS_ENV_VAR, str(slots.path))
    monkeypatch.setenv(STEP_SLOT_ENV_VAR, "0")
    server, _ = shard_server
    try:
        with ShardClient(server.address, token, "ds", "trainer-s", config=CFG) as client:
            client.register(_spec())
            sampler = ShardSampler(client)
            it = iter(sampler)
            for _ in range(7):
                next(it)
            sampler.commit(4)
            sampler.commit(3)
        reading = slots.read(0)
        assert reading is not None
        assert (reading.samples, reading.step) == (7, 0)
    finally:
        slots.close()


class _CountCalls(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Counts the calls of each method (FetchShards asking for the position counted apart)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        name = details.method.rsplit("/", 1)[-1]
        inner = handler.unary_unary

        def behavior(request: Any, context: grpc.ServicerContext) -> Any:
            with self._lock:
                self.calls[name + ("+checkpoint" if getattr(request, "with_checkpoint", False) else "")] += 1
            return inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            behavior, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


@pytest.mark.timeout(120)
def test_lockstep_ranks_saving_every_step_make_two_calls_a_step_and_resume_exactly_once(token: str) -> None:
    """Two ranks in lockstep (one shard of one batch per rank per step), each committing its step and then
    reading the data position, as a DDP loop that checkpoints every step does: the read leases the next
    step's shard, so a step costs a rank two calls, and a restore from any step's position repeats no
    sample and skips none."""
    from dlrover.common import GrpcServer, ServerConfig, SystemClock
    from dlrover.shard import ShardRegistry
    from dlrover.shard.service import add_shard_service

    counter = _CountCalls()
    server = GrpcServer(ServerConfig(), token, interceptors=[counter])
    add_shard_service(server, ShardRegistry(SystemClock()))
    batch, steps = 4, 6
    spec = DatasetSpec(name="ds", source=IndexSource(2 * batch * steps), batch_size=batch, batches_per_shard=1,
                       shuffle=True, seed=3, delivery=DeliveryMode.EXACTLY_ONCE)  # fmt: skip
    on_demand = ShardClientConfig(retry=CFG.retry, prefetch_shards=0)

    def ranks(run: str) -> list[tuple[ShardClient, ShardSampler, Any]]:
        made = []
        for rank in range(2):
            client = ShardClient(server.address, token, "ds", f"{run}-rank-{rank}", config=on_demand)
            sampler = ShardSampler(client)
            made.append((client, sampler, iter(sampler)))
        return made

    def step(group: list[tuple[ShardClient, ShardSampler, Any]]) -> tuple[list[int], dict[str, Any]]:
        taken = [[next(it) for _ in range(batch)] for _, _, it in group]
        for (_, sampler, _), indices in zip(group, taken, strict=True):
            sampler.commit(len(indices))
        # (the collective after the commits: every rank's commit landed before any rank reads)
        states = [sampler.state_dict() for _, sampler, _ in group]
        return [i for indices in taken for i in indices], states[1]

    with server:
        first = ranks("a")
        first[0][0].register(spec)
        for _, sampler, _ in first:
            sampler.state_dict()  # the position of step 0, as a fresh job saves it
        trained: list[int] = []
        kept: dict[str, Any] = {}
        for n in range(1, 5):
            before = counter.calls.copy()
            indices, state = step(first)
            calls = counter.calls - before
            assert calls == Counter({"ReportDone": 2, "FetchShards+checkpoint": 2}), f"step {n}: {calls}"
            if n <= 3:
                trained += indices
            if n == 3:
                kept = state  # rank 1's copy: any rank's position restores the dataset
        for client, _, _ in first:
            client.close()
        # Step 4 is lost with its checkpoint: the job resumes from step 3.
        second = ranks("b")
        second[0][1].load_state_dict(kept, restore=True)
        second[1][1].load_state_dict(kept, restore=False)
        for _ in range(3):
            indices, _ = step(second)
            trained += indices
        assert sorted(trained) == list(range(2 * batch * steps))
        for client, _, _ in second:
            client.close()
