"""`tinyamp train --distributed`: the tasks and regimes of a single-process run, on N ranks.

    mpiexec -n 2 python -m tinyamp.distributed --model mlp --precision mixed --steps 300 --zero

Every rank draws the same batch of B examples (the single-process sequence), takes its slice
of B/N, and trains a replica (``DataParallel``).  The loop is the single-process one
(``experiments.training_run.TrainingRun`` around ``experiments.runner.run_regime``), with
``DistributedSetup.step`` for the step and ``DistributedRun`` for what N ranks do differently,
so the results are measured, saved and written the same way; rank 0 writes them.  The loss reported is the
mean of the ranks' losses: the loss of the whole batch.  At the end, rank 0 prints one row per
rank: steps skipped, the loss scale, the bytes of model states it holds and the bytes it sent,
and a fingerprint (SHA-256) of the state every rank must hold alike: the weights and the scaler
state, and the masters and optimizer moments unless ZeRO shards them.  A line under the table
says whether the fingerprints agree, and if not, which parts differ on which ranks.

Ranks started with different settings are refused before anything is built; an error on one
rank stops every rank (``communicator.abort_on_error``).  Ctrl-C or SIGTERM stops every rank
after the same step, with a checkpoint when there is ``--out`` (``signal_on_any_rank``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import tinyamp as ta
from tinyamp import backend, kernels, random
from tinyamp.amp.lost_updates import lost_updates
from tinyamp.distributed import checkpoint
from tinyamp.distributed.communicator import (
    DEFAULT_TIMEOUT_S,
    Communicator,
    abort_on_error,
    exchange_json,
    make_communicator,
)
from tinyamp.distributed.data_parallel import DataParallel
from tinyamp.distributed.faults import Fault, parse_at
from tinyamp.experiments import exit_status, resume, run_settings
from tinyamp.experiments import history as run_history
from tinyamp.experiments.blas_threads import one_blas_thread
from tinyamp.experiments.interrupts import Interrupted, Stop, handle_signals
from tinyamp.experiments.measure import LostUpdateMeter
from tinyamp.experiments.regimes import REGIMES, Setup, make_scaler
from tinyamp.experiments.training_run import TrainingRun, progress_bar
from tinyamp.tensor import Tensor

DEFAULT_STEPS = 1500  # as `tinyamp train`
SHARED = ("model", "precision", "scaler", "steps", "batch_size", "lr", "schedule", "seed", "device", "reduce_dtype",
          "zero", "agree", "micro_batches", "resume", "checkpoint_every", "out", "overflow_at")  # fmt: skip


_LOCKED: list[Any] = []  # the output folder rank 0 holds (OutputFolder.lock), let go when the run returns


class DistributedUsageError(Exception):
    """Bad settings, found the same way on every rank: every rank exits with status 2, nothing is aborted."""


class RankSlice:
    """A task seen by one rank: the same batches, cut to this rank's B/N examples (in `micro_batches` pieces)."""

    def __init__(self, task: Any, rank: int, size: int, micro_batches: int = 1) -> None:
        self.task, self.rank, self.size, self.micro_batches = task, rank, size, micro_batches
        self.micro = 0  # the micro-batch ``loss`` reads (DistributedSetup.step sets it)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)  # name, lr_at, evaluate, device, ...

    def batches(self, start: int = 0) -> Any:
        """The task's batches from `start`, each as this rank's list of micro-batches."""
        per_rank = self.task.batch_size // self.size
        m = per_rank // self.micro_batches
        for x, y in self.task.batches(start=start):
            at = self.rank * per_rank
            yield [tuple(_rows(t, at + i * m, at + (i + 1) * m) for t in (x, y)) for i in range(self.micro_batches)]

    def loss(self, model: Any, batch: Any) -> Tensor:
        """The task's loss (a mean) on micro-batch ``micro`` of this rank's slice."""
        return self.task.loss(model, batch[self.micro])


def _rows(t: Tensor, lo: int, hi: int) -> Tensor:
    return ta.tensor(t.data[lo:hi], device=t.device)


