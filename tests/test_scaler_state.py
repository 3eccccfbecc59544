"""The loss scaler's state_dict: a round trip continues identically, and a corrupt one is refused.

A checkpoint of the scaler holds its scale, counter, history and settings; loading it continues
the same trajectory to the bit, and a corrupt, mismatched or out-of-order one is one clear
error that changes nothing.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
from scaler_helpers import begin_step, snapshot

from tinyamp.amp.loss_scale import EVENTS, STATES
from tinyamp.amp.presets import PRESETS
from tinyamp.amp.scaler import LossScaler, ScalerOrderError
from tinyamp.amp.scaler_checks import ScalerStateError

pytestmark = pytest.mark.scaler


F, T = False, True


# ---- checkpoints ----------------------------------------------------------------------------------------------
def driven(name: str, flags: list[bool], **overrides: Any) -> LossScaler:
    s = LossScaler.preset(name, **overrides)
    for flag in flags:
        s.update(flag)
    return s


@pytest.mark.parametrize("name", list(PRESETS))
def test_state_dict_round_trip_continues_identically(name: str) -> None:
    flags = [F, F, T, F, F, F, T, T, F, F, F, F]
    interval = {"deepspeed": "scale_window", "fairseq": "scale_window"}.get(name, "growth_interval")  # their names
    s = driven(name, flags, **{interval: 3})
    d = s.state_dict()
    copy_of = copy.deepcopy(d)
    restored = LossScaler.preset(name, **{interval: 3})
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
