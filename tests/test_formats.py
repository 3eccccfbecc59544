"""Floating-point formats as data: the float16 facts a mixed-precision course rests on.

Each law is checked against NumPy's own float16 arithmetic (round to nearest, ties to
even, straight from float64) or against thresholds derived by hand from the format, never
against the implementation's own arithmetic.  The published constants are typed in on
purpose: they are what a student looks up.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from strategies import float16_boundary_floats, half_floats, multiples_of_smallest_subnormal

from tinyamp.amp import formats
from tinyamp.amp.formats import (
    available_formats,
    classify,
    flushes_to_zero,
    format_table,
    get_format,
    round_to,
    ulp,
    update_is_lost,
)
from tinyamp.amp.lost_updates import lost_updates

try:
    import ml_dtypes
except ImportError:  # bfloat16 is optional
    ml_dtypes = None

pytestmark = pytest.mark.formats

needs_ml_dtypes = pytest.mark.skipif(ml_dtypes is None, reason="bfloat16 needs the optional package ml_dtypes")

ALL_HALF_BITS = np.arange(65536, dtype=np.uint16)
ALL_HALVES = ALL_HALF_BITS.view(np.float16)
FINITE_HALVES = ALL_HALVES[np.isfinite(ALL_HALVES)]

OVERFLOW_THRESHOLD = 65520.0  # 65504 + 16: max plus half the ulp at max (32)
UNDERFLOW_THRESHOLD = 2.0**-25  # half the smallest subnormal: exactly it rounds to 0 (0 is even)
NORMAL_THRESHOLD = 2.0**-14 - 2.0**-25  # tie between 0x03FF (odd) and 2^-14 (even): rounds up


def f16(x: float) -> np.float16:
    with np.errstate(over="ignore"):
        return np.float16(x)


# ---- rounding ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [f.name for f in available_formats() if f.name != "float64"])
@given(m=multiples_of_smallest_subnormal())
def test_flushes_to_zero_is_rounding_to_zero(fmt: str, m: float) -> None:
    """The comparison the underflow measures use agrees with rounding, in every format."""
    x = m * get_format(fmt).min_subnormal
    assert bool(flushes_to_zero(x, fmt)) == (float(round_to(x, fmt)) == 0.0)


def test_flushes_to_zero_at_the_float16_threshold() -> None:
    below = [UNDERFLOW_THRESHOLD, -UNDERFLOW_THRESHOLD, 0.0, 1e-30]
    above = [float(np.nextafter(UNDERFLOW_THRESHOLD, 1.0)), 2.0**-24, 1.0]
    assert flushes_to_zero(below).all() and not flushes_to_zero(above).any()


@given(x=half_floats())
def test_every_float16_value_round_trips_through_round_to(x: float) -> None:
    r = round_to(x)
    assert r.dtype == np.float64
    assert float(r) == x
    assert np.signbit(r) == (math.copysign(1.0, x) < 0)  # -0.0 stays -0.0


def test_all_float16_bit_patterns_round_trip_bit_exactly() -> None:
    back = round_to(ALL_HALVES.astype(np.float64)).astype(np.float16)
    np.testing.assert_array_equal(back.view(np.uint16), ALL_HALF_BITS)  # NaN payloads included


def test_one_plus_half_an_epsilon_rounds_back_to_one() -> None:
    assert float(round_to(1 + 2**-11)) == 1.0  # the tie goes to the even neighbour, 1
    assert float(round_to(1 + 2**-10)) == 1 + 2**-10
    assert float(round_to(1 + 3 * 2**-11)) == 1 + 2**-9  # the tie goes up: 1 + 2^-9 is the even one


def test_round_to_rounds_once_from_float64_not_through_float32() -> None:
    x = 1 + 2**-11 + 2**-40  # just above the tie: nearest float16 is 1 + 2^-10
    assert float(round_to(x)) == 1 + 2**-10
    assert float(np.float32(x).astype(np.float16)) == 1.0  # via float32 the 2^-40 is gone first


# ---- classify ------------------------------------------------------------------------------------
def expected_class(x: float) -> str:
    """The class from the thresholds alone (derived by hand from the format)."""
    m = abs(x)
    if math.isinf(m):
        return "inf"
    if m == 0:
        return "zero"
    if m >= OVERFLOW_THRESHOLD:
        return "overflow"
    if m <= UNDERFLOW_THRESHOLD:
        return "underflow"
    return "subnormal" if m < NORMAL_THRESHOLD else "normal"


@given(x=float16_boundary_floats())
@example(x=OVERFLOW_THRESHOLD)
@example(x=float(np.nextafter(OVERFLOW_THRESHOLD, 0)))
@example(x=UNDERFLOW_THRESHOLD)
@example(x=float(np.nextafter(UNDERFLOW_THRESHOLD, 1)))
@example(x=NORMAL_THRESHOLD)
@example(x=float(np.nextafter(NORMAL_THRESHOLD, 0)))
@example(x=-0.0)
def test_classify_follows_the_float16_thresholds_and_numpy_conversion(x: float) -> None:
    got = classify(x)
    assert got == expected_class(x)
    r = f16(x)  # the same question asked of NumPy's conversion
    if got == "overflow":
        assert np.isinf(r) and not math.isinf(x)
    elif got == "underflow":
        assert r == 0 and x != 0
    elif got == "subnormal":
        assert 0 < abs(r) < 2.0**-14
    elif got == "normal":
        assert 2.0**-14 <= abs(r) <= 65504


@given(x=half_floats())
def test_a_float16_value_never_overflows_or_underflows(x: float) -> None:
    expected = {0: "zero"}.get(abs(x), "inf" if math.isinf(x) else None)
    expected = expected or ("subnormal" if abs(x) < 2.0**-14 else "normal")
    assert classify(x) == expected


def test_classify_nan_and_float64_values_beyond_float32() -> None:
    assert classify(float("nan")) == "nan"
    assert classify(float("-inf")) == "inf"
    assert classify(1e300) == "overflow"
    assert classify(-1e-300) == "underflow"


# ---- the published constants ------------------------------------------------------------------------
def test_float16_constants() -> None:
    f = get_format("float16")
    assert (f.bits, f.exponent_bits, f.mantissa_bits) == (16, 5, 10)
    assert f.max == 65504.0
    assert f.min_normal == 2.0**-14
    assert f.min_subnormal == 2.0**-24
    assert f.epsilon == 2.0**-10
    assert f.has_inf and not f.emulated
    assert f.dtype == np.float16
    assert get_format("fp16") == get_format("half") == f


def test_float32_constants() -> None:
    f = get_format("fp32")
    assert (f.bits, f.exponent_bits, f.mantissa_bits) == (32, 8, 23)
    assert f.max == (2 - 2.0**-23) * 2.0**127
    assert (f.min_normal, f.min_subnormal, f.epsilon) == (2.0**-126, 2.0**-149, 2.0**-23)


@needs_ml_dtypes
def test_bfloat16_has_float32_range_and_7_mantissa_bits() -> None:
    bf, f32 = get_format("bf16"), get_format("float32")
    assert (bf.bits, bf.exponent_bits, bf.mantissa_bits) == (16, 8, 7)
    assert bf.exponent_bits == f32.exponent_bits  # same range ...
    assert bf.min_normal == f32.min_normal == 2.0**-126
    assert bf.max == (2 - 2.0**-7) * 2.0**127  # ... the same largest power of two, fewer bits below it
    assert bf.epsilon == 2.0**-7 and bf.min_subnormal == 2.0**-133
    assert bf.emulated and bf.dtype == np.dtype(ml_dtypes.bfloat16)


def test_unknown_format_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"'float12'.*float16"):
        get_format("float12")


def test_available_formats_include_the_native_ones() -> None:
    names = [f.name for f in formats.available_formats()]
    assert {"float16", "float32", "float64"} <= set(names)
    assert ("bfloat16" in names) == (ml_dtypes is not None)


# ---- ulp -------------------------------------------------------------------------------------------
def test_ulp_agrees_with_numpy_spacing_on_every_finite_float16() -> None:
    # np.spacing(65504) is inf (the next value up is inf); the ulp at max is 32, tested below.
    # NumPy's float16 spacing of a negative x is the gap toward zero (its float32 and float64
    # spacing point away from it), so the comparison is made on the magnitudes, x >= 0.
    for x in FINITE_HALVES[(FINITE_HALVES >= 0) & (FINITE_HALVES < 65504)]:
        assert ulp(float(x)) == float(np.spacing(x)) == ulp(-float(x)), x


@given(x=half_floats(allow_infinity=False))
def test_ulp_is_a_power_of_two_at_least_the_smallest_subnormal(x: float) -> None:
    u = ulp(x)
    assert u >= 2.0**-24 and math.frexp(u)[0] == 0.5
    assert u == (2.0**-24 if abs(x) < 2.0**-14 else 2.0 ** (math.frexp(abs(x))[1] - 11))


def test_ulp_at_the_largest_float16_and_beyond() -> None:
    assert ulp(65504.0) == 32.0
    assert ulp(65519.0) == 32.0  # still rounds to 65504
    with pytest.raises(ValueError, match="not finite"):
        ulp(65520.0)
    with pytest.raises(ValueError, match="not finite"):
        ulp(float("inf"))


# ---- lost updates ------------------------------------------------------------------------------------
def lost_in_float16(w: float, u: float) -> bool:
    """The direct computation: float16 weight plus float16 update, compared in float16."""
    with np.errstate(over="ignore", invalid="ignore"):
        w16 = f16(w)
        return bool(w16 + f16(u) == w16)


@given(w=half_floats(), u=half_floats(nonzero=True))
@example(w=1.0, u=2.0**-11)  # exactly half an ulp: the tie goes back to 1
@example(w=1.0 + 2.0**-10, u=2.0**-11)  # the same tie from an odd weight goes up
@example(w=65504.0, u=16.0)  # the tie at max rounds to inf
def test_update_is_lost_agrees_with_float16_arithmetic(w: float, u: float) -> None:
    with np.errstate(invalid="ignore"):  # inf + -inf
        assert update_is_lost(w, u) == lost_in_float16(w, u)


@given(w=st.floats(-1e5, 1e5), u=st.floats(-1e3, 1e3).filter(lambda u: u != 0))
def test_update_is_lost_takes_the_update_in_float32_as_an_optimizer_computes_it(w: float, u: float) -> None:
    """The weight is rounded to float16 first, the update to float32; the float32 sum is rounded once."""
    w16 = f16(w)
    with np.errstate(over="ignore"):
        moved = np.float16(np.float32(w16) + np.float32(u))
    assert update_is_lost(w, u) == (np.float32(u) != 0 and bool(moved == w16))


def test_a_zero_update_is_not_lost() -> None:
    assert not update_is_lost(1.0, 0.0)
    assert not update_is_lost(1.0, -0.0)


def gap_toward(w16: np.float16, sign: float) -> float:
    """The distance from w16 to its float16 neighbour in the direction `sign`.

    Past 65504 the neighbour is the overflow threshold's mirror: the gap is the ulp at max, 32.
    """
    with np.errstate(over="ignore"):
        neighbour = np.nextafter(w16, np.float16(math.copysign(np.inf, sign)))
    return 32.0 if np.isinf(neighbour) else abs(float(neighbour) - float(w16))


@given(w=half_floats(allow_infinity=False), u=half_floats(allow_infinity=False, nonzero=True))
@example(w=1.0, u=-0.75 * 2.0**-11)  # below half an ulp of 1, yet not lost: the gap below 1 is 2^-11
def test_an_update_is_lost_exactly_when_it_is_below_half_the_gap_it_points_into(w: float, u: float) -> None:
    w16 = f16(w)
    half_gap = gap_toward(w16, u) / 2
    if abs(u) < half_gap:
        assert update_is_lost(w, u)
    elif abs(u) > half_gap:
        assert not update_is_lost(w, u)
    else:  # a tie: ties to even, so lost exactly when w's last mantissa bit is 0
        assert update_is_lost(w, u) == (int(w16.view(np.uint16)) % 2 == 0)


@given(w=half_floats(allow_infinity=False), u=half_floats(allow_infinity=False, nonzero=True))
def test_an_update_pointing_away_from_zero_is_lost_below_half_an_ulp(w: float, u: float) -> None:
    u = math.copysign(u, w)  # the same direction as the weight: the gap is ulp(w)
    if abs(u) < ulp(w) / 2:
        assert update_is_lost(w, u)
    elif abs(u) > ulp(w) / 2:
        assert not update_is_lost(w, u)


@given(w=half_floats(allow_infinity=False), u=half_floats(allow_infinity=False, nonzero=True))
@example(w=1.0, u=-(2.0**-12))  # 4096 times smaller, toward zero from a power of two: a tie, kept at 1
@example(w=1.0, u=-(2.0**-11))  # 2048 times smaller, toward zero from a power of two: 1 - 2^-11 exists
def test_the_2048_rule_is_necessary_and_4096_is_sufficient(w: float, u: float) -> None:
    # ulp(w)/2 <= |w| 2^-11 for normal w, so a lost update is at least 2048 times smaller.  The
    # smallest half-gap is ulp(w)/4, toward zero from a power of two, and there |w| 2^-12 is
    # exactly that tie, which rounds back to the (even) power of two: 4096 times smaller is lost.
    if update_is_lost(w, u) and abs(w) >= 2.0**-14:
        assert abs(w) >= 2048 * abs(u)
    if abs(w) >= 4096 * abs(u):
        assert update_is_lost(w, u)


# ---- the table -------------------------------------------------------------------------------------
def test_format_table_prints_each_format_with_its_numbers() -> None:
    table = format_table()
    lines = table.splitlines()
    assert lines[0].split() == ["format", "bits", "exp", "mant", "max", "min", "normal", "min", "subnormal", "epsilon"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    expected = ["float16", "float32"] + (["bfloat16"] if ml_dtypes is not None else [])
    assert sorted(rows) == sorted(expected)
    assert rows["float16"][:8] == ["float16", "16", "5", "10", "65504", "6.104e-05", "5.96e-08", "0.0009766"]
    assert rows["float32"][1:4] == ["32", "8", "23"]
    if ml_dtypes is not None:
        assert rows["bfloat16"][1:4] == ["16", "8", "7"] and rows["bfloat16"][-1] == "(emulated)"


# ---- two roundings: the optimizers' float32 sum, then float16 -------------------------------------
def lost_rounded_once(w16: np.float16, u: float) -> bool:
    """The rule for the exact sum w + u, rounded once: lost below half the gap, and at it when w is even."""
    half_gap = Fraction(gap_toward(w16, u)) / 2
    if abs(Fraction(u)) != half_gap:
        return abs(Fraction(u)) < half_gap
    return int(w16.view(np.uint16)) % 2 == 0


@st.composite
def weights_and_float32_updates_near_a_tie(draw: st.DrawFn) -> tuple[float, float]:
    """A normal float16 weight and a float32 update within a few float32 ulps of half the gap it points into."""
    bits = draw(st.integers(0x0400, 0x7BFF))  # every normal float16 magnitude
    w = float(np.array(bits, np.uint16).view(np.float16)) * draw(st.sampled_from([1.0, -1.0]))
    sign = draw(st.sampled_from([1.0, -1.0]))
    half_gap = gap_toward(f16(w), sign) / 2
    u = np.float32(sign * half_gap)
    for _ in range(draw(st.integers(-8, 8)) % 17):  # move a few float32 ulps either way
        u = np.nextafter(u, np.float32(draw(st.sampled_from([np.inf, -np.inf]))))
    return w, float(u)


@given(wu=weights_and_float32_updates_near_a_tie())
@example(wu=(1.0, 1 / 2047.9))  # lands on the tie 1 + 2^-11 in float32, then goes to the even 1: lost
def test_two_roundings_differ_from_one_only_on_a_tie_and_keep_the_bounds(wu: tuple[float, float]) -> None:
    w, u = wu
    w16, u32 = f16(w), np.float32(u)
    with np.errstate(over="ignore"):  # near 65504 the sum may round to inf in float16: the weight moved, not lost
        twice = update_is_lost(w, u)
        assert twice == lost_updates(np.array([w16]), u32)[0]  # the one definition
    in_fp32 = np.float32(w16) + u32
    on_a_tie = abs(Fraction(float(in_fp32)) - Fraction(float(w16))) == Fraction(gap_toward(w16, u)) / 2
    if twice != lost_rounded_once(w16, float(u32)):
        assert on_a_tie and Fraction(float(in_fp32)) != Fraction(float(w16)) + Fraction(float(u32))
    if twice:  # half the gap plus half a float32 ulp of the sum, at most
        assert abs(float(u32)) <= abs(w) * 2.0**-11 * (1 + 2.0**-12)
    if abs(w) >= 4096 * abs(float(u32)):
        assert twice


def test_the_largest_lost_update_is_two_to_the_minus_11_times_one_plus_two_to_the_minus_13() -> None:
    """lost_updates.py's bound, tight: rounded first to float32, 2^-11 + 2^-24 lands on the FP16 tie 1 + 2^-11
    (and goes to the even neighbour, 1); the next float32 above it moves the weight."""
    largest = np.float32(2.0**-11 * (1 + 2.0**-13))
    assert formats.update_is_lost(1.0, float(largest))
    assert not formats.update_is_lost(1.0, float(np.nextafter(largest, np.float32(1))))