@dataclass
class DistributedSetup(Setup):
    """A Setup whose step is the data-parallel one; it also records the time and bytes of each step."""

    rank_task: Any = None
    overflow_at: tuple[tuple[int, int], ...] = ()
    fault: Fault | None = None
    step_seconds: list[float] = field(default_factory=list)
    comm_seconds: list[float] = field(default_factory=list)
    bytes_sent: list[int] = field(default_factory=list)
    fingerprints: list[dict[str, str]] = field(default_factory=list)

    def step(self, loss_fn: Any, measure_lost: bool = False, inspect: Any = None) -> tuple[float, Any, None]:
        """One data-parallel step (``data_parallel.py``); returns the whole batch's loss and the StepReport."""
        dp, scaler = self.optimizer, self.scaler
        comm, step = dp.comm, scaler.step_count
        if self.fault is not None:
            self.fault.trigger(step, comm.rank)
        began, seconds, sent = time.perf_counter(), comm.seconds, comm.bytes_sent
        dp.zero_grad()
        losses = []
        for i in range(dp.micro_batches):
            self.rank_task.micro = i
            with self.autocast():
                loss = loss_fn(self.model)
            if inspect is not None and i == 0:
                inspect(loss)
            with np.errstate(over="ignore", invalid="ignore"):  # an overflow is the scaler's to find and report
                scaler.scale_loss(loss, accumulate=i > 0).backward()
            dp.collect()
            losses.append(float(loss.item()))
        self.rank_task.micro = 0
        if (step, comm.rank) in self.overflow_at:
            dp.inject_overflow()
        flags = scaler.unscale_(dp)
        dp.exchange(flags)
        before = self._before_update() if measure_lost else None
        report = scaler.step(dp)
        counts = self._lost_counts(before, report.skipped) if measure_lost else None
        dp.finish()
        means = backend.to_device(comm.allgather(comm.xp.asarray([sum(losses) / len(losses)])), "cpu")
        self.step_seconds.append(time.perf_counter() - began)
        self.comm_seconds.append(comm.seconds - seconds)
        self.bytes_sent.append(comm.bytes_sent - sent)
        return sum(float(v) for v in means) / comm.size, report, counts  # summed in rank order: equal everywhere

    def _before_update(self) -> Any:
        """What counting this step's lost updates needs from before the update (None for FP32 weights)."""
        shard = self.optimizer.shard
        if self.regime.weights == "float32":
            return None
        if shard.has_masters:  # the masters of this rank's range, and what the model held there: their rounding
            return shard.tensor.data.copy(), kernels.cast(shard.tensor.data, self.optimizer.weights.dtype)
        meter = LostUpdateMeter(shard.optimizer)  # no masters ("fp16"): replay the update in float32, as one process
        meter.before_step()
        return meter

    def _lost_counts(self, before: Any, skipped: bool) -> tuple[int, int] | None:
        """``(changed, lost)`` over the whole model, as ``Setup.step`` counts them (None: skipped, or FP32).

        Each rank counts its own range; with ZeRO the ranges split the model, so the counts
        are summed over the ranks (every rank takes part, whether its step was skipped or not).
        """
        if before is None:
            return None
        dp = self.optimizer
        if isinstance(before, LostUpdateMeter):
            counts = before.after_step(skipped) or (0, 0)
        elif skipped:
            counts = (0, 0)
        else:
            master_before, w16_before = before
            master = dp.shard.tensor.data
            changed = master != master_before
            lost = lost_updates(w16_before, master - master_before) & changed
            counts = tuple(int(v) for v in backend.host_floats([dp.comm.xp.count_nonzero(a) for a in (changed, lost)]))
        if dp.zero:
            summed = dp.comm.allreduce(dp.comm.xp.asarray(counts, dtype=np.int64), op="sum")
            counts = tuple(int(v) for v in backend.to_device(summed, "cpu"))
        return None if skipped else (counts[0], counts[1])

    def fingerprint(self) -> dict[str, str]:
        """The digests of this rank's weights, masters, moments and scaler state (equal digests: equal bits)."""
        scaler = json.dumps(self.scaler.state_dict(), sort_keys=True, default=str).encode("utf-8")
        return {**self.optimizer.fingerprint(), "scaler": hashlib.sha256(scaler).hexdigest()[:16]}

    def record_fingerprint(self) -> None:
        """Append this step's fingerprint (tests compare them step by step)."""
        self.fingerprints.append(self.fingerprint())

    def row(self, skipped: int) -> dict[str, Any]:
        """This rank's line of the per-rank table."""
        return {
            "rank": self.optimizer.comm.rank, "skipped": skipped, "scale": self.scaler.scale,
            "held_bytes": sum(self.optimizer.memory().values()),
            "sent_per_step": float(np.median(self.bytes_sent)) if self.bytes_sent else 0.0,
            "communication_share": sum(self.comm_seconds) / max(sum(self.step_seconds), 1e-12),
            "ms_per_step": 1e3 * float(np.median(self.step_seconds)) if self.step_seconds else float("nan"),
            "fingerprint": self.fingerprint(), "sharded": self.optimizer.zero,
        }  # fmt: skip


