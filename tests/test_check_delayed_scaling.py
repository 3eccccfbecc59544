"""tinyamp.testing.check_delayed_scaling: it passes tinyamp's own delayed scaling and a plain implementation of
the rule, fails planted mistakes with the clause of the rule they broke, reads a PyTorch recipe through an
adapter, and refuses bad settings with one sentence."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest
from exercise_solutions.eight_bits import DelayedScaling  # tests/exercise_solutions/, not in the package

from tinyamp.fp8 import E4M3, E5M2, ScalingRecipe, TensorScaling
from tinyamp.testing import check_delayed_scaling
from tinyamp.testing.counterexamples import same_examples_every_run

pytestmark = pytest.mark.fp8

FEW = 40  # hypothesis examples where the check passes; the tours of the edge cases always run


class TinyampAdapter:
    """tinyamp's TensorScaling behind the check's interface, through its public API: one value per step."""

    def __init__(self, fp8_max: float, margin: int, amax_history_len: int, amax_compute_algo: str) -> None:
        recipe = ScalingRecipe(margin=margin, amax_history_len=amax_history_len, amax_compute_algo=amax_compute_algo)
        self.tensor = TensorScaling("t", E4M3 if fp8_max == E4M3.max else E5M2, recipe)

    def update(self, amax: float) -> None:
        self.tensor.quantize(np.float32([amax]))  # a tensor whose amax is `amax`

    @property
    def scale(self) -> float:
        return self.tensor.scale

    @property
    def amax_history(self) -> np.ndarray:
        return self.tensor.amax_history

    def state_dict(self) -> dict[str, Any]:
        return self.tensor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tensor.load_state_dict(state)


def test_tinyamps_tensor_scaling_passes_with_a_state_dict_round_trip() -> None:
    check_delayed_scaling(TinyampAdapter, round_trip=True, max_examples=FEW)


def test_a_plain_implementation_of_the_rule_passes_and_so_do_pinned_settings() -> None:
    check_delayed_scaling(DelayedScaling, max_examples=FEW)
    check_delayed_scaling(DelayedScaling, margin=0, amax_history_len=1024, amax_compute_algo="max", max_examples=10)
    check_delayed_scaling(DelayedScaling, formats=("E5M2",), history=None, max_examples=10)


# ---- planted mistakes: each fails with the clause it broke ------------------------------------------------------
class ZeroNotHeld(DelayedScaling):
    """Divides by a zero amax: 448 / 0 is inf, clamped."""

    def update(self, amax: float) -> None:
        super().update(amax)
        if amax == 0 and self.amax_history.max() == 0:
            self.scale = float(np.finfo(np.float32).max)


class NanWritten(DelayedScaling):
    def update(self, amax: float) -> None:
        if math.isnan(amax):
            self.amax_history = np.append(self.amax_history[1:], np.float32(amax))
            return
        super().update(amax)


class InfWritten(DelayedScaling):
    """Writes an inf amax into the history (and so holds the scale while it stays there)."""

    def update(self, amax: float) -> None:
        if math.isinf(amax):
            self.amax_history = np.append(self.amax_history[1:], np.float32(amax))
            return
        super().update(amax)


class OverflowsToInf(DelayedScaling):
    def update(self, amax: float) -> None:
        super().update(amax)
        if self.scale == float(np.finfo(np.float32).max):
            self.scale = math.inf


class ZeroDoesNotRoll(DelayedScaling):
    """Transformer Engine's bulk kernel: a step amax of 0 neither rolls the history nor updates the scale."""

    def update(self, amax: float) -> None:
        if amax != 0:
            super().update(amax)


class MarginIgnored(DelayedScaling):
    def __init__(self, fp8_max: float, margin: int = 0, **settings: Any) -> None:
        super().__init__(fp8_max, 0, **settings)


class MostRecentIgnored(DelayedScaling):
    def __init__(self, fp8_max: float, margin: int = 0, amax_history_len: int = 1024, amax_compute_algo: str = "max"):
        super().__init__(fp8_max, margin, amax_history_len, "max")


