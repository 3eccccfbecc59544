"""The settings of a `tinyamp train` run: one set of rules for the command line and for a checkpoint.

A checkpoint stores the settings its run was started with (model, precision, scaler,
batch size, learning rate, seed, schedule) and where the run stands (``step`` of
``total_steps``).  A resumed run takes them back from the file, so the file is input
like the command line, and it is checked by the same rules: an edited or damaged value
is refused with the file named, before anything is built from it.

The learning-rate schedule is a pure function of (step, total_steps): ``lr_at(step,
total)``.  So those two numbers are the schedule's whole state, and a run resumed from
step k of a total N takes at step k exactly the learning rate it would have taken had
it never stopped.  Changing N is a different run: the cosine's rate at step k moves.
:func:`extension_note` says by how much.
"""

from __future__ import annotations

import math
from typing import Any

MODELS = ("mlp", "transformer", "wordlm")
PRECISIONS = (
    *("fp32", "fp16", "fp16-scaled", "fp16-master", "mixed", "bf16", "bf16-mixed"),
    *("fp8", "fp8-current", "mxfp8"),
)
SCALERS = ("pytorch", "apex", "keras", "jmp", "chainer", "megatron", "deepspeed", "fairseq", "static", "off")
SCHEDULES = ("cosine", "constant")
MAX_SEED = 2**63 - 1  # NumPy's generators take any non-negative integer; this bound keeps it an int64
# A checkpoint keeps the loss scaler's history of every step (about 500 bytes of parsed
# metadata a step, amp/checkpoint_file.py); 100,000 steps stay within what one may hold.
MAX_STEPS = 100_000
# steps between the checkpoints a run with an output folder saves, in one process and on N ranks alike:
# a run killed by SIGKILL, a power cut or the loss of one rank loses at most this many
DEFAULT_CHECKPOINT_EVERY = 500


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def problem(name: str, value: Any) -> str | None:
    """Why `value` is not a valid setting `name`, as the end of a sentence; None when it is valid."""
    choices = {"model": MODELS, "precision": PRECISIONS, "scaler": SCALERS, "schedule": SCHEDULES}
    if name in choices:
        return None if value in choices[name] else f"must be one of {', '.join(choices[name])}; got {value!r}"
    if name in ("steps", "total_steps"):
        if _is_int(value) and 1 <= value <= MAX_STEPS:
            return None
        return (
            f"must be a whole number from 1 to {MAX_STEPS:,} (a checkpoint keeps the loss scale of every step); "
            f"got {value!r}"
        )
    if name == "batch_size":
        return None if _is_int(value) and value >= 1 else f"must be a whole number of at least 1; got {value!r}"
    if name in ("step", "checkpoint_every"):
        return None if _is_int(value) and value >= 0 else f"must be a whole number of at least 0; got {value!r}"
    if name == "seed":
        return None if _is_int(value) and 0 <= value <= MAX_SEED else f"must be between 0 and 2^63-1; got {value!r}"
    if name == "lr":
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
            return None
        return f"must be a finite number greater than 0; got {value!r}"
    raise KeyError(f"no rule for the setting {name!r}")


def _refuse_unknown(table: dict[str, Any], known: tuple[str, ...], where: str, verb: str) -> None:
    """A name `tinyamp train` never writes means the file was edited or crafted: ValueError naming the first."""
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ValueError(f"{where} {unknown[0]!r}, which `tinyamp train` never {verb}; the file was edited or crafted")


STORED = ("model", "precision", "scaler", "batch_size", "lr", "seed", "schedule", "step", "total_steps")


def checked_stored(saved: Any, path: str) -> dict[str, Any]:
    """The settings a checkpoint stores, each checked; raises ValueError with one sentence naming `path`.

    Checkpoints written before ``total_steps`` was stored ended at their last step, so
    their ``step`` is their total.
    """
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: the checkpoint's settings are not a table of values; the file was edited or damaged")
    _refuse_unknown(saved, STORED, f"{path}: the checkpoint's settings include", "stores")
    saved = dict(saved)
    saved.setdefault("total_steps", saved.get("step"))
    for name in STORED:
        if name not in saved:
            raise ValueError(f"{path}: the checkpoint does not store the setting {name}; the file was edited or cut")
        why = problem(name, saved[name])
        if why is not None:
            raise ValueError(f"{path}: the checkpoint's setting {name} {why}; the file was edited or damaged")
    if saved["step"] > saved["total_steps"]:
        raise ValueError(
            f"{path}: the checkpoint says it trained {saved['step']} of {saved['total_steps']} steps, more than its "
            "total; the file was edited or damaged"
        )
    return {name: saved[name] for name in STORED}


EXTRA_SECTIONS = ("train", "distributed", "history", "fp8")  # what `tinyamp train` stores in a checkpoint's extra


def checked_extra(extra: Any, path: str) -> dict[str, Any]:
    """The settings in the ``extra`` of a `tinyamp train` checkpoint, checked (ValueError: one sentence)."""
    if not isinstance(extra, dict) or "train" not in extra:
        raise ValueError(f"{path}: this checkpoint was not written by `tinyamp train`")
    _refuse_unknown(extra, EXTRA_SECTIONS, f"{path}: the checkpoint's extra holds", "writes")
    return checked_stored(extra["train"], path)


def extension_note(task: Any, step: int, old_total: int, new_total: int) -> str:
    """What changes when a run saved at `step` of `old_total` steps continues to `new_total` instead."""
    if task.schedule == "constant":
        return (
            f"the learning rate is constant ({task.lr:g}), so the steps from {step} on are those a straight "
            f"{new_total}-step run takes"
        )
    was, now = task.lr_at(step, old_total), task.lr_at(step, new_total)
    return (
        f"the {task.schedule} schedule is recomputed over {new_total} steps, so the learning rate at step {step} "
        f"becomes {now:.3g} where the saved run's schedule gives {was:.3g}; the result differs from a straight "
        f"{new_total}-step run"
    )


def plan_resume(saved: dict[str, Any], steps: int | None, extend: bool, task: Any) -> tuple[int, str | None]:
    """The total a resumed run trains to, and a note when it extends the saved run (None when it finishes it).

    `saved` holds the checkpoint's ``step`` and ``total_steps``; `steps` is the --steps given
    (None: the saved total).  Raises ValueError when the two disagree without `extend`.
    """
    step, total = saved["step"], saved["total_steps"]
    steps = total if steps is None else steps
    if step == total and steps == total:
        raise ValueError(
            f"the checkpoint's run is finished ({step} of {total} steps); to train it further, pass --steps N "
            "(the new total) and --extend"
        )
    if steps <= step:
        raise ValueError(f"the checkpoint has already trained {step} steps; --steps is the total, pass more than that")
    if steps == total:
        return steps, None  # finishing an interrupted run: the schedule continues where it stopped
    note = extension_note(task, step, total, steps)
    if step == total and not extend:
        raise ValueError(
            f"the checkpoint's run is finished ({step} of {total} steps); add --extend to continue it to "
            f"{steps} steps, knowing that {note}"
        )
    if not extend:
        raise ValueError(
            f"--steps {steps} differs from the checkpoint's total of {total} steps: {note}; leave out --steps to "
            "finish the saved run, or add --extend to continue it to the new total"
        )
    return steps, f"extending the run saved at step {step} of {total} to {steps} steps: {note}"
