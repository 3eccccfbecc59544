"""Tensors made from nothing: zeros, ones, full, randn, rand, arange."""

from __future__ import annotations

from typing import Any

from tinyamp import backend, dtypes, random
from tinyamp.tensor import Tensor

Shape = int | tuple[int, ...]


def _leaf(data: Any, requires_grad: bool) -> Tensor:
    t = Tensor._make(data, False, None)
    return t.requires_grad_(True) if requires_grad else t


def full(
    shape: Shape, value: float, dtype: Any = "float32", device: str = "cpu", requires_grad: bool = False
) -> Tensor:
    """A tensor of `shape` filled with `value`."""
    dt = dtypes.resolve(dtype)
    dtypes.check_supported(dt, backend.check_device(device))
    return _leaf(backend.array_module(device).full(shape, value, dtype=dt), requires_grad)


def zeros(shape: Shape, dtype: Any = "float32", device: str = "cpu", requires_grad: bool = False) -> Tensor:
    """A tensor of zeros."""
    return full(shape, 0, dtype, device, requires_grad)


def ones(shape: Shape, dtype: Any = "float32", device: str = "cpu", requires_grad: bool = False) -> Tensor:
    """A tensor of ones."""
    return full(shape, 1, dtype, device, requires_grad)


def randn(shape: Shape, dtype: Any = "float32", device: str = "cpu", requires_grad: bool = False) -> Tensor:
    """Standard normal samples, drawn on the CPU generator (same values on every device)."""
    dt = dtypes.resolve(dtype)
    dtypes.check_supported(dt, backend.check_device(device))
    data = random.generator("cpu").standard_normal(shape).astype(dt)
    return _leaf(backend.to_device(data, device), requires_grad)


def rand(shape: Shape, dtype: Any = "float32", device: str = "cpu", requires_grad: bool = False) -> Tensor:
    """Uniform samples in [0, 1), drawn on the CPU generator."""
    dt = dtypes.resolve(dtype)
    dtypes.check_supported(dt, backend.check_device(device))
    data = random.generator("cpu").random(shape).astype(dt)
    return _leaf(backend.to_device(data, device), requires_grad)


def arange(*args: int, dtype: Any = "int64", device: str = "cpu") -> Tensor:
    """Integers in [start, stop) with a step, like range()."""
    return _leaf(backend.array_module(device).arange(*args, dtype=dtypes.resolve(dtype)), False)
