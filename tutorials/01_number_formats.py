# %% [markdown]
# # 1. Floating-point formats: FP32, FP16 and BF16, bit by bit
#
# Mixed-precision training stores and computes with 16-bit numbers where it can and keeps
# 32-bit numbers where it must. Every rule of it (FP32 master weights, loss scaling, which ops
# stay in FP32) follows from three facts about a floating-point format: how large a number it
# can hold, how small, and how far apart its neighbouring values are. This tutorial takes
# those facts apart on the bits themselves.
#
# You will learn:
#
# - how a value is laid out in sign, exponent and mantissa bits, and how to decode it by hand;
# - the range (largest value, smallest normal, smallest subnormal) and the precision (epsilon)
#   of FP32, FP16 and BF16, and where each comes from;
# - round to nearest, ties to even, and what overflow (65520 becomes inf) and underflow
#   ($2^{-25}$ becomes 0) look like in FP16;
# - the unit in the last place (ulp) at a value, and why an addend smaller than half the gap to
#   the next value in its direction disappears: $2048 + 1 = 2048$, but $2048 - 0.6 = 2047$, and a
#   running sum of 0.01 stops growing at 32;
# - how one FP32 addition rounds a value to FP16, the trick behind fast software converters.
#
# Time: about 3.5 seconds to run, 20 minutes to read.

# %%
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from tinyamp.amp import formats

# figures go next to this file (or the notebook's folder, where __file__ is not defined)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = Path(os.environ.get("TINYAMP_TUTORIAL_OUT", HERE / "figures"))
OUT.mkdir(parents=True, exist_ok=True)

FP16, BF16, FP32 = (formats.get_format(name) for name in ("float16", "bfloat16", "float32"))

# %% [markdown]
# ## 1. Three formats as data
#
# A binary floating-point number is $(-1)^s \cdot 2^{E - \text{bias}} \cdot 1.m$: one sign bit
# $s$, an exponent field $E$ of $e$ bits, and a mantissa (fraction) field $m$ of $p$ bits. The
# leading 1 before the binary point is not stored, so a normal number has $p + 1$ significant
# bits. `tinyamp.amp.formats` reads each format's limits from NumPy's `finfo` (or from
# `ml_dtypes` for BF16, which NumPy lacks), so the table below is what the arrays really do.

# %%
print(formats.format_table())

# %% [markdown]
# Every number in that table follows from the two field widths. With $e$ exponent bits the
# bias is $2^{e-1} - 1$; the all-zeros exponent is reserved for zero and the subnormals, and
# the all-ones exponent for inf and NaN. So:
#
# - the largest exponent of a finite number is $2^{e} - 2 - \text{bias} = \text{bias}$, and
#   the largest value is $(2 - 2^{-p}) \cdot 2^{\text{bias}}$ (all mantissa bits set);
# - the smallest normal value is $2^{1 - \text{bias}}$;
# - the smallest subnormal is $2^{1 - \text{bias} - p}$: the last mantissa bit at the
#   smallest exponent;
# - machine epsilon, the distance from 1 to the next larger value, is $2^{-p}$.
#
# We check each of those against the values NumPy reports.

# %%
for f in (FP16, BF16, FP32):
    bias = 2 ** (f.exponent_bits - 1) - 1
    derived = {
        "max": (2 - 2.0**-f.mantissa_bits) * 2.0**bias,
        "min_normal": 2.0 ** (1 - bias),
        "min_subnormal": 2.0 ** (1 - bias - f.mantissa_bits),
        "epsilon": 2.0**-f.mantissa_bits,
    }
    for key, value in derived.items():
        assert getattr(f, key) == value, (f.name, key, getattr(f, key), value)
    digits = (f.mantissa_bits + 1) * np.log10(2)
    print(f"{f.name:<9} bias {bias:>3}; {f.mantissa_bits + 1:>2} significant bits, about {digits:.1f} decimal digits")

# %% [markdown]
# FP16 and BF16 both take 16 bits but spend them differently. FP16 (IEEE 754 binary16) keeps
# 10 mantissa bits and only 5 exponent bits: good precision, a narrow range (up to 65504).
# BF16 keeps FP32's 8 exponent bits and so FP32's range (up to $3.4 \times 10^{38}$), with only
# 7 mantissa bits. Which of the two failures of 16-bit training you meet first, running out
# of range or running out of precision, depends on which format you picked.

