# %% [markdown]
# # 5. Loss scaling
#
# FP16 has five exponent bits: its smallest positive value is $2^{-24} \approx 6 \times 10^{-8}$,
# and many gradients of a trained network are smaller than that. This tutorial shows that those
# at or below $2^{-25}$ vanish in a real FP16 backward pass, and how multiplying the loss by a
# scale $S$ brings them back. We start with a fixed (static) scale, then step tinyamp's dynamic
# `LossScaler` by hand through overflows and clean steps, watch it on a real training run,
# compare the published rules of PyTorch, Apex, Keras, jmp and Chainer on one event sequence,
# and end with the rules of Megatron-LM, DeepSpeed and fairseq, which may tolerate an overflow.
#
# You will learn:
#
# - why the gradients of a mean loss underflow in FP16, and how many do on a real model;
# - why a power-of-two scale is exact, and what a static scale gets wrong;
# - the dynamic scaler's state machine: back off on overflow, grow after clean steps;
# - that a skipped step changes no weight and no optimizer moment;
# - where the published scaler rules differ, and why the large FP16 runs tolerate one overflow.
#
# The products run on one BLAS thread (`threadpool_limits(1)` below): OpenBLAS splits the work of
# a product differently for each thread count, so its float32 sums would round differently and
# the numbers printed here would depend on the machine (OpenBLAS starts one thread per core).
#
# Prerequisites: tutorial 1 (section 4, underflow), tutorial 3 (section 3, gradients that underflow)
# and tutorial 4 (`MasterWeights`, whose FP32 gradients the scaler unscales).
#
# Time: about 18 s of CPU to run (four of its training runs are the demo's), 45 minutes to read
# (a reader took 40 to 45).

# %%
import copy
import json
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from threadpoolctl import threadpool_limits

import tinyamp as ta
from tinyamp import nn, optim
from tinyamp.amp import CLASSIC_PRESETS, LossScaler, MasterWeights, autocast, formats, presets_table
from tinyamp.amp.loss_scale import EVENTS, STATES
from tinyamp.cli import DEMO_MEASURE_EVERY, DEMO_MLP_STEPS
from tinyamp.data import load_digits
from tinyamp.experiments.runner import run_regime
from tinyamp.experiments.tasks import KERAS_SGD_DEFAULTS, DigitsMLP, WordLM

# figures go next to this file (or the notebook's folder, where __file__ is not defined)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = Path(os.environ.get("TINYAMP_TUTORIAL_OUT", HERE / "figures"))
OUT.mkdir(parents=True, exist_ok=True)
# One BLAS thread: with another thread count OpenBLAS splits each product's sums differently, and
# the float32 results round differently (and on a busy machine, threads wait for each other).
threadpool_limits(1)

F16 = formats.get_format("float16")
print(
    f"FP16: largest {F16.max}, smallest normal {F16.min_normal:.3g} (2^-14), "
    f"smallest subnormal {F16.min_subnormal:.3g} (2^-24)"
)

# %% [markdown]
# ## 1. Gradients that FP16 cannot hold
#
# The gradient of a mean loss over a batch of $N$ examples is the per-example error divided
# by $N$. Once a network fits its data, the per-example errors $p - y$ of the softmax are
# small, and after the division many gradient values fall below FP16's range: those at or below
# $2^{-25}$, half the smallest subnormal, round to zero (those between $2^{-25}$ and $2^{-24}$
# round up to $2^{-24}$). Values up to $2^{-14}$ survive as subnormals, with fewer significant
# bits the smaller they are.
#
# To see it on a real model we train a small MLP on the 8x8 digits in FP32 until its loss is
# small, then compute the gradient of the loss over the whole training set (1438 images)
# three ways: in FP32 (the reference), in FP16 under `autocast` with no scaling, and in FP16
# with the loss multiplied by $S = 2^{16}$.

# %%
x_train, y_train = load_digits("train")
X, Y = ta.tensor(x_train), ta.tensor(y_train)

ta.manual_seed(0)
model = nn.MLP([64, 128, 128, 10])
sgd = optim.SGD(model.named_parameters(), lr=0.1, momentum=0.9)
rng = np.random.default_rng(0)
for _ in range(300):
    idx = rng.integers(0, len(x_train), 128)
    loss = ta.cross_entropy(model(ta.tensor(x_train[idx])), ta.tensor(y_train[idx]))
    sgd.zero_grad()
    loss.backward()
    sgd.step()

model.zero_grad()
full_loss = ta.cross_entropy(model(X), Y)
full_loss.backward()
reference = {name: p.grad.astype(np.float64) for name, p in model.named_parameters()}
print(f"FP32 training loss after 300 steps: {full_loss.item():.4f}")

# %% [markdown]
# Now the same weights in FP16. `LossScaler(mode="off")` multiplies by 1; a static scaler
# multiplies the loss by a fixed $S$. Either way `unscale_` hands the gradients to the FP32
# master copies (`MasterWeights`) and unscales them *in FP32*, where $2^{-24}/2^{16}$ is an
# ordinary normal number. Unscaling *multiplies* by $1/S$, computed in float64 and rounded to
# float32, as PyTorch's `GradScaler.unscale_` does (`inv_scale =
# scale.double().reciprocal().float()`). For $S$ a power of two, $1/S$ is exact and
# $g \cdot (1/S)$ equals $g / S$; for other $S$ the two can differ by an ulp (asserted below
# for $S = 3$, a scale Exercise 5.2's grader uses).

# %%
g5 = np.float32(5.0)
assert g5 * np.float32(1 / 2.0**16) == g5 / np.float32(2.0**16)  # S = 2^16: the same value
assert g5 * np.float32(1 / 3) != g5 / np.float32(3)  # S = 3: 1.6666667 against 1.6666666, one ulp apart

# %% [markdown]
# What we count is the share of the gradient values that the FP32 reference has as nonzero
# but that arrive at the optimizer as exactly zero.

# %%
model16 = nn.MLP([64, 128, 128, 10])
model16.load_state_dict(model.state_dict())
model16.half()
opt16 = MasterWeights(optim.SGD(model16.named_parameters(), lr=0.1, momentum=0.9))


def gradients_the_optimizer_sees(scaler: LossScaler) -> dict[str, np.ndarray]:
    """One FP16 backward of the full-batch loss through `scaler`; the unscaled FP32 master gradients."""
    opt16.zero_grad()
    with autocast("float16"):
        loss = ta.cross_entropy(model16(X), Y)
    scaler.scale_loss(loss).backward()
    scaler.unscale_(opt16)  # gathers the FP16 gradients into the FP32 masters, then multiplies by float32(1/S)
    return {name: m.grad.astype(np.float64) for name, m in zip(opt16.names, opt16.master_params)}


def underflow_share(grads: dict[str, np.ndarray]) -> float:
    """Of the gradient values that are nonzero in FP32, the share that arrived as 0."""
    lost = sum(int(np.count_nonzero((reference[n] != 0) & (g == 0))) for n, g in grads.items())
    nonzero = sum(int(np.count_nonzero(r)) for r in reference.values())
    return lost / nonzero


