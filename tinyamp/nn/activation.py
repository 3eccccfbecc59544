"""Activation functions as layers, for use inside Sequential."""

from __future__ import annotations

from tinyamp.nn.module import Module
from tinyamp.ops import gelu, relu, tanh
from tinyamp.tensor import Tensor


class ReLU(Module):
    """$y = \\max(x, 0)$."""

    def forward(self, x: Tensor) -> Tensor:
        return relu(x)


class GELU(Module):
    """$y = x (1 + \\tanh(\\sqrt{2/\\pi}(x + 0.044715 x^3))) / 2$ (the tanh form of GPT-2)."""

    def forward(self, x: Tensor) -> Tensor:
        return gelu(x)


class Tanh(Module):
    """$y = \\tanh x$."""

    def forward(self, x: Tensor) -> Tensor:
        return tanh(x)


ACTIVATIONS: dict[str, type[Module]] = {"relu": ReLU, "gelu": GELU, "tanh": Tanh}
