"""Undoing broadcasting in backward, with a float32 accumulator for low precision.

If ``b`` of shape (3,) was broadcast against ``a`` of shape (4, 3), each element of
``b`` was used 4 times, so its gradient is the *sum* of 4 upstream gradients.  Summed in
float16 they would stall (2048 + 1 rounds back to 2048), so the sum accumulates in
float32 (``dtypes.accumulation_dtype``) and is rounded to the tensor's dtype once.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tinyamp import dtypes, kernels


def unbroadcast(grad: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """Sum `grad` down to `shape` and cast it to `dtype`: the gradient of a broadcast."""
    if grad.shape != shape:
        lead = grad.ndim - len(shape)
        axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and grad.shape[lead + i] != 1)
        if lead and axes == tuple(range(lead)):  # only leading axes: the sum of the rows of a 2-D view
            grad = kernels.sum_rows(grad.reshape(-1, math.prod(shape))).reshape(shape)
        else:
            grad = grad.sum(axis=axes, dtype=dtypes.accumulation_dtype(grad.dtype)).reshape(shape)
    return kernels.cast(grad, dtype)
