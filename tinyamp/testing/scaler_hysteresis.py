"""check_scaler against Megatron-LM's, DeepSpeed's or fairseq's rule (``reference="megatron"``, ...).

The scaler under test is built with that library's own settings, by its own names (drawn by
``strategies.hysteresis_settings(reference)``: windows of 1..5 steps, hysteresis of 1..4), and
needs ``update(found_inf)``, ``scale``, the library's hysteresis counter (``counter``, by default
``hysteresis``: Megatron's ``hysteresis_tracker``, DeepSpeed's ``cur_hysteresis``, fairseq's
``overflows_since_rescale``) and, unless ``round_trip=False``, ``state_dict()`` and
``load_state_dict(d)``.  Where the library ends the run (an overflow at DeepSpeed's floor with
``raise_error_at_min_scale``, a fairseq scale at or below ``min_loss_scale``), ``update`` must
raise, and the run is over: no later step is taken.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from tinyamp.amp.hysteresis_rules import LossScaleFloorError, make_rule
from tinyamp.testing.counterexamples import number
from tinyamp.testing.scaler_forks import ScalerAndForks, settings_in_words
from tinyamp.testing.strategies import hysteresis_settings

LONGEST_RUN = 60  # flags in one rule: windows are 1..5 steps, floors 0..9 backoffs below the start

COUNTER_NAMES = {"megatron": "hysteresis_tracker", "deepspeed": "cur_hysteresis", "fairseq": "overflows_since_rescale"}


def broken_law(library: str, settings: dict[str, Any], found_inf: bool, before: float, after: float,
               expected: float, event: str) -> str:  # fmt: skip
    """The rule of `library` that the step `before` -> `after` breaks, in words ("" if none is named)."""
    if found_inf and event == "tolerated" and after != before:
        return {
            "megatron": f"an overflow backs off only once hysteresis={settings.get('hysteresis')} overflows have come "
                        "since the start or the last growth (the counter is restored only when the scale grows)",
            "deepspeed": f"an overflow backs off only when cur_hysteresis is 1 (delayed_shift="
                         f"{settings.get('delayed_shift')}); the counter is restored at a growth"
                         + (", or at every clean step (consecutive_hysteresis=True)"
                            if settings.get("consecutive_hysteresis") else ", not at every clean step"),
            "fairseq": f"an overflow backs off only when the overflows since the last backoff reach tolerance="
                       f"{number(settings.get('tolerance', 0.0))} of the steps since the last rescale",
        }[library]  # fmt: skip
    if found_inf and event in ("backed_off", "hit_floor") and after == before:
        return "this overflow exhausts the hysteresis counter: the scale must back off"
    if not found_inf and event == "held" and after != before:
        return "a clean step grows the scale only at the end of the window"
    if not found_inf and event == "grew" and after == before:
        window = settings.get("growth_interval", settings.get("scale_window"))
        return f"the scale grows here, at the end of the window of {window} clean steps"
    return ""


def counter_law(library: str, settings: dict[str, Any], event: str) -> str:
    """What a clean step does to the hysteresis counter (the law a wrong counter after a clean step breaks)."""
    if library == "fairseq":
        return "a clean step leaves overflows_since_rescale alone; only a backoff sets it back to 0"
    if library == "deepspeed" and settings.get("consecutive_hysteresis"):
        return "with consecutive_hysteresis=True every clean step restores cur_hysteresis to delayed_shift"
    if event == "grew":
        return f"the end of the growth window restores the {COUNTER_NAMES[library]}"
    return f"a clean step restores the {COUNTER_NAMES[library]} only when the scale grows, not at every clean step"


def overflow_counter_law(library: str) -> str:
    """What an overflow does to the hysteresis counter (the law a wrong counter after an overflow breaks)."""
    return {
        "megatron": "an overflow lowers hysteresis_tracker by 1, the one that backs off included (it goes on down: "
                    "0, -1, ...); only a growth restores it, never a backoff",
        "deepspeed": "an overflow that does not back off lowers cur_hysteresis by 1; a backoff leaves it as it is",
        "fairseq": "an overflow adds 1 to overflows_since_rescale, and a backoff sets it back to 0",
    }[library]  # fmt: skip


def hysteresis_machine(
    make_scaler: Callable[..., Any], reference: str, counter: str | None, round_trip: bool
) -> type[RuleBasedStateMachine]:
    """The state machine ``check_scaler`` runs for a hysteresis `reference`."""
    names = ["scale"] if counter is None else ["scale", counter]
    what = COUNTER_NAMES[reference]

    class HysteresisMachine(ScalerAndForks):
        """Your scaler and the library's rule, given the same flags, until the rule ends the run."""

        @initialize(settings=hysteresis_settings(reference))
        def build(self, settings: dict[str, Any]) -> None:
            self.rule = make_rule(reference, settings)
            self.expected = (self.rule.round(self.rule.init_scale), self.rule.start(), "held")
            self.ended = False
            self.compare(self.start(make_scaler, names, settings), None, self.expected[0])

        @precondition(lambda self: not self.ended)
        @rule(found_inf=st.booleans())
        def one_step(self, found_inf: bool) -> None:
            self.apply(found_inf)

        @precondition(lambda self: not self.ended)
        @rule(found_inf=st.booleans(), n=st.integers(2, LONGEST_RUN))
        def run_of_steps(self, found_inf: bool, n: int) -> None:
            self.take_ahead([found_inf] * n)
            for _ in range(n):
                if not self.ended:
                    self.apply(found_inf)
            self.queued = []  # steps taken ahead past the end of the run: never compared

        @precondition(lambda self: self.ended)
        @rule()
        def the_run_is_over(self) -> None:
            """The library ended the run: nothing more to step (hypothesis needs a rule it can take)."""

        @precondition(lambda self: round_trip and not self.ended and len(self.forks) < 2)
        @rule()
        def save_and_restore(self) -> None:
            self.restore_a_fork()

        def apply(self, found_inf: bool) -> None:
            scale, counters, _ = self.expected
            try:
                self.expected = self.rule.next(scale, dict(counters), found_inf)
            except LossScaleFloorError as exc:
                self.expect_the_end(found_inf, str(exc))
                return
            self.step(found_inf)

        def expect_the_end(self, found_inf: bool, why: str) -> None:
            self.ended = True
            ahead, self.queued = self.queued[:1], []  # this step, if it was taken ahead in your scaler's process
            for who, scaler in [("your scaler", self.yours)] + [("a restored scaler", f) for f, _ in self.forks]:
                taken = ahead[0] if ahead and scaler is self.yours else None
                if taken is not None and not (isinstance(taken, tuple) and taken[0] == "before"):
                    if isinstance(taken, tuple) and taken[0] == "update":  # its update raised there
                        if isinstance(taken[1], NotImplementedError):
                            raise taken[1]
                        continue
                else:
                    try:
                        scaler.update(found_inf)
                    except NotImplementedError:
                        raise
                    except Exception:  # DeepSpeed raises Exception, fairseq FloatingPointError: any exception ends it
                        continue
                raise AssertionError(
                    f"{self.when()}, {who}'s update({found_inf}) returned, but the {reference} rule ends the run "
                    f"here with an error ({why}) (settings: {settings_in_words(self.settings)})"
                )

        def compare(self, values: tuple[Any, ...], found_inf: bool | None, before: float) -> None:
            expected_scale, counters, event = self.expected
            expected_counter = self.rule.hysteresis(counters)
            scale, tracker = values[0], values[1] if counter is not None else None
            wrong = []
            if not scale == expected_scale:
                wrong.append(f"your scale is {number(scale)}, the {reference} rule says {number(expected_scale)}")
            if tracker is not None and tracker != expected_counter:
                wrong.append(f"your {counter} is {tracker}, the rule's {what} is {expected_counter}")
            if not wrong:
                return
            # the laws of the scale only where the scale is wrong (at the floor a right scale can look unmoved)
            law = "" if found_inf is None or scale == expected_scale else broken_law(
                reference, self.settings, found_inf, before, scale, expected_scale, event)  # fmt: skip
            if not law and found_inf is False and tracker is not None and tracker != expected_counter:
                law = counter_law(reference, self.settings, event)
            if not law and found_inf is True and tracker is not None and tracker != expected_counter:
                law = overflow_counter_law(reference)
            raise self.failure(wrong, law)

    HysteresisMachine.__name__ = f"ScalerAgainst_{reference}"
    return HysteresisMachine
