# %% [markdown]
# # 4. FP32 master weights
#
# Tutorial 3 trained a network with FP16 weights and watched most of its late weight updates
# vanish: an update smaller than half the gap from its weight to the next FP16 value in its
# direction rounds back to the weight. The fix of Micikevicius et al. (2018) is to keep a second
# copy of every weight in FP32, the *master* copy. The optimizer updates the masters, where
# small updates are kept and add up, and the FP16 weights the model computes with are
# re-rounded from the masters after every step.
#
# You will learn:
#
# - the exact rule for a lost update: where "2048 times" comes from, why it is the worst case
#   (the smallest ratio at which an update is lost), and the role of ties-to-even;
# - how `tinyamp.amp.MasterWeights` wraps an optimizer, what each copy holds, and what it costs
#   in memory;
# - how many updates the masters save at each step of a real training run, and that the run
#   then follows FP32.
#
# The products run on one BLAS thread (`threadpool_limits(1)` below): OpenBLAS splits the work of
# a product differently for each thread count, so its float32 sums would round differently and
# the numbers printed here would depend on the machine (OpenBLAS starts one thread per core).
#
# Prerequisites: tutorial 1 (section 5, the ulp and the additions that are lost) and tutorial 3
# (section 4, lost updates in training).
#
# Time: about 13 s of CPU to run (six training runs), 40 minutes to read
# (a reader took 35 to 40).

# %%
import contextlib
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from threadpoolctl import threadpool_limits

import tinyamp as ta
from tinyamp import optim
from tinyamp.amp import MasterWeights, autocast, formats
from tinyamp.cli import DEMO_MEASURE_EVERY, DEMO_MLP_STEPS
from tinyamp.experiments.diagnosis import diagnose
from tinyamp.experiments.runner import run_regime
from tinyamp.experiments.tasks import KERAS_SGD_DEFAULTS, DigitsMLP

# figures go next to this file (or the notebook's folder, where __file__ is not defined)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = Path(os.environ.get("TINYAMP_TUTORIAL_OUT", HERE / "figures"))
OUT.mkdir(parents=True, exist_ok=True)
# One BLAS thread: with another thread count OpenBLAS splits each product's sums differently, and
# the float32 results round differently (and on a busy machine, threads wait for each other).
threadpool_limits(1)

# %% [markdown]
# ## 1. The 2048x rule, exactly
#
# Take an FP16 weight $w = 1$ and add an update $u = w / r$ for a range of ratios $r$. We compute
# $w + u$ in float64, whose rounding error is at most $2^{-43}$ times FP16's spacing here and decides
# nothing, and round the sum to FP16 once. Above 1 the FP16 values are $2^{-10}$ apart, so
# $1 + u$ rounds back to 1 when $u$ is below half of that, $2^{-11} = 1/2048$. At exactly
# $u = 2^{-11}$ the sum is halfway between 1 and $1 + 2^{-10}$, and ties go to the even
# neighbour: 1, whose last mantissa bit is 0.


# %%
def lost(w, u):
    """True where fp16(w + u) == w for an FP16 weight w and an update u (the float64 sum rounded once)."""
    return formats.round_to(np.asarray(w, np.float64) + u) == w


for r in (1024, 2000, 2047, 2047.9, 2048, 2048.1, 3000, 4096, 8192):
    moved_to = float(formats.round_to(1.0 + 1.0 / r))
    print(f"w = 1, u = w/{r:<6}: fp16(w + u) = {moved_to:.10f}  {'lost' if lost(1.0, 1.0 / r) else 'moved'}")
assert not lost(1.0, 1 / 2047.9) and lost(1.0, 1 / 2048) and lost(1.0, 1 / 2048.1)

# %% [markdown]
# So for $w = 1$ and an update away from zero the threshold is exactly 2048: every such update at
# least 2048 times smaller than the weight is lost, with the boundary case decided by
# ties-to-even. The same tie can also go the other way. For $w = 1 + 2^{-10}$, whose last
# mantissa bit is 1, the update $2^{-11}$ lands halfway between $w$ and $1 + 2^{-9}$, and the
# even neighbour is the upper one: the weight moves by a whole ulp, twice the update.

# %%
w_odd = 1 + 2.0**-10
print(f"w = 1 + 2^-10, u = 2^-11: fp16(w + u) = {float(formats.round_to(w_odd + 2.0**-11))}")
assert formats.round_to(w_odd + 2.0**-11) == 1 + 2.0**-9
assert formats.round_to(1.0 + 2.0**-11) == 1.0

