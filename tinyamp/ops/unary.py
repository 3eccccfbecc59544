"""Elementwise functions of one tensor: neg, exp, log, sqrt, tanh, sigmoid, relu, gelu.

Where the derivative can be written with the output, the output is saved instead of
the input (exp, sqrt, tanh, sigmoid, relu): the next op holds that array anyway, so the
graph keeps no extra bytes.
"""

from __future__ import annotations

import math
from typing import Any

from tinyamp import kernels
from tinyamp.autocast import cast_inputs
from tinyamp.backend import get_array_module
from tinyamp.function import Function
from tinyamp.tensor import Tensor, takes_a_tensor


class Neg(Function):
    """$y = -x$."""

    def forward(self, x: Any) -> Any:
        return -x

    def backward(self, g: Any) -> tuple[Any]:
        return (-g,)


class Exp(Function):
    """$y = e^x$; $dy/dx = y$."""

    def forward(self, x: Any) -> Any:
        out = get_array_module(x).exp(x)
        self.save_for_backward(out)
        return out

    def backward(self, g: Any) -> tuple[Any]:
        (out,) = self.saved
        return (g * out,)


class Log(Function):
    """$y = \\ln x$; $dy/dx = 1/x$."""

    def forward(self, x: Any) -> Any:
        self.save_for_backward(x)
        return get_array_module(x).log(x)

    def backward(self, g: Any) -> tuple[Any]:
        (x,) = self.saved
        return (g / x,)


class Sqrt(Function):
    """$y = \\sqrt{x}$; $dy/dx = 1 / (2y)$."""

    def forward(self, x: Any) -> Any:
        out = get_array_module(x).sqrt(x)
        self.save_for_backward(out)
        return out

    def backward(self, g: Any) -> tuple[Any]:
        (out,) = self.saved
        return (g / (2 * out),)


class Tanh(Function):
    """$y = \\tanh x$; $dy/dx = 1 - y^2$."""

    def forward(self, x: Any) -> Any:
        out = get_array_module(x).tanh(x)
        self.save_for_backward(out)
        return out

    def backward(self, g: Any) -> tuple[Any]:
        (out,) = self.saved
        return (g * (1 - out * out),)


class Sigmoid(Function):
    """$y = 1 / (1 + e^{-x})$; $dy/dx = y (1 - y)$.

    Computed as $(1 + \\tanh(x/2)) / 2$, the same function without the overflow of
    $e^{-x}$ for large negative x (e^{12} already exceeds float16's 65504).
    """

    def forward(self, x: Any) -> Any:
        out = get_array_module(x).tanh(x * 0.5)
        out += 1
        out *= 0.5
        self.save_for_backward(out)
        return out

    def backward(self, g: Any) -> tuple[Any]:
        (out,) = self.saved
        return (g * out * (1 - out),)


class ReLU(Function):
    """$y = \\max(x, 0)$; $dy/dx = [x > 0]$ (0 at the kink, as in PyTorch)."""

    def forward(self, x: Any) -> Any:
        out = kernels.relu(x)
        self.save_for_backward(out)
        return out

    def backward(self, g: Any) -> tuple[Any]:
        (out,) = self.saved
        return (kernels.relu_backward(g, out),)


_GELU_C, _GELU_A = math.sqrt(2 / math.pi), 0.044715


def gelu_forward(x: Any) -> Any:
    """GELU of an array, in float32 at least, rounded once to x's dtype."""
    wide = kernels.widen(x)
    t = get_array_module(x).tanh(_GELU_C * (wide + _GELU_A * wide * wide * wide))
    return kernels.cast(0.5 * wide * (1 + t), x.dtype)


def gelu_backward(g: Any, x: Any) -> Any:
    """`g` times GELU's derivative at `x`, in float32 at least, rounded once to g's dtype."""
    wide = kernels.widen(x)
    t = get_array_module(x).tanh(_GELU_C * (wide + _GELU_A * wide * wide * wide))
    d = 0.5 * (1 + t) + 0.5 * wide * (1 - t * t) * _GELU_C * (1 + 3 * _GELU_A * wide * wide)
    return kernels.cast(kernels.widen(g) * d, g.dtype)


class GELU(Function):
    """GELU, tanh form (as in GPT-2): $y = x (1 + \\tanh(c (x + a x^3))) / 2$.

    $c = \\sqrt{2/\\pi}$, $a = 0.044715$; it differs from the erf form by < 1e-3.
    $dy/dx = (1 + t)/2 + x (1 - t^2) c (1 + 3 a x^2) / 2$ with $t = \\tanh(c(x + a x^3))$.

    For float16/bfloat16 the formula runs in float32 and the result is rounded once: in
    float16, x^3 overflows for |x| > 40 (the gradient's 3 a x^2 for |x| > 699, giving
    inf * 0 = NaN) and 1 + t cancels to 0 for x < -4.  Only x is kept: t is recomputed in
    backward, so the graph holds 2 bytes per element, not 4.  On a GPU each pass is one
    fused kernel (tinyamp/engine/cuda/fused_ops.py) with the same float32 operations.
    """

    def forward(self, x: Any) -> Any:
        self.save_for_backward(x)
        return kernels.call("gelu", gelu_forward, x)

    def backward(self, g: Any) -> tuple[Any]:
        (x,) = self.saved
        return (kernels.call("gelu_backward", gelu_backward, g, x),)


@takes_a_tensor
def neg(x: Tensor) -> Tensor:
    """$-x$."""
    return Neg.apply(x)


@takes_a_tensor
def exp(x: Tensor) -> Tensor:
    """$e^x$ elementwise (float16 overflows to inf for x > 11.09)."""
    return Exp.apply(*cast_inputs("exp", x))


@takes_a_tensor
def log(x: Tensor) -> Tensor:
    """Natural logarithm elementwise."""
    return Log.apply(*cast_inputs("log", x))


@takes_a_tensor
def sqrt(x: Tensor) -> Tensor:
    """Square root elementwise."""
    return Sqrt.apply(x)


@takes_a_tensor
def tanh(x: Tensor) -> Tensor:
    """Hyperbolic tangent elementwise."""
    return Tanh.apply(x)


@takes_a_tensor
def sigmoid(x: Tensor) -> Tensor:
    """Logistic sigmoid elementwise."""
    return Sigmoid.apply(x)


@takes_a_tensor
def relu(x: Tensor) -> Tensor:
    """$\\max(x, 0)$ elementwise."""
    return ReLU.apply(x)


@takes_a_tensor
def gelu(x: Tensor) -> Tensor:
    """GELU (tanh approximation) elementwise."""
    return GELU.apply(x)
