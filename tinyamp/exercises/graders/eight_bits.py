"""Graders of Exercises 10.1 (round_to_e4m3), 10.2 (DelayedScaling) and 10.3 (mx_block_scales)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tinyamp.fp8.blocks import shared_exponents
from tinyamp.fp8.formats import E4M3, E5M2, decode, encode, encode_e8m0
from tinyamp.testing import check_delayed_scaling
from tinyamp.testing.counterexamples import array_in_words, blamed, call, check_settings, number
from tinyamp.testing.strategies import fp8_rounding_points, shapes

# ---- 10.1: E4M3 by hand --------------------------------------------------------------------------------------
POINTS = fp8_rounding_points("E4M3")  # every value, every tie, the float32 values either side, 0, inf, extremes
EVERY_FLOAT16 = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
E4M3_MAGNITUDES = np.unique(np.abs(E4M3.values[np.isfinite(E4M3.values)]).astype(np.float64))  # 0, 2^-9, ..., 448


def grade_round_to_e4m3(round_to_e4m3: Callable[[np.ndarray], np.ndarray], examples: int) -> None:
    """Bit for bit against tinyamp's saturating cast: drawn arrays, every rounding point, every float16 value."""
    points = st.sampled_from(POINTS.tolist())

    @check_settings(examples)
    @given(x=hnp.arrays(np.float32, shapes(min_dims=1, max_dims=2), elements=points | st.floats(width=32)))
    def the_bits_of_the_saturating_cast(x: np.ndarray) -> None:
        e4m3_at(round_to_e4m3, x)

    the_bits_of_the_saturating_cast()
    every = "every E4M3 value, every tie between neighbours, and the float32 values either side of each"
    e4m3_at(round_to_e4m3, POINTS, f"{every} ({POINTS.size} values, both signs)")
    e4m3_at(round_to_e4m3, EVERY_FLOAT16, "every float16 value, widened to float32 (65,536 of them)")


def e4m3_at(round_to_e4m3: Callable[[np.ndarray], np.ndarray], x: np.ndarray, about: str = "") -> None:
    """AssertionError in words unless round_to_e4m3(x) holds the saturating cast's bit patterns."""
    expected = encode(x, E4M3)
    about = about or array_in_words(x)
    got = call(f"for {about} yours", round_to_e4m3, x.copy())
    if not isinstance(got, np.ndarray) or got.shape != x.shape or got.dtype != np.uint8:
        what = f"{type(got).__name__} {getattr(got, 'dtype', '')} {getattr(got, 'shape', '')}"
        raise AssertionError(f"for {about} return a uint8 array of shape {x.shape}, one E4M3 bit pattern per value; "
                             f"yours returned {what}")  # fmt: skip
    if np.array_equal(got, expected):
        return
    i = int(np.flatnonzero(got.reshape(-1) != expected.reshape(-1))[0])
    v, mine, right = float(x.reshape(-1)[i]), int(got.reshape(-1)[i]), int(expected.reshape(-1)[i])
    raise AssertionError(f"for {about}: at x.flat[{i}] = {number(v)} yours gives {bits_in_words(mine)}; the "
                         f"saturating cast gives {bits_in_words(right)}: {e4m3_rule(v, mine, right)}")  # fmt: skip


def bits_in_words(code: int) -> str:
    """0x7e = 0 1111 110 (448): the byte, its fields, its value."""
    bits = f"{code:08b}"
    value = float(decode(np.uint8(code), E4M3))
    return f"0x{code:02x} = {bits[0]} {bits[1:5]} {bits[5:]} ({'NaN' if math.isnan(value) else number(value)})"


def e4m3_rule(v: float, mine: int, right: int) -> str:
    """The clause of E4M3's saturating round-to-nearest-even that decides x = v."""
    if math.isnan(v):
        return "x is NaN, and E4M3's only NaN is s.1111.111 (0x7f, or 0xff when the sign bit is set)"
    if mine & 0x7F == right & 0x7F:
        return "the sign bit (bit 7) is x's own, -0.0 included"
    a = abs(v)
    if a > 448:
        return (f"{number(a)} is beyond E4M3's largest value 448: the recipes' cast saturates it to 448 "
                "(s.1111.110), infinity too, where ml_dtypes' own cast would give NaN")  # fmt: skip
    j = int(np.searchsorted(E4M3_MAGNITUDES, a))  # E4M3_MAGNITUDES[j - 1] < a <= E4M3_MAGNITUDES[j]
    low, high = E4M3_MAGNITUDES[max(j - 1, 0)], E4M3_MAGNITUDES[j]
    answer = number(abs(float(decode(np.uint8(right), E4M3))))
    if a == high:
        return f"{number(a)} is an E4M3 value: it is its own rounding"
    if a <= 2.0**-10:
        return ("at or below 2^-10, half the smallest subnormal 2^-9, the magnitude rounds to 0 (2^-10 itself is a "
                "tie between 0 and 2^-9, and goes to the even one, 0)")  # fmt: skip
    where = ("below 2^-6 E4M3's values are the subnormals, the multiples of 2^-9" if high <= 2.0**-6 else
             f"in [2^{math.frexp(low)[1] - 1}, 2^{math.frexp(low)[1]}) E4M3's values are "
             f"2^{math.frexp(low)[1] - 4} apart")  # fmt: skip
    if 2 * a == low + high:
        return (f"{where}; {number(a)} is exactly halfway between the neighbours {number(low)} and {number(high)}: "
                f"a tie goes to the one whose last mantissa bit is 0, {answer}")  # fmt: skip
    return f"{where}; {number(a)} lies between {number(low)} and {number(high)} and rounds to the nearer, {answer}"


