"""Graders of Exercises 1.1 (round_to_float16), 1.2 (float16_ulp) and 1.3 (fp16_matmul)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from tinyamp.amp import formats
from tinyamp.exercises.remote import Outcome, outcomes
from tinyamp.testing import check_rounding
from tinyamp.testing.counterexamples import blamed, check_settings, number
from tinyamp.testing.strategies import format_values, rounding_inputs


def grade_round_to_float16(round_to_float16: Callable[[np.ndarray], np.ndarray], examples: int) -> None:
    """Bit for bit against float16's rounding: every float16 value, every tie and its neighbours, drawn float32."""
    check_rounding(round_to_float16, "float16", max_examples=examples)


# x just below a tie that float32 would round onto: rounded once, 2047.5 - 2^-30 is 2047 (ulp 1), but through
# float32 it is 2047.5, which ties to 2048 (ulp 2); 65520 - 2^-30 is 65504 (ulp 32), through float32 it is inf
DOUBLE_ROUNDINGS = (2047.5 - 2.0**-30, -(2047.5 - 2.0**-30), 65520 - 2.0**-30)


def grade_float16_ulp(float16_ulp: Callable[[float], float], examples: int) -> None:
    """The gap from |x| rounded to float16 to the next larger float16 magnitude; ValueError beyond float16's range.

    Drawn x (and x just below a tie, where rounding through float32 first differs), then every
    float16 value, exhaustively: 63,488 finite values and 2,048 infinities and NaNs.
    """

    @check_settings(examples)
    @given(x=format_values("float16") | rounding_inputs("float16") | st.floats(-7e4, 7e4))
    @example(x=DOUBLE_ROUNDINGS[0])
    @example(x=DOUBLE_ROUNDINGS[1])
    @example(x=DOUBLE_ROUNDINGS[2])
    def ulp_is_the_gap_above(x: float) -> None:
        ulp_at(float16_ulp, x)

    ulp_is_the_gap_above()
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float64)
    finite = np.isfinite(every)
    magnitude = np.abs(np.where(finite, every, 1.0))
    gaps = np.where(magnitude < 2.0**-14, 2.0**-24, np.ldexp(1.0, np.frexp(magnitude)[1] - 11))  # 2^(k-10)
    answers = outcomes(float16_ulp, [(x,) for x in every.tolist()])  # in one message to the student's process
    for x, is_finite, gap, answer in zip(every.tolist(), finite.tolist(), gaps.tolist(), answers):
        try:
            right = is_finite and answer.error is None and bool(answer.value == gap)
        except Exception:  # a value that does not compare: ulp_at says what it is
            right = False
        if not right:  # ValueError is right only where x is not finite; ulp_at says which it is
            ulp_at(float16_ulp, x, answer)  # raises the AssertionError in words, or returns: the ValueError was right


def ulp_at(float16_ulp: Callable[[float], float], x: float, answer: Outcome | None = None) -> None:
    """AssertionError in words unless float16_ulp(x) is the ulp of x rounded to float16 (ValueError if not finite);
    `answer`: what it gave already (a batch), else it is called."""
    with np.errstate(over="ignore"):
        v = float(np.float16(x))
    finite = math.isfinite(v)
    about = f"for x = {number(x)} ({number(v)} in float16)"
    try:
        got = float16_ulp(x) if answer is None else answer.result()
    except NotImplementedError:
        raise
    except ValueError as exc:
        if finite:
            raise AssertionError(f"{about} yours raised ValueError ({exc}); it has an ulp") from None
        return
    except Exception as exc:
        raise AssertionError(f"{about} yours raised {type(exc).__name__}: {exc}") from exc
    if not finite:
        raise AssertionError(f"{about} yours returns {got!r}: x is not finite in float16, raise ValueError")
    expected = formats.ulp(x, "float16")
    if not isinstance(got, (int, float, np.floating)) or float(got) != expected:
        raise AssertionError(
            f"{about}, a {formats.classify(v, 'float16')} value, yours gives {_shown(got)}; the ulp is "
            f"{number(expected)}: the gap from {number(abs(v))} to the next larger float16 magnitude (round x "
            "to float16 once, directly)"
        )


def _shown(value: Any) -> str:
    return number(value) if isinstance(value, (int, float, np.floating)) else repr(value)


