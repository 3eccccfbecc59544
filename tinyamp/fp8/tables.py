"""The FP8 formats' limits as a printed table (``tinyamp info`` prints it beside FP16's)."""

from __future__ import annotations

import numpy as np

from tinyamp.fp8.formats import FORMATS


def limits_table() -> str:
    """E4M3, E5M2 and E2M1 beside float16: bits, largest value, smallest normal and subnormal, specials."""
    fp16 = np.finfo(np.float16)
    rows = [("float16", 16, 5, 10, float(fp16.max), float(fp16.smallest_normal), float(fp16.smallest_subnormal),
             "inf, NaN")]  # fmt: skip
    specials = {"fn": "NaN only at s.1111.111", "ieee": "inf, NaN", "none": "none"}
    for f in FORMATS.values():
        rows.append((f.name, f.bits, f.exponent_bits, f.mantissa_bits, f.max, f.min_normal, f.min_subnormal,
                     specials[f.specials]))  # fmt: skip
    rows.append(("E8M0 (scale)", 8, 8, 0, 2.0**127, 2.0**-127, 2.0**-127, "powers of two only; NaN at 0xFF"))
    header = ("format", "bits", "exp", "mant", "max", "min normal", "min subnormal")
    lines = ["".join(h.rjust(w) if w else h.ljust(14) for h, w in zip(header, (0, 5, 5, 6, 12, 12, 15))) + "  specials"]
    for name, bits, e, m, top, normal, sub, special in rows:
        lines.append(f"{name:<14}{bits:>5}{e:>5}{m:>6}{top:>12.6g}{normal:>12.4g}{sub:>15.4g}  {special}")
    return "\n".join(lines)
