# %% [markdown]
# # 3. Everything in FP16: what breaks and why
#
# The obvious way to train in half precision is to cast the model to FP16 and train as usual.
# This tutorial does exactly that on a real network, the MLP that `tinyamp demo` trains on the
# 8x8 handwritten digits, next to the same network in FP32, and measures the three ways FP16
# fails, one per part of a training step:
#
# - **forward: overflow.** A value above 65504 becomes inf. We find where it happens with
#   `tinyamp.inspect.find_overflow`, which names the op and the module.
# - **backward: underflow.** A gradient at or below $2^{-25}$, half FP16's smallest subnormal,
#   becomes 0. We count, for the same weights and the same batch, how many gradient values FP16
#   turns into zeros that FP32 keeps.
# - **update: lost updates.** A weight update smaller than half the gap from its weight to the
#   next FP16 value in its direction does not change the weight (tutorial 1). We count the lost
#   updates over a training run and compare the loss curves. The last section trains the demo's
#   run in BF16, whose 8 significant bits lose nearly every update: there training fails.
#
# Tutorial 1 explained the formats and the arithmetic of FP16 products; here we see their limits
# on a network that learns.
# Tutorials 4 and 5 repair the last two failures; tutorial 6 explains the op policy that
# avoids the first.
#
# The products run on one BLAS thread (`threadpool_limits(1)` below): OpenBLAS splits the work of
# a product differently for each thread count, so its float32 sums would round differently and
# the numbers printed here would depend on the machine (OpenBLAS starts one thread per core).
#
# Prerequisites: tutorial 1 (sections 4 to 7: underflow, the ulp and lost additions, FP16 products)
# and tutorial 2 (section 3, the dtype of a gradient).
#
# Time: about 11 s of CPU to run (five training runs of 1500 steps), 40 minutes to read
# (a reader took 35 to 40).

# %%
import contextlib
import copy
import os
from pathlib import Path

import matplotlib.pyplot as plt
import ml_dtypes
import numpy as np
from threadpoolctl import threadpool_limits

import tinyamp as ta
from tinyamp import nn
from tinyamp.amp import autocast, formats
from tinyamp.cli import DEMO_MEASURE_EVERY, DEMO_MLP_STEPS
from tinyamp.experiments.diagnosis import diagnose
from tinyamp.experiments.measure import LostUpdateMeter
from tinyamp.experiments.regimes import REGIMES
from tinyamp.experiments.runner import run_regime
from tinyamp.experiments.tasks import KERAS_SGD_DEFAULTS, DigitsMLP
from tinyamp.inspect import find_overflow

# figures go next to this file (or the notebook's folder, where __file__ is not defined)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = Path(os.environ.get("TINYAMP_TUTORIAL_OUT", HERE / "figures"))
OUT.mkdir(parents=True, exist_ok=True)
# One BLAS thread: with another thread count OpenBLAS splits each product's sums differently, and
# the float32 results round differently (and on a busy machine, threads wait for each other).
threadpool_limits(1)

FP16 = formats.get_format("float16")

# %% [markdown]
# ## 1. Two training runs: FP32 and FP16
#
# `DigitsMLP` (from `tinyamp.experiments`, the code behind `tinyamp demo`) holds the data (1438
# training and 359 test images of 64 pixels in $[0, 1]$), builds a 64-256-256-10 ReLU MLP from a
# fixed seed, and gives the demo's optimizer: SGD with momentum 0.9 and a learning rate of 0.05
# that decays along a cosine to 0. We use a batch of 32 instead of the demo's 128 and 1500 steps
# (about 33 epochs), so that both runs take a few seconds. Both runs start from the same weights
# and see the same batches in the same order.
#
# The FP16 run is the demo's `fp16` regime:

# %%
print("fp16 regime:", REGIMES["fp16"].summary)
STEPS = 1500
MEASURE_EVERY = 10
task = DigitsMLP(batch_size=32)
print(task.make_model())

# %% [markdown]
# Concretely, three things change against FP32:
#
# - `model.half()` stores every weight in FP16 (2 bytes each);
# - the forward pass runs under `autocast("float16")`, so the matrix products take FP16
#   operands, accumulate in FP32 and round the result to FP16, the model of a GPU's Tensor
#   Cores (tutorial 1, section 7). Autocast keeps the loss (softmax and cross-entropy, with its
#   mean over the batch) in FP32; section 2 shows why;
# - the optimizer updates the FP16 weights in place: tinyamp's SGD keeps its momentum buffers in
#   FP32, computes each update in FP32 and rounds the new weight once to FP16. There is no FP32
#   copy of the weights.
#
# Every `MEASURE_EVERY` steps a `LostUpdateMeter` replays the optimizer's arithmetic on copies
# and counts the weight elements whose update was nonzero but whose FP16 weight did not move.


