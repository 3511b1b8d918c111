"""Failure families in wordings the real-world corpus's dev part does not hold.

The third round of rules keys each family on its stable parts (an errno name, an error code, the
fixed phrase of the component that prints it) rather than on the strings of the dev excerpts. Each
case is one line or a few lines in the shape the named tool prints (from its documentation, its
source or users' reports of it), written for this test; the negative cases are lines that name a
family's words while nothing of that kind happened.
"""

from __future__ import annotations

import pytest

from dlrover.diagnosis import Evidence, FailureKind, RuleRegistry, classify

K = FailureKind

_NCCL_TIMEOUT = (
    "[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
    "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800431 milliseconds before timing out."
)

CASES = [
    # (name, log, exit status, expected kind)
    # -- host memory: schedulers, container runtimes, notebooks and user-space OOM killers
    (
        "Slurm virtual memory limit",
        "slurmstepd: error: Job 4321 exceeded virtual memory limit (70000000 > 65536000), being killed",
        None,
        K.HOST_OOM,
    ),
    ("PBS memory limit", "=>> PBS: job killed: mem 136314880kb exceeded limit 134217728kb", None, K.HOST_OOM),
    ("LSF memory limit", "TERM_MEMLIMIT: job killed after reaching LSF memory usage limit.", None, K.HOST_OOM),
    (
        "AWS Batch container",
        "Status reason: OutOfMemoryError: Container killed due to memory usage",
        None,
        K.HOST_OOM,
    ),
    (
        "Kubernetes SystemOOM event",
        "Warning  SystemOOM  node/gpu-node-7  System OOM encountered, victim process: python, pid: 40213",
        None,
        K.HOST_OOM,
    ),
    (
        "systemd-oomd",
        "systemd-oomd[812]: Killed /user.slice/user-1000.slice/session-3.scope due to memory pressure for "
        "/user.slice/user-1000.slice being 71.20% > 50.00% for > 20s with reclaim activity",
        None,
        K.HOST_OOM,
    ),
    (
        "earlyoom",
        "earlyoom: low memory! at or below SIGKILL limits: mem  5.00%, swap  5.00%\n"
        'earlyoom: sending SIGKILL to process 2231 uid 1000 "python": badness 912, VmRSS 59012 MiB',
        None,
        K.HOST_OOM,
    ),
    ("Colab", "Your session crashed after using all available RAM.", None, K.HOST_OOM),
    (
        "mmap without memory",
        "RuntimeError: unable to mmap 1073741824 bytes from file </torch_12_9>: Cannot allocate memory (12)",
        None,
        K.HOST_OOM,
    ),
    (
        "torchrun's SIGKILL root cause",
        "Root Cause (first observed failure):\n[0]:\n  time      : 2024-05-01_10:00:00\n"
        "  rank      : 0 (local_rank: 0)\n"
        "  exitcode  : -9 (pid: 1201)\n  traceback : Signal 9 (SIGKILL) received by PID 1201",
        None,
        K.HOST_OOM,
    ),
    (
        "an OOM kill, then the surviving ranks' NCCL errors",
        "[Thu May  2 10:00:00 2024] Memory cgroup out of memory: Killed process 1201 (python) total-vm:98765432kB, "
        "anon-rss:65432100kB, file-rss:0kB\n" + _NCCL_TIMEOUT + "\n"
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
        "remote process exited or there was a network error, NCCL version 2.19.3",
        None,
        K.HOST_OOM,
    ),
    # -- device memory: other backends and libraries
    (
        "XLA allocator",
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Failed to allocate request for 2.00GiB "
        "(2147483648B) on device ordinal 0",
        None,
        K.DEVICE_OOM,
    ),
    (
        "TPU HBM",
        "RuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
        "Used 17.21G of 15.48G hbm. Exceeded hbm capacity by 1.73G.",
        None,
        K.DEVICE_OOM,
    ),
    ("ROCm runtime", "RuntimeError: HIP error: hipErrorOutOfMemory", None, K.DEVICE_OOM),
    ("cuDNN workspace", "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED", None, K.DEVICE_OOM),
    ("NCCL buffers", "NCCL WARN Failed to CUDA calloc 6291456 bytes", None, K.DEVICE_OOM),
    (
        "Intel XPU",
        "RuntimeError: level_zero backend failed with error: 39 (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)",
        None,
        K.DEVICE_OOM,
    ),
    (
        "a device OOM, then its peers' timeouts",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 3 has a total capacity of "
        "79.15 GiB of which 1.02 GiB is free.\n" + _NCCL_TIMEOUT,
        None,
        K.DEVICE_OOM,
    ),
    # -- communication in other transports' and versions' words
    (
        "an older NCCL's IB completion error",
        "node3:2231:2290 [1] NCCL WARN NET/IB : Got completion with error 12, opcode 0, len 0, vendor err 129",
        None,
        K.COMMUNICATION,
    ),
    (
        "EFA through aws-ofi-nccl",
        "node3:2231:2290 [1] NCCL WARN NET/OFI Request 0x7f2e completed with error. RC: 21. Error: Input/output "
        "error. Completed length: 0",
        None,
        K.COMMUNICATION,
    ),
    (
        "c10d client socket timeout",
        "[E socket.cpp:957] [c10d] The client socket has timed out after 1800s while trying to connect to "
        "(10.1.2.3, 29500).",
        None,
        K.COMMUNICATION,
    ),
    (
        "Horovod",
        "horovod.common.exceptions.HorovodInternalError: ncclAllReduce failed: unhandled system error",
        None,
        K.COMMUNICATION,
    ),
    (
        "JAX distributed barrier",
        "jax.errors.JaxRuntimeError: DEADLINE_EXCEEDED: Barrier timed out.",
        None,
        K.COMMUNICATION,
    ),
    (
        "MPI",
        "[node2:01234] *** An error occurred in MPI_Allreduce\n"
        "[node2:01234] *** MPI_ERR_OTHER: known error not in list",
        None,
        K.COMMUNICATION,
    ),
    # -- hardware and node faults
    ("fabric manager down", "RuntimeError: CUDA error: system not yet initialized", None, K.HARDWARE),
    (
        "NVML on a lost GPU",
        "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error",
        None,
        K.HARDWARE,
    ),
    (
        "a ROCm GPU hang",
        "HW Exception by GPU node-1 (Agent handle: 0x55d1b4c0) reason :GPU Hang",
        None,
        K.HARDWARE,
    ),
    ("an AMD GPU reset", "amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!", None, K.HARDWARE),
    # -- full disks and quotas from other writers
    (
        "Windows",
        "OSError: [WinError 112] There is not enough space on the disk: 'C:\\ckpt\\model.pt'",
        None,
        K.DISK_FULL,
    ),
    (
        "HDFS quota",
        "org.apache.hadoop.hdfs.protocol.DSQuotaExceededException: The DiskSpace quota of /user/ml is exceeded: "
        "quota = 1099511627776 B = 1 TB but diskspace consumed = 1099611627776 B = 1.00 TB",
        None,
        K.DISK_FULL,
    ),
    (
        "a pod's ephemeral storage",
        'Container trainer exceeded its local ephemeral storage limit "20Gi".',
        None,
        K.DISK_FULL,
    ),
    (
        "an emptyDir volume",
        'Usage of EmptyDir volume "cache" exceeds the limit "50Gi".',
        None,
        K.DISK_FULL,
    ),
    (
        "Rust's StorageFull",
        'Error: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })',
        None,
        K.DISK_FULL,
    ),
    (
        "a disk full after a NaN warning is the disk",
        "{'loss': 1.92, 'grad_norm': inf}\nOSError: [Errno 28] No space left on device",
        None,
        K.DISK_FULL,
    ),
    # -- NaN and infinite losses, many wordings
    (
        "DeepSpeed's scale stuck at its minimum",
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1, reducing to 1",
        None,
        K.NAN_LOSS,
    ),
    (
        "Lightning's check on the returned loss",
        "ValueError: The loss returned in `training_step` is nan.",
        None,
        K.NAN_LOSS,
    ),
    (
        "Lightning's parameter check",
        "ValueError: Detected nan and/or inf values in `layer.weight`. Check your forward pass for numerically "
        "unstable operations.",
        None,
        K.NAN_LOSS,
    ),
    (
        "fairseq's JSON log",
        '{"epoch": 3, "update": 2.1, "loss": "nan", "nll_loss": "nan", "ppl": "nan"}',
        None,
        K.NAN_LOSS,
    ),
    ("JSON grad norm", '{"train_loss": "2.03", "train_gnorm": "nan", "train_grad_norm": "nan"}', None, K.NAN_LOSS),
    ("TensorFlow check_numerics", "InvalidArgumentError: loss : Tensor had NaN values", None, K.NAN_LOSS),
    ("a gradient norm in words", "The gradient norm is nan at step 4200, stopping.", None, K.NAN_LOSS),
    ("a loss that went NaN", "WARNING: training loss went NaN at step 1500", None, K.NAN_LOSS),
    ("a non-finite loss", "Non-finite loss, exiting: tensor(nan, device='cuda:0')", None, K.NAN_LOSS),
    ("JAX debug_nans", "FloatingPointError: invalid value (nan) encountered in dot_general", None, K.NAN_LOSS),
    (
        "Paddle",
        "There are NAN or INF (num_nan=1, num_inf=0, num_zero=0) in "
        "[device=gpu:0, op=matmul_v2, tensor=linear_0.w_0@GRAD]",
        None,
        K.NAN_LOSS,
    ),
    ("a diverged loss", "Loss diverged at iteration 3000, aborting run", None, K.NAN_LOSS),
    # -- corrupt and truncated inputs of other formats
    ("a truncated memmap", "ValueError: mmap length is greater than file size", None, K.DATA_ERROR),
    (
        "a truncated torch storage",
        "RuntimeError: storage has wrong byte size: expected 0 got 4718592",
        None,
        K.DATA_ERROR,
    ),
    (
        "a model cloned without git-lfs",
        "OSError: You seem to have cloned a repository without having git-lfs installed. Please install git-lfs and "
        "run `git lfs install` followed by `git lfs pull` in the folder you cloned.",
        None,
        K.DATA_ERROR,
    ),
    ("CSV with NUL bytes", "_csv.Error: line contains NUL", None, K.DATA_ERROR),
    ("msgpack", "ValueError: Unpack failed: incomplete input", None, K.DATA_ERROR),
    ("LMDB", "lmdb.InvalidError: /data/train.lmdb: MDB_INVALID: File is not an LMDB file", None, K.DATA_ERROR),
    (
        "HDF5 object header",
        "OSError: Unable to synchronously open object (bad object header version number)",
        None,
        K.DATA_ERROR,
    ),
    (
        "tensorstore",
        'ValueError: DATA_LOSS: Error reading local file "/ckpt/40000/d/8f2e": Unexpected end of file',
        None,
        K.DATA_ERROR,
    ),
    ("pandas JSON", "ValueError: Expected object or value", None, K.DATA_ERROR),
    # -- stops from outside: schedulers, clouds, signals
    (
        "Slurm's job state",
        "JobId=51234 JobName=pretrain JobState=PREEMPTED Reason=None Dependency=(null)",
        None,
        K.PREEMPTION,
    ),
    ("Slurm's time-out state", "   JobState=TIMEOUT Reason=TimeLimit Dependency=(null)", None, K.PREEMPTION),
    ("PBS walltime", "=>> PBS: job killed: walltime 172830 exceeded limit 172800", None, K.PREEMPTION),
    ("LSF owner kill", "TERM_OWNER: job killed by owner.", None, K.PREEMPTION),
    (
        "Azure scheduled event",
        '{"EventId": "f020ba2e", "EventType": "Preempt", "ResourceType": "VirtualMachine", "EventStatus": "Scheduled"}',
        None,
        K.PREEMPTION,
    ),
    (
        "AWS instance action",
        'instance-action: {"action": "terminate", "time": "2024-05-02T10:02:00Z"}',
        None,
        K.PREEMPTION,
    ),
    (
        "SageMaker spot",
        "ClientError: The spot instance was interrupted while the training job was running.",
        None,
        K.PREEMPTION,
    ),
    ("AWS Batch host", "Status reason: Host EC2 (instance i-0abc123def) terminated.", None, K.PREEMPTION),
    (
        "Kubernetes unreachable node",
        "Warning  NodeNotReady  pod/trainer-worker-3  Node is not ready\n"
        "Tolerations: node.kubernetes.io/unreachable:NoExecute op=Exists for 300s",
        None,
        K.PREEMPTION,
    ),
    ("Lightning's requeue", "Handling auto-requeue signal: 10", None, K.PREEMPTION),
    (
        "a shell's SIGTERM exit status",
        "Process finished with exit code 143 (interrupted by signal 15: SIGTERM)",
        None,
        K.PREEMPTION,
    ),
    # -- hangs
    (
        "faulthandler's timeout dump",
        "Timeout (0:30:00)!\nThread 0x00007f3a2b7fe700 (most recent call first):\n"
        '  File "/usr/lib/python3.10/threading.py", line 324 in wait',
        None,
        K.HANG,
    ),
    (
        "Horovod's stall inspector",
        "[2024-05-02 10:00:00.000: W /tmp/horovod/common/stall_inspector.cc:107] One or more tensors were submitted "
        "to be reduced, gathered or broadcasted by subset of ranks and are waiting for remainder of ranks for more "
        "than 60 seconds.",
        None,
        K.HANG,
    ),
    ("a DataLoader timeout", "RuntimeError: DataLoader timed out after 600 seconds", None, K.HANG),
    # -- native crashes beyond CUDA
    (
        "ROCm memory access fault",
        "Memory access fault by GPU node-2 (Agent handle: 0x5626a1c0) on address 0x7f1c0000. Reason: Page not "
        "present or supervisor privilege.",
        None,
        K.NATIVE_CRASH,
    ),
    (
        "HSA",
        "HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION: The agent attempted to access memory beyond",
        None,
        K.NATIVE_CRASH,
    ),
    ("HIP illegal address", "RuntimeError: HIP error: hipErrorIllegalAddress", None, K.NATIVE_CRASH),
    (
        "glog's fatal check",
        "F0502 10:00:00.000000 12345 pjrt_stream_executor_client.cc:2804] Check failed: buffer != nullptr\n"
        "*** Check failure stack trace: ***",
        None,
        K.NATIVE_CRASH,
    ),
    ("Windows access violation code", "Process finished with exit code -1073741819", None, K.NATIVE_CRASH),
    # -- user code: torch's messages for programs that are wrong
    (
        "expand",
        "RuntimeError: The expanded size of the tensor (3) must match the existing size (4) at non-singleton "
        "dimension 1.  Target sizes: [2, 3].  Tensor sizes: [2, 4]",
        None,
        K.USER_CODE,
    ),
    ("view", "RuntimeError: shape '[-1, 400]' is invalid for input of size 1000", None, K.USER_CODE),
    (
        "dtype",
        "RuntimeError: expected mat1 and mat2 to have the same dtype, but got: float != c10::BFloat16",
        None,
        K.USER_CODE,
    ),
    ("targets", "ValueError: Expected input batch_size (16) to match target batch_size (8).", None, K.USER_CODE),
    (
        "in-place on a leaf",
        "RuntimeError: a leaf Variable that requires grad is being used in an in-place operation.",
        None,
        K.USER_CODE,
    ),
    (
        "CUDA in a fork",
        "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must "
        "use the 'spawn' start method",
        None,
        K.USER_CODE,
    ),
    (
        "a device-side assert's own line",
        "../aten/src/ATen/native/cuda/Loss.cu:250: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], "
        "thread: [5,0,0] Assertion `t >= 0 && t < n_classes` failed.",
        None,
        K.USER_CODE,
    ),
    (
        "torch.compile",
        "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:\nLoweringException: AssertionError",
        None,
        K.USER_CODE,
    ),
    # -- launch configuration in other components' words
    (
        "a port errno",
        "[c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - unknown)",
        None,
        K.CONFIG_ERROR,
    ),
    (
        "gloo's interface",
        "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:83] ifa != nullptr. "
        "Unable to find address for: eth0",
        None,
        K.CONFIG_ERROR,
    ),
    ("IPv6 off", "RuntimeError: Address family not supported by protocol", None, K.CONFIG_ERROR),
    ("an image that cannot be pulled", "Warning  Failed  kubelet  Error: ImagePullBackOff", None, K.CONFIG_ERROR),
    (
        "a Slurm request that cannot be met",
        "sbatch: error: Batch job submission failed: Requested node configuration is not available",
        None,
        K.CONFIG_ERROR,
    ),
    (
        "srun asked for too much",
        "srun: error: Unable to create step for job 1234: More processors requested than permitted",
        None,
        K.CONFIG_ERROR,
    ),
    ("bf16 on an old GPU", "ValueError: Your setup doesn't support bf16/gpu.", None, K.CONFIG_ERROR),
    (
        "flash-attention on an old GPU",
        "RuntimeError: FlashAttention only supports Ampere GPUs or newer.",
        None,
        K.CONFIG_ERROR,
    ),
    (
        "a model path that is not one",
        "OSError: ./llama-7b is not a local folder and is not a valid model identifier listed on "
        "'https://huggingface.co/models'",
        None,
        K.CONFIG_ERROR,
    ),
    (
        "a gated model without a token",
        "OSError: You are trying to access a gated repo.\nMake sure to have access to it at "
        "https://huggingface.co/meta-llama/Llama-2-7b-hf.\n401 Client Error.",
        None,
        K.CONFIG_ERROR,
    ),
    ("a bad device id", "AssertionError: Invalid device id", None, K.CONFIG_ERROR),
]

