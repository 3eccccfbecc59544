"""Named hypothesis strategies: the one place every property test takes its inputs from.

Public and installed (``from tinyamp.testing import strategies``), so that a course or a
library can test its own scaler, cast or backward on the same inputs tinyamp's tests use.
The mixed-precision ones, at the end of this file:

* ``format_values(fmt)``: values of FP16, BF16 or FP32 with the edges weighted (signed
  zeros, the smallest subnormal and normal, the largest finite, inf, NaN);
* ``rounding_inputs(fmt)``: the wider values where rounding to `fmt` is decided: the ties
  halfway between two neighbours and the values either side of them, half the smallest
  subnormal, the overflow threshold;
* ``gradient_arrays(underflow_share=...)``: FP32 gradients of which an exact share underflows in FP16;
* ``overflow_flags()``: runs of clean steps and overflows, long enough to reach a scale's
  ceiling and floor; ``scaler_settings(preset)``: settings sized for that.
* ``fp8_rounding_points(name)``: the float32 values where rounding to E4M3, E5M2 or E2M1 is
  decided; ``amax_values()``: one step's amax with 0, inf, NaN and float32-overflowing scales
  weighted; ``delayed_scaling_settings()``: the settings ``check_delayed_scaling`` draws.

Sizes are small on purpose (each axis 1..5, at most 3 axes, so at most 125 elements):
a finite-difference gradient check evaluates the function twice per element.

Values are bounded so that the float64 check is meaningful: the rounding error of a
central difference is about $\\varepsilon |f| / h$, which stays near $10^{-8}$ only when
|f| stays modest.  Functions with a kink (relu, max) get inputs kept away from it: a
step of $h = 10^{-6}$ across the kink would compare a one-sided slope with the other.
"""

from __future__ import annotations

import math
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

__all__ = [
    "FORMATS", "format_dtype", "format_edges", "format_values", "rounding_inputs", "gradient_arrays",
    "overflow_flags", "scaler_settings", "MAX_SIDE", "MAX_DIMS", "Shape", "ShapeArg", "FLOAT_DTYPES", "shapes",
    "broadcastable_shapes", "floats", "float_arrays", "positive_arrays", "nonzero_arrays", "away_from_kink_arrays",
    "distinct_arrays", "matmul_shape_pairs", "linear_shapes", "reduction_axes", "reshape_targets",
    "permutations_of_axes", "basic_indices", "int_arrays_with_repeats", "advanced_indices", "indices",
    "concatenate_cases", "logits_and_labels", "embedding_cases", "float_dtypes", "small_scalars", "dag_steps",
    "scaler_configs", "gradscaler_settings", "gradient_values", "shapes_then", "half_arrays", "lost_update_cases",
    "bit_pattern_arrays", "json_values", "half_floats", "float16_boundary_floats", "integer_half_arrays",
    "tensor_core_shape_pairs", "mlp_sizes", "depth_and_segment", "float32_bit_patterns", "float16_bit_patterns",
    "multiples_of_smallest_subnormal", "draw_sizes", "FP8_FORMAT_NAMES", "fp8_rounding_points", "fp8_format_names",
    "fp8_rounding_arrays", "amax_values", "scaling_recipe_settings", "delayed_scaling_settings", "amax_sequences",
    "hysteresis_settings",
]  # fmt: skip

MAX_SIDE = 5
MAX_DIMS = 3

Shape = tuple[int, ...]
ShapeArg = Shape | SearchStrategy[Shape] | None

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


# ---- shapes ------------------------------------------------------------------------------------
def shapes(min_dims: int = 0, max_dims: int = MAX_DIMS, min_side: int = 1, max_side: int = MAX_SIDE) -> SearchStrategy:
    """Array shapes with `min_dims`..`max_dims` axes of `min_side`..`max_side` elements."""
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def broadcastable_shapes(num_shapes: int = 2, min_dims: int = 0, max_dims: int = MAX_DIMS) -> SearchStrategy:
    """Tuples of `num_shapes` shapes that broadcast together (size-1 and missing axes included)."""
    return hnp.mutually_broadcastable_shapes(
        num_shapes=num_shapes, min_dims=min_dims, max_dims=max_dims, min_side=1, max_side=MAX_SIDE
    ).map(lambda b: b.input_shapes)


def _shape(draw: Any, shape: ShapeArg) -> Shape:
    if shape is None:
        return draw(shapes())
    if isinstance(shape, SearchStrategy):
        return draw(shape)
    return tuple(shape)


# ---- float64 arrays ----------------------------------------------------------------------------
def floats(low: float = -2.0, high: float = 2.0) -> SearchStrategy[float]:
    """Finite floats in [low, high], no subnormals."""
    return st.floats(low, high, allow_nan=False, allow_infinity=False, allow_subnormal=False)


