# %% [markdown]
# # 8. Tensor Core numerics, and where the speed comes from
#
# Tensor Cores multiply FP16 matrices and, in the mode mixed precision uses, accumulate the
# products in FP32 (they also have modes that accumulate in FP16). That one design choice is why
# matrix products can run in FP16 without losing the sum: each product of two FP16 numbers is
# *exact* in FP32, and only the final result is rounded to FP16. tinyamp computes the idealized
# model of this arithmetic, exact products, FP32 sums and one rounding, on any machine, NumPy
# included, so the first half of this tutorial runs everywhere. It is a model, not the
# hardware's bits: Fasi et al. (2021, "Numerical behavior of NVIDIA tensor cores", PeerJ
# Computer Science) show that real Tensor Cores do not add as IEEE 754 FP32 arithmetic does
# (within a block of products they align the significands to the largest and truncate, rather
# than round each addition to nearest), so their results can differ from the model's in the
# last bits. The second half measures speed, and says plainly what this machine can
# measure: Tensor Core throughput only on a GPU, and only numbers measured in this run.
#
# You will learn:
#
# - why an FP16 x FP16 product fits in FP32 exactly (11 + 11 = 22 significant bits, and FP32
#   has 24);
# - that tinyamp's FP16 matmul is, bit for bit, widen to float32 + sgemm + round once: the
#   idealized model of a Tensor Core product;
# - how much error an FP16 accumulator would add to a long dot product (length 4096);
# - what this machine measures for FP16 and FP32 matrix products.
#
# The products run on one BLAS thread (`threadpool_limits(1)` below): OpenBLAS splits the work of
# a product differently for each thread count, so its float32 sums would round differently and
# the numbers printed here would depend on the machine (OpenBLAS starts one thread per core).
#
# Time: about 3.5 seconds to run on a CPU, 15 minutes to read.

# %%
import os
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from threadpoolctl import threadpool_limits

import tinyamp as ta
from tinyamp import backend, kernels, nn, optim
from tinyamp.amp import LossScaler, MasterWeights, autocast, formats
from tinyamp.inspect import peak_memory

# figures go next to this file (or the notebook's folder, where __file__ is not defined)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = Path(os.environ.get("TINYAMP_TUTORIAL_OUT", HERE / "figures"))
OUT.mkdir(parents=True, exist_ok=True)
# One BLAS thread: with another thread count OpenBLAS splits each product's sums differently, and
# the float32 results round differently (and on a busy machine, threads wait for each other).
threadpool_limits(1)

F16, F32, F64 = np.float16, np.float32, np.float64
for name in ("float16", "float32"):
    f = formats.get_format(name)
    print(f"{name}: {f.mantissa_bits} stored mantissa bits, {f.mantissa_bits + 1} significant bits")


def bits16(a: np.ndarray) -> np.ndarray:
    """The bit patterns of a float16 array: equal bits is bit-exact equality (-0.0 differs from 0.0)."""
    return np.ascontiguousarray(a).view(np.uint16)


# %% [markdown]
# ## 1. A product of two FP16 numbers is exact in FP32
#
# A normal FP16 number has 11 significant bits (10 stored, plus the implicit leading 1): it is
# an integer $m < 2^{11}$ times a power of two. The product of two such numbers is
# $m_1 m_2 < 2^{22}$ times a power of two, so it needs at most 22 significant bits, and FP32
# has 24. Its exponent range is no problem either: the products lie between $2^{-48}$ and
# $65504^2 \approx 4.3 \times 10^9$, all normal FP32 numbers. So a multiplier with FP32 output
# makes no rounding error at all; in the model, the only roundings are in the FP32 additions
# and in the final conversion to FP16.
#
# We check it on 200,000 random pairs of finite FP16 bit patterns (every exponent, subnormals
# included): the FP32 product equals the float64 product, which is exact here.

# %%
rng = np.random.default_rng(0)
n_pairs = 200_000
patterns = rng.integers(0, 0x7C00, size=(2, n_pairs), dtype=np.uint16)  # finite magnitudes
patterns |= rng.integers(0, 2, size=(2, n_pairs), dtype=np.uint16) << 15  # random signs
a16, b16 = patterns.view(F16)
p32 = a16.astype(F32) * b16.astype(F32)
p64 = a16.astype(F64) * b16.astype(F64)


def significant_bits(x: np.ndarray) -> np.ndarray:
    """How many significant bits each nonzero float64 value needs (53 minus trailing zero bits)."""
    mantissa, _ = np.frexp(np.abs(x[x != 0]))
    m = (mantissa * 2.0**53).astype(np.int64)
    trailing = np.zeros_like(m)
    while np.any(m % 2 == 0):
        even = m % 2 == 0
        m[even] //= 2
        trailing[even] += 1
    return 53 - trailing


