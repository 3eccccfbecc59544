"""The training sections of gpu_check.py: MLP and transformer steps, framework overhead, PyTorch AMP.

Each takes the run's Context and the Section it fills in; the same code runs on the GPU
and, for ``--dry-run``, on NumPy at tiny sizes.
"""

from __future__ import annotations

import cProfile
import gc
import pstats
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from gpu_device import CpuClock, TorchClock, measure
from gpu_report import Section, mib, ms, times
from gpu_sections import Config, Context, Skip

import tinyamp as ta
from tinyamp import nn, optim
from tinyamp.amp import LossScaler, MasterWeights, autocast
from tinyamp.inspect import peak_memory, training_memory

LR = 0.01


# ---- 4./5. training steps: FP32 against mixed precision --------------------------------------------------------
def _fp32_step(model: nn.Module, opt: Any, loss_fn: Callable[[nn.Module], ta.Tensor]) -> Callable[[], None]:
    def step() -> None:
        opt.zero_grad()
        loss_fn(model).backward()
        opt.step()

    return step


def _mixed_step(model: nn.Module, opt: MasterWeights, scaler: LossScaler,
                loss_fn: Callable[[nn.Module], ta.Tensor], skipped: list[bool]) -> Callable[[], None]:  # fmt: skip
    def step() -> None:  # benchmarks/mp_step.py's step
        opt.zero_grad()
        with autocast():
            loss = loss_fn(model)
        scaler.scale_loss(loss).backward()
        skipped.append(scaler.step(opt).skipped)

    return step


def _held_bytes(model: nn.Module, opt: Any) -> int:
    return sum(n for by_dtype in training_memory(model, opt).values() for n in by_dtype.values())


def fp32_vs_mixed(ctx: Context, sec: Section, model: nn.Module, make_opt: Callable[[Any], Any],
                  loss_fn: Callable[[nn.Module], ta.Tensor], speedup_target: float | None = None,
                  peak_target: float | None = None) -> None:  # fmt: skip
    """Time and peak-measure an FP32 step, then cast the same model to FP16 and do the mixed-precision step."""
    dev, cfg = ctx.dev, ctx.cfg
    results = {}
    for regime in ("fp32", "mixed"):
        skipped: list[bool] = []
        if regime == "fp32":
            opt = make_opt(model.named_parameters())
            step = _fp32_step(model, opt, loss_fn)
        else:
            model.half()
            opt = MasterWeights(make_opt(model.named_parameters()), track_lost_updates=False, free_model_grads=True)
            step = _mixed_step(model, opt, LossScaler(), loss_fn, skipped)
        t = measure(dev.clock, step, cfg.warmup, cfg.reps, budget_s=cfg.step_budget_s)
        _, peak = peak_memory(step, device=dev.name)
        results[regime] = t.median_s, peak
        label = "FP32 step" if regime == "fp32" else "mixed-precision step (FP16 + FP32 masters + loss scaling)"
        sec.record(f"{regime}_step_s", t.median_s, label, shown=f"{ms(t.median_s)}, peak {mib(peak)}")
        sec.record(f"{regime}_step_min_s", t.min_s)
        sec.record(f"{regime}_step_host_s", t.host_s)
        sec.record(f"{regime}_samples", t.samples)
        sec.record(f"{regime}_peak_bytes", peak)
        sec.record(f"{regime}_held_bytes", _held_bytes(model, opt))
        if regime == "mixed":
            sec.record("mixed_skipped_steps_after_warmup", sum(skipped[cfg.warmup :]))
            sec.record("mixed_steps", len(skipped))
        del opt, step
        dev.free()
    speedup = results["fp32"][0] / results["mixed"][0]
    memory = results["mixed"][1] / max(results["fp32"][1], 1)
    has_speedup, has_peak = speedup_target is not None, peak_target is not None
    sec.record("speedup", speedup, "speed-up (FP32 time / mixed time)", shown=times(speedup),
               target=f"> {speedup_target:g}x" if has_speedup else "",
               met=speedup > speedup_target if has_speedup else None)  # fmt: skip
    sec.record("peak_ratio", memory, "peak memory, mixed / FP32", shown=f"{memory:.3f}",
               target=f"<= {peak_target:g}" if has_peak else "",
               met=memory <= peak_target if has_peak else None)  # fmt: skip
    held_mixed, held_fp32 = sec.metrics["mixed_held_bytes"], sec.metrics["fp32_held_bytes"]
    held = held_mixed / max(held_fp32, 1)
    sec.record("held_ratio", held, "held between steps (weights, masters, optimizer state), mixed / FP32",
               shown=f"{held:.3f} ({mib(held_mixed)} / {mib(held_fp32)})")  # fmt: skip
    skips = sec.metrics["mixed_skipped_steps_after_warmup"]
    sec.record("skips_row", skips, "mixed steps skipped (overflow) after warm-up", shown=f"{skips} of "
               f"{sec.metrics['mixed_steps'] - cfg.warmup}")  # fmt: skip


