# %% [markdown]
# # 7. Memory: saved activations, and checkpointing
#
# Training memory has two parts. What is *held* between steps: weights, FP32 master copies,
# optimizer moments, gradients. And what a forward pass *saves* for its backward: the
# activations, which grow with the batch size and the depth and usually dominate. Mixed
# precision shrinks the second part, by exactly half for an MLP whose every op runs in FP16 and
# by less for a model with ops the policy keeps in FP32 (about a third less for the small
# transformer measured below), and, perhaps surprisingly, does not shrink the first: in the
# standard accounting it holds as many bytes per parameter as FP32. Gradient (activation)
# checkpointing then trades compute for the rest of the activation memory.
#
# You will learn:
#
# - to list, byte by byte, what a graph keeps for backward (`tinyamp.inspect.saved_tensors`),
#   why an MLP under autocast keeps exactly half, and why a transformer keeps more than half;
# - to itemize the memory held by role and dtype (`training_memory`), the standard accounting
#   (16 bytes per parameter with Adam, in FP32 and in mixed precision alike), and where
#   tinyamp's CPU path holds more;
# - how checkpointing (`tinyamp.checkpoint_sequential`) keeps only segment inputs and replays
#   the segments in backward: a measured peak (`peak_memory`) that grows like the square root
#   of the depth, one extra forward pass, and bit-identical gradients.
#
# The products run on one BLAS thread (`threadpool_limits(1)` below): OpenBLAS splits the work of
# a product differently for each thread count, so its float32 sums would round differently and
# the numbers printed here would depend on the machine (OpenBLAS starts one thread per core).
#
# Prerequisites: tutorial 2 (what a graph saves), tutorials 4 and 5 (the step with masters and
# a loss scaler) and tutorial 6 (the op policy).
#
# Time: about 3.6 s of CPU to run (5 s wall-clock on a busy shared 2-core machine), 15 minutes to read.

# %%
import math
import os
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from threadpoolctl import threadpool_limits

import tinyamp as ta
from tinyamp import autograd, nn, optim
from tinyamp.amp import LossScaler, MasterWeights, autocast
from tinyamp.experiments.tasks import CharTransformer
from tinyamp.inspect import format_training_memory, peak_memory, saved_tensors, training_memory
from tinyamp.ops.matmul import Linear as LinearOp

# figures go next to this file (or the notebook's folder, where __file__ is not defined)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = Path(os.environ.get("TINYAMP_TUTORIAL_OUT", HERE / "figures"))
OUT.mkdir(parents=True, exist_ok=True)
# One BLAS thread: with another thread count OpenBLAS splits each product's sums differently, and
# the float32 results round differently (and on a busy machine, threads wait for each other).
threadpool_limits(1)

# %% [markdown]
# ## 1. What the graph saves, row by row
#
# Each op keeps what its backward needs: a linear layer $y = x W^T + b$ keeps $x$ (for
# $\partial L / \partial W = G^T x$) and $W$ (for $\partial L / \partial x = G W$); a ReLU keeps
# its output (the mask). The ReLU's output is also the next linear's input: one array kept by
# two nodes, which the report lists twice and counts once.
#
# We build the same MLP twice from the same weights: in FP32, and as FP16 weights run under
# autocast, the mixed-precision setting of tutorial 4.

# %%
ta.manual_seed(0)
sizes = [64, 128, 128, 10]
mlp32 = nn.MLP(sizes)
mlp16 = nn.MLP(sizes)
mlp16.load_state_dict(mlp32.state_dict())
mlp16.half()
BATCH = 32
xb = ta.tensor(np.random.default_rng(0).standard_normal((BATCH, sizes[0])), dtype="float32")
yb = ta.tensor(np.arange(BATCH) % sizes[-1])

report32 = saved_tensors(mlp32(xb))
with autocast("float16"):
    report16 = saved_tensors(mlp16(xb))
print("FP32 graph of the logits:")
print(report32)
print("\nMixed-precision graph of the logits:")
print(report16)
print(
    f"\nsaved bytes: FP32 {report32.total_bytes:,}, mixed {report16.total_bytes:,}, "
    f"ratio {report16.total_bytes / report32.total_bytes}"
)
assert 2 * report16.total_bytes == report32.total_bytes  # exactly half
assert set(report16.bytes_by_dtype()) == {"float16"}

# %% [markdown]
# Every row of the mixed graph is FP16: the input is a cast copy (autocast rounds it for the
# first linear), the weights are the model's own FP16 arrays, and each activation comes out of
# an FP16 product. The same rows at 2 bytes instead of 4: exactly half.
#
# The loss adds two rows, the same in both precisions, because cross-entropy runs in FP32
# under the op policy (tutorial 6): its log-probabilities (batch x classes, FP32) and the
# integer labels.

