"""The gradient all-reduce, with the dtype of the sum as an explicit choice, and its order fixed.

Data parallelism: N ranks each compute the gradient of the mean loss over their own B/N
examples; the gradient of the whole batch is the mean of those N gradients.  How that sum is
computed is a precision decision:

=====================  ==========================================================================
``"float32"``          widen each FP16 gradient to FP32 (exact), sum in FP32, divide by N.  Each
                       add rounds to 24 bits, so the sum of N values is off by at most about
                       (N-1) * 2^-24 of their magnitudes: nothing FP16 could see.  The result
                       stays FP32: it feeds the FP32 masters, with no rounding back to 16 bits.
``"float16"``          sum in FP16, divide by N afterwards (the reduce-scatter sends half the
                       bytes of FP32's).  Every add rounds to 11 bits, and the *sum* can overflow
                       where every gradient and their mean cannot: two gradients of 40000 are
                       finite, their sum 80000 is inf (FP16's largest value is 65504).  A
                       dynamic loss scale then settles about log2(N) halvings lower.
``"float16-predivide"``  divide each gradient by N first, rounded once to FP16, then sum in FP16
                       (Apex DDP's, Horovod's and DeepSpeed's gradient_predivide_factor = N;
                       PyTorch DDP's fp16_compress_hook divides by N before its FP16 sum too).
                       Each quotient is at most fp16(65504/N), and rounding is monotone, so the
                       sum overflows only if N copies of that quotient do: never for N a power
                       of two (the division is exact; checked for N = 2 to 4096), but for N = 3
                       the quotient rounds up to 21840 and three make 65520, inf.  At the small end, a quotient |g|/N
                       below 2^-25 rounds to 0, 2^-25 itself is a tie that goes to the even 0,
                       and anything above it rounds to 2^-24 or more; below 2^-14 the quotients
                       are subnormal and keep fewer than 11 bits.
=====================  ==========================================================================

The all-reduce is built as its two halves, so that each rank can check the part it owns:

1. *reduce-scatter*: the flat gradient is cut into N equal shards; ``alltoall`` sends shard j
   of every rank to rank j, which sums them **in rank order**, ``((g_0 + g_1) + g_2) + ...``;
2. *all-gather*: every rank receives every summed shard.

Each shard is summed once, on one rank, so every rank ends with the same bits, whatever the
library's own reduction order would have been; and the order is the one a single process
accumulating N micro-batches uses (``sum_in_rank_order``), which makes the two bit-identical.
Bytes sent per rank: (N-1)/N of the flat gradient in each half, as a ring all-reduce sends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyamp import backend, kernels
from tinyamp.distributed.communicator import Communicator


@dataclass(frozen=True)
class Reduction:
    """How the gradients of N ranks are summed: the dtype of the sum, and where the division by N happens."""

    name: str
    dtype: str  # the dtype the gradients travel and are summed in
    predivide: bool  # divide by N before the sum (else after)


REDUCTIONS = {
    r.name: r
    for r in (
        Reduction("float32", "float32", False),
        Reduction("float16", "float16", False),
        Reduction("float16-predivide", "float16", True),
    )
}


def reduction(name: str) -> Reduction:
    """The Reduction called `name` ("float32", "float16" or "float16-predivide")."""
    if name not in REDUCTIONS:
        raise ValueError(f"unknown reduction {name!r}; choose one of {', '.join(REDUCTIONS)}")
    return REDUCTIONS[name]


def sum_in_rank_order(parts: Sequence[Any]) -> Any:
    """``((p_0 + p_1) + p_2) + ...``, each add rounded once to the parts' dtype (a new array).

    For two float16 arrays ``kernels.add`` widens, adds in float32 and rounds once: float32's
    24 bits are at least 2 * 11 + 2, so that double rounding gives the correctly rounded FP16
    sum (Figueroa 1995), the one a GPU's FP16 add gives.
    """
    total = parts[0].copy()
    for p in parts[1:]:
        total = kernels.add(total, p)
    return total


def divide(x: Any, n: int) -> Any:
    """`x` / n, computed in float32 at least and rounded once to x's dtype (in place).

    Exact for n a power of two, unless a value lands among the subnormals; for other n one rounding.
    """
    if n != 1:
        xp = backend.get_array_module(x)
        with np.errstate(over="ignore", invalid="ignore"):
            kernels.cast(xp.divide(kernels.widen(x), np.float32(n)), x.dtype, out=x)
    return x


def reduce_scatter(comm: Communicator, flat: Any) -> Any:
    """This rank's shard of the sum over ranks of `flat` (length N * shard), summed in rank order, in flat's dtype."""
    rows = comm.alltoall(flat.reshape(comm.size, -1))  # row j: rank j's values of the shard this rank owns
    return sum_in_rank_order([rows[j] for j in range(comm.size)])


def all_gather(comm: Communicator, shard: Any) -> Any:
    """Every rank's shard, concatenated in rank order: the whole flat vector, the same bits on every rank."""
    return comm.allgather(shard)


def reduction_error(grads: Sequence[Any], name: str) -> dict[str, float]:
    """What summing `grads` (one FP16 array per rank) with reduction `name` does, against the exact mean.

    Computed on one process with the arithmetic of ``reduce_scatter``: returns the fraction of
    the elements that overflowed (inf where the exact mean is finite), the fraction that came
    out 0 where the exact mean is not, and the median relative error of the other ones.
    """
    r, n = reduction(name), len(grads)
    exact = np.sum([np.asarray(g, np.float64) for g in grads], axis=0) / n
    parts = [np.asarray(g).astype(r.dtype) for g in grads]
    if r.predivide:
        parts = [divide(p, n) for p in parts]
    with np.errstate(over="ignore", invalid="ignore"):
        total = sum_in_rank_order(parts).astype(np.float32)
        mean = total if r.predivide else divide(total, n)
    finite = np.isfinite(mean)
    flushed = finite & (mean == 0) & (exact != 0)
    ok = finite & ~flushed & (exact != 0)
    rel = np.abs(mean[ok] - exact[ok]) / np.abs(exact[ok])
    return {
        "overflowed": float(np.mean(~finite)),
        "flushed_to_zero": float(np.mean(flushed)),
        "median_relative_error": float(np.median(rel)) if rel.size else float("nan"),
    }
