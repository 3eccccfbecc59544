"""tinyamp/fp8/scaling.py: the scale rule, current and delayed scaling, and each tensor's inspectable state.

The laws: the scale is float32(float32(FP8_MAX * 2^-margin) / amax), held for an amax of 0,
inf or NaN, float32's max when the quotient overflows; delayed scaling casts step t with the
scale learned at step t-1 from a rolling history (checked step by step against a plain loop
over drawn amax sequences); the counts of saturated and flushed values are those of the
format's edges; load(state_dict()) continues bit for bit; bad settings get one sentence.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import amax_values, scaling_recipe_settings

from tinyamp.fp8.formats import E4M3, E5M2, decode, encode
from tinyamp.fp8.scales import Fp8Scales
from tinyamp.fp8.scaling import FLOAT32_MAX, STATES, Fp8Tensor, ScalingRecipe, TensorScaling, next_scale

pytestmark = pytest.mark.fp8


def tensor_with_amax(amax: float) -> np.ndarray:
    """A float32 tensor whose largest magnitude is `amax` (NaN and inf kept as they are)."""
    return np.array([0.0, -amax, amax / 2, 1e-3 * amax], dtype=np.float32) if amax == amax else np.float32([np.nan])


# ---- the rule ---------------------------------------------------------------------------------------
@given(amax_values(), st.sampled_from([E4M3, E5M2]), st.integers(0, 40), st.sampled_from([1.0, 0.5, 3.0e38]))
def test_the_scale_rule_and_its_edge_cases(amax: float, fmt, margin: int, previous: float) -> None:
    scale, event = next_scale(amax, previous, fmt.max, margin)
    a = np.float32(amax)
    if not (math.isfinite(a) and a > 0):
        assert (scale, event) == (previous, "held")
        return
    with np.errstate(over="ignore"):
        quotient = np.float32(fmt.max * 2.0**-margin) / a
    if np.isinf(quotient):
        assert (scale, event) == (FLOAT32_MAX, "clamped")
    elif quotient == 0:  # a margin of 31 or more over an amax near float32's largest: 0 would zero every value
        assert (scale, event) == (previous, "held")
    else:
        assert (scale, event) == (float(quotient), "rescaled")
        assert float(np.float32(scale)) == scale  # a float32 value, stored exactly as a Python float


def test_the_rule_in_numbers() -> None:
    assert next_scale(448.0, 1.0, 448.0, 0) == (1.0, "rescaled")
    assert next_scale(1.0, 1.0, 448.0, 2) == (112.0, "rescaled")  # a margin of 2 leaves 2 powers of two of room
    assert next_scale(0.0, 7.0, 448.0, 0) == (7.0, "held")
    assert next_scale(math.inf, 7.0, 57344.0, 0) == (7.0, "held")
    assert next_scale(1e-45, 7.0, 448.0, 0) == (FLOAT32_MAX, "clamped")  # 448 / 2^-149 overflows float32
    assert next_scale(FLOAT32_MAX, 7.0, 448.0, 40) == (7.0, "held")  # 448 * 2^-40 / 3.4e38 underflows to 0


# ---- delayed and current scaling, step by step --------------------------------------------------------
def expected_scales(settings: dict, amaxes: list[float]) -> list[tuple[float, float]]:
    """(scale used, scale next) per step, from the module docstring's description, as a plain loop."""
    fp8_max = 448.0 if settings["fp8_format"] in ("HYBRID", "E4M3") else 57344.0
    window, scale, out = [0.0] * settings["amax_history_len"], 1.0, []
    for amax in amaxes:
        if settings["recipe"] == "current":
            scale, _ = next_scale(amax, scale, fp8_max, settings["margin"])
            out.append((scale, scale))
            continue
        used = scale
        if math.isfinite(np.float32(amax)):
            window = window[1:] + [float(np.float32(amax))]
        reduced = max(window) if settings["amax_compute_algo"] == "max" else window[-1]
        reduced = reduced if math.isfinite(np.float32(amax)) else math.nan  # a NaN or inf step holds the scale
        scale, _ = next_scale(reduced, scale, fp8_max, settings["margin"])
        out.append((used, scale))
    return out


