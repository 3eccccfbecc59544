"""Mixed-precision training step of the MLP 784-1024-1024-10, batch 256, on NumPy.

Full mixed precision as the paper describes it: FP16 weights and activations (the
model's parameters are float16 arrays), FP32 master weights updated by SGD, dynamic
loss scaling, and every matrix product as FP16 x FP16 -> FP32-accumulate -> FP16.
Compared side by side with the FP32 step of mlp_step.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mlp_step import BATCH, LR, SIZES

import tinyamp as ta
from tinyamp import nn, optim
from tinyamp.amp import LossScaler, MasterWeights, autocast
from tinyamp.inspect import saved_tensors


def mixed_precision_step(x: np.ndarray, y: np.ndarray, track_lost_updates: bool = False,
                         sizes: tuple[int, ...] = SIZES) -> Any:  # fmt: skip
    ta.manual_seed(0)
    model = nn.MLP(list(sizes)).half()
    opt = MasterWeights(optim.SGD(model.parameters(), lr=LR), track_lost_updates=track_lost_updates)
    scaler = LossScaler()
    xt, yt = ta.tensor(x), ta.tensor(y)

    def step() -> None:
        opt.zero_grad()
        with autocast():
            loss = ta.cross_entropy(model(xt), yt)
        scaler.scale_loss(loss).backward()
        scaler.step(opt)

    return step


def saved_bytes(x: np.ndarray) -> tuple[int, int]:
    """Bytes the graph of the model's output holds: (FP32 model, mixed precision)."""
    ta.manual_seed(0)
    model = nn.MLP(list(SIZES))
    xt = ta.tensor(x[:BATCH])
    fp32 = saved_tensors(model(xt)).total_bytes
    model.half()
    with autocast():
        mixed = saved_tensors(model(xt)).total_bytes
    return fp32, mixed


def time_breakdown(x: np.ndarray, y: np.ndarray, steps: int = 15) -> dict[str, float]:
    """Median milliseconds of each phase of the mixed-precision step: where the time goes."""
    import time

    ta.manual_seed(0)
    model = nn.MLP(list(SIZES)).half()
    opt = MasterWeights(optim.SGD(model.parameters(), lr=LR), track_lost_updates=False)
    scaler = LossScaler()
    xt, yt = ta.tensor(x), ta.tensor(y)
    phases: dict[str, list[float]] = {"forward (FP16)": [], "backward (FP16)": [], "unscale + inf check": [],
                                      "FP32 master update + FP16 copy": []}  # fmt: skip
    for i in range(steps + 2):
        opt.zero_grad()
        t0 = time.perf_counter()
        with autocast():
            loss = ta.cross_entropy(model(xt), yt)
        t1 = time.perf_counter()
        scaler.scale_loss(loss).backward()
        t2 = time.perf_counter()
        scaler.unscale_(opt)
        t3 = time.perf_counter()
        scaler.step(opt)
        t4 = time.perf_counter()
        if i >= 2:  # warm-up steps excluded
            for name, dt in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                phases[name].append(1e3 * dt)
    return {name: float(np.median(v)) for name, v in phases.items()}


def cast_time(x: np.ndarray, y: np.ndarray, steps: int = 15) -> tuple[float, float]:
    """Median milliseconds per mixed-precision step spent in FP16 <-> FP32 conversions, and per step.

    Times every call of the two conversion functions (``widen_float16``, ``round_to_float16``)
    by wrapping them in tinyamp/engine/fast/casts.py, where ``kernels.cast`` calls them, for the
    duration of this measurement only.
    """
    import time

    from tinyamp.engine.fast import casts

    spent = [0.0]

    def timed(fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - t0

        return wrapper

    names = ("widen_float16", "round_to_float16")
    originals = {(casts, name): getattr(casts, name) for name in names}
    step = mixed_precision_step(x, y)
    per_step, in_casts = [], []
    try:
        for (module, name), fn in originals.items():
            setattr(module, name, timed(fn))
        for i in range(steps + 2):
            spent[0] = 0.0
            t0 = time.perf_counter()
            step()
            if i >= 2:  # warm-up steps excluded
                per_step.append(1e3 * (time.perf_counter() - t0))
                in_casts.append(1e3 * spent[0])
    finally:
        for (module, name), fn in originals.items():
            setattr(module, name, fn)
    return float(np.median(in_casts)), float(np.median(per_step))
