"""Embedding: a table of learned vectors, one row per token id."""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyamp.nn import checks, init
from tinyamp.nn.module import Module
from tinyamp.nn.parameter import Parameter
from tinyamp.ops import embedding
from tinyamp.tensor import Tensor


class Embedding(Module):
    """$y_{\\ldots} = W[i_{\\ldots}]$: rows of ``weight`` (num_embeddings, dim) picked by integer ids.

    ``weight`` starts as samples of $N(0, \\mathrm{std}^2)$; ``std=1`` is PyTorch's default,
    and GPT-2 (hence :class:`CharTransformer`) uses ``std=0.02``.
    """

    def __init__(self, num_embeddings: int, dim: int, std: float = 1.0, dtype: Any = "float32") -> None:
        super().__init__()
        num_embeddings = checks.size("Embedding", "num_embeddings", num_embeddings, 96)
        dim = checks.size("Embedding", "dim", dim, 64)
        std = checks.real("Embedding", "std", std, 0.02, 0.0)
        self.num_embeddings, self.dim, self.std = num_embeddings, dim, std
        self.weight = init.normal_(Parameter(np.zeros((num_embeddings, dim)), dtype=dtype), 0.0, std)

    def forward(self, indices: Tensor | Any) -> Tensor:
        return embedding(self.weight, indices)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.dim}, std={self.std}"
