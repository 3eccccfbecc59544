"""ZeRO stage 1: the FP32 masters and the optimizer's moments sharded across ranks (Rajbhandari et al. 2020).

Mixed-precision training with Adam holds, per parameter: the FP16 weight (2 bytes), its FP16
gradient (2), and the optimizer's state in FP32: the master weight and the two moments (4 + 4
+ 4 = 12).  Of the 16 bytes, 12 are needed only by the update, and the update of an element
needs only that element's gradient, master and moments (it is elementwise).  So rank r keeps
them for its own shard of the flat vector only, updates that shard, and the ranks exchange the
result as FP16 weights (an all-gather of 2 bytes per parameter).  Per rank:

    2 + 2 + 12 / N bytes per parameter        (ZeRO's "P_os", K = 12 for Adam; SGD with momentum: K = 8)

The arithmetic of an element's update is the same whichever rank does it and whatever else
is in its array, so a sharded run gives the same masters, bit for bit, as a replicated one.

``MasterShard`` is what one rank holds: a flat master range and an optimizer over it (one
tensor, named for its range).  Without ZeRO the range is the whole vector.  Without master
weights (the "fp32" and "fp16" regimes) the range is a view of the model's own weights,
which the optimizer then updates in place, as it does in a single process.
"""

from __future__ import annotations

from typing import Any

from tinyamp import backend, kernels
from tinyamp.tensor import Tensor


class MasterShard:
    """The master weights of the flat range ``[lo, hi)`` and an optimizer that updates them.

    Args:
        weights: the model's flat weight vector (16-bit, or float32 in the fp32 regime).
        lo, hi: the range this rank updates.
        make_optimizer: builds the optimizer from ``[(name, tensor)]`` (a task's ``make_optimizer``).
        master_dtype: "float32" for FP32 masters (an exact widening of the weights), or None to
            update the weights themselves.
    """

    def __init__(self, weights: Any, lo: int, hi: int, make_optimizer: Any, master_dtype: str | None) -> None:
        view = weights[lo:hi]  # without masters the optimizer writes the model's weights through this view
        data = view if master_dtype is None else kernels.cast(view, master_dtype)  # widening 16 bits: exact
        self.lo, self.hi, self.has_masters = lo, hi, master_dtype is not None
        self.tensor = Tensor._make(data, False, None)  # wraps the array itself (Tensor() would copy it)
        self.tensor.name = f"flat[{lo}:{hi}]"
        self.optimizer = make_optimizer([(self.tensor.name, self.tensor)])

    def round_into(self, out: Any) -> None:
        """Write the masters into `out` (the model's 16-bit weights of this range), each rounded once."""
        if self.has_masters:
            kernels.cast(self.tensor.data, out.dtype, out=out)

    def state_arrays(self) -> dict[str, Any]:
        """The optimizer's per-element state of this range ({"exp_avg": ..., "exp_avg_sq": ...} for Adam)."""
        return {k: v for k, v in self.optimizer.state[0].items() if backend.is_array(v) and v.shape == (self.size,)}

    @property
    def size(self) -> int:
        return self.hi - self.lo

    @property
    def master_bytes(self) -> int:
        """Bytes of the FP32 masters this rank holds (0 without masters: the weights are their own)."""
        return int(self.tensor.data.nbytes) if self.has_masters else 0

    @property
    def state_bytes(self) -> int:
        """Bytes of the optimizer state this rank holds (momentum, Adam's two moments)."""
        return sum(int(v.nbytes) for v in self.state_arrays().values())


def model_state_bytes(weights: Any, total: int, grad_itemsize: int, shard: MasterShard) -> dict[str, int]:
    """The bytes of the model states one rank holds, from the arrays themselves, ZeRO's four roles.

    The gradients are counted at the size backward writes them (`total` elements of
    `grad_itemsize` bytes, held until they are reduced), the others as the arrays held now.
    """
    return {
        "weights": int(weights.nbytes),
        "gradients": total * grad_itemsize,
        "master weights": shard.master_bytes,
        "optimizer state": shard.state_bytes,
    }


def zero_bytes_per_parameter(ranks: int, state_bytes: int = 12, zero: bool = True) -> float:
    """ZeRO-1's model states per parameter: 2 (FP16 weight) + 2 (FP16 gradient) + K / N, K = `state_bytes`."""
    return 2 + 2 + state_bytes / (ranks if zero else 1)
