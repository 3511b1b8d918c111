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
    ("a plain SIGKILL with no OOM record read is presumed an OOM kill", "step 100 loss 2.1", -9, K.HOST_OOM),
    (
        "a SIGKILL whose OOM records show no kill stays killed",
        "step 100 loss 2.1\ndlrover memory record: no OOM kill: the memory cgroup's oom_kill count stayed at 0",
        -9,
        K.KILLED,
    ),
    (
        "Ray's memory monitor kills workers",
        "(raylet) node_manager.cc:3277: 2 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers "
        "crashed due to other reasons at node (ID: 8289f8, IP: 172.24.0.226) over the last time period.",
        None,
        K.HOST_OOM,
    ),
    (
        "tcmalloc finds the heap corrupt",
        "src/tcmalloc.cc:283] Attempt to free invalid pointer 0x55a1d0d57740",
        None,
        K.NATIVE_CRASH,
    ),
    (
        "an exception line pasted in Markdown bold",
        "_**RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
        "cpu! (when checking argument for argument index in method wrapper__index_select)**_",
        None,
        K.USER_CODE,
    ),
    (
        "torch's own AttributeError subclass (before 1.8)",
        "torch.nn.modules.module.ModuleAttributeError: 'DistributedDataParallel' object has no attribute 'train_step'",
        None,
        K.USER_CODE,
    ),
    # -- the signal a launcher or a shell wrote into the log decides like an exit status
    ("bash reports a kill", "./train.sh: line 12: 40211 Killed                  python train.py", None, K.HOST_OOM),
    (
        "DeepSpeed's return code",
        "[launch.py:325:sigkill_handler] ['python', 'train.py'] exits with return code = -11",
        None,
        K.NATIVE_CRASH,
    ),
    (
        "subprocess",
        "subprocess.CalledProcessError: Command '['python', 't.py']' died with <Signals.SIGSEGV: 11>.",
        None,
        K.NATIVE_CRASH,
    ),
    (
        "kubelet's exit code",
        "    State:          Terminated\n      Reason:       Error\n      Exit Code:    139",
        None,
        K.NATIVE_CRASH,
    ),
    ("Slurm task", "srun: error: gpu-5: task 3: Segmentation fault (core dumped)", None, K.NATIVE_CRASH),
    (
        "torchrun's root cause, not the ranks it stopped",
        "Failures:\n[1]:\n  exitcode  : -15 (pid: 2001)\n  traceback : Signal 15 (SIGTERM) received by PID 2001\n"
        "Root Cause (first observed failure):\n[0]:\n  exitcode  : -7 (pid: 2000)\n"
        "  traceback : Signal 7 (SIGBUS) received by PID 2000",
        None,
        K.NATIVE_CRASH,
    ),
    (
        "a traceback in torchrun's summary",
        "Root Cause (first observed failure):\n[0]:\n  exitcode  : 1 (pid: 2000)\n"
        "  traceback : Traceback (most recent call last):\n"
        '    File "train.py", line 20, in main\n      model.fit(loader)\n'
        "  TypeError: fit() missing 1 required positional argument: 'epochs'",
        None,
        K.USER_CODE,
    ),
    # -- communication errors are the aftermath of any other failure in the same log
    (
        "an OOM kill before its peers' timeouts",
        "slurmstepd: error: Detected 1 oom_kill event in StepId=1.0.\n"
        "[E ProcessGroupNCCL.cpp:828] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, "
        "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600042 milliseconds before timing out.",
        None,
        K.HOST_OOM,
    ),
    (
        "a preemption before the peers' errors",
        "slurmstepd: error: *** STEP 5123.0 ON gpu17 CANCELLED AT 2024-04-04T04:04:04 DUE TO PREEMPTION ***\n"
        "RuntimeError: NCCL communicator was aborted on rank 2.",
        None,
        K.PREEMPTION,
    ),
    (
        "ranks in different collectives are a hang",
        "[rank0]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=50, OpType=ALLREDUCE, NumelIn=10, "
        "NumelOut=10, Timeout(ms)=600000) ran for 600010 milliseconds before timing out.\n"
        "[rank1]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=50, OpType=ALLGATHER, NumelIn=99, "
        "NumelOut=396, Timeout(ms)=600000) ran for 600010 milliseconds before timing out.",
        None,
        K.HANG,
    ),
    (
        "the same collective timing out everywhere is the network",
        "\n".join(
            f"[rank{r}]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, "
            "NumelIn=98, NumelOut=98, Timeout(ms)=600000) ran for 600020 milliseconds before timing out."
            for r in range(3)
        ),
        None,
        K.COMMUNICATION,
    ),
    (
        "torch's desync report",
        "Detected mismatch between collectives on ranks. Rank 1 is running collective",
        None,
        K.HANG,
    ),
    # -- NaN losses across trainers
    ("detectron2", "FloatingPointError: Loss became infinite or NaN at iteration=1234!", None, K.NAN_LOSS),
    ("Lightning progress bar", "Epoch 3:  12%|█▏  | 120/1000 [00:40<04:50, loss=nan, v_num=2]", None, K.NAN_LOSS),
    (
        "Lightning early stopping",
        "Monitored metric val_loss = nan is not finite. Previous best value was inf.",
        None,
        K.NAN_LOSS,
    ),
    (
        "Megatron",
        " iteration 120/ 5000 | lm loss: nan | loss scale: 1.0 | number of nan iterations:   1 |",
        None,
        K.NAN_LOSS,
    ),
    ("Megatron grad check", "AssertionError: found NaN in local grad norm in backward pass", None, K.NAN_LOSS),
    (
        "clip_grad_norm_",
        "RuntimeError: The total norm of order 2.0 for gradients from `parameters` is non-finite",
        None,
        K.NAN_LOSS,
    ),
    ("Keras", "Batch 1532: Invalid loss, terminating training", None, K.NAN_LOSS),
    (
        "a best-loss tracker starting at inf is not a NaN",
        "Epoch 00001: val_loss improved from inf to 0.53210",
        None,
        K.UNKNOWN,
    ),
    (
        "a skipped fp16 step's infinite norm is not a NaN",
        "{'loss': 2.13, 'grad_norm': inf, 'epoch': 0.01}",
        None,
        K.UNKNOWN,
    ),
    # -- host memory beyond the kernel's own words
    ("numpy", "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 3.5 GiB for an array", None, K.HOST_OOM),
    (
        "CPU allocator",
        "RuntimeError: [enforce fail at alloc_cpu.cpp:114] . DefaultCPUAllocator: not enough memory",
        None,
        K.HOST_OOM,
    ),
    (
        "Slurm memory limit",
        "slurmstepd: error: Job 123 exceeded memory limit (16777216 > 16000000), being killed",
        None,
        K.HOST_OOM,
    ),
    (
        "Ray's memory monitor",
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
        None,
        K.HOST_OOM,
    ),
    # -- disks, data, configuration, preemption in other words
    (
        "torch.save on a full disk",
        "RuntimeError: [enforce fail at inline_container.cc:595] . unexpected pos 3154624 vs 3154512",
        None,
        K.DISK_FULL,
    ),
    ("sqlite", "sqlite3.OperationalError: database or disk is full", None, K.DISK_FULL),
    ("HDF5", "OSError: Unable to open file (file signature not found)", None, K.DATA_ERROR),
    (
        "video",
        "av.error.InvalidDataError: [Errno 1094995529] Invalid data found when processing input",
        None,
        K.DATA_ERROR,
    ),
    (
        "a Git LFS pointer",
        "RuntimeError: Internal: src/sentencepiece_processor.cc(1101) [model_proto->ParseFromArray(...)]",
        None,
        K.DATA_ERROR,
    ),
    (
        "an env contract",
        "ValueError: Error initializing torch.distributed using env:// rendezvous: "
        "environment variable MASTER_ADDR expected, but not set",
        None,
        K.CONFIG_ERROR,
    ),
    (
        "two ranks on one GPU",
        "NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1b000",
        None,
        K.CONFIG_ERROR,
    ),
    ("a Hydra key", "omegaconf.errors.ConfigAttributeError: Key 'lr_scheduler' is not in struct", None, K.CONFIG_ERROR),
    ("a bad argument", "train.py: error: unrecognized arguments: --gradient-accumulation 8", None, K.CONFIG_ERROR),
    (
        "an image pull that failed on a full disk",
        'Warning FailedSync  Error syncing pod, skipping: failed to "StartContainer" for "svc" with ErrImagePull: '
        '"failed to register layer: Untar re-exec error: exit status 1: output: open /srv/a: no space left on device"',
        None,
        K.DISK_FULL,
    ),
    (
        "an image pull that failed on a full disk, said on the line before",
        'Warning  Failed  kubelet  Failed to pull image "reg/x:1": write /usr/lib/libcuda.so: no space left on device\n'
        "Warning  Failed  kubelet  Error: ErrImagePull\n"
        "Warning  Failed  kubelet  Error: ImagePullBackOff",
        None,
        K.DISK_FULL,
    ),
    ("an image that cannot be pulled", "Warning  Failed  kubelet  Error: ImagePullBackOff", None, K.CONFIG_ERROR),
    ("torchelastic's signal exception, spaced", "SignalException: Process 7 got signal : 1", None, K.PREEMPTION),
    (
        "torchelastic's signal exception in other words",
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 81061 got sigval:1",
        None,
        K.PREEMPTION,
    ),
    (
        "a Slurm time limit",
        "slurmstepd: error: *** JOB 98 ON gpu042 CANCELLED AT 2024-02-02T02:02:02 DUE TO TIME LIMIT ***",
        None,
        K.PREEMPTION,
    ),
    ("LSF", "TERM_PREEMPT: job killed after preemption.", None, K.PREEMPTION),
    ("a requeue", "Handling SIGUSR1: requeuing job 123456", None, K.PREEMPTION),
    ("Kubernetes node loss", "Pod was deleted by the taint manager: TaintManagerEviction", None, K.PREEMPTION),
    ("a GPU that needs a reset", "torch.cuda.CudaError: CUDA error: GPU requires reset", None, K.HARDWARE),
    ("the adapter's own fault", "NCCL WARN NET/IB : Got async event : local catastrophic error", None, K.HARDWARE),
    ("a kernel that failed", "RuntimeError: CUDA error: unspecified launch failure", None, K.NATIVE_CRASH),
    ("DDP misuse", "RuntimeError: Expected to mark a variable ready only once.", None, K.USER_CODE),
    (
        "a torch built for other GPUs",
        "RuntimeError: CUDA error: no kernel image is available for execution on the device",
        None,
        K.USER_CODE,
    ),
    (
        "a Markdown-quoted exception",
        "> RuntimeError: mat1 and mat2 shapes cannot be multiplied (511x2 and 3x4096)",
        None,
        K.USER_CODE,
    ),
    # -- /dev/shm is a container setting, not the host's memory or a data disk
    (
        "DataLoader shm",
        "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
        None,
        K.CONFIG_ERROR,
    ),
    (
        "NCCL shm",
        "misc/shmutils.cc:88 NCCL WARN Error: failed to extend /dev/shm/nccl-WU88OE to 9637892 bytes, "
        "error: No space left on device (28)",
        None,
        K.CONFIG_ERROR,
    ),
    # -- settings rejected where they are validated, ranks given twice
    (
        "Megatron's argument check",
        'Traceback (most recent call last):\n  File "megatron/training/arguments.py", line 561, in validate_args\n'
        "    assert num_layers % args.transformer_pipeline_model_parallel_size == 0\nAssertionError",
        None,
        K.CONFIG_ERROR,
    ),
    (
        "training arguments checking themselves",
        'Traceback (most recent call last):\n  File "run.py", line 9, in <module>\n'
        "    args = TrainingArguments(**cfg)\n"
        '  File "/usr/lib/python3/site-packages/transformers/training_args.py", line 1500, in __post_init__\n'
        "    raise ValueError(\nValueError: --load_best_model_at_end requires the save and eval strategy to match",
        None,
        K.CONFIG_ERROR,
    ),
    (
        "two processes with one global rank",
        "initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/8\ninitializing ddp: GLOBAL_RANK: 0, MEMBER: 1/8\n"
        "initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/8",
        None,
        K.CONFIG_ERROR,
    ),
    # -- stuck processes, stops from outside, a collapsed loss scale, kubelet's disk signals
    (
        "a py-spy dump",
        'Thread 0x7FA6E7C01740 (idle): "MainThread"\n    wait (threading.py:302)\n    get (queue.py:170)',
        None,
        K.HANG,
    ),
    (
        "interrupted while waiting",
        'Traceback (most recent call last):\n  File "/usr/lib/python3.6/multiprocessing/queues.py", line 346, in put\n'
        "    with self._wlock:\n"
        '  File "/usr/lib/python3.6/multiprocessing/synchronize.py", line 96, in __enter__\n'
        "    return self._semlock.__enter__()\nKeyboardInterrupt",
        None,
        K.HANG,
    ),
    (
        "torchrun's agent stopped",
        "torch/distributed/elastic/agent/server/api.py:719] Received 15 death signal, shutting down workers",
        None,
        K.PREEMPTION,
    ),
    ("hyphenated", "PreemptionError: Nodes of this job got pre-empted.", None, K.PREEMPTION),
    (
        "fairseq's loss scale",
        "fairseq.trainer | NOTE: overflow detected, setting loss scale to: 0.000244",
        None,
        K.NAN_LOSS,
    ),
    (
        "a loss scale of 0 is the dynamic setting",
        '{"fp16": {"enabled": true, "loss_scale": 0, "min_loss_scale": 0.0001}}',
        None,
        K.UNKNOWN,
    ),
    ("kubelet nodefs", "Reason: Evicted\nMessage: The node was low on resource: nodefs.", None, K.DISK_FULL),
    ("a bolded shell report", "**Killed**", None, K.HOST_OOM),
    (
        "srun ending a step after a task failed is not a preemption",
        "[E ProcessGroupNCCL.cpp:828] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, "
        "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600042 milliseconds before timing out.\n"
        "srun: error: node2: task 5: Exited with exit code 1\n"
        "slurmstepd: error: *** STEP 123.0 ON node1 CANCELLED AT 2024-01-01T00:00:00 ***",
        None,
        K.COMMUNICATION,
    ),
    (
        "Windows virtual memory",
        "OSError: [WinError 1455] The paging file is too small for this operation",
        None,
        K.HOST_OOM,
    ),
    ("the kernel's hung-task watchdog", "INFO: task python:1234 blocked for more than 120 seconds.", None, K.HANG),
    ("a file descriptor limit", "RuntimeError: received 0 items of ancdata", None, K.CONFIG_ERROR),
    (
        "a requeue by Slurm",
        "slurmstepd: error: *** JOB 608 ON n1 CANCELLED AT 2022-08-12T02:06:12 DUE TO JOB REQUEUE ***",
        None,
        K.PREEMPTION,
    ),
]