MORE_CASES = [
    # -- the signal in other reporters' words
    ("bash job control", "[1]+  Killed                  nohup python train.py > out.log", None, K.HOST_OOM),
    ("a CI runner", "Error: Process completed with exit code 137.", None, K.HOST_OOM),
    ("Go's exec", "error running trainer: exit status 139", None, K.NATIVE_CRASH),
    (
        "Slurm's exit code record",
        "JobId=77 JobName=train JobState=FAILED Reason=NonZeroExitCode ExitCode=0:11",
        None,
        K.NATIVE_CRASH,
    ),
    (
        "a shell-run subprocess",
        "subprocess.CalledProcessError: Command 'torchrun --nproc_per_node 8 train.py' returned non-zero exit "
        "status 137.",
        None,
        K.HOST_OOM,
    ),
    # -- device memory
    (
        "XLA reservation",
        "RESOURCE_EXHAUSTED: Attempting to reserve 3.10G at the bottom of memory. That was not possible. "
        "There are 2.20G free, 0B reserved, and 2.20G reservable.",
        None,
        K.DEVICE_OOM,
    ),
    (
        "TensorFlow's stream executor",
        "E tensorflow/stream_executor/cuda/cuda_driver.cc:890] failed to allocate 10.76G (11553234944 bytes) "
        "from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
        None,
        K.DEVICE_OOM,
    ),
    (
        "TensorFlow's stream executor on ROCm",
        "E tensorflow/stream_executor/rocm/rocm_driver.cc:615] failed to allocate 15.90G (17072495616 bytes) "
        "from device: hipError_t(1002)",
        None,
        K.DEVICE_OOM,
    ),
    (
        "TensorFlow's allocator",
        "W tensorflow/core/common_runtime/bfc_allocator.cc:457] Allocator (GPU_0_bfc) ran out of memory trying to "
        "allocate 256.00MiB (rounded to 268435456)requested by op MatMul",
        None,
        K.DEVICE_OOM,
    ),
    ("MPS buffer", "RuntimeError: Invalid buffer size: 14.25 GB", None, K.DEVICE_OOM),
    ("Ascend", "RuntimeError: NPU function error: EL0004: Failed to allocate memory.", None, K.DEVICE_OOM),
    ("a GPU out of memory in words", "ERROR: GPU 2 ran out of memory while compiling the graph", None, K.DEVICE_OOM),
    # -- communication
    (
        "NCCL's socket calls",
        "node2:311:340 [0] include/socket.h:423 NCCL WARN Call to send failed : Broken pipe\n"
        "node2:311:340 [0] proxy.cc:1120 NCCL WARN [Proxy Service 0] Failed to execute operation Connect from rank 1",
        None,
        K.COMMUNICATION,
    ),
    (
        "NCCL's proxy thread",
        "transport/net.cc:870 NCCL WARN transport/net.cc:870 -> 6 [Proxy thread error]",
        None,
        K.COMMUNICATION,
    ),
    ("a reset with two spaces", "NCCL WARN Net : Connection reset  by peer", None, K.COMMUNICATION),
    ("libmlx5", "mlx5: gpu-12: got completion with error:", None, K.COMMUNICATION),
    (
        "UCX",
        "[1700000000.123456] [node4:2212 :0]   ib_mlx5_log.c:177  UCX  ERROR Transport retry count exceeded on "
        "mlx5_0:1/IB (synd 0x15 vend 0x81 hw_synd 0/0)",
        None,
        K.COMMUNICATION,
    ),
    (
        "torch's shared-memory file",
        "RuntimeError: unable to write to file </torch_18692_1954506624>: No space left on device (28)",
        None,
        K.CONFIG_ERROR,
    ),
    # -- hardware
    (
        "a driver nvidia-smi cannot reach",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
        "NVIDIA driver is installed and running.",
        None,
        K.HARDWARE,
    ),
    (
        "DCGM",
        "Health check failed: DCGM_FR_VOLATILE_DBE_DETECTED: Detected 2 volatile double-bit ECC error(s) in GPU 5.",
        None,
        K.HARDWARE,
    ),
    # -- native crashes
    ("tcache", "free(): double free detected in tcache 2", None, K.NATIVE_CRASH),
    ("glibc's consolidate", "malloc_consolidate(): invalid chunk size", None, K.NATIVE_CRASH),
    ("SIGTRAP", "Trace/breakpoint trap (core dumped)", None, K.NATIVE_CRASH),
    # -- data
    ("libjpeg", "RuntimeError: Not a JPEG file: starts with 0x89 0x50", None, K.DATA_ERROR),
    (
        "a short download",
        "OSError: Consistency check failed: file should be of size 4976698672 but has size 1254228480 "
        "(model-00001-of-00002.safetensors).",
        None,
        K.DATA_ERROR,
    ),
    (
        "a dataset that cannot be built",
        'Traceback (most recent call last):\n  File "train.py", line 12, in <module>\n'
        '    ds = load_dataset("json", data_files="train.jsonl")\n'
        "datasets.exceptions.DatasetGenerationError: An error occurred while generating the dataset",
        None,
        K.DATA_ERROR,
    ),
    (
        "TensorFlow Example",
        "InvalidArgumentError: Key: image/encoded.  Can't parse serialized Example.",
        None,
        K.DATA_ERROR,
    ),
    # -- NaN losses
    ("perplexity", "| epoch 004 | valid on 'valid' subset | loss nan | ppl nan | num_updates 12000", None, K.NAN_LOSS),
    ("a list of losses", "step 900 losses: [nan, nan, nan]", None, K.NAN_LOSS),
    # -- stops from outside
    (
        "Ray lost a node",
        "WARNING worker.py:1480 -- The node with node id: 5e1f and address: 10.0.3.7 and node name: 10.0.3.7 has "
        "been marked dead because the detector has missed too many heartbeats from it.",
        None,
        K.PREEMPTION,
    ),
    (
        "GKE node shutdown",
        "Warning  NodeShutdown  pod/trainer-0  Pod was rejected as the node is shutting down.",
        None,
        K.PREEMPTION,
    ),
    ("an ssh session that went away", "Connection to 10.0.0.12 closed by remote host.", None, K.PREEMPTION),
    ("submitit's time limit", "Job has timed out. Ran 2880 minutes out of requested 2880 minutes.", None, K.PREEMPTION),
    (
        "a Kubernetes Job's deadline",
        "  Warning  DeadlineExceeded  job/pretrain  Job was active longer than specified deadline",
        None,
        K.PREEMPTION,
    ),
    # -- configuration
    (
        "DeepSpeed's own check",
        'Traceback (most recent call last):\n  File "train.py", line 40, in <module>\n'
        "    engine, *_ = deepspeed.initialize(model=model, config=cfg)\n"
        '  File "/opt/conda/lib/python3.10/site-packages/deepspeed/runtime/config.py", line 1020, in '
        "_do_error_check\n    assert self.train_micro_batch_size_per_gpu, err_msg\n"
        "AssertionError: DeepSpeedConfig: train_micro_batch_size_per_gpu is not defined",
        None,
        K.CONFIG_ERROR,
    ),
    ("MPI backend missing", "RuntimeError: Distributed package doesn't have MPI built in", None, K.CONFIG_ERROR),
    (
        "accelerate on consumer GPUs",
        "NotImplementedError: Using RTX 4000 series doesn't support faster communication broadband via P2P or IB. "
        'Please set `NCCL_P2P_DISABLE="1"` and `NCCL_IB_DISABLE="1" or use `accelerate launch` which will do this '
        "automatically.",
        None,
        K.CONFIG_ERROR,
    ),
    # -- a name that does not resolve yet is the network's, not the script's
    (
        "a master service not yet in DNS",
        'Traceback (most recent call last):\n  File "train.py", line 30, in <module>\n'
        '    dist.init_process_group("nccl")\n'
        '  File "/usr/lib/python3/site-packages/torch/distributed/rendezvous.py", line 180, in '
        "_env_rendezvous_handler\n"
        "    store = TCPStore(master_addr, master_port, world_size, start_daemon, timeout)\n"
        "ValueError: host not found: Name or service not known",
        None,
        K.COMMUNICATION,
    ),
    ("a DNS hiccup", "socket.gaierror: [Errno -3] Temporary failure in name resolution", None, K.COMMUNICATION),
    # -- NaN in a trainer's table, the loss named in its header
    (
        "a table of losses",
        "      Epoch    GPU_mem   box_loss   obj_loss   cls_loss  Instances       Size\n"
        "      12/100      9.1G        nan        nan        nan         31        640: 100%|##########| 50/50",
        None,
        K.NAN_LOSS,
    ),
    # -- other reporters of a process's end
    (
        "joblib's workers",
        "joblib.externals.loky.process_executor.TerminatedWorkerError: A worker process managed by the executor was "
        "unexpectedly terminated. This could be caused by a segmentation fault while calling the function or by an "
        "excessive memory usage causing the Operating System to kill the worker.\n\n"
        "The exit codes of the workers are {SIGKILL(-9)}",
        None,
        K.HOST_OOM,
    ),
    ("a negative status in words", "Worker 3 exited with exit code -11", None, K.NATIVE_CRASH),
    (
        "a workload manager's stop",
        "<info> Trial 88 (Experiment 12) was requested to terminate\n<info> container exited successfully with a zero "
        "exit code",
        None,
        K.PREEMPTION,
    ),
    (
        "the watchdog's warning wrapped by a terminal",
        "[E ProcessGroupNCCL.cpp:455] Some NCCL operations have failed or timed out. Due to the asynchronous nature "
        "of CUDA kernels, subsequent GPU opera\ntions might run on corrupted/incomplete data.",
        None,
        K.COMMUNICATION,
    ),
    # -- root cause over consequence
    (
        "Ray's OOM before the lost node",
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
        "The node with node id: 5e1f has been marked dead because the detector has missed too many heartbeats.",
        None,
        K.HOST_OOM,
    ),
    (
        "a crashed rank's peers",
        "[rank0]: Fatal Python error: Segmentation fault\n"
        "node2:311:340 [1] include/socket.h:423 NCCL WARN Call to recv failed : Connection reset by peer",
        None,
        K.NATIVE_CRASH,
    ),
]

