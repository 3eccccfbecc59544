"""Grading each exercise in a child process: student code can end, hang or break only its own exercise.

For each exercise the parent copies the workspace into a throwaway folder and starts a child
process, which imports the student's code from that copy and runs the grader on it.  The parent
never imports student code, and it alone decides the verdict:

* the child sent a result and then ended normally: that result (passed, not started, failed);
* the child ran past the time limit: failed, "still running after 60 s: an infinite loop?";
* student code called ``sys.exit``, ``os._exit`` or raised a ``BaseException`` such as
  ``KeyboardInterrupt``: failed, with the call and the student's line;
* the child died of a signal, or ended with no result: failed, with the signal or the status.

Limits: a time limit per exercise (``DEFAULT_TIMEOUT`` seconds, ``DEEP`` times it with ``--deep``),
and on Linux a memory limit (``RLIMIT_AS``): the address space the child holds when it starts, plus
``DEFAULT_MEMORY_GIB``; ``containment`` adds the rest (limits the child cannot raise, every process it
starts killed with it, no standard input, a warning when the grader runs as root).  The throwaway copy
means a student's code that deletes or rewrites files changes only the copy it was given: never the
workspace, never another exercise's copy.  The child's one message back is JSON, read with a length
limit: a pickle would run whatever code it names in the grading command itself.

Children are forked where the OS can (Linux, macOS): the parent imports numpy, hypothesis and every
grader once, and each child starts with them already loaded (a fresh interpreter per exercise
would import them again, about half a second each).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from tinyamp.exercises import containment, holes
from tinyamp.exercises.catalog import DEEP, PACKAGE, Exercise, find

DEFAULT_TIMEOUT = 60.0  # seconds per exercise; the slowest reference solution takes about 3 s
DEFAULT_MEMORY_GIB = 2.0  # beyond what the grading process itself holds when the exercise starts
DEFAULT_JOBS = 2  # exercises graded at once (at most the CPU count)
MESSAGE_LIMIT = 2**16  # bytes of one message from a child; a verdict needs a few hundred
IGNORED = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".hypothesis", ".pytest_cache", ".venv", "venv")


@dataclass(frozen=True)
class Limits:
    """What one exercise's child may use: seconds of wall-clock time, bytes of memory beyond the grader's own."""

    seconds: float = DEFAULT_TIMEOUT
    memory_bytes: int | None = int(DEFAULT_MEMORY_GIB * 2**30)  # None: no limit

    @staticmethod
    def default(deep: bool = False) -> Limits:
        """The stated defaults; ``--deep`` draws DEEP times as many examples, so it gets DEEP times the time."""
        return Limits(DEFAULT_TIMEOUT * (DEEP if deep else 1))


def assert_passes(exercise_id: str, workspace: Path) -> None:
    """For the workspace's pytest file: fail the test with the grader's sentence unless the exercise passes.

    It grades as ``tinyamp exercises check`` does: in a child process, on a copy of the workspace.
    """
    import pytest

    from tinyamp.exercises.grading import FAILED, NOT_STARTED

    exercise = find(exercise_id)
    result = next(grade_isolated([exercise], Path(workspace)))
    if result.status == NOT_STARTED:
        pytest.fail(f"Exercise {exercise.number} is not started: {exercise.first_steps}", pytrace=False)
    if result.status == FAILED:
        pytest.fail(f"Exercise {exercise.number} failed: {result.message}", pytrace=False)


def grade_isolated(
    exercises: Sequence[Exercise], workspace: Path, deep: bool = False, limits: Limits | None = None, jobs: int = 1
) -> Iterator[Any]:
    """Grade each exercise in its own child process, up to `jobs` at once; yield the Results in the order given."""
    from tinyamp.exercises.grading import preload

    limits = limits or Limits.default(deep)
    preload(exercises)  # numpy, hypothesis and the graders, once, before the first fork
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    pending, running, done = list(exercises), [], {}
    containment.guard_the_grader(True)
    try:
        for exercise in exercises:
            while exercise.id not in done:
                while pending and len(running) < max(1, jobs):
                    nxt = pending.pop(0)
                    linked = _linked_file(Path(workspace))
                    if linked:
                        done[nxt.id] = _refused(nxt, linked)
                        continue
                    running.append(Child(context, nxt, Path(workspace), deep, limits))
                if not running:
                    continue
                soonest = min(child.deadline for child in running)
                wait([c.process.sentinel for c in running] + [c.receive for c in running if not c.ended],
                     max(0.0, min(soonest - time.monotonic(), CENSUS_EVERY)))  # fmt: skip
                for child in list(running):
                    child.drain()
                    child.census()
                    if child.forked_too_often or not child.process.is_alive() or time.monotonic() >= child.deadline:
                        done[child.exercise.id] = child.finish()
                        running.remove(child)
                        containment.kill_orphans(containment.STARTED)
            yield done[exercise.id]
    finally:
        with _signals_held():  # Ctrl-C, or the caller stopped early: no child outlives the grading, no copy is left
            for child in running:
                child.kill()
                child.finish()
            containment.kill_orphans(containment.STARTED)
            containment.guard_the_grader(False)


CENSUS_EVERY = 0.25  # seconds between two counts of the processes an exercise runs


def _linked_file(workspace: Path) -> str:
    """The first file of the workspace's package that is a symbolic link, as "myamp/x.py -> target" ("" if none)."""
    package = workspace / PACKAGE
    for path in sorted(package.rglob("*")) if package.is_dir() else []:
        if path.is_symlink():
            return f"{path.relative_to(workspace).as_posix()} -> {os.readlink(path)}"
    return ""


