"""The array kernels of mixed precision in reference form, and the one door to the engine room.

Ops, optimizers and the loss scaler do the array work that needs more than NumPy's own
operators here: casts between float widths, the 16-bit add, ReLU, the Tensor Core product,
sums of rows, scatter-adds, unscaling.  Each body is the reference, written to be read (GELU,
softmax, layer norm, cross-entropy, range checks and the loss scaler's whole step keep theirs
beside their code, and come here by ``call``).

The engine room gives the same bits faster, or on a GPU: ``tinyamp.engine.fast`` and
``tinyamp.engine.cuda`` ``register`` implementations under a kernel's name (``tinyamp/__init__.py``
does it).  A call asks them first (``_faster``); one that does not apply to the arrays it is
given answers ``NotImplemented``, and the reference runs.  ``reference_only()`` switches them
off; tests/engine_room checks each against the reference, bit for bit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from tinyamp import dtypes, rounding
from tinyamp.backend import get_array_module

_engine_room: dict[str, list[Callable[..., Any]]] = {}
_engine_room_on = True


def register(name: str, implementation: Callable[..., Any]) -> None:
    """Let `implementation` answer calls to the kernel `name` (before the reference and earlier registrations)."""
    if name not in KERNELS:
        raise ValueError(f"no kernel is called {name!r}; the kernels are {', '.join(KERNELS)}")
    _engine_room.setdefault(name, []).insert(0, implementation)


def unregister(name: str, implementation: Callable[..., Any]) -> None:
    """Take back a registration (the reference, or an earlier registration, answers again)."""
    _engine_room[name].remove(implementation)


@contextlib.contextmanager
def reference_only() -> Iterator[None]:
    """Inside the block every kernel runs its reference body: the engine room is not asked."""
    global _engine_room_on
    previous, _engine_room_on = _engine_room_on, False
    try:
        yield
    finally:
        _engine_room_on = previous


def _faster(name: str, *args: Any) -> Any:
    """The first registered implementation of `name` that applies to `args`, run; or NotImplemented."""
    if _engine_room_on:
        for implementation in _engine_room.get(name, ()):
            result = implementation(*args)
            if result is not NotImplemented:
                return result
    return NotImplemented


def call(name: str, reference: Callable[..., Any], *args: Any) -> Any:
    """The engine room's `name` if one applies to `args`, else `reference(*args)`, a reference kept beside its op."""
    result = _faster(name, *args)
    return reference(*args) if result is NotImplemented else result


# ---- the kernels ----------------------------------------------------------------------------------------
def cast(x: Any, dtype: Any, out: Any = None) -> Any:
    """`x` converted to `dtype`, rounded to nearest (ties to even) when narrower; into `out` if given.

    float32 <-> float16 on NumPy: the formulas of rounding.py; on a GPU, and for every other
    pair of dtypes, the array library's own conversion.
    """
    if out is None and x.dtype == dtype:
        return x  # nothing to convert
    result = _faster("cast", x, dtype, out)
    if result is NotImplemented:
        dtype = np.dtype(dtype)
        if type(x) is np.ndarray and (x.dtype, dtype) == (dtypes.float32, dtypes.float16):
            result = rounding.round_to_float16(x)
        elif type(x) is np.ndarray and (x.dtype, dtype) == (dtypes.float16, dtypes.float32):
            result = rounding.widen_float16(x)
        else:
            result = x.astype(dtype, copy=False)
        if out is not None:
            out[...] = result
            result = out
    return result


def widen(x: Any) -> Any:
    """16-bit floats widened to float32 (exact: every float16 and bfloat16 value is a float32 value)."""
    return cast(x, dtypes.float32) if dtypes.is_16bit(x.dtype) else x


def add(a: Any, b: Any) -> Any:
    """``a + b``.  For two float16 arrays this is widen, add in float32, round once, as NumPy does."""
    result = _faster("add", a, b)
    return a + b if result is NotImplemented else result


def relu(x: Any) -> Any:
    """``max(x, 0)``, with +0 for -0 and every NaN kept: an overflow must reach the scaler's check."""
    result = _faster("relu", x)
    if result is NotImplemented:
        xp = get_array_module(x)
        result = xp.where((x > 0) | xp.isnan(x), x, x.dtype.type(0))
    return result


