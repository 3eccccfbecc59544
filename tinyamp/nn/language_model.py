"""NeuralLanguageModel: the next-word model of Bengio et al. (2003), the first neural language model.

Each of the previous ``context`` tokens is looked up in one embedding table; the vectors,
concatenated, go through a tanh hidden layer, and a Linear layer gives one logit per token
of the vocabulary.  (The paper's optional direct connections from the embeddings to the
output are left out.)  The output layer is the point here: with thousands of tokens, the
softmax's gradient is spread over thousands of logits, most of them tiny.
"""

from __future__ import annotations

from typing import Any

from tinyamp.nn import checks
from tinyamp.nn.activation import Tanh
from tinyamp.nn.embedding import Embedding
from tinyamp.nn.linear import Linear
from tinyamp.nn.module import Module
from tinyamp.tensor import Tensor


class NeuralLanguageModel(Module):
    """``logits = out(tanh(hidden(concat(embedding[x_1], ..., embedding[x_context]))))``.

    Input: integer ids of shape (batch, context); output: logits of shape (batch, vocab_size).
    """

    def __init__(self, vocab_size: int, context: int = 4, dim: int = 64, hidden: int = 256) -> None:
        super().__init__()
        self.vocab_size = checks.size("NeuralLanguageModel", "vocab_size", vocab_size, 4096, at_least=2)
        self.context = checks.size("NeuralLanguageModel", "context", context, 4)
        self.dim = checks.size("NeuralLanguageModel", "dim", dim, 64)
        self.embedding = Embedding(vocab_size, dim)
        self.hidden = Linear(context * dim, hidden)
        self.act = Tanh()
        self.out = Linear(hidden, vocab_size)

    def forward(self, ids: Tensor | Any) -> Tensor:
        if len(ids.shape) != 2 or ids.shape[1] != self.context:
            raise ValueError(
                f"NeuralLanguageModel needs ids of shape (batch, {self.context}); got {tuple(ids.shape)}"
            )
        words = self.embedding(ids).reshape(ids.shape[0], self.context * self.dim)
        return self.out(self.act(self.hidden(words)))
