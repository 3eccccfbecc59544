"""Grading one exercise of a workspace: load the student's code, check it is theirs, run its grader.

The result is passed, not started (the stub still raises NotImplementedError) or failed,
with the first counterexample in words and the student's line: where their code raised,
or else the definition that gave the wrong value.  ``tinyamp exercises check`` calls
``grade`` in a child process per exercise (``isolation``), never in its own.  A normal
check draws the same examples on every run, so the same code always gets the same verdict;
``--deep`` draws new random ones, ten times as many, to look further.  Before the grader
runs, its source is read (``source_checks``): the graded function or class is defined in the
workspace's file (not imported from tinyamp); it reaches no name the reader cannot follow
(``getattr`` or an import with a computed name, ``eval``); it does not use tinyamp's own
implementation of the mechanism (the exercise's ``forbidden`` names, followed through imports,
aliases, helpers, ``importlib`` and ``__import__``); and, for exercises about rounding by hand,
it does not call NumPy's conversion to float16, however spelled.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import time
import traceback
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tinyamp.exercises.catalog import DEEP, PACKAGE, Exercise
from tinyamp.exercises.source_checks import dynamic_access, float8_mention, float16_conversion, tinyamp_names_used

PASSED, NOT_STARTED, FAILED = "passed", "not started", "failed"


@dataclass(frozen=True)
class Result:
    """One row of the table ``tinyamp exercises check`` prints."""

    exercise: Exercise
    status: str  # PASSED, NOT_STARTED or FAILED
    message: str  # why it failed (the first counterexample in words), or the stub's message; "" when passed
    seconds: float


class NotTheirs(Exception):
    """The graded name is missing, imported, or built on tinyamp's own implementation."""


def grade(exercise: Exercise, workspace: Path, deep: bool = False) -> Result:
    """Grade `exercise` in `workspace` (hypothesis examples: the exercise's budget, DEEP times it with `deep`)."""
    from tinyamp.testing.counterexamples import same_examples_every_run  # hypothesis loads only to grade

    start, workspace, definition = time.perf_counter(), Path(workspace), ""
    # the grader is fetched before the student's module runs: code that replaces it on import comes too late
    grader = getattr(importlib.import_module(f"tinyamp.exercises.graders.{exercise.module}"), exercise.grader)
    try:
        graded = load(exercise, workspace)
        definition = f"{exercise.name}, {exercise.path}:{_first_line(graded)}"
        with np.errstate(all="ignore"), warnings.catch_warnings(), same_examples_every_run(not deep):
            warnings.simplefilter("ignore")  # a student's overflow warnings are not the verdict
            grader(graded, exercise.examples * (DEEP if deep else 1))
    except NotImplementedError as exc:
        return Result(exercise, NOT_STARTED, str(exc) or "raises NotImplementedError", time.perf_counter() - start)
    except Exception as exc:  # a counterexample, code that is not theirs, or their exception the grader stopped on
        return Result(exercise, FAILED, failure(exc, workspace, definition), time.perf_counter() - start)
    return Result(exercise, PASSED, "", time.perf_counter() - start)


def failure(exc: Exception, workspace: Path, definition: str) -> str:
    """The reason in one line, ending with the student's line where their code raised, else their definition.

    `definition` is "name, myamp/file.py:LINE" ("" when the code did not load: the message names the file).
    """
    where = raised_at(exc, workspace)
    if any(isinstance(e, MemoryError) for e in _chain(exc)):
        return f"ran out of memory{f' at {where}' if where else ''} (MemoryError)"
    if isinstance(exc, (AssertionError, NotTheirs)):
        message = _one_line(exc)
    else:  # e.g. hypothesis's Flaky: the same input failed once and passed once (shared state?)
        message = f"the grader stopped on {type(exc).__name__}: {_one_line(exc)}"
    if where:
        return f"{message} (at {where})"
    return f"{message} ({definition})" if definition and not isinstance(exc, NotTheirs) else message


def aborted(exc: BaseException, workspace: Path) -> str:
    """The reason when student code ended the grading itself: sys.exit, KeyboardInterrupt, another BaseException."""
    where = raised_at(exc, workspace)
    at = f" at {where}" if where else ""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r}){at}: a graded function must return, not end the program"
    text = _one_line(exc)
    return f"raised {type(exc).__name__}{f': {text}' if text else ''}{at}"


def raised_at(exc: BaseException, workspace: Path) -> str:
    """Where student code raised `exc` (or the exception that caused it): "myamp/backward.py:12", "" if not theirs.

    The innermost exception of the chain that passed through the workspace's files, its deepest frame there;
    for a SyntaxError, the line that does not parse (no frame of the student's file ran).
    """
    for e in reversed(_chain(exc)):
        frames = traceback.extract_tb(e.__traceback__)
        if isinstance(e, SyntaxError) and e.filename:
            frames = [traceback.FrameSummary(e.filename, e.lineno or 0, "<module>")]
        where = student_line(frames, workspace)
        if where:
            return where
    return ""


