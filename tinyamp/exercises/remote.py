"""The student's code in one process, the grader in another: every call travels as plain data.

The process that grades never runs student code.  What a grader holds as "the student's
function or class" is a proxy (``Remote``): calling it sends the arguments to the student's
process, which imports the student's module, makes the call and sends the result back as
JSON: None, booleans, numbers, strings, lists, tuples and dicts of them, and NumPy arrays and
scalars as .npy bytes in base64 (their exact dtype kept, float16 included; read with
``allow_pickle=False``, so no object array and no pickle).  An instance of the student's class
stays in their process under a number (a *handle*): its attributes are read and its methods
called the same way.  So the values a grader compares are its own NumPy's, computed by its
own tinyamp: whatever the student's code patches, it patches in its own process.

* A result that is not plain data (an object of the student's own type, an ndarray subclass
  whose ``==`` says True, an array of objects) ends the grading with one sentence naming the
  type (``NotPlain``); so does one of more than ``REPLY_LIMIT`` bytes.
* An exception of the student's code comes back as its type's name, its builtin base classes,
  its message and the student's line (``grading.raised_at``, read in their process), and is
  raised again here as an exception of that name: NotImplementedError is still "not started",
  a MemoryError still "ran out of memory", a ValueError still a ValueError to the grader;
  ``sys.exit`` or another BaseException ends the grading (``StudentAborted``).
* A process that dies, closes its end, or sends what is not a reply ends the grading
  (``ChildLost``); the grading command then says how it ended.

Where a grader hands tinyamp objects to student code (an optimizer, a segment of layers), a
harness (``HARNESSES``, filled in by the graders that need one) builds them in the student's
process from a plain description, runs the student's code on them and sends back their plain
state, which the grader compares with what its own reference does on the same inputs; a run of
a scaler's steps travels the same way, in one message.  ``outcomes`` makes many calls in one.
"""

from __future__ import annotations

import base64
import builtins
import io
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tinyamp.exercises import holes
from tinyamp.exercises.student_lines import _first_line, error_record

REPLY_LIMIT = 32 * 2**20  # bytes of one reply: the largest a grader needs is about 2 MiB (65,536 results)
ARRAY_LIMIT = 16 * 2**20  # bytes of the arrays in one reply, checked before they are written
DEPTH_LIMIT = 32  # lists in lists...: deeper is not data a grader asked for
EXTENSION_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3", "float8_e8m0fnu", "float4_e2m1fn")
PLAIN = "the grader reads only plain data: numbers, strings, None, NumPy arrays, and lists, tuples and dicts of them"


class GradingEnded(BaseException):
    """Student code ended the grading: the exercise fails with `sentence`.  A BaseException, so that neither a
    grader's ``except Exception`` nor hypothesis takes it for a counterexample to shrink."""

    def __init__(self, sentence: str) -> None:
        super().__init__(sentence)
        self.sentence = sentence


class NotPlain(GradingEnded):
    """A result that is not plain data, or too large."""


class StudentAborted(GradingEnded):
    """sys.exit, KeyboardInterrupt or another BaseException raised by student code."""


class ChildLost(BaseException):
    """The student's process stopped answering: `sentence` says why ("" when only how it ended can say)."""

    def __init__(self, sentence: str = "") -> None:
        super().__init__(sentence)
        self.sentence = sentence


class _Refused(Exception):
    """In the student's process: a value that cannot be sent (the description says what it is)."""


class _TooLarge(_Refused):
    """Arrays of more than ARRAY_LIMIT bytes."""


# ---- plain data ------------------------------------------------------------------------------------------------
def described(value: Any) -> str:
    """"an object of type myamp.formats.Answer", "an ndarray subclass, myamp.formats.Liar" (for sentences)."""
    kind = type(value)
    name = f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__qualname__
    if isinstance(value, np.ndarray):
        return f"an ndarray subclass, {name} (return a numpy.ndarray itself: np.asarray(...))"
    return f"an object of type {name}"


