"""Engine room: the FP8 chapter's casts as compiled loops, with numba (``pip install "tinyamp[fast]"``).

``tinyamp/fp8/formats.py`` encodes a tensor in about a dozen whole-array passes (a clip on the
bits, the power of two P, the float32 addition that rounds, the shifts, the sign, the NaN
lanes), and a scaled cast (``TensorScaling.cast_counted``) or a block cast (``blocks.quantize``)
adds a few more: the product by the scale, the counts, each block's amax and exponent.  Here
the same arithmetic is written for one element, in the same order and the same widths, and
numba compiles the loop, so each value goes through all the steps in registers, in one pass
(two where a scale needs the amax first: current scaling, each block's exponent); the results are
the same bits and the same counts (tests/engine_room/test_fp8_kernels.py checks them against
the chapter on every rounding point of each format, NaN, inf, -0, subnormals and random data).

This module imports numba, so ``fp8.py`` imports it only at the first FP8 cast, not at
``import tinyamp``; numba compiles each loop on its first call (and keeps it in its on-disk cache).
The formats arrive as numbers (mantissa bits, bias, ...): the engine room does not import the chapter.
"""

from __future__ import annotations

import numpy as np

from tinyamp.engine.fast.casts_numba import _compile

_U32 = np.uint32
_F32 = np.float32
_MAGNITUDE = _U32(0x7FFFFFFF)
_EXPONENT = _U32(0x7F800000)  # float32's exponent field; also the bits of +inf


@_compile
def _code(b, m, floor, top, nbits, nan_bits):  # type: ignore[no-untyped-def]  # pragma: no cover - numba
    """One float32 bit pattern -> its code in the format: formats.encode's steps for one element."""
    m, floor, top, nbits, nan_bits = _U32(m), _U32(floor), _U32(top), _U32(nbits), _U32(nan_bits)
    magnitude = _U32(min(_U32(b & _MAGNITUDE), top))  # saturation on the bits; a NaN lane is replaced below
    shift = _U32(_U32(23) - m)
    power = _U32(max(_U32((magnitude & _EXPONENT) + _U32(shift << _U32(23))), _U32(floor << _U32(23))))  # P
    total = _F32(magnitude.view(np.float32) + power.view(np.float32)).view(np.uint32)  # the rounding
    low = _U32(_U32(_U32(1) << shift) - _U32(1))
    code = _U32(_U32(_U32(total >> shift) + _U32(total & low)) - _U32(floor << m))
    sign = _U32(b >> _U32(31))
    code = _U32(code | _U32(sign << _U32(nbits - _U32(1))))
    if _U32(b & _MAGNITUDE) > _EXPONENT:  # NaN: the format's NaN, with the input's sign
        code = _U32(nan_bits | (sign << _U32(7)))
    return np.uint8(code & _U32(0xFF))


@_compile
def encode_bits(bits, out, m, floor, top, nbits, nan_bits):  # type: ignore[no-untyped-def]  # pragma: no cover
    """float32 bit patterns -> codes into `out`; True if some input is NaN (for a format without NaN)."""
    nan = False
    for i in range(bits.size):
        b = bits[i]
        nan |= _U32(b & _MAGNITUDE) > _EXPONENT
        out[i] = _code(b, m, floor, top, nbits, nan_bits)
    return nan


@_compile
def largest_magnitude(bits):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled by numba
    """max |x| over float32 bit patterns, as bits: above 0x7F800000 means a NaN is there."""
    largest = _U32(0)
    for i in range(bits.size):
        largest = max(largest, _U32(bits[i] & _MAGNITUDE))
    return largest


@_compile
def scaled_cast(x, scale, out, m, floor, top, nbits, nan_bits, fmt_max):  # type: ignore[no-untyped-def]  # pragma: no cover
    """x * scale (float32) to codes, every non-finite x to the positive NaN code; (saturated, flushed, nonfinite)."""
    saturated = flushed = nonfinite = 0
    for i in range(x.size):
        v = x[i]
        scaled = _F32(v * scale)
        s = scaled.view(np.uint32)
        code = _code(s, m, floor, top, nbits, nan_bits)
        if _U32(_F32(v).view(np.uint32) & _MAGNITUDE) >= _EXPONENT:  # inf or NaN before the cast
            code = np.uint8(nan_bits)
            nonfinite += 1
        else:
            if not (abs(scaled) <= fmt_max):
                saturated += 1
            if v != 0 and (code & 0x7F) == 0:
                flushed += 1
        out[i] = code
    return saturated, flushed, nonfinite