# what the fingerprint column covers: what every rank must hold alike (ZeRO: each rank its own masters and moments)
SHARED_STATE = {False: ("weights", "masters", "moments", "scaler"), True: ("weights", "scaler")}
IN_WORDS = {"weights": "weights", "masters": "masters", "moments": "optimizer moments", "scaler": "scaler state"}


def shared_fingerprint(row: dict[str, Any]) -> str:
    """One digest of the parts of a rank's fingerprint that every rank must hold alike (8 hex digits)."""
    parts = "/".join(row["fingerprint"][k] for k in SHARED_STATE[row["sharded"]])
    return hashlib.sha256(parts.encode("ascii")).hexdigest()[:8]


def agreement_in_words(rows: list[dict[str, Any]]) -> list[str]:
    """Two lines: what the fingerprint covers, and whether the ranks agree (if not, which parts differ where)."""
    covered = SHARED_STATE[rows[0]["sharded"]]
    what = ", ".join(IN_WORDS[k] for k in covered[:-1]) + f" and {IN_WORDS[covered[-1]]}"
    sharded = " (ZeRO: each rank holds its own shard of the masters and moments)" if rows[0]["sharded"] else ""
    first = rows[0]["fingerprint"]
    differ = {r["rank"]: [IN_WORDS[k] for k in covered if r["fingerprint"][k] != first[k]] for r in rows[1:]}
    told = "; ".join(f"rank {rank}: {', '.join(parts)}" for rank, parts in differ.items() if parts)
    verdict = (f"the ranks DISAGREE with rank 0 ({told}): they no longer train one model" if told else
               f"the same on every rank ({len(rows)} of them): they hold one model, bit for bit" if len(rows) > 1
               else "one rank: there is no other rank to agree with")  # fmt: skip
    return [f"  fingerprint: SHA-256 of the {what}{sharded};", f"  {verdict}"]


def format_ranks(rows: list[dict[str, Any]]) -> str:
    """The per-rank table rank 0 prints, with each rank's fingerprint and whether they agree."""
    lines = [f"{'rank':>4}  {'skipped':>7}  {'loss scale':>10}  {'model states held':>17}  {'sent per step':>13}  "
             f"{'time in collectives':>19}  {'fingerprint':>11}"]  # fmt: skip
    for r in rows:
        lines.append(
            f"{r['rank']:>4}  {r['skipped']:>7}  {r['scale']:>10g}  {r['held_bytes'] / 2**10:>13,.0f} KiB  "
            f"{r['sent_per_step'] / 2**10:>9,.1f} KiB  {100 * r['communication_share']:>18.0f}%  "
            f"{shared_fingerprint(r):>11}"
        )
    lines.append("* held: FP16 weights and gradients, FP32 masters and optimizer state (ZeRO shards the last two);")
    lines.append("  sent: bytes this rank sends per step (as a ring all-reduce counts them); time: waiting included;")
    lines += agreement_in_words(rows)
    return "\n".join(lines)


