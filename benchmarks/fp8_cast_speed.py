"""FP8 casts of 1M values: tinyamp's rounding by hand against ml_dtypes' cast, per value.

    python benchmarks/fp8_cast_speed.py

The saturating cast to E4M3 and E5M2 (``tinyamp.fp8.formats.encode``: a clip on the bits and
one float32 addition) against ml_dtypes' ``astype`` after ``np.clip`` (the same bits,
tests/test_fp8_formats.py), and decoding (a 256-entry table) against ml_dtypes' widening.
Medians of interleaved rounds (timing.py), in nanoseconds per value, with the ratio of
tinyamp's time to ml_dtypes' measured in this one run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # timing.py
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # the working tree's tinyamp, installed or not

from timing import interleaved_medians  # noqa: E402

from tinyamp.fp8.formats import FORMATS, decode, encode  # noqa: E402

N = 1 << 20


def measure(n: int = N, rounds: int = 7) -> dict[str, dict[str, float]]:
    """Nanoseconds per value of each case, {"tinyamp": ..., "ml_dtypes": ...}; ImportError without ml_dtypes."""
    import ml_dtypes

    x = (np.random.default_rng(0).standard_normal(n) * 100).astype(np.float32)  # some beyond 448: saturated
    out = {}
    for name, dtype in (("E4M3", ml_dtypes.float8_e4m3fn), ("E5M2", ml_dtypes.float8_e5m2)):
        top, bits = np.float32(FORMATS[name].max), encode(x, name)
        cases = {
            f"float32 -> {name}, saturating": (
                lambda: encode(x, name), lambda: np.clip(x, -top, top).astype(dtype)),  # noqa: B023
            f"{name} -> float32": (lambda: decode(bits, name), lambda: bits.view(dtype).astype(np.float32)),  # noqa: B023
        }  # fmt: skip
        for case, (ours, theirs) in cases.items():
            t = interleaved_medians({"tinyamp": ours, "ml_dtypes": theirs}, rounds=rounds)
            out[case] = {k: 1e9 * v / n for k, v in t.items()}
    return out


def main() -> int:
    try:
        results = measure()
    except ImportError:
        print("ml_dtypes is not installed (pip install ml_dtypes): nothing to compare with")
        return 0
    print(f"{'cast, 2^20 float32 values':<36}{'tinyamp ns':>11}{'ml_dtypes ns':>14}{'ratio':>8}")
    for case, ns in results.items():
        print(f"{case:<36}{ns['tinyamp']:>11.2f}{ns['ml_dtypes']:>14.2f}{ns['tinyamp'] / ns['ml_dtypes']:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
