"""The ``tinyamp`` command (also ``python -m tinyamp``).

    tinyamp demo                 the digits MLP in FP32, naive FP16 and mixed precision, side by side,
                                 then a char-level transformer in FP32 and mixed (under a minute on a CPU)
    tinyamp train [options]      one model in one precision; --out DIR writes results.json, figures
                                 and a checkpoint that --resume continues from
    tinyamp info                 versions, backends, GPU, the FP16/BF16/FP32 formats, the autocast
                                 op policy and the loss-scaler presets
    tinyamp exercises init DIR   a workspace of exercises to implement; `exercises check DIR` grades it,
                                 each exercise in its own process; `exercises list` names them

Exit status: 0 done; 2 bad input, with a message that says what to type instead; 3 the
run diverged (the message says when and why; `train --out` keeps its results, marked
diverged, and the checkpoint of its last good step); 74 standard output could not be
written (closed or full: the run's files were written, and stderr says where; `info` and
`exercises` say so too, and `exercises check` keeps 1 when an exercise failed); 130/143/129
stopped by Ctrl-C/SIGTERM/SIGHUP (a closed terminal; under nohup SIGHUP stays ignored), after
`train --out` saved a checkpoint at the end of the current step.  An output folder is
replaced as a unit (experiments/output_folder.py): a failed run leaves it as it was, and a
second run on it is refused while the first runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from tinyamp.engine.fast.allocator import keep_freed_memory
from tinyamp.exercises import command as exercises_command
from tinyamp.experiments import exit_status, resume, run_settings
from tinyamp.experiments import history as run_history
from tinyamp.experiments.blas_threads import one_blas_thread
from tinyamp.experiments.interrupts import Interrupted, Stop, handle_signals
from tinyamp.experiments.run_settings import MODELS, PRECISIONS, SCALERS, SCHEDULES
from tinyamp.experiments.training_run import TrainingRun, kept, progress_bar, write_outputs
from tinyamp.extras import install_hint

DEVICES = ("cpu", "cuda")
DEFAULT_TIMEOUT_S = 300.0  # = tinyamp.distributed.communicator.DEFAULT_TIMEOUT_S (tests/test_runs_that_end_well.py)
DEFAULT_TRAIN_STEPS = 1500
DEFAULT_CHECKPOINT_EVERY = run_settings.DEFAULT_CHECKPOINT_EVERY  # steps; on N ranks too
# The demo's sizes: under a minute on two CPU cores, with or without numba (README, "The demo").
DEMO_MLP_STEPS = 1500
DEMO_MEASURE_EVERY = 25  # MLP steps between measurements (lost updates, underflow): 61 of the 1500 steps
DEMO_TRANSFORMER_STEPS = 100
TRANSFORMER_TOLERANCE = 0.05  # nats: how close mixed precision's validation loss must come to FP32's


_LOCKED: list[Any] = []  # the output folders this command holds (OutputFolder.lock), let go when main() returns
_WRITTEN: list[Path] = []  # the output folders this command has written into


class UsageError(Exception):
    """Bad input found after parsing: printed as ``tinyamp: error: ...``, exit status 2."""


# ---- tinyamp info --------------------------------------------------------------------------------
def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except ImportError:
        return "not installed"


def info() -> int:
    """Print versions, backends, the GPU, the number formats, the op policy and the scaler presets."""
    import tinyamp
    from tinyamp import backend
    from tinyamp.amp import format_policy, formats, presets_table
    from tinyamp.inspect.memory import step_peak_bytes

    print(f"tinyamp     {tinyamp.__version__}")
    print(f"python      {platform.python_version()} ({platform.machine()})")
    print(f"numpy       {np.__version__}   (backend for device='cpu')")
    from tinyamp.engine.fast import casts

    if tinyamp.ENGINE_ROOM == "off":
        print("engine room off (TINYAMP_ENGINE_ROOM=off): the reference kernels of tinyamp/kernels.py run alone")
    elif casts.active_kernels() == "numba":
        print(f"numba       {_version('numba')}   (FP16<->FP32 casts as compiled loops)")
    else:
        why = casts.why_not_compiled()
        print(f"numba       not in use: {why} (casts run as NumPy passes; benchmarks/cast_speed.py times both)")
    ml_dtypes = _version("ml_dtypes")
    missing = ": pip install ml_dtypes, a dependency of tinyamp" if ml_dtypes == "not installed" else ""
    print(f"ml_dtypes   {ml_dtypes}   (bfloat16 and float8 on NumPy{missing})")
    print(f"tqdm        {_version('tqdm')}   (progress bars)")
    matplotlib = _version("matplotlib")
    hint = f": {install_hint('plots')}" if matplotlib == "not installed" else ""
    print(f"matplotlib  {matplotlib}   (figures{hint})")
    try:
        import cupy

        print(f"cupy        {cupy.__version__}   (backend for device='cuda')")
    except ImportError:
        print(f"cupy        not installed ({install_hint('cuda12')} for an NVIDIA GPU)")
    if backend.cuda_is_available():
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        print(f"gpu         {props['name'].decode()} ({props['totalGlobalMem'] / 2**30:.0f} GiB)")
        free, total = cupy.cuda.runtime.memGetInfo()
        print(f"gpu memory  {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB")
    else:
        print("gpu         none found: device='cuda' is unavailable, tinyamp runs on the CPU")
    print("\nPeak bytes of one training step, MLP 784-1024-1024-10, batch 256 (measured now)")
    for device in ["cpu"] + (["cuda"] if backend.cuda_is_available() else []):
        peaks = step_peak_bytes(device)
        ratio = peaks["mixed"] / peaks["fp32"] if peaks["fp32"] else float("nan")
        print(
            f"{device:<5} FP32 {peaks['fp32'] / 2**20:7.2f} MiB   mixed precision {peaks['mixed'] / 2**20:7.2f} MiB"
            f"   ({ratio:.2f}x)"
        )
    print("\nFloating-point formats (tinyamp.amp.formats.format_table())")
    print(formats.format_table())
    from tinyamp.fp8 import tables as fp8_tables

    print("\nFP8 and FP4 beside FP16, cast with saturation (tinyamp.fp8.tables.limits_table())")
    print(fp8_tables.limits_table())
    print("\nautocast op policy (tinyamp.amp.format_policy())")
    print(format_policy())
    print("\nLoss-scaler presets (tinyamp.amp.presets_table())")
    print(presets_table())
    return 0


# ---- shared pieces ------------------------------------------------------------------------------------
def _check_device(device: str) -> None:
    from tinyamp.backend import DeviceError, array_module, check_device

    try:
        check_device(device)
        if device != "cpu":
            array_module(device)
    except DeviceError as exc:
        raise UsageError(str(exc)) from exc


def _check_precision(precision: str, device: str) -> None:
    from tinyamp.experiments.regimes import REGIMES, bfloat16_available

    if REGIMES[precision].fp8 is not None and device != "cpu":
        raise UsageError(
            f"--precision {precision} runs on the CPU only: FP8 is emulated on NumPy (CuPy has no 8-bit float). "
            "Use --device cpu, or --precision mixed (FP16) with --device cuda."
        )
    if REGIMES[precision].weights == "bfloat16":
        if device != "cpu":
            raise UsageError(
                f"--precision {precision} runs on the CPU only: tinyamp's GPU code is written for float16. "
                "Use --precision mixed (FP16) with --device cuda."
            )
        if not bfloat16_available():
            raise UsageError(f"--precision {precision} needs the optional package ml_dtypes: pip install ml_dtypes")


def _write_outputs(out: Any, document: dict[str, Any], manifest: dict[str, Any]) -> list[str]:
    """results.json and the figures (when matplotlib is installed): the new content of `out`."""
    written = write_outputs(out, document, manifest, hint=install_hint("plots"))
    _WRITTEN[:] = [out.path]
    return written


# ---- tinyamp demo --------------------------------------------------------------------------------
def demo(args: argparse.Namespace, stop: Stop) -> int:
    """Train the digits MLP in every regime and the transformer in FP32 and mixed; print the tables."""
    from tinyamp.experiments.diagnosis import overflows
    from tinyamp.experiments.divergence import diverged
    from tinyamp.experiments.regimes import REGIMES
    from tinyamp.experiments.results import footnotes, format_table, results_document
    from tinyamp.experiments.runner import demo_regimes, run_all
    from tinyamp.experiments.tasks import KERAS_SGD_DEFAULTS, CharTransformer, DigitsMLP

    if not 0 <= args.transformer_steps <= run_settings.MAX_STEPS:  # --steps' bound: a run that ends
        raise UsageError(f"--transformer-steps must be 0 (skip the transformer) or a whole number up to "
                         f"{run_settings.MAX_STEPS:,}; got {args.transformer_steps}")  # fmt: skip
    _check_settings(args, "steps", "seed")  # the rules `train` and its checkpoints use
    _check_device(args.device)
    out = _output_folder(args.out)
    progress = progress_bar(not args.quiet)
    began = time.perf_counter()
    regimes = demo_regimes(args.device)
    mlp = DigitsMLP(seed=args.seed, device=args.device, **KERAS_SGD_DEFAULTS)
    print(
        f"Digits MLP 64-{'-'.join(map(str, mlp.hidden))}-10, {args.steps} steps of plain SGD with Keras's defaults "
        f"(lr {mlp.lr}, no momentum, no schedule, batch {mlp.batch_size}), seed {args.seed}; same initial weights "
        "and batches in every regime:"
    )
    for name in regimes:
        print(f"  {name:<12} {REGIMES[name].summary}")
    if "bf16-mixed" not in regimes:
        why = "tinyamp's GPU code is FP16 only" if args.device != "cpu" else "ml_dtypes is not installed"
        fix = "" if args.device != "cpu" else ": pip install ml_dtypes, a dependency of tinyamp"
        print(f"  (no bf16 or bf16-mixed rows: {why}{fix})")
    if "fp8" not in regimes:
        print("  (no fp8 row: FP8 is emulated on NumPy, on the CPU only; tinyamp demo --device cpu shows it)")
    with np.errstate(all="ignore"):  # an overflow is a skipped step in the table, not a NumPy warning
        mlp_results = run_all(
            mlp, regimes, args.steps, measure_every=DEMO_MEASURE_EVERY, progress=progress, memory=True
        )
    print()
    print(format_table(mlp_results))
    print(footnotes())
    for r in mlp_results:
        if diverged(r):
            print(f"{r.regime}: DIVERGED: its loss ended {r.series['loss'][-1]}, {r.skipped_steps} steps skipped")
    print()
    print(_mlp_verdict(mlp_results))
    for r in mlp_results:
        for line in _fp8_lines(r):
            print(line)
    print()
    print(_memory_table(mlp_results, args.device))
    document = results_document({"mlp": (mlp, mlp_results)}, {"command": "demo", "seed": args.seed})
    if args.transformer_steps:
        chars = CharTransformer(seed=args.seed, device=args.device)
        print(
            f"\nChar transformer ({chars.layers} layers, dim {chars.dim}, context {chars.block_size}) on Python "
            f"source, {args.transformer_steps} steps of Adam (lr {chars.lr}, cosine), batch {chars.batch_size}:"
        )
        with np.errstate(all="ignore"):
            tr_results = run_all(chars, ["fp32", "mixed"], args.transformer_steps, measure_every=25, progress=progress)
        print()
        print(format_table(tr_results))
        for r in tr_results:
            if (overflow := overflows(r.to_json())) is not None:
                print(f"{r.regime}: {overflow}")
        fp32, mixed = (r.metrics["val_loss"] for r in tr_results)
        verdict = "within" if abs(mixed - fp32) <= TRANSFORMER_TOLERANCE else "NOT within"
        print(
            f"\nmixed precision's validation loss {mixed:.4f} is {verdict} {TRANSFORMER_TOLERANCE} nats of FP32's "
            f"{fp32:.4f}."
        )
        document = results_document(
            {"mlp": (mlp, mlp_results), "transformer": (chars, tr_results)}, {"command": "demo", "seed": args.seed}
        )
    document["config"]["seconds"] = time.perf_counter() - began
    if out is not None:
        with stop.at_step_boundaries():  # a signal now waits until the folder is written
            written = _write_outputs(out, document, {"command": "demo", "seed": args.seed})
        print(f"\nwrote {', '.join(written)} to {out.path}")
        stop.check()
    print(f"\ndemo took {time.perf_counter() - began:.0f} s")
    return 0


def _memory_table(results: list[Any], device: str = "cpu") -> str:
    """Bytes held after training (weights, FP32 masters, moments, gradients) and the measured peak of a step."""
    lines = [f"{'memory':<14}{'weights':>12}{'masters':>12}{'moments':>12}{'gradients':>12}{'peak of a step':>16}"]
    for r in results:
        held = r.memory["held_bytes"]

        def total(role: str, held: dict[str, dict[str, int]] = held) -> str:
            n = sum(held.get(role, {}).values())
            return f"{n / 1024:.0f} KiB" if n else "-"  # one unit for the whole column, so that rows compare

        peak = f"{r.memory['peak_step_bytes'] / 1024:.0f} KiB"
        lines.append(
            f"{r.regime:<14}{total('parameters'):>12}{total('master weights'):>12}{total('optimizer state'):>12}"
            f"{total('gradients'):>12}{peak:>16}"
        )
    if device == "cpu":
        lines.append(
            "* held after the last step; peak: bytes allocated during the last step, measured (tracemalloc). On a CPU\n"
            "  the emulated FP16 products widen their operands to FP32 for the duration of each product, and the FP32\n"
            "  masters need FP32 gradients, so a small model's step can peak above FP32's: the saving is in what the\n"
            "  graph keeps (see saved) and grows with depth and batch (benchmarks, 'Peak step memory against depth')."
        )
        if any(r.fp8 for r in results):
            lines.append(
                "  fp8 keeps one byte a value of x and W for backward, but its emulated products decode them to\n"
                "  FP32, and its weights are FP32 (they are the masters): the peak is the emulation's, not a GPU's."
            )
    else:
        lines.append(
            "* held after the last step; peak: bytes allocated during the last step, measured on the GPU (a CuPy\n"
            "  memory hook on its pool). cuBLAS reads the FP16 operands directly, so no FP32 copies are made."
        )
    return "\n".join(lines)


def _mlp_verdict(results: list[Any]) -> str:
    """The reading of the MLP table, computed from it: each regime against FP32, why, and its repair's run."""
    from tinyamp.experiments.diagnosis import FAILED_LOSS_RATIO, FAILED_POINTS, MATCH_POINTS, diagnose

    verdicts = diagnose({r.regime: r.to_json() for r in results})
    lines = [
        f"Against FP32 (failed: a training loss {FAILED_LOSS_RATIO:g}x FP32's or more, or a test accuracy "
        f"{FAILED_POINTS:g} points below or more; matches: within {MATCH_POINTS:g} point):"
    ]
    for v in verdicts.values():
        lines.extend(v.lines())
    return "\n".join(lines)


