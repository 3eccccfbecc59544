"""Function: one operation as a node of the graph, with its forward and its backward.

Every differentiable operation is a subclass with two methods on raw arrays (NumPy or CuPy):

* ``forward(*arrays, **params) -> array`` computes the output and keeps what the
  gradient needs with ``self.save_for_backward(...)``;
* ``backward(grad_output) -> tuple`` returns one gradient per input (``None`` for an
  input that needs none), each with the dtype and shape of that input.

``SomeFunction.apply(*tensors)`` runs the forward and, when gradients are wanted, links
the output tensor to the node; :func:`tinyamp.autograd.backward` later walks the nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tinyamp import autograd
from tinyamp.autograd import hooks
from tinyamp.grad_mode import is_grad_enabled
from tinyamp.tensor import Tensor


class Function:
    """A node of the graph: one operation, its inputs and what its backward needs.

    Attributes a student can inspect on ``tensor.creator``:

    * ``inputs``: leaf tensors as themselves, computed inputs as ``autograd.Edge`` objects
      (the node that made them, their shape and dtype; not their arrays);
    * ``saved``: the arrays kept for backward (``None`` once backward has freed them);
    * ``needs_input_grad``: which inputs want a gradient.
    """

    inputs: tuple[Tensor | autograd.Edge, ...]
    saved: tuple[Any, ...] | None = ()
    needs_input_grad: tuple[bool, ...] = ()
    output_ref: Callable[[], Tensor | None] | None = None  # set by Tensor.retain_grad()

    @classmethod
    def apply(cls, *inputs: Tensor, **params: Any) -> Tensor:
        """Run ``forward`` on the inputs' arrays and, if a gradient is wanted, record the node."""
        fn = cls()
        try:
            out = fn.forward(*[t.data for t in inputs], **params)
        except ValueError as exc:  # e.g. shapes that do not broadcast: name the op and the shapes
            shapes = ", ".join(f"{t.shape} {t.dtype}" for t in inputs)
            raise ValueError(f"{cls.__name__} got inputs of shapes {shapes}: {exc}") from None
        if isinstance(out, np.generic):  # NumPy's arithmetic on 0-d arrays returns scalars
            out = np.asarray(out)
        for hook in hooks:
            hook("forward", fn, (out,))
        needs = tuple(t.requires_grad for t in inputs)
        if not (is_grad_enabled() and True in needs):
            return Tensor._make(out, False, None)
        fn.inputs = tuple([t if t._ctx is None else t.edge() for t in inputs])
        fn.needs_input_grad = needs
        return Tensor._make(out, True, fn)

    def save_for_backward(self, *arrays: Any) -> None:
        """Keep arrays for backward; they are what the graph holds in memory."""
        self.saved = arrays

    def forward(self, *arrays: Any, **params: Any) -> Any:
        raise NotImplementedError

    def backward(self, grad_output: Any) -> tuple[Any, ...]:
        raise NotImplementedError

    @property
    def name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        shapes = ", ".join(f"{t.shape} {t.dtype}" for t in getattr(self, "inputs", ()))
        return f"<{self.name}({shapes})>"
