"""Loss functions: cross-entropy on integer class labels.

$L = -\\frac{1}{N} \\sum_n \\log \\mathrm{softmax}(z_n)_{y_n}$.  Its gradient is the
classic $(\\mathrm{softmax}(z) - \\mathrm{onehot}(y)) / N$: computed directly, it needs
no division by a probability that may have underflowed to zero.  With N = 0 (an empty
batch) the mean is 0/0: ``cross_entropy`` refuses it rather than return a loss that means nothing.
"""

from __future__ import annotations

from typing import Any

from tinyamp import backend, kernels
from tinyamp.autocast import cast_inputs
from tinyamp.backend import get_array_module
from tinyamp.dtypes import accumulation_dtype
from tinyamp.function import Function
from tinyamp.ops.softmax import stable_log_softmax
from tinyamp.tensor import Tensor, takes_a_tensor

REDUCTIONS = ("mean", "sum", "none")


def cross_entropy_forward(rows: Any, labels: Any, reduction: str) -> tuple[Any, Any]:
    """(losses, log-probabilities) of logits rows (N, C) against labels (N,); the losses summed for "sum"
    and "mean" (in float32 at least, then divided by N for "mean"), one per row for "none"."""
    xp = get_array_module(rows)
    log_probs = stable_log_softmax(rows, axis=1)
    picked = log_probs[xp.arange(rows.shape[0]), labels]
    if reduction == "none":
        return -picked, log_probs
    total = -picked.sum(dtype=accumulation_dtype(picked.dtype))
    if reduction == "mean":
        total = total / rows.shape[0]  # N >= 1: cross_entropy refuses an empty batch
    return xp.asarray(total, dtype=rows.dtype), log_probs


def cross_entropy_backward(g: Any, log_probs: Any, labels: Any, reduction: str) -> Any:
    """$(\\mathrm{softmax}(z) - \\mathrm{onehot}(y))$ times g (and divided by N for "mean"), for rows (N, C)."""
    xp = get_array_module(g)
    grad = xp.exp(log_probs)  # softmax
    grad[xp.arange(grad.shape[0]), labels] -= 1
    if reduction == "none":
        grad *= g.reshape(-1, 1)
    else:
        grad *= g / grad.shape[0] if reduction == "mean" else g
    return grad


class CrossEntropy(Function):
    """Softmax cross-entropy of logits (..., C) against integer labels (...)."""

    def forward(self, logits: Any, labels: Any, reduction: str) -> Any:
        rows, flat_labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
        losses, log_probs = kernels.call("cross_entropy", cross_entropy_forward, rows, flat_labels, reduction)
        self.save_for_backward(log_probs, flat_labels)
        self.meta = (logits.shape, reduction)
        return losses.reshape(labels.shape) if reduction == "none" else losses

    def backward(self, g: Any) -> tuple[Any, None]:
        log_probs, labels = self.saved
        shape, reduction = self.meta
        grad = kernels.call("cross_entropy_backward", cross_entropy_backward, g, log_probs, labels, reduction)
        return kernels.cast(grad.reshape(shape), log_probs.dtype), None


@takes_a_tensor(what="logits")
def cross_entropy(logits: Tensor, labels: Tensor | Any, reduction: str = "mean") -> Tensor:
    """Cross-entropy between `logits` (..., C) and integer class `labels` (...) in [0, C).

    ``reduction`` is "mean" (default), "sum" or "none" (one loss per label).
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; choose one of {REDUCTIONS}")
    if not isinstance(labels, Tensor):
        labels = Tensor(labels, device=logits.device)
    if labels.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy labels must be integers (class indices); got dtype {labels.dtype}")
    if logits.ndim == 0 or labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"cross_entropy: logits of shape {logits.shape} need labels of shape {logits.shape[:-1]}; "
            f"got labels of shape {labels.shape}"
        )
    classes = logits.shape[-1]
    if classes == 0:
        raise ValueError(f"cross_entropy: logits of shape {logits.shape} have no classes (their last axis has size 0)")
    if labels.size == 0 and reduction == "mean":
        # Refused before NumPy computes anything: the mean of 0 losses is 0/0, and its backward would divide by
        # N = 0.  A sum of 0 losses is 0, and reduction="none" returns no losses: both are defined.
        raise ValueError(
            f"cross_entropy got an empty batch: logits of shape {logits.shape} and labels of shape {labels.shape} "
            "hold no examples, and the mean of no losses is undefined. Skip empty batches before the forward pass "
            "(if len(y) == 0: continue), or pass reduction='sum'"
        )
    if labels.size:  # checked; on a GPU the check is answered at the next read (backend.defer_check)
        checked = kernels.call("check_in_range", backend.check_in_range, labels.data, classes, "cross_entropy labels")
        labels = Tensor._make(checked, False, None)  # wrapped, not copied (Tensor() would copy)
    (logits,) = cast_inputs("cross_entropy", logits)
    return CrossEntropy.apply(logits, labels, reduction=reduction)
