#!/bin/bash
# The GPU checks, as one prepared run on a machine with a CUDA GPU, torch and NCCL installed but not
# this project (a lent device machine): the CUDA and NCCL tests that are skipped elsewhere, the flash
# checkpoint's CUDA benchmark, and the price of fault tolerance and a growth's time on that host's CPUs.
# Results are printed and, where $OUT is set, written under it.
#
# What it needs beside torch, as wheels in .whl/ (for the machine's Python, e.g. 3.12), downloaded where
# pip reaches PyPI:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl isal==1.8.0 grpcio==1.85.1 protobuf==6.33.6
# (the protobuf and grpcio the generated code was made with; attrs, psutil, numpy, pytest, pytest-timeout
# and hypothesis are expected there already).
#
#   bash tools/device_check.sh            # tests, then benchmarks
#   bash tools/device_check.sh tests      # tests only
set -u
cd "$(dirname "$0")/.."
out=${OUT:-}
keep() { if [ -n "$out" ]; then tee "$out/$1"; else cat; fi; }  # a copy under $OUT, where set
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/dlrover-site .whl/*.whl || exit 3
PYTHONPATH=/tmp/dlrover-site:$(ls -d "$PWD"/packages/*/src | tr '\n' ':')
export PYTHONPATH PYTHONUNBUFFERED=1 CI=true
nproc
nvidia-smi -L
python3 -c "import torch, grpc, google.protobuf as p; print('torch', torch.__version__, 'grpc', grpc.__version__, 'protobuf', p.__version__, 'cuda', torch.cuda.is_available(), 'nccl', torch.cuda.nccl.version())"
echo "=== tests"
timeout 300 python3 -m pytest -q -p no:cacheprovider --timeout=240 \
  packages/shard/tests/test_group_sampler.py::test_a_lone_trainer_killed_and_resumed_trains_every_sample_once \
  packages/diagnosis/tests/test_ddp_sync.py packages/diagnosis/tests/test_device_leads.py \
  packages/flashckpt/tests/test_cuda_state.py packages/flashckpt/tests/test_pinning.py 2>&1 | keep tests.log | tail -40
[ "${1:-}" = tests ] && exit 0
echo "=== flash checkpoint of CUDA tensors"
timeout 120 python3 benchmarks/flashckpt_cuda.py --sizes 1024 --reps 3 2>&1 | keep flash.log | tail -25
echo "=== the price of fault tolerance on this host's CPUs"
timeout 240 python3 benchmarks/fault_tolerance_price.py --runs 2 --only torchrun,dlrover-run --verbose 2>&1 | keep price.log | tail -30
echo "=== a growth on this host"
timeout 300 python3 benchmarks/resize_growth.py --runs 2 2>&1 | keep growth.log | tail -16