# %%
loss_report32 = saved_tensors(ta.cross_entropy(mlp32(xb), yb))
with autocast("float16"):
    loss_report16 = saved_tensors(ta.cross_entropy(mlp16(xb), yb))
extra32 = loss_report32.total_bytes - report32.total_bytes
extra16 = loss_report16.total_bytes - report16.total_bytes
print(f"the loss adds {extra32:,} bytes in FP32 and {extra16:,} bytes in mixed precision")
assert extra32 == extra16 == BATCH * sizes[-1] * 4 + BATCH * 8  # FP32 log-probabilities + int64 labels

# %% [markdown]
# Exactly half holds for this MLP because every op in it runs in FP16. A model with ops that the
# policy keeps in FP32 saves those ops' arrays at 4 bytes. The small character transformer of
# `tinyamp demo --model transformer` (2 blocks, width 64, batch 32 of 32 characters): its layer
# norms run in FP32 and keep their FP32 input and statistics, and its softmax runs in FP32 and
# keeps its FP32 output; the linear after each layer norm keeps an FP16 copy of the layer norm's
# output, made by autocast (a "cast" row).

# %%
task = CharTransformer(chars=20_000)
gpt32, gpt16 = task.make_model(), task.make_model()  # the same weights (the same seed)
gpt16.half()
tokens, _ = next(task.batches())
gpt_report32 = saved_tensors(gpt32(tokens))
with autocast("float16"):
    gpt_report16 = saved_tensors(gpt16(tokens))
gpt_ratio = gpt_report16.total_bytes / gpt_report32.total_bytes
in_fp32 = sorted({r.op for r in gpt_report16.rows if r.dtype == "float32"})
print(f"transformer, saved bytes: FP32 {gpt_report32.total_bytes:,}, mixed {gpt_report16.total_bytes:,}, "
      f"ratio {gpt_ratio:.3f}; FP32 rows under autocast from {in_fp32}")  # fmt: skip
assert 0.6 < gpt_ratio < 0.7  # not half: about two thirds
assert in_fp32 == ["LayerNorm", "Softmax"]  # the policy's FP32 ops
assert gpt_report16.bytes_by_dtype()["float32"] > 0.3 * gpt_report16.total_bytes  # a third of what is kept

# %% [markdown]
# ## 2. What is held between steps
#
# `training_memory(model, optimizer)` itemizes the arrays that live from one step to the next,
# by role and dtype. We take one Adam step in each precision so that the moments and the
# gradients exist.


# %%
def one_step(model: nn.Module, opt, scaler: LossScaler | None) -> None:
    with autocast("float16", enabled=scaler is not None):
        loss = ta.cross_entropy(model(xb), yb)
    if scaler is None:
        loss.backward()
        opt.step()
    else:
        scaler.scale_loss(loss).backward()
        scaler.step(opt)


adam32 = optim.Adam(mlp32.named_parameters(), lr=1e-3)
adam16 = MasterWeights(optim.Adam(mlp16.named_parameters(), lr=1e-3))
one_step(mlp32, adam32, None)
one_step(mlp16, adam16, LossScaler())
held32, held16 = training_memory(mlp32, adam32), training_memory(mlp16, adam16)
print("FP32, Adam:")
print(format_training_memory(held32))
print("\nMixed precision (FP16 weights, FP32 masters), Adam:")
print(format_training_memory(held16))

n_params = mlp32.num_parameters()
per_param32 = sum(n for by in held32.values() for n in by.values()) / n_params
per_param16 = sum(n for by in held16.values() for n in by.values()) / n_params
print(f"\n{n_params:,} parameters: {per_param32:g} bytes each in FP32, {per_param16:g} in mixed precision")
assert held16["parameters"]["float16"] * 2 == held32["parameters"]["float32"]
assert held16["master weights"]["float32"] == held32["parameters"]["float32"]
assert held16["optimizer state"] == held32["optimizer state"]  # Adam's moments are FP32 either way

# The standard accounting (ZeRO, Rajbhandari et al. 2020) counts the FP16 weights and gradients
# and the FP32 masters and moments: 2 + 2 + 12 = 16 bytes, as in FP32 (4 + 4 + 8). tinyamp's CPU
# path also keeps each gradient widened to FP32 on its master (unscaling and the update read it
# there): 4 bytes more.
fp32_gradient_copy = held16["gradients"]["float32"] / n_params
standard16 = per_param16 - fp32_gradient_copy
print(f"standard accounting: {standard16:g} bytes each in mixed precision, + {fp32_gradient_copy:g} for the FP32 copy")
assert per_param32 == 16 and standard16 == 16 and fp32_gradient_copy == 4 and per_param16 == 20