_TB = 'Traceback (most recent call last):\n  File "{file}", line 41, in <module>\n    main()\n{exc}'

# The fourth round's rules (see the corpus README's "Fourth round"), in wordings of their own.
FOURTH_ROUND_CASES = [
    (
        "Megatron's parallel layout",
        _TB.format(
            file="pretrain_gpt.py",
            exc="AssertionError: world size (12) is not divisible by tensor model parallel size (8) times "
            "pipeline model parallel size (1)",
        ),
        None,
        K.CONFIG_ERROR,
    ),
    (
        "attention heads",
        _TB.format(
            file="model.py",
            exc="ValueError: embed_dim must be divisible by num_heads (got `embed_dim`: 1000 and `num_heads`: 16).",
        ),
        None,
        K.CONFIG_ERROR,
    ),
    (
        "an empty dataset",
        _TB.format(
            file="/opt/conda/lib/python3.10/site-packages/torch/utils/data/sampler.py",
            exc="ValueError: num_samples should be a positive integer value, but got num_samples=0",
        ),
        None,
        K.CONFIG_ERROR,
    ),
    (
        "MPICH's report of a SIGKILL",
        "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n=   PID 4242 RUNNING AT gpu-node-3\n"
        "=   EXIT CODE: 9\n=   CLEANING UP REMAINING PROCESSES",
        None,
        K.HOST_OOM,
    ),
    (
        "bash's report behind a timestamp",
        "2024-05-02 10:00:00 /bin/bash: line 12: 4242 Killed                  python train.py",
        None,
        K.HOST_OOM,
    ),
    (
        "NCCL's socket call in its Net words",
        "node7:88:91 [0] misc/socket.cc:538 NCCL WARN Net : Call to recv from 10.0.0.12<51234> failed : "
        "Connection timed out",
        None,
        K.COMMUNICATION,
    ),
    (
        "NCCL's socket transport gave up",
        "node7:88:91 [0] transport/net_socket.cc:221 NCCL WARN NET/Socket : socket progress error",
        None,
        K.COMMUNICATION,
    ),
    (
        "JAX's coordination service",
        "E0412 23:39:41.656900 2231 client.cc:96] Coordination service agent in error status: UNAVAILABLE: "
        "failed to connect to all addresses",
        None,
        K.COMMUNICATION,
    ),
    (
        "an older TPU runtime's allocator",
        "(1) Resource exhausted: Attempting to allocate 2.00G. That was not possible. There are 1.20G free.; "
        "(0x0x0_HBM0)",
        None,
        K.DEVICE_OOM,
    ),
    ("an import behind a glued prefix", "[stderr]ModuleNotFoundError: No module named 'apex'", None, K.USER_CODE),
]