# %%
def train(precision):
    """Train a fresh MLP for STEPS steps in "fp32" or "fp16"; the model, losses, lost updates, scores, optimizer."""
    model = task.make_model()  # the same initial weights every call (seeded)
    if precision == "fp16":
        model.half()
    opt = task.make_optimizer(model.named_parameters())
    meter = LostUpdateMeter(opt) if precision == "fp16" else None
    forward_context = (lambda: autocast("float16")) if precision == "fp16" else contextlib.nullcontext
    losses, lost = [], []
    batches = task.batches()  # the same batches for both runs
    for step in range(STEPS):
        batch = next(batches)
        opt.lr = task.lr_at(step, STEPS)
        opt.zero_grad()
        with forward_context():
            loss = task.loss(model, batch)
        loss.backward()
        measured = meter is not None and step % MEASURE_EVERY == 0
        if measured:
            meter.before_step()
        opt.step()
        if measured:
            changed, n_lost = meter.after_step(skipped=False)
            lost.append((step, changed, n_lost))
        losses.append(loss.item())
    scores = task.evaluate(model, forward_context)
    return model, np.array(losses), np.array(lost), scores, opt


model32, loss32, _, scores32, _ = train("fp32")
model16, loss16, lost16, scores16, opt16 = train("fp16")
for name, scores in (("fp32", scores32), ("fp16", scores16)):
    print(f"{name}: loss on the training set {scores['train_loss']:.5f}, test accuracy {scores['accuracy']:.2%}")

# %% [markdown]
# FP16 trained: the test accuracy is within a point of FP32's. But its training loss ended
# higher. The rest of this tutorial takes the trained FP16 network apart to see why, and what
# else went wrong on the way.
#
# Before taking it apart: "everything in FP16" is FP16 *storage* and FP16 *arithmetic in the
# layers*, not FP16 everywhere. We replay one step on a copy of the trained network and
# optimizer (the trained ones stay untouched for the sections below) and check each part: the
# weights, the first layer's output (FP16, with exactly the bits of FP32 accumulation rounded
# once), the loss, the weight gradients, the momentum buffers, and the update, which must be the
# FP32 arithmetic of SGD rounded once into the FP16 weight.

# %%
model_c, opt_c = copy.deepcopy((model16, opt16))  # one copy of both: the optimizer holds the copy's weights
opt_c.lr = task.lr_at(0, STEPS)  # the full learning rate, 0.05, so that the update is not near 0
x_batch, y_batch = next(task.batches(start=STEPS))
first = model_c[0]
with autocast("float16"), ta.no_grad():
    h1 = first(x_batch).numpy()
# the layer's FP16 operands (autocast rounds the FP32 input), widened exactly to FP32
x16, w16, b16 = (a.astype(np.float16).astype(np.float32) for a in (x_batch.numpy(), first.weight.data, first.bias.data))
fp32_accumulated = (x16 @ w16.T + b16).astype(np.float16)
fp16_accumulated = np.zeros_like(h1)
for k in range(x16.shape[1]):  # the same exact products, summed by an FP16 accumulator: each addition rounded
    fp16_accumulated = (fp16_accumulated.astype(np.float32) + x16[:, k : k + 1] * w16[:, k]).astype(np.float16)
fp16_accumulated = (fp16_accumulated.astype(np.float32) + b16).astype(np.float16)

opt_c.zero_grad()
with autocast("float16"):
    loss_c = task.loss(model_c, (x_batch, y_batch))
loss_c.backward()
w_before = [p.data.copy() for p in opt_c.params]
buf_before = [s["momentum_buffer"].copy() for s in opt_c.state]
opt_c.step()
replayed = []  # SGD with momentum in FP32, as optim/sgd.py writes it, rounded once to FP16
for p, w, buf in zip(opt_c.params, w_before, buf_before):
    buf = buf * opt_c.momentum + p.grad.astype(np.float32)
    replayed.append(np.array_equal(p.data, (w.astype(np.float32) - opt_c.lr * buf).astype(np.float16)))

