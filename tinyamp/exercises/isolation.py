"""Grading each exercise in child processes: student code can end, hang or break only its own exercise, and
cannot forge its grade.

For each exercise the parent copies the workspace into a throwaway folder, reads the student's
file, and starts two child processes: the *grader*, forked before any student code runs, and the
*student's process*, which imports the student's code from the copy and answers the grader's
calls (``remote``): arguments and results travel as plain data (JSON; arrays as .npy bytes), so
the grader compares values it decoded itself with its own reference, and what student code
patches (tinyamp, NumPy, this package) is patched in the student's process only.  The grader
sends the verdict to the parent; neither the parent nor the grader ever runs student code, and
the student's process never holds the writing end of the verdict.  The parent decides:

* the grader sent a result and the student's process then ended normally: that result;
* either ran past the time limit: failed, "still running after 60 s: an infinite loop?";
* student code called ``sys.exit`` or raised a ``BaseException`` such as ``KeyboardInterrupt``:
  failed, with the call and the student's line (the grader's sentence); ``os._exit``: the same, from
  the note the student's process sends before it ends;
* the student's process sent a reply that is not plain data, too large, or not a reply at all:
  failed, with the grader's sentence;
* it died of a signal, or ended with no verdict: failed, with the signal or the status.

Limits: a time limit per exercise (``DEFAULT_TIMEOUT`` seconds, ``DEEP`` times it with ``--deep``),
and on Linux a memory limit (``RLIMIT_AS``) on the student's process: the address space it holds when
it starts, plus ``DEFAULT_MEMORY_GIB``; ``containment`` adds the rest (limits it cannot raise, every
process it starts killed with it, no standard input), and ``unprivileged`` runs it as ``nobody`` when the
grading command is root.  The throwaway copy means a student's code that deletes or rewrites files changes
only the copy it was given: never the workspace, never another exercise's copy.  Every message is JSON, read with a
length limit: a pickle would run whatever code it names in the process that reads it.

Children are forked where the OS can (Linux, macOS): the parent imports numpy, hypothesis and every
grader once, and each child starts with them already loaded (a fresh interpreter per exercise
would import them again, about half a second each).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import secrets
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

from tinyamp.exercises import containment, unprivileged
from tinyamp.exercises.catalog import DEEP, PACKAGE, Exercise, find
from tinyamp.exercises.reach import workspace_sources

DEFAULT_TIMEOUT = 60.0  # seconds per exercise; the slowest reference solution takes about 3 s
DEFAULT_MEMORY_GIB = 2.0  # beyond what the grading process itself holds when the exercise starts
DEFAULT_JOBS = 2  # exercises graded at once (at most the CPU count)
MESSAGE_LIMIT = 2**16  # bytes of one verdict from a grader; a verdict needs a few hundred
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
    plan = unprivileged.plan()  # as root: how the student's process gives root up
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
                    running.append(Child(context, nxt, Path(workspace), deep, limits, plan))
                if not running:
                    continue
                soonest = min(child.deadline for child in running)
                wait([s for c in running for s in c.sentinels()], max(0.0, min(soonest - time.monotonic(),
                                                                               CENSUS_EVERY)))  # fmt: skip
                for child in list(running):
                    child.drain()
                    child.census()
                    if child.done():
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
    """One exercise's two processes (the student's code, and its grader), its throwaway copy of the workspace, and
    what the grader has said so far."""

    def __init__(self, context: Any, exercise: Exercise, workspace: Path, deep: bool, limits: Limits,
                 plan: unprivileged.Plan | None = None) -> None:  # fmt: skip
        self.exercise, self.limits, self.shown = exercise, limits, str(workspace)
        self.folder = Path(tempfile.mkdtemp(prefix="tinyamp-grading-"))
        copy = self.folder / f"workspace-{secrets.token_hex(8)}"  # a name another grading's student cannot guess
        plan = plan or unprivileged.Plan()
        try:
            shutil.copytree(workspace, copy, ignore=IGNORED, symlinks=True)
            if plan.user is not None:
                unprivileged.hand_over(self.folder, copy, plan.user)
        except (OSError, shutil.Error) as exc:  # an unreadable file: the workspace cannot be graded as it is
            shutil.rmtree(self.folder, ignore_errors=True)
            raise CopyError(f"cannot copy the workspace {workspace} to grade it: {_first_error(exc)}") from None
        except BaseException:  # Ctrl-C in the middle of the copy: the half copy goes too
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        self.copy = str(copy)
        try:  # read before any student code runs: the source checks read the files as they were handed in
            source: str | None = (copy / exercise.path).read_text()
        except (OSError, UnicodeDecodeError):
            source = None
        sources = workspace_sources(copy)
        self.receive, send = context.Pipe(duplex=False)  # grader -> this process: the verdict
        VERDICTS.add(self.receive.fileno())
        grader_end, student_end = context.Pipe(duplex=True)  # grader <-> student: requests and replies
        self.grader = context.Process(target=_grader, name=f"grader-{exercise.id}",
                                      args=(exercise.id, str(copy), deep, limits.memory_bytes, source, sources,
                                            grader_end, send, student_end))  # fmt: skip
        self.process = context.Process(target=_student, name=f"grade-{exercise.id}",
                                       args=(str(copy), limits.memory_bytes, student_end, plan))  # fmt: skip
        self.start = time.monotonic()
        with warnings.catch_warnings(), _signals_held():  # Python 3.12+ warns of forking with threads (numpy's
            warnings.simplefilter("ignore", DeprecationWarning)  # idle BLAS pool); held: no child started unseen
            self.grader.start()
            containment.STARTED.add(self.grader.pid)
            send.close()  # the grader holds the only writing end of the verdict: the student's process never has it
            grader_end.close()
            self.process.start()
            containment.STARTED.add(self.process.pid)
        student_end.close()  # the student's process holds the only other end: its death reads as the end of the pipe
        self.deadline = self.start + limits.seconds
        self.messages: dict[str, Any] = {}
        self.timed_out = False
        self.forked_too_often = False
        self.ended = False  # the verdict pipe reached its end: nothing more to wait for on it

    def sentinels(self) -> list[Any]:
        """What the grading command waits on for this exercise."""
        return [self.process.sentinel, self.grader.sentinel] + ([self.receive] if not self.ended else [])

    def done(self) -> bool:
        """Finished: the grader ended and the student's process too (or the grader ended without a verdict,
        or the exercise ran past its time or forked too often)."""
        if self.forked_too_often or time.monotonic() >= self.deadline:
            return True
        if self.grader.is_alive():
            return False
        self.drain()
        return not self.process.is_alive() or not ({"result", "lost"} & set(self.messages))

    def drain(self) -> None:
        """Read what the grader has sent, JSON: {"result": [status, message]} or {"lost": [why, exit note]}."""
        from tinyamp.exercises.grading import FAILED, NOT_STARTED, PASSED

        try:
            while not self.ended and self.receive.poll():
                message = json.loads(self.receive.recv_bytes(MESSAGE_LIMIT))
                kind, value = next(iter(message.items()))
                if kind == "result" and value[0] in (PASSED, NOT_STARTED, FAILED) and isinstance(value[1], str):
                    self.messages.setdefault(kind, (value[0], value[1][:MESSAGE_LIMIT]))
                elif kind == "lost" and all(isinstance(v, str) for v in value) and len(value) == 2:
                    self.messages.setdefault(kind, (value[0][:MESSAGE_LIMIT], value[1][:MESSAGE_LIMIT]))
                else:
                    raise ValueError("not a message")
        except Exception:  # the end of the pipe, or bytes that are not a message: the verdict says what happened
            self.ended = True

    def census(self) -> None:
        """Count the processes the student's code runs; past PROCESS_LIMIT, it is ended (a fork bomb)."""
        if self.process.pid is not None and containment.tree_size(self.process.pid) > containment.PROCESS_LIMIT:
            self.forked_too_often = True

    def kill(self) -> None:
        """SIGKILL both processes and every process below them (those that left their process group included)."""
        for process in (self.process, self.grader):
            if process.pid is None:
                continue
            if containment.LINUX:
                containment.kill_tree(process.pid, include_root=process.exitcode is None)
            elif process.exitcode is None:
                process.kill()

    def finish(self) -> Any:
        """End the processes if they still run, remove the copy, and decide the exercise's Result."""
        from tinyamp.exercises.grading import Result

        if (self.process.is_alive() or self.grader.is_alive()) and time.monotonic() >= self.deadline:
            self.timed_out = not self.forked_too_often
        self.drain()
        self.kill()  # also when they ended: what they started may still run
        for process in (self.process, self.grader):
            process.join()
            containment.STARTED.discard(process.pid)
        self.drain()
        VERDICTS.discard(self.receive.fileno())
        self.receive.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        seconds = time.monotonic() - self.start
        status, message = self.verdict()
        message = message.replace(self.copy, self.shown)  # the child never learns where the workspace is
        return Result(self.exercise, status, message, min(seconds, self.limits.seconds) if self.timed_out else seconds)

    def verdict(self) -> tuple[str, str]:
        """(status, message) from what the grader sent and how the student's process ended."""
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
        why, exit_note = self.messages.get("lost", ("", ""))
        if why:  # a reply too large or unreadable: the grader's sentence
            return FAILED, why
        if exit_note:
            return FAILED, exit_note
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            why = {"SIGKILL": " (out of memory?)", "SIGSEGV": " (a crash in compiled code?)",
                   "SIGXFSZ": f" (a file, or what it printed, reached {containment.OUTPUT_LIMIT // 2**20} MiB: an "
                              "endless print?)"}.get(name, "")  # fmt: skip
            return FAILED, f"the grading process was killed by {name}{why} before a verdict"
        if result is None and "lost" not in self.messages:
            return FAILED, (f"the grader ended before a verdict (exit status {self.grader.exitcode}): tinyamp's own "
                            "error, or your code stopped it")  # fmt: skip
        if code == 0 and "lost" in self.messages:
            return FAILED, "your code stopped answering the grader (it closed its end of the pipe?) before a verdict"
        return FAILED, f"the grading process ended with exit status {code} before a verdict (os._exit, or a crash?)"


