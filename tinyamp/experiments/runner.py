"""Train one task in one regime, measuring as it goes; or in every regime, for the demo.

The loop is the one in README's "Mixed precision, in the open", plus measurements:

* every step: the loss, the loss scale, whether the step was skipped;
* every ``measure_every`` steps (and the last): the share of updates lost in 16 bits,
  and the share of the true (FP32) gradient that FP16 would flush to zero at the
  regime's loss scale (see ``tinyamp.experiments.measure``).  Those steps are not timed;
* at the first step: the bytes the graph keeps for backward;
* at the end: the task's scores, and a histogram of log2|gradient|.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from tinyamp.amp import MasterWeights
from tinyamp.experiments import history as run_history
from tinyamp.experiments import measure
from tinyamp.experiments.regimes import REGIMES, Setup, bfloat16_available, build
from tinyamp.experiments.results import RegimeResult
from tinyamp.inspect import find_overflow, peak_memory, saved_tensors, training_memory
from tinyamp.nn.module import Module

LATE = 0.1  # "late in training": the last 10% of the steps


def set_lr(setup: Setup, lr: float) -> None:
    """Change the learning rate of the optimizer (inside MasterWeights, if any)."""
    opt = setup.optimizer.optimizer if isinstance(setup.optimizer, MasterWeights) else setup.optimizer
    opt.lr = lr


def load_widened(reference: Module, model: Module) -> Module:
    """Load `model`'s weights, widened exactly to float32, into the float32 model `reference`."""
    reference.load_state_dict({k: v.astype(np.float32) for k, v in model.state_dict().items()})
    return reference


def demo_regimes(device: str = "cpu") -> list[str]:
    """The regimes the demo compares: the 16-bit ones, bf16 and bf16-mixed when ml_dtypes is installed and
    the device is the CPU (tinyamp's GPU code is FP16 only), and fp8 (delayed scaling) on the CPU."""

    def shown(name: str) -> bool:
        if REGIMES[name].weights == "bfloat16":
            return bfloat16_available() and device == "cpu"
        return REGIMES[name].fp8 is None or (name == "fp8" and device == "cpu")  # one FP8 row: the others are alike

    return [name for name in REGIMES if shown(name)]


