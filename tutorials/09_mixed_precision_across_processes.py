# %% [markdown]
# # 9. Mixed precision across processes
#
# Real mixed-precision training runs on many devices, and that is where its subtlest bugs live.
# In data-parallel training, N processes (*ranks*) each hold a replica of the model, each computes
# the gradient of its own slice of the batch, and the N gradients are summed across ranks before
# the update. Three questions of precision appear that a single process never asks:
#
# - in which dtype are the N gradients summed, and what does FP16 do to that sum as N grows?
# - one rank finds an overflow and skips the step: do the others skip too?
# - the FP32 masters and Adam's moments are 12 of the 16 bytes per parameter: must every rank
#   hold all of them?
#
# `tinyamp.distributed` answers each on MPI (mpi4py with MPICH, on CPUs; NCCL through CuPy on
# GPUs, with the same interface). This tutorial runs as an ordinary script: it launches
# `mpiexec -n 2 python -m tinyamp.distributed ...` for each experiment, with `--dump DIR`,
# where every rank writes what it holds after every step, and reads the files back.
#
# You will learn:
#
# - why an FP16 sum of N gradients overflows where their mean cannot, and what pre-dividing costs;
# - why ranks that check different shards of the gradient must take *one* overflow decision,
#   and what happens when they do not;
# - what ZeRO stage 1 saves (2 + 2 + 12/N bytes per parameter) and why it changes no bit;
# - that two ranks with half a batch each are, bit for bit, one process accumulating two halves.
#
# Time: about 40 seconds to run on a busy 2-core machine (33 s of CPU: each launch starts two or four
# Python processes), 25 minutes to read.

# %%
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from tinyamp.amp import formats
from tinyamp.distributed import REDUCTIONS, reduction_error, sum_in_rank_order, zero_bytes_per_parameter
from tinyamp.distributed.allreduce import divide
from tinyamp.distributed.launch import find_mpiexec

HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = Path(os.environ.get("TINYAMP_TUTORIAL_OUT", HERE / "figures"))
OUT.mkdir(parents=True, exist_ok=True)
ROOT = HERE.parent
WORK = Path(tempfile.mkdtemp(prefix="tinyamp-09-"))
# The mpiexec of this Python's MPI: beside the interpreter first (a venv's, even when the venv's bin/
# is not on PATH, as in a Jupyter kernel), then where mpi4py's MPI library lives, then PATH.
try:
    MPIEXEC = find_mpiexec()
except FileNotFoundError as missing:
    raise SystemExit(f"this tutorial launches mpiexec: {missing}") from None


def run(ranks: int, *flags: str, expect: int = 0) -> list[dict]:
    """Train the digits MLP on `ranks` processes; return what each rank dumped (its JSON, plus its arrays).

    Each dict also holds "peak_rss", in bytes: the largest peak resident set among the job's processes.
    """
    folder = WORK / f"run{len(list(WORK.iterdir()))}"
    folder.mkdir()
    # One BLAS thread per rank: the same float32 sums in every run, and no two ranks fighting for a core.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]))  # fmt: skip
    cmd = [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "tinyamp.distributed", "--model", "mlp",
           "--batch-size", "64", "--quiet", "--dump", str(folder), *flags]  # fmt: skip
    with open(folder / "output.txt", "w+") as output:
        job = subprocess.Popen(cmd, env=env, stdout=output, stderr=subprocess.STDOUT)
        # wait4 returns, with the exit status, what the job used: ru_maxrss is the peak resident set of
        # the largest of mpiexec and the processes it waited for, the ranks (KiB on Linux, bytes on macOS)
        _, status, usage = os.wait4(job.pid, 0)
        job.returncode = os.waitstatus_to_exitcode(status)
        output.seek(0)
        assert job.returncode == expect, output.read()[-4000:]
    dumps = []
    for r in range(ranks):
        info = json.loads((folder / f"rank{r}.json").read_text())
        with np.load(folder / f"rank{r}.npz") as z:
            info["arrays"] = {k: z[k] for k in z.files}
        info["peak_rss"] = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        dumps.append(info)
    return dumps


