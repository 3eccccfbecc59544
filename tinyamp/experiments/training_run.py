"""The loop of ``tinyamp train``, in one process or on N ranks: written once.

A run trains from step `start` (0, or the step of the checkpoint it resumed from), keeps in
memory the state of its last good step (a diverged run saves that one, not the state that
diverged: ``divergence.LastGoodState``), saves a checkpoint every `every` steps, stops at a
step boundary when Ctrl-C or SIGTERM arrives (saving a checkpoint first), and at the end
writes results.json, the figures and a checkpoint into its output folder, with a manifest
that says how far the run came.  Its exit status is ``exit_status.py``'s.

:class:`TrainingRun` is the run in one process (``cli.train``).  On N ranks
(``distributed/train.py``) a subclass changes three things: which signal to stop at (the
ranks agree on one), what a checkpoint saves (a single-process copy, gathered from every
rank) and which process speaks (rank 0 prints and writes; every rank takes part in the
collective steps).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tinyamp.experiments import exit_status
from tinyamp.experiments import history as run_history
from tinyamp.experiments.divergence import LastGoodState
from tinyamp.experiments.interrupts import Interrupted, Stop


def progress_bar(show: bool) -> Callable[..., Any] | None:
    """tqdm's bar class (imported only when a bar is shown), or None."""
    if not show:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # a dependency, but a missing bar should not stop a run
        return None

    def bar(**kwargs: Any) -> Any:
        return tqdm(**kwargs, leave=False, dynamic_ncols=True, file=sys.stderr)

    return bar


def write_outputs(out: Any, document: dict[str, Any], manifest: dict[str, Any],
                  save: Callable[[Path], str] | None = None, hint: str | None = None) -> list[str]:  # fmt: skip
    """results.json, the figures (when matplotlib is installed) and a checkpoint: the new content of `out`.

    `hint`, when given, is the pip line printed when the figures are skipped.
    """
    from tinyamp.experiments import figures
    from tinyamp.experiments.results import write_json

    def fill(folder: Path) -> list[str]:
        written = [write_json(document, folder).name]
        if save is not None:
            written.append(save(folder))
        if figures.matplotlib_available():
            written += [p.name for p in figures.write_figures(document, folder)]
        elif hint is not None:
            print(f"figures skipped: matplotlib is not installed ({hint})")
        return written

    return out.write(fill, manifest)


def resume_line(checkpoint: Path, folder: Path) -> str:
    """The command that continues the run saved at `checkpoint` into `folder`, in one process."""
    return f"tinyamp train --resume {checkpoint} --out {folder}"


def kept(path: Path, resume: Callable[[Path, Path], str] = resume_line) -> str:
    """What the output folder at `path` holds now, as the end of a sentence: a checkpoint to resume, or nothing."""
    from tinyamp.experiments.output_folder import read_manifest

    manifest = read_manifest(path) if path.is_dir() else None
    if manifest is None or "checkpoint.npz" not in manifest["files"]:
        return f"{path} holds no checkpoint of this run"
    checkpoint = path / "checkpoint.npz"
    return (
        f"{checkpoint} holds step {manifest.get('step')} of {manifest.get('total_steps')}. Continue with:\n"
        f"  {resume(checkpoint, path)}"
    )