parts = {
    "weights": {p.dtype.name for p in opt_c.params},
    "first layer's output": {h1.dtype.name},
    "loss (softmax, cross-entropy, mean)": {loss_c.dtype.name},
    "weight gradients": {p.grad.dtype.name for p in opt_c.params},
    "momentum buffers": {s["momentum_buffer"].dtype.name for s in opt_c.state},
}
for part, dtypes_seen in parts.items():
    print(f"{part:<36} {', '.join(sorted(dtypes_seen))}")
differ16 = int(np.sum(fp16_accumulated != fp32_accumulated))
print(f"first layer: the bits of FP32 accumulation rounded once: {np.array_equal(h1, fp32_accumulated)}; "
      f"an FP16 accumulator would differ in {differ16} of {h1.size} outputs")  # fmt: skip
print(f"update = FP32 SGD with momentum rounded once to FP16, for all {len(replayed)} parameters: {all(replayed)}")
assert parts["weights"] == parts["first layer's output"] == parts["weight gradients"] == {"float16"}
assert parts["loss (softmax, cross-entropy, mean)"] == parts["momentum buffers"] == {"float32"}
assert np.array_equal(h1.view(np.uint16), fp32_accumulated.view(np.uint16)) and differ16 > 0
assert all(replayed)

# %% [markdown]
# So the fp16 regime already keeps three things in FP32: the accumulation inside every matrix
# product, the loss, and the optimizer's momentum and update arithmetic. What it keeps in FP16 is
# every weight, every layer's output and the gradients of both, and the failures below come from
# those.
#
# ## 2. Forward: overflow
#
# FP16's largest value is 65504. How close do this network's activations come? We run the
# test set through the trained FP16 network entirely in FP16 (no autocast) and print the
# largest magnitude at the output of each layer.

# %%
x_test16 = ta.tensor(task.data["x_test"]).half()
peak = {}
with ta.no_grad():
    h = x_test16
    for name, layer in model16.named_children():
        h = layer(h)
        peak[name] = float(np.abs(h.numpy().astype(np.float32)).max())
        print(
            f"after layer {name} ({type(layer).__name__:<6}): max |value| {peak[name]:8.3f}, "
            f"{FP16.max / peak[name]:6.0f}x below the FP16 limit"
        )
logits16 = h
assert max(peak.values()) < FP16.max / 1000  # inputs in [0, 1] and sensible weights: far from 65504

# PyTorch's default initialization, which DigitsMLP uses: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), whose
# variance is (2 / sqrt(fan_in))^2 / 12 = 1 / (3 fan_in). The sample variance of n uniform values
# has a relative standard error of sqrt(0.8 / n): 1.8% for the 2560 weights of the last layer.
for name, layer in task.make_model().named_children():
    if isinstance(layer, nn.Linear):
        w = layer.weight.numpy().astype(np.float64)
        fan_in = w.shape[1]
        ratio = w.var() * 3 * fan_in
        print(f"layer {name}: fan-in {fan_in:3d}, initial weight variance x 3 fan-in = {ratio:.3f}")
        assert np.abs(w).max() <= 1 / np.sqrt(fan_in) and abs(ratio - 1) < 4 * np.sqrt(0.8 / w.size)

# %% [markdown]
# The hidden activations use a tiny part of FP16's range: inputs in $[0, 1]$ and weights drawn
# from $U(\pm 1/\sqrt{\text{fan-in}})$, of variance $1/(3\,\text{fan-in})$, keep every layer's
# outputs of order 1. The logits are larger, because training makes the network confident: the
# logit of the right class grows until the softmax probability is close to 1. That is where the
# danger is. A softmax written straight from its definition, $p_i = e^{z_i} / \sum_j e^{z_j}$,
# computes $e^{z}$, and in FP16 $e^{z}$ overflows for $z > \ln 65504 \approx 11.09$.
#
# We append such a naive softmax to the trained network as a module of its own and run the
# test set through it in FP16, with `find_overflow` watching every op. It records each op
# whose output leaves the FP16 range, with the op, the module that ran it, and the count.


# %%
class NaiveSoftmax(nn.Module):
    """$p_i = e^{z_i} / \\sum_j e^{z_j}$, without subtracting the maximum first."""

    def forward(self, z):
        e = z.exp()
        return e / e.sum(axis=1, keepdims=True)


probe = nn.Sequential(*model16, NaiveSoftmax())  # modules "0" to "4" are the MLP's, "5" the softmax
with np.errstate(over="ignore", invalid="ignore"), ta.no_grad(), find_overflow(probe) as found:
    probs = probe(x_test16).numpy()