def _fp8_lines(result: Any) -> list[str]:
    """Under a table with an FP8 regime: what its casts saturated and flushed, and each cast that met an inf or NaN."""
    from tinyamp.experiments import fp8_report

    if not result.fp8:
        return []
    return [fp8_report.sentence(result.fp8), *fp8_report.nonfinite_lines(result)]


# ---- tinyamp train -------------------------------------------------------------------------------
def _check_settings(args: argparse.Namespace, *names: str) -> None:
    """The command line's values, checked by the rules a checkpoint's stored settings obey too."""
    for name in names:
        value = getattr(args, name, None)
        why = None if value is None else run_settings.problem(name, value)
        if why is not None:
            raise UsageError(f"--{name.replace('_', '-')} {why}")


def _read_resume(args: argparse.Namespace) -> dict[str, Any]:
    """The settings saved in a --resume checkpoint, each checked, and checked against the command line."""
    try:
        saved, args.history, extra = resume.read_resume(args.resume, {key: getattr(args, key) for key in resume.KEPT})
    except resume.ResumeError as exc:
        raise UsageError(str(exc)) from exc
    args.fp8_state = extra.get("fp8")
    _refuse_a_data_parallel_checkpoint(args, extra.get("distributed"))
    for key in resume.KEPT:
        setattr(args, key, saved[key])
    return saved


