"""Framework overhead per op on tiny tensors: forward + backward, microseconds per op.

A chain of N cheap elementwise ops on 4-element tensors, then one backward.  The array
math is negligible at this size, so the time is the framework's own: creating nodes,
dispatching, walking the graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import tinyamp as ta

CHAIN = 200


def tinyamp_chain() -> Any:
    x = ta.tensor(np.ones(4, np.float32), requires_grad=True)
    w = ta.tensor(np.full(4, 0.5, np.float32), requires_grad=True)

    def run() -> None:
        h = x
        for _ in range(CHAIN // 2):
            h = (h * w).tanh()
        h.sum().backward()
        x.grad = w.grad = None

    return run


def torch_chain() -> Any | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    x = torch.ones(4, requires_grad=True)
    w = torch.full((4,), 0.5, requires_grad=True)

    def run() -> None:
        h = x
        for _ in range(CHAIN // 2):
            h = (h * w).tanh()
        h.sum().backward()
        x.grad = w.grad = None

    return run
