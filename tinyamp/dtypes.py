"""Which dtypes a tensor may hold, where their sums accumulate, and how Python scalars meet tensors.

Floating dtypes carry gradients; integer and bool tensors carry labels, indices
and masks.  bfloat16 comes from the optional ``ml_dtypes`` package and lives on the
CPU only: tinyamp's GPU code (its casts, its cuBLAS products) is written for float16.

The one rule of mixed precision that belongs to the dtypes themselves: a sum of 16-bit
values accumulates in float32 (``accumulation_dtype``).  In float16, 2048 + 1 rounds
back to 2048 (the gap between float16 values at 2048 is 2), so a float16 running sum of
ones stalls there; float32 counts on to 2^24.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
bool_ = np.dtype(np.bool_)

_NUMPY_SUPPORTED = frozenset(
    np.dtype(t)
    for t in (
        np.float16, np.float32, np.float64,
        np.int8, np.int16, np.int32, np.int64,
        np.uint8, np.uint16, np.uint32, np.uint64,
        np.bool_,
    )
)  # fmt: skip

SUPPORTED_NAMES = "float16, bfloat16 (cpu, needs ml_dtypes), float32, float64, int8..int64, uint8..uint64, bool"


def _bfloat16() -> np.dtype:
    try:
        import ml_dtypes
    except ImportError as exc:
        raise TypeError("dtype bfloat16 needs the optional package ml_dtypes: pip install ml_dtypes") from exc
    return np.dtype(ml_dtypes.bfloat16)


def resolve(dtype: Any) -> np.dtype | None:
    """Turn "float16", np.float16, a NumPy dtype (or None) into a NumPy dtype (or None)."""
    if dtype is None:
        return None
    if isinstance(dtype, str) and dtype.lower() in ("bfloat16", "bf16"):
        return _bfloat16()
    aliases = {"half": "float16", "fp16": "float16", "float": "float32", "fp32": "float32",
               "double": "float64", "fp64": "float64", "long": "int64"}  # fmt: skip
    if isinstance(dtype, str):
        dtype = aliases.get(dtype.lower(), dtype)
    try:
        return np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"unknown dtype {dtype!r}; tinyamp supports {SUPPORTED_NAMES}") from exc


def finfo(dtype: np.dtype) -> Any:
    """np.finfo, extended to bfloat16 through ml_dtypes."""
    if dtype.name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.finfo(dtype)
    return np.finfo(dtype)


@functools.cache
def overflow_threshold(dtype: np.dtype) -> float:
    """The smallest magnitude that rounds to inf in `dtype`: max + half an ulp of max.

    Round-to-nearest sends anything at or above it to inf; for float16 it is
    65504 + 16 = 65520 (the ulp at 65504 is 2^(15-10) = 32).
    """
    info = finfo(dtype)
    return float(info.max) + 2.0 ** (info.maxexp - 1 - info.nmant) / 2


def is_floating(dtype: np.dtype) -> bool:
    """True for float16, bfloat16, float32 and float64: the dtypes that carry gradients."""
    return dtype.kind == "f" or dtype.name == "bfloat16"


def is_16bit(dtype: np.dtype) -> bool:
    """True for float16 and bfloat16, the formats mixed precision computes in."""
    return dtype.itemsize == 2 and is_floating(dtype)


def accumulation_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a sum of `dtype` values accumulates in: float32 for 16-bit floats, else `dtype`."""
    return float32 if is_16bit(dtype) else dtype


def check_supported(dtype: np.dtype, device: str) -> None:
    """Raise a TypeError naming `dtype` if the backend for `device` cannot hold it."""
    if dtype in _NUMPY_SUPPORTED:
        return
    if dtype.name == "bfloat16":
        if device == "cpu":
            return
        raise TypeError(
            "tinyamp keeps bfloat16 tensors on device='cpu' (emulated with ml_dtypes): its GPU code is written "
            "for float16, so use float16 on device='cuda'."
        )
    raise TypeError(f"tinyamp cannot hold dtype {dtype} (kind {dtype.kind!r}); supported: {SUPPORTED_NAMES}")


def scalar_dtype(tensor_dtype: np.dtype, scalar: int | float | bool) -> np.dtype:
    """The dtype a Python scalar takes when it meets a tensor of `tensor_dtype`.

    Python scalars are *weak*: ``float16_tensor * 2.0`` stays float16.  (NumPy 2 keeps
    Python scalars weak too, but a 0-d array made from them is float64 and would upcast
    the whole expression; so the scalar is converted with the tensor's dtype.)  An
    integer or bool tensor meeting a Python float becomes float32, as in PyTorch.
    """
    if isinstance(scalar, float) and not is_floating(tensor_dtype):
        return float32
    return tensor_dtype


def promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """Result dtype of an elementwise op between two tensors.

    Two floats promote as NumPy does (float16 + float32 -> float32).  A float meeting an
    integer keeps the float's dtype (NumPy would turn float16 + int64 into float64).
    """
    fa, fb = is_floating(a), is_floating(b)
    if fa and not fb:
        return a
    if fb and not fa:
        return b
    return np.promote_types(a, b)
