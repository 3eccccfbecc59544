"""The stubs a student gets, made from the reference solutions: each exercise written once.

As minitorch puts holes in its real modules, every file of the reference solutions is the only
source of its exercises: signatures, docstrings, hints and the answer.  The solutions live in
the tinyamp repository, in ``tests/exercise_solutions/`` (``SOLUTIONS``), not in the package a
student installs: an installed tinyamp holds no answer to import.  What the package ships is
``stubs/``, the stubs cut from them, committed beside this file and made again by
``python -m tinyamp.exercises.holes`` (in a checkout) whenever a solution changes;
tests/test_exercises_catalog.py fails when the two differ.  Three kinds of comment lines mark
what a stub leaves out:

* ``# >>> exercise N.M`` ... ``# <<< exercise N.M`` around the body of an answer: the stub
  has ``raise NotImplementedError("Exercise N.M: <title>")`` there, at the same indentation;
* ``# >>> solution only`` ... ``# <<< solution only`` around code only the answer needs (a
  helper class, an import): the stub has nothing there;
* an import line ending ``# hint: <why>``, for a name the answer uses and the student may
  need: the stub keeps the import as ``# noqa: F401  (<why>)`` (unused until they write it).

``stub(module)`` reads the shipped stub; ``solution(module)`` and ``cut(module, marked)`` need
the solutions (a checkout); the markers appear in neither text.
"""

from __future__ import annotations

import re
import sys
from importlib import resources
from pathlib import Path

from tinyamp.exercises.catalog import EXERCISES

BEGIN = re.compile(r"^(\s*)# >>> (exercise (\d+\.\d+)|solution only)\s*$")
END = re.compile(r"^\s*# <<< (exercise \d+\.\d+|solution only)\s*$")
HINT = re.compile(r"^(.*\S)\s+# hint: (.+)$")
TITLES = {e.number: e.title for e in EXERCISES}
MODULES = ("__init__", *dict.fromkeys(e.module for e in EXERCISES))  # the files of myamp/, in the tutorials' order
SOLUTIONS = Path(__file__).resolve().parents[2] / "tests" / "exercise_solutions"  # in a checkout of the repository
STUBS = Path(__file__).resolve().parent / "stubs"


class NoSolutions(Exception):
    """The reference solutions are not here: an installed tinyamp ships the stubs only."""


def marked_source(module: str) -> str:
    """The marked source of the reference solution ``<module>.py`` (or ``__init__``), from ``SOLUTIONS``."""
    path = SOLUTIONS / f"{module}.py"
    if not path.is_file():
        raise NoSolutions(
            "the reference solutions are not part of an installed tinyamp (a student's copy holds no answers); "
            "instructors find them in the tinyamp repository, tests/exercise_solutions/: run tinyamp from a checkout"
        )
    return path.read_text()


def solution(module: str) -> str:
    """The reference solution of `module`, as ``tinyamp exercises init --solutions`` writes it (a checkout only)."""
    lines = []
    for line in marked_source(module).splitlines():
        if BEGIN.match(line) or END.match(line):
            continue
        hint = HINT.match(line)
        lines.append(hint[1] if hint else line)
    return re.sub(r"\n{4,}", "\n\n\n", "\n".join(lines) + "\n")


def stub(module: str) -> str:
    """The stub of `module` a workspace starts from, as the package ships it (``stubs/<module>.py``)."""
    return resources.files("tinyamp.exercises").joinpath(f"stubs/{module}.py").read_text()


def cut(module: str, source: str | None = None) -> str:
    """The stub cut from the marked solution `source` (default: ``SOLUTIONS``'s): each answer a
    NotImplementedError, the rest kept."""
    source, lines, inside = marked_source(module) if source is None else source, [], None
    for number, line in enumerate(source.splitlines(), 1):
        begin, end = BEGIN.match(line), END.match(line)
        if begin and inside is None:
            inside = begin[2]
            if begin[3] is not None:
                lines.append(f'{begin[1]}raise NotImplementedError("Exercise {begin[3]}: {TITLES[begin[3]]}")')
        elif end and end[1] == inside:
            inside = None
        elif begin or end:
            raise ValueError(f"solutions/{module}.py, line {number}: {line.strip()!r} does not close {inside!r}")
        elif inside is None:
            hint = HINT.match(line)
            lines.append(f"{hint[1]}  # noqa: F401  ({hint[2]})" if hint else line)
    if inside is not None:
        raise ValueError(f"solutions/{module}.py: {inside!r} is never closed")
    text = re.sub(r"\n{4,}", "\n\n\n", "\n".join(lines) + "\n")  # where a block went: two blank lines, as before
    return _with_instructions(module, text)


def _with_instructions(module: str, text: str) -> str:
    """The module docstring's first line, then what to do with the stubs (not in __init__)."""
    numbers = [e.number for e in EXERCISES if e.module == module]
    if not numbers:
        return text
    first, rest = text.split("\n", 1)
    if not first.endswith('"""'):
        raise ValueError(f"solutions/{module}.py must open with a one-line docstring")
    what = (f"Write the stub below; ``tinyamp exercises check`` grades it (``--only {numbers[0]}``)."
            if len(numbers) == 1 else
            "Write each stub below; ``tinyamp exercises check`` grades them (``--only N.M`` for one).")  # fmt: skip
    return f"{first[:-3]}\n\n{what}\n\"\"\"\n{rest}"


def write_stubs(folder: Path = STUBS) -> list[Path]:
    """Cut every stub from the solutions and write it into `folder` (the package's ``stubs/``); the files written."""
    folder.mkdir(exist_ok=True)
    written = []
    for module in MODULES:
        path = folder / f"{module}.py"
        path.write_text(cut(module))
        written.append(path)
    return written


if __name__ == "__main__":  # python -m tinyamp.exercises.holes: the stubs again, after a solution changed
    try:
        for path in write_stubs():
            print(f"wrote {path}")
    except NoSolutions as exc:
        sys.exit(f"tinyamp.exercises.holes: {exc}")