def settings_of(args: Any) -> dict[str, Any]:
    """The settings every rank must share, from a `tinyamp train` Namespace plus the distributed fields."""
    s = {k: getattr(args, k, None) for k in SHARED}
    s["device"] = s["device"] or "cpu"
    s["reduce_dtype"] = s["reduce_dtype"] or "float32"
    s["zero"], s["agree"] = bool(s["zero"]), s["agree"] is not False
    s["micro_batches"] = 1 if s["micro_batches"] is None else s["micro_batches"]
    s["overflow_at"] = sorted(parse_at(v) for v in (s["overflow_at"] or []))
    s["fault"] = getattr(args, "fault", None)
    s["extend"] = bool(getattr(args, "extend", False))
    s["tinyamp"], s["numpy"] = ta.__version__, np.__version__
    s["distributed"] = True  # (refuse_without_distributed sends False)
    return s


def check_same_settings(comm: Communicator, settings: dict[str, Any]) -> None:
    """Refuse, on every rank, ranks that were started with different settings (the fault may differ)."""
    mine = {k: v for k, v in settings.items() if k != "fault"}
    every = exchange_json(comm, mine)
    differ = sorted({k for s in every for k in s if s.get(k) != every[0].get(k)})
    if differ:
        told = "; ".join(
            f"--{k.replace('_', '-')}: " + ", ".join(f"rank {r} {v.get(k)!r}" for r, v in enumerate(every))
            for k in differ
        )
        raise DistributedUsageError(
            f"the ranks were started with different settings ({told}); every rank of a data-parallel run must be "
            "started with the same command line"
        )


def run_distributed(args: Any) -> int:
    """Train as ``tinyamp train`` does, on the ranks ``mpiexec -n N`` started; return the exit status.

    `args` has the fields of `tinyamp train` (model, precision, scaler, steps, batch_size, lr,
    schedule, seed, out, quiet; device, resume, checkpoint_every, memory where given) and
    ``reduce_dtype`` ("float32", "float16", "float16-predivide"), ``zero`` and ``agree``
    (``micro_batches``, ``timeout``, ``overflow_at``, ``fault`` and ``dump`` optional).
    """
    settings = settings_of(args)
    timeout = getattr(args, "timeout", None)
    if timeout is not None and not (0 < timeout < math.inf):  # before MPI starts; the same verdict on every rank
        if os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")) == "0":
            print(f"tinyamp: error: --timeout must be a number of seconds > 0, e.g. --timeout 60; got {timeout}",
                  file=sys.stderr)  # fmt: skip
        return exit_status.BAD_INPUT
    try:
        comm = make_communicator(settings["device"], float(timeout or DEFAULT_TIMEOUT_S))
    except backend.DeviceError as exc:  # no GPU, no NCCL: every rank finds it alone, before any collective
        print(f"tinyamp: error: {exc}", file=sys.stderr)
        return exit_status.BAD_INPUT
    with handle_signals() as stop, abort_on_error(comm), one_blas_thread():  # the same bits as `tinyamp train`
        try:
            check_same_settings(comm, settings)
            return _train(args, settings, comm, stop)
        except DistributedUsageError as exc:
            if comm.rank == 0:
                print(f"tinyamp: error: {exc}", file=sys.stderr)
            return exit_status.BAD_INPUT
        finally:
            while _LOCKED:
                _LOCKED.pop().unlock()


def refuse_without_distributed(args: Any) -> int:
    """For a rank that mpiexec started with `tinyamp train` but without --distributed: take part in the
    ranks' check of their settings, which then fails on every rank (rank 0 says why); return 2."""
    settings = {**settings_of(args), "distributed": False}
    comm = make_communicator("cpu", DEFAULT_TIMEOUT_S)  # (NCCL ranks would never meet this one: their MPI does)
    with abort_on_error(comm):
        try:
            check_same_settings(comm, settings)
        except DistributedUsageError as exc:
            if comm.rank == 0:
                print(f"tinyamp: error: {exc}", file=sys.stderr)
            return exit_status.BAD_INPUT
        if comm.rank == 0:  # every rank was started without --distributed
            print(f"tinyamp: error: mpiexec started {comm.size} ranks of `tinyamp train` without --distributed; pass "
                  "--distributed to every rank to train one model on all of them", file=sys.stderr)  # fmt: skip
    return exit_status.BAD_INPUT