def _refuse_a_data_parallel_checkpoint(args: argparse.Namespace, saved: Any) -> None:
    """A checkpoint of N ranks (or of micro-batches) resumed here would go on with other sums: refuse it.

    The file holds the whole run's state, but its run summed each batch's gradient as N slices
    in rank order (distributed/allreduce.py); this process sums the whole batch at once, so
    from the first step after the resume the bits part, and a run that says it "ends bit for
    bit as if never stopped" would not.  One process with the same slices continues it exactly.
    """
    if not isinstance(saved, dict):
        return
    ranks, micro = saved.get("ranks"), saved.get("micro_batches", 1)
    if not (isinstance(ranks, int) and isinstance(micro, int)) or ranks * micro <= 1:
        return
    flags = " --zero" * (saved.get("zero") is True)
    reduce = saved.get("reduce_dtype")
    flags += f" --reduce-dtype {reduce}" if reduce in ("float16", "float16-predivide") else ""
    flags += " --no-agree" * (saved.get("agree") is False)
    out = args.out or "DIR"
    what = f"{ranks} rank{'s' * (ranks > 1)}" + (f" x {micro} micro-batches" if micro > 1 else "")
    micro_flag = f" --micro-batches {micro}" if micro > 1 else ""
    raise UsageError(
        f"--resume {args.resume} was saved by a data-parallel run on {what}{' with ZeRO' * (saved.get('zero') is True)}"
        ": one process sums each batch's gradient in another order and would not continue it bit for bit; resume it "
        f"with  mpiexec -n {ranks} python -m tinyamp.distributed --resume {args.resume} --out {out}{flags}{micro_flag}"
        f"  (or in one process, without mpiexec and with --micro-batches {ranks * micro})"
    )


