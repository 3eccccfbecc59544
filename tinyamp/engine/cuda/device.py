"""Which arrays the GPU kernels take: CuPy arrays (the one test the engine room's GPU side asks)."""

from __future__ import annotations

from typing import Any

from tinyamp import backend


def on_gpu(*arrays: Any) -> bool:
    """True when every one of `arrays` is a CuPy array."""
    return all(backend.device_of(a) == "cuda" for a in arrays)
