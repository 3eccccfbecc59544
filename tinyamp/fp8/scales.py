"""A model's FP8 scales: one ``TensorScaling`` per named tensor, its format chosen by its pass.

The tensors are ``seam.TensorScaling``: the chapter's state machine, its passes over the values
through ``tinyamp.kernels`` (the same bits, faster where the engine room answers).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyamp.fp8 import scaling_checks
from tinyamp.fp8.scaling import Fp8Tensor, ScalingRecipe
from tinyamp.fp8.seam import TensorScaling


class Fp8Scales:
    """Every tensor's scaling under one recipe, by name: ``scales.quantize("fc1.weight", w)``.

    A tensor's pass ("forward" for weights and activations, "backward" for gradients) picks
    its format (``recipe.format_for``) when it is first cast and stays with it.
    """

    def __init__(self, recipe: ScalingRecipe | None = None) -> None:
        self.recipe = recipe if recipe is not None else ScalingRecipe()
        self.tensors: dict[str, TensorScaling] = {}
        self.passes: dict[str, str] = {}

    def quantize(self, name: str, x: np.ndarray, pass_: str = "forward") -> Fp8Tensor:
        """Cast `x` to FP8 with the scale of tensor `name` (created on first use), and update that scale."""
        if name not in self.tensors:
            self.tensors[name] = TensorScaling(name, self.recipe.format_for(pass_), self.recipe)
            self.passes[name] = pass_
        elif pass_ != self.passes[name]:
            raise ValueError(f"tensor {name!r} was cast in the {self.passes[name]} pass; name the {pass_} pass's "
                             "tensor differently (e.g. 'fc1.weight.grad')")  # fmt: skip
        return self.tensors[name].quantize(x)

    def state_dict(self) -> dict[str, Any]:
        """The recipe's settings and every tensor's state, as plain Python values."""
        tensors = {n: {"pass": self.passes[n], **t.state_dict()} for n, t in self.tensors.items()}
        return {"recipe": vars(self.recipe).copy(), "tensors": tensors}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` saved under the same recipe; checked whole first, a bad one changes nothing."""
        if not isinstance(state, dict) or set(state) != {"recipe", "tensors"} or not isinstance(state["tensors"], dict):
            raise ValueError("FP8 scales load from the dict {'recipe': ..., 'tensors': ...} of state_dict()")
        if state["recipe"] != vars(self.recipe):
            raise ValueError(f"saved recipe {state['recipe']} is not this one's {vars(self.recipe)}: build Fp8Scales "
                             "with ScalingRecipe(**saved['recipe']) to continue that run")  # fmt: skip
        tensors, passes = {}, {}
        for name, saved in state["tensors"].items():
            if not isinstance(saved, dict):
                raise ValueError(f"saved state of tensor {name!r} is a {type(saved).__name__}, not a state_dict()")
            saved = dict(saved)
            passes[name] = scaling_checks.checked_pass(saved.pop("pass", None))
            tensors[name] = TensorScaling(name, self.recipe.format_for(passes[name]), self.recipe)
            tensors[name].load_state_dict(saved)
        self.tensors, self.passes = tensors, passes

    def __str__(self) -> str:
        return "\n".join(str(t) for t in self.tensors.values()) or "no tensor cast to FP8 yet"
