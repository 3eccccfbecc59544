"""The loss-scaler presets against each library's published rule, trajectory for trajectory.

No tolerances anywhere: the scale trajectories are compared with ``==`` (float32 rounding
included).  The references are transcriptions of each library's published rule (PyTorch's
``_amp_update_scale_cpu_kernel``, apex's ``LossScaler.update_scale``, jmp's
``DynamicLossScale.adjust``, Keras 3's ``LossScaleOptimizer``, Chainer's
``Optimizer.update_loss_scale``), and PyTorch's own kernel when torch is installed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scaler_helpers import f32
from strategies import gradscaler_settings, overflow_flags, scaler_configs

from tinyamp.amp.presets import PRESETS, presets_table
from tinyamp.amp.scaler import LossScaler

pytestmark = pytest.mark.scaler


def trajectory(scaler: LossScaler, flags: list[bool]) -> list[tuple[float, int]]:
    return [(scaler.update(flag).scale_after, scaler.growth_tracker) for flag in flags]


# ---- PyTorch's GradScaler, exactly ---------------------------------------------------------------------
def gradscaler_reference(
    flags: list[bool], init: float, growth: float, backoff: float, interval: int
) -> list[tuple[float, int]]:
    """PyTorch's _amp_update_scale_cpu_kernel transcribed: a float32 scale, double factors, an int tracker."""
    scale, tracker, out = np.float32(init), 0, []
    with np.errstate(over="ignore"):
        for flag in flags:
            if flag:
                scale = np.float32(np.float64(scale) * backoff)  # float * double -> double, stored as float
                tracker = 0
            else:
                tracker += 1
                if tracker == interval:
                    grown = np.float32(np.float64(scale) * growth)
                    if np.isfinite(grown):  # "Do not grow the scale past fp32 bounds to inf."
                        scale = grown
                    tracker = 0
            out.append((float(scale), tracker))
    return out


def torch_update_scale(flags: list[bool], init: float, growth: float, backoff: float, interval: int) -> list:
    """The same trajectory from torch._amp_update_scale_ itself (CPU float32 tensors, in place)."""
    torch = pytest.importorskip("torch")
    scale = torch.full((), init, dtype=torch.float32)
    tracker = torch.zeros((), dtype=torch.int32)
    found_inf = torch.zeros((), dtype=torch.float32)
    out = []
    for flag in flags:
        found_inf.fill_(1.0 if flag else 0.0)
        torch._amp_update_scale_(scale, tracker, found_inf, growth, backoff, interval)
        out.append((scale.item(), int(tracker.item())))
    return out


def pytorch_scaler(init: float, growth: float, backoff: float, interval: int) -> LossScaler:
    return LossScaler.preset(
        "pytorch", init_scale=init, growth_factor=growth, backoff_factor=backoff, growth_interval=interval
    )


@given(settings=gradscaler_settings(), flags=overflow_flags())
def test_pytorch_preset_follows_gradscalers_rule_in_float32(settings: tuple, flags: list[bool]) -> None:
    assert trajectory(pytorch_scaler(*settings), flags) == gradscaler_reference(flags, *settings)


@given(settings=gradscaler_settings(), flags=overflow_flags())
def test_pytorch_preset_matches_torchs_own_update_kernel(settings: tuple, flags: list[bool]) -> None:
    assert trajectory(pytorch_scaler(*settings), flags) == torch_update_scale(flags, *settings)


def test_torch_reference_runs_on_this_cpu() -> None:
    # Checks the reference itself, so that the property above cannot pass vacuously.
    assert torch_update_scale([True, False, False], 65536.0, 2.0, 0.5, 2) == [(32768.0, 0), (32768.0, 1), (65536.0, 0)]


# ---- the presets against each library's published rule ------------------------------------------------
def apex_reference(
    flags: list[bool], init: float, max_scale: float, window: int, min_scale: float | None = None
) -> list[float]:
    """apex.amp.scaler.LossScaler (dynamic): __init__, update_scale; Python floats (apex/amp/scaler.py, e13873de)."""
    scale, unskipped, out = min(max_scale, init), 0, []  # scaler.py:47
    for overflow in flags:
        if overflow:
            if min_scale:  # scaler.py:204: None and 0 are no floor
                scale = max(min_scale, scale / 2.0)
            else:
                scale = scale / 2.0
            unskipped = 0
        else:
            unskipped += 1
        if unskipped == window:
            scale = min(max_scale, scale * 2.0)
            unskipped = 0
        out.append(scale)
    return out


