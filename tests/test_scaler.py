"""LossScaler: the update rule as a state machine, the published presets, exact unscaling, order errors.

No tolerances anywhere: the scale trajectories are compared with ``==`` (float32 rounding
included), and gradients and weights byte for byte.  The references are transcriptions of
each library's published rule (PyTorch's ``_amp_update_scale_cpu_kernel``, apex's
``LossScaler.update_scale``, jmp's ``DynamicLossScale.adjust``, Keras 3's
``LossScaleOptimizer``, Chainer's ``Optimizer.update_loss_scale``), and PyTorch's own
kernel when torch is installed.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import event as note_event
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from strategies import gradient_values, gradscaler_settings, overflow_flags, scaler_configs

import tinyamp as ta
from tinyamp import nn, optim
from tinyamp.amp import MasterWeights
from tinyamp.amp.loss_scale import EVENTS, STATES, ScaleEvent
from tinyamp.amp.presets import PRESETS, presets_table
from tinyamp.amp.scaler import LossScaler, ScalerOrderError, StepReport
from tinyamp.amp.scaler_checks import ScalerStateError
from tinyamp.backend import to_device

pytestmark = pytest.mark.scaler


def f32(x: float) -> float:
    """`x` rounded to float32, as a Python float (inf when out of range)."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def assert_bit_equal(a: Any, b: Any) -> None:
    a, b = to_device(a, "cpu"), to_device(b, "cpu")
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


def trajectory(scaler: LossScaler, flags: list[bool]) -> list[tuple[float, int]]:
    return [(scaler.update(flag).scale_after, scaler.growth_tracker) for flag in flags]


