"""LayerNorm: normalize each feature vector, then scale and shift it."""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyamp.nn import checks
from tinyamp.nn.module import Module
from tinyamp.nn.parameter import Parameter
from tinyamp.ops import layer_norm
from tinyamp.tensor import Tensor


class LayerNorm(Module):
    """$y = (x - \\mu) / \\sqrt{\\sigma^2 + \\epsilon} \\cdot \\gamma + \\beta$ over the last axis.

    $\\gamma$ (``weight``) starts at 1 and $\\beta$ (``bias``) at 0, so the layer starts
    as a pure normalization.  $\\epsilon = 10^{-5}$ keeps the division finite for a
    constant row ($\\sigma^2 = 0$).
    """

    def __init__(self, dim: int, eps: float = 1e-5, dtype: Any = "float32") -> None:
        super().__init__()
        dim = checks.size("LayerNorm", "dim", dim, 64)
        eps = checks.real("LayerNorm", "eps", eps, 1e-5, 0.0, low_open=True)  # 0 divides by 0 on a constant row
        self.dim, self.eps = dim, eps
        self.weight = Parameter(np.ones(dim), dtype=dtype)
        self.bias = Parameter(np.zeros(dim), dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"
