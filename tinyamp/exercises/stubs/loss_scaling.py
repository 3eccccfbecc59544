"""Exercises 5.1 to 5.4: the dynamic loss-scale rule, the skipped step, exact scaling, hysteresis (tutorials/05).

Write each stub below; ``tinyamp exercises check`` grades them (``--only N.M`` for one).
"""

from __future__ import annotations

import math  # noqa: F401  (math.isfinite tells a grown scale that is inf)
from typing import Any

import numpy as np


class DynamicLossScaler:
    """Exercise 5.1: the dynamic loss-scale rule of PyTorch's GradScaler (and of jmp, with a floor).

    Task: keep ``scale`` (a Python float that is a float32 value) and ``growth_tracker`` (the
    clean steps counted towards the next growth), change them in ``update(found_inf)``, and
    save and restore both with ``state_dict()`` / ``load_state_dict(d)``.  The grader drives
    your scaler and tinyamp's presets "pytorch" and "jmp" with the same overflow flags and
    compares scale and counter after every step.

    Math, one step (s the scale, t the tracker, N = growth_interval):

    * overflow (found_inf True): s <- float32(s * backoff_factor), raised to min_scale if
      below it; t <- 0.  No growth on that step.  min_scale bounds a backoff, not the start:
      an init_scale below it is kept (jmp's and Apex's rules allow it) and grows as usual
      until the first overflow lifts it to min_scale.
    * clean step: t <- t + 1; when t reaches N: t <- 0 and s <- float32(s * growth_factor),
      lowered to max_scale if above it, and not at all if float32 would make it inf (PyTorch:
      "do not grow the scale past fp32 bounds to inf").

    float32(v) is ``float(np.float32(v))``: multiply the Python floats (exact for powers of
    two, rounded once otherwise, like PyTorch's double arithmetic) and round to float32.

    Read: tutorials/05_loss_scaling.py, sections 3 (the dynamic scaler, one transition at a
    time) and 5 (the published rules, side by side).

    Time: about 30 minutes of work once the reading is done (an estimate, for planning a lab).
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        min_scale: float | None = None,
        max_scale: float | None = None,
    ) -> None:
        raise NotImplementedError("Exercise 5.1: the dynamic loss-scale rule (pytorch, jmp)")

    def update(self, found_inf: bool) -> None:
        """One step of the rule: back off after an overflow, grow after growth_interval clean steps."""
        raise NotImplementedError("Exercise 5.1: the dynamic loss-scale rule (pytorch, jmp)")

    def state_dict(self) -> dict[str, Any]:
        """Everything the next steps depend on: the scale and the tracker."""
        raise NotImplementedError("Exercise 5.1: the dynamic loss-scale rule (pytorch, jmp)")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a ``state_dict()``: the same future, step for step."""
        raise NotImplementedError("Exercise 5.1: the dynamic loss-scale rule (pytorch, jmp)")


def skip_or_step(optimizer: Any, scale: float) -> bool:
    """Exercise 5.2: unscale the gradients, then step only if all are finite; return True when skipped.

    Task: each parameter in ``optimizer.params`` (float16 or float32 tinyamp Tensors) holds
    in ``.grad`` its gradient multiplied by `scale`.  Unscale every gradient in place (all of
    them, also after one that is not finite), check that all the unscaled gradients are
    finite, and call ``optimizer.step()`` only then.  Return True when the step was skipped.
    The check comes after unscaling: a scale below 1 makes a finite float16 gradient larger,
    and 8192 unscaled at scale 2^-4 is 131072, beyond float16's 65504: inf.  A skipped step
    must change no weight, no optimizer moment, and not ``optimizer.step_count``.

    Math: multiply by float32(1/scale), 1/scale computed in float64 and rounded once to
    float32 (for a float16 gradient: widen to float32, multiply, round once back to float16),
    as ``LossScaler.unscale_`` and PyTorch's ``GradScaler.unscale_`` do (``inv_scale =
    scale.double().reciprocal().float()``).  Do not divide by scale: for a power of two the
    two agree (1/scale is exact), but the grader also uses scale = 3, where float32(5) / 3
    is 1.6666666 and float32(5) * float32(1/3) is 1.6666667, one ulp apart.  1/scale in
    float16 is inexact for most scales, and 0 from a scale of 2^25 on.  An inf or NaN in any
    gradient means the scale was too large for this step: the update would write inf or NaN
    into the weights and the moments, so it is not taken at all.

    Read: tutorials/05_loss_scaling.py, sections 1 (the paragraph on unscaling), 2 (static
    loss scaling, and the skip) and 4 (a real run: the sawtooth).

    Time: about 20 minutes of work once the reading is done (an estimate, for planning a lab).
    """
    raise NotImplementedError("Exercise 5.2: the overflow-skipping step")