@st.composite
def float_arrays(draw: Any, shape: ShapeArg = None, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    """float64 arrays with values in [low, high]."""
    return draw(hnp.arrays(np.float64, _shape(draw, shape), elements=floats(low, high)))


def positive_arrays(shape: ShapeArg = None, low: float = 0.5, high: float = 3.0) -> SearchStrategy[np.ndarray]:
    """float64 arrays in [low, high], low > 0: inputs of log, sqrt, and the base of a power."""
    return float_arrays(shape, low, high)


@st.composite
def nonzero_arrays(draw: Any, shape: ShapeArg = None, low: float = 0.5, high: float = 2.0) -> np.ndarray:
    """float64 arrays with |x| in [low, high] and either sign: denominators, relu inputs."""
    shape = _shape(draw, shape)
    magnitude = draw(float_arrays(shape, low, high))
    sign = draw(hnp.arrays(np.bool_, shape))
    return np.where(sign, magnitude, -magnitude)


def away_from_kink_arrays(shape: ShapeArg = None) -> SearchStrategy[np.ndarray]:
    """float64 arrays with |x| >= 0.1: relu's kink at 0 is 10^5 steps h away."""
    return nonzero_arrays(shape, low=0.1, high=2.0)


@st.composite
def distinct_arrays(draw: Any, shape: ShapeArg = None, spacing: float = 0.25, jitter: float = 0.15) -> np.ndarray:
    """float64 arrays whose values all differ by at least spacing - jitter (0.1).

    A shuffled grid plus a small jitter: max has no ties (its gradient is defined), and
    rows have a variance well above layer_norm's epsilon.
    """
    shape = _shape(draw, shape)
    n = math.prod(shape)
    order = np.array(draw(st.permutations(range(n))), dtype=np.float64)
    noise = draw(hnp.arrays(np.float64, (n,), elements=floats(0.0, jitter)))
    return ((order - (n - 1) / 2) * spacing + noise).reshape(shape)


# ---- matmul --------------------------------------------------------------------------------------
@st.composite
def matmul_shape_pairs(draw: Any, vectors: bool = True) -> tuple[Shape, Shape]:
    """(a.shape, b.shape) for a @ b: 2-D, batched, broadcast batch axes, and 1-D operands."""
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    batch_a, batch_b = draw(broadcastable_shapes(2, min_dims=0, max_dims=2))
    a_shape, b_shape = batch_a + (m, k), batch_b + (k, n)
    if vectors:
        kind = draw(st.sampled_from(["matrix", "matrix", "vector_left", "vector_right", "vectors"]))
        if kind in ("vector_left", "vectors"):
            a_shape = (k,)
        if kind in ("vector_right", "vectors"):
            b_shape = (k,)
    return a_shape, b_shape


@st.composite
def linear_shapes(draw: Any) -> tuple[Shape, Shape]:
    """(x.shape, weight.shape) for linear: x (..., in) with 1-3 axes, weight (out, in)."""
    fan_in, fan_out = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    lead = draw(shapes(min_dims=0, max_dims=2, max_side=4))
    return lead + (fan_in,), (fan_out, fan_in)


# ---- reductions and shape ops ----------------------------------------------------------------
@st.composite
def reduction_axes(draw: Any, ndim: int) -> int | tuple[int, ...] | None:
    """An `axis` argument for sum/mean/max: None, one axis (maybe negative) or a tuple of distinct axes."""
    if ndim == 0:
        return draw(st.sampled_from([None, ()]))
    one = st.integers(-ndim, ndim - 1)
    many = st.lists(st.integers(0, ndim - 1), unique=True, max_size=ndim).flatmap(
        lambda axes: st.tuples(*[st.sampled_from([a, a - ndim]) for a in axes])
    )
    return draw(st.one_of(st.none(), one, many))


@st.composite
def reshape_targets(draw: Any, shape: Shape) -> Shape:
    """A shape with as many elements as `shape` (its size split into random factors, maybe one -1)."""
    size = math.prod(shape)
    factors = []
    rest = size
    for p in (2, 3, 5):  # sizes are products of sides <= 5
        while rest % p == 0:
            factors.append(p)
            rest //= p
    factors = draw(st.permutations(factors))
    target: list[int] = []
    for f in factors:
        if target and draw(st.booleans()):
            target[-1] *= f
        else:
            target.append(f)
    ones = draw(st.integers(0, 2))
    for _ in range(ones):
        target.insert(draw(st.integers(0, len(target))), 1)
    if target and draw(st.booleans()):
        target[draw(st.integers(0, len(target) - 1))] = -1
    return tuple(target)


def permutations_of_axes(ndim: int) -> SearchStrategy:
    """An `axes` argument for transpose: a permutation, or None (reverse)."""
    return st.one_of(st.none(), st.permutations(range(ndim)).map(tuple))


# ---- indexing ----------------------------------------------------------------------------------
def basic_indices(shape: Shape) -> SearchStrategy:
    """Ints, slices (any step), None and Ellipsis: each element is picked at most once."""
    return hnp.basic_indices(shape, min_dims=0, allow_newaxis=True, allow_ellipsis=True)


@st.composite
def int_arrays_with_repeats(draw: Any, n: int, max_size: int = 6) -> np.ndarray:
    """Integer index arrays into an axis of length n (negative allowed) whose first entry repeats."""
    picks = draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=max_size - 1))
    return np.array(picks + [picks[0]], dtype=np.int64)


