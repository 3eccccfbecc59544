"""Following the graded definition into the student's other files, and refusing what cannot be followed.

``source_checks`` reads one file.  A student's definition may call a helper in another file of the
workspace (``from myamp import helper``, ``from .helper import impl``), and what the exercise forbids
may be there.  So the checks run on every workspace definition the graded one reaches, transitively:
``reached`` lists them as (module, name) pairs, name None where a module is used as a whole, read from
the files as they were handed in (``workspace_sources``, read before any student code ran, so code that
writes a new file at run time and imports it reaches a module the grader never read).

The graded definition may reach, through its imports, the standard library, NumPy, ml_dtypes, tinyamp
and the workspace's own files; a module outside those is one the grader cannot read, and so is a
standard module that runs code given as data (``pickle``, ``marshal``, ``runpy``, ``ctypes``...):
``unreadable_module`` names the first such reference, and the grader refuses the code rather than
guess what it does.

Code at the top of a module runs on import, reached or not, so ``patching`` reads each of these files
whole for what would change the grading from inside the student's process: an assignment to an
attribute of an imported module (``np.isnan = ...``, a grader's function replaced), ``setattr`` or
``delattr`` on one, a reference to the grading package itself (``tinyamp.exercises``), or a module
that runs code given as data.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tinyamp.exercises.source_checks import DYNAMIC, _call_to, aliases, dotted, reachable

LIBRARIES = {"numpy", "ml_dtypes", "tinyamp"}  # the packages a solution may use besides the standard library
CODE_AS_DATA = {
    "pickle", "_pickle", "marshal", "runpy", "ctypes", "code", "codeop", "importlib", "pkgutil", "zipimport",
    "imp", "builtins", "types.CodeType", "types.FunctionType", "types.ModuleType", "sys.modules", "sys.path",
    "sys.meta_path", "sys.path_hooks",
}  # fmt: skip  (standard modules and names that load or run code the reader does not see)
SOURCE_LIMIT = 4 * 2**20  # bytes of .py files read from one workspace; a course's workspace holds about 60 KiB
WHOLE = "\x00whole module"  # a name no module binds: reachable() then gives the whole module


def workspace_sources(root: Path) -> dict[str, str]:
    """Module name -> text of each .py file under `root`: "myamp.formats" for myamp/formats.py, "myamp" for
    myamp/__init__.py, "helper" for helper.py.  Files not valid UTF-8, in hidden folders, or past SOURCE_LIMIT
    bytes in all are left out: a reference to one is a module the grader cannot read."""
    sources: dict[str, str] = {}
    total = 0
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if any(part.startswith(".") for part in relative.parts) or not path.is_file() or path.is_symlink():
            continue
        try:
            size = path.stat().st_size
            if total + size > SOURCE_LIMIT:
                break
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        total += size
        parts = relative.with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name and all(p.isidentifier() for p in name.split(".")):
            sources[name] = text
    return sources


def package_of(module: str, sources: dict[str, str]) -> str:
    """The package a relative import in `module` starts from: itself for a package (it has modules below it)."""
    return module if any(other.startswith(module + ".") for other in sources) else module.rpartition(".")[0]


def file_of(module: str, sources: dict[str, str]) -> str:
    """The workspace file of `module`: "myamp/helper.py", "myamp/__init__.py" for the package."""
    path = module.replace(".", "/")
    return f"{path}/__init__.py" if package_of(module, sources) == module else f"{path}.py"


def imports(tree: ast.Module, package: str) -> dict[str, str]:
    """``source_checks.aliases`` plus the relative imports, resolved from `package` (``from . import helper`` in
    myamp/formats.py gives helper -> "myamp.helper")."""
    names = aliases(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            base = package.split(".") if package else []
            base = base[: len(base) - (node.level - 1)] if node.level - 1 <= len(base) else []
            start = ".".join([*base, *([node.module] if node.module else [])])
            for a in node.names:
                names[a.asname or a.name] = f"{start}.{a.name}" if start else a.name
    return names


def references(text: str, module: str, name: str | None, sources: dict[str, str]) -> list[tuple[str, int]]:
    """The dotted names the definition of `name` in `module` reaches through its imports, with their lines
    (the outermost of a.b.c only: a.b and a are not listed again)."""
    tree = ast.parse(text)
    imported = imports(tree, package_of(module, sources))
    found: list[tuple[str, int]] = []
    if name is not None and name in imported:  # a name the module imports and passes on: its origin is reached
        line = next((n.lineno for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                     and any((a.asname or a.name.split(".")[0]) == name for a in n.names)), 0)  # fmt: skip
        found.append((imported[name], line))
    for top in reachable(tree, name or WHOLE):
        inner = {id(n.value) for n in ast.walk(top) if isinstance(n, ast.Attribute)}
        inner |= {id(n.args[0]) for n in ast.walk(top) if _getattr_call(n)}
        for node in ast.walk(top):
            if id(node) in inner or not isinstance(node, (ast.Name, ast.Attribute, ast.Call)):
                continue
            first = _first_name(node)
            full = dotted(node, imported)
            if first in imported and full:
                found.append((full, getattr(node, "lineno", 0)))
    return found


def _getattr_call(node: ast.AST) -> bool:
    return _call_to(node, "getattr") and bool(node.args)  # type: ignore[attr-defined]


def _first_name(node: ast.AST) -> str | None:
    while True:
        if isinstance(node, ast.Attribute):
            node = node.value
        elif _getattr_call(node):
            node = node.args[0]
        else:
            return node.id if isinstance(node, ast.Name) else None


def in_workspace(full: str, sources: dict[str, str]) -> tuple[str, str | None] | None:
    """(module, name) when the dotted `full` names a workspace module or something in one; None otherwise."""
    parts = full.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module in sources:
            return module, parts[cut] if cut < len(parts) else None
    return None


def star_import(text: str) -> str:
    """The first ``from X import *`` in `text` ("line 3: from tinyamp.rounding import *"), "" if none: the names
    it binds cannot be read from the source."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return f"line {node.lineno}: from {'.' * node.level}{node.module or ''} import *"
    return ""


