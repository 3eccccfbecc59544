"""The library keeps its layers: a reading path within its line budget, and three parts with one direction.

The README's "Read the code" table is the reading path.  These tests print it with the line
counts measured now, and check that the table's counts are the real ones, that the total stays
within 1,800 lines, that each mechanism of the paper fits on one screen in the code that runs,
and that no module of the path imports the engine room (``tinyamp.engine``), directly or
through the modules it imports.

The package has three parts, told apart by their folders: the **engine room**
(``tinyamp/engine/``), the **tools** (the command line and the folders in ``TOOLS``), and the
**course** (everything else: the reading path and what it reads beside it).  The course imports
neither of the others; the engine room imports only the seam it fills (``tinyamp.kernels`` and
the modules that rest under it) and the optimizers whose updates it fuses; the tools import the
course, and the engine room only where the command line reports or configures it.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

import pytest

import tinyamp
from tinyamp import autograd, kernels, rounding
from tinyamp.amp.loss_scale import ScaleRule
from tinyamp.amp.master import MasterWeights
from tinyamp.amp.scaler import LossScaler
from tinyamp.autocast import autocast

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 1800
ENGINE_ROOM = ("tinyamp.engine", "tinyamp.fast", "tinyamp.cuda")  # the last two: the old names, kept one release
TOOLS = ("tinyamp.cli", "tinyamp.__main__", "tinyamp.experiments", "tinyamp.exercises", "tinyamp.testing",
         "tinyamp.inspect", "tinyamp.distributed", "tinyamp.data")  # fmt: skip
SEAM = ("tinyamp.kernels", "tinyamp.backend", "tinyamp.dtypes", "tinyamp.rounding", "tinyamp._startup")
ROW = re.compile(r"^\| (\d+) \| `(tinyamp/[\w/]+\.py)` \| (.+?) \| (\d+) \|$")

# Each mechanism of Micikevicius et al. (2018), where it is written, and the most lines it may take.
MECHANISMS = {
    "rounding to FP16": [rounding.round_to_float16],
    "the op policy": [autocast.target_dtype, autocast._eligible, autocast._cast],
    "the Tensor Core product": [kernels.product],
    "the master-weight step": [MasterWeights.step, MasterWeights._round_into_model],
    "the loss-scale rule and its states": [ScaleRule.next, ScaleRule.state],
    "the overflow check and skip": [LossScaler.unscale_, LossScaler._unscale, LossScaler.step,
                                    LossScaler._unscale_and_step],
    "the backward walk": [autograd.backward],
}
ONE_SCREEN = 60


def reading_path() -> list[tuple[str, str, int]]:
    """(module path, what it teaches, line count claimed) for each row of the README's table."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Read the code", 1)[1].split("\n## ", 1)[0]
    return [(m[2], m[3], int(m[4])) for line in section.splitlines() if (m := ROW.match(line))]


def lines_of(path: str) -> int:
    return len((ROOT / path).read_text().splitlines())


