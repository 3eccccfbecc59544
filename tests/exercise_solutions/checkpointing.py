"""Exercise 7.1: activation checkpointing, one segment (tutorials/07_memory_and_checkpointing.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any  # hint: for your annotations

from tinyamp import autocast  # hint: autocast.current() is the autocast block active now (None outside one)
from tinyamp.function import Function  # hint: the node you write: forward and backward on arrays
from tinyamp.grad_mode import enable_grad, no_grad  # hint: forward without a graph, backward with one
from tinyamp.tensor import Tensor

# >>> solution only


class CheckpointedSegment(Function):
    """Forward: run the segment without a graph, keep its input.  Backward: run it again, backpropagate."""

    def forward(self, x: Any, *param_arrays: Any, segment: Callable[[Tensor], Tensor], params: list[Tensor]) -> Any:
        self.segment, self.params = segment, params
        self.block = autocast.current()  # backward runs after the `with autocast(...)` has ended: replay it then
        self.save_for_backward(x)  # all this node keeps: no activation of the segment
        with no_grad():
            return segment(Tensor(x)).data

    def backward(self, g: Any) -> tuple[Any, ...]:
        (x,) = self.saved
        x_again = Tensor(x, requires_grad=self.needs_input_grad[0])
        outer = [p.grad for p in self.params]  # gradients from elsewhere in the graph, kept aside
        for p in self.params:
            p.grad = None
        b = self.block  # a fresh block with the forward's dtype and policy (or none, as in the forward)
        replay = autocast.autocast(enabled=False) if b is None else autocast.autocast(b.dtype, policy=b.policy)
        with enable_grad(), replay:
            out = self.segment(x_again)  # the same operations on the same values, in the same dtypes: the same bits
        out.backward(g)
        grads = (x_again.grad, *[p.grad for p in self.params])
        for p, kept in zip(self.params, outer):
            p.grad = kept
        return grads
# <<< solution only


def checkpoint_segment(segment: Callable[[Tensor], Tensor], x: Tensor, params: Sequence[Tensor]) -> Tensor:
    """Exercise 7.1: ``segment(x)``, keeping only `x` for backward, with the same gradients.

    Task: return a Tensor with the values of ``segment(x)`` whose backward gives x and every
    parameter in `params` (the Tensors the segment reads) the gradients that backpropagating
    through ``segment(x)`` itself would give, bit for bit, while the forward keeps no
    activation of the segment alive: between forward and backward only x (and the output)
    are held.  The segment is deterministic (no dropout).  The grader compares gradients
    with the plain segment and measures the bytes held after the forward.

    Math: write a ``tinyamp.function.Function`` whose inputs are x and the parameters.  Its
    forward runs the segment under ``no_grad()`` (no graph, so the activations are freed as
    soon as they are used) and saves only x.  Its backward runs the segment again under
    ``enable_grad()`` on a fresh leaf holding x, calls ``out.backward(g)`` on that small
    graph, and returns the gradients of the fresh leaf and of each parameter.  A parameter's
    ``.grad`` may already hold a gradient from elsewhere in the graph: set it aside first and
    put it back after, so that the node returns only the segment's share.  One extra forward,
    for memory that no longer grows with the segment's depth.

    Mixed precision: x and the parameters may be float16, and the forward may run inside
    ``with autocast("float16"):`` (or "bfloat16"), while ``loss.backward()`` runs after that
    block has ended.  The recomputation must do what the forward did, in the same dtypes:
    keep x's dtype (no cast to float32), and in forward note the active block
    (``autocast.current()``, None outside autocast), then recompute inside a fresh
    ``autocast.autocast(block.dtype, policy=block.policy)`` (``autocast.autocast(enabled=False)``
    when there was none).  The grader draws float32 and float16 segments, with and without autocast.

    Read: tutorials/07_memory_and_checkpointing.py, section 3 (Checkpointing: keep less, compute again).

    Time: about 25 minutes of work once the reading is done (an estimate, for planning a lab).
    """
    # >>> exercise 7.1
    params = list(params)
    return CheckpointedSegment.apply(x, *params, segment=segment, params=params)
    # <<< exercise 7.1
