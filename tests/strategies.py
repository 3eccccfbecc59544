"""The shared hypothesis strategies of tinyamp's tests: they live in ``tinyamp.testing.strategies``
(installed, so that anyone can draw the same inputs); this module re-exports them for ``from strategies import``."""

from tinyamp.testing.strategies import *  # noqa: F403
from tinyamp.testing.strategies import __all__  # noqa: F401

# ---- FP8: formats and per-tensor scaling (tests/test_fp8_*.py) -----------------------------------
FP8_FORMAT_NAMES = ("E4M3", "E5M2", "E2M1")  # E2M1 is FP4, for the block formats

import numpy as np  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tinyamp.fp8 import formats as fp8_formats  # noqa: E402


def fp8_rounding_points(name: str) -> np.ndarray:
    """float32 values where rounding to FP8/FP4 format `name` is decided, both signs: every finite
    value, every midpoint between neighbours (a tie), the midpoint above the largest value (the
    overflow edge without saturation), half the smallest subnormal, and the float32 values on
    either side of each; then inf and the smallest and largest float32."""
    f = fp8_formats.get_format(name)
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