# %% [markdown]
# ## 1. The sum across ranks, and its dtype
#
# Each rank computes the gradient of the *mean* loss over its B/N examples; the gradient of the
# whole batch is the mean of the N rank gradients. With loss scaling those gradients are large
# on purpose. Nothing in the dynamic rule bounds the scale from above except the overflows it
# causes: it doubles after every run of clean steps and halves at an overflow, so it climbs until
# the largest scaled gradients come near FP16's largest value, 65504, and hovers there (a
# ceiling, where a rule has one, stops it earlier: Apex's $2^{24}$; PyTorch's stops only short of
# float32's inf, tutorial 5). The mean of N values below 65504 is below 65504, but their *sum*
# need not be: two gradients of 40000 sum to 80000, which is inf in FP16. Three ways to compute
# the mean (`tinyamp/distributed/allreduce.py`):
#
# - `float32`: widen each FP16 gradient (exact), sum in FP32, divide by N;
# - `float16`: sum in FP16, divide by N afterwards;
# - `float16-predivide`: divide each gradient by N first, in FP16, then sum. Apex's
#   `DistributedDataParallel`, Horovod's `DistributedOptimizer` and DeepSpeed's configuration
#   each take a `gradient_predivide_factor` f: divide by f before the sum and by N/f after it, so
#   f = N is this scheme. PyTorch's `DistributedDataParallel` has no such parameter; its
#   `fp16_compress_hook` casts each gradient to FP16 and divides it by N before the all-reduce,
#   which is this scheme too (`torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py`).
#   Dividing first keeps each quotient at most $\mathrm{fp16}(65504/N)$, about 65504/N, but two
#   things remain. Rounded quotients can still sum past 65504 (below, for N = 3). And a quotient
#   $|g|/N$ below $2^{-25}$, half of FP16's smallest subnormal, rounds to 0; $2^{-25}$ itself is
#   a tie that goes to the even neighbour, 0; just above it, the quotient rounds up to $2^{-24}$
#   (tutorial 1, section 4).
#
# We measure the three on synthetic gradients of one scaled step: a shared mean per element
# (what the ranks agree on) with 25% of rank-to-rank noise, magnitudes spread from $2^{-24}$ to
# $2^{15}$, for N = 2 to 16 ranks.

# %%
rng = np.random.default_rng(0)
mean = rng.choice([-1.0, 1.0], 50_000) * 2.0 ** rng.uniform(-24, 15, 50_000)
grads = [(mean * (1 + 0.25 * np.clip(rng.standard_normal(50_000), -3, 3))).astype(np.float16) for _ in range(16)]
ranks = [2, 4, 8, 16]
study = {name: [reduction_error(grads[:n], name) for n in ranks] for name in REDUCTIONS}
print(f"{'reduction':<19}{'N':>3}{'overflowed':>12}{'flushed to 0':>14}{'median rel. error':>19}")
for name, rows in study.items():
    for n, e in zip(ranks, rows):
        print(f"{name:<19}{n:>3}{e['overflowed']:>12.2%}{e['flushed_to_zero']:>14.2%}"
              f"{e['median_relative_error']:>19.2e}")  # fmt: skip

over16 = [e["overflowed"] for e in study["float16"]]
assert all(e["overflowed"] == 0 for e in study["float32"])  # FP32's range: the sum never overflows
assert all(a < b for a, b in zip(over16, over16[1:]))  # FP16: more ranks, more overflow
assert all(e["overflowed"] == 0 for e in study["float16-predivide"])  # N a power of two: no overflow here...
flushed = [e["flushed_to_zero"] for e in study["float16-predivide"]]
assert flushed[-1] > study["float16"][-1]["flushed_to_zero"]  # ...but more small values vanish
assert study["float32"][-1]["median_relative_error"] < 2.0**-20 < study["float16"][-1]["median_relative_error"]

