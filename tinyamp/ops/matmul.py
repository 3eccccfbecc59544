"""Matrix products: ``matmul`` (2-D and batched) and ``linear`` ($x W^T + b$).

For $C = A B$: $\\partial L/\\partial A = G B^T$ and $\\partial L/\\partial B = A^T G$.
When A is a batch of rows (shape (..., K)) and B a single matrix (K, N), the
gradient of B sums over the batch; flattening the batch into rows turns that sum into
one matrix product, (B*T, K)^T @ (B*T, N), instead of B products and a sum.
"""

from __future__ import annotations

from typing import Any

from tinyamp.autograd import Function
from tinyamp.backend import DeviceError
from tinyamp.ops.broadcasting import accumulation_dtype, unbroadcast
from tinyamp.tensor import Tensor


def _swap(x: Any) -> Any:
    """Transpose the last two axes (a view: BLAS reads it through its transpose flag)."""
    return x.swapaxes(-1, -2)


def _rows(x: Any) -> Any:
    """(..., K) -> (prod(...), K): a batch of vectors as one matrix."""
    return x.reshape(-1, x.shape[-1])


class MatMul(Function):
    """$C = A B$ over the last two axes, broadcasting the leading (batch) axes."""

    def forward(self, a: Any, b: Any) -> Any:
        self.save_for_backward(a, b)
        return a @ b

    def backward(self, g: Any) -> tuple[Any, Any]:
        a, b = self.saved
        need_a, need_b = self.needs_input_grad
        grad_a = grad_b = None
        if need_a:
            grad_a = unbroadcast(g @ _swap(b), a.shape, a.dtype)
        if need_b:
            if b.ndim == 2 and a.ndim > 2:
                grad_b = (_rows(a).T @ _rows(g)).astype(b.dtype, copy=False)
            else:
                grad_b = unbroadcast(_swap(a) @ g, b.shape, b.dtype)
        return grad_a, grad_b


class Linear(Function):
    """$y = x W^T + b$ with W of shape (out, in), as in ``torch.nn.Linear``.

    $\\partial L/\\partial x = G W$, $\\partial L/\\partial W = G^T x$ and
    $\\partial L/\\partial b = \\sum_{rows} G$ (accumulated in float32 for float16).
    """

    def forward(self, x: Any, weight: Any, bias: Any = None) -> Any:
        self.save_for_backward(x, weight)
        self.bias_dtype = None if bias is None else bias.dtype
        out = x @ weight.T
        if bias is not None:
            if bias.dtype == out.dtype:
                out += bias  # in place: no second (batch, out) array
            else:
                out = out + bias  # promote as x @ W.T + b would (float16 + float32 -> float32)
        return out

    def backward(self, g: Any) -> tuple[Any, ...]:
        x, weight = self.saved
        needs = self.needs_input_grad
        grad_x = (g @ weight).astype(x.dtype, copy=False) if needs[0] else None
        grad_w = (_rows(g).T @ _rows(x)).astype(weight.dtype, copy=False) if needs[1] else None
        if self.bias_dtype is None:
            return grad_x, grad_w
        grad_b = None
        if needs[2]:
            grad_b = _rows(g).sum(axis=0, dtype=accumulation_dtype(g.dtype))
            grad_b = grad_b.astype(self.bias_dtype, copy=False)
        return grad_x, grad_w, grad_b


def _shape_error(a: Tensor, b: Tensor) -> ValueError:
    inner = b.shape[-2] if b.ndim > 1 else b.shape[0]
    return ValueError(
        f"matmul shapes do not match: {a.shape} @ {b.shape}; the last axis of the left operand "
        f"({a.shape[-1]}) must equal the second-to-last axis of the right one ({inner})"
    )


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product over the last two axes, with NumPy's rules (1-D operands as vectors)."""
    from tinyamp.ops.arithmetic import operands

    a, b = operands(a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(
            f"matmul needs tensors with at least one axis; got shapes {a.shape} and {b.shape} (use * for scalars)"
        )
    if a.shape[-1] != (b.shape[-2] if b.ndim > 1 else b.shape[0]):
        raise _shape_error(a, b)
    if a.ndim == 1:  # a vector on the left is a one-row matrix (vector @ vector is a 0-d dot product)
        return matmul(a.reshape(1, -1), b).reshape(b.shape[:-2] + b.shape[-1:] if b.ndim > 1 else ())
    if b.ndim == 1:  # a vector on the right is a one-column matrix
        return matmul(a, b.reshape(-1, 1)).reshape(a.shape[:-1])
    try:
        return MatMul.apply(a, b)
    except ValueError:  # batch axes that do not broadcast
        raise ValueError(f"matmul batch axes do not broadcast: {a.shape} @ {b.shape}") from None


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """$x W^T + b$: x (..., in), W (out, in), b (out,)."""
    if weight.ndim != 2:
        raise ValueError(f"linear needs a 2-D weight (out, in); got shape {weight.shape}")
    if x.ndim == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"linear: input of shape {x.shape} does not fit a weight of shape {weight.shape} "
            f"(out={weight.shape[0]}, in={weight.shape[1]}): the input's last axis must be {weight.shape[1]}"
        )
    for t in (weight, bias):
        if t is not None and t.device != x.device:
            raise DeviceError(
                f"linear: input on {x.device} but a parameter on {t.device}; move the model with model.to('{x.device}')"
            )
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(
            f"linear: bias of shape {bias.shape} does not fit a weight of shape {weight.shape}; "
            f"it must be ({weight.shape[0]},)"
        )
    if bias is None:
        return Linear.apply(x, weight)
    return Linear.apply(x, weight, bias)
