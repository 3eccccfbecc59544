"""The cuBLAS call plans for Tensor Core products, checked on the CPU.

cuBLAS is column-major; tinyamp's arrays are row-major.  These tests run each plan
through a NumPy reading of cuBLAS's formula, C_cm = op(A_cm) op(B_cm) with leading
dimensions and batch strides, on the raw buffers, and compare with ``np.matmul``.  So the
index arithmetic is tested everywhere; the GPU tests check the real calls.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import tensor_core_shape_pairs

from tinyamp.ops import cublas_gemm


def column_major(buffer: np.ndarray, offset: int, rows: int, cols: int, ld: int) -> np.ndarray:
    """The rows x cols column-major matrix at `offset` with leading dimension `ld` (a view)."""
    assert ld >= rows, "cuBLAS needs ld >= rows of the stored column-major matrix"
    item = buffer.itemsize
    return np.lib.stride_tricks.as_strided(buffer[offset:], shape=(rows, cols), strides=(item, ld * item))


def run_plan(p: cublas_gemm.GemmPlan, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What cuBLAS computes for plan `p` on buffers a (= A_cm) and b (= B_cm): the C buffer."""
    a_flat, b_flat = a.reshape(-1), b.reshape(-1)
    c = np.zeros(p.batch * p.stride_c, np.float64)
    for i in range(p.batch):
        stored_a = (p.k, p.m) if p.trans_a else (p.m, p.k)
        stored_b = (p.n, p.k) if p.trans_b else (p.k, p.n)
        op_a = column_major(a_flat, i * p.stride_a, *stored_a, p.lda)
        op_b = column_major(b_flat, i * p.stride_b, *stored_b, p.ldb)
        op_a, op_b = (op_a.T if p.trans_a else op_a), (op_b.T if p.trans_b else op_b)
        column_major(c, i * p.stride_c, p.m, p.n, p.ldc)[...] = op_a @ op_b
    return c


def product_by_plan(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    x, y, batch_shape = cublas_gemm.operands(a, b)
    batch = int(np.prod(batch_shape))
    p = cublas_gemm.plan(x, y, batch)
    c = run_plan(p, y.array, x.array)
    return c.reshape(batch_shape + (p.n, p.m))  # the C buffer read row-major: (M, N)


def maybe_transposed(rng: np.random.Generator, shape: tuple[int, ...], as_view: bool) -> np.ndarray:
    """A float64 array of `shape`, stored either plainly or as the transpose view of a contiguous array."""
    if not as_view or len(shape) < 2:
        return rng.standard_normal(shape)
    stored = rng.standard_normal(shape[:-2] + (shape[-1], shape[-2]))
    return stored.swapaxes(-1, -2)


@given(st.sampled_from(["2d", "batched", "broadcast"]).flatmap(tensor_core_shape_pairs), st.booleans(), st.booleans())
def test_plans_compute_the_row_major_product(shapes: tuple, a_view: bool, b_view: bool) -> None:
    rng = np.random.default_rng(0)
    a = maybe_transposed(rng, shapes[0], a_view)
    b = maybe_transposed(rng, shapes[1], b_view)
    np.testing.assert_allclose(product_by_plan(a, b), np.matmul(a, b), rtol=1e-12, atol=1e-12)


def test_transposed_views_become_flags_not_copies() -> None:
    w = np.ones((5, 3))  # a Linear's weight (out, in); forward reads W.T, backward W
    x, y, _ = cublas_gemm.operands(np.ones((4, 3)), w.T)
    assert y.transposed and np.shares_memory(y.array, w)
    k = np.ones((2, 4, 6, 8))  # attention's keys (B, H, T, D); scores use k^T
    _, kt, _ = cublas_gemm.operands(np.ones((2, 4, 6, 8)), k.swapaxes(-1, -2))
    assert kt.transposed and np.shares_memory(kt.array, k) and kt.batch_stride == 6 * 8


def test_a_single_matrix_serves_every_batch_entry_with_stride_zero() -> None:
    _, w, batch_shape = cublas_gemm.operands(np.ones((3, 4, 5)), np.ones((5, 2)))
    assert batch_shape == (3,) and w.batch_stride == 0 and w.array.shape == (1, 5, 2)


def test_only_float16_arrays_on_the_gpu_apply() -> None:
    a16 = np.ones((2, 2), np.float16)
    assert not cublas_gemm.applies(a16, a16)  # NumPy arrays: the emulation in matmul.py


def test_mismatched_inner_dimensions_are_refused() -> None:
    x, y, _ = cublas_gemm.operands(np.ones((2, 3)), np.ones((3, 4)))
    with pytest.raises(ValueError, match="inner dimensions differ"):
        cublas_gemm.plan(y, y, 1)


def test_empty_products_are_zeros_without_a_call() -> None:
    f16 = np.float16
    assert cublas_gemm.matmul(np.ones((0, 3), f16), np.ones((3, 4), f16), np.float32).shape == (0, 4)
    out = cublas_gemm.matmul(np.ones((2, 0), f16), np.ones((0, 3), f16), np.float16)
    assert out.dtype == np.float16 and np.array_equal(out, np.zeros((2, 3)))
    bias = np.array([1.0, 2.0, 3.0], f16)
    with_bias = cublas_gemm.matmul(np.ones((2, 0), f16), np.ones((0, 3), f16), np.float32, bias=bias)
    assert np.array_equal(with_bias, np.tile(bias.astype(np.float32), (2, 1)))