@st.composite
def advanced_indices(draw: Any, shape: Shape) -> Any:
    """Integer arrays with repeated entries, and boolean masks, alone or mixed with slices."""
    assert len(shape) >= 1
    kinds = ["ints_axis0", "mask_full", "mask_axis0", "hypothesis_ints"]
    if len(shape) >= 2:
        kinds += ["slice_then_ints", "two_int_arrays"]
    kind = draw(st.sampled_from(kinds))
    if kind == "ints_axis0":
        return draw(int_arrays_with_repeats(shape[0]))
    if kind == "mask_full":
        return draw(hnp.arrays(np.bool_, shape))
    if kind == "mask_axis0":
        return draw(hnp.arrays(np.bool_, shape[:1]))
    if kind == "slice_then_ints":
        return (slice(None), draw(int_arrays_with_repeats(shape[1])))
    if kind == "two_int_arrays":
        rows = draw(int_arrays_with_repeats(shape[0], max_size=4))
        cols = draw(hnp.arrays(np.int64, rows.shape, elements=st.integers(-shape[1], shape[1] - 1)))
        return (rows, cols)
    return draw(hnp.integer_array_indices(shape, result_shape=shapes(min_dims=1, max_dims=2, max_side=4)))


def indices(shape: Shape) -> SearchStrategy:
    """Any index expression for ``x[index]``, basic or advanced."""
    if len(shape) == 0:
        return basic_indices(shape)
    return st.one_of(basic_indices(shape), advanced_indices(shape))


# ---- several tensors at once ---------------------------------------------------------------------
@st.composite
def concatenate_cases(draw: Any) -> tuple[list[np.ndarray], int]:
    """(arrays, axis): 1-4 float64 arrays of equal shape except along `axis` (maybe negative)."""
    base = list(draw(shapes(min_dims=1, max_dims=3, max_side=4)))
    ndim = len(base)
    axis = draw(st.integers(-ndim, ndim - 1))
    count = draw(st.integers(1, 4))
    arrays = []
    for _ in range(count):
        base[axis] = draw(st.integers(1, 3))
        arrays.append(draw(float_arrays(tuple(base))))
    return arrays, axis


