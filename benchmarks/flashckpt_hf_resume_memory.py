"""Peak memory of resuming a Hugging Face Trainer: ``FlashCheckpointCallback.prepare_resume`` vs HF's own resume.

Every measurement runs in a fresh process, so peaks do not mix. For each model size (a GPT-2-like
model built from a config, randomly initialised, fp32, AdamW):

* ``ours``: a process trains 2 steps with the callback (a memory snapshot each step, no saver
  process; the snapshot stays in ``/dev/shm``); a new process builds the model, the checkpointer,
  the callback and the Trainer, then ``prepare_resume`` and ``train(resume_from_checkpoint=...)``
  for one more step;
* ``peer``: a process trains 2 steps and the Trainer saves a checkpoint to local disk
  (``save_strategy="steps"``); a new process builds the model and Trainer and resumes from that
  directory for one more step;
* ``scratch``: a process builds the model and Trainer and trains one step without resuming: what
  the training step costs by itself, so the rest of a resume's cost can be told apart.

Each resuming process reports its peak RSS (``VmHWM``), its RSS just before the resume (the model
and Trainer built: the baseline), and for ``ours`` also the peak right after ``prepare_resume``
returned. The parent samples, every few milliseconds, the child's ``RssAnon`` (private memory)
and ``RssShmem`` (pages of shared-memory files it maps: the snapshot slots and the safetensors
file, memory that exists whether or not the process maps it), and the bytes of the child's own
files in ``/dev/shm`` (the ``model.safetensors`` that ``prepare_resume`` writes; the snapshot slots
are reported apart: they hold the flash checkpoint between saves and are there before the resume
starts). Sampled values can miss a short spike; ``VmHWM`` cannot.
The "new memory" column is the sampled peak of what the resume adds to the host's memory at one
instant: the child's private memory over its baseline plus its files in ``/dev/shm``; unlike
``VmHWM`` it leaves out mapped pages that exist anyway (the snapshot slots, the page cache).

    python benchmarks/flashckpt_hf_resume_memory.py            # 112 MiB and 417 MiB of fp32 weights
    python benchmarks/flashckpt_hf_resume_memory.py --quick    # one small model (4 MiB), about a minute

Memory numbers do not depend on the machine's load (timings would, and none are reported).
Everything is removed at the end: temp dirs, the job's shared memory and checkpoint directories;
the script fails if anything of its children is left in ``/dev/shm``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

MB = 1 << 20
SHM = Path("/dev/shm")
RESUME_PREFIX = "dlrover-hfresume-"  # dlrover.flashckpt.hf's resume directories: <prefix><pid>-...
TRAINED_STEPS = 2
SAMPLE_INTERVAL_S = 0.003

# (name, n_layer, n_embd, vocab): GPT-2 blocks, tied embeddings, 64 positions.
SIZES = {
    "quick": (2, 128, 4096),
    "small": (8, 512, 8192),
    "large": (8, 1024, 8192),
}


# ---------------------------------------------------------------- child side (one measurement) --


def _status() -> dict[str, int]:
    """This process's ``/proc/self/status`` memory fields, in bytes."""
    out: dict[str, int] = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssShmem", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _child(mode: str, size: str, work: Path, job: str) -> dict[str, Any]:
    import gc

    import torch
    import transformers

    from dlrover.flashckpt import FlashCheckpointer, StagerConfig
    from dlrover.flashckpt.hf import FlashCheckpointCallback
    from dlrover.flashckpt.segment import write_owner

    torch.set_num_threads(1)  # a shared 2-core machine; memory does not depend on it
    # The tables, not the Trainer's notices and progress bars (both functions are untyped upstream).
    quiet: list[Callable[[], None]] = [
        transformers.utils.logging.set_verbosity_error,
        transformers.utils.logging.disable_progress_bar,
    ]
    for fn in quiet:
        fn()
    n_layer, n_embd, vocab = SIZES[size]
    config = transformers.GPT2Config(
        n_layer=n_layer, n_head=8, n_embd=n_embd, n_positions=64, vocab_size=vocab, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    # Tied embeddings appear twice in the state dict: count each storage once.
    weights = sum(p.numel() * p.element_size() for p in model.parameters())

    class Data(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            ids = (torch.arange(32) * (i + 1)) % vocab
            return {"input_ids": ids, "labels": ids}

    training = mode.startswith("train")
    max_steps = TRAINED_STEPS if training else (1 if mode == "scratch" else TRAINED_STEPS + 1)
    peer_save = mode == "train-peer"
    args = transformers.TrainingArguments(
        output_dir=str(work / "peer-out"),
        max_steps=max_steps,
        per_device_train_batch_size=1,
        learning_rate=1e-4,
        save_strategy="steps" if peer_save else "no",
        save_steps=TRAINED_STEPS,
        report_to=[],
        use_cpu=True,
        logging_strategy="no",
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=7,
    )
    ckpt = callback = None
    if mode in ("train-ours", "resume-ours"):
        ckpt = FlashCheckpointer(StagerConfig(job_id=job, run_id="r"), str(work / "flash-storage"), saver="none")
        # The resumed step takes no snapshot: its copy into the slot is the cost of checkpointing, not of resuming.
        callback = FlashCheckpointCallback(ckpt, memory_every=1 if training else 1000)
    callbacks: list[transformers.TrainerCallback] = [] if callback is None else [callback]
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Data(), callbacks=callbacks)
    gc.collect()
    before = _status()
    result: dict[str, Any] = {"weights": weights, "rss_before": before["VmRSS"], "hwm_before": before["VmHWM"]}
    # Tell the parent the baseline is taken: its samples from here on belong to the resume.
    print("baseline", flush=True)
    try:
        if callback is not None and mode == "resume-ours":
            path = callback.prepare_resume(model)
            if path is None:
                raise RuntimeError("no snapshot to resume from")
            after = _status()
            print("prepared", flush=True)  # the parent's samples from here on belong to the training phase
            result["hwm_prepare"] = after["VmHWM"]
            result["file_bytes"] = sum(p.stat().st_size for p in Path(path).iterdir())
            trainer.train(resume_from_checkpoint=path)
            if os.path.exists(path):
                raise RuntimeError(f"the resume directory {path} outlived on_train_begin")
        elif mode == "resume-peer":
            trainer.train(resume_from_checkpoint=str(work / "peer-out" / f"checkpoint-{TRAINED_STEPS}"))
        else:
            trainer.train()
        if trainer.state.global_step != max_steps:
            raise RuntimeError(f"{mode}: trained to step {trainer.state.global_step}, expected {max_steps}")
    finally:
        if ckpt is not None:
            # The training process keeps its snapshot in memory for the restarted one; that one ends the job.
            ckpt.close(job_end=mode == "resume-ours")
            if mode == "train-ours":
                # Hand the run to the benchmark (our parent): a run whose owner is dead is removed by any
                # stager starting on this machine, and other people's may start before our resume does.
                write_owner(SHM, job, "r", pid=os.getppid())
    result["hwm_end"] = _status()["VmHWM"]
    return result


# ------------------------------------------------------------------------------- parent side --


class _Sampler:
    """Samples a child's RssAnon/RssShmem and the bytes of its files in /dev/shm until stopped."""

    def __init__(self, pid: int, job: str) -> None:
        self.pid = pid
        self.job = job
        self.armed = False  # set once the child took its baseline
        # "new": private memory over the baseline plus the resume's /dev/shm files, at the same instant.
        self.peak: dict[str, int] = {"RssAnon": 0, "RssShmem": 0, "resume_files": 0, "slots": 0, "new": 0}
        self.prepared = False  # set once prepare_resume returned (flashckpt only)
        self.new_in_prepare = 0
        self.base: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> dict[str, int] | None:
        out = {"RssAnon": 0, "RssShmem": 0}
        try:
            with open(f"/proc/{self.pid}/status", encoding="ascii") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in out:
                        out[key] = int(value.split()[0]) * 1024
        except (FileNotFoundError, ProcessLookupError):
            return None
        out["resume_files"] = _tree_bytes(SHM.glob(f"{RESUME_PREFIX}{self.pid}-*"))
        out["slots"] = _tree_bytes(SHM.glob(f"dlrover-fc.{self.job}.*"))
        return out

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            s = self._sample()
            if s is None or not self.armed:
                if s is not None:
                    self.base = s
                continue
            s["new"] = s["RssAnon"] - self.base.get("RssAnon", 0) + s["resume_files"]
            for k, v in s.items():
                self.peak[k] = max(self.peak[k], v)
            if not self.prepared:
                self.new_in_prepare = max(self.new_in_prepare, s["new"])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _tree_bytes(paths: Any) -> int:
    """Bytes allocated (st_blocks) by files, and by the files of directories, among `paths`."""
    total = 0
    for p in paths:
        try:
            if p.is_dir():
                total += sum(f.stat().st_blocks * 512 for f in p.iterdir())
            else:
                total += p.stat().st_blocks * 512
        except FileNotFoundError:
            continue  # removed between listing and stat
    return total


def _run_child(mode: str, size: str, work: Path, job: str, *, timeout_s: float, pids: list[int]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", mode, "--size", size, "--work", str(work), "--job", job]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    pids.append(proc.pid)
    sampler = _Sampler(proc.pid, job)
    # Reading stdout blocks until the child exits: a hung child is killed after timeout_s.
    deadline = threading.Timer(timeout_s, proc.kill)
    deadline.start()
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "baseline":
                sampler.armed = True
            elif line.strip() == "prepared":
                sampler.prepared = True
            lines.append(line)
        proc.wait(timeout_s)
    finally:
        deadline.cancel()
        sampler.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} ({size}) exited with {proc.returncode} (killed after {timeout_s} s if negative)")
    result: dict[str, Any] = json.loads(lines[-1])
    result["sampled"] = sampler.peak
    result["sampled_base"] = sampler.base
    result["new_in_prepare"] = sampler.new_in_prepare
    return result


def _leftovers(job: str, pids: list[int]) -> list[Path]:
    found = list(SHM.glob(f"dlrover-fc.{job}.*"))
    for pid in pids:
        found += SHM.glob(f"{RESUME_PREFIX}{pid}-*")
    return found


def _mb(n: float) -> str:
    return f"{n / MB:,.0f}"


def _measure(size: str, root: Path, timeout_s: float) -> tuple[list[dict[str, Any]], list[str]]:
    job = "hfmem" + uuid.uuid4().hex[:8]
    work = root / size
    work.mkdir()
    pids: list[int] = []
    problems: list[str] = []
    rows = []
    try:
        _run_child("train-ours", size, work, job, timeout_s=timeout_s, pids=pids)
        _run_child("train-peer", size, work, job, timeout_s=timeout_s, pids=pids)
        for mode in ("scratch", "resume-peer", "resume-ours"):
            r = _run_child(mode, size, work, job, timeout_s=timeout_s, pids=pids)
            r["mode"] = mode
            rows.append(r)
    finally:
        from dlrover.flashckpt import remove_run

        remove_run(SHM, job, "r")
        shutil.rmtree(work, ignore_errors=True)
    left = _leftovers(job, pids)
    if left:
        problems.append(f"left in /dev/shm: {', '.join(map(str, left))}")
    return rows, problems


def _table(rows: list[dict[str, Any]]) -> None:
    by = {r["mode"]: r for r in rows}
    w = by["scratch"]["weights"]
    print(f"weights (fp32 parameters): {_mb(w)} MB")
    print()
    print(
        "| resume | peak RSS (VmHWM) MB | RSS before MB | peak - before MB | x weights "
        "| beyond a step from scratch MB | x weights | extra /dev/shm at peak MB "
        "| sampled peak RssShmem MB | sampled new memory at peak MB | x weights |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    scratch_cost = by["scratch"]["hwm_end"] - by["scratch"]["rss_before"]
    for mode, label in (
        ("scratch", "none (1 step from scratch)"),
        ("resume-peer", "HF: checkpoint dir on local disk"),
        ("resume-ours", "flashckpt: prepare_resume + train"),
    ):
        r = by[mode]
        cost = r["hwm_end"] - r["rss_before"]
        beyond = cost - scratch_cost
        new = r["sampled"]["new"]
        print(
            f"| {label} | {_mb(r['hwm_end'])} | {_mb(r['rss_before'])} | {_mb(cost)} | {cost / w:.2f} "
            f"| {_mb(beyond)} | {beyond / w:.2f} | {_mb(r['sampled']['resume_files'])} "
            f"| {_mb(r['sampled']['RssShmem'])} | {_mb(new)} | {new / w:.2f} |"
        )
    ours, peer = by["resume-ours"], by["resume-peer"]
    ours_cost = ours["hwm_end"] - ours["rss_before"] + ours["sampled"]["resume_files"]
    peer_cost = peer["hwm_end"] - peer["rss_before"] + peer["sampled"]["resume_files"]
    prep = ours["hwm_prepare"] - ours["rss_before"]
    print()
    print(f"* flashckpt, peak during prepare_resume alone: {_mb(prep)} MB over the baseline ({prep / w:.2f}x weights)")
    new_prep = ours["new_in_prepare"]
    print(
        f"* flashckpt, sampled new memory at peak during prepare_resume: {_mb(new_prep)} MB ({new_prep / w:.2f}x "
        f"weights); over the whole resume (prepare_resume, the Trainer loading the file, on_train_begin, the "
        f"step): {_mb(ours['sampled']['new'])} MB"
    )
    print(f"* flashckpt, model.safetensors in /dev/shm: {_mb(ours['file_bytes'])} MB")
    print(f"* flashckpt snapshot slots in /dev/shm (there before the resume): {_mb(ours['sampled']['slots'])} MB")
    print(
        f"* resume cost (peak - before, plus extra /dev/shm): flashckpt {_mb(ours_cost)} MB, "
        f"HF {_mb(peer_cost)} MB: ratio flashckpt / HF = {ours_cost / peer_cost:.2f} (VmHWM counts the mapped "
        "snapshot slots, which are in /dev/shm anyway)"
    )
    ours_new, peer_new = ours["sampled"]["new"], peer["sampled"]["new"]
    print(
        f"* new memory at peak (sampled private memory over the baseline + the resume's /dev/shm files): "
        f"flashckpt {_mb(ours_new)} MB, HF {_mb(peer_new)} MB: ratio flashckpt / HF = {ours_new / peer_new:.2f}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one small model")
    p.add_argument("--timeout-s", type=float, default=300.0, help="limit for each child process")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--size", choices=sorted(SIZES), help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--job", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        result = _child(args.child, args.size, Path(args.work), args.job)
        print(json.dumps(result), flush=True)
        return 0
    # SIGTERM runs the finally blocks, so an interrupted run leaves no shared memory behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    import torch
    import transformers

    sizes = ["quick"] if args.quick else ["small", "large"]
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {os.cpu_count()} cores")
    print("GPT-2-like models (fp32, AdamW, batch 1 x 32 tokens), each number from a fresh process")
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="hfresume-bench-", dir=os.environ.get("BENCH_DIR")) as d:
        for size in sizes:
            n_layer, n_embd, vocab = SIZES[size]
            print(f"\n== {size}: n_layer={n_layer} n_embd={n_embd} vocab={vocab} ==")
            rows, problems = _measure(size, Path(d), args.timeout_s)
            _table(rows)
            failed += problems
    for problem in failed:
        print(f"ERROR: {problem}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