def _problem(s: dict[str, Any], size: int) -> str | None:
    """What is wrong with the settings (the same answer on every rank), or None."""
    for name in ("model", "precision", "scaler", "steps", "batch_size", "lr", "schedule", "seed", "checkpoint_every"):
        value = s[name]
        why = None if value is None else run_settings.problem(name, value)
        if why is not None:
            return f"--{name.replace('_', '-')} {why}"
    from tinyamp.distributed.allreduce import REDUCTIONS

    if s["reduce_dtype"] not in REDUCTIONS:
        return f"--reduce-dtype must be one of {', '.join(REDUCTIONS)}; got {s['reduce_dtype']!r}"
    regime = REGIMES[s["precision"] or "mixed"]
    if regime.fp8 is not None:
        return f"--precision {regime.name} trains in one process (FP8 is emulated on NumPy); leave out --distributed"
    if s["zero"] and not regime.master_weights:
        return (f"--zero shards FP32 master weights; --precision {regime.name} has none (use fp16-master, mixed or "
                "bf16-mixed)")  # fmt: skip
    if s["reduce_dtype"].startswith("float16") and regime.weights != "float16":
        return f"--reduce-dtype {s['reduce_dtype']} sums FP16 gradients; --precision {regime.name} has none"
    if not isinstance(s["micro_batches"], int) or s["micro_batches"] < 1:
        return f"--micro-batches must be a whole number of at least 1; got {s['micro_batches']!r}"
    if s["extend"] and s["resume"] is None:
        return "--extend continues a saved run to more steps; it needs --resume CHECKPOINT"
    parts = size * s["micro_batches"]
    if s["batch_size"] is not None and s["batch_size"] % parts:
        return (f"--batch-size {s['batch_size']} does not split into {size} ranks x {s['micro_batches']} micro-batches;"
                f" pass a multiple of {parts}")  # fmt: skip
    if s["checkpoint_every"] is not None and s["out"] is None:
        return "--checkpoint-every writes into the output folder; it needs --out DIR"
    return None


def _resume_settings(s: dict[str, Any]) -> dict[str, Any]:
    """Take the stored settings of --resume (refusing any given that differ); return them."""
    try:
        saved, _, _ = resume.read_resume(s["resume"], {key: s[key] for key in resume.KEPT})  # history: every rank
    except resume.ResumeError as exc:
        raise DistributedUsageError(str(exc)) from exc
    for key in resume.KEPT:
        s[key] = saved[key]
    return saved


def _recovered_then(s: dict[str, Any], read: Any) -> Any:
    """Put back what a run killed mid-swap moved aside (in --out and the folder of --resume), then ``read(s)``."""
    from tinyamp.experiments.output_folder import OutputFolder

    folders = [_held_folder(s["out"])] if s["out"] else []  # locked first: no other run is swapping it
    folders.append(OutputFolder(Path(s["resume"]).absolute().parent))
    for folder in folders:
        for sentence in folder.recover():
            print(f"tinyamp: {folder.path}: {sentence}", file=sys.stderr)
    return read(s)


def _check_loads(path: str, model: Any, make_optimizer: Any, regime: Any, scaler_name: str) -> None:
    """Load the checkpoint at `path` into a single-process copy of the run: every check load_checkpoint makes."""
    import copy

    from tinyamp.amp import MasterWeights, load_checkpoint

    twin = copy.deepcopy(model)
    optimizer = make_optimizer(twin.named_parameters())
    if regime.master_weights:
        optimizer = MasterWeights(optimizer, track_lost_updates=False)
    state = random.get_state()
    try:
        load_checkpoint(path, twin, optimizer, make_scaler(scaler_name))
    except ValueError as exc:  # CheckpointError
        raise DistributedUsageError(f"--resume: {exc}") from exc
    finally:
        random.set_state(state)  # the load set the generators; checkpoint.load sets them again on every rank


def _shared_from_rank0(comm: Communicator, fn: Any) -> Any:
    """Run `fn` on rank 0 only and give its JSON value to every rank; its error becomes every rank's error."""
    from tinyamp.experiments.output_folder import OutputFolderError

    value, error = None, None
    if comm.rank == 0:
        try:
            value = fn()
        except (DistributedUsageError, OutputFolderError) as exc:  # (these name their option)
            error = str(exc)
        except (OSError, ValueError) as exc:
            error = f"--resume: {exc}"
    value, error = exchange_json(comm, [value, error])[0]
    if error is not None:
        raise DistributedUsageError(error)
    return value