def test_the_reading_path_is_within_its_budget_and_the_readme_counts_are_true(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = reading_path()
    assert len(path) >= 8, "the README's 'Read the code' table was not found"
    measured = [(module, lines_of(module)) for module, _, _ in path]
    total = sum(n for _, n in measured)
    with capsys.disabled():
        print(f"\nreading path: {len(path)} modules, {total} lines (budget {BUDGET})")
        for module, n in measured:
            print(f"  {n:5d}  {module}")
    wrong = [f"{m}: README says {claimed}, the file has {n}" for (m, _, claimed), (_, n) in zip(path, measured)
             if claimed != n]  # fmt: skip
    assert not wrong, "update the README's line counts:\n" + "\n".join(wrong)
    assert total <= BUDGET
    assert f"| | total | | {total} |" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_each_mechanism_fits_on_one_screen_on_the_reading_path(mechanism: str) -> None:
    on_path = {module for module, _, _ in reading_path()}
    for fn in MECHANISMS[mechanism]:
        source, _ = inspect.getsourcelines(fn)
        module = Path(inspect.getsourcefile(fn)).resolve().relative_to(ROOT).as_posix()
        assert module in on_path, f"{fn.__qualname__} ({mechanism}) is in {module}, not on the reading path"
        assert len(source) <= ONE_SCREEN, f"{fn.__qualname__} ({mechanism}) takes {len(source)} lines"


def test_the_scaled_step_is_short_and_names_no_device() -> None:
    """Check, then skip or step, then update: at most 25 lines, and a device or a fused step only in the engine
    room (not in the code, nor in its docstring or comments: the teaching core speaks of what it does)."""
    source = inspect.getsource(LossScaler.step)
    body = ast.parse(textwrap.dedent(source)).body[0].body[1:]  # the code, without the docstring
    code = "\n".join(ast.unparse(node) for node in body)
    assert len(source.splitlines()) <= 25, f"LossScaler.step takes {len(source.splitlines())} lines"
    assert not re.search(r"device|cuda|gpu|cupy", code, flags=re.I), code
    named = re.findall(r".*(?:device|cuda|gpu|cupy|fused|engine room).*", source, flags=re.I)
    assert not named, "LossScaler.step's docstring or comments name what the reference does not do: " + str(named)


def imported_modules(path: Path) -> set[str]:
    """The tinyamp modules that `path` imports at any level (``from tinyamp import x`` counts as tinyamp.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] == "tinyamp"}


def module_file(name: str) -> Path | None:
    """The source file of module `name`, or None for a name that is not a module (a function, a class)."""
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def reachable_from(path: Path) -> dict[str, str]:
    """Every tinyamp module `path` reaches through imports, with the module it was reached from.

    Importing ``tinyamp.x.y`` runs the package files ``tinyamp/x/__init__.py`` too, so they are
    followed; ``tinyamp/__init__.py`` is not: it is where the engine room is registered, the one
    place allowed to know both sides.
    """
    seen: dict[str, str] = {}
    todo = [(path, "the module itself")]
    while todo:
        file, via = todo.pop()
        for name in imported_modules(file):
            parts = name.split(".")
            for i in range(2, len(parts) + 1):  # the packages on the way, then the module
                prefix = ".".join(parts[:i])
                target = module_file(prefix)
                if target is not None and prefix not in seen:
                    seen[prefix] = str(file.relative_to(ROOT))
                    todo.append((target, prefix))
    return seen


def test_no_module_of_the_reading_path_reaches_the_engine_room() -> None:
    for module, _, _ in reading_path():
        reached = reachable_from(ROOT / module)
        engine = {name: via for name, via in reached.items() if name.startswith(ENGINE_ROOM)}
        names = ", ".join(f"{n} (from {v})" for n, v in engine.items())
        assert not engine, f"{module} reaches the engine room: {names}"


def module_name(file: Path) -> str:
    parts = file.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def in_part(name: str, part: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in part)


def modules_of(part: str) -> list[tuple[str, Path]]:
    """(module name, file) of every module of `part`: "engine room", "tools" or "course"."""
    found = []
    for file in sorted((ROOT / "tinyamp").rglob("*.py")):
        name = module_name(file)
        kind = "engine room" if in_part(name, ENGINE_ROOM) else "tools" if in_part(name, TOOLS) else "course"
        if kind == part and name != "tinyamp":  # tinyamp/__init__.py is the wiring, the one place that knows all
            found.append((name, file))
    return found


def test_the_course_imports_neither_the_engine_room_nor_the_tools() -> None:
    course = modules_of("course")
    assert len(course) > 40 and ("tinyamp.amp.scaler", ROOT / "tinyamp/amp/scaler.py") in course
    for name, file in course:
        wrong = sorted(m for m in imported_modules(file) if in_part(m, ENGINE_ROOM + TOOLS))
        assert not wrong, f"{name} (course) imports {wrong}"


def test_the_engine_room_imports_only_the_seam_it_fills() -> None:
    engine = modules_of("engine room")
    assert any(name == "tinyamp.engine.cuda.scaler_step" for name, _ in engine)
    for name, file in engine:
        wrong = sorted(m for m in imported_modules(file)
                       if not in_part(m, ENGINE_ROOM + SEAM + ("tinyamp.optim",)) and m != "tinyamp")  # fmt: skip
        assert not wrong, f"{name} (engine room) imports {wrong}: only the seam, tinyamp.kernels, and what it rests on"


def test_the_engine_room_is_registered_only_by_the_package() -> None:
    """Outside the engine room itself, only tinyamp/__init__.py (the wiring) and the command line
    (``tinyamp info`` reports the cast implementation; training runs call keep_freed_memory) import it."""
    tools = modules_of("tools")
    assert any(name == "tinyamp.testing" for name, _ in tools)
    for name, file in tools + modules_of("course"):
        engine = {m for m in imported_modules(file) if in_part(m, ENGINE_ROOM)}
        assert not engine or name == "tinyamp.cli", f"{name} imports {sorted(engine)}"


@pytest.mark.skipif(tinyamp.ENGINE_ROOM == "off", reason="TINYAMP_ENGINE_ROOM=off: the reference alone, on purpose")
def test_import_tinyamp_registers_the_engine_room() -> None:
    assert kernels._engine_room["cast"] and kernels._engine_room["product"]


def import_graph(part: str) -> dict[str, set[str]]:
    """Module -> the modules of `part` it imports (at any level, ``TYPE_CHECKING`` included), leaving out
    a module's own packages: ``tinyamp/amp/__init__.py`` importing ``amp.scaler`` is the package's shape."""
    names = {name for name, _ in modules_of(part)}
    graph = {}
    for name, file in modules_of(part):
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        targets = set()
        for imported in imported_modules(file):
            parts = imported.split(".")
            found = next((".".join(parts[:i]) for i in range(len(parts), 1, -1) if ".".join(parts[:i]) in names), None)
            if found is not None and found != name and found not in ancestors:
                targets.add(found)
        graph[name] = targets
    return graph


def test_the_course_has_no_import_cycle() -> None:
    graph = import_graph("course")
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = path[path.index(name):] + [name]
            raise AssertionError("an import cycle in the course: " + " -> ".join(cycle))
        if name not in done:
            for target in sorted(graph[name]):
                visit(target, path + [name])
            done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_no_two_modules_of_tinyamp_import_each_other() -> None:
    """Two modules that import each other (at the top, or inside a function: a lazy import is still one) have
    no order a reader can follow: what both need belongs in one of them, or in a third module that both import.
    A package importing its own modules (``tinyamp/amp/__init__.py`` and ``amp.scaler``) is the package's shape."""
    files = {module_name(file): file for file in sorted((ROOT / "tinyamp").rglob("*.py"))}
    imports = {}
    for name, file in files.items():
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        relative = [n for n in ast.walk(ast.parse(file.read_text())) if isinstance(n, ast.ImportFrom) and n.level]
        assert not relative, f"{name} has a relative import (line {relative[0].lineno}): write it as tinyamp.<...>"
        found = set()
        for imported in imported_modules(file):
            parts = imported.split(".")
            module = next(".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in files)
            if module != name and module not in ancestors:
                found.add(module)
        imports[name] = found
    pairs = sorted({" <-> ".join(sorted((a, b))) for a, targets in imports.items() for b in targets
                    if a in imports.get(b, set())})  # fmt: skip
    assert not pairs, "modules that import each other: " + "; ".join(pairs)


def test_no_test_file_is_longer_than_800_lines() -> None:
    """The suite follows the lessons: a file that outgrows 800 lines is split by topic, its marker kept."""
    long = {f.relative_to(ROOT).as_posix(): n for f in sorted((ROOT / "tests").rglob("*.py"))
            if (n := len(f.read_text().splitlines())) > 800}  # fmt: skip
    assert not long, f"split these by topic: {long}"
