"""The tutorials: each runs top to bottom as a script, asserts what it teaches, and writes its figures.

Every ``tutorials/NN_*.py`` runs in a fresh interpreter (as a reader would run it), with its
figures sent to a temporary folder through TINYAMP_TUTORIAL_OUT.  The files are also checked
for the jupytext "percent" cell format that lets editors step through them cell by cell.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tinyamp

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))
NAMES = [p.name for p in TUTORIALS]
CELL_MARKERS = ("# %%", "# %% [markdown]")
TIMEOUT_S = 300  # each tutorial takes seconds; this only stops a hung one


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
    assert len(TUTORIALS) >= 8, f"expected at least 8 tutorials in tutorials/, found {NAMES}"
    numbers = [name[:2] for name in NAMES]
    assert len(set(numbers)) == len(numbers), f"two tutorials share a number: {NAMES}"


# Tutorial 7 measures peak memory with the engine room's casts, which convert in cache-sized
# blocks; the reference casts alone (TINYAMP_ENGINE_ROOM=off) make whole-array temporaries.
PEAKS_OF_THE_ENGINE_ROOM = pytest.mark.skipif(
    tinyamp.ENGINE_ROOM == "off", reason="measures peak memory with the engine room's casts"
)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=PEAKS_OF_THE_ENGINE_ROOM) if n.startswith("07") else n for n in NAMES]
)
def test_the_tutorial_runs_and_writes_its_figures(name: str, tmp_path: Path) -> None:
    # One BLAS thread: the tutorials' matrices are small, and OpenBLAS threads spinning against
    # another busy process on a 2-core machine made a 5-second tutorial take a minute.
    env = dict(os.environ, TINYAMP_TUTORIAL_OUT=str(tmp_path), MPLBACKEND="Agg", OPENBLAS_NUM_THREADS="1")
    # As tests/conftest.py does for the tests: find tinyamp even without `pip install -e .`.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tutorials" / name)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, f"{name} exited with status {proc.returncode}; end of stderr:\n{proc.stderr[-4000:]}"
    figures = sorted(p.name for p in tmp_path.glob(f"{name[:2]}*.png"))
    written = sorted(p.name for p in tmp_path.iterdir())
    assert figures, f"{name} wrote no PNG starting with {name[:2]!r} to TINYAMP_TUTORIAL_OUT; it wrote {written}"


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