# %% [markdown]
# ## 2. The bits of a value
#
# The function below cuts a value, rounded to a format, into its three fields, and `decode`
# rebuilds the value from the fields with the formula above (and the subnormal rule: for
# $E = 0$ the leading bit is 0 and the exponent is $1 - \text{bias}$). If the two agree for
# every value, we have understood the layout.

# %%
UINT = {16: np.uint16, 32: np.uint32}


def fields(x, f):
    """(sign, exponent field, mantissa field) of `x` rounded to format `f`."""
    raw = int(np.asarray(formats.round_to(x, f.name)).astype(f.dtype).view(UINT[f.bits]))
    p, e = f.mantissa_bits, f.exponent_bits
    return raw >> (e + p), (raw >> p) & (2**e - 1), raw & (2**p - 1)


def decode(sign, exponent, mantissa, f):
    """The value the three fields stand for."""
    bias, p = 2 ** (f.exponent_bits - 1) - 1, f.mantissa_bits
    if exponent == 2**f.exponent_bits - 1:
        return (-1) ** sign * np.inf if mantissa == 0 else np.nan
    if exponent == 0:  # zero and the subnormals: no implicit leading 1
        return (-1) ** sign * 2.0 ** (1 - bias) * (mantissa / 2**p)
    return (-1) ** sign * 2.0 ** (exponent - bias) * (1 + mantissa / 2**p)


def show(x, f):
    s, e, m = fields(x, f)
    value = decode(s, e, m, f)
    print(f"{f.name:<9}{x!r:>24} -> {s:b} {e:0{f.exponent_bits}b} {m:0{f.mantissa_bits}b}  = {value!r}")
    return value


examples = [1.0, -2.5, 0.1, 1 / 3, 65504.0, 2.0**-14, 2.0**-24, 3e-8, 1e5]
for f in (FP16, BF16, FP32):
    for x in examples:
        value = show(x, f)
        # the decoded fields are exactly the value the format stores
        assert value == formats.round_to(x, f.name), (f.name, x, value)
    print()

# %% [markdown]
# Read a few rows:
#
# - `1.0` is exponent field = bias (01111 in FP16), mantissa 0.
# - `0.1` has no finite binary expansion (it is $1.6 \times 2^{-4}$ and 0.6 repeats in
#   binary), so every format stores a rounded value: 0.0999755859375 in FP16,
#   0.10009765625 in BF16. The error is at most half a step between neighbours.
# - `2**-14` is the smallest FP16 value with an implicit leading 1 (exponent field 00001).
#   `2**-24` has exponent field 0: a *subnormal*, whose only set bit is the last mantissa bit.
# - `1e5` is larger than FP16's 65504: all exponent bits set, mantissa 0, which is inf.
#   BF16 and FP32 hold it, BF16 only to 3 digits (99840). Even FP16's largest value, 65504,
#   is not a BF16 value: with 7 mantissa bits its neighbours there are 65280 and 65536.
#
# BF16 is exactly the upper half of FP32: same sign, same exponent, the first 7 of FP32's 23
# mantissa bits. Converting FP32 to BF16 therefore means rounding away the low 16 bits.

# %%
for x in (1.0, -2.5, 0.1, 1 / 3, 1e5):
    bits32 = int(np.float32(x).view(np.uint32))
    bits16 = int(np.asarray(formats.round_to(x, "bfloat16")).astype(BF16.dtype).view(np.uint16))
    low = bits32 & 0xFFFF
    # round to nearest, ties to even, on the discarded 16 bits
    rounded_up = low > 0x8000 or (low == 0x8000 and (bits32 >> 16) & 1)
    direction = "up" if rounded_up else "down"
    print(f"{x!r:>20}: FP32 {bits32:08x}  BF16 {bits16:04x}  (low half {low:04x}, rounded {direction})")
    assert bits16 == (bits32 >> 16) + rounded_up

# %% [markdown]
# ## 3. Rounding: to nearest, ties to even
#
# A real number between two neighbouring values of a format is rounded to the nearer one. If it
# lies exactly halfway, it goes to the neighbour whose last mantissa bit is 0 (the "even" one).
# Ties-to-even is the IEEE 754 default because it has no bias: half the ties go up, half go
# down, so rounding errors do not drift in one direction over a long computation.
#
# Between 2048 and 4096 the FP16 values are 2 apart (10 mantissa bits: $2^{11} \cdot 2^{-10}$),
# so every odd integer there is a tie.

