"""The emulated FP8 training step against the FP16 mixed step, and FP8 rounding against ml_dtypes' cast.

    python benchmarks/fp8_step.py            # table on stdout, JSON in benchmarks/results/fp8_step.json
    python benchmarks/fp8_step.py --quick    # small sizes, a few rounds, JSON in .../fp8_step_quick.json (CI)

benchmarks/results/ is ignored by git; fp8_step.json there is committed (git add -f) as the run
the docs quote, and a later full run overwrites it.

**The steps** (the MLP 784-1024-1024-10, batch 256, SGD, as mp_step.py).  The FP16 mixed step
is tinyamp's: FP16 weights and activations, FP32 masters, dynamic loss scaling, FP16 x FP16 ->
FP32 products.  The FP8 step emulates Transformer Engine's delayed-scaling recipe on NumPy:
each Linear casts its input and its FP32 weight to E4M3 and its output gradient to E5M2
(``Fp8Scales``, HYBRID, amax history 1024), and runs its products as ``fp8_matmul``
(exact products, float32 sums, scaled back; the first layer's input gradient is not computed,
as the FP16 step's autograd skips it); the weights stay FP32 and SGD updates them there; no loss
scale (the gradients' own scales do that work).  The casts and products go through
``tinyamp.fp8.seam`` (the engine room's compiled loops with numba, the same bits as the
chapter); the same FP8 step is timed a third time with the engine room off
(``kernels.reference_only()``: the chapter's NumPy code).  All are timed as medians of
interleaved rounds (timing.py), the first call (numba's compilation, or its cache's load) in the
untimed warm-up, and their ratios are measured in this one run.  One thread: the script sets
OPENBLAS_NUM_THREADS, OMP_NUM_THREADS and MKL_NUM_THREADS to 1 unless they are set.

**The casts** (2^22 float32 values): tinyamp's exact saturating round-to-nearest-even
(``tinyamp.fp8.seam.encode``) against ml_dtypes' ``astype`` after ``np.clip`` (the same
bits), and decoding against ml_dtypes' widening, as fp8_cast_speed.py measures them.
"""

from __future__ import annotations

import os

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")  # before NumPy starts its BLAS's threads

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # timing.py, mlp_step.py, fp8_cast_speed.py
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # the working tree's tinyamp, installed or not

import fp8_cast_speed  # noqa: E402
import mlp_step  # noqa: E402
import mp_step  # noqa: E402
from timing import interleaved_medians  # noqa: E402

import tinyamp as ta  # noqa: E402
from tinyamp import kernels, nn, optim  # noqa: E402
from tinyamp.fp8 import Fp8Scales, Fp8Tensor, ScalingRecipe  # noqa: E402
from tinyamp.fp8.seam import fp8_matmul  # noqa: E402  (the chapter's product, through tinyamp.kernels)
from tinyamp.function import Function  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "fp8_step.json"
QUICK_SIZES, QUICK_BATCH = (64, 128, 128, 10), 32


def transposed(t: Fp8Tensor) -> Fp8Tensor:
    """The same FP8 bytes read as the transpose (a view: no cast)."""
    return Fp8Tensor(t.bits.T, t.fmt, t.scale)


