"""softmax and log_softmax, computed stably.

$\\mathrm{softmax}(x)_i = e^{x_i - m} / \\sum_j e^{x_j - m}$ with $m = \\max_j x_j$: the
shift changes nothing mathematically, but keeps every exponent <= 0, so no $e^{x}$
overflows (in float16, $e^{x}$ is inf already for x > 11.09).
"""

from __future__ import annotations

from typing import Any

from tinyamp import kernels
from tinyamp.autocast import cast_inputs
from tinyamp.backend import get_array_module
from tinyamp.function import Function
from tinyamp.tensor import Tensor, takes_a_tensor


def stable_log_softmax(x: Any, axis: int) -> Any:
    """$x - m - \\ln \\sum_j e^{x_j - m}$ on arrays."""
    xp = get_array_module(x)
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))


def softmax_forward(x: Any, axis: int) -> Any:
    """$e^{x - m} / \\sum_j e^{x_j - m}$ along `axis` on arrays."""
    e = get_array_module(x).exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def softmax_backward(g: Any, out: Any, axis: int) -> Any:
    """$y (g - \\sum_j g_j y_j)$ along `axis`, with y = softmax(x) the forward pass's output."""
    return out * (g - (g * out).sum(axis=axis, keepdims=True))


class Softmax(Function):
    """$y = \\mathrm{softmax}(x)$; $\\partial L/\\partial x = y (g - \\sum_j g_j y_j)$."""

    def forward(self, x: Any, axis: int) -> Any:
        out = kernels.call("softmax", softmax_forward, x, axis)  # one pass per step on a GPU
        self.axis = axis
        self.save_for_backward(out)
        return out

    def backward(self, g: Any) -> tuple[Any]:
        (out,) = self.saved
        return (kernels.call("softmax_backward", softmax_backward, g, out, self.axis),)


class LogSoftmax(Function):
    """$y = \\log \\mathrm{softmax}(x)$; $\\partial L/\\partial x = g - e^{y} \\sum_j g_j$."""

    def forward(self, x: Any, axis: int) -> Any:
        out = stable_log_softmax(x, axis)
        self.axis = axis
        self.save_for_backward(out)
        return out

    def backward(self, g: Any) -> tuple[Any]:
        (out,) = self.saved
        xp = get_array_module(g)
        return (g - xp.exp(out) * g.sum(axis=self.axis, keepdims=True),)


def _check_axis(x: Tensor, axis: int) -> int:
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for a tensor of shape {x.shape}")
    return axis % x.ndim


@takes_a_tensor
def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """Softmax along `axis`: positive values that sum to 1."""
    (x,) = cast_inputs("softmax", x)
    return Softmax.apply(x, axis=_check_axis(x, axis))


@takes_a_tensor
def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """Logarithm of softmax along `axis`, without forming softmax (no log(0))."""
    (x,) = cast_inputs("log_softmax", x)
    return LogSoftmax.apply(x, axis=_check_axis(x, axis))