class TrainingRun:
    """One run of ``tinyamp train`` in one process: the loop, its checkpoints, its end.

    `task` and `setup` are built (and loaded, when resumed); `settings` are the settings a
    checkpoint stores for ``--resume`` ("train" in its extra); `history` the series of the
    steps before `start`; `out` the OutputFolder (None without --out); `every` the steps
    between checkpoints (0: only at the end); `capture` and `put_back` copy and restore
    the run's own state for the last good step (weights, masters, moments); `writes`
    whether the run saves (default: `out` is given; on N ranks every rank saves, rank 0 alone
    holds `out`).
    """

    where = ""  # after "stopped by SIGINT at step 12 of 300": on N ranks, " on every rank"

    def __init__(self, task: Any, setup: Any, stop: Stop, settings: dict[str, Any], *, start: int, history: Any,
                 out: Any, every: int, capture: Callable[[], Any], put_back: Callable[[Any], Any],
                 writes: bool | None = None) -> None:  # fmt: skip
        self.task, self.setup, self.stop, self.settings = task, setup, stop, settings
        self.steps, self.start, self.history, self.out, self.every = settings["total_steps"], start, history, out, every
        self.writes = out is not None if writes is None else writes  # whether the run saves (the same on every rank)
        self.written: list[Path] = []  # the folders this run has written into
        self.good = None
        if self.writes:  # a diverged run saves the state of its last good step
            self.good = LastGoodState(setup.model, setup.scaler, capture, put_back)
            if start:
                self.good.keep(start)  # the loaded state: good until a step of this run proves otherwise

    # ---- what N ranks do differently (distributed/train.py) ----
    @property
    def speaks(self) -> bool:
        """Whether this process prints and writes the files (on N ranks: rank 0)."""
        return True

    def signal(self) -> int:
        """The signal to stop at after this step (0: none)."""
        return self.stop.signum or 0

    def state_to_save(self) -> tuple[Any, Any]:
        """The model and optimizer a checkpoint saves."""
        return self.setup.model, self.setup.optimizer

    def checkpoint_extra(self) -> dict[str, Any]:
        """What a checkpoint stores besides the settings, the history and FP8's scales."""
        return {}

    def saved(self) -> None:
        """Runs after each checkpoint (on N ranks: a barrier, so that it is on disk before any rank goes on)."""

    def resume_line(self, checkpoint: Path, folder: Path) -> str:
        """The command that continues this run from `checkpoint`."""
        return resume_line(checkpoint, folder)

    # ---- the loop ----
    def save(self, folder: Path, step: int, state: tuple[Any, Any]) -> str:
        """Write checkpoint.npz of the run at `step` into `folder` (`state`: what state_to_save returned)."""
        from tinyamp.amp import save_checkpoint

        extra = {"train": {**self.settings, "step": step}, **self.checkpoint_extra(),
                 "history": run_history.to_extra(self.history, step)}  # fmt: skip
        if self.setup.fp8 is not None:  # every tensor's scale, amax history and casts: the next casts depend on them
            from tinyamp.fp8.training_state import to_extra

            extra["fp8"] = to_extra(self.setup.fp8)
        save_checkpoint(folder / "checkpoint.npz", state[0], state[1], self.setup.scaler, extra)
        return "checkpoint.npz"

    def save_unit(self, step: int) -> None:
        """Replace the output folder by a checkpoint of `step` alone (a run that has not finished)."""
        state = self.state_to_save()
        if self.out is not None:
            manifest = {"command": "train", "finished": False, "step": step, "total_steps": self.steps}
            self.out.write(lambda folder: [self.save(folder, step, state)], manifest)
            self.written[:] = [self.out.path]
        self.saved()

    def after_step(self, done: int) -> None:
        """Stop at a signal; save a checkpoint every `every` steps."""
        if done == self.steps:
            return  # the run is complete: a signal now waits for its files to be written
        signum = self.signal()
        if signum:
            raise Interrupted(signum, done)
        if self.writes and self.every and done % self.every == 0:
            self.save_unit(done)

    def train(self, precision: str, scaler: str, loop_task: Any = None, progress: Any = None,
              memory: bool = False) -> Any:  # fmt: skip
        """Run the steps from `start` to the end (``runner.run_regime``); return the result.

        `loop_task` is the task the steps draw batches from (on N ranks, this rank's slice).
        Raises Interrupted when a signal stopped the run: :meth:`stopped` saves it.
        """
        from tinyamp.experiments.runner import run_regime

        result, _ = run_regime(loop_task or self.task, precision, self.steps, scaler, setup=self.setup,
                               start=self.start, progress=progress, memory=memory, after_step=self.after_step,
                               on_loss=None if self.good is None else self.good.on_loss,
                               history=self.history)  # fmt: skip
        return result

    def stopped(self, exc: Interrupted) -> int:
        """Save the run where the signal stopped it (with --out), say how to continue, return 128 + signal."""
        where = f"tinyamp: stopped by {exc.name} at step {exc.step} of {self.steps}{self.where}"
        if not self.writes:
            self.say(f"\n{where}; nothing was written (with --out DIR a stopped run leaves a checkpoint to resume "
                     "from)")  # fmt: skip
            return exc.exit_status
        if exc.step is None:  # a second signal, in the middle of a step or of a save: that one was abandoned
            self.say(f"\ntinyamp: stopped by a second {exc.name} before the step or save in progress ended; ",
                     self.kept)  # fmt: skip
            return exc.exit_status
        try:
            self.save_unit(exc.step)
        except Interrupted as again:  # the save was abandoned as a whole: the folder is as it was
            self.say(f"\ntinyamp: stopped by a second {again.name} while saving step {exc.step}; ", self.kept)
            return again.exit_status
        if self.out is not None:
            checkpoint = self.out.path / "checkpoint.npz"
            self.say(f"\n{where}; wrote {checkpoint}. Continue with:\n  {self.resume_line(checkpoint, self.out.path)}")
        return exc.exit_status

    def say(self, text: str, then: Callable[[], str] | None = None) -> None:
        """Print `text` (and what `then` returns) on stderr, where this process speaks."""
        if self.speaks:
            print(text + (then() if then is not None else ""), file=sys.stderr)

    def kept(self) -> str:
        """What the output folder holds now (see :func:`kept`)."""
        return kept(self.out.path, self.resume_line)

    # ---- the end ----
    def end_state(self, failed: str | None) -> tuple[int | None, tuple[Any, Any] | None]:
        """The step the checkpoint will hold (a diverged run's last good one, None: no good one) and its state.

        A diverged run's model is put back to its last good step here, before its state is taken.
        """
        step: int | None = self.steps
        if failed:
            step = self.good.restore() if self.good is not None and self.good.step is not None else None
        return step, (self.state_to_save() if self.writes and step else None)

    def finish(self, result: Any, failed: str | None, step: int | None, state: tuple[Any, Any] | None,
               config: dict[str, Any] | None = None, hint: str | None = None) -> int:  # fmt: skip
        """Write results.json, the figures and the checkpoint `end_state` chose (with --out); return the exit status.

        `failed` is why the run diverged (None: it did not); `config` more of results.json's
        config; `hint` the pip line printed when the figures are skipped.
        """
        from tinyamp.experiments.results import results_document

        if self.out is not None:
            config = {"command": "train", "resumed_from": self.start, "diverged": failed, **(config or {})}
            document = results_document({self.task.name: (self.task, [result])}, config)
            manifest = {"command": "train", "finished": not failed, "diverged": bool(failed),
                        "step": step or self.start + len(result.series["loss"]), "total_steps": self.steps}  # fmt: skip
            keep = None if state is None else (lambda folder: self.save(folder, step, state))
            written = write_outputs(self.out, document, manifest, keep, hint)
            self.written[:] = [self.out.path]
            why = ""
            if failed:
                why = (f" (the checkpoint is of step {step}, {LastGoodState.MEANING})" if step else
                       " (no checkpoint: no step of this run was good)")  # fmt: skip
            print(f"wrote {', '.join(written)} to {self.out.path}{why}")
        return exit_status.at_the_end(failed, self.stop, say=self.speaks)