@given(scaling_recipe_settings(), st.lists(amax_values(), min_size=1, max_size=30))
def test_scales_follow_the_recipe_step_by_step(settings: dict, amaxes: list[float]) -> None:
    tensor = TensorScaling("w", ScalingRecipe(**settings).format_for("forward"), ScalingRecipe(**settings))
    for amax in amaxes:
        cast = tensor.quantize(tensor_with_amax(amax))
        assert cast.scale == tensor.history[-1].scale
    got = [(e.scale, e.next_scale) for e in tensor.history]
    assert got == expected_scales(settings, amaxes)
    assert not np.isnan(tensor.amax_history).any() and tensor.amax_history.size == settings["amax_history_len"]


def test_delayed_scaling_starts_at_1_and_learns_a_spike_one_step_late() -> None:
    tensor = TensorScaling("act", E4M3, ScalingRecipe(amax_history_len=3))
    tensor.quantize(tensor_with_amax(2.0))
    assert tensor.history[0].scale == 1.0 and tensor.scale == 224.0  # 448 / 2
    tensor.quantize(tensor_with_amax(200.0))  # cast with 224: 200 * 224 > 448, clipped
    spike = tensor.history[-1]
    assert spike.scale == 224.0 and spike.saturated == 2 and spike.next_scale == np.float32(448 / 200)
    for _ in range(2):  # the spike stays in the 3-step window ("max")
        tensor.quantize(tensor_with_amax(2.0))
        assert tensor.scale == np.float32(448 / 200)
    tensor.quantize(tensor_with_amax(2.0))  # it has left the window
    assert tensor.scale == 224.0 and tensor.state == "rescaled"


def test_most_recent_forgets_the_spike_at_once_and_current_scaling_never_saturates() -> None:
    recent = TensorScaling("act", E4M3, ScalingRecipe(amax_history_len=3, amax_compute_algo="most_recent"))
    current = TensorScaling("act", E4M3, ScalingRecipe(recipe="current"))
    for amax in (2.0, 200.0, 2.0):
        recent.quantize(tensor_with_amax(amax))
        current.quantize(tensor_with_amax(amax))
    assert recent.scale == 224.0
    assert [e.saturated for e in current.history] == [0, 0, 0]
    assert [e.scale for e in current.history] == [224.0, float(np.float32(448) / np.float32(200)), 224.0]


def test_hybrid_casts_the_forward_pass_to_e4m3_and_gradients_to_e5m2() -> None:
    recipe = ScalingRecipe()
    assert (recipe.recipe, recipe.fp8_format, recipe.margin, recipe.amax_history_len, recipe.amax_compute_algo) == (
        "delayed", "HYBRID", 0, 1024, "max")  # fmt: skip
    scales = Fp8Scales(recipe)
    x = np.float32([1.0, 500.0])
    assert scales.quantize("w", x).fmt is E4M3 and scales.quantize("w.grad", x, "backward").fmt is E5M2
    assert scales.tensors["w"].history[0].saturated == 1 and scales.tensors["w.grad"].history[0].saturated == 0
    with pytest.raises(ValueError, match="'w' was cast in the forward pass"):
        scales.quantize("w", x, "backward")


# ---- what a cast does: one byte a value, counts, non-finite values ---------------------------------------
def test_the_cast_multiplies_by_the_scale_and_counts_saturated_and_flushed_values() -> None:
    tensor = TensorScaling("g", E5M2, ScalingRecipe(recipe="current", fp8_format="E5M2"))
    smallest = E5M2.min_subnormal
    x = np.float32([57344.0, smallest / 2, smallest * 0.5000001, -smallest / 4, 0.0, 1.0])
    q = tensor.quantize(x)  # amax 57344: scale 1
    assert q.scale == 1.0 and q.bits.dtype == np.uint8 and q.bits.nbytes == x.size
    assert np.array_equal(q.bits, encode(x, E5M2))
    assert tensor.history[-1].flushed == 2  # at or below half the smallest subnormal: 0 (the tie goes to even, 0)
    tensor.quantize(np.float32([1e30, -1e38, 3.0]))  # 57344 / 1e38 * 1e30 is far below the max: none saturate
    assert tensor.history[-1].saturated == 0


