"""The loss-scale rule as a state machine: its settings, each transition, and the float32 limits.

No tolerances: the scale trajectories are compared with ``==``, float32 rounding included.  The
rule's settings are checked on construction; ``update(found_inf)`` is driven by hand, then by a
hypothesis state machine over random settings and flags (with checkpoints taken along the way),
and to the ends of the float32 and float64 ranges.  The published presets: test_scaler_presets.py.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import event as note_event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from scaler_helpers import f32
from strategies import scaler_configs

import tinyamp as ta
from tinyamp.amp.loss_scale import STATES, ScaleEvent
from tinyamp.amp.scaler import LossScaler

pytestmark = pytest.mark.scaler


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
