"""Dtype names as the safetensors format spells them, so manifests and files agree."""

from __future__ import annotations

import torch

from dlrover.flashckpt.errors import StateStructureError

__all__ = ["dtype_from_name", "dtype_name"]

_BY_DTYPE: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.uint16: "U16",
    torch.uint32: "U32",
    torch.uint64: "U64",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.complex64: "C64",
}
_BY_NAME = {name: dtype for dtype, name in _BY_DTYPE.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """The safetensors name of `dtype`.

    Raises:
        StateStructureError: the dtype has no safetensors name.
    """
    try:
        return _BY_DTYPE[dtype]
    except KeyError:
        raise StateStructureError(f"tensors of dtype {dtype} cannot be checkpointed") from None


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype of a safetensors dtype name.

    Raises:
        StateStructureError: the name is unknown.
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise StateStructureError(f"unknown dtype name {name!r}") from None
