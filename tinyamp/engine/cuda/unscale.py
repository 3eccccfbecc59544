"""Engine room: unscaling and sums of squares on the GPU, without float64 copies of the gradients.

``multiply_and_sum_squares_`` answers ``tinyamp.kernels.multiply_and_sum_squares_`` for float16 and float32 CuPy arrays:
one ``ElementwiseKernel`` multiplies each value by the factor in float32 with the IEEE
multiply of exact_float32.py (CuPy's own arithmetic is compiled with ``-ftz=true`` and
would flush float32 subnormals, where NumPy keeps them) and rounds it once into the
gradient's dtype; a ``ReductionKernel`` then sums the squares in float64.  The sum is not
finite exactly when a value is not (a float32 square, at most 1.2e77, never overflows
float64), so it is the overflow check too, and all of a step's sums reach the host in one read.

``scaled_sum_of_squares`` reads a float16 gradient, unscales each value on the fly and sums
the squares, writing nothing: the fused master updates (master_update.py) unscale the same
gradient again inside their kernels, so no unscaled copy is ever stored.

Many blocks, not one.  CuPy gives each *output* of a ``ReductionKernel`` one thread block, so
a reduction of a whole array to one value runs on one of the GPU's 132 multiprocessors: 67
million values took 19.5 ms on an H200, 87.5% of a training step.  ``_in_rows`` views a large
array as rows of ``ROW`` values, reduces each row in its own block (float64 row sums), and adds
the row sums in a second, small reduction.  The squares are exact in float64 (a float32 square
has at most 48 significant bits) and every sum of them is in float64, so the order changes the
total by at most about n * 2^-53 of itself (n the number of values): never a finite/non-finite
difference, and far below what a norm is compared with.  tests/engine_room check the total
against the reference's within that bound.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from tinyamp import backend
from tinyamp.engine.cuda.device import on_gpu
from tinyamp.engine.cuda.exact_float32 import PREAMBLE

_MULTIPLY = "g = (T)f32_mul((float)g, factor);"
_SQUARE = "f32_to_f64((float)x) * f32_to_f64((float)x)"
_SCALED_SQUARE = "f32_to_f64(f32_mul((float)x, inverse)) * f32_to_f64(f32_mul((float)x, inverse))"


@cache
def _kernels() -> tuple[Any, Any, Any]:  # pragma: no cover - needs a GPU
    cupy = backend.array_module("cuda")
    multiply = cupy.ElementwiseKernel("float32 factor", "T g", _MULTIPLY, "tinyamp_multiply", preamble=PREAMBLE)
    squares = cupy.ReductionKernel(
        "T x", "float64 total", _SQUARE, "a + b", "total = a", "0", "tinyamp_sum_of_squares", preamble=PREAMBLE
    )
    scaled_squares = cupy.ReductionKernel(
        "T x, float32 inverse", "float64 total", _SCALED_SQUARE, "a + b", "total = a", "0",
        "tinyamp_scaled_sum_of_squares", preamble=PREAMBLE,
    )  # fmt: skip
    return multiply, squares, scaled_squares


ROW = 4096  # values a block reduces: 4096 float16 = 8 KiB, 16,384 rows for a 8192 x 8192 gradient
_ONE_BLOCK = 1 << 16  # at most this many values: one block is as fast as two launches


def _in_rows(reduction: Any, g: Any, *args: Any, out: Any = None) -> Any:
    """``reduction(g.ravel(), *args)`` summed in many blocks: per row of ROW values, then over the rows.

    With `out` (a 0-d float64 array, e.g. one slot of a step's array of sums) the total is written there.
    """
    flat = g.ravel()
    if flat.size <= _ONE_BLOCK:
        return reduction(flat, *args) if out is None else reduction(flat, *args, out=out)
    whole = flat.size - flat.size % ROW
    total = reduction(flat[:whole].reshape(-1, ROW), *args, axis=1).sum(out=out)
    if whole < flat.size:  # the last partial row
        total += reduction(flat[whole:], *args)
    return total


def applies(g: Any) -> bool:
    """A float16 or float32 CuPy gradient (float64 ones take the reference path)."""
    return g.dtype in (np.float16, np.float32) and on_gpu(g)


def multiply_and_sum_squares_(g: Any, factor: float) -> Any:
    """``g *= factor`` in place in one pass, then sum(g^2) in float64 as a 0-d device array."""
    if not applies(g):
        return NotImplemented
    if factor != 1.0:
        _kernels()[0](np.float32(factor), g)
    return _in_rows(_kernels()[1], g)


def sum_of_squares(g: Any) -> Any:
    """sum(g^2) in float64, as a 0-d device array, without a float64 copy of g."""
    return _in_rows(_kernels()[1], g) if applies(g) else NotImplemented


def scaled_sum_of_squares(g: Any, inverse: float, out: Any = None) -> Any:
    """sum((g * inverse)^2) in float64, each product rounded to float32 first, as a 0-d device array (or in `out`)."""
    return _in_rows(_kernels()[2], g, np.float32(inverse), out=out)


@cache
def _any_not_finite() -> Any:  # pragma: no cover - needs a GPU
    cupy = backend.array_module("cuda")
    return cupy.ReductionKernel("float64 s", "int32 skip", "isfinite(s) ? 0 : 1", "max(a, b)", "skip = a", "0",
                                "tinyamp_any_not_finite")  # fmt: skip


def any_not_finite(sums: Any) -> Any:
    """1 (int32, on the device) when one of `sums` is inf or NaN, else 0: a step's skip flag, in one kernel."""
    return _any_not_finite()(sums)
