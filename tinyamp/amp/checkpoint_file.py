"""The file under a checkpoint: a zip of ``.npy`` arrays, written without pickle and read within bounds.

A checkpoint comes from disk, a colleague or a download, so reading one trusts no size it
has not checked.  Before a byte is allocated for an array:

1. the zip's central directory (the list of entries) is at most ``MAX_DIRECTORY_BYTES``,
   read from the zip's end record before ``zipfile`` parses it (each entry costs about 500
   bytes of Python objects, ten times its size on disk);
2. the entries' declared uncompressed sizes add up to what the caller allows, so a zip
   bomb is refused before it is inflated (an entry that inflates past its declared size
   stops there and fails its CRC check);
3. the metadata entry is at most ``MAX_METADATA_BYTES`` of JSON, and the Python objects
   ``json.loads`` would build from it, estimated from the text's brackets, commas, colons
   and quotes before it is parsed (``json_cost``), at most ``MAX_METADATA_OBJECT_BYTES``
   (JSON text of ``{}`` and commas becomes 25 times its size in dicts); nested at most
   ``MAX_JSON_DEPTH`` levels (``json.loads`` recurses, so deep nesting would end in
   RecursionError);
4. every entry is named by the metadata, and the caller's ``ArrayBudget`` accepts the
   arrays the metadata names;
5. every ``.npy`` header (at most ``MAX_HEADER_BYTES``) declares the shape and dtype the
   metadata names, no Python objects, and exactly the bytes its entry holds.

Only then is each array allocated once and filled in 1 MiB pieces, so the peak memory
of a read is its arrays, a MiB, and the bounded metadata (its text and its objects).  Every refusal is a
CheckpointError: one sentence naming the file and the problem.
"""

from __future__ import annotations

import io
import json
import math
import os
import zipfile
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

MiB = 2**20
MAX_DIRECTORY_BYTES = 2 * MiB  # ~27,000 entries of a real checkpoint; at worst ~45,000, ~23 MB of ZipInfo objects
MAX_METADATA_BYTES = 16 * MiB
# json_cost of a real checkpoint's metadata: about 500 bytes per training step (the loss
# scaler's history; `tinyamp train --steps 1000` saves 572,000) and 10,000 per weight tensor;
# the limit allows about 130,000 steps of history.
MAX_METADATA_OBJECT_BYTES = 64 * MiB
MAX_JSON_DEPTH = 100  # a checkpoint's own structure nests about 8 levels
MAX_HEADER_BYTES = 10_000  # numpy's own limit for a .npy header (np.save writes ~128 bytes)
NUMPY20_STRAY = "allow_pickle.npy"  # np.savez(f, allow_pickle=False, ...) on numpy 2.0 stored this 0-d bool array
_READ_PIECE = MiB
_METHODS = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}


class CheckpointError(ValueError):
    """A file that is not a (readable) tinyamp checkpoint, or one that does not fit this run."""


@dataclass(frozen=True)
class ArrayRef:
    """An array the metadata names: its entry is ``key + ".npy"``, holding `shape` of `dtype` (as stored)."""

    key: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize  # Python ints: 2^40 * 8 does not overflow


@dataclass(frozen=True)
class ArrayBudget:
    """How many bytes of arrays one read may allocate, and how to allow more.

    `max_bytes` bounds all arrays together; `hint` says how to raise it.  With `run_shapes`,
    the arrays of any other shape (an update history, arrays kept in ``extra``) are bounded
    on their own by `max_other_bytes`, raised as `other_hint` says.
    """

    max_bytes: int
    hint: str
    run_shapes: frozenset[tuple[int, ...]] | None = None
    max_other_bytes: int = 0
    other_hint: str = ""

    def problem(self, refs: list[ArrayRef]) -> str | None:
        """Why these arrays are more than the budget allows (naming the largest), or None."""
        if self.run_shapes is not None:
            other = [r for r in refs if r.shape not in self.run_shapes]
            found = _over(other, "arrays shaped unlike any weight of this model", self.max_other_bytes, self.other_hint)
            if found:
                return found
        return _over(refs, "arrays", self.max_bytes, self.hint)


