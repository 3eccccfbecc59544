"""The tasks: an MLP on the 8x8 digits, a character-level transformer and a word-level model on Python source.

A task knows its data, its model, its optimizer and how to score a model; it knows
nothing about precision (that is the regime's business).  Every regime of a comparison
gets the same initial weights (``tinyamp.manual_seed(seed)`` before the model is built)
and the same batches in the same order (a generator seeded with ``seed``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import tinyamp as ta
from tinyamp import nn, optim
from tinyamp.nn.module import Module
from tinyamp.tensor import Tensor

Batch = tuple[Tensor, Tensor]

# The demo's recipe for the digits MLP: the settings Keras gives anyone who chooses none.
# keras.optimizers.SGD(learning_rate=0.01, momentum=0.0) and Model.fit(batch_size=32) are Keras's
# documented defaults, and Keras applies no schedule unless one is passed (a constant rate).  The
# model keeps its PyTorch default initialization (nn.Linear's).  With these small plain-SGD steps
# BF16 weights lose nearly every update: tinyamp demo and benchmarks/failure_seeds.py measure it.
KERAS_SGD_DEFAULTS: dict[str, Any] = {"lr": 0.01, "momentum": 0.0, "batch_size": 32, "schedule": "constant"}


@dataclass
class DigitsMLP:
    """An MLP classifying the 1797 8x8 handwritten digits, trained with plain SGD.

    Defaults (see tinyamp/experiments/README.md for why): 64-256-256-10, batch 128, SGD with
    momentum 0.9 and learning rate 0.05, the rate decaying along a cosine to 0 over the run.
    """

    name: str = "mlp"
    hidden: tuple[int, ...] = (256, 256)
    batch_size: int = 128
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    schedule: str = "cosine"  # or "constant"
    optimizer: str = "sgd"  # or "adam"
    device: str = "cpu"
    seed: int = 0
    data: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        from tinyamp.data import load_digits

        for split in ("train", "test"):
            x, y = load_digits(split, seed=self.seed)
            self.data[f"x_{split}"], self.data[f"y_{split}"] = x, y

    def make_model(self) -> Module:
        """A fresh float32 MLP, initialized from ``seed`` (the same weights every call)."""
        ta.manual_seed(self.seed)
        return nn.MLP([64, *self.hidden, 10]).to(self.device)

    def make_optimizer(self, params: Any) -> optim.Optimizer:
        """SGD with momentum (or Adam) over `params`."""
        if self.optimizer == "adam":
            return optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
        return optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)

    def lr_at(self, step: int, steps: int) -> float:
        """Cosine decay from ``lr`` at step 0 to 0 at the end (or constant)."""
        if self.schedule == "constant":
            return self.lr
        return 0.5 * self.lr * (1.0 + math.cos(math.pi * step / steps))  # a Python float

    def batches(self, start: int = 0) -> Iterator[Batch]:
        """Random minibatches of the training split, the same sequence for every regime.

        ``start`` skips the first batches (a resumed run continues the same sequence).
        """
        rng = np.random.default_rng(self.seed)
        x, y = self.data["x_train"], self.data["y_train"]
        for _ in range(start):
            rng.integers(0, len(y), size=self.batch_size)
        while True:
            idx = rng.integers(0, len(y), size=self.batch_size)
            yield ta.tensor(x[idx], device=self.device), ta.tensor(y[idx], device=self.device)

    def loss(self, model: Module, batch: Batch) -> Tensor:
        """Mean cross-entropy of the batch."""
        x, y = batch
        return ta.cross_entropy(model(x), y)

    def evaluate(self, model: Module, precision: Callable[[], Any]) -> dict[str, float]:
        """Loss on the whole training split, loss and accuracy on the test split.

        ``precision()`` gives the forward-pass context (the regime's autocast): the model is
        scored in the precision it was trained in.
        """
        out = {}
        with ta.no_grad():
            for split in ("train", "test"):
                x = ta.tensor(self.data[f"x_{split}"], device=self.device)
                y = self.data[f"y_{split}"]
                with precision():
                    logits = model(x)
                    out[f"{split}_loss"] = float(ta.cross_entropy(logits, ta.tensor(y, device=self.device)).item())
                if split == "test":
                    out["accuracy"] = float((logits.numpy().argmax(axis=1) == y).mean())
        return out


@dataclass
class CharTransformer:
    """A small character-level GPT on the Python standard library's source, trained with Adam."""

    name: str = "transformer"
    chars: int = 200_000
    block_size: int = 32
    dim: int = 64
    heads: int = 4
    layers: int = 2
    batch_size: int = 32
    lr: float = 3e-3
    schedule: str = "cosine"
    device: str = "cpu"
    seed: int = 0
    eval_batches: int = 8
    dataset: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        from tinyamp.data import CharDataset

        self.dataset = CharDataset.from_stdlib(self.chars)

    def make_model(self) -> Module:
        """A fresh float32 CharTransformer, initialized from ``seed``."""
        ta.manual_seed(self.seed)
        vocab = self.dataset.vocab_size
        return nn.CharTransformer(vocab, self.block_size, self.dim, self.heads, self.layers).to(self.device)

    def make_optimizer(self, params: Any) -> optim.Optimizer:
        """Adam over `params`."""
        return optim.Adam(params, lr=self.lr)

    def lr_at(self, step: int, steps: int) -> float:
        """Cosine decay from ``lr`` to 0 over the run (or constant)."""
        if self.schedule == "constant":
            return self.lr
        return 0.5 * self.lr * (1.0 + math.cos(math.pi * step / steps))  # a Python float

    def batches(self, start: int = 0, split: str = "train", seed: int | None = None) -> Iterator[Batch]:
        """Random windows of ``split``; ``start`` skips the first batches (for a resumed run)."""
        rng = np.random.default_rng(self.seed if seed is None else seed)
        for _ in range(start):
            self.dataset.batch(split, self.block_size, self.batch_size, rng)
        while True:
            x, y = self.dataset.batch(split, self.block_size, self.batch_size, rng)
            yield ta.tensor(x, device=self.device), ta.tensor(y, device=self.device)

    def loss(self, model: Module, batch: Batch) -> Tensor:
        """Mean next-character cross-entropy over every position of the batch."""
        x, y = batch
        return ta.cross_entropy(model(x), y)

    def evaluate(self, model: Module, precision: Callable[[], Any]) -> dict[str, float]:
        """Mean loss over ``eval_batches`` fixed validation batches (the same for every regime)."""
        batches = self.batches(split="val", seed=12345)
        losses = []
        with ta.no_grad():
            for _ in range(self.eval_batches):
                with precision():
                    losses.append(float(self.loss(model, next(batches)).item()))
        return {"val_loss": float(np.mean(losses))}


@dataclass
class WordLM:
    """A word-level language model on the same Python source: a large softmax, hence small gradients.

    Defaults (see tinyamp/experiments/README.md for why): Bengio et al.'s (2003) model over
    the 4,096 most frequent tokens, the 4 previous tokens as context, Adam at 3e-3 decaying
    along a cosine, as the character transformer trains; a batch of 8,192 predicted tokens,
    fewer than the 12 x 1,024 = 12,288 that nanoGPT's GPT-2 recipe gives each GPU's backward pass.
    """

    name: str = "wordlm"
    vocab_size: int | None = 4096  # None: every distinct token of the corpus
    context: int = 4
    dim: int = 64
    hidden: int = 256
    batch_size: int = 8192
    lr: float = 3e-3
    schedule: str = "cosine"
    device: str = "cpu"
    seed: int = 0
    eval_batches: int = 2
    dataset: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        from tinyamp.data.words import WordDataset

        self.dataset = WordDataset.from_stdlib(self.vocab_size)
        self.vocab_size = self.dataset.vocab_size

    def make_model(self) -> Module:
        """A fresh float32 NeuralLanguageModel, initialized from ``seed``."""
        ta.manual_seed(self.seed)
        return nn.NeuralLanguageModel(self.vocab_size, self.context, self.dim, self.hidden).to(self.device)

    def make_optimizer(self, params: Any) -> optim.Optimizer:
        """Adam over `params`."""
        return optim.Adam(params, lr=self.lr)

    lr_at = CharTransformer.lr_at

    def batches(self, start: int = 0, split: str = "train", seed: int | None = None) -> Iterator[Batch]:
        """Random runs of ``split``; ``start`` skips the first batches (for a resumed run)."""
        rng = np.random.default_rng(self.seed if seed is None else seed)
        for _ in range(start):
            self.dataset.batch(split, self.context, self.batch_size, rng)
        while True:
            x, y = self.dataset.batch(split, self.context, self.batch_size, rng)
            yield ta.tensor(x, device=self.device), ta.tensor(y, device=self.device)

    loss = CharTransformer.loss
    evaluate = CharTransformer.evaluate


TASKS = {"mlp": DigitsMLP, "transformer": CharTransformer, "wordlm": WordLM}
