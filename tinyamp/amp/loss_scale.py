"""The loss-scale rule and its named states: a pure function from one step's outcome to the next scale.

Modes: ``"dynamic"`` (the rule below), ``"static"`` (the scale never changes; an
overflowed step is still skipped and reported) and ``"off"`` (the scale is 1; non-finite
gradients are still detected and the step skipped: overflow is never hidden).

The dynamic rule, one transition per step.  ``round`` rounds to ``scale_dtype`` (float32
reproduces PyTorch, whose scale is a float32 tensor; float64 is a Python float); t is the
growth tracker, N the ``growth_interval``:

==================  =========  ============================================  =========  ========================
rule                found_inf  new scale                                     new t      event
==================  =========  ============================================  =========  ========================
any                 True       max(round(s * backoff_factor), min_scale)     0          backed_off / hit_floor
warmup (Chainer)    False      min(round(s * growth_factor), max_scale)      t + 1      grew / hit_ceiling
"interval", t+1<N   False      s                                             t + 1      held
"interval", t+1=N   False      min(round(s * growth_factor), max_scale)      0          grew / hit_ceiling
"per_step"          False      min(round(s * growth_factor^(1/N)), max)      t + 1      grew / hit_ceiling
==================  =========  ============================================  =========  ========================

``hit_floor`` / ``hit_ceiling`` mean the result was clamped to ``min_scale`` /
``max_scale``, or the growth was *refused* because the grown scale is not finite in
``scale_dtype`` (the scale then stays, as PyTorch's does).  Without a floor, a long run of
overflows halves the scale through the subnormals to 0, as PyTorch's does too.  The warmup
(``warmup=True``) lasts until the first overflow.  In static and off modes the scale never
changes (event ``held``), and t counts consecutive clean steps.

``min_scale`` bounds the backoff and ``max_scale`` the growth.  A scaler starts between them,
unless ``start_below_floor=True`` (jmp and Apex allow it): then the scale grows as usual until
the first overflow, which lifts it to ``min_scale`` (an overflow that *raises* the scale).

With powers of two for the initial scale and both factors (the default) the scale stays
a power of two, so scaling and unscaling only shift exponents: exact, unless a value
overflows or lands among the subnormals.  ``growth_rule="per_step"`` (Chainer's
``2^(1/N)`` per clean step) leaves that grid after the warmup.

The state after each transition (the first matching row wins):

==============  ==========================================================================
state           when
==============  ==========================================================================
"static"/"off"  in those modes, always
"warmup"        warmup=True and no overflow has happened yet
"at_floor"      scale == min_scale
"at_ceiling"    scale == max_scale, or one more growth would not be finite in scale_dtype
"backed_off"    the last step found an overflow
"steady"        otherwise: clean steps, counting towards the next growth
==============  ==========================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MODES = ("dynamic", "static", "off")
SCALE_DTYPES = ("float64", "float32")
GROWTH_RULES = ("interval", "per_step")
STATES = ("warmup", "steady", "backed_off", "at_floor", "at_ceiling", "static", "off")
EVENTS = ("grew", "backed_off", "held", "hit_floor", "hit_ceiling")


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    """One transition of the scale: a row of ``LossScaler.history``.

    ``step`` numbers the step it closes (0 for the first); ``growth_tracker`` and ``state``
    are their values *after* the transition.
    """

    step: int
    scale_before: float
    scale_after: float
    found_inf: bool
    event: str
    growth_tracker: int
    state: str


@dataclass(frozen=True)
class ScaleRule:
    """The settings of one loss-scaling rule (checked by ``scaler_checks.checked_rule``) and the rule itself."""

    init_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int
    min_scale: float | None
    max_scale: float | None
    mode: str
    scale_dtype: str
    warmup: bool
    growth_rule: str
    start_below_floor: bool

    def next(self, scale: float, tracker: int, overflow_seen: bool, found_inf: bool) -> tuple[float, int, bool, str]:
        """(scale, tracker, overflow_seen) after a step that found (or not) an inf or NaN, and the event."""
        if self.mode != "dynamic":
            return scale, 0 if found_inf else tracker + 1, overflow_seen or found_inf, "held"
        if found_inf:
            backed_off = self.round(scale * self.backoff_factor)
            if self.min_scale is not None and backed_off < self.min_scale:
                return self.min_scale, 0, True, "hit_floor"
            return backed_off, 0, True, "backed_off"
        tracker += 1
        if self.growth_rule == "interval" and not self.in_warmup(overflow_seen):
            if tracker < self.growth_interval:
                return scale, tracker, overflow_seen, "held"
            tracker = 0
        grown = self.round(scale * self.growth_multiplier(overflow_seen))
        if not math.isfinite(grown):  # PyTorch: "do not grow the scale past fp32 bounds to inf"
            return scale, tracker, overflow_seen, "hit_ceiling"
        if self.max_scale is not None and grown > self.max_scale:
            return self.max_scale, tracker, overflow_seen, "hit_ceiling"
        return grown, tracker, overflow_seen, "grew"

    def state(self, scale: float, found_inf: bool, overflow_seen: bool) -> str:
        """The named state after a transition (the table in the module docstring)."""
        if self.mode != "dynamic":
            return self.mode
        if self.in_warmup(overflow_seen):
            return "warmup"
        if self.min_scale is not None and scale == self.min_scale:
            return "at_floor"
        at_max = self.max_scale is not None and scale == self.max_scale
        if at_max or not math.isfinite(self.round(scale * self.growth_multiplier(overflow_seen))):
            return "at_ceiling"
        return "backed_off" if found_inf else "steady"

    def in_warmup(self, overflow_seen: bool) -> bool:
        return self.warmup and not overflow_seen

    def growth_multiplier(self, overflow_seen: bool) -> float:
        """growth_factor; after the warmup of the "per_step" rule, growth_factor^(1/N) (Chainer, in float64)."""
        if self.growth_rule == "per_step" and not self.in_warmup(overflow_seen):
            return self.growth_factor ** (1.0 / self.growth_interval)
        return self.growth_factor

    def round(self, x: float) -> float:
        """`x` rounded to ``scale_dtype``, as a Python float (inf when out of range)."""
        return round_scale(self.scale_dtype, x)


def round_scale(scale_dtype: str, x: float) -> float:
    """`x` rounded to `scale_dtype` ("float32" or "float64"), as a Python float (inf when out of range)."""
    if scale_dtype == "float32":
        with np.errstate(over="ignore"):
            return float(np.float32(x))
    return x