for event in found.events:
    print(event)
nan_rows = np.isnan(probs).any(axis=1).mean()
zero_rows = (probs == 0).all(axis=1).mean()
confident = (logits16.numpy().astype(np.float32).max(axis=1) > np.log(FP16.max)).mean()
print(
    f"test images whose largest logit exceeds ln(65504) = {np.log(FP16.max):.2f}: {confident:.1%}; "
    f"images with NaN probabilities: {nan_rows:.1%}; with all probabilities 0: {zero_rows:.1%}"
)
assert found.first.direction == "forward" and found.first.op == "Exp" and found.first.module == "5"
assert nan_rows == confident > 0.5
assert zero_rows > 0  # a few rows: every exponential finite, their sum not

# %% [markdown]
# The first event is the `Exp` in module "5", the naive softmax; the later ones are the
# consequences: the sum of a row that contains inf is inf, and $\infty / \infty$ is NaN. Every
# test image whose largest logit exceeds 11.09 gets NaN probabilities, most of the test set. A
# few more rows have finite exponentials whose *sum* passes 65504: there every probability is
# a finite number divided by inf, 0.
#
# Two defences are built into tinyamp, and the second is why the training run above survived.
# `tinyamp.softmax` and `cross_entropy` subtract the row maximum before exponentiating (the
# result is mathematically the same, but every exponent is $\le 0$), and autocast's op policy
# runs `exp`, `softmax`, `log_softmax` and the losses in FP32, where $e^{26}$ is an ordinary
# number. Under autocast the same naive module runs its `exp` in FP32 and gives the right
# probabilities. `find_overflow` still reports the FP32 values above 65504, because it flags
# every value that *would* leave the FP16 range; the dtype in the report says they did not.

# %%
with ta.no_grad(), find_overflow(probe) as found32, autocast("float16"):
    probs_autocast = probe(x_test16).numpy()
    reference = ta.softmax(logits16.float(), axis=1).numpy()
print(found32.first)
assert found32.first.op == "Exp" and found32.first.dtype == "float32"
assert np.all(np.isfinite(probs_autocast)) and np.allclose(probs_autocast, reference, atol=1e-6)

# %% [markdown]
# ## 3. Backward: underflow
#
# The gradient of a mean loss over a batch of $N$ examples with respect to the logits is
# $(p - \text{onehot}(y)) / N$. For an example the network already gets right with
# probability $1 - 10^{-7}$, those entries are about $10^{-7} / 32 \approx 3 \times 10^{-9}$,
# ten times below $2^{-25} \approx 3 \times 10^{-8}$: FP16 rounds them to 0. At $1 - 10^{-6}$
# they are $3.1 \times 10^{-8}$, just above $2^{-25}$, and FP16 rounds them *up* to its smallest
# subnormal $2^{-24} \approx 6 \times 10^{-8}$, almost twice their size. Backward carries these
# small values through every layer.
#
# To measure it we take one batch and the trained FP16 weights, and compute the gradients twice:
# once in the FP16 network under autocast (what training computes), once in an FP32 copy of the
# same weights (the exact widening of each FP16 value, so the two differ only in the precision
# of the arithmetic). `retain_grad` keeps the gradient at the output of every layer, and we ask:
# of the gradient values FP32 finds nonzero, how many are exactly zero in FP16? Next to the
# measured share we print the share that `formats.flushed_to_zero_fraction` predicts by rounding
# the FP32 values to FP16.


# %%
assert formats.round_to(1e-7 / 32) == 0 and formats.round_to(1e-6 / 32) == FP16.min_subnormal


def gradients(model, batch, fp16):
    """Gradients at each layer's output and of each weight, for one batch, as float64 arrays."""
    x, y = batch
    outputs = []
    with autocast("float16") if fp16 else contextlib.nullcontext():
        h = x
        for layer in model:
            h = layer(h)
            h.retain_grad()
            outputs.append(h)
        loss = ta.cross_entropy(h, y)
    loss.backward()
    at_outputs = [o.grad.astype(np.float64) for o in outputs]
    of_weights = {name: p.grad.astype(np.float64) for name, p in model.named_parameters()}
    model.zero_grad()
    return at_outputs, of_weights


