"""Rounding float32 to float16 with one float32 addition, and widening float16 back exactly.

    float32:  s eeeeeeee mmmmmmmmmmmmmmmmmmmmmmm   (bias 127, 23 mantissa bits)
    float16:  s    eeeee mmmmmmmmmm                 (bias 15,  10 mantissa bits)

**Rounding** (to nearest, ties to even) lets float32 addition do the work.  Add to |x| a
power of two P so large that the sum's ulp is float16's ulp at |x|: float32 then rounds
|x| to the nearest float16 value, ties to even, as IEEE 754 addition always does.  For
|x| = 2^E * 1.f with E >= -14 (a float16 normal) the float16 ulp is 2^(E-10), and the
float32 ulp near P = 2^(E+13) is 2^(E+13-23): the same.  Below float16's normals (the
subnormals are the multiples of 2^-24) P stops at 2^-1, whose float32 ulp is 2^-24.

The sum's bits then hold the answer: its low 13 bits are M, the rounded |x| in float16
ulps (implicit bit included, at most 2^11), and shifting the sum right by 13 moves its
exponent field onto float16's; adding the two and subtracting 126 << 10 rebiases.  A
mantissa that rounded up to 2^11 carries into the exponent, as it should.  One formula
covers normals, subnormals and zero, with no branch (the FP16 library's
``fp16_ieee_from_fp32_value`` uses the same idea).

**Widening** is exact.  Shift the 15 magnitude bits of a float16 left by 13: its exponent
and mantissa fields land on float32's, and read as a float32 the value is 2^-112 times too
small (the bias difference 127 - 15), for normal and subnormal values alike; one exact
multiplication by 2^112 finishes.

Values the formulas do not cover (|x| >= 65520, which rounds to inf, and inf or NaN) are
converted by NumPy, which also warns on overflow.  Both functions return exactly the bits
of NumPy's ``astype`` (tests/test_rounding.py checks every float16 and every rounding
boundary).  They are the reference for ``tinyamp.kernels.cast``; the engine room
(``tinyamp/engine/fast/``) runs the same formulas in cache-sized blocks or compiled.
"""

from __future__ import annotations

import numpy as np

ROUNDS_TO_INF = 0x477FF000  # float32 bits of 65520 = 65504 + half an ulp: the tie rounds to inf
EXPONENT_FIELD = 0x7F800000  # float32's 8 exponent bits
TO_FLOAT16_ULP = 13 << 23  # added to the exponent field: 2^E -> 2^(E+13)
SUBNORMAL_MAGIC = 126 << 23  # float32 bits of 2^-1, whose ulp is 2^-24 (float16's subnormal spacing)
MANTISSA_WITH_CARRY = 0x1FFF  # M <= 2^11 sits in the low 13 bits of the sum
REBIAS = 126 << 10  # (E + 140 + 1) << 10 minus this is float16's (E + 15) << 10
FLOAT16_INF_BITS = 0x7C00  # float16 magnitude bits at or above this: inf or NaN
KEEP_SIGN_AND_MAGNITUDE = np.int32(-0x70000001)  # 0x8FFFFFFF as int32: clears bits 28-30


def round_to_float16(x: np.ndarray) -> np.ndarray:
    """float32 array -> float16, to nearest even, through one float32 addition per element."""
    shape, x = x.shape, x.reshape(-1)  # 1-D: NumPy's arithmetic on a 0-d array would return a scalar
    bits = x.view(np.uint32)
    magnitude = bits & 0x7FFFFFFF
    power = np.maximum((magnitude & EXPONENT_FIELD) + TO_FLOAT16_ULP, SUBNORMAL_MAGIC)  # P, as bits
    with np.errstate(all="ignore"):  # the lanes of |x| >= 65520 compute garbage, replaced below
        total = (magnitude.view(np.float32) + power.view(np.float32)).view(np.uint32)  # the rounding
    sign = (bits >> 16) & 0x8000
    half = (total >> 13) + (total & MANTISSA_WITH_CARRY) + sign - REBIAS
    out = half.astype(np.uint16).view(np.float16)
    special = magnitude >= ROUNDS_TO_INF  # overflow, inf, NaN
    if special.any():
        out[special] = x[special].astype(np.float16)
    return out.reshape(shape)


def widen_float16(h: np.ndarray) -> np.ndarray:
    """float16 array -> float32, exactly: a shift, a mask and one multiplication by 2^112."""
    shape, h = h.shape, h.reshape(-1)  # 1-D: NumPy's arithmetic on a 0-d array would return a scalar
    # As int32 the sign is copied into bits 16-31; after the shift one copy sits on bit 31
    # (float32's sign) and the mask clears the others (bits 28-30).
    bits = (h.view(np.int16).astype(np.int32) << 13) & KEEP_SIGN_AND_MAGNITUDE
    out = bits.view(np.float32) * np.float32(2.0**112)  # exact: a power of two
    special = (h.view(np.uint16) & 0x7FFF) >= FLOAT16_INF_BITS  # inf, NaN
    if special.any():
        out[special] = h[special].astype(np.float32)
    return out.reshape(shape)
