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

import tinyamp as ta
from tinyamp.engine.cuda import gemm as cublas_gemm
from tinyamp.ops.matmul import MatMul

pytestmark = pytest.mark.engine_room


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
    assert cublas_gemm.product(a16, a16, np.float16) is NotImplemented  # NumPy arrays: kernels.product's reference


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
    # batched, with an empty matrix in each entry (a reshape with -1 cannot infer the batch there)
    batched = cublas_gemm.matmul(np.ones((2, 0, 5), f16), np.ones((2, 5, 3), f16), np.float16)
    assert batched.shape == (2, 0, 3)
    assert cublas_gemm.matmul(np.ones((3, 2, 0), f16), np.ones((0, 4), f16), np.float32).shape == (3, 2, 4)


# ---- the cuBLAS path of every product, run on the CPU through a NumPy stand-in for cuBLAS ------------
def fake_call(p: cublas_gemm.GemmPlan, a: np.ndarray, b: np.ndarray, c: np.ndarray, beta: float) -> None:
    """What one cuBLAS call would write into `c`: the column-major product (+ beta * c), rounded once."""
    wide = c.astype(np.float64) if beta else np.zeros(c.shape)
    product = run_plan(p, a.astype(np.float64), b.astype(np.float64))  # exact for the integer operands below
    c[...] = (product.reshape(c.shape) + beta * wide).astype(c.dtype)


@pytest.fixture
def cublas_on_numpy(monkeypatch: pytest.MonkeyPatch) -> list[cublas_gemm.GemmPlan]:
    """Route float16 NumPy products through engine/cuda/gemm.py, as CuPy arrays would be, with fake_call as cuBLAS.

    Returns the list of plans "sent to cuBLAS", so a test can check the GPU path really ran.
    """
    calls: list[cublas_gemm.GemmPlan] = []

    def call(p: cublas_gemm.GemmPlan, a: np.ndarray, b: np.ndarray, c: np.ndarray, beta: float) -> None:
        calls.append(p)
        fake_call(p, a, b, c, beta)

    monkeypatch.setattr(cublas_gemm, "on_gpu", lambda *arrays: all(isinstance(x, np.ndarray) for x in arrays))
    monkeypatch.setattr(cublas_gemm, "_call", call)
    return calls


def integers(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(-8, 9, size=shape).astype(np.float16)


@pytest.mark.parametrize(
    "a_shape, b_shape, gemm_calls",
    [
        ((3, 4), (4, 5), 3),
        ((2, 3, 4), (2, 4, 5), 3),
        ((2, 3, 4), (4, 5), 3),  # grad of the shared matrix: one product of flattened rows
        ((3, 4), (2, 4, 5), 4),  # grad of the shared matrix sums over the batch: float32 products, then their
        # sum over the batch, a product by a row of ones (kernels.sum_rows)
        ((2, 1, 3, 4), (1, 2, 4, 5), 3),  # both gradients sum over broadcast axes
    ],
)
def test_the_cublas_path_of_matmul_gives_the_references_bits(
    cublas_on_numpy: list, a_shape, b_shape, gemm_calls: int
) -> None:
    rng = np.random.default_rng(0)
    a, b = integers(rng, a_shape), integers(rng, b_shape)
    ta_a, ta_b = ta.tensor(a, requires_grad=True), ta.tensor(b, requires_grad=True)
    y = ta.matmul(ta_a, ta_b)
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y.numpy(), (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16))
    g = integers(rng, y.shape)
    y.backward(g)
    g64, a64, b64 = g.astype(np.float64), a.astype(np.float64), b.astype(np.float64)
    grad_a = g64 @ b64.swapaxes(-1, -2)
    grad_b = a64.swapaxes(-1, -2) @ g64
    for grad, shape, got in ((grad_a, a_shape, ta_a.grad), (grad_b, b_shape, ta_b.grad)):
        lead = grad.ndim - len(shape)
        grad = grad.sum(axis=tuple(range(lead)))
        grad = grad.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1), keepdims=True)
        assert got.dtype == np.float16
        np.testing.assert_array_equal(got, grad.astype(np.float16))
    # forward and both gradients through cuBLAS (a gradient summed over batch axes with a float32 output)
    assert len(cublas_on_numpy) == gemm_calls


@pytest.mark.parametrize("x_shape", [(6, 4), (2, 3, 4), (4,)])
def test_the_cublas_path_of_linear_fuses_the_bias_and_transposes_by_flag(cublas_on_numpy: list, x_shape) -> None:
    rng = np.random.default_rng(1)
    x, w, bias = integers(rng, x_shape), integers(rng, (5, 4)), integers(rng, (5,))
    tx, tw, tb = (ta.tensor(v, requires_grad=True) for v in (x, w, bias))
    y = ta.linear(tx, tw, tb)
    x64, w64 = x.astype(np.float64).reshape(-1, 4), w.astype(np.float64)
    expected = (x64 @ w64.T + bias.astype(np.float64)).reshape(x_shape[:-1] + (5,))
    np.testing.assert_array_equal(y.numpy(), expected.astype(np.float16))
    g = integers(rng, y.shape)
    y.backward(g)
    g64 = g.astype(np.float64).reshape(-1, 5)
    np.testing.assert_array_equal(tx.grad, (g64 @ w64).reshape(x_shape).astype(np.float16))
    np.testing.assert_array_equal(tw.grad, (g64.T @ x64).astype(np.float16))
    np.testing.assert_array_equal(tb.grad, g64.sum(axis=0).astype(np.float16))
    forward, grad_x, grad_w, grad_b = cublas_on_numpy  # all three products on cuBLAS, none copied, and the
    rows = g64.shape[0]  # bias's gradient: the sum of g's rows as ones(1, rows) @ g
    assert (grad_b.m, grad_b.n, grad_b.k) == (5, 1, rows) and not grad_b.trans_a and not grad_b.trans_b
    assert forward.trans_a and not forward.trans_b  # W.T read through the transpose flag
    assert not grad_x.trans_a and not grad_x.trans_b
    if len(x_shape) > 1:  # g.T @ x reads g through its flag (the transpose of one row is contiguous as it is)
        assert grad_w.trans_b


def test_a_float32_result_is_rounded_once_not_through_float16(cublas_on_numpy: list) -> None:
    a, b = np.array([[2048.0, 1.0]], np.float16), np.array([[1.0], [1.0]], np.float16)
    y = MatMul.apply(ta.tensor(a), ta.tensor(b), out_dtype=np.float32)
    assert y.dtype == np.float32 and y.item() == 2049.0 and len(cublas_on_numpy) == 1
