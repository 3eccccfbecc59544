# %% [markdown]
# # A1. Appendix: inside the converters, FP32 to BF16 and FP16 and back, bit by bit
#
# Mixed precision converts all the time: weights down to FP16 for the forward pass, gradients up
# to FP32 for the master update. Tutorial 1 says *what* a conversion gives (round to nearest,
# ties to even; widening is exact). This appendix shows *how* a converter gets there with no
# branch and no loop over elements, the way tinyamp does it in `tinyamp/rounding.py` and its
# engine room does it faster in `tinyamp/engine/fast/casts.py`. Nothing in tutorials 2 to 8 depends
# on it: read it after tutorial 1, or whenever you open those two files.
#
# You will learn:
#
# - why FP32 to BF16 is a rounding of the low 16 bits;
# - how one FP32 addition rounds a value to FP16, the trick behind fast software converters,
#   and how `tinyamp/rounding.py` reads the FP16 bits off the sum;
# - why FP16 to FP32 is a shift and one exact multiplication by $2^{112}$;
# - that the engine room's two implementations (NumPy passes in cache-sized blocks, and loops
#   compiled by numba where it is installed) give the same bits.
#
# Prerequisite: tutorial 1 (the fields of a format, ties to even, the ulp).
#
# Time: about 2.7 s of CPU to run (4 s wall-clock on a busy shared 2-core machine), 30 minutes to read
# (a reader took 25 to 30).

# %%
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from tinyamp import rounding
from tinyamp.amp import formats
from tinyamp.engine.fast import casts

# figures go next to this file (or the notebook's folder, where __file__ is not defined)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = Path(os.environ.get("TINYAMP_TUTORIAL_OUT", HERE / "figures"))
OUT.mkdir(parents=True, exist_ok=True)

BF16 = formats.get_format("bfloat16")

# %% [markdown]
# ## 1. FP32 to BF16: round away the low half
#
# BF16 is exactly the upper half of FP32: same sign, same exponent, the first 7 of FP32's 23
# mantissa bits. Converting FP32 to BF16 therefore means rounding away the low 16 bits: up when
# they are above half (0x8000), down when below, and at exactly half to the neighbour whose last
# kept bit is 0.

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
# ## 2. FP32 to FP16 with one addition
#
# FP16 is not a half of FP32: its exponent field is narrower, so its bits cannot be cut out of
# FP32's. A trick of fast software FP16 converters does the rounding instead. Adding $x$ to a
# much larger number $B$ rounds $x$ to the ulp of $B$. For $2^E \le |x| < 2^{E+1}$ FP16's ulp is
# $2^{E-10}$, and FP32's ulp at $B = 2^{E+13}$ is $2^{E+13-23} = 2^{E-10}$: the same. So in FP32
# arithmetic $(|x| + B) - B$ is $|x|$ rounded to FP16, by the hardware's own round to nearest,
# ties to even. Below $2^{-14}$ FP16's ulp stops shrinking at $2^{-24}$, so $B$ stops at
# $2^{-1}$. We check it on 100,000 values whose magnitudes are spread evenly in $\log_2$ from
# $2^{-27}$ (below FP16's smallest subnormal: they round to 0) up to 65520 (where FP16
# overflows), and on the ties of tutorial 1.


