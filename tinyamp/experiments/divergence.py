"""Did a run diverge, and why: said in words, so that a table of NaN never passes for a result.

A run has diverged when its final loss is not finite, or when the loss scaler skipped
every step (no update was ever applied).  The cause is found, not guessed:

* the first step whose loss was not finite, from the run's own series;
* how many weights are no longer finite (an update that overflowed writes inf, and inf
  minus inf is NaN from then on: a skipped step cannot repair weights that are already gone);
* the first op whose forward output or backward gradient leaves the 16-bit range on one
  more batch, located by :class:`tinyamp.inspect.find_overflow`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tinyamp import backend
from tinyamp.inspect import find_overflow


def diverged(result: Any) -> bool:
    """Whether `result` (a RegimeResult) is a diverged run."""
    losses = result.series["loss"]
    final = [v for v in result.metrics.values() if isinstance(v, float)]
    every_step_skipped = bool(losses) and result.skipped_steps == len(losses)
    return every_step_skipped or not math.isfinite(losses[-1]) or not all(math.isfinite(v) for v in final)


def _nonfinite_weights(model: Any) -> tuple[int, int]:
    bad = total = 0
    for _, p in model.named_parameters():
        values = backend.to_device(p.data, "cpu")
        bad += int(np.count_nonzero(~np.isfinite(values.astype(np.float32))))
        total += values.size
    return bad, total


def explain(task: Any, setup: Any, result: Any, start: int) -> str:
    """One paragraph: when the run diverged, what state it left, and the first op out of range."""
    losses = result.series["loss"]
    first_bad = next((start + i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    lines = []
    if first_bad is not None:
        lines.append(f"the loss is first {losses[first_bad - start]} at step {first_bad}")
    if result.skipped_steps:
        lines.append(f"{result.skipped_steps} of {len(losses)} steps were skipped for non-finite gradients")
    bad, total = _nonfinite_weights(setup.model)
    if bad:
        lines.append(
            f"{bad:,} of {total:,} weights are inf or NaN: an update overflowed (learning rate {task.lr:g}); "
            "skipping later steps cannot repair weights that are already gone"
        )
    batch = next(task.batches(start=start + len(losses)))
    with find_overflow(setup.model, dtype=setup.regime.low_precision or "float32") as found:
        setup.optimizer.zero_grad()
        with setup.autocast(), np.errstate(all="ignore"):
            loss = task.loss(setup.model, batch)
        with np.errstate(all="ignore"):
            (loss * setup.scaler.scale).backward()  # as the run did, without another turn of the scaler's protocol
    setup.optimizer.zero_grad()
    if found.first is not None:
        lines.append(f"on the next batch the first value out of range is in the {found.first}")
    return "; ".join(lines) + "."
