# %% [markdown]
# # 8. Tensor Cores and speed
#
# Tutorial 1 showed why FP16 matrix products can be trusted: each product of two FP16 numbers is
# exact in FP32, the products are summed in FP32, and only the result is rounded to FP16.
# tinyamp's FP16 matmul computes that model (widen + sgemm + round once) on any machine;
# NVIDIA's Tensor Cores run it in hardware, where their additions can differ from the model's in
# the last bits (Fasi et al. 2021). That hardware, and operands half the size of FP32's, are
# where the *speed* of mixed precision comes from, and this tutorial measures it, saying plainly
# what this machine can measure: Tensor Core throughput only on a GPU, and only numbers measured
# in this run.
#
# You will learn:
#
# - where the speed of mixed precision comes from (Tensor Cores, and halved memory traffic);
# - on a GPU: the throughput of FP16 and FP32 matrix products, and the peak memory and time of
#   a training step in FP32 and in mixed precision, measured in this run;
# - on a CPU: why the emulated FP16 product is far faster than NumPy's float16 matmul but slower
#   than the sgemm it runs.
#
# Prerequisites: tutorial 1 (sections 6 and 7, the numerics of FP16 products), tutorials 4 and 5
# (the mixed-precision step timed here).
#
# The products run on one BLAS thread (`threadpool_limits(1)` below): OpenBLAS splits the work of
# a product differently for each thread count, so its float32 sums would round differently and
# the numbers printed here would depend on the machine (OpenBLAS starts one thread per core).
#
# Time: about 2.8 s of CPU to run without a GPU (4 s wall-clock on a busy shared 2-core machine), 10 minutes to read.

# %%
import os
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from threadpoolctl import threadpool_limits

import tinyamp as ta
from tinyamp import backend, kernels, nn, optim
from tinyamp.amp import LossScaler, MasterWeights, autocast
from tinyamp.inspect import peak_memory

# figures go next to this file (or the notebook's folder, where __file__ is not defined)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = Path(os.environ.get("TINYAMP_TUTORIAL_OUT", HERE / "figures"))
OUT.mkdir(parents=True, exist_ok=True)
# One BLAS thread: with another thread count OpenBLAS splits each product's sums differently, and
# the float32 results round differently (and on a busy machine, threads wait for each other).
threadpool_limits(1)

F16, F32 = np.float16, np.float32
rng = np.random.default_rng(0)


def bits16(a: np.ndarray) -> np.ndarray:
    """The bit patterns of a float16 array: equal bits is bit-exact equality (-0.0 differs from 0.0)."""
    return np.ascontiguousarray(a).view(np.uint16)


# %% [markdown]
# ## 1. Speed: what this machine can measure
#
# The speed of mixed precision comes from hardware: Tensor Cores run FP16 products with FP32
# accumulation at several times the FP32 rate (NVIDIA's V100 datasheet, SXM2 module: 125 Tensor
# TFLOP/s against 15.7 FP32 TFLOP/s; the PCIe card, 112 against 14), and FP16 operands halve
# the bytes moved. A CPU has neither: NumPy's BLAS has no FP16 product, so an FP16 matmul is
# emulated (the casts cost extra time), and NumPy's own float16 matmul is a plain loop outside BLAS.
#
# The cell below looks for a GPU through `tinyamp.backend` (CuPy with a visible device). On a
# GPU it measures, in this run, the throughput of FP16 and FP32 matrix products and the peak
# memory of a training step. On a CPU it says so and measures the CPU's three ways to multiply
# FP16 matrices instead. No number below comes from anywhere but this run.


# %%
def seconds(fn, repeats: int, sync=lambda: None, warm_up: bool = True) -> tuple[float, float]:
    """(median, best) wall-clock seconds of `repeats` calls of `fn`."""
    if warm_up:
        fn()  # first calls allocate and (on a GPU) pick kernels
        sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return float(np.median(times)), float(np.min(times))


HAVE_GPU = backend.cuda_is_available()
print("GPU found:", HAVE_GPU)