# %%
def round_by_addition(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to FP16 precision (still float32), with one addition."""
    magnitude = np.abs(x)
    _, e = np.frexp(magnitude)  # magnitude = m * 2^e with 1/2 <= m < 1, so E = e - 1
    big = np.ldexp(np.float32(1), np.maximum(e - 1, -14) + 13).astype(np.float32)
    return np.copysign((magnitude + big) - big, x)  # float32 + float32: rounded by the FPU


rng = np.random.default_rng(0)
ties = np.array([2049, 2051, 1 + 2**-11, 1 + 3 * 2**-11, 3 * 2**-25, 2**-25, 0], np.float32)
spread = rng.choice([-1.0, 1.0], 100_000) * 2.0 ** rng.uniform(-27, np.log2(65520), 100_000)
samples = np.concatenate([ties, -ties, spread])
samples = samples[np.abs(samples) < 65520].astype(np.float32)  # beyond: inf, a case of its own
assert (np.abs(samples) < 2.0**-25).any() and np.abs(samples).max() > 32768  # the whole range, both ends
by_addition = round_by_addition(samples)
print(f"fp16(2049) by addition: {by_addition[0]},  fp16(3 * 2^-25): {by_addition[4]:.3e} = 2^-23")
assert np.array_equal(by_addition, samples.astype(np.float16).astype(np.float32))  # every value, every tie
assert by_addition[0] == 2048 and by_addition[1] == 2052 and by_addition[4] == 2.0**-23 and by_addition[5] == 0

# %% [markdown]
# Why drop $|x| \ge 65520$ first? Not only because FP16 has no finite value there: $B$ itself
# overflows FP32 for large $|x|$. $B = 2^{E + 13}$ is finite while $E + 13 \le 127$, that is for
# $|x| < 2^{115} \approx 4.15 \cdot 10^{34}$; from $|x| = 2^{115}$ on, $B$ is inf and
# $(|x| + \infty) - \infty$ is NaN (with NumPy's overflow warning). A converter that computes $B$
# for every lane must therefore set aside the values that round to inf (from 65520 up, inf and
# NaN included) *before* it trusts the sum, or bound $E$ (at 15, say) before it builds $B$. We find
# the threshold by computing $B$ on both sides of it.

# %%
B_OVERFLOWS_FROM = np.float32(2.0**115)
sides = np.array([np.nextafter(B_OVERFLOWS_FROM, np.float32(0)), B_OVERFLOWS_FROM], np.float32)
with np.errstate(over="ignore", invalid="ignore"):  # the second lane overflows: that is the point
    sides_e = np.frexp(sides)[1]
    sides_b = np.ldexp(np.float32(1), np.maximum(sides_e - 1, -14) + 13).astype(np.float32)
    sides_rounded = round_by_addition(sides)
for name, x, b, rounded in zip(("2^115 - 2^91", "2^115"), sides, sides_b, sides_rounded):
    b_in_words = f"2^{np.frexp(b)[1] - 1}" if np.isfinite(b) else str(b)
    print(f"|x| = {name:<12} = {x:.8g}:  B = {b_in_words},  (|x| + B) - B = {rounded:.8g}")
assert sides_b[0] == 2.0**127 and np.isfinite(sides_rounded[0]) and sides_rounded[0] == 2.0**115  # 11 bits: up
assert np.isinf(sides_b[1]) and np.isnan(sides_rounded[1])
# The samples above never met it: the B that round_by_addition built for each of them was finite,
# 2^28 at most (for |x| in [2^15, 65520)), so bounding E at 15 would have changed none of them.
with np.errstate(divide="ignore"):
    samples_b = np.ldexp(np.float32(1), np.maximum(np.frexp(np.abs(samples))[1] - 1, -14) + 13).astype(np.float32)
assert np.isfinite(samples_b).all() and samples_b.max() == 2.0**28

# %% [markdown]
# The figure shows the rule at work around 2048, where FP16's spacing changes from 1 to 2:
# between the FP16 values every real number goes to the nearer one, and the ties (the
# half-integers below 2048, the odd integers above) go to the even neighbour.

# %%
grid = np.arange(2044, 2056.001, 1 / 64, dtype=np.float32)
rounded = round_by_addition(grid)
is_tie = np.isin(grid, np.concatenate([np.arange(2044.5, 2048, 1), np.arange(2049, 2056, 2)]))  # as the text says
fig, ax = plt.subplots(figsize=(7.5, 3.8))
ax.plot(grid, grid, color="#999999", lw=0.8, ls=":", label="x")
ax.step(grid, rounded, where="post", color="#d62728", lw=1.4, label="(x + B) - B in FP32 = fp16(x)")
ax.plot(grid[is_tie], rounded[is_tie], "ko", ms=4, label="ties: to the even neighbour")
ax.axvline(2048, color="#1f77b4", lw=0.8, ls="--", label="2048: FP16 spacing 1 below, 2 above")
ax.set_xlabel("x (float32)")
ax.set_ylabel("rounded to FP16")
ax.set_title("Rounding to FP16 with one FP32 addition, around 2048")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(OUT / "A1_rounding_by_addition.png", dpi=110)
# What the figure shows: the staircase drawn is NumPy's own FP16 rounding, and each tie dot sits on
# an even FP16 value (last mantissa bit 0).
drawn = ax.get_lines()[1].get_ydata()
tie_bits = rounded[is_tie].astype(np.float16).view(np.uint16)
assert np.array_equal(drawn, grid.astype(np.float16).astype(np.float32))
assert np.all(tie_bits & 1 == 0)
# The dots are the ties, found here without the list above: the x that lie exactly halfway between
# their two FP16 neighbours (the FP16 value at or below x and the next one up).
below16 = np.where(grid.astype(np.float16) > grid, np.nextafter(grid.astype(np.float16), np.float16(0)),
                   grid.astype(np.float16)).astype(np.float32)  # fmt: skip
above16 = np.nextafter(below16.astype(np.float16), np.float16(np.inf)).astype(np.float32)
assert np.array_equal(is_tie, (grid - below16 == above16 - grid) & (grid != below16))

# %% [markdown]
# ## 3. Reading the FP16 bits off the sum
#
# `tinyamp/rounding.py` does not subtract $B$ again: the sum already holds the answer. Its low 13
# bits are $M$, the rounded $|x|$ counted in FP16 ulps (the implicit bit included, so at most
# $2^{11}$), and shifting the sum right by 13 moves its exponent field onto FP16's. Adding the two
# and subtracting $126 \cdot 2^{10}$ rebiases the exponent; a mantissa that rounded up to $2^{11}$
# carries into the exponent, as it should. One formula covers normals, subnormals and zero.
# Below, the columns of that computation for a few values, and the bits it gives against NumPy's.

# %%
print(f"{'x':>14}  {'sum (bits)':>10}  {'sum >> 13':>9}  {'M':>5}  {'fp16 bits':>9}  {'NumPy':>5}")
for x in (2049.0, 2051.0, 1 + 2**-11, 65504.0, 1e-7, 3 * 2**-25):
    magnitude = np.array([x], np.float32).view(np.uint32)
    power = np.maximum((magnitude & rounding.EXPONENT_FIELD) + rounding.TO_FLOAT16_ULP, rounding.SUBNORMAL_MAGIC)
    total = (magnitude.view(np.float32) + power.view(np.float32)).view(np.uint32)
    m = total & rounding.MANTISSA_WITH_CARRY
    half = (total >> 13) + m - rounding.REBIAS
    numpys = np.array([x], np.float32).astype(np.float16).view(np.uint16)
    columns = (int(total[0]), int(total[0] >> 13), int(m[0]), int(half[0]), int(numpys[0]))
    print(f"{x:>14.8g}  {columns[0]:10x}  {columns[1]:9x}  {columns[2]:5d}  {columns[3]:9x}  {columns[4]:5x}")
    assert half.astype(np.uint16)[0] == numpys[0] and m[0] <= 2**11
assert np.array_equal(rounding.round_to_float16(samples), samples.astype(np.float16))  # tinyamp's: the same bits

# %% [markdown]
# Exercise 1.1's docstring gives another recipe: subtract $B$ again, then shift the bits of the
# rounded value $r = (|x| + B) - B$ right by 13 and subtract $112 \cdot 2^{10}$ (for $r \ge 2^{-14}$;
# below, the bits are $r / 2^{-24}$). It is the same arithmetic, started from another number.
# Write a normal result as $r = 2^E (1 + m / 2^{10})$, with $m$ its 10-bit FP16 mantissa field.
#
# - From $r$ (exercise 1.1): $r$'s FP32 exponent field is $E + 127$ and its low 13 bits are 0, so
#   $r \gg 13$ is $(E + 127) \cdot 2^{10} + m$. FP16's bits are $(E + 15) \cdot 2^{10} + m$: subtract
#   $112 \cdot 2^{10}$, the bias difference $127 - 15$.
# - From the sum $s = B + r$ (`tinyamp/rounding.py`): $s$ lies in $B$'s binade, so its exponent field is
#   $E + 13 + 127$, and $s \gg 13$ is $(E + 140) \cdot 2^{10}$; its low 13 bits are
#   $M = 2^{10} + m$, $r$ counted in ulps with its implicit bit. Their sum is
#   $(E + 141) \cdot 2^{10} + m$: subtract $126 \cdot 2^{10}$.
#
# So $126 = 112 + 13 + 1$: the bias difference, the 13 binades by which $B$ lies above $|x|$, and
# the implicit bit, which $r$ keeps in its exponent field and $M$ counts. The sum needs no branch
# for subnormals ($B = 2^{-1}$, $s \gg 13 = 126 \cdot 2^{10}$, and the formula leaves $M$, the count
# of $2^{-24}$ that is the subnormal's bits); $r$ does: a nonzero $r$ below $2^{-14}$ is still an FP32
# normal number, with an exponent field FP16 cannot write, so its bits are computed as $r / 2^{-24}$.
# The two recipes, on every sample above:

# %%
r = np.abs(by_addition)  # (|x| + B) - B, as round_by_addition computed it
r_bits = r.view(np.uint32)
subnormal_bits = (np.where(r < 2.0**-14, r, 0) / np.float32(2.0**-24)).astype(np.uint32)  # whole numbers: exact
from_r = np.where(r >= 2.0**-14, (r_bits >> 13) - (112 << 10), subnormal_bits)  # the subnormal lanes wrap: dropped
magnitudes = np.abs(samples).view(np.uint32)
power = np.maximum((magnitudes & rounding.EXPONENT_FIELD) + rounding.TO_FLOAT16_ULP, rounding.SUBNORMAL_MAGIC)
s_bits = (magnitudes.view(np.float32) + power.view(np.float32)).view(np.uint32)
from_s = (s_bits >> 13) + (s_bits & rounding.MANTISSA_WITH_CARRY) - rounding.REBIAS
s0, r0 = s_bits[0], r_bits[0]  # x = 2049: r = 2048, s = 2^24 + 2048
print(f"x = 2049, from r: (r >> 13) - (112 << 10)     = {r0 >> 13:x} - {112 << 10:x} = {from_r[0]:x}")
print(f"x = 2049, from s: (s >> 13) + M - (126 << 10) = {s0 >> 13:x} + {s0 & 0x1FFF:x} - {126 << 10:x} = {from_s[0]:x}")
assert np.array_equal(from_r, from_s)  # the two recipes: the same bits, for every sample
numpy_bits = np.abs(samples).astype(np.float16).view(np.uint16).astype(np.uint32)
assert np.array_equal(from_s, numpy_bits)
# The two constants, measured instead of derived: what each recipe's bits exceed NumPy's by, on every
# sample (for r, every normal one), is one number, the derivation's 112 and 126 = 112 + 13 + 1.
normal_r = r >= 2.0**-14
assert np.unique((r_bits >> 13)[normal_r] - numpy_bits[normal_r]).tolist() == [112 << 10]
s_over_numpy = (s_bits >> 13) + (s_bits & rounding.MANTISSA_WITH_CARRY) - numpy_bits
assert np.unique(s_over_numpy).tolist() == [(112 + 13 + 1) << 10]
assert rounding.REBIAS == (112 + 13 + 1) << 10  # and tinyamp/rounding.py's constant is that number

# %% [markdown]
# ## 4. FP16 to FP32: a shift and one multiplication
#
# Widening is exact, and needs no rounding at all. Shift the 15 magnitude bits of an FP16 value
# left by 13: its exponent and mantissa fields land on FP32's, and read as an FP32 number the
# value is $2^{-112}$ times too small (the bias difference, $127 - 15$), for normal and subnormal
# values alike; one multiplication by $2^{112}$, exact because it is a power of two, finishes.
# We check every one of the 65,536 FP16 bit patterns (inf and NaN go through NumPy, as in
# `rounding.widen_float16`).

# %%
every_fp16 = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
widened = rounding.widen_float16(every_fp16)
with np.errstate(invalid="ignore"):
    reference = every_fp16.astype(np.float32)
finite = np.isfinite(every_fp16)
shifted = ((every_fp16.view(np.uint16).astype(np.uint32) & 0x7FFF) << 13).view(np.float32) * np.float32(2.0**112)
print(f"{finite.sum()} finite FP16 values; widened by shift and multiply, each equal to NumPy's astype")
assert np.array_equal(widened.view(np.uint32), reference.view(np.uint32))  # every pattern, NaN payloads too
assert np.array_equal(shifted[finite], np.abs(reference[finite]))  # the magnitudes, by the formula alone

# %% [markdown]
# ## 5. The engine room: the same bits, faster
#
# NumPy converts between FP16 and FP32 one element at a time, in a C function that branches on
# zero, subnormal and inf. The formulas above have no branch. The engine room runs them in two
# other ways: in blocks of $2^{16}$ elements, so that the dozen NumPy passes stay in the CPU's
# cache, or as a loop over single elements compiled by numba when it is installed
# (`tinyamp/engine/fast/casts.py`; `casts.active_kernels()` says which runs). This appendix checks their
# bits, not their speed: `benchmarks/cast_speed.py` measures how fast each one runs on your machine.

# %%
for implementation in casts.KERNELS:
    try:
        with casts.kernels(implementation):
            assert np.array_equal(casts.round_to_float16(samples), samples.astype(np.float16))
            assert np.array_equal(casts.widen_float16(every_fp16).view(np.uint32), reference.view(np.uint32))
        print(f"{implementation:5s}: the same bits as NumPy's astype, {samples.size} roundings and 65536 widenings")
    except ImportError as why:  # numba not installed: the NumPy passes run
        print(f"{implementation:5s}: not available here ({why})")

# %% [markdown]
# ## Summary
#
# - FP32 to BF16 rounds away the low 16 bits, to nearest, ties to even.
# - FP32 to FP16: $(|x| + B) - B$ with $B = 2^{\max(E, -14) + 13}$ rounds $|x|$ to FP16 in one
#   FP32 addition, while $B$ is finite: from $|x| = 2^{115}$ on it is inf, so the values that round
#   to inf (from 65520) are set aside. `tinyamp/rounding.py` reads the FP16 bits off the sum instead
#   of subtracting: $126 \cdot 2^{10}$ on the sum is exercise 1.1's $112 \cdot 2^{10}$ on $(|x| + B) - B$,
#   plus $B$'s 13 binades and the implicit bit.
# - FP16 to FP32: shift by 13, multiply by $2^{112}$: exact.
# - The engine room runs the same formulas, in cache-sized blocks or compiled, with the same bits.
