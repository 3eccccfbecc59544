"""Block scaling against one scale per tensor: quantization error as an outlier grows.

    python benchmarks/fp8_block_error.py [FIGURE.png]

A 256 x 1024 standard normal tensor with eight values (one in 32768) multiplied by a factor
from 1 to 10^6; each scheme's relative RMS error on the Gaussian bulk (the outliers left out),
printed as a table and, with matplotlib and a path, drawn.  Per-tensor scaling is the current
rule of ``tinyamp.fp8.scaling.next_scale`` (scale = FP8_MAX / amax).  tests/test_fp8_blocks.py
asserts the orderings this shows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the working tree's tinyamp, installed or not

from tinyamp.fp8.blocks import SCHEMES, quantize  # noqa: E402
from tinyamp.fp8.formats import E2M1, E4M3, decode, encode  # noqa: E402
from tinyamp.fp8.scaling import next_scale  # noqa: E402

FACTORS = [10.0**k for k in range(7)]


def per_tensor(x: np.ndarray, fmt) -> np.ndarray:
    scale = np.float32(next_scale(float(np.abs(x).max()), 1.0, fmt.max, 0)[0])
    return decode(encode(x * scale, fmt), fmt) * (np.float32(1) / scale)


def bulk_errors() -> dict[str, list[float]]:
    """Each scheme's bulk error at each factor of FACTORS."""
    rng = np.random.default_rng(0)
    plain = rng.standard_normal((256, 1024)).astype(np.float32)
    where = rng.choice(plain.size, 8, replace=False)
    rows: dict[str, list[float]] = {}
    for factor in FACTORS:
        x = plain.copy()
        x.reshape(-1)[where] *= np.float32(factor)
        bulk = x == plain if factor != 1 else np.ones(x.shape, bool)
        results = {"per-tensor E4M3": per_tensor(x, E4M3), "per-tensor E2M1": per_tensor(x, E2M1)}
        results |= {s: quantize(x, s).dequantize() for s in SCHEMES}
        results["mxfp8_e4m3, scale rounded up"] = quantize(x, "mxfp8_e4m3", "up").dequantize()
        for name, y in results.items():
            error = np.linalg.norm((y - x)[bulk]) / np.linalg.norm(x[bulk])
            rows.setdefault(name, []).append(float(error))
    return rows


def main(argv: list[str]) -> int:
    rows = bulk_errors()
    print(f"{'outlier factor':<30}" + "".join(f"{f:>9.0e}" for f in FACTORS))
    for name, errors in rows.items():
        print(f"{name:<30}" + "".join(f"{e:>9.4f}" for e in errors))
    if argv:
        from matplotlib.figure import Figure  # optional: only for the figure

        fig = Figure(figsize=(7, 4))
        ax = fig.add_subplot()
        for name, errors in rows.items():
            ax.loglog(FACTORS, errors, marker="o", linestyle="--" if name.startswith("per") else "-", label=name)
        ax.set(xlabel="outlier / typical value", ylabel="relative RMS error of the bulk", title="block scaling")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        fig.savefig(argv[0], dpi=120, bbox_inches="tight")
        print(f"figure: {argv[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