# Two lines would lie on 0% on top of each other (FP32 and pre-divided sums never overflowed
# here): drawn once, with both names; the flushed share of the plain FP16 sum is 0 as well.
never = [0.0] * len(ranks)
assert [e["overflowed"] for e in study["float32"]] == [e["overflowed"] for e in study["float16-predivide"]] == never
assert [e["flushed_to_zero"] for e in study["float16"]] == never
fig, ax = plt.subplots(figsize=(7, 3.2))
ax.plot(ranks, [100 * e for e in over16], "s-", color="C1", label="float16: overflowed")
ax.plot(ranks, [100 * f for f in flushed], "^--", color="C2", label="float16-predivide: flushed to 0")
ax.plot(ranks, never, "o:", color="C0", label="0: float32 and float16-predivide overflowed, float16 flushed")
ax.set_xscale("log", base=2)
ax.set_xlabel("ranks N")
ax.set_ylabel("% of gradient elements")
ax.set_title("Summing N scaled FP16 gradients: the dtype of the sum decides", fontsize=9)
ax.grid(alpha=0.3)
ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(OUT / "09_reduction_dtype.png", dpi=110)

# %% [markdown]
# The FP16 sum overflows the more ranks there are: with N ranks, N gradients of only about
# 65504/N each are enough, when they sum to 65520 or more. A dynamic loss scaler would see those
# overflows, skip, and settle about $\log_2 N$ bits lower, giving back the small gradients that
# scaling was meant to save. Pre-dividing moves the problem to the other end, the small values,
# and it removes the overflow only for some N.
# Rounding is monotone, so no N quotients can sum higher than N copies of the largest one,
# $\mathrm{fp16}(65504/N)$, summed in the same order: that worst case decides. For N = 3 the
# quotient rounds *up*, to 21840, and three of them make 65520, the tie between 65504 and the
# next power of two, which rounds to inf. The boundary of the flush to zero, exactly:

# %%
worst = {}
for n in range(2, 17):
    quotient = divide(np.array([65504.0], np.float16), n)  # in FP32, rounded once to FP16
    with np.errstate(over="ignore"):
        worst[n] = float(sum_in_rank_order([quotient] * n)[0])
overflowing = [n for n, v in worst.items() if np.isinf(v)]
print(f"fp16(65504/3) = {float(divide(np.array([65504.0], np.float16), 3)[0]):g}; "
      f"N (2 to 16) whose largest pre-divided sum overflows: {overflowing}")  # fmt: skip
assert worst[3] == np.inf and 5 in overflowing  # N = 3: 21840 + 21840 + 21840 = 65520, inf; N = 5 too
assert all(worst[n] == 65504 for n in (2, 4, 8, 16))  # a power of two divides exactly: the sum is 65504
tiny = np.array([1, 2], np.float16) * np.float16(2**-24)  # the two smallest FP16 subnormals
assert divide(tiny.copy(), 2)[0] == 0  # 2^-24 / 2 = 2^-25, the tie: to the even neighbour, 0
assert np.array_equal(divide(tiny.copy(), 3), [0, 2**-24])  # 1/3 of 2^-24 is below the tie, 2/3 above it
assert formats.round_to(2.0**-25 * (1 + 2**-20)) == 2.0**-24  # just above the tie: up to 2^-24

# %% [markdown]
# An FP32 sum neither overflows nor flushes, at a price in bytes that depends on what is counted. Per parameter, the
# reduce-scatter sends $(N-1)/N$ values in the reduction's dtype: 4 bytes against 2, twice. But
# the step has a second half. Replicated, the all-gather sends the unscaled FP32 gradient
# whatever the reduction (4 bytes), so the whole step sends 8 against 6, $4/3$; under ZeRO it
# sends the FP16 weights (2 bytes), so 6 against 4, $3/2$. Section 2 measures the first.
#
# ## 2. Two ranks, one model: the same bits everywhere
#
# `tinyamp.distributed` builds the all-reduce from its two halves (`allreduce.py`): a
# *reduce-scatter*, after which rank r holds the sum of shard r of the flat gradient, summed in
# rank order $((g_0 + g_1) + g_2) + \dots$, and an *all-gather*, after which every rank holds
# every summed shard. Each shard is summed once, on one rank, so every rank receives the same
# bits, whatever order the MPI library would have chosen. After every step each rank records a
# digest of its FP16 weights, FP32 masters, optimizer moments and scaler state.

