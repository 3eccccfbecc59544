"""A student workspace: the package ``myamp`` of stubs, a pytest file with one marked test per exercise.

DIR/
  README.md               the exercises, the tutorial to read for each, the commands
  pytest.ini              one marker per exercise: pytest -m ex5_1
  conftest.py             puts DIR on sys.path, so that tests of your own can import myamp
  myamp/<module>.py       the stubs (or, with --solutions in a checkout of tinyamp, the reference solutions)
  tests/test_myamp.py     one test per exercise, each calling its grader
"""

from __future__ import annotations

import ast
import os
import tempfile
from pathlib import Path

from tinyamp.exercises import holes
from tinyamp.exercises.catalog import EXERCISES, PACKAGE, Exercise

MODULES = tuple(dict.fromkeys(e.module for e in EXERCISES))  # in the order of the tutorials

CONFTEST = '''"""Puts this workspace on sys.path: tests of your own can `import myamp`, wherever pytest starts."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
'''


class WorkspaceError(Exception):
    """A folder that cannot become, or is not, a workspace: the message says what to do."""


def workspace_files(solutions: bool = False) -> dict[str, str]:
    """Every file of a workspace, path (relative) -> text: the stubs, or the reference solutions."""
    text = holes.solution if solutions else holes.stub  # the stubs ship in the package; the solutions do not
    files = {f"{PACKAGE}/{name}.py": text(name) for name in ("__init__", *MODULES)}
    files["pytest.ini"] = pytest_ini()
    files["conftest.py"] = CONFTEST
    files["tests/test_myamp.py"] = test_file()
    files["README.md"] = readme(solutions)
    return files


def write_workspace(directory: Path, solutions: bool = False) -> list[Path]:
    """Write a workspace into `directory` (created if needed); never over a student's work.

    Refuses a `directory` that already holds a ``myamp`` package, or any file of the workspace.
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise WorkspaceError(f"{directory} is a file; give a folder for the workspace")
    try:
        files = workspace_files(solutions)
    except holes.NoSolutions as exc:
        raise WorkspaceError(str(exc)) from None
    taken = [path for path in [PACKAGE, *files] if (directory / path).exists()]
    if taken:
        raise WorkspaceError(
            f"{directory / taken[0]} already exists: init never writes over a workspace (your work would be "
            "lost); give a new folder"
        )
    made: list[Path] = []  # what this call created, files and folders, in order: taken back if it cannot finish
    try:
        for relative, text in files.items():
            path = directory / relative
            for folder in [*reversed(path.parent.parents), path.parent]:
                if not folder.is_dir():
                    folder.mkdir()  # FileExistsError where a file holds the name
                    made.append(folder)
            _write_whole(path, text)
            made.append(path)
    except BaseException as exc:  # a file in the way, a full disk, Ctrl-C: no half workspace, which a second
        left = _take_back(made)  # init would refuse to write over
        if not isinstance(exc, OSError):
            raise
        why = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
        if isinstance(exc, FileExistsError):
            why = f"{exc.filename} is a file where the workspace needs a folder; move it aside or give a new folder"
        undone = f"{', '.join(map(str, left))} could not be removed again" if left else "nothing was left there"
        raise WorkspaceError(f"cannot write the workspace into {directory} ({why}); {undone}") from None
    return [path for path in made if path.is_file()]


def _write_whole(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all: a temporary file in the same folder, renamed onto `path`.

    A full disk used to leave a truncated stub that the next init refused to write over; now the
    temporary file is removed and `path` never appears.
    """
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(fd, 0o666 & ~umask)  # mkstemp makes it 0600; a stub is a file like any the student writes
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _take_back(made: list[Path]) -> list[Path]:
    """Remove what write_workspace made, last first; return what could not be removed."""
    left = []
    for path in reversed(made):
        try:
            path.rmdir() if path.is_dir() else path.unlink()
        except OSError:
            left.append(path)
    return left


