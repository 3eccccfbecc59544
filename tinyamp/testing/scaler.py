"""check_scaler: a loss scaler, step by step, against a published rule and the laws of loss scaling.

    from tinyamp.testing import check_scaler

    def test_my_scaler_is_pytorchs_rule():
        check_scaler(lambda **settings: MyScaler(**settings), reference="pytorch")

The scaler under test is built with the keywords ``init_scale, growth_factor,
backoff_factor, growth_interval, min_scale, max_scale`` (drawn by
``strategies.scaler_settings(reference)``: intervals of 1..6 steps, so that a few hundred
steps reach the ceiling and the floor) and needs

* ``update(found_inf)``: one step's transition;
* ``scale``: the current scale (a number, or a method that returns one);
* ``growth_tracker``: the clean steps counted towards the next growth (``counter=`` names
  another attribute; ``counter=None`` compares the scale alone);
* ``state_dict()`` and ``load_state_dict(d)`` (``round_trip=False`` skips them).

A hypothesis state machine drives it and ``LossScaler.preset(reference, **settings)`` with
the same flags, one step or hundreds at a time, and compares scale and counter after every
step.  When they differ the failure says after which steps, what each says, and which law
the scaler broke: an overflow backs the scale off (to the floor at most) and resets the
counter; the scale grows after exactly N clean steps, and reaching N resets the counter even
when the growth is refused or clamped; a rule that keeps its scale in float32 (PyTorch's)
rounds each new scale to float32; a power-of-two scale stays a power of two (when the start
and the factors are); the scale never grows to inf; and a scaler restored from
``state_dict()`` continues identically.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from tinyamp.amp.presets import PRESETS
from tinyamp.amp.scaler import LossScaler
from tinyamp.testing.counterexamples import check_settings, number, reported_at_the_call
from tinyamp.testing.scaler_forks import ScalerAndForks
from tinyamp.testing.strategies import scaler_settings

LONGEST_RUN = 300  # flags in one rule: from 2^-30 to float32's ceiling is 157 growths


class _DefaultCounter(str):
    """The counter a caller did not name: growth_tracker, or for a hysteresis reference, hysteresis."""


_DEFAULT_COUNTER = _DefaultCounter("growth_tracker")


@reported_at_the_call
def check_scaler(
    make_scaler: Callable[..., Any],
    reference: str = "pytorch",
    *,
    counter: str | None = _DEFAULT_COUNTER,
    round_trip: bool = True,
    max_examples: int | None = None,
    steps: int = 30,
) -> None:
    """Compare the scaler `make_scaler(**settings)` builds with the preset `reference`, step by step.

    `reference` is one of ``tinyamp.amp.PRESETS`` (pytorch, apex, keras, jmp, chainer); for megatron,
    deepspeed and fairseq the settings are the library's own, and `counter` (by default ``hysteresis``)
    names the library's hysteresis counter (``testing/scaler_hysteresis.py`` says what is checked).
    `steps` is the number of rules per example (each one flag, or a run of up to 300);
    `max_examples` defaults to the loaded hypothesis profile's.  Raises AssertionError
    with the shortest counterexample hypothesis finds, in words.
    """
    if reference not in PRESETS:
        raise ValueError(f"unknown reference rule {reference!r}; the presets are {', '.join(PRESETS)}")
    if PRESETS[reference].library is not None:
        from tinyamp.testing.scaler_hysteresis import hysteresis_machine

        counter = "hysteresis" if isinstance(counter, _DefaultCounter) else counter
        machine = hysteresis_machine(make_scaler, reference, counter, round_trip)
        run_state_machine_as_test(machine, settings=check_settings(max_examples, stateful_step_count=steps))
        return
    machine = _scaler_machine(make_scaler, reference, counter, round_trip)
    run_state_machine_as_test(machine, settings=check_settings(max_examples, stateful_step_count=steps))
    _fixed_run(machine, reference, round_trip)  # after the drawn runs, so that their messages come first


def _fixed_run(machine: type[RuleBasedStateMachine], reference: str, round_trip: bool) -> None:
    """One run the check makes every time: the preset's settings with growth_interval=3, a clean step, a
    state_dict round trip with the counter part way to a growth, then on through a growth and an overflow.

    Drawn runs seldom save part way (growth_interval=1 keeps the counter at 0, and a save must fall
    between two growths): with some seeds 100 examples passed a scaler whose state_dict() drops the counter.
    """
    names = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "min_scale", "max_scale")
    settings = {**{name: PRESETS[reference].settings[name] for name in names}, "growth_interval": 3}  # drawn order
    state = machine()
    state.build(settings=settings)
    state.one_step(found_inf=False)
    if round_trip:
        state.save_and_restore()
    for found_inf in (False, False, True, False):
        state.one_step(found_inf=found_inf)


def _is_power_of_two(x: float) -> bool:
    return x > 0 and math.isfinite(x) and math.frexp(x)[0] == 0.5


def broken_law(settings: dict[str, Any], reference: str, found_inf: bool, before: float, after: float,
               tracker: int | None, rule_event: str, *, expected_tracker: int | None = None,
               scale_dtype: str = "float64") -> str:  # fmt: skip
    """The law of loss scaling that the step `before` -> `after` breaks, in words ("" if none is named).

    `rule_event` and `expected_tracker` are the reference rule's for this step; `scale_dtype` is the
    dtype the rule keeps its scale in (float32 for PyTorch's, whose scale is a float32 tensor).
    """
    interval = settings["growth_interval"]
    in_float32 = scale_dtype == "float32"
    with np.errstate(over="ignore"):  # a scale from 2^128 up is inf in float32: the law below says so
        after_in_float32 = float(np.float32(after))
    if not math.isfinite(after) or (in_float32 and not math.isfinite(after_in_float32)):
        return "the scale must never grow to inf (refuse that growth and keep the scale, as PyTorch does)" + (
            "; the scale is a float32 value, and float32's largest is just below 2^128" if in_float32 else ""
        )
    if found_inf and tracker not in (None, 0):
        return "the counter must go back to 0 on an overflow"
    if found_inf and after >= before and rule_event != "hit_floor":
        return "every overflow must back the scale off"
    if in_float32 and after != before and after_in_float32 != after:
        factor = settings["backoff_factor" if found_inf else "growth_factor"]
        return (f"the {reference} rule keeps its scale in float32, so each new scale is rounded to float32 "
                f"({number(before)} * {number(factor)} rounds to {number(np.float32(before * factor))})")  # fmt: skip
    if not found_inf and rule_event == "held" and after != before:
        return f"the scale grows only after exactly growth_interval={interval} clean steps in a row"
    if not found_inf and rule_event == "grew" and after == before:
        return f"after growth_interval={interval} clean steps in a row the scale must grow"
    if not found_inf and tracker is not None and expected_tracker is not None and tracker != expected_tracker:
        if rule_event == "hit_ceiling":
            return (f"when the counter reaches growth_interval={interval} it goes back to 0, even when the growth is "
                    "refused (the grown scale would be inf) or clamped to max_scale, as PyTorch does")  # fmt: skip
        if rule_event == "grew":
            return f"when the counter reaches growth_interval={interval} the scale grows and the counter goes back to 0"
        return (f"a clean step adds 1 to the counter first and then compares it with growth_interval={interval}; "
                "it goes back to 0 only then, or on an overflow")  # fmt: skip
    powers = [settings["init_scale"], settings["growth_factor"], settings["backoff_factor"]]
    if reference != "chainer" and all(_is_power_of_two(v) for v in powers):
        if after != 0 and not _is_power_of_two(after):
            return "a power-of-two scale must stay a power of two (the factors are powers of two)"
    return ""


def _scaler_machine(
    make_scaler: Callable[..., Any], reference: str, counter: str | None, round_trip: bool
) -> type[RuleBasedStateMachine]:
    names = ["scale"] if counter is None else ["scale", counter]

    class ScalerMachine(ScalerAndForks):
        """Your scaler and the reference rule, given the same found_inf flags; forks restored from state_dict."""

        @initialize(settings=scaler_settings(reference))
        def build(self, settings: dict[str, Any]) -> None:
            self.rule = LossScaler.preset(reference, **settings).rule  # ScaleRule.next: the rule, without a history
            self.expected = (self.rule.init_scale, 0, False, "held")  # scale, tracker, overflow_seen, event
            self.compare(self.start(make_scaler, names, settings), None, math.nan)

        @rule(found_inf=st.booleans())
        def one_step(self, found_inf: bool) -> None:
            self.apply(found_inf)

        @rule(found_inf=st.booleans(), n=st.integers(2, LONGEST_RUN))
        def run_of_steps(self, found_inf: bool, n: int) -> None:
            self.take_ahead([found_inf] * n)
            for _ in range(n):
                self.apply(found_inf)

        @precondition(lambda self: round_trip and len(self.forks) < 2)
        @rule()
        def save_and_restore(self) -> None:
            self.restore_a_fork()

        def apply(self, found_inf: bool) -> None:
            self.expected = self.rule.next(*self.expected[:3], found_inf)
            self.step(found_inf)

        def compare(self, values: tuple[Any, ...], found_inf: bool | None, before: float) -> None:
            scale, tracker = values[0], values[1] if counter is not None else None
            expected_scale, expected_tracker, _, event = self.expected
            wrong = []
            if not scale == expected_scale:  # `not ==`: a NaN scale is wrong too
                wrong.append(f"your scale is {number(scale)}, the {reference} rule says {number(expected_scale)}")
            if tracker is not None and tracker != expected_tracker:
                wrong.append(f"your {counter} is {tracker}, the rule says {expected_tracker}")
            if not wrong:
                return
            law = "" if found_inf is None else broken_law(self.settings, reference, found_inf, before, scale,
                                                           tracker, event, expected_tracker=expected_tracker,
                                                           scale_dtype=self.rule.scale_dtype)  # fmt: skip
            raise self.failure(wrong, law)

    ScalerMachine.__name__ = f"ScalerAgainst_{reference}"
    return ScalerMachine
