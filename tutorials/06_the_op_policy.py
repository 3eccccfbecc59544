# %% [markdown]
# # 6. The op policy: what stays in FP32, and why
#
# Mixed precision does not run every operation in FP16. Matrix products do, because their FP16
# inputs multiply exactly and are accumulated in FP32 (tutorial 1, section 7). Other operations
# would overflow, underflow or lose their sums in FP16, and `autocast` keeps them in FP32.
# The rule for each op is a row of a table you can print and change.
#
# You will learn:
#
# - the four rules of tinyamp's op policy ("lower", "lower_fp32_out", "fp32", "promote");
# - what goes wrong in FP16 for exp and softmax, log and the loss, large sums, and a naively
#   written layer norm, each shown on numbers, and that autocast gets finite, correct answers;
# - how to override one entry of the table and see the effect;
# - how to read the cast log of a forward pass, and why a weight used twice is cast once.
#
# The products run on one BLAS thread (`threadpool_limits(1)` below): OpenBLAS splits the work of
# a product differently for each thread count, so its float32 sums would round differently and
# the numbers printed here would depend on the machine (OpenBLAS starts one thread per core).
#
# Prerequisites: tutorial 1 (overflow, and FP32 accumulation in section 7) and tutorial 3 (section
# 2, a naive softmax that overflows).
#
# Time: about 4.6 s of CPU to run (6.5 s wall-clock on a busy shared 2-core machine), 20 minutes to read.

# %%
import os
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from threadpoolctl import threadpool_limits

import tinyamp as ta
from tinyamp import autograd, nn
from tinyamp.amp import DEFAULT_POLICY, autocast, format_policy, formats
from tinyamp.casting import Cast

# figures go next to this file (or the notebook's folder, where __file__ is not defined)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = Path(os.environ.get("TINYAMP_TUTORIAL_OUT", HERE / "figures"))
OUT.mkdir(parents=True, exist_ok=True)
# One BLAS thread: with another thread count OpenBLAS splits each product's sums differently, and
# the float32 results round differently (and on a busy machine, threads wait for each other).
threadpool_limits(1)

# The failures below are the lesson; NumPy's "overflow encountered" warnings would only repeat them.
warnings.filterwarnings("ignore", category=RuntimeWarning)
F16 = formats.get_format("float16")

# %% [markdown]
# ## 1. The table
#
# `autocast` consults one dictionary, op name to rule:
#
# - **lower**: cast floating inputs to FP16 and compute there (matmul, linear);
# - **lower_fp32_out**: the same products, but return the FP32 accumulator unrounded;
# - **fp32**: cast inputs to FP32; the output is FP32 (the numerically sensitive ops);
# - **promote**: mixed FP16/FP32 inputs go to the wider one (elementwise arithmetic).
#
# Ops not in the table run in whatever dtype their inputs have.

# %%
print(format_policy())
fp32_ops = sorted(op for op, rule in DEFAULT_POLICY.items() if rule == "fp32")
print("\nkept in FP32:", ", ".join(fp32_ops))

# The table is what autocast does: every row, run under autocast("float16"). A "lower" op gets
# FP32 inputs and must give FP16; an "fp32" op gets FP16 inputs and must give FP32 (outside
# autocast each of them would stay in FP16); a "promote" op mixes FP16 and FP32 and gives FP32.
x16 = ta.tensor([[0.5, 1.0, 2.0], [1.5, 0.25, 3.0]], dtype="float16")
x32 = x16.float()
w32 = ta.tensor(np.full((4, 3), 0.5), dtype="float32")
runs = {
    "matmul": lambda: ta.matmul(x32, w32.T),
    "linear": lambda: ta.linear(x32, w32),
    "softmax": lambda: ta.softmax(x16),
    "log_softmax": lambda: ta.log_softmax(x16),
    "cross_entropy": lambda: ta.cross_entropy(x16, ta.tensor(np.array([0, 2]))),
    "layer_norm": lambda: ta.layer_norm(x16),
    "exp": lambda: ta.exp(x16),
    "log": lambda: ta.log(x16),
    "pow": lambda: x16**2,
    "sum": lambda: x16.sum(),
    "mean": lambda: x16.mean(),
    "add": lambda: x16 + x32,
    "sub": lambda: x16 - x32,
    "mul": lambda: x16 * x32,
    "div": lambda: x16 / x32,
    "concatenate": lambda: ta.concatenate([x16, x32]),
}
with autocast("float16"):
    produced = {op: run().dtype for op, run in runs.items()}