# %%
a, b = run(2, "--steps", "6")
print("rank 0, last step:", a["fingerprints"][-1])
print("rank 1, last step:", b["fingerprints"][-1])
assert a["fingerprints"] == b["fingerprints"]  # every step, all four
assert all(np.array_equal(a["arrays"][k], b["arrays"][k]) for k in a["arrays"])

# The bytes each rank sent per step (the communicator counts them as a ring algorithm sends them),
# with the FP32 reduction above and with an FP16 one: the whole step, not only the sum.
(a16, _) = run(2, "--steps", "6", "--reduce-dtype", "float16")
sent32, sent16 = a["rows"][0]["sent_per_step"], a16["rows"][0]["sent_per_step"]
print(f"bytes sent per step by rank 0: {sent32:,.0f} (float32 reduction), {sent16:,.0f} (float16): "
      f"{sent32 / sent16:.3f} times as many, for {a['parameters']:,} parameters")  # fmt: skip
assert abs(sent32 / sent16 - 4 / 3) < 0.01  # 8 bytes against 6 per parameter (x (N-1)/N), not 2x

# %% [markdown]
# ## 3. One overflow decision
#
# Where every rank checks the whole reduced gradient, after a full all-reduce, no agreement is
# needed: every rank holds the same sum, and an inf anywhere in it ($\infty + x = \infty$) is
# found by every rank alike (so PyTorch's `GradScaler` under DDP adds no collective). The ranks
# must agree where they check *different* data: sharded gradients (ZeRO, FSDP, whose
# `ShardedGradScaler` all-reduces found_inf), or a check made before the reduction. tinyamp does
# the first: each rank checks for inf and NaN only in the gradient shard it owns, between the
# reduce-scatter and the all-gather, a check of 1/N of the gradient, and under ZeRO the only part
# a rank holds. Then an overflow in one shard is seen by one rank only. `--overflow-at 2:1`
# writes an inf into rank 1's gradient at step 2, in its own shard, as an overflow in its
# backward would.
#
# With the agreement (`agreement.py`), each rank's found_inf goes through an all-reduce with MAX
# before the skip, so both ranks skip step 2 and both scalers back off. The LossScaler needs no
# change: the agreed decision reaches it as one more gradient, a one-element array that holds inf
# when another rank found an overflow.

# %%
agreed = run(2, "--steps", "5", "--overflow-at", "2:1")
split = run(2, "--steps", "5", "--overflow-at", "2:1", "--no-agree", expect=3)
for label, (r0, r1) in (("with agreement", agreed), ("without", split)):
    print(f"{label}:")
    for r, d in enumerate((r0, r1)):
        print(f"  rank {r}: skipped {[int(s) for s in d['skipped']]}, scales {d['scales']}, "
              f"weights finite: {d['finite']}")  # fmt: skip

r0, r1 = agreed
assert r0["skipped"] == r1["skipped"] == [False, False, True, False, False]
assert r0["fingerprints"] == r1["fingerprints"] and r0["scales"] == r1["scales"]
r0, r1 = split
assert r1["skipped"][2] and not r0["skipped"][2]  # rank 1 skipped alone...
assert r0["fingerprints"][2]["weights"] != r1["fingerprints"][2]["weights"]  # ...and the replicas parted
assert not r0["finite"] and r1["finite"]  # rank 0 stepped with rank 1's inf
assert all(a == 2 * b for a, b in zip(r0["scales"][2:], r1["scales"][2:]))  # the scales parted, by a factor 2

