"""Causal self-attention: each position mixes the values of itself and earlier positions.

For one head, with $Q = x W_q$, $K = x W_k$, $V = x W_v$ and head size $d$,

$$\\mathrm{Attention}(x) = \\mathrm{softmax}\\left(\\frac{Q K^T}{\\sqrt d} + M\\right) V,$$

where the causal mask $M$ is 0 on and below the diagonal and "minus infinity" above
it, so position t gives weight exactly 0 to every position after t.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from tinyamp import backend, dtypes
from tinyamp.nn import checks
from tinyamp.nn.linear import Linear
from tinyamp.nn.module import Module
from tinyamp.ops import dropout, softmax
from tinyamp.tensor import Tensor


@functools.lru_cache(maxsize=32)
def causal_mask(size: int, dtype: np.dtype, device: str) -> Any:
    """A (size, size) array: 0 where key <= query, the most negative finite `dtype` value above.

    Why not -1e9, or -inf?  -1e9 does not fit in float16 (max 65504): it would be inf,
    and tinyamp refuses such a scalar (OverflowError).  An -inf *constant* turns into
    NaN as soon as a whole row is masked or anything multiplies it by 0.  The finite
    minimum works for every dtype: after adding a score, a float16 entry may still
    round to -inf (-65504 - 17 is past the float16 range), but only above the diagonal;
    the diagonal is never masked, so every row's maximum is finite and the masked
    weights come out of softmax as exactly $e^{-\\infty} = 0$ or $e^{-65504 - \\max} = 0$.
    The result is cached (it is read-only: the add in forward does not modify it).
    """
    above = np.triu(np.ones((size, size), dtype=bool), k=1)
    mask = np.where(above, dtypes.finfo(dtype).min, 0).astype(dtype)
    mask.flags.writeable = False
    return backend.to_device(mask, device)


class CausalSelfAttention(Module):
    """Multi-head causal self-attention on x of shape (B, T, dim).

    One fused projection ``qkv`` (dim -> 3 dim: rows [0, dim) of its weight give Q, then
    K, then V) is split into ``heads`` heads of size dim / heads, attention runs per head,
    the heads are concatenated and ``proj`` mixes them.  ``dropout`` applies to the
    attention weights and, as in GPT-2, to the output of ``proj``.
    """

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, dtype: Any = "float32") -> None:
        super().__init__()
        dim = checks.size("CausalSelfAttention", "dim", dim, 64)
        heads = checks.size("CausalSelfAttention", "heads", heads, 4)
        dropout = checks.real("CausalSelfAttention", "dropout", dropout, 0.1, 0.0, 1.0, high_open=True)
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads} (each head gets dim / heads features)")
        self.dim, self.heads, self.dropout = dim, heads, dropout
        self.qkv = Linear(dim, 3 * dim, dtype=dtype)
        self.proj = Linear(dim, dim, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        H = self.heads
        hd = C // H
        qkv = self.qkv(x)  # (B, T, 3C)

        def heads(part: Tensor) -> Tensor:  # (B, T, C) -> (B, H, T, hd)
            return part.reshape(B, T, H, hd).transpose(0, 2, 1, 3)

        q, k, v = heads(qkv[:, :, :C]), heads(qkv[:, :, C : 2 * C]), heads(qkv[:, :, 2 * C :])
        # scaling q (T*hd values) instead of the scores (T*T) is the same math on fewer elements;
        # 1/sqrt(hd) keeps the scores' variance near 1, so softmax is not saturated at init
        scores = (q * (1 / math.sqrt(hd))) @ k.transpose(0, 1, 3, 2)  # (B, H, T, T)
        scores = scores + causal_mask(T, scores.dtype, scores.device)  # an array: no gradient
        att = dropout(softmax(scores, axis=-1), self.dropout, self.training)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)  # heads side by side again
        return dropout(self.proj(y), self.dropout, self.training)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, dropout={self.dropout}"