unscaled = gradients_the_optimizer_sees(LossScaler(mode="off"))
scaled = gradients_the_optimizer_sees(LossScaler(mode="static", init_scale=2.0**16))
share_unscaled, share_scaled = underflow_share(unscaled), underflow_share(scaled)
print(f"gradient values lost to underflow, S = 1:     {share_unscaled:7.2%}")
print(f"gradient values lost to underflow, S = 2^16:  {share_scaled:7.2%}")
print(f"S = 2^16 loses {share_unscaled / share_scaled:.0f} times fewer")

# Scaling cuts the underflow about 25-fold here (24.9 measured); the syllabus quotes "about 25 times".
assert share_unscaled > 0.01, share_unscaled
assert 20 < share_unscaled / share_scaled < 30, (share_scaled, share_unscaled)

# %% [markdown]
# The histogram below shows why one multiplication suffices. Multiplying by $2^{16}$ adds 16
# to every $\log_2 |g|$: the whole distribution slides right, and most of the values in the
# region where FP16 rounds to zero (a few percent of all, printed below) leave it. The values
# that started at or below $2^{-41}$ stay there, and they are
# about the 0.27% the scaled backward still lost. The top of the distribution ends far below the
# overflow threshold $65504 \approx 2^{16}$.

# %%
ref_values = np.concatenate([r.ravel() for r in reference.values()])
log2g = np.log2(np.abs(ref_values[ref_values != 0]))
fig, ax = plt.subplots(figsize=(7, 3.5))
bins = np.arange(np.floor(log2g.min()), 20)  # from the smallest value: every value drawn
drawn_before, _, _ = ax.hist(log2g, bins=bins, alpha=0.6, label="FP32 gradients, S = 1")
drawn_after, _, _ = ax.hist(log2g + 16, bins=bins, alpha=0.6, label="the same, times S = 2^16")
ax.axvspan(bins[0], -25, color="red", alpha=0.12, label="rounds to 0 in FP16")
ax.axvspan(-25, -14, color="orange", alpha=0.12, label="FP16 subnormal")
ax.axvline(np.log2(F16.max), color="black", ls="--", lw=1, label="FP16 overflow")
ax.set_xlabel("log2 |gradient|")
ax.set_ylabel("values")
ax.set_title("Weight gradients of a trained MLP, full batch")
ax.legend(fontsize=7)
fig.tight_layout()
hist_path = OUT / "05_gradient_histogram.png"
fig.savefig(hist_path, dpi=110)
red_before, red_after = np.mean(log2g <= -25), np.mean(log2g + 16 <= -25)
print(
    f"FP32 values in the red band: {red_before:.3%} before the shift, {red_after:.3%} after "
    f"(lost in the FP16 backward with S = 2^16: {share_scaled:.3%}); the largest lands at 2^{log2g.max() + 16:.1f}"
)
assert drawn_before.sum() == drawn_after.sum() == log2g.size  # every value drawn, before and after the shift
assert 0.01 < red_before < 0.1  # a few percent of all the values start in the red band
assert 0 < red_after < red_before / 4  # most of the red band's values leave it, not all
assert abs(red_after - share_scaled) < 0.001  # and those that stay are what the scaled FP16 backward lost
assert log2g.max() + 16 < np.log2(F16.max) - 4  # the top of the shifted distribution: 16x below overflow

# %% [markdown]
# Zeros are the extreme case. Between $2^{-24}$ and $2^{-14}$ FP16 keeps a value as a
# *subnormal*, with only 1 to 10 significant bits, so the values that survive without a scale
# are also the least precise. For $S = 2^k$, multiplying and dividing change only the exponent:
# both are exact as long as no value overflows or lands among the subnormals. Below we count
# the share of the nonzero FP16 gradient values that were subnormal (before unscaling), and
# the median relative error, against FP32, of the gradient values that FP32 has below $2^{-14}$.
# With the scale, the small gradients are normal FP16 numbers, and what error remains is the
# ordinary rounding of the FP16 forward and backward passes ($2^{-11}$ relative at each rounding,
# accumulated over the layers), no longer the missing bits of subnormals.

# %%
ref_flat = np.concatenate([r.ravel() for r in reference.values()])
small = (ref_flat != 0) & (np.abs(ref_flat) < F16.min_normal)


def precision_report(grads: dict[str, np.ndarray], scale: float) -> tuple[float, float]:
    g = np.concatenate([v.ravel() for v in grads.values()])
    nonzero = g != 0
    subnormal_share = float(np.mean(np.abs(g[nonzero]) * scale < F16.min_normal))
    median_error = float(np.median(np.abs(g[small] - ref_flat[small]) / np.abs(ref_flat[small])))
    return subnormal_share, median_error


sub_unscaled, err_unscaled = precision_report(unscaled, 1.0)
sub_scaled, err_scaled = precision_report(scaled, 2.0**16)
print(f"{small.mean():.1%} of the FP32 gradient values lie below 2^-14")
print(
    f"S = 1:    {sub_unscaled:6.1%} of the FP16 gradients subnormal; median relative error of the small ones "
    f"{err_unscaled:.2e}"
)
print(
    f"S = 2^16: {sub_scaled:6.1%} of the FP16 gradients subnormal; median relative error of the small ones "
    f"{err_scaled:.2e}"
)
assert sub_unscaled > 0.25 and sub_scaled < sub_unscaled / 10, (sub_unscaled, sub_scaled)
assert err_scaled < err_unscaled / 2, (err_scaled, err_unscaled)
assert err_scaled > 2.0**-11  # more than one rounding's worth: errors accumulated through the layers

# %% [markdown]
# ## 2. Static loss scaling, and what it gets wrong
#
# Micikevicius et al. (2018) trained with a constant scale chosen per network (they report
# factors from 8 to 32K). The trouble is the other end: the largest gradient value times $S$
# must stay below 65504. The first gradient of the backward pass is $S (p - y) / N$, which for
# a batch of 128 and $S = 2^{28}$ is $2^{21} \cdot |p - y|$: infinite in FP16 wherever
# $|p - y|$ exceeds $65504 / 2^{21} \approx 0.03$, as many entries of a barely trained
# network's errors do.
#
# A scaler never lets an infinite gradient reach the weights. `step` checks every gradient
# after unscaling; if any is inf or NaN the optimizer is not called at all, and the report
# names the parameters. We check that literally: every byte of the FP16 weights, the FP32
# masters and the momentum buffers is the same after the skipped step.
#
# A scaler's printout names its *state*, and each step's report names the *event* of that
# step's transition (`tinyamp/amp/loss_scale.py` has the rule that decides both):
#
# | state | meaning |
# |---|---|
# | `static`, `off` | the modes in which the scale never changes (a fixed $S$, or $S = 1$) |
# | `warmup` | with `warmup=True` (Chainer's rule): doubling at every clean step until the first overflow |
# | `steady` | clean steps, counting toward the next growth |
# | `backed_off` | the last step overflowed and the scale was cut |
# | `at_floor` | the scale equals `min_scale`: a further overflow cannot cut it |
# | `at_ceiling` | the scale equals `max_scale`, or one more growth would be inf in the scale's dtype |
#
# | event | meaning |
# |---|---|
# | `held` | the scale did not change this step |
# | `grew` | multiplied by `growth_factor` after enough clean steps |
# | `backed_off` | multiplied by `backoff_factor` after an overflow |
# | `hit_floor` | a backoff clamped at `min_scale` |
# | `hit_ceiling` | a growth clamped at `max_scale`, or refused because the result would be inf |
#
# Where several states apply, the one shown is the first in the order `static`/`off`, `warmup`,
# `at_floor`, `at_ceiling`, `backed_off`, `steady`.