def _refused(exercise: Exercise, linked: str) -> Any:
    from tinyamp.exercises.grading import FAILED, Result

    return Result(exercise, FAILED, f"{linked} is a link: the grader grades the files in the workspace itself, so "
                                    "copy the code into it", 0.0)  # fmt: skip


@contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block ends (a second Ctrl-C must not stop the killing of children
    half way, leaving one running); where the OS cannot hold signals, the block runs as it is."""
    held = {signal.SIGINT, signal.SIGTERM}
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class CopyError(Exception):
    """The workspace could not be copied (an unreadable file): the message names the file."""


def _first_error(exc: BaseException) -> str:
    """shutil.Error carries a list of (source, destination, why); an OSError says it itself."""
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        source, _, why = exc.args[0][0]
        return f"{source}: {why}"
    return str(exc)


class Child:
    """One exercise's child process, its throwaway copy of the workspace, and what it has said so far."""

    def __init__(self, context: Any, exercise: Exercise, workspace: Path, deep: bool, limits: Limits) -> None:
        self.exercise, self.limits, self.shown = exercise, limits, str(workspace)
        self.folder = Path(tempfile.mkdtemp(prefix="tinyamp-grading-"))
        copy = self.folder / "workspace"
        try:
            shutil.copytree(workspace, copy, ignore=IGNORED, symlinks=True)
        except (OSError, shutil.Error) as exc:  # an unreadable file: the workspace cannot be graded as it is
            shutil.rmtree(self.folder, ignore_errors=True)
            raise CopyError(f"cannot copy the workspace {workspace} to grade it: {_first_error(exc)}") from None
        except BaseException:  # Ctrl-C in the middle of the copy: the half copy goes too
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        self.copy = str(copy)
        self.receive, send = context.Pipe(duplex=False)
        self.process = context.Process(
            target=_child,
            args=(exercise.id, str(copy), deep, limits.memory_bytes, send),
            name=f"grade-{exercise.id}",
        )
        self.start = time.monotonic()
        with warnings.catch_warnings(), _signals_held():  # Python 3.12+ warns of forking with threads (numpy's
            warnings.simplefilter("ignore", DeprecationWarning)  # idle BLAS pool); held: no child started unseen
            self.process.start()
            containment.STARTED.add(self.process.pid)
        send.close()  # the child holds the only writing end: its death reads as the end of the pipe
        self.deadline = self.start + limits.seconds
        self.messages: dict[str, Any] = {}
        self.timed_out = False
        self.forked_too_often = False
        self.ended = False  # the pipe reached its end: nothing more to wait for on it

    def drain(self) -> None:
        """Read what the child has sent, JSON: {"result": [status, message]} and, before an os._exit, {"exit": why}."""
        from tinyamp.exercises.grading import FAILED, NOT_STARTED, PASSED

        try:
            while not self.ended and self.receive.poll():
                message = json.loads(self.receive.recv_bytes(MESSAGE_LIMIT))
                kind, value = next(iter(message.items()))
                if kind == "result" and value[0] in (PASSED, NOT_STARTED, FAILED) and isinstance(value[1], str):
                    self.messages.setdefault(kind, (value[0], value[1][:MESSAGE_LIMIT]))
                elif kind == "exit" and isinstance(value, str):
                    self.messages.setdefault(kind, value[:MESSAGE_LIMIT])
                else:
                    raise ValueError("not a message")
        except Exception:  # the end of the pipe, or bytes that are not a message: the verdict says what happened
            self.ended = True

    def census(self) -> None:
        """Count the processes the exercise runs; past PROCESS_LIMIT, it is ended (a fork bomb)."""
        if self.process.pid is not None and containment.tree_size(self.process.pid) > containment.PROCESS_LIMIT:
            self.forked_too_often = True

    def kill(self) -> None:
        """SIGKILL the child and every process below it (those that left its process group included)."""
        if self.process.pid is None:
            return
        if containment.LINUX:
            containment.kill_tree(self.process.pid, include_root=self.process.exitcode is None)
        elif self.process.exitcode is None:
            self.process.kill()

    def finish(self) -> Any:
        """End the child if it still runs, remove its copy, and decide its exercise's Result."""
        from tinyamp.exercises.grading import Result

        if self.process.is_alive():
            self.timed_out = not self.forked_too_often
        self.kill()  # also when it ended: what it started may still run
        self.process.join()
        containment.STARTED.discard(self.process.pid)
        self.drain()
        self.receive.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        seconds = time.monotonic() - self.start
        status, message = self.verdict()
        message = message.replace(self.copy, self.shown)  # the child never learns where the workspace is
        return Result(self.exercise, status, message, min(seconds, self.limits.seconds) if self.timed_out else seconds)

    def verdict(self) -> tuple[str, str]:
        """(status, message) from what the child sent and how it ended."""
        from tinyamp.exercises.grading import FAILED

        code, result = self.process.exitcode, self.messages.get("result")
        if self.forked_too_often:
            return FAILED, (f"started more than {containment.PROCESS_LIMIT} processes at once (a fork bomb?): "
                            "the grading ended them all")  # fmt: skip
        if self.timed_out:
            if result is not None:
                return FAILED, (f"gave a verdict but was still running after {self.limits.seconds:g} s: a thread or "
                                "process of yours left running?")  # fmt: skip
            return FAILED, (f"still running after {self.limits.seconds:g} s: an infinite loop? (--timeout SECONDS "
                            "allows longer)")  # fmt: skip
        if result is not None and code == 0:
            return result
        if "exit" in self.messages:
            return FAILED, self.messages["exit"]
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            why = {"SIGKILL": " (out of memory?)", "SIGSEGV": " (a crash in compiled code?)",
                   "SIGXFSZ": f" (a file, or what it printed, reached {containment.OUTPUT_LIMIT // 2**20} MiB: an "
                              "endless print?)"}.get(name, "")  # fmt: skip
            return FAILED, f"the grading process was killed by {name}{why} before a verdict"
        return FAILED, f"the grading process ended with exit status {code} before a verdict (os._exit, or a crash?)"


