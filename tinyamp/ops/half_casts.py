"""float16 <-> float32 conversion written with integer ops that NumPy vectorizes.

Why this file exists.  NumPy converts between float16 and float32 one element at a
time, in a C function full of branches (zero? subnormal? inf?).  On a CPU that is the
whole cost of mixed precision: measured here, 1.8 ns per element to float16 and 0.9 ns
back on dense data, but 4 ns back when half the values are zeros (a ReLU's output or its
gradient: the zero/non-zero branch is mispredicted half the time), and 60 ns per element
to float16 when the values are float16 subnormals.  The same conversions written as a
few whole-array integer operations have no branches, so their cost does not depend on
the data, and they teach how the formats are laid out:

    float32:  s eeeeeeee mmmmmmmmmmmmmmmmmmmmmmm   (bias 127, 23 mantissa bits)
    float16:  s    eeeee mmmmmmmmmm                 (bias 15,  10 mantissa bits)

Widening (exact).  Shift the 15 magnitude bits of a float16 left by 13 so that its
exponent and mantissa fields land on float32's; read as a float32 that is the value times
2^-112 (the bias difference, 127 - 15), for normal *and* subnormal float16 values alike,
so one exact float32 multiply by 2^112 finishes the job.  The sign comes along for free:
widening the bits as int16 -> int32 copies the sign into bits 16-31, the shift by 13
moves one copy to bit 31, and a mask clears the others (bits 28-30).

Rounding (to nearest, ties to even).  Let the hardware do it: add to |x| a power of two
so large that the sum's ulp is float16's ulp at |x|, and float32 addition rounds |x| to
the nearest even float16 value.  For |x| = 2^E * 1.f with E >= -14 (a float16 normal) the
float16 ulp is 2^(E-10), and the ulp of a float32 near 2^(E+13) is 2^(E+13-23): the same.
For smaller |x| (float16 subnormals are the multiples of 2^-24) the power stops at 2^-1,
whose float32 ulp is 2^-24.  The sum's bits then hold the answer: its mantissa field is
the rounded |x| in float16 ulps (M, at most 2^11, implicit bit included) and its
exponent field is E + 140 (or 126 for a subnormal).  Shifting the exponent down by 13
and adding M puts the exponent on float16's exponent field (the implicit bit of M adds
the 1 that float16's bias needs; a mantissa that rounded up to 2^11 carries into the
exponent, as it should); subtracting 126 << 10 rebiases.  One formula covers normals,
subnormals and zero, with no data-dependent branch (the same idea as the FP16 library's
``fp16_ieee_from_fp32_value``).

Values these tricks do not cover (a float16 inf or NaN to widen; |x| >= 65520, which
rounds to inf, or inf or NaN to round) are rare, so a block that holds one is simply
converted by NumPy, which also raises NumPy's usual overflow warning.  Both functions
return exactly the bits ``astype`` returns (tested on every float16 bit pattern and on
every rounding boundary).

The arrays are processed in blocks of 2^16 elements so that the dozen passes over a
block stay in the CPU's cache (smaller blocks pay more Python-level calls per element).

Two implementations.  Those passes are the floor for NumPy, about 1.1 to 1.6 ns per
element to round and 0.3 to 0.5 to widen.  When numba is installed (``pip install
"tinyamp[fast]"``) the same formulas run as compiled loops over single elements
(half_casts_numba.py), at 0.1 to 0.2 ns, with the same bits.  ``active_kernels()`` says
which one runs; ``set_kernels`` / ``kernels`` (a context manager) or the environment
variable ``TINYAMP_CAST_KERNELS=numpy`` choose.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

_U16, _I16, _U32, _I32 = (np.dtype(t) for t in (np.uint16, np.int16, np.uint32, np.int32))
_F16, _F32 = np.dtype(np.float16), np.dtype(np.float32)
BLOCK = 1 << 16  # elements per block: 256 KiB of uint32, cache-resident
SMALL = 1 << 12  # below this size NumPy's own cast is faster than our Python-level passes

_F16_INF_BITS = 0x7C00  # float16 magnitude bits >= this: inf or NaN
_ROUNDS_TO_INF = 0x477FF000  # float32 bits of 65520 = 65504 + half an ulp: the tie rounds to inf
_EXPONENT_FIELD = 0x7F800000  # float32's 8 exponent bits
_TO_FLOAT16_ULP = 13 << 23  # added to the exponent field: 2^E -> 2^(E+13)
_SUBNORMAL_MAGIC = 126 << 23  # float32 bits of 2^-1, whose ulp is 2^-24 (the float16 subnormal quantum)
_MANTISSA_WITH_CARRY = 0x1FFF  # M <= 2^11 sits in the low 13 bits of the sum
_REBIAS = 126 << 10  # (E + 140 + 1) << 10 minus this is float16's (E + 15) << 10
_KEEP_SIGN_AND_MAGNITUDE = np.int32(-0x70000001)  # 0x8FFFFFFF as int32


# ---- which implementation runs the casts --------------------------------------------------------
KERNELS = ("numba", "numpy")
_active: str | None = None  # decided at the first large cast, so that `import tinyamp` never imports numba
_compiled: Any = None  # the half_casts_numba module, once loaded
_why_numpy = ""  # why the compiled loops are not in use, for ``tinyamp info``


def _load_compiled() -> Any:
    """Import half_casts_numba (and numba); ImportError with the reason when that cannot work."""
    global _compiled
    if _compiled is None:
        try:
            import numba
        except Exception as e:  # not installed, or a release that does not fit this NumPy
            raise ImportError(f'numba cannot be imported ({e}); pip install "tinyamp[fast]"') from e
        if numba.config.DISABLE_JIT:
            raise ImportError("NUMBA_DISABLE_JIT is set: the loops would run as plain Python")
        from tinyamp.ops import half_casts_numba

        _compiled = half_casts_numba
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


def astype(x: Any, dtype: Any) -> Any:
    """``x.astype(dtype, copy=False)``, the same bits, through the functions below when they apply.

    The one call every backward pass uses to move a 16-bit gradient to or from float32:
    NumPy's own cast costs 5 to 60 ns per element on the small and subnormal values
    gradients are made of, these about 1 (see the module docstring).
    """
    if fast_cast_applies(x, dtype):
        return widen_float16(x) if x.dtype.itemsize == 2 else round_to_float16(x)
    return x.astype(dtype, copy=False)


def half_arithmetic(op: Any, a: Any, b: Any) -> Any:
    """``op(a, b)`` for ``op`` one of ``operator.add``, ``sub``, ``mul``, ``truediv``; for two
    large float16 NumPy arrays computed as NumPy's own float16 loop computes it, with the
    casts above.

    NumPy's float16 loop widens both operands to float32, applies the float32 operation
    and rounds the result to float16, one element at a time; doing the same three steps
    as whole-array passes gives the same bits (the double rounding, float32 then float16,
    never differs from one correct rounding: float32 carries 24 >= 2 * 11 + 2 bits).
    Anything else (float32, a Python scalar, small or CuPy arrays) is plain ``op(a, b)``.
    """
    # `is`: NumPy's built-in dtypes are singletons, and this runs on every add of a graph
    if getattr(a, "dtype", None) is _F16 and getattr(b, "dtype", None) is _F16 and type(a) is type(b) is np.ndarray:
        if a.size >= SMALL or b.size >= SMALL:
            return astype(op(astype(a, _F32), astype(b, _F32)), _F16)
    return op(a, b)


def _check_out(out: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> None:
    # Both implementations write through a flat view of `out`; of a strided array that
    # would be a copy, and the result would silently go nowhere.
    if out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(
            f"out must be a C-contiguous {dtype} array of shape {shape}; got {out.dtype} {out.shape}"
            f"{'' if out.flags.c_contiguous else ', not contiguous'}"
        )


def widen_float16(h: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float16 array -> float32, exactly (bit-identical to ``h.astype(np.float32)``).

    `out`, when given, must be a C-contiguous float32 array of h's shape.
    """
    if out is None:
        out = np.empty(h.shape, _F32)
    _check_out(out, h.shape, _F32)
    if active_kernels() == "numba":
        return _compiled.widen_float16(h, out)
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
        if s16.max() >= _F16_INF_BITS or unsigned16[start:stop].max() >= 0x8000 | _F16_INF_BITS:
            out32[start:stop] = flat[start:stop].astype(_F32).view(_I32)
            continue
        np.left_shift(s16, 13, out=w, dtype=_I32)  # as int32 (sign copied into bits 16-31), shifted:
        # the magnitude lands on float32's exponent and mantissa fields, a sign copy on bit 31
        np.bitwise_and(w, _KEEP_SIGN_AND_MAGNITUDE, out=w)  # clear bits 28-30, keep the sign in bit 31
        np.multiply(w.view(_F32), np.float32(2.0**112), out=out32[start:stop].view(_F32))  # exact: a power of 2
    return out


