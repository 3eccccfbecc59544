"""Ops that move elements without arithmetic: reshape, transpose, indexing, concatenate.

Their backward moves the gradient back to where each element came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tinyamp import backend, kernels
from tinyamp.autocast import cast_inputs
from tinyamp.backend import get_array_module
from tinyamp.dtypes import accumulation_dtype
from tinyamp.function import Function
from tinyamp.tensor import Tensor, not_a_tensor


class Reshape(Function):
    """Same elements, new shape; the gradient is reshaped back."""

    def forward(self, x: Any, shape: tuple[int, ...]) -> Any:
        self.source_shape = x.shape
        return x.reshape(shape)

    def backward(self, g: Any) -> tuple[Any]:
        return (g.reshape(self.source_shape),)


class Transpose(Function):
    """Permute axes; the gradient is permuted by the inverse permutation."""

    def forward(self, x: Any, axes: tuple[int, ...]) -> Any:
        self.axes = axes
        return x.transpose(axes)

    def backward(self, g: Any) -> tuple[Any]:
        return (g.transpose(np.argsort(self.axes)),)


def _is_advanced(index: Any) -> bool:
    """True when an index holds arrays/lists (advanced indexing may repeat elements)."""
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, (list, np.ndarray)) or backend.is_array(p) for p in parts)


class GetItem(Function):
    """``x[index]``; the gradient is scattered back (and summed where an element repeats)."""

    def forward(self, x: Any, index: Any) -> Any:
        self.meta = (x.shape, x.dtype, index)
        return x[index]

    def backward(self, g: Any) -> tuple[Any]:
        shape, dtype, index = self.meta
        xp = get_array_module(g)
        if not _is_advanced(index):
            grad = xp.zeros(shape, dtype=dtype)
            grad[index] = g  # basic indexing: each element picked at most once
            return (grad,)
        # x[[0, 0]] picks x[0] twice: both gradients count, summed in float32 for 16-bit x
        wide = accumulation_dtype(dtype)
        grad = xp.zeros(shape, dtype=wide)
        kernels.scatter_add(grad, index, kernels.cast(g, wide))
        return (kernels.cast(grad, dtype),)


class Concatenate(Function):
    """Join tensors along an axis; each gets back its slice of the gradient."""

    def forward(self, *xs: Any, axis: int) -> Any:
        self.axis = axis
        self.sizes = [x.shape[axis] for x in xs]
        self.dtypes = [x.dtype for x in xs]  # float16 + float32 pieces give a float32 result
        return get_array_module(xs[0]).concatenate(xs, axis=axis)

    def backward(self, g: Any) -> tuple[Any, ...]:
        xp = get_array_module(g)
        bounds = np.cumsum(self.sizes)[:-1]
        pieces = xp.split(g, bounds.tolist(), axis=self.axis)
        return tuple(
            p.astype(dt, copy=False) if need else None
            for p, dt, need in zip(pieces, self.dtypes, self.needs_input_grad)
        )


def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    """`x` with a new shape (one entry may be -1) holding the same number of elements."""
    whole = isinstance(shape, (tuple, list)) and all(isinstance(n, (int, np.integer)) for n in shape)
    if not whole or any(isinstance(n, bool) for n in shape):
        raise TypeError(f"reshape takes whole numbers, like x.reshape(2, 3) or x.reshape((2, -1)); got {shape!r}")
    shape = tuple(int(n) for n in shape)
    if shape == x.shape:
        return x
    known = 1
    for n in shape:
        known *= n if n != -1 else 1
    fits = shape.count(-1) <= 1 and all(n >= -1 for n in shape)
    fits = fits and (known == x.size if -1 not in shape else known > 0 and x.size % known == 0)
    if not fits:
        raise ValueError(f"cannot reshape a tensor of shape {x.shape} ({x.size} elements) into {shape}")
    return Reshape.apply(x, shape=shape)


def transpose(x: Tensor, axes: Sequence[int] | None = None) -> Tensor:
    """Permute the axes (reverse them when `axes` is None)."""
    if axes is None:
        axes = tuple(range(x.ndim))[::-1]
    elif not all(-x.ndim <= a < x.ndim for a in axes):  # checked before % would wrap them
        raise ValueError(f"transpose axes {tuple(axes)} are not a permutation of the {x.ndim} axes of shape {x.shape}")
    axes = tuple(a % x.ndim for a in axes)
    if sorted(axes) != list(range(x.ndim)):
        raise ValueError(f"transpose axes {axes} are not a permutation of the {x.ndim} axes of shape {x.shape}")
    return Transpose.apply(x, axes=axes)


def _unwrap_index(index: Any) -> Any:
    if isinstance(index, Tensor):
        return index.data
    if isinstance(index, tuple):
        return tuple(p.data if isinstance(p, Tensor) else p for p in index)
    return index


def getitem(x: Tensor, index: Any) -> Tensor:
    """``x[index]`` with NumPy's indexing rules (ints, slices, None, int arrays, masks)."""
    index = _unwrap_index(index)
    try:
        return GetItem.apply(x, index=index)
    except IndexError as exc:
        raise IndexError(f"index {index!r} does not fit a tensor of shape {x.shape}: {exc}") from None


def concatenate(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join tensors of equal shape (except along `axis`) and equal device along `axis`."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("concatenate needs at least one tensor")
    for t in tensors:
        if not isinstance(t, Tensor):
            raise not_a_tensor(t, "concatenate")
    first = tensors[0]
    if not -first.ndim <= axis < first.ndim:  # checked before % would wrap it (or divide by 0 for 0-d)
        raise ValueError(f"concatenate: axis {axis} is out of range for tensors of shape {first.shape}")
    for t in tensors[1:]:
        if t.device != first.device:
            raise backend.DeviceError(f"concatenate got tensors on {first.device} and {t.device}")
        if t.ndim != first.ndim or any(
            a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != axis % first.ndim
        ):
            shapes = [u.shape for u in tensors]
            raise ValueError(f"concatenate along axis {axis} needs equal shapes on the other axes; got {shapes}")
    return Concatenate.apply(*cast_inputs("concatenate", *tensors), axis=axis % first.ndim)
