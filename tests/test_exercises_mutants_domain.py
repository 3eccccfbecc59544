"""Wrong solutions only a grader drawing the whole domain of its stub catches (the rest: test_exercises_mutants.py).

A 5.1 scaler may start below its floor (jmp's and Apex's rules allow it); a 5.2 step may
meet a scale below 1, where unscaling overflows a finite float16 gradient, and must unscale
every gradient even after an inf; a 5.3 law computed in float16 is wrong both at the small
scales and, once float16(2^k) is inf, at the large ones.  Each mutant is the reference solution with one edit,
graded as ``tinyamp exercises check`` grades it: it must fail, naming the rule it broke.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_exercises_mutants import mutant_source, stubs  # noqa: F401  (stubs: the workspace fixture)

from tinyamp.exercises.catalog import PACKAGE, find
from tinyamp.exercises.grading import FAILED, grade

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
    exercise = find(exercise_id)
    (stubs / PACKAGE / f"{exercise.module}.py").write_text(mutant_source(exercise_id, old, new))
    result = grade(exercise, stubs)
    assert result.status == FAILED, f"{wrong}: graded {result.status}"
    assert re.search(reason, result.message), result.message