def encode(value: Any, handle: Callable[[Any], Any] | None = None, depth: int = 0, budget: list[int] | None = None
           ) -> Any:  # fmt: skip
    """`value` as JSON-ready data; `handle(value)` for anything else, or _Refused when there is no `handle`."""
    budget = [ARRAY_LIMIT] if budget is None else budget
    if depth > DEPTH_LIMIT:
        raise _Refused(f"data nested more than {DEPTH_LIMIT} deep")
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if isinstance(value, np.generic) or kind is np.ndarray:
        array = np.asarray(value)
        if array.dtype.hasobject:
            raise _Refused(f"a NumPy {'array' if kind is np.ndarray else 'scalar'} of dtype {array.dtype}, which "
                           "holds Python objects")  # fmt: skip
        budget[0] -= array.nbytes
        if budget[0] < 0:
            raise _TooLarge(f"{array.nbytes:,} bytes of arrays (shape {array.shape}, {array.dtype}), more than the "
                           f"{ARRAY_LIMIT // 2**20} MiB the grader reads from your code")  # fmt: skip
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        data = {"$": "array" if kind is np.ndarray else "scalar", "npy": base64.b64encode(buffer.getvalue()).decode()}
        if array.dtype.name in EXTENSION_DTYPES:  # .npy writes ml_dtypes' types as bytes ("|V2"): name it
            data["dtype"] = array.dtype.name
        return data
    if kind is list:  # numbers and strings as they are: most lists are of them
        return [v if type(v) in _PRIMITIVE else encode(v, handle, depth + 1, budget) for v in value]
    if kind is tuple:
        return {"$": "tuple", "items": [encode(v, handle, depth + 1, budget) for v in value]}
    if kind is dict:
        items = [[encode(k, None, depth + 1, budget), encode(v, handle, depth + 1, budget)] for k, v in value.items()]
        return {"$": "dict", "items": items}
    if handle is not None:
        return handle(value)
    raise _Refused(described(value))


_PRIMITIVE = (bool, int, float, str)  # JSON's own, and Python's (None is handled where it is met)


class Malformed(Exception):
    """A reply that is not plain data as ``encode`` writes it."""


def decode(data: Any, handle: Callable[[dict[str, Any]], Any] | None = None, depth: int = 0) -> Any:
    """The value `data` stands for; Malformed if it is not what ``encode`` writes."""
    if depth > DEPTH_LIMIT + 2:
        raise Malformed("nested too deep")
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [v if type(v) in _PRIMITIVE else decode(v, handle, depth + 1) for v in data]
    if type(data) is not dict:
        raise Malformed(f"a {type(data).__name__}")
    tag = data.get("$")
    if tag in ("array", "scalar"):
        array = _load(data.get("npy"))
        if "dtype" in data:
            if data["dtype"] not in EXTENSION_DTYPES or array.dtype.kind != "V":
                raise Malformed(f"a dtype {data['dtype']!r}")
            import ml_dtypes

            dtype = np.dtype(getattr(ml_dtypes, data["dtype"]))
            if dtype.itemsize != array.dtype.itemsize:
                raise Malformed("bytes of another width")
            array = array.view(dtype)
        if tag == "scalar":
            if array.ndim != 0:
                raise Malformed("a scalar with a shape")
            return array[()]
        return array
    if tag == "tuple" and type(data.get("items")) is list:
        return tuple(decode(v, handle, depth + 1) for v in data["items"])
    if tag == "dict" and type(data.get("items")) is list:
        pairs = [decode(pair, handle, depth + 1) for pair in data["items"]]
        if not all(type(p) is list and len(p) == 2 for p in pairs):
            raise Malformed("a dict that is not pairs")
        try:
            return dict(pairs)
        except TypeError:  # a key that is a list
            raise Malformed("a dict key that cannot be one") from None
    if tag == "handle" and handle is not None:
        return handle(data)
    raise Malformed(f"a tag {tag!r}")