# Lines that real training logs print while nothing is wrong: alone they decide nothing, and
# before a failure they do not change its kind.
BENIGN = [
    "[W socket.cpp:663] [c10d] The client socket has failed to connect to [localhost]:29500 (errno: 99 - Cannot "
    "assign requested address).",
    "node1:11:11 [0] NCCL INFO NET/Plugin : Plugin load (libnccl-net.so) returned 2 : libnccl-net.so: cannot open "
    "shared object file: No such file or directory.",
    "The following part of your input was truncated because CLIP can only handle sequences up to 77 tokens",
    "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0",
    "best_loss = inf",
    "Corrupt JPEG data: 2 extraneous bytes before marker 0xd9",
    '  warnings.warn(f"Found {n} corrupted images, skipping them")',
    "Connection reset by peer (retrying in 5s) while downloading https://huggingface.co/model.safetensors",
    "Killed 3 stale processes",
    "preemption_policy: never",
]


@pytest.fixture(scope="module")
def registry() -> RuleRegistry:
    # Built once (a third of a second): a hundred cases below classify with it.
    return RuleRegistry.with_builtin_rules()


@pytest.mark.parametrize(("name", "log", "exit_status", "expected"), CASES, ids=[c[0] for c in CASES])
def test_real_world_shape(
    registry: RuleRegistry, name: str, log: str, exit_status: int | None, expected: FailureKind
) -> None:
    diagnosis = classify(Evidence.from_text(log, returncode=exit_status), registry)
    assert diagnosis.kind is expected, (name, diagnosis.reason)


