"""Comparing states bit for bit and generating random ones."""

from __future__ import annotations

import math
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

from dlrover.flashckpt.segment import SEGMENT_PREFIX
from dlrover.flashckpt.storage import FsspecStorage

SHM = "/dev/shm"


def s3_bucket(endpoint: str) -> str:
    """A new, uniquely named bucket on the S3 server at `endpoint` (moto's; test credentials)."""
    import boto3

    bucket = "b" + uuid.uuid4().hex[:12]
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket=bucket)
    return bucket


def s3_storage(endpoint: str, bucket: str, prefix: str = "ckpt") -> FsspecStorage:
    """`FsspecStorage` on ``<bucket>/<prefix>`` of the S3 server at `endpoint`, through s3fs."""
    import s3fs

    fs: Any = s3fs.S3FileSystem(
        key="testing",
        secret="testing",
        endpoint_url=endpoint,
        client_kwargs={"region_name": "us-east-1"},
        use_listings_cache=False,
        skip_instance_cache=True,  # a forked rank must not reuse its parent's client
    )
    return FsspecStorage(fs, f"{bucket}/{prefix}")


def our_files(job: str) -> list[Path]:
    """Every shared-memory file of a job."""
    return sorted(Path(SHM).glob(f"{SEGMENT_PREFIX}{job}.*"))


DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.int64, torch.uint8, torch.bool]


def same_bits(a: Any, b: Any) -> bool:
    """True when two states are identical: types, structure, dtypes, shapes and every byte."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bytes(a.contiguous().reshape(-1).view(torch.uint8).numpy())
            == bytes(b.contiguous().reshape(-1).view(torch.uint8).numpy())
        )
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a.keys()) == list(b.keys()) and all(same_bits(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return isinstance(b, float) and (
            (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
        )
    return type(a) is type(b) and a == b


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=3))
    n = math.prod(shape)
    raw = draw(st.binary(min_size=n * 8, max_size=n * 8))
    base = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    t = base[: n * itemsize].view(dtype).reshape(shape).clone()
    if dtype is torch.bool:
        t = base[:n].reshape(shape).bool()
    if draw(st.booleans()) and t.dim() >= 2:
        t = t.transpose(0, 1)  # non-contiguous leaves are staged too
    return t


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=8),
)
keys = st.one_of(st.text(max_size=6), st.integers(-5, 50))


def states() -> st.SearchStrategy[Any]:
    leaves = st.one_of(tensors(), scalars)
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.dictionaries(keys, children, max_size=4),
            st.lists(children, max_size=4),
            st.lists(children, max_size=3).map(tuple),
        ),
        max_leaves=12,
    )


def zeros_like_state(s: Any) -> Any:
    """A state of the same structure with every tensor zeroed and every scalar None (a restore target)."""
    if isinstance(s, torch.Tensor):
        return torch.zeros_like(s)
    if isinstance(s, dict):
        return {k: zeros_like_state(v) for k, v in s.items()}
    if isinstance(s, list):
        return [zeros_like_state(v) for v in s]
    if isinstance(s, tuple):
        return tuple(zeros_like_state(v) for v in s)
    return None
