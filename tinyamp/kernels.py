"""The array kernels of mixed precision in reference form, and the one door to the engine room.

Ops, optimizers and the loss scaler do the array work that needs more than NumPy's own
operators here: casts between float widths, the 16-bit add, ReLU, the Tensor Core product,
sums of rows, scatter-adds, unscaling.  Each body is the reference, written to be read (GELU,
softmax, layer norm and cross-entropy keep theirs beside their ops, and come here by ``call``).

The engine room gives the same bits faster, or on a GPU: ``tinyamp.fast`` and
``tinyamp.cuda`` ``register`` implementations under a kernel's name (``tinyamp/__init__.py``
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


def multiply_(g: Any, factor: float) -> Any:
    """``g *= factor`` in place (unscaling: factor 1/S); returns sum(g^2) as a 0-d float64 array.

    The product is computed in float32 at least and rounded once into g's dtype.  For
    1/S with S a power of two it only shifts exponents: exact, unless a result overflows or
    falls among the subnormals.  The sum is inf or NaN when g is not finite: the overflow check.
    """
    result = _faster("multiply_", g, factor)
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


def step_on_device(optimizer: Any, inverse_scale: float) -> Any:
    """A whole loss-scaler step where the gradients are (cuda/scaler_step.py): unscale, check, update or skip.

    No reference body: on the host ``LossScaler.step`` does it.  Returns ``({name: not finite}, [sums of squares])``."""
    return _faster("step_on_device", optimizer, inverse_scale)


_ROW = 1 << 10  # float32 values summed per BLAS dot
_CHUNK = 1 << 16  # float64 values per piece: a cache-sized copy, not one of the whole gradient


def sum_of_squares(g: Any) -> Any:
    """sum(g^2) as a 0-d float64 array on g's device (the global gradient norm is built from these).

    Summed in float64, where a float32 square is exact; but a large float32 gradient is cut
    into rows of 1024 values, whose squares one float32 BLAS dot sums without widening them
    (each row's sum off by at most about 1024 * 2^-24 = 6e-5 of itself; PyTorch sums whole
    tensors in float32), and only the rows are added in float64.  A total that is not finite
    is summed again in float64: a finite gradient never reports an infinite norm.
    """
    result = _faster("sum_of_squares", g)
    if result is not NotImplemented:
        return result
    xp, flat = get_array_module(g), g.ravel()
    with np.errstate(over="ignore", invalid="ignore"):
        if flat.dtype == np.float32 and flat.size > _CHUNK and xp is np:
            whole = flat.size - flat.size % _ROW
            rows, tail = flat[:whole].reshape(-1, _ROW), flat[whole:].astype(np.float64)
            total = np.vecdot(rows, rows).sum(dtype=np.float64) + np.dot(tail, tail)
            if np.isfinite(total):
                return total
        total = xp.zeros((), np.float64)
        for start in range(0, flat.size, _CHUNK):
            piece = flat[start : start + _CHUNK].astype(np.float64)
            total += xp.dot(piece, piece)
        return total


KERNELS = (
    "cast", "add", "relu", "relu_backward", "gelu", "gelu_backward", "softmax", "softmax_backward", "layer_norm",
    "layer_norm_backward", "cross_entropy", "cross_entropy_backward", "product", "sum_rows", "scatter_add",
    "multiply_", "sum_of_squares", "step_on_device",
)  # fmt: skip