rule_gives = {"lower": np.float16, "fp32": np.float32, "promote": np.float32}
assert set(runs) == set(DEFAULT_POLICY)  # every row of the table is run
assert all(produced[op] == rule_gives[rule] for op, rule in DEFAULT_POLICY.items()), produced
assert ta.exp(x16).dtype == np.float16 and x16.sum().dtype == np.float16  # outside autocast: no rule applies
print(f"all {len(runs)} rows checked against what autocast does")

# %% [markdown]
# **In PyTorch.** `torch.autocast` applies a table of the same kind. For CUDA, PyTorch's
# documentation ("Autocast Op Reference") and its source (`aten/src/ATen/autocast_mode.h`) list
# the products (`matmul`, `linear`, ...) among the ops that autocast to FP16, and `softmax`,
# `log_softmax`, `cross_entropy`, `layer_norm`, `exp`, `log`, `pow` and `sum` among those that
# autocast to FP32: tinyamp's table, except that PyTorch's has no entry for `mean`. On a CPU,
# which is where this cell runs, the FP32 list is shorter. The optional cell (it needs PyTorch; without it, it
# prints one line) runs each row of the table above under `torch.autocast("cpu",
# dtype=torch.float16)` and compares the output dtype with tinyamp's: they must agree on every
# product and every promotion, and any row where they differ must be one that tinyamp keeps in
# FP32 and PyTorch's CPU autocast leaves in FP16. There a hand-written `exp` is not protected.

# %%
try:
    import torch
except ImportError:
    torch = None

if torch is None:
    print("PyTorch is not installed: the comparison with torch.autocast is skipped")
else:
    t16, t32 = torch.from_numpy(x16.numpy()), torch.from_numpy(x32.numpy())
    tw32 = torch.from_numpy(w32.numpy())
    F = torch.nn.functional
    torch_runs = {
        "matmul": lambda: t32 @ tw32.T,
        "linear": lambda: F.linear(t32, tw32),
        "softmax": lambda: torch.softmax(t16, -1),
        "log_softmax": lambda: torch.log_softmax(t16, -1),
        "cross_entropy": lambda: F.cross_entropy(t16, torch.tensor([0, 2])),
        "layer_norm": lambda: F.layer_norm(t16, (3,)),
        "exp": lambda: torch.exp(t16),
        "log": lambda: torch.log(t16),
        "pow": lambda: t16**2,
        "sum": lambda: t16.sum(),
        "mean": lambda: t16.mean(),
        "add": lambda: t16 + t32,
        "sub": lambda: t16 - t32,
        "mul": lambda: t16 * t32,
        "div": lambda: t16 / t32,
        "concatenate": lambda: torch.cat([t16, t32]),
    }
    with torch.autocast("cpu", dtype=torch.float16):
        torch_dtypes = {op: str(run().dtype).removeprefix("torch.") for op, run in torch_runs.items()}
        exp12 = torch.exp(torch.tensor([12.0], dtype=torch.float16))
    differ = sorted(op for op in runs if torch_dtypes[op] != np.dtype(produced[op]).name)
    agree = len(runs) - len(differ)
    print(f"torch {torch.__version__} CPU autocast agrees with tinyamp on {agree} of {len(runs)} rows")
    print(f"left in FP16 by PyTorch's CPU autocast, kept in FP32 by tinyamp: {', '.join(differ) or 'none'}")
    assert set(torch_runs) == set(runs)
    assert all(torch_dtypes[op] == np.dtype(produced[op]).name for op, rule in DEFAULT_POLICY.items() if rule != "fp32")
    assert differ and all(DEFAULT_POLICY[op] == "fp32" and torch_dtypes[op] == "float16" for op in differ)
    if "exp" in differ:  # a hand-written exp under PyTorch's CPU autocast: FP16, and e^12 overflows
        print(f"torch.exp(12) in FP16 under CPU autocast: {exp12.item()}")
        assert torch.isinf(exp12).all()

