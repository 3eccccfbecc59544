"""Engine room: a whole loss-scaler step on the GPU, with the skip decided on the device.

``LossScaler.step`` runs its step through ``kernels.call("scaled_step", ...)``: its reference
(``LossScaler._unscale_and_step``) unscales the gradients, reads whether they are finite, and
then calls the optimizer or skips it.  On a GPU that read makes the host wait
for the device before it can launch the update.  So here, for FP32 master weights whose
every update has a fused kernel (master_update.py):

1. one reduction per float16 model gradient sums the squares of its unscaled values into its
   slot of one array of sums (unscale.py), writing nothing else; one more kernel makes the
   device's skip flag from that array (1 where a sum is not finite);
2. the update kernels read the model's float16 gradients, unscale them on the fly and read
   the flag themselves: where it is set they change nothing.  No float32 gradient is ever
   stored, 4 bytes per parameter saved at the peak of the step;
3. the host reads the array of sums, once; after an overflow it rolls its own counters back (the
   optimizer's step count, and the state entries the step created).

Range checks of labels and indices made on the device since the last read (range_check.py)
put their flags (0, or inf) in slots of the same array: a failed one makes the kernels skip,
and its error is raised after the read, with nothing changed.

Same arithmetic, so the same bits, as gather + unscale + step on the host (tests/engine_room
check it on the CPU with NumPy stand-ins for the kernels).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tinyamp import backend
from tinyamp.engine.cuda import master_update, unscale


def scaled_step(optimizer: Any, inverse: float) -> Any:
    """Kernel ``scaled_step``: ``({name: not finite}, [sums of squares])``, stepped or skipped; or NotImplemented."""
    if not _applies(optimizer):
        return NotImplemented
    present = [(i, name, p.grad) for i, (name, p) in enumerate(zip(optimizer.names, optimizer.model_params))
               if p.grad is not None]  # fmt: skip
    xp = backend.get_array_module(present[0][2])
    checks = backend.take_pending_checks()  # labels or indices checked on the device (range_check.py)
    sums = xp.empty(len(present) + len(checks), np.float64)  # a slot per gradient and per check: one array
    for k, (_, _, g) in enumerate(present):
        unscale.scaled_sum_of_squares(g, inverse, out=sums[k, ...])  # a 0-d view of slot k
    for k, check in enumerate(checks, start=len(present)):
        sums[k] = check.flag  # inf when values lay out of range: the step skips, as for an overflow
    skip = unscale.any_not_finite(sums)  # decided on the device
    inner = optimizer.optimizer
    counters = inner.step_count, [dict(s) for s in inner.state]
    inner.step_count += 1
    for i, _, g in present:
        master, model = optimizer.master_params[i], optimizer.model_params[i]
        master_update.fused_update(inner, master.data, g, inner.state[i], model.data, skip, inverse)
    host = backend.to_device(sums, "cpu").tolist()  # the one read of the step
    if not all(math.isfinite(v) for v in host):  # the kernels changed nothing: undo the host's bookkeeping
        inner.step_count, inner.state = counters[0], [dict(s) for s in counters[1]]
    backend.raise_failed_checks(checks, host[len(present) :], "at the loss scaler's step, which changed no weight")
    host = host[: len(present)]
    return {name: not math.isfinite(v) for (_, name, _), v in zip(present, host)}, host


def _applies(optimizer: Any) -> bool:
    """FP32 master weights (``MasterWeights``, recognized by what it holds: the engine room imports no
    course module) over SGD or Adam(W), every parameter with its own master, lost updates not tracked
    (that measure reads the host), gradients not gathered into the masters yet (after ``unscale_`` the
    masters' gradients are the ones to step with), and every gradient a float16 or float32 CuPy array."""
    if not all(hasattr(optimizer, a) for a in ("model_params", "master_params", "names", "optimizer")):
        return False
    if getattr(optimizer, "track_lost_updates", True):
        return False
    pairs = list(zip(optimizer.model_params, optimizer.master_params))
    if not any(model.grad is not None for model, _ in pairs) or any(master.grad is not None for _, master in pairs):
        return False  # the host path raises the "no gradient" error, or steps with the gathered gradients
    return all(
        master is not model
        and (model.grad is None or (unscale.applies(model.grad) and model.grad.shape == master.shape
             and master_update.applies(optimizer.optimizer, master.data, model.grad, model.data)))
        for model, master in pairs
    )  # fmt: skip
