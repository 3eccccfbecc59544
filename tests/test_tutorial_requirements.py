"""The ``[tutorials]`` extra installs everything every tutorial needs, MPI included.

Each tutorial's imports are read from its source (``ast``); every third-party module among them
must come from a package of the extra or of tinyamp's own dependencies, and tutorial 9's
``mpiexec`` from MPICH.  Optional imports (inside ``try``, as PyTorch's cells are) are left out.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

pytestmark = pytest.mark.docs
ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "tutorials").glob("*.py"))
MODULE_OF = {"ml-dtypes": "ml_dtypes", "mpi4py": "mpi4py", "matplotlib": "matplotlib", "numpy": "numpy"}


def required_imports(path: Path) -> set[str]:
    """The top-level modules `path` imports outside any try block."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    optional = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) for n in ast.walk(t)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def package_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=\[ ;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_the_tutorials_extra_installs_every_import_and_mpi() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    installed = package_names(project["optional-dependencies"]["tutorials"]) | package_names(project["dependencies"])
    modules = {MODULE_OF.get(name, name.replace("-", "_")) for name in installed} | {"tinyamp"}
    needed = set().union(*(required_imports(p) for p in TUTORIALS)) - set(sys.stdlib_module_names)
    assert needed <= modules, f"the tutorials import {sorted(needed - modules)}, which [tutorials] does not install"
    assert {"mpi4py", "mpich"} <= installed  # tutorial 9 launches mpiexec, which MPICH's wheel brings
    assert {"jupytext", "ipykernel", "nbclient"} <= installed  # to run them as notebooks, as CI does
