"""The arithmetic of the gradient all-reduce (``tinyamp/distributed/allreduce.py``) on one process.

What pre-dividing by N does at both ends of FP16's range, as the module's docstring and tutorial 9
state it: at the small end the exact boundary of the flush to zero, at the large end when the
FP16 sum of N quotients can still overflow.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from strategies import half_floats

pytest.importorskip("mpi4py", reason="tinyamp.distributed needs mpi4py: pip install -e '.[mpi]'")
from tinyamp.distributed.allreduce import divide, sum_in_rank_order  # noqa: E402

pytestmark = pytest.mark.optim

TIE = Fraction(1, 2**25)  # half of FP16's smallest subnormal


def worst_predivided_sum(n: int) -> float:
    """N copies of fp16(65504 / N) summed in rank order: the largest sum of N pre-divided FP16 values."""
    quotient = divide(np.array([65504.0], np.float16), n)
    with np.errstate(over="ignore"):
        return float(sum_in_rank_order([quotient] * n)[0])


@given(g=half_floats(allow_infinity=False, nonzero=True), n=st.integers(2, 64))
@example(g=2.0**-24, n=2)  # the quotient is the tie 2^-25 itself: to the even neighbour, 0
@example(g=2.0**-23, n=3)  # 2/3 of 2^-24: above the tie, up to 2^-24
@example(g=2.0**-24, n=3)  # 1/3 of 2^-24: below the tie, 0
def test_a_quotient_flushes_to_zero_exactly_at_or_below_two_to_the_minus_25(g: float, n: int) -> None:
    q = float(divide(np.array([g], np.float16), n)[0])
    exact = abs(Fraction(g)) / n
    if exact <= TIE:
        assert q == 0
    else:
        assert abs(q) >= 2.0**-24


def test_pre_dividing_by_three_or_five_can_still_overflow_but_not_by_a_power_of_two() -> None:
    assert float(divide(np.array([65504.0], np.float16), 3)[0]) == 21840  # 65504/3 rounds up ...
    assert worst_predivided_sum(3) == np.inf  # ... and 3 x 21840 = 65520, the tie that rounds to inf
    assert worst_predivided_sum(5) == np.inf
    assert all(worst_predivided_sum(2**k) == 65504 for k in range(1, 12))


def halves(lowest_bits: int) -> st.SearchStrategy[float]:
    """Finite float16 values of either sign from their bit patterns, magnitudes from `lowest_bits` to 65504."""
    magnitude = st.integers(lowest_bits, 0x7BFF).map(lambda b: float(np.array(b, np.uint16).view(np.float16)))
    return st.tuples(magnitude, st.booleans()).map(lambda ms: -ms[0] if ms[1] else ms[0])


# every finite value, or one from 16384 up: the largest quotients, near the worst case
@given(n=st.integers(2, 16), values=st.lists(halves(0) | halves(0x7400), min_size=16, max_size=16))
def test_no_n_quotients_sum_higher_than_n_copies_of_the_largest(n: int, values: list[float]) -> None:
    """Rounding is monotone: the worst case of the pre-divided sum is N copies of fp16(65504 / N)."""
    grads = values[:n]
    parts = [divide(np.array([g], np.float16), n) for g in grads]
    with np.errstate(over="ignore", invalid="ignore"):
        total = float(sum_in_rank_order(parts)[0])
    worst = worst_predivided_sum(n)
    assert abs(total) <= worst