def pytest_ini() -> str:
    """pytest's settings for the workspace: its tests folder, and one registered marker per exercise."""
    markers = "\n".join(f"    {e.id}: Exercise {e.number}, {e.title}" for e in EXERCISES)
    return (
        "# `pytest -m ex5_1` runs the grader of Exercise 5.1; `tinyamp exercises check` prints every result.\n"
        f"[pytest]\naddopts = -q --strict-markers\ntestpaths = tests\nmarkers =\n{markers}\n"
    )


def test_file() -> str:
    """tests/test_myamp.py: one test per exercise, marked with its id, calling its grader."""
    tests = "".join(
        f'\n\n@pytest.mark.{e.id}\ndef test_{e.id}_{_snake(e.name)}() -> None:\n    """Exercise {e.number}: '
        f'{e.title} ({e.path})."""\n    assert_passes("{e.id}", WORKSPACE)\n'
        for e in EXERCISES
    )
    return (
        f'"""One test per exercise: `pytest -m ex5_1` runs the grader of Exercise 5.1 on {PACKAGE}/loss_scaling.py."""'
        "\n\nfrom pathlib import Path\n\nimport pytest\n\nfrom tinyamp.exercises.isolation import assert_passes\n\n"
        f"WORKSPACE = Path(__file__).resolve().parents[1]\n{tests}"
    )


def readme(solutions: bool) -> str:
    """The workspace's README: what to do, the exercises, and the tutorial to read for each."""
    rows = "\n".join(
        f"| {e.number} | `{e.id}` | {e.title} | `{e.path}`: `{e.name}` | {e.tutorial} | ~{e.minutes} min |"
        for e in EXERCISES
    )
    what = (
        "These are the **reference solutions** (`tinyamp exercises init --solutions`): every exercise passes."
        if solutions
        else "Each stub in `myamp/` raises `NotImplementedError`; its docstring states the task, the math and "
        "the tutorial to read. Replace the `raise` with your code."
    )
    return f"""# Mixed precision, built by hand

{what}

    tinyamp exercises list .             # the exercises, and how far each is here
    tinyamp exercises check              # every exercise: passed / not started / failed, and why
    tinyamp exercises check --only 5.1   # one exercise
    tinyamp exercises check --deep       # ten times as many hypothesis examples
    pytest -m ex5_1                      # the same grader, as a pytest test

A failure names the shortest counterexample the grader found, in words ("after 3 clean steps
and 1 overflow your scale is 2048, the pytorch rule says 1024"), and your line: where your code
raised, or the definition that gave the wrong value. The graders check that the code they
grade is yours: importing tinyamp's own implementation of the mechanism fails. Each exercise
is graded in a process of its own on a copy of this folder, with a time limit (60 s,
`--timeout SECONDS`): an exit, an endless loop or a deleted file fails that exercise only.

Read first, then write: the last column is the time to expect for writing an exercise once its
reading is done (an estimate for planning, not a measurement). The tinyamp repository's
`tutorials/README.md` plans a two-hour lab for each group of tutorials.

| # | marker | exercise | where | read first (in the tinyamp repository) | then write |
|---|---|---|---|---|---:|
{rows}
"""


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))


def progress(exercise: Exercise, workspace: Path) -> str:
    """How far the student's file is, read without running it: "not started", "in progress", "written", or worse.

    "not started": the definition is the stub's, word for word; "in progress": it changed but still
    raises NotImplementedError somewhere; "written": no NotImplementedError left (``check`` says if it
    is right); "missing": no such file or definition; "syntax error": the file does not parse.
    """
    path = Path(workspace) / exercise.path
    if not path.is_file():
        return "missing"
    try:
        tree = ast.parse(path.read_text())
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return "syntax error"
    mine = _definition(tree, exercise.name)
    if mine is None:
        return "missing"
    stub = _definition(ast.parse(holes.stub(exercise.module)), exercise.name)
    if stub is not None and ast.dump(mine) == ast.dump(stub):
        return "not started"
    raises = any(
        isinstance(node, ast.Raise) and "NotImplementedError" in ast.dump(node.exc or ast.Pass())
        for node in ast.walk(mine)
    )
    return "in progress" if raises else "written"


def _definition(tree: ast.Module, name: str) -> ast.AST | None:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
    return None
