"""Train CharGPT with DDP over gloo on CPU; the same script runs under `torchrun` and `dlrover-run`.

    torchrun --nproc-per-node=2 examples/gpt/train.py --out runs/plain
    dlrover-run --standalone --nproc-per-node=2 --max-restarts=2 examples/gpt/train.py --out runs/ft

Under `dlrover-run` (DLROVER_MASTER_ADDR is set) the sample indices come from the master's shard
service with exactly-once delivery (`ShardSampler`), and the whole state (model, optimizer, step
and the sampler's position) is staged to shared memory with `FlashCheckpointer` after every step
and persisted every `--persist-every` steps; the model marks its first gradient bucket of each
step (`report_gradient_sync`), so the master finds a slow rank by its lead time. A restarted
worker loads the newest step in memory and goes on from there; the state is the same on every
rank (DDP), so after an elastic resize a rank whose node holds no copy receives one from a rank
that does (`replicated=True`). Under plain
`torchrun` it falls back to a `DistributedSampler` and a `torch.save` checkpoint every
`--persist-every` steps.

The script turns on `torch.use_deterministic_algorithms`, whose first call imports torch's
compiler stack (about 2 s on 2 CPU cores) in every new worker. `examples/demo.py` adds it to
dlrover-run's standbys, so a restart skips it:
`--prewarm=torch,torch._inductor.config,dlrover.flashckpt.checkpointer`.

Both ranks must step in lockstep (DDP). Each shard holds the same number of batches, one that divides
the steps (8 for the default 240 steps; one batch for a dataset sized with `--samples`, whose world
size may change), and every rank leases its next shard at the same step, so ranks draw the same
number of batches; a step is complete (and its samples acknowledged) only after every rank finished
it. (Shards of several batches cost one lease per shard rather than one per step.)

Rank 0 appends one JSON object per line to `<out>/progress.jsonl` (started, resumed, step,
finished); `--record-samples` makes every rank append the indices it trained to
`<out>/samples/rank<R>.jsonl`, and the steps it staged to memory to `<out>/staged/rank<R>.jsonl`.
Every rank writes its process id to `<out>/rank<R>.pid` when it starts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from corpus import generate
from model import CharGPT
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler, TensorDataset

DATASET = "chargpt-train"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="run folder: progress, sample records, checkpoints")
    p.add_argument("--steps", type=int, default=240, help="optimizer steps (the dataset is sized to match)")
    p.add_argument(
        "--samples",
        type=int,
        default=0,
        help="sequences in the dataset; 0: steps x batch x world size. Give it for a job whose world size "
        "changes (elastic): every rank registers the same dataset, and training ends when it is used up",
    )
    p.add_argument("--batch", type=int, default=16, help="sequences per rank per step")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument(
        "--batches-per-shard",
        type=int,
        default=0,
        help="batches in a shard of the master's shard service, a divisor of --steps (1 with --samples); 0: "
        "the largest of 8, 4, 2 and 1 that divides --steps. Every rank then draws the same number of whole shards",
    )
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corpus", default="", help="a text file to train on (default: a generated corpus)")
    p.add_argument("--persist-every", type=int, default=50, help="persist a checkpoint every K steps")
    p.add_argument("--log-every", type=int, default=20, help="print progress every N steps")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument(
        "--job-id", default="", help="names this job's shared memory (default: dlrover-run's, DLROVER_JOB_ID)"
    )
    p.add_argument("--record-samples", action="store_true", help="write the indices each rank trained")
    p.add_argument(
        "--pause-file",
        default="",
        help="while this file exists, training waits before its next step (to hold a job at a point: an "
        "operator's pause, or a test's that must see the job grow before its data runs out)",
    )
    args = p.parse_args(argv)
    for name in ("steps", "batch", "context", "persist_every", "log_every", "threads"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.batches_per_shard < 0:
        p.error(f"--batches-per-shard must be 0 (chosen) or positive, got {args.batches_per_shard}")
    if args.batches_per_shard == 0:
        args.batches_per_shard = 1 if args.samples else math.gcd(args.steps, 8)
    # Ranks step in lockstep, so each must draw the same number of whole shards: a rank that finds no
    # shard left while a peer still trains its last one would wait for it inside the peer's collective.
    if args.samples and args.batches_per_shard != 1:
        p.error(
            "--batches-per-shard must be 1 with --samples (the world size may change, so no shard size "
            f"divides every rank's share), got {args.batches_per_shard}"
        )
    if args.steps % args.batches_per_shard:
        p.error(f"--batches-per-shard must divide --steps ({args.steps}), got {args.batches_per_shard}")
    return args


class Corpus:
    """Maps a sample index to `context + 1` bytes: the input and its next-byte targets.

    Sample `i` starts at byte `i * context`, so samples do not overlap.
    """

    def __init__(self, data: bytes, context: int, num_samples: int) -> None:
        needed = num_samples * context + 1
        if len(data) < needed:
            raise SystemExit(f"the corpus has {len(data)} bytes; {num_samples} samples of {context} need {needed}")
        self.tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        self.context = context

    def batch(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.stack([self.tokens[i * self.context : i * self.context + self.context + 1] for i in indices])
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


class JsonLines:
    """Appends JSON objects to a file, one per line, flushed at once (others read it live)."""

    def __init__(self, path: Path, attempt: int | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")
        self._attempt = attempt

    def write(self, **record: Any) -> None:
        if self._attempt is not None:
            record = {"event": record.pop("event"), "attempt": self._attempt, **record}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class NullLines(JsonLines):
    """A JsonLines that writes nothing (ranks other than 0, or recording off)."""

    def __init__(self) -> None:
        pass

    def write(self, **record: Any) -> None:
        pass

    def close(self) -> None:
        pass


class PlainBackend:
    """Under plain torchrun: a seeded DistributedSampler, and rank 0 `torch.save`s every K steps.

    The checkpoint holds tensors and numbers only and is read back with `weights_only=True`.
    """

    def __init__(self, args: argparse.Namespace, num_samples: int, rank: int, world: int) -> None:
        indices = TensorDataset(torch.arange(num_samples))  # the sampler only needs its length
        sampler: DistributedSampler[int] = DistributedSampler(
            indices, num_replicas=world, rank=rank, shuffle=True, seed=args.seed
        )
        sampler.set_epoch(0)
        self._indices = list(iter(sampler))
        self._batch = args.batch
        self._rank = rank
        self._persist_every = args.persist_every
        self.path = Path(args.out) / "checkpoints" / "plain.pt"

    def resume(self, model: torch.nn.Module, optim: torch.optim.Optimizer, progress: JsonLines) -> int:
        if not self.path.exists():
            return 0
        state: dict[str, Any] = torch.load(self.path, weights_only=True)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        progress.write(event="resumed", step=int(state["step"]), source="storage", load_s=0.0, t=time.time())
        return int(state["step"])

    def watch(self, ddp: DistributedDataParallel) -> None:
        """Plain torchrun finds no stragglers: nothing to mark."""

    def hold(self, pause_file: str) -> None:
        while os.path.exists(pause_file):
            time.sleep(0.05)

    def take(self, step: int) -> list[int]:
        # The position is the step: a resumed run takes the batches the lost steps would have.
        return self._indices[step * self._batch : (step + 1) * self._batch]

    def commit(self, num_samples: int) -> None:
        pass

    def checkpoint(self, step: int, model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
        if step % self._persist_every == 0:
            self._save(step, model, optim)

    def finish(self, step: int, model: torch.nn.Module, optim: torch.optim.Optimizer) -> str:
        self._save(step, model, optim)
        return str(self.path.resolve())

    def _save(self, step: int, model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
        if self._rank != 0:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "optim": optim.state_dict(), "step": step}, tmp)
        tmp.replace(self.path)

    def close(self, job_end: bool) -> None:
        pass


def _state(model: torch.nn.Module, optim: torch.optim.Optimizer, step: int, data: Any) -> dict[str, Any]:
    # Rebuilt every step: the optimizer's state dict gains entries after its first step.
    return {"model": model.state_dict(), "optim": optim.state_dict(), "step": step, "data": data}


class DlroverBackend:
    """Under dlrover-run: shards of whole batches from the shard service (each rank leases its next one
    in the background while a step is saved), and a flash checkpoint of the whole state (the
    sampler's position included) after every step."""

    def __init__(self, args: argparse.Namespace, num_samples: int, rank: int, world: int, staged: JsonLines) -> None:
        from dlrover.common import load_token
        from dlrover.flashckpt import FlashCheckpointer
        from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, ShardClient, ShardClientConfig
        from dlrover.shard.torch_data import ShardSampler

        self._rank, self._world, self._batch = rank, world, args.batch
        self._persist_every = args.persist_every
        self._staged = staged
        self._last_persist = -1
        self._attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.client = ShardClient(
            os.environ["DLROVER_MASTER_ADDR"],
            load_token(),
            DATASET,
            f"rank-{rank}",
            # No prefetch thread: the sampler leases each step's shard ahead itself (see below).
            config=ShardClientConfig(prefetch_shards=0),
        )
        self.client.register(
            DatasetSpec(
                name=DATASET,
                source=IndexSource(num_samples),
                batch_size=args.batch,
                batches_per_shard=args.batches_per_shard,
                shuffle=True,
                shuffle_samples=True,
                seed=args.seed,
                delivery=DeliveryMode.EXACTLY_ONCE,
            )
        )
        # The ranks save together after every step, so they exchange their acknowledgements in a
        # collective there and call the master once every `sync_every` steps (report, read the
        # data position, lease ahead) rather than twice per step each; between two such calls the
        # next step's shard is leased in the background while the checkpoint is saved.
        self.sampler = ShardSampler(self.client, process_group=dist.group.WORLD)
        self._reporter: Any = None  # the wait phase's writer, made at the first hold
        self._iter: Iterator[int] = iter(self.sampler)
        self.storage_dir = Path(args.out) / "checkpoints"
        # Job id, rank and world size come from dlrover-run's environment (--job-id overrides the
        # job id); `replicated`: any rank's copy restores every rank, even after a resize.
        self.ckpt = FlashCheckpointer(str(self.storage_dir), job_id=args.job_id or None, replicated=True)
        if rank == 0 and self.ckpt.client is not None:
            # The process running the saver: dlrover-run's agent, which hosts it and ends it with
            # the job (a detached saver, started without dlrover-run, the demo would end itself).
            (Path(args.out) / "saver.pid").write_text(f"{self.ckpt.client.saver_pid}\n")

    def resume(self, model: torch.nn.Module, optim: torch.optim.Optimizer, progress: JsonLines) -> int:
        from dlrover.flashckpt import NoCheckpointError

        t0 = time.time()
        try:
            loaded = self.ckpt.load()  # a collective: the newest step in memory, sent to ranks without it
        except NoCheckpointError:
            loaded = None
        dist.barrier()  # every rank has read its snapshot before anybody saves again
        if loaded is None:
            if self._rank == 0:
                # Nothing was trained yet; shards a failed first attempt leased go back now
                # rather than when their leases expire.
                for peer in range(self._world):
                    self.client.remove_worker(f"rank-{peer}", reason="training starts again from step 0")
            dist.barrier()
            # Step 0 in memory too: a failure before the first step resumes from the start.
            self.ckpt.save(0, _state(model, optim, 0, self.sampler.state_dict()))
            self._staged.write(attempt=self._attempt, step=0)
            return 0
        model.load_state_dict(loaded.state["model"])
        optim.load_state_dict(loaded.state["optim"])
        # Rank 0 rewinds the shard service to the checkpoint's data position: samples acknowledged
        # after it are handed out again, samples trained before it never are.
        self.sampler.load_state_dict(loaded.state["data"], restore=self._rank == 0)
        dist.barrier()
        step = int(loaded.state["step"])
        progress.write(
            event="resumed",
            step=step,
            source=loaded.source,
            load_s=time.time() - t0,
            detail=loaded.detail,
            t=time.time(),
        )
        return step

    def watch(self, ddp: DistributedDataParallel) -> None:
        """Have the model mark each step's first gradient bucket: the master finds a rank whose
        own work is slow by its lead time (every rank's step is as slow as the slowest's)."""
        from dlrover.diagnosis import report_gradient_sync

        report_gradient_sync(ddp)

    def hold(self, pause_file: str) -> None:
        """Hold training while `pause_file` exists, in the ``wait`` phase: the agent's hang watch
        judges the hold by its own allowance (--hang-wait-allowance), not by the step pace."""
        if self._reporter is None:
            from dlrover.common.step_slots import optional_reporter

            self._reporter = optional_reporter()
        if self._reporter is not None:
            self._reporter.phase("wait")
        try:
            while os.path.exists(pause_file):
                time.sleep(0.05)
        finally:
            if self._reporter is not None:
                self._reporter.phase("train")

    def take(self, step: int) -> list[int]:
        indices = list(islice(self._iter, self._batch))
        if len(indices) < self._batch:
            self._iter = iter(self.sampler)  # the pass ended: a later take starts a new one
        return indices

    def commit(self, num_samples: int) -> None:
        self.sampler.commit(num_samples)

    def checkpoint(self, step: int, model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
        persist = step % self._persist_every == 0
        self.ckpt.save(step, _state(model, optim, step, self.sampler.state_dict()), persist=persist)
        self._staged.write(attempt=self._attempt, step=step)
        if persist:
            self._last_persist = step

    def finish(self, step: int, model: torch.nn.Module, optim: torch.optim.Optimizer) -> str:
        if self._last_persist != step:
            self.ckpt.save(step, _state(model, optim, step, self.sampler.state_dict()), persist=True)
        outcome = self.ckpt.wait_persisted(step, timeout_s=120.0)
        if not outcome.ok:
            raise RuntimeError(f"persisting the final step {step} failed: {outcome.reason}")
        return str(self.storage_dir.resolve())

    def close(self, job_end: bool) -> None:
        # At the job's end rank 0 tells the saver to exit and remove the shared memory.
        self.ckpt.close(job_end=job_end and self._rank == 0)
        self.client.close()


def train(
    args: argparse.Namespace,
    backend: PlainBackend | DlroverBackend,
    corpus: Corpus,
    progress: JsonLines,
    samples: JsonLines,
) -> str:
    """The training loop; returns where the final checkpoint was persisted."""
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(args.seed)
    model = CharGPT(context=args.context, width=args.width, layers=args.layers, heads=args.heads)
    ddp = DistributedDataParallel(model)
    backend.watch(ddp)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    step = backend.resume(model, optim, progress)
    loss_value = float("nan")
    window_start, window_steps = time.time(), 0
    while step < args.steps:
        if args.pause_file and os.path.exists(args.pause_file):
            backend.hold(args.pause_file)
        indices = backend.take(step)
        counts = torch.tensor([len(indices), -len(indices)])
        dist.all_reduce(counts, op=dist.ReduceOp.MIN)
        low, high = int(counts[0]), -int(counts[1])
        if low == 0:
            # A rank saw the end of the data: the last, partial step is dropped (as drop_last does).
            break
        if low != args.batch or high != args.batch:
            raise RuntimeError(f"step {step + 1}: ranks drew {low}..{high} samples, expected {args.batch} each")
        inputs, targets = corpus.batch(indices)
        optim.zero_grad(set_to_none=True)
        _, loss = ddp(inputs, targets)
        assert loss is not None
        loss.backward()
        optim.step()
        step += 1
        backend.commit(len(indices))
        samples.write(attempt=attempt, step=step, indices=indices)
        # A collective after the commit: once it returns every rank acknowledged this step's
        # samples, so the data position read for the checkpoint covers exactly steps 1..step.
        loss_sum = loss.detach().clone()
        dist.all_reduce(loss_sum)
        loss_value = float(loss_sum) / world
        backend.checkpoint(step, model, optim)
        window_steps += 1
        now = time.time()
        rate = window_steps * args.batch * world / max(now - window_start, 1e-9)
        progress.write(event="step", step=step, loss=loss_value, samples_per_s=rate, t=now)
        if rank == 0 and (step % args.log_every == 0 or step == args.steps):
            print(f"[train] step {step:4d}/{args.steps}  loss {loss_value:.3f}  {rate:7.1f} samples/s", flush=True)
            window_start, window_steps = now, 0
    persisted = backend.finish(step, model, optim)
    dist.barrier()  # every rank's last checkpoint is persisted
    progress.write(event="finished", step=step, loss=loss_value, checkpoint=persisted, t=time.time())
    if rank == 0:
        print(f"[train] done: {step} steps, final loss {loss_value:.3f}, checkpoint in {persisted}", flush=True)
    return persisted


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    sharded = bool(os.environ.get("DLROVER_MASTER_ADDR"))
    out = Path(args.out)
    # Where tools that watch the job (examples/demo.py) find a rank's process: /proc/PID/environ of
    # a worker that dlrover-run started from a warm standby shows the standby's environment, which
    # has no RANK (the worker got it after the standby started).
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.pid.tmp").write_text(f"{os.getpid()}\n")
    os.replace(out / f"rank{rank}.pid.tmp", out / f"rank{rank}.pid")
    num_samples = args.samples or args.steps * args.batch * world
    data = Path(args.corpus).read_bytes() if args.corpus else generate(num_samples * args.context + 1, args.seed)
    corpus = Corpus(data, args.context, num_samples)

    progress = JsonLines(out / "progress.jsonl", attempt) if rank == 0 else NullLines()
    samples = JsonLines(out / "samples" / f"rank{rank}.jsonl") if args.record_samples else NullLines()
    staged = JsonLines(out / "staged" / f"rank{rank}.jsonl") if args.record_samples else NullLines()
    progress.write(event="started", world=world, mode="dlrover" if sharded else "torchrun", t=time.time())
    backend: PlainBackend | DlroverBackend | None = None
    finished = False
    try:
        if sharded:
            backend = DlroverBackend(args, num_samples, rank, world, staged)
        else:
            backend = PlainBackend(args, num_samples, rank, world)
        train(args, backend, corpus, progress, samples)
        dist.barrier()  # nobody tells the saver the job ended while another rank still saves
        finished = True
    finally:
        if backend is not None:
            backend.close(job_end=finished)
        for lines in (progress, samples, staged):
            lines.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