_R, _RN, _ABORT = ActionKind.RESTART_PROCESSES, ActionKind.RELAUNCH_NODE, ActionKind.ABORT_JOB


@pytest.mark.parametrize(
    ("kind", "steps"),
    [
        # The node moves when its crash comes back; its replacement's second one stops the job.
        (K.NATIVE_CRASH, [("n0", _R), ("n0", _RN), ("n1", _R), ("n1", _ABORT)]),
        (K.DISK_FULL, [("n0", _ABORT), ("n0", _ABORT)]),
        (K.CONFIG_ERROR, [("n0", _ABORT), ("n0", _ABORT)]),
    ],
)
def test_new_kinds_ladders(kind: FailureKind, steps: list[tuple[str, ActionKind]]) -> None:
    policy = ActionPolicy()
    decisions = [policy.decide(node, kind) for node, _ in steps]
    assert [d.action for d in decisions] == [action for _, action in steps]
    assert "resubmit" in decisions[-1].reason or "native code" in decisions[-1].reason


@pytest.mark.parametrize("line", BENIGN)
def test_benign_lines_decide_nothing(registry: RuleRegistry, line: str) -> None:
    assert classify(Evidence.from_text(line), registry).kind is K.UNKNOWN, line
    failure = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    noisy = "\n".join([*BENIGN, failure, *BENIGN])
    assert classify(Evidence.from_text(noisy), registry).kind is K.DEVICE_OOM
