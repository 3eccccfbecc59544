"""Laws of the engine: dtypes of results and gradients, graph recording, backward mechanics.

Most laws hold on every device, so those tests take the `device` fixture (the "cuda"
case is skipped where CuPy sees no GPU).
"""

from __future__ import annotations

import re
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import broadcastable_shapes, dag_steps, float_arrays, float_dtypes, small_scalars

import tinyamp as ta
from tinyamp.backend import to_device

pytestmark = pytest.mark.autograd


def host(array: Any) -> np.ndarray:
    """A NumPy copy of a NumPy or CuPy array."""
    return to_device(array, "cpu")


# ---- weak Python scalars ----------------------------------------------------------------------------
WEAK_FORMS = {
    "x * 2.0": lambda x: x * 2.0,
    "2.0 * x": lambda x: 2.0 * x,
    "x + 1": lambda x: x + 1,
    "1 + x": lambda x: 1 + x,
    "2.0 - x": lambda x: 2.0 - x,
    "x - 0.5": lambda x: x - 0.5,
    "x / 3": lambda x: x / 3,
    "3 / x": lambda x: 3 / x,
    "x ** 2": lambda x: x**2,
    "2.0 ** x": lambda x: 2.0**x,
}


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("form", list(WEAK_FORMS))
def test_python_scalars_are_weak_and_keep_the_tensor_dtype(form: str, dtype: str, device: str) -> None:
    x = ta.tensor([1.0, 2.0, 4.0], dtype=dtype, device=device, requires_grad=True)
    y = WEAK_FORMS[form](x)
    assert y.dtype == np.dtype(dtype)
    assert y.device == device
    y.sum().backward()
    assert x.grad.dtype == np.dtype(dtype)


@pytest.mark.parametrize("form", list(WEAK_FORMS))
def test_weak_scalar_results_match_numpy_in_the_tensor_dtype(form: str, device: str) -> None:
    values = np.array([1.0, 2.0, 4.0], dtype=np.float16)
    x = ta.tensor(values, device=device)
    expected = WEAK_FORMS[form](values)  # NumPy 2 treats Python scalars as weak too
    assert expected.dtype == np.float16
    np.testing.assert_array_equal(WEAK_FORMS[form](x).numpy(), expected)


@given(dtype=float_dtypes, scalar=small_scalars)
def test_any_small_scalar_keeps_every_float_dtype(dtype: np.dtype, scalar: float) -> None:
    x = ta.tensor(np.array([1.5, -0.5], dtype=dtype))
    for y in (x * scalar, scalar + x, x - scalar, scalar - x):
        assert y.dtype == dtype


@pytest.mark.parametrize("int_dtype", ["int32", "int64"])
def test_int_tensor_times_python_float_is_float32(int_dtype: str, device: str) -> None:
    x = ta.tensor([1, 2, 3], dtype=int_dtype, device=device)
    y = x * 2.5
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y.numpy(), [2.5, 5.0, 7.5])
    assert (x * 2).dtype == np.dtype(int_dtype)


@pytest.mark.parametrize("scalar", [1e6, -1e6, 65520.0, 70000])
def test_scalar_that_overflows_float16_raises_naming_the_value(scalar: float, device: str) -> None:
    x = ta.tensor([1.0, 2.0], dtype="float16", device=device)
    with pytest.raises(OverflowError, match=re.escape(repr(scalar)) + r".*float16"):
        x * scalar


def test_largest_finite_float16_scalar_is_accepted(device: str) -> None:
    x = ta.tensor([1.0], dtype="float16", device=device)
    assert (x * 65504.0).numpy()[0] == 65504.0  # float16's max is a legal weak scalar


# ---- gradient dtype and shape equal the tensor's ---------------------------------------------------
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@given(shapes=broadcastable_shapes(2), dtype_a=float_dtypes, dtype_b=float_dtypes)
def test_grad_has_dtype_and_shape_of_its_leaf_under_mixed_dtypes_and_broadcasting(
    op: str, shapes: tuple[tuple[int, ...], ...], dtype_a: np.dtype, dtype_b: np.dtype
) -> None:
    a = ta.tensor(np.full(shapes[0], 1.5), dtype=dtype_a, requires_grad=True)
    b = ta.tensor(np.full(shapes[1], 2.0), dtype=dtype_b, requires_grad=True)
    out = getattr(ta.ops, op)(a, b)
    assert out.dtype == np.promote_types(dtype_a, dtype_b)
    out.sum().backward()
    for t in (a, b):
        assert t.grad.dtype == t.dtype
        assert t.grad.shape == t.shape


