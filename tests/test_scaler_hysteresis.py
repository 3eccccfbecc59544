"""The presets megatron, deepspeed and fairseq (issue 38): each library's rule step for step, its state, its errors.

The hand-worked sequences below follow the libraries' update code line by line (megatron-core 0.16.1
``megatron/core/optimizer/grad_scaler.py``, DeepSpeed 0.19.8 ``deepspeed/runtime/fp16/loss_scaler.py``,
fairseq 0.12.2 ``fairseq/optim/dynamic_loss_scaler.py``).  The ``*Port`` classes are those update
methods transcribed with their attribute names (tensors and logging left out); hypothesis drives them
and the presets with the same flags.  Where the libraries are installed, the live classes are driven too.
"""

from __future__ import annotations

import collections
import copy
import importlib
import importlib.metadata
import importlib.util
import io
import json
import math
import os
import pathlib
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import hysteresis_settings

from tinyamp.amp import LossScaler, presets_table
from tinyamp.amp.hysteresis import HysteresisScaler, LossScaleFloorError

F, T = False, True
LIBRARIES = ("megatron", "deepspeed", "fairseq")


def run(scaler: LossScaler, flags: list[bool]) -> list[tuple[float, str, int]]:
    """(scale after, event, hysteresis counter after) for each flag."""
    return [(e.scale_after, e.event, e.hysteresis) for e in (scaler.update(f) for f in flags)]  # type: ignore[attr-defined]


# ---- hand-worked sequences --------------------------------------------------------------------------------
def test_megatron_counter_is_restored_only_by_a_growth_so_overflows_need_not_be_consecutive() -> None:
    s = LossScaler.preset("megatron", initial_scale=8.0, growth_interval=2, hysteresis=2)
    # T: hysteresis_tracker 2 -> 1 (> 0: the scale stays); F: growth_tracker 1 (!= 2: no growth, tracker not
    # restored); T: tracker 1 -> 0 (<= 0): 8 * 0.5 = 4; T: 0 -> -1, still <= 0: 2; F, F: growth_tracker
    # reaches 2: scale 4 and hysteresis_tracker back to 2; T: 2 -> 1, tolerated.
    assert run(s, [T, F, T, T, F, F, T]) == [
        (8.0, "tolerated", 1), (8.0, "held", 1), (4.0, "backed_off", 0), (2.0, "backed_off", -1),
        (2.0, "held", -1), (4.0, "grew", 2), (4.0, "tolerated", 1),
    ]  # fmt: skip
    assert s.state == "tolerated" and s.counters == {"growth_tracker": 0, "hysteresis_tracker": 1}


def test_megatron_floor_and_float32_scale() -> None:
    s = LossScaler.preset("megatron", initial_scale=3.0, min_scale=0.25, backoff_factor=0.3, hysteresis=1)
    # each product float32 * float32, rounded once to float32 (not 3 * 0.3 in float64); then 0.081 < 0.25:
    # torch.max gives the floor
    first = float(np.float32(3.0) * np.float32(0.3))
    assert first == 0.9000000357627869
    second = float(np.float32(first) * np.float32(0.3))
    assert run(s, [T, T, T]) == [(first, "backed_off", 0), (second, "backed_off", -1), (0.25, "hit_floor", -2)]
    assert s.state == "at_floor"
    s.update(True)  # Megatron never raises at its floor
    assert s.scale == 0.25


def test_deepspeed_grows_at_the_window_plus_first_clean_step_then_every_window() -> None:
    s = LossScaler.preset("deepspeed", init_scale=8.0, scale_window=2)
    # stable_interval = cur_iter - last_overflow_iter - 1 = 0, 1, 2, 3, 4: growth at 2 and 4 (> 0, % 2 == 0)
    assert [e.scale_after for e in (s.update(F) for _ in range(5))] == [8.0, 8.0, 16.0, 16.0, 32.0]
    s.update(T)  # tolerated (cur_hysteresis 2 -> 1); last_overflow_iter = 5
    # after an overflow at iter j: stable_interval 0, 1, 2 at iters j+1, j+2, j+3: growth at the third clean step
    assert [e.scale_after for e in (s.update(F) for _ in range(3))] == [32.0, 32.0, 64.0]
    assert s.hysteresis == 2  # restored by that growth