needed = significant_bits(p64)
with np.errstate(over="ignore"):
    rounds_in_fp16 = np.mean(p64.astype(F16).astype(F64) != p64)
print(f"FP32 product == exact product for all {n_pairs:,} pairs: {bool(np.all(p32.astype(F64) == p64))}")
print(f"most significant bits any product needed: {needed.max()} (FP32 holds 24)")
print(f"share of the products FP16 itself would have to round: {rounds_in_fp16:.1%}")
assert np.all(p32.astype(F64) == p64)
assert needed.max() == 22 and rounds_in_fp16 > 0.9

x = F16(2047 / 1024)  # 1.9990234375: all 11 significant bits set
print(f"\n{x} * {x}: exact {float(x) * float(x)!r}, FP32 {float(F32(x) * F32(x))!r}, FP16 {float(x * x)!r}")
assert float(F32(x) * F32(x)) == float(x) ** 2 != float(x * x)

# %% [markdown]
# ## 2. tinyamp's FP16 matmul is widen + sgemm + round once
#
# NumPy has no FP16 matrix product in its BLAS, so tinyamp computes the model literally: widen
# both FP16 operands to FP32 (exact), multiply-accumulate in FP32 with the FP32 BLAS routine
# (sgemm), and round the FP32 result to FP16 once (`tinyamp.kernels.product`). We check that
# the output has exactly the bits of that recipe written out by hand. (The order of sgemm's
# additions is the BLAS library's, so the bits are those of this NumPy's sgemm; the few that
# differ from the correctly rounded product show where the FP32 additions rounded.)

# %%
A = rng.standard_normal((64, 512)).astype(F16)
B = rng.standard_normal((512, 48)).astype(F16)
out = ta.matmul(ta.tensor(A), ta.tensor(B))
by_hand = (A.astype(F32) @ B.astype(F32)).astype(F16)
correctly_rounded = (A.astype(F64) @ B.astype(F64)).astype(F16)
print(f"tinyamp matmul output dtype: {out.dtype}")
print(f"bit-identical to widen + sgemm + round once: {np.array_equal(bits16(out.numpy()), bits16(by_hand))}")
off = int(np.sum(bits16(out.numpy()) != bits16(correctly_rounded)))
print(f"elements differing from the correctly rounded exact product: {off} of {out.size} (FP32 additions)")
assert out.dtype == np.float16
assert np.array_equal(bits16(out.numpy()), bits16(by_hand))

# %% [markdown]
# ## 3. Why accumulate in FP32: a dot product of length 4096
#
# The accumulator is where FP16 would fail. Adding positive terms, a running sum $s$ grows,
# and FP16's spacing grows with it: from 1024 on it is 1, from 2048 on it is 2. A term smaller
# than half the spacing is lost entirely, and one of exactly half is a tie: $2048 + 1$ goes to
# the even neighbour, 2048, so an FP16 running sum of ones stops there. Products of numbers in
# $[0, 1)$ average 0.25; once the sum passes 512 the spacing is 0.5, and each addition rounds by
# up to 0.25, the size of a typical term.
#
# We compute 32 dot products of length up to 4096 three ways and measure the relative error
# against the exact value at every length: an FP16 accumulator (each addition rounded to FP16),
# an FP32 accumulator (each addition rounded to FP32), and tinyamp's matmul (FP32 accumulation,
# then one rounding to FP16) at the lengths $2^k$.

# %%
trials, length = 32, 4096
a = rng.uniform(0, 1, (trials, length)).astype(F16)
b = rng.uniform(0, 1, (trials, length)).astype(F16)
products = a.astype(F64) * b.astype(F64)  # exact (22 bits)
exact = np.cumsum(products, axis=1)  # float64: error ~1e-16, zero for our purpose

acc16 = np.zeros(trials, F16)
prefix16 = np.empty((trials, length))
for i in range(length):  # an FP16 accumulator: every addition rounded to FP16
    acc16 = (acc16.astype(F64) + products[:, i]).astype(F16)
    prefix16[:, i] = acc16
prefix32 = np.cumsum(products.astype(F32), axis=1, dtype=F32)  # an FP32 accumulator, unrounded

lengths = 2 ** np.arange(13)  # 1 .. 4096
tiny_err = []
for n in lengths:
    y = ta.matmul(ta.tensor(a[:, None, :n]), ta.tensor(b[:, :n, None])).numpy()[:, 0, 0]
    tiny_err.append(np.max(np.abs(y.astype(F64) - exact[:, n - 1]) / exact[:, n - 1]))
