"""tinyamp.optim: update rules against their formulas and torch.optim, state, checkpoints, memory.

Tolerances: the comparisons with formulas run in float64, where the only difference is
the order of roundings (e.g. $(m / d) \\cdot \\eta$ against $\\eta m / d$): a few ulps of
the weights per step, below 1e-13 for |w| < 100 after a handful of steps.  Any wrong term
(bias correction, eps placement, decay coupling, momentum) moves a weight by at least
lr * |g| > 1e-5.  ``rtol=1e-11, atol=1e-13`` sits between the two.
"""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinyamp as ta
from tinyamp import nn, optim
from tinyamp.backend import is_array, to_device

pytestmark = pytest.mark.optim

RTOL, ATOL = 1e-11, 1e-13
SHAPES = [(3, 4), (5,)]


def assert_bit_equal(a: Any, b: Any) -> None:
    """Same dtype, shape and bytes (arrays on either device): stricter than ==."""
    a, b = to_device(a, "cpu"), to_device(b, "cpu")
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


def problem(seed: int, steps: int, dtype: Any = np.float64) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """Initial weights and a fixed sequence of gradients (one list per step)."""
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    grads = [[rng.standard_normal(s).astype(dtype) for s in SHAPES] for _ in range(steps)]
    return weights, grads


def run(
    make: Callable[[list[nn.Parameter]], optim.Optimizer], weights: list, grads: list, device: str = "cpu"
) -> list[np.ndarray]:
    """The weights after one optimizer step per entry of `grads` (as NumPy arrays)."""
    params = [nn.Parameter(to_device(w, device)) for w in weights]
    opt = make(params)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = to_device(g.copy(), device)  # a copy: the check below must not compare g with itself
        opt.step()
        for p, g in zip(params, step_grads):
            assert_bit_equal(p.grad, g)  # the optimizer reads gradients, never writes them
    return [p.numpy() for p in params]


# ---- the formulas, written the textbook way ------------------------------------------------------
def sgd_formula(w: np.ndarray, grads: list, lr: float, momentum: float, weight_decay: float, nesterov: bool) -> Any:
    b = None
    for g in grads:
        g = g + weight_decay * w
        if momentum:
            b = g if b is None else momentum * b + g
            g = g + momentum * b if nesterov else b
        w = w - lr * g
    return w


def adam_formula(w: np.ndarray, grads: list, lr: float, betas: tuple, eps: float, wd: float, decoupled: bool) -> Any:
    b1, b2 = betas
    m = v = np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        if decoupled:
            w = w - lr * wd * w
        else:
            g = g + wd * w
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        w = w - lr * m_hat / (np.sqrt(v_hat) + eps)
    return w


def per_param(grads: list, i: int) -> list[np.ndarray]:
    return [step[i] for step in grads]


