"""Initialization: fill a parameter in place with random or constant values.

Every random draw comes from the *CPU* generator (``tinyamp.random.generator("cpu")``)
in float64 and is then rounded to the parameter's dtype and copied to its device.  So
``tinyamp.manual_seed(s)`` gives the same initial weights on NumPy and on CuPy, and a
float16 model starts from the float32 model's weights rounded once.
"""

from __future__ import annotations

from typing import Any

from tinyamp import backend, random
from tinyamp.tensor import Tensor


def _fill(t: Tensor, values: Any) -> Tensor:
    t.data[...] = backend.to_device(values.astype(t.dtype), t.device)
    return t


def uniform_(t: Tensor, low: float, high: float) -> Tensor:
    """Fill `t` with samples of $U(\\mathrm{low}, \\mathrm{high})$."""
    return _fill(t, random.generator("cpu").uniform(low, high, t.shape))


def normal_(t: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill `t` with samples of $N(\\mathrm{mean}, \\mathrm{std}^2)$."""
    return _fill(t, random.generator("cpu").normal(mean, std, t.shape))


def constant_(t: Tensor, value: float) -> Tensor:
    """Fill `t` with `value`."""
    t.data[...] = value
    return t



def __getattr__(name: str) -> Any:
    """``zeros_`` and ``ones_``, never used inside tinyamp, go in the next release: constant_ does both."""
    if name in ("zeros_", "ones_"):
        import warnings

        value = 0.0 if name == "zeros_" else 1.0
        warnings.warn(f"tinyamp.nn.init.{name}(t) goes in the next release; use constant_(t, {value})",
                      DeprecationWarning, stacklevel=2)  # fmt: skip
        return lambda t: constant_(t, value)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