# %% [markdown]
# Is 2048 the threshold for every weight? Half an ulp is the same, $2^{-11}$, for every $w$ in
# $[1, 2)$, but the *ratio* $w/u$ at which $u$ reaches it grows with $w$: from 2048 at $w = 1$
# to almost 4096 at $w = 2 - 2^{-10}$. And an update toward zero from a power of two meets the
# finer spacing of the binade below (the FP16 values just under 1 are $2^{-11}$ apart), so there
# the threshold is 4096. We measure the threshold for all 1024 FP16 weights in $[1, 2)$ and the
# same in $[2, 4)$, in both directions, over a fine grid of ratios that contains 1024, 2048,
# 4096 and 8192 exactly.

# %%
# every FP16 value in [1, 4): 1024 per binade, 2^-10 apart in [1, 2) and 2^-9 apart in [2, 4)
weights = np.concatenate([1 + np.arange(1024) / 1024, 2 + np.arange(1024) / 512])
assert np.array_equal(formats.round_to(weights), weights)
ratios = 2048 * 2.0 ** (np.arange(-1024, 2049) / 1024)  # 1024 ... 8192, exact powers of two included
thresholds = {}
for direction, sign in (("away from zero", 1), ("toward zero", -1)):
    is_lost = lost(weights[:, None], sign * weights[:, None] / ratios[None, :])
    # once lost, lost for every larger ratio: the rule is a threshold, not a pattern
    assert np.all(np.diff(is_lost.astype(int), axis=1) >= 0)
    thresholds[direction] = ratios[np.argmax(is_lost, axis=1)]
    assert not is_lost[:, ratios < 2048].any() and is_lost[:, ratios >= 4096].all()
    low, high = thresholds[direction].min(), thresholds[direction].max()
    print(f"updates {direction}: the threshold ratio w/|u| ranges from {low:.0f} to {high:.1f}")
    # float64's rounding of w + u decides nothing: rounding is monotone, so it could change the
    # FP16 result only by landing the sum exactly on a tie; every sum on a tie here is exact
    w16 = weights.astype(np.float16)
    half_gap = np.abs(np.nextafter(w16, np.float16(sign * np.inf)).astype(np.float64) - weights)[:, None] / 2
    u = sign * weights[:, None] / ratios[None, :]
    on_tie = np.abs((weights[:, None] + u) - weights[:, None]) == half_gap
    assert np.all(((weights[:, None] + u) - weights[:, None])[on_tie] == u[on_tie])

ones = weights == 1
assert thresholds["away from zero"][ones] == 2048 and thresholds["toward zero"][ones] == 4096
# away from zero the half-ulp is constant over a binade, so the ratio threshold grows with w
binade = np.floor(np.log2(weights))
assert np.allclose(thresholds["away from zero"], 2048 * weights / 2**binade, rtol=1e-3)

# %% [markdown]
# The measurement gives the precise form of the rule, for any normal FP16 weight:
#
# - an update is **never lost** while the weight is less than 2048 times larger than it;
# - an update is **always lost** once the weight is 4096 or more times larger;
# - in between it depends on where the weight sits in its binade $[2^k, 2^{k+1})$: away from
#   zero, 2048 for a weight at the start of the binade (a power of two) and nearly 4096 at its
#   end; toward zero the same, except at the power of two itself, where it is 4096 (but 2048 at
#   $2^{-14}$, whose neighbours below are subnormals as far apart as the values above).
#
# The "2048" usually quoted is therefore where losses *begin*: the worst case for the update,
# met only by a weight at a power of two; at the top of a binade the ratio is nearly 4096.
# (For BF16, with 7 mantissa bits instead of 10, the same numbers are 256 and 512.) One
# detail matters right at the threshold: the numbers above round the sum once. tinyamp's
# optimizers, and `formats.update_is_lost` with them, add the update to the widened weight in
# FP32 and then round to FP16: two roundings. The FP32 one can land a sum on an FP16 tie, as for
# $u = 1/2047.9$: $1 + u$ lies $2.4 \times 10^{-8}$ above the tie $1 + 2^{-11}$, less than half
# of FP32's spacing at 1 ($2^{-23} \approx 1.2 \times 10^{-7}$), so FP32 rounds it onto the tie,
# which then goes to the even neighbour, 1:

