"""The same Python-source corpus as ``chars``, cut into word tokens, for a word-level language model.

A word-level vocabulary makes a language model's logit gradients small: the softmax spreads
its probability over every token of the vocabulary, and the gradient of a mean loss over
$N$ tokens reaches a non-target logit as $p / N$ (tinyamp/experiments/README.md).  Characters
give at most 96 symbols; words give thousands.

Tokens: each maximal run of letters, digits and underscores (``\\w+``), each other visible
character on its own, and each newline; spaces and tabs are dropped.  The vocabulary is
``"<unk>"`` (id 0) followed by the ``vocab_size - 1`` most frequent tokens of the whole corpus
(ties in the order of first appearance), so it is the same on every machine with the same
Python version.

    words = WordDataset.from_stdlib(vocab_size=4096)
    x, y = words.batch("train", context=4, batch_size=8192, rng=np.random.default_rng(0))
    # x: (8192, 4) ids of four consecutive tokens, y: (8192,) the id of the token after them
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from tinyamp.data.chars import char_corpus, split_train_val

TOKEN = re.compile(r"\w+|[^\w\s]|\n")
UNKNOWN = "<unk>"
ALL_MODULES = 10**8  # char_corpus's max_chars: more than every corpus module holds, so all of them


def word_tokens(text: str) -> list[str]:
    """``text`` cut into tokens: identifiers and numbers whole, other characters one by one, newlines kept."""
    return TOKEN.findall(text)


@dataclass
class WordDataset:
    """Word-token ids of the standard-library corpus, its vocabulary, and its train/validation split."""

    itos: list[str]
    train: np.ndarray
    val: np.ndarray
    unknown_share: float  # of the corpus's tokens, the share outside the vocabulary (id 0)

    @classmethod
    def from_stdlib(cls, vocab_size: int | None = 4096, val_fraction: float = 0.1) -> WordDataset:
        """Every module of ``chars.CORPUS_MODULES`` (about 160,000 tokens), first 90% train, last 10% validation.

        ``vocab_size=None`` keeps every distinct token (6,242 with Python 3.11, so 6,243 ids with ``<unk>``,
        which then never occurs); a larger number than that is refused, naming the largest.
        """
        if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int)
                                       or vocab_size < 2):  # fmt: skip
            raise ValueError(f"vocab_size must be an integer >= 2 (<unk> and one token) or None; got {vocab_size!r}")
        tokens = word_tokens(char_corpus(ALL_MODULES))
        counts = Counter(tokens)
        if vocab_size is not None and vocab_size > len(counts) + 1:
            raise ValueError(
                f"vocab_size={vocab_size} is more than this corpus holds: {len(counts):,} distinct tokens, so at most "
                f"{len(counts) + 1:,} ids with <unk>; pass at most that, or None for every token"
            )
        itos = [UNKNOWN] + [t for t, _ in counts.most_common(None if vocab_size is None else vocab_size - 1)]
        stoi = {t: i for i, t in enumerate(itos)}
        ids = np.fromiter((stoi.get(t, 0) for t in tokens), dtype=np.int64, count=len(tokens))
        train, val = split_train_val(ids, val_fraction)
        return cls(itos, train, val, float(np.mean(ids == 0)))

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def batch(
        self, split: str, context: int, batch_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """``x`` (batch_size, context): runs of consecutive ids at starts drawn by ``rng``; ``y``: the id after each."""
        if split not in ("train", "val"):
            raise ValueError(f"unknown split {split!r}; choose 'train' or 'val'")
        data = self.train if split == "train" else self.val
        if context < 1 or batch_size < 1 or len(data) < context + 1:
            raise ValueError(
                f"a batch of {batch_size} runs of {context} tokens needs context >= 1, batch_size >= 1 "
                f"and more than {context} tokens; the {split} split has {len(data)}"
            )
        starts = rng.integers(0, len(data) - context, size=batch_size)
        return data[starts[:, None] + np.arange(context)], data[starts + context]

    def __repr__(self) -> str:
        return (
            f"WordDataset(vocab {self.vocab_size}, train {len(self.train):,} tokens, val {len(self.val):,}, "
            f"{self.unknown_share:.1%} unknown)"
        )