# The fifth round's rules, in wordings written for this test.
FIFTH_ROUND_CASES = [
    (
        "torch's desync report names a rank that never joined",
        _NCCL_TIMEOUT + "\n"
        "[rank1]:[E ProcessGroupNCCL.cpp:1940] Rank 1\n"
        "         - [0] Timeout at collective: ALLREDUCE, #9\n"
        "         - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:\n"
        "             [3] finished collective #6, but didn't join collective #7 (count from 1)",
        None,
        K.HANG,
    ),
    (
        "monitored_barrier names the ranks that never came",
        "RuntimeError: [Rank 0]: Ranks 2, 5 failed to pass monitoredBarrier in 600000 ms",
        None,
        K.HANG,
    ),
    (
        "gloo's store wait escapes a thread and aborts",
        "terminate called after throwing an instance of 'gloo::IoException'\n"
        "  what():  [gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.7]:41234\n"
        "Aborted (core dumped)",
        None,
        K.COMMUNICATION,
    ),
    (
        "a script that does not take the launcher's --local-rank",
        "usage: train.py [-h] [--local_rank LOCAL_RANK] [--epochs EPOCHS]\n"
        "train.py: error: unrecognized arguments: --local-rank=3",
        2,
        K.USER_CODE,
    ),
    (
        "torch's serializer could not write",
        '  File "/usr/lib/python3/site-packages/torch/serialization.py", line 441, in _save\n'
        "RuntimeError: write(): fd 12 failed with Remote I/O error",
        None,
        K.DISK_FULL,
    ),
    (
        "HTCondor lost the job with its execute node",
        "024 (1234.000.000) 05/02 10:00:00 Job reconnection failed\n"
        "    Job not found at execution machine\n"
        "    Can not reconnect to slot1@worker-12, rescheduling job",
        None,
        K.PREEMPTION,
    ),
    ("Rust's allocator gave up", "memory allocation of 34359738368 bytes failed\nAborted", None, K.HOST_OOM),
    ("macOS's shell reports a SIGKILL", "Killed: 9", None, K.HOST_OOM),
    ("macOS's shell reports an abort", "Abort trap: 6", None, K.NATIVE_CRASH),
    (
        "Open MPI's signal handler",
        "[gpu-3:04242] *** Process received signal ***\n[gpu-3:04242] Signal: Aborted (6)",
        None,
        K.NATIVE_CRASH,
    ),
    ("NVML's error code for a lost GPU", "pynvml.NVMLError: NVML_ERROR_GPU_IS_LOST", None, K.HARDWARE),
    (
        "the driver in a state a process cannot clear",
        "UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount(). Error 999: unknown error",
        None,
        K.HARDWARE,
    ),
    (
        "the device plugin's Xid",
        "XidCriticalError: Xid=79 on Device=GPU-1a2b, the device will go unhealthy.",
        None,
        K.HARDWARE,
    ),
    ("a full disk in other words", "ERROR: insufficient disk space to write /ckpt/step_900", None, K.DISK_FULL),
    (
        "apex's scaler index before the collapsed scale",
        "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 3.0517578125e-05",
        None,
        K.NAN_LOSS,
    ),
    ("spot capacity being taken back", "The spot instance is being reclaimed by the provider", None, K.PREEMPTION),
]