# %%
for x in (2049.0, 2051.0, 2053.0, 2050.0, 2049.5):
    print(f"fp16({x}) = {formats.round_to(x)}")
assert formats.round_to(2049.0) == 2048  # tie: 2048 has the even mantissa (0), 2050 the odd one
assert formats.round_to(2051.0) == 2052  # tie: this time the even neighbour is above
assert formats.round_to(2049.5) == 2050  # not a tie: nearer to 2050

# The same rule at 1: the FP16 neighbours of 1 above are 1 + 2^-10 and 1 + 2^-9.
assert formats.round_to(1 + 2**-11) == 1  # halfway between 1 and 1 + 2^-10: to even, 1
assert formats.round_to(1 + 3 * 2**-11) == 1 + 2**-9  # halfway between 1 + 2^-10 and 1 + 2^-9: to even
assert np.float16(1) + np.float16(2**-11) == 1  # NumPy's FP16 arithmetic rounds the same way

# %% [markdown]
# ## 4. The edges of the range: overflow and underflow
#
# `formats.classify` says what a format does to a real number: keeps it as a normal number,
# keeps it as a subnormal (with fewer significant bits), flushes it to zero (underflow) or
# turns it into inf (overflow).
#
# **Overflow.** The largest FP16 value is $65504 = (2 - 2^{-10}) \cdot 2^{15}$. The next value
# the exponent could give, $2^{16} = 65536$, does not exist (that exponent field means inf), but
# rounding still behaves as if it did: anything from the midpoint 65520 upward rounds to inf.

# %%
for x in (65504.0, 65519.0, 65519.99, 65520.0, 70000.0):
    print(f"{x:>9}: fp16 -> {formats.round_to(x)!s:>8}   {formats.classify(x)}")
assert formats.round_to(65519.99) == 65504 and formats.classify(65519.99) == "normal"
assert np.isinf(formats.round_to(65520.0)) and formats.classify(65520.0) == "overflow"

with np.errstate(over="ignore"):
    product = np.float16(300) * np.float16(300)  # 90000: a product of two harmless values
    e12 = np.exp(np.float16(12))  # e^12 = 162755
print(f"fp16: 300 * 300 = {product},  exp(12) = {e12}")
assert np.isinf(product) and np.isinf(e12)

# %% [markdown]
# Overflow is abrupt: nothing warns that a value is close to the limit, and once an inf is in
# a computation it spreads ($\infty - \infty$ and $0 \cdot \infty$ are NaN). This is why
# tinyamp's autocast keeps `exp`, `softmax` and the losses in FP32 (tutorial 6), and why the
# squares inside a variance are computed in FP32 ($256^2 = 65536$ already overflows).
#
# **Underflow.** Below the smallest normal value $2^{-14}$ the exponent cannot shrink further,
# so FP16 gives up significant bits instead: the subnormals $k \cdot 2^{-24}$, $k = 1 \dots 1023$,
# are evenly spaced, $2^{-24} \approx 6 \times 10^{-8}$ apart. A subnormal near $2^{-24}$ has a
# single significant bit. Below half of $2^{-24}$ a value rounds to zero; exactly $2^{-25}$ is a
# tie between 0 and $2^{-24}$, and ties go to the even neighbour, 0.

# %%
for x in (2.0**-14, 1e-5, 1e-6, 1e-7, 2.0**-24, 2.0**-25 * 1.001, 2.0**-25, 1e-8):
    r = float(formats.round_to(x))
    print(f"{x:11.4e}: fp16 -> {r:11.4e}  relative error {abs(r - x) / x:7.2%}   {formats.classify(x)}")
assert formats.classify(2.0**-14) == "normal" and formats.classify(1e-5) == "subnormal"
assert formats.round_to(2.0**-25) == 0 and formats.classify(2.0**-25) == "underflow"
assert formats.round_to(2.0**-25 * 1.001) == 2.0**-24
# a subnormal loses relative precision: 1e-7 is stored with an error of tens of percent
assert abs(formats.round_to(1e-7) - 1e-7) / 1e-7 > 0.1
assert abs(formats.round_to(1e-3) - 1e-3) / 1e-3 < FP16.epsilon  # a normal value: under 2^-10

