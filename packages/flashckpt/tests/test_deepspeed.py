"""DeepSpeed ZeRO on CPU (gloo): engine state -> shared memory -> a new engine, bit for bit.

Needs deepspeed: skipped without it, except in `nox -s tests-flashckpt-deepspeed` (deepspeed
0.19.8 on torch 2.13.0+cpu, ``DS_ACCELERATOR=cpu``), which sets ``DLROVER_REQUIRE_DEEPSPEED=1``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("DLROVER_REQUIRE_DEEPSPEED") == "1":
    import deepspeed  # noqa: F401 (the DeepSpeed CI session must fail, not skip, without it)
else:
    pytest.importorskip("deepspeed")

WORKER = str(Path(__file__).with_name("flashckpt_deepspeed_worker.py"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def extensions_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Where DeepSpeed builds its CPU ops: the nox session's folder, else one of this module's
    own. The shared default (~/.cache/torch_extensions) may hold a lock a killed build left,
    on which every rank would wait for ever."""
    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(tmp_path_factory.mktemp("torch-extensions"))


@pytest.mark.integration
@pytest.mark.timeout(240)
@pytest.mark.parametrize("stage", [1, 2])
def test_zero_engine_restores_from_memory_bit_for_bit(job_id: str, stage: int, extensions_dir: str) -> None:
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ)
        env.update(
            TORCH_EXTENSIONS_DIR=extensions_dir,
            DS_ACCELERATOR="cpu",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE="2",
        )
        cmd = [sys.executable, WORKER, "--job", job_id, "--stage", str(stage), "--stall-dump-s", "200"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=220)
            assert proc.returncode == 0, err[-3000:]
            results += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert sorted(r["rank"] for r in results) == [0, 1]
    for r in results:
        assert (r["source"], r["step"], r["verified"], r["global_steps"]) == ("memory", 2, True, 2)
        assert r["differs_before"]  # the new engine started elsewhere ...
        assert r["same_loss"]  # ... and after restoring step 2, step 3 is the same step
        assert r["same_state"]  # parameters and this rank's fp32 partition, bit for bit
        assert "param_slice_mappings" not in r["optimizer_keys"]