def test_deepspeed_hysteresis_non_consecutive_and_consecutive() -> None:
    s = LossScaler.preset("deepspeed", init_scale=8.0, scale_window=100)
    # T: cur_hysteresis 2 -> 1; F: no growth, no restore; T: cur_hysteresis == 1: 8 / 2
    assert run(s, [T, F, T, T]) == [(8.0, "tolerated", 1), (8.0, "held", 1), (4.0, "backed_off", 1),
                                    (2.0, "backed_off", 1)]  # fmt: skip
    c = LossScaler.preset("deepspeed", init_scale=8.0, scale_window=100, consecutive_hysteresis=True)
    # every clean step restores cur_hysteresis to delayed_shift: only two overflows in a row back off
    assert run(c, [T, F, T, F, T, T]) == [(8.0, "tolerated", 1), (8.0, "held", 2), (8.0, "tolerated", 1),
                                          (8.0, "held", 2), (8.0, "tolerated", 1), (4.0, "backed_off", 1)]  # fmt: skip


def test_deepspeed_raises_at_its_floor_and_changes_nothing() -> None:
    s = LossScaler.preset("deepspeed", init_scale=2.0, min_scale=1.0, delayed_shift=1)
    assert run(s, [T]) == [(1.0, "backed_off", 1)] and s.state == "at_floor"
    before = s.state_dict()
    with pytest.raises(LossScaleFloorError, match=r"overflowed at loss scale 1, which is already min_scale=1.*"
                       r"raise_error_at_min_scale=True ends the run.*set a lower min_scale"):  # fmt: skip
        s.update(True)
    assert s.state_dict() == before
    quiet = LossScaler.preset("deepspeed", init_scale=2.0, min_scale=1.0, delayed_shift=1,
                              raise_error_at_min_scale=False)  # fmt: skip
    assert run(quiet, [T, T]) == [(1.0, "backed_off", 1), (1.0, "hit_floor", 1)]


def test_fairseq_grows_after_each_window_and_backs_off_at_every_overflow_by_default() -> None:
    s = LossScaler.preset("fairseq", init_scale=8.0, scale_window=2)
    # (iter - last_overflow_iter) % 2 == 0: (0+1), (1+1)=2 grows, 3, 4 grows
    assert [e.scale_after for e in (s.update(F) for _ in range(4))] == [8.0, 16.0, 16.0, 32.0]
    # tolerance 0: 1 / (iter - last_rescale_iter) >= 0 always: 16; then iter 5 - 4 = 1, 6 - 4 = 2: growth
    assert run(s, [T, F, F]) == [(16.0, "backed_off", 0), (16.0, "held", 0), (32.0, "grew", 0)]


def test_fairseq_tolerance_counts_overflows_since_the_last_backoff_over_steps_since_the_last_rescale() -> None:
    s = LossScaler.preset("fairseq", init_scale=8.0, scale_window=100, tolerance=0.5)
    # iter 2: 1 overflow / (2 - -1) = 1/3 < 0.5: tolerated; iter 3: 2 / 4 = 0.5 >= 0.5: 4, counters reset
    # (last_rescale_iter = 3); iter 4: 1 / (4 - 3) = 1: 2
    assert run(s, [F, F, T, T, T]) == [(8.0, "held", 0), (8.0, "held", 0), (8.0, "tolerated", 1),
                                       (4.0, "backed_off", 0), (2.0, "backed_off", 0)]  # fmt: skip
    g = LossScaler.preset("fairseq", init_scale=8.0, scale_window=2, tolerance=0.6)
    # iter 1 grows ((1 - -1) % 2 == 0; last_rescale_iter = 1); iter 3: 1 / (3 - 1) = 0.5 < 0.6: tolerated,
    # last_overflow_iter = 3; iter 5 grows ((5 - 3) % 2 == 0; last_rescale_iter = 5) and keeps the count of 1;
    # iter 7: 2 / (7 - 5) = 1 >= 0.6: backs off.  (Had the growth reset the count, 1 / 2 < 0.6 would tolerate it.)
    assert run(g, [F, F, F, T, F, F, F, T]) == [
        (8.0, "held", 0), (16.0, "grew", 0), (16.0, "held", 0), (16.0, "tolerated", 1), (16.0, "held", 1),
        (32.0, "grew", 1), (32.0, "held", 1), (16.0, "backed_off", 0),
    ]  # fmt: skip


