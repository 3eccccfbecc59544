"""A GPT-style decoder: pre-norm transformer blocks and a character-level language model."""

from __future__ import annotations

from typing import Any

from tinyamp.creation import arange
from tinyamp.nn import checks
from tinyamp.nn.activation import GELU
from tinyamp.nn.attention import CausalSelfAttention
from tinyamp.nn.container import ModuleList, Sequential
from tinyamp.nn.dropout import Dropout
from tinyamp.nn.embedding import Embedding
from tinyamp.nn.linear import Linear
from tinyamp.nn.module import Module
from tinyamp.nn.normalization import LayerNorm
from tinyamp.tensor import Tensor


class TransformerBlock(Module):
    """Pre-norm block: $x \\leftarrow x + \\mathrm{attn}(\\mathrm{ln_1}(x))$, then
    $x \\leftarrow x + \\mathrm{mlp}(\\mathrm{ln_2}(x))$ with mlp = Linear, GELU, Linear, Dropout.

    Normalizing the *input* of each branch (not the sum, as the original Transformer
    did) leaves an identity path from input to output, which keeps gradients of deep
    stacks well scaled.
    """

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 4, dropout: float = 0.0, dtype: Any = "float32") -> None:
        super().__init__()
        mlp_ratio = checks.size("TransformerBlock", "mlp_ratio", mlp_ratio, 4)
        self.ln1 = LayerNorm(dim, dtype=dtype)
        self.attn = CausalSelfAttention(dim, heads, dropout, dtype=dtype)
        self.ln2 = LayerNorm(dim, dtype=dtype)
        hidden = mlp_ratio * dim
        self.mlp = Sequential(
            Linear(dim, hidden, dtype=dtype), GELU(), Linear(hidden, dim, dtype=dtype), Dropout(dropout)
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharTransformer(Module):
    """A character-level GPT: logits (B, T, vocab) for the next character at each position.

    token embedding + position embedding -> dropout -> ``layers`` blocks -> LayerNorm ->
    Linear head.  Embeddings start as $N(0, 0.02^2)$, as in GPT-2.  Train it with
    ``cross_entropy(model(idx), targets)`` where ``targets`` is ``idx`` shifted by one.
    """

    def __init__(
        self, vocab_size: int, block_size: int, dim: int, heads: int, layers: int, dropout: float = 0.0,
        dtype: Any = "float32",
    ) -> None:  # fmt: skip
        super().__init__()
        layers = checks.size("CharTransformer", "layers", layers, 2, at_least=0)
        self.vocab_size, self.block_size = vocab_size, block_size
        self.tok_emb = Embedding(vocab_size, dim, std=0.02, dtype=dtype)
        self.pos_emb = Embedding(block_size, dim, std=0.02, dtype=dtype)
        self.drop = Dropout(dropout)
        self.blocks = ModuleList(TransformerBlock(dim, heads, dropout=dropout, dtype=dtype) for _ in range(layers))
        self.ln_f = LayerNorm(dim, dtype=dtype)
        self.head = Linear(dim, vocab_size, dtype=dtype)

    def forward(self, idx: Tensor | Any) -> Tensor:
        """`idx`: integer token ids of shape (B, T) with T <= block_size."""
        shape = idx.shape
        if len(shape) != 2 or shape[1] > self.block_size:
            raise ValueError(
                f"CharTransformer takes token ids of shape (batch, T) with T <= block_size={self.block_size}; "
                f"got shape {tuple(shape)}"
            )
        pos = arange(shape[1], device=self.pos_emb.weight.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))  # (B, T, dim) + (T, dim)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
