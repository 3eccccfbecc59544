"""Grader of Exercise 6.1 (autocast_dtypes): your decision against what tinyamp's autocast does."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tinyamp import dtypes
from tinyamp.autocast import autocast
from tinyamp.exercises.remote import Outcome, outcomes
from tinyamp.policy import DEFAULT_POLICY, RULES
from tinyamp.tensor import Tensor
from tinyamp.testing.counterexamples import check_settings

OTHER_OPS = ("relu", "tanh", "embedding")  # ops in no row of the table: autocast leaves their inputs alone


def _dtype_names() -> list[str]:
    names = ["float16", "float32", "float64", "int64", "bool"]
    try:
        dtypes.resolve("bfloat16")  # needs ml_dtypes
        names.insert(1, "bfloat16")
    except (ImportError, TypeError, ValueError):
        pass
    return names


@st.composite
def autocast_cases(draw: Any) -> tuple[str, list[str], str, dict[str, str] | None]:
    """(op, input dtypes, lower dtype, overrides): an op of the table or outside it, 1 to 3 inputs, an override."""
    names = _dtype_names()
    op = draw(st.sampled_from(sorted(DEFAULT_POLICY) + list(OTHER_OPS)))
    inputs = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3))
    lower = draw(st.sampled_from([n for n in ("float16", "bfloat16") if n in names]))
    overrides = None
    if op in DEFAULT_POLICY and draw(st.booleans()):
        overrides = {op: draw(st.sampled_from(RULES))}
    return op, inputs, lower, overrides


def autocast_decision(op: str, input_dtypes: list[str], lower: str, overrides: dict[str, str] | None) -> list[str]:
    """What tinyamp's autocast gives the op: cast_inputs on tensors of those dtypes, inside the block."""
    tensors = [Tensor(np.zeros(2, dtype=dtypes.resolve(name))) for name in input_dtypes]
    with autocast(lower, policy=overrides) as block:
        cast = block.cast_inputs(op, tuple(tensors))
    return [t.dtype.name for t in cast]


def grade_autocast_dtypes(autocast_dtypes: Callable[..., list[str]], examples: int) -> None:
    """Every op of the policy table (and ops outside it) on every one or two input dtypes, under both 16-bit
    formats, without and with each override, simplest first; then drawn cases of up to three inputs.

    The cases of one and two inputs are few (about 7,000: a second), so every one is checked, in order: a
    wrong rule among them fails whatever hypothesis draws, with the simplest case it gets wrong (200 drawn
    examples alone passed a solution that lowers to float16 under autocast('bfloat16') in one run of forty).
    """
    names = _dtype_names()
    lowers = [n for n in ("float16", "bfloat16") if n in names]
    ops = sorted(DEFAULT_POLICY) + list(OTHER_OPS)
    cases = [(op, list(inputs), lower, overrides)
             for count in (1, 2) for inputs in itertools.product(names, repeat=count) for op in ops
             for lower in lowers
             for overrides in [None] + ([{op: rule} for rule in RULES] if op in DEFAULT_POLICY else [])]  # fmt: skip
    answers = outcomes(autocast_dtypes, [(op, list(inputs), lower, rule) for op, inputs, lower, rule in cases])
    for case, answer in zip(cases, answers):  # in one message to the student's process, checked in order
        same_decision_at(autocast_dtypes, *case, answer=answer)

    @check_settings(examples)
    @given(case=autocast_cases())
    def same_decision_as_autocast(case: tuple[str, list[str], str, dict[str, str] | None]) -> None:
        same_decision_at(autocast_dtypes, *case)

    same_decision_as_autocast()


def same_decision_at(
    autocast_dtypes: Callable[..., list[str]],
    op: str,
    inputs: list[str],
    lower: str,
    overrides: dict[str, str] | None,
    answer: Outcome | None = None,
) -> None:
    """AssertionError in words unless autocast_dtypes gives what tinyamp's autocast does for this case (`answer`:
    what it gave already, in a batch)."""
    rule = (overrides or {}).get(op, DEFAULT_POLICY.get(op))
    about = (f"for op {op!r} (rule {rule!r}) with inputs {', '.join(inputs)} under autocast({lower!r}"
             f"{f', policy={overrides}' if overrides else ''})")  # fmt: skip
    try:
        got = autocast_dtypes(op, list(inputs), lower, overrides) if answer is None else answer.result()
    except NotImplementedError:
        raise
    except Exception as exc:
        raise AssertionError(f"{about} yours raised {type(exc).__name__}: {exc}") from exc
    expected = autocast_decision(op, inputs, lower, overrides)
    if not isinstance(got, (list, tuple)) or list(got) != expected:
        raise AssertionError(f"{about} yours gives {got!r}; autocast gives {expected!r}")