# ---- 10.2: the delayed-scaling update --------------------------------------------------------------------------
def grade_delayed_scaling(scaling_class: type, examples: int) -> None:
    """The history's dtype, then step by step against tinyamp's TensorScaling: scale and amax history after
    every amax, edge cases toured."""
    history_is_float32(scaling_class)
    check_delayed_scaling(lambda **settings: scaling_class(**settings), max_examples=examples)


def history_is_float32(scaling_class: type) -> None:
    """AssertionError in words unless amax_history is a float32 array of amax_history_len entries, before and after
    an update.  (check_delayed_scaling compares values; a float64 history holds the same values, as every amax is a
    float32 value, so its dtype is checked here.)"""
    settings = dict(fp8_max=448.0, margin=0, amax_history_len=4, amax_compute_algo="max")
    with blamed(f"DelayedScaling(**{settings}), update(2.0) or reading its amax_history"):
        recipe = scaling_class(**settings)
        before = recipe.amax_history
        recipe.update(2.0)
        after = recipe.amax_history
    for when, history in (("before any update", before), ("after update(2.0)", after)):
        if not isinstance(history, np.ndarray) or history.dtype != np.float32 or history.shape != (4,):
            what = f"{type(history).__name__} {getattr(history, 'dtype', '')} {getattr(history, 'shape', '')}"
            raise AssertionError(f"with {settings}: {when} your amax_history is {what.rstrip()}; keep it a float32 "
                                 "array of shape (4,), amax_history_len entries, as Transformer Engine's amax_history "
                                 "is (each amax is a float32 value: float32 holds it exactly)")  # fmt: skip


# ---- 10.3: an MX block's shared scale ---------------------------------------------------------------------------
FORMATS = {"E4M3": E4M3, "E5M2": E5M2}
EMAX_ELEM = {"E4M3": 8, "E5M2": 15}


@st.composite
def mx_cases(draw: Any) -> tuple[np.ndarray, str]:
    """(x, fmt): 1 to 3 rows of 1 to 3 blocks, each block's amax a power of two, the float32 just below one
    (where float32's log2 rounds up), any value, a subnormal, one near float32's largest, or 0 (a block of zeros)."""
    rows, blocks = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    x = np.zeros((rows, blocks * 32), dtype=np.float32)
    for r in range(rows):
        for b in range(blocks):
            k = draw(st.integers(-149, 127))
            kind = draw(st.sampled_from(["power", "below", "any", "subnormal", "huge", "zeros"]))
            amax = {
                "power": np.float32(2.0**k),
                "below": np.nextafter(np.float32(2.0**k), np.float32(0)),
                "any": np.float32(draw(st.floats(1.0, 2.0, exclude_max=True)) * 2.0 ** max(k, -126)),
                "subnormal": np.float32(draw(st.integers(1, 2**23 - 1)) * 2.0**-149),
                "huge": np.finfo(np.float32).max if k % 2 else np.float32(1.5 * 2.0**127),
                "zeros": np.float32(0),
            }[kind]  # fmt: skip
            fractions = np.array(draw(st.lists(st.floats(0, 1), min_size=32, max_size=32)), np.float64)
            block = (fractions * float(amax)).astype(np.float32)
            block[draw(st.integers(0, 31))] = amax  # the block's amax, exactly
            signs = np.array(draw(st.lists(st.booleans(), min_size=32, max_size=32)))
            x[r, 32 * b : 32 * (b + 1)] = np.where(signs, -block, block)
    return x, draw(st.sampled_from(list(FORMATS)))


def every_binade() -> np.ndarray:
    """(554, 32): blocks whose amax is 2^k, then the float32 just below 2^k, for k from -149 to 127; their
    other values 0."""
    amax = [np.float32(2.0**k) for k in range(-149, 128)]
    amax += [np.nextafter(a, np.float32(0)) for a in amax]
    x = np.zeros((len(amax), 32), dtype=np.float32)
    x[:, 7] = amax
    return x


