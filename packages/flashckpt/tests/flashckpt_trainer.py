"""A training process for the kill tests, run as a script by test_kill.py.

Every step fills the state's tensors with the step number, so a loaded state is consistent exactly
when every element equals its ``step`` entry. Progress goes to stdout, one JSON object a line.

Modes:
  train     save steps 1..N (persist every P); at --fault-step, inject --fault:
              mid_copy     stop half way through copying into shared memory and wait to be killed
              after_save   wait to be killed right after the save returned and was sealed
              mid_persist  request a persist and wait to be killed while the saver writes
  resume    load (memory, else storage) into a fresh state, report it, end the job
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import torch

from dlrover.flashckpt import copier as copier_module
from dlrover.flashckpt.checkpointer import FlashCheckpointer
from dlrover.flashckpt.config import StagerConfig


def emit(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def make_state(numel: int) -> dict[str, object]:
    return {"w": torch.zeros(numel), "b": torch.zeros(7, dtype=torch.float64), "step": 0, "pos": {"epoch": 0}}


def fill(state: dict[str, object], step: int) -> None:
    state["w"].fill_(float(step))  # type: ignore[attr-defined]
    state["b"].fill_(float(step))  # type: ignore[attr-defined]
    state["step"] = step
    state["pos"] = {"epoch": step}


def hang_forever() -> None:
    threading.Event().wait()


def inject_hang_mid_copy(step: int) -> None:
    """The fault enters at the copier's seam: its second copy job announces itself and hangs."""
    original = copier_module._run
    calls = [0]

    def half_then_hang(job: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        calls[0] += 1
        if calls[0] == 2:
            emit(event="in_copy", step=step)
            hang_forever()
        original(job)

    copier_module._run = half_then_hang


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["train", "resume"])
    p.add_argument("--job", required=True)
    p.add_argument("--storage", required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--persist-every", type=int, default=0)
    p.add_argument("--numel", type=int, default=1 << 20)
    p.add_argument("--fault", default="")
    p.add_argument("--fault-step", type=int, default=-1)
    p.add_argument("--idle-exit-s", type=float, default=60.0)
    p.add_argument("--shm-dir", default="/dev/shm")
    a = p.parse_args()
    cfg = StagerConfig(job_id=a.job, run_id="run1", shm_dir=a.shm_dir, copy_threads=2, copy_chunk_bytes=1 << 20)
    ckpt = FlashCheckpointer(cfg, a.storage, saver="auto", idle_exit_s=a.idle_exit_s)
    emit(event="started", saver_pid=ckpt.client.saver_pid if ckpt.client else -1)
    state = make_state(a.numel)
    if a.mode == "resume":
        loaded = ckpt.load(target=state)
        w = state["w"]
        consistent = bool(torch.all(w == float(loaded.step))) and bool(torch.all(state["b"] == float(loaded.step)))  # type: ignore[operator,call-overload]
        consistent = consistent and state["step"] == loaded.step and state["pos"] == {"epoch": loaded.step}
        emit(event="loaded", step=loaded.step, source=loaded.source, consistent=consistent, verified=loaded.verified)
        ckpt.close(job_end=True)
        emit(event="closed")
        return
    ckpt.prepare(state)
    for step in range(1, a.steps + 1):
        fill(state, step)
        if step == a.fault_step and a.fault == "mid_copy":
            inject_hang_mid_copy(step)
        persist = bool(a.persist_every) and step % a.persist_every == 0
        result = ckpt.save(step, state, persist=persist or (step == a.fault_step and a.fault == "mid_persist"))
        ckpt.stager.flush()
        emit(event="saved", step=step, slot=result.slot)
        if step == a.fault_step and a.fault in ("after_save", "mid_persist"):
            emit(event="fault_point", step=step)
            hang_forever()
        if persist:
            outcome = ckpt.wait_persisted(step, timeout_s=60)
            emit(event="persisted", step=step, ok=outcome.ok, committed=outcome.committed, reason=outcome.reason)
    ckpt.close(job_end=False)
    emit(event="done")
    time.sleep(0)


if __name__ == "__main__":
    sys.exit(main())
