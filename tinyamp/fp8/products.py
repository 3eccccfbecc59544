"""FP8 products: FP8 inputs, exact products, sums in FP32, the output scaled back; and what a narrower accumulator does
to a long sum, with the promotion to FP32 that repairs it.

An E4M3 value has at most 4 significant bits and an E5M2 value 3, so the product of two has at most 8: exact in
float32, whose significand has 24, and inside its normal range (from 2^-16 * 2^-16 = 2^-32 up to 57344^2, about
3.3e9).  Decoding is exact too, so with float32 sums (the default) the only roundings are the additions, as in the FP16
Tensor Core contract, and the scaling back: times float32(1 / scale) of each input, the ``scale_inv`` values
Transformer Engine hands the GEMM (exact for powers of two, short of overflow and underflow).

**Limited accumulation.**  DeepSeek-V3 (2024, section 3.3) reports that Hopper's FP8 Tensor Cores keep about 14 bits
while accumulating, and promotes each partial sum to FP32 every 128 products.  The model here: the partial sum keeps
`accumulator_bits` significant bits, rounded after every product is added (the addition itself in float64, exact while
the two magnitudes lie within about 2^29 of each other); every `promote_every` products it is added to a float32 total
and restarts from 0.  ``rounding="toward_zero"`` truncates, as Fasi et al. (2021) measured earlier Tensor Cores doing
when they align and add; ``"nearest"`` is the alternative to compare.  It is a model of the effect, not of the
circuit.
"""

from __future__ import annotations

import numpy as np

from tinyamp.fp8 import scaling_checks
from tinyamp.fp8.formats import decode
from tinyamp.fp8.scaling import Fp8Tensor


def fp8_matmul(
    a: Fp8Tensor,
    b: Fp8Tensor,
    accumulator_bits: int | None = None,
    promote_every: int | None = None,
    rounding: str = "toward_zero",
) -> np.ndarray:
    """(M, K) @ (K, N) of two FP8 tensors, float32 out: exact products, summed in float32, scaled back.

    ``accumulator_bits`` (1 to 24) replaces the float32 sum by the limited accumulator of the
    module docstring, promoted to float32 every ``promote_every`` products (None: only at the end).
    """
    scaling_checks.check_product(a.bits.shape, b.bits.shape, accumulator_bits, promote_every, rounding)
    x, y = decode(a.bits, a.fmt), decode(b.bits, b.fmt)  # exact
    if accumulator_bits is None:
        total = np.matmul(x, y)  # float32: every product exact, every sum rounded to float32
    else:
        total = limited_accumulation(x, y, accumulator_bits, promote_every or x.shape[1], rounding)
    return total * (np.float32(1.0) / np.float32(a.scale)) * (np.float32(1.0) / np.float32(b.scale))


def keep_bits(s: np.ndarray, bits: int, rounding: str) -> np.ndarray:
    """`s` (float64) kept to `bits` significant bits: s = f * 2^e, 1/2 <= |f| < 1, f to a multiple of 2^-bits."""
    f, e = np.frexp(s)
    whole = np.trunc(f * 2.0**bits) if rounding == "toward_zero" else np.rint(f * 2.0**bits)  # rint: ties to even
    return np.ldexp(whole, e - bits)


def limited_accumulation(x: np.ndarray, y: np.ndarray, bits: int, promote_every: int, rounding: str) -> np.ndarray:
    """x @ y (float32 values with exact products) through a `bits`-bit accumulator, promoted to float32."""
    total = np.zeros((x.shape[0], y.shape[1]), dtype=np.float32)  # the FP32 registers
    partial = np.zeros(total.shape)  # the Tensor Core's accumulator
    for k in range(x.shape[1]):
        product = np.multiply.outer(x[:, k].astype(np.float64), y[k].astype(np.float64))  # exact
        partial = keep_bits(partial + product, bits, rounding)
        if (k + 1) % promote_every == 0 or k + 1 == x.shape[1]:
            total += partial.astype(np.float32)  # exact conversion (bits <= 24), one float32 rounding in the sum
            partial[:] = 0.0
    return total
