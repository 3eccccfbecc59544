"""Reverse-mode automatic differentiation: the backward walk over a graph of Function nodes.

A tensor made by an operation points to the node that made it (``tensor.creator``, a
:class:`~tinyamp.function.Function`); the node points to its inputs.  ``backward(loss)``
visits the nodes from the loss to the leaves, each after every node that uses its output,
asks each for its inputs' gradients, adds up the gradients that meet at a tensor used
twice, and leaves the sums in the leaves' ``.grad``.

The walk is iterative (a 100,000-op chain must backprop; Python's recursion stops at a few
thousand).  It reads tensors through ``data``, ``grad``, ``requires_grad`` and ``_ctx``
only, and never imports the Tensor class.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from tinyamp import backend, kernels

# Observers of every op, called as hook(direction, fn, arrays) with direction "forward"
# (arrays = (output,)) or "backward" (arrays = the input gradients).  Empty unless an
# inspection tool such as tinyamp.inspect.find_overflow is active.
hooks: list[Callable[[str, Any, Any], None]] = []


class GradientError(RuntimeError):
    """A backward that broke the rules (wrong dtype or shape), or a misuse of backward."""


# ---- the graph ---------------------------------------------------------------------------------------
class Edge:
    """A computed input of a node: where its gradient goes (its creator) and its shape and dtype.

    Not its array: a node that held the tensor would keep every activation alive until the
    graph goes, even those no backward needs (a Linear's output feeding a ReLU, which saves
    its own output).  Leaf inputs are held as tensors, since their ``.grad`` is filled in.
    """

    __slots__ = ("_ctx", "requires_grad", "shape", "dtype", "name")
    is_leaf = False

    def __init__(self, t: Any) -> None:
        self._ctx = t._ctx
        self.requires_grad = t.requires_grad
        self.shape = t.data.shape
        self.dtype = t.data.dtype
        self.name = t.name

    @property
    def creator(self) -> Any:
        """The node that computed this input."""
        return self._ctx

    def __repr__(self) -> str:
        return f"<Edge from {self._ctx.name if self._ctx else '?'}: {self.shape} {self.dtype}>"


def topological_order(root: Any) -> list[Any]:
    """The nodes reachable from node `root`, each before the nodes that made its inputs.

    A depth-first search with an explicit stack: a node is finished (appended) after the
    nodes of all its inputs, so the reversed order puts every node before those it reads from.
    """
    order, visited = [], set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        fn, inputs_done = stack.pop()
        if inputs_done:
            order.append(fn)
        elif fn not in visited:  # marked when expanded, not when pushed: a node can be pushed twice
            visited.add(fn)
            stack.append((fn, True))
            for t in fn.inputs:
                if t._ctx is not None and t._ctx not in visited:
                    stack.append((t._ctx, False))
    order.reverse()
    return order


def backward(root: Any, grad: Any = None, retain_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) into ``leaf.grad`` for every leaf that requires grad.

    Leaf gradients *accumulate* (``+=``) across calls, as in PyTorch: zero them between
    steps.  Unless ``retain_graph`` is set, each node frees its saved arrays once used, so
    a second backward through the same graph is an error rather than a silent reuse.
    """
    grad = _seed(root, grad)
    if root._ctx is None:
        _accumulate_leaf(root, grad, set())
        return
    grads, handed = {root._ctx: grad}, set()  # handed: ids of arrays already stored in some .grad
    for fn in topological_order(root._ctx):
        g = grads.pop(fn, None)
        if g is None:  # no gradient reached this node (its consumers returned None)
            continue
        if fn.saved is None:
            raise GradientError(
                f"backward through {fn.name} a second time: its saved arrays were freed by the first "
                "backward. Pass retain_graph=True to the first call if you need two."
            )
        if fn.output_ref is not None:  # retain_grad() asked for the gradient of this node's output
            _keep_retained(fn, g)
        input_grads = fn.backward(g)
        for hook in hooks:
            hook("backward", fn, input_grads)
        for i, (t, gi) in enumerate(zip(fn.inputs, input_grads)):
            if gi is None or not t.requires_grad:
                continue
            gi = _checked(fn, i, gi, t)
            if t._ctx is None:
                _accumulate_leaf(t, gi, handed)
            else:  # a tensor used twice: its two gradients add up (the chain rule's sum over paths)
                grads[t._ctx] = gi if t._ctx not in grads else _sum(grads[t._ctx], gi)
        if not retain_graph and fn.saved:
            # Let go of what this node kept, and of its inputs: an activation that only the graph
            # still refers to is freed now, as the walk passes it, not when the whole graph goes.
            fn.saved, fn.inputs = None, ()