NEGATIVES = [
    # (name, log, a kind it must not be diagnosed as)
    (
        "a batch that divides, logged",
        "INFO: global batch size 1024 is divisible by micro batch size 4 times data parallel size 8",
        K.CONFIG_ERROR,
    ),
    (
        "MPICH's report of a failed exit",
        "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n=   EXIT CODE: 1",
        K.HOST_OOM,
    ),
    ("a host allocator's words", "Resource exhausted: Attempting to allocate 2.00G on the host", K.DEVICE_OOM),
    (
        "a warning quoting a failed optional import, then a collective timeout",
        "UserWarning: apex unavailable (ModuleNotFoundError: No module named 'apex'), using torch\n" + _NCCL_TIMEOUT,
        K.USER_CODE,
    ),
    ("prose quoting bash's report", "INFO the script said: run.sh: line 12: 4242 Killed python t.py", K.HOST_OOM),
    (
        "a kernel's own size check",
        _TB.format(file="attn.py", exc="RuntimeError: seqlen must be divisible by 128 for this kernel"),
        K.CONFIG_ERROR,
    ),
    (
        "a loss scale that keeps its value",
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 65536",
        K.NAN_LOSS,
    ),
    ("no NaN found", "Checked gradients: no NaN detected in loss", K.NAN_LOSS),
    ("NaN checks switched on", "detect_anomaly: True, terminate_on_nan: True", K.NAN_LOSS),
    ("an EventType that is no stop", '{"EventType": "Freeze", "EventStatus": "Scheduled"}', K.PREEMPTION),
    ("an instance action that is no stop", '{"action": "none"}', K.PREEMPTION),
    (
        "a corrected PCIe error",
        "pcieport 0000:00:03.1: AER: PCIe Bus Error: severity=Corrected, type=Physical Layer",
        K.HARDWARE,
    ),
    ("a corrected ECC count", "Volatile Uncorr. ECC: 0", K.HARDWARE),
    ("memory configuration", "--mem=64G --time=24:00:00 --requeue", K.HOST_OOM),
    ("a pod memory request", "Requests:\n  memory: 64Gi\n  nvidia.com/gpu: 8", K.HOST_OOM),
    ("free memory reported", "total memory 80.0 GiB, free 79.2 GiB", K.DEVICE_OOM),
    ("a cache warning", "WARNING: quota of the dataset cache is 80% used", K.DISK_FULL),
    (
        "a timed-out HTTP retry",
        "ReadTimeout: HTTPSConnectionPool(host='huggingface.co'): Read timed out. Retrying",
        K.COMMUNICATION,
    ),
    ("a Lightning SIGTERM hint", "SLURMEnvironment: requeue on SIGTERM is enabled", K.PREEMPTION),
    (
        "a tokenizer's truncation hint",
        "Truncation was not explicitly activated but `max_length` is provided a specific value, please use "
        "`truncation=True` to explicitly truncate examples to max length.",
        K.DATA_ERROR,
    ),
    ("a shell script cut short", "train.sh: line 40: syntax error: unexpected end of file", K.DATA_ERROR),
    (
        "the default tolerations of every pod",
        "Tolerations: node.kubernetes.io/not-ready:NoExecute op=Exists for 300s\n"
        "             node.kubernetes.io/unreachable:NoExecute op=Exists for 300s",
        K.PREEMPTION,
    ),
    ("an idle DataLoader setting", "DataLoader(dataset, num_workers=8, timeout=600)", K.HANG),
    (
        "gRPC's message limit",
        "grpc: RESOURCE_EXHAUSTED: Received message larger than max (4194305 vs. 4194304)",
        K.DEVICE_OOM,
    ),
    (
        "TensorFlow going on with less memory",
        "W bfc_allocator.cc:275] Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.20GiB with "
        "freed_by_count=0. The caller indicates that this is not a failure, but may mean that there could be "
        "performance gains if more memory were available.",
        K.DEVICE_OOM,
    ),
    (
        "per-class metrics without a loss",
        "  Class     Images  Instances      P          R\n  bicycle         0          0        nan        nan",
        K.NAN_LOSS,
    ),
    (
        "a user's ValueError in the script",
        'Traceback (most recent call last):\n  File "train.py", line 5, in <module>\n    lr = float(args.lr)\n'
        "ValueError: could not convert string to float: 'fast'",
        K.COMMUNICATION,
    ),
    ("a clean exit status", "Process completed with exit code 0.", K.HOST_OOM),
    ("an interrupted run", "Process finished with exit code 130", K.HOST_OOM),
    ("NCCL's info about IB", "NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.3<0>", K.COMMUNICATION),
    (
        "a wrong argument that is not the rank's",
        "train.py: error: unrecognized arguments: --lr-warmup 100",
        K.USER_CODE,
    ),
    ("a disk-space warning", "WARNING: you may run out of disk space soon (92% used)", K.DISK_FULL),
    (
        "apex's healthy scaler",
        "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0",
        K.NAN_LOSS,
    ),
    ("a count named killed", "killed: 3", K.HOST_OOM),
    ("a memory-allocation log line", "memory allocation of 4096 bytes succeeded", K.HOST_OOM),
    ("a healthy desync-debug setting", "TORCH_NCCL_DESYNC_DEBUG=1 TORCH_DISTRIBUTED_DEBUG=DETAIL", K.HANG),
]