@st.composite
def logits_and_labels(draw: Any, max_batch_dims: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(logits (..., C), labels (...)) with integer labels in [0, C)."""
    classes = draw(st.integers(1, MAX_SIDE))
    batch = draw(shapes(min_dims=0, max_dims=max_batch_dims, max_side=4))
    logits = draw(float_arrays(batch + (classes,), -3.0, 3.0))
    labels = draw(hnp.arrays(np.int64, batch, elements=st.integers(0, classes - 1)))
    return logits, labels


@st.composite
def embedding_cases(draw: Any) -> tuple[np.ndarray, np.ndarray]:
    """(table (num, dim), indices) with indices in [0, num) of 1 or 2 axes, one row picked twice."""
    num, dim = draw(st.integers(1, MAX_SIDE)), draw(st.integers(1, 4))
    table = draw(float_arrays((num, dim)))
    picks = draw(st.lists(st.integers(0, num - 1), min_size=1, max_size=5))
    idx = np.array(picks + [picks[0]], dtype=np.int64)
    if idx.size % 2 == 0 and draw(st.booleans()):
        idx = idx.reshape(2, -1)
    return table, idx


float_dtypes = st.sampled_from(FLOAT_DTYPES)
"""float16, float32 or float64."""

small_scalars = st.one_of(
    st.integers(-4, 4),
    st.floats(-4.0, 4.0, allow_nan=False, allow_infinity=False, allow_subnormal=False),
)
"""Python ints and floats that fit every float dtype (for weak-scalar laws)."""


def dag_steps(max_steps: int = 8) -> SearchStrategy[list[tuple[int, int, str]]]:
    """Recipes for random graphs: step k combines nodes i and j (taken modulo the nodes so far)
    with "+", "*" or "t" (tanh of the difference), so nodes end up with several consumers."""
    return st.lists(st.tuples(st.integers(0, 99), st.integers(0, 99), st.sampled_from("+*t")), max_size=max_steps)


# ---- loss scaling --------------------------------------------------------------------------------
@st.composite
def scaler_configs(draw: Any) -> dict[str, Any]:
    """Keyword arguments of a dynamic LossScaler: any growth rule, factor, interval, bounds and scale dtype.

    The initial scale (2^-20..2^120) and the bounds (2^-40..2^127) are powers of two (exact in
    float32 too), with min_scale <= init_scale <= max_scale; the exponents reach far enough
    that float32 overflow refusal and, without a floor, underflow to 0 both happen.
    """
    init_exp = draw(st.integers(-20, 120))
    min_exp = draw(st.none() | st.integers(-40, init_exp))
    max_exp = draw(st.none() | st.integers(init_exp, 127))
    return dict(
        init_scale=2.0**init_exp,
        growth_factor=draw(st.sampled_from([2.0, 4.0]) | st.floats(1.01, 16.0)),
        backoff_factor=draw(st.sampled_from([0.5, 0.25]) | st.floats(0.01, 0.99)),
        growth_interval=draw(st.integers(1, 6)),
        min_scale=None if min_exp is None else 2.0**min_exp,
        max_scale=None if max_exp is None else 2.0**max_exp,
        scale_dtype=draw(st.sampled_from(["float64", "float32"])),
        warmup=draw(st.booleans()),
        growth_rule=draw(st.sampled_from(["interval", "per_step"])),
    )


def overflow_flags(max_runs: int = 12, max_run: int = 250) -> SearchStrategy[list[bool]]:
    """Sequences of found_inf flags built from runs (up to `max_run` equal flags in a row):
    long overflow runs drive a scale to underflow, long clean runs to the growth ceiling."""
    runs = st.lists(st.tuples(st.booleans(), st.integers(1, max_run)), max_size=max_runs)
    return runs.map(lambda rs: [flag for flag, n in rs for _ in range(n)])


@st.composite
def gradscaler_settings(draw: Any) -> tuple[float, float, float, int]:
    """(init_scale, growth_factor, backoff_factor, growth_interval) for PyTorch's update rule.

    init_scale is a float32 value (a power of two, or any positive normal float32); the factors
    are PyTorch's (2, 0.5) or arbitrary, so that the float32 rounding of s * factor matters.
    """
    power = st.integers(-126, 127).map(lambda e: 2.0**e)
    any_f32 = st.floats(2.0**-126, float(np.finfo(np.float32).max), width=32, allow_subnormal=False)
    init = draw(power | any_f32)
    growth = draw(st.just(2.0) | st.floats(1.0001, 16.0))
    backoff = draw(st.just(0.5) | st.floats(0.01, 0.99))
    interval = draw(st.sampled_from([1, 2, 3, 2000]))
    return init, growth, backoff, interval


def gradient_values(dtype: Any) -> SearchStrategy[np.ndarray]:
    """Arrays of `dtype` (float16 or float32) holding any finite values, subnormals and signed zeros included."""
    width = np.dtype(dtype).itemsize * 8
    values = st.floats(width=width, allow_nan=False, allow_infinity=False)
    return hnp.arrays(np.dtype(dtype), shapes(min_dims=1), elements=values)


# ---- master weights and checkpoints --------------------------------------------------------------
def shapes_then(shape: ShapeArg) -> SearchStrategy[Shape]:
    """`shape` as a strategy: a fixed shape, a strategy of shapes, or any shape (None)."""
    if shape is None:
        return shapes()
    if isinstance(shape, SearchStrategy):
        return shape
    return st.just(tuple(shape))


def half_arrays(shape: ShapeArg = None, low: float = -2.0, high: float = 2.0) -> SearchStrategy[np.ndarray]:
    """float16 arrays with finite values in [low, high], float16 subnormals and signed zeros included."""
    values = st.floats(low, high, width=16, allow_nan=False, allow_infinity=False)
    return shapes_then(shape).flatmap(lambda s: hnp.arrays(np.float16, s, elements=values))


@st.composite
def lost_update_cases(draw: Any, shape: ShapeArg = None) -> tuple[np.ndarray, float, np.ndarray]:
    """(w16, lr, g16): float16 weights in one binade [2^e, 2^(e+1)) of either sign, and float16
    gradients of +-1, such that the SGD update -lr * g is lost in float16 and exact in float32.

    lr = k 2^(e-23) with 1 <= k < 2^11, so lr < 2^(e-12): below half an ulp of every weight in
    the binade, in either direction (2^(e-12) is half the gap just below a power of two, the
    smallest such half-gap).  And lr is a multiple of float32's ulp at the weights, so
    w + lr and w - lr are float32 values: a float32 master moves by exactly lr.
    """
    shape = _shape(draw, shape)
    e = draw(st.integers(-14, 14))  # normal float16 binades
    mantissa = draw(hnp.arrays(np.int64, shape, elements=st.integers(0, 1023)))
    negative = draw(hnp.arrays(np.bool_, shape))
    w = np.ldexp(1.0 + mantissa / 1024.0, e)
    w16 = np.where(negative, -w, w).astype(np.float16)
    lr = draw(st.integers(1, 2**11 - 1)) * 2.0 ** (e - 23)
    g16 = np.where(draw(hnp.arrays(np.bool_, shape)), 1.0, -1.0).astype(np.float16)
    return w16, lr, g16


def bit_pattern_arrays(dtype: Any, shape: ShapeArg = None) -> SearchStrategy[np.ndarray]:
    """Arrays of `dtype` (a float or integer dtype, bfloat16 included) holding any bit pattern:
    NaNs with payloads, infinities, signed zeros, subnormals.  For bit-exact round trips."""
    dtype = np.dtype(dtype)
    bits = np.dtype(f"u{dtype.itemsize}")
    return shapes_then(shape).flatmap(lambda s: hnp.arrays(bits, s)).map(lambda a: a.view(dtype))


def json_values(max_leaves: int = 12) -> SearchStrategy[Any]:
    """What a training loop may keep in a checkpoint's `extra` (or a scaler its state_dict):
    None, bools, ints of any size, floats (infinities too, no NaN so that == works), strings,
    and lists, tuples and dicts with string keys nested from them."""
    leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
    keys = st.text(max_size=6).filter(lambda k: k != "__tinyamp__")
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.lists(inner, max_size=3).map(tuple)
            | st.dictionaries(keys, inner, max_size=3)
        ),
        max_leaves=max_leaves,
    )


# ---- 16-bit formats, autocast, Tensor Core numerics --------------------------------------------
def half_floats(allow_infinity: bool = True, nonzero: bool = False) -> SearchStrategy[float]:
    """Python floats that are float16 values (NaN excluded): subnormals, +-0, +-65504, maybe +-inf.

    ``nonzero=True`` leaves out the zeros (without a filter: they are drawn often).
    """
    if not nonzero:
        return st.floats(width=16, allow_nan=False, allow_infinity=allow_infinity)
    magnitude = st.floats(2.0**-24, 65504.0, width=16)
    if allow_infinity:
        magnitude = magnitude | st.just(math.inf)
    return st.tuples(magnitude, st.booleans()).map(lambda ms: -ms[0] if ms[1] else ms[0])


def float16_boundary_floats() -> SearchStrategy[float]:
    """Python floats near where float16 changes behaviour, and their float64 neighbours:
    2^-25 (half the smallest subnormal), 2^-14 - 2^-25 (the tie between the largest subnormal
    and the smallest normal), 65520 (max + half an ulp: the overflow threshold), and any float."""
    edges = [2.0**-25, 2.0**-24, 2.0**-14 - 2.0**-25, 2.0**-14, 65504.0, 65520.0]
    near = st.sampled_from(edges).flatmap(
        lambda e: st.sampled_from([e, float(np.nextafter(e, 0.0)), float(np.nextafter(e, np.inf))])
    )
    magnitude = near | st.floats(0.0, 2.0**-13) | st.floats(6.0e4, 7.0e4) | st.floats(0.0, allow_infinity=True)
    return st.tuples(magnitude, st.booleans()).map(lambda ms: -ms[0] if ms[1] else ms[0])


def integer_half_arrays(shape: ShapeArg = None, bound: int = 32) -> SearchStrategy[np.ndarray]:
    """float16 arrays of integers in [-bound, bound].

    Products and sums of a few hundred of them are integers below 2^24, exact in float32 in
    any order: a matrix product of them has exactly one rounding, the final one to float16.
    """
    values = st.integers(-bound, bound).map(float)
    return shapes_then(shape).flatmap(lambda s: hnp.arrays(np.float16, s, elements=values))


@st.composite
def tensor_core_shape_pairs(draw: Any, kind: str) -> tuple[Shape, Shape]:
    """(a.shape, b.shape) for a @ b of one `kind`: "2d" (M, K) @ (K, N); "batched" with equal
    batch axes; "broadcast" with batch axes that differ (size 1 or missing on one side)."""
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    if kind == "2d":
        return (m, k), (k, n)
    if kind == "batched":
        batch = draw(shapes(min_dims=1, max_dims=2, max_side=3))
        return batch + (m, k), batch + (k, n)
    pairs = broadcastable_shapes(2, min_dims=0, max_dims=2).filter(lambda p: p[0] != p[1])
    batch_a, batch_b = draw(pairs)
    return batch_a + (m, k), batch_b + (k, n)


def mlp_sizes() -> SearchStrategy[list[int]]:
    """Layer sizes for tinyamp.nn.MLP: 2-4 sizes of 1..6 (one to three Linear layers)."""
    return st.lists(st.integers(1, 6), min_size=2, max_size=4)


@st.composite
def depth_and_segment(draw: Any, max_depth: int = 8) -> tuple[int, int]:
    """A number of blocks and a checkpoint segment length (1..depth)."""
    depth = draw(st.integers(1, max_depth))
    return depth, draw(st.integers(1, depth))


def float32_bit_patterns(max_size: int = 64) -> SearchStrategy[np.ndarray]:
    """1-D float32 arrays of any bit patterns: every sign, NaN payloads, infs, subnormals, zeros."""
    words = st.integers(0, 2**32 - 1)
    return st.lists(words, min_size=1, max_size=max_size).map(lambda w: np.array(w, np.uint32).view(np.float32))


def float16_bit_patterns(max_size: int = 64) -> SearchStrategy[np.ndarray]:
    """1-D float16 arrays of any bit patterns (NaN payloads and infs included)."""
    words = st.integers(0, 2**16 - 1)
    return st.lists(words, min_size=1, max_size=max_size).map(lambda w: np.array(w, np.uint16).view(np.float16))


def multiples_of_smallest_subnormal() -> SearchStrategy[float]:
    """Signed multiples m of a format's smallest subnormal with |m| <= 2: the values where
    rounding decides between 0 and the first subnormal, the ties m = +-0.5 and their float64
    neighbours included."""
    ties = st.sampled_from([0.5, float(np.nextafter(0.5, 0.0)), float(np.nextafter(0.5, 1.0)), 1.5, 0.0])
    magnitude = ties | st.floats(0.0, 2.0)
    return st.tuples(magnitude, st.booleans()).map(lambda ms: -ms[0] if ms[1] else ms[0])


def draw_sizes(max_draws: int = 6, max_size: int = 300) -> SearchStrategy[list[int]]:
    """Sizes of successive draws from one random stream (zero-size draws included)."""
    return st.lists(st.integers(0, max_size), min_size=1, max_size=max_draws)


# ---- number formats with their edges weighted (tinyamp.testing's checks draw from these) ----------------
FORMATS = ("float16", "bfloat16", "float32")


def format_dtype(fmt: str) -> np.dtype:
    """The NumPy dtype of "float16", "bfloat16" (through ml_dtypes) or "float32"."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise ImportError("bfloat16 values need the package ml_dtypes: pip install ml_dtypes") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(fmt)


def _wider(fmt: str) -> np.dtype:
    """The format rounding to `fmt` starts from: float32 for the 16-bit formats, float64 for float32."""
    return np.dtype(np.float64 if fmt == "float32" else np.float32)


def _bits_to_values(fmt: str, bits: Any) -> np.ndarray:
    """Unsigned integer bit patterns of `fmt` as float64 values (exact)."""
    dt = format_dtype(fmt)
    return np.asarray(bits, dtype=f"u{dt.itemsize}").view(dt).astype(np.float64)


def format_edges(fmt: str = "float16") -> list[float]:
    """The values of `fmt` where its behaviour changes, both signs: 0, the smallest subnormal, the
    largest subnormal, the smallest normal, 1 and the value after it, the largest finite, inf (and NaN).

    float16: 2^-24, 2^-14 - 2^-24, 2^-14, 1, 1 + 2^-10, 65504.
    """
    dt = format_dtype(fmt)
    mant = {"float16": 10, "bfloat16": 7, "float32": 23}[fmt]
    exp_bits = dt.itemsize * 8 - 1 - mant
    inf_bits = ((1 << exp_bits) - 1) << mant
    one = float(_bits_to_values(fmt, [((1 << (exp_bits - 1)) - 1) << mant])[0])
    bits = [0, 1, (1 << mant) - 1, 1 << mant, inf_bits - 1, inf_bits]
    magnitudes = [float(v) for v in _bits_to_values(fmt, bits)] + [one, one + 2.0**-mant]
    return sorted({sign * m for m in magnitudes for sign in (1.0, -1.0)}) + [math.nan]


def format_values(fmt: str = "float16", allow_nan: bool = True, allow_infinity: bool = True) -> SearchStrategy[float]:
    """Python floats that are values of `fmt` (exactly), with ``format_edges`` drawn often.

    The rest are any bit pattern of `fmt`: every binade, subnormals and signed zeros included.
    """
    dt = format_dtype(fmt)
    edges = [e for e in format_edges(fmt) if (allow_nan or not math.isnan(e)) and (allow_infinity or math.isfinite(e))]
    any_value = st.integers(0, 2 ** (8 * dt.itemsize) - 1).map(lambda b: float(_bits_to_values(fmt, [b])[0]))
    if not allow_nan:
        any_value = any_value.filter(lambda v: not math.isnan(v))
    if not allow_infinity:
        any_value = any_value.filter(lambda v: not math.isinf(v))
    return st.sampled_from(edges) | any_value


def _neighbours(fmt: str, bits: int) -> tuple[float, float]:
    """The nonnegative finite value of `fmt` with these bits, and the next one up.

    Above the largest finite value the next one is where the next binade would start
    (65536 for float16): halfway to it is the overflow threshold (65520 rounds to inf).
    """
    low, high, below = (float(v) for v in _bits_to_values(fmt, [bits, bits + 1, max(bits - 1, 0)]))
    if math.isinf(high):
        high = low + (low - below)  # the top binade's ulp, once more
    return low, high


@st.composite
def rounding_inputs(draw: Any, fmt: str = "float16") -> float:
    """Values of the wider format (float32 for FP16 and BF16, float64 for FP32), as Python floats,
    where rounding to `fmt` is decided.

    Mostly a tie, exactly halfway between two neighbouring values of `fmt`, or the wider
    value just below or just above it: round to nearest, ties to even, is decided there.
    The ties include half the smallest subnormal (2^-25 in float16, which rounds to 0)
    and the overflow threshold (65520, which rounds to inf).  Also values of `fmt`
    itself, and any value of the wider format (inf and NaN included); both signs.
    """
    dt, wide = format_dtype(fmt), _wider(fmt)
    kind = draw(st.sampled_from(["tie", "below", "above", "exact", "any"]))
    if kind == "any":
        width = wide.itemsize * 8
        return float(draw(st.integers(0, 2**width - 1).map(lambda b: np.array(b, f"u{wide.itemsize}").view(wide))))
    mant = {"float16": 10, "bfloat16": 7, "float32": 23}[fmt]
    inf_bits = ((1 << (dt.itemsize * 8 - 1 - mant)) - 1) << mant
    one = ((1 << (dt.itemsize * 8 - 2 - mant)) - 1) << mant  # the bits of 1.0
    # zero, the subnormals' ends, the first normal, the values either side of 1, the largest finite
    edges = [0, 1, (1 << mant) - 1, 1 << mant, one - 1, one, inf_bits - 1]
    bits = draw(st.sampled_from(edges) | st.integers(0, inf_bits - 1))
    low, high = _neighbours(fmt, bits)
    value = low if kind == "exact" else (low + high) / 2  # exact in the wider format: one more bit
    if kind in ("below", "above"):
        value = float(np.nextafter(wide.type(value), wide.type(-math.inf if kind == "below" else math.inf)))
    return -value if draw(st.booleans()) else value


@st.composite
def gradient_arrays(draw: Any, shape: ShapeArg = None, underflow_share: float | None = None) -> np.ndarray:
    """float32 gradients of which an exact share underflows in float16, either sign.

    round(share * size) elements are nonzero with |g| <= 2^-25 (half float16's smallest
    subnormal: they round to 0, the tie at 2^-25 included); the others have |g| in
    [2^-24, 16], which float16 keeps (as a subnormal below 2^-14).  ``underflow_share=None``
    draws the share (0, 1/4, 1/2, 3/4, 1, or any).  ``formats.flushed_to_zero_fraction``
    of the result is exactly that share, rounded to whole elements.
    """
    shape = _shape(draw, shape if shape is not None else shapes(min_dims=1))
    share = underflow_share
    if share is None:
        share = draw(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]) | st.floats(0.0, 1.0))
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"underflow_share must lie in [0, 1]; got {share}")
    n = math.prod(shape)
    k = round(share * n)
    tiny = draw(hnp.arrays(np.float64, (n,), elements=st.sampled_from([-25.0]) | st.floats(-40.0, -25.0)))
    kept = draw(hnp.arrays(np.float64, (n,), elements=st.floats(-24.0, 4.0)))
    underflows = np.zeros(n, dtype=bool)
    underflows[draw(st.permutations(range(n)))[:k]] = True
    magnitude = np.where(underflows, np.exp2(tiny), np.exp2(kept)).astype(np.float32)
    negative = draw(hnp.arrays(np.bool_, (n,)))
    return np.where(negative, -magnitude, magnitude).reshape(shape)