# ---- configuration -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(init_scale=0.0), ValueError, "init_scale must be > 0"),
        (dict(init_scale=-1.0), ValueError, "init_scale must be > 0"),
        (dict(init_scale=math.inf), ValueError, "init_scale must be finite"),
        (dict(init_scale=math.nan), ValueError, "init_scale must be finite"),
        (dict(init_scale="1"), TypeError, "init_scale must be a number"),
        (dict(init_scale=1e39, scale_dtype="float32"), ValueError, "rounds to inf in float32"),
        (dict(growth_factor=1.0), ValueError, "growth_factor must be > 1"),
        (dict(growth_factor=math.inf), ValueError, "growth_factor must be finite"),
        (dict(backoff_factor=1.0), ValueError, r"backoff_factor must lie in \(0, 1\)"),
        (dict(backoff_factor=0.0), ValueError, r"backoff_factor must lie in \(0, 1\)"),
        (dict(growth_interval=0), ValueError, "growth_interval must be an int >= 1"),
        (dict(growth_interval=2.5), ValueError, "growth_interval must be an int >= 1"),
        (dict(growth_interval=True), ValueError, "growth_interval must be an int >= 1"),
        (dict(min_scale=0.0), ValueError, "min_scale must be > 0"),
        (dict(min_scale=2.0**17), ValueError, "min_scale <= init_scale <= max_scale"),
        (dict(min_scale=2.0**17), ValueError, "or pass start_below_floor=True"),
        (dict(min_scale=2.0**17, max_scale=2.0**16, start_below_floor=True), ValueError, "min_scale <= init_scale"),
        (dict(start_below_floor=1), TypeError, "start_below_floor must be True or False"),
        (dict(max_scale=2.0**15), ValueError, "min_scale <= init_scale <= max_scale"),
        (dict(min_scale=0.1, scale_dtype="float32"), ValueError, "not exactly representable in float32"),
        (dict(mode="auto"), ValueError, "mode must be one of"),
        (dict(scale_dtype="float16"), ValueError, "scale_dtype must be one of"),
        (dict(growth_rule="smooth"), ValueError, "growth_rule must be one of"),
        (dict(warmup=1), TypeError, "warmup must be True or False"),
        (dict(mode="static", warmup=True), ValueError, "only apply to mode='dynamic'"),
        (dict(mode="off", init_scale=1024.0), ValueError, "mode='off' scales by 1"),
    ],
)
def test_invalid_settings_are_clear_errors(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        LossScaler(**kwargs)


def test_defaults_are_pytorchs_numbers_with_a_python_float_scale() -> None:
    s = LossScaler()
    assert s.config == dict(
        init_scale=65536.0,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=2000,
        min_scale=None,
        max_scale=None,
        mode="dynamic",
        scale_dtype="float64",
        warmup=False,
        growth_rule="interval",
        start_below_floor=False,
    )
    assert (s.scale, s.growth_tracker, s.step_count, s.state, s.phase) == (65536.0, 0, 0, "steady", "ready")
    assert s.history == [] and s.last_report is None
    assert repr(s) == (
        "LossScaler(mode='dynamic', scale=65536.0, state='steady', growth_tracker=0/2000, step=0, phase='ready')"
    )


def test_float32_scale_rounds_init_scale_like_torch_full() -> None:
    assert LossScaler(init_scale=0.1, scale_dtype="float32").scale == f32(0.1) != 0.1
    assert LossScaler(init_scale=0.1).scale == 0.1


# ---- the rule, one transition at a time ------------------------------------------------------------
def test_update_by_hand_records_every_transition() -> None:
    s = LossScaler(init_scale=8.0, growth_interval=2, min_scale=2.0, max_scale=16.0)
    events = [s.update(flag) for flag in [False, False, False, False, True, True, True, False]]
    assert [(e.scale_after, e.event, e.growth_tracker, e.state) for e in events] == [
        (8.0, "held", 1, "steady"),
        (16.0, "grew", 0, "at_ceiling"),
        (16.0, "held", 1, "at_ceiling"),
        (16.0, "hit_ceiling", 0, "at_ceiling"),
        (8.0, "backed_off", 0, "backed_off"),
        (4.0, "backed_off", 0, "backed_off"),
        (2.0, "backed_off", 0, "at_floor"),
        (2.0, "held", 1, "at_floor"),
    ]
    assert [e.step for e in events] == list(range(8))
    assert s.history == events and s.step_count == 8
    columns = s.history_columns()
    assert columns["scale_after"] == [e.scale_after for e in events]
    assert columns["found_inf"] == [False] * 4 + [True] * 3 + [False]
    assert set(columns) == {"step", "scale_before", "scale_after", "found_inf", "event", "growth_tracker", "state"}
    assert s.update(True).event == "hit_floor"  # 2 * 0.5 = 1 < min_scale: clamped


def test_update_takes_a_bool() -> None:
    s = LossScaler()
    with pytest.raises(TypeError, match="takes a bool"):
        s.update(1)  # type: ignore[arg-type]
    assert s.update(np.bool_(True)).found_inf is True


@pytest.mark.parametrize("mode", ["static", "off"])
def test_static_and_off_modes_never_change_the_scale_but_record_overflow(mode: str) -> None:
    s = LossScaler(mode=mode, init_scale=None if mode == "off" else 1024.0)
    scale = s.scale
    events = [s.update(flag) for flag in [False, True, False, False]]
    assert [e.scale_after for e in events] == [scale] * 4
    assert [e.found_inf for e in events] == [False, True, False, False]
    assert {e.event for e in events} == {"held"} and {e.state for e in events} == {mode}
    assert s.growth_tracker == 2  # consecutive clean steps
    assert scale == (1.0 if mode == "off" else 1024.0)


# ---- the state machine under random configs and random flags -----------------------------------------------
class ScalerMachine(RuleBasedStateMachine):
    """Drives a LossScaler with update(flag) and checks each transition against the rule in the docstring.

    Forks (scalers loaded from a JSON round trip of state_dict) are driven in lockstep: a
    checkpoint taken at any point must reproduce the same future.
    """

    @initialize(config=scaler_configs())
    def build(self, config: dict[str, Any]) -> None:
        self.config = config
        self.scaler = LossScaler(**config)
        self.forks: list[LossScaler] = []
        self.updates = 0
        self.clean_run = 0  # clean updates since the last overflow or interval growth
        self.overflow_seen = False

    def round(self, x: float) -> float:
        return f32(x) if self.config["scale_dtype"] == "float32" else x

    def expected(self, before: float, flag: bool) -> tuple[float, str]:
        c = self.config
        if flag:
            backed = self.round(before * c["backoff_factor"])
            if c["min_scale"] is not None and backed < c["min_scale"]:
                return c["min_scale"], "hit_floor"
            return backed, "backed_off"
        warm = c["warmup"] and not self.overflow_seen
        if not (warm or c["growth_rule"] == "per_step" or self.clean_run + 1 == c["growth_interval"]):
            return before, "held"
        multiplier = c["growth_factor"]
        if c["growth_rule"] == "per_step" and not warm:
            multiplier = c["growth_factor"] ** (1 / c["growth_interval"])
        grown = self.round(before * multiplier)
        if not math.isfinite(grown):
            return before, "hit_ceiling"
        if c["max_scale"] is not None and grown > c["max_scale"]:
            return c["max_scale"], "hit_ceiling"
        return grown, "grew"

    def apply(self, flag: bool) -> None:
        c = self.config
        before = self.scaler.scale
        scale, event = self.expected(before, flag)
        warm = c["warmup"] and not self.overflow_seen
        record = self.scaler.update(flag)
        self.updates += 1
        assert record == ScaleEvent(self.updates - 1, before, scale, flag, event, record.growth_tracker, record.state)
        assert self.scaler.scale == scale
        if flag:
            self.clean_run, self.overflow_seen = 0, True
        elif c["growth_rule"] == "interval" and not warm and self.clean_run + 1 == c["growth_interval"]:
            self.clean_run = 0  # grows (or is refused) after exactly growth_interval clean steps
        else:
            self.clean_run += 1
        assert self.scaler.growth_tracker == self.clean_run
        note_event(f"{c['scale_dtype']} {record.event}")  # shown by pytest --hypothesis-show-statistics
        if record.scale_after == 0.0:
            note_event(f"{c['scale_dtype']} scale underflowed to 0")
        for fork in self.forks:
            assert fork.update(flag) == record
            assert repr(fork) == repr(self.scaler)

    @rule(flag=st.booleans())
    def update(self, flag: bool) -> None:
        self.apply(flag)

    @rule(flag=st.booleans(), n=st.integers(2, 150))
    def run(self, flag: bool, n: int) -> None:
        for _ in range(n):
            self.apply(flag)

    @precondition(lambda self: len(self.forks) < 2)
    @rule()
    def checkpoint(self) -> None:
        saved = json.loads(json.dumps(self.scaler.state_dict()))  # plain values only, exact floats
        fork = LossScaler.from_state_dict(saved)
        assert fork.state_dict() == self.scaler.state_dict()
        self.forks.append(fork)
        note_event("checkpoint")

    @invariant()
    def scale_within_bounds(self) -> None:
        c, s = self.config, self.scaler.scale
        assert math.isfinite(s) and s >= 0
        assert s == self.round(s)
        if c["min_scale"] is not None:
            assert s >= c["min_scale"] > 0
        if c["max_scale"] is not None:
            assert s <= c["max_scale"]

    @invariant()
    def history_has_one_record_per_update(self) -> None:
        assert len(self.scaler.history) == self.scaler.step_count == self.updates

    @invariant()
    def state_is_named(self) -> None:
        state = self.scaler.state
        assert state in STATES
        if self.config["warmup"] and not self.overflow_seen:
            assert state == "warmup"
        elif self.config["min_scale"] is not None and self.scaler.scale == self.config["min_scale"]:
            assert state == "at_floor"


TestScalerMachine = ScalerMachine.TestCase


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


def test_without_a_floor_a_float32_scale_underflows_to_zero_like_pytorchs() -> None:
    s = LossScaler.preset("pytorch")
    scales = [s.update(True).scale_after for _ in range(200)]
    # 2^16 halves exactly down through the float32 subnormals to 2^-149, then to 0.
    assert scales[:166] == [2.0 ** (15 - k) for k in range(165)] + [0.0]
    assert scales[165:] == [0.0] * 35
    assert s.state == "backed_off" and s.update(False).scale_after == 0.0  # 0 * 2 stays 0
    with pytest.raises(FloatingPointError, match="underflowed to 0 at step 165, after repeated overflows"):
        s.scale_loss(ta.tensor(1.0))
    assert s.phase == "ready"


def test_a_float32_scale_stops_growing_below_inf() -> None:
    s = LossScaler.preset("pytorch", growth_interval=1)
    events = [s.update(False) for _ in range(150)]
    assert [e.scale_after for e in events[:111]] == [2.0 ** (17 + k) for k in range(111)]
    assert s.scale == 2.0**127 and {e.event for e in events[111:]} == {"hit_ceiling"}
    assert s.state == "at_ceiling" and math.isfinite(s.scale)


def test_a_python_float_scale_stops_growing_below_inf() -> None:
    s = LossScaler(init_scale=2.0**1000, growth_interval=1)
    for _ in range(40):
        s.update(False)
    assert s.scale == 2.0**1023 and s.state == "at_ceiling" and s.history[-1].event == "hit_ceiling"


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
    assert set(PRESETS) == set(expected)
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


def test_a_below_floor_scale_after_an_overflow_is_a_corrupt_state_dict() -> None:
    s = LossScaler.preset("jmp", init_scale=0.25, growth_interval=1)
    s.update(False)
    d = s.state_dict()
    assert LossScaler.from_state_dict(d).scale == 0.5 < 1.0  # below the floor before any overflow: valid
    s.update(True)
    d = s.state_dict()
    bad = corrupt(corrupt(d, ("scale",), 0.5), ("history", "scale_after", 1), 0.5)
    with pytest.raises(ScalerStateError, match="scale=0.5 is below min_scale=1.0"):
        LossScaler.from_state_dict(bad)


def test_a_state_dict_saved_before_start_below_floor_existed_still_loads() -> None:
    s = driven("pytorch", [F, T, F], growth_interval=2)
    old = corrupt(s.state_dict(), ("config", "start_below_floor"), KeyError)
    assert LossScaler.from_state_dict(old).state_dict() == s.state_dict()
    fresh = LossScaler.preset("pytorch", growth_interval=2)
    fresh.load_state_dict(old)
    assert repr(fresh) == repr(s)


# ---- scaling and unscaling are exact for powers of two ---------------------------------------------------
class FakeOptimizer:
    """The optimizer protocol in its smallest form: params, names, step (counts calls)."""

    def __init__(self, params: list[ta.Tensor], names: list[str] | None = None) -> None:
        self.params = params
        self.names = names or [f"p{i}" for i in range(len(params))]
        self.steps = 0

    def step(self) -> None:
        self.steps += 1


def begin_step(scaler: LossScaler) -> None:
    """Put the scaler in phase "scaled" without a model (the loss itself is not needed)."""
    scaler.scale_loss(ta.tensor(1.0))


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@given(data=st.data(), k=st.integers(-30, 30))
def test_unscaling_undoes_power_of_two_scaling_exactly_iff_scaling_was_exact(dtype: Any, data: Any, k: int) -> None:
    """For S = 2^k: unscale(round(x * S)) == x bit for bit exactly when x * S was representable.

    S >= 1: always, unless x * S overflows (scaling only shifts the exponent up; a subnormal x
    gains precision).  S < 1: fails when x * S lands in the subnormals with bits to spare, the
    very underflow that loss scaling exists to prevent; the result is then the rounded value
    unscaled, and differs from x.  Non-finite results are reported.
    """
    x = data.draw(gradient_values(dtype))
    s = 2.0**k
    with np.errstate(over="ignore"):
        y = (x.astype(np.float64) * s).astype(dtype)  # correctly rounded: x * s is exact in float64
    exact = np.isfinite(y) & (y.astype(np.float64) == x.astype(np.float64) * s)
    if k >= 0:
        assert np.array_equal(exact, np.isfinite(y))
    p = ta.tensor(np.zeros_like(x), requires_grad=True)
    p.grad = y.copy()
    scaler = LossScaler(init_scale=s)
    begin_step(scaler)
    flags = scaler.unscale_(FakeOptimizer([p], ["g"]))
    u = p.grad
    assert u.dtype == x.dtype
    assert flags == {"g": not np.isfinite(u).all()}
    if not np.isfinite(y).all():
        assert flags["g"]  # an inf in the scaled gradient is never hidden
    assert u[exact].tobytes() == x[exact].tobytes()  # bit for bit, signed zeros included
    changed = ~exact & np.isfinite(u)
    assert (u[changed] != x[changed]).all()


def test_subnormal_counterexample_in_float16() -> None:
    x = np.array([3 * 2.0**-24], np.float16)  # a float16 subnormal: 3 units of 2^-24
    p = ta.tensor(np.zeros(1, np.float16), requires_grad=True)
    p.grad = (x * np.float16(0.5)).astype(np.float16)  # 1.5 units rounds (to even) to 2 units
    assert p.grad[0] == 2.0**-23
    scaler = LossScaler(init_scale=0.5)
    begin_step(scaler)
    assert scaler.unscale_(FakeOptimizer([p])) == {"p0": False}
    assert p.grad[0] == 2.0**-22 != x[0]  # finite, not flagged, and not x: the bits were lost when scaling


def test_scale_loss_scales_a_float16_loss_in_float32() -> None:
    scaler = LossScaler()
    loss = ta.tensor(4.0, dtype="float16")  # 4 * 2^16 = 2^18 would be inf in float16
    scaled = scaler.scale_loss(loss)
    assert scaled.dtype == np.float32 and scaled.item() == 2.0**18
    tiny = ta.tensor(2.0**-20, dtype="float16")  # a subnormal float16 loss survives, exactly
    assert LossScaler().scale_loss(tiny).item() == 2.0**-4


def test_scale_loss_gradient_flows_back_scaled() -> None:
    w = ta.tensor([1.5, -2.0], requires_grad=True)
    scaler = LossScaler(init_scale=1024.0)
    scaler.scale_loss((w * w).sum()).backward()
    assert_bit_equal(w.grad, np.array([3.0 * 1024, -4.0 * 1024], np.float32))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # the overflow under test
def test_scale_above_float32_range_overflows_honestly_and_is_reported() -> None:
    scaler = LossScaler(init_scale=2.0**200)  # a Python float scale, beyond float32
    w = ta.tensor([1.0], requires_grad=True)
    scaled = scaler.scale_loss((w * 2.0).sum())
    assert scaled.dtype == np.float64 and scaled.item() == 2.0**201
    scaled.backward()
    report = scaler.step(FakeOptimizer([w], ["w"]))
    assert report.skipped and report.nonfinite_params == ["w"] and scaler.scale == 2.0**199


def test_off_mode_returns_the_loss_and_still_skips_overflow() -> None:
    scaler = LossScaler(mode="off")
    w = ta.tensor([1.0, 2.0], requires_grad=True)
    loss = (w * w).sum()
    assert scaler.scale_loss(loss) is loss
    loss.backward()
    w.grad[1] = np.nan
    opt = FakeOptimizer([w], ["w"])
    report = scaler.step(opt)
    assert report.skipped and report.nonfinite_params == ["w"] and opt.steps == 0
    assert math.isnan(report.grad_norm) and scaler.scale == 1.0 and scaler.state == "off"
    (w * w).sum().backward()  # mode off: stepping without scale_loss is allowed
    w.grad = np.array([1.0, 1.0], np.float32)
    assert not scaler.step(opt).skipped and opt.steps == 1


# ---- order errors: each is a sentence, and changes nothing ------------------------------------------------
def snapshot(scaler: LossScaler) -> tuple:
    return (
        scaler.scale, scaler.growth_tracker, scaler.step_count, scaler.state, scaler.phase,
        scaler.history, scaler.last_report, repr(scaler),
    )  # fmt: skip


def one_param(value: float = 1.0) -> tuple[ta.Tensor, FakeOptimizer]:
    w = ta.tensor([value, 2.0 * value], requires_grad=True)
    return w, FakeOptimizer([w], ["w"])


def test_unscale_twice_is_an_error_and_does_not_divide_twice() -> None:
    scaler = LossScaler(init_scale=8.0)
    w, opt = one_param()
    scaler.scale_loss((w * w).sum()).backward()
    scaler.unscale_(opt)
    grad, before = w.grad.copy(), snapshot(scaler)
    with pytest.raises(ScalerOrderError, match="gradients were already unscaled at step 0; call unscale_ once"):
        scaler.unscale_(opt)
    assert snapshot(scaler) == before
    assert_bit_equal(w.grad, grad)
    assert_bit_equal(w.grad, np.array([2.0, 4.0], np.float32))


def test_step_before_backward_is_an_error() -> None:
    scaler = LossScaler()
    w, opt = one_param()
    scaler.scale_loss((w * w).sum())  # ... and no backward
    before = snapshot(scaler)
    with pytest.raises(ScalerOrderError, match="no parameter of the optimizer has a gradient at step 0"):
        scaler.step(opt)
    with pytest.raises(ScalerOrderError, match="call .backward"):
        scaler.unscale_(opt)
    assert snapshot(scaler) == before and opt.steps == 0


def test_clip_before_unscale_is_an_error() -> None:
    scaler = LossScaler(init_scale=8.0)
    w, opt = one_param()
    scaler.scale_loss((w * w).sum()).backward()
    grad, before = w.grad.copy(), snapshot(scaler)
    with pytest.raises(ScalerOrderError, match="reading scaled gradients as if unscaled"):
        scaler.clip_grad_norm_(opt, 1.0)
    assert snapshot(scaler) == before
    assert_bit_equal(w.grad, grad)


def test_scale_loss_twice_is_an_error_unless_accumulating() -> None:
    scaler = LossScaler(init_scale=4.0)
    w, opt = one_param()
    scaler.scale_loss((w * w).sum()).backward()
    before = snapshot(scaler)
    with pytest.raises(ScalerOrderError, match="scale_loss was already called at step 0"):
        scaler.scale_loss((w * w).sum())
    assert snapshot(scaler) == before
    scaler.scale_loss((w * w).sum(), accumulate=True).backward()  # a second micro-batch
    scaler.step(opt)
    assert_bit_equal(w.grad, np.array([4.0, 8.0], np.float32))  # 2 micro-batches of 2w, unscaled


def test_scale_loss_after_unscale_is_an_error() -> None:
    scaler = LossScaler()
    w, opt = one_param()
    scaler.scale_loss((w * w).sum()).backward()
    scaler.unscale_(opt)
    before = snapshot(scaler)
    with pytest.raises(ScalerOrderError, match="were already unscaled: finish the step"):
        scaler.scale_loss((w * w).sum(), accumulate=True)
    assert snapshot(scaler) == before


def test_step_without_scale_loss_is_an_error() -> None:
    scaler = LossScaler()
    w, opt = one_param()
    (w * w).sum().backward()
    grad, before = w.grad.copy(), snapshot(scaler)
    for call in (scaler.step, scaler.unscale_):
        with pytest.raises(ScalerOrderError, match="scale_loss was not called at step 0"):
            call(opt)
    assert snapshot(scaler) == before and opt.steps == 0
    assert_bit_equal(w.grad, grad)


def test_update_mid_step_or_after_step_is_an_error() -> None:
    scaler = LossScaler()
    w, opt = one_param()
    scaler.scale_loss((w * w).sum()).backward()
    before = snapshot(scaler)
    with pytest.raises(ScalerOrderError, match="would unscale the gradients by a different scale"):
        scaler.update(False)
    assert snapshot(scaler) == before
    scaler.step(opt)
    before = snapshot(scaler)
    with pytest.raises(ScalerOrderError, match="already updated the scale for step 0; calling update"):
        scaler.update(False)
    assert snapshot(scaler) == before


def test_clip_or_step_with_another_optimizer_is_an_error() -> None:
    scaler = LossScaler()
    w, opt = one_param()
    scaler.scale_loss((w * w).sum()).backward()
    scaler.unscale_(opt)
    other = FakeOptimizer([w], ["w"])
    with pytest.raises(ScalerOrderError, match="different optimizer"):
        scaler.clip_grad_norm_(other, 1.0)
    with pytest.raises(ScalerOrderError, match="different optimizer"):
        scaler.step(other)
    assert other.steps == 0 and scaler.phase == "unscaled"


def test_a_non_optimizer_is_a_type_error() -> None:
    scaler = LossScaler()
    begin_step(scaler)
    with pytest.raises(TypeError, match=r"needs an optimizer with .params, .names and .step\(\)"):
        scaler.unscale_([ta.tensor(1.0)])


# ---- a real model: skipped steps change nothing ---------------------------------------------------------
def linear_problem(device: str, dtype: str = "float32") -> tuple[nn.Linear, ta.Tensor]:
    ta.manual_seed(0)
    model = nn.Linear(4, 3, dtype=dtype).to(device)
    x = ta.randn((5, 4), dtype=dtype, device=device)
    return model, x


def loss_of(model: nn.Linear, x: ta.Tensor) -> ta.Tensor:
    return (model(x).tanh() * model(x)).sum()


OPTIMIZERS = {
    "adam": lambda params: optim.Adam(params, lr=1e-2),
    "sgd_momentum": lambda params: optim.SGD(params, lr=1e-2, momentum=0.9),
}


def optimizer_arrays(opt: optim.Optimizer) -> list[np.ndarray]:
    out = [to_device(p.data, "cpu").copy() for p in opt.params]
    for state in opt.state:
        out += [to_device(v, "cpu").copy() if hasattr(v, "shape") else np.array(v) for _, v in sorted(state.items())]
    return out


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_a_skipped_step_leaves_weights_and_moments_untouched(device: str, kind: str) -> None:
    model, x = linear_problem(device)
    opt = OPTIMIZERS[kind](model.named_parameters())
    scaler = LossScaler(init_scale=2.0**10)
    for _ in range(2):  # clean steps first, so that the moments are not zero
        opt.zero_grad()
        scaler.scale_loss(loss_of(model, x)).backward()
        assert not scaler.step(opt).skipped
    before, steps = optimizer_arrays(opt), opt.step_count
    opt.zero_grad()
    scaler.scale_loss(loss_of(model, x)).backward()
    model.bias.grad[1] = np.inf
    report = scaler.step(opt)
    assert isinstance(report, StepReport) and scaler.last_report is report
    assert report.skipped and report.nonfinite_params == ["bias"]
    assert (report.step, report.scale_before, report.scale_after, report.event) == (2, 1024.0, 512.0, "backed_off")
    assert report.grad_norm == math.inf and report.state == "backed_off"
    assert "SKIPPED (non-finite gradients in bias)" in str(report)
    after = optimizer_arrays(opt)
    assert len(after) == len(before) and opt.step_count == steps
    for a, b in zip(after, before):
        assert_bit_equal(a, b)
    assert scaler.history[-1] == ScaleEvent(2, 1024.0, 512.0, True, "backed_off", 0, "backed_off")


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_a_clean_scaled_step_equals_the_unscaled_step_bit_for_bit(device: str, kind: str) -> None:
    # Powers of two commute with rounding: every gradient of the scaled loss is exactly S times
    # the unscaled one, and unscaling gives it back, so training is unchanged to the last bit.
    weights = []
    for scaler in (None, LossScaler(init_scale=2.0**12)):
        model, x = linear_problem(device)
        opt = OPTIMIZERS[kind](model.named_parameters())
        for _ in range(3):
            opt.zero_grad()
            loss = loss_of(model, x)
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale_loss(loss).backward()
                assert not scaler.step(opt).skipped
        weights.append(optimizer_arrays(opt))
    for a, b in zip(*weights):
        assert_bit_equal(a, b)


def test_float16_gradients_are_unscaled_in_float32_and_rounded_once(device: str) -> None:
    model, x = linear_problem(device, "float16")
    opt = optim.SGD(model.named_parameters(), lr=0.0)
    scaler = LossScaler(init_scale=2.0**-3)  # a scale below 1: unscaling multiplies by 8
    scaler.scale_loss(loss_of(model, x)).backward()
    scaled = [to_device(p.grad, "cpu").copy() for p in opt.params]
    scaler.unscale_(opt)
    for p, g in zip(opt.params, scaled):
        assert p.grad.dtype == np.float16
        assert_bit_equal(p.grad, (g.astype(np.float32) * np.float32(8.0)).astype(np.float16))


def test_unscale_reports_every_parameter_by_name(device: str) -> None:
    model, x = linear_problem(device)
    opt = optim.SGD(model.named_parameters(), lr=0.1)
    scaler = LossScaler()
    scaler.scale_loss(loss_of(model, x)).backward()
    model.weight.grad[0, 0] = np.nan
    assert scaler.unscale_(opt) == {"weight": True, "bias": False}
    report = scaler.step(opt)
    assert report.nonfinite_params == ["weight"] and math.isnan(report.grad_norm)


def test_huge_finite_float64_gradients_are_not_reported_as_overflow() -> None:
    """The finiteness check reads the sum of squares; (1e200)^2 overflows float64, yet 1e200 is finite."""
    big, bad = ta.tensor([1.0], dtype="float64", requires_grad=True), ta.tensor([1.0], requires_grad=True)
    opt = FakeOptimizer([big, bad], ["big", "bad"])
    scaler = LossScaler(init_scale=1.0)
    scaler.scale_loss((big * 1e200).sum() + (bad * 1.0).sum()).backward()
    bad.grad[0] = -np.inf
    assert scaler.unscale_(opt) == {"big": False, "bad": True}
    report = scaler.step(opt)
    assert report.nonfinite_params == ["bad"] and report.skipped and opt.steps == 0


def test_parameters_without_gradient_are_skipped_not_reported() -> None:
    used, unused = ta.tensor([1.0], requires_grad=True), ta.tensor([1.0], requires_grad=True)
    opt = FakeOptimizer([used, unused], ["used", "unused"])
    scaler = LossScaler()
    scaler.scale_loss((used * 3.0).sum()).backward()
    assert scaler.unscale_(opt) == {"used": False}
    assert scaler.step(opt).grad_norm == 3.0 and opt.steps == 1


# ---- clipping -------------------------------------------------------------------------------------------
def test_clip_grad_norm_clips_the_unscaled_gradients(device: str) -> None:
    model, x = linear_problem(device)
    opt = optim.SGD(model.named_parameters(), lr=0.1)
    scaler = LossScaler(init_scale=2.0**8)
    scaler.scale_loss(loss_of(model, x)).backward()
    scaler.unscale_(opt)
    grads = [to_device(p.grad, "cpu").astype(np.float64).ravel() for p in opt.params]
    # float64 accumulation: a dot product per parameter, an exactly rounded sum across them
    norm = math.sqrt(math.fsum(float(np.dot(g, g)) for g in grads))
    assert norm > 1.0
    clipped = scaler.clip_grad_norm_(opt, 1.0)
    if device == "cpu":
        assert clipped == norm
    else:  # the GPU reduction kernel sums each gradient in another order: float64 rounding, ~1e-16 relative
        assert abs(clipped - norm) <= 1e-12 * norm
        norm = clipped
    coefficient = np.float32(1.0 / (norm + 1e-6))
    for p, g in zip(opt.params, grads):
        assert_bit_equal(p.grad, g.astype(np.float32).reshape(p.shape) * coefficient)
    report = scaler.step(opt)
    assert report.grad_norm == norm and not report.skipped


def test_clip_grad_norm_leaves_small_and_nonfinite_gradients_alone() -> None:
    w, opt = one_param()
    scaler = LossScaler(init_scale=2.0)
    scaler.scale_loss((w * 1.0).sum()).backward()  # unscaled gradient [1, 1], norm sqrt(2)
    scaler.unscale_(opt)
    assert scaler.clip_grad_norm_(opt, 10.0) == math.sqrt(2.0)
    assert_bit_equal(w.grad, np.ones(2, np.float32))
    with pytest.raises(ValueError, match="max_norm must be a number > 0"):
        scaler.clip_grad_norm_(opt, 0.0)
    w.grad[0] = np.inf
    assert scaler.clip_grad_norm_(opt, 1.0) == math.inf
    assert w.grad[1] == 1.0
    assert scaler.step(opt).skipped and opt.steps == 0


@pytest.mark.parametrize("size", [1 << 16, (1 << 16) + 1, 3 * 1024 * 97 + 5])
def test_sum_of_squares_of_a_large_float32_gradient(size: int) -> None:
    """Large float32 gradients are summed in float32 rows of 1024, the rows in float64: close to
    the exact sum, and never inf for a finite gradient whose float32 squares overflow."""
    from tinyamp.kernels import sum_of_squares as _sum_of_squares

    rng = np.random.default_rng(size)
    g = (rng.standard_normal(size) * np.exp(rng.uniform(-8, 8, size))).astype(np.float32)
    exact = math.fsum((g.astype(np.float64) ** 2).tolist())
    assert abs(float(_sum_of_squares(g)) - exact) <= 1e-6 * exact
    g[size // 2] = 3e19  # finite, but its square (9e38) is not a float32
    exact = math.fsum((g.astype(np.float64) ** 2).tolist())
    assert math.isfinite(float(_sum_of_squares(g)))
    assert abs(float(_sum_of_squares(g)) - exact) <= 1e-12 * exact  # recomputed in float64
    g[size - 1] = -np.inf
    assert float(_sum_of_squares(g)) == math.inf
    g[0] = np.nan
    assert math.isnan(float(_sum_of_squares(g)))


# ---- the optimizer protocol: gather_grads (FP32 master weights) ---------------------------------------------
class GatheringOptimizer(FakeOptimizer):
    """Like MasterWeights: step() reads float32 masters whose gradients gather_grads() copies from float16."""

    def __init__(self, model_params: list[ta.Tensor]) -> None:
        self.model_params = model_params
        super().__init__([ta.tensor(p.data, dtype="float32") for p in model_params], ["a"])
        self.gathered = 0

    def gather_grads(self) -> None:
        self.gathered += 1
        for m, p in zip(self.params, self.model_params):
            m.grad = None if p.grad is None else p.grad.astype(np.float32)


def test_unscale_gathers_first_and_unscales_the_float32_copies() -> None:
    w16 = ta.tensor([2.0**-20, 1.0], dtype="float16", requires_grad=True)
    opt = GatheringOptimizer([w16])
    scaler = LossScaler(init_scale=2.0**10)
    scaler.scale_loss((w16 * w16).sum()).backward()  # d/dw = 2w, times 2^10: exact in float16
    assert scaler.unscale_(opt) == {"a": False} and opt.gathered == 1
    master = opt.params[0].grad
    assert master.dtype == np.float32 and master.tolist() == [2.0**-19, 2.0]
    assert not scaler.step(opt).skipped and opt.gathered == 1 and opt.steps == 1


def test_with_master_weights() -> None:
    master = pytest.importorskip("tinyamp.amp.master")
    model, x = linear_problem("cpu", "float16")
    opt = master.MasterWeights(optim.SGD(model.named_parameters(), lr=0.5))
    scaler = LossScaler(init_scale=2.0**8)
    scaler.scale_loss(loss_of(model, x)).backward()
    weights = [p.data.copy() for p in model.parameters()]
    model.weight.grad[0, 0] = np.inf
    report = scaler.step(opt)
    assert report.skipped and report.nonfinite_params == ["weight"]
    for p, w in zip(model.parameters(), weights):
        assert_bit_equal(p.data, w)
    opt.zero_grad()
    scaler.scale_loss(loss_of(model, x)).backward()
    assert not scaler.step(opt).skipped
    assert all(m.grad.dtype == np.float32 for m in opt.params)


# ---- checkpoints ----------------------------------------------------------------------------------------------
def driven(name: str, flags: list[bool], **overrides: Any) -> LossScaler:
    s = LossScaler.preset(name, **overrides)
    for flag in flags:
        s.update(flag)
    return s


@pytest.mark.parametrize("name", list(PRESETS))
def test_state_dict_round_trip_continues_identically(name: str) -> None:
    flags = [F, F, T, F, F, F, T, T, F, F, F, F]
    s = driven(name, flags, growth_interval=3)
    d = s.state_dict()
    copy_of = copy.deepcopy(d)
    restored = LossScaler.preset(name, growth_interval=3)
    restored.load_state_dict(json.loads(json.dumps(d)))
    assert restored.state_dict() == d == copy_of  # state_dict() hands out copies, not live lists
    assert repr(restored) == repr(s) and restored.history == s.history
    future = [F, F, F, T, F, F, F, F]
    assert [restored.update(f) for f in future] == [s.update(f) for f in future]


def test_state_dict_needs_a_step_boundary() -> None:
    s = LossScaler()
    begin_step(s)
    with pytest.raises(ScalerOrderError, match="in the middle of step 0"):
        s.state_dict()
    with pytest.raises(ScalerOrderError, match="in the middle of step 0"):
        s.load_state_dict(LossScaler().state_dict())


def corrupt(d: dict, path: tuple, value: Any) -> dict:
    d = copy.deepcopy(d)
    target = d
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return d


CORRUPTIONS = [
    (("format",), "tinyamp.optim.Adam", "its 'format' is 'tinyamp.optim.Adam'"),
    (("version",), 99, "it has version 99"),
    (("scale",), KeyError, r"missing keys \['scale'\]"),
    (("scale",), math.inf, "is not a finite float"),
    (("scale",), 2.0**24, "is above max_scale"),
    (("scale",), 0.25, "is below min_scale"),
    (("scale",), "1024", "is not a finite float"),
    (("growth_tracker",), -1, "growth_tracker=-1 is not an int >= 0"),
    (("growth_tracker",), 3, "growth_tracker=3 must be below growth_interval=3"),
    (("step_count",), 3, "each history column must be a list of step_count=3 entries"),
    (("state",), "at_ceiling", "disagrees with"),
    (("overflow_seen",), False, "overflow_seen=False disagrees with the history"),
    (("history", "event", 1), "exploded", "history row 1 has invalid event='exploded'"),
    (("history", "scale_before", 2), 3.0, "history row 2 starts from scale 3.0"),
    (("config", "growth_interval"), 2000, r"configured differently: growth_interval=2000 \(this scaler: 3\)"),
]


@pytest.mark.parametrize("path, value, match", CORRUPTIONS)
def test_corrupt_or_mismatched_state_dict_is_a_clear_error_and_changes_nothing(
    path: tuple, value: Any, match: str
) -> None:
    settings = dict(init_scale=2.0, min_scale=1.0, max_scale=2.0**20, growth_interval=3)
    good = driven("jmp", [F, T, F, F, F, F], **settings).state_dict()
    s = driven("jmp", [T, F], **settings)
    before = snapshot(s)
    with pytest.raises(ScalerStateError, match=match):
        s.load_state_dict(corrupt(good, path, value))
    assert snapshot(s) == before
    s.load_state_dict(good)  # the uncorrupted dict loads
    assert s.state_dict() == good


def test_from_state_dict_rebuilds_the_config() -> None:
    s = driven("chainer", [F, F, T, F])
    assert LossScaler.from_state_dict(s.state_dict()).state_dict() == s.state_dict()
    with pytest.raises(ScalerStateError, match="the saved config is not valid: growth_factor must be > 1"):
        LossScaler.from_state_dict(corrupt(s.state_dict(), ("config", "growth_factor"), 0.5))
    with pytest.raises(ScalerStateError, match="not a LossScaler state_dict"):
        LossScaler.from_state_dict({"scale": 1.0})


def test_history_events_and_states_are_from_the_documented_sets() -> None:
    s = driven("chainer", [F] * 17 + [T, T, F])
    h = s.history_columns()
    assert set(h["event"]) <= set(EVENTS) and set(h["state"]) <= set(STATES)
    assert {"grew", "hit_ceiling", "backed_off"} <= set(h["event"])


# ---- 0-d parameters: NumPy's 0-d arithmetic returns scalars, and every gradient must still be an array ------
ZERO_D_OPTIMIZERS = {
    "sgd": lambda p: optim.SGD(p, lr=0.1),
    "sgd-momentum-wd": lambda p: optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
    "adam": lambda p: optim.Adam(p, lr=0.01, weight_decay=0.01),
    "adamw": lambda p: optim.AdamW(p, lr=0.01),
}


def two_steps(shape: tuple[int, ...], dtype: str, make: Any, mode: str, masters: bool) -> tuple[Any, list[Any]]:
    """Two scaled steps of loss = 3 w^2 on a parameter of `shape` starting at 0.5; the weight and the grads."""
    w = ta.tensor(np.full(shape, 0.5), dtype=dtype, requires_grad=True)
    opt = MasterWeights(make([w])) if masters else make([w])
    scaler, grads = LossScaler(mode=mode, init_scale=1.0 if mode == "off" else 2.0**10), []
    for _ in range(2):
        opt.zero_grad()
        scaler.scale_loss((w * w) * 3.0).backward()
        grads.append(w.grad)
        assert not scaler.step(opt).skipped
    return w.data, grads


@pytest.mark.parametrize("mode", ["dynamic", "static", "off"])
@pytest.mark.parametrize("name", sorted(ZERO_D_OPTIMIZERS))
@pytest.mark.parametrize("dtype, masters", [("float32", False), ("float16", True)], ids=["fp32", "fp16-master"])
def test_zero_dim_parameters_train_with_every_scaler_mode_and_optimizer(
    mode: str, name: str, dtype: str, masters: bool
) -> None:
    """A 0-d parameter's gradient is a 0-d array of its dtype, and its steps are those of a 1-element one."""
    w0, grads0 = two_steps((), dtype, ZERO_D_OPTIMIZERS[name], mode, masters)
    w1, grads1 = two_steps((1,), dtype, ZERO_D_OPTIMIZERS[name], mode, masters)
    for g in grads0:
        assert isinstance(g, np.ndarray) and g.shape == () and g.dtype == np.dtype(dtype)
    assert isinstance(w0, np.ndarray) and w0.shape == ()
    assert w0.reshape(1).tobytes() == w1.tobytes()  # the same arithmetic, element for element
    assert float(w0) != 0.5