if HAVE_GPU:
    cp = backend.array_module("cuda")
    sync = cp.cuda.Device().synchronize
    N = 4096
    x32 = cp.asarray(rng.standard_normal((N, N)), dtype=cp.float32)
    y32 = cp.asarray(rng.standard_normal((N, N)), dtype=cp.float32)
    x16, y16 = x32.astype(cp.float16), y32.astype(cp.float16)
    tx16, ty16 = ta.Tensor(x16, device="cuda"), ta.Tensor(y16, device="cuda")
    runs = {
        "cupy float32 matmul": lambda: x32 @ y32,
        "cupy float16 matmul": lambda: x16 @ y16,
        "tinyamp matmul, float16 tensors": lambda: ta.matmul(tx16, ty16),
    }
    tflops = {}
    for label, fn in runs.items():
        median, _ = seconds(fn, repeats=20, sync=sync)
        tflops[label] = 2 * N**3 / median / 1e12
        print(f"{label:<34} {median * 1e3:8.3f} ms  {tflops[label]:8.1f} TFLOP/s  (measured now, {N}^3)")
    assert all(np.isfinite(v) and v > 0 for v in tflops.values())

    # Memory of one training step, measured on the device's memory pool.
    def make_step(mixed: bool):
        ta.manual_seed(0)
        model = nn.MLP([1024, 4096, 4096, 10]).to("cuda")
        xb = ta.tensor(rng.standard_normal((1024, 1024)), dtype="float32", device="cuda")
        yb = ta.tensor(rng.integers(0, 10, 1024), device="cuda")
        if not mixed:
            opt = optim.SGD(model.parameters(), lr=0.01)

            def step() -> None:
                opt.zero_grad()
                ta.cross_entropy(model(xb), yb).backward()
                opt.step()

            return step
        model.half()
        mopt = MasterWeights(optim.SGD(model.parameters(), lr=0.01), track_lost_updates=False)
        scaler = LossScaler()

        def step() -> None:
            mopt.zero_grad()
            with autocast("float16"):
                loss = ta.cross_entropy(model(xb), yb)
            scaler.scale_loss(loss).backward()
            scaler.step(mopt)

        return step

    for label, mixed in (("fp32", False), ("mixed", True)):
        step = make_step(mixed)
        step()
        _, peak = peak_memory(step, device="cuda")
        median, _ = seconds(step, repeats=5, sync=sync)
        print(
            f"MLP 1024-4096-4096-10 step, batch 1024, {label:<6} peak {peak / 2**20:8.1f} MiB, "
            f"{median * 1e3:7.2f} ms  (measured now)"
        )

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.barh(list(tflops), list(tflops.values()))
    ax.set_xlabel(f"TFLOP/s, {N}^3 matmul (measured in this run)")
    ax.set_title("Matrix products on this GPU", fontsize=9)
    fig.tight_layout()
    speed_path = OUT / "08_gpu_matmul_throughput.png"
