"""Wrong solutions of Exercise 5.4 (Megatron-LM's hysteresis rule), one clause broken in each, and the grade each gets.

The plausible mistakes: the counter restored at every clean step (DeepSpeed's consecutive_hysteresis,
not Megatron's rule) or after a backoff, or not restored at a growth; the growth window one step too
long; and no hysteresis at all (back off at the first overflow, as PyTorch does).  Each mutant is the
reference solution with one edit, graded as ``tinyamp exercises check`` grades it: it must fail, with a
reason that names the clause it broke, whichever counterexample the drawn settings meet first (the
grader's fixed run meets each one, so the message does not depend on hypothesis's luck).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_exercises_mutants import fails_with_its_reason, mutant_source, stubs  # noqa: F401  (stubs: the workspace fixture)

pytestmark = pytest.mark.cli

CLEAN_STEP = "        self.growth_tracker += 1\n        if self.growth_tracker == self.growth_interval:"
BACKOFF = "                self.scale = max(float(np.float32(self.backoff_factor * self.scale)), self.min_scale)"

MUTANTS: list[tuple[str, str, str, str, str]] = [
    (
        "ex5_4",
        "the counter restored at every clean step",
        CLEAN_STEP,
        "        self.growth_tracker += 1\n        self.hysteresis_tracker = self.hysteresis\n"
        "        if self.growth_tracker == self.growth_interval:",
        r"your hysteresis_tracker is \d, the rule's hysteresis_tracker is -?\d+: a clean step restores the "
        r"hysteresis_tracker only when the scale grows, not at every clean step",
    ),
    (
        "ex5_4",
        "the growth window one step too long",
        "        if self.growth_tracker == self.growth_interval:",
        "        if self.growth_tracker > self.growth_interval:",
        # the window's end grows the scale, or, at float32's top, only restores the counter
        r"the scale grows here, at the end of the window of \d clean steps|the end of the growth window restores "
        r"the hysteresis_tracker \(even when the growth is refused\)",
    ),
    (
        "ex5_4",
        "no hysteresis: a backoff at every overflow",
        "            if self.hysteresis_tracker <= 0:",
        "            if True:",
        r"your scale is \S+, the megatron rule says \S+: an overflow backs off only once hysteresis=\d overflows "
        r"have come since the start or the last growth",
    ),
    (
        "ex5_4",
        "the counter restored after a backoff",
        BACKOFF,
        BACKOFF + "\n                self.hysteresis_tracker = self.hysteresis",
        r"your hysteresis_tracker is \d, the rule's hysteresis_tracker is -?\d+: an overflow lowers "
        r"hysteresis_tracker by 1, the one that backs off included .*only a growth restores it, never a backoff",
    ),
    (
        "ex5_4",
        "the counter not restored at a growth",
        "            self.hysteresis_tracker = self.hysteresis\n",
        "",
        r"your hysteresis_tracker is -?\d+, the rule's hysteresis_tracker is \d: the end of the growth window "
        r"restores the hysteresis_tracker",
    ),
]


@pytest.mark.parametrize("exercise_id, wrong, old, new, reason", MUTANTS, ids=[m[1] for m in MUTANTS])
def test_a_wrong_hysteresis_rule_fails_with_the_clause_it_broke(
    stubs: Path,  # noqa: F811
    exercise_id: str,
    wrong: str,
    old: str,
    new: str,
    reason: str,
) -> None:
    fails_with_its_reason(stubs, exercise_id, wrong, old, new, reason)


@pytest.mark.parametrize("exercise_id, wrong, old, new, reason", MUTANTS, ids=[m[1] for m in MUTANTS])
def test_the_fixed_run_alone_fails_each_wrong_hysteresis_rule_with_the_same_reason(
    exercise_id: str, wrong: str, old: str, new: str, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no drawn example the grader's fixed run must still fail the mutant, for the same reason."""
    from tinyamp.exercises.graders import loss_scaling as graders

    namespace: dict = {}
    exec(compile(mutant_source(exercise_id, old, new), "mutant.py", "exec"), namespace)  # noqa: S102
    monkeypatch.setattr(graders, "check_scaler", lambda *args, **kwargs: None)
    with pytest.raises(AssertionError) as failed:
        graders.grade_hysteresis_loss_scaler(namespace["HysteresisLossScaler"], 1)
    assert re.search(reason, str(failed.value)), str(failed.value)
