"""Published dynamic loss-scaling rules, as data: ``LossScaler.preset(name)`` builds one.

Each preset is the set of :class:`~tinyamp.amp.scaler.LossScaler` keyword arguments that
reproduces one framework's rule, plus a line saying where the rule comes from.  Print
``presets_table()`` to compare them side by side.

What the rules share: multiply the scale by ``backoff_factor`` when a gradient is inf or
NaN (and skip that step), multiply it by ``growth_factor`` after ``growth_interval``
consecutive clean steps.  Where they differ is the starting scale, the bounds, and the
dtype the scale itself is stored in:

==========  ==========  ===========  =========  ============  ===========  ======================  ===========
preset      init        growth       interval   floor         ceiling      scale stored as         start below
                                                                                                   the floor
==========  ==========  ===========  =========  ============  ===========  ======================  ===========
pytorch     2^16        x2           2000       none          float32 max  float32                 no
apex        2^16        x2           2000       none          2^24         Python float            yes
keras       2^15        x2           2000       none          float32 max  float32                 no
jmp         2^15        x2           2000       1             float32 max  float32                 yes
chainer     1           x2 per step  (warmup)   1             65504        Python float            no
                        then x2^(1/1000) per clean step after the first overflow
==========  ==========  ===========  =========  ============  ===========  ======================  ===========

A preset takes the settings its library takes, and reads them as the library does
(``ScalerPreset.kwargs``; the plain ``LossScaler`` refuses these, saying why):

* jmp: ``min_scale`` becomes its nearest float32, because jmp compares it with the float32
  scale in float32 (``jnp.maximum(self.min_loss_scale, self.loss_scale / self.factor)``,
  jmp/_src/loss_scale.py:165 at jmp commit 9c1cdbbf, with JAX's default float32); 0 means no floor.
* apex: ``min_scale=0`` means no floor (``if(self._min_loss_scale):``, apex/amp/scaler.py:204);
  an ``init_scale`` above ``max_scale`` starts at ``max_scale``
  (``self._loss_scale = min(max_loss_scale, init_scale)``, scaler.py:47; apex commit e13873de,
  the last with apex.amp).
* jmp and apex: an ``init_scale`` below ``min_scale`` runs (``start_below_floor=True``): the
  scale grows as usual, and the first overflow lifts it to the floor (jmp's
  ``jnp.maximum`` above; apex's ``max(self._min_loss_scale, self._loss_scale/2.)``, scaler.py:205).

Differences from the originals, kept on purpose:

* Keras 3 doubles its float32 scale without checking that the result is finite; tinyamp
  never grows a scale to inf (the first inf would only appear after ~226,000 clean steps).
* Chainer multiplies by 0.5 and 2 whatever its ``interval``; here those are the
  ``backoff_factor`` and ``growth_factor`` (0.5 and 2 in the preset).
* jmp and apex treat a negative floor as no floor; tinyamp refuses it (a likely sign error):
  pass 0 or None.  Apex also takes a ``min_scale`` above ``max_scale`` (its scale then jumps
  between the two); tinyamp refuses it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tinyamp.amp.hysteresis_rules import DeepSpeedRule as _deepspeed
from tinyamp.amp.hysteresis_rules import FairseqRule as _fairseq
from tinyamp.amp.hysteresis_rules import MegatronRule as _megatron
from tinyamp.amp.loss_scale import round_scale


def _as_given(settings: dict[str, Any]) -> dict[str, Any]:
    return settings


def _finite_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _as_jmp_reads(settings: dict[str, Any]) -> dict[str, Any]:
    """jmp's floor is the float32 nearest to min_loss_scale (compared with the float32 scale); 0 is no floor."""
    floor = settings.get("min_scale")
    nearest = round_scale("float32", floor) if _finite_number(floor) else math.inf  # 0.37 -> 0.3700000047683716
    if math.isfinite(nearest):  # beyond float32's range: left for LossScaler to refuse
        settings["min_scale"] = None if nearest == 0 else nearest  # 0, or a floor that rounds to 0 (1e-50)
    return settings


