"""Engine room: a large float32 gradient's sum of squares, in float32 rows added in float64.

``tinyamp.kernels.sum_of_squares`` widens every value to float64 and sums in pieces.  That
copy is the cost: for a float32 gradient of more than 65536 values this cuts the gradient
into rows of 1024 values, whose squares one float32 BLAS dot sums without widening them, and
adds only the rows in float64.  Not the reference's bits: each row's sum is off by at most
about 1024 * 2^-24 = 6e-5 of itself (PyTorch sums whole tensors in float32), so the total is
within 6e-5 of the exact sum of squares (tests/engine_room/test_fast_sums.py checks the bound).
A total that is not finite (a square above float32's range, or an inf or NaN) is handed back
to the reference, which sums in float64: a finite gradient never reports an infinite norm.
So is a total below size * 2^-125: squares below float32's normal range (2^-126) lose bits,
at most 2^-149 each, and only above that total is their loss within 2^-24 of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

ROW = 1 << 10  # float32 values summed per BLAS dot
LARGE = 1 << 16  # below this the reference's float64 copy is cheap


def sum_of_squares(g: Any) -> Any:
    """``tinyamp.kernels.sum_of_squares`` for a NumPy float32 array of more than 65536 values, or NotImplemented."""
    if type(g) is not np.ndarray or g.dtype != np.float32 or g.size <= LARGE:
        return NotImplemented
    flat = g.ravel()
    whole = flat.size - flat.size % ROW
    rows, tail = flat[:whole].reshape(-1, ROW), flat[whole:].astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.vecdot(rows, rows).sum(dtype=np.float64) + np.dot(tail, tail)
    return total if np.isfinite(total) and total >= flat.size * 2.0**-125 else NotImplemented
