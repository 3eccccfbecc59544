"""Eight bits and fewer: E4M3, E5M2 and E2M1 by hand, each value one byte; E8M0 scales.

    float32:  s eeeeeeee mmmmmmmmmmmmmmmmmmmmmmm   (bias 127)
    E4M3:     s     eeee mmm    (bias 7;  no infinity; NaN only at s.1111.111; largest 448)
    E5M2:     s    eeeee mm     (bias 15; IEEE-like: infinities at s.11111.00; largest 57344)
    E2M1:     s       ee m      (bias 1;  FP4, no infinity, no NaN: 0, 0.5, 1, 1.5, 2, 3, 4, 6)

**Rounding** is ``tinyamp/rounding.py``'s for FP16 with other constants.  This paragraph assumes appendix A1
(``tutorials/A1_inside_the_converters.py``, sections 2 and 3), which works the trick through for FP16, one number at a
time; read it first.  Add to |x| a power of two P whose float32 ulp is the format's ulp at |x|: float32 addition then
rounds |x| to the format, to nearest with ties to even.  Normal |x| = 2^E * 1.f has ulp 2^(E-m) (m mantissa bits), the
float32 ulp at P = 2^(E+23-m); below the smallest normal 2^(1-bias) the spacing stays 2^(1-bias-m), so P stops at
2^(1-bias-m+23).  The sum's low 23-m bits then hold M, the rounded |x| in format ulps (implicit bit included; a carry
into the exponent is M = 2^(m+1)), and shifting the sum right by 23-m lays its exponent onto the format's; one
subtraction rebiases.  One formula for normals, subnormals and zero, as for FP16.

**Saturation.**  The recipes cast with saturation (CUDA's ``__NV_SATFINITE``): clip |x| to the largest finite value
first, then round, so 465 becomes 448 in E4M3 and infinity becomes the largest value; NaN stays NaN.  ml_dtypes' FP8
casts do not saturate: 465 becomes NaN in ``float8_e4m3fn`` and 61440 infinity in ``float8_e5m2``; its
``float4_e2m1fn``, with neither, does (7 and infinity become 6) and casts NaN to a zero, where ``encode`` refuses it
(tests/test_fp8_formats.py).

**One byte per value.**  NumPy has no 8-bit float, so an encoded tensor is a ``uint8`` array of bit patterns (E2M1 uses
the low 4 bits of each byte): ``nbytes`` counts one byte a value, as a float16 activation counts two, with no
dependency; ``bits.view(ml_dtypes.float8_e4m3fn)`` reads the same bytes as ml_dtypes' type.  **Decoding** is exact: the
magnitude bits shifted onto float32's fields read 2^(127-bias) too small, normal and subnormal alike, and one
multiplication by that power of two finishes; the table of all 256 (or 16) values is the decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

SIGN_AND_MAGNITUDE = 0x7FFFFFFF
EXPONENT_FIELD = 0x7F800000  # float32's 8 exponent bits


@dataclass(frozen=True)
class Minifloat:
    """A floating-point format of 1 sign, `exponent_bits` and `mantissa_bits` bits; `specials`
    is "fn" (NaN only at the all-ones pattern), "ieee" (infinities and NaNs at the top exponent) or "none"."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    specials: str

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @cached_property
    def values(self) -> np.ndarray:
        """The float32 value of every bit pattern, indexed by the pattern: the decoder."""
        codes = np.arange(2**self.bits, dtype=np.uint32)
        magnitude, top = codes & (2 ** (self.bits - 1) - 1), 2 ** (self.bits - 1) - 1
        laid = (magnitude << (23 - self.mantissa_bits)) | ((codes >> (self.bits - 1)) << 31)
        out = laid.view(np.float32) * np.float32(2.0 ** (127 - self.bias))  # exact: a power of two
        if self.specials == "fn":
            out[magnitude == top] = np.copysign(np.float32(np.nan), out[magnitude == top])
        elif self.specials == "ieee":
            top_exponent = magnitude >> self.mantissa_bits == 2**self.exponent_bits - 1
            inf = top_exponent & (magnitude & (2**self.mantissa_bits - 1) == 0)
            out[top_exponent & ~inf] = np.copysign(np.float32(np.nan), out[top_exponent & ~inf])
            out[inf] = np.copysign(np.float32(np.inf), out[inf])
        out.flags.writeable = False  # shared by every decode
        return out

    @cached_property
    def max(self) -> float:
        """The largest finite value, read from the table: 448, 57344, 6."""
        return float(np.max(self.values[np.isfinite(self.values)]))

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    @property
    def nan_bits(self) -> int:
        """The positive NaN pattern (E4M3: 0x7F; E5M2: 0x7E, the quiet NaN ml_dtypes writes)."""
        return {"fn": 0x7F, "ieee": 0x7E}[self.specials]