def underflow_report(model16, batch, title):
    """Print and return the share of nonzero FP32 gradient values that FP16 computes as 0."""
    model32 = copy.deepcopy(model16).float()  # the same weights, widened exactly
    act32, w32 = gradients(model32, batch, fp16=False)
    act16, w16 = gradients(model16, batch, fp16=True)
    print(title)
    shares, predicted, subnormal_shares = {}, {}, {}
    for (name, layer), g32, g16 in zip(model16.named_children(), act32, act16):
        nonzero = g32 != 0
        shares[name] = float(np.mean(g16[nonzero] == 0))
        predicted[name] = formats.flushed_to_zero_fraction(g32)
        subnormal = subnormal_shares[name] = float(np.mean(np.abs(g16[g16 != 0]) < FP16.min_normal))
        print(
            f"  output of {name} ({type(layer).__name__:<6}): {shares[name]:6.1%} flushed to 0 "
            f"(rounding predicts {predicted[name]:6.1%}); {subnormal:6.1%} of the survivors are subnormal"
        )
    g32_all = np.concatenate([g.ravel() for g in w32.values()])
    g16_all = np.concatenate([g.ravel() for g in w16.values()])
    shares["weights"] = float(np.mean(g16_all[g32_all != 0] == 0))
    print(f"  weight gradients:        {shares['weights']:6.1%} flushed to 0")
    return shares, predicted, subnormal_shares, np.concatenate([g.ravel() for g in act32])


batch = next(task.batches(start=STEPS))  # the batch after the last training batch
start, _, start_subnormal, _ = underflow_report(task.make_model().half(), batch, "initial weights:")
end, end_predicted, end_subnormal, act32_end = underflow_report(model16, batch, "after training:")

assert all(share < 0.01 for share in start.values())  # an untrained network: nothing underflows
assert all(share < 0.15 for share in start_subnormal.values())  # and the survivors are mostly normal
assert 0.6 < end["4"] < 0.72  # the logits' gradient, about two thirds: the errors of confident predictions
assert all(0.2 < end[name] < 0.36 for name in ("0", "1", "2", "3"))  # carried down through every layer
assert all(share > 0.5 for share in end_subnormal.values())  # most survivors are subnormal
assert 0.01 < end["weights"] < 0.1  # weight gradients are sums over the batch: a few percent
assert all(abs(end[name] - end_predicted[name]) < 0.03 for name in end_predicted)  # the format explains it

# %% [markdown]
# Before training nothing underflows (under 1% at every layer): the predictions are uncertain,
# $p - y$ is of order 0.1, and at most 15% of the gradients at any layer are subnormal. After
# training, about two thirds of the logits' gradient values are zero in FP16, and a fifth to a
# third at the hidden layers (the run prints each; asserted between 20% and 36%); most of
# the survivors are subnormal, with only a few significant bits. The measured shares are within
# 3 points of the prediction from rounding the FP32 values: the zeros come from the format, not
# from the way the FP16 backward pass is computed.
#
# The weight gradients fare better (a few percent are zero) because each is a sum over the 32
# examples of the batch, computed with FP32 accumulation in the FP16 product, and a sum of 32
# terms is usually larger than each of them. How much the zeros cost depends on the model:
# Micikevicius et al. (2018) trained their image classifiers in mixed precision without loss
# scaling, while their SSD detector, with many activation gradients below FP16's range (their
# Figure 3), needed loss scaling to match FP32 (tutorial 5). The histogram shows this
# network's FP32 activation gradients against FP16's bands.

# %%
nonzero = act32_end[act32_end != 0]
log2_grad = np.log2(np.abs(nonzero))
# Each value is coloured by what FP16 makes of it, not by the bin it falls in: the bin [-25, -24)
# holds 2^-25 itself, which rounds to 0, and the values above it, which round up to 2^-24.
in_fp16 = np.abs(formats.round_to(nonzero))
fates = {
    "0 in FP16 (at or below 2^-25)": in_fp16 == 0,
    "FP16 subnormal": (in_fp16 > 0) & (in_fp16 < FP16.min_normal),
    "FP16 normal": in_fp16 >= FP16.min_normal,
}
fig, ax = plt.subplots(figsize=(7.5, 4))
bins = np.arange(np.floor(log2_grad.min()), 3)  # from the smallest value up: every value drawn
stacks = ax.hist([log2_grad[m] for m in fates.values()], bins=bins, stacked=True, label=list(fates),
                 color=["#d62728", "#ff7f0e", "#2ca02c"], edgecolor="white", lw=0.3)  # fmt: skip