def _load(text: Any) -> np.ndarray:
    if type(text) is not str:
        raise Malformed("npy bytes that are not a string")
    try:
        array = np.load(io.BytesIO(base64.b64decode(text, validate=True)), allow_pickle=False)
    except Exception as exc:  # not base64, not .npy, object dtype, data shorter than its shape
        raise Malformed(f"npy bytes NumPy cannot read ({type(exc).__name__})") from None
    if type(array) is not np.ndarray or array.dtype.hasobject:
        raise Malformed("not a plain array")
    return array


# ---- exceptions, both ways ---------------------------------------------------------------------------------------
_CLASSES: dict[tuple[str, str], type] = {}


def rebuilt(record: Any) -> BaseException:
    """Here: the student's exception as one of its name, a subclass of its first builtin base class, with its
    message and ``student_line``; for a BaseException that is not an Exception, StudentAborted."""
    if type(record) is not dict or type(record.get("type")) is not str or type(record.get("message")) is not str:
        raise Malformed("an exception that is not a record")
    name, message, where = record["type"], record["message"], record.get("where") or ""
    if type(where) is not str:
        raise Malformed("a line that is not a string")
    if record.get("base"):  # the reason when student code ended the grading itself
        at = f" at {where}" if where else ""
        if name == "SystemExit":
            return StudentAborted(f"called sys.exit({str(record.get('code', 'None'))[:200]}){at}: a graded function "
                                  "must return, not end the program")  # fmt: skip
        text = " ".join(message.split())
        return StudentAborted(f"raised {name}{f': {text}' if text else ''}{at}")
    bases = [getattr(builtins, b, None) for b in record.get("bases") or [] if type(b) is str]
    base = next((b for b in bases if isinstance(b, type) and issubclass(b, Exception)), Exception)
    key = (name if name.isidentifier() else "StudentError", base.__name__)
    if key not in _CLASSES:
        _CLASSES[key] = type(key[0], (base,), {"__init__": _init, "__str__": _str, "__module__": "myamp"})
    exc = _CLASSES[key](message)
    exc.student_line = where
    return exc


def _init(self: BaseException, message: str) -> None:
    BaseException.__init__(self, message)


def _str(self: BaseException) -> str:
    return str(self.args[0]) if self.args else ""