def keras_reference(flags: list[bool], init: float, growth_steps: int) -> list[float]:
    """Keras 3 LossScaleOptimizer: float32 variables, counter == growth_steps - 1 -> double."""
    scale, counter, out = np.float32(init), 0, []
    with np.errstate(over="ignore"):
        for nonfinite in flags:
            if nonfinite:
                counter, scale = 0, scale / np.float32(2.0)
            elif counter == growth_steps - 1:
                counter, scale = 0, scale * np.float32(2.0)
            else:
                counter += 1
            out.append(float(scale))
    return out


def jmp_reference(flags: list[bool], init: float, period: int, min_scale: float) -> list[float]:
    """jmp.DynamicLossScale.adjust with factor 2, float32 arrays (jmp/_src/loss_scale.py:149-174 at 9c1cdbbf).

    A Python-float min_loss_scale meets the float32 scale in jnp.maximum as a weakly typed
    value: it is rounded to float32 first, as np.float32(min_scale) does here.
    """
    scale, counter, out = np.float32(init), 0, []
    factor, floor = np.float32(2), np.float32(min_scale)
    with np.errstate(over="ignore"):
        for nonfinite in flags:
            finite = not nonfinite
            if finite:
                if counter == period - 1:
                    grown = scale * factor
                    scale = grown if np.isfinite(grown) else scale
            else:
                scale = np.maximum(floor, scale / factor)
            counter = ((counter + 1) % period) * finite
            out.append(float(scale))
    return out


def chainer_reference(flags: list[bool], interval: int) -> list[float]:
    """chainer Optimizer.loss_scaling(interval) + update_loss_scale, Python floats, _loss_scale_max = 65504."""
    scale, multiplier, isnan_ever, out = 1.0, math.pow(2.0, 1.0 / interval), False, []
    for isnan in flags:
        isnan_ever = isnan_ever or isnan
        if isnan:
            m = 0.5
        elif isnan_ever:
            m = multiplier
        else:
            m = 2.0
        scale = max(1, min(65504, scale * m))
        out.append(scale)
    return out


def scales(scaler: LossScaler, flags: list[bool]) -> list[float]:
    return [scaler.update(flag).scale_after for flag in flags]


short_flags = overflow_flags(max_runs=10, max_run=24)


@given(flags=short_flags, window=st.integers(1, 4), init_exp=st.integers(14, 24))
def test_apex_preset_follows_apexs_rule(flags: list[bool], window: int, init_exp: int) -> None:
    s = LossScaler.preset("apex", growth_interval=window, init_scale=2.0**init_exp)
    assert scales(s, flags) == apex_reference(flags, 2.0**init_exp, 2.0**24, window)


@given(flags=short_flags, growth_steps=st.integers(1, 4))
def test_keras_preset_follows_keras_rule(flags: list[bool], growth_steps: int) -> None:
    ours = scales(LossScaler.preset("keras", growth_interval=growth_steps), flags)
    theirs = keras_reference(flags, 2.0**15, growth_steps)
    first_inf = next((i for i, v in enumerate(theirs) if math.isinf(v)), len(theirs))
    assert ours[:first_inf] == theirs[:first_inf]
    if first_inf < len(theirs):  # the one documented difference: Keras doubles a float32 scale to inf
        assert ours[first_inf] == 2.0**127


def test_keras_grows_to_inf_where_the_preset_stops() -> None:
    flags = [False] * 114
    assert keras_reference(flags, 2.0**15, 1)[112:] == [math.inf, math.inf]
    assert scales(LossScaler.preset("keras", growth_interval=1), flags)[112:] == [2.0**127, 2.0**127]


@given(flags=short_flags, period=st.integers(1, 4), init_exp=st.integers(0, 20))
def test_jmp_preset_follows_jmps_rule(flags: list[bool], period: int, init_exp: int) -> None:
    s = LossScaler.preset("jmp", growth_interval=period, init_scale=2.0**init_exp)
    assert scales(s, flags) == jmp_reference(flags, 2.0**init_exp, period, 1.0)