# ---- update rules ------------------------------------------------------------------------------------
@given(
    lr=st.floats(1e-4, 1.0),
    momentum=st.sampled_from([0.0, 0.5, 0.9, 0.99]),
    weight_decay=st.sampled_from([0.0, 1e-4, 0.1]),
    nesterov=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_sgd_follows_its_formula(
    device: str, lr: float, momentum: float, weight_decay: float, nesterov: bool, seed: int
) -> None:
    nesterov = nesterov and momentum > 0
    weights, grads = problem(seed, steps=5)
    got = run(lambda ps: optim.SGD(ps, lr, momentum, weight_decay, nesterov), weights, grads, device)
    for i, w in enumerate(weights):
        expected = sgd_formula(w, per_param(grads, i), lr, momentum, weight_decay, nesterov)
        np.testing.assert_allclose(got[i], expected, rtol=RTOL, atol=ATOL)


@given(
    lr=st.floats(1e-4, 0.1),
    beta1=st.sampled_from([0.0, 0.5, 0.9]),
    beta2=st.sampled_from([0.0, 0.9, 0.999]),
    eps=st.sampled_from([1e-8, 1e-3, 0.5]),  # 0.5: where eps sits (inside or outside the sqrt) shows
    weight_decay=st.sampled_from([0.0, 0.01, 0.3]),
    decoupled=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_adam_and_adamw_follow_their_formulas(
    device: str, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, decoupled: bool, seed: int
) -> None:
    cls = optim.AdamW if decoupled else optim.Adam
    weights, grads = problem(seed, steps=5)
    got = run(lambda ps: cls(ps, lr, (beta1, beta2), eps, weight_decay), weights, grads, device)
    for i, w in enumerate(weights):
        expected = adam_formula(w, per_param(grads, i), lr, (beta1, beta2), eps, weight_decay, decoupled)
        np.testing.assert_allclose(got[i], expected, rtol=RTOL, atol=ATOL)


TORCH_CASES = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    ("SGD", {"lr": 0.05, "momentum": 0.8, "weight_decay": 0.1}),
    ("Adam", {"lr": 0.01}),
    ("Adam", {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-3, "weight_decay": 0.1}),
    ("AdamW", {"lr": 0.01}),
    ("AdamW", {"lr": 0.01, "weight_decay": 0.5}),
]


@pytest.mark.parametrize(("name", "hyper"), TORCH_CASES, ids=[f"{n}-{h}" for n, h in TORCH_CASES])
def test_updates_match_torch_optim(name: str, hyper: dict) -> None:
    torch = pytest.importorskip("torch")
    weights, grads = problem(7, steps=8)
    got = run(lambda ps: getattr(optim, name)(ps, **hyper), weights, grads)
    params = [torch.nn.Parameter(torch.from_numpy(w.copy())) for w in weights]
    opt = getattr(torch.optim, name)(params, **hyper)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = torch.from_numpy(g.copy())
        opt.step()
    for mine, theirs in zip(got, params):
        np.testing.assert_allclose(mine, theirs.detach().numpy(), rtol=RTOL, atol=ATOL)


def test_changing_lr_between_steps_takes_effect() -> None:
    p = nn.Parameter(np.array([1.0]))
    opt = optim.SGD([p], lr=0.1)
    p.grad = np.array([1.0])
    opt.step()
    opt.lr = 0.5
    opt.step()
    np.testing.assert_allclose(p.data, [1.0 - 0.1 - 0.5], rtol=1e-15)


# ---- what step() does with odd gradients ---------------------------------------------------------------
@pytest.mark.parametrize("make", [lambda p, lr: optim.SGD(p, lr=lr, momentum=0.9), lambda p, lr: optim.AdamW(p, lr=lr)])
def test_a_numpy_scalar_learning_rate_updates_in_the_parameters_dtype(make: Callable) -> None:
    """np.float64(0.05) from a schedule is a strong type under NumPy 2: kept as is, it would
    compute float32 updates in float64 and round differently.  The optimizer stores it as
    a Python float, so both give the same bits."""
    rng = np.random.default_rng(0)
    w0, g = rng.standard_normal(4096).astype(np.float32), rng.standard_normal(4096).astype(np.float32)
    results = []
    for lr in (0.05, np.float64(0.05)):
        w = ta.tensor(w0, requires_grad=True)
        opt = make([w], lr)
        opt.lr = lr  # the way a schedule sets it between steps
        for _ in range(3):
            w.grad = g.copy()
            opt.step()
        assert type(opt.lr) is float
        results.append(w.numpy())
    assert results[0].tobytes() == results[1].tobytes()


def test_a_parameter_without_grad_is_skipped_and_keeps_its_own_step_count() -> None:
    weights, grads = problem(0, steps=3)
    a, b = nn.Parameter(weights[0]), nn.Parameter(weights[1])
    opt = optim.Adam([a, b], lr=0.1)
    for step_grads in grads[:2]:
        a.grad, b.grad = step_grads[0].copy(), None
        opt.step()
    assert_bit_equal(b.data, weights[1])
    assert opt.state[1] == {}
    a.grad, b.grad = grads[2][0].copy(), grads[2][1].copy()
    opt.step()
    assert opt.state[0]["step"] == 3 and opt.state[1]["step"] == 1 and opt.step_count == 3
    # b's first step has full bias correction: as if it were Adam's step 1
    expected_b = adam_formula(weights[1], [grads[2][1]], 0.1, (0.9, 0.999), 1e-8, 0.0, False)
    np.testing.assert_allclose(b.data, expected_b, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("bad_grad", "message"),
    [
        (
            np.zeros(3, np.float32),
            r"parameter 0\.bias has shape \(8,\) and dtype float32, but its \.grad has shape \(3,\)",
        ),
        (np.zeros(8, np.float16), r"parameter 0\.bias .* but its \.grad has shape \(8,\) and dtype float16"),
    ],
)
def test_a_gradient_that_does_not_fit_is_an_error_naming_the_parameter(bad_grad: np.ndarray, message: str) -> None:
    model = nn.MLP([4, 8, 3])
    opt = optim.SGD(model.named_parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = np.ones(p.shape, np.float32)
    model[0].bias.grad = bad_grad
    before = [p.data.copy() for p in model.parameters()]
    with pytest.raises(ta.GradientError, match=message):
        opt.step()
    for p, b in zip(model.parameters(), before):  # checked before anything moved
        assert_bit_equal(p.data, b)
    assert opt.step_count == 0


def test_updates_are_in_place() -> None:
    model = nn.MLP([4, 8, 3])
    arrays = [p.data for p in model.parameters()]
    for opt in (optim.SGD(model.parameters(), 0.1, momentum=0.9), optim.AdamW(model.parameters())):
        for _ in range(2):
            for p in model.parameters():
                p.grad = np.ones(p.shape, np.float32)
            opt.step()
    assert all(p.data is a for p, a in zip(model.parameters(), arrays))


def test_zero_grad_clears_every_gradient() -> None:
    model = nn.MLP([2, 3])
    opt = optim.SGD(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = np.ones(p.shape, np.float32)
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


# ---- float16 parameters ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [lambda ps: optim.SGD(ps, 0.1, momentum=0.9, weight_decay=0.01), lambda ps: optim.AdamW(ps, 0.01)],
    ids=["sgd", "adamw"],
)
def test_float16_parameters_update_in_float32_and_round_once(make: Callable) -> None:
    """Each step: float16 weight -> float32, the float32 update, one rounding back to float16."""
    weights, grads = problem(3, steps=3, dtype=np.float16)
    p16 = [nn.Parameter(w) for w in weights]
    p32 = [nn.Parameter(w.astype(np.float32)) for w in weights]
    opt16, opt32 = make(p16), make(p32)
    for step_grads in grads:
        for a, b, g in zip(p16, p32, step_grads):
            a.grad, b.grad = g.copy(), g.astype(np.float32)
        opt16.step()
        opt32.step()
        for b in p32:  # without master weights, float32 state meets a float16 weight each step
            b.data[...] = b.data.astype(np.float16)
    for a, b in zip(p16, p32):
        assert a.dtype == np.float16
        assert_bit_equal(a.data, b.data.astype(np.float16))
    moments = [v for s in opt16.state for v in s.values() if isinstance(v, np.ndarray)]
    assert moments and all(m.dtype == np.float32 for m in moments)


# ---- memory: one temporary per parameter, at most ------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda ps: optim.SGD(ps, 0.1),
        lambda ps: optim.SGD(ps, 0.1, momentum=0.9),
        lambda ps: optim.Adam(ps),
        lambda ps: optim.AdamW(ps),
    ],
    ids=["sgd", "sgd-momentum", "adam", "adamw"],
)
def test_a_step_allocates_at_most_one_temporary_the_size_of_the_parameter(make: Callable) -> None:
    p = nn.Parameter(np.zeros(1_000_000, np.float32))
    opt = make([p])
    p.grad = np.ones(p.shape, np.float32)
    opt.step()  # the first step allocates the state (momentum, moments): not measured
    tracemalloc.start()  # NumPy reports its array buffers to tracemalloc
    try:
        opt.step()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * p.nbytes


