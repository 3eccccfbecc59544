"""Exercises 10.1 to 10.3: E4M3 by hand, the delayed-scaling update, and an MX block's shared scale (tutorials/10)."""

from __future__ import annotations

import math  # hint: math.isfinite tells a NaN or inf amax

import numpy as np


def round_to_e4m3(x: np.ndarray) -> np.ndarray:
    """Exercise 10.1: float32 -> E4M3 bit patterns, by hand: saturate, then round to nearest, ties to even.

    Task: `x` is a float32 array of any shape.  Return a uint8 array of the same shape holding
    each value's E4M3 bit pattern s.eeee.mmm (the "fn" variant of FP8: bias 7, no infinity,
    NaN only at s.1111.111), as Transformer Engine's saturating cast writes it.

    Math: E4M3's values in [2^k, 2^(k+1)), for k from -6 to 8, are (1 + m/8) * 2^k: 2^(k-3)
    apart, with exponent field k + 7 and mantissa m (0 to 7).  Below 2^-6 lie the subnormals
    m * 2^-9 (m from 1 to 7), exponent field 0; zero is 0.0000.000.  The largest value is
    1.75 * 2^8 = 448 (s.1111.110).

    * Saturation first: a magnitude beyond 448, infinity included, becomes 448 (so 465 and
      inf give 448, not NaN as ml_dtypes' own cast gives).
    * Then round the magnitude to a multiple of the gap at it (2^(k-3), or 2^-9 below 2^-6) to
      nearest; a tie goes to the even multiple (the one whose last mantissa bit is 0).  A
      carry may move it to the next binade (15.5 -> 16), and 2^-10, half the smallest
      subnormal, is a tie between 0 and 2^-9 that goes to 0.
    * The sign bit is x's (-0.0 gives 0x80); NaN gives s.1111.111 (0x7F, or 0xFF for a NaN
      whose sign bit is set).

    Do not use ml_dtypes or tinyamp.fp8: the point is the rounding.

    Read: tutorials/10_eight_bits.py, section 1 (FP8's range), and tinyamp/fp8/formats.py's
    docstring; tutorials/01_number_formats.py, section 3 (rounding to nearest even, for FP16)
    if ties are new to you.

    Time: about 40 minutes of work once the reading is done (an estimate, for planning a lab).
    """
    # >>> exercise 10.1
    x = np.asarray(x, dtype=np.float32)
    sign = (x.view(np.uint32) >> 31).astype(np.uint8) << 7
    nan = np.isnan(x)
    magnitude = np.minimum(np.abs(np.where(nan, np.float32(0), x).astype(np.float64)), 448.0)  # saturate; exact
    k = np.frexp(magnitude)[1] - 1  # magnitude in [2^k, 2^(k+1))
    gap = np.exp2(np.maximum(k, -6) - 3)  # 2^(k-3) for the normals, 2^-9 below 2^-6
    value = np.rint(magnitude / gap) * gap  # rint: to nearest, ties to even; both steps exact in float64
    k = np.frexp(value)[1] - 1  # the binade of the rounded value (a carry may have moved it)
    normal = value >= 2.0**-6
    code = np.where(normal, (k + 7) * 8 + (value / np.exp2(k) - 1) * 8, value * 2.0**9)
    code = code.astype(np.uint8) | sign
    return np.where(nan, np.uint8(0x7F) | sign, code).astype(np.uint8)
    # <<< exercise 10.1