def _on_rank0(comm: Communicator, fn: Any) -> Any:
    """Run `fn` on rank 0 only; an error there becomes a DistributedUsageError on every rank."""
    value, error = None, None
    if comm.rank == 0:
        try:
            value = fn()
        except (OSError, ValueError) as exc:
            error = str(exc)
    error = exchange_json(comm, error)[0]
    if error is not None:
        raise DistributedUsageError(error)
    return value


def signal_on_any_rank(comm: Communicator, stop: Stop) -> int:
    """The signal some rank has received (0: none), the same answer on every rank: one small all-reduce.

    mpiexec passes Ctrl-C and SIGTERM on to every rank, but each rank sees it between other
    bytecodes, maybe one step later than the others; stopping only at the step they agree on
    keeps the collectives matched and the checkpoint one consistent state.
    """
    signum = comm.allreduce(comm.xp.asarray([stop.signum or 0], dtype=np.int32), op="max")
    return int(backend.to_device(signum, "cpu")[0])


def _train(args: Any, s: dict[str, Any], comm: Communicator, stop: Stop) -> int:
    from tinyamp.experiments.divergence import diverged, explain
    from tinyamp.experiments.output_folder import OutputFolder
    from tinyamp.experiments.results import format_table
    from tinyamp.experiments.tasks import TASKS

    saved = None
    if s["resume"]:  # read on rank 0 alone, before the other ranks touch the file; the verdict is shared
        saved = _shared_from_rank0(comm, lambda: _recovered_then(s, _resume_settings))
        for key in ("model", "precision", "scaler", "batch_size", "lr", "seed", "schedule"):
            s[key] = saved[key]  # as _resume_settings set them on rank 0
    start = saved["step"] if saved else 0
    why = _problem(s, comm.size)
    if why is not None:
        raise DistributedUsageError(why)
    s["model"], s["precision"] = s["model"] or "mlp", s["precision"] or "mixed"
    s["seed"] = s["seed"] or 0
    if saved is None:
        s["steps"] = s["steps"] or DEFAULT_STEPS
    overrides = {k: s[k] for k in ("batch_size", "lr", "schedule") if s[k] is not None}
    task = TASKS[s["model"]](seed=s["seed"], device=s["device"], **overrides)
    extension = None
    if saved is not None:  # --steps and --extend against where the saved run stands, as `tinyamp train` checks them
        try:
            s["steps"], extension = run_settings.plan_resume(saved, s["steps"], s["extend"], task)
        except ValueError as exc:
            raise DistributedUsageError(str(exc)) from exc
    if task.batch_size % (comm.size * s["micro_batches"]):
        raise DistributedUsageError(f"the batch of {task.batch_size} does not split into {comm.size} ranks x "
                                    f"{s['micro_batches']} micro-batches; pass --batch-size")  # fmt: skip
    regime = REGIMES[s["precision"]]
    scaler_name = s["scaler"] or regime.scaler
    model = task.make_model()
    model.astype(regime.weights)
    if start:  # the whole file checked on rank 0 (settings, arrays, optimizer state) before any collective
        _shared_from_rank0(comm, lambda: _check_loads(s["resume"], model, task.make_optimizer, regime, scaler_name))
    dp = DataParallel(model, task.make_optimizer, comm, master_weights=regime.master_weights,
                      reduction=s["reduce_dtype"], zero=s["zero"], agree=s["agree"],
                      micro_batches=s["micro_batches"])  # fmt: skip
    rank_task = RankSlice(task, comm.rank, comm.size, s["micro_batches"])
    fault = Fault.parse(s["fault"]) if s["fault"] else None
    setup = DistributedSetup(regime, model, dp, make_scaler(scaler_name), None, rank_task=rank_task,
                             overflow_at=tuple(map(tuple, s["overflow_at"])), fault=fault)  # fmt: skip
    if start:
        checkpoint.load(s["resume"], dp, model, task.make_optimizer, setup.scaler)
    out = _on_rank0(comm, lambda: _checked_folder(OutputFolder, s["out"])) if s["out"] else None  # rank 0's
    distributed = {"ranks": comm.size, "reduce_dtype": s["reduce_dtype"], "zero": s["zero"], "agree": s["agree"],
                   "micro_batches": s["micro_batches"]}  # fmt: skip
    train = {k: s[k] for k in ("model", "precision", "seed")}  # the settings `tinyamp train --resume` reads
    train.update(scaler=scaler_name, batch_size=task.batch_size, lr=task.lr, schedule=task.schedule,
                 total_steps=s["steps"])  # fmt: skip
    if comm.rank == 0 and not getattr(args, "quiet", False):
        mode = "ZeRO-1 (masters and moments sharded)" if s["zero"] else "replicated masters"
        ranks = f"{comm.size} rank{'' if comm.size == 1 else 's'}"
        print(f"{task.name} in {s['precision']} on {ranks} x batch {task.batch_size // comm.size} "
              f"({mode}, gradients summed in {s['reduce_dtype']}, agreement {'on' if s['agree'] else 'OFF'}): "
              f"{s['steps']} steps, lr {task.lr} ({task.schedule}), seed {s['seed']}"
              f"{f', resumed at step {start}' if start else ''}")  # fmt: skip
    if comm.rank == 0 and extension is not None:
        print(extension)

    history = run_history.new(start)
    if start:  # the steps before `start`, read by every rank (rank 0 has checked them): every rank's result covers them
        from tinyamp.amp.training_state import read_extra

        extra = read_extra(s["resume"])
        if "history" in extra:
            history = run_history.from_extra(extra["history"], start, s["resume"])

    run = DistributedRun(task, setup, stop, train, start=start, history=history, out=out,
                         every=_checkpoint_every(s), writes=s["out"] is not None,  # the same on every rank
                         capture=lambda: _local_state(dp),
                         put_back=lambda state: _put_local_state(dp, state))  # fmt: skip
    run.distributed, run.flags, run.dump = distributed, _flags(s), bool(getattr(args, "dump", None))
    bar = progress_bar(comm.rank == 0 and not getattr(args, "quiet", False))
    with stop.at_step_boundaries(), np.errstate(all="ignore"):
        try:
            result = run.train(s["precision"], scaler_name, loop_task=rank_task, progress=bar,
                               memory=bool(getattr(args, "memory", False)))  # fmt: skip
        except Interrupted as exc:
            return run.stopped(exc)
        rows = exchange_json(comm, setup.row(result.skipped_steps))
        why = exchange_json(comm, explain(task, setup, result, start) if diverged(result) else None)
        failed = next((f"rank {r}: {w}" for r, w in enumerate(why) if w), None)  # the same on every rank
        step, twin = run.end_state(failed)  # collective: a diverged run's last good step, gathered from every rank
        if getattr(args, "dump", None):
            _dump(Path(args.dump), setup, dp, result, rows)
        if comm.rank == 0:
            print(format_table([result]))
            print(format_ranks(rows))
        return run.finish(result, failed, step, twin, {"distributed": {**distributed, "per_rank": rows}})


