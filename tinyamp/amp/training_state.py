"""One-file checkpoints of a whole training run: resume it and continue bit for bit.

A mixed-precision run is more than its model weights.  To continue *exactly* as if it
had never stopped, a checkpoint needs everything the next step reads:

* the model's state_dict (its 16-bit weights and buffers);
* the FP32 master weights (rounding them to 16 bits is not invertible: the model's
  float16 copy has lost the small updates the masters are still adding up);
* the optimizer's state: moments, step counts, hyperparameters;
* the loss scaler's state (its scale and how many clean steps it has counted);
* the random generators (the next dropout mask);
* and whatever the training loop wants back (``extra``: the step number, the epoch).

Format: a NumPy ``.npz`` archive (a zip of ``.npy`` files).  Every array is stored under
a readable key (``model/0.weight``, ``optimizer/master/0``, ...), and everything else
(numbers, strings, the structure) sits in one JSON document under the key
``tinyamp_checkpoint``.  No pickle, ever, so a checkpoint from an untrusted source cannot
run code when loaded.  Arrays round-trip bit for bit; bfloat16 (from ml_dtypes, which
``.npy`` cannot describe) is stored as its uint16 bit pattern with the dtype's name in the JSON.

Reading is bounded and total (``checkpoint_file.py``): the metadata is checked first, then
every array's header, and only then are arrays allocated, within a budget: ``max_bytes``
for ``read_checkpoint``, the size of the run for ``load_checkpoint``.  A file that is not a
checkpoint tinyamp wrote (truncated, edited, crafted) ends in one CheckpointError sentence.

``np.load("run.npz").files`` lists what is inside; ``describe_checkpoint`` prints it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import stat
import zipfile
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from tinyamp import backend, dtypes, random
from tinyamp.amp import master_state
from tinyamp.amp.checkpoint_file import (
    MAX_JSON_DEPTH,
    MAX_METADATA_BYTES,
    MAX_METADATA_OBJECT_BYTES,
    ArchiveReader,
    ArrayBudget,
    ArrayRef,
    CheckpointError,
    json_cost,
    json_depth,
    write_archive,
)
from tinyamp.amp.master import MasterWeights
from tinyamp.nn.module import Module

FORMAT = "tinyamp-checkpoint"
VERSION = 1
METADATA_KEY = "tinyamp_checkpoint"  # the JSON document; every other key is an array
_TAG = "__tinyamp__"  # marks the JSON objects that stand for an array, a NumPy scalar or a tuple
_SECTIONS = ("model", "optimizer_type", "optimizer", "scaler_type", "scaler", "rng", "extra")
_NATIVE_KINDS = "biuf"  # dtypes .npy stores faithfully; others (bfloat16, kind "V") go as raw bits
_FIELDS = {"tuple": {"items"}, "scalar": {"dtype", "value"}, "array": {"key", "dtype", "shape"}}
DEFAULT_MAX_BYTES = 2**30  # read_checkpoint: all arrays together
DEFAULT_EXTRA_BYTES = 64 * 2**20  # load_checkpoint: arrays shaped unlike the model's (history: 56 bytes a step)
STATE_COPIES = 4  # per weight, besides its own copy: a master and up to three optimizer arrays (Adam has two)

PathLike = str | os.PathLike


# ---- the encoding: Python values <-> (JSON document, named arrays) ---------------------------------
def _encode(value: Any, path: str, arrays: dict[str, np.ndarray], depth: int = 1) -> Any:
    """Turn `value` into JSON-able data, moving every array into `arrays` under a key built from `path`."""
    if depth > MAX_JSON_DEPTH:  # (JSON nests at least as deep as the value)
        raise ValueError(
            f"cannot store {path.split('/')[0]}: it nests deeper than {MAX_JSON_DEPTH} levels, which "
            "read_checkpoint refuses"
        )
    if backend.is_array(value):
        arr = np.asarray(backend.to_device(value, "cpu"))  # (not ascontiguousarray: it makes 0-d arrays 1-d)
        key = path
        n = 1
        while key in arrays or key == METADATA_KEY:  # a dict key containing "/" could collide
            key, n = f"{path}~{n}", n + 1
        stored = arr if arr.dtype.kind in _NATIVE_KINDS else arr.view(f"u{arr.dtype.itemsize}")
        arrays[key] = stored
        return {_TAG: "array", "key": key, "dtype": arr.dtype.name, "shape": list(arr.shape)}
    if isinstance(value, np.generic):
        # keep the NumPy type: a np.float64 learning rate and a Python float round differently
        return {_TAG: "scalar", "dtype": value.dtype.name, "value": value.item()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"cannot store {path}: a checkpoint dict needs string keys, got {k!r}")
            if k == _TAG:
                raise TypeError(f"cannot store {path}: the key {_TAG!r} is reserved by the checkpoint format")
            out[k] = _encode(v, f"{path}/{k}" if path else k, arrays, depth + 1)
        return out
    if isinstance(value, tuple):
        return {_TAG: "tuple", "items": [_encode(v, f"{path}/{i}", arrays, depth + 2) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{path}/{i}", arrays, depth + 1) for i, v in enumerate(value)]
    raise TypeError(
        f"cannot store {path} ({type(value).__name__}) in a checkpoint: only arrays, numbers, strings, bools, "
        "None, lists, tuples and dicts with string keys are stored (no pickle, so loading cannot run code)"
    )


def _decode(value: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    """The inverse of _encode, for metadata that _array_refs has checked."""
    if isinstance(value, list):
        return [_decode(v, arrays) for v in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(_TAG)
    if tag is None:
        return {k: _decode(v, arrays) for k, v in value.items()}
    if tag == "tuple":
        return tuple(_decode(v, arrays) for v in value["items"])
    dtype = dtypes.resolve(value["dtype"])
    if tag == "scalar":
        return dtype.type(value["value"])
    stored = arrays[value["key"]]  # "array"
    return stored if stored.dtype == dtype else stored.view(dtype)


def _dtype_problem(name: Any) -> str | None:
    """Why `name` is not a dtype a checkpoint holds (numbers, never Python objects), or None."""
    try:
        dtype = dtypes.resolve(name) if isinstance(name, str) else None
    except (TypeError, ValueError) as exc:  # bfloat16 without ml_dtypes: the message says what to install
        return f"names the dtype {name!r} ({exc})"
    numbers = dtype is not None and (dtype.kind in _NATIVE_KINDS or dtype.type.__module__ == "ml_dtypes")
    if not numbers or not dtype.isnative or dtype.itemsize not in (1, 2, 4, 8):
        return f"names the dtype {name!r}, which no checkpoint holds"
    return None


def _tag_problem(value: dict[str, Any]) -> str | None:
    """What is wrong with one tagged object of the metadata (a tuple, a NumPy scalar, an array), or None."""
    tag = value[_TAG]
    if tag not in _FIELDS or set(value) != _FIELDS[tag] | {_TAG}:
        return f"has an object tagged {tag!r} with the fields {sorted(value)}"
    if tag == "tuple":
        return None if isinstance(value["items"], list) else "has a tuple whose items are not a list"
    problem = _dtype_problem(value["dtype"])
    if problem:
        return f"{problem} (for {'an array' if tag == 'array' else 'a NumPy scalar'})"
    if tag == "scalar":
        if type(value["value"]) not in (bool, int, float):
            return f"has a NumPy scalar whose value is {value['value']!r}"
        try:
            dtypes.resolve(value["dtype"]).type(value["value"])
        except (OverflowError, ValueError):  # 1000 as an int8
            return f"has a NumPy scalar {value['value']!r} that does not fit its dtype {value['dtype']}"
        return None
    key, shape = value["key"], value["shape"]
    if not isinstance(key, str) or key == METADATA_KEY:
        return f"names an array {key!r}"
    if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
        return f"gives array {key} the shape {shape!r}"
    return None


def _array_refs(path: str, document: Any) -> list[ArrayRef]:
    """Check the metadata (format, version, sections, every tagged object); return the arrays it names."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a tinyamp checkpoint: its metadata does not name the format")
    if document.get("version") != VERSION:
        raise CheckpointError(
            f"{path} is a tinyamp checkpoint of format version {document.get('version')}; "
            f"this tinyamp reads version {VERSION}"
        )
    missing = [k for k in _SECTIONS if k not in document]
    if missing:
        raise CheckpointError(f"{path} is damaged: its metadata lacks {', '.join(missing)}")
    unknown = sorted(set(document) - {"format", "version", *_SECTIONS})
    if unknown:
        raise CheckpointError(
            f"{path} is not a checkpoint tinyamp wrote: its metadata has the section {unknown[0]!r}, which "
            "save_checkpoint never writes"
        )
    refs: dict[str, ArrayRef] = {}
    todo = [document]
    while todo:
        value = todo.pop()
        if isinstance(value, list):
            todo.extend(value)
        elif isinstance(value, dict) and _TAG not in value:
            todo.extend(value.values())
        elif isinstance(value, dict):
            problem = _tag_problem(value)
            if problem is None and value[_TAG] == "array" and value["key"] in refs:
                problem = f"names the array {value['key']} twice"
            if problem:
                raise CheckpointError(f"{path} is not a checkpoint tinyamp can read: its metadata {problem}")
            if value[_TAG] == "tuple":
                todo.extend(value["items"])
            elif value[_TAG] == "array":
                dtype = dtypes.resolve(value["dtype"])
                stored = dtype if dtype.kind in _NATIVE_KINDS else np.dtype(f"u{dtype.itemsize}")
                refs[value["key"]] = ArrayRef(value["key"], stored, tuple(value["shape"]))
    return list(refs.values())


