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
``tinyamp_checkpoint``.  No pickle: the file is read with ``allow_pickle=False``, so a
checkpoint from an untrusted source cannot run code when loaded.  Arrays round-trip bit
for bit; bfloat16 (from ml_dtypes, which ``.npy`` cannot describe) is stored as its
uint16 bit pattern with the dtype's name in the JSON.

``np.load("run.npz").files`` lists what is inside; ``describe_checkpoint`` prints it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from tinyamp import backend, dtypes, random
from tinyamp.nn.module import Module

FORMAT = "tinyamp-checkpoint"
VERSION = 1
METADATA_KEY = "tinyamp_checkpoint"  # the JSON document; every other key is an array
_TAG = "__tinyamp__"  # marks the JSON objects that stand for an array, a NumPy scalar or a tuple
_SECTIONS = ("model", "optimizer_type", "optimizer", "scaler_type", "scaler", "rng", "extra")
_NATIVE_KINDS = "biuf"  # dtypes .npy stores faithfully; others (bfloat16, kind "V") go as raw bits

PathLike = str | os.PathLike


class CheckpointError(ValueError):
    """A file that is not a (readable) tinyamp checkpoint, or one that does not fit this run."""


# ---- the encoding: Python values <-> (JSON document, named arrays) ---------------------------------
def _encode(value: Any, path: str, arrays: dict[str, np.ndarray]) -> Any:
    """Turn `value` into JSON-able data, moving every array into `arrays` under a key built from `path`."""
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
            out[k] = _encode(v, f"{path}/{k}" if path else k, arrays)
        return out
    if isinstance(value, tuple):
        return {_TAG: "tuple", "items": [_encode(v, f"{path}/{i}", arrays) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{path}/{i}", arrays) for i, v in enumerate(value)]
    raise TypeError(
        f"cannot store {path} ({type(value).__name__}) in a checkpoint: only arrays, numbers, strings, bools, "
        "None, lists, tuples and dicts with string keys are stored (no pickle, so loading cannot run code)"
    )


def _decode(value: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    """The inverse of _encode."""
    if isinstance(value, list):
        return [_decode(v, arrays) for v in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(_TAG)
    if tag is None:
        return {k: _decode(v, arrays) for k, v in value.items()}
    if tag == "tuple":
        return tuple(_decode(v, arrays) for v in value["items"])
    if tag == "scalar":
        return dtypes.resolve(value["dtype"]).type(value["value"])
    if tag == "array":
        dtype = dtypes.resolve(value["dtype"])  # bfloat16 needs ml_dtypes: its error says so
        stored = arrays[value["key"]]
        expected = dtype if dtype.kind in _NATIVE_KINDS else np.dtype(f"u{dtype.itemsize}")
        if stored.dtype != expected or list(stored.shape) != value["shape"]:
            raise ValueError(
                f"array {value['key']} is stored as {stored.shape} {stored.dtype}; "
                f"the metadata says {tuple(value['shape'])} {value['dtype']}"
            )
        return stored if stored.dtype == dtype else stored.view(dtype)
    raise ValueError(f"unknown tag {tag!r}")


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
    arrays[METADATA_KEY] = np.frombuffer(json.dumps(document).encode("utf-8"), dtype=np.uint8)
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            np.savez(f, allow_pickle=False, **arrays)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points to them
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def read_checkpoint(path: PathLike) -> dict[str, Any]:
    """The contents of a checkpoint as plain Python: {"model": {...}, "optimizer": {...}, "scaler",
    "rng", "extra", ...}, every array a NumPy array.  Loads nothing into a model.

    Raises FileNotFoundError for a missing file and CheckpointError for anything that is
    not a complete tinyamp checkpoint (another file, a truncated or corrupted archive).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}: the file does not exist")
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic.startswith(b"\x93NUMPY"):
        raise CheckpointError(f"{path} is not a tinyamp checkpoint: it holds a single .npy array")
    if not magic.startswith(b"PK"):
        # (np.load would try to unpickle it and suggest trusting the file: never for a checkpoint)
        raise CheckpointError(f"{path} is not a tinyamp checkpoint: it is not a zip archive (.npz)")
    try:
        archive = np.load(path, allow_pickle=False)
        with archive:
            if METADATA_KEY not in archive.files:
                raise CheckpointError(
                    f"{path} is not a tinyamp checkpoint: it is a NumPy archive without the "
                    f"{METADATA_KEY!r} entry that save_checkpoint writes"
                )
            arrays = {key: archive[key] for key in archive.files}  # reads (and CRC-checks) everything now
        for key, arr in arrays.items():
            if not isinstance(arr, np.ndarray):  # NpzFile hands back the raw bytes of a non-.npy entry
                raise CheckpointError(f"{path} is damaged: its entry {key!r} is not a .npy array")
        document = json.loads(arrays.pop(METADATA_KEY).tobytes().decode("utf-8"))
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
        return _decode(document, arrays)
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, ValueError, KeyError, OSError, EOFError, UnicodeDecodeError, TypeError) as exc:
        # not a zip, a truncated zip, a CRC mismatch, a pickle we refuse to run, bad JSON...
        raise CheckpointError(f"{path} is not a tinyamp checkpoint, or it is damaged: {exc}") from exc


def load_checkpoint(path: PathLike, model: Module, optimizer: Any, scaler: Any = None) -> Any:
    """Restore a run saved by ``save_checkpoint`` into `model`, `optimizer` and `scaler`, and the
    random generators; return the ``extra`` it was saved with.

    Afterwards the next training step is the one the saved run would have taken, bit for
    bit.  All or nothing: the file is read and decoded completely first; if anything does
    not fit (parameter names, shapes, dtypes, optimizer kind, a scaler state missing or
    unexpected), everything already loaded is rolled back, and a CheckpointError names the
    problem.  (The rollback keeps a copy of the current state while loading.)
    """
    path = os.fspath(path)
    content = read_checkpoint(path)
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
        raise CheckpointError(f"{path} does not fit this run; nothing was changed:\n  {exc}") from exc
    return content["extra"]


def describe_checkpoint(path: PathLike) -> str:
    """A printable table of a checkpoint's arrays (key, dtype, shape, bytes) and its other contents."""
    content = read_checkpoint(path)
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