def _over(refs: list[ArrayRef], what: str, limit: int, hint: str) -> str | None:
    total = sum(r.nbytes for r in refs)
    if total <= limit:
        return None
    big = max(refs, key=lambda r: r.nbytes)
    return (
        f"holds {total:,} bytes of {what} (the largest, {big.key}, is {big.shape} {big.dtype}), more than the "
        f"limit of {limit:,} bytes; {hint}"
    )


def write_archive(f: IO[bytes], arrays: dict[str, np.ndarray]) -> None:
    """Write `arrays` to `f` as an ``.npz``: one uncompressed ``key.npy`` entry per array, never pickled.

    (Not ``np.savez(f, allow_pickle=False, ...)``: numpy 2.0 takes that keyword for an array
    and stores it as an entry named ``allow_pickle``.)
    """
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for key, array in arrays.items():
            with archive.open(f"{key}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)


def directory_bytes(f: IO[bytes]) -> int:
    """The size of a zip's central directory as its end record declares it (0 when there is none).

    zipfile reads and parses this many bytes, so it is checked first.  Every end record in
    the last 64 KiB counts (zipfile picks one of them), and so does a zip64 record that a
    locator just before it points to: the largest size is returned.
    """
    f.seek(0, os.SEEK_END)
    size = f.tell()
    start = max(0, size - (22 + 0xFFFF + 20 + 56))  # end record + longest comment + zip64 locator + record
    f.seek(start)
    tail = f.read()
    largest, at = 0, tail.find(b"PK\x05\x06")
    while 0 <= at <= len(tail) - 22:
        largest = max(largest, int.from_bytes(tail[at + 12 : at + 16], "little"))
        if at >= 76 and tail[at - 20 : at - 16] == b"PK\x06\x07" and tail[at - 76 : at - 72] == b"PK\x06\x06":
            largest = max(largest, int.from_bytes(tail[at - 36 : at - 28], "little"))
        at = tail.find(b"PK\x05\x06", at + 1)
    return largest


class ArchiveReader:
    """A checkpoint's zip, opened for bounded reading (the checks are listed in the module docstring).

    ``with ArchiveReader(path, budget, "meta.npy") as archive:`` then ``archive.metadata()`` and
    ``archive.arrays(refs)``.  zipfile's own errors (a truncated file, a bad CRC) pass through.
    """

    def __init__(self, path: str, budget: ArrayBudget, metadata_name: str) -> None:
        self.path, self.budget, self.metadata_name = path, budget, metadata_name
        self._file = open(path, "rb")  # closed by close(), or below when a check fails
        try:
            self._zip = self._open_zip()
        except BaseException:
            self._file.close()
            raise

    def __enter__(self) -> ArchiveReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the zip and the file."""
        self._zip.close()
        self._file.close()

    def _open_zip(self) -> zipfile.ZipFile:
        """zipfile's view of the file, once its directory and its entries' declared sizes are checked."""
        path = self.path
        listed = directory_bytes(self._file)
        if listed > MAX_DIRECTORY_BYTES:
            raise CheckpointError(
                f"{path} is not a checkpoint tinyamp wrote: its zip directory declares {listed:,} bytes of "
                f"entries, more than the {MAX_DIRECTORY_BYTES:,} bytes a checkpoint's list of arrays takes"
            )
        archive = zipfile.ZipFile(self._file)
        self.entries: dict[str, zipfile.ZipInfo] = {}
        for info in archive.infolist():
            name = info.filename
            if name in self.entries:
                raise CheckpointError(f"{path} is damaged: it holds two entries named {name!r}")
            if info.flag_bits & 0x1:
                raise CheckpointError(f"{path} is not a checkpoint tinyamp wrote: its entry {name!r} is encrypted")
            if info.compress_type not in _METHODS:
                raise CheckpointError(
                    f"{path} is not a checkpoint tinyamp can read: its entry {name!r} uses compression "
                    f"method {info.compress_type}, which zipfile cannot inflate"
                )
            self.entries[name] = info
        declared = sum(info.file_size for info in self.entries.values())
        allowed = self.budget.max_bytes + MAX_METADATA_BYTES + len(self.entries) * MAX_HEADER_BYTES
        if declared > allowed:  # a zip bomb stops here, before anything is inflated
            raise CheckpointError(
                f"{path} declares {declared:,} bytes once uncompressed, more than a checkpoint with at most "
                f"{self.budget.max_bytes:,} bytes of arrays can hold; {self.budget.hint}"
            )
        return archive

    def metadata(self) -> Any:
        """The JSON document in the metadata entry (JSON text as a uint8 ``.npy`` array), its size and depth checked."""
        path, name = self.path, self.metadata_name
        info = self.entries.get(name)
        if info is None:
            raise CheckpointError(
                f"{path} is not a tinyamp checkpoint: it is a NumPy archive without the "
                f"{name.removesuffix('.npy')!r} entry that save_checkpoint writes"
            )
        if info.file_size > MAX_METADATA_BYTES + MAX_HEADER_BYTES:
            raise CheckpointError(
                f"{path} is not a checkpoint tinyamp can read: its metadata declares {info.file_size:,} bytes, "
                f"more than the {MAX_METADATA_BYTES:,} bytes a checkpoint's metadata may take"
            )
        with self._zip.open(info) as member:
            shape, _, dtype, header = self._header(name, member)
            if dtype != np.uint8 or len(shape) != 1:
                raise CheckpointError(f"{path} is damaged: its metadata is a {shape} {dtype} array, not uint8 text")
            self._check_size(name, shape, dtype, header)
            text = member.read(shape[0])
        cost = json_cost(text)
        if cost > MAX_METADATA_OBJECT_BYTES:
            raise CheckpointError(
                f"{path} is not a checkpoint tinyamp can read: parsing its {len(text):,} bytes of metadata would build "
                f"about {cost:,} bytes of Python objects, more than the {MAX_METADATA_OBJECT_BYTES:,} a checkpoint's "
                "metadata may take"
            )
        try:
            document = json.loads(text.decode("utf-8"))
            too_deep = json_depth(document) > MAX_JSON_DEPTH
        except RecursionError:  # json.loads recurses once per level, and gave up
            too_deep = True
        except ValueError as exc:  # UnicodeDecodeError and json.JSONDecodeError are ValueErrors
            raise CheckpointError(f"{path} is damaged: its metadata is not JSON text ({exc})") from None
        if too_deep:
            raise CheckpointError(
                f"{path} is not a checkpoint tinyamp wrote: its metadata nests deeper than {MAX_JSON_DEPTH} levels"
            )
        return document

    def arrays(self, refs: list[ArrayRef], only: set[str] | None = None) -> dict[str, np.ndarray]:
        """Check the budget, the entries and every header against `refs`; then read the arrays, by key
        (those whose keys are in `only`, when given)."""
        path = self.path
        problem = self.budget.problem(refs)
        if problem:
            raise CheckpointError(f"{path} {problem}")
        wanted = {f"{r.key}.npy": r for r in refs}
        unknown = sorted(self.entries.keys() - wanted.keys() - {self.metadata_name, NUMPY20_STRAY})
        if unknown:
            raise CheckpointError(
                f"{path} is not a checkpoint tinyamp wrote: its entry {unknown[0]!r} is not named in its metadata"
            )
        missing = sorted(wanted.keys() - self.entries.keys())
        if missing:
            raise CheckpointError(f"{path} is damaged: it lacks the entry {missing[0]!r} that its metadata names")
        headers = dict(wanted)
        if NUMPY20_STRAY in self.entries and NUMPY20_STRAY not in wanted:  # tolerated as numpy 2.0 wrote it
            headers[NUMPY20_STRAY] = ArrayRef(NUMPY20_STRAY.removesuffix(".npy"), np.dtype(bool), ())
        for name, ref in headers.items():  # every header, before any array is allocated
            with self._zip.open(self.entries[name]) as member:
                self._check_header(name, ref, member)
        try:
            return {ref.key: self._read(name) for name, ref in wanted.items() if only is None or ref.key in only}
        except MemoryError:
            total = sum(r.nbytes for r in refs)
            raise CheckpointError(
                f"{path} holds {total:,} bytes of arrays, more than this machine can allocate"
            ) from None

    # ---- one entry ---------------------------------------------------------------------------------------------
    def _header(self, name: str, member: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype, int]:
        """The .npy header at the start of `member`: (shape, fortran_order, dtype, its size in bytes)."""
        path = self.path
        try:
            major, minor = np.lib.format.read_magic(member)
        except ValueError:
            raise CheckpointError(f"{path} is damaged: its entry {name!r} is not a .npy array") from None
        if (major, minor) not in ((1, 0), (2, 0)):
            raise CheckpointError(f"{path} is damaged: its entry {name!r} is a .npy file of version {major}.{minor}")
        length_field = member.read(2 if major == 1 else 4)
        length = int.from_bytes(length_field, "little")
        if length > MAX_HEADER_BYTES:  # refused before numpy would read that many bytes
            raise CheckpointError(f"{path} is damaged: its entry {name!r} declares a {length:,}-byte .npy header")
        read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        try:
            shape, fortran, dtype = read(io.BytesIO(length_field + member.read(length)), max_header_size=length)
        except (ValueError, SyntaxError, TypeError, RecursionError):
            raise CheckpointError(f"{path} is damaged: its entry {name!r} has an unreadable .npy header") from None
        if dtype.hasobject:
            raise CheckpointError(
                f"{path} is not a checkpoint tinyamp wrote: its entry {name!r} holds Python objects (a pickle), "
                "which tinyamp never writes and never loads"
            )
        return shape, fortran, dtype, 8 + len(length_field) + length

    def _check_size(self, name: str, shape: tuple[int, ...], dtype: np.dtype, header: int) -> None:
        data = math.prod(shape) * dtype.itemsize  # Python ints, so a shape of 2^40 cannot overflow
        held = self.entries[name].file_size - header
        if data != held:
            raise CheckpointError(
                f"{self.path} is damaged: the header of its entry {name!r} declares {data:,} bytes of data "
                f"({shape} {dtype}), but the entry holds {held:,}"
            )

    def _check_header(self, name: str, ref: ArrayRef, member: IO[bytes]) -> None:
        shape, _, dtype, header = self._header(name, member)
        if dtype != ref.dtype or shape != ref.shape:
            raise CheckpointError(
                f"{self.path} is damaged: array {ref.key} is stored as {shape} {dtype}; "
                f"the metadata says {ref.shape} {ref.dtype}"
            )
        self._check_size(name, shape, dtype, header)

    def _read(self, name: str) -> np.ndarray:
        """The array in entry `name` (its header already checked), allocated once and filled piece by piece."""
        with self._zip.open(self.entries[name]) as member:
            shape, fortran, dtype, _ = self._header(name, member)
            array = np.empty(shape[::-1] if fortran else shape, dtype)  # Fortran order: the transpose, in C order
            flat = array.reshape(-1).view(np.uint8)  # a view of the array's own bytes
            for start in range(0, flat.size, _READ_PIECE):
                want = min(_READ_PIECE, flat.size - start)
                piece = member.read(want)  # zipfile checks the CRC as the last piece is read
                if len(piece) != want:
                    raise CheckpointError(f"{self.path} is damaged: its entry {name!r} ends early")
                flat[start : start + want] = np.frombuffer(piece, np.uint8)
        return array.T if fortran else array


def json_cost(text: bytes) -> int:
    """About how many bytes of Python objects ``json.loads(text)`` builds, counted without parsing.

    Each JSON value becomes an object, and every value but the first follows a ``[``, ``{``,
    ``,`` or ``:``.  The weights are CPython 3's sizes, rounded up: a dict of a few keys
    takes 184-232 bytes, a list 56 plus 8 per item and its over-allocation, a string 49 plus
    its length (two quotes each), a float 24, a list's slot or an int about 40.  Measured
    against tracemalloc on 15 MiB texts of nine shapes (lists, dicts, numbers, strings, one
    dict of many keys, nesting) under CPython 3.11, the estimate is 0.98 to 9.3 times the
    peak; the one it underestimates, by 2%, is a single dict of 1.5 million distinct keys.
    """
    return (
        240 * text.count(b"{")
        + 100 * text.count(b"[")
        + 40 * (text.count(b",") + text.count(b":"))
        + 30 * text.count(b'"')
        + 2 * len(text)
    )


def json_depth(value: Any) -> int:
    """How deeply lists and dicts nest in `value` (0 for a number, 1 for ``[]``), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth)
            todo.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest
