"""What a student installs holds no reference solution: the package ships the stubs, cut from the solutions in
tests/exercise_solutions/ and committed (they cannot drift), and an import of the old solutions module fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tinyamp.exercises import holes
from tinyamp.exercises.catalog import EXERCISES, PACKAGE
from tinyamp.exercises.workspace import write_workspace

pytestmark = pytest.mark.cli

ROOT = Path(__file__).resolve().parents[1]


def answers() -> dict[str, str]:
    """Each marked answer of the solutions, as its lines stripped and joined: exercise number -> text."""
    found: dict[str, str] = {}
    for module in holes.MODULES:
        number, lines = None, []
        for line in holes.marked_source(module).splitlines():
            begin = holes.BEGIN.match(line)
            if begin and begin[3]:
                number, lines = begin[3], []
            elif holes.END.match(line) and number:
                found[number] = "\n".join(lines)
                number = None
            elif number and line.strip():
                lines.append(line.strip())
    return found


def holds_an_answer(text: str, every: dict[str, str]) -> str:
    """The number of the first answer `text` holds whole, or a marker line of the solutions ("" if neither)."""
    if any(holes.BEGIN.match(line) or holes.END.match(line) for line in text.splitlines()):
        return "a marker"
    joined = "\n".join(line.strip() for line in text.splitlines() if line.strip())
    return next((number for number, answer in every.items() if answer in joined), "")


def test_the_committed_stubs_are_what_the_solutions_cut_to() -> None:
    """Run ``python -m tinyamp.exercises.holes`` after changing a solution: this fails until the stubs follow."""
    assert {p.stem for p in holes.STUBS.glob("*.py")} == set(holes.MODULES)
    for module in holes.MODULES:
        assert holes.stub(module) == holes.cut(module), f"stubs/{module}.py is stale: python -m tinyamp.exercises.holes"


def test_no_file_of_the_package_holds_an_answer() -> None:
    every = answers()
    assert set(every) == {e.number for e in EXERCISES}
    assert not (ROOT / "tinyamp/exercises/solutions").exists()
    for file in sorted((ROOT / "tinyamp").rglob("*.py")):
        assert not holds_an_answer(file.read_text(), every), f"{file.relative_to(ROOT)} holds a reference answer"
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert found["packages"]["find"]["include"] == ["tinyamp*"]  # tests/ is not a package of the wheel
    assert not [p for patterns in found["package-data"].values() for p in patterns if "solution" in p]


def test_a_built_wheel_holds_the_stubs_and_no_answer(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "tinyamp", source / "tinyamp", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(holes.SOLUTIONS, source / "tests/exercise_solutions")  # beside it, as in the repository
    argv = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-w",
            str(tmp_path / "dist"), "-q"]  # offline: the setuptools installed here
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if done.returncode and "bdist_wheel" in done.stdout + done.stderr:  # setuptools < 70.1 without `wheel`
        pytest.skip("building a wheel offline needs the `wheel` package or setuptools >= 70.1")
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    every, names = answers(), zipfile.ZipFile(wheel).namelist()
    assert {f"tinyamp/exercises/stubs/{m}.py" for m in holes.MODULES} <= set(names)
    for name in names:
        assert "solution" not in name, name
        if name.endswith(".py"):
            assert not holds_an_answer(zipfile.ZipFile(wheel).read(name).decode(), every), name


def test_importing_the_old_solutions_module_fails_the_exercise(tmp_path: Path) -> None:
    """The one line that used to pass most exercises: an installed tinyamp has no tinyamp.exercises.solutions."""
    write_workspace(tmp_path / "ws")
    path = tmp_path / "ws" / PACKAGE / "backward.py"
    path.write_text(path.read_text() + "\nfrom tinyamp.exercises.solutions.backward import softmax_backward  # noqa\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "tinyamp", "exercises", "check", str(tmp_path / "ws"), "--only",
                           "2.1"], capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)  # fmt: skip
    line = next(line for line in done.stdout.splitlines() if line.startswith("2.1 "))
    assert "failed" in line and "No module named 'tinyamp.exercises.solutions'" in line, done.stdout


def test_init_solutions_outside_a_checkout_says_where_the_solutions_are(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:  # fmt: skip
    from tinyamp.exercises import command

    monkeypatch.setattr(holes, "SOLUTIONS", tmp_path / "nowhere")
    assert command.init(tmp_path / "stubs", False) == 0  # the stubs need nothing but the package
    with pytest.raises(command.UsageError, match="not part of an installed tinyamp .* tests/exercise_solutions/"):
        command.init(tmp_path / "sol", True)
    assert not (tmp_path / "sol").exists()
