"""The engine room's float32 sum of squares (tinyamp/engine/fast/sums.py) keeps the bound its docstring states."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tinyamp import kernels
from tinyamp.engine.fast import sums

pytestmark = pytest.mark.engine_room


def exact(g: np.ndarray) -> float:
    return math.fsum((g.astype(np.float64) ** 2).tolist())


@pytest.mark.parametrize("size", [65537, 1 << 20, (1 << 20) + 77])
@pytest.mark.parametrize("magnitude", [1e-15, 1.0, 1e17])
def test_a_large_float32_sum_is_within_6e_5_of_the_exact_one(size: int, magnitude: float) -> None:
    g = (np.random.default_rng(size).standard_normal(size) * magnitude).astype(np.float32)
    fast, reference = float(sums.sum_of_squares(g)), exact(g)
    assert abs(fast - reference) <= 6e-5 * reference
    with kernels.reference_only():  # the reference widens to float64: far closer
        assert abs(float(kernels.sum_of_squares(g)) - reference) <= 1e-12 * reference
    assert float(kernels.sum_of_squares(g)) == fast  # the engine room answers for kernels


def test_small_wide_or_16_bit_gradients_are_left_to_the_reference() -> None:
    for g in (np.ones(65536, np.float32), np.ones(70000, np.float16), np.ones(70000, np.float64)):
        assert sums.sum_of_squares(g) is NotImplemented


def test_squares_below_floats_normal_range_are_left_to_the_reference() -> None:
    g = np.full(70000, 2.0**-70, np.float32)  # each square, 2^-140, is a float32 subnormal
    assert sums.sum_of_squares(g) is NotImplemented
    assert float(kernels.sum_of_squares(g)) == 70000 * 2.0**-140  # exact in float64


@pytest.mark.parametrize("bad", [np.inf, np.nan, 3e38])
def test_a_total_that_is_not_finite_is_summed_again_by_the_reference(bad: float) -> None:
    g = np.ones(70000, np.float32)
    g[12345] = bad
    assert sums.sum_of_squares(g) is NotImplemented
    total = float(kernels.sum_of_squares(g))
    if bad == 3e38:
        assert total == exact(g)  # a finite gradient: (3e38)^2 fits float64, so the norm stays finite
    else:
        assert not math.isfinite(total)
