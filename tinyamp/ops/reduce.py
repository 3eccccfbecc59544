"""Reductions over axes: sum, mean, max.

Sums of float16 values accumulate in float32 and are rounded once at the end: a
float16 running sum stalls at 2048 when adding ones (2048 + 1 rounds back to 2048).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tinyamp import dtypes, kernels
from tinyamp.autocast import cast_inputs
from tinyamp.backend import get_array_module
from tinyamp.dtypes import accumulation_dtype
from tinyamp.function import Function
from tinyamp.tensor import Tensor, takes_a_tensor

Axis = int | Sequence[int] | None


def normalize_axes(axis: Axis, ndim: int) -> tuple[int, ...]:
    """Axes as a sorted tuple of non-negative ints, with a clear error when out of range."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis) if isinstance(axis, (tuple, list)) else None
    if axes is None or any(isinstance(a, bool) or not isinstance(a, (int, np.integer)) for a in axes):
        raise TypeError(f"axis is an int, a tuple of ints or None, like axis=0 or axis=(0, 1); got {axis!r}")
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"axis {a} is out of range for a tensor with {ndim} dimensions")
        out.append(a % ndim)
    return tuple(sorted(set(out)))


def _expand(g: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
    """Put back the reduced axes as size-1 axes, so g broadcasts against the input."""
    if keepdims or not axes:
        return g
    shape = list(g.shape)
    for a in axes:
        shape.insert(a, 1)
    return g.reshape(shape)


class Sum(Function):
    """$y = \\sum_{axes} x$; every x receives the gradient of its sum."""

    def forward(self, x: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
        self.meta = (x.shape, axes, keepdims)
        return x.sum(axis=axes, keepdims=keepdims, dtype=accumulation_dtype(x.dtype)).astype(x.dtype, copy=False)

    def backward(self, g: Any) -> tuple[Any]:
        shape, axes, keepdims = self.meta
        return (get_array_module(g).broadcast_to(_expand(g, axes, keepdims), shape),)


class Mean(Function):
    """$y = \\frac{1}{n} \\sum_{axes} x$, with n the number of elements reduced."""

    def forward(self, x: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
        n = 1
        for a in axes:
            n *= x.shape[a]
        self.meta = (x.shape, axes, keepdims, n)
        acc = accumulation_dtype(x.dtype)
        return x.mean(axis=axes, keepdims=keepdims, dtype=acc).astype(x.dtype, copy=False)

    def backward(self, g: Any) -> tuple[Any]:
        shape, axes, keepdims, n = self.meta
        return (get_array_module(g).broadcast_to(_expand(g / n, axes, keepdims), shape),)


class Max(Function):
    """$y = \\max_{axes} x$; the gradient goes to the maximum (split evenly between ties)."""

    def forward(self, x: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
        out = x.max(axis=axes, keepdims=True)
        self.save_for_backward(x, out)
        self.meta = (axes, keepdims)
        return out if keepdims else out.reshape([n for i, n in enumerate(x.shape) if i not in axes])

    def backward(self, g: Any) -> tuple[Any]:
        x, out = self.saved
        axes, keepdims = self.meta
        is_max = x == out
        count = is_max.sum(axis=axes, keepdims=True)
        # A NaN maximum equals no element (count 0): 0/0 makes its gradients NaN, the honest answer (a loss
        # scaler reports them and skips the step); NumPy's "invalid value" warning would only repeat that.
        with np.errstate(invalid="ignore"):
            return (kernels.cast(_expand(g, axes, keepdims) * is_max / count, x.dtype),)


@takes_a_tensor
def sum(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Sum over `axis` (all axes when None)."""
    (x,) = cast_inputs("sum", x)
    return Sum.apply(x, axes=normalize_axes(axis, x.ndim), keepdims=keepdims)


@takes_a_tensor
def mean(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Mean over `axis` (all axes when None); integer tensors average as float32.

    A mean over no elements (an axis of size 0) is 0/0: an error here, where NumPy would warn
    and return NaN.
    """
    axes = normalize_axes(axis, x.ndim)
    if any(x.shape[a] == 0 for a in axes):
        raise ValueError(
            f"mean over axes {axes} of a tensor of shape {x.shape} averages no elements, which is undefined: "
            "is the batch empty? Skip empty batches, or use sum, which is 0 over no elements"
        )
    if not dtypes.is_floating(x.dtype):  # the mean of [1, 2] is 1.5, not the integer 1
        x = x.astype(dtypes.float32)
    (x,) = cast_inputs("mean", x)
    return Mean.apply(x, axes=axes, keepdims=keepdims)


@takes_a_tensor
def max(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Maximum over `axis` (all axes when None)."""
    if x.size == 0:
        raise ValueError(f"max of an empty tensor (shape {x.shape}) is undefined")
    return Max.apply(x, axes=normalize_axes(axis, x.ndim), keepdims=keepdims)
