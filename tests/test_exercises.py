"""The exercises: stubs and solutions that match, graders that pass the solutions and fail wrong ones
clearly, the checks that the graded code is the student's, and the `tinyamp exercises` command."""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from exercise_helpers import IDS, ROOT, grade_remote, grader, solution
from exercise_solutions import data_parallel as data_parallel_solutions
from exercise_solutions import loss_scaling as scaling_solutions
from exercise_solutions import master_weights as master_solutions
from exercise_solutions import op_policy as policy_solutions
from exercise_solutions.checkpointing import CheckpointedSegment

from tinyamp.exercises import command, holes
from tinyamp.exercises.catalog import EXERCISES, PACKAGE, find
from tinyamp.exercises.graders.master_weights import check_one_update, half_gap
from tinyamp.exercises.grading import FAILED, NOT_STARTED, PASSED, float16_conversion, grade, tinyamp_names_used
from tinyamp.exercises.source_checks import float8_mention
from tinyamp.exercises.workspace import write_workspace
from tinyamp.function import Function
from tinyamp.grad_mode import enable_grad
from tinyamp.tensor import Tensor
from tinyamp.testing.counterexamples import same_examples_every_run

pytestmark = pytest.mark.cli


# ---- every grader passes its reference solution -------------------------------------------------------------
@pytest.mark.parametrize("exercise_id", IDS)
def test_grader_passes_the_reference_solution(exercise_id: str) -> None:
    with np.errstate(all="ignore"):
        grader(exercise_id)(solution(exercise_id), max(10, find(exercise_id).examples // 4))


# ---- ... and fails wrong ones, with the counterexample in words ------------------------------------------------
def _grade_wrong(exercise_id: str, wrong: Any, match: str) -> None:
    """As `tinyamp exercises check` grades: the same examples every run, so a miss here is a miss every time."""
    with np.errstate(all="ignore"), same_examples_every_run(), pytest.raises(AssertionError, match=match):
        grader(exercise_id)(wrong, find(exercise_id).examples)


# 1.1: float32 -> float16
def round_ties_away_from_zero(x: np.ndarray) -> np.ndarray:
    r = x.astype(np.float16)
    up = np.nextafter(r, np.copysign(np.float16(np.inf), r))
    tie = np.isfinite(x) & (np.abs(x.astype(np.float64) - r) * 2 == np.abs(up.astype(np.float64) - r))
    return np.where(tie & (np.abs(x) > np.abs(r)), up, r)


def round_toward_zero(x: np.ndarray) -> np.ndarray:
    r = x.astype(np.float16)
    return np.where(np.abs(r.astype(np.float32)) > np.abs(x), np.nextafter(r, np.float16(0)), r)


def flush_subnormals(x: np.ndarray) -> np.ndarray:
    r = x.astype(np.float16)
    return np.where(np.abs(r) < 2.0**-14, np.float16(0), r)


def saturate_at_65504(x: np.ndarray) -> np.ndarray:
    r = x.astype(np.float16)
    return np.where(np.isinf(r) & np.isfinite(x), np.copysign(np.float16(65504), r), r)


@pytest.mark.parametrize(
    "wrong, match",
    [
        (round_ties_away_from_zero, r"x = 1\.00048828125 .* exactly halfway between the float16 neighbours 1 and "),
        (round_toward_zero, r"just above halfway between the float16 neighbours .*yours gives"),
        (flush_subnormals, r"between the float16 neighbours 6\.09.*e-05 and 2\^-14, yours gives 0;"),
        (
            saturate_at_65504,
            r"x = 65520 .* beyond the largest float16 value 65504 .* yours gives 65504; float16 rounds",
        ),
    ],
)
def test_ex1_1_grader_fails_wrong_roundings(wrong: Callable, match: str) -> None:
    _grade_wrong("ex1_1", wrong, match)


def test_ex1_1_docstring_says_where_b_overflows_and_relates_the_two_bit_recipes() -> None:
    """B = 2^(E+13) is inf in float32 from the first E with E + 13 = 128; the docstring names that |x|, and
    A1's 126 << 10 on the sum is 1.1's 112 << 10 on r plus B's 13 binades and the implicit bit."""
    from tinyamp import rounding

    doc = " ".join(inspect.getdoc(solution("ex1_1")).split())  # the stub's is the same (tested above)
    with np.errstate(over="ignore"):
        first = next(e for e in range(-14, 200) if np.isinf(np.ldexp(np.float32(1), e + 13)))
        x = np.array([np.nextafter(np.float32(2.0**first), np.float32(0)), 2.0**first], np.float32)
        big = np.ldexp(np.float32(1), np.frexp(x)[1] - 1 + 13).astype(np.float32)
    assert np.isfinite(big[0]) and np.isinf(big[1])  # the threshold is the power of two itself
    assert f"B itself overflows float32 from |x| = 2^{first} on (E + 13 = {first + 13})" in doc
    assert rounding.REBIAS == (127 - 15 + 13 + 1) << 10 and "126 = 112 + 13 + 1" in doc and "(126 << 10)" in doc


# 1.2: the ulp
def ulp_by_np_spacing(x: float) -> float:
    return float(np.spacing(np.float16(x)))


def ulp_of_x_not_of_its_rounding(x: float) -> float:
    return 2.0 ** (np.frexp(abs(x))[1] - 11) if abs(x) >= 2.0**-14 else 2.0**-24


def ulp_with_no_subnormal_case(x: float) -> float:
    v = abs(float(np.float16(x)))
    if not np.isfinite(v):
        raise ValueError("not finite")
    return 2.0 ** (np.frexp(v)[1] - 11) if v else 2.0**-24


@pytest.mark.parametrize(
    "wrong, match",
    [
        (ulp_by_np_spacing, r"for x = .* yours (gives|returns)"),
        (ulp_of_x_not_of_its_rounding, r"for x = .* \(.* in float16\).* yours (gives .*; the ulp is|returns)"),
        (ulp_with_no_subnormal_case, r"a subnormal value, yours gives .*; the ulp is 2\^-24"),
    ],
)
def test_ex1_2_grader_fails_wrong_ulps(wrong: Callable, match: str) -> None:
    _grade_wrong("ex1_2", wrong, match)


# 2.1 to 2.3: backwards
WRONG_BACKWARDS = [
    ("ex2_1", lambda y, g, axis: y * g),  # forgot the sum
    ("ex2_1", lambda y, g, axis: g - (g * y).sum(axis=axis, keepdims=True)),  # forgot the factor y
    ("ex2_1", lambda y, g, axis: y * (g - (g * y).sum(axis=-1, keepdims=True))),  # ignores axis
    ("ex2_2", lambda y, g, axis: g - y * g.sum(axis=axis, keepdims=True)),  # log-probabilities as probabilities
    ("ex2_2", lambda y, g, axis: g - np.exp(y) * g),  # no sum
    ("ex2_2", lambda y, g, axis: g - np.exp(y) * g.sum()),  # the sum over every axis
    ("ex2_3", lambda xhat, rstd, g: rstd * g),  # as if mean and variance were constants
    ("ex2_3", lambda xhat, rstd, g: rstd * (g - g.mean(axis=-1, keepdims=True))),  # forgot the variance's share
    ("ex2_3", lambda xhat, rstd, g: rstd * (g - g.sum(-1, keepdims=True) - xhat * (g * xhat).sum(-1, keepdims=True))),
]


@pytest.mark.parametrize("exercise_id, wrong", WRONG_BACKWARDS)
def test_ex2_graders_fail_wrong_backwards(exercise_id: str, wrong: Callable) -> None:
    _grade_wrong(
        exercise_id, wrong, r"for x = \[.*\(shape .*element .*: your \w+_backward gives .*, finite differences give"
    )


# 4.1: the lost update
def lost_below_half_an_ulp(weight: float, update: float) -> bool:
    """Blind to direction and to ties: the rule of thumb, not the rule."""
    w = abs(weight)
    ulp = 2.0**-24 if w < 2.0**-14 else 2.0 ** (np.frexp(w)[1] - 11)
    return update != 0 and abs(update) < ulp / 2


def lost_at_half_an_ulp_too(weight: float, update: float) -> bool:
    w = abs(weight)
    ulp = 2.0**-24 if w < 2.0**-14 else 2.0 ** (np.frexp(w)[1] - 11)
    return update != 0 and abs(update) <= ulp / 2


def lost_with_an_exact_sum(weight: float, update: float) -> bool:
    """The gap rule done right, but on the exact sum: float32 rounds the sum first, and that decides near ties."""
    if update == 0:
        return False
    w = abs(weight)
    ulp = 2.0**-24 if w < 2.0**-14 else 2.0 ** (np.frexp(w)[1] - 11)
    toward_zero = weight != 0 and (update < 0) == (weight > 0)
    gap = ulp / 2 if toward_zero and np.frexp(w)[0] == 0.5 and w > 2.0**-14 else ulp
    return abs(update) < gap / 2 or (abs(update) == gap / 2 and (w / ulp) % 2 == 0)


@pytest.mark.parametrize("wrong", [lost_below_half_an_ulp, lost_at_half_an_ulp_too, lost_with_an_exact_sum])
def test_ex4_1_grader_fails_wrong_lost_update_rules(wrong: Callable) -> None:
    _grade_wrong(
        "ex4_1", wrong, r"for weight = .* and update = .* yours says .*, expected .*: the float32 sum .* rounds"
    )


def an_update_of_0_is_lost(weight: float, update: float) -> bool:
    """The rounding rule right, the "update is not 0" clause forgotten."""
    return update == 0 or master_solutions.update_is_lost(weight, update)


def test_ex4_1_grader_names_the_clause_an_update_of_0_misses() -> None:
    _grade_wrong(
        "ex4_1",
        an_update_of_0_is_lost,
        r"for weight = \S+ and update = 0 yours says True, expected False: an update of 0 is not a lost update "
        r"\(the rule: True when the float32 sum, rounded to float16, gives the weight back "
        r"\*and the update is not 0\*\)",
    )


def test_ex4_1_counterexamples_name_the_binade_and_its_ulp() -> None:
    _grade_wrong(
        "ex4_1",
        lost_at_half_an_ulp_too,
        r"yours says True, expected False: .*; the weight is in \[2\^-?\d+, 2\^-?\d+\), where float16's values are "
        r"2\^-?\d+ apart\n",
    )


def ties_to_odd(weight: float, update: float) -> bool:
    """The gaps right, the tie decided by the wrong parity of |w| / ulp(w)."""
    lost = master_solutions.update_is_lost(weight, update)
    direction = 1.0 if update > 0 else -1.0
    moved = abs(float(np.float32(weight) + np.float32(update)) - weight)
    return (not lost) if update != 0 and moved == half_gap(weight, direction) else lost


KEEPS = "even: the weight's last mantissa bit is 0, so the tie keeps it"
LEAVES = "odd: the weight's last mantissa bit is 1, so the tie leaves it"


@pytest.mark.parametrize(
    "weight, update, says", [(1.0, 2.0**-11, f"1024, {KEEPS}"), (1 + 2.0**-10, 2.0**-11, f"1025, {LEAVES}")]
)
def test_ex4_1_tie_counterexamples_read_the_last_bit_from_the_parity_of_w_in_ulps(
    weight: float, update: float, says: str
) -> None:
    expected = (
        "a tie, which goes to the even neighbour; |w| / ulp(w) = " + says + "); the weight is in [2^0, 2^1), where "
        "float16's values are 2^-10 apart"
    )
    with pytest.raises(AssertionError) as failed:
        check_one_update(ties_to_odd, weight, update)
    assert str(failed.value).endswith(expected)


def test_ex4_1_grader_tells_a_rule_that_ties_to_odd_how_to_read_the_last_bit() -> None:
    _grade_wrong("ex4_1", ties_to_odd, r"a tie, which goes to the even neighbour; \|w\| / ulp\(w\) = \d+, (odd|even)")


# 4.2: the master step
def step_on_the_float16_copy(w16: Any, master: Any, grad16: Any, lr: float) -> tuple:
    new = (w16 - np.float16(lr) * grad16).astype(np.float16)
    return new, new.astype(np.float32), 0


def update_rounded_to_float16(w16: Any, master: Any, grad16: Any, lr: float) -> tuple:
    new_w16, new_master, lost = master_solutions.master_step(w16, master, grad16, lr)
    new_master = master - (np.float16(lr) * grad16).astype(np.float32)  # the product rounded to float16 first
    return new_master.astype(np.float16), new_master, lost


def lost_counted_as_unchanged(w16: Any, master: Any, grad16: Any, lr: float) -> tuple:
    new_w16, new_master, _ = master_solutions.master_step(w16, master, grad16, lr)
    return new_w16, new_master, int(np.count_nonzero((new_w16 == w16) & (new_master != master)))


def zero_updates_counted_as_lost(w16: Any, master: Any, grad16: Any, lr: float) -> tuple:
    new_w16, new_master, lost = master_solutions.master_step(w16, master, grad16, lr)
    return new_w16, new_master, lost + int(np.count_nonzero(new_master == master))


@pytest.mark.parametrize(
    "wrong, match",
    [
        (step_on_the_float16_copy, r"your new master\[.*\] is .*, expected .*: master - float32\(lr\)"),
        (update_rounded_to_float16, r"your new master\[.*\] is .*, expected"),
        (lost_counted_as_unchanged, r"you count \d+ lost updates, expected \d+"),
        (zero_updates_counted_as_lost, r"grad16 = .*0\..* you count \d+ lost updates, expected \d+"),
    ],
)
def test_ex4_2_grader_fails_wrong_master_steps(wrong: Callable, match: str) -> None:
    _grade_wrong("ex4_2", wrong, match)


# 5.1: the dynamic loss-scale rule
Scaler = scaling_solutions.DynamicLossScaler


class CounterNotResetOnOverflow(Scaler):
    def update(self, found_inf: bool) -> None:
        tracker = self.growth_tracker
        super().update(found_inf)
        if found_inf:
            self.growth_tracker = tracker


class GrowthOnTheOverflowStep(Scaler):
    def update(self, found_inf: bool) -> None:
        if found_inf:
            super().update(True)
        super().update(False)  # the clean-step rule runs on every step, the overflow step too


class GrowsToInf(Scaler):
    def update(self, found_inf: bool) -> None:
        if not found_inf and self.growth_tracker + 1 == self.growth_interval:
            self.growth_tracker = 0
            with np.errstate(over="ignore"):
                self.scale = float(np.float32(self.scale * self.growth_factor))
            return
        super().update(found_inf)


class NoFloor(Scaler):
    def update(self, found_inf: bool) -> None:
        floor, self.min_scale = self.min_scale, None
        super().update(found_inf)
        self.min_scale = floor


class ScaleKeptAsPythonFloat(Scaler):
    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale, self.growth_tracker = max(self.scale * self.backoff_factor, self.min_scale or 0.0), 0
            return
        super().update(False)


class StateDictWithoutTheTracker(Scaler):
    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "growth_tracker": 0}


@pytest.mark.parametrize(
    "wrong, match",
    [
        (
            CounterNotResetOnOverflow,
            r"after .*overflow your growth_tracker is \d+, the rule says 0: the counter must go",
        ),
        (GrowthOnTheOverflowStep, r"after .*overflow your (scale|growth_tracker) is .*, the (pytorch )?rule says"),
        (
            GrowsToInf,
            r"after \d+ clean steps? your scale is inf, the (pytorch|jmp) rule says .*: the scale must never grow",
        ),
        (NoFloor, r"after .*overflows? your scale is .*, the jmp rule says .*\(settings: .*min_scale="),
        (ScaleKeptAsPythonFloat, r"your scale is .*, the pytorch rule says .*\(settings: .*backoff_factor=0\.\d"),
        (StateDictWithoutTheTracker, r"a scaler restored from your state_dict\(\) after .* has growth_tracker 0"),
    ],
)
def test_ex5_1_grader_fails_wrong_scalers(wrong: type, match: str) -> None:
    _grade_wrong("ex5_1", wrong, match)


# 5.2: the skip
def step_even_after_an_overflow(optimizer: Any, scale: float) -> bool:
    skipped = not all(np.isfinite(p.grad).all() for p in optimizer.params)
    for p in optimizer.params:
        p.grad[...] = (p.grad.astype(np.float32) * np.float32(1 / scale)).astype(p.grad.dtype)
    optimizer.step()
    return skipped


def zero_the_bad_values_and_step(optimizer: Any, scale: float) -> bool:
    bad = False
    for p in optimizer.params:
        p.grad[...] = (p.grad.astype(np.float32) * np.float32(1 / scale)).astype(p.grad.dtype)
        bad = bad or not np.isfinite(p.grad).all()
        p.grad[~np.isfinite(p.grad)] = 0
    optimizer.step()
    return bad


def check_for_inf_only(optimizer: Any, scale: float) -> bool:
    for p in optimizer.params:
        p.grad[...] = (p.grad.astype(np.float32) * np.float32(1 / scale)).astype(p.grad.dtype)
    if any(np.isinf(p.grad).any() for p in optimizer.params):
        return True
    optimizer.step()
    return False


def unscale_in_float16(optimizer: Any, scale: float) -> bool:
    for p in optimizer.params:
        p.grad *= p.grad.dtype.type(1 / scale)  # 1/scale rounded to float16: inexact, or 0 above 2^24
    if not all(np.isfinite(p.grad).all() for p in optimizer.params):
        return True
    optimizer.step()
    return False


def divide_by_the_scale(optimizer: Any, scale: float) -> bool:
    """What "divide by S in FP32" would give: g / S, not g * float32(1/S) (they differ for S = 3)."""
    for p in optimizer.params:
        p.grad[...] = (p.grad.astype(np.float32) / np.float32(scale)).astype(p.grad.dtype)
    if not all(np.isfinite(p.grad).all() for p in optimizer.params):
        return True
    optimizer.step()
    return False


@pytest.mark.parametrize(
    "wrong, match",
    [
        (
            divide_by_the_scale,
            r"with scale \S+ and finite scaled gradients.* after your step .*multiply by 1/scale in float32.*"
            r"\(not by dividing by the scale, as yours seems to: for a scale that is not a power of two, "
            r"g / scale and g \* float32\(1/scale\) can be one ulp apart\)",
        ),
        (step_even_after_an_overflow, r"with scale .* and an? (inf|NaN) in the scaled gradient of w\d.*: after your "),
        (zero_the_bad_values_and_step, r"an? (inf|NaN) in the scaled gradient .* an overflowed step must change no"),
        (check_for_inf_only, r"a NaN in the scaled gradient .* your step returned skipped=False"),
        (
            unscale_in_float16,
            r"finite scaled gradients, on .*float16.* after your step .*multiply by 1/scale in float32",
        ),
    ],
)
def test_ex5_2_grader_fails_wrong_skips(wrong: Callable, match: str) -> None:
    _grade_wrong("ex5_2", wrong, match)


# 5.3: the exactness law
def exact_for_every_power_of_two(g: np.ndarray, k: int) -> np.ndarray:
    return np.ones(g.shape, bool)


def exact_unless_it_overflows(g: np.ndarray, k: int) -> np.ndarray:
    return np.abs(g.astype(np.float64) * 2.0**k) <= 65504


def exact_only_among_the_normals(g: np.ndarray, k: int) -> np.ndarray:
    scaled = np.abs(g.astype(np.float64) * 2.0**k)
    return (scaled <= 65504) & ((scaled == 0) | (scaled >= 2.0**-14))  # but a subnormal on the grid is exact too


def exact_above_the_smallest_subnormal(g: np.ndarray, k: int) -> np.ndarray:
    scaled = np.abs(g.astype(np.float64) * 2.0**k)
    return (scaled <= 65504) & ((scaled == 0) | (scaled >= 2.0**-24))  # but 1.5 x 2^-24 is not a float16 value


@pytest.mark.parametrize(
    "wrong, match",
    [
        (exact_for_every_power_of_two, r"yours says exact, but g \* S = .* is not a float16 value: it rounds to"),
        (exact_unless_it_overflows, r"yours says exact, but g \* S = .* is not a float16 value: it rounds to"),
        (exact_only_among_the_normals, r"yours says not exact, but g \* S = .* is a float16 value"),
        (exact_above_the_smallest_subnormal, r"yours says exact, but g \* S = .* is not a float16 value: it rounds to"),
    ],
)
def test_ex5_3_grader_fails_wrong_exactness_laws(wrong: Callable, match: str) -> None:
    _grade_wrong("ex5_3", wrong, match)


# 6.1: the autocast decision
def lower_float64_too(op: str, dtypes: list[str], lower: str = "float16", overrides: Any = None) -> list[str]:
    got = policy_solutions.autocast_dtypes(op, dtypes, lower, overrides)
    rule = {**policy_solutions.DEFAULT_POLICY, **(overrides or {})}.get(op)
    return [lower if rule in ("lower", "lower_fp32_out") and d == "float64" else g for d, g in zip(dtypes, got)]


def fp32_rule_lowers_float64(op: str, dtypes: list[str], lower: str = "float16", overrides: Any = None) -> list[str]:
    got = policy_solutions.autocast_dtypes(op, dtypes, lower, overrides)
    rule = {**policy_solutions.DEFAULT_POLICY, **(overrides or {})}.get(op)
    return ["float32" if rule == "fp32" and d == "float64" else g for d, g in zip(dtypes, got)]


def overrides_ignored(op: str, dtypes: list[str], lower: str = "float16", overrides: Any = None) -> list[str]:
    return policy_solutions.autocast_dtypes(op, dtypes, lower, None)


def integers_cast_too(op: str, dtypes: list[str], lower: str = "float16", overrides: Any = None) -> list[str]:
    got = policy_solutions.autocast_dtypes(op, dtypes, lower, overrides)
    rule = {**policy_solutions.DEFAULT_POLICY, **(overrides or {})}.get(op)
    return ["float32" if rule == "fp32" and d in ("int64", "bool") else g for d, g in zip(dtypes, got)]


@pytest.mark.parametrize("wrong", [lower_float64_too, fp32_rule_lowers_float64, overrides_ignored, integers_cast_too])
def test_ex6_1_grader_fails_wrong_autocast_decisions(wrong: Callable) -> None:
    _grade_wrong(
        "ex6_1", wrong, r"for op '\w+' \(rule '?\w+'?\) with inputs .* under autocast\(.* yours gives .*; autocast"
    )


# 7.1: checkpointing
def no_checkpoint_at_all(segment: Callable, x: Tensor, params: list[Tensor]) -> Tensor:
    return segment(x)


class SegmentWithoutParameterGradients(CheckpointedSegment):
    def backward(self, g: Any) -> tuple[Any, ...]:
        grads = super().backward(g)
        return (grads[0], *[None] * (len(grads) - 1))


class SegmentKeepingItsGraph(CheckpointedSegment):
    def forward(self, x: Any, *arrays: Any, segment: Callable, params: list[Tensor]) -> Any:
        self.kept = segment(Tensor(x))  # the graph, kept alive by the node: nothing saved
        return super().forward(x, *arrays, segment=segment, params=params)


class SegmentNotSettingGradientsAside(CheckpointedSegment):
    def backward(self, g: Any) -> tuple[Any, ...]:
        (x,) = self.saved
        x_again = Tensor(x, requires_grad=self.needs_input_grad[0])
        with enable_grad():
            out = self.segment(x_again)
        out.backward(g)  # lands in each parameter's .grad, which the node then returns: counted twice
        return (x_again.grad, *[p.grad for p in self.params])


def checkpoint_with(node: type[Function]) -> Callable:
    return lambda segment, x, params: node.apply(x, *params, segment=segment, params=list(params))


@pytest.mark.parametrize(
    "wrong, match",
    [
        (no_checkpoint_at_all, r"your forward leaves .* MiB held until backward, the plain segment .* MiB"),
        (checkpoint_with(SegmentWithoutParameterGradients), r"the gradient of [Wb]0 is None, expected an array"),
        (checkpoint_with(SegmentKeepingItsGraph), r"your forward leaves .* MiB held until backward"),
        (checkpoint_with(SegmentNotSettingGradientsAside), r"the gradient of [Wb]\d \[.*\] is .*, expected .*, as "
         "backpropagating through the segment itself gives"),
    ],
)  # fmt: skip
def test_ex7_1_grader_fails_wrong_checkpoints(wrong: Callable, match: str) -> None:
    _grade_wrong("ex7_1", wrong, match)


# 1.3: FP16 x FP16 -> FP32
def running_sum_in_float16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.zeros((a.shape[0], b.shape[1]), np.float16)
    for k in range(a.shape[1]):
        out = (out + np.outer(a[:, k], b[k]).astype(np.float16)).astype(np.float16)
    return out


def products_rounded_to_float16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    products = (a.astype(np.float32)[:, :, None] * b.astype(np.float32)[None]).astype(np.float16)
    return products.astype(np.float32).sum(axis=1).astype(np.float16)


def rounded_toward_zero(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return round_toward_zero((a.astype(np.float32) @ b.astype(np.float32)).ravel()).reshape(a.shape[0], b.shape[1])


@pytest.mark.parametrize(
    "wrong, match",
    [
        (running_sum_in_float16, r"your \[\d, \d\] is .*; the exact sum of products is .*, which rounds once to"),
        (products_rounded_to_float16, r"your \[\d, \d\] is .*; the exact sum of products is"),
        (rounded_toward_zero, r"your \[\d, \d\] is .*; the exact sum of products is"),
        (lambda a, b: a.astype(np.float32) @ b.astype(np.float32), r"return a float16 array of shape"),
    ],
)
def test_ex1_3_grader_fails_wrong_products(wrong: Callable, match: str) -> None:
    _grade_wrong("ex1_3", wrong, match)


# 9.1: the mean gradient across ranks
def sum_always_in_float32(grads: list[np.ndarray], reduction: str) -> np.ndarray:
    return data_parallel_solutions.mean_gradient(grads, "float32")


def sum_in_reverse_rank_order(grads: list[np.ndarray], reduction: str) -> np.ndarray:
    return data_parallel_solutions.mean_gradient(grads[::-1], reduction)


def predivide_after_the_sum(grads: list[np.ndarray], reduction: str) -> np.ndarray:
    return data_parallel_solutions.mean_gradient(grads, "float16" if reduction == "float16-predivide" else reduction)


@pytest.mark.parametrize(
    "wrong, match",
    [
        (sum_always_in_float32, r"and reduction 'float16': your mean\[0\] is .*: sum in rank order in float16"),
        (sum_in_reverse_rank_order, r"g_0 = \[2\.048e\+03\].* your mean\[0\] is 683\.33.*, expected 682\.66"),
        (predivide_after_the_sum, r"'float16-predivide': your mean\[0\] is 2\^-24, expected 0: divide each"),
        (lambda grads, reduction: np.float16(1) * grads[0], r"return a float32 array of shape"),
    ],
)
def test_ex9_1_grader_fails_wrong_means(wrong: Callable, match: str) -> None:
    _grade_wrong("ex9_1", wrong, match)


def test_ex9_1_reference_is_the_all_reduce_arithmetic() -> None:
    """The grader's reference (tinyamp.kernels, no MPI) gives the bits of allreduce's own functions."""
    allreduce = pytest.importorskip("tinyamp.distributed.allreduce", reason="needs mpi4py (pip install -e '.[mpi]')")
    from tinyamp.exercises.graders.data_parallel import reference_mean

    rng = np.random.default_rng(9)
    for n in (1, 2, 3, 5, 8):
        with np.errstate(over="ignore"):  # a few values beyond 65504 become inf, as gradients can
            grads = [(rng.standard_normal(64) * rng.choice([1e-6, 1.0, 3e4], 64)).astype(np.float16) for _ in range(n)]
        for name, r in allreduce.REDUCTIONS.items():
            parts = [g.astype(r.dtype) for g in grads]
            with np.errstate(over="ignore", invalid="ignore"):
                if r.predivide:
                    parts = [allreduce.divide(q, n) for q in parts]
                total = allreduce.sum_in_rank_order(parts).astype(np.float32)
                expected = total if r.predivide else allreduce.divide(total, n)
                got = reference_mean(grads, name)
            assert np.array_equal(got.view(np.uint32), expected.view(np.uint32)) or np.array_equal(
                got, expected, equal_nan=True), (n, name)  # fmt: skip


# ---- grading a workspace: the code must be the student's ---------------------------------------------------
@pytest.fixture(scope="module")
def solutions_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("solutions") / "ws"
    write_workspace(directory, solutions=True)
    return directory


def replaced(directory: Path, module: str, source: str) -> Path:
    """A copy of the workspace with myamp/<module>.py replaced by `source`."""
    (directory / PACKAGE / f"{module}.py").write_text(source)
    return directory


NUMPY = "import numpy as np\n\n"


def stub_workspace(tmp_path: Path) -> Path:
    write_workspace(tmp_path / "ws")
    return tmp_path / "ws"


@pytest.mark.parametrize(
    "module, source, exercise_id, match",
    [
        ("formats", "from tinyamp.rounding import round_to_float16\n", "ex1_1",
         r"round_to_float16 in myamp/formats.py is not yours: it comes from .*tinyamp/rounding.py"),
        ("formats", f"{NUMPY}def round_to_float16(x):\n    return x.astype(np.float16)\n", "ex1_1",
         r"converts to float16 with NumPy \(line 4: astype\(float16\)\): Exercise 1.1 asks you"),
        ("formats", f"{NUMPY}def round_to_float16(x):\n    return np.array(x, dtype='float16')\n", "ex1_1",
         r"converts to float16 with NumPy \(line 4: dtype=float16\)"),
        ("master_weights", f"{NUMPY}def update_is_lost(weight, update):\n    return update != 0 and "
         "float(np.float16(np.float32(weight) + np.float32(update))) == weight\n", "ex4_1",
         r"converts to float16 with NumPy \(line 4: float16\(\.\.\.\)\): Exercise 4.1 asks you to decide it with "
         r"the gaps between float16 values, not by rounding \(w's last mantissa bit is the parity of the integer "
         r"\|w\| / ulp\(w\)\)$"),
        ("checkpointing", "import tinyamp as ta\n\ndef checkpoint_segment(segment, x, params):\n"
         "    return ta.checkpoint(segment, x)\n", "ex7_1", r"uses tinyamp.checkpoint, tinyamp's own"),
        ("loss_scaling", "from tinyamp.amp import LossScaler as S\n\nclass DynamicLossScaler(S):\n    pass\n", "ex5_1",
         r"DynamicLossScaler uses tinyamp.amp.LossScaler, tinyamp's own version of what Exercise 5.1 asks"),
        ("formats", "def matmul(a, b):\n    return a @ b\n", "ex1_3", r"myamp/formats.py has no fp16_matmul"),
        ("formats", "def fp16_matmul(a, b)\n", "ex1_3", r"myamp/formats.py does not import: SyntaxError"),
    ],
)  # fmt: skip
def test_grading_fails_code_that_is_not_the_students(
    tmp_path: Path, module: str, source: str, exercise_id: str, match: str
) -> None:
    workspace = replaced(stub_workspace(tmp_path), module, source)
    result = grade_remote(find(exercise_id), workspace)
    assert result.status == FAILED
    assert result.message == " ".join(result.message.split())  # one line, for the table
    assert re.search(match, result.message), result.message


def test_tinyamp_names_are_followed_through_imports_and_aliases() -> None:
    source = (
        "import tinyamp as ta\nimport tinyamp.kernels\nfrom tinyamp.amp import formats as f\n"
        "def mine(x):\n    return ta.amp.LossScaler, tinyamp.kernels.cast(x), f.ulp(x)\n"
        "def other():\n    return ta.checkpoint\n"
    )
    assert tinyamp_names_used(source, "mine") == {
        "tinyamp", "tinyamp.amp", "tinyamp.amp.LossScaler", "tinyamp.kernels", "tinyamp.kernels.cast",
        "tinyamp.amp.formats", "tinyamp.amp.formats.ulp",
    }  # fmt: skip
    assert "tinyamp.checkpoint" not in tinyamp_names_used(source, "mine")  # other definitions are not graded


def test_float16_conversions_are_found_but_a_view_of_bits_is_allowed() -> None:
    def found(body: str) -> str:
        return float16_conversion(f"import numpy as np\ndef f(x):\n    return {body}\n", "f")

    assert found("x.astype(np.float16)") == "line 3: astype(float16)"
    assert found("(x + 1).astype('e')") == "line 3: astype(float16)"
    assert found("np.float16(x)") == "line 3: float16(...)"
    assert found("np.asarray(x, dtype=np.half)") == "line 3: dtype=float16"
    assert found("x.view(np.float16)") == found("x.astype(np.uint16)") == ""


def test_other_packages_are_followed_when_asked_and_fp8_type_names_are_found_outside_docstrings() -> None:
    body = '    """Not float8_e4m3fn: prose."""\n    return x.astype(md.float8_e5m2)\n'
    source = f"import ml_dtypes as md\ndef f(x):\n{body}"
    assert tinyamp_names_used(source, "f") == set()  # tinyamp's names only, unless asked
    assert tinyamp_names_used(source, "f", ("tinyamp", "ml_dtypes")) == {"ml_dtypes", "ml_dtypes.float8_e5m2"}
    assert float8_mention(source, "f") == "line 4: float8_e5m2"  # the docstring's float8_e4m3fn is prose
    assert float8_mention('def f(x):\n    return x.astype("float8_e4m3fn")\n', "f") == "line 2: float8_e4m3fn"
    assert float8_mention('def f(x):\n    """float8, in words."""\n    return x\n', "f") == ""


def test_grade_reports_not_started_and_passed(tmp_path: Path, solutions_workspace: Path) -> None:
    stubs = stub_workspace(tmp_path)
    result = grade(find("ex2_1"), stubs)
    assert (result.status, result.message) == (NOT_STARTED, "Exercise 2.1: the backward of softmax")
    assert grade(find("ex2_1"), solutions_workspace).status == PASSED
    assert grade(find("ex2_1"), stubs).status == NOT_STARTED  # each grade imports its own workspace afresh


# ---- the workspace and the command ----------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tinyamp")
    command.add_parser(p.add_subparsers(dest="command", required=True))
    return p


def run(*argv: str) -> int:
    return command.run(parser().parse_args(["exercises", *argv]))


def test_init_writes_the_stubs_or_the_solutions_and_never_over_a_workspace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("init", str(tmp_path / "ws")) == 0
    written = sorted(str(p.relative_to(tmp_path / "ws")) for p in (tmp_path / "ws").rglob("*") if p.is_file())
    assert written == sorted(["README.md", "conftest.py", "pytest.ini", "tests/test_myamp.py",
                              *(f"myamp/{m}.py" for m in ["__init__", *{e.module for e in EXERCISES}])])  # fmt: skip
    stub = (tmp_path / "ws/myamp/loss_scaling.py").read_text()
    assert 'raise NotImplementedError("Exercise 5.1: ' in stub and "self.growth_tracker = 0" not in stub
    ini = (tmp_path / "ws/pytest.ini").read_text()
    assert all(f"    {e.id}: Exercise {e.number}, " in ini for e in EXERCISES)
    assert f"wrote {len(written)} files" in capsys.readouterr().out  # the files listed above
    assert run("init", str(tmp_path / "ws")) == 2
    assert "ws/myamp already exists: init never writes over a workspace" in capsys.readouterr().err
    assert run("init", str(tmp_path / "sol"), "--solutions") == 0
    assert "self.growth_tracker = 0" in (tmp_path / "sol/myamp/loss_scaling.py").read_text()
    assert "reference solutions" in (tmp_path / "sol/README.md").read_text()


def test_check_prints_the_table_and_exits_0_only_when_all_asked_for_pass(
    tmp_path: Path, solutions_workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("check", str(solutions_workspace), "--only", "2.1", "--only", "ex6_1") == 0
    out = capsys.readouterr().out
    assert "2 passed" in out and "2.1  the backward of softmax" in out and "6.1  the autocast decision" in out
    assert "1.1  " not in out
    stubs = stub_workspace(tmp_path)
    assert run("check", str(stubs)) == 1
    out = capsys.readouterr().out
    assert f"{len(EXERCISES)} not started" in out
    assert "write DynamicLossScaler in myamp/loss_scaling.py; read tutorials/05_loss_scaling.py" in out


def test_check_shows_the_first_counterexample_of_a_failed_exercise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = stub_workspace(tmp_path)
    replaced(workspace, "backward", "def softmax_backward(y, g, axis):\n    return y * g\n")
    assert run("check", str(workspace), "--only", "2.1") == 1
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("2.1"))
    assert "failed" in line and "your softmax_backward gives" in line and "finite differences give" in line


def test_check_gives_the_same_verdict_every_run_and_deep_draws_new_examples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = stub_workspace(tmp_path)
    replaced(workspace, "backward", "def softmax_backward(y, g, axis):\n    return y * g\n")
    lines = []
    for _ in range(3):
        assert run("check", str(workspace), "--only", "2.1") == 1
        lines.append(next(x for x in capsys.readouterr().out.splitlines() if x.startswith("2.1")))
    strip_time = [re.sub(r"\d+\.\ds", "", line) for line in lines]
    assert strip_time[0] == strip_time[1] == strip_time[2]  # the same counterexample, word for word
    assert run("check", str(workspace), "--only", "2.1", "--deep") == 1  # random examples: still caught


def test_check_refuses_bad_input_with_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("check", str(tmp_path)) == 2
    assert (
        "is not a workspace (it has no myamp/ folder); write one with tinyamp exercises init" in capsys.readouterr().err
    )
    workspace = stub_workspace(tmp_path)
    assert run("check", str(workspace), "--only", "9.9") == 2
    assert "no exercise '9.9'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser().parse_args(["exercises"])  # init or check is required


def test_pytest_markers_select_one_exercise_in_a_workspace(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    write_workspace(workspace, solutions=True)
    replaced(workspace, "backward", holes.stub("backward"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(workspace), "-m", "ex1_2 or ex2_1", "-p", "no:cacheprovider"],
        capture_output=True, text=True, timeout=300, cwd=workspace, env=env,
    )  # fmt: skip
    assert f"1 failed, 1 passed, {len(EXERCISES) - 2} deselected" in done.stdout, done.stdout + done.stderr
    assert "Exercise 2.1 is not started: write softmax_backward in myamp/backward.py" in done.stdout


def test_the_graded_solutions_import_only_what_a_student_may() -> None:
    for e in EXERCISES:
        source = (ROOT / f"tests/exercise_solutions/{e.module}.py").read_text()
        assert not [n for n in tinyamp_names_used(source, e.name) if any(n.startswith(f) for f in e.forbidden)]
        if e.no_float16_casts:
            assert float16_conversion(source, e.name) == ""
