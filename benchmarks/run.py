"""Run every benchmark, print one table, write the numbers as JSON.

    python benchmarks/run.py              # table on stdout, JSON in benchmarks/results/latest.json
    python benchmarks/run.py --out r.json

Times are medians of interleaved rounds (see timing.py); ratios compare contenders
measured side by side in this one run.  The process keeps 64 MB of freed memory mapped
(tinyamp.keep_freed_memory, as the tinyamp command does): otherwise whether a
step pays thousands of page faults depends on what ran before it in the process.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cast_speed  # noqa: E402
import matmul_fp16  # noqa: E402
import memory_depth  # noqa: E402
import mlp_step  # noqa: E402
import mp_step  # noqa: E402
import op_overhead  # noqa: E402
from timing import cast_kernel_choices, interleaved_medians, with_cast_kernels  # noqa: E402

from tinyamp.engine.fast import casts  # noqa: E402
from tinyamp.engine.fast.allocator import keep_freed_memory  # noqa: E402


def row(benchmark: str, contender: str, unit: str, value: float, ratio: float) -> dict:
    """One line of the table; `ratio` is tinyamp's time over this contender's."""
    return {"benchmark": benchmark, "contender": contender, "unit": unit, "value": value, "tinyamp_over_this": ratio}


def bench_mlp_step() -> list[dict]:
    """tinyamp against the hand-written NumPy step, then (separately) against PyTorch.

    Two phases, because PyTorch's OpenMP threads keep the cores busy after each of its
    steps and would slow whatever runs next; each ratio comes from its own phase.
    """
    x, y = mlp_step.make_data()
    name = "MLP 784-1024-1024-10 step, batch 256, SGD, FP32"
    ours = mlp_step.tinyamp_step(x, y)
    t = interleaved_medians({"tinyamp": ours, "numpy by hand": mlp_step.numpy_step(x, y)}, rounds=15)
    rows = [row(name, c, "ms", 1e3 * sec, t["tinyamp"] / sec) for c, sec in t.items()]
    torch_step = mlp_step.torch_step(x, y)
    if torch_step is not None:
        t = interleaved_medians({"tinyamp": ours, "pytorch cpu": torch_step}, rounds=15)
        rows.append(row(name, "pytorch cpu", "ms", 1e3 * t["pytorch cpu"], t["tinyamp"] / t["pytorch cpu"]))
    return rows


def bench_op_overhead() -> list[dict]:
    contenders = {"tinyamp": op_overhead.tinyamp_chain()}
    torch_chain = op_overhead.torch_chain()
    if torch_chain is not None:
        contenders["pytorch cpu"] = torch_chain
    t = interleaved_medians(contenders, rounds=7, calls_per_round=10)
    us = {name: 1e6 * sec / op_overhead.CHAIN for name, sec in t.items()}
    name = "overhead per op (forward + backward), 4-element tensors"
    return [row(name, c, "us/op", v, us["tinyamp"] / v) for c, v in us.items()]


def ratio(value: float) -> str:
    return "" if value != value else f"{value:.3g}x"  # NaN (no ratio) prints as an empty cell


def markdown_table(rows: list[dict]) -> str:
    """The rows as the Markdown table benchmarks/README.md shows."""
    lines = ["| benchmark | contender | median | tinyamp / contender |", "|---|---|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['benchmark']} | {r['contender']} | {r['value']:.2f} {r['unit']} | {ratio(r['tinyamp_over_this'])} |"
        )
    return "\n".join(lines)


CASTS = {"numba": "casts compiled (numba)", "numpy": "casts as NumPy passes"}


def bench_mixed_precision_step() -> list[dict]:
    """The full mixed-precision step against the FP32 step, with each implementation of the
    casts (measured side by side), its phases, and saved bytes."""
    x, y = mlp_step.make_data()
    kernels = cast_kernel_choices()
    contenders = {k: with_cast_kernels(k, mp_step.mixed_precision_step(x, y)) for k in kernels}
    t = interleaved_medians({**contenders, "fp32": mlp_step.tinyamp_step(x, y)}, rounds=9)
    rows = []
    for k in kernels:
        name = f"MLP step, mixed precision (FP16 + FP32 master + loss scaling) vs FP32, {CASTS[k]}"
        rows.append(row(name, "tinyamp mixed precision", "ms", 1e3 * t[k], 1.0))
        rows.append(row(name, "tinyamp fp32", "ms", 1e3 * t["fp32"], t[k] / t["fp32"]))
    for k in kernels:
        with casts.kernels(k):
            phases = mp_step.time_breakdown(x, y)
            casts_ms, step_ms = mp_step.cast_time(x, y)
        for phase, ms in phases.items():
            rows.append(row(f"  where the mixed-precision step's time goes, {CASTS[k]}", phase, "ms", ms, float("nan")))
        rows.append(row(f"  of which FP16 <-> FP32 conversions (share of the step), {CASTS[k]}", "widen + round", "ms",
                        casts_ms, casts_ms / step_ms))  # fmt: skip
    fp32_bytes, mixed_bytes = mp_step.saved_bytes(x)
    rows.append(row("saved activation bytes (graph of the MLP output)", "fp32", "MB", fp32_bytes / 1e6, float("nan")))
    rows.append(
        row("saved activation bytes (graph of the MLP output)", "mixed precision", "MB", mixed_bytes / 1e6,
            mixed_bytes / fp32_bytes)
    )  # fmt: skip
    return rows


def bench_memory_by_depth(depth: int = 36) -> list[dict]:
    """Peak step memory of a deep MLP: FP32, mixed precision, mixed + checkpointing."""
    rows = []
    results = {r: memory_depth.measure(depth, r) for r in ("fp32", "mixed", "mixed+checkpoint")}
    name = f"deep MLP, depth {depth}, width {memory_depth.WIDTH}, batch {memory_depth.BATCH}"
    for regime, m in results.items():
        rows.append(row(f"{name}: saved activations", regime, "MB", m["saved_mb"],
                        m["saved_mb"] / results["fp32"]["saved_mb"]))  # fmt: skip
    for regime, m in results.items():
        rows.append(row(f"{name}: peak step memory", regime, "MB", m["peak_mb"],
                        m["peak_mb"] / results["fp32"]["peak_mb"]))  # fmt: skip
    times = interleaved_medians(
        {r: memory_depth.build(depth, r)[0] for r in ("mixed", "mixed+checkpoint")}, rounds=3, calls_per_round=1
    )
    rows.append(row(f"{name}: step time", "mixed", "ms", 1e3 * times["mixed"], 1.0))
    rows.append(
        row(f"{name}: step time", "mixed+checkpoint", "ms", 1e3 * times["mixed+checkpoint"],
            times["mixed+checkpoint"] / times["mixed"])
    )  # fmt: skip
    return rows


def bench_cast_speed() -> list[dict]:
    """Nanoseconds per element of each FP16 <-> FP32 conversion, by kind of values."""
    rows = []
    kernels = cast_kernel_choices()
    for direction, label in (("round", "rounding to FP16"), ("widen", "widening to FP32")):
        for kind, x in cast_speed.values().items():
            t = interleaved_medians(cast_speed.contenders(x, direction, kernels), rounds=7)
            ns = {name: 1e9 * sec / x.size for name, sec in t.items()}
            best = ns["tinyamp compiled (numba)" if "numba" in kernels else "tinyamp NumPy passes"]
            for name, value in ns.items():
                rows.append(row(f"{label}, 1M values, {kind}", name, "ns/element", value, best / value))
    return rows


def bench_fp16_matmul() -> list[dict]:
    """Emulated FP16 matmul (with each implementation of the casts) against NumPy's float16 loop
    (timed once: seconds) and sgemm."""
    a, b = matmul_fp16.operands()
    kernels = cast_kernel_choices()
    contenders = {k: with_cast_kernels(k, matmul_fp16.tinyamp_float16(a, b)) for k in kernels}
    t = interleaved_medians({**contenders, "float32 sgemm": matmul_fp16.float32_sgemm(a, b)}, rounds=7)
    slow = matmul_fp16.time_once(matmul_fp16.numpy_float16(a, b))
    rows = []
    for k in kernels:
        name = f"FP16 matmul {matmul_fp16.N}^3 (NumPy), {CASTS[k]}"
        rows.append(row(name, "tinyamp (Tensor Core emulation)", "ms", 1e3 * t[k], 1.0))
        rows.append(row(name, "numpy float16 matmul", "ms", 1e3 * slow, t[k] / slow))
        rows.append(row(name, "float32 sgemm", "ms", 1e3 * t["float32 sgemm"], t[k] / t["float32 sgemm"]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth-sweep", action="store_true", help="also sweep depth for peak memory (slow) + figure")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "latest.json")
    args = parser.parse_args()
    keep_freed_memory()

    rows = bench_mlp_step() + bench_op_overhead() + bench_cast_speed() + bench_fp16_matmul()
    rows += bench_mixed_precision_step()
    rows += bench_memory_by_depth()
    print(markdown_table(rows))
    if args.depth_sweep:
        table = memory_depth.sweep()
        print("\n| depth | " + " | ".join(k for k in table if k != "depth") + " |")
        print("|---:|" + "---:|" * (len(table) - 1))
        for i, d in enumerate(table["depth"]):
            print(f"| {d} | " + " | ".join(f"{table[k][i]:.1f} MB" for k in table if k != "depth") + " |")
        figure = Path(__file__).resolve().parent / "figures" / "peak_memory_by_depth.png"
        figure.parent.mkdir(parents=True, exist_ok=True)
        if memory_depth.plot_sweep(table, str(figure)):
            print(f"wrote {figure}")
    meta = {"python": platform.python_version(), "numpy": np.__version__, "machine": platform.machine()}
    try:
        import torch

        meta["torch"] = torch.__version__
    except ImportError:
        pass
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