def _plan_resume(args: argparse.Namespace, saved: dict[str, Any], task: Any) -> str | None:
    """Check --steps and --extend against where the saved run stands; return a note for an extension."""
    try:
        args.steps, note = run_settings.plan_resume(saved, args.steps, args.extend, task)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return note


def _check_batch_size(task: Any) -> None:
    """A batch is drawn from the training split: it cannot hold more examples than the split has."""
    if task.name == "mlp":
        available, what = len(task.data["y_train"]), "training images"
    elif task.name == "wordlm":
        available, what = len(task.dataset.train) - task.context, f"training runs of {task.context} tokens"
    else:
        available, what = len(task.dataset.train) - task.block_size, f"training windows of {task.block_size} chars"
    if task.batch_size > available:
        raise UsageError(f"--batch-size {task.batch_size} is more than the {available:,} {what}; pass at most that")


def _recover_folders(resume: str | None) -> None:
    """Put back the folder --resume reads from, when a run killed in the middle of its swap moved it aside."""
    from tinyamp.experiments.output_folder import OutputFolder

    if resume is not None and resume.strip():
        folder = Path(os.path.abspath(resume)).parent
        for sentence in OutputFolder(folder).recover():
            print(f"tinyamp: {folder}: {sentence}", file=sys.stderr)