tiny_err = np.array(tiny_err)
err16 = np.max(np.abs(prefix16 - exact) / exact, axis=0)
err32 = np.max(np.abs(prefix32.astype(F64) - exact) / exact, axis=0)
print(f"{'length':>6}  {'FP16 accumulator':>16}  {'FP32 accumulator':>16}  {'tinyamp (FP32 acc, FP16 out)':>28}")
for n, e in zip(lengths, tiny_err):
    print(f"{n:>6}  {err16[n - 1]:>16.2e}  {err32[n - 1]:>16.2e}  {e:>28.2e}")

assert err16[-1] > 10 * tiny_err[-1]  # FP16 accumulation: an error no output rounding explains
assert np.all(tiny_err <= 2.0**-11 + err32[lengths - 1])  # half an FP16 ulp, plus the FP32 sum's error
assert 0.02 < err16[-1] < 0.2 and err16[-1] > 10 * err16[63]  # grows with the length, to several percent
assert np.all(err32 < 1e-5) and err32[-1] > 1e-7  # the FP32 accumulator: near 1e-6 at 4096 terms

ones = np.ones((1, 4096), F16)
via_tinyamp = ta.matmul(ta.tensor(ones), ta.tensor(ones.T)).item()
running16 = np.cumsum(ones[0], dtype=F16)[-1]
print(f"\n4096 ones: tinyamp matmul {via_tinyamp}, FP16 accumulator {running16}")
assert via_tinyamp == 4096.0 and running16 == 2048.0

# %%
fig, ax = plt.subplots(figsize=(7, 4))
n_axis = np.arange(1, length + 1)
ax.loglog(n_axis, err16, label="FP16 accumulator")
ax.loglog(n_axis, np.where(err32 > 0, err32, np.nan), label="FP32 accumulator (no final rounding)")
ax.loglog(lengths, tiny_err, "o", label="tinyamp matmul: FP32 accumulate, round once to FP16")
ax.axhline(2.0**-11, color="gray", ls=":", lw=1, label="half an FP16 ulp, relative (2^-11)")
ax.set_xlabel("dot product length")
ax.set_ylabel("max relative error (32 dot products)")
ax.set_ylim(1e-9, 1)
ax.set_title("Products of FP16 numbers in [0, 1): where the sum is kept matters", fontsize=9)
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=7)
fig.tight_layout()
error_path = OUT / "08_dot_product_error.png"
fig.savefig(error_path, dpi=110)

# %% [markdown]
# The FP16 accumulator's error grows with the length, to several percent at 4096 terms; the
# FP32 accumulator's stays near $10^{-6}$, so rounding its result once to FP16 gives an answer
# within half an FP16 ulp of the exact one (plus that $10^{-6}$): as good as FP16 can represent.
# That is the whole numerical case for FP16 matrix products with FP32 accumulation.
#
# ## 4. Speed: what this machine can measure
#
# The speed of mixed precision comes from hardware: Tensor Cores run FP16 products with FP32
# accumulation at several times the FP32 rate (NVIDIA's V100 datasheet: 125 against 15.7
# TFLOP/s), and FP16 operands halve the bytes moved. A CPU has neither: NumPy's BLAS has no FP16
# product, so an FP16 matmul is emulated (the casts cost extra time), and NumPy's own float16
# matmul is a plain loop outside BLAS.
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
    assert [bar.get_width() for bar in ax.patches] == list(tflops.values())  # the bars are this run's numbers
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

    fig, ax = plt.subplots(figsize=(7.5, 3))
    ax.barh(list(cpu_ms), list(cpu_ms.values()))
    for i, ms in enumerate(cpu_ms.values()):
        ax.text(ms, i, f" {ms:.3g} ms", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(right=max(cpu_ms.values()) * 8)
    ax.set_xlabel(f"median ms per {N}^3 matmul, measured in this run (log scale)")
    ax.set_title("No GPU here: the CPU's ways to multiply FP16 matrices", fontsize=9)
    fig.tight_layout()
    assert [bar.get_width() for bar in ax.patches] == list(cpu_ms.values())  # the bars are this run's numbers
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
# cuBLAS GemmEx calls with FP32 compute (`tinyamp/cuda/gemm.py`): the Tensor Cores' own
# arithmetic, which follows section 2's model up to the last bits, at CuPy's float16 speed if
# the dispatch around them costs little; the line printed above says whether it does.
#
# ## Summary
#
# - An FP16 x FP16 product needs at most 22 significant bits: exact in FP32.
# - tinyamp's FP16 matmul is widen + sgemm + round once, bit for bit: the idealized model of
#   Tensor Core arithmetic, on any machine (the hardware's own additions can differ in the last
#   bits: Fasi et al. 2021).
# - Accumulating a long dot product in FP16 loses the sum (4096 ones stop at 2048); FP32
#   accumulation rounded once keeps the result within half an FP16 ulp.
# - Speed is a property of the hardware: measure it where it exists, and only report what
#   was measured.
