"""Wrong solutions only a grader drawing the whole domain of its stub catches (the rest: test_exercises_mutants.py).

A 5.1 scaler may start below its floor (jmp's and Apex's rules allow it); a 5.2 step may
meet a scale below 1, where unscaling overflows a finite float16 gradient, and must unscale
every gradient even after an inf; a 5.3 law computed in float16 is wrong both at the small
scales and, once float16(2^k) is inf, at the large ones.  A 7.1 recomputation may leave the
forward's dtypes or its autocast policy (backward runs after the autocast block).  A 10.2 history
may be kept in float64 (its values agree), and its quotient may underflow to 0 (from a margin of
31); a 10.3 emax_elem one too small looks like an exponent rounded up unless a power of two is
tried.  Each mutant is the reference solution with one edit, graded as ``tinyamp exercises check``
grades it: it must fail, naming the rule it broke.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_exercises_mutants import fails_with_its_reason, mutant_source, stubs  # noqa: F401  (stubs: the workspace fixture)

pytestmark = pytest.mark.cli

MUTANTS: list[tuple[str, str, str, str, str]] = [
    (
        "ex5_1",
        "a start below the floor lifted to the floor",
        "self.scale = float(np.float32(init_scale))",
        "self.scale = float(np.float32(init_scale if min_scale is None else max(init_scale, min_scale)))",
        # caught by the drawn jmp settings (one starts below the floor) or, failing that, by the fixed ones
        r"before any step your scale is \S+, the jmp rule says \S+ .*(min_scale bounds a backoff, not the start|"
        r"init_scale=)",
    ),
    (
        "ex5_2",
        "finiteness checked before unscaling",
        '        with np.errstate(over="ignore", invalid="ignore"):  # an inf found here is what we check for\n'
        "            p.grad[...] = (p.grad.astype(np.float32) * inverse).astype(p.grad.dtype)\n"
        "        finite = finite and bool(np.isfinite(p.grad).all())",
        "        finite = finite and bool(np.isfinite(p.grad).all())\n"
        '        with np.errstate(over="ignore", invalid="ignore"):\n'
        "            p.grad[...] = (p.grad.astype(np.float32) * inverse).astype(p.grad.dtype)",
        r"with scale (2\^-\d+|0\.\d+) and finite scaled gradients.*your step returned skipped=False, but an "
        r"unscaled gradient is not finite",
    ),
    (
        "ex5_2",
        "unscaling stops at the first gradient that is not finite",
        "        finite = finite and bool(np.isfinite(p.grad).all())",
        "        finite = finite and bool(np.isfinite(p.grad).all())\n        if not finite:\n            break",
        r"(an inf|a NaN) in the scaled gradient of w\d.*the gradient of w\d\S* is \S+, expected \S+: unscale every "
        r"gradient \(multiply by 1/scale in float32, round once to its dtype\) in place, all of them, also after an "
        r"inf or NaN is found",
    ),
    (
        "ex5_3",
        "scaled in float16",
        "scaled = g.astype(np.float64) * 2.0**k",
        "scaled = (g * np.float16(2.0**k)).astype(np.float64)",
        # two faults, and which one the grader meets first depends on hypothesis's draws: g * S rounded to float16
        # (or S = 0 from k = -25 down) looks exact; from k = 16 on float16(S) is inf, and g * inf (NaN for g = 0)
        # looks not exact
        r"yours says exact, but g \* S = .* is not a float16 value: it rounds to"
        r"|and k = (1[6-9]|2\d|30) \(S = 2\^\1\): at g\.flat\[\d+\] = \S+ yours says not exact, but g \* S = \S+ is a "
        r"float16 value",
    ),
    (
        "ex7_1",
        "the recomputation in float32",
        "x_again = Tensor(x, requires_grad=self.needs_input_grad[0])",
        "x_again = Tensor(x.astype('float32'), requires_grad=self.needs_input_grad[0])",
        r"float16 x and parameters.*(the gradient of \w+ .* the recomputation must repeat the forward in its dtypes"
        r"|returned a gradient of shape .* and dtype float32 for input \d+, a tensor of shape .* and dtype float16)",
    ),
    (
        "ex7_1",
        "the recomputation outside the forward's autocast",
        "with enable_grad(), replay:",
        "with enable_grad():",
        r"the forward inside autocast\('\w+'\) and backward after it: (the gradient of .*under its autocast policy"
        r"|your checkpoint_segment, its forward or its backward raised)",
    ),
    (
        "ex10_2",
        "the history kept in float64",
        "self.amax_history = np.zeros(amax_history_len, dtype=np.float32)",
        "self.amax_history = np.zeros(amax_history_len, dtype=np.float64)",
        r"before any update your amax_history is ndarray float64 \(4,\); keep it a float32 array of shape \(4,\)",
    ),
    (
        "ex10_2",
        "a quotient that underflows taken as the scale",
        "        if scale == 0:  # underflowed: a scale of 0 would zero every value\n            return\n",
        "",
        r"margin=40, .*after the amaxes 1, (\S+) your scale is 0, tinyamp's rule says \S+: float32\(\S+ \* 2\^-40\) / "
        r"\1 underflows to 0 .*the previous scale is kept, as 0 would zero every value",
    ),
    (
        "ex10_3",
        "emax_elem one below the largest value's exponent",
        'emax_elem = {"E4M3": 8, "E5M2": 15}[fmt]',
        'emax_elem = {"E4M3": 7, "E5M2": 14}[fmt]',
        r"yours is one higher, and one higher for a block whose amax is 1 too, a power of two, where rounding the "
        r"exponent up changes nothing: emax_elem is (8 for E4M3|15 for E5M2) .*yours seems to use (7|14)",
    ),
]


@pytest.mark.parametrize("exercise_id, wrong, old, new, reason", MUTANTS, ids=[f"{m[0]}: {m[1]}" for m in MUTANTS])
def test_a_wrong_solution_outside_the_usual_draws_fails_with_the_rule_it_broke(
    stubs: Path,  # noqa: F811
    exercise_id: str,
    wrong: str,
    old: str,
    new: str,
    reason: str,
) -> None:
    fails_with_its_reason(stubs, exercise_id, wrong, old, new, reason)