# %%
DEFINED_STATES = ("static", "off", "warmup", "steady", "backed_off", "at_floor", "at_ceiling")
DEFINED_EVENTS = ("held", "grew", "backed_off", "hit_floor", "hit_ceiling")
assert set(DEFINED_STATES) == set(STATES) and set(DEFINED_EVENTS) == set(EVENTS)  # the tables above are complete

ta.manual_seed(1)
mlp = nn.MLP([64, 64, 64, 10]).half()
opt = MasterWeights(optim.SGD(mlp.named_parameters(), lr=0.1, momentum=0.9))


def training_step(scaler: LossScaler, idx: np.ndarray, model: nn.Module = mlp, optimizer: MasterWeights = opt):
    """One mixed-precision step on the digits in `idx`; returns the scaler's StepReport and the loss."""
    with autocast("float16"):
        loss = ta.cross_entropy(model(ta.tensor(x_train[idx])), ta.tensor(y_train[idx]))
    # An overflow in the backward is the event the scaler is built to detect; NumPy's
    # "overflow encountered" warnings would only repeat it.
    with np.errstate(over="ignore", invalid="ignore"):
        scaler.scale_loss(loss).backward()
    report = scaler.step(optimizer)
    optimizer.zero_grad()
    return report, loss.item()


def snapshot() -> list[np.ndarray]:
    """Every array a step could change: FP16 weights, FP32 masters, optimizer moments."""
    arrays = [p.data.copy() for p in mlp.parameters()] + [m.data.copy() for m in opt.master_params]
    return arrays + [v.copy() for s in opt.optimizer.state for v in s.values()]


# One clean step first, so that the momentum buffers exist and could be damaged.
batches = np.random.default_rng(1)
report, _ = training_step(LossScaler(mode="static", init_scale=2.0**10), batches.integers(0, len(x_train), 128))
assert not report.skipped
print(report)

static = LossScaler(mode="static", init_scale=2.0**28)
for _ in range(3):
    before = snapshot()
    report, _ = training_step(static, batches.integers(0, len(x_train), 128))
    after = snapshot()
    print(report)
    assert report.skipped and report.nonfinite_params
    assert all(np.array_equal(a, b) for a, b in zip(before, after))  # nothing moved, bit for bit
print(static)
# the claim of the next paragraph: its scale never moved, so every one of the three steps overflowed
assert all(e.found_inf and e.event == "held" and e.scale_after == e.scale_before == 2.0**28 for e in static.history)


# ... and a smaller static scale need not overflow on every step. From copies of this network, the
# same 12 batches under static scales from 2^28 down, until one of them steps at all:
def static_pattern(k: int) -> str:
    """Skipped (s) and taken (.) steps of 12 under a static 2^k, from a copy of the network as it is now."""
    model = copy.deepcopy(mlp)
    optimizer = MasterWeights(optim.SGD(model.named_parameters(), lr=0.1, momentum=0.9))
    scaler, same_batches = LossScaler(mode="static", init_scale=2.0**k), np.random.default_rng(2)
    reports = [training_step(scaler, same_batches.integers(0, len(x_train), 128), model, optimizer)[0]
               for _ in range(12)]  # fmt: skip
    return "".join("s" if r.skipped else "." for r in reports)


patterns = {}
for k in range(28, 0, -1):
    patterns[k] = static_pattern(k)
    if "." in patterns[k]:
        break
print("static 2^k, 12 steps (s skipped, . taken):", ", ".join(f"2^{k} {p}" for k, p in patterns.items()))
assert "s" in patterns[k] and "." in patterns[k]  # the first scale that steps at all also skips: both, by step

# %% [markdown]
# The static scaler skips, correctly, and skips again: its scale never moves, so it goes on
# overflowing for as long as the gradients stay as large (here, from the untrained network, at
# $2^{28}$, on every step). A smaller static scale may overflow on some steps and not on others,
# since each step's gradients differ: the first scale below $2^{28}$ at which copies of this
# network take any of the same 12 steps also skips some of them (the run prints which). A scale
# small enough never to overflow must be guessed per model, and the best one changes during
# training as the gradients shrink. Hence dynamic loss scaling.
#
# ## 3. The dynamic scaler, one transition at a time
#
# The rule of tinyamp's `LossScaler`, applied once per step (PyTorch's `GradScaler` is the same
# rule without the two bounds: it has no `min_scale` or `max_scale`, and only refuses a growth
# whose float32 result would be inf; with both bounds left at None, tinyamp's rule is that one):
#
# | event | new scale | growth tracker |
# |---|---|---|
# | a gradient was inf or NaN | $S \cdot$ `backoff_factor` (0.5), not below `min_scale` | 0 |
# | clean, and $t + 1$ reaches `growth_interval` | $S \cdot$ `growth_factor` (2), not above `max_scale` | 0 |
# | clean otherwise | $S$ | $t + 1$ |
#
# The tracker $t$ counts the clean steps before this one: a clean step adds 1 first, then
# compares with `growth_interval`, so with `growth_interval` 3 the third clean step grows the scale.
#
# `update(found_inf)` applies one transition without a model, which lets us drive the
# machine by hand. We use small numbers so the whole cycle fits on a screen: a start at
# $2^4$, growth after 3 clean steps, a floor at $2^2$ and a ceiling at $2^6$.

# %%
hand = LossScaler(init_scale=2.0**4, growth_interval=3, min_scale=2.0**2, max_scale=2.0**6)
print(hand)
events = [False] * 9 + [True] * 5 + [False] * 4 + [True] + [False] * 3
print(f"{'step':>4}  {'found_inf':>9}  {'scale before':>12}  {'scale after':>11}  {'event':<12}  {'tracker':>7}  state")
for found_inf in events:
    e = hand.update(found_inf)
    print(
        f"{e.step:>4}  {e.found_inf!s:>9}  {e.scale_before:>12g}  {e.scale_after:>11g}  "
        f"{e.event:<12}  {e.growth_tracker:>7}  {e.state}"
    )
print(hand.history[-1])

# %% [markdown]
# Read the table against the rule. Three clean steps double the scale (steps 2 and 5); at
# the ceiling, the next growth is clamped (`hit_ceiling`). Each overflow halves it, down to
# the floor, where a further overflow is `hit_floor`. After an overflow the tracker restarts
# from 0, so growth waits a full interval again. The comparison comes after the increment: the
# tracker read before a growing step is 2, the step makes it 3 = `growth_interval`, and the
# scale grows (and the tracker is 0 again); a clean step that does not grow leaves it at most 2.
# The asserts below recompute these facts from the recorded history, not from the table we expect.

