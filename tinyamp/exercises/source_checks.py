"""Reading a student's source without running it: what the graded definition reaches.

The graded definition reaches its own body and, transitively, every module-level function,
class or assignment it names (a helper, ``HALF = np.float16``).  In that code:

* ``tinyamp_names_used``: the dotted tinyamp names it refers to, through imports and aliases,
  ``getattr(x, "name")``, ``importlib.import_module("...")``, ``__import__("...")`` and any
  string that names a tinyamp module (and the names of any other package it is asked about,
  such as ml_dtypes);
* ``dynamic_access``: a name it reaches in a way no reader can follow: ``getattr`` or an import
  with a computed name, ``eval``, ``exec``, ``globals()``...;
* ``float16_conversion``: NumPy's conversion to float16, however it is spelled
  (``astype(np.float16)``, ``np.float16(v)``, ``dtype="e"``, ``np.asarray(x, np.half)``,
  ``getattr(np, "float16")``), or a dtype the reader cannot read; ``.view(np.float16)`` only
  reinterprets bits and is allowed;
* ``float8_mention``: a name or string that names one of ml_dtypes' FP8 types (``float8_e4m3fn``,
  ``"float8_e5m2"``), which NumPy accepts as a dtype once ml_dtypes is imported anywhere.

Where a name cannot be followed, the check refuses the code rather than guess: the message says
to write the names directly.
"""

from __future__ import annotations

import ast

FLOAT16_NAMES = {"float16", "half"}  # np.float16, np.half, "float16", "half"
FLOAT16_CODES = {"e", "f2", "<f2", "=f2", ">f2"}  # the type codes, as a dtype argument
DTYPE_CALLS = {"astype", "dtype", "array", "asarray", "asanyarray", "zeros", "ones", "empty", "full", "pack", "unpack"}
DYNAMIC = {"eval", "exec", "compile", "globals", "locals", "vars", "__builtins__"}  # builtins that reach any name
GETTERS = {"getattr", "attrgetter", "methodcaller"}  # reach a name given as a string
IMPORTERS = {"__import__", "import_module"}
DTYPE_NAMES = {
    "bool", "bool_", "int", "float", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "intp", "uintp", "int_", "uint", "float32", "float64", "single", "double", "longdouble", "complex64",
    "complex128", "bfloat16",
}  # fmt: skip


def reachable(tree: ast.Module, name: str) -> list[ast.AST]:
    """The top-level definition of `name` and the module-level statements it names, transitively.

    The whole module when `name` is bound in a way this cannot see.
    """
    binds: dict[str, list[ast.stmt]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            binds.setdefault(node.name, []).append(node)
        elif not isinstance(node, (ast.Import, ast.ImportFrom)):
            for target in ast.walk(node):
                if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store):
                    binds.setdefault(target.id, []).append(node)
    if name not in binds:
        return [tree]
    found: list[ast.AST] = []
    queue, seen = [name], set()
    while queue:
        current = queue.pop()
        if current in seen:
            continue
        seen.add(current)
        for node in binds.get(current, []):
            if node not in found:
                found.append(node)
                queue += [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]
    return found


def aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted name it was imported as, from every import in the module."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def dotted(node: ast.AST | None, imported: dict[str, str] | None = None) -> str | None:
    """ "a.b.c" for a.b.c or getattr(a.b, "c") (the first name through `imported`), else None."""
    parts = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif _call_to(node, "getattr") and len(node.args) >= 2 and _string(node.args[1]) is not None:
            parts.append(_string(node.args[1]))
            node = node.args[0]
        else:
            break
    if not isinstance(node, ast.Name):
        return None
    first = (imported or {}).get(node.id, node.id)
    return ".".join([first, *reversed(parts)])


def tinyamp_names_used(source: str, name: str, roots: tuple[str, ...] = ("tinyamp",)) -> set[str]:
    """The dotted tinyamp names the definition of `name` reaches, through the module's imports and aliases.

    `roots` are the packages looked for (tinyamp by default; an exercise adds e.g. "ml_dtypes").

    ``import tinyamp as ta`` then ``ta.amp.LossScaler(...)`` gives "tinyamp.amp.LossScaler";
    ``from tinyamp.rounding import round_to_float16`` then a call gives "tinyamp.rounding.round_to_float16";
    ``importlib.import_module("tinyamp.rounding")`` gives "tinyamp.rounding".
    """
    tree = ast.parse(source)
    imported, used = aliases(tree), set()
    for top in reachable(tree, name):
        passed = {id(a) for n in ast.walk(top) if isinstance(n, ast.Call) for a in [*n.args, *n.keywords]}
        passed |= {id(n.slice) for n in ast.walk(top) if isinstance(n, ast.Subscript)}  # sys.modules["..."]
        passed |= {id(k.value) for n in ast.walk(top) if isinstance(n, ast.Call) for k in n.keywords}
        for node in ast.walk(top):
            full = dotted(node, imported) if isinstance(node, (ast.Name, ast.Attribute, ast.Call)) else None
            text = _string(node) if id(node) in passed else None  # a string handed over, not a docstring
            for candidate in (full, text):
                if candidate and any(candidate == r or candidate.startswith(r + ".") for r in roots):
                    used.add(candidate)
    return used


