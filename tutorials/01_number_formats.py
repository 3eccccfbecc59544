# %% [markdown]
# # 1. Floating-point formats and FP16 arithmetic: FP32, FP16 and BF16, bit by bit
#
# Mixed-precision training stores and computes with 16-bit numbers where it can and keeps
# 32-bit numbers where it must. Every rule of it (FP32 master weights, loss scaling, which ops
# stay in FP32) follows from three facts about a floating-point format: how large a number it
# can hold, how small, and how far apart its neighbouring values are. This tutorial takes
# those facts apart on the bits themselves, and then applies them to the two operations a
# network spends its time on: products, and the sums that add them up.
#
# You will learn:
#
# - how a value is laid out in sign, exponent and mantissa bits, and how to decode it by hand;
# - the range (largest value, smallest normal, smallest subnormal) and the precision (epsilon)
#   of FP32, FP16 and BF16, and where each comes from;
# - round to nearest, ties to even, and what overflow (65520 becomes inf) and underflow
#   ($2^{-25}$ becomes 0) look like in FP16;
# - the unit in the last place (ulp) at a value, and why an addend at most half the gap to the
#   next value in its direction disappears (at exactly half, a tie, the even neighbour wins):
#   $2048 + 1 = 2048$ (a tie: the gap above 2048 is 2), but $2048 - 0.6 = 2047$, and a
#   running sum of 0.01 stops growing at 32;
# - why the product of two FP16 numbers is exact in FP32, and why a matrix product of FP16
#   matrices accumulates in FP32 and rounds once: what every later tutorial's FP16 matmul does.
#
# How a converter rounds FP32 to FP16 with one FP32 addition, bit by bit, is the subject of the
# appendix, `A1_inside_the_converters.py`.
#
# The products of sections 6 and 7 run on one BLAS thread (`threadpool_limits(1)` below):
# OpenBLAS splits the work of a product differently for each thread count, so its float32 sums
# would round differently and the numbers printed here would depend on the machine.
#
# Prerequisites: Python and NumPy; nothing about floating point.
#
# Time: about 6 s of CPU to run (14 s wall-clock on a busy shared 2-core machine), 60 minutes to read
# (a reader took 55 to 60).

# %%
import math
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from threadpoolctl import threadpool_limits

import tinyamp as ta
from tinyamp.amp import formats

# figures go next to this file (or the notebook's folder, where __file__ is not defined)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = Path(os.environ.get("TINYAMP_TUTORIAL_OUT", HERE / "figures"))
OUT.mkdir(parents=True, exist_ok=True)
# One BLAS thread: with another thread count OpenBLAS splits each product's sums differently, and
# the float32 results round differently (and on a busy machine, threads wait for each other).
threadpool_limits(1)

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
# BF16 keeps FP32's 8 exponent bits and so nearly FP32's range (up to $3.39 \times 10^{38}$
# against $3.40 \times 10^{38}$; section 4 gives the exact boundary), with only 7 mantissa
# bits. Which of the two failures of 16-bit training you meet first, running out of range or
# running out of precision, depends on which format you picked.

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
# mantissa bits, so converting FP32 to BF16 means rounding away the low 16 bits (the appendix
# does it on the bits).

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
assert abs(formats.round_to(1e-3) - 1e-3) / 1e-3 < FP16.epsilon / 2  # a normal value: under 2^-11, half an ulp

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
# Nor is its top quite FP32's: BF16's largest value is $(2 - 2^{-7}) \cdot 2^{127} \approx
# 3.3895 \times 10^{38}$, and an FP32 value rounds to inf in BF16 from the midpoint between that
# and $2^{128}$ up, $(2 - 2^{-8}) \cdot 2^{127} = 2^{128} - 2^{119} \approx 3.3962 \times 10^{38}$
# (the midpoint itself is a tie, and BF16's largest value has an odd last bit: it goes to the
# even neighbour, $2^{128}$, which is inf). FP32 values up to its own largest,
# $3.4028 \times 10^{38}$, lie beyond that boundary.

# %%
for x in (1e-8, 1e-20, 1e-38, 1e-42):
    print(
        f"{x:.0e}:  fp16 {formats.classify(x, 'float16'):<10} bf16 {formats.classify(x, 'bfloat16'):<10} "
        f"fp32 {formats.classify(x, 'float32')}"
    )
