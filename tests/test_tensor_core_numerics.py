"""tinyamp's model of Tensor Core numerics for 16-bit operands, and ReLU's exactness in 16 bits.

The emulation rule: a product of two float16 values has at most 22 significant bits, so
it is exact in float32; the products are summed in float32 and the sum is rounded to
float16 once.  On NumPy: widen both operands to float32, call sgemm, round the result.
Every check here is bit-exact, against a NumPy reference written out by hand.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import half_arrays, half_floats, integer_half_arrays, linear_shapes, tensor_core_shape_pairs

import tinyamp as ta
from tinyamp.backend import to_device
from tinyamp.ops.matmul import MatMul

try:
    import ml_dtypes
except ImportError:  # bfloat16 is optional
    ml_dtypes = None

pytestmark = pytest.mark.tensor_cores

needs_ml_dtypes = pytest.mark.skipif(ml_dtypes is None, reason="bfloat16 needs the optional package ml_dtypes")

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
SIXTEEN_BIT = [F16] + ([np.dtype(ml_dtypes.bfloat16)] if ml_dtypes is not None else [])


def bits(array: Any) -> np.ndarray:
    """The bit patterns of an array: equality of these is bit-exactness (-0.0 != 0.0, NaN payloads)."""
    array = np.asarray(array)
    return np.ascontiguousarray(array).view(f"u{array.dtype.itemsize}")


def assert_bits_equal(actual: Any, expected: Any, zero_sign: bool = True) -> None:
    """Same dtype, shape and bits.  ``zero_sign=False`` counts -0 and +0 as equal: a sum whose
    terms are all -0 (products like -3 * 0) is -0 if a BLAS starts from the first product and
    +0 if it starts from an accumulator of 0, and both are correct."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if not zero_sign:
        actual, expected = actual + actual.dtype.type(0), expected + expected.dtype.type(0)  # -0 + 0 is +0
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_array_equal(bits(actual), bits(expected))


def emulate(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Tensor Core numerics by hand: widen, multiply-accumulate in float32, round once."""
    return (a.astype(F32) @ b.astype(F32)).astype(a.dtype)


def unbroadcast_ref(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum `g` down to `shape` over the broadcast axes (leading ones and size-1 ones)."""
    g = g.sum(axis=tuple(range(g.ndim - len(shape))))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True)


def leaf(array: np.ndarray) -> ta.Tensor:
    return ta.tensor(array, requires_grad=True)


# ---- forward -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["2d", "batched", "broadcast"])
@given(data=st.data())
def test_float16_matmul_is_float32_accumulation_rounded_once(kind: str, data: st.DataObject) -> None:
    a_shape, b_shape = data.draw(tensor_core_shape_pairs(kind))
    a, b = data.draw(half_arrays(a_shape, -8.0, 8.0)), data.draw(half_arrays(b_shape, -8.0, 8.0))
    y = ta.matmul(ta.tensor(a), ta.tensor(b))
    assert y.dtype == F16
    assert_bits_equal(y.numpy(), emulate(a, b))


@given(a=half_floats(allow_infinity=False), b=half_floats(allow_infinity=False))
def test_a_product_of_two_float16_values_is_exact_in_float32(a: float, b: float) -> None:
    assert float(np.float32(a) * np.float32(b)) == a * b  # a * b in float64 is exact too (22 bits)


def test_4096_ones_sum_to_4096_where_a_float16_running_sum_stalls_at_2048() -> None:
    a, b = np.ones((1, 4096), F16), np.ones((4096, 1), F16)
    assert ta.matmul(ta.tensor(a), ta.tensor(b)).item() == 4096.0
    running = np.cumsum(a[0], dtype=F16)  # a float16 accumulator: 2048 + 1 is a tie, rounded back to 2048
    assert running[-1] == 2048.0


class NoHalfMatmul(np.ndarray):
    """An array that fails any matmul with a 16-bit operand (NumPy's float16 matmul is a slow
    loop, not BLAS; the emulation must never reach it) and records the dtypes of the others."""

    calls: list[tuple[np.dtype, ...]] = []

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if ufunc is np.matmul:
            dtypes = tuple(np.asarray(x).dtype for x in inputs)
            if any(d.itemsize == 2 for d in dtypes):
                raise AssertionError(f"a matmul on 16-bit operands: {dtypes}")
            NoHalfMatmul.calls.append(dtypes)
        plain = tuple(x.view(np.ndarray) if isinstance(x, NoHalfMatmul) else x for x in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, NoHalfMatmul) else o for o in kwargs["out"])
        return getattr(ufunc, method)(*plain, **kwargs)


