"""All parameters as one flat vector, cut into N equal shards: the index arithmetic of data parallelism.

Parameter i occupies elements ``offsets[i] : offsets[i] + sizes[i]`` of the flat vector.  The
vector is padded with zeros to a multiple of N, so that rank r owns exactly the elements
``r * shard : (r + 1) * shard``.  A shard's boundary may cut through a parameter: its
``pieces`` name the part of each parameter a rank owns (``"1.weight[0:512]"``), which is
how an overflow found in a shard is reported.  The padding stays zero: a zero gradient moves
no SGD or Adam weight that starts at zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tinyamp import kernels
from tinyamp.backend import get_array_module


@dataclass(frozen=True)
class FlatLayout:
    """Where each parameter sits in the flat vector, and which range each of `ranks` ranks owns."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    ranks: int

    @property
    def sizes(self) -> list[int]:
        out = []
        for shape in self.shapes:
            n = 1
            for d in shape:
                n *= d
            out.append(n)
        return out

    @property
    def offsets(self) -> list[int]:
        out, at = [], 0
        for n in self.sizes:
            out.append(at)
            at += n
        return out

    @property
    def total(self) -> int:
        """Elements of all parameters together (P)."""
        return sum(self.sizes)

    @property
    def shard_size(self) -> int:
        """Elements each rank owns: ceil(P / N)."""
        return -(-self.total // self.ranks)

    @property
    def padded(self) -> int:
        """Length of the flat vector: N * shard_size (at most N - 1 zeros of padding)."""
        return self.shard_size * self.ranks

    def shard(self, rank: int) -> tuple[int, int]:
        """The flat range ``[lo, hi)`` rank `rank` owns."""
        return rank * self.shard_size, (rank + 1) * self.shard_size

    def flatten(self, arrays: list[Any], dtype: Any) -> Any:
        """One padded flat vector of `dtype` from one array per parameter (cast by ``kernels.cast``: exact
        when widening, rounded once when narrowing)."""
        xp = get_array_module(arrays[0])
        flat = xp.zeros(self.padded, dtype=dtype)
        for a, at, n in zip(arrays, self.offsets, self.sizes):
            kernels.cast(a.reshape(-1), flat.dtype, out=flat[at : at + n])
        return flat

    def views(self, flat: Any) -> list[Any]:
        """Each parameter's part of `flat`, reshaped: views, so that writing them writes `flat`."""
        return [flat[at : at + n].reshape(shape) for at, n, shape in zip(self.offsets, self.sizes, self.shapes)]

    def pieces(self, lo: int, hi: int) -> list[tuple[str, int, int]]:
        """``(name, start, stop)`` for each parameter overlapping ``[lo, hi)``, start and stop relative to lo."""
        out = []
        for name, at, n in zip(self.names, self.offsets, self.sizes):
            a, b = max(at, lo), min(at + n, hi)
            if a < b:
                label = name if (a, b) == (at, at + n) else f"{name}[{a - at}:{b - at}]"
                out.append((label, a - lo, b - lo))
        return out