assert formats.classify(1e-20, "float16") == "underflow" and formats.classify(1e-20, "bfloat16") == "normal"
# the same smallest normal value: 2^-126 is normal in both, the next value below it subnormal in both ...
below_normal = float(np.nextafter(np.float32(2.0**-126), np.float32(0)))
assert formats.classify(2.0**-126, "bfloat16") == formats.classify(2.0**-126, "float32") == "normal"
assert formats.classify(2.0**-126 - 2.0**-133, "bfloat16") == formats.classify(below_normal, "float32") == "subnormal"
assert BF16.min_subnormal == 2.0**-133 and FP32.min_subnormal == 2.0**-149  # ... not the same underflow
assert formats.classify(1e-42, "bfloat16") == "underflow" and formats.classify(1e-42, "float32") == "subnormal"
# Every FP32 value from BF16's largest to FP32's largest (65,536 bit patterns), rounded to BF16 by
# ml_dtypes: the first that becomes inf is found by looking, not by the formula above.
top32 = np.arange(np.float32(BF16.max).view(np.uint32), np.float32(FP32.max).view(np.uint32) + 1, dtype=np.uint32)
top32 = top32.view(np.float32)
top_in_bf16 = np.asarray(formats.round_to(top32, "bfloat16"))
inf_from = top32[np.argmax(np.isinf(top_in_bf16))]
print(f"bf16: largest {BF16.max:.5g}; FP32 values from {float(inf_from):.5g} up round to inf")
assert float(inf_from) == 2.0**128 - 2.0**119  # the midpoint (2 - 2^-8) 2^127, as derived above
assert np.all(np.isinf(top_in_bf16[top32 >= inf_from])) and np.all(top_in_bf16[top32 < inf_from] == BF16.max)
bf16_max_bits = int(np.asarray(BF16.max, dtype=BF16.dtype).view(np.uint16))
assert bf16_max_bits & 1 == 1  # BF16's largest value has an odd last bit: the tie goes up, to inf

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
samples = 2.0 ** rng.uniform(-30, 15.9, size=400)  # from below the subnormals (2^-30 rounds to 0) to under 65504
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
# above, and the limit stays half an ulp). The even neighbour is the one whose last mantissa bit
# is 0, and that bit can be read without looking at the bits: it is the parity of the integer
# $|w| / \mathrm{ulp}(w)$, $w$ counted in ulps (below $2^{11}$, and exact in FP32 and FP64, since
# the ulp is a power of two). At $w = 2048$ the FP16 ulp is 2: adding 1 is a tie and goes to the
# even neighbour, 2048 itself (1024 ulps: even), and adding 0.6 is lost too, but *subtracting*
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
# the last mantissa bit is the parity of |w| / ulp(w), for every finite FP16 value (subnormals and 0 included)
every_finite = np.arange(0x7C00, dtype=np.uint16).view(np.float16)  # the bits 0 ... 0x7BFF: 0 to 65504
ulps = np.array([formats.ulp(float(v)) for v in every_finite])
in_ulps = every_finite.astype(np.float64) / ulps
assert np.array_equal(in_ulps, np.round(in_ulps)) and in_ulps.max() < 2**11
assert np.array_equal(every_finite.astype(np.float32) / ulps.astype(np.float32), in_ulps)  # FP32: the same integers
assert np.array_equal(in_ulps.astype(np.int64) % 2, every_finite.view(np.uint16) & 1)
# FP32 has the same wall, 8192 times further out: where its ulp becomes 2. Found by asking NumPy for
# the spacing at each power of two, then compared with 2^(mantissa bits + 1).
wall16, wall32 = (
    next(2.0**k for k in range(64) if np.spacing(dtype(2.0**k)) == 2) for dtype in (np.float16, np.float32)
)
assert (wall16, wall32) == tuple(2.0 ** (f.mantissa_bits + 1) for f in (FP16, FP32)) and wall32 / wall16 == 8192
assert np.float32(wall32) + np.float32(1) == wall32 and np.float32(wall32 - 1) + np.float32(1) == wall32
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
# At or below 2^-25 (half the smallest subnormal; 2^-25 itself is a tie, to the even 0) FP16 holds
# only 0: that band is not subnormal, and is drawn apart.
zero_band = ax_ulp.axvspan(xs[0], FP16.min_subnormal / 2, color="#7f7f7f", alpha=0.15,
                           label="FP16 rounds x to 0 (x at most 2^-25)")  # fmt: skip
