"""PyTorch beside tinyamp in gpu_check.py: the transformer of section 4, and the tiny MLP of section 5.

The twin is built from the same pieces as ``tinyamp.nn.CharTransformer``: token and
position embeddings, pre-norm blocks (LayerNorm, one fused QKV projection, attention written
out as softmax(Q K^T / sqrt(d) + mask) V, an output projection, LayerNorm, Linear, tanh-GELU,
Linear), a final LayerNorm and a Linear head, trained with AdamW(lr 3e-4) on next-token
cross-entropy.  FP32 runs without TF32; the AMP step is ``torch.autocast`` (float16) with a
``GradScaler``.  These sections run after tinyamp's, so PyTorch's allocator does not share
the GPU with CuPy's while tinyamp is measured.
"""

from __future__ import annotations

import gc
import math
import time
from typing import Any

import numpy as np
from gpu_device import CpuClock, TorchClock, measure
from gpu_report import Section, mib, ms, times
from gpu_sections import Context
from gpu_training import LR, import_torch


def twin_transformer(torch: Any, vocab: int, block: int, dim: int, heads: int, layers: int) -> Any:
    """A PyTorch module with CharTransformer's layers, in the same order."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))
            self.register_buffer("mask", torch.triu(torch.ones(block, block, dtype=torch.bool), 1), persistent=False)

        def forward(self, x: Any) -> Any:
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, heads, C // heads).transpose(1, 2) for t in (q, k, v))
            scores = (q * (1 / math.sqrt(C // heads))) @ k.transpose(-2, -1)
            scores = scores.masked_fill(self.mask[:T, :T], torch.finfo(scores.dtype).min)
            y = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
            x = x + self.proj(y)
            return x + self.mlp(self.ln2(x))

    class Twin(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(block, dim)
            self.blocks = nn.Sequential(*(Block() for _ in range(layers)))
            self.ln_f, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

        def forward(self, idx: Any) -> Any:
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            return self.head(self.ln_f(self.blocks(x)))

    return Twin()


def torch_transformer(ctx: Context, sec: Section) -> None:
    """PyTorch on section 4's transformer shape: FP32 (no TF32) against AMP, time and peak memory."""
    torch, cuda = import_torch(ctx)
    c = ctx.cfg.transformer
    device = "cuda" if cuda else "cpu"
    amp_dtype = torch.float16 if cuda else torch.bfloat16
    previous_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # FP32 products in FP32, as CuPy's are in section 4
    rng = np.random.default_rng(1)
    tokens = torch.from_numpy(rng.integers(0, c["vocab"], size=(c["batch"], c["block"] + 1))).to(device)
    idx, targets = tokens[:, :-1], tokens[:, 1:]
    sec.record("torch", torch.__version__)
    results = {}
    try:
        for regime in ("fp32", "amp"):
            step = _twin_step(torch, c, device, amp_dtype if regime == "amp" else None, idx, targets)
            cfg = ctx.cfg
            t = measure(TorchClock(torch) if cuda else CpuClock(), step, cfg.warmup, cfg.reps,
                        budget_s=cfg.step_budget_s)  # fmt: skip
            peak = _torch_peak(torch, step) if cuda else 0
            results[regime] = t.median_s, peak
            label = "PyTorch FP32 step (no TF32)" if regime == "fp32" else f"PyTorch AMP step ({amp_dtype} autocast)"
            sec.record(f"{regime}_step_s", t.median_s, label, shown=f"{ms(t.median_s)}, peak {mib(peak)}")
            sec.record(f"{regime}_peak_bytes", peak)
            del step
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous_tf32
    speedup = results["fp32"][0] / results["amp"][0]
    sec.record("speedup", speedup, "PyTorch speed-up (FP32 time / AMP time)", shown=times(speedup))
    if cuda:
        ratio = results["amp"][1] / max(results["fp32"][1], 1)
        sec.record("peak_ratio", ratio, "PyTorch peak memory, AMP / FP32", shown=f"{ratio:.3f}")
    mine = ctx.done("transformer")
    if mine is not None:
        ratio = mine.metrics["mixed_step_s"] / results["amp"][0]
        sec.record("tinyamp_over_torch", ratio, "tinyamp mixed step / PyTorch AMP step (time)",
                   shown=times(ratio), target="<= 2.5x", met=ratio <= 2.5)  # fmt: skip


def _twin_step(torch: Any, c: dict[str, int], device: str, amp_dtype: Any, idx: Any, targets: Any) -> Any:
    """One training step of a fresh twin: FP32 when `amp_dtype` is None, else autocast + GradScaler."""
    torch.manual_seed(0)
    model = twin_transformer(torch, c["vocab"], c["block"], c["dim"], c["heads"], c["layers"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    amp = amp_dtype is not None
    scaler = torch.amp.GradScaler(device, enabled=amp)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=amp_dtype, enabled=amp):
            logits = model(idx)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, c["vocab"]), targets.reshape(-1))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    return step


def _torch_peak(torch: Any, step: Any) -> int:
    """Bytes PyTorch's allocator held at the peak of one step, above what it held before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def torch_tiny(ctx: Context, sec: Section) -> None:
    """PyTorch AMP on section 5's tiny MLP: the host time per step, beside tinyamp's."""
    torch, cuda = import_torch(ctx)
    cfg = ctx.cfg
    device = "cuda" if cuda else "cpu"
    amp_dtype = torch.float16 if cuda else torch.bfloat16
    sizes, batch = cfg.tiny_sizes, cfg.tiny_batch
    rng = np.random.default_rng(2)
    x = torch.from_numpy(rng.standard_normal((batch, sizes[0]), dtype=np.float32)).to(device)
    y = torch.from_numpy(rng.integers(0, sizes[-1], size=batch)).to(device)
    torch.manual_seed(0)
    layers: list[Any] = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    scaler = torch.amp.GradScaler(device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=amp_dtype):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(cfg.warmup + 2):
        step()
    calls = 20 * cfg.reps
    clock = TorchClock(torch) if cuda else CpuClock()
    clock.sync()
    h0 = time.perf_counter()
    for _ in range(calls):
        step()
    clock.sync()
    wall = (time.perf_counter() - h0) / calls
    sec.record("amp_host_s", wall, "PyTorch AMP, tiny MLP: host wall time per step", shown=ms(wall))
    mine = ctx.done("overhead")
    if mine is not None:
        ratio = mine.metrics["mixed_wall_s"] / wall
        sec.record("tinyamp_over_torch", ratio, "tinyamp mixed / PyTorch AMP, host time per tiny step",
                   shown=times(ratio), target="<= 1.5x", met=ratio <= 1.5)  # fmt: skip