# %%
in_fp32 = np.float32(1) + np.float32(1 / 2047.9)
print(
    "update 1/2047.9 on w = 1: the sum rounded once ->",
    "lost" if lost(1.0, 1 / 2047.9) else "moved",
    f"| added in FP32 first ({float(in_fp32)!r} = 1 + 2^-11), as tinyamp's optimizers do ->",
    "lost" if formats.update_is_lost(1.0, 1 / 2047.9) else "moved",
)
assert in_fp32 == 1 + 2.0**-11 and formats.update_is_lost(1.0, 1 / 2047.9) and not lost(1.0, 1 / 2047.9)

# The two curves are equal except at the powers of two (asserted below), so one line draws both,
# and the two points where the update toward zero differs are drawn apart, as markers: a dashed
# line over the solid one would hide the one at w = 2 in the sawtooth's rise.
powers = np.log2(weights) == np.round(np.log2(weights))
fig, ax = plt.subplots(figsize=(7.5, 3.8))
ax.plot(weights, thresholds["away from zero"], color="#1f77b4", lw=1.3,
        label="update away from zero; toward zero too, except at 1 and 2")  # fmt: skip
ax.plot(weights[powers], thresholds["toward zero"][powers], "o", color="#ff7f0e", ms=7,
        label="update toward zero from a power of two")  # fmt: skip
ax.axhspan(ratios[0], 2048, color="#2ca02c", alpha=0.12, label="always kept: w < 2048 |u|")
ax.axhspan(4096, ratios[-1], color="#d62728", alpha=0.12, label="always lost: w >= 4096 |u|")
ax.set_yscale("log", base=2)
ax.set_xlabel("FP16 weight w")
ax.set_ylabel("smallest ratio w/|u| at which u is lost")
ax.set_title("When does fp16(w + u) == w? (the sum rounded once)")
ax.legend(fontsize=8, loc="upper left")
fig.tight_layout()
rule_path = OUT / "04_lost_update_threshold.png"
fig.savefig(rule_path, dpi=110)
# What the figure shows: the two measured curves coincide except at the powers of two (1 and 2
# here), where the update toward zero needs 4096; and the binade [2, 4) repeats [1, 2) exactly.
# Read off the drawing: the markers sit exactly where the measurements differ, nowhere else.
away, toward = thresholds["away from zero"], thresholds["toward zero"]
markers = ax.get_lines()[1]
differ = away != toward
assert np.array_equal(markers.get_xdata(), weights[differ]) and markers.get_xdata().tolist() == [1.0, 2.0]
assert np.array_equal(markers.get_ydata(), toward[differ]) and np.all(toward[differ] == 4096)
assert all(np.array_equal(t[:1024], t[1024:]) for t in (away, toward))

# %% [markdown]
# The two curves coincide except at the powers of two, where a step toward zero meets the
# finer spacing of the binade below: there any update larger than $w/4096$ moves the weight
# (the orange points at $w = 1$ and $w = 2$). Each binade repeats the same sawtooth: the rule
# depends on the ratio $w/|u|$ and on where $w$ sits in its binade, not on the size of $w$.
#
# ## 2. Master weights on one weight
#
# Before a network, one weight. An FP16 parameter $w = 1$ receives the same gradient $-1$ at
# every step, and SGD with learning rate $10^{-4}$ adds $10^{-4}$ each time: a weight 10,000
# times larger than its update, far beyond the 4096 limit. We run 200 steps twice: with SGD
# updating the FP16 parameter directly, and with the same SGD wrapped in `MasterWeights`.


# %%
def one_weight_run(use_master, steps=200):
    w = ta.tensor([1.0], dtype="float16", requires_grad=True)
    opt = optim.SGD([("w", w)], lr=1e-4)
    if use_master:
        opt = MasterWeights(opt)
    for _ in range(steps):
        w.grad = np.array([-1.0], dtype=np.float16)  # the same gradient every step
        opt.step()
    return w, opt


