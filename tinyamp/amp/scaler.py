"""Loss scaling, one training step at a time: scale the loss, unscale and check, step or skip.

Why scale the loss: in float16 the smallest positive value is 2^-24 (about 6e-8) and the
smallest *normal* value 2^-14, so small gradients round to zero or lose their low bits
on the way back through an FP16 network.  Multiplying the loss by S multiplies every
gradient by S (the chain rule is linear), lifting them into range; dividing by S again
before the optimizer reads them gives back the true gradients.  Too large an S overflows
some gradient to inf, so every gradient is checked: a step with an inf or NaN is skipped
(no weight and no optimizer moment changes) and the rule of ``loss_scale.py`` lowers S.

One training step, in order (each call out of order is an error that says why)::

    scaled = scaler.scale_loss(loss)        # phase "ready"    -> "scaled"
    scaled.backward()
    scaler.unscale_(opt)                    # phase "scaled"   -> "unscaled" (optional here)
    scaler.clip_grad_norm_(opt, 1.0)        # needs "unscaled" (optional)
    report = scaler.step(opt)               # skips or steps, updates the scale -> "ready"
    opt.zero_grad()
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from tinyamp import backend, dtypes, kernels
from tinyamp.amp import scaler_checks
from tinyamp.amp.loss_scale import ScaleEvent
from tinyamp.amp.presets import PRESETS
from tinyamp.backend import OutOfRangeError, get_array_module
from tinyamp.tensor import Tensor


class ScalerOrderError(RuntimeError):
    """A scaler method called out of order (e.g. unscaling twice, stepping before backward)."""


@dataclass(frozen=True)
class StepReport:
    """What ``LossScaler.step`` did: stepped or skipped, why, and what became of the scale.

    ``grad_norm`` is the L2 norm of all the unscaled gradients (inf or nan when one was not
    finite); after ``clip_grad_norm_``, the norm it measured before clipping.
    """

    step: int
    skipped: bool
    nonfinite_params: list[str]
    scale_before: float
    scale_after: float
    grad_norm: float
    event: str
    state: str

    def __str__(self) -> str:
        if self.skipped:
            what = f"SKIPPED (non-finite gradients in {', '.join(self.nonfinite_params)})"
        else:
            what = f"stepped, grad norm {self.grad_norm:.6g}"
        return f"step {self.step}: {what}; scale {self.scale_before:g} -> {self.scale_after:g} ({self.event})"


class LossScaler:
    """Loss scaling with a rule (PyTorch's GradScaler by default), named states and a history.

    The settings are those of ``loss_scale.ScaleRule``, whose module explains the rule and
    the states; ``LossScaler.preset(name)`` builds the published ones.  ``phase`` orders
    the calls within a step: "ready" --scale_loss--> "scaled" --unscale_--> "unscaled"
    --step--> "ready" (step unscales first if needed).
    """

    def __init__(
        self,
        init_scale: float | None = None,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        min_scale: float | None = None,
        max_scale: float | None = None,
        mode: str = "dynamic",
        scale_dtype: str = "float64",
        warmup: bool = False,
        growth_rule: str = "interval",
        start_below_floor: bool = False,
    ) -> None:
        """``init_scale`` defaults to 2^16 (1 when ``mode="off"``); ``mode`` is "dynamic", "static" or "off"."""
        self.rule = scaler_checks.checked_rule(
            init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
            growth_interval=growth_interval, min_scale=min_scale, max_scale=max_scale, mode=mode,
            scale_dtype=scale_dtype, warmup=warmup, growth_rule=growth_rule, start_below_floor=start_below_floor,
        )  # fmt: skip
        self._scale, self._tracker, self._step_count, self._overflow_seen = self.rule.init_scale, 0, 0, False
        self._state = self.rule.state(self._scale, found_inf=False, overflow_seen=False)
        self._history: list[ScaleEvent] = []
        self._phase = "ready"
        self._step_just_updated = False  # step() ran and no scale_loss since: update() now would update twice
        self._unscaled_optimizer: int | None = None
        self._grad_norm = math.nan
        self.last_report: StepReport | None = None

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> LossScaler:
        """A scaler following a published rule: one of ``presets.PRESETS`` ("pytorch", ..., "megatron").

        ``overrides`` replace single settings: ``LossScaler.preset("pytorch", growth_interval=100)``,
        read as that library reads them (``presets.py`` says how).
        """
        if name not in PRESETS:
            raise ValueError(f"unknown loss-scaler preset {name!r}; the presets are {', '.join(PRESETS)}")
        return PRESETS[name].build(cls, overrides)  # megatron, deepspeed, fairseq: a HysteresisScaler

    # ---- the state machine ----------------------------------------------------------------------
    def update(self, found_inf: bool) -> ScaleEvent:
        """Apply one transition of the rule and record it in ``history``.

        ``step()`` calls this itself; call it by hand only to drive the state machine without
        a model: ``for flag in [False, True, False]: scaler.update(flag)``.
        """
        if not isinstance(found_inf, (bool, np.bool_)):
            raise TypeError(f"update(found_inf) takes a bool; got {type(found_inf).__name__} {found_inf!r}")
        if self._phase != "ready":
            raise ScalerOrderError(
                f"update() at step {self._step_count} in phase {self._phase!r}: changing the scale between "
                "scale_loss and step would unscale the gradients by a different scale than the loss was scaled "
                "with; scaler.step(optimizer) updates the scale itself"
            )
        if self._step_just_updated:
            raise ScalerOrderError(
                f"scaler.step(optimizer) already updated the scale for step {self._step_count - 1}; calling "
                "update() after step() would update it twice (PyTorch's GradScaler needs both calls, "
                "tinyamp's step() does both)"
            )
        return self._transition(bool(found_inf))

    def _transition(self, found_inf: bool) -> ScaleEvent:
        rule = self.rule
        scale, tracker, overflow_seen, event = rule.next(self._scale, self._tracker, self._overflow_seen, found_inf)
        state = rule.state(scale, found_inf, overflow_seen)
        record = ScaleEvent(self._step_count, self._scale, scale, found_inf, event, tracker, state)
        self._scale, self._tracker, self._overflow_seen, self._state = scale, tracker, overflow_seen, state
        self._history.append(record)
        self._step_count += 1
        return record

    # ---- one training step ------------------------------------------------------------------------
    def scale_loss(self, loss: Tensor, accumulate: bool = False) -> Tensor:
        """``loss * scale``, computed in float32 at least; call ``.backward()`` on the result.

        Once per step; for gradient accumulation over micro-batches pass ``accumulate=True``
        to every call after the first in the same step.  In mode "off" the loss is returned untouched.
        """
        if not isinstance(loss, Tensor):
            raise TypeError(f"scale_loss takes the loss Tensor; got {type(loss).__name__}")
        if not dtypes.is_floating(loss.dtype):
            raise TypeError(f"scale_loss needs a floating-point loss; this one is {loss.dtype}")
        if self._phase == "unscaled":
            raise ScalerOrderError(
                f"the gradients of step {self._step_count} were already unscaled: finish the step with "
                "scaler.step(optimizer) before scaling the next loss"
            )
        if self._phase == "scaled" and not accumulate:
            raise ScalerOrderError(
                f"scale_loss was already called at step {self._step_count}: the loss is scaled once per step "
                "(finish it with scaler.step(optimizer); for gradient accumulation over several backward "
                "calls pass accumulate=True from the second call on)"
            )
        if self._scale == 0.0:
            at = next(e.step for e in self._history if e.scale_after == 0.0)
            raise FloatingPointError(
                f"the loss scale underflowed to 0 at step {at}, after repeated overflows: every gradient would be "
                "0 or NaN and every step skipped. Find where the non-finite values come from (scaler.history, "
                "the step reports), or give the scaler a floor, e.g. min_scale=1.0"
            )
        self._phase, self._step_just_updated = "scaled", False
        if self.rule.mode == "off":
            return loss
        if dtypes.is_16bit(loss.dtype):
            # 2^16 * loss overflows float16 (max 65504) for any loss >= 1; float32 holds it.  The
            # cast's backward rounds the gradient to float16 on the way into the network: that
            # rounding is the one loss scaling is for.  (That first gradient *is* the scale, so a
            # scale above 65504 still overflows at the first float16 op: the step is skipped.)
            loss = loss.float()
        if loss.dtype == dtypes.float32 and self._scale >= dtypes.overflow_threshold(dtypes.float32):
            loss = loss.double()  # a float64 scale beyond float32's range: the gradients become inf, reported
        return loss * self._scale

    def unscale_(self, optimizer: Any) -> dict[str, bool]:
        """Unscale, in place, the gradients ``optimizer.step()`` will read; report non-finite ones.

        Returns ``{parameter name: True if its gradient holds an inf or NaN}``.  Each gradient is multiplied
        by float32(1/S), as PyTorch's ``unscale_`` does (``scale.double().reciprocal().float()``): g / S for S
        a power of two, maybe an ulp from it otherwise (S = 3).  In float32 at least, rounded once into the
        gradient's dtype; FP32 masters gather (widen) their gradients first.  Once per step, before clipping.
        """
        self._check_can_unscale(optimizer)
        try:
            nonfinite, sums = self._unscale(optimizer, 1.0 / self._scale)  # exact for a power of two
        except OutOfRangeError:  # bad labels, found as the sums are read (backend.host_floats): scale the next loss
            self._phase = "ready"
            raise
        self._grad_norm = math.sqrt(math.fsum(sums))
        self._phase, self._unscaled_optimizer = "unscaled", id(optimizer)
        return dict(nonfinite)

    def _unscale(self, optimizer: Any, inverse: float) -> tuple[dict[str, bool], list[float]]:
        """Multiply each gradient by `inverse` (1 only checks): ``{name: not finite}`` and the sums of squares."""
        params, names = scaler_checks.optimizer_params(optimizer)
        if hasattr(optimizer, "gather_grads") and self._phase != "unscaled":
            optimizer.gather_grads()  # FP32 masters: widened, exactly, once a step, before unscaling
        present = [(name, p.grad) for p, name in zip(params, names) if p.grad is not None]
        if not present:
            raise ScalerOrderError(
                f"no parameter of the optimizer has a gradient at step {self._step_count}: call .backward() "
                "on the scaled loss before unscale_ or step"
            )
        # kernels.multiply_and_sum_squares_ rounds `inverse` to float32; one read per device brings every sum.
        sums = backend.host_floats([kernels.multiply_and_sum_squares_(g, inverse) for _, g in present])
        # The check: an inf or NaN makes its sum of squares inf or NaN.  (A float64 gradient's
        # square can overflow from a finite value above 1e154: that sum is checked element-wise.)
        finite = [math.isfinite(s) or bool(get_array_module(g).isfinite(g).all()) for s, (_, g) in zip(sums, present)]
        return {name: not ok for (name, _), ok in zip(present, finite)}, sums

    def step(self, optimizer: Any) -> StepReport:
        """Check, then skip or step, then update the scale: ``optimizer.step()`` runs only if every gradient is finite.

        The check unscales first unless ``unscale_`` did (then it checks again: clipping or user code may
        have written to the gradients since).  An overflowed step changes no weight and no optimizer
        state: it is reported in the returned StepReport (also ``last_report``) and in ``history``.
        Unlike PyTorch, stepping without ``scale_loss`` in this step is an error (except in mode "off"):
        the gradients would be divided by a scale they were never multiplied by.  Check and step together
        are the kernel "scaled_step" (``kernels.call``), whose reference is ``_unscale_and_step`` below.
        """
        self._check_can_step(optimizer)
        again = self._phase == "unscaled"  # unscale_ ran: multiplying by 1 only checks again
        inverse = 1.0 if again else 1.0 / self._scale
        try:
            nonfinite, sums = kernels.call("scaled_step", self._unscale_and_step, optimizer, inverse)
        except OutOfRangeError:  # bad labels, found as the sums are read (backend.host_floats): no weight changed
            self._phase, self._unscaled_optimizer = "ready", None
            raise
        if not again or any(nonfinite.values()):  # else unscale_'s norm stands: the one before clipping
            self._grad_norm = math.sqrt(math.fsum(sums))
        return self._finish_step([name for name, bad in nonfinite.items() if bad])

    def _unscale_and_step(self, optimizer: Any, inverse: float) -> tuple[dict[str, bool], list[float]]:
        """The reference of the kernel "scaled_step": unscale and check, then step only if every gradient is finite."""
        nonfinite, sums = self._unscale(optimizer, inverse)
        if not any(nonfinite.values()):
            optimizer.step()  # the skip is this line not running: no weight, no moment changes
        return nonfinite, sums

    def _finish_step(self, nonfinite: list[str]) -> StepReport:
        scale_before = self._scale
        record = self._transition(bool(nonfinite))
        self._phase, self._step_just_updated, self._unscaled_optimizer = "ready", True, None
        self.last_report = StepReport(
            step=record.step, skipped=bool(nonfinite), nonfinite_params=nonfinite, scale_before=scale_before,
            scale_after=record.scale_after, grad_norm=self._grad_norm, event=record.event, state=record.state,
        )  # fmt: skip
        return self.last_report

    def clip_grad_norm_(self, optimizer: Any, max_norm: float) -> float:
        """Rescale the unscaled gradients in place so that their global L2 norm is at most `max_norm`.

        Returns the norm before clipping, summed as ``StepReport.grad_norm`` is (inf or nan
        when a gradient is not finite: then nothing changes, and step() will skip).  As in
        PyTorch the gradients are multiplied by max_norm / (norm + 1e-6) when that is below 1.
        """
        params, _ = scaler_checks.optimizer_params(optimizer)
        scaler_checks.check_max_norm(max_norm)
        if self._phase != "unscaled":
            raise ScalerOrderError(
                f"clip_grad_norm_ at step {self._step_count} (phase {self._phase!r}) would be reading scaled "
                "gradients as if unscaled: call scaler.unscale_(optimizer) before clipping"
            )
        self._check_same_optimizer(optimizer, "clip_grad_norm_")
        if hasattr(optimizer, "clip_grad_norm_"):  # its gradient is sharded over processes (DataParallel):
            self._grad_norm = optimizer.clip_grad_norm_(max_norm)  # only it can sum the norm over all of them
        else:
            self._grad_norm = clip_by_global_norm_([p.grad for p in params if p.grad is not None], max_norm)
        return self._grad_norm

    def _check_can_unscale(self, optimizer: Any) -> None:
        scaler_checks.optimizer_params(optimizer)  # an object that is not an optimizer: one sentence saying so
        if self._phase == "unscaled":
            raise ScalerOrderError(
                f"gradients were already unscaled at step {self._step_count}; call unscale_ once per step, "
                "before clipping (a second unscale_ would divide them by the scale twice)"
            )
        if self._phase == "ready" and self.rule.mode != "off":
            raise ScalerOrderError(
                f"scale_loss was not called at step {self._step_count}: there is nothing to unscale. "
                "Call scaled = scaler.scale_loss(loss); scaled.backward() first"
            )

    def _check_can_step(self, optimizer: Any) -> None:
        scaler_checks.optimizer_params(optimizer)
        if self._phase == "ready" and self.rule.mode != "off":
            raise ScalerOrderError(
                f"scale_loss was not called at step {self._step_count}: stepping would read gradients that "
                f"were never scaled as if they had been scaled by {self._scale:g}. Call "
                "scaler.scale_loss(loss).backward() first (or use mode='off' to train without scaling)"
            )
        if self._phase == "unscaled":
            self._check_same_optimizer(optimizer, "step")

    def _check_same_optimizer(self, optimizer: Any, method: str) -> None:
        if self._unscaled_optimizer != id(optimizer):
            raise ScalerOrderError(
                f"{method} got a different optimizer from the one unscale_ was called with at step "
                f"{self._step_count}; one scaler drives one optimizer per step"
            )

    # ---- what a student prints ----------------------------------------------------------------------
    @property
    def scale(self) -> float:
        """The current loss scale S (a Python float; exactly a float32 value when scale_dtype is float32)."""
        return self._scale

    @property
    def growth_tracker(self) -> int:
        """Consecutive clean steps counted towards the next growth (reset by an overflow and by growth)."""
        return self._tracker

    @property
    def step_count(self) -> int:
        """Number of updates so far; also the number of the step in progress (0-based)."""
        return self._step_count

    @property
    def state(self) -> str:
        """One of ``loss_scale.STATES``."""
        return self._state

    @property
    def phase(self) -> str:
        """Where the current step is: "ready", "scaled" or "unscaled"."""
        return self._phase

    @property
    def config(self) -> dict[str, Any]:
        """The settings this scaler was built with (a copy): ``LossScaler(**scaler.config)`` rebuilds it."""
        return asdict(self.rule)

    @property
    def overflow_seen(self) -> bool:
        """True once any step has found an inf or NaN (it ends Chainer's warmup)."""
        return self._overflow_seen

    @property
    def history(self) -> list[ScaleEvent]:
        """One ScaleEvent per update, oldest first (a copy of the list)."""
        return list(self._history)

    def history_columns(self) -> dict[str, list[Any]]:
        """The history as columns, for plotting: ``plt.step(h["step"], h["scale_after"])``."""
        return {f.name: [getattr(e, f.name) for e in self._history] for f in fields(ScaleEvent)}

    def __repr__(self) -> str:
        tracker = f"{self._tracker}/{self.rule.growth_interval}"
        if self.rule.mode != "dynamic" or self.rule.growth_rule == "per_step":
            tracker = str(self._tracker)
        return (
            f"LossScaler(mode={self.rule.mode!r}, scale={self._scale!r}, state={self._state!r}, "
            f"growth_tracker={tracker}, step={self._step_count}, phase={self._phase!r})"
        )

    # ---- checkpoints (built and checked in scaler_checks.py) ----------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything the future of this scaler depends on, as plain Python values (saved between steps)."""
        self._check_between_steps("state_dict()", "save the scaler between steps, after scaler.step(optimizer)")
        return scaler_checks.state_dict(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` of a scaler with the same config; it then continues as if never stopped.

        Everything is checked first: a dict that does not fit changes nothing.
        """
        self._check_between_steps("load_state_dict()", "load between steps")
        values = scaler_checks.validated_state(self.rule, state_dict)
        self._scale, self._tracker, self._step_count, self._overflow_seen, self._state, self._history = values
        self._step_just_updated, self.last_report = False, None

    @classmethod
    def from_state_dict(cls, state_dict: dict[str, Any]) -> LossScaler:
        """A new scaler with the saved config and state."""
        scaler = scaler_checks.built_from_saved_config(cls, state_dict)
        scaler.load_state_dict(state_dict)
        return scaler

    def _check_between_steps(self, method: str, advice: str) -> None:
        if self._phase != "ready":
            step, phase = self._step_count, self._phase
            raise ScalerOrderError(f"{method} in the middle of step {step} (phase {phase!r}); {advice}")


def global_norm(grads: list[Any]) -> float:
    """The L2 norm of all the gradients together (inf or nan when one is not finite), with one read per device."""
    return math.sqrt(math.fsum(backend.host_floats([kernels.sum_of_squares(g) for g in grads])))


def clip_by_global_norm_(grads: list[Any], max_norm: float, norm_of: Callable[[], float] | None = None) -> float:
    """Multiply `grads` in place by max_norm / (norm + 1e-6) when that is below 1 (PyTorch's rule); return the norm.

    The norm is ``global_norm(grads)``, or ``norm_of()`` where the gradients are sharded over processes
    (DataParallel sums it over every rank).  A norm that is not finite changes nothing: step() will skip.
    """
    scaler_checks.check_max_norm(max_norm)
    norm = global_norm(grads) if norm_of is None else norm_of()
    coefficient = float(max_norm) / (norm + 1e-6)
    if math.isfinite(norm) and coefficient < 1.0:
        for g in grads:
            kernels.multiply_and_sum_squares_(g, coefficient)  # rounded once into g's dtype; the sum is not needed
    return norm
