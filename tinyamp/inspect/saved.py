"""What a graph holds for backward: every saved array, its op, dtype and bytes.

``saved_tensors(loss)`` walks the graph that produced `loss` and lists each array some
node keeps for its backward.  An array kept by two nodes (a ReLU's output is also the
next Linear's input) is one allocation: it is listed twice but counted once.  Each
array is classed by where its memory comes from:

* "leaf": the data of a leaf tensor (a parameter, the input batch), held anyway;
* "cast": a lower-precision copy that autocast made for this forward;
* "activation": an intermediate result that exists only for the backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tinyamp import autograd, backend
from tinyamp.casting import Cast
from tinyamp.tensor import Tensor


@dataclass(frozen=True)
class SavedTensor:
    """One array kept by one node of the graph."""

    op: str
    index: int  # which of the node's saved arrays
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    kind: str  # "leaf", "cast" or "activation"
    shared_with: int | None  # row of an earlier entry holding the same array (then not counted again)


@dataclass
class SavedTensorsReport:
    """The rows, and totals that count each array once."""

    rows: list[SavedTensor] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(r.nbytes for r in self.rows if r.shared_with is None)

    def bytes_by_dtype(self) -> dict[str, int]:
        return self._bytes_by("dtype")

    def bytes_by_kind(self) -> dict[str, int]:
        return self._bytes_by("kind")

    def _bytes_by(self, column: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            if r.shared_with is None:  # an array kept by two nodes is one allocation
                key = getattr(r, column)
                out[key] = out.get(key, 0) + r.nbytes
        return out

    def __str__(self) -> str:
        lines = [f"{'op':<14}{'#':>2}  {'shape':<16}{'dtype':<10}{'bytes':>12}  kind"]
        for r in self.rows:
            note = f"  (same array as row {r.shared_with})" if r.shared_with is not None else ""
            lines.append(f"{r.op:<14}{r.index:>2}  {str(r.shape):<16}{r.dtype:<10}{r.nbytes:>12,}  {r.kind}{note}")
        by_dtype = ", ".join(f"{d} {b:,}" for d, b in self.bytes_by_dtype().items())
        lines.append(f"total {self.total_bytes:,} bytes ({by_dtype})")
        return "\n".join(lines)


def saved_tensors(root: Tensor) -> SavedTensorsReport:
    """Every array the graph of `root` keeps for backward (call it before backward frees them)."""
    fns = list(autograd.walk(root))
    # What each array a node could have saved is: a leaf's own array, the output of a Cast
    # node (a low-precision copy), or else an activation computed by some other op.
    kind_of: dict[int, str] = {}
    for fn in fns:
        if isinstance(fn, Cast) and getattr(fn, "output_array", None) is not None:
            out = fn.output_array()
            if out is not None:
                kind_of[id(out)] = "cast"
        for t in fn.inputs:
            if t.is_leaf:  # a cast of a tensor that needs no grad is a leaf of the graph, but still a copy
                kind_of.setdefault(id(t.data), "cast" if t.name == "autocast copy" else "leaf")
    report = SavedTensorsReport()
    first_row: dict[int, int] = {}
    for fn in reversed(fns):  # leaves' consumers first: rows read in forward order
        for i, array in enumerate(fn.saved or ()):
            if not backend.is_array(array):
                continue
            kind = kind_of.get(id(array), "activation")
            key = id(array)
            report.rows.append(
                SavedTensor(
                    fn.name, i, tuple(array.shape), array.dtype.name, int(array.nbytes), kind, first_row.get(key)
                )
            )
            first_row.setdefault(key, len(report.rows) - 1)
    return report