# free_model_grads=True drops each FP16 gradient once it is widened: 2 bytes less held.
mlp_free = nn.MLP(sizes)
mlp_free.load_state_dict(mlp32.state_dict())
mlp_free.half()
adam_free = MasterWeights(optim.Adam(mlp_free.named_parameters(), lr=1e-3), free_model_grads=True)
one_step(mlp_free, adam_free, LossScaler())
per_param_free = sum(n for by in training_memory(mlp_free, adam_free).values() for n in by.values()) / n_params
print(f"with free_model_grads=True: {per_param_free:g} bytes each")
assert per_param_free == 18

# %% [markdown]
# Per parameter, FP32 training with Adam holds 16 bytes (weight 4, gradient 4, two moments 8).
# Mixed precision, in the standard accounting of ZeRO (Rajbhandari et al. 2020), holds 16 too:
# FP16 weight 2, FP16 gradient 2, and 12 in FP32 for the master copy and the two moments.
# tinyamp's CPU path holds 20: it also keeps each gradient widened to FP32 on its master, where
# the loss scaler unscales it and the optimizer reads it (on a GPU, the fused kernels of
# `tinyamp/engine/cuda/scaler_step.py` read the FP16 gradient directly and store no FP32 copy). With
# `free_model_grads=True` it drops the FP16 gradient instead, for 18. Either way mixed precision
# does not save memory per parameter; Micikevicius et al. (2018) make the same point: the FP32
# master copy makes the weights 50% larger, while activations dominate training memory. What
# mixed precision saves is activation memory, and the bandwidth and time of the products that
# read it, and those grow with batch and depth.
#
# ## 3. Checkpointing: keep less, compute again
#
# A network of $n$ blocks keeps every block's activations until the backward pass reaches
# it, so memory grows linearly with $n$. Checkpointing (Chen et al. 2016, "Training deep nets
# with sublinear memory cost") keeps only the input of each segment of $k$ blocks; in
# backward, each segment is run forward again, from its saved input, and backpropagated
# through the fresh graph. Memory is then about $n/k$ segment inputs plus one segment's
# activations, minimized near $k = \sqrt n$; the price is one extra forward pass.
#
# `tinyamp.checkpoint_sequential(blocks, every, x)` does this. The replay runs under the same
# autocast policy and the same random state as the first forward (dropout draws the same
# masks), so it computes the same values, and the gradients are the same bits.
#
# We use a deep stack of Linear(64, 64) + ReLU blocks with a batch of 1024: activations, not
# weights, dominate, as in a transformer on long sequences.

# %%
WIDTH, DEEP_BATCH, CLASSES = 64, 1024, 10
data_rng = np.random.default_rng(1)
x_deep = ta.tensor(data_rng.standard_normal((DEEP_BATCH, WIDTH)), dtype="float32")
y_deep = ta.tensor(data_rng.integers(0, CLASSES, DEEP_BATCH))


def build(depth: int, regime: str):
    """A training-step function for `regime` in "fp32", "mixed", "mixed+checkpoint"; and its model."""
    ta.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(depth)]
    head = nn.Linear(WIDTH, CLASSES)
    model = nn.Sequential(*blocks, head)
    every = max(1, round(math.sqrt(depth)))
    if regime == "fp32":
        sgd = optim.SGD(model.parameters(), lr=0.01)

        def step() -> None:
            sgd.zero_grad()
            ta.cross_entropy(model(x_deep), y_deep).backward()
            sgd.step()

        return step, model
    model.half()
    opt = MasterWeights(optim.SGD(model.parameters(), lr=0.01), track_lost_updates=False)
    scaler = LossScaler()

    def forward() -> ta.Tensor:
        if regime == "mixed+checkpoint":
            return head(ta.checkpoint_sequential(blocks, every, x_deep))
        return head(nn.Sequential(*blocks)(x_deep))

    def step() -> None:
        opt.zero_grad()
        with autocast("float16"):
            loss = ta.cross_entropy(forward(), y_deep)
        scaler.scale_loss(loss).backward()
        scaler.step(opt)

    step.forward = forward
    return step, model


def measure(step, repeats: int = 3) -> tuple[int, float]:
    """Median peak bytes and median seconds of `repeats` steps (after one warm-up step)."""
    step()  # the first step creates the optimizer state and master gradients
    peaks, seconds = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        _, peak = peak_memory(step)
        seconds.append(time.perf_counter() - start)
        peaks.append(peak)
    return int(np.median(peaks)), float(np.median(seconds))