def probe(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(F16).view(NoHalfMatmul)


def probe_leaf(shape: tuple[int, ...], seed: int) -> ta.Tensor:
    return ta.Tensor._make(probe(shape, seed), True, None)


def test_numpy_float16_matmul_is_never_called() -> None:
    with pytest.raises(AssertionError, match="16-bit"):  # the probe itself works
        probe((2, 3), 0) @ probe((3, 2), 1)
    NoHalfMatmul.calls = []
    a, b = probe_leaf((2, 3, 4), 0), probe_leaf((4, 5), 1)
    ta.matmul(a, b).backward(probe((2, 3, 5), 2))  # forward, grad of a, grad of b
    x, w, bias = probe_leaf((3, 4), 3), probe_leaf((2, 4), 4), probe_leaf((2,), 5)
    ta.linear(x, w, bias).backward(probe((3, 2), 6))  # forward, grad of x, grad of w
    assert NoHalfMatmul.calls == [(F32, F32)] * 6
    assert a.grad.dtype == b.grad.dtype == x.grad.dtype == w.grad.dtype == bias.grad.dtype == F16


@given(shapes=linear_shapes(), data=st.data())
def test_float16_linear_adds_the_bias_in_float32_and_rounds_once(shapes, data: st.DataObject) -> None:
    x_shape, w_shape = shapes
    x, w = data.draw(half_arrays(x_shape, -8.0, 8.0)), data.draw(half_arrays(w_shape, -8.0, 8.0))
    b = data.draw(half_arrays((w_shape[0],), -8.0, 8.0))
    y = ta.linear(ta.tensor(x), ta.tensor(w), ta.tensor(b))
    expected = (x.astype(F32) @ w.astype(F32).T + b.astype(F32)).astype(F16)
    assert_bits_equal(y.numpy(), expected)
    assert_bits_equal(ta.linear(ta.tensor(x), ta.tensor(w)).numpy(), (x.astype(F32) @ w.astype(F32).T).astype(F16))


def test_the_bias_is_added_before_the_single_rounding() -> None:
    # x W^T = 2048 + 1 = 2049 in float32; + bias 1 = 2050, a float16 value: rounded once, 2050.
    # Rounded twice: 2049 -> 2048 (a tie, to the even 2048), then 2048 + 1 -> 2048 again.
    x, w, b = np.array([[1.0, 1.0]], F16), np.array([[2048.0, 1.0]], F16), np.array([1.0], F16)
    y = ta.linear(ta.tensor(x), ta.tensor(w), ta.tensor(b))
    assert y.dtype == F16 and y.item() == 2050.0
    twice = (x.astype(F32) @ w.astype(F32).T).astype(F16) + b
    assert twice.item() == 2048.0


@needs_ml_dtypes
@given(pair=tensor_core_shape_pairs("broadcast"), shapes=linear_shapes(), data=st.data())
def test_bfloat16_products_follow_the_same_emulation(pair, shapes, data: st.DataObject) -> None:
    bf16 = np.dtype(ml_dtypes.bfloat16)

    def draw(shape: tuple[int, ...]) -> np.ndarray:
        return data.draw(half_arrays(shape, -8.0, 8.0)).astype(F32).astype(bf16)

    a, b = draw(pair[0]), draw(pair[1])
    y = ta.matmul(ta.tensor(a), ta.tensor(b))
    assert y.dtype == bf16
    assert_bits_equal(y.numpy(), emulate(a, b))
    x, w, bias = draw(shapes[0]), draw(shapes[1]), draw(shapes[1][:1])
    z = ta.linear(ta.tensor(x), ta.tensor(w), ta.tensor(bias))
    assert_bits_equal(z.numpy(), (x.astype(F32) @ w.astype(F32).T + bias.astype(F32)).astype(bf16))


# ---- backward ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["2d", "batched", "broadcast"])
@given(data=st.data())
def test_float16_matmul_gradients_are_the_same_emulation(kind: str, data: st.DataObject) -> None:
    # Integer operands: every float32 sum is exact in any order, so the only rounding in the
    # reference is the final one, and summation order (sgemm blocking, batch sums) cannot matter.
    a_shape, b_shape = data.draw(tensor_core_shape_pairs(kind))
    a, b = data.draw(integer_half_arrays(a_shape)), data.draw(integer_half_arrays(b_shape))
    g = data.draw(integer_half_arrays(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], b_shape[-1])))
    ta_a, ta_b = leaf(a), leaf(b)
    ta.matmul(ta_a, ta_b).backward(g)
    a64, b64, g64 = a.astype(F64), b.astype(F64), g.astype(F64)
    assert_bits_equal(ta_a.grad, unbroadcast_ref(g64 @ b64.swapaxes(-1, -2), a_shape).astype(F16))
    assert_bits_equal(ta_b.grad, unbroadcast_ref(a64.swapaxes(-1, -2) @ g64, b_shape).astype(F16))