class DistributedRun(TrainingRun):
    """The run on N ranks: every rank steps, rank 0 speaks and writes; the collective parts, in step on every rank.

    The ranks stop at the signal any of them received, after the same step; a checkpoint is the
    single-process copy of the run (``checkpoint.single_process_copy``, gathered from every
    rank), which ``tinyamp train --resume`` reads as well.
    """

    where = " on every rank"
    distributed: dict[str, Any]  # the checkpoint's "distributed": ranks, reduce_dtype, zero, agree, micro_batches
    flags = ""  # the options of the command that continues the run, besides --resume and --out
    dump = False  # record a fingerprint after every step (tests compare them)

    @property
    def comm(self) -> Communicator:
        return self.setup.optimizer.comm

    @property
    def speaks(self) -> bool:
        return self.comm.rank == 0

    def signal(self) -> int:
        return signal_on_any_rank(self.comm, self.stop)

    def state_to_save(self) -> Any:
        return checkpoint.single_process_copy(self.setup.optimizer, self.setup.model, self.task.make_optimizer)

    def checkpoint_extra(self) -> dict[str, Any]:
        return {"distributed": self.distributed}

    def saved(self) -> None:
        self.comm.barrier()  # the checkpoint is on disk before any rank goes on (and may fail)

    def resume_line(self, checkpoint: Path, folder: Path) -> str:
        command = f"mpiexec -n {self.comm.size} python -m tinyamp.distributed"
        return f"{command} --resume {checkpoint} --out {folder}{self.flags}"

    def after_step(self, done: int) -> None:
        if self.dump:
            self.setup.record_fingerprint()
        super().after_step(done)