# ---- checkpoints ------------------------------------------------------------------------------------------------
OPTIMIZERS = {
    "sgd-momentum": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
    "sgd-nesterov-wd": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adam-wd": lambda ps: optim.Adam(ps, lr=0.01, weight_decay=0.01),
    "adamw": lambda ps: optim.AdamW(ps, lr=0.01),
}


def batches(n: int, seed: int, device: str = "cpu") -> list[tuple[ta.Tensor, ta.Tensor]]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 8, 4)).astype(np.float32)
    y = rng.integers(0, 3, (n, 8))
    return [(ta.tensor(x[i], device=device), ta.tensor(y[i], device=device)) for i in range(n)]


def train(model: nn.Module, opt: optim.Optimizer, data: list) -> None:
    for x, y in data:
        opt.zero_grad()
        ta.cross_entropy(model(x), y).backward()
        opt.step()


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_checkpoint_continues_bit_identically(name: str, device: str) -> None:
    make = OPTIMIZERS[name]
    first, then = batches(3, 0, device), batches(4, 1, device)
    ta.manual_seed(0)
    model = nn.MLP([4, 8, 3]).to(device)
    opt = make(model.named_parameters())
    train(model, opt, first)
    model_sd, opt_sd = model.state_dict(), opt.state_dict()
    saved = [{k: v.copy() for k, v in s.items() if is_array(v)} for s in opt_sd["state"]]
    train(model, opt, then)

    ta.manual_seed(1)  # other weights, other hyperparameters: all must come from the checkpoint
    fresh = nn.MLP([4, 8, 3]).to(device)
    fresh_opt = make(fresh.named_parameters())
    fresh_opt.lr = 123.0
    fresh.load_state_dict(model_sd)
    fresh_opt.load_state_dict(opt_sd)
    assert fresh_opt.lr == opt.lr
    train(fresh, fresh_opt, then)

    for p, q in zip(model.parameters(), fresh.parameters()):
        assert_bit_equal(p.data, q.data)
    for s, t in zip(opt.state, fresh_opt.state):
        assert s.keys() == t.keys() and s
        for k in s:
            if is_array(s[k]):
                assert_bit_equal(s[k], t[k])
            else:
                assert s[k] == t[k]
    assert fresh_opt.step_count == opt.step_count == 7
    for s, before in zip(opt_sd["state"], saved):  # training on did not touch the checkpoint
        for k, v in before.items():
            assert_bit_equal(s[k], v)