def scaling_is_exact(g: np.ndarray, k: int) -> np.ndarray:
    """Exercise 5.3: where scaling the float16 gradient by S = 2^k and unscaling gives it back, bit for bit.

    Task: `g` is a float16 array of finite values, S = 2^k (k from -30 to 30).  Return a
    bool array: True where ``float16(float16(g * S) / S) == g`` bit for bit.  Decide it
    from the law below (your answer is checked against the round trip itself).

    Math: multiplying by a power of two only moves the exponent: the 11 significant bits of
    g are kept unless g * S leaves float16's grid.  It leaves it in two ways: above the
    largest value (|g * S| > 65504 rounds to inf), and below 2^-14, where float16's values
    are the multiples of 2^-24 (the subnormals): g * S must be one of them.  So the round
    trip is exact exactly when |g * S| <= 65504 and g * S is a multiple of 2^-24.  (g * S is
    exact in float64.)  With S >= 1 only the first can fail; that is why a scale above 1
    protects small gradients.

    Read: tutorials/05_loss_scaling.py, section 1 (Gradients that FP16 cannot hold).

    Time: about 10 minutes of work once the reading is done (an estimate, for planning a lab).
    """
    raise NotImplementedError("Exercise 5.3: the exactness law: unscale(scale(g)) == g")


class HysteresisLossScaler:
    """Exercise 5.4: Megatron-LM's loss-scale rule, which tolerates overflows before it backs off.

    Task: keep ``scale`` (a Python float that is a float32 value), ``growth_tracker`` (the
    clean steps counted towards the next growth) and ``hysteresis_tracker`` (the overflows
    still tolerated), change them in ``update(found_inf)``, and save and restore all three
    with ``state_dict()`` / ``load_state_dict(d)``.  The grader drives your scaler and
    tinyamp's preset "megatron" (``LossScaler.preset("megatron", **settings)``) with the same
    overflow flags and compares scale and hysteresis_tracker after every step.

    Math, one step (s the scale, t = growth_tracker, h = hysteresis_tracker, N = growth_interval,
    H = hysteresis; megatron-core 0.16.1, megatron/core/optimizer/grad_scaler.py, ``update``):

    * overflow (found_inf True): t <- 0 and h <- h - 1; if now h <= 0, s <- float32(s *
      float32(backoff_factor)), raised to float32(min_scale) if below it.  Otherwise the scale
      is kept: the step is skipped all the same, but one overflow is tolerated.  A backoff does
      not restore h: it goes on down (0, -1, ...), and every overflow backs off until the next
      growth.
    * clean step: t <- t + 1; when t reaches N: t <- 0, h <- H (restored here, and only here:
      a clean step that does not grow leaves h alone, so the overflows need not be consecutive)
      and s <- float32(s * float32(growth_factor)), inf past float32's largest value: Megatron
      does not check, and the scale then stays inf (inf * backoff_factor is inf; every step at
      that scale overflows).

    float32(v) is ``float(np.float32(v))``: the product of two float32 values is exact in a
    Python float, so rounding it once to float32 is Megatron's float32 multiplication.

    The grader's settings: initial_scale a power of two from 2^-4 to 2^20, min_scale 0 to 8
    halvings below it, growth_interval 1 to 5, hysteresis 1 to 4, growth_factor 1.5, 2 or 4,
    backoff_factor 0.25, 0.5 or 0.7; runs of up to 60 equal flags, so that scales reach the floor
    and float32's top.

    Read: tutorials/05_loss_scaling.py, section 7 (Tolerating one overflow), and section 3 (the
    dynamic scaler, one transition at a time).

    Time: about 20 minutes of work once the reading is done (an estimate, for planning a lab).
    """

    def __init__(
        self,
        initial_scale: float = 2.0**32,
        min_scale: float = 1.0,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 1000,
        hysteresis: int = 2,
    ) -> None:
        raise NotImplementedError("Exercise 5.4: hysteresis: the overflows Megatron tolerates")

    def update(self, found_inf: bool) -> None:
        """One step of the rule: count an overflow down the hysteresis, grow after growth_interval clean steps."""
        raise NotImplementedError("Exercise 5.4: hysteresis: the overflows Megatron tolerates")

    def state_dict(self) -> dict[str, Any]:
        """Everything the next steps depend on: the scale and both trackers."""
        raise NotImplementedError("Exercise 5.4: hysteresis: the overflows Megatron tolerates")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a ``state_dict()``: the same future, step for step."""
        raise NotImplementedError("Exercise 5.4: hysteresis: the overflows Megatron tolerates")