w_plain, _ = one_weight_run(use_master=False)
w_model, masters = one_weight_run(use_master=True)
master = masters.master_params[0]
print(f"plain SGD on the FP16 weight:  w = {w_plain.data[0]}")
print(f"with MasterWeights: FP32 master = {master.data[0]:.7f}, FP16 model weight = {w_model.data[0]}")
print(masters.history[-1])
assert w_plain.data[0] == 1.0  # 200 updates, all lost
assert abs(master.data[0] - 1.02) < 1e-5  # the master kept every one of them
assert w_model.data[0] == master.data[0].astype(np.float16)  # the model weight is the rounded master
assert (w_model.data[0] - 1) / formats.ulp(1.0) == 20  # 1.02 is 20.48 ulps above 1: rounded, 20
records = masters.history
assert all(r.lost == r.changed == 1 for r in records)  # every single update would have been lost ...
moves = sum(r.unchanged == 0 for r in records)
print(f"the FP16 weight moved at {moves} of the 200 steps")
assert 0 < moves < 200  # ... yet the FP16 copy moves whenever the master crosses a rounding boundary

# %% [markdown]
# Each update, taken alone, is lost, and `MasterWeights` records that (`lost == changed` at
# every step). But the master keeps it: after 200 steps it holds $1.02$, and the FP16 weight,
# re-rounded from it at every step, has moved 20 ulps. It moves in jumps, at the steps where the
# master crosses a rounding boundary. Without the master, 200 steps of training left the weight
# exactly where it started.
#
# **In PyTorch.** `torch.amp` keeps no master weights: neither `torch.autocast` nor `GradScaler`
# makes an FP32 copy of an FP16 parameter. The PyTorch recipe keeps the parameters themselves in
# FP32, so that they *are* the master copy: the optimizer updates them in FP32, and autocast casts
# each one to FP16 inside the ops it lowers (keeping the FP16 copy in a cache until the autocast
# region ends), so the forward computes with FP16 weights while the gradient flows back through
# the cast into an FP32 `.grad`. Call `model.half()` and train with a plain optimizer, and nothing
# keeps the small updates: that is tutorial 3's fp16 regime. The optional cell runs the experiment
# above in PyTorch (it needs PyTorch; without it, it prints one line): an FP16 parameter is still
# 1 after the 200 updates, and an FP32 parameter ends at the value of tinyamp's FP32 master, bit
# for bit. Then an FP32 `Linear` under `torch.autocast`: an FP16 output, an FP32 weight and an
# FP32 gradient.

# %%
try:
    import torch
except ImportError:
    torch = None


def torch_one_weight_run(dtype):
    """Section 2's experiment with torch.optim.SGD: w = 1, gradient -1, lr 1e-4, 200 steps."""
    w = torch.nn.Parameter(torch.ones(1, dtype=dtype))
    opt = torch.optim.SGD([w], lr=1e-4)
    for _ in range(200):
        w.grad = torch.full((1,), -1.0, dtype=dtype)
        opt.step()
    return w.detach()


if torch is None:
    print("PyTorch is not installed: the comparison with torch.amp is skipped")
else:
    w16_torch, w32_torch = torch_one_weight_run(torch.float16), torch_one_weight_run(torch.float32)
    layer = torch.nn.Linear(4, 3)  # FP32 parameters, as PyTorch keeps them
    with torch.autocast("cpu", dtype=torch.float16):
        out = layer(torch.randn(2, 4))
    out.float().sum().backward()
    print(f"torch, FP16 parameter: {w16_torch.item()}; FP32 parameter: {w32_torch.item():.7f} "
          f"(tinyamp's master: {master.data[0]:.7f}); under autocast: output {out.dtype}, "
          f"weight {layer.weight.dtype}, its gradient {layer.weight.grad.dtype}")  # fmt: skip
    assert w16_torch.item() == w_plain.data[0] == 1.0  # every update lost, as in tinyamp
    assert np.array_equal(w32_torch.numpy().view(np.uint32), master.data.view(np.uint32))  # the same FP32 bits
    assert out.dtype == torch.float16 and layer.weight.dtype == layer.weight.grad.dtype == torch.float32

# %% [markdown]
# ## 3. Master weights on the digits MLP
#
# Now the network of tutorial 3, the same 64-256-256-10 MLP with the same optimizer settings,
# batches and initial weights. `MasterWeights(optimizer)` rebinds the optimizer to FP32 copies
# of the FP16 parameters and keeps both lists.

# %%
STEPS = 1500
task = DigitsMLP(batch_size=32)
model = task.make_model().half()
opt = MasterWeights(task.make_optimizer(model.named_parameters()))
print(opt)
print(opt.summary())
fp32_bytes = sum(p.data.nbytes for p in task.make_model().parameters())  # the same MLP in FP32
n_params = fp32_bytes // 4
print(
    f"weights + masters: {(opt.model_bytes + opt.master_bytes) / n_params:g} bytes per parameter; "
    f"the FP32 model's weights: {fp32_bytes / n_params:g}"
)
assert opt.model_bytes == 2 * n_params and opt.master_bytes == fp32_bytes  # 2 bytes per weight, plus 4

