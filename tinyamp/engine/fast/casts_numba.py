"""Engine room: the two casts of casts.py as compiled loops, with numba (``pip install "tinyamp[fast]"``).

casts.py runs each formula of ``tinyamp/rounding.py`` as a dozen whole-array passes, and
every pass is its own trip through memory.  Here the same arithmetic is written for one
element, and numba compiles the loop: each element stays in registers through all the
steps, and the compiler vectorizes the loop.  The results are the same bits (tested
against NumPy's ``astype`` on every float16 pattern and every rounding boundary);
``benchmarks/cast_speed.py`` measures the speed.

Each loop also notes whether any element needs NumPy's own cast (a float16 inf or NaN to
widen; an |x| that rounds to inf, or an inf or NaN, to round); the caller then converts
the whole array with NumPy, which keeps NaN payloads and raises NumPy's overflow warning.

This module imports numba, so casts.py imports it only at the first large cast, not at
``import tinyamp``.  numba compiles each loop on its first call and keeps the machine code
in its on-disk cache for the next runs.
"""

from __future__ import annotations

import numba
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

_U32 = np.uint32
_TWO_TO_112 = np.float32(2.0**112)


def _compile(fn):  # type: ignore[no-untyped-def]
    """numba.njit with the on-disk cache when there is somewhere to keep it."""
    try:
        return numba.njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # no writable cache directory: compile in every process instead
        return numba.njit(nogil=True)(fn)


# numba computes with 64-bit integers unless told otherwise: the np.uint32(...) below keep
# each value 32 bits wide, as the float32 bit patterns they are (and ``view`` needs that).
# Each function makes two passes: the largest magnitude first (a loop the compiler turns
# into a vector max), then the conversion, which then has no branch for the rare cases.


@_compile
def round_bits(bits32: np.ndarray, bits16: np.ndarray) -> bool:  # pragma: no cover - compiled by numba
    """float32 bit patterns -> float16 bit patterns, to nearest even; True if some element needs NumPy."""
    largest = _U32(0)
    for i in range(bits32.size):
        largest = max(largest, _U32(bits32[i] & _U32(0x7FFFFFFF)))
    for i in range(bits32.size):
        x = bits32[i]
        magnitude = _U32(x & _U32(0x7FFFFFFF))  # |x|
        # 2^(E+13), at least 2^-1: its float32 ulp is float16's ulp at |x|
        power = _U32(max(_U32((magnitude & _U32(EXPONENT_FIELD)) + _U32(TO_FLOAT16_ULP)), _U32(SUBNORMAL_MAGIC)))
        # float32 addition rounds |x| to that ulp, to nearest even
        total = np.float32(magnitude.view(np.float32) + power.view(np.float32)).view(np.uint32)
        # the exponent field onto float16's, plus M (|x| in float16 ulps), plus the sign, rebiased
        sign = (x >> _U32(16)) & _U32(0x8000)
        bits16[i] = np.uint16((total >> _U32(13)) + (total & _U32(MANTISSA_WITH_CARRY)) + sign - _U32(REBIAS))
    return largest >= _U32(ROUNDS_TO_INF)  # overflow, inf or NaN somewhere: NumPy's cast


@_compile
def widen_bits(bits16: np.ndarray, out: np.ndarray) -> bool:  # pragma: no cover - compiled by numba
    """float16 bit patterns (as int16) -> float32 values, exactly; True if some element needs NumPy."""
    largest = np.int32(0)
    for i in range(bits16.size):
        largest = max(largest, np.int32(bits16[i] & 0x7FFF))
    for i in range(bits16.size):
        # as int32 (the sign copied into bits 16-31), shifted by 13: the magnitude lands on
        # float32's exponent and mantissa fields; clear bits 28-30, keep the sign in bit 31
        w = np.int32((np.int32(bits16[i]) << 13) & KEEP_SIGN_AND_MAGNITUDE)
        out[i] = w.view(np.float32) * _TWO_TO_112  # exact: a power of two
    return largest >= FLOAT16_INF_BITS  # inf or NaN somewhere: NumPy's cast keeps NaN payloads


def round_to_float16(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Write ``x.astype(float16)`` into the contiguous array `out`: the compiled loop, or NumPy for specials."""
    if round_bits(x.reshape(-1).view(np.uint32), out.reshape(-1).view(np.uint16)):
        out[...] = x.astype(np.float16)
    return out


def widen_float16(h: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Write ``h.astype(float32)`` into the contiguous array `out`: the compiled loop, or NumPy for specials."""
    if widen_bits(h.reshape(-1).view(np.int16), out.reshape(-1)):
        out[...] = h.astype(np.float32)
    return out
