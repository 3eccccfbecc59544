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


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all (a half-written results.json would be read as a grade)."""
    path = Path(path)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