def dynamic_access(source: str, name: str) -> str:
    """The first place the definition of `name` reaches a name no reader can follow ("line 7: getattr with a ...")."""
    tree = ast.parse(source)
    for top in reachable(tree, name):
        for node in ast.walk(top):
            if isinstance(node, ast.Name) and node.id in DYNAMIC:
                return f"line {node.lineno}: {node.id}"
            method = _method(node)
            named = node.args[1:2] if method == "getattr" else node.args[:1] if method in GETTERS | IMPORTERS else []
            if method in GETTERS | IMPORTERS and (not named or _string(named[0]) is None):
                return f"line {node.lineno}: {method} with a computed name"
    return ""


def float16_conversion(source: str, name: str) -> str:
    """The first NumPy conversion to float16 the definition of `name` reaches, as "line 12: astype(float16)".

    "" if none.  A dtype argument that is neither a string nor a dtype's name (``astype(d)`` with a
    computed ``d``) counts too, as "line 12: astype(<a dtype not written by name>)": the reader cannot
    tell it is not float16.
    """
    tree = ast.parse(source)
    imported = aliases(tree)
    for top in reachable(tree, name):
        views = {  # what .view(...) is given: it reinterprets bits, it converts nothing
            id(sub)
            for n in ast.walk(top)
            if _method(n) == "view"
            for a in [*n.args, *n.keywords]
            for sub in ast.walk(a)
        }
        for node in ast.walk(top):
            if id(node) in views:
                continue
            method = _method(node)
            if method in FLOAT16_NAMES:
                return f"line {node.lineno}: {method}(...)"
            if isinstance(node, ast.Attribute) and node.attr in FLOAT16_NAMES:
                return f"line {node.lineno}: {node.attr}"
            if isinstance(node, ast.Name) and imported.get(node.id, "").split(".")[-1] in FLOAT16_NAMES:
                return f"line {node.lineno}: {node.id} (numpy.float16)"
            if not isinstance(node, ast.Call) or method == "view":
                continue
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                text, name16 = _string(arg), (dotted(arg, imported) or "").split(".")[-1]
                if (
                    text in FLOAT16_NAMES
                    or name16 in FLOAT16_NAMES
                    or (text in FLOAT16_CODES and method in DTYPE_CALLS)
                ):
                    return f"line {node.lineno}: {_call_in_words(node, method)}"
            dtypes = node.args[:1] if method == "astype" else []
            dtypes += [k.value for k in node.keywords if k.arg == "dtype"]
            if any(not _names_a_dtype(arg, imported) for arg in dtypes):
                return f"line {node.lineno}: {method}(<a dtype not written by name>)"
    return ""


def float8_mention(source: str, name: str) -> str:
    """The first name or string in the definition of `name` that names an FP8 type ("line 9: float8_e4m3fn").

    Docstrings are prose, not code, and are not read.
    """
    tree = ast.parse(source)
    for top in reachable(tree, name):
        docstrings = {id(scope.body[0].value) for scope in ast.walk(top) if _has_docstring(scope)}
        for node in ast.walk(top):
            text = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                text = node.value
            if text and "float8" in text.lower():
                return f"line {node.lineno}: {text.strip()[:40]}"
    return ""


def _has_docstring(scope: ast.AST) -> bool:
    body = getattr(scope, "body", None)
    first = body[0] if isinstance(body, list) and body else None
    return isinstance(first, ast.Expr) and _string(first.value) is not None


def _call_in_words(node: ast.Call, method: str) -> str:
    if method == "astype":
        return "astype(float16)"
    if any(k.arg == "dtype" for k in node.keywords):
        return "dtype=float16"
    return f"{method}(..., float16)"


def _names_a_dtype(node: ast.AST, imported: dict[str, str]) -> bool:
    """A string, or a dotted name ending in a dtype's name (np.uint32, float): a dtype a reader can read."""
    if _string(node) is not None:
        return True
    name = dotted(node, imported)
    return name is not None and name.split(".")[-1] in DTYPE_NAMES


def _method(node: ast.AST) -> str:
    """The name called: "astype" for x.astype(...), "float16" for np.float16(...), "" if not a call."""
    if not isinstance(node, ast.Call):
        return ""
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return node.func.id if isinstance(node.func, ast.Name) else ""


def _call_to(node: ast.AST | None, name: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name


def _string(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
