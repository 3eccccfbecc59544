"""Forward values against NumPy and hand-written formulas in float64, and against PyTorch.

The gradient checks in test_gradients.py prove that each backward matches its forward;
these tests prove that the forward computes the right function in the first place.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import (
    broadcastable_shapes,
    distinct_arrays,
    embedding_cases,
    float_arrays,
    linear_shapes,
    logits_and_labels,
    nonzero_arrays,
    positive_arrays,
    reduction_axes,
    shapes,
)

import tinyamp as ta

pytestmark = pytest.mark.ops

EXACT = {"rtol": 1e-13, "atol": 1e-15}  # float64 forward: a few ulps of rounding order at most
# Gradients such as gelu's (1 + tanh(...)) / 2 cancel terms of order 1, so two correct
# float64 implementations can differ by ~1e-15 absolute where the result is tiny.
CLOSE = {"rtol": 1e-12, "atol": 1e-13}


def t64(array: np.ndarray, requires_grad: bool = False) -> ta.Tensor:
    return ta.tensor(np.asarray(array, dtype=np.float64), requires_grad=requires_grad)


def ref_log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """log softmax by its definition (inputs here are bounded, so no shift is needed)."""
    return x - np.log(np.exp(x).sum(axis=axis, keepdims=True))


def ref_gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def ref_layer_norm(x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, eps: float = 1e-5) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


# ---- elementwise ----------------------------------------------------------------------------------
BINARY = {
    "add": (np.add, float_arrays),
    "sub": (np.subtract, float_arrays),
    "mul": (np.multiply, float_arrays),
    "div": (np.divide, nonzero_arrays),
}


@pytest.mark.parametrize("op", list(BINARY))
@given(data=st.data())
def test_binary_ops_broadcast_like_numpy(op: str, data: st.DataObject) -> None:
    np_op, b_values = BINARY[op]
    sa, sb = data.draw(broadcastable_shapes(2))
    a, b = data.draw(float_arrays(sa)), data.draw(b_values(sb))
    out = getattr(ta.ops, op)(t64(a), t64(b))
    expected = np_op(a, b)
    assert out.shape == expected.shape
    np.testing.assert_array_equal(out.numpy(), expected)


@given(data=st.data())
def test_pow_matches_numpy(data: st.DataObject) -> None:
    sa, sb = data.draw(broadcastable_shapes(2))
    a, b = data.draw(positive_arrays(sa)), data.draw(float_arrays(sb))
    np.testing.assert_allclose((t64(a) ** t64(b)).numpy(), a**b, **EXACT)


UNARY = {
    "exp": (ta.exp, np.exp, float_arrays),
    "log": (ta.log, np.log, positive_arrays),
    "sqrt": (ta.sqrt, np.sqrt, positive_arrays),
    "tanh": (ta.tanh, np.tanh, float_arrays),
    "sigmoid": (ta.sigmoid, lambda x: 1 / (1 + np.exp(-x)), lambda: float_arrays(low=-30.0, high=30.0)),
    "relu": (ta.relu, lambda x: np.where(x > 0, x, 0.0), float_arrays),
    "gelu": (ta.gelu, ref_gelu_tanh, lambda: float_arrays(low=-6.0, high=6.0)),
    "neg": (ta.ops.neg, np.negative, float_arrays),
}


@pytest.mark.parametrize("name", list(UNARY))
@given(data=st.data())
def test_elementwise_functions_match_their_formulas(name: str, data: st.DataObject) -> None:
    fn, ref, values = UNARY[name]
    x = data.draw(values())
    np.testing.assert_allclose(fn(t64(x)).numpy(), ref(x), **EXACT)


def test_gelu_tanh_form_is_within_1e_3_of_the_erf_form() -> None:
    x = np.linspace(-6, 6, 2001)
    erf_form = 0.5 * x * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x]))
    err = np.abs(ta.gelu(t64(x)).numpy() - erf_form)
    assert err.max() < 1e-3
    assert err.max() > 1e-5  # it is an approximation: the tanh form is not the erf form


def test_sigmoid_of_large_negative_float16_is_finite_and_not_nan() -> None:
    x = ta.tensor([-20.0, -12.0, 0.0, 12.0], dtype="float16")
    y = ta.sigmoid(x).numpy()
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-np.array([-20.0, -12.0, 0.0, 12.0]))), atol=1e-3)


# ---- reductions ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["sum", "mean", "max"])
@given(data=st.data(), keepdims=st.booleans())
def test_reductions_match_numpy(name: str, data: st.DataObject, keepdims: bool) -> None:
    x = data.draw(float_arrays())
    axis = data.draw(reduction_axes(x.ndim))
    out = getattr(t64(x), name)(axis=axis, keepdims=keepdims)
    expected = getattr(np, name)(x, axis=axis, keepdims=keepdims)
    assert out.shape == np.shape(expected)
    np.testing.assert_allclose(out.numpy(), expected, **EXACT)


def test_mean_of_an_integer_tensor_is_not_truncated() -> None:
    out = ta.tensor([1, 2]).mean()
    assert out.dtype.kind == "f"
    assert out.item() == 1.5


# ---- matmul, linear -----------------------------------------------------------------------------
@given(data=st.data(), with_bias=st.booleans())
def test_linear_is_x_times_w_transposed_plus_b(data: st.DataObject, with_bias: bool) -> None:
    sx, sw = data.draw(linear_shapes())
    x, w, b = data.draw(float_arrays(sx)), data.draw(float_arrays(sw)), data.draw(float_arrays(sw[:1]))
    out = ta.linear(t64(x), t64(w), t64(b) if with_bias else None)
    np.testing.assert_allclose(out.numpy(), x @ w.T + (b if with_bias else 0), **EXACT)


def test_vector_dot_vector_is_a_0d_tensor() -> None:
    a, b = np.array([1.0, 2.0, 3.0]), np.array([4.0, -5.0, 6.0])
    out = ta.matmul(t64(a), t64(b))
    assert out.shape == ()
    assert out.item() == 12.0


# ---- softmax family, losses, normalization --------------------------------------------------------
@given(data=st.data())
def test_softmax_and_log_softmax_match_their_definitions(data: st.DataObject) -> None:
    x = data.draw(float_arrays(shapes(min_dims=1), -5.0, 5.0))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    log_p = ref_log_softmax(x, axis)
    p = ta.softmax(t64(x), axis=axis).numpy()
    np.testing.assert_allclose(ta.log_softmax(t64(x), axis=axis).numpy(), log_p, **EXACT)
    np.testing.assert_allclose(p, np.exp(log_p), **EXACT)
    np.testing.assert_allclose(p.sum(axis=axis), 1.0, rtol=1e-14)


def test_softmax_is_stable_for_large_logits() -> None:
    x = ta.tensor([[1000.0, 1000.0, -1000.0]], dtype="float64")
    np.testing.assert_array_equal(ta.softmax(x).numpy(), [[0.5, 0.5, 0.0]])
    np.testing.assert_allclose(ta.log_softmax(x).numpy()[0, :2], [-math.log(2)] * 2)
    h = ta.tensor([[20.0, 0.0]], dtype="float16")  # e^20 overflows float16 unless shifted
    assert np.isfinite(ta.softmax(h).numpy()).all()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@given(case=logits_and_labels())
def test_cross_entropy_is_minus_log_softmax_at_the_label(reduction: str, case: tuple) -> None:
    logits, labels = case
    picked = np.take_along_axis(ref_log_softmax(logits, -1), labels[..., None], axis=-1)[..., 0]
    expected = {"mean": -picked.mean(), "sum": -picked.sum(), "none": -picked}[reduction]
    out = ta.cross_entropy(t64(logits), labels, reduction=reduction)
    assert out.shape == np.shape(expected)
    np.testing.assert_allclose(out.numpy(), expected, **EXACT)


@pytest.mark.parametrize("params", ["none", "weight", "weight_and_bias"])
@given(data=st.data())
def test_layer_norm_matches_its_formula(params: str, data: st.DataObject) -> None:
    x = data.draw(distinct_arrays(shapes(min_dims=1)))
    d = x.shape[-1]
    w = data.draw(float_arrays((d,))) if params != "none" else None
    b = data.draw(float_arrays((d,))) if params == "weight_and_bias" else None
    out = ta.layer_norm(t64(x), None if w is None else t64(w), None if b is None else t64(b))
    np.testing.assert_allclose(out.numpy(), ref_layer_norm(x, w, b), rtol=1e-12, atol=1e-12)


@given(case=embedding_cases())
def test_embedding_picks_rows(case: tuple) -> None:
    table, idx = case
    np.testing.assert_array_equal(ta.embedding(t64(table), idx).numpy(), table[idx])


# ---- dropout ------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_keeps_a_fraction_1_minus_p_scaled_by_1_over_1_minus_p(p: float) -> None:
    ta.manual_seed(0)
    n = 100_000
    y = ta.dropout(ta.ones(n, dtype="float64"), p=p).numpy()
    kept = y != 0
    np.testing.assert_allclose(y[kept], 1 / (1 - p), rtol=1e-15)
    # the kept count is Binomial(n, 1-p): 5 standard deviations is a loose, fixed-seed bound
    assert abs(kept.mean() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    assert abs(y.mean() - 1) < 0.02  # the expected value of every element is unchanged


def test_dropout_mask_is_reproducible_with_manual_seed() -> None:
    x = ta.ones(64, dtype="float64")
    ta.manual_seed(3)
    first = ta.dropout(x).numpy()
    second = ta.dropout(x).numpy()
    ta.manual_seed(3)
    again = ta.dropout(x).numpy()
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, second)  # the generator advances between calls


def test_dropout_is_the_identity_when_not_training_or_p_is_0() -> None:
    x = ta.ones(8, requires_grad=True)
    assert ta.dropout(x, p=0.5, training=False) is x
    assert ta.dropout(x, p=0.0) is x


# ---- comparisons -------------------------------------------------------------------------------
@given(data=st.data())
def test_comparisons_match_numpy_and_carry_no_gradient(data: st.DataObject) -> None:
    sa, sb = data.draw(broadcastable_shapes(2))
    a, b = data.draw(float_arrays(sa)), data.draw(float_arrays(sb))
    ta_a, ta_b = t64(a, requires_grad=True), t64(b)
    for got, expected in [
        (ta_a < ta_b, a < b), (ta_a <= ta_b, a <= b), (ta_a > ta_b, a > b),
        (ta_a >= ta_b, a >= b), (ta.equal(ta_a, ta_b), a == b), (ta_a > 0.5, a > 0.5),
    ]:  # fmt: skip
        assert got.dtype == np.bool_ and not got.requires_grad
        np.testing.assert_array_equal(got.numpy(), expected)


# ---- PyTorch as a second opinion, forward and backward -------------------------------------------
def _torch():
    return pytest.importorskip("torch")


def _seed(shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(7).standard_normal(shape)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@given(case=logits_and_labels())
def test_cross_entropy_matches_torch(reduction: str, case: tuple) -> None:
    torch = _torch()
    logits, labels = case
    classes = logits.shape[-1]
    z = t64(logits, requires_grad=True)
    out = ta.cross_entropy(z, labels, reduction=reduction)
    g = _seed(out.shape)
    out.backward(g)
    zt = torch.tensor(logits.reshape(-1, classes), requires_grad=True)
    ref = torch.nn.functional.cross_entropy(zt, torch.tensor(labels.reshape(-1)), reduction=reduction)
    ref = ref.reshape(labels.shape) if reduction == "none" else ref
    ref.backward(torch.tensor(g))
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), **EXACT)
    np.testing.assert_allclose(z.grad, zt.grad.numpy().reshape(logits.shape), **CLOSE)


@pytest.mark.parametrize("params", ["none", "weight", "weight_and_bias"])
@given(data=st.data())
def test_layer_norm_matches_torch(params: str, data: st.DataObject) -> None:
    torch = _torch()
    x = data.draw(distinct_arrays(shapes(min_dims=1)))
    d = x.shape[-1]
    arrays = [x] + [data.draw(float_arrays((d,))) for _ in range({"none": 0, "weight": 1}.get(params, 2))]
    ours = [t64(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = ta.layer_norm(*ours)
    ref = torch.nn.functional.layer_norm(theirs[0], (d,), *theirs[1:], eps=1e-5)
    g = _seed(out.shape)
    out.backward(g)
    ref.backward(torch.tensor(g))
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-12, atol=1e-12)
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.grad, t.grad.numpy(), rtol=1e-10, atol=1e-10)


@given(x=float_arrays(low=-6.0, high=6.0))
def test_gelu_matches_torch_tanh_approximation(x: np.ndarray) -> None:
    torch = _torch()
    ours, theirs = t64(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out = ta.gelu(ours)
    ref = torch.nn.functional.gelu(theirs, approximate="tanh")
    g = _seed(x.shape)
    out.backward(g)
    ref.backward(torch.tensor(g))
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), **EXACT)
    np.testing.assert_allclose(ours.grad, theirs.grad.numpy(), **CLOSE)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@given(data=st.data())
def test_softmax_matches_torch(name: str, data: st.DataObject) -> None:
    torch = _torch()
    x = data.draw(float_arrays(shapes(min_dims=1), -5.0, 5.0))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    ours, theirs = t64(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out = getattr(ta, name)(ours, axis=axis)
    ref = getattr(torch, name)(theirs, dim=axis)
    g = _seed(x.shape)
    out.backward(g)
    ref.backward(torch.tensor(g))
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), **EXACT)
    np.testing.assert_allclose(ours.grad, theirs.grad.numpy(), **CLOSE)


def test_float16_gelu_is_the_float32_gelu_rounded_once() -> None:
    x32 = np.linspace(-6, 6, 4001, dtype=np.float32).astype(np.float16).astype(np.float32)
    ref = ta.gelu(ta.tensor(x32, requires_grad=True))
    ref.backward(np.ones_like(x32))
    x16 = ta.tensor(x32.astype(np.float16), requires_grad=True)
    out = ta.gelu(x16)
    out.backward(np.ones(x32.shape, np.float16))
    assert out.dtype == np.float16 and x16.grad.dtype == np.float16
    np.testing.assert_array_equal(out.data, ref.data.astype(np.float16))
    # backward: the float32 derivative times the widened upstream 1.0, rounded once
    np.testing.assert_array_equal(x16.grad, _gelu_grad32(x32).astype(np.float16))


def _gelu_grad32(x: np.ndarray) -> np.ndarray:
    c, a = np.float32(np.sqrt(2 / np.pi)), np.float32(0.044715)
    t = np.tanh(c * (x + a * x * x * x))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * a * x * x)
