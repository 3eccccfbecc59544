"""The rules that trained the large FP16 models: an overflow may be tolerated before the scale backs off.

Megatron-LM's ``DynamicGradScaler`` and DeepSpeed's ``DynamicLossScaler`` skip every overflowed
step, but lower the scale only once a *hysteresis* counter runs out; fairseq's
``DynamicLossScaler`` lowers it once the overflowed fraction of the steps since its last rescale
reaches its ``tolerance`` (by default 0: at every overflow).  Each rule below is the library's
``update`` step for step, with its own setting names, defaults and counters (read from the source:
megatron-core 0.16.1 ``megatron/core/optimizer/grad_scaler.py``, DeepSpeed 0.19.8
``deepspeed/runtime/fp16/loss_scaler.py``, fairseq 0.12.2 ``fairseq/optim/dynamic_loss_scaler.py``).

* **megatron** (float32 scale).  An overflow sets ``growth_tracker`` to 0 and lowers
  ``hysteresis_tracker`` by 1; when that is <= 0 the scale becomes ``max(scale * backoff_factor,
  min_scale)``.  A clean step adds 1 to ``growth_tracker``; when it equals ``growth_interval``
  it goes back to 0, the scale is multiplied by ``growth_factor``, and *only then* is
  ``hysteresis_tracker`` restored to ``hysteresis``.  So the overflows need not be consecutive:
  the ``hysteresis``-th overflow since the start or the last growth backs off, and so does every
  one after it until the next growth (the tracker goes on down: 0, -1, ...).
* **deepspeed** (Python float scale, factor 2).  An overflow backs off, to
  ``max(scale / 2, min_scale)``, when ``delayed_shift == 1`` or ``cur_hysteresis == 1``, and
  otherwise lowers ``cur_hysteresis`` by 1; either way ``last_overflow_iter = cur_iter``.  An
  overflow at ``scale == min_scale`` that would back off raises instead when
  ``raise_error_at_min_scale``.  A clean step computes ``stable_interval = cur_iter -
  last_overflow_iter - 1`` (the clean steps before it since the last overflow) and grows when
  that is > 0 and a multiple of ``scale_window``: the first growth comes at the
  ``scale_window + 1``-th clean step of a run, the next ones every ``scale_window`` steps.
  ``cur_hysteresis`` is restored to ``delayed_shift`` at every growth, or, with
  ``consecutive_hysteresis=True``, at every clean step (only consecutive overflows then count).
* **fairseq** (Python float scale).  An overflow sets ``last_overflow_iter = iter``, adds 1 to
  ``overflows_since_rescale``, and backs off (``scale / scale_factor``, then ``max(.., threshold)``
  when a threshold is set; ``last_rescale_iter = iter``, ``overflows_since_rescale = 0``) when
  ``overflows_since_rescale / (iter - last_rescale_iter) >= tolerance``.  A growth also sets
  ``last_rescale_iter`` but leaves ``overflows_since_rescale``: the overflows are counted since
  the last *backoff*, the steps since the last rescale of either kind.  A clean step grows the
  scale by ``scale_factor`` when ``(iter - last_overflow_iter) % scale_window == 0``: after
  ``scale_window`` clean steps, every time.  When the new scale would be <= ``min_loss_scale``
  the run stops with an error.

When the run stops at the floor (DeepSpeed, fairseq) the scaler raises ``LossScaleFloorError`` and
changes nothing.  fairseq's own scaler keeps its scale there too but has already updated
``last_overflow_iter`` and ``overflows_since_rescale`` (and, when it backed off, ``last_rescale_iter``;
not ``iter``): counters no later step reads, as the error ends its run.

The state after each transition (the first matching row wins): "tolerated", the step overflowed
and the scale did not back off; "at_floor", the scale equals the floor (``min_scale``; fairseq's
``threshold``); "at_ceiling", one more growth would not be finite; "backed_off"; "steady".

None of the three libraries checks that a grown scale is finite, and neither does the rule here
(unlike the classic presets, which refuse a growth to inf, as PyTorch does): a growth past the
largest float of the scale's dtype gives inf (event "grew", state "at_ceiling"), as Megatron's
``self._scale = self._scale * self.growth_factor`` (grad_scaler.py, ``update``), DeepSpeed's
``self.cur_scale *= self.scale_factor`` (loss_scaler.py, ``update_scale``) and fairseq's
``self.loss_scale *= self.scale_factor`` (dynamic_loss_scaler.py, ``update``) do.  The scale then
stays inf: a backoff gives inf again (inf * backoff_factor, inf / 2, inf / scale_factor), and a
training step at that scale overflows.  At the defaults the first inf would come after 96,000
clean steps (Megatron, float32 from 2^32), about a million (DeepSpeed, float64 from 2^16) or two
million (fairseq, from 2^15).  (At an overflow, DeepSpeed's rank 0 builds its log line with
``int(self.cur_scale)`` (for its default dtype, torch.half), which raises OverflowError for an inf
scale; its other ranks, and this rule, go on.)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from tinyamp.amp.loss_scale import EVENTS, ScaleEvent, round_scale

STATES = ("tolerated", "steady", "backed_off", "at_floor", "at_ceiling")
HYSTERESIS_EVENTS = (*EVENTS, "tolerated")


class LossScaleFloorError(FloatingPointError):
    """An overflow at the floor of a rule that ends the run there (DeepSpeed's and fairseq's)."""


@dataclass(frozen=True, slots=True)
class HysteresisEvent(ScaleEvent):
    """A row of ``HysteresisScaler.history``: a ScaleEvent and the library's counters after the transition.

    ``hysteresis`` is Megatron's ``hysteresis_tracker``, DeepSpeed's ``cur_hysteresis``, or
    fairseq's ``overflows_since_rescale`` (the overflows its tolerance counts).
    """

    hysteresis: int
    counters: tuple[tuple[str, int], ...]


def _real(library: str, name: str, value: Any, accepted: str, ok: Any) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value) or not ok(value):
        raise ValueError(f"{library}: {name} must be {accepted}; got {value!r}")
    return float(value)


def _int(library: str, name: str, value: Any, low: int, why: str = "") -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
        raise ValueError(f"{library}: {name} must be an int >= {low}{why}; got {value!r}")
    return int(value)


@dataclass(frozen=True)
class _Rule:
    """What the three rules share: their settings, the dtype of their scale, and their named states."""

    settings: Mapping[str, Any]  # the library's settings, by its own names, checked
    library: ClassVar[str] = ""
    source: ClassVar[str] = ""
    scale_dtype: ClassVar[str] = "float64"
    mode: ClassVar[str] = "dynamic"  # what LossScaler reads
    DEFAULTS: ClassVar[dict[str, Any]] = {}

    @property
    def init_scale(self) -> float:
        return float(self.settings[self.init_name])

    init_name: ClassVar[str] = "init_scale"
    floor_name: ClassVar[str] = "min_scale"
    growth_name: ClassVar[str] = "scale_factor"

    def round(self, x: float) -> float:
        return round_scale(self.scale_dtype, x)

    def floor(self) -> float | None:
        return self.settings.get(self.floor_name)

    def grown(self, scale: float) -> float:
        return self.round(scale * self.settings.get(self.growth_name, 2.0))

    def state(self, scale: float, event: str) -> str:
        if event == "tolerated":
            return "tolerated"
        if scale == self.floor():
            return "at_floor"
        if not math.isfinite(self.grown(scale)):
            return "at_ceiling"
        return "backed_off" if event in ("backed_off", "hit_floor") else "steady"

    def grow(self, scale: float) -> tuple[float, str]:
        return self.grown(scale), "grew"  # inf past the dtype's largest float, as in the libraries


class MegatronRule(_Rule):
    library = "megatron"
    source = "megatron-core 0.16.1 megatron/core/optimizer/grad_scaler.py DynamicGradScaler"
    scale_dtype = "float32"  # torch.tensor([initial_scale], dtype=torch.float): scale, factors and floor
    init_name, growth_name = "initial_scale", "growth_factor"
    DEFAULTS = dict(initial_scale=2.0**32, min_scale=1.0, growth_factor=2.0, backoff_factor=0.5,
                    growth_interval=1000, hysteresis=2)  # fmt: skip  # OptimizerConfig's, optimizer/__init__.py

    @classmethod
    def checked(cls, s: dict[str, Any]) -> dict[str, Any]:
        lib = cls.library
        s["initial_scale"] = _real(lib, "initial_scale", s["initial_scale"], "a number > 0 within float32's range",
                                   lambda v: v > 0 and math.isfinite(round_scale(cls.scale_dtype, v)))  # fmt: skip
        s["min_scale"] = _real(lib, "min_scale", s["min_scale"], f"> 0 and <= initial_scale={s['initial_scale']!r}",
                               lambda v: 0 < v <= s["initial_scale"])  # fmt: skip
        s["growth_factor"] = _real(lib, "growth_factor", s["growth_factor"], "> 1", lambda v: v > 1)
        s["backoff_factor"] = _real(lib, "backoff_factor", s["backoff_factor"], "in (0, 1)", lambda v: 0 < v < 1)
        s["growth_interval"] = _int(lib, "growth_interval", s["growth_interval"], 1)
        s["hysteresis"] = _int(lib, "hysteresis", s["hysteresis"], 1, " (1: back off at every overflow)")
        return s

    def start(self) -> dict[str, int]:
        return {"growth_tracker": 0, "hysteresis_tracker": self.settings["hysteresis"]}

    def floor(self) -> float:
        return self.round(self.settings["min_scale"])

    def grown(self, scale: float) -> float:
        return self.round(scale * self.round(self.settings["growth_factor"]))

    def next(self, scale: float, c: dict[str, int], found_inf: bool) -> tuple[float, dict[str, int], str]:
        s = self.settings
        if found_inf:
            c = {"growth_tracker": 0, "hysteresis_tracker": c["hysteresis_tracker"] - 1}
            if c["hysteresis_tracker"] > 0:
                return scale, c, "tolerated"
            backed = self.round(scale * self.round(s["backoff_factor"]))  # float32 * float32, one rounding
            return (self.floor(), c, "hit_floor") if backed < self.floor() else (backed, c, "backed_off")
        c = {**c, "growth_tracker": c["growth_tracker"] + 1}
        if c["growth_tracker"] != s["growth_interval"]:
            return scale, c, "held"
        scale, event = self.grow(scale)
        return scale, {"growth_tracker": 0, "hysteresis_tracker": s["hysteresis"]}, event

    def clean_steps(self, c: dict[str, int]) -> int:
        return c["growth_tracker"]

    def hysteresis(self, c: dict[str, int]) -> int:
        return c["hysteresis_tracker"]

    def valid(self, c: dict[str, int]) -> bool:
        return 0 <= c["growth_tracker"] < self.settings["growth_interval"] and (
            c["hysteresis_tracker"] <= self.settings["hysteresis"]
        )


class DeepSpeedRule(_Rule):
    library = "deepspeed"
    source = "DeepSpeed 0.19.8 deepspeed/runtime/fp16/loss_scaler.py DynamicLossScaler"
    DEFAULTS = dict(init_scale=2.0**16, scale_window=1000, min_scale=1.0, delayed_shift=2,
                    consecutive_hysteresis=False, raise_error_at_min_scale=True)  # fmt: skip  # runtime/constants.py

    @classmethod
    def checked(cls, s: dict[str, Any]) -> dict[str, Any]:
        lib = cls.library
        s["init_scale"] = _real(lib, "init_scale", s["init_scale"], "a finite number > 0", lambda v: v > 0)
        s["min_scale"] = _real(lib, "min_scale", s["min_scale"], f"> 0 and <= init_scale={s['init_scale']!r}",
                               lambda v: 0 < v <= s["init_scale"])  # fmt: skip
        s["scale_window"] = _int(lib, "scale_window", s["scale_window"], 1)
        s["delayed_shift"] = _int(lib, "delayed_shift", s["delayed_shift"], 1, " (1: back off at every overflow)")
        for key in ("consecutive_hysteresis", "raise_error_at_min_scale"):
            if not isinstance(s[key], bool):
                raise ValueError(f"{lib}: {key} must be True or False; got {s[key]!r}")
        return s

    def start(self) -> dict[str, int]:
        return {"cur_iter": 0, "last_overflow_iter": -1, "cur_hysteresis": self.settings["delayed_shift"]}

    def next(self, scale: float, c: dict[str, int], found_inf: bool) -> tuple[float, dict[str, int], str]:
        s, c = self.settings, dict(c)
        if found_inf:
            event = "tolerated"
            if s["delayed_shift"] == 1 or c["cur_hysteresis"] == 1:
                if scale == s["min_scale"] and s["raise_error_at_min_scale"]:
                    raise LossScaleFloorError(
                        f"deepspeed: a step overflowed at loss scale {scale:g}, which is already min_scale="
                        f"{s['min_scale']:g}, and raise_error_at_min_scale=True ends the run here, as DeepSpeed's "
                        "'Current loss scale already at minimum' does. Find where the non-finite gradients come "
                        "from (scaler.history), lower the learning rate, or set a lower min_scale"
                    )
                event = "hit_floor" if scale / 2.0 < s["min_scale"] else "backed_off"
                scale = max(scale / 2.0, s["min_scale"])
            else:
                c["cur_hysteresis"] -= 1
            c["last_overflow_iter"] = c["cur_iter"]
        else:
            event = "held"
            if s["consecutive_hysteresis"]:
                c["cur_hysteresis"] = s["delayed_shift"]
            stable_interval = c["cur_iter"] - c["last_overflow_iter"] - 1
            if stable_interval > 0 and stable_interval % s["scale_window"] == 0:
                c["cur_hysteresis"] = s["delayed_shift"]
                scale, event = self.grow(scale)
        c["cur_iter"] += 1
        return scale, c, event

    def grown(self, scale: float) -> float:
        return scale * 2.0

    def clean_steps(self, c: dict[str, int]) -> int:
        return c["cur_iter"] - c["last_overflow_iter"] - 1

    def hysteresis(self, c: dict[str, int]) -> int:
        return c["cur_hysteresis"]

    def valid(self, c: dict[str, int]) -> bool:
        return -1 <= c["last_overflow_iter"] < c["cur_iter"] and 1 <= c["cur_hysteresis"] <= self.settings[
            "delayed_shift"
        ]


class FairseqRule(_Rule):
    library = "fairseq"
    source = "fairseq 0.12.2 fairseq/optim/dynamic_loss_scaler.py DynamicLossScaler"
    floor_name = "threshold"
    DEFAULTS = dict(init_scale=2.0**15, scale_factor=2.0, scale_window=2000, tolerance=0.0, threshold=None,
                    min_loss_scale=1e-4)  # fmt: skip  # the class's own (fairseq-train's: fp16_init_scale=128)

    @classmethod
    def checked(cls, s: dict[str, Any]) -> dict[str, Any]:
        lib = cls.library
        s["init_scale"] = _real(lib, "init_scale", s["init_scale"], "a finite number > 0", lambda v: v > 0)
        s["scale_factor"] = _real(lib, "scale_factor", s["scale_factor"], "> 1", lambda v: v > 1)
        s["scale_window"] = _int(lib, "scale_window", s["scale_window"], 1)
        s["tolerance"] = _real(lib, "tolerance", s["tolerance"], ">= 0 (0: back off at every overflow)",
                               lambda v: v >= 0)  # fmt: skip
        s["min_loss_scale"] = _real(
            lib, "min_loss_scale", s["min_loss_scale"],
            f">= 0 and below init_scale={s['init_scale']!r} (the run stops when a new scale would be <= it)",
            lambda v: 0 <= v < s["init_scale"],
        )  # fmt: skip
        if s["threshold"] is not None:
            accepted = f"None, or > 0 and <= init_scale={s['init_scale']!r}"
            s["threshold"] = _real(lib, "threshold", s["threshold"], accepted, lambda v: 0 < v <= s["init_scale"])
        return s

    def start(self) -> dict[str, int]:
        return {"iter": 0, "last_overflow_iter": -1, "last_rescale_iter": -1, "overflows_since_rescale": 0}

    def next(self, scale: float, c: dict[str, int], found_inf: bool) -> tuple[float, dict[str, int], str]:
        s, c = self.settings, dict(c)
        if not found_inf:  # update(), after a step that was taken
            event = "held"
            if (c["iter"] - c["last_overflow_iter"]) % s["scale_window"] == 0:
                scale, event = self.grow(scale)
                c["last_rescale_iter"] = c["iter"]
            c["iter"] += 1
            return scale, c, event
        new, event = scale, "tolerated"  # check_overflow(grad_norm), with a grad_norm that is inf or NaN
        iter_since_rescale = c["iter"] - c["last_rescale_iter"]
        c["last_overflow_iter"] = c["iter"]
        c["overflows_since_rescale"] += 1
        if c["overflows_since_rescale"] / float(iter_since_rescale) >= s["tolerance"]:
            new, event = scale / s["scale_factor"], "backed_off"
            if s["threshold"] is not None and new < s["threshold"]:
                new, event = s["threshold"], "hit_floor"
            c["last_rescale_iter"], c["overflows_since_rescale"] = c["iter"], 0
        if new <= s["min_loss_scale"]:
            raise LossScaleFloorError(
                f"fairseq: a step overflowed at loss scale {scale:g}, and the next scale, {new:g}, would be at or "
                f"below min_loss_scale={s['min_loss_scale']:g}: fairseq ends the run here ('Minimum loss scale "
                "reached'). The loss is probably exploding: lower the learning rate, clip the gradients, or "
                "increase the batch size"
            )
        c["iter"] += 1
        return new, c, event

    def grown(self, scale: float) -> float:
        return scale * self.settings["scale_factor"]

    def clean_steps(self, c: dict[str, int]) -> int:
        return c["iter"] - c["last_overflow_iter"] - 1

    def hysteresis(self, c: dict[str, int]) -> int:
        return c["overflows_since_rescale"]

    def valid(self, c: dict[str, int]) -> bool:
        return -1 <= c["last_overflow_iter"] < c["iter"] and -1 <= c["last_rescale_iter"] < c["iter"] and (
            c["overflows_since_rescale"] >= 0
        )


RULES: Mapping[str, type[_Rule]] = {r.library: r for r in (MegatronRule, DeepSpeedRule, FairseqRule)}
CLASS = {"megatron": "DynamicGradScaler", "deepspeed": "DynamicLossScaler", "fairseq": "DynamicLossScaler"}


def make_rule(library: str, overrides: Mapping[str, Any]) -> _Rule:
    """The `library`'s rule with its defaults and `overrides` (its own setting names), checked."""
    kind = RULES[library]
    unknown = sorted(set(overrides) - set(kind.DEFAULTS))
    if unknown:
        hint = " (its initial scale is initial_scale)" if library == "megatron" and "init_scale" in unknown else ""
        raise ValueError(
            f"{library}: unknown setting {', '.join(unknown)}{hint}; {library}'s {CLASS[library]} takes "
            f"{', '.join(kind.DEFAULTS)}"
        )
    return kind(settings=kind.checked({**kind.DEFAULTS, **overrides}))