for edge in (-25, -14):
    ax.axvline(edge, color="grey", ls=":", lw=0.8)
ax.set_xlabel("log2 |gradient| (FP32, at the output of each layer)")
ax.set_ylabel("gradient values")
ax.set_title("Activation gradients of the trained MLP, one batch of 32")
ax.legend(fontsize=8)
fig.tight_layout()
hist_path = OUT / "03_gradient_histogram.png"
fig.savefig(hist_path, dpi=110)
below = float(np.mean(np.abs(nonzero) <= 2.0**-25))
print(f"{below:.1%} of the nonzero FP32 activation gradients are at or below 2^-25")
# Each fate is a band between the dotted lines, as the legend says: every red value at or left of
# -25, every orange one right of it and left of -14 (or on -14: within half an ulp of 2^-14, FP16
# rounds up to it), every green one from just below -14 up.
red, orange, green = (log2_grad[m] for m in fates.values())
assert red.max() <= -25 < orange.min() and orange.max() <= -14 and green.min() >= np.log2(2.0**-14 - 2.0**-25)
assert stacks[0][-1].sum() == nonzero.size  # and each value is drawn once: the top of the stack counts them all
assert fates["0 in FP16 (at or below 2^-25)"].mean() == below  # red: exactly the values at or below 2^-25
assert below > 0.2  # more than a fifth of the activation gradients lie in the red band

# %% [markdown]
# ## 4. Update: lost weight updates
#
# The third failure is in the optimizer step. SGD computes an update $\Delta$ in FP32 and
# writes $\text{fp16}(w + \Delta)$ back into the weight. If $|\Delta|$ is below half the gap from
# $w$ to the next FP16 value in $\Delta$'s direction, that is $w$ again: the update is lost. For
# a weight in $[2^k, 2^{k+1})$ half an ulp is $2^{k-11}$, and toward zero from $w = 2^k$ the gap
# is half as large (for $k > -14$). So a weight 2048 or more times larger than its update is at
# risk, and one 4096 or more times larger never moves (tutorial 4 works this out exactly).
#
# Updates shrink during training for two reasons: the gradients shrink as the examples are
# fitted, and the learning rate decays. The meter's counts show the effect.

