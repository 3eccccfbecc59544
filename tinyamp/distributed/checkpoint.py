"""Checkpoints of a data-parallel run: gathered into one file, the very file a single-process run writes.

Rank 0 writes, through ``tinyamp.amp.save_checkpoint``, a copy of the model with a
single-process optimizer (a ``MasterWeights`` when the run has masters) that holds the run's
whole state: every rank's masters and optimizer moments, all-gathered first under ZeRO.  So
the file does not depend on N:

* a run saved on N ranks resumes on any N whose slices divide the batch (every rank reads the
  file and keeps its own range), and in a single process as ``python -m tinyamp.distributed``
  with N micro-batches; ``tinyamp train --resume`` refuses it, naming that command (it sums
  whole batches, so the bits would part from the first step); a single-process checkpoint
  resumes on N ranks;
* resumed on the same N, the run continues bit for bit as if never stopped (the masters and
  moments are stored exactly, the scale, the random generators and the step too).  On another
  N the continuation is the one an N-rank run takes from that state: the gradients are then
  summed in another order, bit-identical to the old one only where ``allreduce.py`` says so.

The gather costs, for a moment, the whole optimizer state (12 bytes per parameter with Adam)
on every rank: ZeRO's saving holds between checkpoints, not while one is written.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from tinyamp import backend, dtypes
from tinyamp.amp import MasterWeights, load_checkpoint, save_checkpoint
from tinyamp.distributed.data_parallel import DataParallel
from tinyamp.nn.module import Module


def _template(dp: DataParallel, model: Module, make_optimizer: Any) -> tuple[Module, Any, Any]:
    """A copy of `model` and a fresh single-process optimizer over it (MasterWeights when the run has masters)."""
    twin = copy.deepcopy(model)
    inner = make_optimizer(twin.named_parameters())
    return twin, (MasterWeights(inner, track_lost_updates=False) if dp.shard.has_masters else inner), inner


def single_process_copy(dp: DataParallel, model: Module, make_optimizer: Any) -> tuple[Module, Any] | None:
    """Collective.  On rank 0, ``(model copy, optimizer)`` holding the whole run's state; None elsewhere."""
    masters, arrays = dp.gathered()  # every rank takes part in the all-gathers
    if dp.comm.rank != 0:
        return None
    twin, optimizer, inner = _template(dp, model, make_optimizer)
    if dp.shard.has_masters:
        for m, values in zip(optimizer.master_params, dp.layout.views(masters)):
            m.data[...] = values
    scalars = {k: v for k, v in dp.state[0].items() if k not in arrays}  # e.g. Adam's step count t
    per_key = {k: dp.layout.views(v) for k, v in arrays.items()}
    inner.state = [{**scalars, **{k: per_key[k][i].copy() for k in per_key}} for i in range(len(inner.params))]
    inner.step_count = dp.optimizer.step_count
    for h in type(inner).hyperparameters:
        setattr(inner, h, getattr(dp.optimizer, h))
    return twin, optimizer


def save(path: str | os.PathLike[str], dp: DataParallel, model: Module, make_optimizer: Any, scaler: Any,
         extra: Any = None) -> None:  # fmt: skip
    """Collective: gather the run's state, and write it on rank 0 as a single-process checkpoint at `path`."""
    twin = single_process_copy(dp, model, make_optimizer)
    if twin is not None:
        save_checkpoint(path, twin[0], twin[1], scaler, extra)


def load(path: str | os.PathLike[str], dp: DataParallel, model: Module, make_optimizer: Any, scaler: Any) -> Any:
    """Every rank: read a gathered (or single-process) checkpoint and keep this rank's range; return its extra.

    The file is checked completely by ``load_checkpoint`` (names, shapes, dtypes, finite
    masters that round to the weights) before anything here changes.
    """
    twin, optimizer, inner = _template(dp, model, make_optimizer)
    extra = load_checkpoint(path, twin, optimizer, scaler)
    states = inner.state
    kinds = {tuple(sorted(k for k, v in s.items() if backend.is_array(v))) for s in states}
    scalars = [{k: v for k, v in s.items() if not backend.is_array(v)} for s in states]
    if len(kinds) != 1 or any(s != scalars[0] for s in scalars):
        raise ValueError(
            f"{path}: the optimizer state differs between parameters (some were never updated); a data-parallel "
            "run updates every parameter at every step, so it cannot continue this checkpoint"
        )
    model.load_state_dict(twin.state_dict())  # in place: the flat weight vector every parameter views
    lo, hi = dp.shard.lo, dp.shard.hi
    if dp.shard.has_masters:
        masters = dp.layout.flatten([m.data for m in optimizer.master_params], dtypes.float32)
        dp.shard.tensor.data[...] = masters[lo:hi]
    arrays = {k: dp.layout.flatten([s[k] for s in states], states[0][k].dtype)[lo:hi].copy() for k in kinds.pop()}
    dp.state[0] = {**scalars[0], **arrays}
    dp.optimizer.step_count = inner.step_count
    for h in type(inner).hyperparameters:
        setattr(dp.optimizer, h, getattr(inner, h))
    return extra