def bound_names(text: str) -> set[str]:
    """The names a module binds at its top level: definitions, assignments, imports (none if it does not parse)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
        else:
            names |= {t.id for t in ast.walk(node) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
    return names


def unreadable_module(full: str, sources: dict[str, str], package: str) -> str:
    """Why the grader cannot read the module `full` reaches ("" when it can): not in the workspace as handed in,
    outside the standard library and the allowed packages, or a module that runs code given as data."""
    root = full.split(".")[0]
    if any(full == c or full.startswith(c + ".") for c in CODE_AS_DATA):
        return f"{full} loads or runs code the grader cannot read"
    target = in_workspace(full, sources)
    if target is not None and target[1] is not None and package_of(target[0], sources) == target[0]:
        if target[1] not in bound_names(sources[target[0]]):  # a package's submodule the grader never read
            return f"{full} is not in the workspace as it was handed in (made while grading?)"
    if target is not None or root in LIBRARIES:
        return ""
    if root == package or root in {m.split(".")[0] for m in sources}:
        return f"{full} is not in the workspace as it was handed in (made while grading?)"
    if root in getattr(sys, "stdlib_module_names", ()) or root in sys.builtin_module_names:
        return ""
    return f"{full} is outside the workspace, the standard library, NumPy, ml_dtypes and tinyamp"


def reached(sources: dict[str, str], module: str, name: str) -> list[tuple[str, str | None]]:
    """Every workspace definition the definition of `name` in `module` reaches, itself first: (module, name)
    pairs, name None for a module used as a whole, each once (a module used whole covers its names)."""
    order: list[tuple[str, str | None]] = []
    queue: list[tuple[str, str | None]] = [(module, name)]
    while queue:
        current = queue.pop(0)
        if current in order or (current[0], None) in order:
            continue
        order.append(current)
        text = sources.get(current[0])
        if text is None:
            continue
        try:
            found = references(text, current[0], current[1], sources)
        except SyntaxError:
            continue  # the import fails for the student too; check_source reports its own file's
        for full, _ in found:
            target = in_workspace(full, sources)
            if target is not None:
                queue.append(target)
    return order


GRADING = "tinyamp.exercises"  # student code has no business with the package that grades it


def patching(text: str, module: str, sources: dict[str, str]) -> str:
    """The first place the module `module` (its whole `text`) changes what it imported or reaches the grading
    ("line 12: assigns np.isnan"), "" if none; ``patching`` of a file that does not parse is ""."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return ""
    imported = imports(tree, package_of(module, sources))
    for node in ast.walk(tree):  # m = np: m names a module too (one level of aliasing is followed)
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Attribute)):
            origin = dotted(node.value, imported) if _first_name(node.value) in imported else None
            for t in node.targets:
                if origin and isinstance(t, ast.Name):
                    imported[t.id] = origin
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in DYNAMIC:
            return f"line {node.lineno}: uses {node.id}(), which reaches any name"
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            targets = node.args[:1]
        for target in [t for top in targets for t in ast.walk(top) if isinstance(t, (ast.Attribute, ast.Name))]:
            base = target.value if isinstance(target, ast.Attribute) else target if isinstance(node, ast.Call) else None
            full = dotted(base, imported) if base is not None and _first_name(base) in imported else None
            if full and in_workspace(full, sources) is None:
                return f"line {node.lineno}: changes {dotted(target, imported)}, which it imported"
    for full, line in references(text, module, None, sources):
        if full == GRADING or full.startswith(GRADING + "."):
            return f"line {line}: uses {full}, the package that grades it"
        if any(full == c or full.startswith(c + ".") for c in CODE_AS_DATA):
            return f"line {line}: uses {full}, which loads or runs code the grader cannot read"
    return ""


def imported_on_load(sources: dict[str, str], module: str) -> list[str]:
    """The workspace modules that may run when `module` is imported: it, the packages above it, and whatever
    workspace module any import in them names, transitively (wherever in the file the import stands)."""
    order: list[str] = []
    queue = [module]
    while queue:
        current = queue.pop(0)
        if current in order or current not in sources:
            continue
        order.append(current)
        parts = current.split(".")
        queue += [".".join(parts[:i]) for i in range(1, len(parts))]  # myamp/__init__.py runs before myamp.formats
        try:
            tree = ast.parse(sources[current])
        except SyntaxError:
            continue
        for full in imports(tree, package_of(current, sources)).values():
            target = in_workspace(full, sources)
            if target is not None:
                queue.append(target[0])
                if target[1] is not None and f"{target[0]}.{target[1]}" in sources:  # from myamp import helper
                    queue.append(f"{target[0]}.{target[1]}")
    return order