# ---- 1.3: one rounding per output ------------------------------------------------------------------------
@st.composite
def matrix_pairs(draw: Any) -> tuple[np.ndarray, np.ndarray]:
    """(a, b): float16 (M, K) and (K, N), M, N <= 3, K <= 4, entries n * 2^e with |n| <= 64.

    Each product is at most 2^12 units of 2^(ea + eb), and a sum of 4 at most 2^14: exact in
    float32 in any order, so the float32 sum is one number and its rounding one answer.
    Sums above 2048 units lose bits in float16 (a float16 running sum would differ); with
    2^(ea + eb) from 2^-30 to 2^8, results land among the subnormals and overflow to inf too.
    """
    m, k, n = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    ea, eb = draw(st.integers(-15, 4)), draw(st.integers(-15, 4))
    a = np.array(draw(st.lists(st.integers(-64, 64), min_size=m * k, max_size=m * k)), float).reshape(m, k) * 2.0**ea
    b = np.array(draw(st.lists(st.integers(-64, 64), min_size=k * n, max_size=k * n)), float).reshape(k, n) * 2.0**eb
    return a.astype(np.float16), b.astype(np.float16)


def grade_fp16_matmul(fp16_matmul: Callable[[np.ndarray, np.ndarray], np.ndarray], examples: int) -> None:
    """Against the exact sum of products rounded once to float16: 1 x 1 first, then drawn matrices."""

    @check_settings(examples)
    @given(case=matrix_pairs())
    @example(case=ONE_TIMES_ONE)
    def one_rounding_per_output(case: tuple[np.ndarray, np.ndarray]) -> None:
        a, b = case
        about = f"for a of shape {a.shape} and b of shape {b.shape} (float16)"
        try:
            got = fp16_matmul(a.copy(), b.copy())
        except NotImplementedError:
            raise
        except Exception as exc:
            raise AssertionError(f"{about} yours raised {type(exc).__name__}: {exc}") from exc
        exact = a.astype(np.float64) @ b.astype(np.float64)  # exact: see matrix_pairs
        with np.errstate(over="ignore"):
            expected = exact.astype(np.float16)
        if not isinstance(got, np.ndarray) or got.dtype != np.float16 or got.shape != expected.shape:
            raise AssertionError(
                f"{about} return a float16 array of shape {expected.shape}; yours returned "
                f"{type(got).__name__} {getattr(got, 'dtype', '')} {getattr(got, 'shape', '')}"
            )
        wrong = np.flatnonzero(got.reshape(-1).view(np.uint16) != expected.reshape(-1).view(np.uint16))
        if wrong.size:
            i, j = np.unravel_index(int(wrong[0]), expected.shape)
            raise AssertionError(
                f"for row {i} of a = {_values(a[i])} and column {j} of b = {_values(b[:, j])} (float16): your "
                f"[{i}, {j}] is {number(got[i, j])}; the exact sum of products is {number(exact[i, j])}, which rounds "
                f"once to {number(expected[i, j])} in float16 (products are exact in float32: widen, sum in float32, "
                "round at the end)"
            )

    one_rounding_per_output()
    a, b = FLOAT32_MUST_ROUND
    with blamed(f"for a = {_values(a[0])} and b = {_values(b[:, 0])} (float16), yours"):
        got = fp16_matmul(a.copy(), b.copy())
    shaped = isinstance(got, np.ndarray) and got.dtype == np.float16 and got.shape == (1, 1)
    if not (shaped and got[0, 0] == 1):
        raise AssertionError(
            f"for a = [[1, 2^-11, 2^-15]] and b = [[1], [1], [2^-15]] (float16) yours gives "
            f"{number(got[0, 0]) if shaped else repr(got)}, expected 1: the "
            "products 1, 2^-11 and 2^-30 are exact in float32, but their sum needs 31 bits; float32 rounds it to "
            "1 + 2^-11, halfway between the float16 neighbours 1 and 1 + 2^-10, and the tie goes to the even one, 1 "
            "(the sums must be float32: a float64 sum keeps the 2^-30 and rounds up)"
        )


# the simplest product, [[1]] @ [[1]], met first: a product left out shows here as 0, whatever hypothesis draws
# (its shrinking does not always take a drawn counterexample down to one row and one column)
ONE_TIMES_ONE = (np.ones((1, 1), np.float16), np.ones((1, 1), np.float16))

# one output whose float32 sum rounds: 1 + 2^-11 + 2^-30 is 1 + 2^-11 in float32 (in any order), a float16 tie
FLOAT32_MUST_ROUND = (
    np.array([[1.0, 2.0**-11, 2.0**-15]], np.float16),
    np.array([[1.0], [1.0], [2.0**-15]], np.float16),
)


def _values(v: np.ndarray) -> str:
    return "[" + ", ".join(number(x) for x in v) + "]"
