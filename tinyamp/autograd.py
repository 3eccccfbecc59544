"""Reverse-mode automatic differentiation: Function nodes and the backward walk.

Every differentiable operation is a subclass of :class:`Function` with two methods
on raw arrays (NumPy or CuPy):

* ``forward(*arrays, **params) -> array`` computes the output and may keep what the
  gradient needs with ``self.save_for_backward(...)``;
* ``backward(grad_output) -> tuple`` returns one gradient per input (or ``None`` for an
  input that needs none), each with the dtype and shape of that input.

Calling ``SomeFunction.apply(*tensors)`` runs the forward and, when gradients are
wanted, links the output tensor to the node.  ``Tensor.backward()`` then walks the
graph from the output to the leaves, *iteratively* (a recursive walk dies at a few
thousand nodes; a 100,000-op chain must backprop).
"""

from __future__ import annotations

import functools
import operator
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tinyamp.tensor import Tensor

_grad_enabled = True

# Observers of every op, called as hook(direction, fn, arrays) with direction "forward"
# (arrays = (output,)) or "backward" (arrays = the input gradients).  Empty unless an
# inspection tool such as tinyamp.inspect.find_overflow is active.
hooks: list[Callable[[str, Function, Any], None]] = []

# Tensor._make, registered by tinyamp.tensor when it is imported (tensor.py imports
# this module, so this one cannot import it back at the top).
_make_tensor: Callable[[Any, bool, Function | None], Tensor] = None  # type: ignore[assignment]


class GradientError(RuntimeError):
    """A backward that broke the rules (wrong dtype or shape), or a misuse of backward."""


def is_grad_enabled() -> bool:
    """True unless inside a ``no_grad()`` block."""
    return _grad_enabled


