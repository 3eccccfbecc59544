"""Engine room: float16 <-> float32 conversions fast enough for a training step on a CPU.

NumPy converts between float16 and float32 one element at a time, in a C function that
branches on zero, subnormal and inf; on a CPU that is most of the extra cost of mixed
precision, and it depends on the data (ReLU outputs, half zeros, and subnormal gradients
are the slow cases).  The formulas of ``tinyamp/rounding.py`` have no branches.  Here they
run on blocks of 2^16 elements (so that their dozen passes stay in the CPU's cache, with
no allocation per pass), or, with numba installed (``pip install "tinyamp[fast]"``), as
compiled loops over single elements (casts_numba.py).  ``benchmarks/cast_speed.py``
measures all three against ``astype``; tests/engine_room checks them against it, bit for bit.

``active_kernels()`` says which of the two runs; ``set_kernels`` / ``kernels`` (a context
manager) or the environment variable ``TINYAMP_CAST_KERNELS=numpy`` choose.  ``cast`` and
``add`` are what ``tinyamp.engine.fast.register()`` puts behind ``tinyamp.kernels``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from tinyamp.rounding import (
    EXPONENT_FIELD,
    FLOAT16_INF_BITS,
    KEEP_SIGN_AND_MAGNITUDE,
    MANTISSA_WITH_CARRY,
    REBIAS,
    ROUNDS_TO_INF,
    SUBNORMAL_MAGIC,
    TO_FLOAT16_ULP,
)

_U16, _I16, _U32, _I32 = (np.dtype(t) for t in (np.uint16, np.int16, np.uint32, np.int32))
_F16, _F32 = np.dtype(np.float16), np.dtype(np.float32)
BLOCK = 1 << 16  # elements per block: 256 KiB of uint32, cache-resident
SMALL = 1 << 12  # below this size NumPy's own cast is faster than our Python-level passes


# ---- which implementation runs the casts --------------------------------------------------------
KERNELS = ("numba", "numpy")
_active: str | None = None  # decided at the first large cast, so that `import tinyamp` never imports numba
_compiled: Any = None  # the casts_numba module, once loaded
_why_numpy = ""  # why the compiled loops are not in use, for ``tinyamp info``


def _load_compiled() -> Any:
    """Import casts_numba (and numba); ImportError with the reason when that cannot work."""
    global _compiled
    if _compiled is None:
        try:
            import numba
        except Exception as e:  # not installed, or a release that does not fit this NumPy
            raise ImportError(f'numba cannot be imported ({e}); pip install "tinyamp[fast]"') from e
        if numba.config.DISABLE_JIT:
            raise ImportError("NUMBA_DISABLE_JIT is set: the loops would run as plain Python")
        from tinyamp.engine.fast import casts_numba

        _compiled = casts_numba
    return _compiled


def active_kernels() -> str:
    """What runs the large float16 <-> float32 casts: "numba" (compiled loops) or "numpy" (passes).

    By default numba when it can be imported, else NumPy; ``TINYAMP_CAST_KERNELS`` set to
    "numpy" or "numba" chooses instead.  Both give NumPy's ``astype`` bits.
    """
    global _active, _why_numpy
    if _active is None:
        wanted = os.environ.get("TINYAMP_CAST_KERNELS", "").strip().lower()
        if wanted not in ("", *KERNELS):
            raise ValueError(f"TINYAMP_CAST_KERNELS={wanted!r}: use one of {', '.join(KERNELS)} (or leave it unset)")
        if wanted == "numpy":
            _active, _why_numpy = "numpy", "TINYAMP_CAST_KERNELS=numpy"
        else:
            try:
                _load_compiled()
                _active = "numba"
            except ImportError as e:
                if wanted == "numba":
                    raise ImportError(f"TINYAMP_CAST_KERNELS=numba, but {e}") from e
                _active, _why_numpy = "numpy", str(e)
    return _active


def why_not_compiled() -> str:
    """Why the casts run as NumPy passes ("" when the compiled loops are in use)."""
    return "" if active_kernels() == "numba" else _why_numpy


def set_kernels(name: str) -> str:
    """Run the casts with `name` ("numba" or "numpy") from now on; returns the previous choice.

    "numba" raises ImportError, with the reason, when numba cannot be used.
    """
    global _active, _why_numpy
    if name not in KERNELS:
        raise ValueError(f"unknown cast kernels {name!r}; choose one of {', '.join(KERNELS)}")
    previous = active_kernels()
    if name == "numba":
        _load_compiled()
    elif _compiled is not None:  # numba works: the choice is the reason (else keep why it does not)
        _why_numpy = "chosen with set_kernels('numpy')"
    _active = name
    return previous


@contextlib.contextmanager
def kernels(name: str) -> Iterator[None]:
    """``with kernels("numpy"):`` runs the casts inside with `name`, then restores the previous choice."""
    previous = set_kernels(name)
    try:
        yield
    finally:
        set_kernels(previous)


def fast_cast_applies(x: np.ndarray, dtype: np.dtype) -> bool:
    """True when ``x.astype(dtype)`` is a float16 <-> float32 cast these functions do faster."""
    if type(x) is not np.ndarray or x.size < SMALL or not x.flags.c_contiguous:
        return False
    return (x.dtype == _F16 and dtype == _F32) or (x.dtype == _F32 and dtype == _F16)


def cast(x: Any, dtype: Any, out: Any = None) -> Any:
    """``tinyamp.kernels.cast`` for NumPy arrays (NotImplemented for others): the same bits, faster.

    Large contiguous float16 <-> float32 arrays go through the passes or the compiled loops
    below (a transposed one through its transpose); everything else through NumPy's own cast.
    """
    if type(x) is not np.ndarray:
        return NotImplemented
    if out is None and x.dtype == dtype:
        return x
    if out is not None:
        if out.shape == x.shape and out.flags.c_contiguous and fast_cast_applies(x, out.dtype):
            return (widen_float16 if x.dtype.itemsize == 2 else round_to_float16)(x, out)
        out[...] = x
        return out
    if x.ndim == 2 and not x.flags.c_contiguous and x.flags.f_contiguous:
        return cast(x.T, dtype).T  # a transposed view (a BLAS operand): cast the contiguous array under it
    if fast_cast_applies(x, dtype):
        return widen_float16(x) if x.dtype.itemsize == 2 else round_to_float16(x)
    return x.astype(dtype, copy=False)


def add(a: Any, b: Any) -> Any:
    """``tinyamp.kernels.add`` for two large float16 NumPy arrays (NotImplemented otherwise).

    NumPy's float16 loop widens both operands to float32, adds and rounds the sum to
    float16, one element at a time; the same three steps as whole-array passes give the
    same bits (and double rounding, float32 then float16, never differs from one correct
    rounding of a sum of two float16 values: float32 carries 24 >= 2 * 11 + 2 bits).
    """
    # `is`: NumPy's built-in dtypes are singletons, and this runs on every gradient sum of a graph
    if getattr(a, "dtype", None) is _F16 and getattr(b, "dtype", None) is _F16 and type(a) is type(b) is np.ndarray:
        if a.size >= SMALL or b.size >= SMALL:
            return cast(cast(a, _F32) + cast(b, _F32), _F16)
    return NotImplemented


def _checked_out(out: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A new array for the result, or the caller's `out` once it is checked to fit."""
    if out is None:
        return np.empty(shape, dtype)
    # Both implementations write through a flat view of `out`; of a strided array that
    # would be a copy, and the result would silently go nowhere.
    if out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(
            f"out must be a C-contiguous {dtype} array of shape {shape}; got {out.dtype} {out.shape}"
            f"{'' if out.flags.c_contiguous else ', not contiguous'}"
        )
    return out


