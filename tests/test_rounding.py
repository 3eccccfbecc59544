"""tinyamp/rounding.py: rounding to float16 with one float32 addition, and widening back, give IEEE's bits.

The reference every cast of the library stands on (``kernels.cast``), so it is checked
against NumPy's own conversion on every float16 value, every rounding boundary and tie,
and drawn float32 bit patterns (NaN payloads, infinities, float32 subnormals).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import example, given
from strategies import float16_bit_patterns, float32_bit_patterns

from tinyamp import kernels
from tinyamp.rounding import round_to_float16, widen_float16

pytestmark = pytest.mark.formats

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
ALL_FLOAT16 = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(F16)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def numpy_cast(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the overflow warning NumPy gives (the formula warns the same)
        return x.astype(dtype)


def test_widening_is_exact_on_every_float16_bit_pattern() -> None:
    assert same_bits(widen_float16(ALL_FLOAT16), ALL_FLOAT16.astype(F32))  # NaN payloads, +-0, subnormals


def test_rounding_every_float16_value_and_every_boundary_between_two() -> None:
    """Every finite float16 value, each midpoint (a tie) and the float32 values on either side of it."""
    values = np.sort(ALL_FLOAT16[np.isfinite(ALL_FLOAT16)].astype(np.float64))
    mids = (values[:-1] + values[1:]) / 2
    points = np.concatenate([values, mids, [65520.0, 2.0**-25, 3 * 2.0**-26]]).astype(F32)
    bits = points.view(np.uint32).astype(np.int64)
    near = np.concatenate([bits + d for d in (-1, 0, 1)]) % 2**32
    x = np.concatenate([near.astype(np.uint32).view(F32), -points])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert same_bits(round_to_float16(x), numpy_cast(x, F16))


@given(float32_bit_patterns(256))
@example(np.array([2049.0, 2051.0, 1 + 2**-11, 2.0**-25, 65519.0, 65520.0, np.inf, -0.0], F32))
def test_rounding_any_float32_bit_pattern(x: np.ndarray) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert same_bits(round_to_float16(x), numpy_cast(x, F16))


@given(float16_bit_patterns(256))
def test_widening_any_float16_bit_pattern(h: np.ndarray) -> None:
    assert same_bits(widen_float16(h), h.astype(F32))


def test_ties_go_to_the_even_neighbour() -> None:
    """2049 and 2051 lie halfway between float16 neighbours 2 apart: both go to the one whose last bit is 0."""
    x = np.array([2049.0, 2051.0, 2.0**-25, 3 * 2.0**-25], F32)
    assert round_to_float16(x).tolist() == [2048.0, 2052.0, 0.0, 2.0**-23]


def test_the_reference_cast_is_these_formulas() -> None:
    """With the engine room switched off, kernels.cast runs rounding.py on NumPy arrays."""
    x = np.linspace(-70000, 70000, 1001, dtype=F32)
    with kernels.reference_only(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert same_bits(kernels.cast(x, F16), round_to_float16(x))
        assert same_bits(kernels.cast(ALL_FLOAT16, F32), widen_float16(ALL_FLOAT16))


def test_an_overflow_warns_as_numpy_does() -> None:
    with pytest.warns(RuntimeWarning, match="overflow"):
        out = round_to_float16(np.array([1.0, 70000.0], F32))
    assert out.tolist() == [1.0, np.inf]


@pytest.mark.parametrize("shape", [(), (1,), (3, 4), (2, 0, 5)])
def test_any_shape_keeps_its_shape(shape: tuple[int, ...]) -> None:
    """0-d included: NumPy's arithmetic on 0-d arrays returns scalars, which the formulas must not."""
    x = np.full(shape, 1.5 + 2**-12, F32)  # a value that rounds
    h = round_to_float16(x)
    assert isinstance(h, np.ndarray) and h.shape == shape and same_bits(h, x.astype(F16))
    assert isinstance(widen_float16(h), np.ndarray) and same_bits(widen_float16(h), h.astype(F32))
