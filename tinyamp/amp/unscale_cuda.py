"""Unscaling on the GPU: one kernel pass per gradient divides by the scale and flags inf/NaN.

On NumPy, unscaling is a multiply and the finiteness check comes from the sum of squares
(scaler.py).  On the GPU every pass is a trip through memory, so one
``cupy.ElementwiseKernel`` multiplies each gradient by 1/scale in place (in float32,
rounded once into the gradient's dtype, as ``_multiply_`` does on the CPU: the same bits,
with the IEEE multiply of tinyamp/ops/exact_float32_cuda.py)
and raises a per-gradient device flag when the stored result is not finite.  A reduction
kernel sums the squares in float64 for the gradient norm without a float64 copy of the
gradient.  The flags and the sums then travel to the host together: one read per step.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from tinyamp import backend
from tinyamp.ops.exact_float32_cuda import PREAMBLE

_UNSCALE = """
float v = f32_mul((float)g, inverse);
g = (T)v;
if (!isfinite((float)g)) flag[0] = 1;
"""


@cache
def _kernels() -> tuple[Any, Any, Any]:  # pragma: no cover - needs a GPU
    cupy = backend.array_module("cuda")
    unscale = cupy.ElementwiseKernel(
        "float32 inverse", "T g, raw int32 flag", _UNSCALE, "tinyamp_unscale", preamble=PREAMBLE
    )
    squares = cupy.ReductionKernel(
        "T x", "float64 total", "f32_to_f64((float)x) * f32_to_f64((float)x)", "a + b", "total = a", "0",
        "tinyamp_sum_of_squares", preamble=PREAMBLE,
    )  # fmt: skip
    # sum((x / scale)^2) of a float16 gradient, each term unscaled in float32 as the CPU does,
    # without writing the unscaled values anywhere: an inf or NaN makes the sum non-finite.
    scaled_squares = cupy.ReductionKernel(
        "T x, float32 inverse", "float64 total",
        "f32_to_f64(f32_mul((float)x, inverse)) * f32_to_f64(f32_mul((float)x, inverse))", "a + b", "total = a", "0",
        "tinyamp_scaled_sum_of_squares", preamble=PREAMBLE,
    )  # fmt: skip
    return unscale, squares, scaled_squares


def applies(g: Any) -> bool:
    """A float16 or float32 CuPy gradient (float64 ones take the generic path)."""
    return not isinstance(g, np.ndarray) and g.dtype in (np.float16, np.float32)


def unscale_(g: Any, inverse: float) -> Any:
    """g *= inverse in place, in one pass; returns a device int32 flag, 1 if g now holds inf or NaN."""
    flag = backend.get_array_module(g).zeros((), np.int32)
    _kernels()[0](np.float32(inverse), g, flag)
    return flag


def sum_of_squares(g: Any) -> Any:
    """sum(g^2) in float64, as a 0-d device array, without a float64 copy of g."""
    return _kernels()[1](g)


def scaled_sum_of_squares(g: Any, inverse: float) -> Any:
    """sum((g * inverse)^2) in float64, each product rounded to float32 first, as a 0-d device array.

    It reads the gradient without changing it: the update kernels unscale it again on the
    fly (fused_cuda.py), so no unscaled copy is ever stored.  Not finite when g is not.
    """
    return _kernels()[2](g, np.float32(inverse))
