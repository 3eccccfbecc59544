"""Exercise 7.1: activation checkpointing, one segment (tutorials/07_memory_and_checkpointing.py).

Write the stub below; ``tinyamp exercises check`` grades it (``--only 7.1``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any  # noqa: F401  (for your annotations)

from tinyamp import autocast  # noqa: F401  (autocast.current() is the autocast block active now (None outside one))
from tinyamp.function import Function  # noqa: F401  (the node you write: forward and backward on arrays)
from tinyamp.grad_mode import enable_grad, no_grad  # noqa: F401  (forward without a graph, backward with one)
from tinyamp.tensor import Tensor


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
    raise NotImplementedError("Exercise 7.1: checkpointing: same gradients, lower peak")
