"""Every op's backward against central finite differences, in float64 on the CPU.

``tinyamp.gradcheck`` compares the analytic gradient with $(f(x+h) - f(x-h)) / 2h$ at
every element, with atol=1e-6 and rtol=1e-5 (right for float64: the difference error is
near 1e-8 for these bounded inputs).  Shapes come from hypothesis, broadcasting included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import (
    away_from_kink_arrays,
    basic_indices,
    broadcastable_shapes,
    concatenate_cases,
    distinct_arrays,
    embedding_cases,
    float_arrays,
    indices,
    linear_shapes,
    logits_and_labels,
    matmul_shape_pairs,
    nonzero_arrays,
    permutations_of_axes,
    positive_arrays,
    reduction_axes,
    reshape_targets,
    shapes,
)

import tinyamp as ta
from tinyamp import ops

pytestmark = pytest.mark.ops


def leaf(array: np.ndarray) -> ta.Tensor:
    """A float64 CPU leaf that requires grad (what gradcheck needs)."""
    return ta.tensor(np.asarray(array, dtype=np.float64), requires_grad=True)


# ---- the check itself can fail -----------------------------------------------------------------
class _WrongSquare(ta.Function):
    """$y = x^2$ with a deliberately wrong backward ($x$ instead of $2x$)."""

    def forward(self, x: Any) -> Any:
        self.save_for_backward(x)
        return x * x

    def backward(self, g: Any) -> tuple[Any]:
        (x,) = self.saved
        return (g * x,)


def test_gradcheck_rejects_a_wrong_backward() -> None:
    x = leaf(np.array([0.5, -1.0, 2.0]))
    with pytest.raises(ta.GradientError, match=r"input 0 \(shape \(3,\)\) element"):
        ta.gradcheck(_WrongSquare.apply, [x])


def test_gradcheck_refuses_float32_inputs() -> None:
    x = ta.tensor([1.0, 2.0], dtype="float32", requires_grad=True)
    with pytest.raises(ta.GradientError, match="float64"):
        ta.gradcheck(lambda t: t * t, [x])


class _NanBackward(ta.Function):
    """$y = x^2$ whose backward returns NaN: every comparison with NaN is False, so `error > tol` never fires."""

    def forward(self, x: Any) -> Any:
        return x * x

    def backward(self, g: Any) -> tuple[Any]:
        return (g * np.nan,)


def test_gradcheck_rejects_a_backward_that_gives_nan() -> None:
    x = leaf(np.array([0.5, -1.0]))
    with pytest.raises(ta.GradientError, match=r"element \(0,\): backward gives nan, finite differences give -?\d"):
        ta.gradcheck(_NanBackward.apply, [x])


def test_gradcheck_refuses_non_finite_inputs_and_a_result_that_is_not_a_tensor() -> None:
    with pytest.raises(ta.GradientError, match=r"finite inputs; input 0 \(shape \(3,\)\) holds 2 NaN or inf"):
        ta.gradcheck(lambda t: t * t, [leaf(np.array([1.0, np.nan, np.inf]))])
    with pytest.raises(ta.GradientError, match="return a Tensor; it returned float"):
        ta.gradcheck(lambda t: 3.0, [leaf(np.array([1.0]))])


# ---- + - * / ** with broadcasting -----------------------------------------------------------------
BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
}


@pytest.mark.parametrize("name", sorted(BINARY))
@given(data=st.data())
def test_binary_gradient_sums_over_broadcast_axes(name: str, data: st.DataObject) -> None:
    sa, sb = data.draw(broadcastable_shapes(2))
    a, b = leaf(data.draw(float_arrays(sa))), leaf(data.draw(float_arrays(sb)))
    assert ta.gradcheck(BINARY[name], [a, b])


@given(data=st.data())
def test_div_gradient_is_one_over_b_and_minus_a_over_b_squared(data: st.DataObject) -> None:
    sa, sb = data.draw(broadcastable_shapes(2))
    a, b = leaf(data.draw(float_arrays(sa))), leaf(data.draw(nonzero_arrays(sb)))
    assert ta.gradcheck(lambda x, y: x / y, [a, b])


@given(data=st.data())
def test_pow_gradient_in_base_and_exponent(data: st.DataObject) -> None:
    sa, sb = data.draw(broadcastable_shapes(2))
    a, b = leaf(data.draw(positive_arrays(sa))), leaf(data.draw(float_arrays(sb)))
    assert ta.gradcheck(lambda x, y: x**y, [a, b])


SCALAR_FORMS: dict[str, tuple[Callable[[ta.Tensor], ta.Tensor], str]] = {
    "x + 1.5": (lambda x: x + 1.5, "any"),
    "1.5 + x": (lambda x: 1.5 + x, "any"),
    "x - 1.5": (lambda x: x - 1.5, "any"),
    "2 - x": (lambda x: 2 - x, "any"),
    "x * -1.5": (lambda x: x * -1.5, "any"),
    "3 * x": (lambda x: 3 * x, "any"),
    "x / 3": (lambda x: x / 3, "any"),
    "1.5 / x": (lambda x: 1.5 / x, "nonzero"),
    "x ** 2": (lambda x: x**2, "any"),
    "x ** 3": (lambda x: x**3, "any"),
    "x ** 0.5": (lambda x: x**0.5, "positive"),
    "x ** -1.5": (lambda x: x**-1.5, "positive"),
    "2.0 ** x": (lambda x: 2.0**x, "any"),
    "-x": (lambda x: -x, "any"),
    "ops.neg(x)": (ops.neg, "any"),
}
_DOMAINS = {"any": float_arrays, "nonzero": nonzero_arrays, "positive": positive_arrays}


@pytest.mark.parametrize("form", list(SCALAR_FORMS))
@given(data=st.data())
def test_scalar_operand_on_either_side(form: str, data: st.DataObject) -> None:
    fn, domain = SCALAR_FORMS[form]
    x = leaf(data.draw(_DOMAINS[domain]()))
    assert ta.gradcheck(fn, [x])


# ---- matmul and linear -----------------------------------------------------------------------------
@given(data=st.data())
def test_matmul_gradients_are_g_bt_and_at_g(data: st.DataObject) -> None:
    sa, sb = data.draw(matmul_shape_pairs())
    a, b = leaf(data.draw(float_arrays(sa))), leaf(data.draw(float_arrays(sb)))
    out = ta.matmul(a, b)
    np.testing.assert_allclose(out.numpy(), a.numpy() @ b.numpy(), rtol=1e-12, atol=1e-12)
    assert ta.gradcheck(ta.matmul, [a, b])


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
@given(data=st.data())
def test_linear_gradients_in_input_weight_and_bias(with_bias: bool, data: st.DataObject) -> None:
    sx, sw = data.draw(linear_shapes())
    x, w = leaf(data.draw(float_arrays(sx))), leaf(data.draw(float_arrays(sw)))
    inputs = [x, w]
    if with_bias:
        inputs.append(leaf(data.draw(float_arrays((sw[0],)))))
    assert ta.gradcheck(ta.linear, inputs)


@pytest.mark.parametrize("x_shape", [(4, 3), (2, 4, 3)], ids=["2d", "3d"])
def test_linear_gradients_on_fixed_2d_and_3d_inputs(x_shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(1)
    x, w, b = (leaf(rng.standard_normal(s)) for s in (x_shape, (5, 3), (5,)))
    assert ta.gradcheck(ta.linear, [x, w, b])
    assert ta.gradcheck(ta.linear, [x, w])


# ---- elementwise functions ---------------------------------------------------------------------------
UNARY = {
    "exp": (ta.exp, float_arrays),
    "log": (ta.log, positive_arrays),
    "sqrt": (ta.sqrt, positive_arrays),
    "tanh": (ta.tanh, float_arrays),
    "sigmoid": (ta.sigmoid, lambda: float_arrays(low=-6.0, high=6.0)),
    "relu": (ta.relu, away_from_kink_arrays),
    "gelu": (ta.gelu, lambda: float_arrays(low=-4.0, high=4.0)),
}


@pytest.mark.parametrize("name", list(UNARY))
@given(data=st.data())
def test_elementwise_gradient_is_the_derivative(name: str, data: st.DataObject) -> None:
    fn, values = UNARY[name]
    assert ta.gradcheck(fn, [leaf(data.draw(values()))])


# ---- reductions -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["sum", "mean"])
@given(data=st.data(), keepdims=st.booleans())
def test_sum_and_mean_spread_the_gradient_over_the_reduced_axes(name: str, data: st.DataObject, keepdims: bool) -> None:
    x = leaf(data.draw(float_arrays()))
    axis = data.draw(reduction_axes(x.ndim))
    assert ta.gradcheck(lambda t: getattr(t, name)(axis=axis, keepdims=keepdims), [x])


@given(data=st.data(), keepdims=st.booleans())
def test_max_sends_the_gradient_to_the_maximum(data: st.DataObject, keepdims: bool) -> None:
    x = leaf(data.draw(distinct_arrays()))
    axis = data.draw(reduction_axes(x.ndim))
    assert ta.gradcheck(lambda t: t.max(axis=axis, keepdims=keepdims), [x])


def test_max_splits_the_gradient_evenly_between_ties() -> None:
    x = leaf(np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]]))
    x.max(axis=1).sum().backward()
    np.testing.assert_array_equal(x.grad, [[0.0, 0.5, 0.5], [0.5, 0.0, 0.5]])


# ---- shape ops -----------------------------------------------------------------------------------
@given(data=st.data())
def test_reshape_gradient_is_reshaped_back(data: st.DataObject) -> None:
    x = leaf(data.draw(float_arrays()))
    target = data.draw(reshape_targets(x.shape))
    assert ta.gradcheck(lambda t: t.reshape(target), [x])


@given(data=st.data())
def test_transpose_gradient_is_inversely_permuted(data: st.DataObject) -> None:
    x = leaf(data.draw(float_arrays(shapes(min_dims=1))))
    axes = data.draw(permutations_of_axes(x.ndim))
    out = x.transpose(*axes) if axes is not None else x.T
    np.testing.assert_array_equal(out.numpy(), x.numpy().transpose(axes))
    assert ta.gradcheck(lambda t: t.transpose(*axes) if axes is not None else t.T, [x])


@pytest.mark.parametrize("axes", [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0), (-1, 0, -2)])
def test_transpose_gradient_inverts_every_permutation_of_unequal_axes(axes: tuple[int, ...]) -> None:
    # unequal sides (2, 3, 4): a gradient permuted by `axes` instead of its inverse has the wrong shape
    x = leaf(np.random.default_rng(0).standard_normal((2, 3, 4)))
    assert ta.gradcheck(lambda t: t.transpose(*axes), [x])


@given(data=st.data())
def test_getitem_basic_gradient_scatters_back(data: st.DataObject) -> None:
    x = leaf(data.draw(float_arrays()))
    index = data.draw(basic_indices(x.shape))
    np.testing.assert_array_equal(x[index].numpy(), x.numpy()[index])
    assert ta.gradcheck(lambda t: t[index], [x])


@given(data=st.data())
def test_getitem_gradient_sums_repeated_indices(data: st.DataObject) -> None:
    x = leaf(data.draw(float_arrays(shapes(min_dims=1))))
    index = data.draw(indices(x.shape))
    np.testing.assert_array_equal(x[index].numpy(), x.numpy()[index])
    assert ta.gradcheck(lambda t: t[index], [x])


@pytest.mark.parametrize(
    "index",
    [[0, 2, 0, 0], np.array([0, 2, 0, 0]), ta.tensor([0, 2, 0, 0]), ta.tensor([[0, 2], [0, -3]])],
    ids=["list", "ndarray", "tensor", "2d_tensor_negative"],
)
def test_getitem_repeated_row_receives_every_gradient(index: Any) -> None:
    x = leaf(np.arange(6.0).reshape(3, 2))
    x[index].sum().backward()
    np.testing.assert_array_equal(x.grad, [[3.0, 3.0], [0.0, 0.0], [1.0, 1.0]])


@given(case=concatenate_cases())
def test_concatenate_gradient_is_split_back(case: tuple[list[np.ndarray], int]) -> None:
    arrays, axis = case
    tensors = [leaf(a) for a in arrays]
    np.testing.assert_array_equal(ta.concatenate(tensors, axis).numpy(), np.concatenate(arrays, axis))
    assert ta.gradcheck(lambda *ts: ta.concatenate(ts, axis=axis), tensors)


# ---- softmax family, losses, normalization -------------------------------------------------------
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@given(data=st.data())
def test_softmax_gradients_along_any_axis(name: str, data: st.DataObject) -> None:
    x = leaf(data.draw(float_arrays(shapes(min_dims=1), -3.0, 3.0)))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    assert ta.gradcheck(lambda t: getattr(ta, name)(t, axis=axis), [x])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@given(case=logits_and_labels())
def test_cross_entropy_gradient_is_softmax_minus_onehot(reduction: str, case: tuple[np.ndarray, np.ndarray]) -> None:
    logits, labels = case
    y = ta.tensor(labels)
    assert ta.gradcheck(lambda z: ta.cross_entropy(z, y, reduction=reduction), [leaf(logits)])


@pytest.mark.parametrize("params", ["none", "weight", "weight_and_bias"])
@given(data=st.data())
def test_layer_norm_gradients(params: str, data: st.DataObject) -> None:
    x = leaf(data.draw(distinct_arrays(shapes(min_dims=1))))
    d = x.shape[-1]
    inputs = [x]
    if params != "none":
        inputs.append(leaf(data.draw(float_arrays((d,)))))
    if params == "weight_and_bias":
        inputs.append(leaf(data.draw(float_arrays((d,)))))
    assert ta.gradcheck(ta.layer_norm, inputs)


@given(case=embedding_cases())
def test_embedding_gradient_adds_up_repeated_rows(case: tuple[np.ndarray, np.ndarray]) -> None:
    table, idx = case
    assert ta.gradcheck(lambda w: ta.embedding(w, idx), [leaf(table)])


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
@given(x=float_arrays(), seed=st.integers(0, 2**16))
def test_dropout_gradient_is_the_mask(p: float, x: np.ndarray, seed: int) -> None:
    def fn(t: ta.Tensor) -> ta.Tensor:
        ta.manual_seed(seed)  # each evaluation draws the same mask
        return ta.dropout(t, p=p)

    xt = leaf(x)
    assert ta.gradcheck(fn, [xt])
    ta.manual_seed(seed)
    out = ta.dropout(xt, p=p).numpy()
    kept = out != 0
    # survivors are scaled by 1/(1-p); dropped elements are exactly zero
    np.testing.assert_allclose(out[kept], x[kept] / (1 - p), rtol=1e-15)


@given(x=float_arrays())
def test_cast_to_own_dtype_is_the_identity(x: np.ndarray) -> None:
    xt = leaf(x)
    assert xt.astype("float64") is xt
    assert ta.gradcheck(lambda t: t.astype("float64") * 2.0, [xt])


@pytest.mark.parametrize(("source", "target"), [("float64", "float32"), ("float32", "float16"), ("float16", "float32")])
def test_cast_gradient_is_cast_back_to_the_source_dtype(source: str, target: str) -> None:
    x = ta.tensor([0.5, -1.25, 3.0], dtype=source, requires_grad=True)
    y = x.astype(target)
    assert y.dtype == np.dtype(target)
    (y * 3.0).sum().backward()
    assert x.grad.dtype == np.dtype(source)
    np.testing.assert_array_equal(x.grad, np.full(3, 3.0, dtype=source))


# ---- compositions: the chain rule across several ops ---------------------------------------------
@given(data=st.data())
def test_chain_rule_through_a_two_layer_mlp_with_loss(data: st.DataObject) -> None:
    batch, d_in, hidden, classes = (data.draw(st.integers(1, 4)) for _ in range(4))
    x = leaf(data.draw(float_arrays((batch, d_in))))
    w1, b1 = leaf(data.draw(float_arrays((hidden, d_in)))), leaf(data.draw(float_arrays((hidden,))))
    w2 = leaf(data.draw(float_arrays((classes, hidden))))
    labels = ta.tensor(data.draw(st.lists(st.integers(0, classes - 1), min_size=batch, max_size=batch)))

    def loss(x: ta.Tensor, w1: ta.Tensor, b1: ta.Tensor, w2: ta.Tensor) -> ta.Tensor:
        h = ta.gelu(ta.tanh(ta.linear(x, w1, b1)))
        return ta.cross_entropy(ta.linear(h, w2), labels) + (w1 * w1).mean() * 0.1

    assert ta.gradcheck(loss, [x, w1, b1, w2])