def test_load_state_dict_errors_name_what_does_not_fit_and_change_nothing() -> None:
    model = nn.MLP([4, 8, 3])
    opt = optim.Adam(model.named_parameters(), lr=0.01)
    train(model, opt, batches(1, seed=0))
    sd = opt.state_dict()
    with pytest.raises(optim.OptimizerStateError, match="a state_dict of Adam; it cannot be loaded into AdamW"):
        optim.AdamW(model.parameters()).load_state_dict(sd)
    with pytest.raises(optim.OptimizerStateError, match="state for 4 parameters; this optimizer has 2"):
        optim.Adam(nn.Linear(4, 8).parameters()).load_state_dict(sd)
    other = nn.MLP([4, 9, 3])
    with pytest.raises(
        optim.OptimizerStateError,
        match=r"parameter 0\.weight has shape \(9, 4\) and dtype float32, but the state_dict was saved for "
        r"0\.weight of shape \(8, 4\)",
    ):
        optim.Adam(other.named_parameters()).load_state_dict(sd)
    target = optim.Adam(model.named_parameters(), lr=0.5)
    sd["state"][2]["exp_avg_sq"] = sd["state"][2]["exp_avg_sq"].astype(np.float16)
    with pytest.raises(
        optim.OptimizerStateError,
        match=r"state 'exp_avg_sq' of parameter 2\.weight: expected shape \(3, 8\) and dtype float32, "
        r"got shape \(3, 8\) and dtype float16",
    ):
        target.load_state_dict(sd)
    assert target.lr == 0.5 and target.step_count == 0 and all(s == {} for s in target.state)


