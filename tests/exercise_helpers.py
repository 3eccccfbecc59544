"""What the exercise tests share: the catalog's ids, each exercise's stub, solution and grader, and a channel
student code can write to whoever it runs as."""

from __future__ import annotations

import functools
import importlib
import os
import tempfile
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tinyamp.exercises import holes
from tinyamp.exercises.catalog import EXERCISES, find
from tinyamp.exercises.grading import FAILED  # noqa: F401  (for the tests that grade with grade_remote)

ROOT = Path(__file__).resolve().parents[1]
IDS = [e.id for e in EXERCISES]


def module_of(kind: str, module: str) -> Any:
    """graders/<module>.py of the package, or the reference solution (tests/exercise_solutions/, not in the package)."""
    if kind == "solutions":
        return importlib.import_module(f"exercise_solutions.{module}")
    return importlib.import_module(f"tinyamp.exercises.{kind}.{module}")


@functools.cache
def stub_module(module: str) -> types.ModuleType:
    """The stub a workspace gets (``holes.stub``), run as a module."""
    stub = types.ModuleType(f"myamp.{module}")
    exec(compile(holes.stub(module), f"myamp/{module}.py", "exec"), stub.__dict__)  # noqa: S102
    return stub


def solution(exercise_id: str) -> Any:
    e = find(exercise_id)
    return getattr(module_of("solutions", e.module), e.name)


def grader(exercise_id: str) -> Callable[[Any, int], None]:
    e = find(exercise_id)
    return getattr(module_of("graders", e.module), e.grader)


def grade_remote(exercise: Any, workspace: Path, deep: bool = False, sources: dict[str, str] | None = None) -> Any:
    """``grading.grade`` as ``tinyamp exercises check`` runs it: the student's code in a forked process of its own,
    every call a message (``remote``); the verdict here.  (No copy, no limits: those are ``isolation``'s.)  With
    `sources`, the source checks read those texts instead of the workspace's files."""
    import json
    import multiprocessing
    import warnings

    from tinyamp.exercises.grading import grade, preload
    from tinyamp.exercises.reach import workspace_sources
    from tinyamp.exercises.remote import Student

    preload([exercise])  # the graders register their harnesses: the student's process starts with them
    mine, theirs = multiprocessing.get_context("fork").Pipe(duplex=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # forking with threads (Python 3.12+)
        process = multiprocessing.get_context("fork").Process(target=_serve, args=(theirs, Path(workspace)))
        process.start()
    theirs.close()
    try:
        sources = workspace_sources(Path(workspace)) if sources is None else sources  # given: what the checks read
        source = sources.get(f"myamp.{exercise.module}", "")
        return grade(exercise, Path(workspace), deep=deep, student=Student(mine), source=source, sources=sources)
    finally:
        try:
            mine.send_bytes(json.dumps({"op": "quit"}).encode())
        except OSError:
            pass
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join()
        mine.close()


def _serve(connection: Any, workspace: Path) -> None:
    from tinyamp.exercises.remote import Server

    Server(connection, workspace).serve()


class Channel:
    """A FIFO student code can write its pids into, whoever it runs as: root, nobody, or user 0 with every file
    read-only (writing into a FIFO changes no file system).  The test holds the reading end from the start."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="tinyamp-test-"))  # not pytest's tmp_path: root's alone (0700)
        os.chmod(self.folder, 0o755)
        self.path = self.folder / "fifo"
        os.mkfifo(self.path, 0o666)
        os.chmod(self.path, 0o666)
        self.reading = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self.heard = b""

    def read(self) -> str:
        """Everything written so far."""
        while True:
            try:
                chunk = os.read(self.reading, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            self.heard += chunk
        return self.heard.decode()
