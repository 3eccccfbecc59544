"""The exercises as a course: each with a stub made from its solution, a grader and a tutorial; the lab plan.

The catalog (ids, modules, tutorials, minutes), the stubs ``holes`` cuts from the solutions, and
the syllabus's reading and writing times summed from the tutorials and the catalog.
"""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from exercise_helpers import IDS, ROOT, grader, module_of, solution, stub_module

from tinyamp.exercises import holes
from tinyamp.exercises.catalog import EXERCISES, PACKAGE, find
from tinyamp.exercises.workspace import write_workspace

pytestmark = pytest.mark.cli


# ---- the catalog, the stubs and the solutions ---------------------------------------------------------------
def test_at_least_ten_exercises_across_the_course_each_with_a_stub_a_solution_a_grader_and_a_tutorial() -> None:
    assert len(EXERCISES) >= 10 and len(set(IDS)) == len(IDS)
    assert {e.number.split(".")[0] for e in EXERCISES} >= {"1", "2", "4", "5", "6", "7"}
    for e in EXERCISES:
        assert hasattr(stub_module(e.module), e.name) and hasattr(module_of("solutions", e.module), e.name)
        assert callable(grader(e.id))
        named = re.findall(r"tutorials/\w+\.py", e.tutorial)
        assert named and all((ROOT / name).is_file() for name in named), e.tutorial  # every tutorial named exists
    assert find("5.1") is find("ex5_1") is find("5_1")
    with pytest.raises(KeyError, match="no exercise '9.9'; the exercises are 1.1, 1.2"):
        find("9.9")


def _definitions(obj: Any) -> dict[str, Any]:
    """The graded object and, for a class, its methods: name -> object."""
    if inspect.isclass(obj):
        return {obj.__name__: obj, **{k: v for k, v in vars(obj).items() if inspect.isfunction(v)}}
    return {obj.__name__: obj}


@pytest.mark.parametrize("exercise_id", IDS)
def test_stub_and_solution_have_the_same_signature_and_docstring_and_the_stub_raises(exercise_id: str) -> None:
    e = find(exercise_id)
    stub, answer = getattr(stub_module(e.module), e.name), solution(exercise_id)
    stubs, answers = _definitions(stub), _definitions(answer)
    assert stubs.keys() == answers.keys()
    for name in stubs:
        assert stubs[name].__doc__ == answers[name].__doc__, name  # one text, never two that drift
        if not inspect.isclass(stubs[name]):
            assert inspect.signature(stubs[name]) == inspect.signature(answers[name]), name
    doc = inspect.getdoc(stub)
    assert doc.startswith(f"Exercise {e.number}: ") and "Task:" in doc and "Math" in doc and "Read: tutorials/" in doc
    assert e.minutes > 0 and f"Time: about {e.minutes} minutes of work once the reading is done" in doc
    assert doc.index("Read: tutorials/") < doc.index("Time: about")  # what to read first, then how long
    source = holes.stub(e.module)
    assert f'raise NotImplementedError("Exercise {e.number}: {e.title}")' in source
    params = [p for p in inspect.signature(stub).parameters.values() if p.default is p.empty]
    with pytest.raises(NotImplementedError, match=rf"^Exercise {re.escape(e.number)}: "):
        stub(**{p.name: None for p in params})  # the body is the raise: the arguments are never read


# ---- a lab an instructor can plan: reading times, exercise times, and the syllabus's sums of them ---------------
SYLLABUS = ROOT / "tutorials" / "README.md"


def reading_minutes() -> dict[str, int]:
    """Each tutorial's reading time, from the title cell of the tutorial itself: {"01": 30, ..., "A1": 15}."""
    minutes = {}
    for path in sorted((ROOT / "tutorials").glob("[0-9A][0-9]_*.py")):
        found = re.findall(r"(\d+) minutes to read", path.read_text(encoding="utf-8").split("# %%\n")[0])
        assert len(found) == 1, f"{path.name} says its reading time {len(found)} times in its title cell"
        minutes[path.name[:2]] = int(found[0])
    return minutes