def test_powers_of_two_scales_dequantize_exactly() -> None:
    values = E4M3.values[np.isfinite(E4M3.values)]
    for k in (-20, -3, 0, 5, 40):
        q = Fp8Tensor(encode(values, E4M3), E4M3, 2.0**k)
        assert np.array_equal(q.dequantize(), values * np.float32(2.0**-k))  # an exact shift of the exponent


def test_a_non_finite_input_is_reported_and_cast_to_nan_not_saturated() -> None:
    tensor = TensorScaling("fc2.grad", E5M2, ScalingRecipe(fp8_format="E5M2", amax_history_len=4))
    tensor.quantize(tensor_with_amax(10.0))
    q = tensor.quantize(np.float32([1.0, np.inf, -np.inf, np.nan]))
    event = tensor.history[-1]
    assert np.isnan(decode(q.bits, E5M2)[1:]).all() and decode(q.bits, E5M2)[0] == 6144.0  # 1 * 5734.4, rounded
    assert (event.nonfinite, event.saturated, event.event, event.step) == (3, 0, "held", 1)
    assert "step 1: 3 values not finite" in str(tensor) and "fc2.grad" in str(tensor)
    assert tensor.scale == np.float32(5734.4)  # held: a NaN amax leaves the scale and the history
    before = tensor.amax_history.copy()
    tensor.quantize(np.float32([2.0, np.inf]))  # an inf amax, like a NaN one, leaves the history as it was
    assert tensor.state == "held" and np.array_equal(tensor.amax_history, before)
    assert tensor.history[-1].nonfinite == 1 and tensor.scale == np.float32(5734.4)


# ---- state_dict: printable, named, and a bit-identical resume ---------------------------------------------
@given(scaling_recipe_settings(), st.integers(0, 6), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_load_of_state_dict_continues_bit_for_bit(settings: dict, before: int, after: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = 10.0 ** rng.integers(-8, 6, size=before + after)  # spikes and dips: every event happens
    batches = [(rng.standard_normal(40) * size).astype(np.float32) for size in sizes]
    run = Fp8Scales(ScalingRecipe(**settings))

    def step(scales: Fp8Scales, x: np.ndarray) -> bytes:
        forward = scales.quantize("w", x)
        backward = scales.quantize("w.grad", x * np.float32(1e-3), "backward")
        return forward.bits.tobytes() + backward.bits.tobytes()

    for x in batches[:before]:
        step(run, x)
    resumed = Fp8Scales(ScalingRecipe(**json.loads(json.dumps(run.state_dict()))["recipe"]))
    resumed.load_state_dict(json.loads(json.dumps(run.state_dict())))  # through a file's text
    for x in batches[before:]:
        assert step(run, x) == step(resumed, x)
    assert run.state_dict() == resumed.state_dict() and str(run) == str(resumed)


def test_the_state_is_named_and_printable() -> None:
    scales = Fp8Scales(ScalingRecipe(amax_history_len=2))
    assert str(scales) == "no tensor cast to FP8 yet"
    scales.quantize("fc1.weight", np.float32([3.0, -1.0]))
    assert TensorScaling("w", E4M3, ScalingRecipe()).state == "initial" and scales.tensors["fc1.weight"].state in STATES
    state = scales.state_dict()["tensors"]["fc1.weight"]
    assert state["scale"] == np.float32(448 / 3) and state["amax_history"] == [0.0, 3.0]
    assert state["history"][0]["saturated"] == 0 and state["pass"] == "forward" and state["format"] == "E4M3"
    text = str(scales)
    assert "fc1.weight: E4M3, delayed scaling" in text and "saturated 0, flushed to zero 0" in text


# ---- bad input ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"recipe": "dynamic"}, ["'dynamic'", "'delayed'", "'current'"]),
        ({"fp8_format": "E4M3FN"}, ["'E4M3FN'", "'HYBRID'"]),
        ({"margin": -1}, ["margin=-1", "from 0 to 126"]),
        ({"margin": 1.5}, ["margin=1.5", "whole number"]),
        ({"margin": True}, ["margin=True"]),
        ({"amax_history_len": 0}, ["amax_history_len=0", ">= 1"]),
        ({"amax_history_len": 2.0}, ["amax_history_len=2.0"]),
        ({"amax_compute_algo": "mean"}, ["'mean'", "'max'", "'most_recent'"]),
    ],
)
def test_a_bad_setting_gets_one_sentence_naming_it_and_the_fix(settings: dict, words: list[str]) -> None:
    with pytest.raises(ValueError) as raised:
        ScalingRecipe(**settings)
    assert all(w in str(raised.value) for w in words), str(raised.value)