def round_to_float16(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 array -> float16, round to nearest even (bit-identical to ``x.astype(np.float16)``).

    `out`, when given, must be a C-contiguous float16 array of x's shape.
    """
    if out is None:
        out = np.empty(x.shape, _F16)
    _check_out(out, x.shape, _F16)
    if active_kernels() == "numba":
        return _compiled.round_to_float16(x, out)
    bits32, bits16 = x.reshape(-1).view(_U32), out.reshape(-1).view(_U16)
    n = bits32.size
    size = min(n, BLOCK)
    mag, total, sign = np.empty(size, _U32), np.empty(size, _U32), np.empty(size, _U32)
    for start in range(0, n, BLOCK):
        stop = min(start + BLOCK, n)
        k = stop - start
        b, m, t, s = bits32[start:stop], mag[:k], total[:k], sign[:k]
        np.bitwise_and(b, 0x7FFFFFFF, out=m)  # |x|
        if m.max() >= _ROUNDS_TO_INF:  # overflow, inf or NaN here: NumPy's cast, with its warning
            bits16[start:stop] = x.reshape(-1)[start:stop].astype(_F16).view(_U16)
            continue
        np.bitwise_and(m, _EXPONENT_FIELD, out=t)  # 2^E, the power of two at or below |x|
        np.add(t, _TO_FLOAT16_ULP, out=t)  # 2^(E+13): its float32 ulp is float16's ulp at |x|
        np.maximum(t, _SUBNORMAL_MAGIC, out=t)  # at least 2^-1: ulp 2^-24 below float16's normals
        np.add(m.view(_F32), t.view(_F32), out=t.view(_F32))  # the hardware rounds |x| to nearest even
        np.right_shift(t, 13, out=m)  # the sum's exponent field onto float16's
        np.bitwise_and(t, _MANTISSA_WITH_CARRY, out=t)  # M: |x| in float16 ulps
        np.add(m, t, out=m)
        np.right_shift(b, 16, out=s)
        np.bitwise_and(s, 0x8000, out=s)  # the sign, moved to bit 15
        np.add(m, s, out=m)
        np.subtract(m, _REBIAS, out=m)  # float16's exponent bias; bits 16-31 end at 0 (mod 2^32)
        bits16[start:stop] = m  # uint32 -> uint16: every value fits
    return out
