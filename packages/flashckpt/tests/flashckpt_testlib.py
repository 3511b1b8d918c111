"""Comparing states bit for bit and generating random ones."""

from __future__ import annotations

import ctypes
import math
import mmap
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


def resident_pages(path: Path) -> int:
    """Pages of `path` in the page cache, i.e. backed by memory for a tmpfs file (mincore over
    a mapping that faults nothing in)."""
    size = path.stat().st_size
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as mm:
        start = np.frombuffer(mm, dtype=np.uint8)
        try:
            if libc.mincore(ctypes.c_void_p(start.ctypes.data), size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
        finally:
            del start  # the mapping closes only once nothing exports it
    return sum(b & 1 for b in vec)


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


def _nested(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.dictionaries(keys, children, max_size=4),
            st.lists(children, max_size=4),
            st.lists(children, max_size=3).map(tuple),
        ),
        max_leaves=12,
    )


def states() -> st.SearchStrategy[Any]:
    """Random nested states whose tensors are all distinct."""
    return _nested(st.one_of(tensors(), scalars))


@st.composite
def tied_states(draw: st.DrawFn) -> Any:
    """Random nested states in which a tensor may sit at several places (tied weights)."""
    pool = draw(st.lists(tensors(), min_size=1, max_size=3))
    return draw(_nested(st.one_of(st.sampled_from(pool), tensors(), scalars)))


def tensor_places(s: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], torch.Tensor]]:
    """Every tensor of a state with its path, in depth-first order."""
    if isinstance(s, torch.Tensor):
        return [(path, s)]
    if isinstance(s, dict):
        return [p for k, v in s.items() for p in tensor_places(v, (*path, k))]
    if isinstance(s, list | tuple):
        return [p for i, v in enumerate(s) for p in tensor_places(v, (*path, i))]
    return []


def ties(s: Any) -> list[list[tuple[Any, ...]]]:
    """The paths of every non-empty tensor object that sits at more than one place of a state."""
    by_object: dict[int, list[tuple[Any, ...]]] = {}
    for path, t in tensor_places(s):
        if t.numel():
            by_object.setdefault(id(t), []).append(path)
    return [paths for paths in by_object.values() if len(paths) > 1]


def at(s: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        s = s[key]
    return s


def zeros_like_state(s: Any, memo: dict[int, torch.Tensor] | None = None) -> Any:
    """A state of the same structure with every tensor zeroed and every scalar None (a restore target).

    With `memo` (a dict, empty at first) a tensor that sits at several places of `s` becomes one
    zeroed tensor at those places, so the target keeps the state's ties; without, every place gets
    its own.
    """
    if isinstance(s, torch.Tensor):
        if memo is None:
            return torch.zeros_like(s)
        return memo.setdefault(id(s), torch.zeros_like(s))
    if isinstance(s, dict):
        return {k: zeros_like_state(v, memo) for k, v in s.items()}
    if isinstance(s, list):
        return [zeros_like_state(v, memo) for v in s]
    if isinstance(s, tuple):
        return tuple(zeros_like_state(v, memo) for v in s)
    return None


def assert_restores(state: Any, load: Any) -> None:
    """Check a saved state's round trip through `load(target)` (None: a fresh load), ties included.

    A fresh load gives one tensor at the places where the state had one; a load in place fills a
    target whose places are apart, and one that keeps the state's ties, bit for bit, writing only
    into the target's own tensors.
    """
    fresh = load(None)
    assert same_bits(state, fresh)
    for paths in ties(state):
        assert all(at(fresh, p) is at(fresh, paths[0]) for p in paths), paths
    for memo in (None, {}):
        target = zeros_like_state(state, memo)
        before = [(path, t, t.data_ptr()) for path, t in tensor_places(target)]
        restored = load(target)
        assert same_bits(state, restored)
        assert all(at(restored, path) is t and t.data_ptr() == ptr for path, t, ptr in before)


def replica_state(seed: int, step: int) -> dict[str, Any]:
    """A DDP-like state (model, optimizer, RNG, NumPy and plain values, a tied weight), by seed."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(48, 16, generator=g)
    return {
        "model": {"weight": weight, "bias": torch.randn(16, generator=g).to(torch.bfloat16), "head": weight},
        "optim": {
            "state": {0: {"momentum": torch.randn(48, 16, generator=g), "step": torch.tensor(float(step))}},
            "param_groups": [{"lr": 0.1, "params": [0], "betas": (0.9, 0.99)}],
        },
        "rng": torch.randint(0, 255, (816,), dtype=torch.uint8, generator=g),
        "mask": torch.rand(7, generator=g) > 0.5,
        "empty": torch.empty(0, 3, dtype=torch.float16),
        "counts": np.arange(seed, seed + 5, dtype=np.int64),
        "step": step,
        "note": f"seed {seed}",
    }
