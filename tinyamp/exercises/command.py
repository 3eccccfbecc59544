"""``tinyamp exercises``: list the exercises, write a workspace of stubs, grade it.

    tinyamp exercises list [DIR]                 number, title, tutorial, points; with DIR, how far each is
    tinyamp exercises init DIR [--solutions]     the package myamp/ of stubs (or the reference solutions),
                                                 pytest.ini with one marker per exercise, tests/test_myamp.py
    tinyamp exercises check [DIR] [--only ID] [--deep] [--timeout SECONDS] [--memory GIB] [--jobs N]
                            [--json | --format gradescope [--results PATH]]
                                                 grade the workspace (default: the current folder), each
                                                 exercise in its own process, and print a table: exercise,
                                                 passed / not started / failed, the first counterexample in words

Exit status: 0 when every exercise asked for passes; 1 when one is failed or not started;
2 for bad input (a folder that is not a workspace, an unknown exercise, a limit that is not a
number in its range, a --results path that is not a new path or a regular file, or --results
without --format gradescope); 74 in place of 0 when standard output is closed or full, so that a
verdict nobody could read never looks like a pass (``tinyamp.cli.main``; a pipe whose reader
stopped early, as in ``exercises list | head``, is no error for ``list`` and ``init``; ``--help``
into a full disk is 74 too).  Building the parser imports
neither hypothesis nor the graders: they load when ``check`` runs.  Nothing here writes into the
workspace graded: each exercise runs on a copy.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from tinyamp.exercises.catalog import DEEP, EXERCISES, PACKAGE, Exercise, find
from tinyamp.exercises.isolation import DEFAULT_JOBS, DEFAULT_MEMORY_GIB, DEFAULT_TIMEOUT

# The bounds of --timeout and --memory: a day is longer than any grading needs, and past about 10^9 s the
# wait for a child overflows the OS's timeout; RLIMIT_AS is a signed 64-bit count of bytes (2^63 = 2^33 GiB
# fails setrlimit in the child, and the exercise with it), so the limit stops far below, at 2^20 GiB (1 PiB).
# Below 1 MiB the child cannot even start its grader.
MAX_TIMEOUT = 86_400.0
MAX_MEMORY_GIB = float(2**20)
MIN_MEMORY_GIB = 0.001
EXIT_STATUS = ("exit status: 0 every exercise asked for passes; 1 one is failed or not started; 2 bad input; "
               "74 in place of 0: standard output closed or full")  # fmt: skip
# list and init grade nothing: their statuses are their own (a pipe whose reader stopped early is no error for them)
LIST_EXIT_STATUS = ("exit status: 0 listed; 2 bad input (DIR is missing or not a workspace); 74 in place of 0: "
                    "standard output closed or full")  # fmt: skip
INIT_EXIT_STATUS = ("exit status: 0 the workspace was written; 2 bad input (no folder named; DIR is a file, or holds "
                    "a workspace's files already, which init never writes over; or DIR cannot be written, and what "
                    "init wrote is taken back); 74 in place of 0: standard output closed or full (the workspace is "
                    "written)")  # fmt: skip
FIRST_STEPS = "start:  tinyamp exercises init ws  then  tinyamp exercises check ws"


def catalog_text() -> str:
    """The exercises, one line each: number, title, the tutorial section to read first (for --help)."""
    return "\n".join(f"  {e.number:<4} {e.title:<46} {e.read_first}" for e in EXERCISES)


def add_parser(subparsers: Any) -> None:
    """Add ``exercises list``, ``init`` and ``check`` to the ``tinyamp`` command's subparsers."""
    p = subparsers.add_parser(
        "exercises", help="coursework: a workspace of stubs to write, and graders that check them",
        description="Exercises across the tutorials: write stubs in a workspace, grade them with property tests.",
        epilog=f"the exercises:\n{catalog_text()}\n\n{FIRST_STEPS}\n{EXIT_STATUS}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    sub = p.add_subparsers(dest="exercises_command", required=True)
    listing = sub.add_parser("list", help="the exercises; with DIR, how far each is in that workspace",
                             epilog=LIST_EXIT_STATUS)  # fmt: skip
    listing.add_argument("directory", metavar="DIR", nargs="?", help="a workspace: its files are read, never run")
    init = sub.add_parser("init", help="write a student workspace into DIR", epilog=INIT_EXIT_STATUS)
    init.add_argument("directory", metavar="DIR", help="the folder to write (created; never written over)")
    init.add_argument("--solutions", action="store_true", help="write the reference solutions (for instructors, "
                      "from a checkout of the tinyamp repository: an installed tinyamp holds none)")  # fmt: skip
    check = sub.add_parser("check", help="grade a workspace and print the table", epilog=EXIT_STATUS)
    check.add_argument("directory", metavar="DIR", nargs="?", default=".", help="the workspace (default: here)")
    check.add_argument("--only", metavar="ID", action="append",
                       help="grade this exercise only (5.1 or ex5_1); repeat for several")  # fmt: skip
    check.add_argument("--deep", action="store_true", help=f"{DEEP} times as many hypothesis examples per property "
                       f"(and {DEEP} times the time limit)")  # fmt: skip
    check.add_argument("--timeout", metavar="SECONDS", help=f"time limit per exercise (default {DEFAULT_TIMEOUT:g}; "
                       f"{DEFAULT_TIMEOUT * DEEP:g} with --deep): past it, the exercise fails")  # fmt: skip
    check.add_argument("--memory", metavar="GIB", help="memory per exercise beyond the grader's own, on Linux "
                       f"(default {DEFAULT_MEMORY_GIB:g} GiB): past it, the exercise fails")  # fmt: skip
    check.add_argument("--jobs", metavar="N", help=f"exercises graded at once (default {DEFAULT_JOBS}, at most "
                       "the number of CPUs)")  # fmt: skip
    form = check.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_const", const="json", dest="format",
                      help="print one JSON record per exercise instead of the table")  # fmt: skip
    form.add_argument("--format", choices=("table", "json", "gradescope"), default="table",
                      help="gradescope: the table, and Gradescope's results.json (see --results)")  # fmt: skip
    check.add_argument("--results", metavar="PATH",
                       help="with --format gradescope: where it writes (default: results.json; a new path or a "
                       "regular file, never inside DIR)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Run ``tinyamp exercises list``, ``init`` or ``check`` from parsed arguments; return the exit status."""
    try:
        if args.exercises_command == "list":
            return list_exercises(None if args.directory is None else Path(args.directory))
        if args.exercises_command == "init":
            if not args.directory.strip():  # Path("") is the current folder: never what an empty name meant
                raise UsageError("exercises init needs the name of a new folder, e.g. tinyamp exercises init ws")
            return init(Path(args.directory), args.solutions)
        return check(args)
    except UsageError as exc:
        print(f"tinyamp: error: {exc}", file=sys.stderr)
        return 2


class UsageError(Exception):
    """Bad input: printed as ``tinyamp: error: ...``, exit status 2."""


def list_exercises(directory: Path | None) -> int:
    """Print the exercises; with a workspace, how far each is there (its files read, not run)."""
    from tinyamp.exercises.workspace import progress

    if directory is not None:
        require_workspace(directory)
    print(f"{'#':<5}{'exercise':<46}{'points':>6}{'min':>5}  {'status' if directory else 'read first'}")
    for e in EXERCISES:  # min: the minutes of work to expect once the reading is done (an estimate)
        last = f"{progress(e, directory):<13} {e.tutorial}" if directory else e.tutorial
        print(f"{e.number:<5}{e.title:<46}{e.points:>6}{e.minutes:>5}  {last}")
    print(f"\n{FIRST_STEPS}" if directory is None else f"\ngrade them: tinyamp exercises check {directory}")
    return 0


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


def require_workspace(directory: Path) -> None:
    """UsageError unless `directory` is a workspace (a folder with a myamp/ package)."""
    if not directory.exists():
        raise UsageError(f"{directory} does not exist; write a workspace there with tinyamp exercises init {directory}")
    if not (directory / PACKAGE).is_dir():
        raise UsageError(f"{directory} is not a workspace (it has no {PACKAGE}/ folder); write one with "
                         f"tinyamp exercises init {directory}")  # fmt: skip


def positive(text: str | None, option: str, default: float, example: str, most: float = math.inf,
             least: float = 0.0, unit: str = "") -> float:  # fmt: skip
    """The value of `option`, a finite number > 0, from `least` to `most` (`default` when not given);
    UsageError otherwise."""
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{option} takes a number > 0, such as {example}; got {text!r}")
    if not least <= value <= most:
        span = f"from {least:g} to {most:,.15g}" if least else f"above 0 and up to {most:,.15g}"
        raise UsageError(f"{option} takes a number of {unit} {span}, such as {example}; got {text!r}")
    return value


def check(args: argparse.Namespace) -> int:
    """Grade the exercises asked for, each in a child process; print the table (or JSON) and write results."""
    from tinyamp.exercises import reports
    from tinyamp.exercises.isolation import Limits

    directory = Path(args.directory)
    require_workspace(directory)
    try:
        exercises = list(EXERCISES) if not args.only else list(dict.fromkeys(find(name) for name in args.only))
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    seconds = positive(args.timeout, "--timeout", DEFAULT_TIMEOUT * (DEEP if args.deep else 1), "60", MAX_TIMEOUT,
                       unit="seconds")  # fmt: skip
    memory = positive(args.memory, "--memory", DEFAULT_MEMORY_GIB, "2", MAX_MEMORY_GIB, MIN_MEMORY_GIB, "GiB")
    jobs = positive(args.jobs, "--jobs", min(DEFAULT_JOBS, os.cpu_count() or 1), "2")
    if jobs != int(jobs):
        raise UsageError(f"--jobs takes a whole number > 0, such as 2; got {args.jobs!r}")
    results_path = None
    if args.results is not None and args.format != "gradescope":
        raise UsageError(f"--results {args.results} names where --format gradescope writes Gradescope's results.json; "
                         "add --format gradescope, or leave out --results")  # fmt: skip
    if args.format == "gradescope":
        args.results = args.results or "results.json"
        results_path = Path(args.results).resolve()
        if results_path.is_relative_to(directory.resolve()):
            raise UsageError(f"--results {args.results} is inside the workspace {directory}, which grading never "
                             "writes into; give a path outside it")  # fmt: skip
        if not results_path.parent.is_dir() or results_path.is_dir():
            raise UsageError(f"--results {args.results}: {results_path.parent} is not a folder to write results.json "
                             "into" if not results_path.parent.is_dir() else f"--results {args.results} is a folder; "
                             "give a file path such as results.json")  # fmt: skip
        why = reports.not_a_file(results_path)
        if why is not None:
            raise UsageError(f"--results {args.results} {why}")
    try:
        import hypothesis  # noqa: F401  (every grader is a hypothesis property)
    except ImportError:
        from tinyamp.extras import install_hint

        raise UsageError(f"grading needs hypothesis: pip install hypothesis (or {install_hint('exercises')})") from None
    limits = Limits(seconds, int(memory * 2**30))
    from tinyamp.exercises.isolation import CopyError

    try:
        results = grade_and_print(exercises, directory, args.deep, limits, int(jobs), table=args.format != "json")
    except CopyError as exc:
        raise UsageError(str(exc)) from None
    if args.format == "json":
        print(reports.records_json(results))
    if results_path is not None:
        summary = reports.gradescope(results, sum(r.seconds for r in results))
        import json

        try:
            reports.write_atomically(results_path, json.dumps(summary, indent=1))
        except OSError as exc:  # a full disk, or a device or pipe put there while grading ran
            raise UsageError(
                f"--results {args.results}: could not write {results_path} ({exc.strerror or exc}); "
                "nothing was written there, and the grades above stand"
            ) from None
        print(f"wrote {results_path}: score {summary['score']} of {sum(e.points for e in exercises)}")
    return 0 if all(r.status == "passed" for r in results) else 1


def grade_and_print(exercises: list[Exercise], directory: Path, deep: bool, limits: Any, jobs: int,
                    table: bool) -> list[Any]:  # fmt: skip
    """Grade in child processes; with `table`, print one row per exercise as its turn comes."""
    from tinyamp.exercises import unprivileged
    from tinyamp.exercises.grading import FAILED, NOT_STARTED, PASSED
    from tinyamp.exercises.isolation import grade_isolated
    from tinyamp.exercises.reports import reason

    start = time.perf_counter()
    if table:
        memory = f", {limits.memory_bytes / 2**30:g} GiB" if sys.platform.startswith("linux") else ""
        print(f"grading {len(exercises)} exercise{'s' * (len(exercises) > 1)} in {directory.resolve()}"
              f"{f' ({DEEP}x examples)' if deep else ''}, each in its own process (at most {limits.seconds:g} s"
              f"{memory}; {jobs} at a time)")  # fmt: skip
        line = unprivileged.plan().line
        print(f"{line}\n" if line else "")
        print(row("#", "exercise", "result", "time", "first counterexample (failed) or what to read (not started)"))
    results = []
    for result in grade_isolated(exercises, directory, deep, limits, jobs):
        results.append(result)
        if table:
            e = result.exercise
            print(row(e.number, e.title, result.status, f"{result.seconds:.1f}s", reason(result)), flush=True)
    if table:
        counts = {status: sum(r.status == status for r in results) for status in (PASSED, FAILED, NOT_STARTED)}
        summary = ", ".join(f"{n} {status}" for status, n in counts.items() if n)
        print(f"\n{summary} ({time.perf_counter() - start:.1f} s).{what_next(results, directory)}")
    return results


def what_next(results: list[Any], directory: Path) -> str:
    """The footer's suggestion: the first exercise checked that did not pass, to try again; else the exercise
    after the last one checked, in the course's order; else nothing (the course's last exercise passed)."""
    again = next((r.exercise for r in results if r.status != "passed"), None)
    later = EXERCISES[EXERCISES.index(results[-1].exercise) + 1 :] if results else ()
    e = again or (later[0] if later else None)
    if e is None:
        return ""
    verb = "Again" if again else "Next"
    return (f" {verb}: exercise {e.number}, {e.title}: tinyamp exercises check {directory} --only {e.number}, "
            f"or pytest {directory} -m {e.id}")  # fmt: skip


def row(number: str, title: str, result: str, seconds: str, why: str) -> str:
    """One line of the table (the last column is as long as it needs)."""
    return f"{number:<5}{title:<46}{result:<13}{seconds:>6}  {why}".rstrip()
