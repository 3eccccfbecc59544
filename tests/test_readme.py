"""The README: its Python examples run as written, and it stays a ten-minute read in the course's order.

The README is what a newcomer reads top to bottom: at most 460 lines, its sections in one
order (try it, test it, a first look, read the code, exercises, tutorials, the GPU, across
processes, benchmarks), its map naming every folder of the package, its list of exercises the
catalog's, and its summary tables rows of the full ones in benchmarks/README.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tinyamp.exercises.catalog import EXERCISES

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TEXT = README.read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)
MOST_LINES = 460
SECTIONS = [
    "## Try it",
    "## Test it",
    "## A first look",
    "## Read the code",
    "## Exercises",
    "## Tutorials",
    "## On a GPU",
    "## Across processes",
    "## Benchmarks",
]


def section(text: str, heading: str) -> str:
    """The text under `heading` (a "## " line), up to the next "## " heading."""
    return text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def table_rows(text: str) -> set[str]:
    """The body rows of every Markdown table in `text` (header and rule rows included: they match too)."""
    return {line for line in text.splitlines() if line.startswith("|")}


def test_the_readme_has_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int) -> None:
    exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), {})


def test_the_readme_is_a_ten_minute_read_in_the_order_of_the_course() -> None:
    lines = len(TEXT.splitlines())
    assert lines <= MOST_LINES, f"README.md has {lines} lines; move detail to benchmarks/README.md or tinyamp/README.md"
    headings = [line for line in TEXT.splitlines() if line.startswith("## ")]
    missing = [h for h in SECTIONS if h not in headings]
    assert not missing, f"README.md lacks the sections {missing}"
    order = [h for h in headings if h in SECTIONS]
    assert order == SECTIONS, f"README.md's sections are in the order {order}, not {SECTIONS}"
    intro = TEXT.split("\n## ", 1)[0]  # the first screen leads to the exercises and the syllabus
    assert "(tutorials/README.md)" in intro and "(#exercises)" in intro and "tinyamp exercises init ws" in intro


def test_the_map_names_every_folder_of_the_package_once() -> None:
    read_the_code = section(TEXT, "## Read the code")
    named = re.findall(r"^    (tinyamp/[\w/]*) ", read_the_code, flags=re.M)
    folders = ["tinyamp/"] + sorted(
        f"tinyamp/{d.name}/" for d in (ROOT / "tinyamp").iterdir() if (d / "__init__.py").exists()
    )
    assert sorted(named) == sorted(folders), f"the map names {sorted(named)}; tinyamp/ has {folders}"
    part = re.compile(r"^    tinyamp/[\w/]*\s+(course|engine room|tools|data)\b", flags=re.M)
    assert len(part.findall(read_the_code)) == len(folders), "each line of the map says which part its folder is"


def test_the_readme_lists_every_exercise_of_the_catalog() -> None:
    exercises = section(TEXT, "## Exercises")
    listed = re.findall(r"^    (\d+\.\d+) +", exercises, flags=re.M)
    assert listed == [e.number for e in EXERCISES]
    assert all(f"    {e.number:<4} {e.title}" in exercises for e in EXERCISES)


def test_the_readme_summaries_are_rows_of_the_full_tables_in_benchmarks_readme() -> None:
    full = table_rows((ROOT / "benchmarks" / "README.md").read_text())
    for heading in ("## Benchmarks", "## On a GPU"):
        rows = table_rows(section(TEXT, heading))
        assert len(rows) >= 5, f"the README's {heading} has no table"
        assert rows <= full, f"rows of the README's {heading} not in benchmarks/README.md: {sorted(rows - full)}"