subnormal_band = ax_ulp.axvspan(FP16.min_subnormal / 2, FP16.min_normal, color="#ff7f0e", alpha=0.12,
                                label="FP16 subnormal (ulp constant)")  # fmt: skip
ax_ulp.axvline(FP16.max, color="#d62728", ls="--", lw=1, label="FP16 max, 65504")
ax_ulp.set_xlabel("value x")
ax_ulp.set_ylabel("ulp(x): gap to the next value")
ax_ulp.set_title("Spacing of representable values")
ax_ulp.grid(True, which="major", alpha=0.3)
ax_ulp.legend(fontsize=8, loc="upper left")  # the one corner no staircase passes through
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
# The two bands, against NumPy's own FP16 cast of every x drawn there: 0 in the grey one; in the
# orange one a nonzero value below 2^-14 (or 2^-14 itself, for an x within half an ulp of it).
x_fp16 = x16.astype(np.float16).astype(np.float64)
for band, fits in ((zero_band, x_fp16 == 0), (subnormal_band, (x_fp16 > 0) & (x_fp16 <= FP16.min_normal))):
    inside = (x16 > band.get_x()) & (x16 < band.get_x() + band.get_width())
    assert inside.sum() > 10 and np.all(fits[inside]), band.get_label()
assert ulp16[-1] == np.spacing(np.float16(2.0**15)) == 32  # the FP16 staircase reaches [2^15, 2^16), 65504's binade
# and neither legend covers a point of a line drawn in its panel
fig.canvas.draw()
for panel in (ax_ulp, ax_sum):
    legend_box = panel.get_legend().get_window_extent()
    for line in panel.get_lines():
        points = panel.transData.transform(np.column_stack([line.get_xdata(), line.get_ydata()]))
        assert legend_box.count_contains(points) == 0, line.get_label()

# %% [markdown]
# Read the left panel as a ruler. Each format's ulp is a staircase that doubles at each power of
# two; FP32's staircase lies $2^{13} = 8192$ times below FP16's (23 versus 10 mantissa bits) and
# BF16's $2^{3} = 8$ times above it. FP16's line turns flat where the subnormals begin and ends at
# 65504; below $2^{-25}$ (the grey band) it stays flat, but there it is the gap from 0 to the
# smallest subnormal, as every such $x$ rounds to 0. BF16 and FP32 continue far beyond both edges
# of the plot.
#
# **In PyTorch.** `torch.float16` and `torch.bfloat16` are the same IEEE 754 formats, so the
# lesson carries over bit for bit. The optional cell below (it needs PyTorch, and without it
# prints one line) checks that: PyTorch's format limits (`torch.finfo`), its rounding of the 400
# values of the ulp check above to FP16 and BF16, its ulp (`torch.nextafter` minus the value), and
# its $2048 + 1$ and $2048 - 0.6$ are the ones computed here.

# %%
try:
    import torch
except ImportError:
    torch = None

if torch is None:
    print("PyTorch is not installed: the comparison with torch.float16 is skipped")
else:
    for f, t_dtype in ((FP16, torch.float16), (BF16, torch.bfloat16)):
        info = torch.finfo(t_dtype)
        assert (info.max, info.smallest_normal, info.eps) == (f.max, f.min_normal, f.epsilon), f.name
    x32 = samples.astype(np.float32)
    t16 = torch.from_numpy(x32).to(torch.float16)
    same_bits16 = np.array_equal(t16.view(torch.int16).numpy(), x32.astype(np.float16).view(np.int16))
    bf16_torch = torch.from_numpy(x32).to(torch.bfloat16).double().numpy()
    same_bf16 = np.array_equal(bf16_torch, formats.round_to(x32, "bfloat16"))
    ulp_torch = (torch.nextafter(t16, torch.tensor(np.inf, dtype=torch.float16)) - t16).double().numpy()
    same_ulp = np.array_equal(ulp_torch, [formats.ulp(x, "float16") for x in x32])
    w16 = torch.tensor(2048.0, dtype=torch.float16)
    plus_1, minus_06 = w16 + torch.tensor(1.0, dtype=torch.float16), w16 - torch.tensor(0.6, dtype=torch.float16)
    print(f"torch {torch.__version__}: the same FP16 bits {same_bits16}, BF16 values {same_bf16}, ulps {same_ulp}; "
          f"2048 + 1 = {plus_1.item()}, 2048 - 0.6 = {minus_06.item()}")  # fmt: skip
    assert same_bits16 and same_bf16 and same_ulp and plus_1.item() == 2048 and minus_06.item() == 2047