# %% [markdown]
# Without the agreement, rank 0 found its own shard clean and stepped, with the whole gradient,
# rank 1's inf included: its weights are no longer finite (the run exits with status 3, diverged),
# while rank 1's stopped changing (it skips every step from 2 on). Their loss scales part too:
# from step 2 on, rank 0's is twice rank 1's, since both now back off at every step (rank 0's
# non-finite weights make every later gradient overflow, on both ranks). Nothing in rank 0's own
# check could have told it. The agreement costs one 4-byte all-reduce per step.
#
# ## 4. ZeRO stage 1: the masters and moments, sharded
#
# Per parameter, mixed precision with Adam holds 2 bytes of FP16 weight, 2 of FP16 gradient,
# and 12 of optimizer state in FP32: master, first and second moment. The update of an element
# reads only that element's gradient, master and moments, so rank r can keep the 12 bytes for its
# shard alone, update it, and send the others its new FP16 weights (an all-gather). Per rank that
# is $2 + 2 + 12/N$ bytes per parameter (Rajbhandari et al., 2020). The digits MLP trains with
# SGD and momentum: its state is 8 bytes (master and momentum), so $2 + 2 + 8/N$.
#
# What is measured and what is nominal: each rank reports (`DataParallel.memory()`) the `nbytes`
# of the arrays it holds between steps for the weights, the masters and the momentum, the last
# two being what ZeRO shards; the gradient it counts nominally, at the 2 bytes per parameter of
# the FP16 gradient backward writes. During a step a rank holds more: the flattened gradient in
# the reduction's dtype and its FP32 shard, transients that ZeRO's accounting leaves out. And a
# process holds far more than its model states: the peak resident set (RSS) of the largest
# process of each job, which the launcher gets back with the exit status, is printed too. For
# N = 1, 2 and 4 (two processes per core is fine for counting bytes):

# %%
held, sharded, rss = {}, {}, {}
for n in (1, 2, 4):
    dumps = run(n, "--steps", "2", "--zero")
    held[n] = [sum(d["memory"].values()) / d["parameters"] for d in dumps]
    sharded[n] = [(d["memory"]["master weights"] + d["memory"]["optimizer state"]) / d["parameters"] for d in dumps]
    rss[n] = dumps[0]["peak_rss"]
    print(f"N = {n}: bytes per parameter on each rank {[f'{x:.3f}' for x in held[n]]} (masters and momentum "
          f"{[f'{x:.3f}' for x in sharded[n]]}), formula 2 + 2 + 8/N = {zero_bytes_per_parameter(n, 8):.3f}; "
          f"peak RSS of the largest process {rss[n] / 2**20:.0f} MiB")  # fmt: skip
    assert all(abs(x - zero_bytes_per_parameter(n, state_bytes=8)) < 1e-3 for x in held[n])  # padding < N elements
    assert all(abs(x - 8 / n) < 1e-3 for x in sharded[n])  # the sharded arrays' own nbytes: 8/N
states = zero_bytes_per_parameter(1, state_bytes=8) * dumps[0]["parameters"]
print(f"the model states of one replicated rank: {states / 2**20:.2f} MiB")
assert min(rss.values()) > 20 * states  # at this size the interpreter, NumPy and the data dominate
print(f"with Adam's 12 bytes of state the formula gives {zero_bytes_per_parameter(64):.2f} bytes at N = 64, "
      f"against {zero_bytes_per_parameter(1):.0f} at N = 1")  # fmt: skip

fig, ax = plt.subplots(figsize=(6, 3.2))
ns = np.array([1, 2, 4, 8, 16])
ax.plot(ns, [zero_bytes_per_parameter(n, 8) for n in ns], "k--", label="2 + 2 + 8/N (SGD, momentum)")
ax.plot(ns, [zero_bytes_per_parameter(n, 12) for n in ns], "k:", label="2 + 2 + 12/N (Adam)")
ax.plot(list(held), [v[0] for v in held.values()], "o", ms=8,
        label="rank 0 (SGD): weights, masters, momentum measured; gradient counted at 2")  # fmt: skip
