"""Dropout: zero each element with probability p, scale the survivors by 1/(1-p).

The scaling keeps the expected value of every element unchanged, so nothing needs to
change at evaluation time, when dropout is the identity.
"""

from __future__ import annotations

from typing import Any

from tinyamp import random
from tinyamp.function import Function
from tinyamp.tensor import Tensor, takes_a_tensor


class Dropout(Function):
    """$y = x \\cdot m$ with $m_i \\in \\{0, 1/(1-p)\\}$; the gradient is $g \\cdot m$."""

    def forward(self, x: Any, mask: Any) -> Any:
        self.save_for_backward(mask)
        return x * mask

    def backward(self, g: Any) -> tuple[Any]:
        (mask,) = self.saved
        return (g * mask,)


@takes_a_tensor
def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Zero elements of `x` with probability `p` (only when `training`)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1); got {p}")
    if not training or p == 0.0:
        return x
    keep = random.generator(x.device).random(x.shape, dtype="float32") >= p
    # the mask is stored in x's dtype: 1/(1-p) is exact for p = 0.5 and rounds once otherwise
    mask = keep.astype(x.dtype) * x.dtype.type(1.0 / (1.0 - p))
    return Dropout.apply(x, mask=mask)