# %% [markdown]
# Each entry below is tested the same way: the same FP16 input, once under the default policy
# and once with that one entry overridden to `"lower"` (`autocast(policy={"exp": "lower"})`),
# against a float64 reference computed from the same FP16-rounded input.
#
# ## 2. exp and softmax
#
# The largest FP16 value is 65504, and $e^{11.09} \approx 65504$: the exponential of any
# logit above 11.09 is infinite in FP16. Logits of 12 or more are ordinary in a trained
# classifier. A naive softmax, $e^{z_i} / \sum_j e^{z_j}$, then divides inf by inf: NaN.

# %%
logits = ta.tensor([[12.0, 3.0, -1.0, 0.5]], dtype="float16")
z64 = logits.numpy().astype(np.float64)
reference = np.exp(z64 - z64.max()) / np.exp(z64 - z64.max()).sum()


def naive_softmax(z: ta.Tensor) -> ta.Tensor:
    e = ta.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


with autocast("float16"):
    p_policy = naive_softmax(logits)
with autocast("float16", policy={"exp": "lower"}):
    p_lowered = naive_softmax(logits)
print("reference            ", np.round(reference, 6))
print("exp in FP32 (policy) ", p_policy.numpy(), p_policy.dtype)
print("exp in FP16          ", p_lowered.numpy())
assert np.isnan(p_lowered.numpy()).any()
assert np.all(np.isfinite(p_policy.numpy())) and np.allclose(p_policy.numpy(), reference, rtol=1e-5, atol=1e-7)

# %% [markdown]
# tinyamp's own `softmax` subtracts the row maximum first, $e^{z_i - m} / \sum_j e^{z_j - m}$:
# mathematically the same, and every exponential is then at most $e^0 = 1$, so nothing
# overflows even in FP16. What remains is precision: FP16 keeps 11 significant bits, so the
# probabilities carry errors of order $2^{-11}$ relative, where FP32 keeps 24 bits. The figure
# sweeps the logit magnitude for a row of 1000 classes and measures the largest error of each
# version against float64.