def _power_of_two(exponent: int) -> float:
    return 2.0**exponent


@st.composite
def scaler_settings(draw: Any, preset: str = "pytorch") -> dict[str, Any]:
    """Settings of `preset`'s rule (tinyamp.amp.PRESETS) that a few hundred steps take to its ceiling and floor.

    The keywords ``init_scale, growth_factor, backoff_factor, growth_interval, min_scale,
    max_scale`` for ``LossScaler.preset(preset, **settings)`` and for a scaler under test.
    growth_interval is 1..6 (not 2000); the initial scale is a power of two between the
    preset's bounds (for jmp and apex, which start below their floor when told to, down to
    2^-4 times the floor); the factors are 2 and 1/2, other powers of two, or any (where the
    float32 rounding of ``s * factor`` shows); a preset with a floor or a ceiling gets a
    drawn one (a power of two) or its own.
    """
    from tinyamp.amp.presets import PRESETS

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; the presets are {', '.join(PRESETS)}")
    if PRESETS[preset].library is not None:
        raise ValueError(f"{preset} is a hysteresis rule with settings of its own names: draw them with "
                         f"hysteresis_settings({preset!r})")  # fmt: skip
    p = PRESETS[preset].settings
    top = 127 if p["scale_dtype"] == "float32" else 1023  # the largest power of two the scale can hold
    floors, ceilings = st.integers(-8, 4).map(_power_of_two), st.integers(4, 30).map(_power_of_two)
    min_scale = None if p["min_scale"] is None else draw(st.just(p["min_scale"]) | floors)
    max_scale = None if p["max_scale"] is None else draw(st.just(p["max_scale"]) | ceilings)
    low = -30 if min_scale is None else math.frexp(min_scale)[1] - 1  # exponent of the floor
    if min_scale is not None and p.get("start_below_floor"):
        low -= 4  # these rules run a start below the floor: the first overflow lifts it there
    high = top if max_scale is None else math.frexp(max_scale)[1] - 1  # of the largest power of two <= ceiling
    usual = math.frexp(p["init_scale"])[1] - 1  # hypothesis shrinks the offset to 0: the preset's own start
    return dict(
        init_scale=2.0 ** (usual + draw(st.integers(low - usual, high - usual))),
        growth_factor=draw(st.sampled_from([2.0, 4.0]) | st.floats(1.01, 16.0)),
        backoff_factor=draw(st.sampled_from([0.5, 0.25]) | st.floats(0.01, 0.99)),
        growth_interval=draw(st.integers(1, 6)),
        min_scale=min_scale,
        max_scale=max_scale,
    )