# %%
h = hand.history_columns()
interval = hand.rule.growth_interval
for i, e in enumerate(hand.history):
    before = hand.history[i - 1].growth_tracker if i else 0  # the tracker this step read
    if not e.found_inf:  # the step adds 1, then compares: it grows (or hits the ceiling) exactly when t + 1 reaches 3
        assert (e.event in ("grew", "hit_ceiling")) == (before + 1 == interval)
        assert e.growth_tracker == (0 if before + 1 == interval else before + 1) < interval
    if e.found_inf:
        assert e.scale_after == max(e.scale_before / 2, 2.0**2) and e.growth_tracker == 0
    elif e.event == "grew":
        assert e.scale_after == 2 * e.scale_before and e.growth_tracker == 0
        assert all(not hand.history[j].found_inf for j in range(i - 2, i + 1))  # three clean steps
    elif e.event == "held":
        assert e.scale_after == e.scale_before
assert max(h["scale_after"]) == 2.0**6 and min(h["scale_after"]) == 2.0**2
assert "hit_ceiling" in h["event"] and "hit_floor" in h["event"]
assert {"steady", "backed_off", "at_floor", "at_ceiling"} <= set(h["state"])

# %% [markdown]
# The same machine as a picture. It is not drawn from a table typed in: tinyamp runs the rule
# itself (`ScaleRule.next`) from a fresh scaler's start, one clean and one overflowed step at a
# time from every situation it reaches, and draws each transition it finds, so the picture
# cannot drift from the code. Red arrows are overflowed steps, green ones clean steps.

# %%
from tinyamp.inspect import draw_scaler_states, scaler_state_machine

machine = scaler_state_machine(hand)
arrows = {(t.state, t.event, t.next_state) for t in machine.transitions}
for state, event, next_state in sorted(arrows):
    print(f"{state:>10} --{event}--> {next_state}")
fig = draw_scaler_states(hand)
fig.savefig(OUT / "05_scaler_states.png", dpi=110)
# every transition the hand-driven run above made is an arrow of the picture
states = [machine.start] + [e.state for e in hand.history]
made = {(states[i], e.event, states[i + 1]) for i, e in enumerate(hand.history)}
assert machine.complete and made <= arrows, made - arrows
# and PyTorch's rule, which has no floor, never enters at_floor, while jmp's (floor 1) does
assert "at_floor" not in scaler_state_machine("pytorch").states and "at_floor" in scaler_state_machine("jmp").states
fig  # noqa: B018  (the cell's value: a notebook draws the figure under the cell)

# %% [markdown]
# **In PyTorch.** `torch.amp.GradScaler` is this machine without the floor and the ceiling, which
# is tinyamp's `pytorch` preset. The optional cell (it needs PyTorch; without it, it prints one
# line) drives a real `GradScaler` through the event sequence of the table above: a tiny model's
# backward, with an inf written into a gradient on each overflow step, then `scaler.step` and
# `scaler.update`. Its scale after every step, and its growth tracker at the end, must be those
# of `LossScaler.preset("pytorch")` with the same start and interval (which, with no ceiling,
# reaches $2^7$ where the hand-driven scaler stopped at $2^6$), and every step with an inf must
# leave the parameter untouched.

# %%
try:
    import torch
except ImportError:
    torch = None

if torch is None:
    print("PyTorch is not installed: the comparison with torch.amp.GradScaler is skipped")
else:
    weight = torch.nn.Parameter(torch.ones(3))
    torch_sgd = torch.optim.SGD([weight], lr=0.1)
    grad_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4, growth_interval=3)
    ours = LossScaler.preset("pytorch", init_scale=2.0**4, growth_interval=3)
    torch_scales, our_scales, skipped_unchanged = [], [], []
    for found_inf in events:
        torch_sgd.zero_grad()
        grad_scaler.scale((2 * weight).sum()).backward()
        if found_inf:
            weight.grad[0] = float("inf")  # the injected overflow
        before = weight.detach().clone()
        grad_scaler.step(torch_sgd)
        grad_scaler.update()
        torch_scales.append(grad_scaler.get_scale())
        our_scales.append(ours.update(found_inf).scale_after)
        if found_inf:
            skipped_unchanged.append(torch.equal(before, weight.detach()))
    print("GradScaler:", [f"{v:g}" for v in torch_scales])
    print("pytorch preset:", [f"{v:g}" for v in our_scales])
    assert torch_scales == our_scales and max(our_scales) == 2.0**7  # no ceiling: past the hand scaler's 2^6
    assert grad_scaler.state_dict()["_growth_tracker"] == ours.growth_tracker and all(skipped_unchanged)

# %% [markdown]
# ## 4. A real run: the sawtooth
#
# Now the scaler drives a training run of the MLP in mixed precision (FP16 weights, FP32
# masters). We start it deliberately too high, at $2^{24}$, and shorten PyTorch's growth
# interval from 2000 to 20 steps so that a short run shows several cycles:
# `LossScaler.preset("pytorch", init_scale=2.0**24, growth_interval=20)`.
#
# The scale first backs off until no gradient overflows, then grows every 20 clean steps
# until a step overflows again: the sawtooth of dynamic loss scaling. As training proceeds the
# gradients shrink, and the scale that fits them rises.

# %%
scaler = LossScaler.preset("pytorch", init_scale=2.0**24, growth_interval=20)
losses, skipped_moved = [], []
for _ in range(200):
    before = snapshot()
    report, loss_value = training_step(scaler, batches.integers(0, len(x_train), 128))
    losses.append(loss_value)
    if report.skipped:
        skipped_moved.append(any(not np.array_equal(a, b) for a, b in zip(before, snapshot())))
    if report.skipped and len(skipped_moved) <= 8:
        print(report)

run = scaler.history_columns()
n_skipped = sum(run["found_inf"])
print(f"{n_skipped} of {len(losses)} steps skipped; scale at the end 2^{np.log2(scaler.scale):.0f}")
print(f"loss: first 10 steps {np.mean(losses[:10]):.3f}, last 10 steps {np.mean(losses[-10:]):.3f}")

assert n_skipped >= 3 and not any(skipped_moved)  # skipped steps happened, and changed nothing
assert run["scale_after"][0] == 2.0**23  # the first step overflowed and halved the scale
assert run["event"].count("grew") >= 2  # clean runs of 20 steps doubled it again
assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])  # and the model trained meanwhile

# %%
fig, axes = plt.subplots(2, 1, figsize=(7, 6))
for ax, cols, title in (
    (axes[0], h, "Driven by hand: growth_interval 3, floor 2^2, ceiling 2^6"),
    (axes[1], run, "Training the MLP: pytorch preset, init 2^24, growth_interval 20"),
):
    steps = np.array(cols["step"])
    scale_after = np.log2(cols["scale_after"])
    skipped = np.array(cols["found_inf"])
    ax.step(steps, scale_after, where="post", label="log2 scale after the step")
    ax.plot(steps[skipped], np.log2(cols["scale_before"])[skipped], "rx", label="skipped step (overflow)")
    ax.set_ylabel("log2 S")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