# ---- the grader's side -------------------------------------------------------------------------------------------
class Student:
    """The grader's end of the pipe to the student's process: one request, one reply."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.exit_note = ""  # "called os._exit(3) at myamp/x.py:5", sent by the student's process before it ends

    def ask(self, request: dict[str, Any], what: str = "your code") -> Any:
        """Send `request`, return the decoded value of the reply; raise what the reply says was raised."""
        try:
            self.connection.send_bytes(json.dumps(request).encode())
        except (OSError, ValueError):
            raise ChildLost() from None
        while True:
            try:
                raw = self.connection.recv_bytes(REPLY_LIMIT)
            except EOFError:
                raise ChildLost() from None
            except OSError as exc:
                if "bad message length" in str(exc):
                    mib = f"{REPLY_LIMIT // 2**20} MiB (a result that large?): return at most {ARRAY_LIMIT // 2**20}"
                    raise ChildLost(f"sent the grader a reply of more than {mib} MiB of plain data") from None
                raise ChildLost() from None
            try:
                reply = json.loads(raw)
            except (ValueError, RecursionError):
                raise ChildLost("sent the grader a reply that is not JSON: only tinyamp's own code in your process "
                                "writes replies") from None  # fmt: skip
            if type(reply) is dict and type(reply.get("exit")) is str:
                self.exit_note = reply["exit"][:4000]
                continue
            try:
                value, raised = self._value(reply, what)
            except (Malformed, RecursionError) as exc:
                raise ChildLost(f"sent the grader a reply it cannot read ({exc}): only tinyamp's own code in your "
                                "process writes replies") from None  # fmt: skip
            if raised is not None:
                raise raised
            return value

    def _value(self, reply: Any, what: str) -> tuple[Any, BaseException | None]:
        """(the value, None), or (None, the exception to raise)."""
        if type(reply) is not dict or len(reply) != 1:
            raise Malformed("not a reply")
        ((kind, value),) = reply.items()
        if kind == "ok":
            return decode(value, self._handle), None
        if kind == "raised":
            return None, rebuilt(value)
        if kind in ("refused", "large") and type(value) is str:
            return None, NotPlain(f"{what} returned {value[:400]}" + (f": {PLAIN}" if kind == "refused" else ""))
        if kind == "many" and type(value) is dict:
            return self._outcomes(value, what), None
        raise Malformed(f"a reply {kind!r}")

    def _outcomes(self, value: dict[str, Any], what: str) -> list[Outcome]:
        errors, results = value.get("errors"), value.get("results")
        if type(errors) is not list or type(results) is not list:
            raise Malformed("a batch without results")
        for e in errors:
            rebuilt(e)  # each record checked once; each call below gets an exception of its own
        found = []
        for item in results:
            if type(item) is not dict or len(item) != 1:
                raise Malformed("a batch item")
            ((kind, v),) = item.items()
            if kind == "v":
                found.append(Outcome(decode(v, self._handle)))
            elif kind == "e" and type(v) is int and 0 <= v < len(errors):
                found.append(Outcome(None, rebuilt(errors[v])))
            elif kind in ("refused", "large") and type(v) is str:
                found.append(Outcome(None, NotPlain(f"{what} returned {v[:400]}" + (f": {PLAIN}" if kind == "refused"
                                                                                   else ""))))  # fmt: skip
            else:
                raise Malformed("a batch item")
        return found

    def _handle(self, data: dict[str, Any]) -> Any:
        if type(data.get("id")) is not int or type(data.get("type")) is not str:
            raise Malformed("a handle")
        if data.get("attr") is not None:
            if type(data["attr"]) is not str:
                raise Malformed("a method")
            return RemoteMethod(self, data["id"], data["attr"], f"your {data['type']}.{data['attr']}")
        return RemoteObject(self, data["id"], data["type"])


class Remote:
    """The student's graded function or class, in their process (handle 0)."""

    def __init__(self, student: Student, handle: int, name: str) -> None:
        self._student, self._id, self._name = student, handle, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._student.ask({"op": "call", "id": self._id, "args": encode(list(args)), "kwargs": encode(kwargs)},
                                 f"your {self._name}")  # fmt: skip

    def __repr__(self) -> str:
        return f"<{self._name}, in the student's process>"


class RemoteMethod(Remote):
    """A method of an object in the student's process: ``obj.update``."""

    def __init__(self, student: Student, handle: int, attr: str, what: str) -> None:
        super().__init__(student, handle, what.removeprefix("your "))
        self._attr = attr

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._student.ask({"op": "call", "id": self._id, "attr": self._attr, "args": encode(list(args)),
                                  "kwargs": encode(kwargs)}, f"your {self._name}")  # fmt: skip


class RemoteObject:
    """An object the student's code made (an instance of their class), kept in their process under a handle."""

    def __init__(self, student: Student, handle: int, type_name: str) -> None:
        object.__setattr__(self, "_remote", (student, handle, type_name, {}))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and repr probe these: nothing of the student's answers them
            raise AttributeError(name)
        student, handle, type_name, methods = object.__getattribute__(self, "_remote")
        if name in methods:  # a method read once is a method: one message per call, not two
            return methods[name]
        value = student.ask({"op": "getattr", "id": handle, "name": name}, f"your {type_name}.{name}")
        if isinstance(value, RemoteMethod):
            methods[name] = value
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("the grader does not set attributes of your objects")

    def __repr__(self) -> str:
        return f"<a {object.__getattribute__(self, '_remote')[2]}, in the student's process>"


