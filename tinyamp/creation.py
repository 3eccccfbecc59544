"""Tensors made from nothing: zeros, ones, full, randn, rand, arange."""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyamp import backend, dtypes, random
from tinyamp.tensor import Tensor

Shape = int | tuple[int, ...]


def _check_shape(shape: Any, made_by: str) -> tuple[int, ...]:
    """`shape` as a tuple of sizes, each a whole number >= 0; a ValueError or TypeError naming the fix otherwise."""
    sizes = (shape,) if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool) else shape
    if not isinstance(sizes, (tuple, list)) or any(
        isinstance(n, bool) or not isinstance(n, (int, np.integer)) for n in sizes
    ):
        raise TypeError(f"{made_by}: a shape is an int or a tuple of ints, like (2, 3); got {shape!r}")
    if any(n < 0 for n in sizes):
        raise ValueError(f"{made_by}: sizes must be whole numbers >= 0; got shape {tuple(sizes)}")
    return tuple(int(n) for n in sizes)


def _leaf(data: Any, requires_grad: bool) -> Tensor:
    t = Tensor._make(data, False, None)
    return t.requires_grad_(True) if requires_grad else t


def full(
    shape: Shape, value: float, dtype: Any = "float32", device: str = "cpu", requires_grad: bool = False
) -> Tensor:
    """A tensor of `shape` filled with `value`."""
    shape = _check_shape(shape, "full")
    dt = dtypes.resolve(dtype)
    dtypes.check_supported(dt, backend.check_device(device))
    return _leaf(backend.array_module(device).full(shape, value, dtype=dt), requires_grad)


def zeros(shape: Shape, dtype: Any = "float32", device: str = "cpu", requires_grad: bool = False) -> Tensor:
    """A tensor of zeros."""
    return full(_check_shape(shape, "zeros"), 0, dtype, device, requires_grad)


def ones(shape: Shape, dtype: Any = "float32", device: str = "cpu", requires_grad: bool = False) -> Tensor:
    """A tensor of ones."""
    return full(_check_shape(shape, "ones"), 1, dtype, device, requires_grad)


def randn(shape: Shape, dtype: Any = "float32", device: str = "cpu", requires_grad: bool = False) -> Tensor:
    """Standard normal samples, drawn on the CPU generator (same values on every device)."""
    shape = _check_shape(shape, "randn")
    dt = dtypes.resolve(dtype)
    dtypes.check_supported(dt, backend.check_device(device))
    data = random.generator("cpu").standard_normal(shape).astype(dt)
    return _leaf(backend.to_device(data, device), requires_grad)


def rand(shape: Shape, dtype: Any = "float32", device: str = "cpu", requires_grad: bool = False) -> Tensor:
    """Uniform samples in [0, 1), drawn on the CPU generator."""
    shape = _check_shape(shape, "rand")
    dt = dtypes.resolve(dtype)
    dtypes.check_supported(dt, backend.check_device(device))
    data = random.generator("cpu").random(shape).astype(dt)
    return _leaf(backend.to_device(data, device), requires_grad)


def arange(*args: int, dtype: Any = "int64", device: str = "cpu") -> Tensor:
    """Integers in [start, stop) with a step, like range()."""
    if not 1 <= len(args) <= 3 or any(isinstance(a, bool) or not isinstance(a, (int, np.integer)) for a in args):
        raise TypeError(f"arange takes 1 to 3 ints (stop, or start, stop[, step]), like range(); got {args!r}")
    if len(args) == 3 and args[2] == 0:
        raise ValueError("arange: a step of 0 would never reach stop; pass a step other than 0")
    return _leaf(backend.array_module(device).arange(*args, dtype=dtypes.resolve(dtype)), False)
