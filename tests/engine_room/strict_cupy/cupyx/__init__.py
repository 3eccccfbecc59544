"""The strict CuPy stand-in's cupyx: only scatter_add, which tinyamp uses for repeated indices."""

from __future__ import annotations

from typing import Any

import cupy as _cupy


def scatter_add(a: Any, slices: Any, value: Any) -> None:
    """a[slices] += value with repeats summed (CuPy: float32 atomic adds)."""
    _cupy.scatter_add_impl(a, slices, value)