first_model, first_master = opt.model_params[0], opt.master_params[0]
print("model  (FP16) 0.weight[0, :4]:", first_model.data[0, :4])
print("master (FP32) 0.weight[0, :4]:", first_master.data[0, :4])
# The inner optimizer now holds the masters (separate FP32 arrays, not views of the FP16 ones),
# and each master starts as its weight widened, exactly.
assert all(p is m and m.dtype == np.float32 for p, m in zip(opt.optimizer.params, opt.master_params))
assert not any(np.shares_memory(p.data, m.data) for p, m in zip(opt.model_params, opt.master_params))
assert all(np.array_equal(m.data, p.data.astype(np.float32)) for p, m in zip(opt.model_params, opt.master_params))

# %% [markdown]
# The masters cost 4 bytes per weight on top of the model's 2, so weights and masters together
# take 6 bytes per parameter, more than FP32 training's 4. Counting gradients and optimizer state
# too, the usual accounting comes out even (tutorial 7); mixed precision saves its memory
# elsewhere: in the activations the graph keeps for backward.
#
# One step, with each role spelled out. The backward pass leaves FP16 gradients on the model's
# parameters; `gather_grads` widens them into the masters' `.grad` (exact, and the place where a
# loss scaler unscales them, in FP32); `step` runs the SGD update on the masters and writes the
# rounded masters back into the FP16 weights.

# %%
batch = next(task.batches())
opt.zero_grad()
with autocast("float16"):
    loss = task.loss(model, batch)
loss.backward()
print("model gradient:", first_model.grad.dtype, " loss:", float(loss.item()))
opt.gather_grads()
print("master gradient:", first_master.grad.dtype)
assert np.array_equal(first_master.grad, first_model.grad.astype(np.float32))
opt.step()
assert all(np.array_equal(m.data.astype(np.float16), p.data) for p, m in zip(opt.model_params, opt.master_params))
record = opt.history[-1]
print(record, f"-> lost_update_fraction {opt.lost_update_fraction:.1%}")
assert 0.2 < opt.lost_update_fraction < 0.5  # about a third, at the full learning rate

# %% [markdown]
# The record counts, among the weight elements whose master changed, those whose update would
# have been lost had it been added to the FP16 weight directly (`lost`), and those whose FP16
# copy did not change this step (`unchanged`). Already at the first step, with the full learning
# rate, about a third of the updates are too small for FP16. (The model, optimizer and one step
# we just took are only a demonstration; the training below starts afresh.)
#
# The whole step as a picture, in the manner of Figure 1 of Micikevicius et al. (2018):
# `record_step` runs one real step with a loss scaler and measures the dtype and bytes at each
# stage, and `draw_step_record` draws them; nothing on it is typed in.

# %%
from tinyamp.amp import LossScaler
from tinyamp.inspect import draw_step_record, record_step


def step_loss() -> ta.Tensor:
    with autocast("float16"):
        return task.loss(model, batch)


arrays_before = [p.data for p in model.parameters()]
values_before = [a.copy() for a in arrays_before]
step = record_step(model, step_loss, opt, LossScaler())
fig = draw_step_record(step)
fig.savefig(OUT / "04_one_step.png", dpi=110)
print(step.gradients, "->", step.unscaled)
assert step.unscaled == {"float32": 2 * step.gradients["float16"]}  # each FP16 gradient widened: twice the bytes
# the FP16 weights are rewritten in place: the same arrays, FP16 still, with new values
assert all(p.data is a and a.dtype == np.float16 for p, a in zip(model.parameters(), arrays_before))
assert step.changed > 0 and any(not np.array_equal(a, v) for a, v in zip(arrays_before, values_before))
fig  # noqa: B018  (the cell's value: a notebook draws the figure under the cell)

# %% [markdown]
# ## 4. Training: FP32, FP16, and FP16 with master weights
#
# Three runs from the same initial weights on the same batches: FP32; FP16 weights updated in
# place, as in tutorial 3; and FP16 weights with FP32 masters. The two FP16 runs compute the
# forward and backward passes the same way (autocast, FP16 products with FP32 accumulation,
# loss in FP32); they differ only in where the optimizer's update goes.