def widen_float16(h: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float16 array -> float32, exactly (bit-identical to ``h.astype(np.float32)``).

    `out`, when given, must be a C-contiguous float32 array of h's shape.
    """
    out = _checked_out(out, h.shape, _F32)
    return (_compiled.widen_float16 if active_kernels() == "numba" else _widen_in_passes)(h, out)


def round_to_float16(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 array -> float16, round to nearest even (bit-identical to ``x.astype(np.float16)``).

    `out`, when given, must be a C-contiguous float16 array of x's shape.
    """
    out = _checked_out(out, x.shape, _F16)
    return (_compiled.round_to_float16 if active_kernels() == "numba" else _round_in_passes)(x, out)


def _widen_in_passes(h: np.ndarray, out: np.ndarray) -> np.ndarray:
    """widen_float16 as NumPy passes over blocks."""
    flat = h.reshape(-1)
    signed16, unsigned16, out32 = flat.view(_I16), flat.view(_U16), out.reshape(-1).view(_I32)
    n = flat.size
    wide = np.empty(min(n, BLOCK), _I32)
    for start in range(0, n, BLOCK):
        stop = min(start + BLOCK, n)
        w, s16 = wide[: stop - start], signed16[start:stop]
        # inf or NaN here?  As int16, +inf and the positive NaNs are the largest values
        # (>= 0x7C00); as uint16, -inf and the negative NaNs are (>= 0xFC00).  Two reductions,
        # no pass that writes.  NumPy's cast then keeps the NaN payloads.
        if s16.max() >= FLOAT16_INF_BITS or unsigned16[start:stop].max() >= 0x8000 | FLOAT16_INF_BITS:
            out32[start:stop] = flat[start:stop].astype(_F32).view(_I32)
            continue
        np.left_shift(s16, 13, out=w, dtype=_I32)  # as int32 (sign copied into bits 16-31), shifted:
        # the magnitude lands on float32's exponent and mantissa fields, a sign copy on bit 31
        np.bitwise_and(w, KEEP_SIGN_AND_MAGNITUDE, out=w)  # clear bits 28-30, keep the sign in bit 31
        np.multiply(w.view(_F32), np.float32(2.0**112), out=out32[start:stop].view(_F32))  # exact: a power of 2
    return out


def _round_in_passes(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """round_to_float16 as NumPy passes over blocks."""
    bits32, bits16 = x.reshape(-1).view(_U32), out.reshape(-1).view(_U16)
    n = bits32.size
    size = min(n, BLOCK)
    mag, total, sign = np.empty(size, _U32), np.empty(size, _U32), np.empty(size, _U32)
    for start in range(0, n, BLOCK):
        stop = min(start + BLOCK, n)
        k = stop - start
        b, m, t, s = bits32[start:stop], mag[:k], total[:k], sign[:k]
        np.bitwise_and(b, 0x7FFFFFFF, out=m)  # |x|
        if m.max() >= ROUNDS_TO_INF:  # overflow, inf or NaN here: NumPy's cast, with its warning
            bits16[start:stop] = x.reshape(-1)[start:stop].astype(_F16).view(_U16)
            continue
        np.bitwise_and(m, EXPONENT_FIELD, out=t)  # 2^E, the power of two at or below |x|
        np.add(t, TO_FLOAT16_ULP, out=t)  # 2^(E+13): its float32 ulp is float16's ulp at |x|
        np.maximum(t, SUBNORMAL_MAGIC, out=t)  # at least 2^-1: ulp 2^-24 below float16's normals
        np.add(m.view(_F32), t.view(_F32), out=t.view(_F32))  # the hardware rounds |x| to nearest even
        np.right_shift(t, 13, out=m)  # the sum's exponent field onto float16's
        np.bitwise_and(t, MANTISSA_WITH_CARRY, out=t)  # M: |x| in float16 ulps
        np.add(m, t, out=m)
        np.right_shift(b, 16, out=s)
        np.bitwise_and(s, 0x8000, out=s)  # the sign, moved to bit 15
        np.add(m, s, out=m)
        np.subtract(m, REBIAS, out=m)  # float16's exponent bias; bits 16-31 end at 0 (mod 2^32)
        bits16[start:stop] = m  # uint32 -> uint16: every value fits
    return out