def run_regime(
    task: Any,
    regime: str,
    steps: int,
    scaler: str | None = None,
    measure_every: int = 10,
    progress: Callable[..., Any] | None = None,
    setup: Setup | None = None,
    start: int = 0,
    memory: bool = False,
    after_step: Callable[[int], None] | None = None,
    on_loss: Callable[[int, float, bool], None] | None = None,
    history: dict[str, Any] | None = None,
) -> tuple[RegimeResult, Setup]:
    """Train `task` in `regime` for `steps` steps (from step `start` of a resumed `setup`).

    `progress`, when given, is a tqdm-like class: ``progress(total=..., desc=...)``.
    Returns the result and the Setup (whose model, optimizer and scaler a checkpoint saves).
    With `memory`, the last step runs under ``peak_memory`` and the bytes held after it are
    itemized (``result.memory``).  ``after_step(done)``, when given, runs after every step
    with the number of steps done: the place to save a checkpoint, or to stop (by raising).
    ``on_loss(done, loss, skipped)``, when given, runs before it with the step's loss and whether
    the step was skipped (the place to keep the last good state of a run that may diverge).
    A FloatingPointError from the step (the loss scale underflowed to 0) ends the loop: the
    result covers the steps done, and ``result.stopped`` holds the error's sentence.
    Steps are measured when ``step % measure_every == 0`` (and the last), counted from the
    start of the run, not of this call: a resumed run measures the steps an uninterrupted one would.
    `history` (``experiments.history``: the series of the steps before `start`, from a
    checkpoint) is appended to in place, so that the result covers the whole run.
    """
    spec = REGIMES[regime]
    if setup is None:
        setup = build(spec, task.make_model(), task.make_optimizer, scaler)
    reference = copy.deepcopy(setup.model).float()  # for the true (FP32) gradients; reloaded when measuring
    fmt = spec.low_precision or "float16"  # FP32's row shows nothing; the census still runs on it for the figure
    history = run_history.new(start) if history is None else history
    series: dict[str, list[Any]] = history["series"]  # per step, from the run's first step
    measured: dict[str, list[Any]] = history["measured"]
    first = history["first_step"]
    saved = None
    step_seconds: list[float] = []  # the timed steps' wall times
    grads, scale = np.zeros(0), 1.0
    peak: int | None = None
    began = time.perf_counter()
    bar = progress(total=steps, initial=start, desc=f"{task.name} {regime}") if progress else None
    batches = task.batches(start=start)
    stopped = None
    first_overflow: dict[str, Any] = {}
    try:
        for step in range(start, steps):
            batch = next(batches)
            lr = task.lr_at(step, steps)
            set_lr(setup, lr)
            is_measured = step % measure_every == 0 or step == steps - 1
            if is_measured:
                grads = measure.fp32_gradients(load_widened(reference, setup.model), lambda m, b=batch: task.loss(m, b))
                scale = setup.scaler.scale  # the scale this step's loss is multiplied by
            inspect = None
            if saved is None:

                def inspect(loss: Any) -> None:
                    nonlocal saved
                    saved = saved_tensors(loss)

            t0 = time.perf_counter()
            try:
                if memory and step == steps - 1:  # the last step, measured for real (tracemalloc / CuPy pool)
                    (loss, report, counts), peak = peak_memory(
                        lambda b=batch, i=inspect, m=is_measured: setup.step(
                            lambda mod, bb=b: task.loss(mod, bb), measure_lost=m, inspect=i
                        ),
                        device=task.device,
                    )
                else:
                    loss, report, counts = setup.step(
                        lambda m, b=batch: task.loss(m, b), measure_lost=is_measured, inspect=inspect
                    )
            except FloatingPointError as exc:  # the scaler found that no later step can succeed
                stopped = str(exc)
                break
            if report.skipped and not first_overflow and setup.fp8 is None:  # (FP8's replay would move its scales)
                where = locate_overflow(setup, lambda m, b=batch: task.loss(m, b), report.scale_before)
                first_overflow = {"step": step, "scale": report.scale_before, "where": where}
            if not is_measured and inspect is None and peak is None:
                step_seconds.append(time.perf_counter() - t0)
            series["loss"].append(loss)
            series["scale"].append(report.scale_before)
            series["skipped"].append(report.skipped)
            series["lr"].append(lr)
            if is_measured:
                measured["step"].append(step)
                measured["changed"].append(None if counts is None else counts[0])
                measured["lost"].append(None if counts is None else counts[1])
                measured["underflow_fraction"].append(measure.underflow_fraction(grads, scale, fmt))
                measured["underflow_norm_fraction"].append(measure.underflow_norm_fraction(grads, scale, fmt))
            if bar is not None:
                bar.update(1)
                if step % 10 == 0 or step == steps - 1:
                    bar.set_postfix(loss=f"{loss:.4f}", scale=f"{setup.scaler.scale:g}", refresh=False)
            if on_loss is not None:
                on_loss(step + 1, loss, report.skipped)
            if after_step is not None:
                after_step(step + 1)
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - began
    held = training_memory(setup.model, setup.optimizer) if memory else {}
    metrics = task.evaluate(setup.model, setup.autocast)
    late = max(first, steps - max(1, int(round(LATE * (steps - first)))))
    result = RegimeResult(
        regime=regime,
        task=task.name,
        scaler=scaler or spec.scaler,
        steps=steps,
        metrics=metrics,
        skipped_steps=int(sum(series["skipped"])),
        final_scale=setup.scaler.scale,
        underflow_fraction=None if spec.low_precision is None else _late_mean(measured, "underflow_fraction", late),
        underflow_norm_fraction=None
        if spec.low_precision is None
        else _late_mean(measured, "underflow_norm_fraction", late),
        lost_update_fraction=None if spec.weights == "float32" else _pooled_lost(measured),
        saved_bytes=0 if saved is None else saved.total_bytes,
        saved_bytes_by_kind={} if saved is None else saved.bytes_by_kind(),
        # the median and the 10th and 90th percentiles: a mean would let a few steps slowed by
        # another process on the machine stand for all of them
        ms_per_step=1e3 * float(np.median(step_seconds)) if step_seconds else float("nan"),
        ms_per_step_spread=[1e3 * float(q) for q in np.percentile(step_seconds, [10, 90])] if step_seconds else [],
        seconds=seconds,
        series=series,
        measured=measured,
        histogram={
            "log2_bins": measure.LOG2_BINS.tolist(),
            "scale": scale,  # the scale of the last step, the one these gradients were measured at
            "unscaled": measure.log2_histogram(grads),
            "scaled": measure.log2_histogram(grads, scale),
            "zeros": int(np.count_nonzero(grads == 0)),
        },
        memory={"held_bytes": held, "peak_step_bytes": peak} if memory else {},
        stopped=stopped,
        first_step=first,
        resumed_at=list(history["resumed_at"]),
        fp8={} if setup.fp8 is None else setup.fp8.summary(),
        first_overflow=first_overflow,
    )
    return result, setup


def locate_overflow(setup: Setup, loss_fn: Callable[[Module], Any], scale: float) -> str:
    """Where a skipped step's gradients first became inf or NaN: the step replayed under ``find_overflow``.

    A skipped step changed no weight, so the same batch at the same loss scale gives the same
    values again; the first non-finite one names the op, its module and the direction.  (Finite
    FP32 values above 65504, such as the scaled loss itself, are not overflows: they are passed over.)
    """
    setup.optimizer.zero_grad()
    with find_overflow(setup.model, dtype=setup.regime.low_precision or "float16") as found:
        with setup.autocast():
            loss = loss_fn(setup.model)
        with np.errstate(all="ignore"):
            (loss.float() * scale).backward()
    setup.optimizer.zero_grad()
    event = next((e for e in found.events if not np.isfinite(e.value)), None)
    return "no value became inf or NaN on the replay" if event is None else str(event)


def _late_mean(measured: dict[str, list[Any]], key: str, late: int) -> float:
    values = [v for s, v in zip(measured["step"], measured[key]) if s >= late and np.isfinite(v)]
    return float(np.mean(values)) if values else float("nan")


def _pooled_lost(measured: dict[str, list[Any]]) -> float:
    """Lost updates pooled over all measured steps: total lost / total changed elements."""
    changed = sum(c for c in measured["changed"] if c)
    lost = sum(n for c, n in zip(measured["changed"], measured["lost"]) if c)
    return lost / changed if changed else float("nan")


def run_all(
    task: Any,
    regimes: Iterable[str],
    steps: int,
    measure_every: int = 10,
    progress: Callable[..., Any] | None = None,
    memory: bool = False,
) -> list[RegimeResult]:
    """`task` trained in each of `regimes` from the same seed on the same batches."""
    return [
        run_regime(task, r, steps, measure_every=measure_every, progress=progress, memory=memory)[0] for r in regimes
    ]