def _child(exercise_id: str, copy: str, deep: bool, memory_bytes: int | None, send: Connection) -> None:
    """In the child: contained (``containment``), the copy as the current folder, the grade, one message back."""
    from tinyamp.exercises.grading import FAILED, aborted, grade

    root = Path(copy)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, not the grading command's handlers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):  # started while the parent held them (_signals_held)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    containment.contain_child(memory_bytes)
    _quiet(root / ".output")  # what student code prints goes to a file in the copy, not into the table
    os.chdir(root)
    sys.dont_write_bytecode = True
    _report_os_exit(send, root)
    for name in [n for n in list(sys.modules) if _is_solution(n)]:
        del sys.modules[name]  # so that an import of one, however made, loads it again and is seen
    loaded = set(sys.modules)
    try:
        result = grade(find(exercise_id), root, deep=deep)
        verdict = (result.status, result.message)
        if result.message.startswith("ran out of memory") and memory_bytes is not None:
            limit = f"; the limit is {memory_bytes / 2**30:g} GiB beyond the grader's own, --memory GIB"
            verdict = (FAILED, f"{result.message[:-1]}{limit})")
        solution = _solution_loaded(loaded)
        if solution:
            verdict = (FAILED, f"your code loaded {solution}, tinyamp's reference solution: write it yourself")
    except BaseException as exc:  # sys.exit, KeyboardInterrupt, ...: this exercise's verdict, not the grader's end
        verdict = (FAILED, aborted(exc, root))
    _send(send, "result", list(verdict))
    send.close()


def _send(send: Connection, kind: str, value: Any) -> None:
    send.send_bytes(json.dumps({kind: value}).encode())


def _solution_loaded(before: set[str]) -> str:
    """A module of tinyamp's reference solutions that grading loaded, found by the path of its file (they are
    not in an installed tinyamp; a checkout of the repository has them in tests/exercise_solutions/)."""
    for name in sorted(set(sys.modules) - before, key=len, reverse=True):  # the module itself, not its package
        if _is_solution(name):
            return name
    return ""


def _is_solution(name: str) -> bool:
    file = getattr(sys.modules.get(name), "__file__", None) or ""
    try:
        return bool(file) and Path(file).resolve().parent == holes.SOLUTIONS
    except (OSError, ValueError):
        return False


def _quiet(log: Path) -> None:
    """Send file descriptors 1 and 2 (and sys.stdout, sys.stderr) to `log`."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = sys.stderr = open(1, "w", closefd=False)  # noqa: SIM115  (lives as long as the child)


def _report_os_exit(send: Connection, root: Path) -> None:
    """Make os._exit, when student code calls it, say so (and where) before the process ends."""
    real_exit = os._exit

    from tinyamp.exercises.grading import student_line

    def _exit(status: int) -> None:
        where = student_line(traceback.extract_stack(), root)
        if where:  # the grader's own os._exit, at the end of the child, says nothing
            try:
                _send(send, "exit", f"called os._exit({status}) at {where}")
            except Exception:
                pass
        real_exit(status)

    os._exit = _exit
