"""Optimizer: the parameters to update, their per-parameter state, and a checkpoint of both.

``step()`` reads each parameter's ``.grad`` and updates ``.data`` *in place*: the array
a parameter holds is never replaced, so anything that refers to it stays valid.  The
update rules (``update``) are plain NumPy/CuPy arithmetic on arrays, written with
in-place operators to keep a step's temporaries few (a 16-bit weight adds its FP32 copies).

Low precision: the state (momentum, Adam moments) of a float16 or bfloat16 parameter
is kept in float32, and its update is computed in float32 and rounded once when it is
written back.  Rounded into a float16 weight, a small update still vanishes: $1 + 2^{-11}$
rounds to 1 (``tinyamp.amp.lost_updates`` has the rule).  Mixed precision therefore keeps
an FP32 *master copy* of the weights across steps, so that small updates accumulate:
``tinyamp.amp.MasterWeights`` adds that on top of these optimizers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyamp import backend, dtypes, kernels
from tinyamp.autograd import GradientError
from tinyamp.optim import optimizer_checks
from tinyamp.optim.optimizer_checks import Params


class Optimizer:
    """Base class: subclasses list their ``hyperparameters`` and write ``update``.

    ``params`` is an iterable of Tensors (``model.parameters()``) or of ``(name, Tensor)``
    pairs (``model.named_parameters()``, whose names then appear in error messages).
    Hyperparameters are plain attributes: ``opt.lr = 1e-4`` changes the learning rate, and
    every value is checked as it is set (``opt.lr = float("nan")`` is an error, not NaN weights).
    """

    hyperparameters: tuple[str, ...] = ("lr",)

    def __setattr__(self, name: str, value: Any) -> None:
        # A NumPy scalar hyperparameter (np.float64(0.05), say, from a schedule computed with
        # np.cos) is a *strong* type under NumPy 2: `w -= lr * g` would then compute in
        # float64 instead of the parameters' float32.  Python numbers are weak and adapt.
        if name in type(self).hyperparameters:
            if isinstance(value, np.generic):
                value = value.item()
            elif isinstance(value, tuple):
                value = tuple(v.item() if isinstance(v, np.generic) else v for v in value)
            optimizer_checks.checked_hyperparameter(type(self).__name__, name, value)
        super().__setattr__(name, value)

    def __init__(self, params: Params) -> None:
        self.params, self.names = optimizer_checks.collect(params)
        self.state: list[dict[str, Any]] = [{} for _ in self.params]
        self.step_count = 0

    def zero_grad(self) -> None:
        """Set every parameter's ``.grad`` to None."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """Update every parameter that has a gradient, in place.

        A parameter whose ``.grad`` is None (it took no part in the loss) is skipped and
        its state is left untouched, as in PyTorch.  A gradient whose shape or dtype
        differs from its parameter is an error, raised before any parameter changes.
        """
        for p, name in zip(self.params, self.names):
            g = p.grad
            if g is not None and (g.shape != p.data.shape or g.dtype != p.data.dtype):
                raise GradientError(
                    f"parameter {name} has shape {p.data.shape} and dtype {p.data.dtype}, but its .grad has shape "
                    f"{g.shape} and dtype {g.dtype}; a gradient must match its parameter"
                )
        backend.settle_checks("before the optimizer's step changed any weight")  # labels checked on a GPU
        self.step_count += 1
        for p, state in zip(self.params, self.state):
            if p.grad is None:
                continue
            if dtypes.is_16bit(p.dtype):  # computed in float32, rounded once on the way back
                w32 = kernels.cast(p.data, dtypes.float32)
                self.update(w32, kernels.cast(p.grad, dtypes.float32), state)
                kernels.cast(w32, p.dtype, out=p.data)
            else:
                self.update(p.data, p.grad, state)

    def update(self, w: Any, g: Any, state: dict[str, Any]) -> None:
        """Change the array `w` in place from its gradient `g` (never modified) and its `state`."""
        raise NotImplementedError

    # ---- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Hyperparameters, step count and a *copy* of every state array: all that ``step`` depends on."""
        return {
            "optimizer": type(self).__name__,
            "hyperparameters": {h: getattr(self, h) for h in self.hyperparameters},
            "step_count": self.step_count,
            "params": [{"name": n, "shape": p.shape, "dtype": p.dtype.name} for n, p in zip(self.names, self.params)],
            "state": [{k: v.copy() if backend.is_array(v) else v for k, v in s.items()} for s in self.state],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore hyperparameters, step count and state (copied), so training continues bit-identically.

        Everything is checked first (optimizer_checks.py); a state_dict that does not fit changes nothing.
        """
        optimizer_checks.check_state_dict(self, state_dict)
        for h, value in state_dict["hyperparameters"].items():
            setattr(self, h, tuple(value) if isinstance(value, list) else value)
        self.step_count = state_dict["step_count"]
        self.state = [
            {k: backend.to_device(v, p.device).copy() if backend.is_array(v) else v for k, v in s.items()}
            for p, s in zip(self.params, state_dict["state"])
        ]

    def __repr__(self) -> str:
        hyper = ", ".join(f"{h}={getattr(self, h)!r}" for h in self.hyperparameters)
        return f"{type(self).__name__}({hyper}; {len(self.params)} parameters)"