axes[1].set_xlabel("step")
fig.tight_layout()
trajectory_path = OUT / "05_scale_trajectory.png"
fig.savefig(trajectory_path, dpi=110)
# What the lower panel shows: every growth comes after 20 clean steps in a row; the scale first
# falls to its lowest value, then, as the gradients shrink, the scale that fits them rises.
grew_at = [i for i, e in enumerate(run["event"]) if e == "grew"]
assert all(i >= 19 and not any(run["found_inf"][i - 19 : i + 1]) for i in grew_at)
lowest = int(np.argmin(run["scale_after"]))
lowest_scale = run["scale_after"][lowest]
print(f"the lowest scale, 2^{np.log2(lowest_scale):.0f}, at step {lowest}; at the end 2^{np.log2(scaler.scale):.0f}")
assert lowest < len(losses) // 2 and scaler.scale > lowest_scale

# %% [markdown]
# ## 5. The published rules, side by side
#
# Every framework with mixed precision ships a dynamic scaler, and they agree on the idea but
# not on the constants: the starting scale, the bounds, the dtype the scale is stored in, and
# Chainer's warm-up. tinyamp has each as a preset; the table is generated from the presets
# themselves.

# %%
print(presets_table())

# %% [markdown]
# To compare the rules we feed all five the *same* sequence of overflow events. (In real
# training the events depend on the scale: a smaller scale overflows less. Fixing the sequence
# isolates the rule.) The sequence: 2500 clean steps, one overflow (it also ends Chainer's
# warm-up), 19499 clean steps, a burst of 30 consecutive overflows, then 1970 clean steps.

# %%
N_STEPS = 24000
overflow = np.zeros(N_STEPS, dtype=bool)
overflow[2500] = True
overflow[22000:22030] = True

trajectories: dict[str, np.ndarray] = {}
for name in CLASSIC_PRESETS:  # the five that back off at the first overflow; megatron, deepspeed, fairseq wait
    s = LossScaler.preset(name)
    for found_inf in overflow:
        s.update(bool(found_inf))
    trajectories[name] = np.array(s.history_columns()["scale_after"])

checkpoints = [15, 1999, 2500, 21999, 22029, 23999]
print(f"{'preset':<9}" + "".join(f"{'after ' + str(k):>14}" for k in checkpoints) + f"{'max':>12}{'min':>12}")
for name, tr in trajectories.items():
    row = "".join(f"{tr[k]:>14.6g}" for k in checkpoints)
    print(f"{name:<9}{row}{tr.max():>12.6g}{tr.min():>12.6g}")

# %% [markdown]
# What the table shows, each a documented difference of the rules:
#
# - **Growth after 2000 clean steps.** PyTorch, Apex, Keras and jmp double their scale at the
#   2000th clean step. Keras starts at $2^{15}$, its default; jmp's `DynamicLossScale` has no
#   default starting scale, and the preset takes $2^{15}$, the example in jmp's documentation.
#   Both therefore run one power of two below PyTorch, and their curves lie on top of each
#   other until the burst of overflows takes jmp to its floor. Chainer instead doubles at
#   *every* clean step until its first overflow, and is clamped at its ceiling of 65504 (the
#   FP16 maximum, not a power of two) after 16 steps.
# - **The ceiling.** Apex caps the scale at $2^{24}$; PyTorch only refuses a growth whose
#   float32 result would be infinite (so it has no ceiling in practice), and after 19499 clean
#   steps it reaches $2^{25}$. The two curves coincide until PyTorch grows past Apex's ceiling.
# - **The floor.** After 30 overflows in a row PyTorch, Apex and Keras have halved their
#   scale far below 1 (with enough overflows PyTorch's reaches 0); jmp and Chainer stop at 1.
# - **Chainer after its warm-up** grows by $2^{1/1000}$ per clean step, and its ceiling 65504
#   (whose half is 32752) is no power of two either: its scale leaves the powers of two, so
#   scaling and unscaling are no longer exact.

# %%
pt, apex, keras, jmp, chainer = (trajectories[n] for n in ("pytorch", "apex", "keras", "jmp", "chainer"))
assert pt[1998] == 2.0**16 and pt[1999] == 2.0**17  # PyTorch grows at the 2000th clean step
assert keras[1999] == 2.0**16 and jmp[1999] == 2.0**16  # from 2^15: one power of two lower
assert chainer[15] == F16.max and chainer[1999] == F16.max  # warm-up doubling, clamped at 65504
assert apex.max() == 2.0**24 and pt.max() == 2.0**25  # Apex's ceiling; PyTorch has none below inf
assert pt[22029] < 1 and apex[22029] < 1 and keras[22029] < 1  # no floor
assert jmp[22029] == 1.0 and chainer[22029] == 1.0  # floor at 1
grown = chainer[2501:21999]
assert not np.all(np.log2(grown) == np.round(np.log2(grown)))  # per-step growth leaves the powers of two

# %%
# Keras and jmp, and PyTorch and Apex, share their curves for most of the run (asserted below):
# the second of each pair is drawn thinner on top, with markers, so that both stay visible.
fig, ax = plt.subplots(figsize=(7, 4.6), layout="constrained")
looks = {
    "pytorch": {"lw": 3.0, "alpha": 0.6},
    "apex": {"lw": 1.2, "ls": "--", "marker": "s", "ms": 4, "markevery": (1000, 2000)},
    "keras": {"lw": 3.0, "alpha": 0.6},
    "jmp": {"lw": 1.2, "ls": ":", "marker": "o", "ms": 4, "markevery": (0, 2000)},
    "chainer": {"lw": 1.6},
}
for name, tr in trajectories.items():
    label = {"apex": "apex (on pytorch's line to 2^24)", "jmp": "jmp (on keras's line to step 22000)"}.get(name, name)
    ax.step(np.arange(N_STEPS), np.log2(tr), where="post", label=label, **looks[name])
ax.plot(np.flatnonzero(overflow), np.full(int(overflow.sum()), -8.0), "r|", ms=8, label="overflow event")
ax.set_xlabel("step")
ax.set_ylabel("log2 S")
ax.set_title("Five published loss-scaler rules on one event sequence", fontsize=9)
ax.grid(alpha=0.3)
ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.13))  # below: the drop at 22000 shows
presets_path = OUT / "05_presets.png"
fig.savefig(presets_path, dpi=110)
fig.canvas.draw()  # the legend covers no drawn point of any curve
legend_box = ax.get_legend().get_window_extent()
for line in ax.get_lines():
    points = ax.transData.transform(np.column_stack([line.get_xdata(), line.get_ydata()]))
    assert legend_box.count_contains(points) == 0, line.get_label()
