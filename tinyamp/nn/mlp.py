"""MLP: a stack of Linear layers with an activation between consecutive ones."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tinyamp.nn.activation import ACTIVATIONS
from tinyamp.nn.container import Sequential
from tinyamp.nn.linear import Linear


class MLP(Sequential):
    """Multi-layer perceptron: ``MLP([784, 1024, 1024, 10])`` is
    Linear(784, 1024), ReLU, Linear(1024, 1024), ReLU, Linear(1024, 10).

    No activation follows the last layer: its outputs are logits for a loss.  The
    parameters are named "0.weight", "0.bias", "2.weight", ... (the activations hold none).
    """

    def __init__(self, sizes: Sequence[int], activation: str = "relu", dtype: Any = "float32") -> None:
        if len(sizes) < 2:
            raise ValueError(f"MLP needs at least an input and an output size; got sizes={list(sizes)}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}")
        layers = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            if i > 0:
                layers.append(ACTIVATIONS[activation]())
            layers.append(Linear(fan_in, fan_out, dtype=dtype))
        super().__init__(*layers)
        self.sizes = list(sizes)