@dataclass
class Outcome:
    """One call of a batch: its value, or the exception it raised."""

    value: Any
    error: BaseException | None = None

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def outcomes(fn: Callable[..., Any], calls: Iterable[Sequence[Any]]) -> list[Outcome]:
    """``fn(*args)`` for each args of `calls`, in order: in one message when `fn` is the student's, remote.

    An Exception becomes that call's Outcome; a BaseException (or a result that is not plain) ends the batch
    there, its Outcome raising it."""
    calls = [list(args) for args in calls]
    if isinstance(fn, Remote) and not isinstance(fn, RemoteMethod):
        return fn._student.ask({"op": "many", "id": fn._id, "calls": encode(calls)}, f"your {fn._name}")
    found = []
    for args in calls:
        try:
            found.append(Outcome(fn(*args)))
        except Exception as exc:
            found.append(Outcome(None, exc))
    return found


def solution_loaded(before: set[str]) -> str:
    """A module of tinyamp's reference solutions that grading loaded, found by the path of its file (they are
    not in an installed tinyamp; a checkout of the repository has them in tests/exercise_solutions/)."""
    for name in sorted(set(sys.modules) - before, key=len, reverse=True):  # the module itself, not its package
        if is_solution(name):
            return name
    return ""


def is_solution(name: str) -> bool:
    """Whether the loaded module `name` is one of the reference solutions."""
    file = getattr(sys.modules.get(name), "__file__", None) or ""
    try:
        return bool(file) and Path(file).resolve().parent == holes.SOLUTIONS
    except (OSError, ValueError):
        return False


HARNESSES: dict[str, Callable[..., Any]] = {}  # name -> harness(graded, *args), filled in by the graders


def harness(graded: Any, name: str, *args: Any) -> Any:
    """``HARNESSES[name](graded, *args)``: in the student's process when `graded` is remote (their function, class
    or object: objects among `args` travel as their handles), here otherwise."""
    if isinstance(graded, (Remote, RemoteObject)):
        student, what = (graded._student, graded._name) if isinstance(graded, Remote) else \
            (object.__getattribute__(graded, "_remote")[0], object.__getattribute__(graded, "_remote")[2])  # fmt: skip
        return student.ask({"op": "harness", "name": name, "args": encode(list(args), _reference)}, f"your {what}")
    return HARNESSES[name](graded, *args)


def _reference(value: Any) -> dict[str, Any]:
    if isinstance(value, RemoteObject):
        return {"$": "handle", "id": object.__getattribute__(value, "_remote")[1]}
    raise _Refused(described(value))


def is_remote(graded: Any) -> bool:
    """Whether `graded` lives in the student's process (a proxy of their function, class or object)."""
    return isinstance(graded, (Remote, RemoteObject))


