"""Optimizer: the parameters to update, their per-parameter state, and a checkpoint of both.

``step()`` reads each parameter's ``.grad`` and updates ``.data`` *in place*: the array
a parameter holds is never replaced, so anything that refers to it stays valid.  The
update rules (``update``) are plain NumPy/CuPy arithmetic on arrays, written with
in-place operators so that a step allocates at most one temporary per parameter.

Low precision: the state (momentum, Adam moments) of a float16 or bfloat16 parameter
is kept in float32, and its update is computed in float32 and rounded once when it is
written back.  Done in float16, a small update vanishes: $1 + 2^{-11} = 1$, so any
update below half an ulp of the weight is lost.  (Proper mixed precision keeps an
FP32 *master copy* of the weights across steps, so that small updates accumulate;
tinyamp's AMP layer adds that on top of these optimizers.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from tinyamp import backend, dtypes
from tinyamp.autograd import GradientError
from tinyamp.ops.broadcasting import accumulation_dtype
from tinyamp.ops.casting import convert
from tinyamp.optim import fused_cuda
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

    def fuses_every_update(self, rounded_copies: Sequence[Any], grads: Sequence[Any] | None = None) -> bool:
        """True when every update of the next ``step(rounded_copies, grads=grads)`` runs as a fused GPU kernel."""
        grads = [p.grad for p in self.params] if grads is None else grads
        updated = [(p, g, c) for p, g, c in zip(self.params, grads, rounded_copies) if g is not None]
        has_kernels = type(self).fused_update is not Optimizer.fused_update
        return bool(updated) and has_kernels and all(fused_cuda.applies(p.data, g, c) for p, g, c in updated)

    def bookkeeping(self) -> tuple[int, list[dict[str, Any]]]:
        """The host-side record of the steps taken: step count and per-parameter state entries.

        The arrays in it are the live state arrays, not copies: this is for undoing a step
        whose kernels were skipped on the GPU (``restore_bookkeeping``), where those arrays
        were left unchanged but counters had already moved and new buffers been allocated.
        """
        return self.step_count, [dict(s) for s in self.state]

    def restore_bookkeeping(self, record: tuple[int, list[dict[str, Any]]]) -> None:
        """Return the step count and the state entries to `record` (see ``bookkeeping``)."""
        self.step_count, states = record
        self.state = [dict(s) for s in states]

    def step(
        self,
        rounded_copies: Sequence[Any] | None = None,
        skip_if: Any = None,
        grads: Sequence[Any] | None = None,
        grad_scale: float | None = None,
    ) -> None:
        """Update every parameter that has a gradient, in place.

        A parameter whose ``.grad`` is None (it took no part in the loss) is skipped and
        its state is left untouched, as in PyTorch.  A gradient whose shape or dtype
        differs from its parameter is an error, raised before any parameter changes.

        `rounded_copies` (one entry per parameter, or None) are arrays to overwrite with
        each updated parameter rounded once to their dtype: the model's float16 weights
        when these parameters are FP32 masters.  On the GPU the update and that rounding
        are one fused kernel (fused_cuda.py); elsewhere, the update, then the rounding.

        `skip_if` (GPU only, with every update fused): a device int32 flag; the kernels
        change nothing where it is nonzero.  The host does not wait to read it, so its own
        counters move as if the step ran; the caller restores them (``bookkeeping``).

        `grads` and `grad_scale` (GPU only, every update fused): gradients to read instead of
        the ``.grad`` of the parameters, multiplied by `grad_scale` inside the kernels: the
        model's float16 gradients, unscaled on the fly, so that FP32 master weights never need
        a float32 copy of their gradients.
        """
        fused_grads = grads is not None
        grads = [p.grad for p in self.params] if grads is None else list(grads)
        for p, name, g in zip(self.params, self.names, grads):
            if g is not None and (g.shape != p.data.shape or (g.dtype != p.data.dtype and not fused_grads)):
                raise GradientError(
                    f"parameter {name} has shape {p.data.shape} and dtype {p.data.dtype}, but its .grad has shape "
                    f"{g.shape} and dtype {g.dtype}; a gradient must match its parameter"
                )
        copies = rounded_copies if rounded_copies is not None else [None] * len(self.params)
        if (skip_if is not None or fused_grads) and not self.fuses_every_update(copies, grads):
            raise ValueError("skip_if and grads need every update fused on the GPU (check fuses_every_update first)")
        self.step_count += 1
        for p, g, state, copy in zip(self.params, grads, self.state, copies):
            if g is None:
                continue
            w = p.data
            if fused_cuda.applies(w, g, copy) and self.fused_update(w, g, state, copy, skip_if, grad_scale):
                continue
            if accumulation_dtype(w.dtype) == w.dtype:
                self.update(w, g, state)
            else:  # 16-bit: compute in float32, round once on the way back
                w32 = convert(w, np.float32)
                self.update(w32, convert(g, np.float32), state)
                convert(w32, w.dtype, out=w)
            if copy is not None:
                convert(w, copy.dtype, out=copy)  # one rounding, in place

    def update(self, w: Any, g: Any, state: dict[str, Any]) -> None:
        """Change the array `w` in place from its gradient `g` (never modified) and its `state`."""
        raise NotImplementedError

    def fused_update(
        self, w: Any, g: Any, state: dict[str, Any], copy: Any, skip_if: Any = None, grad_scale: float | None = None
    ) -> bool:
        """``update`` and the rounding of `w` into `copy` as one GPU kernel; False if this optimizer has none.

        `skip_if`: a device flag that, when nonzero, makes the kernel change nothing;
        `grad_scale`: a factor for a float16 `g` (1/loss scale), applied in the kernel.
        """
        return False

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
            expected = accumulation_dtype(p.dtype)
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
