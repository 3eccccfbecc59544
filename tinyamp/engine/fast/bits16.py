"""Engine room: ReLU and its backward on the bit patterns of 16-bit floats, for NumPy.

NumPy has no vector code for float16: each float16 comparison or maximum goes through a
scalar loop that converts to float32 and back.  For ops that only *select* values, the
bit patterns can be handled as int16, which NumPy vectorizes:

* IEEE floats order like sign-magnitude integers: for any x >= +0.0 the int16 view is
  >= 0, and for x > 0 it is > 0; the NaNs with the sign bit clear lie above +inf
  (0x7C00 in float16, 0x7F80 in bfloat16), where ``x > 0`` is False;
* -inf is the int16 value -1024 in float16 (0xFC00) and -128 in bfloat16 (0xFF80);
  the int16 values strictly between it and 0 are the NaNs with the sign bit set.

Multiplying a bit pattern by 1 keeps the value exactly and by 0 gives +0.0, so a
masked select costs one int16 multiply.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyamp import dtypes

_INT16 = np.dtype(np.int16)


def relu_kernel(x: Any) -> Any:
    """``tinyamp.kernels.relu`` for NumPy arrays (NotImplemented for others): the reference's bits.

    16-bit floats on their bits; float32 and float64 with ``np.maximum``, which gives +0
    for -0 and keeps every NaN, as the reference does.
    """
    if type(x) is not np.ndarray:
        return NotImplemented
    return relu(x) if dtypes.is_16bit(x.dtype) else np.maximum(x, x.dtype.type(0))


def relu_backward_kernel(g: Any, out: Any) -> Any:
    """``tinyamp.kernels.relu_backward`` for NumPy arrays (NotImplemented for others)."""
    if type(g) is not np.ndarray:
        return NotImplemented
    if dtypes.is_16bit(g.dtype) and g.dtype == out.dtype:
        return mask_where_positive(g, out)
    return select(g, out > 0)  # as np.where(out > 0, g, 0), without its slower general loop


def _neg_inf_bits(dtype: np.dtype) -> int:
    return int(np.array(-np.inf, dtype=dtype).view(_INT16))


def _pos_inf_bits(dtype: np.dtype) -> int:
    return int(np.array(np.inf, dtype=dtype).view(_INT16))


def relu(x: np.ndarray) -> np.ndarray:
    """max(x, 0) for a 16-bit float array, exactly, with NaN kept as NaN.

    Keep the int16 values above the bits of -inf: the non-negative numbers and every NaN
    (with either sign); zero the rest (negative numbers, -0.0 and -inf).
    """
    bits = x.view(_INT16)
    return (bits * (bits > _neg_inf_bits(x.dtype))).view(x.dtype)


def mask_where_positive(g: np.ndarray, out: np.ndarray) -> np.ndarray:
    """g where out > 0, else +0.0 (ReLU's backward), for 16-bit float arrays.

    ``out > 0`` holds for the int16 values from 1 (the smallest subnormal) up to the bits
    of +inf; a NaN compares False, as it does in float32, so its gradient is zero too.
    """
    bits = out.view(_INT16)
    positive = (bits > 0) & (bits <= _pos_inf_bits(out.dtype))
    return (g.view(_INT16) * positive).view(g.dtype)


_SAME_WIDTH_INT = {2: np.dtype(np.int16), 4: np.dtype(np.int32), 8: np.dtype(np.int64)}


def select(g: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """g where `keep` (bool) holds, else +0.0, for a float array of any width.

    A select, not a product: ``g * keep`` turns an inf gradient at a dropped position
    into NaN (inf * 0), while multiplying the bit pattern by 0 gives +0.0 exactly.
    """
    return (g.view(_SAME_WIDTH_INT[g.dtype.itemsize]) * keep).view(g.dtype)
