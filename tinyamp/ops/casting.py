"""Casts between dtypes and moves between devices, both differentiable.

The gradient of a cast is the upstream gradient cast back to the source dtype
(the rule tinygrad encodes in two lines): a float16 copy of a float32 weight sends
its float16 gradient back as float32.
"""

from __future__ import annotations

from typing import Any

from tinyamp import backend, dtypes
from tinyamp.autograd import Function
from tinyamp.tensor import Tensor


def convert(x: Any, dtype: Any, out: Any = None) -> Any:
    """``x.astype(dtype)``, or that cast written into the existing array `out`.

    Every cast between float widths on the hot path goes through here, so a profile
    shows what they cost in one line.  On a CPU they are the price of mixed precision:
    NumPy converts float16 <-> float32 one element at a time, about 1.8 ns per element
    to float16 and 1.0 ns back (0.4 ns is a float32 multiply), and 30x more for values
    that are float16 subnormals.  (Splitting large casts across two threads gained
    nothing in a training step: OpenBLAS's threads keep spinning on the cores between
    matrix products.)
    """
    if out is not None:
        out[...] = x
        return out
    return x if x.dtype == dtype else x.astype(dtype)


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
