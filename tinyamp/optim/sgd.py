"""Stochastic gradient descent, with momentum, Nesterov momentum and weight decay."""

from __future__ import annotations

from typing import Any

from tinyamp.backend import get_array_module
from tinyamp.optim.optimizer import Optimizer, Params


class SGD(Optimizer):
    """PyTorch's SGD, step by step (``dampening`` is 0):

    $$g \\leftarrow g + \\lambda w, \\qquad
      b \\leftarrow \\mu b + g \\ (b = g \\text{ on the first step}), \\qquad
      w \\leftarrow w - \\eta\\,(g + \\mu b \\text{ if nesterov else } b).$$

    Without momentum the update is $w \\leftarrow w - \\eta g$.  Weight decay $\\lambda$ is
    added to the gradient (L2 regularization), so it passes through the momentum.
    """

    hyperparameters = ("lr", "momentum", "weight_decay", "nesterov")
    state_keys = ("momentum_buffer",)  # per parameter, from its first step on, when momentum > 0

    def __init__(
        self, params: Params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False
    ) -> None:
        super().__init__(params)
        # each value is checked as it is set (Optimizer.__setattr__, optimizer_checks.checked_hyperparameter)
        self.lr, self.momentum, self.weight_decay, self.nesterov = lr, momentum, weight_decay, nesterov
        if nesterov and momentum == 0:
            raise ValueError("nesterov=True needs a momentum > 0")

    def update(self, w: Any, g: Any, state: dict[str, Any]) -> None:
        mu = self.momentum
        if self.weight_decay != 0:
            d = w * self.weight_decay
            d += g
        else:
            d = g  # the caller's gradient: read it, never write it
        if mu != 0:
            buf = state.get("momentum_buffer")
            if buf is None:  # a copy, and an array even where NumPy's 0-d arithmetic made d a scalar
                buf = state["momentum_buffer"] = get_array_module(w).array(d)
            else:
                buf *= mu
                buf += d
            d = d + mu * buf if self.nesterov else buf
        w -= self.lr * d
