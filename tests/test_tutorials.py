"""The tutorials: each runs top to bottom as a script, asserts what it teaches, and writes its figures.

Every ``tutorials/NN_*.py`` and every appendix ``tutorials/AN_*.py`` runs in a fresh interpreter (as a
reader would run it), with its figures sent to a temporary folder through TINYAMP_TUTORIAL_OUT.  The
files are also checked for the jupytext "percent" cell format that lets editors step through them cell
by cell, and the syllabus (tutorials/README.md) for listing each one with its questions (answers in ANSWERS.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tinyamp

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[1]
NUMBERED = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))
APPENDICES = sorted((ROOT / "tutorials").glob("A[0-9]_*.py"))  # after the numbered ones, in the same CI run
TUTORIALS = NUMBERED + APPENDICES
NAMES = [p.name for p in TUTORIALS]
CELL_MARKERS = ("# %%", "# %% [markdown]")
TIMEOUT_S = 300  # each tutorial takes seconds; this only stops a hung one
# Tutorials that write NN_quoted.json: the phrases with measured figures that their syllabus answers quote.
QUOTES_ITS_ANSWERS = ("10_eight_bits.py",)


def cells(path: Path) -> list[tuple[str, list[str]]]:
    """The cells of a percent-format file: (marker line, the lines up to the next marker)."""
    out: list[tuple[str, list[str]]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# %%"):
            out.append((line, []))
        elif out:
            out[-1][1].append(line)
    return out


def test_the_tutorials_are_all_there() -> None:
    assert len(NUMBERED) >= 8, f"expected at least 8 numbered tutorials in tutorials/, found {NAMES}"
    assert APPENDICES, f"expected the appendix A1_*.py in tutorials/, found {NAMES}"
    numbers = [name[:2] for name in NAMES]  # also the prefix of each one's figures
    assert len(set(numbers)) == len(numbers), f"two tutorials share a number: {NAMES}"


def lessons(text: str, level: str) -> dict[str, tuple[str, str]]:
    """{lesson: (title, body)} for each ``<level> N. title`` heading of `text` ("###" in the syllabus, "##" in
    ANSWERS.md); the body runs to the next heading."""
    parts = re.split(rf"^{level} (\w+)\. (.*)$", text, flags=re.M)
    return {n: (title, re.split(r"^#", body, flags=re.M)[0]) for n, title, body in zip(parts[1::3], parts[2::3],
                                                                                         parts[3::3])}  # fmt: skip


def slug(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's) makes of a heading: "1. Floating-point" -> "1-floating-point"."""
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", heading.lower()))


def numbered_items(text: str) -> list[str]:
    return re.findall(r"^(\d+)\. ", text, flags=re.M)


def test_the_syllabus_lists_every_tutorial_with_questions_and_answers_kept_apart() -> None:
    """Each lesson's questions end with a link to its answers in ANSWERS.md, as many answers as questions;
    no answer sits under its question (``<details>`` folds only when rendered: a terminal shows it all)."""
    syllabus = (ROOT / "tutorials" / "README.md").read_text(encoding="utf-8")
    missing = [name for name in NAMES if f"`{name}`" not in syllabus]
    assert not missing, f"tutorials/README.md does not list {missing}"
    assert "<details>" not in syllabus, "an answer under its question in tutorials/README.md: move it to ANSWERS.md"
    questions = lessons(syllabus.split("## Check your understanding", 1)[1].split("\n## ", 1)[0], "###")
    answered = lessons((ROOT / "tutorials" / "ANSWERS.md").read_text(encoding="utf-8"), "##")
    assert len(questions) >= len(NAMES) and list(questions) == list(answered), (list(questions), list(answered))
    for lesson, (title, asked) in questions.items():
        anchor = slug(f"{lesson}. {title}")
        assert f"](ANSWERS.md#{anchor})" in asked, f"lesson {lesson}'s questions do not link to ANSWERS.md#{anchor}"
        assert answered[lesson][0] == title, f"lesson {lesson}: {answered[lesson][0]!r} in ANSWERS.md, {title!r}"
        assert f"](README.md#{anchor})" in answered[lesson][1], f"ANSWERS.md's lesson {lesson} links back"
        n, m = numbered_items(asked), numbered_items(answered[lesson][1])
        assert n and n == m, f"lesson {lesson}: questions {n}, answers {m}"


# Tutorial 7 measures peak memory with the engine room's casts, which convert in cache-sized
# blocks; the reference casts alone (TINYAMP_ENGINE_ROOM=off) make whole-array temporaries.
PEAKS_OF_THE_ENGINE_ROOM = pytest.mark.skipif(
    tinyamp.ENGINE_ROOM == "off", reason="measures peak memory with the engine room's casts"
)