@given(shapes=linear_shapes(), data=st.data())
def test_float16_linear_gradients_are_the_same_emulation(shapes, data: st.DataObject) -> None:
    x_shape, w_shape = shapes
    x, w = data.draw(integer_half_arrays(x_shape)), data.draw(integer_half_arrays(w_shape))
    b = data.draw(integer_half_arrays((w_shape[0],)))
    g = data.draw(integer_half_arrays(x_shape[:-1] + (w_shape[0],)))
    tx, tw, tb = leaf(x), leaf(w), leaf(b)
    ta.linear(tx, tw, tb).backward(g)
    x64, w64 = x.astype(F64).reshape(-1, x_shape[-1]), w.astype(F64)
    g64 = g.astype(F64).reshape(-1, w_shape[0])
    assert_bits_equal(tx.grad, (g64 @ w64).reshape(x_shape).astype(F16))
    assert_bits_equal(tw.grad, (g64.T @ x64).astype(F16))
    assert_bits_equal(tb.grad, g64.sum(axis=0).astype(F16))


def test_gradient_sums_are_rounded_once_not_per_term() -> None:
    # dW = g^T x over two rows: 2048 + 1 + 1 = 2050 in float32, a float16 value.  Rounding
    # after each term would give 2048 (2048 + 1 is a tie that goes back to the even 2048).
    x = leaf(np.array([[2048.0], [1.0], [1.0]], F16))
    w = leaf(np.array([[1.0]], F16))
    ta.linear(x, w).backward(np.ones((3, 1), F16))
    assert w.grad.dtype == F16 and w.grad[0, 0] == 2050.0
    a, b = leaf(np.array([[2048.0, 1.0, 1.0]], F16)), leaf(np.ones((3, 1), F16))
    ta.matmul(a, b).backward(np.ones((1, 1), F16))
    assert ta.matmul(a.detach(), b.detach()).item() == 2050.0


# ---- ReLU keeps NaN (an overflow must reach the scaler) and is exact in 16 bits --------------------
def all_patterns(dtype: np.dtype) -> np.ndarray:
    return np.arange(65536, dtype=np.uint16).view(dtype)


def test_a_nan_output_blocks_the_gradient_in_float16_as_in_float32() -> None:
    nans = np.array([0x7E00, 0xFE00, 0x7C01, 0xFFFF], np.uint16).view(F16)  # both signs, several payloads
    for dtype in (F16, F32):
        x = leaf(np.concatenate([nans, np.array([1.0, -1.0], F16)]).astype(dtype))
        y = ta.relu(x)
        assert np.isnan(y.numpy()[:4]).all()
        y.backward(np.full(6, 3.0, dtype))
        np.testing.assert_array_equal(x.grad, np.array([0, 0, 0, 0, 3, 0], dtype))


@given(g=half_arrays((1024,), -1000.0, 1000.0))
def test_relu_on_float16_is_the_float32_relu_rounded(g: np.ndarray) -> None:
    x = all_patterns(F16)
    x = x[~np.isnan(x.astype(F32))][: 64 * 1024 - 2048]  # every non-NaN value (infs included) ...
    g = np.resize(g, x.shape)  # ... against finite gradients
    t = leaf(x)
    y = ta.relu(t)
    y.backward(g)
    x32, g32 = x.astype(F32), g.astype(F32)
    expected_y = np.maximum(x32, 0).astype(F16)
    np.testing.assert_array_equal(y.numpy(), expected_y)  # equal values (-0.0 == 0.0: see the test above)
    expected_g = (g32 * (np.maximum(x32, 0) > 0)).astype(F16)
    np.testing.assert_array_equal(t.grad, expected_g)  # equal values; a blocked -0.0 gradient becomes +0.0
    nonzero = expected_g != 0
    assert_bits_equal(t.grad[nonzero], expected_g[nonzero])


# ---- the same numerics on every device ------------------------------------------------------------------
# Integer operands keep every float32 sum exact in any order, so cuBLAS (which sums in its
# own order, on Tensor Cores) must give the very bits of the emulation: one rounding, at the end.
def on(device: str, array: np.ndarray) -> ta.Tensor:
    return ta.tensor(array, requires_grad=True, device=device)