VERDICTS: set[int] = set()  # the file descriptors of the verdict pipes the grading command reads now


def _started_in_a_child() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, not the grading command's handlers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):  # started while the parent held them (_signals_held)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def _student(copy: str, memory_bytes: int | None, connection: Connection, plan: unprivileged.Plan) -> None:
    """The student's process: no longer root (``unprivileged``'s `plan`), contained (``containment``), the copy
    as the current folder, answering the grader."""
    from tinyamp.exercises.remote import Server, is_solution

    root = Path(copy)
    for fd in VERDICTS:  # the ends the grading command reads verdicts from, inherited by the fork: not theirs
        try:
            os.close(fd)
        except OSError:
            pass
    _started_in_a_child()
    plan.apply(copy)  # first: the limits below then bind it (and as nobody, its process count is nobody's)
    containment.contain_child(memory_bytes)
    _quiet(root / ".output")  # what student code prints goes to a file in the copy, not into the table
    os.chdir(root)
    sys.dont_write_bytecode = True
    _report_os_exit(connection, root)
    for name in [n for n in list(sys.modules) if is_solution(n)]:
        del sys.modules[name]  # so that an import of one, however made, loads it again and is seen
    Server(connection, root).serve()
    connection.close()


def _grader(exercise_id: str, copy: str, deep: bool, memory_bytes: int | None, source: str | None,
            sources: dict[str, str], connection: Connection, send: Connection, student_end: Connection
            ) -> None:  # fmt: skip
    """The grader's process: forked from the grading command before any student code ran, it never runs any.

    It grades with ``grading.grade``, every call of the student's code a message to the student's process
    (``remote``), and sends the verdict to the grading command."""
    from tinyamp.exercises.grading import FAILED, grade
    from tinyamp.exercises.remote import ChildLost, Student

    student_end.close()  # the student's end is the student's
    _started_in_a_child()
    if hasattr(os, "setsid"):
        os.setsid()  # the terminal's Ctrl-C reaches the grading command, which ends this process
    root = Path(copy)
    _no_workspace_on_the_path()
    private = Path(tempfile.mkdtemp(prefix="grader-", dir=root.parent))
    _quiet(private / "output")  # hypothesis's reports: not into the table
    os.chdir(private)  # hypothesis's example database (--deep), if any, lands here
    student = Student(connection)
    try:
        result = grade(find(exercise_id), root, deep=deep, student=student, source=source, sources=sources)
        verdict = (result.status, result.message)
        if result.message.startswith("ran out of memory") and memory_bytes is not None:
            limit = f"; the limit is {memory_bytes / 2**30:g} GiB beyond the grader's own, --memory GIB"
            verdict = (FAILED, f"{result.message[:-1]}{limit})")
        solution = student.ask({"op": "solutions"})
        if solution and isinstance(solution, str):
            verdict = (FAILED, f"your code loaded {solution}, tinyamp's reference solution: write it yourself")
    except ChildLost as exc:
        _send(send, "lost", [exc.sentence, student.exit_note])
        return
    _send(send, "result", list(verdict))
    send.close()
    try:
        connection.send_bytes(json.dumps({"op": "quit"}).encode())
    except OSError:
        pass


def _no_workspace_on_the_path() -> None:
    """In the grader: no import may find a student's file.  ``python -m`` puts the folder the command started in
    on sys.path (a workspace, when it is graded from inside it), and "" is whatever folder is current: both go,
    with any folder that holds a workspace, before anything the grader imports late (ml_dtypes, for bfloat16)."""
    sys.path[:] = [p for p in sys.path if p and not (Path(p) / PACKAGE).is_dir() and Path(p).resolve() != Path.cwd()]


def _send(send: Connection, kind: str, value: Any) -> None:
    send.send_bytes(json.dumps({kind: value}).encode())


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

    from tinyamp.exercises.student_lines import student_line

    def _exit(status: int) -> None:
        where = student_line(traceback.extract_stack(), root)
        if where:  # the grader's own os._exit, at the end of the child, says nothing
            try:
                _send(send, "exit", f"called os._exit({status}) at {where}")
            except Exception:
                pass
        real_exit(status)

    os._exit = _exit