def _output_folder(path: str | None, flag: str = "--out") -> Any:
    """The OutputFolder for --out, cleaned of a killed run's leftovers and checked before training."""
    from tinyamp.experiments.output_folder import OutputFolder

    if path is None:
        return None
    if not path.strip():
        raise UsageError(f"{flag} needs a folder name, e.g. {flag} runs/mlp")
    out = OutputFolder(path, flag)
    out.lock()  # until main() returns: a second run on this folder is refused, naming this process
    _LOCKED.append(out)
    for sentence in out.recover():
        print(f"tinyamp: {out.path}: {sentence}", file=sys.stderr)
    previous = out.check()
    if previous is not None:
        step = f", step {previous['step']} of {previous['total_steps']}" if "total_steps" in previous else ""
        print(f"{out.path} holds an earlier `tinyamp {previous.get('command')}` run{step}; this run replaces it")
    return out


def train(args: argparse.Namespace, stop: Stop) -> int:
    """Train one model in one precision; print the result; with --out write results, figures, a checkpoint."""
    from tinyamp.amp import CheckpointError, load_checkpoint
    from tinyamp.experiments.divergence import diverged, explain
    from tinyamp.experiments.regimes import REGIMES, build
    from tinyamp.experiments.results import footnotes, format_table
    from tinyamp.experiments.tasks import TASKS

    _check_settings(args, "steps", "batch_size", "lr", "seed", "checkpoint_every")
    if args.resume is not None and not args.resume.strip():
        raise UsageError("--resume needs the path of a checkpoint, e.g. --resume runs/mlp/checkpoint.npz")
    if args.extend and args.resume is None:
        raise UsageError("--extend continues a saved run to more steps; it needs --resume CHECKPOINT")
    if args.checkpoint_every is not None and args.out is None:
        raise UsageError("--checkpoint-every writes into the output folder; it needs --out DIR")
    _check_device(args.device)
    out = _output_folder(args.out)  # locked, and a killed run's leftovers put back or removed
    _recover_folders(args.resume)  # a run killed mid-swap may have moved the checkpoint aside
    saved = _read_resume(args) if args.resume is not None else None
    args.model = args.model or "mlp"
    args.precision = args.precision or "mixed"
    args.seed = 0 if args.seed is None else args.seed
    _check_precision(args.precision, args.device)
    overrides = {k: getattr(args, k) for k in ("batch_size", "lr", "schedule") if getattr(args, k) is not None}
    task = TASKS[args.model](seed=args.seed, device=args.device, **overrides)
    _check_batch_size(task)
    extension = _plan_resume(args, saved, task) if saved is not None else None
    args.steps = args.steps or DEFAULT_TRAIN_STEPS
    regime = REGIMES[args.precision]
    scaler = args.scaler or regime.scaler
    setup = build(regime, task.make_model(), task.make_optimizer, scaler)
    start = 0
    if saved is not None:
        try:
            room = _extra_bytes(setup, args)
            load_checkpoint(args.resume, setup.model, setup.optimizer, setup.scaler, extra_bytes=room)
        except CheckpointError as exc:
            raise UsageError(f"--resume: {exc}") from exc
        _load_fp8_state(setup, args)
        start = saved["step"]
    if not args.quiet:
        resumed = f", resumed at step {start}" if start else ""
        print(
            f"{task.name} in {args.precision} ({regime.summary}), loss scaler {scaler}: {args.steps} steps, "
            f"batch {task.batch_size}, lr {task.lr} ({task.schedule}), seed {args.seed}, {args.device}{resumed}"
        )
    if extension is not None:
        print(extension)
    settings = {
        "model": args.model, "precision": args.precision, "scaler": scaler, "batch_size": task.batch_size,
        "lr": task.lr, "seed": args.seed, "schedule": task.schedule, "total_steps": args.steps,
    }  # fmt: skip

    history = getattr(args, "history", None) or run_history.new(start)  # the steps before `start`, if saved
    every = DEFAULT_CHECKPOINT_EVERY if args.checkpoint_every is None else args.checkpoint_every
    fp8 = setup.fp8
    run = TrainingRun(
        task, setup, stop, settings, start=start, history=history, out=out, every=every,
        capture=lambda: (setup.model.state_dict(), setup.optimizer.state_dict(), fp8 and fp8.capture()),
        put_back=lambda state: (setup.model.load_state_dict(state[0]), setup.optimizer.load_state_dict(state[1]),
                                fp8 and fp8.restore(state[2])),
    )  # fmt: skip
    run.written = _WRITTEN
    with stop.at_step_boundaries(), np.errstate(all="ignore"):  # overflow is reported in words, below
        try:
            result = run.train(args.precision, scaler, progress=progress_bar(not args.quiet), memory=args.memory)
        except Interrupted as exc:
            return run.stopped(exc)
        print(format_table([result]))
        if result.resumed_at:
            print(_resumed_note(result))
        if args.memory:
            from tinyamp.inspect import format_training_memory

            print(f"\nmemory held after the last step ({args.device}):")
            print(format_training_memory(result.memory["held_bytes"]))
            print(f"peak allocated during the last step: {result.memory['peak_step_bytes']:,} bytes (measured)")
        for line in _fp8_lines(result):
            print(line)
        if not args.quiet:
            print(footnotes())
        failed = explain(task, setup, result, start) if diverged(result) else None
        return run.finish(result, failed, *run.end_state(failed), hint=install_hint("plots"))