DEPTH = 64  # deep enough that activations, not the weight gradients, set the peak
step_plain, model_plain = build(DEPTH, "mixed")
step_ckpt, model_ckpt = build(DEPTH, "mixed+checkpoint")
with autocast("float16"):
    saved_plain = saved_tensors(step_plain.forward()).total_bytes
    saved_ckpt = saved_tensors(step_ckpt.forward()).total_bytes
peak_plain, time_plain = measure(step_plain)
peak_ckpt, time_ckpt = measure(step_ckpt)
print(f"depth {DEPTH}, checkpoint every {round(math.sqrt(DEPTH))} blocks")
print(f"{'':<18}{'saved by graph':>16}{'peak of a step':>16}{'time of a step':>16}")
print(f"{'mixed':<18}{saved_plain / 1e6:>13.2f} MB{peak_plain / 1e6:>13.2f} MB{time_plain * 1e3:>13.1f} ms")
print(f"{'mixed+checkpoint':<18}{saved_ckpt / 1e6:>13.2f} MB{peak_ckpt / 1e6:>13.2f} MB{time_ckpt * 1e3:>13.1f} ms")
assert saved_ckpt * 4 < saved_plain  # only 8 segment inputs (and the head) are kept
assert peak_ckpt * 2 < peak_plain  # the measured peak of the whole step falls at least twofold

# %% [markdown]
# The peak falls less than the saved bytes: a step also holds things no checkpoint removes
# (the FP32 master gradients, the FP32 widened operands of the emulated FP16 products, one
# segment's activations during its replay). The extra work is one more forward pass of the
# blocks, which we can count exactly: the number of Linear forwards in one training step. (The
# time ratio printed with it is measured, and moves with the load of the machine.)


# %%
def linear_forwards(step) -> int:
    count = 0

    def hook(direction: str, fn, arrays) -> None:
        nonlocal count
        count += direction == "forward" and isinstance(fn, LinearOp)

    autograd.hooks.append(hook)
    try:
        step()
    finally:
        autograd.hooks.remove(hook)
    return count


n_plain, n_ckpt = linear_forwards(step_plain), linear_forwards(step_ckpt)
print(
    f"Linear forwards per step: {n_plain} without checkpointing, {n_ckpt} with "
    f"(time ratio measured here: {time_ckpt / time_plain:.2f}x)"
)
assert n_plain == DEPTH + 1 and n_ckpt == 2 * DEPTH + 1  # each block once more; the head is not checkpointed

# %% [markdown]
# And the gradients: same weights, same batch, one backward with and one without
# checkpointing. They are compared bit for bit (as unsigned integers), not within a tolerance.


# %%
def gradients(model: nn.Module, forward) -> list[np.ndarray]:
    model.zero_grad()
    with autocast("float16"):
        loss = ta.cross_entropy(forward(), y_deep)
    (loss * 1024.0).backward()  # a static loss scale, so that few FP16 gradients underflow
    return [p.grad.copy() for p in model.parameters()]


model_ckpt.load_state_dict(model_plain.state_dict())  # the two models took different steps above
g_plain = gradients(model_plain, step_plain.forward)
g_ckpt = gradients(model_ckpt, step_ckpt.forward)
identical = all(np.array_equal(a.view(np.uint16), b.view(np.uint16)) for a, b in zip(g_plain, g_ckpt))
print(f"{len(g_plain)} gradient arrays ({g_plain[0].dtype}), bit-identical with and without checkpointing: {identical}")
assert identical and any(np.count_nonzero(g) for g in g_plain)

# %% [markdown]
# ## 4. Peak memory against depth
#
# Finally the three regimes at several depths (width 64, batch 1024, checkpointing every
# round($\sqrt{\text{depth}}$) blocks), each the measured peak of one full training step:
# forward, backward and optimizer update.

# %%
depths = [4, 9, 16, 25, 36]
regimes = ["fp32", "mixed", "mixed+checkpoint"]
peaks_mb: dict[str, list[float]] = {r: [] for r in regimes}
for depth in depths:
    for regime in regimes:
        step, _ = build(depth, regime)
        peaks_mb[regime].append(measure(step, repeats=1)[0] / 1e6)
print(f"{'depth':>5}" + "".join(f"{r:>20}" for r in regimes))
for i, depth in enumerate(depths):
    print(f"{depth:>5}" + "".join(f"{peaks_mb[r][i]:>17.2f} MB" for r in regimes))

