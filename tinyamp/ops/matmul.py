"""Matrix products: ``matmul`` (2-D and batched) and ``linear`` ($x W^T + b$).

For $C = A B$: $\\partial L/\\partial A = G B^T$ and $\\partial L/\\partial B = A^T G$.
When A is a batch of rows (shape (..., K)) and B a single matrix (K, N), the gradient of
B sums over the batch; flattening the batch into rows turns that sum into one matrix
product, (B*T, K)^T @ (B*T, N), instead of B products and a sum.

Every product, forward and backward, is ``kernels.product``: with 16-bit operands, FP16
x FP16 -> FP32 accumulate, rounded once.  That is a model of Tensor Core numerics, not
the hardware's bits: the products are exact, as on a Tensor Core, but the FP32 sums are
sgemm's, in one order and each correctly rounded, where a Tensor Core adds in adder trees
of its own order, with alignment that can truncate low bits rather than round them, so a
GPU's results can differ in the last bits (Fasi et al. 2021).  A gradient summed over
batch axes is summed from the FP32 products and rounded once, after the sum.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyamp import dtypes, kernels
from tinyamp.autocast import cast_inputs, output_dtype
from tinyamp.backend import DeviceError
from tinyamp.function import Function
from tinyamp.ops.arithmetic import operands
from tinyamp.ops.broadcasting import unbroadcast
from tinyamp.tensor import Tensor, takes_a_tensor


def _swap(x: Any) -> Any:
    """Transpose the last two axes (a view: BLAS reads it through its transpose flag)."""
    return x.swapaxes(-1, -2)


def _rows(x: Any) -> Any:
    """(..., K) -> (prod(...), K): a batch of vectors as one matrix."""
    return x.reshape(-1, x.shape[-1])


class MatMul(Function):
    """$C = A B$ over the last two axes, broadcasting the leading (batch) axes."""

    def forward(self, a: Any, b: Any, out_dtype: Any = None) -> Any:
        self.save_for_backward(a, b)
        return kernels.product(a, b, out_dtype or np.result_type(a, b))

    def backward(self, g: Any) -> tuple[Any, Any]:
        a, b = self.saved
        need_a, need_b = self.needs_input_grad
        grad_a = _gradient_product(g, _swap(b), like=a) if need_a else None
        if need_b and b.ndim == 2 and a.ndim > 2:  # the batch sum as one product of flattened rows
            grad_b = _gradient_product(_rows(a).T, _rows(g), like=b)
        else:
            grad_b = _gradient_product(_swap(a), g, like=b) if need_b else None
        return grad_a, grad_b


def _gradient_product(x: Any, y: Any, like: Any) -> Any:
    """x @ y summed over the batch axes `like` was broadcast along, rounded once to like's dtype."""
    if np.broadcast_shapes(x.shape[:-2], y.shape[:-2]) == like.shape[:-2]:
        return kernels.product(x, y, like.dtype)  # no batch sum
    return unbroadcast(kernels.product(x, y, dtypes.accumulation_dtype(like.dtype)), like.shape, like.dtype)


class Linear(Function):
    """$y = x W^T + b$ with W of shape (out, in), as in ``torch.nn.Linear``.

    $\\partial L/\\partial x = G W$, $\\partial L/\\partial W = G^T x$ and
    $\\partial L/\\partial b = \\sum_{rows} G$ (accumulated in float32 for float16).
    With 16-bit operands the bias is added to the float32 accumulator and the sum is
    rounded once, as a GPU's fused GEMM epilogue does.
    """

    def forward(self, x: Any, weight: Any, bias: Any = None, out_dtype: Any = None) -> Any:
        self.save_for_backward(x, weight)
        self.bias_dtype = None if bias is None else bias.dtype
        out_dtype = out_dtype or np.result_type(*(a for a in (x, weight, bias) if a is not None))
        return kernels.product(x, weight.T, out_dtype, bias)  # W.T: a view, read with a BLAS transpose flag

    def backward(self, g: Any) -> tuple[Any, ...]:
        x, weight = self.saved
        need_x, need_w, *need_b = self.needs_input_grad
        rows = _rows(g)
        grad_x = kernels.product(rows, weight, x.dtype).reshape(x.shape) if need_x else None
        grad_w = kernels.product(rows.T, _rows(x), weight.dtype) if need_w else None
        if self.bias_dtype is None:
            return grad_x, grad_w
        grad_b = kernels.sum_rows(rows).astype(self.bias_dtype, copy=False) if need_b[0] else None
        return grad_x, grad_w, grad_b


def _shape_error(a: Tensor, b: Tensor) -> ValueError:
    inner = b.shape[-2] if b.ndim > 1 else b.shape[0]
    return ValueError(
        f"matmul shapes do not match: {a.shape} @ {b.shape}; the last axis of the left operand "
        f"({a.shape[-1]}) must equal the second-to-last axis of the right one ({inner})"
    )


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product over the last two axes, with NumPy's rules (1-D operands as vectors)."""
    a, b = operands(a, b, "matmul")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(
            f"matmul needs tensors with at least one axis; got shapes {a.shape} and {b.shape} (use * for scalars)"
        )
    if a.shape[-1] != (b.shape[-2] if b.ndim > 1 else b.shape[0]):
        raise _shape_error(a, b)
    if a.ndim == 1 and b.ndim == 1:  # vector . vector: a 0-d dot product, as in NumPy
        return matmul(a.reshape(1, -1), b.reshape(-1, 1)).reshape(())
    if a.ndim == 1:  # a vector on the left is a one-row matrix
        return matmul(a.reshape(1, -1), b).reshape(b.shape[:-2] + b.shape[-1:])
    if b.ndim == 1:  # a vector on the right is a one-column matrix
        return matmul(a, b.reshape(-1, 1)).reshape(a.shape[:-1])
    try:
        return MatMul.apply(a, b, out_dtype=output_dtype("matmul"))
    except ValueError:  # batch axes that do not broadcast
        raise ValueError(f"matmul batch axes do not broadcast: {a.shape} @ {b.shape}") from None


@takes_a_tensor(what="a Linear layer's input")
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
    if not dtypes.is_floating(x.dtype):
        raise TypeError(f"linear needs a floating-point input; got {x.dtype} (convert it with x.astype('float32'))")
    if bias is None:
        return Linear.apply(*cast_inputs("linear", x, weight), out_dtype=output_dtype("linear"))
    return Linear.apply(*cast_inputs("linear", x, weight, bias), out_dtype=output_dtype("linear"))