def _extra_bytes(setup: Any, args: argparse.Namespace) -> int:
    """What load_checkpoint may read besides the model's state: the default, and an FP8 run's casts of every step."""
    from tinyamp.amp.training_state import DEFAULT_EXTRA_BYTES

    if setup.fp8 is None:
        return DEFAULT_EXTRA_BYTES
    from tinyamp.fp8.training_state import extra_bytes
    from tinyamp.nn import Linear

    layers = sum(isinstance(m, Linear) for m in setup.model.modules())
    return DEFAULT_EXTRA_BYTES + extra_bytes(6 * layers, args.steps)  # at most six tensors cast per layer (MXFP8)


def _load_fp8_state(setup: Any, args: argparse.Namespace) -> None:
    """Give a resumed FP8 run the scales, amax histories and casts its checkpoint saved (refuse a mismatch)."""
    state = getattr(args, "fp8_state", None)
    if setup.fp8 is None and state is not None:
        raise UsageError(f"--resume {args.resume}: the checkpoint holds FP8 scales, but its run is "
                         f"--precision {args.precision}; the file was edited or crafted")  # fmt: skip
    if setup.fp8 is None:
        return
    if state is None:
        raise UsageError(f"--resume {args.resume}: the checkpoint of a --precision {args.precision} run holds no "
                         "FP8 scales; the file was edited or cut")  # fmt: skip
    from tinyamp.fp8.training_state import load_extra

    try:
        load_extra(setup.fp8, state, args.resume, setup.model)
    except ValueError as exc:
        raise UsageError(f"--resume {exc}") from exc


def _resumed_note(result: Any) -> str:
    """Under the table of a resumed run: which steps it covers, and where the run was resumed."""
    at = ", ".join(map(str, result.resumed_at))
    end = result.first_step + len(result.series["loss"])
    if result.first_step:
        return (f"* steps {result.first_step} to {end} (resumed at step {at}; the checkpoint it resumed from held no "
                "history of the steps before)")  # fmt: skip
    return (
        f"* the whole run, steps 0 to {end}: resumed at step {at} from its checkpoint, which carried the steps before"
    )