def test_fairseq_threshold_and_min_loss_scale() -> None:
    s = LossScaler.preset("fairseq", init_scale=4.0, threshold=2.0)
    assert run(s, [T, T]) == [(2.0, "backed_off", 0), (2.0, "hit_floor", 0)] and s.state == "at_floor"
    e = LossScaler.preset("fairseq", init_scale=4.0, min_loss_scale=1.0)
    e.update(True)  # 2 > 1
    before = e.state_dict()
    with pytest.raises(LossScaleFloorError, match=r"at loss scale 2, and the next scale, 1, would be at or below "
                       r"min_loss_scale=1.*lower the learning rate"):  # fmt: skip
        e.update(True)
    assert e.state_dict() == before and e.scale == 2.0


def test_a_growth_past_the_largest_float_gives_inf_and_the_scale_stays_there_as_in_the_libraries() -> None:
    # megatron-core grad_scaler.py update: self._scale = self._scale * self.growth_factor (float32: 2^127 * 2 is
    # inf), and later torch.max(inf * backoff_factor, min_scale) is inf; DeepSpeed: self.cur_scale *= 2.0 in a
    # Python float; fairseq: self.loss_scale *= self.scale_factor
    m = LossScaler.preset("megatron", initial_scale=2.0**127, growth_interval=1, hysteresis=1)
    assert run(m, [F, T, F]) == [(math.inf, "grew", 1), (math.inf, "backed_off", 0), (math.inf, "grew", 1)]
    assert m.state == "at_ceiling"
    d = LossScaler.preset("deepspeed", init_scale=2.0**1023, scale_window=1, delayed_shift=1)
    assert [e.scale_after for e in (d.update(f) for f in [F, F, T, F, F])] == [2.0**1023, math.inf, math.inf,
                                                                               math.inf, math.inf]  # fmt: skip
    f = LossScaler.preset("fairseq", init_scale=2.0**1022, scale_factor=4.0, scale_window=1)
    assert run(f, [F, T]) == [(math.inf, "grew", 0), (math.inf, "backed_off", 0)]
    restored = HysteresisScaler.from_state_dict(json.loads(json.dumps(m.state_dict())))  # "Infinity" in JSON
    assert restored.scale == math.inf and restored.counters == m.counters