def mlp_data(cfg: Config, seed: int = 0, sizes: tuple[int, ...] | None = None,
             batch: int | None = None) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Random inputs (float32) and labels on the host, the same for tinyamp and PyTorch."""
    sizes, batch = sizes or cfg.mlp_sizes, batch or cfg.mlp_batch
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, sizes[0]), dtype=np.float32)
    return x, rng.integers(0, sizes[-1], size=batch)


Workload = tuple[nn.Module, Callable[[Any], Any], Callable[[nn.Module], ta.Tensor]]  # model, make_opt, loss


def mlp_workload(ctx: Context, sizes: tuple[int, ...], batch: int, seed: int = 0) -> Workload:
    """An MLP on random data with SGD momentum 0.9 and cross-entropy, on the run's device, in FP32."""
    dev = ctx.dev
    x, y = mlp_data(ctx.cfg, seed, sizes, batch)
    xt, yt = ta.tensor(dev.put(x), device=dev.name), ta.tensor(dev.put(y), device=dev.name)
    ta.manual_seed(0)
    model = nn.MLP(list(sizes)).to(dev.name)

    def make_opt(params: Any) -> optim.SGD:
        return optim.SGD(params, lr=LR, momentum=0.9)

    return model, make_opt, lambda m: ta.cross_entropy(m(xt), yt)


def transformer_workload(ctx: Context) -> Workload:
    """The CharTransformer of the run's configuration on random tokens, AdamW, next-token cross-entropy."""
    dev, c = ctx.dev, ctx.cfg.transformer
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, c["vocab"], size=(c["batch"], c["block"] + 1))
    idx = ta.tensor(dev.put(tokens[:, :-1]), device=dev.name)
    targets = ta.tensor(dev.put(tokens[:, 1:]), device=dev.name)
    ta.manual_seed(0)
    model = nn.CharTransformer(c["vocab"], c["block"], c["dim"], c["heads"], c["layers"]).to(dev.name)

    def make_opt(params: Any) -> optim.AdamW:
        return optim.AdamW(params, lr=3e-4)

    return model, make_opt, lambda m: ta.cross_entropy(m(idx), targets)


def mixed_step(workload: Workload) -> Callable[[], None]:
    """The workload's model cast to FP16 and its mixed-precision step (for the kernel tables)."""
    model, make_opt, loss_fn = workload
    model.half()
    opt = MasterWeights(make_opt(model.named_parameters()), track_lost_updates=False, free_model_grads=True)
    return _mixed_step(model, opt, LossScaler(), loss_fn, [])


def mlp(ctx: Context, sec: Section) -> None:
    """MLP training step, FP32 against mixed precision, SGD with momentum 0.9, cross-entropy."""
    cfg = ctx.cfg
    sec.record("sizes", list(cfg.mlp_sizes), "model",
               shown=f"MLP {'-'.join(map(str, cfg.mlp_sizes))}, batch {cfg.mlp_batch}, SGD momentum 0.9")  # fmt: skip
    model, make_opt, loss_fn = mlp_workload(ctx, cfg.mlp_sizes, cfg.mlp_batch)
    fp32_vs_mixed(ctx, sec, model, make_opt, loss_fn, speedup_target=6.0)