E4M3 = Minifloat("E4M3", 4, 3, "fn")
E5M2 = Minifloat("E5M2", 5, 2, "ieee")
E2M1 = Minifloat("E2M1", 2, 1, "none")
FORMATS = {f.name: f for f in (E4M3, E5M2, E2M1)}


def get_format(name: str | Minifloat) -> Minifloat:
    """The format called `name` ("E4M3", "E5M2" or "E2M1", any case)."""
    if isinstance(name, Minifloat):
        return name
    if not isinstance(name, str) or name.upper() not in FORMATS:
        raise ValueError(f"unknown FP8/FP4 format {name!r}; use one of {', '.join(FORMATS)}")
    return FORMATS[name.upper()]


def encode(x: np.ndarray, fmt: str | Minifloat) -> np.ndarray:
    """float16/float32 array -> uint8 bit patterns of `fmt`: saturate, then round to nearest even."""
    f, x = get_format(fmt), np.asarray(x)
    if x.dtype not in (np.float16, np.float32):  # float64 -> float32 -> fmt would round twice
        raise TypeError(f"encode takes float16 or float32 values, not {x.dtype}: round to float32 first on purpose")
    shape, x = x.shape, x.astype(np.float32).reshape(-1)  # float16 widens exactly
    m = f.mantissa_bits
    floor = 127 + 23 + (1 - f.bias - m)  # float32 exponent field of the smallest P, 2^(1-bias-m+23)
    bits = x.view(np.uint32)
    # Saturation: as bits, positive floats order as their values (inf, then NaN, above the max).
    magnitude = np.minimum(bits & SIGN_AND_MAGNITUDE, np.float32(f.max).view(np.uint32))  # NaN lanes: fixed below
    power = np.maximum((magnitude & EXPONENT_FIELD) + ((23 - m) << 23), floor << 23)  # P, as bits
    total = (magnitude.view(np.float32) + power.view(np.float32)).view(np.uint32)  # the rounding
    # The sum's exponent field, shifted onto the format's, minus the smallest P's: 0 below the normals.
    code = (total >> (23 - m)) + (total & ((1 << (23 - m)) - 1)) - (floor << m)
    code |= (bits >> 31) << (f.bits - 1)  # the sign
    nan = np.isnan(x)
    if nan.any():
        if f.specials == "none":
            raise ValueError(f"{f.name} has no NaN: {int(nan.sum())} NaN value(s) cannot be encoded; remove them first")
        code[nan] = f.nan_bits | ((bits[nan] >> 31) << 7)
    return code.astype(np.uint8).reshape(shape)


def codes(code: np.ndarray, bits: int, name: str, encoder: str = "encode") -> np.ndarray:
    """`code` as uint8, refused unless integers in [0, 2^bits): a cast would wrap 300 to 44 and read 1.5 as 1."""
    c = np.asarray(code)
    if c.dtype.kind not in "iu" or (c.size and (c.min() < 0 or c.max() >= 2**bits)):
        got = f"integers from {c.min()} to {c.max()}" if c.dtype.kind in "iu" else f"{c.dtype} values, not codes"
        raise ValueError(f"{name} codes are integers from 0 to {2**bits - 1}, as {encoder} returns them; got {got}")
    return c.astype(np.uint8)


def decode(code: np.ndarray, fmt: str | Minifloat) -> np.ndarray:
    """uint8 bit patterns of `fmt` -> float32 values, exactly (a table look-up); round values with decode(encode(x))."""
    f = get_format(fmt)
    return f.values[codes(code, f.bits, f.name)]


def encode_e8m0(exponent: np.ndarray) -> np.ndarray:
    """Integer exponents k in [-127, 127] -> E8M0 bytes k + 127 (the scale 2^k; 0xFF is NaN, no zero, no sign)."""
    k = np.asarray(exponent)
    if k.dtype.kind not in "iu" or (k.size and (k.min() < -127 or k.max() > 127)):
        raise ValueError("E8M0 holds the scales 2^k for integers k from -127 to 127; clamp the exponents first")
    return (k.astype(np.int32) + 127).astype(np.uint8)


def decode_e8m0(code: np.ndarray) -> np.ndarray:
    """E8M0 bytes -> float32 scales 2^(code - 127), exactly (2^-127 is a float32 subnormal); 0xFF -> NaN."""
    code = codes(code, 8, "E8M0", "encode_e8m0")
    out = np.ldexp(np.float32(1.0), np.minimum(code, 254).astype(np.int32) - 127).astype(np.float32)
    return np.where(code == 0xFF, np.float32(np.nan), out)
