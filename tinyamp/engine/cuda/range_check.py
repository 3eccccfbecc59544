"""Engine room: range checks of labels and indices kept on the GPU, so that the host does not wait.

``kernels.check_in_range``'s reference reads the smallest and largest value to the host.  On a
GPU that read waits for every kernel launched before it: cross-entropy's labels and each
embedding's indices made three such waits in a transformer's step, besides the loss scaler's
one read.  Here the two bounds stay on the device with a flag (0, or inf when a value lies out
of range), held by ``backend.defer_check`` until the next read: the loss scaler's step folds the
flags into its one read and into its skip (scaler_step.py), an optimizer's step reads them
before it changes a weight, and any other read from the GPU reads them first.

Until then the op computes with the values clipped into range: a batch whose check fails is
never stepped with, but no kernel may read outside a table meanwhile (the fused cross-entropy
indexes memory with each label; CuPy's own indexing wraps).  Plain CuPy array operations (a
few tiny kernels), no custom kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyamp import backend
from tinyamp.engine.cuda.device import on_gpu


def check_in_range(values: Any, size: int, what: str) -> Any:
    """Kernel ``check_in_range`` for a CuPy array: the check kept on the device, and `values` clipped into
    [0, size) for the kernels that read them until its error is raised (a fused cross-entropy indexes
    memory with a label); or NotImplemented."""
    if not on_gpu(values):
        return NotImplemented
    xp = backend.get_array_module(values)
    bounds = xp.stack([values.min(), values.max()])
    # Compared in float64, where rounding keeps every order with size (exact up to 2^53): a Python
    # int compared with, or clipped into, an int8 or uint8 array must fit that dtype (NEP 50).
    wide = bounds.astype(np.float64)
    out_of_range = (wide[0] < 0) | (wide[1] >= size)
    backend.defer_check(backend.DeferredCheck(what, size, bounds, xp.where(out_of_range, np.inf, 0.0)))
    return xp.clip(values, 0, min(size - 1, int(np.iinfo(values.dtype).max)))