# ---- the parser -----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``tinyamp`` command."""
    import tinyamp

    parser = argparse.ArgumentParser(prog="tinyamp", description="Mixed-precision training you can read.",
                                     epilog=exit_status.EXPLAINED)  # fmt: skip
    parser.add_argument("--version", action="version", version=f"tinyamp {tinyamp.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, backends, GPU, number formats, op policy, scaler presets")

    d = sub.add_parser("demo", help="FP32, naive FP16 and mixed precision side by side", epilog=exit_status.EXPLAINED)
    d.add_argument("--steps", type=int, default=DEMO_MLP_STEPS, help=f"MLP steps (default {DEMO_MLP_STEPS})")
    d.add_argument("--transformer-steps", type=int, default=DEMO_TRANSFORMER_STEPS,
                   help=f"char-transformer steps, 0 to skip it (default {DEMO_TRANSFORMER_STEPS})")  # fmt: skip
    d.add_argument("--seed", type=int, default=0, help="initial weights and batches (default 0); the same in "
                   "every regime")  # fmt: skip
    d.add_argument("--device", choices=DEVICES, default="cpu", help="cuda needs CuPy and an NVIDIA GPU (default cpu)")
    d.add_argument("--out", metavar="DIR", help="write results.json, PNG figures and tinyamp-run.json into DIR, "
                   "replacing what an earlier run wrote there")  # fmt: skip
    d.add_argument("--quiet", action="store_true", help="no progress bars")

    t = sub.add_parser("train", help="train one model in one precision", epilog=exit_status.EXPLAINED)
    t.add_argument("--model", choices=MODELS,
                   help="mlp (8x8 digits, default); transformer or wordlm (Python source: characters, words)")
    t.add_argument("--precision", choices=PRECISIONS, help="default mixed")
    t.add_argument(
        "--scaler",
        choices=SCALERS,
        help="loss-scaler preset (default: pytorch for mixed, off otherwise; static is a constant 2^10)",
    )
    t.add_argument("--steps", type=int, help=f"total training steps (default {DEFAULT_TRAIN_STEPS}; with --resume, "
                   "the saved run's total)")  # fmt: skip
    t.add_argument("--batch-size", type=int, help="default 128 (mlp), 32 (transformer)")
    t.add_argument("--lr", type=float, help="learning rate (default 0.05 SGD for mlp, 0.003 Adam for transformer)")
    t.add_argument("--schedule", choices=SCHEDULES, help="learning-rate schedule over --steps (default cosine)")
    t.add_argument("--seed", type=int, help="initial weights and batches (default 0)")
    t.add_argument("--device", choices=DEVICES, default="cpu", help="cuda needs CuPy and an NVIDIA GPU")
    t.add_argument("--out", metavar="DIR", help="write results.json, PNG figures and checkpoint.npz into DIR, "
                   "replacing what an earlier run wrote there")  # fmt: skip
    t.add_argument("--checkpoint-every", type=int, metavar="N",
                   help=f"with --out, save checkpoint.npz every N steps (default {DEFAULT_CHECKPOINT_EVERY}, 0: only "
                   "at the end); Ctrl-C, SIGTERM and SIGHUP save one too, at the end of the current step")  # fmt: skip
    t.add_argument("--resume", metavar="CHECKPOINT", help="continue a run from its checkpoint.npz: it ends bit for "
                   "bit as if never stopped")  # fmt: skip
    t.add_argument("--extend", action="store_true", help="with --resume and --steps: continue a run to a new "
                   "total (the schedule is recomputed, so the result differs from a straight run)")  # fmt: skip
    t.add_argument("--quiet", action="store_true", help="no progress bar, only the result table")
    t.add_argument("--distributed", action="store_true", help="data-parallel on the ranks `mpiexec -n N` starts "
                   "(MPI; NCCL with --device cuda); needs pip install -e '.[mpi]'")  # fmt: skip
    t.add_argument("--reduce-dtype", choices=("float32", "float16", "float16-predivide"), help="with --distributed: "
                   "the dtype gradients are summed in across ranks (default float32)")  # fmt: skip
    t.add_argument("--zero", action="store_true", help="with --distributed: ZeRO stage 1, the FP32 masters and "
                   "optimizer state sharded across ranks")  # fmt: skip
    t.add_argument("--timeout", type=float, metavar="SECONDS", help="with --distributed: how long a rank waits for "
                   f"the others in a collective before the job is stopped (default {DEFAULT_TIMEOUT_S:g})")  # fmt: skip
    t.add_argument(
        "--memory", action="store_true", help="itemize the bytes held (weights, masters, moments, gradients) "
        "and measure the peak bytes of the last step"
    )  # fmt: skip
    exercises_command.add_parser(sub)
    return parser


