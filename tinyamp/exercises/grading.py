"""Grading one exercise of a workspace: load the student's code, check it is theirs, run its grader.

The result is passed, not started (the stub still raises NotImplementedError) or failed,
with the first counterexample in words and the student's line: where their code raised,
or else the definition that gave the wrong value.  ``tinyamp exercises check`` calls
``grade`` in a grader process per exercise, forked before any student code ran, while the
student's code runs in a second, contained process (``isolation``): every call the grader makes
of it travels there and back as plain data (``remote``), so the verdict is decided by tinyamp's
code alone, from values it checks against its own reference, in a process student code never
ran in (patching tinyamp, NumPy or this module patches the student's process only).  A normal
check draws the same examples on every run, so the same code always gets the same verdict;
``--deep`` draws new random ones, ten times as many, to look further.  Before the grader
runs, its source is read (``source_checks``, on the files as they were before any student code
ran): the graded function or class is defined in the workspace's file (the student's process says
where it was defined, this one decides; not imported from tinyamp); and it, and every definition
it reaches in the workspace's other files (``reach``: helpers, relative imports, transitively),
reach no name the reader cannot follow (``getattr`` or an import with a computed name, ``eval``),
no module the grader cannot read (outside the workspace as handed in, the standard library, NumPy,
ml_dtypes and tinyamp; ``pickle``, ``sys.path``), not tinyamp's own implementation of the
mechanism (the exercise's ``forbidden`` names, followed through imports, aliases, ``importlib`` and
``__import__``) and, for exercises about rounding by hand, not NumPy's conversion to float16,
however spelled.  First of all, before the student's process is asked anything, no workspace file
that runs on that import may change a module it imported (``np.isnan = ...``, a grader's function
replaced) or use one that runs code given as data (``reach.patching``).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tinyamp.exercises.catalog import DEEP, PACKAGE, Exercise
from tinyamp.exercises.reach import (
    WHOLE,
    bound_names,
    file_of,
    imported_on_load,
    patching,
    reached,
    references,
    star_import,
    unreadable_module,
    workspace_sources,
)
from tinyamp.exercises.source_checks import dynamic_access, float8_mention, float16_conversion, tinyamp_names_used
from tinyamp.exercises.student_lines import _chain, _first_line, raised_at, student_line  # noqa: F401  (their home)

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


def grade(exercise: Exercise, workspace: Path, deep: bool = False, student: Any = None, source: str | None = None,
          sources: dict[str, str] | None = None) -> Result:  # fmt: skip
    """Grade `exercise` in `workspace` (hypothesis examples: the exercise's budget, DEEP times it with `deep`).

    With `student` (a ``remote.Student``, the grader's end of the pipe to the student's process) the
    student's code runs there and `source` is the text of their file, `sources` every .py file of the
    workspace (``reach.workspace_sources``), read before their process started; without it, it is
    imported into this process (tests of the graders do that).
    """
    from tinyamp.exercises.remote import GradingEnded
    from tinyamp.testing.counterexamples import same_examples_every_run  # hypothesis loads only to grade

    start, workspace, definition = time.perf_counter(), Path(workspace), ""
    # the grader is fetched before the student's module runs: code that replaces it on import comes too late
    grader = getattr(importlib.import_module(f"tinyamp.exercises.graders.{exercise.module}"), exercise.grader)
    try:
        if student is None:
            graded = load(exercise, workspace)
            definition = f"{exercise.name}, {exercise.path}:{_first_line(graded)}"
        else:
            graded, line = load_remote(exercise, workspace, student, source, sources)
            definition = f"{exercise.name}, {exercise.path}:{line}"
        with np.errstate(all="ignore"), warnings.catch_warnings(), same_examples_every_run(not deep):
            warnings.simplefilter("ignore")  # a student's overflow warnings are not the verdict
            grader(graded, exercise.examples * (DEEP if deep else 1))
    except NotImplementedError as exc:
        return Result(exercise, NOT_STARTED, str(exc) or "raises NotImplementedError", time.perf_counter() - start)
    except GradingEnded as exc:  # a result that is not plain data, sys.exit: the sentence says it
        return Result(exercise, FAILED, exc.sentence, time.perf_counter() - start)
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


def preload(exercises: Iterable[Exercise]) -> None:
    """Import hypothesis and the graders of `exercises` (tinyamp's code only): child processes start with them."""
    import tinyamp.testing.counterexamples  # noqa: F401

    try:  # bfloat16 and the FP8 types: loaded late, it costs every process that needs it half a second
        import ml_dtypes  # noqa: F401
    except ImportError:
        pass

    for module in dict.fromkeys(e.module for e in exercises):
        importlib.import_module(f"tinyamp.exercises.graders.{module}")


def load(exercise: Exercise, workspace: Path) -> Any:
    """The function or class the exercise grades, imported afresh from the workspace into this process and checked
    to be the student's."""
    path = (workspace / exercise.path).resolve()
    if not path.is_file():
        raise NotTheirs(f"{exercise.path} is missing from {workspace}: is it a workspace (tinyamp exercises init)?")
    module = _fresh_import(workspace, exercise.module)
    graded = getattr(module, exercise.name, None)
    if graded is None:
        raise NotTheirs(f"{exercise.path} has no {exercise.name}: the grader looks for that name")
    try:
        source_file: Path | None = Path(inspect.getsourcefile(graded) or "").resolve()
    except TypeError:
        source_file = None
    check_source(exercise, path, source_file, path.read_text(), workspace_sources(workspace))
    return graded


def load_remote(exercise: Exercise, workspace: Path, student: Any, source: str | None,
                sources: dict[str, str] | None = None) -> tuple[Any, int]:  # fmt: skip
    """The proxy of the graded function or class in the student's process, and the line of its definition.

    Their process imports the module and says where the name was defined; this process decides: the
    checks of ``load``, on `source`, the file as it was before their code ran.
    """
    from tinyamp.exercises.remote import Remote

    path = (workspace / exercise.path).resolve()
    if source is None:
        raise NotTheirs(f"{exercise.path} is missing from {workspace}: is it a workspace (tinyamp exercises init)?")
    no_patching(exercise, source, sources)
    try:
        info = student.ask({"op": "load", "module": exercise.module, "name": exercise.name})
    except NotImplementedError:
        raise
    except Exception as exc:  # a syntax error, a failed import: the student's file does not load
        raise NotTheirs(f"{PACKAGE}/{exercise.module}.py does not import: {type(exc).__name__}: {exc}") from exc
    if type(info) is not dict or not info.get("found"):
        raise NotTheirs(f"{exercise.path} has no {exercise.name}: the grader looks for that name")
    file = info.get("file")
    defined_in = Path(file) if type(file) is str and info.get("kind") != "other" else None
    check_source(exercise, path, defined_in, source, sources)
    line = info.get("line")
    return Remote(student, 0, exercise.name), line if type(line) is int else 0


def no_patching(exercise: Exercise, source: str, sources: dict[str, str] | None) -> None:
    """NotTheirs if a workspace file that runs when the graded module is imported (``reach.imported_on_load``)
    changes a module it imported or uses one that runs code given as data: checked before the student's process
    is asked anything, since that import is what runs the change."""
    module = f"{PACKAGE}.{exercise.module}"
    sources = {**(sources or {}), module: source}
    for loaded in imported_on_load(sources, module):  # what runs on import, reached or not
        changes = patching(sources[loaded], loaded, sources)
        if changes:
            raise NotTheirs(f"{file_of(loaded, sources)} {changes}: the grader cannot tell what such "
                            "code changes, so it grades none of it (leave the modules you import as they are)")


def check_source(exercise: Exercise, path: Path, source_file: Path | None, source: str,
                 sources: dict[str, str] | None = None) -> None:  # fmt: skip
    """NotTheirs unless the graded name was defined in `path` (`source_file`, None if it is no function or class),
    and neither its `source` nor any workspace code it reaches (``reach``, in `sources`) uses what the exercise
    forbids or a module the grader cannot read."""
    if source_file is None:
        raise NotTheirs(f"{exercise.name} in {exercise.path} must be a function or class defined there")
    if source_file != path:
        raise NotTheirs(
            f"{exercise.name} in {exercise.path} is not yours: it comes from {source_file}. Write it in "
            f"{exercise.path}; the grader grades the code there"
        )
    if exercise.name not in bound_names(source):  # where the student's process said it was defined, read here
        raise NotTheirs(f"{exercise.path} has no {exercise.name}: the grader looks for that name")
    module = f"{PACKAGE}.{exercise.module}"
    sources = {**(sources or {}), module: source}  # the graded file as the grader read it
    no_patching(exercise, source, sources)
    for where, name in reached(sources, module, exercise.name):
        text = sources.get(where)
        if text is None:
            continue
        who = exercise.name if (where, name) == (module, exercise.name) else (
            f"{exercise.name}, through {file_of(where, sources)}{f' ({name})' if name else ''},")
        try:  # (patching: no_patching above read every file an import of the graded module runs)
            star = star_import(text)
            if star:
                raise NotTheirs(f"{who} is in a file with a star import ({star}): the grader cannot tell which names "
                                "it binds, so import each name you use by name")  # fmt: skip
            _check_code(exercise, who, text, name or WHOLE)
            for full, line in references(text, where, name, sources):
                if _forbidden(full, exercise.forbidden):
                    raise NotTheirs(f"{who} uses {full} (line {line}), tinyamp's own version of what Exercise "
                                    f"{exercise.number} asks you to build: write it yourself")  # fmt: skip
                why = unreadable_module(full, sources, PACKAGE)
                if why:
                    raise NotTheirs(f"{who} reaches {full} (line {line}): {why}; the grader reads every module your "
                                    "code reaches, so write it in the workspace's own files")  # fmt: skip
        except SyntaxError:
            if where == module:
                raise
            continue  # another file that does not parse: the student's process says so when it imports it


def _check_code(exercise: Exercise, who: str, source: str, name: str) -> None:
    """NotTheirs if the definition of `name` in `source` uses what `exercise` forbids (`who` says whose it is)."""
    dynamic = dynamic_access(source, name)
    if dynamic:
        raise NotTheirs(
            f"{who} reaches a name the grader cannot follow ({dynamic}): Exercise {exercise.number} must "
            f"not use {', '.join(exercise.forbidden)}, so the grader reads every name you use: write them directly"
        )
    roots = tuple(dict.fromkeys(["tinyamp", *(f.split(".")[0] for f in exercise.forbidden)]))
    names = tinyamp_names_used(source, name, roots)
    used = sorted(n for n in names if _forbidden(n, exercise.forbidden))
    if used:
        whose = "tinyamp's own version" if used[0].startswith("tinyamp") else "a library's version"
        raise NotTheirs(
            f"{who} uses {used[0]}, {whose} of what Exercise {exercise.number} asks you to build: write it "
            "yourself"
        )
    if exercise.no_float8_casts:
        mention = float8_mention(source, name)
        if mention:
            raise NotTheirs(
                f"{who} names an FP8 type ({mention}): Exercise {exercise.number} asks you to {exercise.by_hand}"
            )
    if exercise.no_float16_casts:
        cast = float16_conversion(source, name)
        if cast.endswith("<a dtype not written by name>)"):
            raise NotTheirs(
                f"{who} converts to a dtype the grader cannot read ({cast}): Exercise {exercise.number} "
                "forbids NumPy's conversion to float16, so write every dtype by name (np.uint32, 'float32')"
            )
        if cast:
            raise NotTheirs(
                f"{who} converts to float16 with NumPy ({cast}): Exercise {exercise.number} asks you to "
                f"{exercise.by_hand}"
            )


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