@given(flags=overflow_flags(max_runs=8, max_run=40), interval=st.sampled_from([1, 3, 1000]))
def test_chainer_preset_follows_chainers_rule(flags: list[bool], interval: int) -> None:
    s = LossScaler.preset("chainer", growth_interval=interval)
    assert scales(s, flags) == chainer_reference(flags, interval)


F, T = False, True
STEP = 2.0 ** (1 / 1000)  # Chainer's per-step multiplier after warmup, interval 1000

PRESET_TRAJECTORIES = [
    (
        "pytorch",
        dict(growth_interval=2),
        [F, F, T, F, F, T],
        [(2.0**16, "held"), (2.0**17, "grew"), (2.0**16, "backed_off"), (2.0**16, "held"), (2.0**17, "grew"),
         (2.0**16, "backed_off")],
    ),
    (
        "apex",
        dict(growth_interval=2, init_scale=2.0**23),
        [F, F, F, F, T],
        [(2.0**23, "held"), (2.0**24, "grew"), (2.0**24, "held"), (2.0**24, "hit_ceiling"), (2.0**23, "backed_off")],
    ),
    (
        "keras",
        dict(growth_interval=3),
        [F, F, F, T],
        [(2.0**15, "held"), (2.0**15, "held"), (2.0**16, "grew"), (2.0**15, "backed_off")],
    ),
    (
        "jmp",
        dict(init_scale=2.0),
        [T, T, F],
        [(1.0, "backed_off"), (1.0, "hit_floor"), (1.0, "held")],
    ),
    (
        "chainer",
        {},
        [F, F, F, T, F, F],
        [(2.0, "grew"), (4.0, "grew"), (8.0, "grew"), (4.0, "backed_off"), (4.0 * STEP, "grew"),
         (4.0 * STEP * STEP, "grew")],
    ),
    (
        "chainer",
        {},
        [T, F],
        [(1.0, "hit_floor"), (STEP, "grew")],
    ),
    (
        "chainer",
        {},
        [F] * 17 + [T, F],
        [(2.0**k, "grew") for k in range(1, 16)]
        + [(65504.0, "hit_ceiling"), (65504.0, "hit_ceiling"), (32752.0, "backed_off"), (32752.0 * STEP, "grew")],
    ),
]  # fmt: skip


@pytest.mark.parametrize("name, overrides, flags, expected", PRESET_TRAJECTORIES)
def test_preset_trajectories(name: str, overrides: dict, flags: list[bool], expected: list[tuple[float, str]]) -> None:
    s = LossScaler.preset(name, **overrides)
    assert [(e.scale_after, e.event) for e in (s.update(flag) for flag in flags)] == expected


def test_chainer_states_warmup_then_steady() -> None:
    s = LossScaler.preset("chainer")
    assert s.state == "warmup" and s.scale == 1.0
    assert [s.update(flag).state for flag in [F, F, T, F, T, T]] == [
        "warmup", "warmup", "backed_off", "steady", "backed_off", "at_floor",
    ]  # fmt: skip
    # after warmup the scale is not a power of two: scale/unscale are no longer exact
    s.update(False)
    assert math.frexp(s.scale)[0] != 0.5


def test_preset_settings_and_table() -> None:
    expected = {
        "pytorch": (2.0**16, 2000, None, None, "float32"),
        "apex": (2.0**16, 2000, None, 2.0**24, "float64"),
        "keras": (2.0**15, 2000, None, None, "float32"),
        "jmp": (2.0**15, 2000, 1.0, None, "float32"),
        "chainer": (1.0, 1000, 1.0, 65504.0, "float64"),
    }
    starts_below_floor = {"pytorch": False, "apex": True, "keras": False, "jmp": True, "chainer": False}
    assert set(PRESETS) == set(expected) | {"megatron", "deepspeed", "fairseq"}  # those: test_scaler_hysteresis.py
    for name, (init, interval, low, high, dtype) in expected.items():
        c = LossScaler.preset(name).config
        assert (c["init_scale"], c["growth_interval"], c["min_scale"], c["max_scale"], c["scale_dtype"]) == (
            init, interval, low, high, dtype,
        )  # fmt: skip
        assert (c["growth_factor"], c["backoff_factor"]) == (2.0, 0.5)
        assert c["start_below_floor"] is starts_below_floor[name]
        assert name in presets_table() and PRESETS[name].source
    row = {line.split()[0]: line.split() for line in presets_table().splitlines()[1:6]}
    assert presets_table().split()[10] == "start_below_floor"
    assert {name: row[name][10] for name in row} == {k: str(v) for k, v in starts_below_floor.items()}
    assert (
        LossScaler.preset("chainer").config["warmup"]
        and LossScaler.preset("chainer").config["growth_rule"] == "per_step"
    )
    with pytest.raises(ValueError, match="unknown loss-scaler preset 'torch'; the presets are pytorch, apex"):
        LossScaler.preset("torch")
    with pytest.raises(TypeError):
        PRESETS["pytorch"].settings["init_scale"] = 1.0  # type: ignore[index]