@st.composite
def hysteresis_settings(draw: Any, library: str) -> dict[str, Any]:
    """Settings of Megatron's, DeepSpeed's or fairseq's rule (by their own names) that a few dozen steps exercise.

    Windows of 1..5 steps, hysteresis of 1..4, a power-of-two start with a floor 0..8 halvings
    below it; DeepSpeed's two switches and fairseq's tolerance (0, or a fraction) and threshold drawn.
    """
    exponent = draw(st.integers(-4, 20))
    start, halvings = 2.0**exponent, draw(st.integers(0, 8))
    window = draw(st.integers(1, 5))
    if library == "megatron":
        return dict(initial_scale=start, min_scale=start / 2.0**halvings, growth_interval=window,
                    hysteresis=draw(st.integers(1, 4)), growth_factor=draw(st.sampled_from([2.0, 4.0, 1.5])),
                    backoff_factor=draw(st.sampled_from([0.5, 0.25, 0.7])))  # fmt: skip
    if library == "deepspeed":
        return dict(init_scale=start, min_scale=start / 2.0**halvings, scale_window=window,
                    delayed_shift=draw(st.integers(1, 4)), consecutive_hysteresis=draw(st.booleans()),
                    raise_error_at_min_scale=draw(st.booleans()))  # fmt: skip
    if library == "fairseq":
        threshold = draw(st.none() | st.just(start / 2.0**halvings))
        return dict(init_scale=start, scale_factor=draw(st.sampled_from([2.0, 4.0])), scale_window=window,
                    tolerance=draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])), threshold=threshold,
                    min_loss_scale=start / 2.0 ** draw(st.integers(1, 9)))  # fmt: skip
    raise ValueError(f"unknown hysteresis rule {library!r}; the rules are megatron, deepspeed, fairseq")


