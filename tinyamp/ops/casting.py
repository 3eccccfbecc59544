"""Casts between dtypes and moves between devices, both differentiable.

The gradient of a cast is the upstream gradient cast back to the source dtype
(the rule tinygrad encodes in two lines): a float16 copy of a float32 weight sends
its float16 gradient back as float32.
"""

from __future__ import annotations

import weakref
from typing import Any

from tinyamp import backend, dtypes
from tinyamp.autograd import Function
from tinyamp.ops.half_casts import astype, fast_cast_applies, round_to_float16, widen_float16
from tinyamp.tensor import Tensor


def convert(x: Any, dtype: Any, out: Any = None) -> Any:
    """``x.astype(dtype)``, or that cast written into the existing array `out`.

    Every cast between float widths on the hot path goes through here, so a profile
    shows what they cost in one line.  On a CPU they are the price of mixed precision:
    NumPy converts float16 <-> float32 one element at a time, with branches whose cost
    depends on the data (1.8 ns per element to float16 and 0.9 back on dense values, 4 ns
    back when half are zeros, 60 ns to float16 for subnormals).  Large contiguous NumPy
    arrays therefore go through the branch-free integer versions in half_casts.py, which
    return the same bits (as compiled loops when numba is installed, half_casts_numba.py).
    (Splitting casts across two threads gained nothing in a training step: OpenBLAS's
    threads keep spinning on the cores between matrix products.)
    """
    if out is not None:
        if out.shape == x.shape and out.flags.c_contiguous and fast_cast_applies(x, out.dtype):
            (widen_float16 if x.dtype.itemsize == 2 else round_to_float16)(x, out)
        else:
            out[...] = x
        return out
    return astype(x, dtype)


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
        out = convert(x, dtype)
        try:  # for the saved-tensors report, which labels arrays a node saved as "cast" copies
            self.output_array: Any = weakref.ref(out)
        except TypeError:
            self.output_array = None
        return out

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
