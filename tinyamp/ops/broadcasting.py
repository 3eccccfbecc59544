"""Undoing broadcasting in backward, with a float32 accumulator for low precision.

If ``b`` of shape (3,) was broadcast against ``a`` of shape (4, 3), each element of
``b`` was used 4 times, so its gradient is the *sum* of 4 upstream gradients.  Summing
many float16 values in float16 loses them (1 + 2^-11 == 1 in float16: once a running
sum reaches 2048, adding 1 changes nothing), so the sum accumulates in float32 and is
rounded to the tensor's dtype once, at the end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyamp.ops.half_casts import astype

_FLOAT32 = np.dtype(np.float32)


def accumulation_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a sum of `dtype` values accumulates in: float32 for 16-bit floats."""
    # itemsize 2 and a floating kind: float16 ("f") or ml_dtypes' bfloat16 ("V")
    return _FLOAT32 if dtype.itemsize == 2 and dtype.kind in "fV" else dtype


def unbroadcast(grad: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """Sum `grad` down to `shape` and cast it to `dtype`: the gradient of a broadcast."""
    if grad.shape != shape:
        lead = grad.ndim - len(shape)
        axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and grad.shape[lead + i] != 1)
        grad = grad.sum(axis=axes, dtype=accumulation_dtype(grad.dtype)).reshape(shape)
    if grad.dtype != dtype:
        grad = astype(grad, dtype)
    return grad
