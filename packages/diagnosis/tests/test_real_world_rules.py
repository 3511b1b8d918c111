"""The rules written for real-world logs, one shape each, including the cases they must leave alone.

The logs here are written for these tests in the shapes users' jobs print; the real excerpts are
in corpus_real/ (scored by test_corpus_real.py).
"""

from __future__ import annotations

import pytest

from dlrover.diagnosis import ActionKind, ActionPolicy, Evidence, FailureKind, RuleRegistry, classify

K = FailureKind

CASES = [
    # (name, log, exit status, expected kind)
    (
        "deepspeed loss scale at minimum",
        "Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.",
        1,
        K.NAN_LOSS,
    ),
    ("trainer grad_norm nan", "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 9.9e-05, 'epoch': 0.0}", 1, K.NAN_LOSS),
    (
        "metrics table with nan",
        "Step  Train loss  Test loss\n1000  [5.4e+03]  [6.4e+03]\n2000  [nan]  [nan]\n",
        1,
        K.NAN_LOSS,
    ),
    (
        "loss scale halving every step",
        "\n".join(f"PARAMETER loss_scale : {2.0**k}" for k in range(20, 12, -1)),
        None,
        K.NAN_LOSS,
    ),
    (
        "a loss scale that recovers is healthy",
        "\n".join(f"PARAMETER loss_scale : {v}" for v in (65536.0, 32768.0, 65536.0, 32768.0, 65536.0, 131072.0)),
        None,
        K.UNKNOWN,
    ),
    (
        "checkpoint without its zip directory",
        "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory",
        1,
        K.DATA_ERROR,
    ),
    ("pickle checkpoint with a bad key", "_pickle.UnpicklingError: invalid load key, '\\x00'.", 1, K.DATA_ERROR),
    ("ENOSPC", "OSError: [Errno 28] No space left on device: '/ckpt/step_10/model.pt'", 1, K.DISK_FULL),
    ("EDQUOT", "OSError: [Errno 122] Disk quota exceeded", 1, K.DISK_FULL),
    (
        "checkpoint writer",
        "RuntimeError: [enforce fail at inline_container.cc:471] . PytorchStreamWriter failed writing file data/2",
        1,
        K.DISK_FULL,
    ),
    ("pod evicted for disk pressure", "Evicted   Pod The node had condition: [DiskPressure].", None, K.DISK_FULL),
    ("port in use", "RuntimeError: Address already in use", 1, K.CONFIG_ERROR),
    ("more ranks than GPUs", "RuntimeError: CUDA error: invalid device ordinal", 1, K.CONFIG_ERROR),
    ("no NCCL interface", "NCCL WARN Bootstrap : no socket interface found", 1, K.CONFIG_ERROR),
    (
        "store refused at init",
        'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\n'
        '    dist.init_process_group("nccl")\n'
        '  File "/x/torch/distributed/rendezvous.py", line 189, in _create_c10d_store\n'
        "    return TCPStore(\n"
        "torch.distributed.DistNetworkError: The client socket has failed to connect to [10.0.0.9]:29500 "
        "(errno: 111 - Connection refused).",
        1,
        K.CONFIG_ERROR,
    ),
    (
        "store refused mid-training is a network glitch",
        'Traceback (most recent call last):\n  File "t.py", line 30, in train\n    store.get("k")\n'
        "RuntimeError: Connection refused",
        1,
        K.COMMUNICATION,
    ),
    (
        "the launcher's own argument handling",
        'Traceback (most recent call last):\n  File "/usr/bin/accelerate-launch", line 8, in <module>\n'
        "    sys.exit(main())\n"
        '  File "/usr/lib/python3/site-packages/accelerate/commands/launch.py", line 280, in simple_launcher\n'
        "    mixed_precision = PrecisionType(args.mixed_precision.lower())\n"
        "AttributeError: 'NoneType' object has no attribute 'lower'",
        1,
        K.CONFIG_ERROR,
    ),
    ("segfault in a worker", "ERROR: Unexpected segmentation fault encountered in worker.", 1, K.NATIVE_CRASH),
    (
        "illegal memory access",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        1,
        K.NATIVE_CRASH,
    ),
    ("std::terminate", "terminate called without an active exception", -6, K.NATIVE_CRASH),
    ("a bare SIGSEGV exit", "", -11, K.NATIVE_CRASH),
    (
        "the watchdog's own abort is the collective's failure",
        "[E ProcessGroupNCCL.cpp:1182] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, "
        "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600042 milliseconds before timing out.\n"
        "[E ProcessGroupNCCL.cpp:460] To avoid data inconsistency, we are taking the entire process down.\n"
        "terminate called after throwing an instance of 'c10::DistBackendError'\n"
        "Fatal Python error: Aborted",
        -6,
        K.COMMUNICATION,
    ),
    (
        "a stuck watchdog alone is a hang",
        "[rank0]:[E608 14:09:10 ProcessGroupNCCL.cpp:1484] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
        "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued "
        "collectives. This typically indicates a NCCL/CUDA API hang blocking the watchdog.",
        -6,
        K.HANG,
    ),
    (
        "a follow-up Xid names an NVLink fault",
        "NVRM: Xid (PCI:0000:dc:00): 45, pid=1, caused by previous Xid 149",
        1,
        K.HARDWARE,
    ),
    ("spot notice", "GCP Metadata Service says termination is imminent", None, K.PREEMPTION),
    ("node shutdown", "Message: Pod was terminated in response to imminent node shutdown.", None, K.PREEMPTION),
    (
        "SIGHUP",
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 8665 got signal: 1",
        1,
        K.PREEMPTION,
    ),
    (
        "slurm oom-kill",
        "slurmstepd: error: Detected 2 oom_kill events in StepId=13. Some tasks have been OOM Killed.",
        1,
        K.HOST_OOM,
    ),
    ("a plain SIGKILL stays killed", "step 100 loss 2.1", -9, K.KILLED),
]


@pytest.mark.parametrize(("name", "log", "exit_status", "expected"), CASES, ids=[c[0] for c in CASES])
def test_real_world_shape(name: str, log: str, exit_status: int | None, expected: FailureKind) -> None:
    diagnosis = classify(Evidence.from_text(log, returncode=exit_status), RuleRegistry.with_builtin_rules())
    assert diagnosis.kind is expected, (name, diagnosis.reason)


@pytest.mark.parametrize(
    ("kind", "first", "then"),
    [
        (K.NATIVE_CRASH, ActionKind.RESTART_PROCESSES, ActionKind.ABORT_JOB),
        (K.DISK_FULL, ActionKind.ABORT_JOB, ActionKind.ABORT_JOB),
        (K.CONFIG_ERROR, ActionKind.ABORT_JOB, ActionKind.ABORT_JOB),
    ],
)
def test_new_kinds_ladders(kind: FailureKind, first: ActionKind, then: ActionKind) -> None:
    policy = ActionPolicy()
    assert policy.decide("n0", kind).action is first
    last = policy.decide("n0", kind)
    assert last.action is then
    assert "resubmit" in last.reason or "native code" in last.reason