class _GuardedStdout:
    """sys.stdout while a command runs: a write that fails (stdout closed, full, a reader gone) is recorded,
    not raised, so that a run goes on to write its files and a grading to its verdict; main() reports it at
    the end."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.error: str | None = None if stream is not None else "it is closed"
        self.reader_gone = False  # the failure was a pipe whose reader stopped reading (`tinyamp info | head`)

    def _failed(self, exc: Exception) -> None:
        self.error = getattr(exc, "strerror", None) or str(exc)  # ValueError: a closed file object
        self.reader_gone = isinstance(exc, BrokenPipeError)

    def write(self, text: str) -> int:
        if self.error is None:
            try:
                return self.stream.write(text)
            except (OSError, ValueError) as exc:
                self._failed(exc)
        return len(text)

    def flush(self) -> None:
        if self.error is None:
            try:
                self.stream.flush()
            except (OSError, ValueError) as exc:
                self._failed(exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def main(argv: list[str] | None = None) -> int:
    """Run the command; return its exit status (experiments/exit_status.py)."""
    parser = build_parser()
    if sys.stdout is None:  # started with stdout closed: keep fd 1 from being reused by a file the run opens
        with contextlib.suppress(OSError):
            if os.open(os.devnull, os.O_WRONLY) != 1:
                raise OSError
    guard, previous = _GuardedStdout(sys.stdout), sys.stdout
    sys.stdout = guard  # type: ignore[assignment]
    args, parsed = None, None  # --help and --version print, then end the parse: their text is output like any other
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, --version (0), or a usage error (2, said on stderr)
            parsed = exc
            status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        else:
            status = _run(args)
        guard.flush()
    finally:
        sys.stdout = previous
    if guard.error is None:
        if parsed is not None:
            raise parsed  # as argparse ends: SystemExit, for a caller of main() to see
        return status
    if previous is not None:
        with contextlib.suppress(OSError, ValueError):  # the exit's own flush of what is left must stay quiet
            os.dup2(os.open(os.devnull, os.O_WRONLY), previous.fileno())
    listing = args is None or args.command == "info" or getattr(args, "exercises_command", "") in ("list", "init")
    if guard.reader_gone and listing:
        return status  # a listing read in part (`tinyamp info | head`) has done its job; a run's or a grading's has not
    where = f"; the run's files are in {', '.join(map(str, _WRITTEN))}" if _WRITTEN else ""
    lost = "the printed results are lost" if args is not None else "the help or version it printed is lost"
    print(f"tinyamp: could not write to standard output ({guard.error}): {lost}{where}", file=sys.stderr)
    return status or exit_status.STDOUT_FAILED


def _mpi_job_size() -> int:
    """How many ranks the MPI job this process belongs to has (1 outside mpiexec): MPICH's and Open MPI's variables."""
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 1


def _refuse_in_an_mpi_job(args: argparse.Namespace) -> int:
    """A rank mpiexec started without --distributed: refuse, together with the ranks started with it.

    Those ranks wait for every rank in their first collective (the check that all were started
    alike), and would wait for this one until their time-out: so this rank takes part in that
    check, which then fails on every rank with one message (distributed/train.py).
    """
    try:
        from tinyamp.distributed.train import refuse_without_distributed
    except ImportError:  # no mpi4py: no rank of this job can be a distributed one
        raise UsageError(
            f"this process is one of the {_mpi_job_size()} ranks mpiexec started; `tinyamp train` runs in one "
            "process, or on every rank with --distributed"
        ) from None
    return refuse_without_distributed(args)


def _run(args: argparse.Namespace) -> int:
    """The command `args` names; its exit status."""
    _WRITTEN.clear()
    try:
        if args.command in ("info", "exercises"):  # a signal stops them at once, through their `finally`s: a
            with handle_signals():  # grading's children are killed and its copies removed (exercises/isolation.py)
                return info() if args.command == "info" else exercises_command.run(args)
        keep_freed_memory()  # no page faults from glibc trimming its heap between steps (engine/fast/allocator.py)
        if args.command == "train" and (args.zero or args.reduce_dtype) and not args.distributed:
            raise UsageError("--zero and --reduce-dtype shard or reduce across processes; they need --distributed")
        if args.command == "train" and args.timeout is not None and not args.distributed:
            raise UsageError("--timeout bounds the wait of a rank for the others; it needs --distributed")
        if args.command == "train" and not args.distributed and _mpi_job_size() > 1:
            return _refuse_in_an_mpi_job(args)
        if args.command == "train" and args.distributed:
            try:
                from tinyamp.distributed.train import run_distributed
            except ImportError as exc:  # no mpi4py: the message says how to install it
                raise UsageError(str(exc)) from exc
            return run_distributed(args)  # on one BLAS thread, as below (blas_threads.py)
        with handle_signals() as stop, one_blas_thread():
            return demo(args, stop) if args.command == "demo" else train(args, stop)
    except UsageError as exc:
        print(f"tinyamp: error: {exc}", file=sys.stderr)
        return exit_status.BAD_INPUT
    except MemoryError as exc:
        print(f"tinyamp: error: out of memory ({exc or 'an array did not fit'}); a smaller --batch-size or "
              "model needs less", file=sys.stderr)  # fmt: skip
        return exit_status.BAD_INPUT
    except OSError as exc:  # an output folder that cannot be written, a disk that fills up
        print(f"tinyamp: error: {exc}", file=sys.stderr)
        return exit_status.BAD_INPUT
    except Interrupted as exc:
        held = "; ".join(kept(folder.path) for folder in _LOCKED) or "nothing was written"
        print(f"\ntinyamp: stopped by {exc.name}; {held}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:  # outside the main thread no handler is installed
        print("\ntinyamp: interrupted; nothing was written", file=sys.stderr)
        return exit_status.stopped_by(signal.SIGINT)
    finally:
        while _LOCKED:
            _LOCKED.pop().unlock()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