# Curves drawn on top of each other: Keras and jmp until the burst of overflows takes Keras below
# jmp's floor of 1; PyTorch and Apex until PyTorch grows past Apex's ceiling of 2^24.
split_kj = int(np.argmax(keras != jmp))
split_pa = int(np.argmax(pt != apex))
print(f"Keras and jmp coincide until step {split_kj}, PyTorch and Apex until step {split_pa}")
assert 22000 <= split_kj < 22030 and jmp[split_kj] == 1.0 and np.array_equal(keras[:split_kj], jmp[:split_kj])
assert apex[split_pa] == 2.0**24 and np.array_equal(pt[:split_pa], apex[:split_pa])

# %% [markdown]
# ## 6. Loss scaling alone, on the demo's run
#
# Tutorial 3 ended with the demo's run (Keras's default SGD: learning rate 0.01, no momentum,
# batch 32, no schedule), where FP16 weights without masters lost more than half of their
# updates, and tutorial 4 repaired that with FP32 masters. What does loss scaling alone do
# there? The demo's `fp16-scaled` row is `fp16` plus the dynamic scaler, with no masters;
# `mixed` is `fp16-master` plus the same scaler. Four runs of the demo's code:

# %%
demo_task = DigitsMLP(**KERAS_SGD_DEFAULTS)
demo_runs = {}
for name in ("fp16", "fp16-scaled", "fp16-master", "mixed"):
    demo_runs[name], _ = run_regime(demo_task, name, DEMO_MLP_STEPS, measure_every=DEMO_MEASURE_EVERY)
for name, r in demo_runs.items():
    print(f"{name:<12} training loss {r.metrics['train_loss']:.4f}, test accuracy {r.metrics['accuracy']:.2%}, "
          f"final scale {r.final_scale:g}, gradient values 0 in FP16 at the end {r.underflow_fraction:.3%}, "
          f"updates too small for FP16 {r.lost_update_fraction:.1%}")  # fmt: skip
plain, scaled = demo_runs["fp16"], demo_runs["fp16-scaled"]
assert scaled.final_scale > 1 == plain.final_scale  # the scaler ran ...
assert abs(scaled.lost_update_fraction - plain.lost_update_fraction) < 0.01  # ... and kept no update
assert abs(scaled.metrics["train_loss"] / plain.metrics["train_loss"] - 1) < 0.01
assert scaled.metrics["train_loss"] > 1.03 * demo_runs["mixed"].metrics["train_loss"]  # the masters are missing
# here little underflows without a scale, so the scale has little to repair
assert demo_runs["mixed"].underflow_fraction <= demo_runs["fp16-master"].underflow_fraction < 0.01
assert abs(demo_runs["mixed"].metrics["train_loss"] / demo_runs["fp16-master"].metrics["train_loss"] - 1) < 0.001

# %% [markdown]
# Loss scaling alone repairs no lost update: `fp16-scaled` loses as many updates as `fp16`
# and ends where it ends. Each repair mends its own failure. And on this run there is almost
# no underflow to repair: after 1500 steps of these small updates the training loss is still
# about 0.4, so the errors $p - y$ of most examples are large and their gradients, divided by
# the batch of 32, stay far above $2^{-24}$; `mixed` and `fp16-master` end at the same loss.
# Underflow grows as the network fits its examples (section 1, on a trained network). Even
# where a third of the values vanish, they are the smallest ones, and on models of this size
# they carry a negligible share of the gradient (tinyamp/experiments/README.md measures it on
# six settings of this MLP and on the transformer); loss scaling changes the outcome of a run
# where the bulk of a gradient lies below FP16's range, as in the SSD detector and the large
# LSTM language model of Micikevicius et al. (2018).

# %% [markdown]
# ### Where loss scaling alone repairs a run: a word-level model
#
# What decides is how much of a gradient lies at or below $2^{-25}$, and a language model's
# softmax is where most of it can. Its loss is the mean over the $N$ tokens a batch predicts,
# so the logit of a token $j$ that is not the target receives $p_j / N$, which FP16 flushes to
# 0 when $p_j \le N \cdot 2^{-25}$. With the digits' 10 classes a probability is rarely that
# small. Over a word-level vocabulary of 4,096 tokens the share of a uniform guess, 1/4096, is
# $2.4 \times 10^{-4}$, and at $N = 8192$ so is the bound $N \cdot 2^{-25}$. (nanoGPT's GPT-2
# recipe gives each GPU's backward more tokens, 12 sequences of 1,024, and GPT-2's vocabulary
# is twelve times larger, 50,257.) The model is `tinyamp train --model wordlm` (`experiments.tasks.WordLM`):
# Bengio et al.'s (2003) next-token model, the four previous tokens' embeddings through a tanh
# layer to 4,096 logits, on the Python-source corpus cut into words. Its first batch, in FP16
# under `autocast`, and the gradient of the mean loss with respect to its logits as the FP16
# backward receives it, without a scale and at $2^{16}$:

# %%
words_task = WordLM()  # 4,096 tokens of vocabulary, 8,192 predicted tokens a batch
x_w, y_w = next(words_task.batches())
words16 = words_task.make_model().half()
with autocast("float16"):
    probs = ta.softmax(words16(x_w).float(), axis=-1).numpy().astype(np.float64)
n_tok, targets = len(y_w), y_w.numpy()
is_target = np.zeros(probs.shape, dtype=bool)
is_target[np.arange(n_tok), targets] = True
dlogits = (probs - is_target) / n_tok  # d(mean loss) / d(logit): p / N, and (p - 1) / N at the target
absent = np.setdiff1d(np.arange(words_task.vocab_size), targets)  # tokens no example of the batch predicts
bias_grad = dlogits.sum(axis=0)  # the output layer's bias gradient, in float64
flushed_w, bias_error = {}, {}
for S in (1.0, 2.0**16):
    in_fp16 = (dlogits * S).astype(np.float16)
    flushed_w[S] = float(np.mean(in_fp16[~is_target] == 0))
    received = in_fp16.astype(np.float64).sum(axis=0) / S
    bias_error[S] = float(np.linalg.norm(received[absent] - bias_grad[absent]) / np.linalg.norm(bias_grad[absent]))
    print(f"S = {S:>7g}: non-target logit gradients 0 in FP16 {flushed_w[S]:.1%}; bias gradient of the "
          f"{absent.size} tokens no example predicts, error in norm {bias_error[S]:.2g}")  # fmt: skip
assert flushed_w[1.0] > 0.5 and flushed_w[2.0**16] == 0.0
assert bias_error[1.0] > 0.1 and bias_error[2.0**16] < 1e-4

# %% [markdown]
# More than half of the non-target values vanish without a scale, none at $2^{16}$. And here
# what vanishes matters: for a token that no example of the batch predicts, the push down,
# $\sum_n p_{nj} / N$, is its whole gradient, and without the scale the output bias's gradient
# of those tokens comes out more than 10% wrong in norm (printed above). Trained beside FP32 for
# 150 steps on three seeds by `benchmarks/underflow_lm.py` (32 minutes on two CPU cores, so
# read here from the results file it keeps; `--device cuda` runs it on a GPU):