# %%
def train(precision):
    """Train a fresh MLP in "fp32", "fp16" or "fp16+master"; return the losses, scores and optimizer."""
    model = task.make_model()
    if precision != "fp32":
        model.half()
    sgd = task.make_optimizer(model.named_parameters())
    opt = MasterWeights(sgd) if precision == "fp16+master" else sgd
    forward_context = contextlib.nullcontext if precision == "fp32" else (lambda: autocast("float16"))
    losses = []
    batches = task.batches()
    for step in range(STEPS):
        batch = next(batches)
        sgd.lr = task.lr_at(step, STEPS)  # the learning rate lives on the inner optimizer
        opt.zero_grad()
        with forward_context():
            loss = task.loss(model, batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return np.array(losses), task.evaluate(model, forward_context), opt


runs = {name: train(name) for name in ("fp32", "fp16", "fp16+master")}
for name, (losses, scores, _) in runs.items():
    print(
        f"{name:<12} loss on the training set {scores['train_loss']:.5f}, "
        f"last 150 steps {losses[-150:].mean():.5f}, test accuracy {scores['accuracy']:.2%}"
    )

(loss32, s32, _), (loss16, s16, _), (loss_m, s_m, masters) = runs.values()
gap16 = s16["train_loss"] / s32["train_loss"] - 1
gap_m = s_m["train_loss"] / s32["train_loss"] - 1
print(f"training-set loss above FP32's: fp16 {gap16:+.1%}, fp16+master {gap_m:+.1%}")
assert gap16 > 0.1  # without masters the loss ends clearly higher (tutorial 3) ...
assert abs(gap_m) < 0.02 and abs(gap_m) < gap16 / 10  # ... with them it ends within 2% of FP32's
assert abs(loss_m[-150:].mean() / loss32[-150:].mean() - 1) < 0.05

# %% [markdown]
# With master weights the FP16 network ends within 2% of FP32's training loss, while the FP16
# network without them ends more than 10% higher: a gap at least ten times larger (the line above
# prints both). The remaining difference between `fp16+master` and FP32 is the FP16 arithmetic of
# the forward and backward passes, and the FP16 rounding of the weights they read, which the
# masters do not touch.
#
# `MasterWeights.history` has a record for every step; `lost_update_history` turns it into the
# fraction of updates that FP16 weights would have lost, ready to plot.

# %%
lost_fraction = np.array(masters.lost_update_history)
fifth = STEPS // 5
print(
    f"updates that FP16 would have lost: first fifth of the run {np.nanmean(lost_fraction[:fifth]):.1%}, "
    f"last fifth {np.nanmean(lost_fraction[-fifth:]):.1%}"
)
last_lr = task.lr_at(STEPS - 1, STEPS)
print(f"lost at the first step: {lost_fraction[0]:.1%}; at the last, with lr {last_lr:.1e}: {lost_fraction[-1]:.1%}")
assert 0.2 < lost_fraction[0] < 0.5 and np.nanmean(lost_fraction[:fifth]) < 0.4  # about a third at the start
assert np.nanmean(lost_fraction[-fifth:]) > 0.95 and lost_fraction[-1] == 1.0  # nearly all, then all

fig, (ax_loss, ax_lost) = plt.subplots(2, 1, figsize=(7.5, 6.5), sharex=True)
window = 50
kernel = np.ones(window) / window
steps_smooth = np.arange(STEPS - window + 1) + window - 1
styles = {"fp32": ("#000000", "-"), "fp16": ("#d62728", "-"), "fp16+master": ("#1f77b4", "--")}
for name, (losses, _, _) in runs.items():
    color, ls = styles[name]
    ax_loss.semilogy(steps_smooth, np.convolve(losses, kernel, mode="valid"), color=color, ls=ls, lw=1.4, label=name)
ax_loss.set_ylabel("minibatch loss (50-step average)")
ax_loss.set_title("Digits MLP: FP16 weights with and without FP32 masters")
ax_loss.grid(True, which="both", alpha=0.3)
ax_loss.legend()
ax_lost.plot(
    np.arange(STEPS),
    100 * lost_fraction,
    color="#1f77b4",
    lw=0.8,
    label="updates FP16 weights would lose (kept by the masters)",
)
ax_lost.set_ylabel("% of updates")
ax_lost.set_xlabel("step")
ax_lost.set_ylim(0, 102)
ax_lost.grid(True, alpha=0.3)
ax_lost.legend(loc="upper left", fontsize=8)
fig.tight_layout()
curves_path = OUT / "04_master_weights_training.png"
fig.savefig(curves_path, dpi=110)
# What the figure shows, read off its lines: the FP16 curve ends above FP32's, the master curve
# on it (the last smoothed values); that the lost share ends at 100% is asserted above.
ends = {line.get_label(): line.get_ydata()[-1] for line in ax_loss.get_lines()}
assert ends["fp16"] > 1.1 * ends["fp32"] and abs(ends["fp16+master"] / ends["fp32"] - 1) < 0.05, ends

# %% [markdown]
# The lower panel is the reason the blue dashed curve stays on the black one: from a third of
# the updates at the start to nearly all of them in the last fifth, the masters keep what the
# FP16 weights cannot hold. With a cosine schedule the last steps have a learning rate near zero,
# and at the very last step every update would be lost; in FP32 those tiny steps still add up,
# and in the masters they do too.
#
# ## 5. The run that failed in tutorial 3, repaired
#
# Tutorial 3 ended with the demo's run in BF16: Keras's default SGD (learning rate 0.01, no
# momentum, batch 32, no schedule), whose BF16 weights lost 95% of their updates and ended
# at several times FP32's loss. The same run with FP32 master weights is the demo's
# `bf16-mixed` row: BF16 weights and BF16 products as before, the update kept in FP32. We run
# the failure and the repair again, with the demo's code, next to FP32.

# %%
demo_task = DigitsMLP(**KERAS_SGD_DEFAULTS)
demo_runs = {}
for name in ("fp32", "bf16", "bf16-mixed"):
    demo_runs[name], _ = run_regime(demo_task, name, DEMO_MLP_STEPS, measure_every=DEMO_MEASURE_EVERY)
verdicts = diagnose({name: r.to_json() for name, r in demo_runs.items()})
for name, v in verdicts.items():
    state = "FAILED" if v.failed else "matches FP32" if v.matches else "apart from FP32"
    print(f"{name:<12} {v.loss_ratio:.3f}x FP32's training loss, accuracy {v.points:+.2f} points: {state}; "
          f"updates too small for the 16-bit weight: {demo_runs[name].lost_update_fraction:.1%}")  # fmt: skip
fp32_scores = demo_runs["fp32"].metrics
assert verdicts["bf16"].failed and verdicts["bf16-mixed"].matches  # the failure, and its repair
repaired = demo_runs["bf16-mixed"].metrics
assert abs(repaired["accuracy"] - fp32_scores["accuracy"]) <= 0.01
assert abs(repaired["train_loss"] / fp32_scores["train_loss"] - 1) < 0.01
# the masters did not make the updates larger: as many would have been lost, and were kept instead
assert demo_runs["bf16-mixed"].lost_update_fraction > 0.9

# %% [markdown]
# With masters, BF16 ends within 1% of FP32's training loss and within a point of its
# accuracy, although more than nine in ten of its updates were still too small to move a BF16
# weight: each was added to the FP32 master instead, where it counts, and the BF16 weight moved
# once the master had moved by enough. The one change is where the update goes: the products
# and the gradients are computed in BF16, as in the run that failed. (`tinyamp demo` runs FP16's
# pair too, `fp16` and `fp16-master`.)
#
# ## Summary
#
# - An update $u$ to a normal FP16 weight $w$ is never lost when $w < 2048 |u|$ and always lost
#   when $w \ge 4096 |u|$; in between it depends on $w$'s place in its binade, and exact halves
#   are decided by ties-to-even.
# - `MasterWeights(optimizer)` keeps an FP32 copy of each FP16 weight, runs the optimizer on the
#   copies, and rounds them into the model after each step, so the FP16 weight is always the
#   rounded master. Cost: 4 more bytes per weight.
# - It measures its own usefulness: `history` and `lost_update_fraction` say how many of each
#   step's updates FP16 weights would have lost. On the digits MLP that grows to nearly 100%,
#   and with the masters the training loss follows FP32's.
# - The masters alone turn the demo's failing BF16 run (Keras's default SGD) into one that
#   matches FP32.
#
# Master weights repair the update. The gradients that underflowed in tutorial 3 are still
# zero when they reach the masters; tutorial 5 brings them back with loss scaling.