class DelayedScaling:
    """Exercise 10.2: the delayed-scaling update of one tensor's FP8 scale (Transformer Engine's recipe).

    Task: keep ``scale`` (a Python float that is a float32 value: the scale the next cast
    multiplies by, 1 at first) and ``amax_history`` (a float32 array of the last
    `amax_history_len` amaxes, oldest first, zeros at first), and change them in
    ``update(amax)``, once per step, after that step's cast.  The grader drives your class and
    tinyamp's ``TensorScaling`` with the same amaxes (0, inf, NaN, spikes, amaxes so small that
    the scale overflows float32) and compares scale and history after every step
    (``tinyamp.testing.check_delayed_scaling``).

    Math, one step with this step's amax a:

    * a is NaN or inf: nothing was measured; scale and history stay as they are (an inf kept in
      the history would hold the scale for the whole window).
    * otherwise append a to the history and drop the oldest entry (a = 0 too); reduce the
      history to r: its largest entry (``amax_compute_algo="max"``) or its newest
      (``"most_recent"``).
    * r is 0: keep the previous scale (nothing was measured).
    * otherwise q = float32(fp8_max * 2^-margin) / float32(r), one float32 division.  (A
      float64 division rounded to float32 gives the same value: with 53 >= 2 * 24 + 2 bits,
      rounding twice cannot differ from rounding once for a quotient.)  The scale becomes q,
      except: q overflows to inf (a tiny r): scale = float32's largest value 3.4028235e38,
      never inf; q underflows to 0 (from a margin of 31 on, for a large r: 448 * 2^-40 / 2^127
      is below float32's smallest subnormal 2^-149): keep the previous scale, as a scale of 0
      would turn every value into 0.

    Read: tutorials/10_eight_bits.py, section 3 (delayed against current scaling, and one
    spike), and the table at the top of tinyamp/fp8/scaling.py.

    Time: about 30 minutes of work once the reading is done (an estimate, for planning a lab).
    """

    def __init__(
        self, fp8_max: float, margin: int = 0, amax_history_len: int = 1024, amax_compute_algo: str = "max"
    ) -> None:
        self.fp8_max, self.margin, self.amax_compute_algo = fp8_max, margin, amax_compute_algo
        # >>> exercise 10.2
        self.amax_history = np.zeros(amax_history_len, dtype=np.float32)
        self.scale = 1.0
        # <<< exercise 10.2

    def update(self, amax: float) -> None:
        """One step: write this step's amax into the history, then compute the next cast's scale."""
        # >>> exercise 10.2
        if not math.isfinite(amax):
            return
        self.amax_history = np.append(self.amax_history[1:], np.float32(amax))
        r = self.amax_history.max() if self.amax_compute_algo == "max" else self.amax_history[-1]
        if r == 0:
            return
        with np.errstate(over="ignore"):
            scale = np.float32(self.fp8_max * 2.0**-self.margin) / np.float32(r)
        if scale == 0:  # underflowed: a scale of 0 would zero every value
            return
        self.scale = float(scale) if np.isfinite(scale) else float(np.finfo(np.float32).max)
        # <<< exercise 10.2


def mx_block_scales(x: np.ndarray, fmt: str) -> np.ndarray:
    """Exercise 10.3: the shared scale of each MX block of 32 values, as E8M0 bytes (OCP Microscaling v1.0).

    Task: `x` is a float32 array of finite values whose last axis is a multiple of 32; `fmt`
    is the element format, "E4M3" or "E5M2".  Each run of 32 consecutive values along the
    last axis is one block.  Return a uint8 array of shape (..., last axis / 32): for each
    block, the E8M0 byte of its shared scale 2^e.

    Math (the OCP specification's rule): with amax the block's largest magnitude and
    emax_elem the exponent of the element format's largest power of two (8 for E4M3, whose
    largest value is 448 = 1.75 * 2^8; 15 for E5M2, 57344 = 1.75 * 2^15),

        e = floor(log2(amax)) - emax_elem,

    so that amax / 2^e lies in [2^emax_elem, 2^(emax_elem + 1)): [256, 512) for E4M3, whose
    elements above 448 then saturate.  (Transformer Engine instead rounds e up, so that nothing
    saturates.)  floor(log2(amax)) must be exact: amax = 2^k * (1 - 2^-24) has floor k - 1, and
    log2 in float32 rounds it to k.  E8M0 stores 2^e for e from -127 to 127 as the byte
    e + 127: clamp e into that range.  A block of zeros has no amax: give it e = -127 (byte 0),
    as tinyamp does.

    Read: tutorials/10_eight_bits.py, section 4 (block scaling), and the section "The shared
    exponent" of tinyamp/fp8/blocks.py's docstring.

    Time: about 25 minutes of work once the reading is done (an estimate, for planning a lab).
    """
    # >>> exercise 10.3
    emax_elem = {"E4M3": 8, "E5M2": 15}[fmt]
    blocks = np.abs(x.astype(np.float64)).reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    amax = blocks.max(axis=-1)
    k = np.frexp(amax)[1] - 1  # floor(log2 amax), exactly: amax = m * 2^(k+1) with m in [1/2, 1)
    e = np.where(amax > 0, k - emax_elem, -127)
    return (np.clip(e, -127, 127) + 127).astype(np.uint8)
    # <<< exercise 10.3
