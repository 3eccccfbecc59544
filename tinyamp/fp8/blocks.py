"""Block scaling: a scale for every small block of a tensor, so one outlier costs only its block.

A per-tensor scale maps the tensor's amax onto the format's largest value; one outlier then
pushes every other value toward the subnormals.  Block formats give each block its own scale:

==================  ==========  ==========  ======================================================
scheme              elements    block       scale of a block (stored per block, one byte)
==================  ==========  ==========  ======================================================
mxfp8_e4m3 / _e5m2  E4M3, E5M2  1 x 32      E8M0 2^e (OCP Microscaling v1.0)
mxfp4               E2M1        1 x 32      E8M0 2^e (OCP Microscaling v1.0)
nvfp4               E2M1        1 x 16      E4M3 block_amax * S / 6, under an FP32 tensor scale S
deepseek_1x128      E4M3        1 x 128     2^e (DeepSeek-V3's activation tiles)
deepseek_128x128    E4M3        128 x 128   2^e (DeepSeek-V3's weight blocks; a 2-D tensor)
==================  ==========  ==========  ======================================================

A stored scale is the *decoding* one, as MX's X and TE's ``scale_inv``: a value is its element
times its block's scale.  Blocks run along the last axis (rows of 1).

**The shared exponent.**  With emax_elem = floor(log2 FMT_MAX) (8 for E4M3, 15 for E5M2, 2 for
E2M1), the OCP reference takes e = floor(log2 block_amax) - emax_elem (rounding ``"floor"``): the
block's amax lands in [2^emax_elem, 2^(emax_elem+1)), [256, 512) for E4M3 and [4, 8) for E2M1, and
above 448 (or 6) it saturates; for Gaussian data in E4M3 that clips the top of about one block in
six (measured in tests/test_fp8_blocks.py).  floor(log2 amax) is read exactly, from the float's
exponent field, as hardware and torchao's FLOOR read it: microxcaling's float32 ``log2`` rounds an
amax a few ulp below 2^k to k, so there its floor acts as rounding up (a scale twice as large, every
element one binade nearer the subnormals), a rule that would hang on a log2's last bit.  Transformer Engine
rounds the scale up; ``"up"`` here is the exact rule, the smallest e with block_amax / 2^e <=
FMT_MAX, and nothing saturates (TE reaches its power of two through amax times float32
1/FMT_MAX, which can round across a boundary).  MX defaults to ``"floor"``, DeepSeek's blocks to
``"up"``.  Exponents are clamped to E8M0's [-127, 127]; a block of zeros gets 2^-127.  The elements
are x / 2^e, exact in float32 (a power of two; below float32's normals the bits lost are far below
the format's own smallest value), cast with saturation.  Where the code is 0, x / 2^-127 too:
torchao divides by 2^-126 there (float32's smallest normal) and so stores half of each value
under a code that reads 2^-127.  Decoding is exact (but under ``"up"`` a block amax from
248 * 2^120 in E4M3, or 1.75 * 2^127 in E2M1, rounds to 2^128: infinity).

**NVFP4.**  S = 448 * 6 / tensor_amax in float32 (1 when the amax is 0 or not finite, float32's
max if the quotient overflows: Transformer Engine's rule) spreads the tensor over E4M3's range of
block scales.  Each block scale block_amax * S / 6 is rounded to nearest in E4M3, subnormals kept:
torchao clamps it to [2^-6, 448], so a block far below the tensor's amax gets a scale too large and
fewer of E2M1's values (tests/test_fp8_peers.py measures it).  Rounded down, a scale lets the
block's top element reach 6 * 17/16 (more where the scale is subnormal), saturated to 6.
Elements are (x * S) / block_scale in float32, then E2M1: x * S is at most about 2688 and a block
scale at least 2^-9, so neither step overflows, where the factor S / block_scale (up to
FLT_MAX / 2^-9) can for a tensor amax below about 2^-107.6.  A nonzero block whose scale rounds
to 0 gets E4M3's smallest, 2^-9: 0 would zero the block, and 2^-9 errs at most |x| on each value
and keeps the largest.  Under the largest FP32 S no value below 0.5 * 2^-9 / FLT_MAX (about
2^-138) exists: a tensor whose amax is below about 2^-131.4 gets subnormal block scales, and its
values at or below 2^-139 become 0.  Dequantizing, element * block_scale is exact and the one rounding is the
multiplication by float32(1 / S).

**What blocks buy** (measured in tests/test_fp8_blocks.py on the Gaussian bulk of 2^18 values
with eight outliers).  FP4 spans only 0.5 to 6: one scale per tensor loses the bulk at 100x
outliers, NVFP4 keeps it, and MXFP4 errs 1.1 to 1.3 times as much (blocks of 32, power-of-two
scales, the floor rule saturating a block's top).  E4M3's range absorbs a 100x outlier, and there
per-tensor scaling is as good as blocks (the floor rule's clipping even makes MXFP8 worse); at 10^5x
the bulk falls into E4M3's subnormals under one scale, and 1 x 32 or 1 x 128 blocks err over 5 times less.

**Bad input** (refused in ``scaling_checks``).  A block that does not divide the last axis (or,
for 128 x 128, the rows) is refused with the shape and the fix (pad with zeros: they change no
amax).  NaN or infinity is refused: it would make its block's amax, and its scale, meaningless;
per-tensor scaling (``TensorScaling``) casts such values to NaN and reports them.  An empty
tensor has no block to scale and quantizes to an empty one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyamp.fp8 import scaling_checks
from tinyamp.fp8.formats import E2M1, E4M3, E5M2, Minifloat, decode, decode_e8m0, encode, encode_e8m0

# name: (element format, block (rows, columns), default rounding of the power-of-two scale; None: E4M3 scale)
SCHEMES: dict[str, tuple[Minifloat, tuple[int, int], str | None]] = {
    "mxfp8_e4m3": (E4M3, (1, 32), "floor"),
    "mxfp8_e5m2": (E5M2, (1, 32), "floor"),
    "mxfp4": (E2M1, (1, 32), "floor"),
    "nvfp4": (E2M1, (1, 16), None),
    "deepseek_1x128": (E4M3, (1, 128), "up"),
    "deepseek_128x128": (E4M3, (128, 128), "up"),
}


def shared_exponents(amax: np.ndarray, fmt: Minifloat, rounding: str) -> np.ndarray:
    """Each block's scale exponent e (the scale 2^e) under `rounding`: "floor" (OCP) or "up" (TE)."""
    amax = np.asarray(amax, dtype=np.float64)  # float32 amaxes widen exactly
    emax_elem = int(np.floor(np.log2(fmt.max)))  # 8 for E4M3, 15 for E5M2, 2 for E2M1
    e = np.frexp(amax)[1] - 1 - emax_elem  # frexp: amax = m 2^E, m in [0.5, 1), so floor(log2 amax) = E - 1
    if rounding == "up":  # one more power of two where the block's amax would pass the format's max
        e = e + (np.ldexp(amax, -e) > fmt.max)
    return np.clip(np.where(amax > 0, e, -127), -127, 127).astype(np.int32)