def tutorial8(ctx: Context, sec: Section) -> None:
    """Tutorial 8's MLP (1024-4096-4096-10, batch 1024 at full size): FP32 against mixed precision."""
    cfg = ctx.cfg
    sizes = "-".join(map(str, cfg.tutorial8_sizes))
    sec.record("sizes", list(cfg.tutorial8_sizes), "model",
               shown=f"MLP {sizes}, batch {cfg.tutorial8_batch}, SGD momentum 0.9")  # fmt: skip
    model, make_opt, loss_fn = mlp_workload(ctx, cfg.tutorial8_sizes, cfg.tutorial8_batch, seed=3)
    fp32_vs_mixed(ctx, sec, model, make_opt, loss_fn, speedup_target=1.0)


def transformer(ctx: Context, sec: Section) -> None:
    """CharTransformer training step, FP32 against mixed precision, AdamW, next-token cross-entropy."""
    c = ctx.cfg.transformer
    sec.record("config", dict(c), "model", shown=f"CharTransformer dim {c['dim']}, {c['layers']} layers, "
               f"{c['heads']} heads, context {c['block']}, vocab {c['vocab']}, batch {c['batch']}, AdamW")  # fmt: skip
    model, make_opt, loss_fn = transformer_workload(ctx)
    sec.record("parameters", model.num_parameters())
    fp32_vs_mixed(ctx, sec, model, make_opt, loss_fn, speedup_target=2.5, peak_target=0.75)


# ---- 6. framework overhead at small sizes ----------------------------------------------------------------------
def overhead(ctx: Context, sec: Section) -> None:
    """Host wall time of a tiny step, FP32 and mixed: Python and launches, not the GPU, set its pace.

    The GPU time of its kernels comes from the profiler (the kernels section): a spin kernel
    holding the GPU while the host queued the step measured the host's own pauses too.
    """
    dev, cfg = ctx.dev, ctx.cfg
    sizes, batch = list(cfg.tiny_sizes), cfg.tiny_batch
    sec.record("sizes", sizes, "model", shown=f"MLP {'-'.join(map(str, sizes))}, batch {batch}, FP32, SGD momentum")
    rng = np.random.default_rng(2)
    xt = ta.tensor(dev.put(rng.standard_normal((batch, sizes[0]), dtype=np.float32)), device=dev.name)
    yt = ta.tensor(dev.put(rng.integers(0, sizes[-1], size=batch)), device=dev.name)
    ta.manual_seed(0)
    model = nn.MLP(sizes).to(dev.name)
    step = _fp32_step(model, optim.SGD(model.named_parameters(), lr=LR, momentum=0.9),
                      lambda m: ta.cross_entropy(m(xt), yt))  # fmt: skip
    wall = _wall_per_step(dev, step, cfg)
    sec.record("host_wall_s", wall, "host wall time per FP32 step", shown=f"{ms(wall)} (mean of {20 * cfg.reps})")
    t = measure(dev.clock, step, warmup=0, reps=2 * cfg.reps)
    sec.record("event_s", t.median_s, "GPU time per step, events around it (launch gaps included)",
               shown=ms(t.median_s))  # fmt: skip
    model.half()
    skipped: list[bool] = []
    opt = MasterWeights(
        optim.SGD(model.named_parameters(), lr=LR, momentum=0.9), track_lost_updates=False, free_model_grads=True
    )
    mixed = _mixed_step(model, opt, LossScaler(), lambda m: ta.cross_entropy(m(xt), yt), skipped)
    wall = _wall_per_step(dev, mixed, cfg)
    sec.record("mixed_wall_s", wall, "host wall time per mixed-precision step, same model",
               shown=f"{ms(wall)} (mean of {20 * cfg.reps})")  # fmt: skip
    t = measure(dev.clock, mixed, cfg.warmup, 2 * cfg.reps)
    sec.record("mixed_host_s", t.host_s)
    sec.record("mixed_host_profile", host_profile(dev, mixed, steps=20 * cfg.reps))
    for row in sec.metrics["mixed_host_profile"][:15]:
        sec.say(f"{row['ms_per_step']:.4f} ms/step own time, {row['calls_per_step']:g} calls/step  {row['function']}")