# ---- settings ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "library, settings, message",
    [
        ("megatron", dict(hysteresis=0), r"megatron: hysteresis must be an int >= 1 \(1: back off at every"),
        ("deepspeed", dict(delayed_shift=0), r"deepspeed: delayed_shift must be an int >= 1"),
        ("deepspeed", dict(scale_window=-5), r"deepspeed: scale_window must be an int >= 1; got -5"),
        ("fairseq", dict(scale_window=0), r"fairseq: scale_window must be an int >= 1; got 0"),
        ("megatron", dict(growth_interval=-1), r"megatron: growth_interval must be an int >= 1; got -1"),
        ("megatron", dict(min_scale=2.0**40), r"megatron: min_scale must be > 0 and <= initial_scale=4294967296"),
        ("deepspeed", dict(min_scale=2.0**17), r"deepspeed: min_scale must be > 0 and <= init_scale=65536"),
        ("fairseq", dict(min_loss_scale=2.0**15), r"fairseq: min_loss_scale must be >= 0 and below init_scale"),
        ("fairseq", dict(tolerance=-0.1), r"fairseq: tolerance must be >= 0"),
        ("deepspeed", dict(growth_interval=3), r"deepspeed: unknown setting growth_interval; deepspeed's "
                                               r"DynamicLossScaler takes init_scale, scale_window, min_scale"),
        ("megatron", dict(init_scale=8.0), r"unknown setting init_scale \(its initial scale is initial_scale\)"),
        ("deepspeed", dict(consecutive_hysteresis=1), r"consecutive_hysteresis must be True or False"),
    ],
)  # fmt: skip
def test_bad_settings_name_the_setting_and_the_range(library: str, settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LossScaler.preset(library, **settings)


def test_defaults_are_the_libraries_and_the_table_shows_them() -> None:
    assert LossScaler.preset("megatron").config == dict(
        library="megatron", initial_scale=2.0**32, min_scale=1.0, growth_factor=2.0, backoff_factor=0.5,
        growth_interval=1000, hysteresis=2,
    )  # fmt: skip
    assert LossScaler.preset("deepspeed").config == dict(
        library="deepspeed", init_scale=2.0**16, scale_window=1000, min_scale=1.0, delayed_shift=2,
        consecutive_hysteresis=False, raise_error_at_min_scale=True,
    )  # fmt: skip
    assert LossScaler.preset("fairseq").config == dict(
        library="fairseq", init_scale=2.0**15, scale_factor=2.0, scale_window=2000, tolerance=0.0, threshold=None,
        min_loss_scale=1e-4,
    )  # fmt: skip
    table = presets_table()
    for name, counter in (("megatron", "hysteresis_tracker"), ("deepspeed", "cur_hysteresis"),
                          ("fairseq", "overflows_since_rescale")):  # fmt: skip
        assert any(line.startswith(f"{name}: ") and line.endswith(f"counter {counter}") for line in table.splitlines())
    assert "megatron: initial_scale=2^32" in table and "delayed_shift=2" in table


# ---- ports of the libraries' update methods (the reference for the property tests) --------------------------
class MegatronPort:
    """DynamicGradScaler.update, megatron-core 0.16.1, with float32 tensors as numpy float32 scalars."""

    def __init__(self, initial_scale, min_scale, growth_factor, backoff_factor, growth_interval, hysteresis):
        self._scale, self.min_scale = np.float32(initial_scale), np.float32(min_scale)
        self.growth_factor, self.backoff_factor = np.float32(growth_factor), np.float32(backoff_factor)
        self.growth_interval, self.hysteresis = growth_interval, hysteresis
        self._growth_tracker, self._hysteresis_tracker = 0, hysteresis

    def update(self, found_inf):
        if found_inf:
            self._growth_tracker = 0
            self._hysteresis_tracker -= 1
            if self._hysteresis_tracker <= 0:
                self._scale = max(self._scale * self.backoff_factor, self.min_scale)
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                self._growth_tracker = 0
                self._hysteresis_tracker = self.hysteresis
                self._scale = self._scale * self.growth_factor

    def values(self):
        trackers = {"growth_tracker": self._growth_tracker, "hysteresis_tracker": self._hysteresis_tracker}
        return float(self._scale), trackers


class DeepSpeedPort:
    """DynamicLossScaler.update_scale, DeepSpeed 0.19.8 (logging left out)."""

    def __init__(self, init_scale, scale_window, min_scale, delayed_shift, consecutive_hysteresis,
                 raise_error_at_min_scale=True):  # fmt: skip
        self.cur_scale, self.cur_iter, self.last_overflow_iter, self.scale_factor = init_scale, 0, -1, 2.0
        self.scale_window, self.min_scale, self.delayed_shift = scale_window, min_scale, delayed_shift
        self.cur_hysteresis, self.consecutive_hysteresis = delayed_shift, consecutive_hysteresis
        self.raise_error_at_min_scale = raise_error_at_min_scale

    def update(self, overflow):
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if (self.cur_scale == self.min_scale) and self.raise_error_at_min_scale:
                    raise Exception("Current loss scale already at minimum - cannot decrease scale anymore.")
                else:
                    self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            stable_interval = (self.cur_iter - self.last_overflow_iter) - 1
            if (stable_interval > 0) and (stable_interval % self.scale_window == 0):
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1

    def values(self):
        return float(self.cur_scale), {"cur_iter": self.cur_iter, "last_overflow_iter": self.last_overflow_iter,
                                       "cur_hysteresis": self.cur_hysteresis}  # fmt: skip


class FairseqPort:
    """DynamicLossScaler.check_overflow (an inf grad norm) and update (after a step taken), fairseq 0.12.2."""

    def __init__(self, init_scale, scale_factor, scale_window, tolerance, threshold, min_loss_scale):
        self.loss_scale, self.scale_factor, self.scale_window = init_scale, scale_factor, scale_window
        self.tolerance, self.threshold, self.min_loss_scale = tolerance, threshold, min_loss_scale
        self._iter, self._last_overflow_iter, self._last_rescale_iter, self._overflows_since_rescale = 0, -1, -1, 0

    def update(self, overflow):
        if not overflow:
            if (self._iter - self._last_overflow_iter) % self.scale_window == 0:
                self.loss_scale *= self.scale_factor
                self._last_rescale_iter = self._iter
            self._iter += 1
            return
        prev_scale = self.loss_scale
        iter_since_rescale = self._iter - self._last_rescale_iter
        self._last_overflow_iter = self._iter
        self._overflows_since_rescale += 1
        pct_overflow = self._overflows_since_rescale / float(iter_since_rescale)
        if pct_overflow >= self.tolerance:
            self.loss_scale /= self.scale_factor
            if self.threshold is not None:
                self.loss_scale = max(self.loss_scale, self.threshold)
            self._last_rescale_iter = self._iter
            self._overflows_since_rescale = 0
        if self.loss_scale <= self.min_loss_scale:
            self.loss_scale = prev_scale
            raise FloatingPointError("Minimum loss scale reached")
        self._iter += 1  # then it raises OverflowError: the step is skipped

    def values(self):
        return float(self.loss_scale), {"iter": self._iter, "last_overflow_iter": self._last_overflow_iter,
                                        "last_rescale_iter": self._last_rescale_iter,
                                        "overflows_since_rescale": self._overflows_since_rescale}  # fmt: skip


PORTS = {"megatron": MegatronPort, "deepspeed": DeepSpeedPort, "fairseq": FairseqPort}
FLAGS = st.lists(st.booleans(), max_size=80) | st.lists(st.sampled_from([F, F, F, T]), max_size=200)


def compare(library: str, settings: dict[str, Any], flags: list[bool], reference: Any) -> HysteresisScaler:
    """Drive the preset and `reference` with `flags`: the same scale and counters after every step, or both raise."""
    ours = LossScaler.preset(library, **settings)
    for i, flag in enumerate(flags):
        try:
            reference.update(flag)
        except Exception:  # DeepSpeed's Exception, fairseq's FloatingPointError: the run ends at the floor
            with pytest.raises(LossScaleFloorError):
                ours.update(flag)
            return ours
        ours.update(flag)
        scale, counters = reference.values()
        assert (ours.scale, ours.counters) == (scale, counters), f"after step {i} of {flags[: i + 1]}"
    return ours


@pytest.mark.parametrize("library", LIBRARIES)
@given(data=st.data())
def test_presets_follow_the_library_code_step_for_step(library: str, data: st.DataObject) -> None:
    settings = data.draw(hysteresis_settings(library))
    flags = data.draw(FLAGS)
    ours = compare(library, settings, flags, PORTS[library](**settings))
    for e in ours.history:  # laws all three share
        assert e.found_inf or e.scale_after >= e.scale_before  # a clean step never lowers the scale
        assert not e.found_inf or e.scale_after <= e.scale_before or e.event == "hit_floor"
        assert (e.event == "tolerated") == (e.found_inf and e.scale_after == e.scale_before and
                                             e.state == "tolerated")  # fmt: skip
        assert e.scale_after > 0  # inf too: a growth past the dtype's largest float gives inf, as in the libraries


@pytest.mark.parametrize("library", LIBRARIES)
@given(data=st.data())
def test_state_dict_round_trip_is_bit_identical(library: str, data: st.DataObject) -> None:
    settings = data.draw(hysteresis_settings(library))
    flags, future = data.draw(FLAGS), data.draw(FLAGS)
    s = LossScaler.preset(library, **settings)
    try:
        for f in flags:
            s.update(f)
    except LossScaleFloorError:
        pass
    d = s.state_dict()
    restored = HysteresisScaler.from_state_dict(json.loads(json.dumps(d)))
    assert restored.state_dict() == d and repr(restored) == repr(s) and restored.history == s.history

    def go(x: HysteresisScaler) -> list[Any]:
        out = []
        for f in future:
            try:
                out.append(x.update(f))
            except LossScaleFloorError as exc:
                return [*out, str(exc)]
        return out

    assert go(restored) == go(s)


def test_a_bad_state_dict_changes_nothing_and_says_why() -> None:
    s = LossScaler.preset("megatron", initial_scale=8.0, growth_interval=3)
    for f in [T, F]:
        s.update(f)
    d = s.state_dict()
    bad = copy.deepcopy(d)
    bad["counters"]["hysteresis_tracker"] = 5
    fresh = LossScaler.preset("megatron", initial_scale=8.0, growth_interval=3)
    with pytest.raises(ValueError, match=r"counters=.* are not megatron's \(growth_tracker, hysteresis_tracker\)"):
        fresh.load_state_dict(bad)
    assert fresh.step_count == 0
    other = LossScaler.preset("megatron", initial_scale=8.0, growth_interval=4)
    with pytest.raises(ValueError, match="it was saved by a scaler configured as"):
        other.load_state_dict(d)


# ---- the live libraries, where installed -------------------------------------------------------------------
# Each library's own class, driven with the flags the preset gets.  Only the library's surroundings are adapted:
# Megatron's tensors, made for 'cuda', are made on the CPU; DeepSpeed asks deepspeed.comm (its torch.distributed)
# for its rank, and is told 1 (a rank that does not log); fairseq's scaler file is loaded alone, as its package
# imports much more.
WANTED = {"megatron": ("megatron-core", "0.16.1"), "deepspeed": ("deepspeed", "0.19.8"),
          "fairseq": ("fairseq", "0.12.2")}  # fmt: skip
FLOOR_ERRORS = {"deepspeed": (Exception, "Current loss scale already at minimum"),
                "fairseq": (FloatingPointError, "Minimum loss scale reached")}  # fmt: skip
SCALER_MODULES = {"megatron": "megatron.core.optimizer.grad_scaler", "deepspeed": "deepspeed.runtime.fp16.loss_scaler"}
TOP_EXPONENT = {"megatron": 127, "deepspeed": 1023, "fairseq": 1023}  # the largest power of two of the scale's dtype
RUNS = st.lists(st.tuples(st.booleans(), st.integers(1, 40)), max_size=40)  # (flag, how many steps in a row)
LIVE_FLAGS = (
    st.integers(0, 300).flatmap(lambda n: st.lists(st.booleans(), min_size=n, max_size=n))
    | st.integers(0, 300).flatmap(lambda n: st.lists(st.sampled_from([F, F, F, F, F, F, T]), min_size=n, max_size=n))
    | RUNS.map(lambda runs: [flag for flag, n in runs for _ in range(n)])
)
LIVE_EXAMPLES = max(200, settings.default.max_examples)
TALLY: dict[str, collections.Counter] = {library: collections.Counter() for library in LIBRARIES}


def _skip_unless_installed(library: str) -> None:
    name, version = WANTED[library]
    install = f"pip install torch {name}=={version} (on Python 3.11; they run on a CPU)"
    for module in ("torch", {"megatron": "megatron.core", "deepspeed": "deepspeed"}[library]):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the live {library} test needs {module}, which is not installed: {install}")
    found = importlib.metadata.version(name)
    if found != version:
        pytest.skip(f"the {library} preset follows {name} {version}; {found} is installed: {install}")


def _fairseq_module() -> Any:
    """fairseq 0.12.2's fairseq/optim/dynamic_loss_scaler.py (it imports nothing), from an installed fairseq or
    from the fairseq source tree named by TINYAMP_FAIRSEQ_SOURCE (an unpacked fairseq-0.12.2 sdist)."""
    spec = importlib.util.find_spec("fairseq")
    tree = pathlib.Path(list(spec.submodule_search_locations)[0]).parent if spec else None
    tree = pathlib.Path(os.environ["TINYAMP_FAIRSEQ_SOURCE"]) if "TINYAMP_FAIRSEQ_SOURCE" in os.environ else tree
    if tree is None:
        pytest.skip("the live fairseq test needs fairseq 0.12.2's source: pip install fairseq==0.12.2, or set "
                    "TINYAMP_FAIRSEQ_SOURCE to an unpacked fairseq-0.12.2 sdist")  # fmt: skip
    version, path = tree / "fairseq" / "version.txt", tree / "fairseq" / "optim" / "dynamic_loss_scaler.py"
    if not version.is_file() or version.read_text().strip() != "0.12.2" or not path.is_file():
        pytest.skip(f"{tree} is not a fairseq 0.12.2 source tree with fairseq/optim/dynamic_loss_scaler.py")
    module_spec = importlib.util.spec_from_file_location("fairseq_0_12_2_dynamic_loss_scaler", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def live_module(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The scaler module of the library `request.param`, imported once, or the test's skip naming what to install;
    at the end, what was compared (shown with pytest -s)."""
    library = request.param
    if library == "fairseq":
        module = _fairseq_module()
    else:
        _skip_unless_installed(library)
        module = importlib.import_module(SCALER_MODULES[library])
    yield module
    if TALLY[library]:
        print(f"\nlive {library}: {', '.join(f'{n} {what}' for what, n in TALLY[library].items())}")
        TALLY[library].clear()


class _TorchOnTheCpu:
    """The ``torch`` that Megatron's grad_scaler.py sees: a tensor it asks for on 'cuda' is made on the CPU."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self.cuda = types.SimpleNamespace(current_device=lambda: 0)  # read by load_state_dict only

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def tensor(self, *args: Any, **kwargs: Any) -> Any:
        return self._torch.tensor(*args, **{**kwargs, "device": "cpu"})


class _Cuda:
    """A saved CPU tensor whose ``.cuda(device)`` (Megatron's load_state_dict calls it) returns it as it is."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor

    def cuda(self, device: int) -> Any:
        return self.tensor


class Live:
    """A library's own scaler behind ``update(found_inf)``, ``values()`` (scale, counters) and ``restored()``."""

    def __init__(self, library: str, module: Any, settings: dict[str, Any]) -> None:
        self.library, self.module, self.settings = library, module, settings
        self.live = {"megatron": lambda: module.DynamicGradScaler(**settings),
                     "deepspeed": lambda: module.DynamicLossScaler(**settings),
                     "fairseq": lambda: module.DynamicLossScaler(**settings)}[library]()  # fmt: skip

    def update(self, found_inf: bool) -> None:
        if self.library == "megatron":
            self.live.update(found_inf)
        elif self.library == "deepspeed":
            self.live.update_scale(found_inf)
        else:  # fairseq: check_overflow(grad_norm) at every step; update() after a step that was taken
            try:
                self.live.check_overflow(math.inf if found_inf else 1.0)
            except OverflowError:  # the skipped step: fairseq's trainer catches it
                return
            self.live.update()

    def values(self) -> tuple[float, dict[str, int]]:
        x = self.live
        if self.library == "megatron":  # read through its state_dict, the one it saves
            d = x.state_dict()
            assert d["scale"].dtype == self.module.torch.float32 and d["scale"].shape == (1,)
            return float(d["scale"].item()), {"growth_tracker": d["growth_tracker"],
                                              "hysteresis_tracker": d["hysteresis_tracker"]}  # fmt: skip
        if self.library == "deepspeed":
            return float(x.cur_scale), {"cur_iter": x.cur_iter, "last_overflow_iter": x.last_overflow_iter,
                                        "cur_hysteresis": x.cur_hysteresis}  # fmt: skip
        return float(x.loss_scale), {"iter": x._iter, "last_overflow_iter": x._last_overflow_iter,
                                     "last_rescale_iter": x._last_rescale_iter,
                                     "overflows_since_rescale": x._overflows_since_rescale}  # fmt: skip

    def restored(self) -> Live | None:
        """A new scaler resumed as the library resumes one (Megatron: its state_dict through torch.save and
        load_state_dict; DeepSpeed: the object itself pickled, as ZeRO's checkpoint saves it); fairseq's
        checkpoint keeps the loss scale only, not its counters: None."""
        if self.library == "fairseq":
            return None
        torch = self.module.torch
        other = Live(self.library, self.module, self.settings)
        buffer = io.BytesIO()
        if self.library == "megatron":
            torch.save(self.live.state_dict(), buffer)
            saved = torch.load(io.BytesIO(buffer.getvalue()))
            other.live.load_state_dict({**saved, "scale": _Cuda(saved["scale"])})
        else:
            torch.save(self.live, buffer)  # zero/stage_1_and_2.py: state_dict[LOSS_SCALER] = self.loss_scaler
            other.live = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
        return other


@st.composite
def live_settings(draw: Any, library: str) -> dict[str, Any]:
    """``hysteresis_settings``, and in one draw of four the same moved up to within 10 doublings of the top of
    the scale's dtype, where a few growths reach inf."""
    s = draw(hysteresis_settings(library))
    start = {"megatron": "initial_scale"}.get(library, "init_scale")
    if draw(st.integers(0, 3)) == 0:
        shift = TOP_EXPONENT[library] - draw(st.integers(0, 10)) - math.frexp(s[start])[1] + 1
        for key in (start, "min_scale", "threshold", "min_loss_scale"):
            if s.get(key) is not None:
                s[key] = math.ldexp(s[key], shift)
    return s


@pytest.mark.parametrize("library, live_module", [(library, library) for library in LIBRARIES],
                         indirect=["live_module"], ids=LIBRARIES)  # fmt: skip
@settings(max_examples=LIVE_EXAMPLES)
@given(data=st.data())
def test_presets_match_the_live_library(library: str, live_module: Any, data: st.DataObject) -> None:
    """The preset and the library's own class, given the same overflows: the same scale and counters after every
    step, the floor error at the same step, and (Megatron, DeepSpeed) the same future after a resume."""
    module = live_module
    settings_ = data.draw(live_settings(library), label="settings")
    flags = data.draw(LIVE_FLAGS, label="flags")
    resume_at = data.draw(st.integers(0, len(flags)), label="resume_at")
    tally, floor_error = TALLY[library], FLOOR_ERRORS[library][0] if library in FLOOR_ERRORS else ()
    tally["examples"] += 1
    with pytest.MonkeyPatch.context() as patch:
        if library == "megatron":
            patch.setattr(module, "torch", _TorchOnTheCpu(module.torch))
        if library == "deepspeed":
            patch.setattr(module, "dist", types.SimpleNamespace(get_rank=lambda: 1))
        live, ours = Live(library, module, settings_), LossScaler.preset(library, **settings_)
        assert (ours.scale, ours.counters) == live.values()
        for i, flag in enumerate(flags):
            where = f"at step {i} of {flags[: i + 1]}"
            if i == resume_at and (resumed := live.restored()) is not None:
                live, ours = resumed, HysteresisScaler.from_state_dict(json.loads(json.dumps(ours.state_dict())))
                assert (ours.scale, ours.counters) == live.values(), f"resumed {where}"
                tally["resumes"] += 1
            try:
                live.update(flag)
            except floor_error as exc:
                assert FLOOR_ERRORS[library][1] in str(exc), where
                with pytest.raises(LossScaleFloorError):
                    ours.update(flag)
                assert ours.scale == live.values()[0], where  # both keep the scale at which the run ends
                tally["runs ended by the floor error"] += 1
                return
            ours.update(flag)
            tally["steps compared"] += 1
            assert (ours.scale, ours.counters) == live.values(), where
        tally["steps that hit the floor"] += sum(e.event == "hit_floor" for e in ours.history)
        tally["runs that reached an inf scale"] += ours.scale == math.inf


@pytest.mark.parametrize("live_module", ["deepspeed"], indirect=True)
def test_deepspeed_rank_0_cannot_log_an_overflow_at_an_inf_scale(live_module: Any) -> None:
    """What the hysteresis_rules docstring says of DeepSpeed's rank 0 at an inf scale: its log line's
    int(self.cur_scale) raises OverflowError (the preset follows the other ranks, which go on)."""
    live = live_module.DynamicLossScaler(init_scale=2.0**1023, scale_window=1, min_scale=1.0, delayed_shift=2,
                                         consecutive_hysteresis=False)  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(live_module, "dist", types.SimpleNamespace(get_rank=lambda: 0))
        live.update_scale(False), live.update_scale(False)  # stable_interval 0, then 1: 2^1024 is inf
        assert live.cur_scale == math.inf
        with pytest.raises(OverflowError, match="cannot convert float infinity to integer"):
            live.update_scale(True)
    ours = LossScaler.preset("deepspeed", init_scale=2.0**1023, scale_window=1)
    assert run(ours, [F, F, T]) == [(2.0**1023, "held", 2), (math.inf, "grew", 2), (math.inf, "tolerated", 1)]