def grade_mx_block_scales(mx_block_scales: Callable[[np.ndarray, str], np.ndarray], examples: int) -> None:
    """Against the OCP rule (tinyamp.fp8.blocks.shared_exponents, "floor"): drawn blocks, then every binade."""

    @check_settings(examples)
    @given(case=mx_cases())
    def each_block_gets_the_ocp_scale(case: tuple[np.ndarray, str]) -> None:
        scales_at(mx_block_scales, *case)

    each_block_gets_the_ocp_scale()
    for fmt in FORMATS:
        about = "blocks whose amax is 2^k or the float32 just below 2^k, for every k from -149 to 127"
        scales_at(mx_block_scales, every_binade(), fmt, about)


def scales_at(
    mx_block_scales: Callable[[np.ndarray, str], np.ndarray], x: np.ndarray, fmt: str, about: str = ""
) -> None:
    """AssertionError in words unless mx_block_scales(x, fmt) is the OCP rule's E8M0 byte for every block."""
    amax = np.abs(x.astype(np.float64)).reshape(*x.shape[:-1], -1, 32).max(axis=-1)
    expected = encode_e8m0(shared_exponents(amax, FORMATS[fmt], "floor"))
    about = f"{about or array_in_words(x)} and fmt = {fmt!r}"
    got = call(f"for {about} yours", mx_block_scales, x.copy(), fmt)
    if not isinstance(got, np.ndarray) or got.shape != expected.shape or got.dtype != np.uint8:
        what = f"{type(got).__name__} {getattr(got, 'dtype', '')} {getattr(got, 'shape', '')}"
        raise AssertionError(f"for {about} return a uint8 array of shape {expected.shape}, one E8M0 byte per block "
                             f"of 32; yours returned {what}")  # fmt: skip
    if np.array_equal(got, expected):
        return
    index = tuple(int(i) for i in np.argwhere(got != expected)[0])
    a, mine, right = float(amax[index]), int(got[index]), int(expected[index])
    block = f"block {index} (x[{', '.join(map(str, index[:-1]))}{', ' if index[:-1] else ''}" \
        f"{32 * index[-1]}:{32 * index[-1] + 32}])"  # fmt: skip
    # yours on a block whose amax is 1: 2^0, a power of two, where rounding the exponent up changes nothing
    one = np.zeros((1, 32), np.float32)
    one[0, 0] = 1.0
    try:
        off_at_one = int(np.asarray(mx_block_scales(one, fmt)).reshape(-1)[0]) - (127 - EMAX_ELEM[fmt])
    except Exception:  # the message below is about the block above; a probe that fails adds nothing to it
        off_at_one = 0
    raise AssertionError(f"for {about}: {block} has amax {number(a)}; yours gives the byte {mine} (2^{mine - 127}), "
                         f"the OCP rule gives {right} (2^{right - 127}): "
                         f"{mx_rule(a, fmt, mine, right, off_at_one)}")  # fmt: skip


def mx_rule(a: float, fmt: str, mine: int, right: int, off_at_one: int = 0) -> str:
    """The clause of the OCP shared-exponent rule that decides a block of amax `a`; `off_at_one` is how far
    yours is from the rule's byte for a block whose amax is 1."""
    emax = EMAX_ELEM[fmt]
    if a == 0:
        return "a block of zeros has no amax; it gets e = -127, the byte 0"
    k = math.frexp(a)[1] - 1
    rule = f"e = floor(log2 amax) - emax_elem = {k} - {emax} = {k - emax}, as {number(a)} is in [2^{k}, 2^{k + 1})"
    if k - emax < -127:
        return f"{rule}, below E8M0's smallest exponent: clamp e to -127 (the byte 0)"
    if mine == right + 1 and off_at_one == 1:
        top = number(FORMATS[fmt].max)
        return (f"{rule}; yours is one higher, and one higher for a block whose amax is 1 too, a power of two, where "
                f"rounding the exponent up changes nothing: emax_elem is {emax} for {fmt} ({top} lies in "
                f"[2^{emax}, 2^{emax + 1})), yours seems to use {emax - 1}")  # fmt: skip
    if mine == right + 1 and float(np.log2(np.float32(a))) == k + 1:
        return f"{rule}; log2 in float32 rounds {number(a)} up to exactly {k + 1}: take the exponent exactly (np.frexp)"
    if mine == right + 1:
        return f"{rule}; yours is that exponent rounded up (Transformer Engine's choice), the OCP rule rounds down"
    if mine == right - 1:
        top = number(FORMATS[fmt].max)
        return (f"{rule}; yours is one lower: emax_elem is the exponent of the largest value's binade, "
                f"{emax} = floor(log2 {top}), not {emax + 1} nor log2 {top} itself")  # fmt: skip
    if fmt == "E5M2" and mine == right + 7:
        return f"{rule}; E5M2's emax_elem is 15 (its largest value is 57344 = 1.75 * 2^15), not E4M3's 8"
    return f"{rule}; the byte is e + 127"
