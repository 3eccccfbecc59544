"""Engine room: FP16 x FP16 -> FP32-accumulate matrix products on the GPU, one cuBLAS GemmEx call each.

CuPy's own ``@`` does this for 2-D float16 arrays, but a 3-D float16 ``cupy.matmul``
upcasts to float32 and skips the Tensor Cores, and it cannot return a float32 result
without rounding through float16 first.  So tinyamp calls cuBLAS itself:
``cublasGemmEx`` (2-D) or ``cublasGemmStridedBatchedEx`` (batched) with float16
operands, ``CUBLAS_COMPUTE_32F`` (products summed in float32) and a float16 or float32
output, rounded once: the numerics of ``tinyamp.kernels.product``, which ``product`` here
answers for two float16 CuPy arrays.

Row-major arrays in a column-major library.  cuBLAS reads a matrix column by column; a
C-contiguous (rows, cols) array read that way is its transpose, (cols, rows), with leading
dimension ``cols``.  So the row-major product C = X Y is computed as the column-major
product C^T = Y^T X^T: pass Y first, X second, and swap m and n.  A transposed operand
(``W.T`` in a Linear's backward, ``k.swapaxes(-1, -2)`` in attention) is never copied:
it is the C-contiguous array under the view, with cuBLAS's transpose flag set.

``plan`` works the call out from shapes alone (it is tested on the CPU against a NumPy
reading of the column-major formula); ``matmul`` makes the call.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np

from tinyamp import backend
from tinyamp.engine.cuda.device import on_gpu

_FLOAT16, _FLOAT32 = np.dtype(np.float16), np.dtype(np.float32)


class Operand(NamedTuple):
    """A matrix operand as cuBLAS sees it: a C-contiguous stack of (rows, cols) matrices, maybe transposed."""

    array: Any  # shape (batch, rows, cols), C-contiguous in the last two axes
    transposed: bool  # the product uses array^T
    batch_stride: int  # elements from one matrix to the next; 0 when one matrix serves every batch entry


class GemmPlan(NamedTuple):
    """The arguments of one column-major cuBLAS call computing a row-major C = op(X) op(Y).

    cuBLAS computes C_cm (m x n) = op(A) op(B) with A = Y and B = X (see the module text).
    """

    trans_a: bool
    trans_b: bool
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    stride_a: int
    stride_b: int
    stride_c: int
    batch: int


def product(a: Any, b: Any, out_dtype: Any, bias: Any = None) -> Any:
    """``tinyamp.kernels.product`` on Tensor Cores for two float16 CuPy arrays; NotImplemented otherwise.

    Rows (or one vector) times one matrix, (..., K) @ (K, N), is one 2-D GemmEx on the
    flattened rows (a Linear); a bias is fused into such calls when it is no wider than the output.
    """
    if not (a.dtype == b.dtype == _FLOAT16 and np.dtype(out_dtype) in (_FLOAT16, _FLOAT32) and on_gpu(a, b)):
        return NotImplemented
    if bias is not None and (b.ndim != 2 or bias.dtype.itemsize > np.dtype(out_dtype).itemsize):
        return NotImplemented
    if b.ndim == 2 and a.ndim != 2:
        return matmul(a.reshape(-1, a.shape[-1]), b, out_dtype, bias).reshape(a.shape[:-1] + (b.shape[-1],))
    if a.ndim < 2 or b.ndim < 2:
        return NotImplemented
    return matmul(a, b, out_dtype, bias=bias)


def _matrix_stack(x: Any, batch_shape: tuple[int, ...]) -> Operand:
    """View `x` (..., r, c) as a C-contiguous (batch, rows, cols) stack, copying only when no view exists."""
    xp = backend.get_array_module(x)
    own_batch = x.shape[:-2]
    transposed = False
    if not x.flags.c_contiguous:
        swapped = x.swapaxes(-1, -2)
        if swapped.flags.c_contiguous:  # a transposed view of a contiguous array: use the flag
            x, transposed = swapped, True
        else:
            x = xp.ascontiguousarray(x)
    rows, cols = x.shape[-2:]
    if math.prod(own_batch) == 1:  # one matrix for every batch entry: stride 0
        return Operand(x.reshape(1, rows, cols), transposed, 0)
    if own_batch != batch_shape:  # a batch axis of size 1 or missing: broadcasting needs real copies
        if transposed:
            x, transposed = x.swapaxes(-1, -2), False
            rows, cols = cols, rows
        x = xp.ascontiguousarray(xp.broadcast_to(x, batch_shape + (rows, cols)))
    # the batch count, not -1: with rows * cols == 0 NumPy/CuPy cannot infer it
    return Operand(x.reshape(math.prod(batch_shape), rows, cols), transposed, rows * cols)


def _logical_shape(op: Operand) -> tuple[int, int]:
    rows, cols = op.array.shape[-2:]
    return (cols, rows) if op.transposed else (rows, cols)


def plan(x: Operand, y: Operand, batch: int) -> GemmPlan:
    """The cuBLAS arguments for C = op(X) op(Y): C is (batch, M, N) and row-major."""
    M, K = _logical_shape(x)
    K2, N = _logical_shape(y)
    if K != K2:
        raise ValueError(f"inner dimensions differ: {M}x{K} @ {K2}x{N}")
    return GemmPlan(
        trans_a=y.transposed,
        trans_b=x.transposed,
        m=N,
        n=M,
        k=K,
        lda=y.array.shape[-1],  # leading dimension: the stored row length
        ldb=x.array.shape[-1],
        ldc=N,
        stride_a=y.batch_stride,
        stride_b=x.batch_stride,
        stride_c=M * N,
        batch=batch,
    )


def operands(a: Any, b: Any) -> tuple[Operand, Operand, tuple[int, ...]]:
    """Both operands as matrix stacks over their broadcast batch shape, and that shape."""
    batch_shape = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    return _matrix_stack(a, batch_shape), _matrix_stack(b, batch_shape), batch_shape


def matmul(a: Any, b: Any, out_dtype: Any, bias: Any = None) -> Any:
    """a @ b for float16 CuPy arrays (float32 ones too, for sum_rows): FP32 accumulation, rounded once to `out_dtype`.

    `out_dtype` is float16 or float32.  With `bias` (shape (N,), 2-D products only) the
    output starts as the broadcast bias and cuBLAS adds the product to it (beta = 1)
    before its one rounding, as a fused GEMM epilogue does.
    """
    out_dtype = np.dtype(out_dtype)
    if out_dtype not in (_FLOAT16, _FLOAT32):
        raise ValueError(f"a Tensor Core product returns float16 or float32, not {out_dtype}")
    xp = backend.get_array_module(a)
    x, y, batch_shape = operands(a, b)
    batch = math.prod(batch_shape)
    p = plan(x, y, batch)
    out = xp.empty(batch_shape + (p.n, p.m), dtype=out_dtype)  # row-major (M, N)
    if 0 in (p.m, p.n, p.k, batch):  # nothing to multiply (and cuBLAS refuses a leading dimension of 0)
        out[...] = 0 if bias is None else bias
        return out
    beta = 0.0
    if bias is not None:
        if batch_shape:
            raise ValueError("a fused bias is supported for 2-D products only")
        out[...] = bias  # broadcast over the rows; cuBLAS adds alpha * A B to it
        beta = 1.0
    _call(p, y.array, x.array, out, beta)
    return out


_COMPUTE_32F_PEDANTIC = 69  # cublasComputeType_t: float32 products and sums, never TF32 whatever the math mode


def _call(p: GemmPlan, a: Any, b: Any, c: Any, beta: float) -> None:  # pragma: no cover - needs a GPU
    """One cuBLAS call: C_cm = A_cm B_cm (column-major names), FP16 (Tensor Cores) or FP32 in, FP32 compute."""
    cupy = backend.array_module("cuda")
    cublas, runtime = backend.cublas(), cupy.cuda.runtime
    handle = cupy.cuda.device.get_cublas_handle()
    # alpha and beta are read from host memory (CuPy's default pointer mode) during the call
    alpha_host, beta_host = np.array(1.0, np.float32), np.array(beta, np.float32)
    c_type = runtime.CUDA_R_16F if c.dtype == _FLOAT16 else runtime.CUDA_R_32F
    if a.dtype == _FLOAT16:
        ab_type, compute, algo = runtime.CUDA_R_16F, cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_GEMM_DEFAULT_TENSOR_OP
    else:  # float32 operands (sum_rows): plain FP32, even where CUPY_TF32 set the handle's math mode to TF32
        ab_type, compute, algo = runtime.CUDA_R_32F, _COMPUTE_32F_PEDANTIC, cublas.CUBLAS_GEMM_DEFAULT
    op = {False: cublas.CUBLAS_OP_N, True: cublas.CUBLAS_OP_T}
    common = (handle, op[p.trans_a], op[p.trans_b], p.m, p.n, p.k, alpha_host.ctypes.data)
    if p.batch == 1:
        cublas.gemmEx(
            *common,
            a.data.ptr, ab_type, p.lda,
            b.data.ptr, ab_type, p.ldb,
            beta_host.ctypes.data, c.data.ptr, c_type, p.ldc,
            compute, algo,
        )  # fmt: skip
    else:
        cublas.gemmStridedBatchedEx(
            *common,
            a.data.ptr, ab_type, p.lda, p.stride_a,
            b.data.ptr, ab_type, p.ldb, p.stride_b,
            beta_host.ctypes.data, c.data.ptr, c_type, p.ldc, p.stride_c,
            p.batch, compute, algo,
        )  # fmt: skip


@functools.lru_cache(maxsize=32)
def _ones(xp: Any, rows: int, dtype: str, device: int | None) -> Any:
    """A cached (1, rows) row of ones on `device` (kept: it is built once per bias shape)."""
    if device is None:
        return xp.ones((1, rows), dtype=dtype)
    with xp.cuda.Device(device):
        return xp.ones((1, rows), dtype=dtype)


def sum_rows(x: Any) -> Any:
    """``tinyamp.kernels.sum_rows`` for a 2-D float16 or float32 CuPy array: ones(1, R) @ x in one cuBLAS call.

    A reduction over axis 0 reads the rows with a stride; a product by a row of ones reads x
    once, at full bandwidth.  Each product x * 1 is exact and the sums are float32 (Tensor
    Cores for float16, plain FP32 for float32), as in the reference, but cuBLAS adds them in its
    own order: each column within 2 (R - 1) * 2^-24 of the sum of its |x| of the reference's.
    """
    if not (on_gpu(x) and x.ndim == 2 and x.dtype in (_FLOAT16, _FLOAT32) and 0 not in x.shape):
        return NotImplemented
    rows, cols = x.shape
    device = getattr(getattr(x, "device", None), "id", None)  # a CuPy array's GPU
    return matmul(_ones(backend.get_array_module(x), rows, x.dtype.str, device), x, _FLOAT32).reshape(cols)
