"""Optimizer: the parameters to update, their per-parameter state, and a checkpoint of both.

``step()`` reads each parameter's ``.grad`` and updates ``.data`` *in place*: the array
a parameter holds is never replaced, so anything that refers to it stays valid.  The
update rules (``update``) are plain NumPy/CuPy arithmetic on arrays, written with
in-place operators so that a step allocates at most one temporary per parameter.

Low precision: the state (momentum, Adam moments) of a float16 or bfloat16 parameter
is kept in float32, and its update is computed in float32 and rounded once when it is
written back.  Rounded into a float16 weight, a small update still vanishes: $1 + 2^{-11}$
rounds to 1 (``tinyamp.amp.lost_updates`` has the rule).  Mixed precision therefore keeps
an FP32 *master copy* of the weights across steps, so that small updates accumulate:
``tinyamp.amp.MasterWeights`` adds that on top of these optimizers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from tinyamp import backend, dtypes, kernels
from tinyamp.autograd import GradientError
from tinyamp.tensor import Tensor

Params = Iterable[Tensor] | Iterable[tuple[str, Tensor]]


class OptimizerStateError(ValueError):
    """An optimizer state_dict that does not fit this optimizer or its parameters."""


def _collect(params: Params) -> tuple[list[Tensor], list[str]]:
    """Parameters and their names ("0", "1", ... unless given as named_parameters() pairs)."""
    if isinstance(params, Tensor):
        raise TypeError("an optimizer takes an iterable of parameters, e.g. model.parameters(); wrap one in a list")
    tensors: list[Tensor] = []
    names: list[str] = []
    seen: set[int] = set()
    for i, item in enumerate(params):
        name, t = item if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) else (str(i), item)
        if not isinstance(t, Tensor):
            raise TypeError(f"an optimizer can only update Tensors; parameter {name} is a {type(t).__name__}")
        if not t.is_leaf:
            raise ValueError(f"parameter {name} (shape {t.shape}) is not a leaf: it is the output of an operation")
        if not dtypes.is_floating(t.dtype):
            raise TypeError(f"parameter {name} has dtype {t.dtype}; only floating-point tensors can be trained")
        if id(t) in seen:
            raise ValueError(f"parameter {name} (shape {t.shape}) appears twice in the parameter list")
        seen.add(id(t))
        tensors.append(t)
        names.append(name)
    if not tensors:
        raise ValueError("the optimizer got an empty parameter list")
    return tensors, names


class Optimizer:
    """Base class: subclasses list their ``hyperparameters`` and write ``update``.

    ``params`` is an iterable of Tensors (``model.parameters()``) or of ``(name, Tensor)``
    pairs (``model.named_parameters()``, whose names then appear in error messages).
    Hyperparameters are plain attributes: ``opt.lr = 1e-4`` changes the learning rate.
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
        super().__setattr__(name, value)

    def __init__(self, params: Params) -> None:
        self.params, self.names = _collect(params)
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

        Everything is checked first; a state_dict that does not fit changes nothing.
        """
        kind = state_dict.get("optimizer")
        if kind != type(self).__name__:
            raise OptimizerStateError(f"this is a state_dict of {kind}; it cannot be loaded into {type(self).__name__}")
        hyper = state_dict["hyperparameters"]
        if set(hyper) != set(self.hyperparameters):
            raise OptimizerStateError(
                f"the state_dict has hyperparameters {sorted(hyper)}; "
                f"{type(self).__name__} has {sorted(self.hyperparameters)}"
            )
        states = state_dict["state"]
        if len(states) != len(self.params):
            raise OptimizerStateError(
                f"the state_dict holds state for {len(states)} parameters; this optimizer has {len(self.params)}"
            )
        for p, name, saved, state in zip(self.params, self.names, state_dict["params"], states):
            expected = dtypes.accumulation_dtype(p.dtype)
            if tuple(saved["shape"]) != p.shape or saved["dtype"] != p.dtype.name:
                raise OptimizerStateError(
                    f"parameter {name} has shape {p.shape} and dtype {p.dtype}, but the state_dict was saved for "
                    f"{saved['name']} of shape {tuple(saved['shape'])} and dtype {saved['dtype']}"
                )
            for key, value in state.items():
                if backend.is_array(value) and (value.shape != p.shape or value.dtype != expected):
                    raise OptimizerStateError(
                        f"state {key!r} of parameter {name}: expected shape {p.shape} and dtype {expected}, "
                        f"got shape {value.shape} and dtype {value.dtype}"
                    )
        for h, value in hyper.items():
            setattr(self, h, tuple(value) if isinstance(value, list) else value)
        self.step_count = state_dict["step_count"]
        self.state = [
            {k: backend.to_device(v, p.device).copy() if backend.is_array(v) else v for k, v in s.items()}
            for p, s in zip(self.params, states)
        ]

    def __repr__(self) -> str:
        hyper = ", ".join(f"{h}={getattr(self, h)!r}" for h in self.hyperparameters)
        return f"{type(self).__name__}({hyper}; {len(self.params)} parameters)"
