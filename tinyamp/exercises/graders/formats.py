"""Graders of Exercises 1.1 (round_to_float16), 1.2 (float16_ulp) and 1.3 (fp16_matmul)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tinyamp.amp import formats
from tinyamp.testing import check_rounding
from tinyamp.testing.counterexamples import check_settings, number
from tinyamp.testing.strategies import format_values, rounding_inputs


def grade_round_to_float16(round_to_float16: Callable[[np.ndarray], np.ndarray], examples: int) -> None:
    """Bit for bit against float16's rounding: every float16 value, every tie and its neighbours, drawn float32."""
    check_rounding(round_to_float16, "float16", max_examples=examples)


def grade_float16_ulp(float16_ulp: Callable[[float], float], examples: int) -> None:
    """The gap from |x| rounded to float16 to the next larger float16 magnitude; ValueError beyond float16's range."""

    @check_settings(examples)
    @given(x=format_values("float16") | rounding_inputs("float16") | st.floats(-7e4, 7e4))
    def ulp_is_the_gap_above(x: float) -> None:
        with np.errstate(over="ignore"):
            v = float(np.float16(x))
        finite = math.isfinite(v)
        about = f"for x = {number(x)} ({number(v)} in float16)"
        try:
            got = float16_ulp(x)
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
                f"{number(expected)}: the gap from {number(abs(v))} to the next larger float16 magnitude"
            )

    ulp_is_the_gap_above()


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
    """Against the exact sum of products rounded once to float16."""

    @check_settings(examples)
    @given(case=matrix_pairs())
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


def _values(v: np.ndarray) -> str:
    return "[" + ", ".join(number(x) for x in v) + "]"