class FirstScaleFromTheFormat(DelayedScaling):
    def __init__(self, fp8_max: float, *args: Any, **kwargs: Any) -> None:
        super().__init__(fp8_max, *args, **kwargs)
        self.scale = fp8_max


class ScaleNotRounded(DelayedScaling):
    """The quotient kept in float64: not a float32 value."""

    def update(self, amax: float) -> None:
        super().update(amax)
        r = self.amax_history.max() if self.amax_compute_algo == "max" else self.amax_history[-1]
        if np.isfinite(r) and r > 0 and self.scale < 3e38:
            self.scale = self.fp8_max * 2.0**-self.margin / float(r)


class HistoryDroppedOnLoad(DelayedScaling):
    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "amax_history": self.amax_history.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = state["scale"]  # the history is forgotten


@pytest.mark.parametrize(
    "wrong, words",
    [
        (
            ZeroNotHeld,
            r"after the amaxes 0 your scale is 3\.40\d*e\+38, tinyamp's rule says 1: the reduced amax "
            r"\(the largest of the last 3 amaxes\) is 0, nothing measured: the previous scale is kept",
        ),
        (
            NanWritten,
            r"after the amaxes 2, nan your amax_history is \[2, nan\] .*the rule's is \[0, 2\] .*a NaN or inf amax "
            r"is not written",
        ),
        (
            InfWritten,
            r"after the amaxes 2, inf your amax_history is \[2, inf\] .*the rule's is \[0, 2\] .*a NaN or inf amax "
            r"is not written",
        ),
        (
            OverflowsToInf,
            r"after the amaxes 2\^-149 your scale is inf, tinyamp's rule says 3\.40\d*e\+38: float32\("
            r"448 \* 2\^-0\) / 2\^-149 overflows float32 .*: the scale becomes float32's largest value",
        ),
        (
            ZeroDoesNotRoll,
            r"after the amaxes 0, 2, 0 your amax_history is \[0, 0, 2\] .*the rule's is \[0, 2, 0\] .*a 0 included",
        ),
        (
            MarginIgnored,
            r"margin=1, .* your scale is 224, tinyamp's rule says 112: scale = float32\(448 \* 2\^-1\) / 2",
        ),
        (
            MostRecentIgnored,
            r"after the amaxes 2, 200, 3 your scale is 1\.12\d*, tinyamp's rule says 74\.66\d*: .* "
            r"where 3 is the newest amax",
        ),
        (
            FirstScaleFromTheFormat,
            r"before any update your scale is 448, tinyamp's rule says 1: the first cast uses a "
            r"scale of 1",
        ),
        (
            ScaleNotRounded,
            r"after the amaxes 2, 200 your scale is 2\.24 \(not a float32 value\), tinyamp's rule says "
            r"2\.2400000\d*: scale = float32\(448 \* 2\^-0\) / 200, one float32 division",
        ),
    ],
)
def test_a_planted_mistake_fails_with_the_clause_of_the_rule_it_broke(wrong: type, words: str) -> None:
    with same_examples_every_run(), pytest.raises(AssertionError) as raised:
        check_delayed_scaling(wrong, max_examples=FEW)
    assert re.search(words, str(raised.value)), str(raised.value)


def test_a_state_dict_that_forgets_the_history_fails_the_round_trip() -> None:
    with same_examples_every_run(), pytest.raises(AssertionError, match=r"a copy restored from your state_dict\(\)"):
        check_delayed_scaling(HistoryDroppedOnLoad, round_trip=True, max_examples=FEW)
    check_delayed_scaling(HistoryDroppedOnLoad, max_examples=10)  # without the round trip it follows the rule


class QuotientTruncated(DelayedScaling):
    """The quotient rounded toward zero, not to nearest: within one float32 ulp of the rule's."""

    def update(self, amax: float) -> None:
        super().update(amax)
        r = self.amax_history.max() if self.amax_compute_algo == "max" else self.amax_history[-1]
        if np.isfinite(r) and r > 0 and self.scale < 3e38:
            exact = self.fp8_max * 2.0**-self.margin / float(r)  # float64: near enough to decide the direction
            scale = np.float32(exact)
            if scale >= 2.0**-126 and float(scale) > exact:  # truncated where float32 is normal (no truncation to 0)
                scale = np.nextafter(scale, np.float32(0))
            if scale > 0:  # a quotient that underflows to 0 keeps the previous scale, as the rule does
                self.scale = float(scale)