# ---- writing and reading files ---------------------------------------------------------------------
def save_checkpoint(path: PathLike, model: Module, optimizer: Any, scaler: Any = None, extra: Any = None) -> None:
    """Write model, optimizer (with its FP32 master weights when it is a MasterWeights), loss
    scaler, random generators and `extra` to the one file `path`.

    `optimizer` and `scaler` are anything with ``state_dict()``/``load_state_dict()``;
    `extra` is your own data (numbers, strings, lists, dicts; arrays too), handed back by
    ``load_checkpoint``.  The file is written atomically: first to a temporary file in the
    same folder, which then replaces `path` in one ``os.replace``, so a crash or an error
    never leaves a half-written checkpoint (an older checkpoint at `path` stays intact).
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):  # else os.replace would fail naming the temporary file, not `path`
        raise IsADirectoryError(f"cannot save a checkpoint to {path}: it is a folder; name a file in it, "
                                f"e.g. {os.path.join(path, 'checkpoint.npz')}")  # fmt: skip
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"cannot save a checkpoint to {path}: the folder {folder} does not exist; create it "
                                "first (os.makedirs(folder, exist_ok=True))")  # fmt: skip
    content = {
        "format": FORMAT,
        "version": VERSION,
        "model": model.state_dict(),
        "optimizer_type": type(optimizer).__name__,
        "optimizer": optimizer.state_dict(),
        "scaler_type": None if scaler is None else type(scaler).__name__,
        "scaler": None if scaler is None else scaler.state_dict(),
        "rng": random.get_state(),
        "extra": extra,
    }
    arrays: dict[str, np.ndarray] = {}
    document = _encode(content, "", arrays)  # fails here, before any file is touched
    text = json.dumps(document).encode("utf-8")
    if json_depth(document) > MAX_JSON_DEPTH:
        raise ValueError(f"cannot store this checkpoint: its metadata nests deeper than {MAX_JSON_DEPTH} levels")
    if len(text) > MAX_METADATA_BYTES or json_cost(text) > MAX_METADATA_OBJECT_BYTES:
        raise ValueError(
            f"cannot store this checkpoint: its metadata (all but the arrays) takes {len(text):,} bytes, about "
            f"{json_cost(text):,} once parsed into Python objects; read_checkpoint reads at most "
            f"{MAX_METADATA_BYTES:,} bytes of it, parsed into at most {MAX_METADATA_OBJECT_BYTES:,}: keep large data "
            "in extra as NumPy arrays"
        )
    arrays[METADATA_KEY] = np.frombuffer(text, dtype=np.uint8)
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            write_archive(f, arrays)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points to them
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def read_checkpoint(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    """The contents of a checkpoint as plain Python: {"model": {...}, "optimizer": {...}, "scaler",
    "rng", "extra", ...}, every array a NumPy array.  Loads nothing into a model.

    At most `max_bytes` of arrays are read (1 GiB by default; pass more for a bigger run).
    Raises FileNotFoundError for a missing file and CheckpointError for anything that is
    not a complete tinyamp checkpoint (another file, a truncated, corrupted or crafted one).
    """
    budget = ArrayBudget(max_bytes, hint="read_checkpoint(path, max_bytes=...) reads a bigger file")
    return _read(os.fspath(path), budget)


def read_extra(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """Only the ``extra`` a checkpoint was saved with (a training loop's settings and step).

    The whole file is checked as ``read_checkpoint`` checks it (metadata, entries, every
    array's header), but only the arrays inside ``extra`` are read, at most `max_bytes`:
    a training command reads its settings this way before it builds the model whose
    size bounds the rest (``load_checkpoint``).
    """
    return _read(os.fspath(path), ArrayBudget(max_bytes, hint="read_extra(path, max_bytes=...) reads more"), True)


def _keys_in(value: Any) -> set[str]:
    """The keys of the arrays a piece of metadata names."""
    keys, todo = set(), [value]
    while todo:
        v = todo.pop()
        if isinstance(v, list):
            todo.extend(v)
        elif isinstance(v, dict):
            if v.get(_TAG) == "array":
                keys.add(v["key"])
            else:
                todo.extend(v.values())
    return keys


def _run_budget(model: Module, optimizer: Any, extra_bytes: int) -> ArrayBudget:
    """What a checkpoint of this run may hold: see load_checkpoint."""
    master = getattr(optimizer, "master_dtype", None)
    master_width = 0 if master is None else dtypes.resolve(master).itemsize
    tensors = [t for _, t in model.named_parameters()] + [t for _, t in model.named_buffers()]
    run = sum(t.nbytes + STATE_COPIES * math.prod(t.shape) * max(4, t.dtype.itemsize, master_width) for t in tensors)
    return ArrayBudget(
        run + extra_bytes,
        hint="a run of this model holds its state, a master and three optimizer arrays per weight, and up to "
        "load_checkpoint(..., extra_bytes=...) more",
        run_shapes=frozenset(tuple(t.shape) for t in tensors),
        max_other_bytes=extra_bytes,
        other_hint="load_checkpoint(..., extra_bytes=...) allows more",
    )


def _read(path: str, budget: ArrayBudget, only_extra: bool = False) -> Any:
    """The decoded contents of the checkpoint at `path`, its arrays within `budget` (with
    `only_extra`, its decoded ``extra`` alone, only those arrays read and counted)."""
    if not os.path.exists(path):
        why = "the file does not exist"
        if os.path.islink(path):  # exists() follows the link: a missing target, or links that loop
            why = "it is a symbolic link that leads to no file (its target is missing, or the links loop)"
        raise FileNotFoundError(f"no checkpoint at {path}: {why}")
    kind = os.stat(path).st_mode
    if not stat.S_ISREG(kind):  # a FIFO or a terminal would block the read below; a device may never end
        what = "a folder" if stat.S_ISDIR(kind) else "a named pipe (FIFO)" if stat.S_ISFIFO(kind) else "a device"
        what = "a socket" if stat.S_ISSOCK(kind) else what
        raise CheckpointError(f"{path} is not a checkpoint: it is {what}, not a file save_checkpoint wrote")
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic.startswith(b"\x93NUMPY"):
        raise CheckpointError(f"{path} is not a tinyamp checkpoint: it holds a single .npy array")
    if not magic.startswith(b"PK"):
        # (np.load would try to unpickle it and suggest trusting the file: never for a checkpoint)
        raise CheckpointError(f"{path} is not a tinyamp checkpoint: it is not a zip archive (.npz)")
    try:
        if only_extra:
            with ArchiveReader(path, ArrayBudget(2**63, hint=""), f"{METADATA_KEY}.npy") as archive:
                document = archive.metadata()
                refs, keys = _array_refs(path, document), _keys_in(document.get("extra"))
                problem = budget.problem([r for r in refs if r.key in keys])
                if problem:
                    raise CheckpointError(f"{path} {problem}")
                return _decode(document["extra"], archive.arrays(refs, only=keys))
        with ArchiveReader(path, budget, f"{METADATA_KEY}.npy") as archive:
            document = archive.metadata()  # bounded and checked before any array is read
            arrays = archive.arrays(_array_refs(path, document))
        return _decode(document, arrays)
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError, NotImplementedError, RuntimeError) as exc:
        # not a zip, a truncated zip, a CRC mismatch, a compression module missing...
        raise CheckpointError(f"{path} is not a tinyamp checkpoint, or it is damaged: {exc}") from exc


def load_checkpoint(
    path: PathLike, model: Module, optimizer: Any, scaler: Any = None, *, extra_bytes: int = DEFAULT_EXTRA_BYTES
) -> Any:
    """Restore a run saved by ``save_checkpoint`` into `model`, `optimizer` and `scaler`, and the
    random generators; return the ``extra`` it was saved with.

    Afterwards the next training step is the one the saved run would have taken, bit for
    bit.  All or nothing: the file is read and decoded completely first; if anything does
    not fit (parameter names, shapes, dtypes, optimizer kind, a scaler state missing or
    unexpected), everything already loaded is rolled back, and a CheckpointError names the
    problem.  (The rollback keeps a copy of the current state while loading.)  Refused too:
    a master weight that is NaN or inf, and a saved 16-bit weight that is not its master
    rounded (save_checkpoint writes both from the same masters: the file was edited).

    Memory is bounded by the run, not by the file: for each element of the model's state
    the file may hold its own copy plus ``STATE_COPIES`` (4) arrays at least 4 bytes wide
    (a master, the optimizer's moments), and arrays of other shapes (the update history,
    arrays in ``extra``) up to `extra_bytes` (64 MiB).  Anything more is refused before it
    is read, so the peak is about the run's state twice (the file's and the rollback copy)
    plus `extra_bytes`.
    """
    path = os.fspath(path)
    content = _read(path, _run_budget(model, optimizer, extra_bytes))
    saved_opt, own_opt = content["optimizer_type"], type(optimizer).__name__
    if saved_opt != own_opt:
        hint = (
            " (the run kept FP32 master weights: wrap the optimizer in MasterWeights before loading)"
            if saved_opt == "MasterWeights"
            else " (the run had no master weights: load into the plain optimizer)"
            if own_opt == "MasterWeights"
            else ""
        )
        raise CheckpointError(f"{path} was saved with optimizer {saved_opt}; this optimizer is {own_opt}{hint}")
    if (content["scaler"] is None) != (scaler is None):
        if scaler is None:
            raise CheckpointError(
                f"{path} holds the state of a {content['scaler_type']} loss scaler; pass scaler= to restore it "
                "(resuming without it would restart the loss scale)"
            )
        raise CheckpointError(f"{path} holds no loss-scaler state, but a {type(scaler).__name__} was passed")
    if isinstance(optimizer, MasterWeights):
        name_of = {id(p): name for name, p in model.named_parameters()}
        saved_model = content["model"] if isinstance(content["model"], dict) else {}
        weights = [saved_model.get(name_of.get(id(p))) for p in optimizer.model_params]
        problem = master_state.saved_copies_problem(optimizer, content["optimizer"], weights)
        if problem:
            raise CheckpointError(f"{path} is inconsistent: {problem}")
    snapshot = (
        model.state_dict(),
        optimizer.state_dict(),
        None if scaler is None else scaler.state_dict(),
        random.get_state(),
    )
    try:
        model.load_state_dict(content["model"])
        optimizer.load_state_dict(content["optimizer"])
        if scaler is not None:
            scaler.load_state_dict(content["scaler"])
        random.set_state(content["rng"])
    except Exception as exc:
        # undo in reverse order: a MasterWeights rewrites the model from its masters, so the
        # model's own values go back last
        undo = [
            ("scaler", lambda: scaler is not None and scaler.load_state_dict(snapshot[2])),
            ("optimizer", lambda: optimizer.load_state_dict(snapshot[1])),
            ("model", lambda: model.load_state_dict(snapshot[0])),
            ("random state", lambda: random.set_state(snapshot[3])),
        ]
        failed = []
        for what, restore in undo:
            try:
                restore()
            except Exception as undo_exc:  # keep undoing the rest; report below
                failed.append(f"{what}: {undo_exc}")
        if failed:
            raise CheckpointError(
                f"{path} does not fit this run:\n  {exc}\nand restoring the previous state failed too, so this "
                "run is now inconsistent; rebuild it:\n  " + "\n  ".join(failed)
            ) from exc
        raise CheckpointError(f"{path} does not fit this run (nothing was changed): {exc}") from exc
    return content["extra"]


def describe_checkpoint(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """A printable table of a checkpoint's arrays (key, dtype, shape, bytes) and its other contents."""
    content = read_checkpoint(path, max_bytes=max_bytes)
    rows: list[tuple[str, str, str, str]] = []

    def walk(value: Any, key: str) -> None:
        if isinstance(value, np.ndarray):
            rows.append((key, value.dtype.name, str(value.shape), str(value.nbytes)))
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}/{k}" if key else k)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{key}/{i}")

    walk({k: content[k] for k in ("model", "optimizer", "scaler", "extra")}, "")
    widths = [max([len(r[i]) for r in rows] + [len(h)]) for i, h in enumerate(("array", "dtype", "shape", "bytes"))]
    header = ("array", "dtype", "shape", "bytes")
    lines = [f"{os.fspath(path)}: tinyamp checkpoint v{content['version']}, optimizer {content['optimizer_type']}"]
    for r in [header, *rows]:
        lines.append(
            "  ".join([r[0].ljust(widths[0]), r[1].ljust(widths[1]), r[2].ljust(widths[2]), r[3].rjust(widths[3])])
        )
    total = sum(int(r[3]) for r in rows)
    lines.append(f"total {total} bytes in {len(rows)} arrays")
    lines.append(f"scaler: {content['scaler']!r}")
    lines.append(f"extra: {content['extra']!r}")
    return "\n".join(lines)