# %%
study = json.loads((HERE.parent / "benchmarks" / "results" / "underflow_lm.json").read_text(encoding="utf-8"))
gaps_w = {}
for seed, regimes in study["seeds"].items():
    fp32_val = regimes["fp32"]["metrics"]["val_loss"]
    gaps_w[seed] = {name: r["metrics"]["val_loss"] - fp32_val for name, r in regimes.items()}
    print(f"seed {seed}: fp32 validation loss {fp32_val:.4f}; " + ", ".join(
        f"{name} {gap:+.4f} (underflow@end {r['underflow_fraction']:.1%})"
        for (name, gap), r in zip(list(gaps_w[seed].items())[1:], list(regimes.values())[1:])))  # fmt: skip
assert study["steps"] == 150 and len(gaps_w) == 3 and all(study["claims"].values())
assert all(0.085 < g["fp16-master"] < 0.135 and abs(g["mixed"]) < 1e-4 for g in gaps_w.values())
assert all(r["skipped_steps"] == 0 for regimes in study["seeds"].values() for r in regimes.values())

# %% [markdown]
# `fp16-master` ends 0.09 to 0.13 nats above FP32's validation loss on every seed, with no step
# skipped, and `mixed`, the same run with the dynamic scale and nothing else changed, within
# 0.0001 of FP32. Loss scaling alone repairs this run's underflow, as the masters alone repaired
# tutorial 4's lost updates (`benchmarks/figures/underflow_lm_loss.png` draws seed 0's losses).

# %% [markdown]
# ## 7. Tolerating one overflow: the rules of the large FP16 runs
#
# Every rule of section 5 halves the scale at the first overflow. In a long FP16 run at a
# well-chosen scale, an overflow can be a single spike: one batch whose gradients are far
# larger than the rest. Halving the scale for it costs more than the skipped step: the scale
# then needs a whole growth window of clean steps to get back, and for those steps the bound at
# or below which a gradient value rounds to zero in FP16, $2^{-25} / S$ (section 1), is twice
# as high. The scalers of Megatron-LM and DeepSpeed, with which large FP16 language models were
# trained, may instead *tolerate* an overflow before they back off, and fairseq's may when its
# tolerance is above 0:
#
# - **Megatron-LM** (`DynamicGradScaler`, megatron-core 0.16.1
#   `megatron/core/optimizer/grad_scaler.py`, lines 116-128): an overflow lowers
#   `hysteresis_tracker` by 1 and backs off once it is <= 0; it is restored to `hysteresis` only
#   when the scale grows (`hysteresis` is 2 by default, `OptimizerConfig` in
#   `megatron/core/optimizer/optimizer_config.py`). The class's docstring speaks of "consecutive
#   NaNs" (line 81), but the clean steps between two overflows do not restore the tracker: what
#   counts is the overflows since the last growth.
# - **DeepSpeed** (`DynamicLossScaler`, DeepSpeed 0.19.8 `deepspeed/runtime/fp16/loss_scaler.py`):
#   `cur_hysteresis`, starting at `delayed_shift` (the fp16 config's `hysteresis`, 2 by default,
#   `deepspeed/runtime/constants.py`), goes down at an overflow that does not back off; it is
#   restored when the scale grows, or, with `consecutive_hysteresis=True` (default False), at
#   every clean step, so that only overflows in a row count (lines 254-286).
# - **fairseq** (`DynamicLossScaler`, fairseq 0.12 `fairseq/optim/dynamic_loss_scaler.py`): an
#   overflow backs off when `overflows_since_rescale` divided by the steps since the last rescale
#   is at least `tolerance` (line 52). The default `tolerance` is 0 (line 13, and fairseq-train's
#   `--fp16-scale-tolerance`, `fairseq/dataclass/configs.py`, line 173): every overflow backs off.
#
# tinyamp has each as a preset (`LossScaler.preset("megatron")`, ...) that takes the library's
# own setting names and reproduces its scale step for step (`tinyamp/amp/hysteresis_rules.py`).
# To see the rules alone we give all of them the same start, $2^{16}$, and the same window, 1000
# clean steps, and feed them one sequence of 6000 steps with five overflows: an isolated one at
# step 1500; two at steps 3000 and 3400, 399 clean steps apart; two in a row at steps 4500 and 4501.

# %%
H_STEPS = 6000
spikes = np.zeros(H_STEPS, dtype=bool)
spikes[[1500, 3000, 3400, 4500, 4501]] = True
hysteresis_rules = {
    "pytorch": LossScaler.preset("pytorch", growth_interval=1000),
    "megatron": LossScaler.preset("megatron", initial_scale=2.0**16, growth_interval=1000),  # hysteresis=2
    "deepspeed": LossScaler.preset("deepspeed", scale_window=1000),  # delayed_shift=2, from 2^16
    "deepspeed, consecutive_hysteresis": LossScaler.preset("deepspeed", scale_window=1000, consecutive_hysteresis=True),
    "fairseq": LossScaler.preset("fairseq", init_scale=2.0**16, scale_window=1000),  # tolerance=0
}
runs = {}
for name, s in hysteresis_rules.items():
    for found_inf in spikes:
        s.update(bool(found_inf))
    runs[name] = s.history_columns()
print(
    f"{'rule':<34}" + "".join(f"{'step ' + str(k):>12}" for k in (1500, 3000, 3400, 4500, 4501)) + "  scale at the end"
)
for name, cols in runs.items():
    print(f"{name:<34}" + "".join(f"{cols['event'][k]:>12}" for k in (1500, 3000, 3400, 4500, 4501))
          + f"  2^{int(np.log2(cols['scale_after'][-1]))}")  # fmt: skip
print("megatron's counters after steps 1499, 1500, 2499, 3000, 3400:",
      [dict(zip(("growth_tracker", "hysteresis_tracker"), (runs["megatron"][c][k] for c in ("growth_tracker",
       "hysteresis_tracker")))) for k in (1499, 1500, 2499, 3000, 3400)])  # fmt: skip

# %% [markdown]
# What the table shows, each claim asserted below:
#
# - **One spike.** At step 1500 PyTorch (and fairseq, with its tolerance of 0) halves its scale,
#   from $2^{17}$ to $2^{16}$; Megatron and DeepSpeed skip the step and keep $2^{17}$ (event
#   `tolerated`), with the counter down to 1. PyTorch's scale is back at $2^{17}$ only at step
#   2500: 1000 steps, one growth window, at half the scale, and one power of two below Megatron's
#   until the next overflow, at step 3000, widens the gap.
# - **Two overflows 399 clean steps apart.** Megatron and DeepSpeed with their defaults back off
#   at step 3400: the clean steps between did not restore the counter, and no growth came between.
#   DeepSpeed with `consecutive_hysteresis=True` tolerates it, as every clean step restored
#   `cur_hysteresis` to 2.
# - **Two in a row.** Every hysteresis rule tolerates step 4500 and backs off at step 4501.
# - **The window is counted differently.** Megatron grows at the 1000th clean step (step 999),
#   DeepSpeed at the 1001st (step 1000): its `stable_interval` counts the clean steps *before*
#   the current one. fairseq's curve is PyTorch's here, step for step.
# - A tolerated step is still skipped: its gradients are not used, only the scale is kept.