# -- whole failures as a multi-rank job prints them: the root cause, then its consequences (the
# peers' collective timeouts, torchrun's teardown and its summary)
_W = (
    "[rank{r}]:[E ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
    "ran for 600124 milliseconds before timing out."
)
_SUMMARY = (
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
    "============================================================\ntrain.py FAILED\n"
    "------------------------------------------------------------\nFailures:\n  "
    "<NO_OTHER_FAILURES>\n------------------------------------------------------------\nRoot "
    "Cause (first observed failure):\n[0]:\n  time      : 2024-05-02_10:00:00\n  host      : "
    "node1\n  rank      : 0 (local_rank: 0)\n  exitcode  : {code} (pid: 4242)\n  error_file: "
    "<N/A>\n  traceback : {tb}\n============================================================"
)
ROOT_CAUSE_CASES = [
    (
        "user KeyError + peers' timeouts",
        (
            'Traceback (most recent call last):\n  File "train.py", line 80, in <module>\n    batch = '
            'next(it)\n  File "/w/data.py", line 12, in __getitem__\n    return self.items[idx]["label"]\n'
            "KeyError: 'label'\n"
        )
        + _W.format(r=1)
        + "\n"
        + _SUMMARY.format(code=1, tb="To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"),
        K.USER_CODE,
    ),
    (
        "cuda oom + torchrun teardown",
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.\nW0502 "
            "torch/distributed/elastic/multiprocessing/api.py:858] Sending process 4243 closing signal "
            "SIGTERM\n"
        )
        + _SUMMARY.format(code=1, tb="To enable traceback"),
        K.DEVICE_OOM,
    ),
    (
        "disk full while saving + watchdog abort",
        ("RuntimeError: [enforce fail at inline_container.cc:595] . unexpected pos 1048576 vs 1048512\n")
        + _W.format(r=2)
        + ("\n[E ProcessGroupNCCL.cpp:460] To avoid data inconsistency, we are taking the entire process down.\n")
        + _SUMMARY.format(code=-6, tb="Signal 6 (SIGABRT) received by PID 4242"),
        K.DISK_FULL,
    ),
    (
        "preempted slurm step",
        (
            "slurmstepd: error: *** STEP 123.0 ON n1 CANCELLED AT 2024-05-02T10:00:00 DUE TO "
            "PREEMPTION ***\ntorch.distributed.elastic.multiprocessing.api.SignalException: Process 17 "
            "got signal: 15\n"
        )
        + _SUMMARY.format(code=-15, tb="Signal 15 (SIGTERM) received by PID 4242"),
        K.PREEMPTION,
    ),
    (
        "truncated image in a worker",
        (
            "OSError: Caught OSError in DataLoader worker process 3.\nOriginal Traceback (most recent "
            'call last):\n  File "/usr/lib/python3/site-packages/PIL/ImageFile.py", line 249, in load\n  '
            "  raise OSError(\nOSError: image file is truncated (9 bytes not processed)"
        ),
        K.DATA_ERROR,
    ),
    (
        "ECC + peers",
        "RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
        + _W.format(r=3)
        + (
            "\nterminate called after throwing an instance of 'c10::Error'\n  what():  CUDA error: "
            "uncorrectable ECC error encountered"
        ),
        K.HARDWARE,
    ),
    ("SIGKILL root cause", _SUMMARY.format(code=-9, tb="Signal 9 (SIGKILL) received by PID 4242"), K.HOST_OOM),
    (
        "user error in a worker",
        (
            "KeyError: Caught KeyError in DataLoader worker process 0.\nOriginal Traceback (most recent "
            'call last):\n  File "/usr/lib/python3/site-packages/torch/utils/data/_utils/worker.py", '
            'line 308, in _worker_loop\n    data = fetcher.fetch(index)\n  File "/w/ds.py", line 40, in '
            "__getitem__\n    x = row['pixel_values']\nKeyError: 'pixel_values'"
        ),
        K.USER_CODE,
    ),
    (
        "segfault after NCCL INFO",
        (
            "node1:1:1 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\nnode1:1:1 [0] NCCL INFO NET/IB "
            ": No device found.\nSegmentation fault (core dumped)"
        ),
        K.NATIVE_CRASH,
    ),
    (
        "nan then min scale",
        (
            "{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.3}\nException: Current "
            "loss scale already at minimum - cannot decrease scale anymore. Exiting run.\n"
        )
        + _SUMMARY.format(code=1, tb="x"),
        K.NAN_LOSS,
    ),
    (
        "illegal memory access reported by the watchdog",
        (
            "[rank0]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 0] Process group watchdog thread "
            "terminated with exception: CUDA error: an illegal memory access was encountered\nterminate "
            "called after throwing an instance of 'c10::DistBackendError'"
        ),
        K.NATIVE_CRASH,
    ),
    (
        "host oom by dmesg + peers",
        "[12345.6] Out of memory: Killed process 4242 (python) total-vm:1kB, anon-rss:1kB\n"
        + _W.format(r=1)
        + "\n"
        + _SUMMARY.format(code=-9, tb="Signal 9 (SIGKILL) received by PID 4242"),
        K.HOST_OOM,
    ),
    (
        "spot + peers",
        "2024-05-02 10:00:00 Spot instance interruption notice received, draining\n" + _W.format(r=1),
        K.PREEMPTION,
    ),
    (
        "NCCL unhandled system error everywhere",
        (
            "torch.distributed.DistBackendError: NCCL error in: "
            "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run "
            "with NCCL_DEBUG=INFO for details), NCCL version 2.20.5\nncclSystemError: System call (e.g. "
            "socket, malloc) or external library call failed or device error.\nLast error:\n"
            "socketStartConnect: Connect to 10.0.0.2<43281> failed : Software caused connection abort"
        ),
        K.COMMUNICATION,
    ),
    (
        "config: wrong nproc",
        (
            "RuntimeError: CUDA error: invalid device ordinal\nCUDA kernel errors might be "
            "asynchronously reported at some other API call, so the stacktrace below might be "
            "incorrect.\n"
        )
        + _W.format(r=0),
        K.CONFIG_ERROR,
    ),
]