def tutorials_in_words(text: str) -> set[str]:
    """ "tutorials 1 and 2, appendix A1" -> {"01", "02", "A1"}."""
    return {n if n.startswith("A") else f"{int(n):02d}" for n in re.findall(r"\b(A\d|\d+)\b", text)}


def test_the_syllabus_reading_times_are_the_tutorials_own() -> None:
    rows = re.findall(r"^\| \w+ \| `(\w\w)_\w+\.py` \| (\d+) min \|", SYLLABUS.read_text(encoding="utf-8"), re.M)
    syllabus = {prefix: int(minutes) for prefix, minutes in rows}
    assert syllabus == reading_minutes() and len(syllabus) >= 10


def test_each_labs_time_to_read_and_to_run_is_the_sum_of_its_tutorials_rows() -> None:
    """The syllabus's first table (labs) against its second (tutorials): minutes of reading (the tutorials'
    own), seconds of wall time and of CPU time."""
    text, reading = SYLLABUS.read_text(encoding="utf-8"), reading_minutes()
    rows = {p: (float(wall), float(cpu)) for p, wall, cpu in re.findall(
        r"^\| \w+ \| `(\w\w)_\w+\.py` \| \d+ min \| ([\d.]+) s \(([\d.]+) s CPU\) \|", text, re.M)}  # fmt: skip
    lab_row = r"^\| (?:\d\. [^|]+|appendix) \| ([^|]+) \| [^|]+ \| ~(\d+) min \| ([\d.]+) s \(([\d.]+) s CPU\) \|$"
    labs = re.findall(lab_row, text, re.M)
    assert len(labs) == 6 and len(rows) >= 11
    for tutorials, minutes, wall, cpu in labs:
        read = tutorials_in_words(tutorials.replace("appendix", ""))
        assert int(minutes) == sum(reading[t] for t in read), (tutorials, minutes)
        assert abs(float(wall) - sum(rows[t][0] for t in read)) < 0.5, (tutorials, wall)  # rounded as printed
        assert abs(float(cpu) - sum(rows[t][1] for t in read)) < 0.5, (tutorials, cpu)


def test_the_lab_plan_adds_up_the_reading_and_the_exercise_times_and_fits_two_hours() -> None:
    reading, text = reading_minutes(), SYLLABUS.read_text(encoding="utf-8")
    exercises_table = dict(re.findall(r"^\| \d \| (\d+\.\d) .* \| ~(\d+) min \|$", text, re.M))
    assert exercises_table == {e.number: str(e.minutes) for e in EXERCISES}  # the table's times are the catalog's
    plan = re.findall(r"^\| (\d) \| ([^|]+) \| ~(\d+) min \| exercises? ([\d., ]+) \| ~(\d+) min \|$", text, re.M)
    assert [lab for lab, *_ in plan] == ["1", "2", "3", "4", "5"]
    planned = []
    for _lab, tutorials, to_read, numbers, to_write in plan:
        read, written = tutorials_in_words(tutorials), [find(n.strip()) for n in numbers.split(",")]
        assert int(to_read) == sum(reading[t] for t in read), tutorials
        assert int(to_write) == sum(e.minutes for e in written) <= 120, numbers  # the exercises fit in the lab
        assert all(f"{int(e.number.split('.')[0]):02d}" in read for e in written), numbers  # its own tutorial first
        planned += [e.number for e in written]
    assert sorted(planned) == sorted(e.number for e in EXERCISES)  # every exercise, once


