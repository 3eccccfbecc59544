"""FP16 matrix products on the CPU: three ways to compute C = A B at N^3.

* NumPy's own float16 matmul: a scalar loop, no BLAS (what tinyamp never calls);
* tinyamp's Tensor Core emulation: widen to float32, sgemm, round once to float16;
* float32 sgemm on the same values: the floor.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import tinyamp as ta

N = 1024


def operands(n: int = N, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((n, n)).astype(np.float16) for _ in range(2))  # type: ignore[return-value]


def numpy_float16(a: np.ndarray, b: np.ndarray) -> Any:
    return lambda: a @ b


def tinyamp_float16(a: np.ndarray, b: np.ndarray) -> Any:
    ta_a, ta_b = ta.tensor(a), ta.tensor(b)
    return lambda: ta.matmul(ta_a, ta_b)


def float32_sgemm(a: np.ndarray, b: np.ndarray) -> Any:
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    return lambda: a32 @ b32


def time_once(fn: Any) -> float:
    """Seconds for one call (the float16 loop is too slow to repeat many times)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
