"""Per-tensor scaling: the loss scale's descendant, a scale of its own for every tensor cast to FP8.

E4M3 spans 2^-9 to 448 and E5M2 2^-16 to 57344, far narrower than a network's values, so each
tensor is multiplied by its own scale before the cast and the product's result divided by it
again.  The scale maps the tensor's largest magnitude, its *amax*, onto the format's largest
value, with `margin` powers of two to spare:

    scale = (FP8_MAX * 2^-margin) / amax          computed in float32, as Transformer Engine does

=========  ===================================================  ========================
event      when                                                 the scale becomes
=========  ===================================================  ========================
rescaled   the amax is finite and > 0                           the quotient above
clamped    the quotient overflows float32 (a tiny amax)         float32's largest value
held       the amax is 0 (nothing to measure), inf or NaN,      the previous scale
           or the quotient underflows to 0 (a margin of 31+)
=========  ===================================================  ========================

Two recipes choose the amax.  **Current** scaling measures this tensor now and casts it with the scale of its own
amax.  **Delayed** scaling (TE's ``DelayedScaling``) casts step t with the scale computed at step t-1, then writes step
t's amax into a history of the last `amax_history_len` steps and reduces it (``"max"``: the largest entry;
``"most_recent"``: the newest) to the scale of step t+1.  The first scale is 1.  The cast needs no pass over the tensor
before it (the point of the recipe), and a spike larger than the history saw saturates until the next step learns
it.  ``"HYBRID"`` uses E4M3 for the forward pass and E5M2, with its wider range, for gradients.

Which of Transformer Engine's behaviours this follows: the rule of its per-tensor kernel
(``common/recipe/delayed_scaling.cu``): ``FP8_MAX * 2^-margin`` rounded to float32, then one float32 division; an amax
of 0, inf or NaN keeps the previous scale; an infinite scale becomes float32's max (a quotient that underflows to 0
keeps the previous scale: tinyamp's own guard, as a scale of 0 would zero every value); every step's amax enters the
history, zero included, and pushes the oldest entry out (TE's bulk kernel, in the same file, instead neither rolls the
history nor updates the scale for a step amax of 0).  A step whose amax is NaN or inf holds the scale and leaves the
history as it was; TE writes it, and its ``"max"``, an ``fmaxf``, skips a NaN but not an inf, which then holds every
scale at its stale value for the whole window while values clip: a history here holds only amaxes that define a scale,
and one holding a NaN or an inf is refused on loading.  A non-finite input value is cast to NaN, counted and reported
with its tensor and step; TE's satfinite cast makes an inf the largest value, a finite number wrong by an unbounded
factor that carries an overflow unseen into the product; a NaN reaches the loss scaler's check, which skips the
step.  The cast multiplies in float32 and dequantizing multiplies by float32(1 / scale), TE's ``scale_inv``.  The two
passes over the values are methods (``amax_of``, ``cast_counted``) so that ``seam.py``, off the reading path, can run
them faster, to the same bits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tinyamp.fp8 import scaling_checks
from tinyamp.fp8.formats import Minifloat, decode, encode, get_format

FLOAT32_MAX = float(np.finfo(np.float32).max)
EVENTS = ("rescaled", "clamped", "held")
STATES = ("initial",) + EVENTS  # a tensor's state: "initial" before its first cast, then its last event


def next_scale(amax: float, previous: float, fp8_max: float, margin: int) -> tuple[float, str]:
    """The scale for amax `amax` and the event (the table above); float32 values as Python floats."""
    scaled_max = np.float32(fp8_max * 2.0**-margin)
    amax = np.float32(amax)
    if not (np.isfinite(amax) and amax > 0):
        return previous, "held"
    with np.errstate(over="ignore"):
        scale = scaled_max / amax  # float32 / float32: one rounding
    if np.isinf(scale):
        return FLOAT32_MAX, "clamped"
    return (float(scale), "rescaled") if scale > 0 else (previous, "held")  # 0 would zero every value


@dataclass(frozen=True)
class ScalingRecipe:
    """How scales are chosen: TE's ``DelayedScaling`` settings (its defaults), or ``recipe="current"``."""

    recipe: str = "delayed"
    fp8_format: str = "HYBRID"  # or "E4M3" or "E5M2" for both passes
    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"  # or "most_recent"

    def __post_init__(self) -> None:
        scaling_checks.check_recipe(self)

    def format_for(self, pass_: str) -> Minifloat:
        """The format of the "forward" pass (weights, activations) or the "backward" pass (gradients)."""
        return get_format(scaling_checks.PASS_FORMATS[self.fp8_format][scaling_checks.checked_pass(pass_)])