def test_grad_dtypes_in_a_mixed_float16_float32_network(device: str) -> None:
    rng = np.random.default_rng(0)

    def make(shape: tuple[int, ...], dtype: str) -> ta.Tensor:
        return ta.tensor(rng.standard_normal(shape), dtype=dtype, device=device, requires_grad=True)

    x = make((2, 3, 4), "float16")
    w1, b1 = make((5, 4), "float16"), make((5,), "float32")
    gamma, beta = make((5,), "float32"), make((5,), "float32")
    table = make((7, 5), "float16")
    w2 = make((3, 5), "float32")
    scale = make((1, 1, 5), "float16")
    h = ta.linear(x, w1) + b1  # float16 + float32 -> float32
    h = ta.layer_norm(h, gamma, beta)
    h = ta.concatenate([h * scale, ta.embedding(table, np.array([[0, 1, 1], [6, 0, 2]]))], axis=1)
    h = ta.gelu(h).astype("float16")[:, ::2]
    logits = ta.matmul(h, w2.T)
    loss = ta.cross_entropy(logits, np.zeros(logits.shape[:-1], dtype=np.int64))
    loss.backward()
    for t in (x, w1, b1, gamma, beta, table, w2, scale):
        assert t.grad is not None
        assert t.grad.dtype == t.dtype, t
        assert t.grad.shape == t.shape, t
        assert ta.backend.device_of(t.grad) == device
        assert np.isfinite(host(t.grad)).all()


# ---- broadcast-undoing sums accumulate in float32 ----------------------------------------------
N_FP16_STALL = 4096


def test_premise_float16_running_sums_stall_at_2048() -> None:
    ones = np.ones((N_FP16_STALL, 3), dtype=np.float16)
    # 2048 + 1 rounds back to 2048 in float16 (the spacing there is 2)
    assert np.cumsum(ones[:, 0], dtype=np.float16)[-1] == 2048
    # NumPy sums a strided axis one row at a time, so its own float16 sum stalls too
    # (a contiguous 1-D sum is pairwise and would happen to reach 4096 exactly)
    np.testing.assert_array_equal(ones.sum(axis=0, dtype=np.float16), [2048, 2048, 2048])


BROADCAST_FORMS = {
    "a + b": lambda a, b: a + b,
    "b + a": lambda a, b: b + a,
    "b - a": lambda a, b: -(b - a),
    "a * b": lambda a, b: a * b,
    "b / a": lambda a, b: b / a,
}


@pytest.mark.parametrize(
    ("a_shape", "b_shape"), [((1,), (N_FP16_STALL,)), ((3,), (N_FP16_STALL, 3)), ((1, 3), (N_FP16_STALL, 3))]
)
@pytest.mark.parametrize("form", list(BROADCAST_FORMS))
def test_broadcast_gradient_sums_in_float32(form: str, a_shape: tuple, b_shape: tuple, device: str) -> None:
    a = ta.ones(a_shape, dtype="float16", device=device, requires_grad=True)
    b = ta.ones(b_shape, dtype="float16", device=device)
    out = BROADCAST_FORMS[form](a, b)
    out.backward(ta.ones(out.shape, dtype="float16", device=device))
    # each element of a was used 4096 times with gradient 1 (or -1): exactly 4096 in float16
    assert a.grad.dtype == np.float16 and a.grad.shape == a_shape
    np.testing.assert_array_equal(np.abs(host(a.grad)), np.full(a_shape, N_FP16_STALL))


def test_linear_bias_gradient_sums_in_float32(device: str) -> None:
    x = ta.zeros((N_FP16_STALL, 2), dtype="float16", device=device)
    w = ta.zeros((3, 2), dtype="float16", device=device)
    b = ta.zeros((3,), dtype="float16", device=device, requires_grad=True)
    ta.linear(x, w, b).backward(ta.ones((N_FP16_STALL, 3), dtype="float16", device=device))
    np.testing.assert_array_equal(host(b.grad), np.full(3, N_FP16_STALL, dtype=np.float16))


