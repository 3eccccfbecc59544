"""Engine room: scatter-adds on the GPU with ``cupyx.scatter_add`` (float32 atomic adds).

The atomic adds land in an order that varies from run to run, so the last bits of a sum
of repeated indices (an embedding's gradient) vary too: a GPU run matches another to
rounding, not to the bit.
"""

from __future__ import annotations

from typing import Any

from tinyamp.engine.cuda.device import on_gpu


def scatter_add(target: Any, index: Any, values: Any) -> Any:
    """``tinyamp.kernels.scatter_add`` for CuPy arrays (NotImplemented for others)."""
    if not on_gpu(target):
        return NotImplemented
    import cupyx

    cupyx.scatter_add(target, index, values)
    return None
