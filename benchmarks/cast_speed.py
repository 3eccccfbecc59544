"""FP16 <-> FP32 conversions of 1M values: NumPy's astype against tinyamp's two implementations.

NumPy's cast branches on every element (zero? subnormal?), so its cost depends on the
data; tinyamp's casts (tinyamp/engine/fast/casts.py as NumPy passes, casts_numba.py as
compiled loops) have no data-dependent branch.  Four kinds of values, the ones a training
step converts: dense weights, small gradients with some FP16 subnormals, tiny gradients
that are mostly subnormal, and ReLU outputs (half zeros).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from timing import with_cast_kernels

from tinyamp.engine.fast import casts

N = 1 << 20


def values() -> dict[str, np.ndarray]:
    """float32 test data by kind."""
    rng = np.random.default_rng(0)
    dense = rng.standard_normal(N).astype(np.float32)
    return {
        "dense, N(0, 1)": dense,
        "N(0, 10^-3): some FP16 subnormals": dense * np.float32(1e-3),
        "N(0, 10^-6): mostly FP16 subnormals": dense * np.float32(1e-6),
        "half zeros, as after a ReLU": np.maximum(dense, 0),
    }


def contenders(x: np.ndarray, direction: str, kernels: list[str]) -> dict[str, Callable[[], object]]:
    """The cast of `x` ("round": float32 -> float16; "widen": its float16 values -> float32) by each contender."""
    source = x if direction == "round" else x.astype(np.float16)
    target = np.float16 if direction == "round" else np.float32
    out = np.empty(x.shape, target)
    cast = casts.round_to_float16 if direction == "round" else casts.widen_float16
    names = {"numba": "tinyamp compiled (numba)", "numpy": "tinyamp NumPy passes"}
    ours = {names[k]: with_cast_kernels(k, lambda: cast(source, out)) for k in kernels}
    return {"numpy astype": lambda: source.astype(target), **ours}