# %%
rng = np.random.default_rng(0)
direction = rng.uniform(-1, 1, size=(8, 1000))
direction[:, 0] = 1.0  # the largest logit of each row equals the magnitude
magnitudes = np.linspace(1, 20, 39)
errors: dict[str, list[float]] = {"naive, exp in FP16": [], "stable, FP16 (softmax: lower)": [], "autocast (FP32)": []}
for m in magnitudes:
    z = ta.tensor(m * direction, dtype="float16")
    zz = z.numpy().astype(np.float64)
    ref = np.exp(zz - zz.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    with autocast("float16", policy={"exp": "lower"}):
        naive16 = naive_softmax(z).numpy()
    with autocast("float16", policy={"softmax": "lower"}):
        stable16 = ta.softmax(z).numpy()
    with autocast("float16"):
        policy32 = ta.softmax(z).numpy()
    for key, p in zip(errors, (naive16, stable16, policy32)):
        err = np.abs(p.astype(np.float64) - ref).max()
        errors[key].append(float(err) if np.isfinite(err) else np.nan)

e_naive, e16, e32 = (np.array(v) for v in errors.values())
print(f"logit magnitude where the naive FP16 softmax first gives NaN: {magnitudes[np.isnan(e_naive)].min():.1f}")
print(f"largest error, stable FP16 softmax: {np.nanmax(e16):.2e};  autocast (FP32): {np.nanmax(e32):.2e}")
assert np.all(np.isnan(e_naive[magnitudes > np.log(F16.max)]))  # every magnitude above 11.09 fails
assert not np.isnan(e_naive[magnitudes < np.log(F16.max)]).any()  # and none below
assert np.nanmax(e32) < 1e-6 and np.nanmax(e16) > 20 * np.nanmax(e32)
below = magnitudes < np.log(F16.max)
naive_over_stable = (e_naive / e16)[below]
print(f"below 11.09, naive error / stable FP16 error: {naive_over_stable.min():.2f} to {naive_over_stable.max():.2f}")

fig, ax = plt.subplots(figsize=(7, 4))
ax.semilogy(magnitudes, e_naive, "o-", ms=3, label="naive, exp in FP16")
ax.semilogy(magnitudes, e16, "s-", ms=3, label="stable softmax in FP16 (policy override)")
ax.semilogy(magnitudes, e32, "^-", ms=3, label="autocast default: softmax in FP32")
ax.axvspan(np.log(F16.max), magnitudes[-1] + 0.5, color="red", alpha=0.08)
ax.text(
    np.log(F16.max) + 0.3,
    0.5,
    "e^z > 65504:\nnaive FP16 softmax is NaN",
    color="red",
    fontsize=8,
    transform=ax.get_xaxis_transform(),
)
ax.set_xlabel("largest logit in the row")
ax.set_ylabel("max |p - p_float64|")
ax.set_title("Softmax of 1000 logits: error against float64", fontsize=9)
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=7, loc="lower right")
fig.tight_layout()
softmax_path = OUT / "06_softmax_error.png"
fig.savefig(softmax_path, dpi=110)

# %% [markdown]
# Below 11.09 the naive curve lies *under* the stable FP16 one. Not because the naive formula is
# better: only its `exp` was lowered. Its sum (an "fp32" op) and its division (FP16 by FP32
# promotes) run in FP32 and it returns FP32 probabilities, while the stable softmax lowered as
# a whole rounds every intermediate to FP16: $z - m$, the exponentials, their sum and its output.
# Round the naive output to FP16 as well, and its error is the same size as the stable one's:
# the gap was mostly the precision of the output.