@dataclass(frozen=True)
class CastEvent:
    """One cast of one tensor: a row of ``TensorScaling.history``."""

    step: int
    amax: float  # of the tensor before scaling; NaN when it held a NaN
    scale: float  # the scale this cast used
    next_scale: float  # the scale the next cast starts from
    event: str
    saturated: int  # finite values beyond FP8_MAX after scaling, clipped to it
    flushed: int  # nonzero finite values that became 0
    nonfinite: int  # inf or NaN inputs, cast to NaN


@dataclass(frozen=True)
class Fp8Tensor:
    """An FP8 tensor: one byte a value, and the scale its values were multiplied by."""

    bits: np.ndarray  # uint8 bit patterns of `fmt`
    fmt: Minifloat
    scale: float

    def __post_init__(self) -> None:
        scaling_checks.check_fp8_tensor(self.bits, self.fmt, self.scale)

    def dequantize(self) -> np.ndarray:
        """float32 values: the decoded bytes times float32(1 / scale), TE's ``scale_inv``."""
        return decode(self.bits, self.fmt) * (np.float32(1.0) / np.float32(self.scale))


class TensorScaling:
    """The scale of one named tensor, its amax history (oldest first) and every cast, as a state machine."""

    def __init__(self, name: str, fmt: str | Minifloat, recipe: ScalingRecipe) -> None:
        self.name, self.format, self.recipe = name, scaling_checks.checked_format(get_format(fmt)), recipe
        self.scale, self.amax_history = 1.0, np.zeros(recipe.amax_history_len, dtype=np.float32)
        self.history: list[CastEvent] = []

    @property
    def state(self) -> str:
        return self.history[-1].event if self.history else "initial"

    def quantize(self, x: np.ndarray) -> Fp8Tensor:
        """Cast `x` (float16 or float32) to FP8 with this tensor's scale, count what the cast did, update."""
        x = scaling_checks.checked_input(self.name, x)
        fmt, margin, step = self.format, self.recipe.margin, len(self.history)
        amax, scale, event = self.amax_of(x), self.scale, None  # amax: NaN when x holds a NaN
        if self.recipe.recipe == "current":
            scale, event = next_scale(amax, self.scale, fmt.max, margin)
        bits, saturated, flushed, nonfinite = self.cast_counted(x, scale)
        if np.isfinite(amax):
            self.amax_history = np.append(self.amax_history[1:], np.float32(amax))  # the window rolls
        if self.recipe.recipe == "delayed":  # the next cast's scale, from the history
            window = self.amax_history if self.recipe.amax_compute_algo == "max" else self.amax_history[-1:]
            reduced = float(window.max()) if np.isfinite(amax) else amax  # a NaN or inf step holds the scale
            self.scale, event = next_scale(reduced, self.scale, fmt.max, margin)
        else:
            self.scale = scale
        self.history.append(CastEvent(step, amax, scale, self.scale, event, saturated, flushed, nonfinite))
        return Fp8Tensor(bits, fmt, scale)

    def amax_of(self, x: np.ndarray) -> float:
        """max |x| as a float: 0 for an empty x, NaN when x holds a NaN."""
        return float(np.max(np.abs(x))) if x.size else 0.0

    def cast_counted(self, x: np.ndarray, scale: float) -> tuple[np.ndarray, int, int, int]:
        """x * scale in FP8, inf and NaN inputs to NaN; and how many values saturated, flushed to 0, were not finite."""
        with np.errstate(over="ignore", invalid="ignore"):
            scaled = x.astype(np.float32) * np.float32(scale)  # a finite value may overflow: saturated below
        bits, finite = encode(scaled, self.format), np.isfinite(x)
        bits[~finite] = self.format.nan_bits  # never the largest value: the input was not a number
        saturated = int(np.count_nonzero(finite & ~(np.abs(scaled) <= self.format.max)))
        flushed = int(np.count_nonzero(finite & (x != 0) & ((bits & 0x7F) == 0)))
        return bits, saturated, flushed, x.size - int(np.count_nonzero(finite))

    def state_dict(self) -> dict[str, Any]:
        """Everything the next casts depend on, as plain Python values."""
        return {"name": self.name, "format": self.format.name, "recipe": asdict(self.recipe), "scale": self.scale,
                "amax_history": self.amax_history.tolist(), "history": [asdict(e) for e in self.history]}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` of this tensor; checked whole first, so a bad one changes nothing."""
        self.scale, self.amax_history, self.history = scaling_checks.validated_state(self, state, CastEvent)

    def __str__(self) -> str:
        return scaling_checks.describe(self)