def host_grad(t: ta.Tensor) -> np.ndarray:
    return to_device(t.grad, "cpu")


@pytest.mark.parametrize("kind", ["2d", "batched", "broadcast"])
@given(data=st.data())
def test_float16_matmul_and_gradients_match_the_emulation_on_each_device(
    device: str, kind: str, data: st.DataObject
) -> None:
    a_shape, b_shape = data.draw(tensor_core_shape_pairs(kind))
    a, b = data.draw(integer_half_arrays(a_shape)), data.draw(integer_half_arrays(b_shape))
    out_shape = np.broadcast_shapes(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], b_shape[-1])
    g = data.draw(integer_half_arrays(out_shape))
    ta_a, ta_b = on(device, a), on(device, b)
    y = ta.matmul(ta_a, ta_b)
    assert y.device == device and y.dtype == F16
    assert_bits_equal(y.numpy(), emulate(a, b), zero_sign=False)
    y.backward(ta.tensor(g, device=device))
    a64, b64, g64 = a.astype(F64), b.astype(F64), g.astype(F64)
    grad_a = unbroadcast_ref(g64 @ b64.swapaxes(-1, -2), a_shape).astype(F16)
    grad_b = unbroadcast_ref(a64.swapaxes(-1, -2) @ g64, b_shape).astype(F16)
    assert_bits_equal(host_grad(ta_a), grad_a, zero_sign=False)
    assert_bits_equal(host_grad(ta_b), grad_b, zero_sign=False)


@given(shapes=linear_shapes(), data=st.data())
def test_float16_linear_matches_the_emulation_on_each_device(device: str, shapes, data: st.DataObject) -> None:
    x_shape, w_shape = shapes
    x, w = data.draw(integer_half_arrays(x_shape)), data.draw(integer_half_arrays(w_shape))
    b = data.draw(integer_half_arrays((w_shape[0],)))
    g = data.draw(integer_half_arrays(x_shape[:-1] + (w_shape[0],)))
    tx, tw, tb = on(device, x), on(device, w), on(device, b)
    y = ta.linear(tx, tw, tb)
    x64, w64 = x.astype(F64).reshape(-1, x_shape[-1]), w.astype(F64)
    assert_bits_equal(y.numpy(), (x64 @ w64.T + b.astype(F64)).reshape(y.shape).astype(F16), zero_sign=False)
    y.backward(ta.tensor(g, device=device))
    g64 = g.astype(F64).reshape(-1, w_shape[0])
    assert_bits_equal(host_grad(tx), (g64 @ w64).reshape(x_shape).astype(F16), zero_sign=False)
    assert_bits_equal(host_grad(tw), (g64.T @ x64).astype(F16), zero_sign=False)
    assert_bits_equal(host_grad(tb), g64.sum(axis=0).astype(F16), zero_sign=False)


def test_the_bias_is_added_before_the_single_rounding_on_each_device(device: str) -> None:
    x, w, b = np.array([[1.0, 1.0]], F16), np.array([[2048.0, 1.0]], F16), np.array([1.0], F16)
    y = ta.linear(ta.tensor(x, device=device), ta.tensor(w, device=device), ta.tensor(b, device=device))
    assert y.dtype == F16 and y.item() == 2050.0


def test_float32_output_of_a_float16_product_is_not_rounded_through_float16(device: str) -> None:
    # 2048 + 1 = 2049 is a float32 value but not a float16 one: a float32 result must keep it
    a, b = np.array([[2048.0, 1.0]], F16), np.array([[1.0], [1.0]], F16)
    y = MatMul.apply(ta.tensor(a, device=device), ta.tensor(b, device=device), out_dtype=F32)
    assert y.dtype == F32 and y.item() == 2049.0


def test_gathered_rows_sum_their_gradients_in_float32_on_each_device(device: str) -> None:
    # one row of a float16 table picked 4096 times: its gradient is 4096, where a float16
    # running sum of ones stops at 2048 (2048 + 1 rounds back to 2048)
    table = ta.tensor(np.zeros((3, 2), F16), requires_grad=True, device=device)
    ta.embedding(table, ta.tensor(np.zeros(4096, np.int64), device=device)).sum().backward()
    assert host_grad(table).dtype == F16 and host_grad(table)[0, 0] == 4096.0
    x = ta.tensor(np.zeros(3, F16), requires_grad=True, device=device)
    x[np.zeros(4096, np.int64)].sum().backward()
    assert host_grad(x)[0] == 4096.0