# ---- what jmp and Apex accept, the presets accept (issue 15) ------------------------------------------------
def test_jmp_preset_takes_a_floor_that_is_not_a_float32_and_uses_its_nearest_float32() -> None:
    s = LossScaler.preset("jmp", min_scale=0.37, init_scale=1.0, growth_interval=1)
    assert s.config["min_scale"] == f32(0.37) == 0.3700000047683716
    flags = [T, T, T, F, F, T, T, T]  # 1 -> 0.5 -> floor -> floor, grow twice, back down to the floor
    assert scales(s, flags) == jmp_reference(flags, 1.0, 1, 0.37)
    assert s.history[2].event == "hit_floor" and s.state == "at_floor"
    assert LossScaler.from_state_dict(s.state_dict()).state_dict() == s.state_dict()


def test_plain_loss_scaler_still_refuses_a_floor_that_is_not_a_float32_value() -> None:
    with pytest.raises(ValueError, match=r"min_scale=0.37 is not exactly representable in float32"):
        LossScaler(min_scale=0.37, init_scale=1.0, scale_dtype="float32")


@pytest.mark.parametrize("floor", [0.0, 0, 1e-50])  # 1e-50 rounds to 0 in float32, so jmp's floor is 0 too
def test_jmp_preset_floor_of_zero_is_no_floor(floor: float) -> None:
    s = LossScaler.preset("jmp", min_scale=floor, init_scale=2.0**-140, growth_interval=3)
    assert s.config["min_scale"] is None
    flags = [T] * 12  # down through float32's subnormals to 0, as jmp's float32 scale goes
    assert scales(s, flags) == jmp_reference(flags, 2.0**-140, 3, floor)
    assert s.scale == 0.0 and s.history[-1].event == "backed_off"


def test_jmp_and_apex_presets_refuse_a_negative_floor_they_would_ignore() -> None:
    for name in ("jmp", "apex"):
        with pytest.raises(ValueError, match=r"min_scale must be > 0 \(or None\); got -1.0"):
            LossScaler.preset(name, min_scale=-1.0)


def test_jmp_preset_starts_below_its_floor_and_the_first_overflow_lifts_it_to_the_floor() -> None:
    s = LossScaler.preset("jmp", init_scale=0.125, growth_interval=1)  # floor 1
    assert (s.scale, s.state) == (0.125, "steady")
    flags = [F, F, T, T, F]
    events = [s.update(flag) for flag in flags]
    assert [e.scale_after for e in events] == jmp_reference(flags, 0.125, 1, 1.0) == [0.25, 0.5, 1.0, 1.0, 2.0]
    assert [e.event for e in events] == ["grew", "grew", "hit_floor", "hit_floor", "grew"]
    assert events[2].scale_after > events[2].scale_before  # jmp's overflow *raises* a scale below the floor


def test_plain_loss_scaler_starts_below_the_floor_only_when_asked() -> None:
    with pytest.raises(ValueError, match="or pass start_below_floor=True to start below the floor"):
        LossScaler(init_scale=0.5, min_scale=1.0)
    s = LossScaler(init_scale=0.5, min_scale=1.0, start_below_floor=True, growth_interval=2)
    assert scales(s, [F, T, T]) == [0.5, 1.0, 1.0]