def _checkpoint_every(s: dict[str, Any]) -> int:
    """Steps between the checkpoints rank 0 saves with --out: --checkpoint-every, else the single-process default.

    With 0 here a run saved only at its end, so a rank killed at step 1400 of 1500 lost the whole run.
    """
    return run_settings.DEFAULT_CHECKPOINT_EVERY if s["checkpoint_every"] is None else s["checkpoint_every"]


def _local_state(dp: DataParallel) -> tuple[Any, Any, dict[str, Any]]:
    """Copies of what this rank holds of the run: the weights, its masters, its optimizer's state."""
    return dp.weights.copy(), dp.shard.tensor.data.copy(), dp.optimizer.state_dict()


def _put_local_state(dp: DataParallel, state: tuple[Any, Any, dict[str, Any]]) -> None:
    weights, masters, optimizer = state
    dp.weights[...] = weights  # in place: every parameter of the model views this vector
    dp.shard.tensor.data[...] = masters
    dp.optimizer.load_state_dict(optimizer)


def _flags(s: dict[str, Any]) -> str:
    """The options of the command that continues a stopped run, besides --resume and --out."""
    flags = [f"--device {s['device']}"] if s["device"] != "cpu" else []
    flags += [f"--reduce-dtype {s['reduce_dtype']}"] if s["reduce_dtype"] != "float32" else []
    flags += ["--zero"] if s["zero"] else []
    flags += [f"--micro-batches {s['micro_batches']}"] if s["micro_batches"] != 1 else []
    flags += ["--no-agree"] if not s["agree"] else []
    return "".join(" " + f for f in flags)


def _held_folder(path: str) -> Any:
    """Rank 0's OutputFolder for --out, locked against other runs (until run_distributed returns)."""
    from tinyamp.experiments.output_folder import OutputFolder

    for held in _LOCKED:
        if held.path == Path(path).absolute():
            return held
    out = OutputFolder(path, "--out")
    out.lock()
    _LOCKED.append(out)
    return out


def _checked_folder(folder_type: Any, path: str) -> Any:
    out = _held_folder(path)
    for sentence in out.recover():
        print(f"tinyamp: {out.path}: {sentence}", file=sys.stderr)
    out.check()
    return out


def _dump(folder: Path, setup: DistributedSetup, dp: DataParallel, result: Any, rows: list[dict[str, Any]]) -> None:
    """For tests and the tutorial: this rank's step-by-step digests, final arrays and scaler history."""
    masters, state = dp.gathered()  # collective
    folder.mkdir(parents=True, exist_ok=True)
    rank = dp.comm.rank
    host = {k: backend.to_device(v, "cpu") for k, v in state.items()}
    np.savez(folder / f"rank{rank}.npz", weights=backend.to_device(dp.weights[: dp.layout.total], "cpu"),
             masters=backend.to_device(masters, "cpu"), **{f"state_{k}": v for k, v in host.items()})  # fmt: skip
    info = {
        "fingerprints": setup.fingerprints, "scales": [e.scale_after for e in setup.scaler.history],
        "skipped": result.series["skipped"], "loss": result.series["loss"], "memory": dp.memory(),
        "parameters": dp.layout.total, "rows": rows, "finite": bool(math.isfinite(float(np.sum(
            backend.to_device(dp.weights, "cpu").astype(np.float64))))),
    }  # fmt: skip
    (folder / f"rank{rank}.json").write_text(json.dumps(info, default=float) + "\n", encoding="utf-8")
