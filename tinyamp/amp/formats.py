"""Floating-point formats as data: bits, range, precision, and what rounding does.

Every number here is read from NumPy's ``finfo`` (or ``ml_dtypes.finfo`` for bfloat16
and the float8 formats), not typed in, so the table cannot drift from the arrays the
framework really computes with.

The facts a mixed-precision course keeps coming back to, for float16:

* 1 sign, 5 exponent and 10 mantissa bits; the largest value is 65504;
* the smallest normal value is 2^-14 (about 6.1e-5), the smallest subnormal 2^-24
  (about 6.0e-8): anything at or below half of that, 2^-25, rounds to zero;
* machine epsilon is 2^-10, so ``1 + 2^-11`` rounds back to 1: a small enough update
  added to a weight is lost (``update_is_lost``, and ``lost_updates.py`` for the rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyamp import dtypes
from tinyamp.amp.lost_updates import lost_updates


@dataclass(frozen=True)
class FloatFormat:
    """One binary floating-point format, its layout and its limits."""

    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int  # stored fraction bits (the leading 1 of normal numbers is implicit)
    max: float  # largest finite value
    min_normal: float  # smallest positive normal value, 2^(1 - bias)
    min_subnormal: float  # smallest positive value, min_normal * 2^-mantissa_bits
    epsilon: float  # distance from 1 to the next larger value, 2^-mantissa_bits
    has_inf: bool
    emulated: bool  # True when NumPy stores it through ml_dtypes, not natively

    @property
    def dtype(self) -> np.dtype:
        return dtypes.resolve(self.name)


_NAMES = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2")


def _ml_dtype(name: str) -> np.dtype | None:
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(getattr(ml_dtypes, name))


def get_format(name: str) -> FloatFormat:
    """The FloatFormat called `name` ("float16", "bfloat16", "float32", "float64", ...)."""
    name = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32"}.get(name, name)
    if name not in _NAMES:
        raise ValueError(f"unknown format {name!r}; choose one of {', '.join(_NAMES)}")
    native = name in ("float16", "float32", "float64")
    dt = np.dtype(name) if native else _ml_dtype(name)
    if dt is None:
        raise ValueError(f"format {name} needs the optional package ml_dtypes: pip install ml_dtypes")
    info = np.finfo(dt) if native else __import__("ml_dtypes").finfo(dt)
    mant = int(info.nmant)
    min_normal = float(info.smallest_normal)
    return FloatFormat(
        name=name,
        bits=dt.itemsize * 8,
        exponent_bits=int(info.iexp),
        mantissa_bits=mant,
        max=float(info.max),
        min_normal=min_normal,
        min_subnormal=float(info.smallest_subnormal),
        epsilon=float(info.eps),
        has_inf=name != "float8_e4m3fn",
        emulated=not native,
    )


def available_formats() -> list[FloatFormat]:
    """Every format this machine can represent (bfloat16 and float8 need ml_dtypes)."""
    out = []
    for name in _NAMES:
        try:
            out.append(get_format(name))
        except ValueError:
            pass
    return out


def round_to(x: Any, fmt: str = "float16") -> np.ndarray:
    """`x` rounded to `fmt` (round to nearest, ties to even) and returned as float64.

    Rounding happens once, from float64, so ``round_to(1 + 2**-11)`` is exactly 1.0.
    """
    f = get_format(fmt)
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float64).astype(f.dtype).astype(np.float64)


def flushes_to_zero(x: Any, fmt: str = "float16") -> np.ndarray:
    """True where `x` rounds to zero in `fmt`: ``round_to(x, fmt) == 0``, without rounding.

    Round to nearest sends every magnitude below half the smallest subnormal to 0, and
    the tie at exactly half goes to the even neighbour, which is 0 as well; anything
    above half rounds up to the smallest subnormal.  One comparison per value instead of a
    cast, whose NumPy implementation is at its slowest on exactly these tiny values.
    """
    return np.abs(np.asarray(x)) <= get_format(fmt).min_subnormal / 2


def classify(x: float, fmt: str = "float16") -> str:
    """What `fmt` does to the real number `x`: one of

    "zero" (x is 0), "normal", "subnormal" (kept with fewer significant bits),
    "underflow" (a nonzero x that rounds to 0), "overflow" (a finite x that rounds to
    inf, or to NaN in formats without inf), "inf" or "nan" (already not finite).
    """
    x = float(x)
    if np.isnan(x):
        return "nan"
    if np.isinf(x):
        return "inf"
    if x == 0.0:
        return "zero"
    r = float(round_to(x, fmt))
    if not np.isfinite(r):
        return "overflow"
    if r == 0.0:
        return "underflow"
    return "subnormal" if abs(r) < get_format(fmt).min_normal else "normal"


def ulp(x: float, fmt: str = "float16") -> float:
    """The unit in the last place at `x` in `fmt`: the gap to the next representable magnitude.

    For normal x it is 2^(e - mantissa_bits) with 2^e <= |x| < 2^(e+1); below the normal
    range it is the subnormal spacing, min_subnormal.
    """
    f = get_format(fmt)
    r = abs(float(round_to(x, fmt)))
    if not np.isfinite(r):
        raise ValueError(f"{x!r} is not finite in {fmt}: it has no ulp")
    if r < f.min_normal:
        return f.min_subnormal
    exponent = int(np.floor(np.log2(r)))
    return 2.0 ** (exponent - f.mantissa_bits)


def update_is_lost(weight: float, update: float, fmt: str = "float16") -> bool:
    """True when the nonzero `update`, added to `weight` rounded to `fmt`, leaves that weight unchanged.

    The arithmetic of tinyamp's optimizers (``tinyamp.amp.lost_updates``): the update is
    rounded to float32, as an optimizer computes it, added to the widened weight in float32,
    and that sum rounded to `fmt`: two roundings of the sum.  The rule of ``lost_updates.py``
    is for one (in float16: never lost while a normal weight is less than 2048 times larger
    than the update, always lost once it is 4096 or more times larger).  The two agree for
    every float16 update; otherwise the float32 rounding can land the sum on a tie, and a
    lost update can exceed half the gap by up to half a float32 ulp of the sum
    (``update_is_lost(1.0, 1 / 2047.9)`` is True).  Always lost from 4096 holds for both.
    """
    with np.errstate(over="ignore", invalid="ignore"):  # a weight beyond fmt's range is inf, whose updates are lost
        w = np.asarray(weight, dtype=np.float64).astype(get_format(fmt).dtype)
        return bool(lost_updates(w, np.float32(update)))


def format_table(names: tuple[str, ...] = ("float16", "bfloat16", "float32")) -> str:
    """A printable table of the formats' bits and limits (those this machine can represent)."""
    available = {f.name: f for f in available_formats()}
    rows = [available[name] for name in names if name in available]
    widths = {"bits": 5, "exp": 5, "mant": 6, "max": 12, "min normal": 12, "min subnormal": 15, "epsilon": 11}
    header = "format".ljust(14) + "".join(name.rjust(w) for name, w in widths.items())
    lines = [header]
    for f in rows:
        lines.append(
            f"{f.name:<14}{f.bits:>5}{f.exponent_bits:>5}{f.mantissa_bits:>6}{f.max:>12.6g}{f.min_normal:>12.4g}"
            f"{f.min_subnormal:>15.4g}{f.epsilon:>11.4g}" + ("  (emulated)" if f.emulated else "")
        )
    return "\n".join(lines)


def flushed_to_zero_fraction(values: Any, fmt: str = "float16") -> float:
    """Among the nonzero finite `values`, the fraction that rounds to zero in `fmt`.

    Applied to FP32 gradients this measures what FP16 would erase: in float16 every
    magnitude at or below 2^-25 (half the smallest subnormal) becomes 0.
    """
    from tinyamp.backend import to_device

    x = np.asarray(to_device(values, "cpu"), dtype=np.float64).ravel()
    x = x[np.isfinite(x) & (x != 0)]
    if x.size == 0:
        return 0.0
    return float(np.mean(flushes_to_zero(x, fmt)))
