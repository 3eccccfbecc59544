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


def _floating(dtype: Any, made_by: str) -> Any:
    """`dtype` resolved, refused unless floating: samples cast to ints are truncated, to bool nearly all True."""
    dt = dtypes.resolve(dtype)
    if not dtypes.is_floating(dt):
        raise TypeError(
            f"{made_by} draws real numbers, which {dt} cannot hold (they would be truncated toward 0, or become True); "
            f"pass a floating dtype, e.g. dtype='float32'"
        )
    return dt


def _leaf(data: Any, requires_grad: bool) -> Tensor:
    t = Tensor._make(data, False, None)
    return t.requires_grad_(requires_grad) if requires_grad is not False else t


def full(
    shape: Shape, value: float, dtype: Any = "float32", device: str = "cpu", requires_grad: bool = False
) -> Tensor:
    """A tensor of `shape` filled with `value`."""
    shape = _check_shape(shape, "full")
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        value = value.item()
    if not isinstance(value, (int, float)):  # None would fill with NaN, a string fail inside NumPy
        raise TypeError(f"full fills a tensor with one number; got {value!r} ({type(value).__name__})")
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
    return _drawn("randn", "standard_normal", shape, dtype, device, requires_grad)


def rand(shape: Shape, dtype: Any = "float32", device: str = "cpu", requires_grad: bool = False) -> Tensor:
    """Uniform samples in [0, 1), drawn on the CPU generator."""
    return _drawn("rand", "random", shape, dtype, device, requires_grad)


def _drawn(op: str, method: str, shape: Shape, dtype: Any, device: str, requires_grad: bool) -> Tensor:
    """Samples of the CPU generator's `method`, cast to `dtype` and moved to `device`: the same values everywhere."""
    shape = _check_shape(shape, op)
    dt = _floating(dtype, op)
    dtypes.check_supported(dt, backend.check_device(device))
    data = getattr(random.generator("cpu"), method)(shape).astype(dt)
    return _leaf(backend.to_device(data, device), requires_grad)


def arange(*args: int, dtype: Any = "int64", device: str = "cpu") -> Tensor:
    """Integers in [start, stop) with a step, like range()."""
    if not 1 <= len(args) <= 3 or any(isinstance(a, bool) or not isinstance(a, (int, np.integer)) for a in args):
        raise TypeError(f"arange takes 1 to 3 ints (stop, or start, stop[, step]), like range(); got {args!r}")
    if len(args) == 3 and args[2] == 0:
        raise ValueError("arange: a step of 0 would never reach stop; pass a step other than 0")
    wide = next((int(a) for a in args if not -(2**63) <= a < 2**63), None)
    if wide is not None:  # NumPy counts in int64: past it, an OverflowError from inside NumPy
        raise ValueError(f"arange{args}: {wide} is beyond int64, the widest integer an array holds (-2^63 to "
                         f"2^63-1); pass a start, stop and step within that range")  # fmt: skip
    dt = dtypes.resolve(dtype)
    dtypes.check_supported(dt, backend.check_device(device))
    values = range(*(int(a) for a in args))
    nbytes = len(values) * dt.itemsize
    if nbytes > np.iinfo(np.intp).max:  # NumPy's own words: "array is too big; `arr.size * arr.dtype.itemsize`..."
        raise ValueError(f"arange{args}: {len(values):,} values of {dt} would take {nbytes:,} bytes, more than an "
                         f"array can address (2^63 - 1 bytes); pass a shorter range")  # fmt: skip
    # Evenly spaced integers: an integer dtype (or bool) holds them all when it holds both ends; a float
    # dtype holds every integer up to 2^(mantissa bits + 1), and is checked value by value above it.
    check = np.array([values[0], values[-1]] if values else [], dtype=np.int64)
    floating = dtypes.is_floating(dt)
    if floating and check.size and np.abs(check).max() > 2.0 ** (dtypes.finfo(dt).nmant + 1):
        try:
            check = np.arange(*args, dtype=np.int64)  # the rare case, on the host
        except MemoryError:
            raise MemoryError(f"arange{args}: checking that {dt} holds each of its {len(values):,} values needs "
                              f"{len(values) * 8 / 2**30:,.1f} GiB on the host; pass a shorter range") from None
    with np.errstate(all="ignore"):  # a value that does not fit is reported below, by name
        held = check.astype(dt)
        back = held.astype(np.float64) if floating else held.astype(np.int64)
    wrong = np.flatnonzero(back != check)  # float16 skips odd numbers above 2048; uint8 wraps 256 to 0
    if wrong.size:
        i = int(wrong[0])
        raise ValueError(
            f"arange{args}: {int(check[i])} does not fit in {dt} (it would become {held[i].item()!r}); "
            "pass a dtype that holds every value, e.g. dtype='int64', and cast afterwards if you mean to round"
        )
    try:
        data = backend.array_module(device).arange(*args, dtype=dt)  # made where it lives: no copy
    except MemoryError:
        raise MemoryError(f"arange{args}: {len(values):,} values of {dt} need {nbytes / 2**30:,.1f} GiB, more than "
                          f"could be allocated on {device}; pass a shorter range") from None  # fmt: skip
    return _leaf(data, False)