# %%
steps_measured, changed, n_lost = lost16.T
lost_fraction = n_lost / changed
for s, f in list(zip(steps_measured, lost_fraction))[:: len(lost_fraction) // 10]:
    print(f"step {s:5d}: lr {task.lr_at(s, STEPS):.4f}, {f:6.1%} of the updates lost")
early = lost_fraction[: len(lost_fraction) // 5].mean()
late = lost_fraction[-len(lost_fraction) // 5 :].mean()
print(
    f"lost updates in the first fifth of the run: {early:.1%}; in the last fifth: {late:.1%}; "
    f"over the whole run: {n_lost.sum() / changed.sum():.1%}"
)
assert 0.2 < early < 1 / 3 and late > 0.95  # a fifth to a third early on, virtually all at the end

# %% [markdown]
# Even early on, a fifth to a third of the updates are lost: the weights whose gradients are
# small compared with the weights themselves do not move even at the full learning rate.
# In the last fifth of the run, with the learning rate near 0, virtually every update is lost.
# That alone would not matter, since FP32 makes only tiny changes there too. What matters is
# that the lost updates are not random noise: they are a systematic bias toward the current
# weights, and small consistent updates that would add up over hundreds of steps in FP32 add up
# to nothing in FP16. The loss curves show the consequence.


# %%
def smooth(values, window=50):
    kernel = np.ones(window) / window
    return np.convolve(values, kernel, mode="valid")


tail = STEPS // 10
final32, final16 = loss32[-tail:].mean(), loss16[-tail:].mean()
print(
    f"mean minibatch loss over the last {tail} steps: fp32 {final32:.5f}, fp16 {final16:.5f} ({final16 / final32:.2f}x)"
)
print(
    f"loss on the whole training set: fp32 {scores32['train_loss']:.5f}, fp16 {scores16['train_loss']:.5f} "
    f"({scores16['train_loss'] / scores32['train_loss']:.2f}x)"
)
assert final16 > 1.1 * final32
assert scores16["train_loss"] > 1.1 * scores32["train_loss"]
assert abs(scores16["accuracy"] - scores32["accuracy"]) <= 0.02

fig, (ax_loss, ax_lost) = plt.subplots(2, 1, figsize=(7.5, 6.5), sharex=True)
x_smooth = np.arange(len(smooth(loss32))) + 49
ax_loss.semilogy(x_smooth, smooth(loss32), color="#000000", lw=1.4, label="FP32")
ax_loss.semilogy(x_smooth, smooth(loss16), color="#d62728", lw=1.4, label="FP16 (no master weights)")
ax_loss.set_ylabel("minibatch loss (50-step average)")
ax_loss.set_title("Digits MLP, the same weights and batches in FP32 and in FP16")
ax_loss.grid(True, which="both", alpha=0.3)
ax_loss.legend()
ax_lost.plot(steps_measured, 100 * lost_fraction, color="#d62728", lw=1.2, label="updates lost in FP16")
ax_lr = ax_lost.twinx()
ax_lr.plot(np.arange(STEPS), [task.lr_at(s, STEPS) for s in range(STEPS)], color="#777777", ls="--", lw=1)
ax_lr.set_ylabel("learning rate (dashed)")
ax_lost.set_ylabel("% of updates lost")
ax_lost.set_xlabel("step")
ax_lost.set_ylim(0, 102)
ax_lost.grid(True, alpha=0.3)
ax_lost.legend(loc="upper left")
fig.tight_layout()
curves_path = OUT / "03_loss_and_lost_updates.png"
fig.savefig(curves_path, dpi=110)
# What the upper panel shows: while most updates still count, the smoothed FP16 curve wanders a
# few percent either side of FP32's (the runs see the same batches, but their weights already
# differ by FP16's rounding), with no lean either way; over the last fifth it lies above.
gap = smooth(loss16) / smooth(loss32) - 1
half_lost = int(steps_measured[np.argmax(lost_fraction > 0.5)])  # the first measured step losing half
early_gap, late_gap = gap[x_smooth < half_lost], gap[x_smooth >= STEPS - STEPS // 5]
print(
    f"smoothed FP16 loss against FP32's before step {half_lost} (half the updates lost from there): "
    f"{early_gap.min():+.1%} to {early_gap.max():+.1%}, {early_gap.mean():+.1%} on average; "
    f"last fifth: {late_gap.min():+.1%} to {late_gap.max():+.1%}"
)
assert early_gap.min() < 0 < early_gap.max() and abs(early_gap.mean()) < 0.02
assert late_gap.min() > 0.1

# %% [markdown]
# For the first part of the run the two curves lie on top of each other: the learning rate is
# large, the updates are large, and the FP16 rounding of the weights is noise next to them (the
# FP16 curve falls on both sides of FP32's, with no lean either way). Once the learning rate decays and most
# updates are lost, FP32 keeps refining the fit while FP16 lags, and over the last fifth of the
# run its loss stays more than 10% above FP32's. Here the test accuracy hardly moves, because
# the updates that vanish are the small late ones that sharpen the fit rather than change
# decisions. On a larger problem the same mechanism costs accuracy: Micikevicius et al. (2018,
# Section 3.1) report that updating the FP16 weights of their Mandarin speech model directly,
# without an FP32 master copy, cost 80% relative accuracy.
#
# ## 5. A run that fails: BF16 weights without masters
#
# The FP16 run above lost updates and still reached FP32's accuracy. Its format has 11
# significant bits; BF16 (tutorial 1) has 8, so the same rule with 8 in place of 11 says that
# an update 512 or more times smaller than its normal BF16 weight is always lost, and one
# under 256 times smaller never is. We check that rule on random weights and updates first.

# %%
rng = np.random.default_rng(0)
w_bf = rng.uniform(2.0**-6, 2.0**-1, 200_000).astype(np.float32)
w_bf = w_bf.astype(ml_dtypes.bfloat16).astype(np.float32)  # weights that are BF16 values
u_bf = w_bf / rng.uniform(16, 4096, w_bf.size).astype(np.float32) * rng.choice([-1, 1], w_bf.size)
moved = (w_bf + u_bf).astype(ml_dtypes.bfloat16).astype(np.float32) != w_bf
ratio = w_bf / np.abs(u_bf)
print(f"updates under 256x smaller that moved their BF16 weight: {moved[ratio < 256].mean():.1%}; "
      f"512x or more smaller that moved it: {moved[ratio >= 512].mean():.1%}")  # fmt: skip
between = (ratio >= 256) & (ratio < 512)  # where it depends on the weight's place in its binade
assert moved[ratio < 256].all() and not moved[ratio >= 512].any() and 0 < moved[between].mean() < 1

# %% [markdown]
# Now a run where that matters, from the settings a newcomer gets without choosing any:
# `tinyamp demo` trains this MLP with Keras's defaults (`keras.optimizers.SGD`:
# `learning_rate=0.01`, `momentum=0.0`; `Model.fit`: `batch_size=32`; no schedule, so a
# constant rate), for 1500 steps. Plain SGD's update is $0.01\,g$, and most of the
# per-element gradients $g$ of this network are small enough that $0.01\,|g|$ is under a 512th
# of a weight of a few hundredths. The three runs below are the demo's `fp32`, `fp16` and
# `bf16` rows, computed by the same code (`run_regime`): the numbers are the demo's.

# %%
demo_task = DigitsMLP(**KERAS_SGD_DEFAULTS)
demo_runs = {}
for name in ("fp32", "fp16", "bf16"):
    demo_runs[name], _ = run_regime(demo_task, name, DEMO_MLP_STEPS, measure_every=DEMO_MEASURE_EVERY)
verdicts = diagnose({name: r.to_json() for name, r in demo_runs.items()})
for name, r in demo_runs.items():
    lost = "-" if r.lost_update_fraction is None else f"{r.lost_update_fraction:.1%}"
    print(f"{name:<5} training loss {r.metrics['train_loss']:.4f}, test accuracy {r.metrics['accuracy']:.2%}, "
          f"updates lost {lost}")  # fmt: skip
fp32_m, bf16_m = demo_runs["fp32"].metrics, demo_runs["bf16"].metrics
for name in ("fp16", "bf16"):
    v = verdicts[name]
    print(f"{name}: {v.loss_ratio:.2f}x FP32's training loss, test accuracy {-v.points:.2f} points below FP32's")
assert verdicts["bf16"].failed and not verdicts["fp16"].failed
assert bf16_m["train_loss"] > 2 * fp32_m["train_loss"] and bf16_m["accuracy"] < fp32_m["accuracy"] - 0.05
assert demo_runs["bf16"].lost_update_fraction > 0.9 > 0.7 > demo_runs["fp16"].lost_update_fraction > 0.4
assert demo_runs["bf16"].skipped_steps == 0 and demo_runs["bf16"].underflow_fraction < 0.001  # nothing else failed

fig, ax = plt.subplots(figsize=(7.5, 4))
for name, color in (("fp32", "#000000"), ("fp16", "#d62728"), ("bf16", "#8c564b")):
    lost = demo_runs[name].lost_update_fraction
    label = name if lost is None else f"{name}: {lost:.0%} of the updates lost"
    ax.plot(np.arange(49, DEMO_MLP_STEPS), smooth(np.array(demo_runs[name].series["loss"])), color=color, lw=1.4,
            label=label)  # fmt: skip
ax.set_xlabel("step")
ax.set_ylabel("minibatch loss (50-step average)")
ax.set_title("Digits MLP with Keras's default SGD: the weights in FP32, FP16 and BF16")
ax.grid(True, alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(OUT / "03_a_run_that_fails.png", dpi=110)
ends = {line.get_label().split(":")[0]: line.get_ydata()[-1] for line in ax.get_lines()}
assert ends["bf16"] > 2 * ends["fp32"], ends  # the figure shows it too: BF16's curve ends far above

# %% [markdown]
# BF16 without masters failed: nineteen of every twenty updates rounded away, and the
# network is still near its starting loss after 1500 steps while FP32's has fallen about
# fivefold. Nothing else went wrong (no gradient underflowed, no step overflowed): the loss
# of updates alone did it. FP16 lost more than half of its updates too, and ended a little
# apart from FP32. Tutorial 4 repairs both runs with FP32 master weights.
#
# ## Summary
#
# | step | FP16 failure | seen here | repair |
# |---|---|---|---|
# | forward | overflow above 65504 | a naive softmax's $e^{z}$ on confident logits | FP32 exp/softmax/loss (tut. 6) |
# | backward | underflow at or below $2^{-25}$ | 2/3 of the logits' gradients, trained net | loss scaling (tut. 5) |
# | update | updates under half the gap lost | 95% late; higher loss; BF16 fails (sec. 5) | FP32 masters (tut. 4) |
#
# None of the three is visible at the start of training: all three grow as the network fits
# the data, because confident predictions mean large logits and small errors, and a decaying
# learning rate means small updates.
