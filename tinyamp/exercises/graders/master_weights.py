"""Graders of Exercises 4.1 (update_is_lost) and 4.2 (master_step)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tinyamp.amp import formats
from tinyamp.testing import check_master_step
from tinyamp.testing.counterexamples import binade_in_words, blamed, check_settings, number
from tinyamp.testing.master_step import reference_master_step
from tinyamp.testing.strategies import format_values


def half_gap(weight: float, direction: float) -> float:
    """Half the gap from the float16 `weight` to its neighbour in `direction` (+1 up, -1 down)."""
    w, ulp = abs(weight), formats.ulp(weight, "float16")
    toward_zero = weight != 0 and (direction < 0) == (weight > 0)
    below_a_power_of_two = toward_zero and math.frexp(w)[0] == 0.5 and w > 2.0**-14
    return (ulp / 2 if below_a_power_of_two else ulp) / 2


@st.composite
def weights_and_updates(draw: Any) -> tuple[float, float]:
    """(float16 weight, float32 update): mostly updates at, or one float32 step either side of, half the gap
    to the neighbour in their direction, where ties to even and the float32 sum decide; powers of two weighted."""
    powers = st.integers(-14, 15).map(lambda k: 2.0**k)
    weight = draw(format_values("float16", allow_nan=False, allow_infinity=False) | powers | powers.map(lambda p: -p))
    direction = draw(st.sampled_from([1.0, -1.0]))
    half = half_gap(weight, direction)
    kind = draw(st.sampled_from(["tie", "near", "near", "scaled", "any"]))
    if kind == "tie":
        update = direction * half
    elif kind == "near":  # one to three float32 ulps of the update away from the tie: the float32 sum rounds here
        update = direction * half * (1 + draw(st.integers(-3, 3)) * 2.0**-23)
    elif kind == "scaled":
        update = direction * half * draw(st.sampled_from([0.25, 0.5, 0.75, 1.5, 2.0, 3.0]) | st.floats(0.0, 4.0))
    else:
        update = draw(st.floats(-1.0, 1.0, width=32))
    return weight, float(np.float32(update))


def grade_update_is_lost(update_is_lost: Callable[[float, float], bool], examples: int) -> None:
    """Against tinyamp.amp.formats.update_is_lost: the float32 sum rounded once to float16 gives the weight back."""

    @check_settings(examples)
    @given(case=weights_and_updates())
    def lost_exactly_when_rounding_gives_the_weight_back(case: tuple[float, float]) -> None:
        check_one_update(update_is_lost, *case)

    lost_exactly_when_rounding_gives_the_weight_back()
    for weight, update in WORKED_CASES:  # after the drawn cases, so that their (simplest) messages come first
        check_one_update(update_is_lost, weight, update)


# the docstring's worked example (1 loses +2^-11, not -2^-11: the gap below a power of two is half) and
# 2^-14, the smallest normal, which has a full gap below it: -2^-25 is a tie there, and 1024 * 2^-24 is even
WORKED_CASES = ((1.0, 2.0**-11), (1.0, -(2.0**-11)), (2.0**-14, -(2.0**-25)), (-(2.0**-14), 2.0**-25))


def check_one_update(update_is_lost: Callable[[float, float], bool], weight: float, update: float) -> None:
    """AssertionError in words unless update_is_lost(weight, update) is what float16 rounding says."""
    about = f"for weight = {number(weight)} and update = {number(update)}"
    try:
        got = update_is_lost(weight, update)
    except NotImplementedError:
        raise
    except Exception as exc:
        raise AssertionError(f"{about} yours raised {type(exc).__name__}: {exc}") from exc
    expected = formats.update_is_lost(weight, update, "float16")
    yours = repr(bool(got)) if isinstance(got, np.bool_) else repr(got)  # True, not np.True_
    if update == 0 and isinstance(got, (bool, np.bool_)) and bool(got):
        raise AssertionError(
            f"{about} yours says {yours}, expected False: an update of 0 is not a lost update (the rule: True "
            "when the float32 sum, rounded to float16, gives the weight back *and the update is not 0*)"
        )
    if not isinstance(got, (bool, np.bool_)) or bool(got) != expected:
        total = float(np.float32(weight) + np.float32(update))
        direction = 1.0 if update > 0 else -1.0
        rounded = float(formats.round_to(total, "float16"))
        tie = abs(total - weight) == half_gap(weight, direction)
        raise AssertionError(
            f"{about} yours says {yours}, expected {expected}: the float32 sum {number(total)} rounds to "
            f"{number(rounded)} in float16 (half the gap from the weight to its neighbour "
            f"{'above' if direction > 0 else 'below'} is {number(half_gap(weight, direction))}; "
            + (f"the sum is exactly halfway: a tie, which goes to the even neighbour; {last_bit_in_words(weight)})"
               if tie else "a tie goes to the even neighbour)")
            + (f"; the weight is {binade_in_words(weight)}" if weight != 0 else "")
        )  # fmt: skip


def last_bit_in_words(weight: float) -> str:
    """The weight's last mantissa bit read as 4.1's docstring reads it, from the parity of |w| / ulp(w):
    "|w| / ulp(w) = 1025, odd: the weight's last mantissa bit is 1, so the tie leaves it"."""
    in_ulps = int(abs(weight) / formats.ulp(weight, "float16"))  # a whole number below 2^11: exact
    if in_ulps % 2:
        return f"|w| / ulp(w) = {in_ulps}, odd: the weight's last mantissa bit is 1, so the tie leaves it"
    return f"|w| / ulp(w) = {in_ulps}, even: the weight's last mantissa bit is 0, so the tie keeps it"


# a step whose float32 arithmetic shows: float32(1e-4) * 1.5 rounds to 1.4999999e-4 in float32, while the
# float64 step 1.5e-4 rounds (once, at the end) to 1.5000001e-4
FLOAT32_STEP = (np.zeros(1, np.float16), np.zeros(1, np.float32), np.array([1.5], np.float16), 1e-4)


def grade_master_step(master_step: Callable[..., Any], examples: int) -> None:
    """Bit for bit against MasterWeights(SGD): the update in float32, the round back, the lost updates counted;
    drawn steps, then one whose float32 product and float64 product round to different float32 values."""
    check_master_step(master_step, max_examples=examples)
    w16, master, grad16, lr = FLOAT32_STEP
    about = f"for w16 = [0], master = [0], grad16 = [1.5] and lr = {lr!r}"
    with blamed(f"{about}, your master_step"):
        new_w16, new_master, _ = master_step(w16.copy(), master.copy(), grad16.copy(), lr)
    expected = reference_master_step(w16, master, grad16, lr)[1]
    if not isinstance(new_master, np.ndarray) or new_master.dtype != np.float32 or new_master.shape != (1,):
        raise AssertionError(f"{about}: your new master must be a float32 array of shape (1,); it is {new_master!r}")
    if new_master.view(np.uint32)[0] != expected.view(np.uint32)[0]:
        raise AssertionError(
            f"{about}: your new master[0] is {number(new_master[0])}, expected {number(expected[0])}: master - "
            f"float32(lr) * widened grad16, computed in float32: float32(lr) is {number(np.float32(lr))} and the "
            "product is rounded to float32 before the subtraction (a float64 step rounds once, to another float32)"
        )
