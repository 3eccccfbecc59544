"""Dropout as a layer: active in training mode, the identity after ``eval()``."""

from __future__ import annotations

from tinyamp.nn import checks
from tinyamp.nn.module import Module
from tinyamp.ops import dropout
from tinyamp.tensor import Tensor


class Dropout(Module):
    """Zero each element with probability p and scale the rest by $1/(1-p)$, only while ``training``.

    The scaling keeps $E[y] = x$, so evaluation needs no correction.
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = checks.real("Dropout", "p", p, 0.1, 0.0, 1.0, high_open=True)  # p = 1 would scale by 1 / 0

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