else:
    print("No CUDA GPU is visible (CuPy absent or no device): Tensor Core throughput cannot be measured here.")
    print("Measuring the CPU's three ways to multiply FP16 matrices instead.\n")
    N = 384
    A16 = rng.standard_normal((N, N)).astype(F16)
    B16 = rng.standard_normal((N, N)).astype(F16)
    A32, B32 = A16.astype(F32), B16.astype(F32)
    C32 = A32 @ B32
    tA, tB = ta.tensor(A16), ta.tensor(B16)
    cpu_runs = {
        "NumPy float32 sgemm": lambda: A32 @ B32,
        "tinyamp FP16 matmul (emulated)": lambda: ta.matmul(tA, tB),
        "its casts alone (2 widenings, 1 rounding)": lambda: (
            kernels.widen(A16),
            kernels.widen(B16),
            kernels.cast(C32, F16),
        ),
    }
    # Timed in turn, 30 rounds, so that all three meet the same load of the machine; the best of
    # the 30 is the run that other processes delayed least.
    samples: dict[str, list[float]] = {label: [] for label in cpu_runs}
    for fn in cpu_runs.values():
        fn()  # warm-up: allocations, and the engine room's first calls
    for _ in range(30):
        for label, fn in cpu_runs.items():
            start = time.perf_counter()
            fn()
            samples[label].append(time.perf_counter() - start)
    cpu_ms = {label: 1e3 * float(np.median(t)) for label, t in samples.items()}
    best_ms = {label: 1e3 * min(t) for label, t in samples.items()}
    loop_median, loop_best = seconds(lambda: A16 @ B16, 3, warm_up=False)  # a plain loop: slow, nothing to warm up
    cpu_ms["NumPy float16 matmul"], best_ms["NumPy float16 matmul"] = loop_median * 1e3, loop_best * 1e3
    for label in cpu_ms:
        print(f"{label:<42} median {cpu_ms[label]:9.3f} ms, best {best_ms[label]:9.3f} ms  ({N}^3, measured now)")
    emulated, sgemm = best_ms["tinyamp FP16 matmul (emulated)"], best_ms["NumPy float32 sgemm"]
    print(
        f"\nemulated FP16 matmul, best times: {best_ms['NumPy float16 matmul'] / emulated:.0f}x faster than NumPy's "
        f"float16 matmul, {emulated / sgemm:.2f}x the time of sgemm"
    )
    # BLAS against a plain loop; and the emulation against the sgemm it runs, plus its casts.
    assert best_ms["NumPy float16 matmul"] > 3 * emulated, best_ms
    assert emulated > sgemm, best_ms
    assert np.array_equal(bits16((A16.astype(F32) @ B16.astype(F32)).astype(F16)), bits16(ta.matmul(tA, tB).numpy()))

    # The bars are the best times, which the text compares; the ticks the medians, which the load moves.
    fig, ax = plt.subplots(figsize=(7.5, 3))
    bars = ax.barh(list(best_ms), list(best_ms.values()), label="best of 30 rounds (3 for the loop): compared")
    ax.plot(list(cpu_ms.values()), range(len(cpu_ms)), "k|", ms=14, mew=2, label="median of the rounds")
    for i, ms in enumerate(best_ms.values()):
        ax.text(max(ms, cpu_ms[list(cpu_ms)[i]]), i, f"  best {ms:.3g} ms", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(right=max(cpu_ms.values()) * 8)
    ax.set_xlabel(f"ms per {N}^3 matmul, measured in this run (log scale)")
    ax.set_title("No GPU here: the CPU's ways to multiply FP16 matrices", fontsize=9)
    ax.legend(fontsize=7, loc="center right")
    fig.tight_layout()
    drawn = {label: bar.get_width() for label, bar in zip(best_ms, bars.patches)}
    # what the text reads off the figure: the emulation slower than sgemm, far faster than the loop
    assert drawn["NumPy float32 sgemm"] < drawn["tinyamp FP16 matmul (emulated)"] < drawn["NumPy float16 matmul"] / 3
    speed_path = OUT / "08_cpu_matmul_times.png"

fig.savefig(speed_path, dpi=110)

# %% [markdown]
# On a CPU, mixed precision buys correctness lessons, not speed. The emulated FP16 product is
# far faster than NumPy's float16 loop (BLAS against an element-by-element loop) but slower
# than sgemm: it runs the same sgemm, and the two widenings and the rounding, timed alone above,
# are extra passes over memory. The comparisons use the best of the 30 rounds, the run that
# other work on a busy machine delayed least; the medians move more with the load. (Every
# product here runs on one BLAS thread, as set at the top.)
#
# On a GPU the numbers printed above are what this run measured: the ratio of the CuPy float16
# and float32 lines is what the hardware offers. tinyamp's float16 products there are single
# cuBLAS GemmEx calls with FP32 compute (`tinyamp/engine/cuda/gemm.py`): the Tensor Cores' own
# arithmetic, which follows tutorial 1's model (section 7) up to the last bits, at CuPy's float16 speed if
# the dispatch around them costs little; the line printed above says whether it does.
#
# **What a GPU run of this tutorial printed.** On one NVIDIA H200 (CUDA 13.2, CuPy 14.2), on
# 2026-12-04 (`benchmarks/results/gpu_check_h200_2026-12-04_run4.log`, section cli): CuPy's
# float32 matmul 50.7 TFLOP/s, its float16 matmul 607.3, tinyamp's float16 matmul 413.7, at
# 4096^3; the MLP step above, FP32 4.09 ms with a peak of 64.0 MiB, mixed precision 3.45 ms with
# a peak of 18.0 MiB. Two things in those lines are about Python, not about Tensor Cores. At
# 4096^3 a product takes a third of a millisecond, and the dispatch around tinyamp's cuBLAS call
# is a visible part of it: at 8192^3 the same run measured tinyamp's product at 730 TFLOP/s
# against CuPy's 654 (`benchmarks/gpu_check.py`, section matmul). And this MLP's step is bound by
# the host launching kernels: in that run the same MLP (with SGD momentum, section tutorial8)
# took 2.98 ms a mixed step, of which its kernels kept the GPU busy 0.63 ms (section kernels),
# so its speed-up measures launches more than arithmetic. Where the products
# dominate, an MLP of width 8192, the same mixed step ran 10.2 times faster than FP32 (the
# README's "Measured on a GPU"). The first GPU run of this tutorial, before the engine room's
# reductions ran in many blocks, printed the mixed step four times *slower* than FP32 (17.0 ms
# against 4.5): one reduction kernel ran on a single one of the GPU's 132 multiprocessors.
#
# ## Summary
#
# - The numerics come first (tutorial 1): FP16 x FP16 products are exact in FP32, and FP32
#   accumulation rounded once keeps a product within half an FP16 ulp; tinyamp's FP16 matmul is
#   that model, bit for bit (on a CPU the cell above checks its bits again).
# - The speed comes from hardware: Tensor Cores and halved memory traffic. On a CPU the emulated
#   FP16 product is far faster than NumPy's float16 loop and slower than the sgemm it runs.
# - Speed is a property of the hardware: measure it where it exists, and only report what
#   was measured.