# %% [markdown]
# Gradients in deep networks are often that small. Micikevicius et al. (2018, Figure 3)
# histogram the activation gradients of an SSD detector trained in FP32: most of FP16's range
# goes unused, while many values lie below its smallest subnormal $2^{-24}$, and those at or
# below $2^{-25}$ become zero in FP16. Tutorial 3 measures the same on a real model here;
# tutorial 5 moves them back into range with loss scaling.
#
# BF16 has FP32's exponent bits and so the same smallest *normal* value, $2^{-126}$: gradients
# of $10^{-8}$ or $10^{-20}$ are ordinary normal numbers there. It does not have the same
# underflow, though. With 7 mantissa bits instead of 23, its subnormals stop at $2^{-133}$,
# where FP32's go on to $2^{-149}$: a value like $10^{-42}$ is an FP32 subnormal and a BF16 zero.

# %%
for x in (1e-8, 1e-20, 1e-38, 1e-42):
    print(
        f"{x:.0e}:  fp16 {formats.classify(x, 'float16'):<10} bf16 {formats.classify(x, 'bfloat16'):<10} "
        f"fp32 {formats.classify(x, 'float32')}"
    )
assert formats.classify(1e-20, "float16") == "underflow" and formats.classify(1e-20, "bfloat16") == "normal"
assert BF16.min_normal == FP32.min_normal == 2.0**-126  # the same normal range ...
assert BF16.min_subnormal == 2.0**-133 and FP32.min_subnormal == 2.0**-149  # ... not the same underflow
assert formats.classify(1e-42, "bfloat16") == "underflow" and formats.classify(1e-42, "float32") == "subnormal"

# %% [markdown]
# ## 5. The ulp, and the additions that are lost
#
# The *ulp* (unit in the last place) at $x$ is the gap between $x$ and the next larger
# representable magnitude. For a normal number with $2^k \le |x| < 2^{k+1}$ it is
# $2^{k - p}$: it doubles at every power of two, so the *relative* spacing stays between
# $2^{-p-1}$ and $2^{-p}$ over the whole normal range. Among the subnormals it is constant.
#
# `formats.ulp` computes it from that definition; NumPy's `np.spacing` measures it on the
# actual arrays. They must agree.

# %%
for x in (1.0, 1.5, 2.0, 1000.0, 2048.0, 65504.0, 1e-6):
    print(
        f"ulp({x:g}):  fp16 {formats.ulp(x, 'float16'):<12.6g} bf16 {formats.ulp(x, 'bfloat16'):<12.6g} "
        f"fp32 {formats.ulp(x, 'float32'):.6g}"
    )

rng = np.random.default_rng(0)
samples = 2.0 ** rng.uniform(-30, 15.9, size=400)  # from deep in the subnormals to just under 65504
for name, dtype in (("float16", np.float16), ("float32", np.float32)):
    ours = np.array([formats.ulp(x, name) for x in samples])
    numpys = np.spacing(samples.astype(dtype)).astype(np.float64)
    assert np.array_equal(ours, numpys), name
assert formats.ulp(1.0) == FP16.epsilon and formats.ulp(2048.0) == 2 and formats.ulp(65504.0) == 32
print("formats.ulp agrees with np.spacing on 400 random FP16 and FP32 values")

# %% [markdown]
# Adding $u$ to $w$ changes nothing when the exact sum lies nearer to $w$ than to $w$'s neighbour
# *in the direction of $u$*: when $|u|$ is below half the gap to that neighbour (at exactly half,
# a tie, it goes to the even one). Away from zero the gap is one ulp of $w$, so the limit is half
# an ulp. Toward zero it is the same, except at a power of two: the values just below $2^k$ have
# the spacing of the binade below, half an ulp of $2^k$, so there the limit is a quarter of an
# ulp (at the smallest normal, $2^{-14}$, the subnormals below are as far apart as the values
# above, and the limit stays half an ulp). At $w = 2048$ the FP16 ulp is 2: adding 1 is a tie
# and goes to the even neighbour, 2048 itself, and adding 0.6 is lost too, but *subtracting*
# 0.6 gives 2047, because the FP16 values below 2048 are 1 apart. `formats.update_is_lost` asks
# exactly this question (`tinyamp/amp/lost_updates.py` has the rule), and tutorial 4 asks it for
# every weight of a network at every step of training.

