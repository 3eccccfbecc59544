"""Grader of Exercise 9.1 (mean_gradient): the all-reduce's arithmetic, bit for bit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from tinyamp import kernels
from tinyamp.testing.counterexamples import array_in_words, blamed, check_settings, number

REDUCTIONS = ("float32", "float16", "float16-predivide")

RULES = {
    "float32": "widen each gradient to float32, sum in rank order in float32, divide by N in float32",
    "float16": "sum in rank order in float16 (each add rounded once), widen the sum, divide by N in float32",
    "float16-predivide": "divide each gradient by N in float16 (rounded once), sum in rank order in float16, "
    "widen the sum",
}


def reference_mean(grads: list[np.ndarray], reduction: str) -> np.ndarray:
    """The mean as ``tinyamp.distributed`` computes it (``allreduce.sum_in_rank_order`` and ``divide``).

    Written here with ``tinyamp.kernels`` so that grading needs no MPI; tests/test_exercises.py
    checks it against the all-reduce's own functions.
    """
    n = len(grads)
    dtype = "float32" if reduction == "float32" else "float16"
    parts = [kernels.cast(g, dtype) for g in grads]
    if reduction == "float16-predivide":
        parts = [kernels.cast(kernels.widen(p) / np.float32(n), "float16") for p in parts]
    total = parts[0]
    for p in parts[1:]:
        total = kernels.add(total, p)  # one rounding to the dtype of the sum
    mean = kernels.cast(total, "float32")
    return mean if reduction == "float16-predivide" else (mean / np.float32(n)).astype(np.float32)


@st.composite
def rank_gradients(draw: Any) -> tuple[list[np.ndarray], str]:
    """(one float16 gradient per rank, a reduction): 1 to 8 ranks, values from the subnormals to near 65504."""
    ranks = draw(st.integers(1, 8))
    shape = draw(st.tuples(st.integers(1, 6)))
    big = st.floats(8192, 65504, width=16) | st.floats(-65504, -8192, width=16)  # N of them overflow a float16 sum
    tiny = st.integers(-2047, 2047).map(lambda m: float(np.float16(m * 2.0**-24)))
    values = st.floats(-4, 4, width=16) | big | tiny | st.sampled_from([2048.0, 1.0, 0.0, -0.0])
    grads = [draw(hnp.arrays(np.float16, shape, elements=values)) for _ in range(ranks)]
    return grads, draw(st.sampled_from(REDUCTIONS))


ORDER_MATTERS = ([np.array([2048.0], np.float16), np.array([1.0], np.float16), np.array([1.0], np.float16)],
                 "float16")  # fmt: skip  # (2048 + 1) + 1 = 2048 in float16; 2048 + (1 + 1) = 2050
SUM_OVERFLOWS = ([np.array([40000.0], np.float16), np.array([40000.0], np.float16)], "float16")  # 80000 > 65504
PREDIVIDE_FLUSHES = ([np.array([2.0**-24], np.float16)] * 4, "float16-predivide")  # 2^-24 / 4 rounds to 0


def grade_mean_gradient(mean_gradient: Callable[[list[np.ndarray], str], np.ndarray], examples: int) -> None:
    """Against the all-reduce's arithmetic, bit for bit, in each of the three reductions."""

    @check_settings(examples)
    @given(case=rank_gradients())
    @example(case=ORDER_MATTERS)
    @example(case=SUM_OVERFLOWS)
    @example(case=PREDIVIDE_FLUSHES)
    def the_mean_of_the_all_reduce(case: tuple[list[np.ndarray], str]) -> None:
        grads, reduction = case
        about = (
            f"for {len(grads)} ranks' gradients "
            + ", ".join(array_in_words(g, f"g_{r}") for r, g in enumerate(grads))
            + f" and reduction {reduction!r}"
        )
        with blamed(f"{about}, yours"):
            got = mean_gradient([g.copy() for g in grads], reduction)
        with np.errstate(over="ignore", invalid="ignore"):
            expected = reference_mean(grads, reduction)
        if not isinstance(got, np.ndarray) or got.dtype != np.float32 or got.shape != expected.shape:
            what = f"{type(got).__name__} {getattr(got, 'dtype', '')} {getattr(got, 'shape', '')}"
            raise AssertionError(f"{about}: return a float32 array of shape {expected.shape}; yours returned {what}")
        bits = (got.view(np.uint32) != expected.view(np.uint32)) & ~(np.isnan(got) & np.isnan(expected))
        if not bits.any():
            return
        i = int(np.flatnonzero(bits)[0])
        raise AssertionError(
            f"{about}: your mean[{i}] is {number(got[i])}, expected {number(expected[i])}: {RULES[reduction]}"
        )

    the_mean_of_the_all_reduce()
