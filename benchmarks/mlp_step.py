"""Training step of an MLP 784-1024-1024-10, batch 256, SGD, FP32 on NumPy.

Three contenders doing the same math on the same data:
* tinyamp (nn.MLP, cross_entropy, optim.SGD),
* a hand-written NumPy step (the floor for any NumPy framework),
* PyTorch on the CPU, when it is installed (a peer, never a dependency).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import tinyamp as ta
from tinyamp import nn, optim

SIZES = (784, 1024, 1024, 10)
BATCH = 256
LR = 0.01


def make_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], size=BATCH)
    return x, y


def tinyamp_step(x: np.ndarray, y: np.ndarray) -> Any:
    ta.manual_seed(0)
    model = nn.MLP(list(SIZES))
    opt = optim.SGD(model.parameters(), lr=LR)
    xt, yt = ta.tensor(x), ta.tensor(y)

    def step() -> None:
        opt.zero_grad()
        loss = ta.cross_entropy(model(xt), yt)
        loss.backward()
        opt.step()

    return step


def numpy_step(x: np.ndarray, y: np.ndarray) -> Any:
    """The same step written by hand: W stored (out, in), y = x W^T + b."""
    rng = np.random.default_rng(0)
    params = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:]):
        bound = 1 / np.sqrt(fan_in)
        w = rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32)
        b = rng.uniform(-bound, bound, fan_out).astype(np.float32)
        params.append((w, b))
    rows = np.arange(BATCH)

    def step() -> None:
        acts = [x]
        h = x
        for i, (w, b) in enumerate(params):
            h = h @ w.T
            h += b
            if i < len(params) - 1:
                h = np.maximum(h, 0)
            acts.append(h)
        z = h - h.max(axis=1, keepdims=True)
        e = np.exp(z)
        p = e / e.sum(axis=1, keepdims=True)
        g = p
        g[rows, y] -= 1
        g /= BATCH
        for i in range(len(params) - 1, -1, -1):
            w, b = params[i]
            a = acts[i]
            gw = g.T @ a
            gb = g.sum(axis=0)
            if i > 0:
                g = g @ w
                g *= acts[i] > 0
            w -= LR * gw
            b -= LR * gb

    return step


def torch_step(x: np.ndarray, y: np.ndarray) -> Any | None:
    try:
        import torch
    except ImportError:
        return None
    torch.manual_seed(0)
    layers: list[Any] = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:]):
        layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step() -> None:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xt), yt)
        loss.backward()
        opt.step()

    return step
