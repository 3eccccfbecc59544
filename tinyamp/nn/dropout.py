"""Dropout as a layer: active in training mode, the identity after ``eval()``."""

from __future__ import annotations

from tinyamp.nn.module import Module
from tinyamp.ops import dropout
from tinyamp.tensor import Tensor


class Dropout(Module):
    """Zero each element with probability p and scale the rest by $1/(1-p)$, only while ``training``.

    The scaling keeps $E[y] = x$, so evaluation needs no correction.
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1); got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