def test_layer_norm_weight_and_bias_gradients_sum_in_float32(device: str) -> None:
    x = ta.tensor(np.tile([1.0, -1.0], (N_FP16_STALL, 1)), dtype="float16", device=device)
    w = ta.ones((2,), dtype="float16", device=device, requires_grad=True)
    b = ta.zeros((2,), dtype="float16", device=device, requires_grad=True)
    ta.layer_norm(x, w, b).backward(ta.ones((N_FP16_STALL, 2), dtype="float16", device=device))
    # each row normalizes to (1, -1) (up to eps), so dL/dw sums 4096 copies of (1, -1)
    np.testing.assert_allclose(host(w.grad).astype(np.float64), [N_FP16_STALL, -N_FP16_STALL], rtol=2e-3)
    np.testing.assert_array_equal(host(b.grad), np.full(2, N_FP16_STALL, dtype=np.float16))


def test_float16_sum_and_mean_accumulate_in_float32(device: str) -> None:
    x = ta.ones((N_FP16_STALL, 3), dtype="float16", device=device)
    assert x.sum(axis=0).dtype == np.float16
    np.testing.assert_array_equal(x.sum(axis=0).numpy(), np.full(3, N_FP16_STALL))
    np.testing.assert_array_equal(x.mean(axis=0).numpy(), np.ones(3))


# ---- deep graphs ------------------------------------------------------------------------------
def test_a_100000_op_chain_backprops_without_recursion_error() -> None:
    steps = 50_000  # two ops per step
    c = 1.00001
    x = ta.tensor(np.array([0.5]), requires_grad=True)
    y = x
    for _ in range(steps):
        y = y * c + 1.0
    assert steps * 2 > sys.getrecursionlimit() * 10
    assert len(list(ta.autograd.walk(y))) == 2 * steps
    y.sum().backward()
    # d/dx of c^n x + const is c^n; forward and backward round alike, so 1e-9 is loose
    np.testing.assert_allclose(x.grad, [c**steps], rtol=1e-9)


# ---- graph recording: no_grad / enable_grad -----------------------------------------------------
def test_no_grad_builds_no_graph(device: str) -> None:
    x = ta.tensor([1.0, 2.0], device=device, requires_grad=True)
    with ta.no_grad():
        assert not ta.is_grad_enabled()
        y = (x * 2 + 1).exp().sum()
    assert ta.is_grad_enabled()
    assert y.requires_grad is False
    assert y.creator is None
    with pytest.raises(ta.GradientError, match="does not require grad"):
        y.backward()


def test_nested_no_grad_and_enable_grad_restore_state() -> None:
    x = ta.tensor([1.0], requires_grad=True)
    with ta.no_grad():
        with ta.enable_grad():
            assert ta.is_grad_enabled()
            inner = x * 2
            with ta.no_grad():
                assert not ta.is_grad_enabled()
            assert ta.is_grad_enabled()
        assert not ta.is_grad_enabled()
        outer = x * 2
    assert ta.is_grad_enabled()
    assert inner.requires_grad and inner.creator is not None
    assert not outer.requires_grad and outer.creator is None


def test_no_grad_restores_state_after_an_exception() -> None:
    with pytest.raises(KeyError), ta.no_grad():
        raise KeyError("boom")
    assert ta.is_grad_enabled()


def test_no_grad_and_enable_grad_work_as_decorators() -> None:
    x = ta.tensor([3.0], requires_grad=True)

    @ta.no_grad()
    def evaluate(t: ta.Tensor) -> ta.Tensor:
        assert not ta.is_grad_enabled()
        return train(t) * 2

    @ta.enable_grad()
    def train(t: ta.Tensor) -> ta.Tensor:
        assert ta.is_grad_enabled()
        return t * t

    y = evaluate(x)
    assert ta.is_grad_enabled()
    assert not y.requires_grad and y.creator is None
    with ta.no_grad():
        z = train(x)
        assert not ta.is_grad_enabled()
    assert z.requires_grad and z.creator is not None
    assert evaluate.__name__ == "evaluate"