# %%
pt_h, mg, ds, dsc, fs = (np.array(runs[n]["scale_after"]) for n in hysteresis_rules)
events_at = {n: [runs[n]["event"][k] for k in (1500, 3000, 3400, 4500, 4501)] for n in runs}
assert pt_h[1499] == mg[1499] == 2.0**17 and pt_h[1500] == 2.0**16 and mg[1500] == ds[1500] == 2.0**17
assert events_at["megatron"][0] == events_at["deepspeed"][0] == "tolerated"
assert runs["megatron"]["hysteresis"][1500] == runs["deepspeed"]["hysteresis"][1500] == 1  # the counter, down by 1
below = np.flatnonzero(pt_h[1500:3000] < 2.0**17) + 1500  # the steps PyTorch's scale spent below its pre-spike value
assert below[0] == 1500 and below[-1] == 2499 and below.size == 1000 and pt_h[2500] == 2.0**17  # one growth window
assert np.all(pt_h[1500:3000] == mg[1500:3000] / 2) and pt_h[3000] == mg[3000] / 4  # one power of two, then two
assert events_at["megatron"][1:3] == events_at["deepspeed"][1:3] == ["tolerated", "backed_off"]
assert events_at["deepspeed, consecutive_hysteresis"][1:3] == ["tolerated", "tolerated"]
assert not any(e == "grew" for e in runs["megatron"]["event"][3001:3400])  # no growth between 3000 and 3400
assert all(
    events_at[n][3:] == ["tolerated", "backed_off"]
    for n in ("megatron", "deepspeed", "deepspeed, consecutive_hysteresis")
)
assert all(e == "backed_off" for n in ("pytorch", "fairseq") for e in events_at[n])
assert mg[998] == 2.0**16 and mg[999] == 2.0**17 and ds[999] == 2.0**16 and ds[1000] == 2.0**17
assert np.array_equal(fs, pt_h)
for n in ("megatron", "deepspeed"):  # tolerated: an overflowed (so skipped) step whose scale did not move
    tol = [i for i, e in enumerate(runs[n]["event"]) if e == "tolerated"]
    assert tol and all(runs[n]["found_inf"][i] and runs[n]["scale_after"][i] == runs[n]["scale_before"][i] for i in tol)

# %%
# pytorch and fairseq share their curve (asserted above): fairseq is drawn thinner on top, with markers;
# deepspeed, dashed, lies on megatron's line but for one step at each growth (asserted below)
fig, ax = plt.subplots(figsize=(7, 4))
looks_h = {
    "pytorch": {"lw": 3.0, "alpha": 0.5},
    "megatron": {"lw": 1.6},
    "deepspeed": {"lw": 1.2, "ls": "--"},
    "deepspeed, consecutive_hysteresis": {"lw": 1.2, "ls": "-."},
    "fairseq": {"lw": 1.0, "ls": ":", "marker": "o", "ms": 3, "markevery": (250, 500)},
}
for name, tr in zip(hysteresis_rules, (pt_h, mg, ds, dsc, fs)):
    label = {"fairseq": "fairseq (tolerance 0: on pytorch's line)",
             "deepspeed": "deepspeed (megatron's line; growths 1 step later)"}.get(name, name)  # fmt: skip
    ax.step(np.arange(H_STEPS), np.log2(tr), where="post", label=label, **looks_h[name])
ax.plot(np.flatnonzero(spikes), np.full(int(spikes.sum()), 13.5), "r|", ms=10, label="overflow")
ax.set_xlabel("step")
ax.set_ylabel("log2 S")
ax.set_title("One overflow sequence, the same start and window: who backs off when", fontsize=9)
ax.grid(alpha=0.3)
ax.set_ylim(13, 21)
ax.legend(fontsize=7, loc="upper left", ncol=2)
fig.tight_layout()
fig.savefig(OUT / "05_hysteresis_rules.png", dpi=110)
# What the labels say: DeepSpeed differs from Megatron only on the step before each of its growths
apart = np.flatnonzero(mg != ds)
assert apart.size == runs["megatron"]["event"].count("grew") and np.all(ds[apart + 1] == mg[apart])

# %% [markdown]
# The states of such a scaler, drawn as in section 3 by running the library's rule (here
# Megatron's, with its defaults): between `steady` and `backed_off` sits `tolerated`, and the
# labels say which counter decides. From `steady` an overflow may go either way, because
# `hysteresis_tracker` is not restored by clean steps; for DeepSpeed with
# `consecutive_hysteresis=True` (asserted, not drawn) no overflow from `steady` backs off.

# %%
megatron_machine = scaler_state_machine("megatron")
mg_arrows = {(t.state, t.event, t.next_state) for t in megatron_machine.transitions}
assert megatron_machine.complete and "tolerated" in megatron_machine.states
assert {("steady", "tolerated", "tolerated"), ("steady", "backed_off", "backed_off")} <= mg_arrows
ds_arrows = {
    (t.state, t.event)
    for t in scaler_state_machine(LossScaler.preset("deepspeed", consecutive_hysteresis=True)).transitions
}
assert ("steady", "tolerated") in ds_arrows and ("steady", "backed_off") not in ds_arrows
fig = draw_scaler_states("megatron")
fig.savefig(OUT / "05_hysteresis_states.png", dpi=80)
fig  # noqa: B018  (the cell's value: a notebook draws the figure under the cell)

# %% [markdown]
# ## Summary
#
# - Small gradients underflow in FP16 (here several percent of a trained MLP's weight
#   gradients); multiplying the loss by $S = 2^k$ shifts most of them into range (the
#   multiplication itself is exact), and the division happens in FP32 on the master gradients.
# - A static scale must be guessed and overflows for ever if guessed too high. The dynamic
#   scaler backs off on overflow, skips that step without touching any weight or moment, and
#   grows again after a run of clean steps.
# - The published rules share that idea and differ in the constants: start, bounds, the
#   scale's dtype, and Chainer's warm-up.
# - Megatron-LM, DeepSpeed and fairseq can tolerate an overflow (skip the step, keep the
#   scale): with `hysteresis=2` one spike costs one step, not a growth window at half the scale.
#   Megatron restores its counter only when the scale grows, DeepSpeed also at every clean step
#   if asked (`consecutive_hysteresis`), fairseq by its default tolerance (0) never tolerates.
# - Loss scaling alone keeps no lost update: on the demo's run `fp16-scaled` ends where `fp16`
#   does, and only the masters bring it to FP32's loss.
# - Loss scaling alone repairs underflow where most of a gradient lies below FP16's range: a
#   softmax over 4,096 word tokens, averaged over 8,192, loses most of its non-target
#   gradients without a scale, and on three seeds `fp16-master` ends above FP32's validation
#   loss while `mixed` matches it.
#
# Next: which operations must stay in FP32 even with a good loss scale (tutorial 6).