def nvfp4_tensor_scale(amax: float) -> np.float32:
    """S = 448 * 6 / amax in float32; 1 when the amax is 0 or not finite; float32's max on overflow."""
    if not (np.isfinite(amax) and amax > 0):
        return np.float32(1.0)
    with np.errstate(over="ignore"):
        s = np.float32(E4M3.max * E2M1.max) / np.float32(amax)
    return np.float32(np.finfo(np.float32).max) if np.isinf(s) else s


@dataclass(frozen=True)
class BlockTensor:
    """A block-scaled tensor: one byte a value (E2M1 in the low 4 bits) and one byte a block."""

    codes: np.ndarray  # uint8 element bit patterns, the tensor's shape
    scales: np.ndarray  # uint8 per block, E8M0 (2^e) or, for nvfp4, E4M3; shape: the grid of blocks
    scheme: str
    tensor_scale: float = 1.0  # nvfp4's S; 1 for the power-of-two schemes

    def block_scales(self) -> np.ndarray:
        """Each block's decoding scale as float32: 2^e, or nvfp4's E4M3 scale (still times S)."""
        return decode(self.scales, E4M3) if self.scheme == "nvfp4" else decode_e8m0(self.scales)

    def dequantize(self) -> np.ndarray:
        """float32 values: element times block scale (exact), for nvfp4 times float32(1 / S)."""
        fmt, block, _ = SCHEMES[self.scheme]
        tiles = tiled(decode(self.codes, fmt), block, self.scheme)
        with np.errstate(over="ignore"):  # only the "up" corner case in the docstring overflows
            out = tiles * self.block_scales().reshape(tiles.shape[0], 1, tiles.shape[2], 1)
        if self.scheme == "nvfp4":
            out = out * (np.float32(1.0) / np.float32(self.tensor_scale))
        return out.reshape(self.codes.shape)


def tiled(x: np.ndarray, block: tuple[int, int], scheme: str) -> np.ndarray:
    """`x` viewed as (rows / r, r, columns / c, c) tiles, leading axes folded into the rows."""
    (r, c), last = scaling_checks.checked_block_shape(x.shape, block, scheme), x.shape[-1] if x.ndim else 1
    return x.reshape(int(np.prod(x.shape[:-1])) // r, r, last // c, c)  # not -1: an empty x has no row count


def quantize(x: np.ndarray, scheme: str, rounding: str | None = None) -> BlockTensor:
    """float16/float32 `x` -> a ``BlockTensor`` of `scheme`; `rounding`: of a power-of-two scale ("floor", "up")."""
    fmt, block, default = scaling_checks.checked_block_scheme(scheme, rounding, SCHEMES)
    tiles = tiled(scaling_checks.checked_block_input(x).astype(np.float32), block, scheme)
    amax = np.abs(tiles).max(axis=(1, 3), initial=0.0)  # one per block
    if default is None:  # nvfp4: an E4M3 scale per block under the FP32 tensor scale S
        s = nvfp4_tensor_scale(float(amax.max(initial=0.0)))
        scales = encode((amax * s / np.float32(6.0)).astype(np.float32), E4M3)  # rounded to nearest, saturating
        scales[(scales == 0) & (amax > 0)] = 1  # not 0, which zeroes the block: 2^-9 keeps its largest values
        decoded = decode(scales, E4M3)[:, None, :, None]
        with np.errstate(divide="ignore", invalid="ignore"):  # x * S <= 2688 and a block scale >= 2^-9: finite
            elements = np.where(decoded > 0, tiles * s / decoded, np.float32(0.0))  # 0: a flushed block
        return BlockTensor(encode(elements, fmt).reshape(x.shape), scales, scheme, float(s))
    e = shared_exponents(amax, fmt, rounding or default)
    elements = np.ldexp(tiles.astype(np.float64), -e[:, None, :, None]).astype(np.float32)  # x / 2^e, exact
    return BlockTensor(encode(elements, fmt).reshape(x.shape), encode_e8m0(e), scheme)