class _GradMode:
    """Context manager (and decorator) that switches graph recording on or off."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._previous: list[bool] = []

    def __enter__(self) -> None:
        global _grad_enabled
        self._previous.append(_grad_enabled)
        _grad_enabled = self.enabled

    def __exit__(self, *exc: object) -> None:
        global _grad_enabled
        _grad_enabled = self._previous.pop()

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _GradMode(self.enabled):
                return fn(*args, **kwargs)

        return wrapper


def no_grad() -> _GradMode:
    """Record no graph inside the block: outputs need no grad, nothing is saved.

    Use it for evaluation and for optimizer updates::

        with tinyamp.no_grad():
            logits = model(x)
    """
    return _GradMode(False)


def enable_grad() -> _GradMode:
    """Record the graph again inside a ``no_grad()`` block."""
    return _GradMode(True)


class Edge:
    """An input of a node that was itself computed: a graph edge that does not hold the array.

    A node's backward needs, from each computed input, only where to send its gradient
    (the input's ``creator``) and what that gradient must look like (shape and dtype).
    Holding the input *tensor* instead would keep its array alive until the graph goes,
    even when no backward needs it: the output of a Linear feeding a ReLU (which keeps its
    own output) would stay in memory for nothing, and memory would be twice what the
    saved-tensors report counts.  So, as in PyTorch, a node holds an ``Edge`` for each
    computed input and only what its ``backward`` saved; leaves (parameters, data) are
    held as the tensors themselves, since their ``.grad`` is filled in.

    Each tensor has at most one Edge (a tensor used twice is one edge, read by two nodes).
    """

    __slots__ = ("_ctx", "requires_grad", "shape", "dtype", "name")
    is_leaf = False

    def __init__(self, t: Tensor) -> None:
        data = t.data
        self._ctx = t._ctx
        self.requires_grad = t.requires_grad
        self.shape = data.shape
        self.dtype = data.dtype
        self.name = t.name

    @property
    def creator(self) -> Function | None:
        """The node that computed this input."""
        return self._ctx

    def __repr__(self) -> str:
        return f"<Edge from {self._ctx.name if self._ctx else '?'}: {self.shape} {self.dtype}>"


class Function:
    """A node of the graph: one operation, its inputs and what its backward needs.

    Attributes a student can inspect on ``tensor.creator``:

    * ``inputs``: the edges of the graph: leaf tensors as themselves, computed inputs as
      ``Edge`` objects (the node that made them, shape and dtype; not their arrays);
    * ``saved``: the arrays kept for backward (``None`` once backward has freed them);
    * ``needs_input_grad``: which inputs want a gradient.
    """

    inputs: tuple[Tensor | Edge, ...]
    saved: tuple[Any, ...] | None = ()
    needs_input_grad: tuple[bool, ...] = ()
    output_ref: Callable[[], Tensor | None] | None = None  # set by Tensor.retain_grad()

    @classmethod
    def apply(cls, *inputs: Tensor, **params: Any) -> Tensor:
        """Run ``forward`` on the inputs' arrays and, if needed, record the node."""
        fn = cls()
        try:
            out = fn.forward(*[t.data for t in inputs], **params)
        except ValueError as exc:  # e.g. shapes that do not broadcast: name the op and shapes
            shapes = ", ".join(f"{t.shape} {t.dtype}" for t in inputs)
            raise ValueError(f"{cls.__name__} got inputs of shapes {shapes}: {exc}") from None
        if hooks:
            for hook in hooks:
                hook("forward", fn, (out,))
        if _grad_enabled:
            needs = tuple(t.requires_grad for t in inputs)
            if True in needs:
                fn.inputs = tuple([t if t._ctx is None else t._edge or t.edge() for t in inputs])
                fn.needs_input_grad = needs
                return _make_tensor(out, True, fn)
        return _make_tensor(out, False, None)

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


def topological_order(root: Function) -> list[Function]:
    """Functions reachable from `root`, each before the functions that made its inputs.

    An iterative depth-first search: the explicit stack replaces Python's call stack,
    so graph depth is limited by memory, not by the recursion limit.
    """
    order: list[Function] = []
    visited: set[Function] = set()
    stack: list[tuple[Function, bool]] = [(root, False)]
    while stack:
        fn, children_done = stack.pop()
        if children_done:
            order.append(fn)
            continue
        # Mark a node when it is expanded, not when it is pushed: a node pushed early by
        # one consumer may also feed a consumer expanded later, and must be finished
        # (appended) before that consumer is.
        if fn in visited:
            continue
        visited.add(fn)
        stack.append((fn, True))
        for t in fn.inputs:
            parent = t._ctx
            if parent is not None and parent not in visited:
                stack.append((parent, False))
    order.reverse()  # post-order reversed: outputs first, leaves' creators last
    return order


def _check_gradient(fn: Function, index: int, grad: Any, tensor: Tensor | Edge) -> None:
    if grad.shape != tensor.shape or grad.dtype != tensor.dtype:
        raise GradientError(
            f"{fn.name}.backward returned a gradient of shape {grad.shape} and dtype {grad.dtype} "
            f"for input {index}, a tensor of shape {tensor.shape} and dtype {tensor.dtype}; "
            "a gradient must have the shape and dtype of its tensor"
        )


def backward(root: Tensor, grad: Any = None, retain_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) into ``leaf.grad`` for every leaf that requires grad.

    Leaf gradients *accumulate* (``+=``) across calls, as in PyTorch: zero them between
    steps.  Unless ``retain_graph`` is set, each node frees its saved arrays once used,
    so a second backward through the same graph is an error rather than a silent reuse.
    """
    from tinyamp.backend import get_array_module, is_array
    from tinyamp.ops.half_casts import half_arithmetic  # sums of float16 gradients, NumPy's bits but vectorized
    from tinyamp.tensor import Tensor

    if not root.requires_grad:
        raise GradientError(
            f"backward() on a tensor that does not require grad ({root!r}); make a leaf with "
            "requires_grad=True, and do not compute it inside no_grad()"
        )
    data = root.data
    if grad is None:
        if data.size != 1:
            raise GradientError(
                f"backward() without a seed gradient needs a scalar output, but this tensor has "
                f"shape {data.shape}; reduce it first (loss.sum().backward()) or pass "
                f"grad= an array of shape {data.shape}"
            )
        grad = get_array_module(data).ones_like(data)
    else:
        grad = grad.data if isinstance(grad, Tensor) else grad
        if not is_array(grad):
            raise GradientError(f"the seed gradient must be a Tensor or an array; got {type(grad).__name__}")
        if grad.shape != data.shape:
            raise GradientError(f"seed gradient has shape {grad.shape}, but the output has shape {data.shape}")
        grad = grad.astype(data.dtype, copy=True)  # never hand the caller's own array to a leaf

    if root._ctx is None:
        _accumulate_leaf(root, grad, set(), half_arithmetic)
        return

    handed: set[int] = set()  # ids of arrays already stored in some leaf's .grad
    grads: dict[Function, Any] = {root._ctx: grad}
    for fn in topological_order(root._ctx):
        g = grads.pop(fn, None)
        if g is None:  # no gradient reached this node (its consumers returned None)
            continue
        if fn.saved is None:
            raise GradientError(
                f"backward through {fn.name} a second time: its saved arrays were freed by the "
                "first backward. Pass retain_graph=True to the first call if you need two."
            )
        if fn.output_ref is not None:
            out = fn.output_ref()
            if out is not None:  # a copy: g may be a read-only view, or reach a leaf's .grad too
                out.grad = g.copy() if out.grad is None else half_arithmetic(operator.add, out.grad, g)
        input_grads = fn.backward(g)
        if hooks:
            for hook in hooks:
                hook("backward", fn, input_grads)
        release = not retain_graph and bool(fn.saved)
        for i, (t, gi) in enumerate(zip(fn.inputs, input_grads)):
            if gi is None or not t.requires_grad:
                continue
            _check_gradient(fn, i, gi, t)
            parent = t._ctx
            if parent is None:
                _accumulate_leaf(t, gi, handed, half_arithmetic)
            else:
                previous = grads.get(parent)
                grads[parent] = gi if previous is None else half_arithmetic(operator.add, previous, gi)
        if release:
            # Free what this node kept, and let go of its inputs: an intermediate tensor
            # that only the graph still refers to is freed now, not when the whole graph
            # goes, so activations are released as the walk passes them (as in PyTorch).
            # A node that kept nothing (an add, a cast) loses nothing and may be walked
            # again.
            fn.saved = None
            fn.inputs = ()


def _accumulate_leaf(t: Tensor, g: Any, handed: set[int], add: Callable[..., Any]) -> None:
    # Several leaves can receive the very same array (a + b hands g to both) or a view
    # of another array; a later in-place change of one .grad (unscaling, clipping) must
    # not leak into another, so such arrays are copied before they are stored.
    if t.grad is None:
        if id(g) in handed or g.base is not None:
            g = g.copy()
        handed.add(id(g))
        t.grad = g
    else:
        t.grad = add(operator.add, t.grad, g)


def walk(root: Tensor) -> Iterator[Function]:
    """Every Function in the graph that produced `root`, outputs first."""
    if root._ctx is not None:
        yield from topological_order(root._ctx)


def make_output_ref(t: Tensor) -> Callable[[], Tensor | None]:
    """A weak reference from a node to its output, used by Tensor.retain_grad()."""
    return weakref.ref(t)