# %% [markdown]
# ## 6. A product of two FP16 numbers is exact in FP32
#
# So far, additions. A network spends its time in matrix products: multiplications, and sums of
# their results. A normal FP16 number has 11 significant bits (10 stored, plus the implicit
# leading 1): it is an integer $m < 2^{11}$ times a power of two. The product of two such numbers
# is $m_1 m_2 < 2^{22}$ times a power of two, so it needs at most 22 significant bits, and FP32
# has 24. Its exponent range is no problem either: the products lie between $2^{-48}$ and
# $65504^2 \approx 4.3 \times 10^9$, all normal FP32 numbers. So a multiplier with FP32 output
# makes no rounding error at all.
#
# We check it on 200,000 random pairs of finite FP16 bit patterns (every exponent, subnormals
# included): the FP32 product equals the float64 product, which is exact here.

# %%
F16, F32, F64 = np.float16, np.float32, np.float64


def bits16(a: np.ndarray) -> np.ndarray:
    """The bit patterns of a float16 array: equal bits is bit-exact equality (-0.0 differs from 0.0)."""
    return np.ascontiguousarray(a).view(np.uint16)


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
# ## 7. Sums: accumulate in FP32, round once
#
# The products are exact; their sum is where FP16 would fail. A running sum meets the wall of
# section 5: it grows, FP16's spacing grows with it (from 1024 on it is 1, from 2048 on it is 2),
# and a term smaller than half the spacing is lost. Products of numbers in $[0, 1)$ average 0.25;
# once a sum of them passes 512 the spacing is 0.5, and each FP16 addition rounds by up to 0.25,
# the size of a typical term.
#
# So mixed precision multiplies FP16 matrices with FP32 accumulation: widen both FP16 operands
# to FP32 (exact), multiply and add in FP32, and round the FP32 result to FP16 once. NVIDIA's
# Tensor Cores offer this mode (they also have modes that accumulate in FP16), and it is what
# tinyamp's FP16 matmul computes on any machine, `tinyamp.kernels.product`: NumPy has no FP16
# matrix product in its BLAS, so tinyamp widens, calls the FP32 routine (sgemm) and rounds once.
# It is the idealized model of a Tensor Core product, not the hardware's bits: Fasi et al. (2021,
# "Numerical behavior of NVIDIA tensor cores", PeerJ Computer Science) show that real Tensor
# Cores do not add as IEEE 754 FP32 arithmetic does (within a block of products they align the
# significands to the largest and truncate, rather than round each addition to nearest), so
# their results can differ from the model's in the last bits. Every FP16 matmul of the later
# tutorials, and every FP16 linear layer under autocast, is this one.
#
# First, the output of tinyamp's matmul has exactly the bits of that recipe written out by hand.
# (The order of sgemm's additions is the BLAS library's, so the bits are those of this NumPy's
# sgemm; the few that differ from the correctly rounded product show where the FP32 additions
# rounded.)

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
assert 0 < off < out.size // 100  # a few elements: where an FP32 addition's rounding reached the FP16 result

# %% [markdown]
# Now the accumulator's error. We compute 32 dot products of length up to 4096 three ways and
# measure the relative error against the exact value at every length: an FP16 accumulator (each
# addition rounded to FP16), an FP32 accumulator (each addition rounded to FP32), and tinyamp's
# matmul (FP32 accumulation, then one rounding to FP16) at the lengths $2^k$.

