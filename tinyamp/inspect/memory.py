"""Memory of a training step, measured and itemized.

Two kinds of numbers:

* ``training_memory(model, optimizer)``: what is *held* between steps, itemized from the
  arrays themselves: parameters by dtype (FP16 copies), FP32 master weights, optimizer
  state (momentum, Adam moments), gradients.
* ``peak_memory(fn)``: the *peak* bytes allocated while `fn` runs (a whole training step),
  measured for real: on the CPU by ``tracemalloc``, which sees every NumPy array
  allocation; on a GPU by a CuPy memory hook that follows the memory pool.
"""

from __future__ import annotations

import contextlib
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

from tinyamp import backend


def _array_bytes(arrays: list[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    seen: set[int] = set()
    for a in arrays:
        if a is None or not backend.is_array(a) or id(a) in seen:
            continue
        seen.add(id(a))
        out[a.dtype.name] = out.get(a.dtype.name, 0) + int(a.nbytes)
    return out


def training_memory(model: Any, optimizer: Any = None) -> dict[str, dict[str, int]]:
    """Bytes held by the model and the optimizer, by role and dtype.

    Roles: "parameters" (what the model computes with), "master weights" (FP32 copies
    kept by a MasterWeights wrapper), "optimizer state" (moments), "gradients" (model and
    master ``.grad`` arrays present now).
    """
    params = model.parameters()
    report = {"parameters": _array_bytes([p.data for p in params])}
    grads = [p.grad for p in params]
    inner = optimizer
    masters = getattr(optimizer, "master_params", None)
    if masters is not None:
        own = {id(p) for p in params}
        report["master weights"] = _array_bytes([m.data for m in masters if id(m) not in own])
        grads += [m.grad for m in masters if id(m) not in own]
        inner = optimizer.optimizer
    if inner is not None:
        report["optimizer state"] = _array_bytes([v for s in inner.state for v in s.values()])
    report["gradients"] = _array_bytes(grads)
    return report


def format_training_memory(report: dict[str, dict[str, int]]) -> str:
    """The report of training_memory as a printable table."""
    lines = [f"{'held by':<18}{'dtype':<10}{'bytes':>14}"]
    for role, by_dtype in report.items():
        for dtype, n in by_dtype.items():
            lines.append(f"{role:<18}{dtype:<10}{n:>14,}")
    total = sum(n for by in report.values() for n in by.values())
    lines.append(f"{'total':<28}{total:>14,}")
    return "\n".join(lines)


def peak_memory(fn: Callable[[], Any], device: str = "cpu") -> tuple[Any, int]:
    """Run `fn` and return ``(its result, peak bytes allocated above the starting point)``.

    On "cpu", tracemalloc counts every allocation (NumPy reports its array buffers to it)
    while `fn` runs; the peak is measured from the bytes already allocated at the start.
    On "cuda", a CuPy memory hook follows the bytes in use by the memory pool.
    """
    if backend.check_device(device) == "cuda":
        return _peak_cuda(fn)
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return result, max(peak - start, 0)


def _peak_cuda(fn: Callable[[], Any]) -> tuple[Any, int]:  # pragma: no cover - needs a GPU
    cupy = backend.array_module("cuda")
    pool = cupy.get_default_memory_pool()

    class PeakHook(cupy.cuda.MemoryHook):
        name = "tinyamp-peak"

        def __init__(self) -> None:
            self.start = pool.used_bytes()
            self.peak = self.start

        def malloc_postprocess(self, **kwargs: Any) -> None:
            self.peak = max(self.peak, pool.used_bytes())

    cupy.cuda.Device().synchronize()
    hook = PeakHook()
    with hook:
        result = fn()
        cupy.cuda.Device().synchronize()
    return result, hook.peak - hook.start


def step_peak_bytes(device: str = "cpu", sizes: tuple[int, ...] = (784, 1024, 1024, 10), batch: int = 256) -> dict:
    """Measured peak bytes of one training step of an MLP, in FP32 and in mixed precision.

    Mixed precision here is the full recipe: float16 weights and activations, FP32 master
    weights (SGD; each float16 gradient freed once widened into its master) and loss
    scaling.  Each step is measured after one warm-up step (so the optimizer state already
    exists) with ``peak_memory`` on `device`.  Returns ``{"fp32": bytes, "mixed": bytes}``.
    ``tinyamp info`` prints it for every device it finds.
    """
    import tinyamp as ta
    from tinyamp import nn, optim
    from tinyamp.amp import LossScaler, MasterWeights, autocast

    rng = np.random.default_rng(0)
    x = ta.tensor(rng.standard_normal((batch, sizes[0])).astype(np.float32), device=device)
    y = ta.tensor(rng.integers(0, sizes[-1], size=batch), device=device)
    peaks = {}
    for regime in ("fp32", "mixed"):
        ta.manual_seed(0)
        model = nn.MLP(list(sizes)).to(device)
        if regime == "fp32":
            opt: Any = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            scaler = LossScaler(mode="off")
        else:
            sgd = optim.SGD(model.half().parameters(), lr=0.01, momentum=0.9)
            opt = MasterWeights(sgd, track_lost_updates=False, free_model_grads=True)
            scaler = LossScaler(init_scale=2.0**10)

        def step(
            model: Any = model, opt: Any = opt, scaler: LossScaler = scaler, mixed: bool = regime == "mixed"
        ) -> None:
            opt.zero_grad()
            with autocast() if mixed else contextlib.nullcontext():
                loss = ta.cross_entropy(model(x), y)
            scaler.scale_loss(loss).backward()
            scaler.step(opt)

        step()
        peaks[regime] = peak_memory(step, device)[1]
    return peaks
