"""The training regimes compared side by side, each one mechanism away from the next.

================  ========  ===========  ==============  ============  ==============================
regime            weights   activations  master weights  loss scaling  what it shows
================  ========  ===========  ==============  ============  ==============================
``fp32``          FP32      FP32         (not needed)    no            the reference
``fp16``          FP16      FP16         no              no            small updates are lost
``fp16-scaled``   FP16      FP16         no              dynamic       scaling alone: updates still lost
``fp16-master``   FP16      FP16         FP32            no            masters alone: gradients underflow
``mixed``         FP16      FP16         FP32            dynamic       both repaired: FP32's result
``bf16``          BF16      BF16         no              no            8 bits of precision: most updates lost
``bf16-mixed``    BF16      BF16         FP32            no            BF16 has FP32's range
``fp8``           FP32      FP32         (the weights)   no            FP8 products, delayed scales
``fp8-current``   FP32      FP32         (the weights)   no            the same, current scales
``mxfp8``         FP32      FP32         (the weights)   no            a scale per 32 values
================  ========  ===========  ==============  ============  ==============================

Each repair can be seen alone: ``fp16-scaled`` adds loss scaling and ``fp16-master`` FP32
masters to ``fp16``; ``mixed`` has both, and ``bf16-mixed`` adds the masters to ``bf16``.

Every 16-bit regime runs its forward pass under the same ``autocast`` policy (matrix
products in 16 bits with FP32 accumulation; softmax and the loss in FP32), so two
neighbouring rows differ in exactly one mechanism.  "No loss scaling" is a
``LossScaler(mode="off")``: the scale is 1, but a step whose gradients are not finite is
still skipped and counted rather than written into the weights.

The FP8 regimes (``tinyamp.fp8.training``) keep FP32 weights, which are their master
weights, and run each Linear layer's three products (forward, dgrad, wgrad) on FP8 inputs
under ``fp8_training(name).autocast(model)``: E4M3 for activations and weights, E5M2 for
gradients, every tensor's scale recorded.  Everything else runs in FP32.  Their scales
replace loss scaling (``scaler="off"``), whose check still skips a step whose gradients are
not finite, as a NaN or inf cast to FP8 makes them.  They are emulated on NumPy: CPU only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyamp.amp import PRESETS, LossScaler, MasterWeights, StepReport, autocast
from tinyamp.experiments.measure import LostUpdateMeter
from tinyamp.fp8.training import RECIPES as FP8_RECIPES
from tinyamp.fp8.training import Fp8Casts, fp8_training
from tinyamp.nn.module import Module
from tinyamp.optim.optimizer import Optimizer
from tinyamp.tensor import Tensor

STATIC_SCALE = 2.0**10  # "static": one constant scale, inside the 8 to 32K range Micikevicius et al. used
SCALERS = (*PRESETS, "static", "off")


@dataclass(frozen=True)
class Regime:
    """One way to train: the dtype of the weights, of the activations, and the two repairs."""

    name: str
    weights: str  # the dtype the model stores (and computes with)
    activations: str | None  # the 16-bit dtype autocast lowers matrix products to; None: all FP32
    master_weights: bool  # an FP32 master copy takes the optimizer's updates
    scaler: str  # the default loss scaler: a preset name, "static" or "off"
    summary: str
    fp8: str | None = None  # the FP8 recipe of the Linear layers' products (tinyamp.fp8.training.RECIPES)

    @property
    def low_precision(self) -> str | None:
        """The 16-bit format whose limits matter ("float16", "bfloat16"), None for FP32."""
        return self.activations


REGIMES: dict[str, Regime] = {
    r.name: r
    for r in (
        Regime("fp32", "float32", None, False, "off", "FP32 weights, activations and gradients: the reference"),
        Regime("fp16", "float16", "float16", False, "off", "FP16 weights updated in place; no loss scaling"),
        Regime("fp16-scaled", "float16", "float16", False, "pytorch", "FP16 weights updated in place; dynamic scaling"),
        Regime("fp16-master", "float16", "float16", True, "off", "FP16 weights with FP32 masters; no loss scaling"),
        Regime("mixed", "float16", "float16", True, "pytorch", "FP16 compute, FP32 masters, dynamic loss scaling"),
        Regime("bf16", "bfloat16", "bfloat16", False, "off", "BF16 weights updated in place; no loss scaling"),
        Regime("bf16-mixed", "bfloat16", "bfloat16", True, "off", "BF16 compute, FP32 masters; no scaling needed"),
        *(Regime(name, "float32", None, False, "off", summary, fp8=name) for name, summary in FP8_RECIPES.items()),
    )
}


def bfloat16_available() -> bool:
    """bfloat16 arrays need the optional package ml_dtypes."""
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return False
    return True


def make_scaler(name: str) -> LossScaler:
    """The LossScaler called `name`: a published preset, "static" (a constant 2^10) or "off"."""
    if name == "off":
        return LossScaler(mode="off")
    if name == "static":
        return LossScaler(mode="static", init_scale=STATIC_SCALE)
    if name not in PRESETS:
        raise ValueError(f"unknown loss scaler {name!r}; choose one of {', '.join(SCALERS)}")
    return LossScaler.preset(name)


@dataclass
class Setup:
    """A model ready to train in one regime: its optimizer, its loss scaler, its meters."""

    regime: Regime
    model: Module
    optimizer: Optimizer | MasterWeights
    scaler: LossScaler
    lost_updates: LostUpdateMeter | None  # for 16-bit weights without a master
    fp8: Fp8Casts | None = None  # the FP8 regimes' casts: every tensor's scale and record

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The forward-pass context of this regime (autocast, FP8 Linear products, or nothing for FP32)."""
        if self.fp8 is not None:
            return self.fp8.autocast(self.model)
        if self.regime.activations is None:
            return contextlib.nullcontext()
        return autocast(self.regime.activations)

    def step(
        self,
        loss_fn: Callable[[Module], Tensor],
        measure_lost: bool = False,
        inspect: Callable[[Tensor], None] | None = None,
    ) -> tuple[float, StepReport, tuple[int, int] | None]:
        """One training step: forward under the regime's policy, scaled backward, (maybe skipped) update.

        Returns the loss, the scaler's StepReport, and with ``measure_lost`` the counts
        ``(changed, lost)``: elements the optimizer changed, and among them those whose
        16-bit weight did not move (with master weights: would not have moved).  None for
        FP32 weights, for a skipped step, or without ``measure_lost``.  ``inspect(loss)``
        runs before backward (e.g. ``saved_tensors``).
        """
        self.optimizer.zero_grad()
        with self.autocast():
            loss = loss_fn(self.model)
        if inspect is not None:
            inspect(loss)
        # An overflow in backward is expected now and then (a loss scale too large); the
        # scaler finds the inf, skips the step and reports it, so NumPy's warning adds nothing.
        with np.errstate(over="ignore", invalid="ignore"):
            self.scaler.scale_loss(loss).backward()
        meter = self.lost_updates if measure_lost else None
        masters = self.optimizer if isinstance(self.optimizer, MasterWeights) else None
        if masters is not None:
            masters.track_lost_updates = measure_lost
        if meter is not None:
            meter.before_step()
        report = self.scaler.step(self.optimizer)
        counts = None
        if meter is not None:
            counts = meter.after_step(report.skipped)
        elif masters is not None and measure_lost and not report.skipped:
            record = masters.history[-1]
            counts = (record.changed, record.lost)
        return float(loss.item()), report, counts


def build(
    regime: Regime, model: Module, make_optimizer: Callable[[Any], Optimizer], scaler: str | None = None
) -> Setup:
    """Cast `model` to the regime's weight dtype and build its optimizer and loss scaler.

    ``make_optimizer(params)`` builds the optimizer from ``model.named_parameters()``;
    `scaler` overrides the regime's default loss scaler (e.g. "static" for ``mixed``).
    """
    model.astype(regime.weights)
    optimizer = make_optimizer(model.named_parameters())
    meter = None
    if regime.master_weights:
        optimizer = MasterWeights(optimizer)
    elif regime.weights != "float32":
        meter = LostUpdateMeter(optimizer)
    casts = None if regime.fp8 is None else fp8_training(regime.fp8)
    return Setup(regime, model, optimizer, make_scaler(scaler or regime.scaler), meter, casts)
