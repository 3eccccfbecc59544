"""autocast and its op policy: which dtype each op computes in, the cast log, the parameter cache.

The strongest check is an equivalence: a program under autocast is bit for bit the same
program written by hand with explicit ``.half()`` / ``.float()`` casts, forward and
backward.  Against the FP32 model the agreement is bounded by a forward error analysis
of float16 rounding (see ``fp16_error_bound``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given
from strategies import float_arrays, linear_shapes

import tinyamp as ta
from tinyamp import autocast as autocast_module
from tinyamp import autograd
from tinyamp.amp import DEFAULT_POLICY, CastRecord, autocast, format_policy, is_autocast_enabled
from tinyamp.casting import Cast

try:
    import ml_dtypes
except ImportError:  # bfloat16 is optional
    ml_dtypes = None

pytestmark = pytest.mark.policy

needs_ml_dtypes = pytest.mark.skipif(ml_dtypes is None, reason="bfloat16 needs the optional package ml_dtypes")

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
LABELS = np.array([0, 2, 1, 2])


def bits(array: np.ndarray) -> np.ndarray:
    """The bit patterns of an array: equality of these is bit-exactness (-0.0 != 0.0, NaN == NaN)."""
    return np.ascontiguousarray(array).view(f"u{array.dtype.itemsize}")


def assert_bits_equal(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(bits(a), bits(b))


def data(shape: tuple[int, ...], dtype: np.dtype = F32, seed: int = 0, low: float = -2.0, high: float = 2.0):
    return np.random.default_rng(seed).uniform(low, high, shape).astype(dtype)


@pytest.fixture(autouse=True)
def no_autocast_leaks():
    """Every test starts and ends outside autocast."""
    assert autocast_module.current() is None
    yield
    assert autocast_module.current() is None


# ---- which dtype each op runs in ------------------------------------------------------------------
LOWER_OPS: dict[str, Callable[[ta.Tensor, ta.Tensor, ta.Tensor], ta.Tensor]] = {
    "linear": lambda x, w, b: ta.linear(x, w, b),
    "linear without bias": lambda x, w, b: ta.linear(x, w),
    "matmul": lambda x, w, b: ta.matmul(x, w.T),
    "x @ W^T": lambda x, w, b: x @ w.T,
}

FP32_OPS: dict[str, Callable[[ta.Tensor], ta.Tensor]] = {
    "softmax": lambda x: ta.softmax(x),
    "log_softmax": lambda x: ta.log_softmax(x),
    "cross_entropy": lambda x: ta.cross_entropy(x, LABELS),
    "layer_norm": lambda x: ta.layer_norm(x),
    "exp": lambda x: ta.exp(x),
    "log": lambda x: ta.log(x),
    "sum": lambda x: x.sum(),
    "mean": lambda x: x.mean(axis=0),
}


@pytest.mark.parametrize("op", list(LOWER_OPS))
@pytest.mark.parametrize("dtype", [F16, F32])
def test_products_run_in_float16_and_equal_the_hand_cast_program(op: str, dtype: np.dtype) -> None:
    x = ta.tensor(data((4, 3), dtype, 1))
    w = ta.tensor(data((5, 3), dtype, 2), requires_grad=True)
    b = ta.tensor(data((5,), dtype, 3), requires_grad=True)
    with autocast():
        y = LOWER_OPS[op](x, w, b)
    assert y.dtype == F16
    assert y.data.dtype == F16 and y.data.nbytes == 2 * y.size  # really stored in two bytes
    by_hand = LOWER_OPS[op](x.half(), w.half(), b.half())
    assert_bits_equal(y.numpy(), by_hand.numpy())


@pytest.mark.parametrize("op", list(FP32_OPS))
@pytest.mark.parametrize("dtype", [F16, F32])
def test_sensitive_ops_run_in_float32_even_for_float16_inputs(op: str, dtype: np.dtype) -> None:
    x = ta.tensor(data((4, 3), dtype, 4, low=0.1))  # positive: log's domain
    with autocast():
        y = FP32_OPS[op](x)
    assert y.dtype == F32
    assert_bits_equal(y.numpy(), FP32_OPS[op](x.float()).numpy())


@pytest.mark.parametrize("op", list(FP32_OPS))
def test_outside_autocast_float16_stays_float16(op: str) -> None:
    x = ta.tensor(data((4, 3), F16, 4, low=0.1))
    assert not is_autocast_enabled()
    assert FP32_OPS[op](x).dtype == F16


@pytest.mark.parametrize("op", list(LOWER_OPS))
def test_outside_autocast_products_keep_float32(op: str) -> None:
    x, w, b = (ta.tensor(data(s, F32, i)) for i, s in enumerate([(4, 3), (5, 3), (5,)]))
    with autocast():
        pass
    assert LOWER_OPS[op](x, w, b).dtype == F32


def test_mixed_add_promotes_to_the_wider_dtype() -> None:
    a, b = ta.tensor(data((3,), F16)), ta.tensor(data((3,), F32, 1))
    with autocast(log_casts=True) as ac:
        s, t = a + b, b - a
    assert s.dtype == t.dtype == F32
    assert ac.cast_log == [CastRecord("add", "float16", "float32", (3,), False)] + [
        CastRecord("sub", "float16", "float32", (3,), False)
    ]
    assert_bits_equal(s.numpy(), a.numpy().astype(F32) + b.numpy())
    with autocast(log_casts=True) as ac:
        assert (a * a).dtype == F16  # nothing to promote: float16 elementwise stays float16
    assert ac.cast_log == []


def test_float64_inputs_are_left_alone() -> None:
    x = ta.tensor(data((4, 3), F64))
    w = ta.tensor(data((5, 3), F64, 1), requires_grad=True)
    with autocast(log_casts=True) as ac:
        y = ta.linear(x, w)
        p = ta.softmax(y)
        s = y.sum()
    assert y.dtype == p.dtype == s.dtype == F64
    assert ac.cast_log == []
    s.backward()
    assert w.grad.dtype == F64


def test_autocast_lowers_only_to_a_16_bit_float() -> None:
    with pytest.raises(ValueError, match="16-bit float.*float32"):
        autocast("float32")


@needs_ml_dtypes
def test_bfloat16_autocast_lowers_products_to_bfloat16() -> None:
    bf16 = np.dtype(ml_dtypes.bfloat16)
    x, w = ta.tensor(data((4, 3))), ta.tensor(data((5, 3), seed=1), requires_grad=True)
    with autocast("bfloat16"):
        y = ta.linear(x, w)
        p = ta.softmax(y)
    assert y.dtype == bf16 and p.dtype == F32
    expected = (x.numpy().astype(bf16).astype(F32) @ w.numpy().astype(bf16).astype(F32).T).astype(bf16)
    assert_bits_equal(y.numpy(), expected)


# ---- entering and leaving -------------------------------------------------------------------------
def test_is_autocast_enabled_only_inside_the_block() -> None:
    assert not is_autocast_enabled()
    with autocast() as ac:
        assert is_autocast_enabled()
        assert autocast_module.current() is ac
    assert not is_autocast_enabled()
    with autocast(enabled=False):
        assert not is_autocast_enabled()


def test_an_exception_inside_the_block_restores_everything() -> None:
    w = ta.tensor(data((5, 3)), requires_grad=True)
    with pytest.raises(RuntimeError, match="boom"):
        with autocast() as ac:
            ta.linear(ta.tensor(data((2, 3))), w)
            raise RuntimeError("boom")
    assert not is_autocast_enabled()
    assert ac._cache == {}
    assert ta.linear(ta.tensor(data((2, 3))), w).dtype == F32


def test_nested_blocks_restore_the_outer_one() -> None:
    x, w = ta.tensor(data((2, 3))), ta.tensor(data((5, 3)), requires_grad=True)
    with autocast(policy={"softmax": "lower"}) as outer:
        with autocast(enabled=False):
            assert not is_autocast_enabled()
            assert ta.linear(x, w).dtype == F32
        assert autocast_module.current() is outer
        with autocast() as inner:
            assert autocast_module.current() is inner
            assert ta.softmax(x).dtype == F32  # the inner block's default policy
        assert autocast_module.current() is outer
        assert ta.linear(x, w).dtype == F16
        assert ta.softmax(x).dtype == F16  # the outer override is back
    assert not is_autocast_enabled()


# ---- the policy ----------------------------------------------------------------------------------
def test_a_policy_override_takes_effect_in_its_block_only() -> None:
    x = ta.tensor(data((2, 3)))
    with autocast(policy={"softmax": "lower"}) as ac:
        y = ta.softmax(x)
    assert y.dtype == F16
    assert_bits_equal(y.numpy(), ta.softmax(x.half()).numpy())
    assert ac.policy["softmax"] == "lower" and DEFAULT_POLICY["softmax"] == "fp32"  # the default is not changed
    with autocast():
        assert ta.softmax(x).dtype == F32


def test_an_unknown_rule_is_a_clear_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"unknown autocast rule 'sideways' for op 'softmax'.*lower"):
        autocast(policy={"softmax": "sideways"})
    assert not is_autocast_enabled()


@pytest.mark.parametrize("op", ["linear", "matmul"])
def test_lower_fp32_out_returns_the_unrounded_float32_accumulator(op: str) -> None:
    x, w, b = data((6, 7), seed=5), data((4, 7), seed=6), data((4,), seed=7)
    with autocast(policy={op: "lower_fp32_out"}):
        y = ta.linear(ta.tensor(x), ta.tensor(w), ta.tensor(b)) if op == "linear" else ta.tensor(x) @ ta.tensor(w.T)
    assert y.dtype == F32
    x32, w32, b32 = (a.astype(F16).astype(F32) for a in (x, w, b))  # the FP16 operands, widened exactly
    expected = x32 @ w32.T + b32 if op == "linear" else x32 @ w32.T
    assert_bits_equal(y.numpy(), expected)
    assert np.any(expected.astype(F16).astype(F32) != expected)  # rounding would have changed it


def test_format_policy_lists_every_op_with_its_rule() -> None:
    lines = format_policy().splitlines()
    assert lines[0].split()[:2] == ["op", "rule"]
    assert [line.split()[:2] for line in lines[1:]] == [[op, rule] for op, rule in DEFAULT_POLICY.items()]


# ---- the cast log --------------------------------------------------------------------------------
def test_the_cast_log_lists_op_dtypes_shape_and_cache_hits() -> None:
    x = ta.tensor(data((2, 3)))
    w, b = ta.tensor(data((4, 3)), requires_grad=True), ta.tensor(data((4,)), requires_grad=True)
    with autocast(log_casts=True) as ac:
        ta.softmax(ta.linear(x, w, b) + ta.linear(x, w, b))
    assert ac.cast_log == [
        CastRecord("linear", "float32", "float16", (2, 3), False),  # x needs no grad: never cached
        CastRecord("linear", "float32", "float16", (4, 3), False),
        CastRecord("linear", "float32", "float16", (4,), False),
        CastRecord("linear", "float32", "float16", (2, 3), False),
        CastRecord("linear", "float32", "float16", (4, 3), True),
        CastRecord("linear", "float32", "float16", (4,), True),
        CastRecord("softmax", "float16", "float32", (2, 4), False),
    ]
    table = ac.format_cast_log().splitlines()
    assert table[0].split() == ["op", "from", "to", "shape", "cached"]
    assert len(table) == 1 + len(ac.cast_log)
    assert table[5].split() == ["linear", "float32", "float16", "(4,", "3)", "yes"]
    assert "7 casts logged" in repr(ac)


def test_the_cast_log_is_empty_unless_asked_for() -> None:
    with autocast() as ac:
        ta.linear(ta.tensor(data((2, 3))), ta.tensor(data((4, 3))))
    assert ac.cast_log == []


# ---- the parameter cache ----------------------------------------------------------------------------
def shared_weight_net(x: ta.Tensor, w: ta.Tensor) -> ta.Tensor:
    """The same square weight in two layers: linear(relu(linear(x, W)), W)."""
    return ta.linear(ta.relu(ta.linear(x, w)), w)


def test_a_weight_used_twice_is_cast_once_by_one_node() -> None:
    x, w = ta.tensor(data((3, 4))), ta.tensor(data((4, 4), seed=1), requires_grad=True)
    with autocast(log_casts=True) as ac:
        y = shared_weight_net(x, w)
    assert [r.cached for r in ac.cast_log if r.shape == (4, 4)] == [False, True]
    second = y.creator.inputs[1]
    first = y.creator.inputs[0].creator.inputs[0].creator.inputs[1]
    assert first is second  # the same float16 tensor ...
    assert isinstance(second.creator, Cast) and second.creator.inputs[0] is w  # ... made by one Cast node
    nodes = [fn for fn in autograd.walk(y) if isinstance(fn, Cast) and fn.inputs[0] is w]
    assert len(nodes) == 1


def test_a_shared_weight_gets_the_gradient_of_the_hand_cast_program_bit_for_bit() -> None:
    x, w = ta.tensor(data((3, 4))), ta.tensor(data((4, 4), seed=1), requires_grad=True)
    with autocast():
        loss = shared_weight_net(x, w).sum()
    loss.backward()
    amp_grad, w.grad = w.grad, None
    w16 = w.half()  # cast once, used twice: the two float16 gradients meet at this node
    shared_weight_net(x.half(), w16).float().sum().backward()
    assert amp_grad.dtype == F32
    assert_bits_equal(amp_grad, w.grad)


def test_cast_once_means_the_two_gradients_are_summed_in_float16() -> None:
    # d/dW of sum(x1 W^T) + sum(x2 W^T) is 2048 + 1 in float16: a tie, rounded to 2048.
    # Two separate casts would sum 2048 + 1 in float32 at the weight: 2049.
    w = ta.tensor([[0.5]], requires_grad=True)
    x1, x2 = ta.tensor([[2048.0]]), ta.tensor([[1.0]])
    with autocast():
        (ta.linear(x1, w).sum() + ta.linear(x2, w).sum()).backward()
    assert w.grad.dtype == F32 and w.grad[0, 0] == 2048.0
    w.grad = None
    (ta.linear(x1.half(), w.half()).float().sum() + ta.linear(x2.half(), w.half()).float().sum()).backward()
    assert w.grad[0, 0] == 2049.0


def test_the_cache_is_cleared_at_block_exit() -> None:
    x, w = ta.tensor(data((2, 3))), ta.tensor(data((4, 3)), requires_grad=True)
    with autocast(log_casts=True) as ac:
        first = ta.linear(x, w).creator.inputs[1]
        assert len(ac._cache) == 1
    assert ac._cache == {}
    with ac:  # the same object again: a fresh cast
        second = ta.linear(x, w).creator.inputs[1]
    assert second is not first
    assert [r.cached for r in ac.cast_log if r.shape == (4, 3)] == [False, False]


def test_a_changed_weight_is_cast_again_in_the_next_block() -> None:
    x, w = ta.tensor(np.ones((1, 1), F32)), ta.tensor([[1.0]], requires_grad=True)
    with autocast():
        assert ta.linear(x, w).item() == 1.0
    w.data[...] = 3.0  # an optimizer step, outside the block
    with autocast():
        assert ta.linear(x, w).item() == 3.0


def test_a_first_use_under_no_grad_does_not_cut_the_weight_off_its_gradient() -> None:
    x, w = ta.tensor(data((2, 3))), ta.tensor(data((4, 3)), requires_grad=True)
    with autocast():
        with ta.no_grad():
            ta.linear(x, w)  # e.g. an evaluation pass inside the block
        y = ta.linear(x, w)
    assert y.requires_grad
    y.sum().backward()
    assert w.grad is not None and w.grad.dtype == F32


def test_gradient_accumulation_over_two_backwards_in_one_block() -> None:
    x, w = ta.tensor(data((2, 3))), ta.tensor(data((4, 3)), requires_grad=True)
    with autocast():
        ta.linear(x, w).sum().backward()
        once = w.grad.copy()
        ta.linear(x, w).sum().backward()  # the cached copy's node was freed: it is cast afresh
    assert_bits_equal(w.grad, 2 * once)


def test_two_losses_sharing_a_cached_weight_backpropagate_separately() -> None:
    x, w = ta.tensor(data((2, 3))), ta.tensor(data((4, 3)), requires_grad=True)
    with autocast():
        first, second = ta.linear(x, w).sum(), ta.linear(x, w).sum()
    first.backward()
    second.backward()
    assert w.grad is not None


def test_float32_parameters_get_float32_gradients_and_float16_copies() -> None:
    model = ta.nn.MLP([3, 5, 2])
    x = ta.tensor(data((4, 3)), requires_grad=True)
    with autocast():
        logits = model(x)
        loss = ta.cross_entropy(logits, np.array([0, 1, 1, 0]))
    assert logits.dtype == F16 and loss.dtype == F32
    loss.backward()
    for name, p in model.named_parameters():
        assert p.dtype == F32 and p.grad.dtype == F32, name
    assert x.grad.dtype == F32


def test_an_mlp_under_autocast_is_the_hand_cast_mlp_bit_for_bit() -> None:
    model = ta.nn.MLP([6, 8, 8, 3])
    x = ta.tensor(data((5, 6), seed=9))
    with autocast():
        loss = ta.cross_entropy(model(x), np.array([0, 1, 2, 0, 1]))
    loss.backward()
    amp = {n: p.grad for n, p in model.named_parameters()}
    model.zero_grad()
    h = x.half()
    for i, layer in enumerate(model):
        h = ta.linear(h, layer.weight.half(), layer.bias.half()) if i % 2 == 0 else ta.relu(h)
    by_hand = ta.cross_entropy(h.float(), np.array([0, 1, 2, 0, 1]))
    assert_bits_equal(loss.numpy(), by_hand.numpy())
    by_hand.backward()
    for n, p in model.named_parameters():
        assert_bits_equal(amp[n], p.grad)


# ---- agreement with the FP32 model ------------------------------------------------------------------
U16, U32, TINY = 2.0**-11, 2.0**-24, 2.0**-25


def fp16_error_bound(layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Elementwise bounds on |autocast output - exact| and |FP32 output - exact| for an MLP with ReLU.

    Each float16 rounding of z errs by at most u|z| + 2^-25 (u = 2^-11; the 2^-25 covers the
    subnormal range).  A linear layer under autocast rounds its input, weight and bias
    (u each), sums K products and the bias in float32 (at most gamma = (K+2) 2^-24 / (1 - (K+2) 2^-24)
    times the sum of magnitudes, Higham's bound), and rounds the result once (u).  The error
    of the layer's input passes through |W|; ReLU is 1-Lipschitz and passes it unchanged.  The
    FP32 model has only the float32 summation errors.  Magnitudes of the rounded quantities
    are bounded by the exact ones plus their error bounds, so the result is a true bound.
    """
    h = x.astype(F64)
    e16 = U16 * np.abs(h) + TINY  # the input is cast to float16
    e32 = np.zeros_like(h)
    for i, (w, b) in enumerate(layers):
        w, b = w.astype(F64), b.astype(F64)
        k = w.shape[1]
        gamma = (k + 2) * U32 / (1 - (k + 2) * U32)
        aw, ab = np.abs(w), np.abs(b)
        h16 = np.abs(h) + e16  # |rounded input| <= |exact| + error
        w16, b16 = (1 + U16) * aw + TINY, (1 + U16) * ab + TINY
        z = h @ w.T + b
        before_rounding = (
            e16 @ aw.T  # the input's error, through W
            + h16 @ (U16 * aw + TINY).T  # the weight's rounding
            + U16 * ab
            + TINY  # the bias's rounding
            + gamma * (h16 @ w16.T + b16)  # the float32 accumulation
        )
        e16 = before_rounding + U16 * (np.abs(z) + before_rounding) + TINY  # the single rounding of the output
        e32 = e32 @ aw.T + gamma * ((np.abs(h) + e32) @ aw.T + ab)
        h = np.maximum(z, 0) if i < len(layers) - 1 else z
    return e16, e32


