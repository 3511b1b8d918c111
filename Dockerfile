# The one image DLRover's Kubernetes operator, the job master (dlrover-master) and the workers
# (dlrover-run and the training script) all run from. Build the wheels first, then the image:
#
#   python3 dev.py nox -s wheels    # every package's wheel, one version (VERSION), into dist/
#   docker build -t dlrover:0.1.0 .                                                     # CPU torch
#   docker build --build-arg TORCH_INDEX_URL=https://pypi.org/simple -t dlrover:0.1.0-cuda .   # CUDA torch
#
# The install steps are the README's "Install" section, line for line (tests/test_packaging.py
# compares them). This image has not been built on the project's machines: they have no Docker
# engine. What the test proves there is that the pip lines match the README's, that every COPY
# source exists, and, in a fresh venv, that the built wheels install.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

# Where torch==2.13.0 comes from: PyTorch's CPU index (the CPU build: a 190 MB wheel), or
# https://pypi.org/simple for the CUDA build with its NVIDIA runtime libraries (several GB).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/dlrover
COPY constraints.txt ./
COPY dist/*.whl dist/
# torch first, alone and pinned; constraints.txt pins it too, so the next line keeps it.
RUN pip install torch==2.13.0 --index-url ${TORCH_INDEX_URL}
RUN pip install -c constraints.txt dist/*.whl "dlrover-master[k8s]"
# The GPT example (examples/gpt/train.py) that the example ElasticJob trains.
COPY examples/ examples/

# Not root: uid and gid 1000 (`dlrover`), the user the deploy/kubernetes manifests name. Its home is
# the working directory, so what runs in /opt/dlrover writes there (dlrover-run's ./dlrover-logs,
# ~/.cache for the master's profile store); the installed files stay root's. Mounted volumes need
# the pod's `securityContext.fsGroup: 1000` to be writable; a volume's root is never private, so
# the master's --state-dir is a folder it creates inside its volume.
RUN groupadd --gid 1000 dlrover \
    && useradd --uid 1000 --gid 1000 --no-create-home --home-dir /opt/dlrover dlrover \
    && mkdir -p /var/lib/dlrover /checkpoints \
    && chown dlrover:dlrover /opt/dlrover /var/lib/dlrover /checkpoints
ENV HOME=/opt/dlrover
USER 1000
