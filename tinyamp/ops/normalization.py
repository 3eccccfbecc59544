"""Layer normalization over the last axis.

$\\hat x = (x - \\mu) / \\sqrt{\\sigma^2 + \\epsilon}$, $y = \\hat x \\gamma + \\beta$, with
$\\mu, \\sigma^2$ the mean and (biased) variance of each row.  The variance is a sum
of squares: in float16 a row of values near 300 already overflows (300^2 * 1 > 65504
is not needed; 256 values of 16 squared sum past 65504 as soon as |x| > 16), which is
why mixed precision keeps this op in float32.
"""

from __future__ import annotations

import math
from typing import Any

from tinyamp import kernels
from tinyamp.autocast import cast_inputs
from tinyamp.backend import get_array_module
from tinyamp.function import Function
from tinyamp.tensor import Tensor, takes_a_tensor


def layer_norm_forward(x: Any, weight: Any, bias: Any, eps: float) -> tuple[Any, Any, Any]:
    """(out, xhat, rstd) for arrays: each row centered, divided by its standard deviation, scaled, shifted."""
    xp = get_array_module(x)
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=-1, keepdims=True)
    rstd = 1 / xp.sqrt(var + eps)
    xhat = centered * rstd
    out = xhat
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out, xhat, rstd


def layer_norm_backward(g: Any, xhat: Any, rstd: Any, weight: Any) -> Any:
    """dL/dx for arrays, row by row: $r (\\hat g - \\bar{\\hat g} - \\hat x\\, \\overline{\\hat g \\hat x})$,
    where $\\hat g = g \\gamma$ and a bar is a row's mean."""
    ghat = g if weight is None else g * weight
    mean_g = ghat.mean(axis=-1, keepdims=True)
    mean_gx = (ghat * xhat).mean(axis=-1, keepdims=True)
    return rstd * (ghat - mean_g - xhat * mean_gx)


class LayerNorm(Function):
    """Normalize each row of x (last axis), then scale by weight and shift by bias.

    $\\partial L/\\partial x = \\frac{r}{D}(D \\hat g - \\sum \\hat g - \\hat x \\sum \\hat g \\hat x)$
    with $\\hat g = g \\gamma$ and $r = 1/\\sqrt{\\sigma^2 + \\epsilon}$.  On a GPU each pass is a few
    fused kernels (tinyamp/engine/cuda/fused_ops.py).
    """

    def forward(self, x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Any:
        out, xhat, rstd = kernels.call("layer_norm", layer_norm_forward, x, weight, bias, eps)
        self.save_for_backward(xhat, rstd, weight)
        self.dtypes = (x.dtype, None if weight is None else weight.dtype, None if bias is None else bias.dtype)
        return out

    def backward(self, g: Any) -> tuple[Any, ...]:
        xhat, rstd, weight = self.saved
        x_dtype, w_dtype, b_dtype = self.dtypes
        needs = self.needs_input_grad
        rows = g.reshape(-1, g.shape[-1])
        grads: list[Any] = [None]
        if weight is not None:
            grads.append(kernels.sum_rows(rows * xhat.reshape(rows.shape)).astype(w_dtype) if needs[1] else None)
        if b_dtype is not None:
            grads.append(kernels.sum_rows(rows).astype(b_dtype) if needs[-1] else None)
        if needs[0]:
            dx = kernels.call("layer_norm_backward", layer_norm_backward, g, xhat, rstd, weight)
            grads[0] = kernels.cast(dx, x_dtype)
        return tuple(grads)


@takes_a_tensor
def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Layer norm over the last axis of `x`, with optional per-feature `weight` and `bias`."""
    d = x.shape[-1] if x.ndim else 0
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and p.shape != (d,):
            raise ValueError(f"layer_norm: {name} of shape {p.shape} does not fit input {x.shape}; it must be ({d},)")
    if weight is None and bias is not None:
        raise ValueError("layer_norm: a bias without a weight is not supported; pass weight=ones")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        # eps <= 0 divides 0 by 0 (or takes sqrt of < 0) on a constant row: NaN, not an error, without this
        raise ValueError(f"layer_norm: eps must be a finite number > 0; got eps={eps!r}. Pass e.g. eps=1e-05")
    inputs = cast_inputs("layer_norm", *[t for t in (x, weight, bias) if t is not None])
    return LayerNorm.apply(*inputs, eps=eps)