p32, pmix, pck = (np.array(peaks_mb[r]) for r in regimes)
slope32, slope_mix, slope_ck = (np.polyfit(depths, p, 1)[0] for p in (p32, pmix, pck))
print(
    f"growth per block: fp32 {slope32 * 1e3:.0f} KB, mixed {slope_mix * 1e3:.0f} KB, "
    f"mixed+checkpoint {slope_ck * 1e3:.0f} KB"
)
assert np.all(pmix[1:] < p32[1:]) and np.all(pck[1:] < pmix[1:])
assert pck[0] > pmix[0]  # at depth 4 checkpointing costs memory: the figure's crossing, explained below
assert 0.4 < slope_mix / slope32 < 0.6  # FP16 activations: half the bytes per block
assert (pck[-1] - pck[0]) < 0.4 * (pmix[-1] - pmix[0])  # checkpointing: far slower growth

# Which law the checkpointed peaks follow: least-squares lines in sqrt(depth) and in depth, and
# the largest distance of a measured peak from each. Without checkpointing, a line in depth.
fit_sqrt = np.polyfit(np.sqrt(depths), pck, 1)
off_sqrt = np.abs(np.polyval(fit_sqrt, np.sqrt(depths)) - pck).max()
off_line = np.abs(np.polyval(np.polyfit(depths, pck, 1), depths) - pck).max()
off_mix = np.abs(np.polyval(np.polyfit(depths, pmix, 1), depths) - pmix).max()
print(
    f"mixed+checkpoint: peaks within {off_sqrt * 1e3:.0f} KB of a line in sqrt(depth), {off_line * 1e3:.0f} KB of "
    f"a line in depth; mixed: within {off_mix * 1e3:.0f} KB of a line in depth"
)
assert off_sqrt < off_line / 3 and off_sqrt < 0.02 * pck[-1]  # square-root growth fits; linear does not
assert off_mix < 0.02 * pmix[-1]  # without checkpointing: linear

fig, ax = plt.subplots(figsize=(6.5, 4))
for regime in regimes:
    ax.plot(depths, peaks_mb[regime], marker="o", label=regime)
ax.plot(depths, np.polyval(fit_sqrt, np.sqrt(depths)), "k:", lw=1.6, zorder=3, label="a + b sqrt(depth), fitted")
ax.annotate("depth 4: mixed+checkpoint above mixed\n(2 inputs + 2 replayed blocks = 4 blocks)", (depths[0], pck[0]),
            xytext=(14, 0.9), fontsize=7, arrowprops={"arrowstyle": "->", "lw": 0.7})  # fmt: skip
ax.set_xlabel("depth (Linear + ReLU blocks)")
ax.set_ylabel("peak memory of one training step (MB, measured)")
ax.set_title(f"Width {WIDTH}, batch {DEEP_BATCH}; checkpoint every round(sqrt(depth)) blocks", fontsize=9)
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
depth_path = OUT / "07_peak_memory_by_depth.png"
fig.savefig(depth_path, dpi=110)

# %% [markdown]
# Without checkpointing the peak grows linearly with depth, and the mixed-precision line grows
# half as fast as the FP32 one: each block saves FP16 activations. With checkpointing it
# grows like $\sqrt{\text{depth}}$ (the measured peaks lie on the fitted dotted line): with
# $k = \sqrt{n}$ both the number of segment inputs kept, $n/k$, and the length of the segment
# replayed, $k$, grow like $\sqrt{n}$.
#
# At depth 4 the lines cross: the checkpointed peak is *above* the plain one. There $n/k + k =
# 2 + 2$ blocks' worth of arrays, as many as the 4 blocks the plain step keeps, so checkpointing
# has nothing to save, and what the replay allocates for itself (its recomputed forward, run
# while the gradient of the segment after it is held) comes on top. From depth 9, where
# $n/k + k = 6 < 9$, it saves more the deeper the network (asserted for every depth from 9 on).
#
# ## Summary
#
# - `saved_tensors` lists every array a graph keeps; under autocast an MLP's graph keeps
#   exactly half the bytes of the FP32 one, the small transformer about two thirds (its layer
#   norms and softmax run in FP32 and keep FP32 arrays).
# - Mixed precision holds no fewer bytes per parameter: 16 with Adam in the standard
#   accounting, as in FP32 (20 in tinyamp's CPU path, which keeps an FP32 gradient copy). Its
#   saving is in the activations, which grow with batch and depth.
# - Checkpointing keeps only segment inputs and replays each segment in backward: one extra
#   forward pass, a peak that grows like the square root of the depth, and gradients that are
#   the same bits.
#
# Next: where the speed of mixed precision comes from, measured on this machine (tutorial 8).
