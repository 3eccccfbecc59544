"""The graded definition is followed into the student's other files (``reach``): what an exercise forbids is
refused wherever in the workspace it hides, and a module the grader cannot read is refused.  The rules are tested
on source text; each attack also for real, by a workspace graded by the real command in a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tinyamp.exercises.catalog import PACKAGE
from tinyamp.exercises.reach import imports, reached, references, unreadable_module, workspace_sources
from tinyamp.exercises.workspace import write_workspace

ROOT = Path(__file__).resolve().parents[1]
SOLVED_FORMATS = (ROOT / "tests" / "exercise_solutions" / "formats.py").read_text()


def test_workspace_sources_names_each_file_as_python_imports_it(tmp_path: Path) -> None:
    (tmp_path / PACKAGE / "sub").mkdir(parents=True)
    for name in (f"{PACKAGE}/__init__.py", f"{PACKAGE}/formats.py", f"{PACKAGE}/sub/__init__.py",
                 f"{PACKAGE}/sub/deep.py", "helper.py", ".hidden/x.py", "not-a-name.py"):  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"# {name}\n")
    (tmp_path / PACKAGE / "latin1.py").write_bytes(b"# caf\xe9\n")  # not UTF-8: left out
    assert sorted(workspace_sources(tmp_path)) == ["helper", PACKAGE, f"{PACKAGE}.formats", f"{PACKAGE}.sub",
                                                   f"{PACKAGE}.sub.deep"]  # fmt: skip


def test_relative_imports_resolve_from_the_modules_package() -> None:
    import ast

    tree = ast.parse("from . import helper\nfrom .helper import impl as f\nfrom .. import top\nimport numpy as np\n")
    names = imports(tree, "myamp.sub")
    assert names == {"helper": "myamp.sub.helper", "f": "myamp.sub.helper.impl", "top": "myamp.top", "np": "numpy"}


def test_reached_follows_helpers_transitively_and_a_module_used_whole() -> None:
    sources = {
        "myamp.formats": "from myamp import one\n\ndef graded(x):\n    return one.step(x)\n",
        "myamp.one": "from .two import deeper\n\ndef step(x):\n    return deeper(x)\n\ndef unused():\n    pass\n",
        "myamp.two": "import myamp.three as three\n\ndef deeper(x):\n    return three\n",
        "myamp.three": "import tinyamp.rounding\n",
    }
    assert reached(sources, "myamp.formats", "graded") == [("myamp.formats", "graded"), ("myamp.one", "step"),
                                                           ("myamp.two", "deeper"), ("myamp.three", None)]  # fmt: skip
    assert references(sources["myamp.one"], "myamp.one", "unused", sources) == []  # not reached, not read


@pytest.mark.parametrize(("full", "why"), [
    ("numpy.float32", ""), ("math.frexp", ""), ("tinyamp.tensor.Tensor", ""), ("myamp.helper.impl", ""),
    ("pickle.loads", "pickle.loads loads or runs code the grader cannot read"),
    ("sys.path.insert", "sys.path.insert loads or runs code the grader cannot read"),
    ("myamp.made_later.impl", "myamp.made_later.impl is not in the workspace as it was handed in (made while "
                              "grading?)"),
    ("evil.impl", "evil.impl is outside the workspace, the standard library, NumPy, ml_dtypes and tinyamp"),
])  # fmt: skip
def test_unreadable_modules_are_named(full: str, why: str) -> None:
    assert unreadable_module(full, {"myamp": "", "myamp.helper": ""}, "myamp") == why


# ---- the attacks, for real -----------------------------------------------------------------------------------
def graded_row(workspace: Path, number: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "tinyamp", "exercises", "check", str(workspace), "--only", number],
                          capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)  # fmt: skip
    return next(line for line in done.stdout.splitlines() if line.startswith(f"{number} "))


def with_body(workspace: Path, body: str, helpers: dict[str, str]) -> Path:
    """Exercise 1.1's round_to_float16 in `workspace` made to `body`, with `helpers` (path -> text) beside it."""
    path = workspace / PACKAGE / "formats.py"
    source = path.read_text()
    start = source.index("def round_to_float16(")
    end = source.index("\n\n\n", start)
    head = source[start:end].split('"""')
    path.write_text(source[:start] + '"""'.join(head[:2]) + '"""\n' + body + source[end:])
    for name, text in helpers.items():
        (workspace / name).write_text(text)
    return workspace