def _seed(root: Any, grad: Any) -> Any:
    """The gradient backward starts from: 1 for a scalar root, or the caller's array (copied)."""
    if not root.requires_grad:
        raise GradientError(
            f"backward() on a tensor that does not require grad ({root!r}); make a leaf with "
            "requires_grad=True, and do not compute it inside no_grad()"
        )
    data = root.data
    if grad is None:
        if data.size != 1:
            raise GradientError(
                f"backward() without a seed gradient needs a scalar output, but this tensor has shape "
                f"{data.shape}; reduce it first (loss.sum().backward()) or pass grad= an array of shape {data.shape}"
            )
        return backend.get_array_module(data).ones_like(data)
    if not backend.is_array(grad):
        grad = getattr(grad, "data", grad)  # a Tensor: its array
    if not backend.is_array(grad):
        raise GradientError(f"the seed gradient must be a Tensor or an array; got {type(grad).__name__}")
    if grad.shape != data.shape:
        raise GradientError(f"seed gradient has shape {grad.shape}, but the output has shape {data.shape}")
    return grad.astype(data.dtype, copy=True)  # never hand the caller's own array to a leaf


def _as_array(g: Any) -> Any:
    """`g` as an array: NumPy's arithmetic on 0-d arrays returns scalars, which cannot be changed in place."""
    return np.asarray(g) if isinstance(g, np.generic) else g


def _sum(a: Any, b: Any) -> Any:
    """Two gradients of one tensor, added (for float16, in float32 and rounded once, as NumPy does)."""
    return _as_array(kernels.add(a, b))


def _checked(fn: Any, index: int, grad: Any, t: Any) -> Any:
    """`grad` as an array, checked against its tensor."""
    grad = _as_array(grad)
    if grad.shape != t.shape or grad.dtype != t.dtype:
        raise GradientError(
            f"{fn.name}.backward returned a gradient of shape {grad.shape} and dtype {grad.dtype} for input "
            f"{index}, a tensor of shape {t.shape} and dtype {t.dtype}; a gradient must have the shape "
            "and dtype of its tensor"
        )
    return grad


def _accumulate_leaf(t: Any, g: Any, handed: set[int]) -> None:
    # Several leaves can receive the very same array (a + b hands g to both) or a view of
    # another array; a later in-place change of one .grad (unscaling, clipping) must not
    # leak into another, so such arrays are copied before they are stored.
    if t.grad is None:
        if id(g) in handed or g.base is not None:
            g = g.copy()
        handed.add(id(g))
        t.grad = g
    else:
        t.grad = _sum(t.grad, g)


def _keep_retained(fn: Any, g: Any) -> None:
    """Store the gradient of a node's output in that tensor's .grad (if the tensor still exists)."""
    out = fn.output_ref()
    if out is not None:  # a copy: g may be a read-only view, or reach a leaf's .grad too
        out.grad = g.copy() if out.grad is None else _sum(out.grad, g)


def walk(root: Any) -> Iterator[Any]:
    """Every Function in the graph that produced the tensor `root`, outputs first."""
    if root._ctx is not None:
        yield from topological_order(root._ctx)


def make_output_ref(t: Any) -> Callable[[], Any]:
    """A weak reference from a node to its output, used by Tensor.retain_grad()."""
    return weakref.ref(t)
