"""check_rounding: a conversion to FP16 or BF16, bit for bit against the format's own rounding.

    from tinyamp.testing import check_rounding

    def test_my_cast():
        check_rounding(my_round_to_float16, "float16")

`fn` takes a 1-D float32 array and returns the array rounded to `fmt` (to nearest, ties
to even, as IEEE 754 and NumPy's ``astype`` do; ml_dtypes for bfloat16).  A 16-bit format
has few enough values to check them all: every one of its 65,536 bit patterns, every tie
halfway between two neighbouring values (the tie between the largest value and the next
power of two is the overflow threshold, 65520 in float16; the tie between 0 and the
smallest subnormal is half of it), and the float32 values just below and just above every
tie.  Then hypothesis draws float32 values (``strategies.rounding_inputs`` and any bit
pattern).  A NaN must round to a NaN (any payload); every other result must have exactly
the format's bits, the sign of zero included.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tinyamp.testing.counterexamples import blamed, check_settings, number, reported_at_the_call
from tinyamp.testing.strategies import format_dtype, rounding_inputs

SIXTEEN_BIT = ("float16", "bfloat16")


@reported_at_the_call
def check_rounding(fn: Callable[[np.ndarray], Any], fmt: str = "float16", *, max_examples: int | None = None) -> None:
    """Check that `fn` rounds float32 arrays to `fmt` ("float16" or "bfloat16") bit for bit.

    Every value of `fmt`, every tie between neighbours and the float32 values either side
    of each (about 256,000 values, in one call), then drawn float32 arrays.  Raises
    AssertionError naming the value, where it lies between the format's neighbours, what
    `fn` gave and what the format gives.
    """
    if fmt not in SIXTEEN_BIT:
        raise ValueError(f"check_rounding checks float32 -> {' or '.join(SIXTEEN_BIT)}; got {fmt!r}")
    table = _finite_values(fmt)
    x = every_rounding_case(fmt)
    _compare(fn, x, fmt, table, f"of the {x.size:,} values checked (every {fmt} value, every tie between two "
             "neighbours, and the float32 values either side of each tie)")  # fmt: skip

    @check_settings(max_examples)
    @given(values=st.lists(rounding_inputs(fmt), min_size=1, max_size=32))
    def rounds_like_the_format(values: list[float]) -> None:
        with np.errstate(over="ignore"):
            x = np.array(values, dtype=np.float32)
        _compare(fn, x, fmt, table, "of these drawn values")

    rounds_like_the_format()


def every_rounding_case(fmt: str) -> np.ndarray:
    """float32: every value of the 16-bit `fmt`, every tie between neighbours, and the float32 values either side."""
    dt = format_dtype(fmt)
    with np.errstate(invalid="ignore"):  # the NaN patterns
        values = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(dt).astype(np.float32)
    table = _finite_values(fmt)
    positive = table[table > 0]
    low = np.concatenate([[0.0], positive])
    high = np.concatenate([positive, [2 * positive[-1] - positive[-2]]])  # past the largest: one more top ulp
    ties = ((low + high) / 2).astype(np.float32)  # exact: a tie needs one more bit than the format has
    below = np.nextafter(ties, np.float32(0))
    above = np.nextafter(ties, np.float32(np.inf))
    magnitudes = np.concatenate([ties, below, above])
    return np.concatenate([values, magnitudes, -magnitudes])


def _finite_values(fmt: str) -> np.ndarray:
    """Every finite value of `fmt`, as sorted float64 (one zero)."""
    dt = format_dtype(fmt)
    with np.errstate(invalid="ignore"):  # the NaN patterns
        v = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(dt).astype(np.float64)
    return np.unique(v[np.isfinite(v)])


def _compare(fn: Callable[[np.ndarray], Any], x: np.ndarray, fmt: str, table: np.ndarray, among: str) -> None:
    dt = format_dtype(fmt)
    with blamed(f"your rounding of {x.size} float32 values"):
        out = fn(x.copy())
    if not isinstance(out, np.ndarray) or out.dtype != dt or out.shape != x.shape:
        got = f"a {type(out).__name__} of dtype {getattr(out, 'dtype', '-')} and shape {getattr(out, 'shape', '-')}"
        raise AssertionError(f"it must return a {fmt} array of shape {x.shape}, like its input; it returned {got}")
    with np.errstate(over="ignore", invalid="ignore"):  # rounding to inf, and NaN inputs, are what is checked
        expected = x.astype(dt)
    bits = f"u{dt.itemsize}"
    same = (out.view(bits) == expected.view(bits)) | (np.isnan(out.astype(np.float32)) & np.isnan(x))
    if same.all():
        return
    wrong = np.flatnonzero(~same)
    with np.errstate(all="ignore"):  # the counterexample nearest to 1 reads best: 1 + 2^-11, not 2^-25 (NaN last)
        distance = np.abs(np.log2(np.abs(x[wrong].astype(np.float64))))
    i = wrong[np.argmin(np.where(np.isnan(distance), np.inf, distance))]
    value = x[i]
    raise AssertionError(
        f"for x = {number(value)} (float32 bits 0x{int(value.view(np.uint32)):08x}), "
        f"{position_in_words(float(value), fmt, table)}, yours gives {_value(out[i])}; {fmt} rounds it to "
        f"{_value(expected[i])} (to nearest, ties to even). {wrong.size:,} {among} differ"
    )


def _value(v: Any) -> str:
    return number(float(np.asarray(v).astype(np.float32)))


def position_in_words(x: float, fmt: str, table: np.ndarray) -> str:
    """Where `x` lies among the values of `fmt`: a value itself, halfway between two, nearer one, beyond the largest."""
    if math.isnan(x):
        return "a NaN"
    if math.isinf(x):
        return "an infinity"
    i = int(np.searchsorted(table, x, side="right"))
    low = table[i - 1] if i > 0 else -math.inf
    if low == x:
        return f"itself a {fmt} value"
    if i == len(table) or i == 0:
        largest = number(table[-1])
        return f"beyond the largest {fmt} value {largest} (the overflow threshold is halfway to the next power of two)"
    high = table[i]
    between = f"between the {fmt} neighbours {number(low)} and {number(high)}"
    middle = (low + high) / 2
    if x == middle:
        return f"exactly halfway {between}"
    return f"{'just ' if _next_to(x, middle) else ''}{'below' if x < middle else 'above'} halfway {between}"


def _next_to(x: float, middle: float) -> bool:
    m = np.float32(middle)
    return float(np.nextafter(m, np.float32(-np.inf))) == x or float(np.nextafter(m, np.float32(np.inf))) == x