@pytest.mark.parametrize(("name", "log", "expected"), ROOT_CAUSE_CASES, ids=[c[0] for c in ROOT_CAUSE_CASES])
def test_root_cause_over_its_consequences(registry: RuleRegistry, name: str, log: str, expected: FailureKind) -> None:
    diagnosis = classify(Evidence.from_text(log), registry)
    assert diagnosis.kind is expected, (name, diagnosis.reason)


@pytest.fixture(scope="module")
def registry() -> RuleRegistry:
    return RuleRegistry.with_builtin_rules()


@pytest.mark.parametrize(
    ("name", "log", "exit_status", "expected"),
    CASES + MORE_CASES + FOURTH_ROUND_CASES + FIFTH_ROUND_CASES,
    ids=[c[0] for c in CASES + MORE_CASES + FOURTH_ROUND_CASES + FIFTH_ROUND_CASES],
)
def test_family_in_another_wording(
    registry: RuleRegistry, name: str, log: str, exit_status: int | None, expected: FailureKind
) -> None:
    diagnosis = classify(Evidence.from_text(log, returncode=exit_status), registry)
    assert diagnosis.kind is expected, (name, diagnosis.reason)


@pytest.mark.parametrize(("name", "log", "forbidden"), NEGATIVES, ids=[c[0] for c in NEGATIVES])
def test_words_of_a_family_that_report_nothing(
    registry: RuleRegistry, name: str, log: str, forbidden: FailureKind
) -> None:
    diagnosis = classify(Evidence.from_text(log), registry)
    assert diagnosis.kind is not forbidden, (name, diagnosis.reason)