def test_ulps_lets_a_scale_differ_by_that_many_float32_ulps() -> None:
    with same_examples_every_run(), pytest.raises(AssertionError, match=r"your scale is .*, tinyamp's rule says"):
        check_delayed_scaling(QuotientTruncated, max_examples=FEW)
    check_delayed_scaling(QuotientTruncated, ulps=1, max_examples=FEW)


# ---- a third party's recipe, through an adapter ------------------------------------------------------------------
def test_a_pytorch_recipe_through_an_adapter_is_told_where_its_rule_differs() -> None:
    """A recipe in PyTorch whose scale is computed as torchao.float8's ``amax_to_scale`` computes it
    (torchao/float8/float8_utils.py: the FP8 maximum divided, in float64, by the amax clamped below at 1e-12,
    then rounded to float32), with the history rolled as Transformer Engine rolls it: an amax of 0 gives a
    scale of 4.48e14 where tinyamp's rule keeps the previous one."""
    torch = pytest.importorskip("torch")

    class TorchRecipe:
        def __init__(self, fp8_max: float, margin: int, amax_history_len: int, amax_compute_algo: str) -> None:
            self.fp8_max, self.margin, self.algo = fp8_max, margin, amax_compute_algo
            self.history = torch.zeros(amax_history_len, dtype=torch.float32)
            self.scale_tensor = torch.tensor(1.0, dtype=torch.float32)

        def update(self, amax: float) -> None:
            self.history = torch.roll(self.history, -1)
            self.history[-1] = amax
            reduced = (self.history.max() if self.algo == "max" else self.history[-1]).to(torch.float64)
            top = self.fp8_max * 2.0**-self.margin
            self.scale_tensor = (top / torch.clamp(reduced, min=1e-12)).to(torch.float32)

        @property
        def scale(self) -> float:
            return float(self.scale_tensor)

        @property
        def amax_history(self) -> np.ndarray:
            return self.history.numpy()

    with same_examples_every_run(), pytest.raises(AssertionError) as raised:
        check_delayed_scaling(TorchRecipe, nan_amaxes=False, max_examples=FEW)
    assert re.search(r"after the amaxes 0 your scale is 4479999\d+, tinyamp's rule says 1: the reduced amax .* is 0",
                     str(raised.value)), str(raised.value)  # fmt: skip


# ---- bad settings: one sentence each ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "settings, error, words",
    [
        ({"make_scaling": 3}, TypeError, "make_scaling is a int; pass a function or class"),
        ({"formats": ("E4M4",)}, ValueError, "unknown FP8/FP4 format 'E4M4'; use one of E4M3, E5M2, E2M1"),
        ({"formats": ("E2M1",)}, ValueError, "per-tensor scaling casts to E4M3 or E5M2, not E2M1"),
        ({"formats": "E4M3"}, ValueError, r"formats='E4M3': pass a tuple of format names, e.g. \('E4M3',\)"),
        ({"margin": -1}, ValueError, "margin=-1: the margin is a whole number of powers of two from 0 to 126"),
        ({"margin": 1.5}, ValueError, "margin=1.5: the margin is a whole number"),
        ({"amax_history_len": 0}, ValueError, "amax_history_len=0: the history holds at least one step"),
        ({"amax_compute_algo": "mean"}, ValueError, "unknown amax_compute_algo 'mean'; use 'max'"),
        ({"history": ""}, ValueError, "history='': name your recipe's amax-history attribute, or pass None"),
        ({"ulps": -1}, ValueError, "ulps=-1: use a whole number >= 0"),
        ({"steps": 0}, ValueError, "steps=0: use a whole number >= 1"),
        ({"max_examples": 0}, ValueError, "max_examples=0: use a whole number >= 1"),
    ],
)
def test_a_bad_setting_is_refused_with_one_sentence(settings: dict, error: type, words: str) -> None:
    make = settings.pop("make_scaling", DelayedScaling)
    with pytest.raises(error, match=words):
        check_delayed_scaling(make, **settings)