ATTACKS = {
    "a helper that re-exports tinyamp.rounding": (
        "    from myamp import helper\n    return helper.impl(x)\n",
        {f"{PACKAGE}/helper.py": "from tinyamp.rounding import round_to_float16 as impl\n"},
        "round_to_float16, through myamp/helper.py (impl), uses tinyamp.rounding.round_to_float16 (line 1), "
        "tinyamp's own version of what Exercise 1.1 asks you to build: write it yourself",
    ),
    "a relative import, two helpers deep, NumPy's cast": (
        "    from .helper import impl\n    return impl(x)\n",
        {f"{PACKAGE}/helper.py": "from .deeper import cast\n\n\ndef impl(x):\n    return cast(x)\n",
         f"{PACKAGE}/deeper.py": "import numpy as np\n\n\ndef cast(x):\n    return x.astype(np.float16)\n"},
        "round_to_float16, through myamp/deeper.py (cast), converts to float16 with NumPy (line 5: astype(float16))",
    ),
    "a helper written at run time": (
        "    import pathlib\n    pathlib.Path(__file__).with_name('made.py').write_text("
        "'from tinyamp.rounding import round_to_float16 as impl')\n"
        "    from myamp import made\n    return made.impl(x)\n",
        {},
        "round_to_float16 reaches myamp.made.impl (line #): myamp.made.impl is not in the workspace as it was "
        "handed in (made while grading?)",
    ),
    "a module outside the workspace, by sys.path": (
        "    import sys\n    sys.path.insert(0, '/tmp')\n"
        "    import tinyamp_evil_helper\n    return tinyamp_evil_helper.f(x)\n",
        {},
        "myamp/formats.py line #: uses sys.path.insert, which loads or runs code the grader cannot read: the grader "
        "cannot tell what such code changes, so it grades none of it",
    ),
    "a star import": (
        "    from .helper import impl\n    return impl(x)\n",
        {f"{PACKAGE}/helper.py": "from tinyamp.rounding import *\n\nimpl = round_to_float16\n"},
        "round_to_float16, through myamp/helper.py (impl), is in a file with a star import (line 1: from "
        "tinyamp.rounding import *): the grader cannot tell which names it binds, so import each name you use by name",
    ),
    "pickle": (
        "    import pickle\n    return pickle.loads(b'ctinyamp.rounding\\nround_to_float16\\n.')(x)\n",
        {},
        "myamp/formats.py line #: uses pickle.loads, which loads or runs code the grader cannot read",
    ),
}


@pytest.mark.cli
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_what_an_exercise_forbids_is_refused_wherever_it_hides(tmp_path: Path, attack: str) -> None:
    body, helpers, sentence = ATTACKS[attack]
    write_workspace(tmp_path / "ws")
    row = graded_row(with_body(tmp_path / "ws", body, helpers), "1.1")
    assert " failed " in row and re.search(re.escape(sentence).replace("\\#", r"\d+"), row), row  # '#': a line


@pytest.mark.cli
def test_a_helper_that_does_the_work_by_hand_passes(tmp_path: Path) -> None:
    """The reference solution's round_to_float16, moved into a helper module the graded function calls."""
    start = SOLVED_FORMATS.index("def round_to_float16(")
    end = SOLVED_FORMATS.index("\n\n\ndef ", start)
    helper = SOLVED_FORMATS[: SOLVED_FORMATS.index("def ")] + SOLVED_FORMATS[start:end] + "\n"
    write_workspace(tmp_path / "ws")
    workspace = with_body(tmp_path / "ws", "    from . import by_hand\n    return by_hand.round_to_float16(x)\n",
                          {f"{PACKAGE}/by_hand.py": helper})  # fmt: skip
    assert " passed " in graded_row(workspace, "1.1")