# ---- the student's side ------------------------------------------------------------------------------------------
class Server:
    """In the student's process: the graded name and the objects made from it, answering the grader's requests."""

    def __init__(self, connection: Any, workspace: Path) -> None:
        self.connection, self.workspace = connection, workspace
        self.objects: dict[int, Any] = {}
        self.loaded: set[str] = set()

    def serve(self) -> None:
        """Answer requests until the grader says quit or closes its end.

        Student code runs as it did inside the grader: NumPy's floating-point errors and Python's warnings
        ignored (an overflow warning is not a verdict, and a million of them would only slow it down)."""
        import warnings

        np.seterr(all="ignore")
        warnings.simplefilter("ignore")
        while True:
            try:
                request = json.loads(self.connection.recv_bytes())
            except (EOFError, OSError):
                return
            if request.get("op") == "quit":
                return
            reply = self.answer(request)
            try:
                self.send(reply)
            except Exception as exc:  # a reply too large to write (MemoryError): say so, in a reply that is small
                self.send({"raised": error_record(exc, self.workspace)})

    def send(self, reply: dict[str, Any]) -> None:
        self.connection.send_bytes(json.dumps(reply).encode())

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        try:
            if op == "load":
                return self.reply(self.load(request["module"], request["name"]))
            if op == "solutions":
                return {"ok": solution_loaded(self.loaded)}
            if op == "many":
                return {"many": self.many(self.objects[request["id"]], decode(request["calls"]))}
            if op == "harness":
                args = decode(request["args"], lambda ref: self.objects[ref["id"]])
                value = HARNESSES[request["name"]](self.objects[0], *args)
                return self.reply(value)
            target = self.objects[request["id"]]
            if op == "getattr":
                value = getattr(target, request["name"])
                if callable(value) and not isinstance(value, (np.ndarray, np.generic)):
                    return {"ok": {"$": "handle", "id": request["id"], "attr": request["name"],
                                   "type": type(target).__name__}}  # fmt: skip
                return self.reply(value)
            if op == "call":
                fn = getattr(target, request["attr"]) if request.get("attr") else target
                value = fn(*decode(request["args"]), **decode(request["kwargs"]))
                if isinstance(self.objects[0], type) and request["id"] == 0:  # the graded class: an instance
                    self.objects[len(self.objects)] = value
                    return {"ok": {"$": "handle", "id": len(self.objects) - 1, "type": type(value).__name__}}
                return self.reply(value)
        except BaseException as exc:  # the student's exception, whatever it is: the grader decides what it means
            return {"raised": error_record(exc, self.workspace)}
        return {"raised": error_record(ValueError(f"no request {op!r}"), self.workspace)}

    def reply(self, value: Any) -> dict[str, Any]:
        try:
            return {"ok": encode(value, self.known)}
        except _Refused as exc:
            return {"large" if isinstance(exc, _TooLarge) else "refused": str(exc)}

    def known(self, value: Any) -> Any:
        """An object already under a handle (a method that returns self) goes back as that handle."""
        for handle, obj in self.objects.items():
            if obj is value and handle:
                return {"$": "handle", "id": handle, "type": type(value).__name__}
        raise _Refused(described(value))

    def many(self, fn: Callable[..., Any], calls: list[list[Any]]) -> dict[str, Any]:
        results: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        seen: dict[str, int] = {}
        budget = [ARRAY_LIMIT]
        for args in calls:
            try:
                value = fn(*args)
            except BaseException as exc:
                record = error_record(exc, self.workspace)
                key = json.dumps(record, sort_keys=True)
                if key not in seen:
                    seen[key] = len(errors)
                    errors.append(record)
                results.append({"e": seen[key]})
                if record["base"] or isinstance(exc, NotImplementedError):  # a stub: the grader stops at the first
                    break
                continue
            try:
                results.append({"v": encode(value, None, 0, budget)})
            except _Refused as exc:
                results.append({"large" if isinstance(exc, _TooLarge) else "refused": str(exc)})
                break
        return {"results": results, "errors": errors}

    def load(self, module: str, name: str) -> dict[str, Any]:
        """Import ``myamp.<module>`` afresh; what the grader needs to decide the graded `name` is the student's."""
        import inspect

        from tinyamp.exercises.catalog import PACKAGE

        for loaded in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[loaded]
        self.loaded = set(sys.modules)
        root = str(self.workspace.resolve())
        sys.path.insert(0, root)
        try:
            imported = __import__(f"{PACKAGE}.{module}", fromlist=["_"])
        finally:
            if root in sys.path:
                sys.path.remove(root)
        graded = getattr(imported, name, None)
        if graded is None:
            return {"found": False}
        self.objects[0] = graded
        try:
            file = str(Path(inspect.getsourcefile(graded) or "").resolve())
        except TypeError:
            file = None
        kind = "class" if isinstance(graded, type) else "function" if callable(graded) else "other"
        return {"found": True, "kind": kind, "file": file, "line": _first_line(graded)}


