"""Matrix products: ``matmul`` (2-D and batched) and ``linear`` ($x W^T + b$).

For $C = A B$: $\\partial L/\\partial A = G B^T$ and $\\partial L/\\partial B = A^T G$.
When A is a batch of rows (shape (..., K)) and B a single matrix (K, N), the
gradient of B sums over the batch; flattening the batch into rows turns that sum into
one matrix product, (B*T, K)^T @ (B*T, N), instead of B products and a sum.

Tensor Core numerics for 16-bit operands: the product of two float16 values has at
most 22 significant bits, so it is exact in float32 (24 bits); products are summed in
float32 and the result is rounded once.  On NumPy this is done literally: widen both
operands to float32, call sgemm, round the result.  (NumPy's own float16 matmul is a
non-BLAS loop 260-540x slower than sgemm; it is never called.)  On CuPy, float16
products are single cuBLAS GemmEx calls on Tensor Cores (cublas_gemm.py), with the
transposes of backward passed as flags, not copies.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyamp import dtypes
from tinyamp.autograd import Function
from tinyamp.backend import DeviceError
from tinyamp.ops import cublas_gemm
from tinyamp.ops.broadcasting import accumulation_dtype, unbroadcast
from tinyamp.ops.casting import autocast_inputs, autocast_output_dtype, convert
from tinyamp.tensor import Tensor

_FLOAT32 = np.dtype(np.float32)


def _swap(x: Any) -> Any:
    """Transpose the last two axes (a view: BLAS reads it through its transpose flag)."""
    return x.swapaxes(-1, -2)


def _rows(x: Any) -> Any:
    """(..., K) -> (prod(...), K): a batch of vectors as one matrix."""
    return x.reshape(-1, x.shape[-1])


def _wide(x: Any) -> Any:
    """16-bit floats widened to float32 (exact); anything else unchanged."""
    return convert(x, _FLOAT32) if x.dtype.itemsize == 2 else x


def accumulate_product(a: Any, b: Any) -> Any:
    """a @ b with 16-bit operands widened: FP32 accumulation, the result left unrounded."""
    return _wide(a) @ _wide(b)


class MatMul(Function):
    """$C = A B$ over the last two axes, broadcasting the leading (batch) axes."""

    def forward(self, a: Any, b: Any, out_dtype: Any = None) -> Any:
        self.save_for_backward(a, b)
        out_dtype = out_dtype or np.result_type(a, b)
        if cublas_gemm.applies(a, b):
            return cublas_gemm.matmul(a, b, out_dtype)
        return convert(accumulate_product(a, b), out_dtype)

    def backward(self, g: Any) -> tuple[Any, Any]:
        a, b = self.saved
        need_a, need_b = self.needs_input_grad
        grad_a = grad_b = None
        if need_a:
            grad_a = _gradient_product(g, _swap(b), a)
        if need_b:
            if b.ndim == 2 and a.ndim > 2:  # the batch sum as one product of flattened rows
                grad_b = _gradient_product(_rows(a).T, _rows(g), b)
            else:
                grad_b = _gradient_product(_swap(a), g, b)
        return grad_a, grad_b


def _gradient_product(x: Any, y: Any, like: Any) -> Any:
    """x @ y summed over the batch axes `like` was broadcast along, rounded once to like's dtype."""
    if cublas_gemm.applies(x, y) and np.broadcast_shapes(x.shape[:-2], y.shape[:-2]) == like.shape[:-2]:
        return cublas_gemm.matmul(x, y, like.dtype)  # no batch sum: cuBLAS rounds to the dtype itself
    return unbroadcast(accumulate_product(x, y), like.shape, like.dtype)


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
        if out_dtype is None:
            out_dtype = np.result_type(x, weight) if bias is None else np.result_type(x, weight, bias)
        rows = _rows(x)
        if cublas_gemm.applies(rows, weight) and (bias is None or bias.dtype.itemsize <= np.dtype(out_dtype).itemsize):
            out = cublas_gemm.matmul(rows, weight.T, out_dtype, bias=bias)  # W.T: a transpose flag
            return out.reshape(x.shape[:-1] + (weight.shape[0],))
        out = _wide(x) @ _wide(weight).T
        if bias is not None:
            if bias.dtype.itemsize <= out.dtype.itemsize:
                out += bias  # in place: no second (batch, out) array
            else:
                out = out + bias  # a wider bias promotes, as x @ W.T + b would
        return convert(out, out_dtype)

    def backward(self, g: Any) -> tuple[Any, ...]:
        x, weight = self.saved
        needs = self.needs_input_grad
        g_rows = None  # on NumPy: the rows of g, 16-bit ones widened to float32 for the products
        if cublas_gemm.applies(_rows(g), weight) and x.dtype == g.dtype:
            grad_x = cublas_gemm.matmul(_rows(g), weight, x.dtype).reshape(x.shape) if needs[0] else None
            grad_w = cublas_gemm.matmul(_rows(g).T, _rows(x), weight.dtype) if needs[1] else None
        else:
            g_rows = _wide(_rows(g))  # widened once, read by both products
            grad_x = convert((g_rows @ _wide(weight)).reshape(x.shape), x.dtype) if needs[0] else None
            grad_w = convert(g_rows.T @ _wide(_rows(x)), weight.dtype) if needs[1] else None
        if self.bias_dtype is None:
            return grad_x, grad_w
        grad_b = None
        if needs[2]:
            # On NumPy, sum the rows already widened for the products: NumPy's own float16 ->
            # float32 cast inside sum(dtype=float32) costs twice as much, for the same bits.
            rows = _rows(g) if g_rows is None else g_rows
            grad_b = rows.sum(axis=0, dtype=accumulation_dtype(g.dtype)).astype(self.bias_dtype, copy=False)
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
        return MatMul.apply(a, b, out_dtype=autocast_output_dtype("matmul"))
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
    if not dtypes.is_floating(x.dtype):
        raise TypeError(f"linear needs a floating-point input; got {x.dtype} (convert it with x.astype('float32'))")
    out_dtype = autocast_output_dtype("linear")
    if bias is None:
        x, weight = autocast_inputs("linear", x, weight)
        return Linear.apply(x, weight, out_dtype=out_dtype)
    x, weight, bias = autocast_inputs("linear", x, weight, bias)
    return Linear.apply(x, weight, bias, out_dtype=out_dtype)
