"""The engine room, CPU side: the same bits as the reference kernels, fast enough to train with.

Not on the reading path.  Each function answers for ``tinyamp.kernels`` only where it returns
the reference's bits (tests/engine_room checks every one), or, for a sum whose order it
changes (``sums``), a result within the bound its docstring states; it hands every other
case back with ``NotImplemented``.

* ``casts``: float16 <-> float32 conversions in cache-sized NumPy passes, or compiled by
  numba (``casts_numba``); 16-bit adds through them;
* ``bits16``: ReLU and its backward on 16-bit bit patterns;
* ``sums``: a large float32 gradient's sum of squares in float32 rows, within a stated bound;
* ``fp8``: the FP8 chapter's casts (encode, the counted per-tensor cast, block scaling) and its
  product, the same bits in compiled loops (``fp8_numba``), for ``tinyamp/fp8/seam.py``;
* ``allocator``: ``keep_freed_memory()``, which stops glibc handing a step's memory back to
  the kernel between steps (a process-wide setting, so only called on request).
"""

from __future__ import annotations

from tinyamp.engine.fast import bits16, casts, fp8, sums
from tinyamp.engine.fast.allocator import keep_freed_memory

IMPLEMENTATIONS = {
    "cast": casts.cast,
    "add": casts.add,
    "relu": bits16.relu_kernel,
    "relu_backward": bits16.relu_backward_kernel,
    "sum_of_squares": sums.sum_of_squares,
    "fp8_encode": fp8.encode,
    "fp8_amax": fp8.amax,
    "fp8_scaled_cast": fp8.scaled_cast,
    "fp8_block_quantize": fp8.block_quantize,
    "fp8_matmul": fp8.fp8_matmul,
}
# tinyamp/__init__.py registers them behind tinyamp.kernels

__all__ = ["IMPLEMENTATIONS", "keep_freed_memory", "casts", "bits16", "fp8", "sums"]