def host_profile(dev: Any, step: Callable[[], None], steps: int) -> list[dict[str, Any]]:
    """Where a step's host time goes: cProfile over `steps` steps, the functions with the most own time.

    CuPy's launches are compiled code, so their cost shows as the own time of the Python function
    that makes them (an op's forward, a kernel wrapper).
    """
    profiler = cProfile.Profile()
    dev.clock.sync()
    profiler.enable()
    for _ in range(steps):
        step()
    dev.clock.sync()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda item: -item[1][2])[:40]
    return [{"function": f"{Path(file).name}:{line}({name})", "calls_per_step": calls / steps,
             "ms_per_step": 1e3 * own / steps, "cumulative_ms_per_step": 1e3 * cumulative / steps}
            for (file, line, name), (_, calls, own, cumulative, _) in rows]  # fmt: skip


def _wall_per_step(dev: Any, step: Callable[[], None], cfg: Config) -> float:
    """Mean wall time of 20 * reps back-to-back steps, the device synchronized before and after."""
    for _ in range(cfg.warmup + 2):
        step()
    calls = 20 * cfg.reps
    dev.clock.sync()
    h0 = time.perf_counter()
    for _ in range(calls):
        step()
    dev.clock.sync()
    return (time.perf_counter() - h0) / calls


def import_torch(ctx: Context) -> tuple[Any, bool]:
    """PyTorch, and whether the run is on CUDA; Skip when PyTorch is absent or sees no GPU the run uses."""
    try:
        import torch
    except ImportError as exc:
        raise Skip("PyTorch is not importable here") from exc
    cuda = ctx.dev.name == "cuda"
    if cuda and not torch.cuda.is_available():
        raise Skip("PyTorch sees no CUDA GPU")
    return torch, cuda


# ---- 7. PyTorch AMP on the same MLP (last: its allocator must not disturb CuPy's measurements) --------------
def torch_amp(ctx: Context, sec: Section) -> None:
    """PyTorch's AMP step (autocast + GradScaler, same MLP, data and SGD) against tinyamp's mixed step."""
    torch, cuda = import_torch(ctx)
    try:
        _torch_amp(ctx, sec, torch, cuda)
    finally:  # the model, optimizer and data were local to _torch_amp: give their blocks back
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()


def _torch_amp(ctx: Context, sec: Section, torch: Any, cuda: bool) -> None:
    cfg = ctx.cfg
    device, amp_dtype = ("cuda", torch.float16) if cuda else ("cpu", torch.bfloat16)
    sec.record("torch", torch.__version__)
    sec.record("amp", f"torch.autocast({device!r}, {amp_dtype}) + torch.amp.GradScaler, FP32 weights, SGD momentum")
    torch.manual_seed(0)
    layers: list[Any] = []
    for fan_in, fan_out in zip(cfg.mlp_sizes[:-1], cfg.mlp_sizes[1:]):
        layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    scaler = torch.amp.GradScaler(device)
    x_host, y_host = mlp_data(cfg)
    x, y = torch.from_numpy(x_host).to(device), torch.from_numpy(y_host).to(device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=amp_dtype):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    t = measure(TorchClock(torch) if cuda else CpuClock(), step, cfg.warmup, cfg.reps, budget_s=cfg.step_budget_s)
    sec.record("torch_amp_step_s", t.median_s, "PyTorch AMP step, same MLP", shown=ms(t.median_s))
    sec.record("torch_amp_samples", t.samples)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        sec.record("torch_amp_peak_bytes", peak, "PyTorch AMP peak memory of a step", shown=mib(peak))
    mlp_section = ctx.done("mlp")
    if mlp_section is None:
        raise RuntimeError("the mlp section did not succeed: no tinyamp time to compare with")
    ratio = mlp_section.metrics["mixed_step_s"] / t.median_s
    sec.record("tinyamp_over_torch", ratio, "tinyamp mixed step / PyTorch AMP step (time)", shown=times(ratio),
               target="<= 1.6x", met=ratio <= 1.6)  # fmt: skip
