"""Adam and AdamW: per-element step sizes from running moments of the gradient."""

from __future__ import annotations

import math
from typing import Any

from tinyamp.backend import get_array_module
from tinyamp.optim.optimizer import Optimizer, Params


class Adam(Optimizer):
    """Adam (Kingma & Ba, 2015) with PyTorch's exact formulas.  At step t:

    $$m \\leftarrow \\beta_1 m + (1 - \\beta_1) g, \\qquad v \\leftarrow \\beta_2 v + (1 - \\beta_2) g^2,$$
    $$w \\leftarrow w - \\frac{\\eta}{1 - \\beta_1^t} \\frac{m}{\\sqrt{v} / \\sqrt{1 - \\beta_2^t} + \\epsilon}.$$

    The bias corrections undo the pull of $m = v = 0$ towards zero in early steps.
    ``weight_decay`` $\\lambda$ is L2 regularization here ($g \\leftarrow g + \\lambda w$ before
    the moments); AdamW decouples it.  Each parameter keeps its own step count t, so a
    parameter that first gets a gradient late starts with full bias correction.

    $\\epsilon = 10^{-8}$ is below float16's smallest subnormal ($2^{-24} \\approx 6 \\times 10^{-8}$):
    one more reason the moments live in float32.
    """

    hyperparameters = ("lr", "betas", "eps", "weight_decay")
    state_keys = ("step", "exp_avg", "exp_avg_sq")  # per parameter, from its first step on
    decoupled_weight_decay = False
    default_weight_decay = 0.0  # what weight_decay=None means: AdamW's is 0.01

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float | None = None,
    ) -> None:
        super().__init__(params)
        wd = self.default_weight_decay if weight_decay is None else weight_decay
        # each value is checked as it is set (Optimizer.__setattr__, optimizer_checks.checked_hyperparameter)
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, wd

    def update(self, w: Any, g: Any, state: dict[str, Any]) -> None:
        xp = get_array_module(w)
        lr, (beta1, beta2), wd = self.lr, self.betas, self.weight_decay
        if not state:
            state.update(step=0, exp_avg=xp.zeros_like(w), exp_avg_sq=xp.zeros_like(w))
        state["step"] += 1
        t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
        if wd != 0:
            if self.decoupled_weight_decay:
                w *= 1 - lr * wd
            else:
                decayed = w * wd
                decayed += g
                g = decayed
        tmp = xp.multiply(g, 1 - beta1, out=xp.empty_like(w))  # the one temporary, reused below (an array, 0-d too)
        m *= beta1
        m += tmp
        xp.multiply(g, g, out=tmp)
        tmp *= 1 - beta2
        v *= beta2
        v += tmp
        xp.sqrt(v, out=tmp)
        tmp /= math.sqrt(1 - beta2**t)
        tmp += self.eps
        xp.divide(m, tmp, out=tmp)
        tmp *= lr / (1 - beta1**t)
        w -= tmp


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter, 2019), as PyTorch's AdamW:

    $w \\leftarrow w (1 - \\eta \\lambda)$ first, then the Adam step with the raw gradient.
    Unlike L2 in Adam, the decay is not divided by $\\sqrt{v}$, so every weight decays
    at the same rate.  Default $\\lambda = 0.01$.
    """

    decoupled_weight_decay = True
    default_weight_decay = 0.01
