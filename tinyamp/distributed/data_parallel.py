"""Data-parallel training, as an optimizer that a LossScaler drives: reduce, check, agree, step, gather.

One step on every rank (``train.py``'s ``DistributedSetup.step``; tutorial 9 spells it out)::

    for i, batch in enumerate(micro_batches):    # usually one
        scaler.scale_loss(loss(batch), accumulate=i > 0).backward()
        dp.collect()                             # this rank's 16-bit gradient, flattened
    flags = scaler.unscale_(dp)                  # dp.gather_grads(): reduce-scatter; then the scaler
                                                 # unscales and checks the shard this rank owns
    dp.exchange(flags)                           # found_inf agreed (MAX); DDP: all-gather the gradient
    report = scaler.step(dp)                     # skip, or dp.step(): update this rank's masters
    dp.finish()                                  # ZeRO: all-gather the 16-bit weights

The LossScaler is tinyamp's own, unchanged: it sees this object's ``params`` (the pieces of
the gradient shard this rank checks, and the agreement's ``RemoteOverflow``) and calls
``gather_grads``, ``step`` and ``zero_grad``, as it does with ``MasterWeights``.  So the
``grad_norm`` of its StepReport is the norm of this rank's shard; the whole gradient's norm
is the square root of the sum over the ranks of their squares, one more collective, which a
step takes only to clip: ``scaler.clip_grad_norm_(dp, max_norm)``, called between
``unscale_`` and ``exchange``, lands in ``DataParallel.clip_grad_norm_``, which sums the
squares over the ranks, and the StepReport's ``grad_norm`` is then the whole norm.

Bytes per step and rank, P parameters, N ranks: the reduce-scatter sends (N-1)/N * P values
in the reduction's dtype; the all-gather then sends (N-1)/N * P values of the unscaled FP32
gradient (replicated: the check happens between the two halves, after the unscale) or of the
FP16 weights (ZeRO).  So with ZeRO and an FP16 reduction a step sends 2 * 2 (N-1)/N bytes per
parameter, as a plain FP16 ring all-reduce does.

Every rank calls every collective in every step, whatever it decided, so ranks that decide
differently (``agree=False``, for the demonstration only) make the replicas diverge, never
the job hang.  The model's parameters become views of one flat weight vector, broadcast from
rank 0 at the start: every replica starts from the same bits.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from tinyamp import backend, dtypes, kernels
from tinyamp.amp.scaler import clip_by_global_norm_
from tinyamp.amp.scaler_checks import check_max_norm
from tinyamp.distributed import allreduce
from tinyamp.distributed.agreement import RemoteOverflow, agree_on_overflow
from tinyamp.distributed.communicator import Communicator
from tinyamp.distributed.flat import FlatLayout
from tinyamp.distributed.zero import MasterShard, model_state_bytes
from tinyamp.nn.module import Module


class _Piece:
    """The part of one parameter's gradient inside this rank's shard: what the scaler unscales and checks."""

    def __init__(self, name: str, start: int, stop: int) -> None:
        self.name, self.start, self.stop = name, start, stop
        self.grad: Any = None


class DataParallel:
    """One replica of a data-parallel run: the flat weights, this rank's masters and optimizer state, the exchange.

    Args:
        model: the model, already in its weight dtype (every parameter the same dtype).
        make_optimizer: builds an optimizer from ``[(name, tensor)]`` (a task's ``make_optimizer``).
        comm: the communicator (``communicator.py``).
        master_weights: keep FP32 master weights (the regimes fp16-master, mixed, bf16-mixed).
        reduction: "float32", "float16" or "float16-predivide" (``allreduce.py``).
        zero: shard the masters and the optimizer state across ranks (ZeRO-1, ``zero.py``).
        agree: all-reduce found_inf before the skip (``agreement.py``); False only to show divergence.
        micro_batches: backward passes per step on each rank, summed in order before the reduce.
    """

    def __init__(
        self,
        model: Module,
        make_optimizer: Any,
        comm: Communicator,
        *,
        master_weights: bool = True,
        reduction: str = "float32",
        zero: bool = False,
        agree: bool = True,
        micro_batches: int = 1,
    ) -> None:
        named = model.named_parameters()
        self.param_names, self.model_params = [n for n, _ in named], [p for _, p in named]
        kinds = sorted({p.dtype.name for p in self.model_params})
        if len(kinds) != 1:
            raise ValueError(f"data parallelism flattens the parameters into one vector of one dtype; got {kinds}")
        self.reduction = allreduce.reduction(reduction)
        if self.reduction.dtype == "float16" and kinds[0] != "float16":
            raise ValueError(
                f"reduction {reduction!r} sums FP16 gradients; this model's gradients are {kinds[0]}: use float32"
            )
        if zero and not master_weights:
            raise ValueError("ZeRO-1 shards the FP32 master weights and their optimizer state: it needs master weights")
        if not (isinstance(micro_batches, int) and micro_batches >= 1):
            raise ValueError(f"micro_batches must be a whole number >= 1; got {micro_batches!r}")
        self.comm, self.zero, self.agree, self.micro_batches = comm, zero, agree, micro_batches
        self.layout = FlatLayout(tuple(self.param_names), tuple(p.shape for p in self.model_params), comm.size)
        self.weights = comm.bcast(self.layout.flatten([p.data for p in self.model_params], kinds[0]), root=0)
        for p, view in zip(self.model_params, self.layout.views(self.weights)):
            p.data = view  # the model now computes with the flat vector's values, in place
        self.own = self.layout.shard(comm.rank)  # the range this rank sums and checks, in both modes
        lo, hi = self.own if zero else (0, self.layout.padded)
        self.shard = MasterShard(self.weights, lo, hi, make_optimizer, "float32" if master_weights else None)
        self.checked = [_Piece(*piece) for piece in self.layout.pieces(*self.own)]
        self.remote = RemoteOverflow()
        self._parts: list[Any] = []  # this rank's flattened gradients of the step, one per micro-batch
        self._grad: Any = None  # this rank's shard of the reduced gradient, float32
        self.found_inf = self.found_inf_here = False  # the last step's decision, and this rank's own check

    # ---- the LossScaler's protocol ------------------------------------------------------------------
    @property
    def params(self) -> list[Any]:
        """What the scaler unscales and checks: this rank's gradient shard, by parameter, then the agreement."""
        return [*self.checked, self.remote]

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.checked] + [RemoteOverflow.NAME]

    def collect(self) -> None:
        """Flatten this rank's gradients of one micro-batch (in the reduction's dtype) and clear the model's."""
        grads = [p.grad for p in self.model_params]
        missing = [n for n, g in zip(self.param_names, grads) if g is None]
        if missing:
            raise ValueError(f"parameters {missing} have no gradient: every parameter must take part in the loss")
        if len(self._parts) == self.micro_batches:
            raise RuntimeError(f"collect() was called more than micro_batches={self.micro_batches} times this step")
        part = self.layout.flatten(grads, self.reduction.dtype)  # FP16 -> FP32 is exact; FP16 -> FP16 a copy
        if self.reduction.predivide:
            allreduce.divide(part, self.comm.size * self.micro_batches)
        self._parts.append(part)
        for p in self.model_params:
            p.grad = None

    def gather_grads(self) -> None:
        """Sum every rank's gradients into this rank's shard (reduce-scatter, rank order), as float32 means."""
        if any(p.grad is not None for p in self.model_params):
            self.collect()
        if len(self._parts) != self.micro_batches:
            raise RuntimeError(f"{len(self._parts)} micro-batch gradients collected; expected {self.micro_batches}")
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow of the FP16 sum is found by the check
            local = allreduce.sum_in_rank_order(self._parts)
            grad = kernels.cast(allreduce.reduce_scatter(self.comm, local), dtypes.float32)  # widening: exact
            if not self.reduction.predivide:
                allreduce.divide(grad, self.comm.size * self.micro_batches)
        self._parts, self._grad = [], grad
        for piece in self.checked:
            piece.grad = grad[piece.start : piece.stop]  # views: the scaler unscales the shard in place
        self.remote.grad = None

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip the whole gradient, over all ranks, to an L2 norm of at most `max_norm`; return the norm before.

        ``scaler.clip_grad_norm_(dp, max_norm)`` calls this, between ``scaler.unscale_(dp)`` and
        ``dp.exchange(flags)`` (whose all-gather, in DDP, must send the clipped shards).  No rank
        holds the whole gradient, and clipping a shard by its own norm would scale the shards by
        different factors: a gradient pointing elsewhere.  So each rank's sum of squares is
        all-gathered and every rank adds the N sums in rank order: one norm, bit for bit, on every
        rank, and one factor max_norm / (norm + 1e-6), applied when below 1 (the scaler's rule).
        PyTorch's FSDP has its own ``clip_grad_norm_`` for the same reason.
        """
        check_max_norm(max_norm)
        if self._grad is None or self.shard.tensor.grad is not None:
            raise RuntimeError(
                "clip between scaler.unscale_(dp) and dp.exchange(flags): before, there is no reduced gradient "
                "to clip; after, DDP has already all-gathered the unclipped one"
            )
        # the padding beyond the last parameter is 0: it adds nothing to the norm and stays 0
        return clip_by_global_norm_([self._grad], max_norm, norm_of=self._norm_over_ranks)

    def _norm_over_ranks(self) -> float:
        mine = math.fsum(backend.host_floats([kernels.sum_of_squares(p.grad) for p in self.checked]))
        every = self.comm.allgather(self.comm.xp.asarray([mine], dtype=np.float64))
        return math.sqrt(math.fsum(backend.to_device(every, "cpu").tolist()))  # inf or nan if any shard is

    def exchange(self, flags: dict[str, bool]) -> None:
        """Agree on the overflow decision, then (DDP) give every rank the whole unscaled gradient."""
        self.found_inf_here = any(flags.values())
        self.found_inf = agree_on_overflow(self.comm, self.found_inf_here) if self.agree else self.found_inf_here
        if self.agree:
            self.remote.set(self.comm.xp, self.found_inf and not self.found_inf_here)
        grad = self._grad if self.zero else allreduce.all_gather(self.comm, self._grad)
        # without masters a 16-bit weight takes a 16-bit gradient: the float32 mean, rounded once
        self.shard.tensor.grad = kernels.cast(grad, self.shard.tensor.dtype)

    def step(self) -> None:
        """Update this rank's masters (the scaler calls it only when the step is not skipped)."""
        self.shard.optimizer.step()
        if not self.zero:
            self.shard.round_into(self.weights)  # every rank rounds the same masters: the same 16-bit weights

    def finish(self) -> None:
        """ZeRO: all-gather the 16-bit weights, each rank's shard rounded once from its masters."""
        if self.zero:
            own = kernels.cast(self.shard.tensor.data, self.weights.dtype)
            self.weights[...] = allreduce.all_gather(self.comm, own)

    def zero_grad(self) -> None:
        """Clear the model's gradients and everything gathered from them."""
        for p in self.model_params:
            p.grad = None
        for piece in self.checked:
            piece.grad = None
        self.remote.grad = self._grad = self.shard.tensor.grad = None
        self._parts = []

    def inject_overflow(self) -> None:
        """Write inf into this rank's last collected gradient, in its own shard: an overflow only it will see.

        For demonstrations and tests: after the reduce-scatter the inf lands in this rank's shard
        alone (inf + x = inf), as an overflow in this rank's backward would.
        """
        self._parts[-1][self.own[0]] = np.inf

    # ---- what runners and reports read ----------------------------------------------------------
    @property
    def optimizer(self) -> Any:
        """The optimizer over this rank's masters (one flat tensor)."""
        return self.shard.optimizer

    @property
    def state(self) -> list[dict[str, Any]]:
        return self.shard.optimizer.state

    @property
    def master_params(self) -> list[Any] | None:
        """This rank's masters as one tensor (None without masters, for ``inspect.training_memory``)."""
        return [self.shard.tensor] if self.shard.has_masters else None

    @property
    def lr(self) -> float:
        return self.shard.optimizer.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.shard.optimizer.lr = value

    def memory(self) -> dict[str, int]:
        """Bytes of the model states this rank holds: weights, gradients, masters, optimizer state."""
        return model_state_bytes(self.weights, self.layout.total, self.weights.dtype.itemsize, self.shard)

    def fingerprint(self) -> dict[str, str]:
        """SHA-256 digests of this rank's weights, masters and optimizer state (equal digests: equal bits)."""

        def digest(arrays: list[Any]) -> str:
            h = hashlib.sha256()
            for a in arrays:
                h.update(np.ascontiguousarray(backend.to_device(a, "cpu")).view(np.uint8).tobytes())
            return h.hexdigest()[:16]

        state = self.shard.state_arrays()
        return {
            "weights": digest([self.weights]),
            "masters": digest([self.shard.tensor.data]),
            "moments": digest([state[k] for k in sorted(state)]),
        }

    def gathered(self) -> tuple[Any, dict[str, Any]]:
        """The whole flat masters and optimizer state (length P), on every rank: all-gathered under ZeRO."""
        masters, state = self.shard.tensor.data, self.shard.state_arrays()
        if self.zero:
            masters = allreduce.all_gather(self.comm, masters)
            state = {k: allreduce.all_gather(self.comm, state[k]) for k in sorted(state)}
        total = self.layout.total
        return masters[:total], {k: v[:total] for k, v in state.items()}

    def __repr__(self) -> str:
        mode = "ZeRO-1" if self.zero else "replicated"
        return (
            f"DataParallel(rank {self.comm.rank} of {self.comm.size}, {self.layout.total:,} parameters, {mode} "
            f"masters {self.shard.tensor.name}, reduction {self.reduction.name}, agree={self.agree})"
        )
