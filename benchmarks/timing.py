"""Timing helpers shared by the benchmarks: medians of interleaved rounds.

These machines are noisy, so each benchmark runs its contenders in alternating
rounds (A, B, C, A, B, C, ...) and reports the median time per call of each: drift in
machine load then hits every contender alike, and ratios stay meaningful.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved_medians(
    contenders: dict[str, Callable[[], object]], rounds: int = 7, calls_per_round: int = 5, warmup: int = 2
) -> dict[str, float]:
    """Median seconds per call of each contender, measured in alternating rounds."""
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            start = time.perf_counter()
            for _ in range(calls_per_round):
                fn()
            samples[name].append((time.perf_counter() - start) / calls_per_round)
    return {name: statistics.median(s) for name, s in samples.items()}


def cast_kernel_choices() -> list[str]:
    """The implementations of the float16 casts this machine can run: "numba" (when installed), "numpy"."""
    from tinyamp.engine.fast import casts

    try:
        with casts.kernels("numba"):
            pass
    except ImportError:
        return ["numpy"]
    return ["numba", "numpy"]


def with_cast_kernels(kernels: str, fn: Callable[[], object]) -> Callable[[], None]:
    """`fn`, each call run with the float16 <-> float32 casts done by `kernels` ("numba" or "numpy")."""
    from tinyamp.engine.fast import casts

    def run() -> None:
        with casts.kernels(kernels):
            fn()

    return run
