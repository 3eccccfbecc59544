"""``tinyamp exercises``: write a workspace of stubs, grade it.

    tinyamp exercises init DIR [--solutions]     the package myamp/ of stubs (or the reference solutions),
                                                 pytest.ini with one marker per exercise, tests/test_myamp.py
    tinyamp exercises check [DIR] [--only ID] [--deep]
                                                 grade the workspace (default: the current folder) and print
                                                 a table: exercise, passed / not started / failed, the first
                                                 counterexample in words

Exit status: 0 when every exercise asked for passes; 1 when one is failed or not started;
2 for bad input (a folder that is not a workspace, an unknown exercise).  Building the parser
imports neither hypothesis nor the graders: they load when ``check`` runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from tinyamp.exercises.catalog import DEEP, EXERCISES, PACKAGE, find

EXIT_STATUS = "exit status: 0 every exercise asked for passes; 1 one is failed or not started; 2 bad input"


def add_parser(subparsers: Any) -> None:
    """Add ``exercises init`` and ``exercises check`` to the ``tinyamp`` command's subparsers."""
    p = subparsers.add_parser(
        "exercises", help="coursework: a workspace of stubs to write, and graders that check them",
        description="Exercises across the tutorials: write stubs in a workspace, grade them with property tests.",
        epilog=EXIT_STATUS,
    )  # fmt: skip
    sub = p.add_subparsers(dest="exercises_command", required=True)
    init = sub.add_parser("init", help="write a student workspace into DIR", epilog=EXIT_STATUS)
    init.add_argument("directory", metavar="DIR", help="the folder to write (created; never written over)")
    init.add_argument("--solutions", action="store_true", help="write the reference solutions (for instructors)")
    check = sub.add_parser("check", help="grade a workspace and print the table", epilog=EXIT_STATUS)
    check.add_argument("directory", metavar="DIR", nargs="?", default=".", help="the workspace (default: here)")
    check.add_argument("--only", metavar="ID", action="append",
                       help="grade this exercise only (5.1 or ex5_1); repeat for several")  # fmt: skip
    check.add_argument("--deep", action="store_true", help=f"{DEEP} times as many hypothesis examples per property")


def run(args: argparse.Namespace) -> int:
    """Run ``tinyamp exercises init`` or ``check`` from parsed arguments; return the exit status."""
    try:
        if args.exercises_command == "init":
            return init(Path(args.directory), args.solutions)
        return check(Path(args.directory), args.only, args.deep)
    except UsageError as exc:
        print(f"tinyamp: error: {exc}", file=sys.stderr)
        return 2


class UsageError(Exception):
    """Bad input: printed as ``tinyamp: error: ...``, exit status 2."""


def init(directory: Path, solutions: bool) -> int:
    """Write the workspace and say what to do next."""
    from tinyamp.exercises.workspace import WorkspaceError, write_workspace

    try:
        written = write_workspace(directory, solutions)
    except WorkspaceError as exc:
        raise UsageError(str(exc)) from None
    kind = "reference solutions" if solutions else "stubs"
    print(f"wrote {len(written)} files into {directory}: the {kind} of {len(EXERCISES)} exercises in {PACKAGE}/")
    print(f"next: open {directory / PACKAGE / 'formats.py'}, then run  tinyamp exercises check {directory}")
    return 0


def check(directory: Path, only: list[str] | None, deep: bool) -> int:
    """Grade the exercises asked for and print one row each as it finishes; 0 when all of them pass."""
    if not (directory / PACKAGE).is_dir():
        raise UsageError(f"{directory} is not a workspace (it has no {PACKAGE}/ folder); write one with "
                         f"tinyamp exercises init {directory}")  # fmt: skip
    try:
        exercises = list(EXERCISES) if not only else list(dict.fromkeys(find(name) for name in only))
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    try:
        import hypothesis  # noqa: F401  (every grader is a hypothesis property)
    except ImportError:
        raise UsageError("grading needs hypothesis: pip install hypothesis (or pip install 'tinyamp[test]')") from None
    from tinyamp.exercises.grading import FAILED, NOT_STARTED, PASSED, grade

    start = time.perf_counter()
    print(f"grading {len(exercises)} exercise{'s' * (len(exercises) > 1)} in {directory.resolve()}"
          f"{f' ({DEEP}x examples)' if deep else ''}\n")  # fmt: skip
    print(row("#", "exercise", "result", "time", "first counterexample (failed) or what to read (not started)"))
    counts = {PASSED: 0, FAILED: 0, NOT_STARTED: 0}
    for exercise in exercises:
        result = grade(exercise, directory, deep=deep)
        counts[result.status] += 1
        why = {FAILED: result.message, NOT_STARTED: exercise.first_steps}.get(result.status, "")
        print(row(exercise.number, exercise.title, result.status, f"{result.seconds:.1f}s", why), flush=True)
    summary = ", ".join(f"{n} {status}" for status, n in counts.items() if n)
    print(f"\n{summary} ({time.perf_counter() - start:.1f} s). One exercise: tinyamp exercises check --only 5.1, "
          f"or pytest {directory} -m ex5_1")  # fmt: skip
    return 0 if counts[PASSED] == len(exercises) else 1


def row(number: str, title: str, result: str, seconds: str, why: str) -> str:
    """One line of the table (the last column is as long as it needs)."""
    return f"{number:<5}{title:<46}{result:<13}{seconds:>6}  {why}".rstrip()