def _as_apex_reads(settings: dict[str, Any]) -> dict[str, Any]:
    """apex: a floor of 0 is no floor (it is falsy); the start is min(max_loss_scale, init_scale)."""
    floor, init, ceiling = settings.get("min_scale"), settings.get("init_scale"), settings.get("max_scale")
    if _finite_number(floor) and floor == 0:
        settings["min_scale"] = None
    if _finite_number(ceiling) and isinstance(init, numbers.Real) and not isinstance(init, bool) and init > ceiling:
        settings["init_scale"] = ceiling  # an init_scale of inf too, as min(2.**24, inf) is 2.**24
    return settings


@dataclass(frozen=True)
class ScalerPreset:
    """One published loss-scaling rule: LossScaler keyword arguments, their source, and how the library reads them."""

    name: str
    source: str  # one line: which class in which library, and the rule in words
    settings: Mapping[str, Any] = field(default_factory=dict)
    reads: Callable[[dict[str, Any]], dict[str, Any]] = _as_given  # overridden settings, as the library reads them
    library: str | None = None  # a hysteresis rule (amp/hysteresis.py): settings by the library's own names

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", MappingProxyType(dict(self.settings)))

    def kwargs(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """The LossScaler keyword arguments: the settings with `overrides` on top, read as the library reads them."""
        return self.reads({**self.settings, **overrides})

    def build(self, cls: Any, overrides: Mapping[str, Any]) -> Any:
        """The scaler: ``cls(**self.kwargs(overrides))``, or for a hysteresis rule a ``HysteresisScaler``."""
        if self.library is None:
            return cls(**self.kwargs(overrides))
        return HYSTERESIS_SCALER[0](self.library, **overrides)


HYSTERESIS_SCALER: list[Any] = []  # [HysteresisScaler], put there by amp/hysteresis.py (it imports LossScaler,
# which imports this module); tinyamp.amp imports it, so that it is there before any preset is built


# PyTorch's GradScaler rule; apex, Keras and jmp keep its x2 after 2000 clean steps and x0.5 on overflow,
# and differ from it only where their presets below say so
_GRAD_SCALER = dict(
    init_scale=2.0**16,
    growth_factor=2.0,
    backoff_factor=0.5,
    growth_interval=2000,
    min_scale=None,
    max_scale=None,
    scale_dtype="float32",
)

PRESETS: Mapping[str, ScalerPreset] = MappingProxyType(
    {
        p.name: p
        for p in (
            ScalerPreset(
                "pytorch",
                "torch.amp.GradScaler: float32 scale 2^16, x0.5 on overflow, x2 after 2000 clean steps, "
                "growth refused when the float32 result would be inf, no floor (the scale can underflow to 0)",
                _GRAD_SCALER,
            ),
            ScalerPreset(
                "apex",
                "apex.amp LossScaler (dynamic): 2^16, /2 on overflow, x2 after 2000 clean steps, "
                "capped at max_loss_scale=2^24, no floor; starts at min(max_loss_scale, init_scale), "
                "min_loss_scale=0 is no floor, and a start below min_loss_scale runs until the first overflow",
                {**_GRAD_SCALER, "max_scale": 2.0**24, "scale_dtype": "float64", "start_below_floor": True},
                _as_apex_reads,
            ),
            ScalerPreset(
                "keras",
                "keras.optimizers.LossScaleOptimizer (Keras 3): float32 scale 2^15, /2 on overflow, "
                "x2 after dynamic_growth_steps=2000 clean steps",
                {**_GRAD_SCALER, "init_scale": 2.0**15},
            ),
            ScalerPreset(
                "jmp",
                "jmp.DynamicLossScale (DeepMind): float32 scale, no default (2^15 here, the example in jmp's docs); "
                "max(min_loss_scale=1, scale/factor=2) on overflow, x2 after period=2000 clean steps unless the result "
                "is not finite; "
                "min_loss_scale is used as its nearest float32 (0: no floor), and a start below it runs "
                "until the first overflow",
                {**_GRAD_SCALER, "init_scale": 2.0**15, "min_scale": 1.0, "start_below_floor": True},
                _as_jmp_reads,
            ),
            ScalerPreset(
                "chainer",
                "chainer Optimizer.loss_scaling(interval=1000): starts at 1, x2 every clean step until the "
                "first overflow, then x2^(1/interval) every clean step; x0.5 on overflow; kept in [1, 65504]",
                dict(
                    init_scale=1.0,
                    growth_factor=2.0,
                    backoff_factor=0.5,
                    growth_interval=1000,
                    min_scale=1.0,
                    max_scale=65504.0,
                    scale_dtype="float64",
                    warmup=True,
                    growth_rule="per_step",
                ),
            ),
            ScalerPreset(
                "megatron",
                "Megatron-LM DynamicGradScaler (megatron-core 0.16.1, megatron/core/optimizer/grad_scaler.py): "
                "float32 scale 2^32, x0.5 (floor min_scale=1) once hysteresis=2 overflows since the last growth "
                "(not only consecutive ones: the counter is restored only when the scale grows), "
                "x2 after growth_interval=1000 clean steps",
                _megatron.DEFAULTS,
                library="megatron",
            ),
            ScalerPreset(
                "deepspeed",
                "DeepSpeed DynamicLossScaler (0.19.8, deepspeed/runtime/fp16/loss_scaler.py; fp16 config "
                "defaults): 2^16, /2 (floor min_scale=1) at the overflow that finds cur_hysteresis at 1 "
                "(delayed_shift=2: one tolerated), restored at each growth, or at each clean step with "
                "consecutive_hysteresis; x2 at the (scale_window=1000)+1-th clean step after an overflow, then "
                "every 1000; raise_error_at_min_scale: an overflow at the floor ends the run",
                _deepspeed.DEFAULTS,
                library="deepspeed",
            ),
            ScalerPreset(
                "fairseq",
                "fairseq DynamicLossScaler (0.12.2, fairseq/optim/dynamic_loss_scaler.py; the class's defaults): "
                "2^15, /scale_factor=2 when the overflows since the last backoff are >= tolerance=0 of the "
                "steps since the last rescale, x2 after scale_window=2000 clean steps, threshold=None below; "
                "a new scale <= min_loss_scale=1e-4 ends the run",
                _fairseq.DEFAULTS,
                library="fairseq",
            ),
        )
    }
)
"""name -> ScalerPreset.  Read-only: copy ``dict(PRESETS[name].settings)`` to change one."""
CLASSIC_PRESETS = tuple(name for name, p in PRESETS.items() if p.library is None)
"""The presets that back off at the first overflow: a plain LossScaler, its rule a ``ScaleRule``."""
HYSTERESIS_PRESETS = tuple(name for name, p in PRESETS.items() if p.library is not None)
"""megatron, deepspeed, fairseq: a ``HysteresisScaler`` (amp/hysteresis.py), settings by the library's names."""


def presets_table() -> str:
    """The presets as a plain-text table: a row per preset, the hysteresis rules' settings, then each source line."""
    columns = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "min_scale", "max_scale")
    extra = ("scale_dtype", "warmup", "growth_rule", "start_below_floor")
    header = ["preset", *columns, *extra]
    rows = []
    for p in (p for p in PRESETS.values() if p.library is None):
        s = p.settings
        rows.append([p.name, *(_fmt(s.get(c)) for c in columns), *(_fmt(s.get(c, _DEFAULTS[c])) for c in extra)])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
    lines += ["", "hysteresis rules (tinyamp/amp/hysteresis_rules.py), their settings by the library's own names, "
              "and the counter that lets an overflow pass without backing off:"]  # fmt: skip
    for p in (p for p in PRESETS.values() if p.library is not None):
        settings = ", ".join(f"{k}={_fmt(v)}" for k, v in p.settings.items())
        lines.append(f"{p.name}: {settings}; counter {_COUNTER[p.name]}")
    lines.append("")
    lines += [f"{p.name}: {p.source}" for p in PRESETS.values()]
    return "\n".join(lines)


_COUNTER = {"megatron": "hysteresis_tracker", "deepspeed": "cur_hysteresis", "fairseq": "overflows_since_rescale"}
_DEFAULTS = {"scale_dtype": "float64", "warmup": False, "growth_rule": "interval", "start_below_floor": False}


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value > 0 and value.is_integer():
        exponent = int(value).bit_length() - 1
        if value == 2.0**exponent and exponent >= 4:
            return f"2^{exponent}"
    return str(value)
