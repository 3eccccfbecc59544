"""Peak memory of one training step of a deep MLP, by depth and precision.

Blocks are Linear(width, width) + ReLU, batch large against the width so activations,
not weights, dominate (as in a transformer on long sequences).  Three regimes: FP32,
mixed precision (FP16 activations, FP32 masters, loss scaling), and mixed precision with
activation checkpointing every round(sqrt(depth)) blocks.  Peak bytes are measured with
tracemalloc over the whole step (forward, backward, optimizer), above what was
allocated before it.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

import tinyamp as ta
from tinyamp import nn, optim
from tinyamp.amp import LossScaler, MasterWeights, autocast
from tinyamp.inspect import peak_memory, saved_tensors

WIDTH, BATCH, CLASSES = 256, 2048, 10


def build(depth: int, regime: str) -> Any:
    """A step function for `regime` in "fp32", "mixed", "mixed+checkpoint"."""
    ta.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(depth)]
    head = nn.Linear(WIDTH, CLASSES)
    model = nn.Sequential(*blocks, head)
    rng = np.random.default_rng(0)
    x = ta.tensor(rng.standard_normal((BATCH, WIDTH)), dtype="float32")
    y = ta.tensor(rng.integers(0, CLASSES, BATCH))
    every = max(1, round(math.sqrt(depth)))
    if regime == "fp32":
        opt = optim.SGD(model.parameters(), lr=0.01)

        def step() -> None:
            opt.zero_grad()
            ta.cross_entropy(model(x), y).backward()
            opt.step()

        return step, model, x
    model.half()
    opt = MasterWeights(optim.SGD(model.parameters(), lr=0.01), track_lost_updates=False)
    scaler = LossScaler()
    checkpointed = regime == "mixed+checkpoint"

    def forward() -> ta.Tensor:
        h = ta.checkpoint_sequential(blocks, every, x) if checkpointed else nn.Sequential(*blocks)(x)
        return head(h)

    def step() -> None:
        opt.zero_grad()
        with autocast():
            loss = ta.cross_entropy(forward(), y)
        scaler.scale_loss(loss).backward()
        scaler.step(opt)

    step.forward = forward  # type: ignore[attr-defined]
    return step, model, x


def measure(depth: int, regime: str, repeats: int = 3) -> dict[str, float]:
    step, model, x = build(depth, regime)
    step()  # first step: optimizer state and master gradients come into being
    peaks, times = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        _, peak = peak_memory(step)
        times.append(time.perf_counter() - start)
        peaks.append(peak)
    if regime == "fp32":
        saved = saved_tensors(model(x)).total_bytes
    else:
        with autocast():
            saved = saved_tensors(step.forward()).total_bytes  # type: ignore[attr-defined]
    return {"peak_mb": float(np.median(peaks)) / 1e6, "step_ms": 1e3 * float(np.median(times)), "saved_mb": saved / 1e6}


def sweep(depths: tuple[int, ...] = (4, 9, 16, 25, 36)) -> dict[str, list[float]]:
    """Peak step memory (MB) of each regime at each depth (one measured step each)."""
    out: dict[str, list[float]] = {"depth": list(depths)}
    for regime in ("fp32", "mixed", "mixed+checkpoint"):
        out[regime] = [measure(d, regime, repeats=1)["peak_mb"] for d in depths]
    return out


def plot_sweep(table: dict[str, list[float]], path: str) -> bool:
    """Peak memory against depth, one line per regime; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for regime in ("fp32", "mixed", "mixed+checkpoint"):
        ax.plot(table["depth"], table[regime], marker="o", label=regime)
    ax.set_xlabel("depth (Linear+ReLU blocks)")
    ax.set_ylabel("peak step memory (MB, measured)")
    ax.set_title(f"One training step, width {WIDTH}, batch {BATCH}: checkpoint every round(sqrt(depth))")
    ax.title.set_fontsize(9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
