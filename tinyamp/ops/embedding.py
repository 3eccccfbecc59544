"""Embedding lookup: rows of a table picked by integer indices.

The gradient of the table is a scatter-add: a row used k times in a batch (a common
character, say) receives the sum of its k gradients.
"""

from __future__ import annotations

from typing import Any

from tinyamp import backend, kernels
from tinyamp.backend import get_array_module
from tinyamp.dtypes import accumulation_dtype
from tinyamp.function import Function
from tinyamp.tensor import Tensor


class Embedding(Function):
    """$y_{\\ldots} = W[i_{\\ldots}]$ for a table W (num, dim) and indices i."""

    def forward(self, weight: Any, indices: Any) -> Any:
        self.save_for_backward(indices)
        self.meta = (weight.shape, weight.dtype)
        return weight[indices]

    def backward(self, g: Any) -> tuple[Any, None]:
        (indices,) = self.saved
        shape, dtype = self.meta
        xp = get_array_module(g)
        # A row picked by many positions sums many gradients: in float32 for a 16-bit table,
        # rounded once (a float16 running sum of 4096 ones stops at 2048).
        grad = xp.zeros(shape, dtype=accumulation_dtype(dtype))
        kernels.scatter_add(grad, indices.reshape(-1), kernels.cast(g.reshape(-1, shape[1]), grad.dtype))
        return kernels.cast(grad, dtype), None


def embedding(weight: Tensor, indices: Tensor | Any) -> Tensor:
    """Rows of `weight` (num_embeddings, dim) at integer `indices` (any shape)."""
    if not isinstance(indices, Tensor):
        indices = Tensor(indices, device=weight.device)
    if indices.dtype.kind not in "iu":
        raise TypeError(f"embedding indices must be integers; got dtype {indices.dtype}")
    if weight.ndim != 2:
        raise ValueError(f"embedding needs a 2-D table (num_embeddings, dim); got shape {weight.shape}")
    n = weight.shape[0]
    if indices.size:  # NumPy would wrap a negative index silently; an embedding index is a token id.
        # On a GPU the check is answered at the next read (backend.defer_check).
        checked = kernels.call("check_in_range", backend.check_in_range, indices.data, n, "embedding indices")
        indices = Tensor._make(checked, False, None)  # wrapped, not copied (Tensor() would copy)
    return Embedding.apply(weight, indices)