# %%
assert np.float16(2048) + np.float16(1) == 2048
# 2051 is a tie too, halfway between 2050 and 2052; the even neighbour is 2052: a step of 4 for an addend of 3
assert np.float16(2048) + np.float16(3) == 2052
assert formats.update_is_lost(2048.0, 1.0) and not formats.update_is_lost(2048.0, 1.5)
# toward zero from the power of two 2048 the gap is 1, not 2: 0.6 is lost upward but not downward
assert formats.update_is_lost(2048.0, 0.6) and not formats.update_is_lost(2048.0, -0.6)
assert np.float16(2048) - np.float16(0.6) == 2047 and formats.round_to(2048 - 0.5) == 2048  # 2047.5: a tie, to even
assert formats.update_is_lost(1.0, 2**-11) and not formats.update_is_lost(1.0, 2**-10)
assert np.float32(2**24) + np.float32(1) == 2**24  # FP32 has the same wall, 8192 times further out
assert not formats.update_is_lost(1.0, 2**-11, "float32")
print(f"fp16: 2048 + 1 = {np.float16(2048) + np.float16(1)},  2048 - 0.6 = {np.float16(2048) - np.float16(0.6)}")
print(
    "weight 0.06, update 1e-5 lost in fp16?",
    formats.update_is_lost(0.06, 1e-5),
    "  in bf16?",
    formats.update_is_lost(0.06, 1e-5, "bfloat16"),
    "  in fp32?",
    formats.update_is_lost(0.06, 1e-5, "float32"),
)

# %% [markdown]
# A running sum is a sequence of such additions, and it stalls once its value is so large that
# half its ulp exceeds the addend. Summing the FP16 value of 0.01 ten thousand times should give
# 100. In FP16 it does something stranger, so we measure it step by step and compare with a
# float32 accumulator (the choice tinyamp's reductions make: `sum` and `mean` of FP16 tensors
# accumulate in FP32 and round once).

# %%
N = 10_000
step16 = np.float16(0.01)
running16 = np.empty(N)
s16, s32 = np.float16(0), np.float32(0)
running32 = np.empty(N)
for i in range(N):
    s16 = np.float16(s16 + step16)
    s32 = np.float32(s32 + np.float32(step16))
    running16[i], running32[i] = s16, s32