# ---- FP8: formats and per-tensor scaling (tests/test_fp8_*.py, check_delayed_scaling, Exercises 10.x) -----
FP8_FORMAT_NAMES = ("E4M3", "E5M2", "E2M1")  # E2M1 is FP4, for the block formats


def fp8_rounding_points(name: str) -> np.ndarray:
    """float32 values where rounding to FP8/FP4 format `name` is decided, both signs: every finite
    value, every midpoint between neighbours (a tie), the midpoint above the largest value (the
    overflow edge without saturation), half the smallest subnormal, and the float32 values on
    either side of each; then inf and the smallest and largest float32."""
    from tinyamp.fp8.formats import get_format

    f = get_format(name)
    values = np.unique(np.abs(f.values[np.isfinite(f.values)]).astype(np.float64))
    top_ulp = values[-1] - values[-2]
    mids = np.concatenate([(values[:-1] + values[1:]) / 2, [values[-1] + top_ulp / 2, f.min_subnormal / 2]])
    bits = np.concatenate([values, mids]).astype(np.float32).view(np.uint32).astype(np.int64)
    near = np.unique(np.concatenate([bits - 1, bits, bits + 1]).clip(0, 0x7F7FFFFF)).astype(np.uint32)
    tiny_and_huge = np.array([1, 0x7F7FFFFF, 0x7F800000], np.uint32)  # float32's smallest, largest, inf
    magnitudes = np.concatenate([near, tiny_and_huge]).view(np.float32)
    return np.concatenate([magnitudes, -magnitudes])


