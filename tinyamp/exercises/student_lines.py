"""Where in the student's files their code was: the line a failure names.

Read in the student's process (``remote.error_record``: their traceback is there) and, when the
graders run on code imported into one process (the tests), in that process.
"""

from __future__ import annotations

import functools
import inspect
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def raised_at(exc: BaseException, workspace: Path) -> str:
    """Where student code raised `exc` (or the exception that caused it): "myamp/backward.py:12", "" if not theirs.

    The innermost exception of the chain that passed through the workspace's files, its deepest frame there;
    for a SyntaxError, the line that does not parse (no frame of the student's file ran).
    """
    for e in reversed(_chain(exc)):
        if getattr(e, "student_line", ""):  # an exception of student code in its own process, which read its line
            return e.student_line
        frames = traceback.extract_tb(e.__traceback__)
        if isinstance(e, SyntaxError) and e.filename:
            frames = [traceback.FrameSummary(e.filename, e.lineno or 0, "<module>")]
        where = student_line(frames, workspace)
        if where:
            return where
    return ""


def student_line(frames: Iterable[traceback.FrameSummary], workspace: Path) -> str:
    """The last of `frames` in a file inside `workspace`, as "myamp/backward.py:12" ("" if none is)."""
    root = _resolved(str(workspace))
    found = ""
    for frame in frames:
        if frame.filename.startswith("<"):  # "<string>", "<frozen importlib._bootstrap>": no file, although
            continue  # resolved against the current folder (the workspace, while grading) it would name one there
        relative = _inside(frame.filename, root)
        if relative:  # else a file elsewhere (the grader, numpy)
            found = f"{relative}:{frame.lineno}"
    return found


@functools.lru_cache(maxsize=4096)
def _resolved(path: str) -> str:
    return str(Path(path).resolve())


@functools.lru_cache(maxsize=4096)
def _inside(filename: str, root: str) -> str:
    """`filename` relative to the folder `root`, "" if it is not inside it (remembered: a batch of calls that
    raise asks the same of the same frames thousands of times)."""
    try:
        return Path(filename).resolve().relative_to(root).as_posix()
    except (OSError, ValueError):
        return ""


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




def error_record(exc: BaseException, workspace: Path) -> dict[str, Any]:
    """In the student's process: what the grader needs of `exc`, as plain data."""
    try:
        message = str(exc)
    except Exception:  # a __str__ that raises
        message = "<a message that cannot be printed>"
    record = {
        "type": type(exc).__name__[:200],
        "bases": [c.__name__ for c in type(exc).__mro__ if c.__module__ == "builtins"],
        "message": message[:4000].encode("utf-8", "replace").decode("utf-8"),
        "where": raised_at(exc, workspace),
        "base": not isinstance(exc, Exception),
    }
    if isinstance(exc, SystemExit):
        record["code"] = repr(exc.code)[:200]
    return record