# %%
trials, length = 32, 4096
a = rng.uniform(0, 1, (trials, length)).astype(F16)
b = rng.uniform(0, 1, (trials, length)).astype(F16)
products = a.astype(F64) * b.astype(F64)  # exact (22 bits)
exact_dot = np.cumsum(products, axis=1)  # float64: error ~1e-16, zero for our purpose

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
    tiny_err.append(np.max(np.abs(y.astype(F64) - exact_dot[:, n - 1]) / exact_dot[:, n - 1]))
tiny_err = np.array(tiny_err)
err16 = np.max(np.abs(prefix16 - exact_dot) / exact_dot, axis=0)
err32 = np.max(np.abs(prefix32.astype(F64) - exact_dot) / exact_dot, axis=0)
print(f"{'length':>6}  {'FP16 accumulator':>16}  {'FP32 accumulator':>16}  {'tinyamp (FP32 acc, FP16 out)':>28}")
for n, e in zip(lengths, tiny_err):
    print(f"{n:>6}  {err16[n - 1]:>16.2e}  {err32[n - 1]:>16.2e}  {e:>28.2e}")

assert err16[-1] > 10 * tiny_err[-1]  # FP16 accumulation: an error no output rounding explains
# Half an FP16 ulp plus the FP32 sum's error, bounded for any order of addition (the BLAS picks its
# own, and it differs from the FP32 accumulator's above): n nonnegative terms summed in float32 come
# within gamma = (n - 1) u / (1 - (n - 1) u) of the exact sum, u = 2^-24 (Higham, "Accuracy and
# Stability of Numerical Algorithms", 2002, section 4.2), and rounding that once to FP16 adds at most
# 2^-11 of it (every sum here is an FP16 normal number). The references are exact to the last bit:
# float64's cumulative sums equal math.fsum's correctly rounded ones.
assert np.array_equal(exact_dot[:, lengths - 1].T, [[math.fsum(p[:n]) for p in products] for n in lengths])
assert exact_dot.min() >= FP16.min_normal
gamma = (lengths - 1) * 2.0**-24 / (1 - (lengths - 1) * 2.0**-24)
any_order_bound = 2.0**-11 * (1 + gamma) + gamma
assert np.all(tiny_err <= any_order_bound)
assert 0.02 < err16[-1] < 0.2 and err16[-1] > 10 * err16[63]  # grows with the length, to several percent
assert np.all(err32 < 1e-5) and err32[-1] > 1e-7  # the FP32 accumulator: near 1e-6 at 4096 terms

ones = np.ones((1, 4096), F16)
via_tinyamp = ta.matmul(ta.tensor(ones), ta.tensor(ones.T)).item()
ones_running16 = np.cumsum(ones[0], dtype=F16)[-1]
print(f"\n4096 ones: tinyamp matmul {via_tinyamp}, FP16 accumulator {ones_running16}")
assert via_tinyamp == 4096.0 and ones_running16 == 2048.0

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
fig.savefig(OUT / "01_dot_product_error.png", dpi=110)
# What the figure shows: every point drawn lies inside the axes; at length 1 the FP16 accumulator
# and tinyamp's matmul are the same single rounding of one product, and from length 8 on the FP16
# accumulator's curve lies above every tinyamp point.
drawn = {line.get_label(): line.get_ydata() for line in ax.get_lines()}
drawn16, drawn_tiny = drawn["FP16 accumulator"], drawn["tinyamp matmul: FP32 accumulate, round once to FP16"]
assert drawn16[0] == drawn_tiny[0] and np.all(drawn16[lengths[3:] - 1] > drawn_tiny[3:])
assert min(err32[err32 > 0].min(), tiny_err.min()) > 1e-9 and err16.max() < 1  # the first FP32 error, 0, is not drawn

# %% [markdown]
# The FP16 accumulator's error grows with the length, to several percent at 4096 terms; the
# FP32 accumulator's stays near $10^{-6}$, so rounding its result once to FP16 gives an answer
# within half an FP16 ulp of the exact one (plus that $10^{-6}$): as good as FP16 can represent.
# tinyamp's matmul adds in the BLAS's order, not in this one, so its points are checked against a
# bound that holds for every order: $2^{-11}$ plus at most $(n - 1) \cdot 2^{-24}$ for the FP32
# sum of $n$ nonnegative terms (to first order; $2.4 \times 10^{-4}$ at 4096 terms).
# That is the whole numerical case for FP16 matrix products with FP32 accumulation, and why
# tinyamp's reductions (`sum`, `mean`) of FP16 tensors accumulate in FP32 as well.
#
# **In PyTorch.** PyTorch's CPU matmul of `torch.float16` tensors also accumulates in FP32. The
# optional cell checks it on the same data: 4096 ones sum to 4096, and the 32 dot products of
# length 4096 are within the same bound (half an FP16 ulp plus the FP32 sum's error in any order)
# of the exact values, far from the FP16 accumulator's error. Its bits need not be tinyamp's: its
# FP32 additions run in another order, so a few elements of the 64 x 48 product above round
# differently, by one FP16 ulp.