def test_apex_preset_starts_at_the_ceiling_when_init_scale_is_above_it() -> None:
    for init in (2.0**30, math.inf):  # apex: min(max_loss_scale, init_scale), inf included
        s = LossScaler.preset("apex", init_scale=init, growth_interval=2)
        assert (s.scale, s.config["init_scale"], s.state) == (2.0**24, 2.0**24, "at_ceiling")
        flags = [F, F, T, F, F]
        expected = [2.0**24, 2.0**24, 2.0**23, 2.0**23, 2.0**24]
        assert scales(s, flags) == apex_reference(flags, init, 2.0**24, 2) == expected
    with pytest.raises(ValueError, match="min_scale <= init_scale <= max_scale"):
        LossScaler(init_scale=2.0**30, max_scale=2.0**24)  # the plain constructor still refuses it


@pytest.mark.parametrize("floor", [0.0, 0, None])
def test_apex_preset_floor_of_zero_is_no_floor(floor: float | None) -> None:
    s = LossScaler.preset("apex", min_scale=floor, init_scale=4.0)
    assert s.config["min_scale"] is None
    assert scales(s, [T, T, T, T]) == apex_reference([T] * 4, 4.0, 2.0**24, 2000, floor) == [2.0, 1.0, 0.5, 0.25]


def test_apex_preset_starts_below_its_floor_like_apex() -> None:
    flags = [F, T, F, T, T]
    s = LossScaler.preset("apex", init_scale=2.0, min_scale=100.0, growth_interval=1)
    assert scales(s, flags) == apex_reference(flags, 2.0, 2.0**24, 1, 100.0) == [4.0, 100.0, 200.0, 100.0, 100.0]


# jmp's settings: any float32 start (below the floor too), any floor a float32 can hold or round to 0.
jmp_inits = st.floats(2.0**-30, 2.0**40, width=32)
jmp_floors = st.sampled_from([0.0, 1.0, 0.37, 1e-50]) | st.floats(0.0, 2.0**40)


@given(flags=short_flags, period=st.integers(1, 4), init=jmp_inits, floor=jmp_floors)
def test_jmp_preset_is_jmps_rule_for_every_setting_jmp_takes(
    flags: list[bool], period: int, init: float, floor: float
) -> None:
    s = LossScaler.preset("jmp", growth_interval=period, init_scale=init, min_scale=floor)
    assert scales(s, flags) == jmp_reference(flags, init, period, floor)
    assert LossScaler.from_state_dict(s.state_dict()).state_dict() == s.state_dict()  # a checkpoint loads anywhere


@given(
    flags=short_flags,
    window=st.integers(1, 4),
    init=st.floats(1.0, 2.0**40) | st.just(math.inf),
    floor=st.none() | st.just(0.0) | st.floats(1.0, 2.0**24),  # a floor above the ceiling: refused
)
def test_apex_preset_is_apexs_rule_for_every_setting_apex_takes(
    flags: list[bool], window: int, init: float, floor: float | None
) -> None:
    s = LossScaler.preset("apex", growth_interval=window, init_scale=init, min_scale=floor)
    assert scales(s, flags) == apex_reference(flags, init, 2.0**24, window, floor)
    assert LossScaler.from_state_dict(s.state_dict()).state_dict() == s.state_dict()


@st.composite
def below_floor_configs(draw: Any) -> dict[str, Any]:
    """A dynamic LossScaler config (tests/strategies.py) moved to start 2^1..2^12 below its floor (at most 2^127)."""
    c = draw(scaler_configs())
    c["min_scale"] = min(c["init_scale"] * 2.0 ** draw(st.integers(1, 12)), 2.0**127)  # init_scale <= 2^120
    if c["max_scale"] is not None and c["max_scale"] < c["min_scale"]:
        c["max_scale"] = None
    return {**c, "start_below_floor": True}


@given(config=below_floor_configs(), flags=overflow_flags(max_runs=6, max_run=30))
def test_a_scaler_started_below_its_floor_is_floorless_until_the_first_overflow(
    config: dict[str, Any], flags: list[bool]
) -> None:
    """start_below_floor's law: the trajectory without a floor up to the first overflow, >= the floor from then on."""
    s, floorless = LossScaler(**config), LossScaler(**{**config, "min_scale": None, "start_below_floor": False})
    first = flags.index(True) if True in flags else len(flags)
    assert scales(s, flags[:first]) == scales(floorless, flags[:first])
    for flag in flags[first:]:
        assert s.update(flag).scale_after >= config["min_scale"]
        assert LossScaler.from_state_dict(s.state_dict()).state_dict() == s.state_dict()