def relu_backward(g: Any, out: Any) -> Any:
    """`g` where the ReLU's output is positive, else +0 (a select, so an inf elsewhere gives 0, not NaN)."""
    result = _faster("relu_backward", g, out)
    return get_array_module(g).where(out > 0, g, g.dtype.type(0)) if result is NotImplemented else result


def product(a: Any, b: Any, out_dtype: Any, bias: Any = None) -> Any:
    """``a @ b (+ bias)`` in a model of Tensor Core numerics: FP16 x FP16 -> FP32 accumulate, rounded once.

    The product of two float16 values has at most 22 significant bits, so it is exact in
    float32 (24): widen both operands, multiply and sum in float32 (one sgemm, in its order; a
    Tensor Core's adder trees order and truncate the sums differently), add the bias to the
    float32 sums as a GPU's GEMM epilogue does, and round once to `out_dtype`.
    """
    result = _faster("product", a, b, out_dtype, bias)
    if result is NotImplemented:
        sums = widen(a) @ widen(b)
        if bias is not None and bias.dtype.itemsize <= sums.dtype.itemsize:
            sums += bias  # in place: no second array of sums
        elif bias is not None:
            sums = sums + bias  # a wider bias promotes, as a @ b + bias would
        result = cast(sums, out_dtype)
    return result


def sum_rows(x: Any) -> Any:
    """The sum of a 2-D array's rows (over axis 0) in float32 at least: a bias's gradient, summed over a batch."""
    result = _faster("sum_rows", x)
    return x.sum(axis=0, dtype=dtypes.accumulation_dtype(x.dtype)) if result is NotImplemented else result


def scatter_add(target: Any, index: Any, values: Any) -> None:
    """``target[index] += values``, where an index that repeats adds every one of its values."""
    if _faster("scatter_add", target, index, values) is NotImplemented:
        get_array_module(target).add.at(target, index, values)


def multiply_and_sum_squares_(g: Any, factor: float) -> Any:
    """``g *= factor`` in place (unscaling: factor 1/S; clipping), then sum(g^2) as a 0-d float64 array.

    The product is computed in float32 at least and rounded once into g's dtype.  For
    1/S with S a power of two it only shifts exponents: exact, unless a result overflows or
    falls among the subnormals.  The sum is inf or NaN when g is not finite: the overflow check.
    """
    result = _faster("multiply_and_sum_squares_", g, factor)
    if result is NotImplemented:
        compute = dtypes.accumulation_dtype(g.dtype)
        if factor != 1.0:
            with np.errstate(over="ignore", invalid="ignore"):  # an inf made here is reported by the check
                if compute == g.dtype:
                    g *= compute.type(factor)
                else:
                    cast(cast(g, compute) * compute.type(factor), g.dtype, out=g)
        result = sum_of_squares(g)
    return result


def sum_of_squares(g: Any) -> Any:
    """sum(g^2) as a 0-d float64 array on g's device (the global gradient norm is built from these).

    Summed in float64, where a float32 square is exact, a piece of 65536 values at a time (a
    cache-sized copy, not one of the whole gradient).  The engine room may sum float32 rows in
    float32 first, within a bound its docstring states (tinyamp/engine/fast/sums.py).
    """
    result = _faster("sum_of_squares", g)
    if result is NotImplemented:
        xp, flat, result = get_array_module(g), g.ravel(), get_array_module(g).zeros((), np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            for start in range(0, flat.size, 1 << 16):
                piece = flat[start : start + (1 << 16)].astype(np.float64)
                result += xp.dot(piece, piece)
    return result


KERNELS = (
    "cast", "add", "relu", "relu_backward", "gelu", "gelu_backward", "softmax", "softmax_backward", "layer_norm",
    "layer_norm_backward", "cross_entropy", "cross_entropy_backward", "product", "sum_rows", "scatter_add",
    "multiply_and_sum_squares_", "sum_of_squares", "scaled_step", "check_in_range", "fp8_encode", "fp8_amax",
    "fp8_scaled_cast", "fp8_block_quantize", "fp8_matmul",
)  # fmt: skip
