"""Named hypothesis strategies: the one place every test file takes its inputs from.

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