# %%
if torch is None:
    print("PyTorch is not installed: the comparison with PyTorch's float16 matmul is skipped")
else:
    torch.set_num_threads(1)  # as the BLAS above: one thread, the same sums on every machine
    ones_t = torch.ones((1, 4096), dtype=torch.float16)
    ones_torch = (ones_t @ ones_t.T).item()
    dots_t = (torch.from_numpy(a)[:, None, :] @ torch.from_numpy(b)[:, :, None]).numpy()[:, 0, 0]
    err_torch = np.max(np.abs(dots_t.astype(F64) - exact_dot[:, -1]) / exact_dot[:, -1])
    product_t = (torch.from_numpy(A) @ torch.from_numpy(B)).numpy()
    differ = bits16(product_t) != bits16(out.numpy())
    ulps_apart = np.abs(product_t.astype(F64) - out.numpy().astype(F64)) / np.spacing(np.abs(out.numpy()))
    print(f"torch float16 matmul: 4096 ones -> {ones_torch}; relative error at 4096 terms {err_torch:.2e} "
          f"(FP16 accumulator: {err16[-1]:.2e}); {differ.sum()} of {differ.size} elements differ from tinyamp's, "
          f"by at most {ulps_apart.max():g} FP16 ulp")  # fmt: skip
    assert ones_torch == 4096.0 and err_torch <= any_order_bound[-1] and err16[-1] > 10 * err_torch
    assert differ.mean() < 0.01 and ulps_apart.max() <= 1

# %% [markdown]
# ## Summary
#
# - FP16: 5 exponent bits, 10 mantissa bits. Largest value 65504 (from 65520 up: inf), smallest
#   normal $2^{-14}$, smallest subnormal $2^{-24}$ (at or below $2^{-25}$: zero), epsilon $2^{-10}$.
# - BF16: FP32's exponent bits with 7 mantissa bits, epsilon $2^{-7}$: 8 times coarser than
#   FP16. Its smallest normal is FP32's, $2^{-126}$, but its smallest subnormal is $2^{-133}$
#   against FP32's $2^{-149}$, so it underflows a little sooner; and FP32 values from
#   $2^{128} - 2^{119} \approx 3.3962 \times 10^{38}$ up round to inf.
# - Rounding is to nearest, ties to even. An addend is lost when it is smaller than half the gap
#   between the value it is added to and that value's neighbour in the addend's direction (half
#   an ulp; toward zero from a power of two strictly above $2^{-14}$, a quarter of one: $2^{-14}$
#   itself has the subnormals below it, a full ulp apart); one of exactly half is a tie that goes
#   to the even neighbour, whose last mantissa bit, the parity of $|w| / \mathrm{ulp}(w)$, is 0.
# - An FP16 x FP16 product needs at most 22 significant bits: exact in FP32. Accumulating a long
#   dot product in FP16 loses the sum (4096 ones stop at 2048); FP32 accumulation rounded once
#   keeps the result within half an FP16 ulp plus the FP32 sum's error (for $n$ nonnegative
#   terms, in any order, at most about $(n - 1) \cdot 2^{-24}$). tinyamp's FP16 matmul is widen + sgemm + round
#   once, bit for bit: the idealized model of a Tensor Core product (the hardware's own
#   additions can differ in the last bits: Fasi et al. 2021). Tutorial 8 measures its speed.
#
# The two failures of FP16 training follow directly. Gradients at or below $2^{-25}$ vanish
# (underflow; fixed by loss scaling), and a weight update can vanish once its weight is 2048 times
# larger, and always does once it is 4096 times larger (fixed by FP32 master weights). Tutorial 3
# measures both on a real network.