def test_constructor_errors() -> None:
    model = nn.MLP([2, 3])
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="wrap one in a list"):
        optim.SGD(model[0].weight, lr=0.1)
    with pytest.raises(ValueError, match="parameter 1 .* is not a leaf"):
        optim.SGD([model[0].weight, model[0].weight * 2], lr=0.1)
    with pytest.raises(ValueError, match=r"parameter 0\.weight \(shape \(3, 2\)\) appears twice"):
        optim.SGD([("0.weight", model[0].weight)] * 2, lr=0.1)
    with pytest.raises(ValueError, match="nesterov=True needs a momentum > 0"):
        optim.SGD(model.parameters(), lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Adam: lr must be a finite number >= 0; got lr=-1. Pass one, e.g. lr=1e-3"):
        optim.Adam(model.parameters(), lr=-1)
    with pytest.raises(ValueError, match=r"betas must be a tuple of two numbers in \[0, 1\)"):
        optim.AdamW(model.parameters(), betas=(0.9, 1.0))


# ---- hyperparameters: finite numbers, checked whenever they are set ----------------------------------------------
MAKERS = {"SGD": lambda ps, **h: optim.SGD(ps, **{"lr": 0.1, **h}), "Adam": optim.Adam, "AdamW": optim.AdamW}
NOT_FINITE_OR_NEGATIVE = [math.nan, math.inf, -math.inf, -1.0]
BAD_HYPERPARAMETERS = [
    *[(kind, "lr", v) for kind in MAKERS for v in NOT_FINITE_OR_NEGATIVE],
    *[(kind, "weight_decay", v) for kind in MAKERS for v in NOT_FINITE_OR_NEGATIVE],
    *[("SGD", "momentum", v) for v in NOT_FINITE_OR_NEGATIVE],
    *[(kind, "eps", v) for kind in ("Adam", "AdamW") for v in NOT_FINITE_OR_NEGATIVE],
]


@pytest.mark.parametrize("kind, name, value", BAD_HYPERPARAMETERS)
def test_a_hyperparameter_that_is_not_a_finite_number_at_least_0_is_refused_naming_it(
    kind: str, name: str, value: float
) -> None:
    """SGD(lr=nan) used to run, turning every weight into NaN with no overflow for the scaler to see."""
    expected = rf"^{kind}: {name} must be a finite number >= 0; got {name}={value!r}.*Pass one, e.g. {name}="
    with pytest.raises(ValueError, match=expected):
        MAKERS[kind]([nn.Parameter(np.ones(2))], **{name: value})
    opt = MAKERS[kind]([nn.Parameter(np.ones(2))])
    before = getattr(opt, name)
    with pytest.raises(ValueError, match=expected):
        setattr(opt, name, value)  # the way a schedule sets it between steps: opt.lr = ...
    assert getattr(opt, name) == before


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_nan_or_inf_learning_rate_from_a_numpy_schedule_is_refused_before_any_step(value: float) -> None:
    p = nn.Parameter(np.array([1.0, 2.0]))
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="check the schedule"):
        opt.lr = np.float64(value) * np.cos(0.0)  # a NumPy scalar, as a cosine schedule computes it
    p.grad = np.array([1.0, 1.0])
    opt.step()
    np.testing.assert_array_equal(p.data, [0.9, 1.9])  # the step ran with lr 0.1


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda ps: optim.SGD(ps, lr="0.1"), TypeError, r"SGD: lr must be a number; got str '0.1'"),
        (lambda ps: optim.SGD(ps, lr=True), TypeError, "SGD: lr must be a number; got bool True"),
        (lambda ps: optim.Adam(ps, lr=None), TypeError, "Adam: lr must be a number; got NoneType None"),
        (lambda ps: optim.SGD(ps, lr=0.1, nesterov="yes"), TypeError, "nesterov must be True or False; got 'yes'"),
        (lambda ps: optim.Adam(ps, betas=(math.nan, 0.9)), ValueError, r"got betas=\(nan, 0.9\)"),
        (lambda ps: optim.Adam(ps, betas=(0.9, math.inf)), ValueError, r"got betas=\(0.9, inf\)"),
        (lambda ps: optim.AdamW(ps, betas=(0.9,)), ValueError, r"betas must be a tuple of two numbers"),
        (lambda ps: optim.AdamW(ps, betas=(-0.1, 0.9)), ValueError, r"Pass e.g. betas=\(0.9, 0.999\)"),
    ],
)
def test_hyperparameters_of_the_wrong_type_or_range_are_named(make: Callable, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make([nn.Parameter(np.ones(2))])


def test_a_learning_rate_of_0_is_allowed_and_moves_no_weight() -> None:
    p = nn.Parameter(np.array([1.0, 2.0]))
    opt = optim.SGD([p], lr=0.0, momentum=0.9, weight_decay=0.1)
    p.grad = np.array([1.0, -1.0])
    opt.step()
    np.testing.assert_array_equal(p.data, [1.0, 2.0])
    np.testing.assert_array_equal(opt.state[0]["momentum_buffer"], [1.1, -0.8])  # the momentum still updates
    opt.lr = 0.5
    assert opt.lr == 0.5


def test_a_state_dict_with_a_nan_learning_rate_is_refused_and_changes_nothing() -> None:
    model = nn.MLP([4, 8, 3])
    opt = optim.Adam(model.named_parameters(), lr=0.01)
    sd = opt.state_dict()
    sd["hyperparameters"] = {**sd["hyperparameters"], "betas": [0.8, 0.9], "lr": math.nan}
    target = optim.Adam(model.named_parameters(), lr=0.5)
    with pytest.raises(optim.OptimizerStateError, match="hyperparameters do not fit: Adam: lr must be a finite"):
        target.load_state_dict(sd)
    assert (target.lr, target.betas) == (0.5, (0.9, 0.999))
