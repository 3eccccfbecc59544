"""The stubs a student gets, made from the reference solutions: each exercise written once.

As minitorch puts holes in its real modules, every file of ``solutions/`` is the only source
of its exercises: signatures, docstrings, hints and the answer.  Three kinds of comment lines
mark what a stub leaves out:

* ``# >>> exercise N.M`` ... ``# <<< exercise N.M`` around the body of an answer: the stub
  has ``raise NotImplementedError("Exercise N.M: <title>")`` there, at the same indentation;
* ``# >>> solution only`` ... ``# <<< solution only`` around code only the answer needs (a
  helper class, an import): the stub has nothing there;
* an import line ending ``# hint: <why>``, for a name the answer uses and the student may
  need: the stub keeps the import as ``# noqa: F401  (<why>)`` (unused until they write it).

``stub(module)`` and ``solution(module)`` give the two texts; the markers appear in neither.
"""

from __future__ import annotations

import re
from importlib import resources

from tinyamp.exercises.catalog import EXERCISES

BEGIN = re.compile(r"^(\s*)# >>> (exercise (\d+\.\d+)|solution only)\s*$")
END = re.compile(r"^\s*# <<< (exercise \d+\.\d+|solution only)\s*$")
HINT = re.compile(r"^(.*\S)\s+# hint: (.+)$")
TITLES = {e.number: e.title for e in EXERCISES}


def marked_source(module: str) -> str:
    """The marked source of ``solutions/<module>.py`` (or ``__init__``), as shipped in the package."""
    return resources.files("tinyamp.exercises").joinpath(f"solutions/{module}.py").read_text()


def solution(module: str) -> str:
    """The reference solution of `module`, as ``tinyamp exercises init --solutions`` writes it."""
    lines = []
    for line in marked_source(module).splitlines():
        if BEGIN.match(line) or END.match(line):
            continue
        hint = HINT.match(line)
        lines.append(hint[1] if hint else line)
    return re.sub(r"\n{4,}", "\n\n\n", "\n".join(lines) + "\n")


def stub(module: str) -> str:
    """The stub of `module` a workspace starts from: each answer a NotImplementedError, the rest kept."""
    source, lines, inside = marked_source(module), [], None
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