exact = float(step16) * np.arange(1, N + 1)
stall_value = running16[-1]
stall_step = int(np.argmax(running16 == stall_value))
print(
    f"fp16 running sum of {float(step16)!r}: stops at {stall_value} after {stall_step + 1} additions "
    f"(exact then: {exact[stall_step]:.4f}); after {N}: {stall_value} instead of {exact[-1]:.4f}"
)
print(f"fp32 accumulator: {running32[-1]:.4f}")
assert stall_value == 32.0 and running16[N // 2] == 32.0
assert abs(running32[-1] - exact[-1]) < 1e-3 * exact[-1]

# In [8, 16) the FP16 ulp is 2^-7 = 0.0078125: 0.01 lies nearer to one ulp than to two, so each
# addition adds 0.0078125 and the sum falls behind the exact one ...
jumps = np.diff(running16)
in_8_16 = (running16[:-1] >= 8) & (running16[:-1] < 16)
assert np.all(jumps[in_8_16] == 2.0**-7)
# ... in [16, 32) the ulp is 2^-6 = 0.015625: 0.01 is more than half of it, so each addition
# rounds *up* to a whole ulp and the sum runs ahead ...
in_16_32 = (running16[:-1] >= 16) & (running16[:-1] < 32)
assert np.all(jumps[in_16_32] == 2.0**-6) and running16[stall_step - 1] > exact[stall_step - 1]
# ... and at 32 the ulp is 2^-5: 0.01 is less than half of it, and every addition rounds back.
assert formats.update_is_lost(32.0, float(step16)) and not formats.update_is_lost(31.0, float(step16))

# %% [markdown]
# The sum is wrong in three different ways. Between 8 and 16 every addition of 0.01 becomes an
# addition of one ulp, 0.0078125, and the sum falls behind; between 16 and 32 it becomes an
# addition of one ulp, 0.015625, and the sum runs ahead; at 32, where half an ulp (0.015625)
# exceeds 0.01, it stops dead. All three are the same mechanism: the result of each addition is
# rounded to the spacing at the size of the *sum*, not of the addend. The figure plots the
# running sums next to the spacing of the three formats.

# %%
fig, (ax_ulp, ax_sum) = plt.subplots(1, 2, figsize=(12, 4.5))
xs = 2.0 ** np.linspace(-28, 17.5, 1500)
colors = {"float16": "#d62728", "bfloat16": "#9467bd", "float32": "#000000"}
for f in (FP16, BF16, FP32):
    finite = xs[xs <= f.max]
    ax_ulp.loglog(finite, [formats.ulp(x, f.name) for x in finite], label=f.name, color=colors[f.name], lw=1.4)
ax_ulp.axvspan(xs[0], FP16.min_normal, color="#ff7f0e", alpha=0.12, label="FP16 subnormal (ulp constant)")
ax_ulp.axvline(FP16.max, color="#d62728", ls="--", lw=1, label="FP16 max, 65504")
ax_ulp.set_xlabel("value x")
ax_ulp.set_ylabel("ulp(x): gap to the next value")
ax_ulp.set_title("Spacing of representable values")
ax_ulp.grid(True, which="major", alpha=0.3)
ax_ulp.legend(fontsize=8)
drawn_ulp = {line.get_label(): (line.get_xdata(), line.get_ydata()) for line in ax_ulp.get_lines()}

steps = np.arange(1, N + 1)
ax_sum.plot(steps, exact, color="#777777", lw=2.5, label="exact")
ax_sum.plot(steps, running32, color="#000000", lw=1, ls="--", label="FP32 running sum")
ax_sum.plot(steps, running16, color="#d62728", lw=1.4, label="FP16 running sum")
ax_sum.axhline(32, color="#d62728", lw=0.6, ls=":")
ax_sum.set_xlabel("additions of fp16(0.01)")
ax_sum.set_ylabel("running sum")
ax_sum.set_title("A running FP16 sum stalls where ulp/2 > addend")
ax_sum.grid(True, alpha=0.3)
ax_sum.legend(fontsize=8)
fig.tight_layout()
path = OUT / "01_ulp_and_stalled_sum.png"
fig.savefig(path, dpi=110)
print("wrote", path.name)

# The ruler, read off the plotted staircases: over FP16's normal range FP32's ulp is 2^13 times
# smaller and BF16's 2^3 times larger (compared where no format rounds x up into the next binade,
# which happens just below each power of two, soonest in BF16); among FP16's subnormals its ulp is
# flat at 2^-24; its line ends at 65504, the others run to the edge of the plot.
x16, ulp16 = drawn_ulp["float16"]
ulp32, ulp_bf16 = drawn_ulp["float32"][1][: x16.size], drawn_ulp["bfloat16"][1][: x16.size]
binade = np.floor(np.log2(x16))
with np.errstate(divide="ignore"):  # FP16 rounds the smallest x to 0, whose log2 is -inf: not the same binade
    same_binade = np.all([np.floor(np.log2(formats.round_to(x16, f.name))) == binade for f in (FP16, BF16)], axis=0)
normal16 = (x16 >= FP16.min_normal) & same_binade
assert np.all(ulp16[normal16] / ulp32[normal16] == 2.0**13) and normal16.mean() > 0.5
assert np.all(ulp_bf16[normal16] / ulp16[normal16] == 2.0**3)
subnormal16 = x16 < FP16.min_normal
assert np.all(ulp16[subnormal16] == FP16.min_subnormal) and subnormal16.any()
assert x16.max() <= FP16.max < drawn_ulp["float32"][0].max() == drawn_ulp["bfloat16"][0].max() == xs.max()

# %% [markdown]
# Read the left panel as a ruler. Each format's ulp is a staircase that doubles at each power of
# two; FP32's staircase lies $2^{13} = 8192$ times below FP16's (23 versus 10 mantissa bits) and
# BF16's $2^{3} = 8$ times above it. FP16's line turns flat where the subnormals begin and ends at
# 65504; BF16 and FP32 continue far beyond both edges of the plot.
#
# ## 6. Rounding with one addition
#
# The ruler explains a trick that fast software FP16 converters use. Adding $x$ to a much larger
# number $B$ rounds $x$ to the ulp of $B$. For $2^E \le |x| < 2^{E+1}$ FP16's ulp is $2^{E-10}$,
# and FP32's ulp at $B = 2^{E+13}$ is $2^{E+13-23} = 2^{E-10}$: the same. So in FP32 arithmetic
# $(|x| + B) - B$ is $|x|$ rounded to FP16, by the hardware's own round to nearest, ties to
# even. Below $2^{-14}$ FP16's ulp stops shrinking at $2^{-24}$, so $B$ stops at $2^{-1}$.
# No branch, no loop over elements: this is how tinyamp rounds arrays, in
# `tinyamp/rounding.py` (it reads the bits of the sum instead of subtracting $B$), the reference
# that `tinyamp.kernels.cast` runs. The engine room runs the same formula with the same bits in
# two other ways: in cache-sized blocks of NumPy passes, or as a loop over single elements
# compiled by numba when it is installed (`tinyamp/fast/casts.py`). This tutorial checks their
# bits, not their speed: `benchmarks/cast_speed.py` measures how fast each one runs on your machine.

# %%
from tinyamp.rounding import round_to_float16  # noqa: E402


def round_by_addition(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to FP16 precision (still float32), with one addition."""
    magnitude = np.abs(x)
    _, e = np.frexp(magnitude)  # magnitude = m * 2^e with 1/2 <= m < 1, so E = e - 1
    big = np.ldexp(np.float32(1), np.maximum(e - 1, -14) + 13).astype(np.float32)
    return np.copysign((magnitude + big) - big, x)  # float32 + float32: rounded by the FPU


rng = np.random.default_rng(0)
ties = np.array([2049, 2051, 1 + 2**-11, 1 + 3 * 2**-11, 3 * 2**-25, 2**-25, 0], np.float32)
samples = np.concatenate([ties, -ties, rng.standard_normal(100_000) * 10.0 ** rng.integers(-9, 4, 100_000)])
samples = samples[np.abs(samples) < 65520].astype(np.float32)  # beyond: inf, a case of its own
by_addition = round_by_addition(samples)
print(f"fp16(2049) by addition: {by_addition[0]},  fp16(3 * 2^-25): {by_addition[4]:.3e} = 2^-23")
assert np.array_equal(by_addition, samples.astype(np.float16).astype(np.float32))  # every value, every tie
assert np.array_equal(round_to_float16(samples), samples.astype(np.float16))  # tinyamp's: the same bits

# The engine room's two implementations of the formula, side by side: the NumPy passes always,
# the compiled loop when numba is installed (`casts.active_kernels()` says which runs).
from tinyamp.fast import casts  # noqa: E402

for implementation in casts.KERNELS:
    try:
        with casts.kernels(implementation):
            assert np.array_equal(casts.round_to_float16(samples), samples.astype(np.float16))
        print(f"{implementation:5s}: the same bits as NumPy's astype on {samples.size} values")
    except ImportError as why:  # numba not installed: the NumPy passes run
        print(f"{implementation:5s}: not available here ({why})")

# %% [markdown]
# ## Summary
#
# - FP16: 5 exponent bits, 10 mantissa bits. Largest value 65504 (from 65520 up: inf), smallest
#   normal $2^{-14}$, smallest subnormal $2^{-24}$ (at or below $2^{-25}$: zero), epsilon $2^{-10}$.
# - BF16: FP32's range of normal numbers with 7 mantissa bits, epsilon $2^{-7}$: 8 times coarser
#   than FP16. Its smallest subnormal is $2^{-133}$ against FP32's $2^{-149}$, so it keeps every
#   normal FP32 magnitude but underflows a little sooner.
# - Rounding is to nearest, ties to even. An addend is lost when it is smaller than half the gap
#   between the value it is added to and that value's neighbour in the addend's direction (half
#   an ulp; toward zero from a normal power of two above $2^{-14}$, a quarter of one); one of
#   exactly half is a tie that goes to the even neighbour.
#
# The two failures of FP16 training follow directly. Gradients at or below $2^{-25}$ vanish
# (underflow; fixed by loss scaling), and a weight update can vanish once its weight is 2048 times
# larger, and always does once it is 4096 times larger (fixed by FP32 master weights). Tutorial 3
# measures both on a real network.
