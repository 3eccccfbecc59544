"""One overflow decision for all ranks: found_inf is all-reduced with MAX before the skip.

The agreement is needed where ranks check different data.  After a full all-reduce every rank
holds the same summed gradient, and an inf anywhere in it is found by every rank alike.  Here
each rank checks only the gradient shard it owns (the reduce-scatter half of the all-reduce,
``allreduce.py``): checking 1/N of the gradient is N times cheaper, and in ZeRO a rank never
holds the rest.  But then the ranks see different data, and an overflow in one shard is seen by
one rank only.  If that rank skipped the step while the others stepped:

* with replicated weights (DDP), the ranks that stepped would write the other shard's inf into
  their weights, and the replicas would no longer be replicas;
* with sharded masters (ZeRO), the weights stay equal (they are all-gathered), but the loss
  scales part: the skipping rank backs off, the others do not, and from the next step on the
  gradients summed across ranks were scaled by different factors.

So before the skip, every rank's found_inf goes through ``allreduce(op="max")``: one if any rank
found an overflow.  Every rank then skips or steps together, and every rank's scaler takes the
same transition, so their scale histories stay identical.  DeepSpeed's ZeRO optimizers
all-reduce their overflow flag with MAX the same way; PyTorch's ShardedGradScaler (FSDP)
all-reduces its found_inf with a sum, which is non-zero in the same cases.  It costs one 4-byte
all-reduce per step.

The LossScaler needs no change to obey it: the agreed decision reaches it as one more gradient,
``RemoteOverflow``, a one-element array that holds inf when another rank found an overflow.
The scaler's own check sees it, skips, and names it in the StepReport.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyamp import backend
from tinyamp.distributed.communicator import Communicator


def agree_on_overflow(comm: Communicator, found_inf: bool) -> bool:
    """True on every rank if any rank's `found_inf` is True: the MAX all-reduce of one flag."""
    flag = comm.xp.asarray([1.0 if found_inf else 0.0], dtype=np.float32)
    return backend.host_floats([comm.allreduce(flag, op="max")[0]])[0] > 0


class RemoteOverflow:
    """The agreed decision as a gradient the LossScaler checks: inf when another rank found an overflow.

    It is listed among the optimizer's ``params`` under the name ``NAME``; its ``.grad`` is None
    while the scaler unscales (so its own check sees only this rank's gradients), then set by
    ``DataParallel.exchange`` before ``scaler.step`` checks again.
    """

    NAME = "(an overflow on another rank)"

    def __init__(self) -> None:
        self.grad: Any = None

    def set(self, xp: Any, other_rank_overflowed: bool) -> None:
        """Make the scaler's next check fail (inf) or pass (0) on this entry."""
        self.grad = xp.asarray([np.inf if other_rank_overflowed else 0.0], dtype=np.float32)

    def __repr__(self) -> str:
        return f"RemoteOverflow(grad={self.grad!r})"
