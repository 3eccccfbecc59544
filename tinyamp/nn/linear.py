"""Linear: the affine layer $y = x W^T + b$."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tinyamp.nn import checks, init
from tinyamp.nn.module import Module
from tinyamp.nn.parameter import Parameter
from tinyamp.ops import linear
from tinyamp.tensor import Tensor


class Linear(Module):
    """$y = x W^T + b$ with W of shape (out_features, in_features), as in ``torch.nn.Linear``.

    W and b start as samples of $U(-1/\\sqrt{in}, 1/\\sqrt{in})$ (PyTorch's default): the
    variance of each output then does not grow with the number of inputs.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype: Any = "float32") -> None:
        super().__init__()
        in_features = checks.size("Linear", "in_features", in_features, 64)  # 0 would divide by 0 just below
        out_features = checks.size("Linear", "out_features", out_features, 10)
        bias = checks.flag("Linear", "bias", bias)
        self.in_features, self.out_features = in_features, out_features
        bound = 1 / math.sqrt(in_features)
        self.weight = init.uniform_(Parameter(np.zeros((out_features, in_features)), dtype=dtype), -bound, bound)
        self.bias = init.uniform_(Parameter(np.zeros(out_features), dtype=dtype), -bound, bound) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