@pytest.mark.cli
def test_a_definition_that_is_not_in_the_file_is_refused_whatever_the_students_process_says(tmp_path: Path) -> None:
    """The file has no round_to_float16: a module __getattr__ hands out tinyamp's, and inspect.getsourcefile is
    patched so that the student's process says it was defined in formats.py.  The command refuses the patch;
    past that check (the grader reading the file without it), the grader still finds no such definition."""
    from exercise_helpers import FAILED, grade_remote

    from tinyamp.exercises.catalog import find

    write_workspace(tmp_path / "ws")
    path = tmp_path / "ws" / PACKAGE / "formats.py"
    source = path.read_text()
    start = source.index("def round_to_float16(")
    source = source[:start] + "def _unused(x):\n    pass" + source[source.index("\n\n\n", start):]
    handed_out = "\n\ndef __getattr__(name):\n    from tinyamp import rounding\n    return rounding.round_to_float16\n"
    patch = ("\n\nimport inspect as _inspect\n\n_real = _inspect.getsourcefile\n_inspect.getsourcefile = lambda obj: "
             "__file__ if getattr(obj, '__name__', '') == 'round_to_float16' else _real(obj)\n")
    path.write_text(source + handed_out + patch)
    row = graded_row(tmp_path / "ws", "1.1")
    assert " failed " in row and "changes inspect.getsourcefile, which it imported" in row, row
    sources = {**workspace_sources(tmp_path / "ws"), f"{PACKAGE}.formats": source + handed_out}
    result = grade_remote(find("1.1"), tmp_path / "ws", sources=sources)
    assert result.status == FAILED and result.message.startswith(
        "myamp/formats.py has no round_to_float16: the grader looks for that name"), result.message


PASS_THROUGH = "\n    return segment(x)\n"  # right gradients, no memory saved: only the memory check can fail it
MEMORY_PATCH = ("import tinyamp.exercises.graders.checkpointing as _grader\n"
                "_grader.memory_held = lambda checkpoint_segment: 0  # the grader's measurement, made to say 0 bytes\n")


@pytest.mark.cli
@pytest.mark.parametrize(("where", "sentence"), [
    ("checkpointing.py", "myamp/checkpointing.py line # changes tinyamp.exercises.graders.checkpointing.memory_held, "
                         "which it imported: the grader cannot tell what such code changes, so it grades none of it"),
    ("__init__.py", "myamp/__init__.py line # changes tinyamp.exercises.graders.checkpointing.memory_held, which it "
                    "imported"),
])  # fmt: skip
def test_a_patched_measurement_is_refused_in_the_file_or_in_the_package_that_loads_first(
    tmp_path: Path, where: str, sentence: str
) -> None:
    """7.1's memory is measured in the student's process: a checkpoint that saves nothing passed once its file (or
    myamp/__init__.py, which Python runs first) replaced the measurement."""
    write_workspace(tmp_path / "ws", solutions=True)
    path = tmp_path / "ws" / PACKAGE / "checkpointing.py"
    source = path.read_text()
    start = source.index("def checkpoint_segment(")
    body = source.index('"""', source.index('"""', start) + 3) + 3
    end = source.find("\n\n\n", body)
    path.write_text(source[:body] + PASS_THROUGH + (source[end:] if end != -1 else ""))
    target = tmp_path / "ws" / PACKAGE / where
    target.write_text(target.read_text() + "\n\n" + MEMORY_PATCH)
    row = graded_row(tmp_path / "ws", "7.1")
    assert " failed " in row and re.search(re.escape(sentence).replace("\\#", r"\d+:"), row), row
