"""Published dynamic loss-scaling rules, as data: ``LossScaler.preset(name)`` builds one.

Each preset is the set of :class:`~tinyamp.amp.scaler.LossScaler` keyword arguments that
reproduces one framework's rule, plus a line saying where the rule comes from.  Print
``presets_table()`` to compare them side by side.

What the rules share: multiply the scale by ``backoff_factor`` when a gradient is inf or
NaN (and skip that step), multiply it by ``growth_factor`` after ``growth_interval``
consecutive clean steps.  Where they differ is the starting scale, the bounds, and the
dtype the scale itself is stored in:

==========  ==========  ===========  =========  ============  ===========  ======================
preset      init        growth       interval   floor         ceiling      scale stored as
==========  ==========  ===========  =========  ============  ===========  ======================
pytorch     2^16        x2           2000       none          float32 max  float32
apex        2^16        x2           2000       none          2^24         Python float
keras       2^15        x2           2000       none          float32 max  float32
jmp         2^15        x2           2000       1             float32 max  float32
chainer     1           x2 per step  (warmup)   1             65504        Python float
                        then x2^(1/1000) per clean step after the first overflow
==========  ==========  ===========  =========  ============  ===========  ======================

Differences from the originals, kept on purpose:

* Keras 3 doubles its float32 scale without checking that the result is finite; tinyamp
  never grows a scale to inf (the first inf would only appear after ~226,000 clean steps).
* Chainer multiplies by 0.5 and 2 whatever its ``interval``; here those are the
  ``backoff_factor`` and ``growth_factor`` (0.5 and 2 in the preset).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class ScalerPreset:
    """One published loss-scaling rule: LossScaler keyword arguments and their source."""

    name: str
    source: str  # one line: which class in which library, and the rule in words
    settings: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", MappingProxyType(dict(self.settings)))


PRESETS: Mapping[str, ScalerPreset] = MappingProxyType(
    {
        p.name: p
        for p in (
            ScalerPreset(
                "pytorch",
                "torch.amp.GradScaler: float32 scale 2^16, x0.5 on overflow, x2 after 2000 clean steps, "
                "growth refused when the float32 result would be inf, no floor (the scale can underflow to 0)",
                dict(
                    init_scale=2.0**16,
                    growth_factor=2.0,
                    backoff_factor=0.5,
                    growth_interval=2000,
                    min_scale=None,
                    max_scale=None,
                    scale_dtype="float32",
                ),
            ),
            ScalerPreset(
                "apex",
                "apex.amp LossScaler (dynamic): 2^16, /2 on overflow, x2 after 2000 clean steps, "
                "capped at max_loss_scale=2^24, no floor",
                dict(
                    init_scale=2.0**16,
                    growth_factor=2.0,
                    backoff_factor=0.5,
                    growth_interval=2000,
                    min_scale=None,
                    max_scale=2.0**24,
                    scale_dtype="float64",
                ),
            ),
            ScalerPreset(
                "keras",
                "keras.optimizers.LossScaleOptimizer (Keras 3): float32 scale 2^15, /2 on overflow, "
                "x2 after dynamic_growth_steps=2000 clean steps",
                dict(
                    init_scale=2.0**15,
                    growth_factor=2.0,
                    backoff_factor=0.5,
                    growth_interval=2000,
                    min_scale=None,
                    max_scale=None,
                    scale_dtype="float32",
                ),
            ),
            ScalerPreset(
                "jmp",
                "jmp.DynamicLossScale (DeepMind): float32 scale 2^15, /factor=2 on overflow but never below "
                "min_loss_scale=1, x2 after period=2000 clean steps unless the result is not finite",
                dict(
                    init_scale=2.0**15,
                    growth_factor=2.0,
                    backoff_factor=0.5,
                    growth_interval=2000,
                    min_scale=1.0,
                    max_scale=None,
                    scale_dtype="float32",
                ),
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
        )
    }
)
"""name -> ScalerPreset.  Read-only: copy ``dict(PRESETS[name].settings)`` to change one."""


def presets_table() -> str:
    """The presets as a plain-text table (one row per preset, then its source line)."""
    columns = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "min_scale", "max_scale")
    extra = ("scale_dtype", "warmup", "growth_rule")
    header = ["preset", *columns, *extra]
    rows = []
    for p in PRESETS.values():
        s = p.settings
        rows.append([p.name, *(_fmt(s.get(c)) for c in columns), *(_fmt(s.get(c, _DEFAULTS[c])) for c in extra)])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
    lines.append("")
    lines += [f"{p.name}: {p.source}" for p in PRESETS.values()]
    return "\n".join(lines)


_DEFAULTS = {"scale_dtype": "float64", "warmup": False, "growth_rule": "interval"}


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value > 0 and value.is_integer():
        exponent = int(value).bit_length() - 1
        if value == 2.0**exponent and exponent >= 4:
            return f"2^{exponent}"
    return str(value)
