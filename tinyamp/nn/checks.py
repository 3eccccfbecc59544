"""What a layer's constructor checks: each argument, before a weight is allocated.

``nn.Linear(0, 3)`` would otherwise divide by zero in its initialization (the bound is
$1/\\sqrt{in}$), ``nn.Linear(-1, 3)`` take the square root of -1, and ``nn.Linear(2.5, 3)``
fail inside NumPy.  Each check raises a TypeError (a value of the wrong kind) or a
ValueError (out of range) naming the layer, the argument and the value, and saying what
to pass instead.
"""

from __future__ import annotations

import math
import numbers
from typing import Any


def size(layer: str, name: str, value: Any, example: int, at_least: int = 1) -> int:
    """`value` as a size (a whole number >= `at_least`), or an error saying what to pass."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{layer}: {name} is a number of features or rows, a whole number; got {value!r} "
            f"({type(value).__name__}). Pass e.g. {name}={example}"
        )
    if value < at_least:
        raise ValueError(f"{layer}: {name} must be at least {at_least}; got {name}={value}. Pass e.g. {name}={example}")
    return int(value)


def real(layer: str, name: str, value: Any, example: float, low: float, high: float = math.inf,
         high_open: bool = False, low_open: bool = False) -> float:  # fmt: skip
    """`value` as a finite number in [low, high] (ends open as asked), or an error saying what to pass."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{layer}: {name} must be a number; got {value!r} ({type(value).__name__}). "
                        f"Pass e.g. {name}={example}")  # fmt: skip
    value = float(value)
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    if not (math.isfinite(value) and above and below):
        span = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        if high == math.inf:
            span = f"{'>' if low_open else '>='} {low:g}"
        raise ValueError(f"{layer}: {name} must be a finite number {span}; got {name}={value!r}. "
                         f"Pass e.g. {name}={example}")  # fmt: skip
    return value


def flag(layer: str, name: str, value: Any) -> bool:
    """`value` as True or False, or a TypeError (``bias="no"`` would be true)."""
    if not isinstance(value, bool):
        raise TypeError(f"{layer}: {name} must be True or False; got {value!r} ({type(value).__name__})")
    return value