# %%
rounded_naive_error = []
for m in magnitudes[below]:
    z = ta.tensor(m * direction, dtype="float16")
    zz = z.numpy().astype(np.float64)
    ref = np.exp(zz - zz.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    with autocast("float16", policy={"exp": "lower"}):
        naive = naive_softmax(z)
    assert naive.dtype == np.float32  # sum and division ran in FP32
    rounded_naive_error.append(np.abs(naive.numpy().astype(np.float16).astype(np.float64) - ref).max())
ratio = np.array(rounded_naive_error) / e16[below]
print(f"naive output rounded to FP16, its error / the stable FP16 error: {ratio.min():.2f} to {ratio.max():.2f}")
assert np.all(e_naive[below] < e16[below])  # as drawn: the FP32 output is the more accurate ...
assert np.all((0.5 < ratio) & (ratio < 1.5))  # ... and rounded to FP16 it is as far off as the stable one

# %% [markdown]
# ## 3. log, and the loss
#
# The cross-entropy of an example is $-\log p_y$. A confidently wrong prediction has a tiny
# $p_y$: a logit gap of 20 gives $p_y \approx e^{-20} \approx 2 \times 10^{-9}$, far below
# $2^{-25} \approx 3 \times 10^{-8}$, at or below which FP16 rounds to 0. So even the stable
# softmax, computed in FP16 (where nothing overflows: its largest exponential is $e^0$), gives
# $p_y = 0$, and its log is $-\infty$: the loss is infinite and every gradient of the logits is
# NaN. (The naive softmax fails here too, by overflow rather than underflow: $e^{20}$ is inf in
# FP16, and $p_y = 1/\infty = 0$.) Computed from the log-softmax in FP32, as `cross_entropy` does
# under autocast, the loss is 20 (to six decimals).

# %%
wrong = ta.tensor([[20.0, 0.0, 0.0]], dtype="float16", requires_grad=True)  # the label is class 1
label = ta.tensor([1])

with autocast("float16", policy={"softmax": "lower", "log": "lower"}):
    p_stable16 = ta.softmax(wrong)
    loss16 = -ta.log(p_stable16[0, 1])
loss16.backward()
with autocast("float16", policy={"exp": "lower", "log": "lower", "sum": "lower"}):
    exp16 = ta.exp(wrong)
    loss_naive16 = -ta.log(naive_softmax(wrong)[0, 1])
with autocast("float16"):
    loss_naive32 = -ta.log(naive_softmax(wrong)[0, 1])
    loss_ce = ta.cross_entropy(wrong, label)
exact = 20.0 + np.log1p(2 * np.exp(-20.0))
print(f"stable softmax in FP16: p = {p_stable16.numpy()}, -log p_y = {loss16.item()}, logit gradient {wrong.grad}")
print(f"naive softmax in FP16:  e^z = {exp16.numpy()}, -log p_y = {loss_naive16.item()}")
print(f"naive -log softmax, autocast:    {loss_naive32.item():.6f} ({loss_naive32.dtype})")
print(f"cross_entropy, autocast:         {loss_ce.item():.6f} ({loss_ce.dtype}); exact {exact:.6f}")
assert formats.round_to(np.exp(-20.0)) == 0 and np.all(np.isfinite(p_stable16.numpy()))  # underflow, no overflow
assert p_stable16.numpy()[0, 1] == 0 and np.isinf(loss16.item()) and np.all(np.isnan(wrong.grad))
assert np.isinf(exp16.numpy()[0, 0]) and np.isinf(loss_naive16.item())  # the naive one: e^20 overflows
assert abs(loss_ce.item() - exact) < 1e-5 and loss_ce.dtype == np.float32

# %% [markdown]
# ## 4. Sums and means
#
# A sum can overflow even when every term is small: 100,000 activations of 1.0 sum to
# 100,000, which is beyond 65504. And an FP16 *accumulator* stalls long before that: above
# 2048 the spacing of FP16 values is 2, so $2048 + 1$ is a tie that rounds back to 2048, and
# a running sum of ones never gets past it.
#
# tinyamp's reductions always accumulate in FP32 (see `tinyamp/ops/reduce.py`), so the stall
# can only be shown with NumPy's FP16 cumulative sum. The policy decides the dtype of the
# result: with `"sum": "lower"` the FP32 total is rounded to FP16 at the end, and 100,000
# becomes inf.

# %%
ones16 = np.ones(100_000, dtype=np.float16)
running = np.cumsum(ones16, dtype=np.float16)  # an FP16 accumulator, as a naive kernel would use
print(f"FP16 running sum of 100,000 ones: {running[-1]} (stuck since term {int(np.argmax(running == 2048)) + 1})")
x = ta.tensor(ones16)
with autocast("float16"):
    s_policy, m_policy = x.sum(), x.mean()
with autocast("float16", policy={"sum": "lower"}):
    s_lowered = x.sum()
print(f"sum under autocast: {s_policy.item()} ({s_policy.dtype}); mean {m_policy.item()}")
print(f"sum with 'sum': 'lower': {s_lowered.item()} ({s_lowered.dtype})")
assert running[-1] == 2048.0
assert s_policy.item() == 100_000.0 and s_policy.dtype == np.float32 and m_policy.item() == 1.0
assert np.isinf(s_lowered.item()) and s_lowered.dtype == np.float16

# %% [markdown]
# ## 5. Layer norm
#
# Layer norm divides by the standard deviation of each row, and the variance is a mean of
# squares $(x - \mu)^2$. Written naively in FP16, each square rounded to FP16 (what tinyamp's
# `layer_norm` computes when its entry is overridden to "lower"), an activation 256 away from
# its row mean squares to 65536, past FP16's maximum: the variance becomes inf,
# $1/\sqrt{\mathrm{var}}$ becomes 0, and the output is a row of zeros. No NaN, no error: a
# silently dead layer.
#
# That is the naive formula's fault, not FP16 inputs' as such. A careful FP16 kernel computes
# the mean and the variance in FP32 and rounds only its output to FP16; PyTorch's FP16
# `layer_norm` kernels accumulate in float32 this way, and get the same input right. We compute
# such a kernel in NumPy next to the two others. Autocast keeps layer norm in FP32 anyway, as
# PyTorch's autocast does (it lists `layer_norm` among the ops it runs in float32): the result
# then does not depend on how carefully a kernel was written, and the normalized output keeps
# FP32's 24 significant bits instead of 11. Large activations do occur: the residual stream of a
# deep transformer grows with depth, and large language models develop outlier features many
# times larger than the rest (Dettmers et al. 2022).


# %%
def careful_fp16_layer_norm(x16: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """FP16 in, FP16 out; the mean and variance accumulated in FP32, as PyTorch's FP16 kernels do."""
    x = x16.astype(np.float32)
    centered = x - x.mean(-1, keepdims=True)
    var = (centered * centered).mean(-1, keepdims=True)
    return (centered / np.sqrt(var + np.float32(eps))).astype(np.float16)


spreads = np.logspace(0, 3, 31)
ln_err16, ln_err32, ln_err_careful, half_ulp, farthest = [], [], [], [], []
act_rng = np.random.default_rng(1)
for s in spreads:
    h = ta.tensor(act_rng.standard_normal((16, 256)) * s, dtype="float16")
    hh = h.numpy().astype(np.float64)
    ref = (hh - hh.mean(-1, keepdims=True)) / np.sqrt(hh.var(-1, keepdims=True) + 1e-5)
    with autocast("float16", policy={"layer_norm": "lower"}):
        y16 = ta.layer_norm(h).numpy().astype(np.float64)
    with autocast("float16"):
        y32 = ta.layer_norm(h).numpy().astype(np.float64)
    ln_err16.append(np.abs(y16 - ref).max())
    ln_err32.append(np.abs(y32 - ref).max())
    ln_err_careful.append(np.abs(careful_fp16_layer_norm(h.numpy()).astype(np.float64) - ref).max())
    half_ulp.append(formats.ulp(np.abs(ref).max()) / 2)  # the rounding of the largest output to FP16
    farthest.append(np.abs(hh - hh.mean(-1, keepdims=True)).max())
ln_err16, ln_err32, ln_err_careful = np.array(ln_err16), np.array(ln_err32), np.array(ln_err_careful)
farthest = np.array(farthest)

h = ta.tensor(np.random.default_rng(2).standard_normal((2, 256)) * 300, dtype="float16")
with autocast("float16", policy={"layer_norm": "lower"}):
    dead = ta.layer_norm(h)
with autocast("float16"):
    alive = ta.layer_norm(h)
print(f"activations of spread 300, layer norm in FP16: output range [{dead.numpy().min()}, {dead.numpy().max()}]")
print(f"the same under autocast (FP32): std of each row {np.round(alive.numpy().std(-1), 4)}")
careful = careful_fp16_layer_norm(h.numpy()).astype(np.float64)
print(f"the same in a careful FP16 kernel (statistics in FP32): std of each row {np.round(careful.std(-1), 4)}")
print(
    f"largest error over the sweep: naive FP16 {ln_err16.max():.2f}, careful FP16 {ln_err_careful.max():.2e}, "
    f"FP32 {ln_err32.max():.2e}"
)
assert np.all(dead.numpy() == 0) and np.allclose(alive.numpy().std(-1), 1.0, atol=1e-3)
assert np.allclose(careful.std(-1), 1.0, atol=1e-3)
assert np.all(ln_err32 < 1e-5)
# the careful kernel's error is the rounding of its output: half an FP16 ulp (plus FP32's ~1e-7)
assert np.all(ln_err_careful <= np.array(half_ulp) + 1e-6)
# the naive one fails at exactly the spreads whose sample has an activation 256 or more from its row mean
# (no sample here lies within a few units of 256, where FP16's own rounding of x - mean would decide)
assert np.all(np.abs(farthest - 256) > 4)
assert np.array_equal(ln_err16 > 1.0, farthest >= 256) and np.all(ln_err16[farthest < 256] < 0.05)
first_dead = spreads[np.argmax(farthest >= 256)]
print(f"first spread of the sweep with an activation 256 from its mean: {first_dead:.0f}")

fig, ax = plt.subplots(figsize=(7, 4))
ax.loglog(spreads, ln_err16, "s-", ms=3, label="naive FP16 layer norm (policy override)")
ax.loglog(spreads, ln_err_careful, "o-", ms=3, label="careful FP16 kernel: statistics in FP32")
ax.loglog(spreads, ln_err32, "^-", ms=3, label="autocast default: layer norm in FP32")
ax.axvline(first_dead, color="gray", ls=":", lw=1)
ax.text(first_dead * 1.1, 1e-2, "from here some |x - mean| >= 256:\n(x - mean)^2 > 65504 in FP16", fontsize=8)
ax.set_xlabel("standard deviation of the activations")
ax.set_ylabel("max |y - y_float64|")
ax.set_title("Layer norm of 16 rows of 256 activations", fontsize=9)
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=7)
fig.tight_layout()
ln_path = OUT / "06_layer_norm_error.png"
fig.savefig(ln_path, dpi=110)

# %% [markdown]
# ## 6. The cast log of a forward pass
#
# `autocast(log_casts=True)` records every cast it makes: which op asked, from which dtype to
# which, the shape, and whether the copy came from the block's cache. Here is one forward pass
# of a small network with FP32 parameters (PyTorch's usual setting; tutorial 4 keeps FP16
# weights with FP32 masters instead, and then the linear layers' weights need no cast).

# %%
ta.manual_seed(0)
net = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 10))
xb = ta.tensor(np.random.default_rng(3).standard_normal((4, 16)), dtype="float32")
yb = ta.tensor(np.array([1, 0, 3, 9]))
with autocast("float16", log_casts=True) as ac:
    loss = ta.cross_entropy(net(xb), yb)