# ---- backward mechanics -------------------------------------------------------------------------------
def test_gradients_accumulate_across_backward_calls(device: str) -> None:
    x = ta.tensor([1.0, -2.0], device=device, requires_grad=True)
    (x * x).sum().backward()
    np.testing.assert_array_equal(host(x.grad), [2.0, -4.0])
    (x * 3.0).sum().backward()
    np.testing.assert_array_equal(host(x.grad), [5.0, -1.0])
    x.zero_grad()
    assert x.grad is None


def test_second_backward_without_retain_graph_is_a_clear_error() -> None:
    x = ta.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(ta.GradientError, match=r"second time.*retain_graph=True"):
        y.backward()


def test_retain_graph_allows_a_second_backward(device: str) -> None:
    x = ta.tensor([1.0, 2.0], device=device, requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_array_equal(host(x.grad), [4.0, 8.0])


def test_retain_grad_keeps_an_intermediate_gradient(device: str) -> None:
    x = ta.tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
    y = x * 2.0
    y.retain_grad()
    z = x * 5.0  # not retained
    (y * y + z).sum().backward()
    np.testing.assert_array_equal(host(y.grad), 2 * host(y.data))
    assert y.grad.dtype == y.dtype and y.grad.shape == y.shape
    assert z.grad is None
    np.testing.assert_array_equal(host(x.grad), 8 * host(x.data) + 5)


class _WrongDtype(ta.Function):
    def forward(self, x: Any) -> Any:
        return x * 2

    def backward(self, g: Any) -> tuple[Any]:
        return (g.astype(np.float32),)


class _WrongShape(ta.Function):
    def forward(self, x: Any) -> Any:
        return x * 2

    def backward(self, g: Any) -> tuple[Any]:
        return (g.sum(axis=0),)


def test_backward_returning_a_wrong_dtype_names_the_op() -> None:
    x = ta.tensor(np.ones((2, 3)), requires_grad=True)
    with pytest.raises(ta.GradientError, match=r"_WrongDtype.*dtype float32.*float64"):
        _WrongDtype.apply(x).sum().backward()


def test_backward_returning_a_wrong_shape_names_the_op() -> None:
    x = ta.tensor(np.ones((2, 3)), requires_grad=True)
    with pytest.raises(ta.GradientError, match=r"_WrongShape.*shape \(3,\).*shape \(2, 3\)"):
        _WrongShape.apply(x).sum().backward()


def test_leaves_given_the_same_gradient_array_do_not_alias(device: str) -> None:
    a = ta.tensor([1.0, 2.0], device=device, requires_grad=True)
    b = ta.tensor([3.0, 4.0], device=device, requires_grad=True)
    c = a + b
    c.backward(ta.ones((2,), device=device))
    a.grad *= 2
    np.testing.assert_array_equal(host(b.grad), [1.0, 1.0])
    np.testing.assert_array_equal(host(a.grad), [2.0, 2.0])


def test_leaf_gradient_is_not_a_view_of_another_leafs_gradient() -> None:
    a = ta.tensor(np.zeros((2, 3)), requires_grad=True)
    b = ta.tensor(np.zeros((3, 2)), requires_grad=True)
    (a + b.T).sum().backward()
    a.grad *= 2
    np.testing.assert_array_equal(b.grad, np.ones((3, 2)))


def test_detach_shares_data_but_cuts_the_graph(device: str) -> None:
    x = ta.tensor([1.0, 2.0], device=device, requires_grad=True)
    y = x * 3.0
    d = y.detach()
    assert d.requires_grad is False and d.creator is None and d.is_leaf
    assert d.data is y.data
    (y.sum() + (d * x).sum()).backward()
    # through y: 3; through d * x: d (a constant) = 3 x
    np.testing.assert_array_equal(host(x.grad), [6.0, 9.0])


def test_backward_of_a_leaf_fills_its_own_grad() -> None:
    x = ta.tensor(2.5, dtype="float64", requires_grad=True)
    x.backward()
    assert x.grad.shape == () and x.grad == 1.0


# ---- conversions and repr -------------------------------------------------------------------------
def test_item_numpy_tolist(device: str) -> None:
    x = ta.tensor([[1.5, 2.0], [3.0, -4.0]], device=device)
    assert isinstance(x.numpy(), np.ndarray)
    np.testing.assert_array_equal(x.numpy(), [[1.5, 2.0], [3.0, -4.0]])
    assert x.tolist() == [[1.5, 2.0], [3.0, -4.0]]
    s = x.sum()
    assert isinstance(s.item(), float) and s.item() == 2.5
    assert ta.tensor([7], device=device).item() == 7
    with pytest.raises(ValueError, match=r"one element.*shape \(2, 2\)"):
        x.item()


@given(values=float_arrays())
def test_numpy_round_trip_is_exact(values: np.ndarray) -> None:
    np.testing.assert_array_equal(ta.tensor(values).numpy(), values)
    assert ta.tensor(values).dtype == np.float64  # a NumPy float64 array keeps its dtype


def test_python_floats_make_float32_tensors() -> None:
    assert ta.tensor([1.0, 2.0]).dtype == np.float32
    assert ta.tensor([1, 2]).dtype == np.int64


def test_repr_shows_shape_dtype_device_and_requires_grad(device: str) -> None:
    x = ta.tensor(np.ones((2, 3)), dtype="float16", device=device, requires_grad=True)
    r = repr(x)
    assert "shape=(2, 3)" in r
    assert "dtype=float16" in r
    assert f"device='{device}'" in r
    assert "requires_grad=True" in r
    assert "creator=Mul" in repr(x * 2)
    assert "requires_grad" not in repr(ta.tensor([1.0], device=device))


# ---- the same numbers on every device -------------------------------------------------------------
def _mlp_reference(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, labels: np.ndarray) -> dict:
    """Forward and backward of mean cross-entropy(tanh(x W1^T + b1) W2^T), by hand in float64."""
    z1 = x @ w1.T + b1
    h = np.tanh(z1)
    z2 = h @ w2.T
    shifted = z2 - z2.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    n = x.shape[0]
    loss = -log_p[np.arange(n), labels].mean()
    dz2 = np.exp(log_p)
    dz2[np.arange(n), labels] -= 1
    dz2 /= n
    dw2 = dz2.T @ h
    dz1 = (dz2 @ w2) * (1 - h * h)
    return {"loss": loss, "x": dz1 @ w1, "w1": dz1.T @ x, "b1": dz1.sum(axis=0), "w2": dw2}


@pytest.mark.parametrize(("dtype", "rtol"), [("float64", 1e-12), ("float32", 1e-5)])
def test_mlp_forward_and_backward_match_a_float64_numpy_reference(device: str, dtype: str, rtol: float) -> None:
    rng = np.random.default_rng(42)
    arrays = {
        "x": rng.standard_normal((6, 4)),
        "w1": rng.standard_normal((5, 4)) * 0.5,
        "b1": rng.standard_normal(5) * 0.1,
        "w2": rng.standard_normal((3, 5)) * 0.5,
    }
    labels = np.array([0, 2, 1, 1, 0, 2])
    # the reference sees the inputs as rounded to `dtype`, so only the arithmetic differs
    ref = _mlp_reference(*(a.astype(dtype).astype(np.float64) for a in arrays.values()), labels)
    t = {k: ta.tensor(v, dtype=dtype, device=device, requires_grad=True) for k, v in arrays.items()}
    h = ta.tanh(ta.linear(t["x"], t["w1"], t["b1"]))
    loss = ta.cross_entropy(ta.linear(h, t["w2"]), ta.tensor(labels, device=device))
    loss.backward()
    assert loss.dtype == np.dtype(dtype) and loss.device == device
    np.testing.assert_allclose(loss.item(), ref["loss"], rtol=rtol)
    for k in arrays:
        assert t[k].grad.dtype == np.dtype(dtype)
        np.testing.assert_allclose(host(t[k].grad), ref[k], rtol=rtol, atol=rtol * 1e-1)


# ---- graphs where one node feeds several consumers --------------------------------------------------
def test_a_node_used_twice_receives_both_gradients(device: str) -> None:
    # h feeds the Add directly and through a Mul; the walk must finish both consumers
    # before it sends h's gradient on (d/dx of 3x + 3x*1 is 6).
    x = ta.tensor([1.0, 2.0], requires_grad=True, device=device)
    h = x * 3.0
    (h + h * 1.0).sum().backward()
    np.testing.assert_array_equal(host(x.grad), [6.0, 6.0])


@given(data=st.data())
def test_random_dags_with_shared_nodes_match_finite_differences(data: st.DataObject) -> None:
    """A random DAG: each new node combines two earlier nodes (so nodes get many consumers)."""
    steps = data.draw(dag_steps())
    x0 = ta.tensor(data.draw(float_arrays((3,), low=-1.0, high=1.0)), requires_grad=True)
    x1 = ta.tensor(data.draw(float_arrays((3,), low=-1.0, high=1.0)), requires_grad=True)

    def fn(a: ta.Tensor, b: ta.Tensor) -> ta.Tensor:
        nodes = [a, b]
        for i, j, op in steps:
            u, v = nodes[i % len(nodes)], nodes[j % len(nodes)]
            nodes.append(u + v if op == "+" else u * v if op == "*" else (u - v).tanh())
        return sum(nodes[2:], nodes[0] * nodes[1])

    assert ta.gradcheck(fn, [x0, x1])


def test_a_seed_gradient_array_is_never_stored_as_a_leaf_grad() -> None:
    a = ta.tensor(np.ones(3), requires_grad=True)
    b = ta.tensor(np.ones(3), requires_grad=True)
    seed = np.ones(3)
    (a + b).backward(seed)
    a.grad *= 2
    np.testing.assert_array_equal(seed, np.ones(3))
    np.testing.assert_array_equal(b.grad, np.ones(3))


def test_a_retained_grad_is_writable_and_owned() -> None:
    x = ta.tensor(np.ones(3), requires_grad=True)
    y = x * 2.0
    y.retain_grad()
    y.sum().backward()  # Sum's backward hands y a read-only broadcast view
    y.grad *= 2
    np.testing.assert_array_equal(y.grad, [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(x.grad, [2.0, 2.0, 2.0])


def test_backward_releases_intermediates_that_only_the_graph_holds() -> None:
    import weakref

    x = ta.tensor(np.ones(3), requires_grad=True)
    hidden = (x * 2.0).tanh()  # tanh saves its output: this array
    probe = weakref.ref(hidden.data)
    out = (hidden * 3.0).sum()
    del hidden
    assert probe() is not None  # the graph keeps it for backward
    out.backward()
    assert probe() is None  # released as the walk passed it


def test_the_graph_keeps_only_what_backward_needs() -> None:
    """An intermediate that no backward reads (ReLU keeps its output, not its input) is freed at once."""
    import weakref

    x = ta.tensor(np.linspace(-1, 1, 6), requires_grad=True)
    pre = x * 2.0
    probe = weakref.ref(pre.data)
    out = pre.relu()
    edge = out.creator.inputs[0]
    assert edge.creator is pre.creator and edge.shape == (6,) and edge.dtype == pre.dtype
    del pre
    assert probe() is None  # the edge knows where gradients go and their shape, not the values
    out.sum().backward()
    np.testing.assert_array_equal(x.grad, np.where(np.linspace(-1, 1, 6) > 0, 2.0, 0.0))


def test_tensor_keeps_an_array_on_its_own_device(device: str) -> None:
    on_device = ta.tensor([1.0, 2.0], device=device)
    copy = ta.tensor(on_device.data)  # no device given: where the array already is
    assert copy.device == device and copy.data is not on_device.data
    assert ta.tensor([1.0]).device == "cpu"


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_gradients_of_0d_tensors_are_0d_arrays(dtype: str) -> None:
    """NumPy's arithmetic on 0-d arrays returns scalars; every gradient must still be an array
    (an optimizer and the loss scaler change it in place)."""
    w = ta.tensor(0.5, dtype=dtype, requires_grad=True)
    u = w * w
    u.retain_grad()
    loss = u * w + w  # w reaches the loss by three paths: their gradients are summed
    loss.backward()
    for g in (w.grad, u.grad):
        assert isinstance(g, np.ndarray) and g.shape == () and g.dtype == np.dtype(dtype)
    assert float(w.grad) == 3 * 0.5**2 + 1 and float(u.grad) == 0.5
    assert isinstance(loss.data, np.ndarray) and loss.data.shape == ()  # forward outputs are arrays too