@given(x=float_arrays((6, 8), -4.0, 4.0))
def test_an_mlp_under_autocast_matches_fp32_within_the_float16_error_bound(x: np.ndarray) -> None:
    ta.manual_seed(0)
    model = ta.nn.MLP([8, 16, 16, 4])
    x32 = x.astype(F32)
    fp32 = model(ta.tensor(x32)).numpy().astype(F64)
    with autocast():
        amp = model(ta.tensor(x32))
    assert amp.dtype == F16
    layers = [(m.weight.numpy(), m.bias.numpy()) for m in model if isinstance(m, ta.nn.Linear)]
    e16, e32 = fp16_error_bound(layers, x32)
    error = np.abs(amp.numpy().astype(F64) - fp32)
    assert np.all(error <= e16 + e32)
    # The bound means something: about three float16 roundings per layer relative to the
    # scale of the computation, s = |W_L| ... |W_1| |x| (plus biases), so a result with
    # bfloat16-sized errors (2^-8) would fail it.
    scale = np.abs(x32.astype(F64))
    for w, b in layers:
        scale = scale @ np.abs(w.astype(F64)).T + np.abs(b.astype(F64))
    assert np.all(e16 + e32 <= (3 * len(layers) + 1) * U16 * scale + 2.0**-20)


def test_autocast_really_differs_from_fp32() -> None:
    ta.manual_seed(0)
    model = ta.nn.MLP([8, 16, 4])
    x = ta.tensor(data((6, 8), seed=3))
    with autocast():
        amp = model(x).numpy()
    assert np.any(amp.astype(F32) != model(x).numpy())


@given(shapes=linear_shapes())
def test_linear_under_autocast_keeps_shape_and_stores_two_bytes_per_value(shapes) -> None:
    x_shape, w_shape = shapes
    x = ta.tensor(data(x_shape, seed=1))
    w = ta.tensor(data(w_shape, seed=2), requires_grad=True)
    with autocast():
        y = ta.linear(x, w)
    assert y.shape == x_shape[:-1] + (w_shape[0],)
    assert y.data.dtype == F16 and y.data.nbytes == 2 * y.size
    y.float().sum().backward()
    assert w.grad.dtype == F32 and w.grad.shape == w_shape