print(ac.format_cast_log())
print(f"loss: {loss.item():.4f} ({loss.dtype})")

to16 = {(r.op, r.shape) for r in ac.cast_log if r.to_dtype == "float16"}
to32 = {(r.op, r.shape) for r in ac.cast_log if r.to_dtype == "float32"}
assert ("linear", (32, 16)) in to16 and ("linear", (10, 32)) in to16  # weights go down to FP16 ...
assert ("layer_norm", (4, 32)) in to32 and ("cross_entropy", (4, 10)) in to32  # ... sensitive ops back up
assert loss.dtype == np.float32

# %% [markdown]
# The same forward pass as a picture of its graph (`tinyamp.inspect.draw_graph`): one box per op
# and per leaf, each with the shape and dtype it produces (FP16 red, FP32 blue), and the casts
# autocast inserted drawn with a thick border. `to_dot` writes the same graph for Graphviz.

# %%
from tinyamp.inspect import draw_graph, to_dot

fig = draw_graph(loss, net)  # before backward(), which frees the graph as it goes
fig.savefig(OUT / "06_graph.png", dpi=110)
dot = to_dot(loss, net)
made = [r for r in ac.cast_log if not r.cached]
# every cast autocast made is a box of the picture: a Cast op, or the copy of a tensor that needs no gradient
assert dot.count("Cast (autocast)") + dot.count("autocast copy") == len(made)
fig  # noqa: B018  (the cell's value: a notebook draws the figure under the cell)

