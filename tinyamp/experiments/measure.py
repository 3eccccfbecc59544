"""Measuring the two failures of naive FP16 training: underflowed gradients and lost updates.

**Underflowed gradients.**  Run the same weights on the same batch in FP32 and collect
every gradient the backward pass computes (activation gradients and weight gradients).
Among the nonzero ones, the *underflow fraction* is the share that rounds to zero in
FP16 after multiplication by the loss scale S: the values with $|g| \\cdot S \\le 2^{-25}$,
half the smallest FP16 subnormal.  This is what FP16 erases from the true gradient;
the FP16 backward itself erases at least as much, since a gradient computed from an
upstream gradient that is already zero stays zero.

**Lost updates.**  An update is *lost* when the optimizer computed a nonzero change for
an element but its 16-bit weight did not move: $\\mathrm{fp16}(w + \\Delta) = w$
(``tinyamp.amp.lost_updates`` has the rule; in float16 every update 4096 or more times
smaller than its weight is lost).
``MasterWeights`` counts this itself (the master keeps the update, so the count says what
*would* have been lost); :class:`LostUpdateMeter` counts it for an optimizer that updates
16-bit weights directly, where it *is* lost.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np

from tinyamp import autograd, backend, kernels
from tinyamp.amp import formats
from tinyamp.amp.lost_updates import lost_updates
from tinyamp.nn.module import Module
from tinyamp.optim.optimizer import Optimizer
from tinyamp.tensor import Tensor

# Histogram bins of log2|g|: one bin per power of two, from 2^-60 to 2^20.
LOG2_BINS = np.arange(-60, 21)


def fp32_gradients(model: Module, loss_fn: Callable[[Module], Tensor]) -> np.ndarray:
    """Every gradient value of one FP32 forward and backward of `model`, as one float64 vector.

    `model` must be a float32 model (a reference copy); its ``.grad`` is cleared afterwards.
    The values come from ``tinyamp.autograd.hooks``: each op's backward reports the
    gradients it hands to its inputs, so activation gradients are included, not only the
    weights' gradients.
    """
    collected: list[np.ndarray] = []

    def hook(direction: str, fn: Any, arrays: Any) -> None:
        if direction == "backward":
            for g in arrays:
                if g is not None and getattr(g, "dtype", None) is not None and g.dtype.kind == "f":
                    collected.append(np.asarray(backend.to_device(g, "cpu"), dtype=np.float64).ravel())

    loss = loss_fn(model)
    autograd.hooks.append(hook)
    try:
        loss.backward()
    finally:
        autograd.hooks.remove(hook)
    model.zero_grad()
    return np.concatenate(collected) if collected else np.zeros(0)


def underflow_fraction(gradients: np.ndarray, scale: float = 1.0, fmt: str = "float16") -> float:
    """Among the nonzero `gradients`, the fraction that is zero in `fmt` once multiplied by `scale`."""
    return formats.flushed_to_zero_fraction(gradients * scale, fmt)


def underflow_norm_fraction(gradients: np.ndarray, scale: float = 1.0, fmt: str = "float16") -> float:
    """The share of the gradients' squared L2 norm carried by the values `fmt` flushes to zero.

    The count (``underflow_fraction``) says how many values vanish; this says how much of
    the gradient they were.  Values flush to zero because they are tiny, so a third of the
    values can vanish while carrying a negligible share of the norm, and of the update.
    """
    g = np.asarray(gradients, dtype=np.float64)
    g = g[np.isfinite(g) & (g != 0)]
    total = float(np.dot(g, g))
    if total == 0.0:
        return 0.0
    lost = g[formats.flushes_to_zero(g * scale, fmt)]
    return float(np.dot(lost, lost)) / total


def log2_histogram(gradients: np.ndarray, scale: float = 1.0) -> list[int]:
    """Counts of the nonzero ``|g| * scale`` per power of two: bin k holds $2^k \\le |g| S < 2^{k+1}$.

    The bins are ``LOG2_BINS`` (values outside them are counted in the first or last bin).
    """
    g = np.abs(gradients[np.isfinite(gradients) & (gradients != 0)]) * scale
    k = np.clip(np.floor(np.log2(g)), LOG2_BINS[0], LOG2_BINS[-1]).astype(np.int64) - LOG2_BINS[0]
    return np.bincount(k, minlength=len(LOG2_BINS)).tolist()


class LostUpdateMeter:
    """Count the updates an optimizer loses when it writes straight into 16-bit weights.

    tinyamp's optimizers compute a 16-bit parameter's update in float32 and round the
    result into the weight (``Optimizer.step``).  To see which updates vanished, the meter
    replays that float32 computation on copies (``optimizer.update`` on a widened weight
    and a copy of the state, taken before the step): an element whose float32 result
    differs from its old weight but whose 16-bit weight did not change lost its update.
    The replay doubles the cost of the optimizer's arithmetic; the training is untouched.
    """

    def __init__(self, optimizer: Optimizer) -> None:
        self.optimizer = optimizer
        self._before: list[tuple[Any, dict[str, Any]]] | None = None

    def before_step(self) -> None:
        """Snapshot the weights and the optimizer state (call it right before the step)."""
        self._before = [(p.data.copy(), copy.deepcopy(s)) for p, s in zip(self.optimizer.params, self.optimizer.state)]

    def after_step(self, skipped: bool) -> tuple[int, int] | None:
        """Count this step's ``(changed, lost)`` elements (None for a skipped step: nothing was updated)."""
        before, self._before = self._before, None
        if before is None:
            raise RuntimeError("LostUpdateMeter.after_step without before_step")
        if skipped:
            return None
        changed = lost = 0
        for p, (old, state) in zip(self.optimizer.params, before):
            if p.grad is None:
                continue
            xp = backend.get_array_module(old)
            wide = kernels.widen(old)
            intended = wide.copy()
            self.optimizer.update(intended, kernels.widen(p.grad), state)
            changed += int(xp.count_nonzero(intended != wide))
            intended -= wide  # the update, in place
            lost += int(xp.count_nonzero(lost_updates(old, intended)))
        return changed, lost