class Fp8Linear(Function):
    """y = x W^T + b with x and W cast to E4M3 and dy to E5M2, each under its own delayed scale."""

    def forward(self, x: np.ndarray, w: np.ndarray, b: np.ndarray, *, scales: Fp8Scales, name: str) -> np.ndarray:
        xq, wq = scales.quantize(f"{name}.input", x), scales.quantize(f"{name}.weight", w)
        self.save_for_backward(xq, wq)  # one byte a value
        self.scales, self.tensor = scales, name
        return fp8_matmul(xq, transposed(wq)) + b

    def backward(self, grad_output: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        xq, wq = self.saved
        gq = self.scales.quantize(f"{self.tensor}.grad_output", grad_output, "backward")
        gx = fp8_matmul(gq, wq) if self.needs_input_grad[0] else None  # the batch's input needs none, as in FP16
        return gx, fp8_matmul(transposed(gq), xq), grad_output.sum(axis=0)


def fp8_model_step(x: np.ndarray, y: np.ndarray, sizes: tuple[int, ...] = mlp_step.SIZES) -> tuple[Any, Any]:
    """(step, losses): one emulated FP8 training step per call; `losses` collects each step's loss."""
    ta.manual_seed(0)
    model = nn.MLP(list(sizes))  # float32: the weights FP8 casts from, and SGD updates
    opt = optim.SGD(model.parameters(), lr=mlp_step.LR)
    scales = Fp8Scales(ScalingRecipe())  # Transformer Engine's defaults: delayed, HYBRID, history 1024
    xt, yt = ta.tensor(x), ta.tensor(y)
    losses: list[float] = []

    def step() -> None:
        opt.zero_grad()
        h = xt
        for i, layer in enumerate(model):
            is_linear = isinstance(layer, nn.Linear)
            h = Fp8Linear.apply(h, layer.weight, layer.bias, scales=scales, name=str(i)) if is_linear else layer(h)
        loss = ta.cross_entropy(h, yt)
        loss.backward()
        opt.step()
        losses.append(loss.item())

    return step, losses


def row(benchmark: str, contender: str, unit: str, value: float, ratio: float) -> dict:
    """One line of the table; `ratio` is this contender's value over the benchmark's reference (1 for itself)."""
    return {"benchmark": benchmark, "contender": contender, "unit": unit, "value": value, "over_reference": ratio}


def bench_steps(quick: bool) -> list[dict]:
    sizes, batch = (QUICK_SIZES, QUICK_BATCH) if quick else (mlp_step.SIZES, mlp_step.BATCH)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((batch, sizes[0])).astype(np.float32), rng.integers(0, sizes[-1], size=batch)
    fp8, _ = fp8_model_step(x, y, sizes)
    reference, _ = fp8_model_step(x, y, sizes)
    fp16 = mp_step.mixed_precision_step(x, y, sizes=sizes)  # the step mp_step.py times, at these sizes

    def chapter() -> None:
        with kernels.reference_only():
            reference()

    t = interleaved_medians({"fp16": fp16, "fp8": fp8, "chapter": chapter}, rounds=2 if quick else 9,
                            calls_per_round=1 if quick else 3, warmup=1)  # fmt: skip
    name = f"MLP {'-'.join(map(str, sizes))} step, batch {batch}: FP8 emulated vs FP16 mixed"
    off = "the FP8 step above with the engine room off (the chapter's NumPy casts and product), over the FP16 step"
    return [
        row(name, "FP16 mixed (tinyamp: FP32 masters, loss scaling)", "ms", 1e3 * t["fp16"], 1.0),
        row(name, "FP8 emulated (delayed scaling, HYBRID, FP32 weights)", "ms", 1e3 * t["fp8"], t["fp8"] / t["fp16"]),
        row(off, "FP8 emulated, engine room off", "ms", 1e3 * t["chapter"], t["chapter"] / t["fp16"]),
    ]


def bench_casts(quick: bool) -> list[dict]:
    rows, n = [], 1 << (14 if quick else 22)
    results, _ = fp8_cast_speed.measure(n, rounds=2 if quick else 7)
    for case, ms in results.items():
        if "ml_dtypes" not in ms:
            continue  # the quantizers: fp8_cast_speed.py prints them
        ns = {k: 1e6 * v / n for k, v in ms.items()}
        name = f"{case}, ns per value"
        rows.append(row(name, "ml_dtypes", "ns", ns["ml_dtypes"], 1.0))
        rows.append(row(name, "tinyamp (exact, by hand)", "ns", ns["tinyamp"], ns["tinyamp"] / ns["ml_dtypes"]))
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| benchmark | contender | median | over the first row |", "|---|---|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['benchmark']} | {r['contender']} | {r['value']:.2f} {r['unit']} | {r['over_reference']:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes and few rounds: checks that it runs")
    parser.add_argument("--out", type=Path, help=f"where the JSON goes (default {RESULTS}, or *_quick.json)")
    args = parser.parse_args(argv)
    args.out = args.out or (RESULTS.with_name("fp8_step_quick.json") if args.quick else RESULTS)
    rows = bench_steps(args.quick)
    try:
        rows += bench_casts(args.quick)
    except ImportError:
        print("ml_dtypes is not installed (pip install ml_dtypes): the casts are not compared")
    print(table(rows))
    meta = {"python": platform.python_version(), "numpy": np.__version__, "machine": platform.machine(),
            "processor": platform.processor() or "unknown", "quick": args.quick,
            "threads": {v: os.environ[v] for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")},
            "fp8_kernels": "numba" if fp8_cast_speed.casts.active_kernels() == "numba" else "numpy"}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
