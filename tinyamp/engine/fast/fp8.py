"""Engine room: the FP8 chapter's casts and its product, the same bits in compiled loops (fp8_numba.py).

Registered behind ``tinyamp.kernels`` under the names the course's ``tinyamp/fp8/seam.py`` calls:

==================  =================================================  ====================================
kernel              reference (tinyamp/fp8/)                           here
==================  =================================================  ====================================
fp8_encode          ``formats.encode``                                 one loop over the values
fp8_amax            ``scaling.amax_of``: max |x|                       a max over the bit patterns
fp8_scaled_cast     ``scaling.cast_counted``: x * scale cast, counted  one loop: cast and the three counts
fp8_block_quantize  ``blocks.quantize``: 1-row blocks (MX, NVFP4)      the amaxes, then one loop per block
fp8_matmul          ``products.fp8_matmul`` with float32 sums          decode by table, sgemm, scale once
==================  =================================================  ====================================

Each answers only where it gives the reference's result: float32 C-contiguous input (and, for
the product, 2-D uint8 operands without a narrow accumulator); everything else (float16, a
strided view, a CuPy array, an amax over a NaN, whose payload NumPy's max chooses), and every
input the reference refuses (a NaN for E2M1, a NaN or inf in a block tensor, a bad shape),
gets ``NotImplemented``, and the reference runs, with its own errors.  Without numba, or with
the casts switched to NumPy (``casts.set_kernels("numpy")``, ``TINYAMP_CAST_KERNELS=numpy``),
every call is ``NotImplemented``.  tests/engine_room/test_fp8_kernels.py checks them bit for bit.
(The compiled loops raise no RuntimeWarning: a product scaled back past float32's range is inf
here too, without NumPy's "overflow encountered in multiply".)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyamp.engine.fast import casts

_F32 = np.dtype(np.float32)
FLOAT32_MAX = float(np.finfo(np.float32).max)


def _loops() -> Any:
    """The compiled loops (importing numba on the first call), or None where the casts run as NumPy."""
    if casts.active_kernels() != "numba":
        return None
    from tinyamp.engine.fast import fp8_numba

    return fp8_numba


def _float32_input(x: Any) -> bool:
    return type(x) is np.ndarray and x.dtype == _F32 and x.flags.c_contiguous


def format_numbers(fmt: Any) -> tuple[int, int, int, int, int]:
    """(mantissa bits, float32 exponent field of the smallest P, largest value's float32 bits, bits, NaN code)
    of a format of tinyamp.fp8.formats, read from its attributes; the NaN code is 0 for E2M1 (it has none)."""
    m = fmt.mantissa_bits
    floor = 127 + 23 + (1 - fmt.bias - m)
    top = int(np.float32(fmt.max).view(np.uint32))
    return m, floor, top, fmt.bits, fmt.nan_bits if fmt.specials != "none" else 0


def encode(x: Any, fmt: Any) -> Any:
    """``formats.encode(x, fmt)`` for a float32 C-contiguous array (a NaN with E2M1: NotImplemented)."""
    loops = _loops()
    if loops is None or not _float32_input(x):
        return NotImplemented
    out = np.empty(x.shape, np.uint8)
    nan = loops.encode_bits(x.reshape(-1).view(np.uint32), out.reshape(-1), *format_numbers(fmt))
    return NotImplemented if nan and fmt.specials == "none" else out  # the reference refuses it


def amax(x: Any) -> Any:
    """``scaling.amax_of(x)``: the largest |x| as a Python float, 0.0 when empty (NotImplemented for a NaN)."""
    loops = _loops()
    if loops is None or not _float32_input(x):
        return NotImplemented
    largest = int(loops.largest_magnitude(x.reshape(-1).view(np.uint32)))
    if largest > 0x7F800000:  # a NaN: the reference's np.max picks which NaN (payload), so it answers
        return NotImplemented
    return float(np.uint32(largest).view(np.float32))


def scaled_cast(x: Any, scale: float, fmt: Any) -> Any:
    """``scaling.cast_counted(x, scale, fmt)``: (codes, saturated, flushed, nonfinite) in one loop."""
    loops = _loops()
    if loops is None or not _float32_input(x) or fmt.specials == "none":
        return NotImplemented
    out = np.empty(x.shape, np.uint8)
    with np.errstate(over="ignore"):  # as the reference: a scale beyond float32 is inf
        scale32 = np.float32(scale)
    counts = loops.scaled_cast(x.reshape(-1), scale32, out.reshape(-1), *format_numbers(fmt), float(fmt.max))
    return (out, *(int(n) for n in counts))


def nvfp4_tensor_scale(amax: float) -> np.float32:
    """blocks.nvfp4_tensor_scale, the same four lines: S = 448 * 6 / amax in float32, 1 for an amax of 0 or
    not finite, float32's max on overflow (tests/engine_room/test_fp8_kernels.py pins the two together)."""
    if not (np.isfinite(amax) and amax > 0):
        return np.float32(1.0)
    with np.errstate(over="ignore"):
        s = np.float32(448.0 * 6.0) / np.float32(amax)
    return np.float32(FLOAT32_MAX) if np.isinf(s) else s


def block_quantize(x: Any, scheme: str, fmt: Any, block: tuple[int, int], rounding: str | None, e4m3: Any) -> Any:
    """``blocks.quantize`` for blocks of one row (MXFP8, MXFP4, NVFP4, 1 x 128): (codes, block scales, S).

    `rounding` is the power-of-two scale's ("floor", "up"), None for NVFP4, whose block scales are `e4m3`."""
    loops = _loops()
    rows, c = block
    if loops is None or not _float32_input(x) or rows != 1 or x.ndim == 0 or x.size == 0 or x.shape[-1] % c:
        return NotImplemented
    flat, codes = x.reshape(-1), np.empty(x.shape, np.uint8)
    grid = (x.size // x.shape[-1], x.shape[-1] // c)
    scales = np.empty(grid, np.uint8)
    if rounding is None:  # nvfp4: E4M3 block scales under the FP32 tensor scale S
        largest = int(loops.largest_magnitude(flat.view(np.uint32)))
        if largest >= 0x7F800000 or c != 16 or fmt.mantissa_bits != 1:
            return NotImplemented  # NaN or inf: refused by the reference
        s = nvfp4_tensor_scale(float(np.uint32(largest).view(np.float32)))
        loops.nvfp4_blocks(flat, s, e4m3.values, codes.reshape(-1), scales.reshape(-1),
                           format_numbers(e4m3), format_numbers(fmt))  # fmt: skip
        return codes, scales, float(s)
    emax_elem = int(np.floor(np.log2(fmt.max)))
    done = loops.power_of_two_blocks(flat, c, emax_elem, rounding == "up", float(fmt.max), codes.reshape(-1),
                                     scales.reshape(-1), *format_numbers(fmt))  # fmt: skip
    return (codes, scales, 1.0) if done else NotImplemented


def _decoded(bits: np.ndarray, table: np.ndarray, loops: Any) -> np.ndarray | None:
    """``table[bits]`` with the reference's memory order (a transposed operand stays transposed), or None."""
    if bits.flags.c_contiguous:
        out = np.empty(bits.shape, np.float32)
        loops.look_up(bits.reshape(-1), table, out.reshape(-1))
        return out
    if bits.flags.f_contiguous:
        return _decoded(bits.T, table, loops).T
    return None


def fp8_matmul(a: Any, b: Any, accumulator_bits: Any = None, promote_every: Any = None,
               rounding: str = "toward_zero") -> Any:  # fmt: skip
    """``products.fp8_matmul`` with float32 sums: decode (same layout), the same np.matmul, then
    (total * 1/scale_a) * 1/scale_b in one pass over the result instead of two."""
    loops = _loops()
    if loops is None or accumulator_bits is not None:
        return NotImplemented
    x_bits, y_bits = a.bits, b.bits
    if not all(type(t) is np.ndarray and t.dtype == np.uint8 and t.ndim == 2 for t in (x_bits, y_bits)):
        return NotImplemented
    if x_bits.shape[1] != y_bits.shape[0] or a.fmt.bits != 8 or b.fmt.bits != 8 or 0 in x_bits.shape + y_bits.shape:
        return NotImplemented
    x, y = _decoded(x_bits, a.fmt.values, loops), _decoded(y_bits, b.fmt.values, loops)
    if x is None or y is None:
        return NotImplemented
    total = np.matmul(x, y)
    loops.scale_product(total, np.float32(1.0) / np.float32(a.scale), np.float32(1.0) / np.float32(b.scale))
    return total