# %% [markdown]
# Read the log top to bottom: the first linear casts its input, weight and bias to FP16; layer
# norm takes the FP16 activations back to FP32 (its own FP32 parameters need no cast); GELU
# is not in the table and runs in whatever it receives; the last linear goes to FP16 again;
# and the loss widens the FP16 logits to FP32.
#
# ## 7. Overriding one entry
#
# Change one row, keep the rest: `autocast(policy={"layer_norm": "lower"})`. The log shows the
# effect directly, and the output dtype of layer norm changes with it.

# %%
table_before = dict(DEFAULT_POLICY)
with autocast("float16", policy={"layer_norm": "lower"}, log_casts=True) as ac_low:
    ln_out = net[1](net[0](xb))
print(ac_low.format_cast_log())
with autocast("float16") as ac_default:
    ln_default = net[1](net[0](xb))
print(f"layer norm output: {ln_out.dtype} with the override, {ln_default.dtype} by default")
ln_casts = [r for r in ac_low.cast_log if r.op == "layer_norm"]
assert ln_out.dtype == np.float16 and ln_default.dtype == np.float32
assert ln_casts and all(r.to_dtype == "float16" for r in ln_casts)  # its FP32 weight and bias go down
assert DEFAULT_POLICY == table_before  # the override lived in that block only: the table is unchanged

