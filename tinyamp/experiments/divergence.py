"""Did a run diverge, and why: said in words, so that a table of NaN never passes for a result.

A run has diverged when its final loss is not finite, when the loss scaler stopped it (the
scale underflowed to 0: ``result.stopped``), or when more than ``SKIPPED_MOST`` (half) of its
steps were skipped: most of its batches never reached the weights, so its numbers are not
those of a trained model (a dynamic scaler skips a handful while it finds its scale; a
static one too high for the gradients skips nearly all).  The cause is found, not guessed:

* the first step whose loss was not finite, from the run's own series;
* how many weights are no longer finite (an update that overflowed writes inf, and inf
  minus inf is NaN from then on: a skipped step cannot repair weights that are already gone);
* the first op whose forward output or backward gradient leaves the 16-bit range on one
  more batch, located by :class:`tinyamp.inspect.find_overflow`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from tinyamp import backend, random
from tinyamp.inspect import find_overflow

SKIPPED_MOST = 0.5  # a run that skipped more than this share of its steps did not train


def mostly_skipped(result: Any) -> bool:
    """Whether more than SKIPPED_MOST of the steps of `result` were skipped."""
    losses = result.series["loss"]
    return bool(losses) and result.skipped_steps > SKIPPED_MOST * len(losses)


def diverged(result: Any) -> bool:
    """Whether `result` (a RegimeResult) is a diverged run."""
    if getattr(result, "stopped", None) or mostly_skipped(result):
        return True
    losses = result.series["loss"]
    final = [v for v in result.metrics.values() if isinstance(v, float)]
    return (bool(losses) and not math.isfinite(losses[-1])) or not all(math.isfinite(v) for v in final)


def nonfinite_weights(model: Any) -> tuple[int, int]:
    """(How many weights of `model` are inf or NaN, how many it has)."""
    bad = total = 0
    for _, p in model.named_parameters():
        values = backend.to_device(p.data, "cpu")
        bad += int(np.count_nonzero(~np.isfinite(values.astype(np.float32))))
        total += values.size
    return bad, total


def explain(task: Any, setup: Any, result: Any, start: int) -> str:
    """One paragraph: when the run diverged, what state it left, and the first op out of range."""
    losses = result.series["loss"]
    first = getattr(result, "first_step", start)  # the step of losses[0]
    first_bad = next((first + i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    lines = []
    if getattr(result, "stopped", None):
        lines.append(result.stopped.rstrip("."))
    if first_bad is not None:
        lines.append(f"the loss is first {losses[first_bad - first]} at step {first_bad}")
    if mostly_skipped(result) and not getattr(result, "stopped", None):
        lines.append(
            f"{result.skipped_steps} of {len(losses)} steps were skipped for non-finite gradients, more than "
            f"{SKIPPED_MOST:.0%}: the run did not train (a smaller learning rate, or a dynamic loss scaler, "
            "which lowers a scale that overflows)"
        )
    elif result.skipped_steps:
        lines.append(f"{result.skipped_steps} of {len(losses)} steps were skipped for non-finite gradients")
    bad, total = nonfinite_weights(setup.model)
    if bad:
        lines.append(
            f"{bad:,} of {total:,} weights are inf or NaN: an update overflowed (learning rate {task.lr:g}); "
            "skipping later steps cannot repair weights that are already gone"
        )
    batch = next(task.batches(start=first + len(losses)))
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


class LastGoodState:
    """A run's state after its last good step, kept in memory so that a diverged run can save it.

    A step is good when its update was applied, the weights it left are finite, the loss
    scale is above 0, and the next step computed a finite loss from that state: a checkpoint
    of it resumes into a run that can take a step.  ``capture()`` copies the weights, masters
    and moments (``put_back(state)`` restores them); the scaler's state and the random
    generators are kept here.  The copies cost one state's memory (two while the next step
    checks the newest) and a copy per applied step.
    """

    MEANING = "the last whose update left finite weights, a loss scale above 0 and a finite loss at the next step"

    def __init__(self, model: Any, scaler: Any, capture: Callable[[], Any], put_back: Callable[[Any], Any]) -> None:
        self.model, self.scaler, self.capture, self.put_back = model, scaler, capture, put_back
        self.step: int | None = None  # the step of the confirmed state
        self.state: tuple[Any, Any, Any] | None = None
        self.pending: tuple[int, tuple[Any, Any, Any]] | None = None  # the newest state, until the next loss is seen

    def keep(self, done: int) -> None:
        """Take the state after `done` steps as the candidate (a resumed run's loaded state, at its start)."""
        self.pending = None
        if self.scaler.scale > 0 and not nonfinite_weights(self.model)[0]:
            self.pending = (done, (self.capture(), self.scaler.state_dict(), random.get_state()))

    def on_loss(self, done: int, loss: float, skipped: bool) -> None:
        """Step `done` - 1 computed `loss` from the state after `done` - 1 steps: confirm that one, keep this one."""
        if self.pending is not None and self.pending[0] == done - 1 and math.isfinite(loss):
            self.step, self.state = self.pending
        self.pending = None
        if not skipped and math.isfinite(loss):
            self.keep(done)

    def restore(self) -> int:
        """Put the confirmed state back into the run (the weights first, as load_checkpoint does); return its step."""
        if self.state is None or self.step is None:
            raise ValueError("no step of this run was good: there is no state to restore")
        own, scaler, rng = self.state
        self.put_back(own)
        self.scaler.load_state_dict(scaler)
        random.set_state(rng)
        return self.step
