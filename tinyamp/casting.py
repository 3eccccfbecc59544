"""Casts between dtypes and moves between devices, both differentiable.

The gradient of a cast is the upstream gradient cast back to the source dtype (the rule
tinygrad encodes in two lines): a float16 copy of a float32 weight sends its float16
gradient back as float32.
"""

from __future__ import annotations

import weakref
from typing import Any

from tinyamp import backend, dtypes, kernels
from tinyamp.function import Function
from tinyamp.tensor import Tensor


class Cast(Function):
    """$y = \\mathrm{round}_{dtype}(x)$; the gradient is cast back to x's dtype."""

    def forward(self, x: Any, dtype: Any) -> Any:
        self.source_dtype = x.dtype
        out = kernels.cast(x, dtype)
        try:  # for the saved-tensors report, which labels arrays a node saved as "cast" copies
            self.output_array: Any = weakref.ref(out)
        except TypeError:
            self.output_array = None
        return out

    def backward(self, g: Any) -> tuple[Any]:
        return (kernels.cast(g, self.source_dtype),)


class ToDevice(Function):
    """Copy to another device; the gradient is copied back."""

    def forward(self, x: Any, device: str) -> Any:
        self.source_device = backend.device_of(x)
        return backend.to_device(x, device)

    def backward(self, g: Any) -> tuple[Any]:
        return (backend.to_device(g, self.source_device),)


def cast(x: Tensor, dtype: Any) -> Tensor:
    """`x` rounded to `dtype`, differentiably (returns `x` itself when it already has that dtype)."""
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
