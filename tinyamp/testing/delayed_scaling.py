"""check_delayed_scaling: anyone's delayed-scaling recipe, step by step, against tinyamp's rule.

    from tinyamp.testing import check_delayed_scaling

    def test_my_recipe_follows_the_rule():
        check_delayed_scaling(lambda **settings: MyDelayedScaling(**settings))

The recipe under test is built with the keywords ``fp8_max`` (448 for E4M3, 57344 for E5M2),
``margin``, ``amax_history_len`` and ``amax_compute_algo`` (``"max"`` or ``"most_recent"``:
Transformer Engine's ``DelayedScaling`` names) and needs

* ``update(amax)``: one step: this step's amax (a float32 value, as a Python float) goes into
  the history, and the scale for the next cast is computed;
* ``scale``: the scale the next cast multiplies by (a number, or a method that returns one);
  1 before the first update.  A recipe that keeps the dequantizing ``scale_inv`` instead
  passes an adapter whose ``scale`` is ``1 / scale_inv``, and perhaps ``ulps=1``;
* ``amax_history`` (unless ``history=None``): the last ``amax_history_len`` amaxes, oldest
  first, zeros before the first steps;
* ``state_dict()`` and ``load_state_dict(d)`` with ``round_trip=True``.

**The rule** (``tinyamp/fp8/scaling.py``, Transformer Engine's per-tensor kernel): every
step's amax is appended to the history and the oldest entry dropped, a 0 included; the
history is reduced (its largest entry, or its newest) to amax_r; then

    scale = float32(fp8_max * 2^-margin) / amax_r      one float32 division
                                                       (a float64 one rounded to float32 is the same:
                                                       53 >= 2 * 24 + 2 bits, so rounding twice is harmless)

except that an amax_r of 0, or a quotient that underflows to 0 (a margin of 31 or more),
keeps the previous scale, and a quotient that overflows float32 becomes float32's largest
value (never inf).  A step whose amax is NaN or inf keeps the
scale and leaves the history as it was (so the history never holds inf: one infinite
activation would otherwise hold every scale for the whole window).  ``nan_amaxes=False`` leaves NaN out of
the amaxes, for a recipe that decides otherwise (JAX's propagates NaN).

The check feeds the recipe and tinyamp's ``TensorScaling`` the same amaxes: drawn sequences
(``strategies.amax_sequences``: 0, inf, NaN, spikes, amaxes so small that the quotient
overflows, any float32 value), then a fixed tour of each edge case, and compares after every
step.  The first disagreement raises AssertionError with the settings, the amaxes so far,
your scale and the rule's, and the clause of the rule that decided it.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tinyamp.fp8 import scaling_checks
from tinyamp.fp8.formats import get_format
from tinyamp.fp8.scaling import FLOAT32_MAX, ScalingRecipe, TensorScaling
from tinyamp.testing.counterexamples import blamed, check_settings, number
from tinyamp.testing.strategies import amax_sequences, delayed_scaling_settings

NAN, INF = float("nan"), float("inf")
# (what the tour exercises, pinned settings, amaxes): each edge case of the rule, after the drawn examples
TOURS: tuple[tuple[str, dict[str, Any], list[float]], ...] = (
    ("a zero amax", dict(margin=0, amax_history_len=3, amax_compute_algo="max"), [0.0, 2.0, 0.0, 0.0, 0.0, 0.0]),
    ("a NaN amax", dict(margin=0, amax_history_len=2, amax_compute_algo="max"), [2.0, NAN, 4.0, NAN, 1.0, 1.0]),
    ("an inf amax", dict(margin=0, amax_history_len=2, amax_compute_algo="max"), [2.0, INF, 2.0, 2.0, 2.0]),
    ("a spike", dict(margin=0, amax_history_len=3, amax_compute_algo="max"), [2.0, 200.0, 2.0, 2.0, 2.0, 2.0]),
    ("the newest amax", dict(margin=1, amax_history_len=3, amax_compute_algo="most_recent"), [2.0, 200.0, 3.0]),
    ("a scale beyond float32", dict(margin=0, amax_history_len=1, amax_compute_algo="max"), [2.0**-149, 1e-40, 1.0]),
    ("a margin", dict(margin=3, amax_history_len=2, amax_compute_algo="max"), [3.0, 5.0, 7.0]),
    ("a quotient rounded to float32", dict(margin=0, amax_history_len=1, amax_compute_algo="max"), [3.0, 7.0, 0.1]),
    # 448 * 2^-40 / 2^127 = 1.75 * 2^-159 and 57344 * 2^-40 / 2^127 = 1.75 * 2^-152 are below 2^-150, half of
    # float32's smallest subnormal: the quotient rounds to 0
    ("a quotient that underflows", dict(margin=40, amax_history_len=1, amax_compute_algo="max"), [1.0, 2.0**127, 2.0]),
)  # fmt: skip


def check_delayed_scaling(
    make_scaling: Callable[..., Any],
    *,
    formats: Sequence[str] = ("E4M3", "E5M2"),
    margin: int | None = None,
    amax_history_len: int | None = None,
    amax_compute_algo: str | None = None,
    history: str | None = "amax_history",
    round_trip: bool = False,
    ulps: int = 0,
    nan_amaxes: bool = True,
    max_examples: int | None = None,
    steps: int = 30,
) -> None:
    """Compare the recipe `make_scaling(**settings)` builds with tinyamp's delayed-scaling rule, step by step.

    `formats` gives the fp8_max values drawn (``"E4M3"``: 448, ``"E5M2"``: 57344); `margin`,
    `amax_history_len` and `amax_compute_algo`, when given, pin that setting (a recipe that has
    only TE's defaults: ``margin=0, amax_history_len=1024, amax_compute_algo="max"``).
    `history` names the amax-history attribute (None: scales alone); `ulps` is how many float32
    ulps a scale may differ by (0: bit for bit); `steps` the most amaxes in one drawn sequence.
    Raises AssertionError with the first disagreement, in words.
    """
    pinned = _checked_settings(make_scaling, formats, margin, amax_history_len, amax_compute_algo, history, ulps,
                               max_examples, steps)  # fmt: skip
    fp8_max = tuple(get_format(f).max for f in formats)
    check = _Check(make_scaling, history, round_trip, ulps)

    for _, settings, amaxes in TOURS:  # first: each edge case on its own, the simplest counterexamples
        if nan_amaxes or not any(math.isnan(a) for a in amaxes):
            for top in fp8_max:
                check.run({"fp8_max": top, **settings, **pinned}, amaxes, 1)

    @check_settings(max_examples)
    @given(delayed_scaling_settings(fp8_max, **pinned), amax_sequences(steps, nan_amaxes), st.integers(0, steps))
    def scales_follow_the_rule(settings: dict[str, Any], amaxes: list[float], fork_at: int) -> None:
        check.run(settings, amaxes, fork_at)

    scales_follow_the_rule()


def _checked_settings(make_scaling: Any, formats: Any, margin: Any, length: Any, algo: Any, history: Any, ulps: Any,
                      max_examples: Any, steps: Any) -> dict[str, Any]:  # fmt: skip
    """The pinned settings, each checked with one sentence naming the fix (ScalingRecipe's own for the recipe)."""
    if not callable(make_scaling):
        raise TypeError(f"make_scaling is a {type(make_scaling).__name__}; pass a function or class that builds your "
                        "recipe from the keywords fp8_max, margin, amax_history_len, amax_compute_algo")  # fmt: skip
    if isinstance(formats, str) or not formats:
        raise ValueError(f"formats={formats!r}: pass a tuple of format names, e.g. ('E4M3',) or ('E4M3', 'E5M2')")
    for name in formats:
        scaling_checks.checked_format(get_format(name))  # unknown names and E2M1 are refused there
    pinned = {k: v for k, v in (("margin", margin), ("amax_history_len", length), ("amax_compute_algo", algo))
              if v is not None}  # fmt: skip
    ScalingRecipe(**pinned)  # refuses a negative or fractional margin, a history below 1, an unknown algorithm
    if history is not None and not (isinstance(history, str) and history.isidentifier()):
        raise ValueError(f"history={history!r}: name your recipe's amax-history attribute, or pass None to "
                         "compare scales alone")  # fmt: skip
    for name, value, low in (("ulps", ulps, 0), ("steps", steps, 1), ("max_examples", max_examples, 1)):
        if value is None and name == "max_examples":
            continue
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name}={value!r}: use a whole number >= {low}")
    return pinned


@dataclass
class _Step:
    """What the rule says after one step."""

    scale: float
    history: np.ndarray
    event: str  # rescaled, clamped, held
    reduced: float  # the reduced amax (NaN on a step whose amax is NaN or inf)


class _Reference:
    """tinyamp's rule: a TensorScaling fed one value per step whose magnitude is the step's amax."""

    def __init__(self, settings: dict[str, Any]) -> None:
        fmt = "E4M3" if settings["fp8_max"] == 448.0 else "E5M2"
        recipe = ScalingRecipe(**{k: v for k, v in settings.items() if k != "fp8_max"})
        self.tensor = TensorScaling("checked", fmt, recipe)

    def update(self, amax: float) -> _Step:
        self.tensor.quantize(np.float32([amax]))
        t, algo = self.tensor, self.tensor.recipe.amax_compute_algo
        window = t.amax_history if algo == "max" else t.amax_history[-1:]
        reduced = float(window.max()) if math.isfinite(amax) else NAN
        return _Step(t.scale, t.amax_history.copy(), t.history[-1].event, reduced)


class _Check:
    def __init__(self, make: Callable[..., Any], history: str | None, round_trip: bool, ulps: int) -> None:
        self.make, self.history, self.round_trip, self.ulps = make, history, round_trip, ulps

    def run(self, settings: dict[str, Any], amaxes: list[float], fork_at: int) -> None:
        where = f"with {settings_in_words(settings)}"
        amaxes = [float(np.float32(a)) for a in amaxes]  # float32 values, as a tensor's amax is
        reference = _Reference(settings)
        with blamed(f"{where}, make_scaling(**settings) or reading its scale"):
            yours = self.make(**settings)
            first = self.read(yours)
        start = _Step(1.0, np.zeros(settings["amax_history_len"], np.float32), "initial", NAN)
        self.compare(first, start, settings, [], where)
        fork = None  # with round_trip: a copy restored from yours after `fork_at` steps, then updated alongside
        for i, amax in enumerate(amaxes):
            if self.round_trip and i == fork_at:
                with blamed(f"{where}, after the amaxes {amaxes_in_words(amaxes[:i])}, state_dict() and "
                            "load_state_dict()"):  # fmt: skip
                    fork = self.make(**settings)
                    fork.load_state_dict(copy.deepcopy(yours.state_dict()))
            expected = reference.update(amax)
            for recipe in (yours, fork):
                if recipe is None:
                    continue
                with blamed(f"{where}, after the amaxes {amaxes_in_words(amaxes[:i])}, update({number(amax)}) or "
                            "reading the scale"):  # fmt: skip
                    recipe.update(amax)
                    got = self.read(recipe)
                restored = f" (a copy restored from your state_dict() after {fork_at} amaxes)"
                self.compare(got, expected, settings, amaxes[: i + 1], where + ("" if recipe is yours else restored))

    def read(self, recipe: Any) -> tuple[float, np.ndarray | None]:
        scale = recipe.scale() if callable(recipe.scale) else recipe.scale
        if self.history is None:
            return float(scale), None
        history = getattr(recipe, self.history)
        return float(scale), np.asarray(history() if callable(history) else history, dtype=np.float64)

    def compare(self, got: tuple[float, np.ndarray | None], expected: _Step, settings: dict[str, Any],
                amaxes: list[float], where: str) -> None:  # fmt: skip
        scale, history = got
        when = f"after the amaxes {amaxes_in_words(amaxes)}" if amaxes else "before any update"
        if not self.close(scale, expected.scale):
            odd = "" if math.isnan(scale) or float(np.float32(scale)) == scale else " (not a float32 value)"
            raise AssertionError(f"{where}: {when} your scale is {number(scale)}{odd}, tinyamp's rule says "
                                 f"{number(expected.scale)}: {clause(settings, amaxes, expected)}")  # fmt: skip
        if history is None:
            return
        want = expected.history.astype(np.float64)
        if history.shape != want.shape or not np.array_equal(history, want):
            raise AssertionError(
                f"{where}: {when} your {self.history} is {values_in_words(history)}, the rule's is "
                f"{values_in_words(want)} (oldest first): each step's amax is appended and the oldest dropped, a 0 "
                f"included; a NaN or inf amax is not written; zeros fill the {settings['amax_history_len']} places "
                "at first"
            )

    def close(self, scale: float, expected: float) -> bool:
        if scale == expected:
            return True
        if self.ulps == 0 or not (math.isfinite(scale) and scale > 0):
            return False
        ordinal = np.float32([scale, expected]).view(np.int32).astype(np.int64)  # positive floats order as ints
        return float(np.float32(scale)) == scale and abs(int(ordinal[0] - ordinal[1])) <= self.ulps


def clause(settings: dict[str, Any], amaxes: list[float], step: _Step) -> str:
    """The clause of the rule that decided `step`'s scale, in words."""
    if not amaxes:
        return "the first cast uses a scale of 1 (Transformer Engine's initial scale)"
    top, margin, n = number(settings["fp8_max"]), settings["margin"], settings["amax_history_len"]
    amax, reduced = amaxes[-1], step.reduced
    if not math.isfinite(amax):
        return "a step whose amax is NaN or inf keeps the previous scale and leaves the history as it was"
    window = f"the largest of the last {n} amaxes" if settings["amax_compute_algo"] == "max" and n > 1 else \
        "the newest amax" + (" (the history holds one)" if n == 1 else "")  # fmt: skip
    quotient, reduced_is = f"float32({top} * 2^-{margin}) / {number(reduced)}", f"{number(reduced)} is {window}"
    if step.event == "held" and reduced == 0:
        return f"the reduced amax ({window}) is 0, nothing measured: the previous scale is kept"
    if step.event == "held":
        return f"{quotient} underflows to 0 ({reduced_is}): the previous scale is kept, as 0 would zero every value"
    if step.event == "clamped":
        return (f"{quotient} overflows float32 ({reduced_is}): the scale becomes float32's largest value "
                f"{number(FLOAT32_MAX)}, not inf")  # fmt: skip
    zero = "; an amax of 0 enters the history like any other" if amax == 0 else ""
    return f"scale = {quotient}, one float32 division, where {reduced_is}{zero}"


def settings_in_words(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={number(v)}" for k, v in settings.items())


def amaxes_in_words(amaxes: list[float]) -> str:
    return ", ".join(number(a) for a in amaxes) if amaxes else "(none)"


def values_in_words(values: np.ndarray) -> str:
    shown = ", ".join(number(v) for v in values[-8:])
    return f"[{'..., ' if values.size > 8 else ''}{shown}] ({values.size} entries)"