# %% [markdown]
# ## 8. A weight used twice is cast once
#
# Within one autocast block, each parameter is cast once and the copy is reused by every op
# that reads it. A layer applied twice (weight tying, a recurrent cell, a shared block) thus
# costs one cast, not two, and its two gradients meet at the single Cast node: they are summed
# there into one FP16 gradient (added in FP32 and rounded once) and widened to FP32 once. The
# cache belongs to the block; the next forward (the next block, after the weights were
# updated) casts again.

# %%
ta.manual_seed(1)
shared = nn.Linear(32, 32)
xs = ta.tensor(np.random.default_rng(4).standard_normal((4, 32)), dtype="float32")

for forward in range(2):
    with autocast("float16", log_casts=True) as ac_shared:
        out = shared(ta.relu(shared(xs)))  # the same layer, twice
    weight_casts = [r for r in ac_shared.cast_log if r.shape == (32, 32)]
    cast_nodes = [fn for fn in autograd.walk(out) if isinstance(fn, Cast) and fn.inputs[0] is shared.weight]
    print(
        f"forward {forward}: weight cast records {[('cached' if r.cached else 'new') for r in weight_casts]}, "
        f"Cast nodes of the weight in the graph: {len(cast_nodes)}"
    )
    assert [r.cached for r in weight_casts] == [False, True]  # new copy on first use, cached on the second
    assert len(cast_nodes) == 1  # one FP16 copy per forward
    first_use = out.creator.inputs[0].creator.inputs[0].creator.inputs[1]
    assert first_use is out.creator.inputs[1]  # both layers read the very same FP16 tensor

out.float().sum().backward()
assert shared.weight.grad.dtype == np.float32
print(f"the shared weight's gradient arrives as {shared.weight.grad.dtype}, shape {shared.weight.grad.shape}")

# %% [markdown]
# ## Summary
#
# - Products go to FP16 because their FP16 inputs multiply exactly and the sum is kept in
#   FP32. Everything whose range or accumulation matters stays in FP32.
# - exp overflows above 11.09 (naive softmax gives NaN); a probability at or below
#   $2^{-25} \approx 3 \times 10^{-8}$ is 0 in FP16 and its log is $-\infty$ (an infinite loss);
#   sums pass 65504 or stall at 2048 in an FP16 accumulator; a naive FP16 layer norm's variance
#   overflows once an activation is 256 from its mean, and the layer outputs zeros.
# - The policy is data: print it, override a row per block, read the cast log.
# - Each parameter is cast once per block, however often it is used.
#
# Next: what the FP16 graph saves for backward, and trading compute for memory (tutorial 7).
