"""Casts between dtypes and moves between devices, both differentiable.

The gradient of a cast is the upstream gradient cast back to the source dtype
(the rule tinygrad encodes in two lines): a float16 copy of a float32 weight sends
its float16 gradient back as float32.
"""

from __future__ import annotations

import contextvars
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tinyamp import backend, dtypes
from tinyamp.autograd import Function
from tinyamp.tensor import Tensor

# Casting large NumPy arrays on every core.  NumPy converts float16 <-> float32 one
# element at a time (about 1.8 ns per element to float16, 1.0 ns to float32 here, and
# 30x more for values that are float16 subnormals), and a mixed-precision step on a
# CPU spends most of its extra time in these casts.  A cast is independent per
# element and NumPy releases the GIL while it runs, so halves of an array convert in
# parallel on two cores, as sgemm already uses them.
PARALLEL_MIN_ELEMENTS = 1 << 18
_pool: ThreadPoolExecutor | None = None


def _workers() -> int:
    try:
        return max(1, min(len(os.sched_getaffinity(0)), 8))
    except AttributeError:  # not on Linux
        return max(1, min(os.cpu_count() or 1, 8))


def convert(x: Any, dtype: Any, out: Any = None) -> Any:
    """``x.astype(dtype)`` (or, with `out`, that cast written into `out`), with large
    C-contiguous NumPy arrays split across the cores.

    Bit-identical to ``astype``: each element is rounded by the same NumPy cast.
    """
    global _pool
    dtype = np.dtype(dtype)
    if out is None and x.dtype == dtype:
        return x
    workers = _workers()
    parallel = isinstance(x, np.ndarray) and x.size >= PARALLEL_MIN_ELEMENTS and workers >= 2
    if not (parallel and x.flags.c_contiguous and (out is None or out.flags.c_contiguous)):
        if out is None:
            return x.astype(dtype)
        out[...] = x
        return out
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=workers - 1, thread_name_prefix="tinyamp-cast")
    if out is None:
        out = np.empty(x.shape, dtype=dtype)
    src, dst = x.reshape(-1), out.reshape(-1)
    bounds = np.linspace(0, src.size, workers + 1).astype(int)
    pieces = [(dst[a:b], src[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    # np.errstate lives in a context variable: each piece runs in a copy of the caller's
    # context, so an overflow warns, is ignored or raises exactly as astype's would.
    futures = [_pool.submit(contextvars.copy_context().run, np.copyto, d, s, casting="unsafe") for d, s in pieces[1:]]
    np.copyto(*pieces[0], casting="unsafe")
    for f in futures:
        f.result()
    return out


# The autocast block in force (a tinyamp.amp.autocast), or None.  It lives here, with
# the casts, so that every op can consult it without importing the amp package.
active_autocast: Any = None


def autocast_inputs(op: str, *tensors: Any) -> tuple[Any, ...]:
    """`tensors`, cast as the active autocast's policy says for `op` (unchanged outside autocast)."""
    if active_autocast is None:
        return tensors
    return active_autocast.cast_inputs(op, tensors)


def autocast_output_dtype(op: str) -> Any:
    """float32 when the policy keeps `op`'s FP32 accumulator, else None."""
    return None if active_autocast is None else active_autocast.output_dtype(op)


class Cast(Function):
    """$y = \\mathrm{round}_{dtype}(x)$; the gradient is cast back to x's dtype."""

    def forward(self, x: Any, dtype: Any) -> Any:
        self.source_dtype = x.dtype
        return convert(x, dtype)

    def backward(self, g: Any) -> tuple[Any]:
        return (convert(g, self.source_dtype),)


class ToDevice(Function):
    """Copy to another device; the gradient is copied back."""

    def forward(self, x: Any, device: str) -> Any:
        self.source_device = backend.device_of(x)
        return backend.to_device(x, device)

    def backward(self, g: Any) -> tuple[Any]:
        return (backend.to_device(g, self.source_device),)


def cast(x: Tensor, dtype: Any) -> Tensor:
    """`x` rounded to `dtype` (returns `x` itself when it already has that dtype)."""
    dtype = dtypes.resolve(dtype)
    if dtype == x.dtype:
        return x
    dtypes.check_supported(dtype, x.device)
    if x.requires_grad and not dtypes.is_floating(dtype):
        return Tensor._make(x.data.astype(dtype), False, None)  # no gradient through an int cast
    return Cast.apply(x, dtype=dtype)


def to_device(x: Tensor, device: str) -> Tensor:
    """`x` on `device` ("cpu" or "cuda"); returns `x` itself when it is already there."""
    device = backend.check_device(device)
    if device == x.device:
        return x
    dtypes.check_supported(x.dtype, device)
    return ToDevice.apply(x, device=device)