def student_line(frames: Iterable[traceback.FrameSummary], workspace: Path) -> str:
    """The last of `frames` in a file inside `workspace`, as "myamp/backward.py:12" ("" if none is)."""
    root = Path(workspace).resolve()
    found = ""
    for frame in frames:
        if frame.filename.startswith("<"):  # "<string>", "<frozen importlib._bootstrap>": no file, although
            continue  # resolved against the current folder (the workspace, while grading) it would name one there
        try:
            relative = Path(frame.filename).resolve().relative_to(root)
        except (OSError, ValueError):  # a file elsewhere (the grader, numpy)
            continue
        found = f"{relative.as_posix()}:{frame.lineno}"
    return found


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc`, then what caused it, then what caused that...: outermost first."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def _first_line(graded: Any) -> int:
    try:
        return inspect.getsourcelines(graded)[1]
    except (OSError, TypeError):
        return 0


def preload(exercises: Iterable[Exercise]) -> None:
    """Import hypothesis and the graders of `exercises` (tinyamp's code only): child processes start with them."""
    import tinyamp.testing.counterexamples  # noqa: F401

    for module in dict.fromkeys(e.module for e in exercises):
        importlib.import_module(f"tinyamp.exercises.graders.{module}")


def load(exercise: Exercise, workspace: Path) -> Any:
    """The function or class the exercise grades, imported afresh from the workspace and checked to be the student's."""
    path = (workspace / exercise.path).resolve()
    if not path.is_file():
        raise NotTheirs(f"{exercise.path} is missing from {workspace}: is it a workspace (tinyamp exercises init)?")
    module = _fresh_import(workspace, exercise.module)
    graded = getattr(module, exercise.name, None)
    if graded is None:
        raise NotTheirs(f"{exercise.path} has no {exercise.name}: the grader looks for that name")
    try:
        source_file = Path(inspect.getsourcefile(graded) or "").resolve()
    except TypeError:
        raise NotTheirs(f"{exercise.name} in {exercise.path} must be a function or class defined there") from None
    if source_file != path:
        raise NotTheirs(
            f"{exercise.name} in {exercise.path} is not yours: it comes from {source_file}. Write it in "
            f"{exercise.path}; the grader grades the code there"
        )
    source = path.read_text()
    dynamic = dynamic_access(source, exercise.name)
    if dynamic:
        raise NotTheirs(
            f"{exercise.name} reaches a name the grader cannot follow ({dynamic}): Exercise {exercise.number} must "
            f"not use {', '.join(exercise.forbidden)}, so the grader reads every name you use: write them directly"
        )
    roots = tuple(dict.fromkeys(["tinyamp", *(f.split(".")[0] for f in exercise.forbidden)]))
    names = tinyamp_names_used(source, exercise.name, roots)
    used = sorted(name for name in names if _forbidden(name, exercise.forbidden))
    if used:
        whose = "tinyamp's own version" if used[0].startswith("tinyamp") else "a library's version"
        raise NotTheirs(
            f"{exercise.name} uses {used[0]}, {whose} of what Exercise {exercise.number} asks you to build: write it "
            "yourself"
        )
    if exercise.no_float8_casts:
        mention = float8_mention(source, exercise.name)
        if mention:
            raise NotTheirs(
                f"{exercise.name} names an FP8 type ({mention}): Exercise {exercise.number} asks you to "
                f"{exercise.by_hand}"
            )
    if exercise.no_float16_casts:
        cast = float16_conversion(source, exercise.name)
        if cast.endswith("<a dtype not written by name>)"):
            raise NotTheirs(
                f"{exercise.name} converts to a dtype the grader cannot read ({cast}): Exercise {exercise.number} "
                "forbids NumPy's conversion to float16, so write every dtype by name (np.uint32, 'float32')"
            )
        if cast:
            raise NotTheirs(
                f"{exercise.name} converts to float16 with NumPy ({cast}): Exercise {exercise.number} asks you to "
                f"{exercise.by_hand}"
            )
    return graded


def _fresh_import(workspace: Path, module: str) -> Any:
    """Import ``myamp.<module>`` from `workspace`, never a cached copy (a process may grade several workspaces)."""
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
        del sys.modules[name]
    root = str(workspace.resolve())
    sys.path.insert(0, root)
    try:
        return importlib.import_module(f"{PACKAGE}.{module}")
    except NotImplementedError:
        raise
    except Exception as exc:  # a syntax error, a failed import: the student's file does not load
        raise NotTheirs(f"{PACKAGE}/{module}.py does not import: {type(exc).__name__}: {exc}") from exc
    finally:
        sys.path.remove(root)


def _forbidden(name: str, forbidden: tuple[str, ...]) -> bool:
    return any(name == f or name.startswith(f + ".") for f in forbidden)


def _one_line(exc: BaseException) -> str:
    """The message without hypothesis's notes, on one line."""
    return " ".join(str(exc).split())