def test_a_damaged_state_is_refused_and_changes_nothing() -> None:
    scales = Fp8Scales(ScalingRecipe(amax_history_len=2))
    scales.quantize("w", np.float32([3.0]))
    good = scales.state_dict()
    for path, value, words in [
        (("amax_history",), [float("nan"), 3.0], "amax_history holds nan"),
        (("amax_history",), [-1.0, 3.0], "holds -1.0"),
        (("amax_history",), [float("inf"), 3.0], "amax_history holds inf"),
        (("amax_history",), [3.0], "has 1 entries"),
        (("scale",), 0.0, "scale holds 0.0"),
        (("scale",), 0.1, "scale holds 0.1"),  # not a float32 value: not a scale this code made
        (("format",), "E5M2", "saved format 'E5M2'"),
        (("pass",), "sideways", "unknown pass 'sideways'"),
    ]:
        bad = json.loads(json.dumps(good))
        bad["tensors"]["w"][path[0]] = value
        with pytest.raises(ValueError, match=words):
            scales.load_state_dict(bad)
        assert scales.state_dict() == good
    with pytest.raises(ValueError, match="saved state of tensor 'w' is a list"):
        scales.load_state_dict({**good, "tensors": {"w": [1.0]}})
    with pytest.raises(ValueError, match="saved recipe"):
        Fp8Scales(ScalingRecipe(amax_history_len=3)).load_state_dict(good)
    with pytest.raises(TypeError, match="float64"):
        scales.quantize("w", np.array([1.0]))


@pytest.mark.parametrize(
    ("bits", "scale", "error", "words"),
    [
        (np.zeros(3, np.uint8), 0.0, ValueError, "scale 0.0 is not a positive finite number"),
        (np.zeros(3, np.uint8), float("nan"), ValueError, "scale nan is not a positive finite number"),
        (np.zeros(3, np.uint8), -2.0, ValueError, "scale -2.0 is not a positive finite number"),
        (np.zeros(3, np.uint8), float("inf"), ValueError, "scale inf is not a positive finite number"),
        (np.zeros(3, np.uint8), True, ValueError, "scale True is not a positive finite number"),
        (np.zeros(3, np.float32), 1.0, TypeError, "bits is a float32 array; it holds the E4M3 bit patterns"),
        ([0, 1], 1.0, TypeError, "bits is list; it holds the E4M3 bit patterns, one uint8 a value"),
    ],
)
def test_an_fp8_tensor_whose_scale_cannot_be_divided_out_is_refused_in_one_sentence(
    bits: object, scale: object, error: type, words: str
) -> None:
    """Dequantizing divides by the scale: with 0 or NaN it gave inf and NaN values and a RuntimeWarning."""
    with pytest.raises(error, match=re.escape(words)):
        Fp8Tensor(bits, E4M3, scale)
    kept = Fp8Tensor(encode(np.array([1.0, -2.0], np.float32) * np.float32(64.0), E4M3), E4M3, np.float32(64.0))
    assert kept.dequantize().tolist() == [1.0, -2.0]  # a positive finite scale, float32 included, is taken
