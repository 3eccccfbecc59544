"""Exercises 1.1 to 1.3: rounding to float16 by hand, the ulp, FP16 products (tutorials/01_number_formats.py).

Write each stub below; ``tinyamp exercises check`` grades them (``--only N.M`` for one).
"""

from __future__ import annotations

import math  # noqa: F401  (math.frexp gives the exponent of a float)

import numpy as np


def round_to_float16(x: np.ndarray) -> np.ndarray:
    """Exercise 1.1: round a float32 array to float16 (to nearest, ties to even) with one float32 addition.

    Task: return the float16 array nearest to `x` (a 1-D float32 array): bit for bit what
    ``x.astype(np.float16)`` gives (except that for a NaN any NaN will do: astype keeps its
    sign and the top 10 of its 23 mantissa bits; the grader asks for a NaN), but without
    NumPy's conversion to float16 (no ``astype(np.float16)``, no ``np.float16(v)``, no
    ``dtype=np.float16``, however spelled: the grader refuses them, and a dtype not written
    by name).  Build the float16 bits yourself and ``.view(np.float16)`` them.

    Math: adding |x| to a much larger B rounds |x| to the ulp of B.  For 2^E <= |x| < 2^(E+1)
    float16's ulp is 2^(E-10), and float32's ulp at B = 2^(E+13) is 2^(E+13-23): the same, so
    ``(|x| + B) - B``, in float32, is |x| rounded to float16 by the hardware's own round to
    nearest, ties to even.  Below 2^-14 float16's ulp stays 2^-24: there B = 2^-1.  B itself
    overflows float32 from |x| = 2^115 on (E + 13 = 128): B is inf and (|x| + B) - B is NaN,
    so do not trust those lanes (replace them, as below) or bound E (at 15) before building B.
    The bits of that float32 value r, rounded: for r >= 2^-14 shift the float32 bits right by
    13 and subtract 112 << 10 (the exponent bias 127 becomes 15); below, the bits are
    r / 2^-24.  (Appendix A1 reads them off the sum s = |x| + B instead, B not subtracted:
    (s >> 13) + (s & 0x1FFF) - (126 << 10).  The same arithmetic: s's exponent is 13 above r's,
    and its low 13 bits count r in ulps with the implicit bit, so 126 = 112 + 13 + 1.)
    Then the sign (bit 15 of float16); |x| >= 65520 (65504 plus half an ulp) gives inf
    (0x7C00), a NaN gives a NaN (0x7E00, the quiet NaN, will do).  r = 65536 comes out as 0x7C00 by itself.

    Read: tutorials/01_number_formats.py, section 3 (Rounding: to nearest, ties to even);
    tutorials/A1_inside_the_converters.py, sections 2 and 3 (FP32 to FP16 with one addition;
    reading the FP16 bits off the sum).

    Time: about 30 minutes of work once the reading is done (an estimate, for planning a lab).
    """
    raise NotImplementedError("Exercise 1.1: float32 to float16 with one float32 addition")


def float16_ulp(x: float) -> float:
    """Exercise 1.2: the ulp of `x` in float16: the gap from |x|, rounded to float16, to the next larger magnitude.

    Task: `x` is any Python float; round it to float16 first (2047.9 rounds to 2048, whose
    ulp is 2, not 1), once and directly: through float32 first is two roundings, and the
    grader tries x = 2047.5 - 2^-30, which rounds to 2047 (ulp 1) but through float32 becomes
    2047.5, a tie that goes to 2048 (ulp 2).  (np.float16(x) on a Python float rounds once.)
    Raise ValueError when it is not finite in float16 (inf, NaN, or |x| >= 65520, which
    rounds to inf).

    Math: for a normal float16 value with 2^k <= |v| < 2^(k+1) the ulp is 2^(k-10) (10 stored
    mantissa bits): it doubles at every power of two.  Below the smallest normal value 2^-14
    the subnormals are evenly spaced: the ulp is 2^-24 there, and for 0 too.

    Read: tutorials/01_number_formats.py, section 5 (The ulp, and the additions that are lost).

    Time: about 10 minutes of work once the reading is done (an estimate, for planning a lab).
    """
    raise NotImplementedError("Exercise 1.2: the ulp of a float16 value")


def fp16_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exercise 1.3: the float16 product a @ b with Tensor Core numerics: FP16 x FP16 -> FP32 sums, rounded once.

    Task: `a` (M, K) and `b` (K, N) are float16 matrices; return the float16 matrix (M, N)
    whose every entry is the float32 sum of the K products, rounded once to float16.

    Math: a float16 value has 11 significant bits, so the product of two has at most 22:
    exact in float32 (24 bits).  Widen both operands to float32 (exact), multiply and
    accumulate in float32 (one sgemm: ``@`` on float32 arrays), and round the sums to
    float16 at the end: one rounding per output, not one per product or per partial sum.
    A float16 running sum would stall: 2048 + 1 rounds back to 2048.

    Read: tutorials/01_number_formats.py, sections 6 (a product of two FP16 numbers is exact in
    FP32) and 7 (sums: accumulate in FP32, round once).

    Time: about 10 minutes of work once the reading is done (an estimate, for planning a lab).
    """
    raise NotImplementedError("Exercise 1.3: FP16 x FP16 -> FP32 products, rounded once")