def fp8_format_names(with_fp4: bool = True) -> st.SearchStrategy[str]:
    """The names of the hand-written formats: "E4M3", "E5M2" (and "E2M1", FP4)."""
    return st.sampled_from(FP8_FORMAT_NAMES if with_fp4 else FP8_FORMAT_NAMES[:2])


def fp8_rounding_arrays(max_size: int = 64) -> st.SearchStrategy[tuple[str, np.ndarray]]:
    """(format name, float32 array) with the array's values drawn from that format's rounding points."""

    def arrays(name: str) -> st.SearchStrategy[tuple[str, np.ndarray]]:
        points = st.sampled_from(fp8_rounding_points(name).tolist())
        return st.lists(points, min_size=1, max_size=max_size).map(lambda v: (name, np.array(v, np.float32)))

    return fp8_format_names().flatmap(arrays)


def amax_values() -> st.SearchStrategy[float]:
    """One step's amax, edge cases weighted: 0, inf, NaN, amaxes so small that 448/amax
    overflows float32 (a clamped scale), and positive float32 values of any size."""
    edges = st.sampled_from([0.0, float("inf"), float("nan"), 1e-45, 1e-40, 2.0**-126, 3.4e38, 1.0, 448.0])
    return st.one_of(edges, st.floats(2.0**-126, 2.0**126, width=32))


def scaling_recipe_settings() -> st.SearchStrategy[dict]:
    """Keyword arguments of ``tinyamp.fp8.scaling.ScalingRecipe``, with short histories."""
    return st.fixed_dictionaries({
        "recipe": st.sampled_from(["delayed", "current"]),
        "fp8_format": st.sampled_from(["HYBRID", "E4M3", "E5M2"]),
        "margin": st.integers(0, 4),
        "amax_history_len": st.integers(1, 6),
        "amax_compute_algo": st.sampled_from(["max", "most_recent"]),
    })  # fmt: skip


def delayed_scaling_settings(
    fp8_max: tuple[float, ...] = (448.0, 57344.0), **pinned: Any
) -> st.SearchStrategy[dict[str, Any]]:
    """Keywords ``fp8_max, margin, amax_history_len, amax_compute_algo`` of a delayed-scaling recipe.

    Short histories (1..6 steps, so that a spike leaves the window within a few steps) and
    Transformer Engine's 1024; margins 0..4, 20, and 31 and 40, where
    float32(fp8_max * 2^-margin) / amax underflows to 0 for a large amax (from a margin of 31
    for 448 and float32's largest amax, from 38 for 57344) and the rule keeps the previous
    scale.  A keyword given in `pinned` is that value in every example.
    """
    drawn = {
        "fp8_max": st.sampled_from(fp8_max),
        "margin": st.sampled_from([0, 1, 2, 3, 4, 20, 31, 40]),  # sampled_from shrinks to its first element
        "amax_history_len": st.sampled_from([1, 2, 3, 4, 5, 6, 1024]),
        "amax_compute_algo": st.sampled_from(["max", "most_recent"]),
    }
    return st.fixed_dictionaries({k: st.just(pinned[k]) if k in pinned else v for k, v in drawn.items()})


def amax_sequences(max_size: int = 30, nan: bool = True) -> st.SearchStrategy[list[float]]:
    """One amax per step (float32 values as Python floats): ``amax_values()`` and spikes 2^10 to 2^40
    times an ordinary amax of 1..2; without NaN when `nan` is False."""
    values = amax_values() if nan else amax_values().filter(lambda v: v == v)
    spikes = st.tuples(st.floats(1.0, 2.0, width=32), st.integers(10, 40)).map(lambda a_k: a_k[0] * 2.0 ** a_k[1])
    return st.lists(values | spikes, min_size=1, max_size=max_size).map(
        lambda amaxes: [float(np.float32(a)) for a in amaxes]
    )
