"""The grades in forms a course platform reads: JSON records, and Gradescope's results.json.

One record per exercise (``tinyamp exercises check --json``)::

    {"number": "5.1", "id": "ex5_1", "title": "...", "status": "passed" | "failed" | "not started",
     "reason": "" | why it failed | what to write and read, "seconds": 2.5, "points": 1, "max_points": 1}

Gradescope (``--format gradescope``) reads ``results.json``: a score and one test per exercise
with ``name``, ``score``, ``max_score``, ``status`` ("passed" or "failed") and ``output``.  Each
exercise is worth its catalog ``points`` (1 each) when it passes, 0 otherwise.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tinyamp.exercises.grading import FAILED, NOT_STARTED, PASSED, Result


def reason(result: Result) -> str:
    """Why it failed, or what to do for an exercise not started ("" when passed)."""
    return {FAILED: result.message, NOT_STARTED: result.exercise.first_steps}.get(result.status, "")


def record(result: Result) -> dict[str, Any]:
    """One exercise's grade as plain data."""
    e = result.exercise
    return {
        "number": e.number,
        "id": e.id,
        "title": e.title,
        "status": result.status,
        "reason": reason(result),
        "seconds": round(result.seconds, 3),
        "points": e.points if result.status == PASSED else 0,
        "max_points": e.points,
    }


def records_json(results: Sequence[Result]) -> str:
    """The --json output: a list of records, one per exercise, in the order graded."""
    return json.dumps([record(r) for r in results], indent=1)


def gradescope(results: Sequence[Result], seconds: float) -> dict[str, Any]:
    """Gradescope's results.json: the total score and one test per exercise."""
    tests = [
        {
            "name": f"Exercise {r.exercise.number}: {r.exercise.title}",
            "number": r.exercise.number,
            "score": record(r)["points"],
            "max_score": r.exercise.points,
            "status": "passed" if r.status == PASSED else "failed",
            "output": r.status if r.status == PASSED else f"{r.status}: {reason(r)}",
        }
        for r in results
    ]
    passed = sum(r.status == PASSED for r in results)
    return {
        "score": sum(t["score"] for t in tests),
        "execution_time": round(seconds, 1),
        "output": f"{passed} of {len(results)} exercises passed",
        "tests": tests,
    }


KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
         (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"))  # fmt: skip


def not_a_file(path: Path) -> str | None:
    """Why results may not be written at `path` (the end of a sentence), or None: a new path or a regular file.

    The write replaces what the name points at (``os.replace``): run as root, a results path of
    /dev/full or of a FIFO would turn the device or the pipe into a regular file.  A symbolic
    link is judged by what it points at.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None  # a new path (or a link to one)
    except OSError as exc:
        return f"cannot be looked at ({exc.strerror or exc}); give a new path or a regular file"
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in KINDS if test(mode)), "not a regular file")
    return f"is {kind}, which writing results.json would replace; give a new path or a regular file"


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all (a half-written results.json would be read as a grade).

    Only a new path or a regular file is replaced (``not_a_file``), checked again just before the
    replace: anything else raises OSError and is left as it was.
    """
    path = Path(path)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # on disk before it takes the name: a crash leaves the old grades or the new
        why = not_a_file(path)
        if why is not None:
            raise OSError(f"{path} {why}")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