def notebook_tools_available() -> bool:
    """jupytext, nbclient and ipykernel (the `tutorials` and `test` extras) run a tutorial as a notebook."""
    try:
        import ipykernel  # noqa: F401
        import jupytext  # noqa: F401
        import nbclient  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.long_run
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=PEAKS_OF_THE_ENGINE_ROOM) if n.startswith("07") else n for n in NAMES]
)
def test_the_tutorial_runs_and_writes_its_figures(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a notebook, cell by cell in a Jupyter kernel, where the notebook tools are installed (CI
    installs them); as a script otherwise.  Each tutorial bounds its BLAS threads itself."""
    env = dict(os.environ, TINYAMP_TUTORIAL_OUT=str(tmp_path), MPLBACKEND="Agg")
    # As tests/conftest.py does for the tests: find tinyamp even without `pip install -e .`.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if notebook_tools_available():
        images = run_as_notebook(ROOT / "tutorials" / name, env, monkeypatch)
    else:
        env.pop("MPLBACKEND")  # a script chooses Agg itself where there is no display
        proc = subprocess.run([sys.executable, str(ROOT / "tutorials" / name)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S)  # fmt: skip
        assert proc.returncode == 0, f"{name} exited with status {proc.returncode}:\n{proc.stderr[-4000:]}"
        images = None
    figures = sorted(p.name for p in tmp_path.glob(f"{name[:2]}*.png"))
    written = sorted(p.name for p in tmp_path.iterdir())
    assert figures, f"{name} wrote no PNG starting with {name[:2]!r} to TINYAMP_TUTORIAL_OUT; it wrote {written}"
    if images is not None:  # every figure it saves is also drawn in the notebook, under its cell
        assert images >= len(figures), f"{name}: {len(figures)} figures saved, {images} drawn inline"
    if name in QUOTES_ITS_ANSWERS:
        check_the_answers_quote_the_run(name, tmp_path / f"{name[:2]}_quoted.json")


def answers(lesson: str) -> str:
    """The answers of lesson `lesson` ("5", "10", "A1") in tutorials/ANSWERS.md, whitespace collapsed."""
    found = lessons((ROOT / "tutorials" / "ANSWERS.md").read_text(encoding="utf-8"), "##").get(lesson)
    assert found, f"tutorials/ANSWERS.md has no answers for lesson {lesson} ('## {lesson}. ...')"
    return " ".join(found[1].split())


def check_the_answers_quote_the_run(name: str, quoted: Path) -> None:
    """Every phrase the tutorial wrote (its figures, from this run) appears in its lesson's answers."""
    assert quoted.is_file(), f"{name} wrote no {quoted.name}: the phrases its syllabus answers quote"
    phrases = [p for section in json.loads(quoted.read_text()).values() for p in section]
    text = answers(name[:2].lstrip("0"))
    missing = [p for p in phrases if " ".join(p.split()) not in text]
    assert phrases and not missing, (
        f"tutorials/ANSWERS.md's answers to lesson {name[:2].lstrip('0')} do not say what {name} measured in this "
        f"run: {missing}"
    )


def run_as_notebook(path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> int:
    """Execute the tutorial as a notebook (jupytext + nbclient); return how many images its cells drew."""
    import jupytext
    import nbclient

    for key, value in env.items():
        monkeypatch.setenv(key, value)  # the kernel inherits this process's environment
    monkeypatch.delenv("MPLBACKEND")  # the kernel's own inline backend draws the figures
    notebook = jupytext.read(path)
    client = nbclient.NotebookClient(notebook, timeout=TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})  # fmt: skip
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        pytest.fail(f"{path.name}, run as a notebook, failed in a cell:\n{str(exc)[-4000:]}")
    drawn = 0
    for number, cell in enumerate(notebook.cells):
        images = [out["data"]["image/png"] for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]
        # a pyplot figure left as the cell's value is drawn twice: by the display hook and by the inline backend
        assert len(set(images)) == len(images), f"{path.name}, cell {number}: one figure drawn twice"
        drawn += len(images)
    return drawn


@pytest.mark.parametrize("name", NAMES)
def test_the_tutorial_is_a_sequence_of_percent_cells_opening_with_a_title(name: str) -> None:
    path = ROOT / "tutorials" / name
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# %% [markdown]\n"), f"{name} must open with a markdown cell ('# %% [markdown]')"
    found = cells(path)
    bad = [marker for marker, _ in found if marker not in CELL_MARKERS]
    assert not bad, f"{name}: cell markers must be exactly '# %%' or '# %% [markdown]'; found {bad}"
    title = next((line for line in found[0][1] if line.strip()), "")
    assert title.startswith("# # "), f"{name}: the first cell must start with a title line '# # ...'; got {title!r}"
    for marker, body in found:
        if marker == "# %% [markdown]":
            code = [line for line in body if line.strip() and not line.startswith("#")]
            assert not code, f"{name}: a markdown cell holds lines that are not comments: {code[:3]}"
    assert any(marker == "# %%" for marker, _ in found), f"{name} has no code cell"


@pytest.mark.parametrize("name", NAMES)
def test_jupytext_reads_the_tutorial_as_a_notebook(name: str) -> None:
    jupytext = pytest.importorskip("jupytext")
    notebook = jupytext.read(ROOT / "tutorials" / name)
    kinds = [cell.cell_type for cell in notebook.cells]
    assert kinds[0] == "markdown" and notebook.cells[0].source.startswith("# "), kinds[:3]
    assert "markdown" in kinds and "code" in kinds, kinds