def test_the_syllabus_says_how_long_the_reading_for_exercises_1_1_4_1_5_1_and_5_2_takes() -> None:
    """The reading that the four exercises name, whole tutorials counted once, and the exercises' own times,
    summed from the catalog and the tutorials' title cells, against the figures the syllabus prints."""
    text = " ".join(SYLLABUS.read_text(encoding="utf-8").split())
    said = re.search(
        r"exercises ([\d.]+), ([\d.]+), ([\d.]+) and ([\d.]+), names sections of tutorials ([\w, ]+), which take "
        r"about (\d+) minutes to read \(([\d + ]+)\), and then asks for about (\d+) minutes of exercises "
        r"\(([\d + ]+)\)",
        text,
    )
    assert said is not None, "the syllabus no longer says how long the reading for the four exercises takes"
    four = [find(n) for n in said.groups()[:4]]
    assert [e.number for e in four] == ["1.1", "4.1", "5.1", "5.2"]
    named = {t for e in four for t in re.findall(r"tutorials/(\w\w)_\w+\.py", e.tutorial)}
    assert tutorials_in_words(said.group(5)) == named == {"01", "04", "05", "A1"}
    minutes = reading_minutes()
    total_reading = sum(minutes[t] for t in named)
    assert int(said.group(6)) == total_reading == sum(int(m) for m in said.group(7).split("+"))
    assert sorted(int(m) for m in said.group(7).split("+")) == sorted(minutes[t] for t in named)
    total_writing = sum(e.minutes for e in four)
    assert int(said.group(8)) == total_writing == sum(int(m) for m in said.group(9).split("+"))
    assert [int(m) for m in said.group(9).split("+")] == [e.minutes for e in four]
    assert total_reading > 120 / 2  # "the reading alone would fill most of the two hours"