@_compile
def _power_of_two(e):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled by numba
    """2^e as a float64, from its bits (exact for the exponents here, -300 < e < 300)."""
    return np.uint64(np.int64(e + 1023) << 52).view(np.float64)


@_compile
def _block_amaxes(x, c, out):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled by numba
    """Each block of `c` values' largest magnitude, as float32 bits; the largest of all (NaN, inf: >= 0x7F800000)."""
    blocks = x.view(np.uint32).reshape((x.size // c, c))  # 2-D: the inner loop has a fixed length, and vectorizes
    top = _U32(0)
    for k in range(blocks.shape[0]):
        largest = _U32(0)
        for j in range(c):
            largest = max(largest, _U32(blocks[k, j] & _MAGNITUDE))
        out[k] = largest
        top = max(top, largest)
    return top


@_compile
def power_of_two_blocks(x, c, emax_elem, up, fmt_max, codes, exponents, m, floor, top, nbits, nan_bits):  # type: ignore[no-untyped-def]  # noqa: E501  # pragma: no cover
    """Blocks of `c` values along x (float32, flat): each block's exponent e (blocks.shared_exponents) as its
    E8M0 byte, its elements x / 2^e as codes; False (and nothing written that counts) if a value is NaN or inf."""
    amaxes = np.empty(x.size // c, np.uint32)
    if _block_amaxes(x, c, amaxes) >= _EXPONENT:
        return False
    factors = np.empty(x.size // c, np.float32)
    for k in range(amaxes.size):
        largest = amaxes[k]
        if largest >= _U32(0x00800000):  # floor(log2 amax): a normal float's exponent field, less the bias
            log2 = np.int64(largest >> _U32(23)) - 127
        else:  # a subnormal amax: largest * 2^-149, exact as a float64, whose exponent is read instead
            log2 = np.int64(np.uint64(np.float64(largest).view(np.uint64) >> np.uint64(52))) - 1023 - 149
        e = log2 - emax_elem
        if up and np.float64(_U32(largest).view(np.float32)) > fmt_max * _power_of_two(e):
            e += 1  # the "up" rule: amax / 2^e would pass the format's largest value
        if largest == 0:
            e = -127  # a block of zeros
        e = min(max(e, -127), 127)
        exponents[k] = np.uint8(e + 127)
        factors[k] = _F32(_power_of_two(-e))  # exact in float32 (2^-127 is a subnormal)
    xs, cs = x.reshape((x.size // c, c)), codes.reshape((x.size // c, c))
    for k in range(xs.shape[0]):
        f = factors[k]
        for j in range(c):  # x * 2^-e in float32 rounds as x / 2^e in float64 then float32 does: once
            cs[k, j] = _code(_F32(xs[k, j] * f).view(np.uint32), m, floor, top, nbits, nan_bits)
    return True


@_compile
def nvfp4_blocks(x, s, e4m3_values, codes, scales, e4m3, e2m1):  # type: ignore[no-untyped-def]  # pragma: no cover
    """NVFP4 blocks of 16 (blocks.quantize): each block's E4M3 scale of amax * S / 6 (1 where it rounds to 0
    from a nonzero amax), its elements (x * S) / scale as E2M1 codes (+0 for a flushed block)."""
    amaxes = np.empty(x.size // 16, np.uint32)
    _block_amaxes(x, 16, amaxes)
    six = _F32(6.0)
    for k in range(amaxes.size):
        amax = _U32(amaxes[k]).view(np.float32)
        code = _code(_F32(_F32(amax * s) / six).view(np.uint32), e4m3[0], e4m3[1], e4m3[2], e4m3[3], e4m3[4])
        if code == 0 and amaxes[k] > 0:
            code = np.uint8(1)
        scales[k] = code
    xs, cs = x.reshape((x.size // 16, 16)), codes.reshape((x.size // 16, 16))
    for k in range(xs.shape[0]):
        decoded = e4m3_values[scales[k]]
        for j in range(16):
            element = _U32(0)  # +0: a flushed block
            if decoded > 0:
                element = _F32(_F32(xs[k, j] * s) / decoded).view(np.uint32)
            cs[k, j] = _code(element, e2m1[0], e2m1[1], e2m1[2], e2m1[3], e2m1[4])


@_compile
def scale_product(total, a, b):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled by numba
    """total = (total * a) * b in place, each product rounded to float32 (products.fp8_matmul's scaling back)."""
    flat = total.reshape(-1)
    for i in range(flat.size):
        flat[i] = _F32(_F32(flat[i] * a) * b)


@_compile
def look_up(codes, table, out):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled by numba
    """out[i] = table[codes[i]]: decoding, the table of all 256 values."""
    for i in range(codes.size):
        out[i] = table[codes[i]]