ax.set_xscale("log", base=2)
ax.set_xlabel("ranks N")
ax.set_ylabel("bytes per parameter per rank")
ax.set_title("ZeRO-1: model states each rank holds between steps (process RSS not shown)", fontsize=9)
ax.grid(alpha=0.3)
ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(OUT / "09_zero_memory.png", dpi=110)

# %% [markdown]
# Sharding changes who computes each element's update, not its arithmetic, which is elementwise:
# the masters and moments gathered from the ZeRO ranks are those of the replicated run, bit for bit.

# %%
zero = run(2, "--steps", "6", "--zero")
replicated = run(2, "--steps", "6")
for key in replicated[0]["arrays"]:
    assert np.array_equal(zero[0]["arrays"][key], replicated[0]["arrays"][key]), key
print("ZeRO's gathered masters and moments equal the replicated run's:", list(replicated[0]["arrays"]))

# %% [markdown]
# ## 5. Two ranks are one process accumulating two micro-batches
#
# Each rank takes its half of every batch. One process that computes the gradients of the two
# halves one after the other (`--micro-batches 2`) and sums them in the same order, in the same
# dtype, performs exactly the same arithmetic: the results are bit-identical. One process with
# the whole batch is not: the sum over the batch then happens inside the matrix product, in
# BLAS's order, so its gradients differ from the two halves' in float32 rounding. That alone
# would leave the masters about $2^{-24}$ apart, relative. But each step rounds the masters to
# the FP16 weights the next forward computes with, and where a master lies within that tiny
# difference of an FP16 rounding boundary, the two runs' weights differ by one FP16 ulp. From
# then on the runs compute with different weights, and the masters part by the size of FP16's
# rounding of a weight: after 8 steps, by less than $2^{-11}$ (half an FP16 ulp, relative) of
# the largest master, but far more than float32's $2^{-24}$.

# %%
(two, _) = run(2, "--steps", "8")
(one,) = run(1, "--steps", "8", "--micro-batches", "2")
(whole,) = run(1, "--steps", "8")
assert two["loss"] == one["loss"] and two["fingerprints"] == one["fingerprints"]
w2, w1 = two["arrays"]["masters"].astype(np.float64), whole["arrays"]["masters"].astype(np.float64)
gap = np.max(np.abs(w2 - w1)) / np.max(np.abs(w1))
flipped = np.count_nonzero(two["arrays"]["weights"] != whole["arrays"]["weights"])
print(f"2 ranks vs 1 process x 2 micro-batches: identical; vs 1 process x whole batch: masters within {gap:.1e} "
      f"of the largest ({gap / 2**-11:.2f} x 2^-11); {flipped:,} of {w1.size:,} FP16 weights differ")  # fmt: skip
assert flipped > 0  # some FP16 weights were rounded differently ...
assert 2.0**-16 < gap < 2.0**-11  # ... and the masters differ by FP16's rounding, far above float32's 2^-24

shutil.rmtree(WORK, ignore_errors=True)

# %% [markdown]
# ## Summary
#
# - Sum gradients across ranks in FP32: an FP16 sum overflows where the mean cannot, the more
#   so the more ranks; pre-dividing by N trades that overflow (all of it only for some N, powers
#   of two among them) for small values lost: quotients at or below $2^{-25}$ become 0. FP32's
#   price here: 4/3 the bytes of a step with an FP16 reduction, not 2x.
# - Ranks that check different data (each its own shard, as here and under ZeRO) must take one
#   overflow decision: all-reduce found_inf (MAX) before the skip. Without it, one rank skips,
#   another steps with the inf, and the replicas part for good.
# - ZeRO-1 shards the 12 bytes of FP32 state per parameter across ranks, $2 + 2 + 12/N$ bytes
#   each in ZeRO's accounting of model states (the process holds far more), and changes no bit
#   of the result.
# - Data parallelism over N ranks is gradient accumulation over N micro-batches, bit for bit,
#   when the sum has the same order and dtype.
#
# `mpiexec -n 2 python -m tinyamp.distributed --zero` trains with all of it and prints a table
# per rank; `benchmarks/distributed_step.py` times a step and its communication.