def test_each_exercise_is_written_once_and_its_stub_is_the_solution_with_holes() -> None:
    """tests/exercise_solutions/ is the only source: the stub is the solution with each marked answer cut out, and
    both texts are free of the markers; everything outside the marks is the same, line for line."""
    names = {p.name for p in holes.SOLUTIONS.glob("*.py")}
    assert names == {"__init__.py", *(f"{e.module}.py" for e in EXERCISES)}
    assert not (ROOT / "tinyamp/exercises/template").exists()
    for module in sorted({e.module for e in EXERCISES}):
        stub, answer = holes.stub(module), holes.solution(module)
        assert ">>>" not in stub + answer and "<<<" not in stub + answer and "# hint:" not in stub + answer
        numbers = [e.number for e in EXERCISES if e.module == module]
        holes_cut = len(re.findall(r"# >>> exercise", holes.marked_source(module)))
        assert stub.count("raise NotImplementedError(") == holes_cut
        assert {n for n in re.findall(r'NotImplementedError\("Exercise (\d+\.\d+):', stub)} == set(numbers)
        kept = [line for line in stub.splitlines()[4:] if "NotImplementedError" not in line]
        assert all(line.split("  # noqa: F401")[0] in answer for line in kept), module  # nothing the answer lacks


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_the_stubs_and_solutions_a_workspace_gets_are_ruff_clean(tmp_path: Path) -> None:
    for kind in ("stubs", "solutions"):
        write_workspace(tmp_path / kind, solutions=kind == "solutions")
    done = subprocess.run(["ruff", "check", "--config", str(ROOT / "pyproject.toml"), "--no-cache",
                           str(tmp_path / "stubs" / PACKAGE), str(tmp_path / "solutions" / PACKAGE)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_marker_left_open_or_crossed_is_an_error_that_names_the_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def marked(text: str) -> None:
        monkeypatch.setattr(holes, "marked_source", lambda module: text)

    marked('"""Doc."""\ndef f():\n    # >>> exercise 1.1\n    return 1\n')
    with pytest.raises(ValueError, match=r"'exercise 1\.1' is never closed"):
        holes.cut("formats")
    marked('"""Doc."""\ndef f():\n    # >>> exercise 1.1\n    # <<< solution only\n')
    with pytest.raises(ValueError, match=r"line 4: '# <<< solution only' does not close 'exercise 1\.1'"):
        holes.cut("formats")


# ---- what to read first: one source, the catalog ---------------------------------------------------------------
def test_every_list_of_what_to_read_first_prints_the_catalogs() -> None:
    """README.md's list (as ``exercises --help`` prints it), the syllabus's lab table, ``exercises list`` and the
    workspace's README all print the catalog's reading (``Exercise.tutorial``, or its short form ``read_first``)."""
    from tinyamp.exercises.command import catalog_text
    from tinyamp.exercises.workspace import readme

    readme_md = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = [line.strip() for line in catalog_text().splitlines()]
    assert all(f"    {line}\n" in readme_md for line in listed), "README.md's exercise list is not catalog_text()"
    syllabus = SYLLABUS.read_text(encoding="utf-8")
    workspace = readme(False)
    listing = subprocess.run([sys.executable, "-m", "tinyamp", "exercises", "list"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    for e in EXERCISES:
        short = re.sub(r"(tinyamp/[\w/]+\.py)", r"`\1`", e.read_first)
        row = next((line for line in syllabus.splitlines() if f"| {e.number} {e.title} | `{e.id}` |" in line), "")
        assert row.endswith(f"| {short} | ~{e.minutes} min |"), f"the syllabus's row of {e.number}: {row}"
        assert f"| {e.tutorial} | ~{e.minutes} min |" in workspace, e.id
        assert f"  {e.tutorial}\n" in listing, e.id


def test_each_stubs_read_paragraph_names_what_the_catalog_says_to_read() -> None:
    """The docstring a student reads in the stub names every tutorial section and module of the catalog's list."""
    for e in EXERCISES:
        doc = " ".join(inspect.getdoc(getattr(stub_module(e.module), e.name)).split())
        read = doc.split("Read: ", 1)[1].split("Time: ", 1)[0]
        for part in re.sub(r" \([^()]*\)", "", e.tutorial).split("; "):  # the titles in parentheses left out
            file = re.search(r"(tutorials/\w+\.py|tinyamp/[\w/]+\.py)", part)[1]
            sections = re.findall(r"\d+", part.split(file, 1)[1])
            assert file in read, f"{e.number}: the stub's Read: does not name {file}"
            after = read.split(file, 1)[1].split("tutorials/", 1)[0]
            assert all(re.search(rf"\b{n}\b", after) for n in sections), f"{e.number}: {part!r}, stub: {read!r}"


# ---- what the command says around its work ---------------------------------------------------------------------
def test_list_and_init_describe_their_own_exit_statuses_not_grading() -> None:
    for command, said in (("init", "0 the workspace was written"), ("list", "0 listed")):
        out = subprocess.run([sys.executable, "-m", "tinyamp", "exercises", command, "--help"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        text = " ".join(out.split())
        assert said in text and "passes" not in text and "failed or not started" not in text, text


def test_the_footer_after_a_check_suggests_what_comes_next() -> None:
    """After --only 10.1 (passed): 10.2; after the last exercise, or all of them passed: nothing; a failed one first."""
    from types import SimpleNamespace

    from tinyamp.exercises.command import what_next

    def results(*pairs: tuple[str, str]) -> list[Any]:
        return [SimpleNamespace(exercise=find(number), status=status) for number, status in pairs]

    ws = Path("ws")
    assert what_next(results(("10.1", "passed")), ws) == (" Next: exercise 10.2, the delayed-scaling update of an "
                                                           "FP8 scale: tinyamp exercises check ws --only 10.2, or "
                                                           "pytest ws -m ex10_2")  # fmt: skip
    assert what_next(results(("5.1", "passed"), ("5.2", "failed")), ws).startswith(" Again: exercise 5.2,")
    assert what_next(results(("10.3", "passed")), ws) == ""
    assert what_next(results(*((e.number, "passed") for e in EXERCISES)), ws) == ""
    assert "--only 1.2" in what_next(results(*((e.number, "not started") for e in EXERCISES[1:])), ws)
