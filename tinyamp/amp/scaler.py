"""Loss scaling as a state machine you can print, plot and test.

Why scale the loss: in float16 the smallest positive value is 2^-24 (about 6e-8) and the
smallest *normal* value 2^-14, so small gradients round to zero or lose their low bits
on the way back through an FP16 network.  Multiplying the loss by S multiplies every
gradient by S (the chain rule is linear), lifting them into range.  Dividing by S again
before the optimizer reads them gives back the true gradients; when S is a power of two
both multiplications only shift the exponent, so they are *exact* unless a value
overflows (above 65504 in float16) or falls into the subnormal range.

Why the scale is dynamic: too large a scale overflows some gradient to inf.  So the
scaler watches every gradient: on an inf or NaN the step is skipped (no weight and no
optimizer moment changes) and the scale shrinks; after a run of clean steps it grows
again.  ``history`` records every decision, so the sawtooth of the scale can be plotted.

One training step, in order (each step out of order is an error that says so)::

    scaled = scaler.scale_loss(loss)        # phase "ready"    -> "scaled"
    scaled.backward()
    scaler.unscale_(opt)                    # phase "scaled"   -> "unscaled" (optional here)
    scaler.clip_grad_norm_(opt, 1.0)        # needs "unscaled" (optional)
    report = scaler.step(opt)               # skips or steps, updates the scale -> "ready"
    opt.zero_grad()
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from tinyamp import backend, dtypes
from tinyamp.amp import unscale_cuda
from tinyamp.amp.presets import PRESETS
from tinyamp.backend import get_array_module
from tinyamp.ops.broadcasting import accumulation_dtype
from tinyamp.tensor import Tensor

MODES = ("dynamic", "static", "off")
SCALE_DTYPES = ("float64", "float32")
GROWTH_RULES = ("interval", "per_step")
STATES = ("warmup", "steady", "backed_off", "at_floor", "at_ceiling", "static", "off")
EVENTS = ("grew", "backed_off", "held", "hit_floor", "hit_ceiling")
PHASES = ("ready", "scaled", "unscaled")

_FORMAT = "tinyamp.amp.LossScaler"
_VERSION = 1
_F32_MAX = float(np.finfo(np.float32).max)


class ScalerOrderError(RuntimeError):
    """A scaler method called out of order (e.g. unscaling twice, stepping before backward)."""


class ScalerStateError(ValueError):
    """A scaler state_dict that is corrupt or was saved by a differently configured scaler."""


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    """One transition of the scale: a row of ``LossScaler.history``.

    ``step`` numbers the step it closes (0 for the first); ``growth_tracker`` and ``state``
    are their values *after* the transition.
    """

    step: int
    scale_before: float
    scale_after: float
    found_inf: bool
    event: str
    growth_tracker: int
    state: str


@dataclass(frozen=True)
class StepReport:
    """What ``LossScaler.step`` did: stepped or skipped, why, and what became of the scale.

    ``grad_norm`` is the global L2 norm of the unscaled gradients (summed in float64, large
    float32 gradients in float32 rows first, see ``_sum_of_squares``; inf or nan when a
    gradient was not finite); if ``clip_grad_norm_`` ran, it is the norm
    it measured *before* clipping, the number it returned.
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
    """Dynamic loss scaling (PyTorch's GradScaler rule by default), with named states.

    Modes: ``"dynamic"`` (the rule below), ``"static"`` (the scale never changes; an
    overflowed step is still skipped and reported) and ``"off"`` (the scale is 1 and
    ``scale_loss`` returns the loss untouched, but non-finite gradients are still
    detected, the step skipped and reported: overflow is never hidden).

    The rule of the dynamic mode, one ``update(found_inf)`` per step.  ``round`` rounds to
    ``scale_dtype`` (float32 reproduces PyTorch, whose scale is a float32 tensor; float64 is
    a Python float); t is ``growth_tracker``, N is ``growth_interval``:

    ==================  =========  ============================================  =========  ========================
    rule                found_inf  new scale                                     new t      event
    ==================  =========  ============================================  =========  ========================
    any                 True       max(round(s * backoff_factor), min_scale)     0          backed_off / hit_floor
    warmup (Chainer)    False      min(round(s * growth_factor), max_scale)      t + 1      grew / hit_ceiling
    "interval", t+1<N   False      s                                             t + 1      held
    "interval", t+1=N   False      min(round(s * growth_factor), max_scale)      0          grew / hit_ceiling
    "per_step"          False      min(round(s * growth_factor^(1/N)), max)      t + 1      grew / hit_ceiling
    ==================  =========  ============================================  =========  ========================

    ``hit_floor`` / ``hit_ceiling`` mean the rule's result was clamped to ``min_scale`` /
    ``max_scale``, or the growth was *refused* because the grown scale is not finite in
    ``scale_dtype`` (the scale then stays).  Without a floor, a long run of overflows
    halves the scale down through the subnormals to 0, exactly as PyTorch's does;
    ``scale_loss`` then raises instead of skipping every step forever.  The warmup
    (``warmup=True``) lasts until the first overflow.  In static and off modes the scale
    never changes (event ``held``), and t counts consecutive clean steps.

    With powers of two for ``init_scale``, ``growth_factor`` and ``backoff_factor`` (the
    default) the scale stays a power of two, and scaling and unscaling are exact unless a
    value overflows or lands among the subnormals.  ``growth_rule="per_step"`` (Chainer's
    ``2^(1/N)`` per clean step) leaves that grid after the warmup: every scale and unscale
    then rounds, by up to half an ulp of each gradient.

    ``state`` after each transition (the first matching row wins):

    ==============  ==========================================================================
    state           when
    ==============  ==========================================================================
    "static"/"off"  in those modes, always
    "warmup"        warmup=True and no overflow has happened yet
    "at_floor"      scale == min_scale
    "at_ceiling"    scale == max_scale, or one more growth would not be finite in scale_dtype
    "backed_off"    the last update found an overflow
    "steady"        otherwise: clean steps, counting towards the next growth
    ==============  ==========================================================================

    ``phase`` orders the calls within a step: "ready" --scale_loss--> "scaled"
    --unscale_--> "unscaled" --step--> "ready" (step unscales first if needed).
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
    ) -> None:
        """``init_scale`` defaults to 2^16 (1 when ``mode="off"``).  See the class docstring for the rule."""
        self._config = _check_config(
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            min_scale=min_scale,
            max_scale=max_scale,
            mode=mode,
            scale_dtype=scale_dtype,
            warmup=warmup,
            growth_rule=growth_rule,
        )
        self._scale = self._config["init_scale"]
        self._tracker = 0
        self._step_count = 0
        self._overflow_seen = False
        self._state = self._state_for(self._scale, found_inf=False, overflow_seen=False)
        self._phase = "ready"
        self._history: list[ScaleEvent] = []
        self.last_report: StepReport | None = None
        self._step_just_updated = False  # step() ran and no scale_loss since: update() now would update twice
        self._unscaled_optimizer: int | None = None
        self._unscale_flags: dict[str, bool] = {}
        self._grad_norm = math.nan

    # ---- presets ------------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> LossScaler:
        """A scaler following a published rule: "pytorch", "apex", "keras", "jmp" or "chainer".

        ``overrides`` replace single settings, e.g. ``LossScaler.preset("pytorch", growth_interval=100)``.
        See :mod:`tinyamp.amp.presets` for the table and the sources.
        """
        if name not in PRESETS:
            raise ValueError(f"unknown loss-scaler preset {name!r}; the presets are {', '.join(PRESETS)}")
        settings = dict(PRESETS[name].settings)
        settings.update(overrides)
        return cls(**settings)

    # ---- what a student prints ----------------------------------------------------------------
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
        """One of STATES; see the table in the class docstring."""
        return self._state

    @property
    def phase(self) -> str:
        """Where the current step is: "ready", "scaled" or "unscaled"."""
        return self._phase

    @property
    def config(self) -> dict[str, Any]:
        """The settings this scaler was built with (a copy): ``LossScaler(**scaler.config)`` rebuilds it."""
        return dict(self._config)

    @property
    def history(self) -> list[ScaleEvent]:
        """One ScaleEvent per update, oldest first (a copy of the list; ~150 bytes per step in memory)."""
        return list(self._history)

    def history_columns(self) -> dict[str, list[Any]]:
        """The history as columns, for plotting: ``plt.step(h["step"], h["scale_after"])``."""
        return {f.name: [getattr(e, f.name) for e in self._history] for f in fields(ScaleEvent)}

    def __repr__(self) -> str:
        tracker = f"{self._tracker}/{self._config['growth_interval']}"
        if self._config["mode"] != "dynamic" or self._config["growth_rule"] == "per_step":
            tracker = str(self._tracker)
        return (
            f"LossScaler(mode={self._config['mode']!r}, scale={self._scale!r}, state={self._state!r}, "
            f"growth_tracker={tracker}, step={self._step_count}, phase={self._phase!r})"
        )

    # ---- the state machine ----------------------------------------------------------------------
    def update(self, found_inf: bool) -> ScaleEvent:
        """Apply one transition of the rule (see the class docstring) and record it in ``history``.

        ``step()`` calls this itself; call it by hand only to drive the state machine without
        a model, e.g. ``for flag in [False, True, False]: scaler.update(flag)``.
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
        scale, tracker, overflow_seen, event = self._next(self._scale, self._tracker, self._overflow_seen, found_inf)
        state = self._state_for(scale, found_inf, overflow_seen)
        record = ScaleEvent(self._step_count, self._scale, scale, found_inf, event, tracker, state)
        self._scale, self._tracker, self._overflow_seen, self._state = scale, tracker, overflow_seen, state
        self._history.append(record)
        self._step_count += 1
        return record

    def _next(self, scale: float, tracker: int, overflow_seen: bool, found_inf: bool) -> tuple[float, int, bool, str]:
        """The pure rule: (scale, tracker, overflow_seen, found_inf) -> (scale, tracker, overflow_seen, event)."""
        c = self._config
        if c["mode"] != "dynamic":
            return scale, 0 if found_inf else tracker + 1, overflow_seen or found_inf, "held"
        if found_inf:
            new = self._round(scale * c["backoff_factor"])
            if c["min_scale"] is not None and new < c["min_scale"]:
                return c["min_scale"], 0, True, "hit_floor"
            return new, 0, True, "backed_off"
        tracker += 1
        if not (c["warmup"] and not overflow_seen) and c["growth_rule"] == "interval":
            if tracker < c["growth_interval"]:
                return scale, tracker, overflow_seen, "held"
            tracker = 0
        new, event = self._grow(scale, self._growth_multiplier(overflow_seen))
        return new, tracker, overflow_seen, event

    def _growth_multiplier(self, overflow_seen: bool) -> float:
        c = self._config
        if c["warmup"] and not overflow_seen:
            return c["growth_factor"]
        if c["growth_rule"] == "per_step":
            # Chainer's multiplier: math.pow(2.0, 1.0 / interval), computed in float64.
            return c["growth_factor"] ** (1.0 / c["growth_interval"])
        return c["growth_factor"]

    def _grow(self, scale: float, multiplier: float) -> tuple[float, str]:
        grown = self._round(scale * multiplier)
        if not math.isfinite(grown):  # PyTorch: "do not grow the scale past fp32 bounds to inf"
            return scale, "hit_ceiling"
        max_scale = self._config["max_scale"]
        if max_scale is not None and grown > max_scale:
            return max_scale, "hit_ceiling"
        return grown, "grew"

    def _round(self, x: float) -> float:
        return _round_to(self._config["scale_dtype"], x)

    def _state_for(self, scale: float, found_inf: bool, overflow_seen: bool) -> str:
        c = self._config
        if c["mode"] != "dynamic":
            return c["mode"]
        if c["warmup"] and not overflow_seen:
            return "warmup"
        if c["min_scale"] is not None and scale == c["min_scale"]:
            return "at_floor"
        at_max = c["max_scale"] is not None and scale == c["max_scale"]
        if at_max or not math.isfinite(self._round(scale * self._growth_multiplier(overflow_seen))):
            return "at_ceiling"
        return "backed_off" if found_inf else "steady"

    # ---- one training step ----------------------------------------------------------------------
    def scale_loss(self, loss: Tensor, accumulate: bool = False) -> Tensor:
        """``loss * scale``, computed in float32 at least; call ``.backward()`` on the result.

        Once per step.  For gradient accumulation over micro-batches, pass ``accumulate=True``
        to every call after the first in the same step.  In mode "off" the loss is returned
        untouched.
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
        self._phase = "scaled"
        self._step_just_updated = False
        if self._config["mode"] == "off":
            return loss
        if loss.dtype.itemsize < 4:
            # Scale a float16 loss in float32: 2^16 * loss overflows float16 (max 65504) for any
            # loss >= 1, while float32 holds it.  The cast's backward rounds the gradient to
            # float16 on the way into the network; that rounding is the one loss scaling is for.
            # (That first gradient *is* the scale, so a scale above 65504 still overflows at the
            # first float16 op: the first step is skipped and the scale backs off to 2^15.)
            loss = loss.float()
        if loss.dtype == dtypes.float32 and self._scale >= dtypes.overflow_threshold(dtypes.float32):
            # A float64 scale beyond float32's range: the product would be inf in float32, and the
            # backward of this cast rounds the gradients to inf, which unscale_ then reports.
            loss = loss.double()
        return loss * self._scale

    def unscale_(self, optimizer: Any) -> dict[str, bool]:
        """Divide, in place, the gradients ``optimizer.step()`` will read by the scale; report non-finite ones.

        Returns ``{parameter name: True if its gradient holds an inf or NaN}`` for every
        parameter with a gradient.  float32 and float64 gradients are multiplied by
        ``1/scale`` in their own dtype; float16 and bfloat16 gradients are unscaled in
        float32 and rounded back once.  If the optimizer has ``gather_grads()`` (FP32
        master weights) it is called first.  Once per step, after backward, before clipping.
        """
        return self._finish_unscale(optimizer, *self._launch_unscale(optimizer))

    def _check_can_unscale(self) -> None:
        if self._phase == "unscaled":
            raise ScalerOrderError(
                f"gradients were already unscaled at step {self._step_count}; call unscale_ once per step, "
                "before clipping (a second unscale_ would divide them by the scale twice)"
            )
        if self._phase == "ready" and self._config["mode"] != "off":
            raise ScalerOrderError(
                f"scale_loss was not called at step {self._step_count}: there is nothing to unscale. "
                "Call scaled = scaler.scale_loss(loss); scaled.backward() first"
            )

    def _launch_unscale(self, optimizer: Any) -> tuple[list[tuple[str, Any]], list[Any], list[Any]]:
        """unscale_'s device work: gather, unscale, sums of squares; nothing is read back yet."""
        params, names = _optimizer_params(optimizer)
        self._check_can_unscale()
        gather = getattr(optimizer, "gather_grads", None)
        if gather is not None:
            gather()
        present = [(name, p.grad) for p, name in zip(params, names) if p.grad is not None]
        if not present:
            raise ScalerOrderError(
                f"no parameter of the optimizer has a gradient at step {self._step_count}: call .backward() "
                "on the scaled loss before unscale_ or step"
            )
        inverse = 1.0 / self._scale  # exact when the scale is a power of two
        squares: list[Any] = []
        device_flags: list[Any] = []  # from the GPU kernel that unscales and flags in one pass
        for _, g in present:
            if unscale_cuda.applies(g):
                device_flags.append(unscale_cuda.unscale_(g, inverse))
            elif inverse != 1.0:
                _multiply_(g, inverse)
            squares.append(_sum_of_squares(g))
        return present, squares, device_flags

    def _step_from_model_grads(self, optimizer: Any) -> None:
        """The GPU step with FP32 master weights and no float32 gradient stored anywhere.

        One reduction kernel per float16 model gradient sums the squares of its unscaled
        values (read, not written); their non-finite sums make the device's skip flag; the
        fused update kernels unscale each gradient again on the fly and read the flag; then
        the one host read of the sums gives the report and, after an overflow, the rollback
        of the host's counters.  Same arithmetic, and so the same bits, as gather + unscale_
        + step on the CPU.
        """
        self._check_can_unscale()
        present = [(n, m.grad) for n, m in zip(optimizer.names, optimizer.model_params) if m.grad is not None]
        if not present:
            raise ScalerOrderError(
                f"no parameter of the optimizer has a gradient at step {self._step_count}: call .backward() "
                "on the scaled loss before step"
            )
        inverse = 1.0 / self._scale
        sums = [unscale_cuda.scaled_sum_of_squares(g, inverse) for _, g in present]
        xp = get_array_module(sums[0])
        found = (~xp.isfinite(xp.stack(sums))).any().astype(np.int32)  # decided on the device
        before = optimizer.bookkeeping()
        optimizer.step_from_model_grads(inverse, skip_if=found)
        host = backend.host_floats(sums)  # the one read of the step
        self._unscale_flags = {name: not math.isfinite(v) for (name, _), v in zip(present, host)}
        self._grad_norm = math.sqrt(math.fsum(host))
        self._phase = "unscaled"
        self._unscaled_optimizer = id(optimizer)
        if any(self._unscale_flags.values()):
            optimizer.restore_bookkeeping(before)

    def _finish_unscale(
        self, optimizer: Any, present: list[tuple[str, Any]], squares: list[Any], device_flags: list[Any]
    ) -> dict[str, bool]:
        """unscale_'s host work: the one read of flags and sums, then the per-parameter report."""
        host = backend.host_floats(squares + device_flags)  # one device-to-host copy per device
        sums, raised = host[: len(squares)], iter(host[len(squares) :])
        # On the CPU, one pass gives both the norm and the finiteness check: an inf or NaN makes
        # the sum of squares inf or NaN.  A non-finite sum can also come from float64 squares
        # overflowing (|g| > 1e154, only possible in float64 gradients): checked element-wise.
        flags = []
        for total, (_, g) in zip(sums, present):
            if unscale_cuda.applies(g):
                flags.append(next(raised) == 0.0)
            else:
                flags.append(math.isfinite(total) or bool(get_array_module(g).isfinite(g).all()))
        self._unscale_flags = {name: not ok for (name, _), ok in zip(present, flags)}
        self._grad_norm = math.sqrt(math.fsum(sums))
        self._phase = "unscaled"
        self._unscaled_optimizer = id(optimizer)
        return dict(self._unscale_flags)

    def clip_grad_norm_(self, optimizer: Any, max_norm: float) -> float:
        """Rescale the unscaled gradients in place so that their global L2 norm is at most `max_norm`.

        Returns the norm before clipping, summed as ``StepReport.grad_norm`` is (inf or nan when a gradient is
        not finite; then nothing is changed, and step() will skip).  As in PyTorch the gradients
        are multiplied by max_norm / (norm + 1e-6) when that is below 1.  Needs unscale_ first.
        """
        params, _ = _optimizer_params(optimizer)
        if not isinstance(max_norm, numbers.Real) or isinstance(max_norm, bool) or not max_norm > 0:
            raise ValueError(f"max_norm must be a number > 0; got {max_norm!r}")
        if self._phase != "unscaled":
            raise ScalerOrderError(
                f"clip_grad_norm_ at step {self._step_count} (phase {self._phase!r}) would be reading scaled "
                "gradients as if unscaled: call scaler.unscale_(optimizer) before clipping"
            )
        self._check_same_optimizer(optimizer, "clip_grad_norm_")
        grads = [p.grad for p in params if p.grad is not None]
        _, total = _to_host([], [_sum_of_squares(g) for g in grads])
        norm = math.sqrt(total)
        coefficient = float(max_norm) / (norm + 1e-6)
        if math.isfinite(norm) and coefficient < 1.0:
            for g in grads:
                _multiply_(g, coefficient)
        self._grad_norm = norm
        return norm

    def step(self, optimizer: Any) -> StepReport:
        """Unscale (if not done yet), then call ``optimizer.step()`` only if every gradient is finite.

        An overflowed step changes no weight and no optimizer state; it is recorded in the
        returned StepReport (also ``self.last_report``) and in ``history``.  Then the scale is
        updated (``update``) and the phase returns to "ready".  If unscale_ ran earlier in the
        step, the gradients are checked again here, since clipping or user code may have
        written to them.

        Unlike PyTorch, stepping without ``scale_loss`` in this step is an error (except in
        mode "off"): the gradients would be divided by a scale they were never multiplied by.
        """
        _optimizer_params(optimizer)
        if self._phase == "ready" and self._config["mode"] != "off":
            raise ScalerOrderError(
                f"scale_loss was not called at step {self._step_count}: stepping would read gradients that "
                f"were never scaled as if they had been scaled by {self._scale:g}. Call "
                "scaler.scale_loss(loss).backward() first (or use mode='off' to train without scaling)"
            )
        if self._phase == "unscaled":
            stepped = False
            # unscale_ ran earlier and something (clipping, the user) may have written to the
            # gradients since: check again what optimizer.step() is about to read.
            self._check_same_optimizer(optimizer, "step")
            params, names = _optimizer_params(optimizer)
            present = [(name, p.grad) for p, name in zip(params, names) if p.grad is not None]
            flags, _ = _to_host([get_array_module(g).isfinite(g).all() for _, g in present], [])
            self._unscale_flags = {name: not ok for (name, _), ok in zip(present, flags)}
            if not all(flags):
                self._grad_norm = math.sqrt(_to_host([], [_sum_of_squares(g) for _, g in present])[1])
        elif _updates_from_model_grads(optimizer):
            stepped = True
            self._step_from_model_grads(optimizer)
        else:
            present, squares, device_flags = self._launch_unscale(optimizer)
            stepped = bool(device_flags) and len(device_flags) == len(present) and _fuses_every_update(optimizer)
            if stepped:
                # The skip is decided on the GPU: the update kernels read the overflow flag
                # themselves, so they are launched before the host has read anything; the one
                # read below then tells the host whether its counters must be rolled back.
                found = get_array_module(device_flags[0]).stack(device_flags).max()
                before = optimizer.bookkeeping()
                optimizer.step(skip_if=found)
            self._finish_unscale(optimizer, present, squares, device_flags)
            if stepped and any(self._unscale_flags.values()):
                optimizer.restore_bookkeeping(before)
        nonfinite = [name for name, bad in self._unscale_flags.items() if bad]
        if not nonfinite and not stepped:
            optimizer.step()
        scale_before = self._scale
        record = self._transition(bool(nonfinite))
        self._phase = "ready"
        self._step_just_updated = True
        self._unscaled_optimizer = None
        report = StepReport(
            step=record.step,
            skipped=bool(nonfinite),
            nonfinite_params=nonfinite,
            scale_before=scale_before,
            scale_after=record.scale_after,
            grad_norm=self._grad_norm,
            event=record.event,
            state=record.state,
        )
        self.last_report = report
        return report

    def _check_same_optimizer(self, optimizer: Any, method: str) -> None:
        if self._unscaled_optimizer != id(optimizer):
            raise ScalerOrderError(
                f"{method} got a different optimizer from the one unscale_ was called with at step "
                f"{self._step_count}; one scaler drives one optimizer per step"
            )

    # ---- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything the future of this scaler depends on, as plain Python values (saved between steps)."""
        if self._phase != "ready":
            raise ScalerOrderError(
                f"state_dict() in the middle of step {self._step_count} (phase {self._phase!r}): save the "
                "scaler between steps, after scaler.step(optimizer)"
            )
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "config": dict(self._config),
            "scale": self._scale,
            "growth_tracker": self._tracker,
            "step_count": self._step_count,
            "overflow_seen": self._overflow_seen,
            "state": self._state,
            "history": self.history_columns(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()``; training then continues exactly as if never interrupted.

        The dict must come from a scaler with the same config (``LossScaler.from_state_dict``
        builds one).  Everything is checked first: a dict that does not fit changes nothing.
        """
        if self._phase != "ready":
            raise ScalerOrderError(
                f"load_state_dict() in the middle of step {self._step_count} (phase {self._phase!r}); "
                "load between steps"
            )
        values = self._validated(state_dict)
        self._scale, self._tracker, self._step_count, self._overflow_seen, self._state, self._history = values
        self._step_just_updated = False
        self.last_report = None

    @classmethod
    def from_state_dict(cls, state_dict: dict[str, Any]) -> LossScaler:
        """A new scaler with the saved config and state."""
        if not isinstance(state_dict, dict) or not isinstance(state_dict.get("config"), dict):
            raise ScalerStateError("this is not a LossScaler state_dict: it has no 'config' dict")
        try:
            scaler = cls(**state_dict["config"])
        except (TypeError, ValueError) as exc:
            raise ScalerStateError(f"the saved config is not valid: {exc}") from exc
        scaler.load_state_dict(state_dict)
        return scaler

    def _validated(self, d: Any) -> tuple[float, int, int, bool, str, list[ScaleEvent]]:
        def fail(why: str) -> ScalerStateError:
            return ScalerStateError(f"cannot load this LossScaler state_dict: {why}")

        if not isinstance(d, dict):
            raise fail(f"expected a dict, got {type(d).__name__}")
        if d.get("format") != _FORMAT:
            raise fail(f"its 'format' is {d.get('format')!r}, not {_FORMAT!r} (is it another object's state?)")
        if d.get("version") != _VERSION:
            raise fail(f"it has version {d.get('version')!r}; this tinyamp reads version {_VERSION}")
        expected = {"format", "version", "config", "scale", "growth_tracker", "step_count", "overflow_seen", "state"}
        expected.add("history")
        if set(d) != expected:
            missing, extra = sorted(expected - set(d)), sorted(set(d) - expected)
            raise fail(f"missing keys {missing}, unexpected keys {extra}")
        config = d["config"]
        if config != self._config:
            if not isinstance(config, dict):
                raise fail("'config' is not a dict")
            diff = [
                f"{k}={config.get(k)!r} (this scaler: {self._config.get(k)!r})"
                for k in sorted(set(config) | set(self._config))
                if config.get(k, "<missing>") != self._config.get(k, "<missing>")
            ]
            raise fail(
                "it was saved by a scaler configured differently: "
                + ", ".join(diff)
                + ". Build the scaler with LossScaler.from_state_dict(d), or LossScaler(**d['config'])"
            )
        c = self._config
        scale, tracker, steps = d["scale"], d["growth_tracker"], d["step_count"]
        if not isinstance(scale, float) or not math.isfinite(scale) or scale < 0 or self._round(scale) != scale:
            raise fail(f"scale={scale!r} is not a finite float >= 0 representable in {c['scale_dtype']}")
        if c["min_scale"] is not None and scale < c["min_scale"]:
            raise fail(f"scale={scale!r} is below min_scale={c['min_scale']!r}")
        if c["max_scale"] is not None and scale > c["max_scale"]:
            raise fail(f"scale={scale!r} is above max_scale={c['max_scale']!r}")
        if c["mode"] != "dynamic" and scale != c["init_scale"]:
            raise fail(f"scale={scale!r}, but in mode {c['mode']!r} the scale is always {c['init_scale']!r}")
        for key, value in (("growth_tracker", tracker), ("step_count", steps)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise fail(f"{key}={value!r} is not an int >= 0")
        overflow_seen = d["overflow_seen"]
        if not isinstance(overflow_seen, bool):
            raise fail(f"overflow_seen={overflow_seen!r} is not a bool")
        interval_rule = c["mode"] == "dynamic" and c["growth_rule"] == "interval"
        if interval_rule and not (c["warmup"] and not overflow_seen) and tracker >= c["growth_interval"]:
            raise fail(f"growth_tracker={tracker} must be below growth_interval={c['growth_interval']}")
        history = self._validated_history(d["history"], steps, fail)
        if history:
            last = history[-1]
            if (last.scale_after, last.growth_tracker, last.state) != (scale, tracker, d["state"]):
                raise fail(
                    f"the last history record (scale {last.scale_after!r}, tracker {last.growth_tracker}, "
                    f"state {last.state!r}) disagrees with scale={scale!r}, growth_tracker={tracker}, "
                    f"state={d['state']!r}"
                )
            if overflow_seen != any(e.found_inf for e in history):
                raise fail(f"overflow_seen={overflow_seen} disagrees with the history")
        elif (scale, tracker, overflow_seen) != (c["init_scale"], 0, False):
            raise fail("the history is empty, but the scale, tracker or overflow_seen are not the initial ones")
        state = self._state_for(scale, history[-1].found_inf if history else False, overflow_seen)
        if d["state"] != state:
            raise fail(f"state={d['state']!r}, but scale={scale!r} and the history give state {state!r}")
        return scale, tracker, steps, overflow_seen, state, history

    @staticmethod
    def _validated_history(columns: Any, steps: int, fail: Any) -> list[ScaleEvent]:
        names = [f.name for f in fields(ScaleEvent)]
        if not isinstance(columns, dict) or set(columns) != set(names):
            raise fail(f"'history' must be a dict with the columns {names}")
        lengths = {len(v) if isinstance(v, list) else -1 for v in columns.values()}
        if lengths != {steps}:
            raise fail(f"each history column must be a list of step_count={steps} entries")
        checks = {
            "step": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "scale_before": lambda v: isinstance(v, float) and math.isfinite(v) and v >= 0,
            "scale_after": lambda v: isinstance(v, float) and math.isfinite(v) and v >= 0,
            "found_inf": lambda v: isinstance(v, bool),
            "event": lambda v: v in EVENTS,
            "growth_tracker": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
            "state": lambda v: v in STATES,
        }
        history = []
        for i in range(steps):
            row = {k: columns[k][i] for k in names}
            bad = [k for k in names if not checks[k](row[k])]
            if bad:
                raise fail(f"history row {i} has invalid {', '.join(f'{k}={row[k]!r}' for k in bad)}")
            if row["step"] != i:
                raise fail(f"history row {i} is numbered step {row['step']}")
            if i and row["scale_before"] != columns["scale_after"][i - 1]:
                raise fail(f"history row {i} starts from scale {row['scale_before']!r}, not the previous row's end")
            history.append(ScaleEvent(**row))
        return history


def _round_to(scale_dtype: str, x: float) -> float:
    """`x` rounded to `scale_dtype` ("float32" or "float64"), as a Python float (inf when out of range)."""
    if scale_dtype == "float32":
        with np.errstate(over="ignore"):
            return float(np.float32(x))
    return x


# ---- configuration checks -------------------------------------------------------------------------
def _number(name: str, value: Any) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number; got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite; got {value}")
    return value


def _check_config(**c: Any) -> dict[str, Any]:
    """Validate the constructor's arguments; return them normalized (floats, rounded init_scale)."""
    if c["mode"] not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {c['mode']!r}")
    if c["scale_dtype"] not in SCALE_DTYPES:
        raise ValueError(f"scale_dtype must be one of {SCALE_DTYPES}; got {c['scale_dtype']!r}")
    if c["growth_rule"] not in GROWTH_RULES:
        raise ValueError(f"growth_rule must be one of {GROWTH_RULES}; got {c['growth_rule']!r}")
    if not isinstance(c["warmup"], bool):
        raise TypeError(f"warmup must be True or False; got {c['warmup']!r}")
    if c["mode"] != "dynamic" and (c["warmup"] or c["growth_rule"] != "interval"):
        raise ValueError(f"warmup and growth_rule only apply to mode='dynamic'; this scaler has mode={c['mode']!r}")
    growth = _number("growth_factor", c["growth_factor"])
    if not growth > 1:
        raise ValueError(f"growth_factor must be > 1 (the scale grows after clean steps); got {growth}")
    backoff = _number("backoff_factor", c["backoff_factor"])
    if not 0 < backoff < 1:
        raise ValueError(f"backoff_factor must lie in (0, 1) (the scale shrinks after an overflow); got {backoff}")
    interval = c["growth_interval"]
    if not isinstance(interval, numbers.Integral) or isinstance(interval, bool) or interval < 1:
        raise ValueError(f"growth_interval must be an int >= 1; got {interval!r}")
    c.update(growth_factor=growth, backoff_factor=backoff, growth_interval=int(interval))

    def round_to_dtype(x: float) -> float:
        return _round_to(c["scale_dtype"], x)

    init = c["init_scale"]
    if init is None:
        init = 1.0 if c["mode"] == "off" else 2.0**16
    init = _number("init_scale", init)
    if c["mode"] == "off" and init != 1.0:
        raise ValueError(f"mode='off' scales by 1; init_scale={init} would be ignored, so it is an error")
    if not init > 0:
        raise ValueError(f"init_scale must be > 0; got {init}")
    rounded = round_to_dtype(init)  # as torch.full((), init_scale, dtype=torch.float32) does
    if not (math.isfinite(rounded) and rounded > 0):
        raise ValueError(f"init_scale={init} rounds to {rounded} in float32; pick a scale within float32's range")
    c["init_scale"] = rounded
    for key in ("min_scale", "max_scale"):
        if c[key] is None:
            continue
        value = _number(key, c[key])
        if not value > 0:
            raise ValueError(f"{key} must be > 0 (or None); got {value}")
        if round_to_dtype(value) != value:
            raise ValueError(
                f"{key}={value!r} is not exactly representable in float32 (nearest: {round_to_dtype(value)!r}); "
                "use a power of two, or that nearest value"
            )
        c[key] = value
    low = c["min_scale"] if c["min_scale"] is not None else 0.0
    high = c["max_scale"] if c["max_scale"] is not None else math.inf
    if not low <= c["init_scale"] <= high:
        raise ValueError(
            f"the bounds must satisfy min_scale <= init_scale <= max_scale; got min_scale={c['min_scale']}, "
            f"init_scale={c['init_scale']}, max_scale={c['max_scale']}"
        )
    return c


# ---- array helpers (NumPy or CuPy through get_array_module) --------------------------------------------
def _updates_from_model_grads(optimizer: Any) -> bool:
    """True for FP32 master weights that can update straight from the float16 model gradients (a GPU)."""
    from tinyamp.amp.master import MasterWeights

    if not isinstance(optimizer, MasterWeights):
        return False
    grads = [m.grad for m in optimizer.model_params]
    return all(g is None or unscale_cuda.applies(g) for g in grads) and optimizer.updates_from_model_grads()


def _fuses_every_update(optimizer: Any) -> bool:
    """True when the optimizer can take a GPU-side skip flag: FP32 master weights whose every
    update (and rounding into the model) is one fused kernel."""
    from tinyamp.amp.master import MasterWeights

    return isinstance(optimizer, MasterWeights) and optimizer.fuses_every_update()


def _optimizer_params(optimizer: Any) -> tuple[list[Tensor], list[str]]:
    """The optimizer protocol: ``.params`` (Tensors whose .grad step() reads), ``.names``, ``.step()``."""
    params, names = getattr(optimizer, "params", None), getattr(optimizer, "names", None)
    if params is None or names is None or not callable(getattr(optimizer, "step", None)):
        raise TypeError(
            f"the scaler needs an optimizer with .params, .names and .step() (a tinyamp optimizer, or "
            f"MasterWeights); got {type(optimizer).__name__}"
        )
    params, names = list(params), list(names)
    if len(params) != len(names):
        raise ValueError(f"the optimizer has {len(params)} params but {len(names)} names")
    return params, names


def _multiply_(g: Any, factor: float) -> None:
    """``g *= factor`` in place, computed in float32 at least and rounded once into g's dtype."""
    # Overflow here (a scale below 1, or clipping) makes an inf that the finiteness check
    # reports; the warning NumPy would print adds nothing.
    with np.errstate(over="ignore", invalid="ignore"):
        compute = accumulation_dtype(g.dtype)
        if compute == g.dtype:
            g *= compute.type(factor)  # float32 grads: factor rounded to float32, as PyTorch's inv_scale
        else:
            wide = g.astype(compute)
            wide *= compute.type(factor)
            g[...] = wide


_CHUNK = 1 << 16
_ROW = 1 << 10  # float32 values per BLAS dot in a large float32 gradient's sum of squares


def _sum_of_squares(g: Any) -> Any:
    """sum(g^2) as a 0-d float64 array on g's device (inf or nan if g is not finite).

    Small gradients, float16 and float64 ones, and every gradient on the GPU are summed in
    float64 (a float32 square is exact in float64).  A large float32 gradient on the CPU is
    cut into rows of 1024 values, each row's squares summed by one float32 BLAS dot, and the
    row sums added in float64: NumPy has no fast float32 -> float64 cast (0.7 ns a value,
    ten times the dot itself), and this sum runs over every parameter at every step.  A
    row's float32 sum is off by at most 1024 * 2^-24 = 6e-5 of itself, in practice ~1e-8
    (PyTorch's ``clip_grad_norm_`` sums a whole float32 tensor in float32).  A non-finite
    total (an inf or NaN in g, or a float32 square above 3.4e38) is recomputed in float64,
    so the norm of a finite float32 gradient is never reported as inf.

    Squares of float64 values above 1e154 overflow to inf; callers that read the sum as a
    finiteness check look at such gradients element by element, so the warning is muted.
    """
    if unscale_cuda.applies(g):
        return unscale_cuda.sum_of_squares(g)  # a reduction kernel: no float64 copy on the GPU
    flat = g.ravel()
    xp = get_array_module(g)
    with np.errstate(over="ignore", invalid="ignore"):
        if xp is not np or flat.size <= _CHUNK:
            wide = flat.astype(np.float64)
            return xp.dot(wide, wide)
        if flat.dtype == np.float32:
            whole = flat.size - flat.size % _ROW
            rows, tail = flat[:whole].reshape(-1, _ROW), flat[whole:].astype(np.float64)
            total = np.vecdot(rows, rows).sum(dtype=np.float64) + np.dot(tail, tail)
            if np.isfinite(total):
                return total
        # Otherwise in float64, a cache-sized piece at a time: a float64 copy of a whole
        # weight gradient would be a fresh allocation of 8 bytes per element (page faults).
        total = np.zeros((), np.float64)
        for start in range(0, flat.size, _CHUNK):
            piece = flat[start : start + _CHUNK].astype(np.float64)
            total += np.dot(piece, piece)
        return total


def _to_host(flags: list[Any], squares: list[Any]) -> tuple[list[bool], float]:
    """Bring per-parameter finiteness flags and sums of squares to the host: one copy per device."""
    host = backend.host_floats(flags + squares)
    return [v == 1.0 for v in host[: len(flags)]], math.fsum(host[len(flags) :])
