"""tinyamp.amp.master: FP32 master weights keep the updates that 16-bit weights lose.

Every comparison is bit-exact: the masters are float32 computations that the reference
(the same optimizer on float32 copies, or float64 arithmetic that is exact for the
chosen values) reproduces operation for operation.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import bit_pattern_arrays, half_arrays, lost_update_cases

import tinyamp as ta
from tinyamp import nn, optim
from tinyamp.amp import autocast, formats
from tinyamp.amp.lost_updates import UpdateRecord, lost_updates
from tinyamp.amp.master import MasterWeights
from tinyamp.amp.master_state import MasterWeightsStateError
from tinyamp.optim import OptimizerStateError

pytestmark = pytest.mark.master_weights

BF16 = np.dtype(ml_dtypes.bfloat16)
SHAPES = [(3, 4), (5,)]


def assert_bit_equal(a: Any, b: Any) -> None:
    """Same dtype, shape and bytes: stricter than == (tells -0 from 0, compares NaNs)."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    assert a.tobytes() == b.tobytes(), (a, b)


def params_of(*arrays: np.ndarray) -> list[nn.Parameter]:
    return [nn.Parameter(a) for a in arrays]


OPTIMIZERS = {
    "sgd": lambda ps: optim.SGD(ps, lr=0.1),
    "sgd_nesterov_wd": lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=True),
    "adam_l2": lambda ps: optim.Adam(ps, lr=1e-2, weight_decay=0.1),
    "adamw": lambda ps: optim.AdamW(ps, lr=1e-3, weight_decay=0.1),
}


# ---- the masters start as the exact widening of the 16-bit weights -----------------------------
@given(half_arrays(), bit_pattern_arrays(BF16))
def test_masters_start_as_the_exact_widening_of_the_16bit_weights(w16: np.ndarray, wbf: np.ndarray) -> None:
    params = params_of(w16, wbf)
    opt = optim.Adam(params)
    mw = MasterWeights(opt)
    assert mw.model_params == params and mw.optimizer is opt
    assert opt.params is mw.master_params and mw.params is mw.master_params  # the optimizer now updates the masters
    assert mw.names == opt.names == ["0", "1"]
    for p, m, original in zip(params, mw.master_params, (w16, wbf)):
        assert m is not p and not np.shares_memory(m.data, p.data)
        assert_bit_equal(p.data, original)  # the model's weights are untouched
        assert_bit_equal(m.data, original.astype(np.float32))
        finite = np.isfinite(original.astype(np.float32))
        assert_bit_equal(m.data[finite].astype(original.dtype), original[finite])  # widening lost nothing


def test_a_float32_parameter_is_its_own_master() -> None:
    w16, w32 = nn.Parameter(np.ones(3, np.float16)), nn.Parameter(np.ones(2, np.float32))
    mw = MasterWeights(optim.SGD([w16, w32], lr=0.5))
    assert mw.master_params[1] is w32 and mw.master_params[0] is not w16
    assert mw.model_bytes == 3 * 2 + 2 * 4 and mw.master_bytes == 3 * 4  # no copy of the float32 one
    w16.grad, w32.grad = np.ones(3, np.float16), np.ones(2, np.float32)
    g32 = w32.grad
    mw.gather_grads()
    assert mw.params[1].grad is g32  # no copy: the scaler unscales the parameter's own gradient
    mw.step()
    assert_bit_equal(w32.data, np.full(2, 0.5, np.float32))  # updated in place, directly
    assert_bit_equal(w16.data, np.full(3, 0.5, np.float16))
    assert mw.history[-1] == UpdateRecord(1, 3, 0, 0)  # counts only the parameter with a copy
    assert "(itself)" in mw.summary()


# ---- updates lost in 16-bit weights, kept by the masters -----------------------------------------
@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16])
def test_updates_lost_in_16bit_weights_add_up_in_the_master(dtype: np.dtype) -> None:
    """w = 1 and lr * g = eps / 4 (float16: 2^-12; bfloat16: 2^-9), a quarter of an ulp at 1.

    Applied to the 16-bit weight it is lost every time; the master adds it up, and after
    2^k steps (k >= 2) the 16-bit copy has moved by exactly 2^k * eps / 4.
    """
    eps = float(formats.get_format(dtype.name).epsilon)
    lr = eps / 4
    plain = nn.Parameter(np.ones(1, dtype))
    plain_sgd = optim.SGD([plain], lr=lr)
    w = nn.Parameter(np.ones(1, dtype))
    mw = MasterWeights(optim.SGD([w], lr=lr))
    for step in range(1, 65):
        plain.grad = np.full(1, -1.0, dtype)
        plain_sgd.step()
        w.grad = np.full(1, -1.0, dtype)
        mw.step()
        mw.zero_grad()
        assert_bit_equal(plain.data, np.ones(1, dtype))  # lost, every step
        assert_bit_equal(mw.master_params[0].data, np.array([1 + step * lr], np.float32))
        assert_bit_equal(w.data, mw.master_params[0].data.astype(dtype))
        if step >= 4 and step & (step - 1) == 0:
            assert_bit_equal(w.data, np.array([1 + step * lr], dtype))
        assert mw.lost_update_fraction == 1.0
    assert w.data[0] == 1 + 16 * eps  # 64 quarter-ulps
    # steps 1-2: the copy stays at 1 (1 + eps/2 is a tie, to even); 3: rounds up to 1 + eps; 4: exactly 1 + eps
    assert mw.history[:4] == [UpdateRecord(1, 1, 1, 1), UpdateRecord(2, 1, 1, 1), UpdateRecord(3, 1, 1, 0),
                              UpdateRecord(4, 1, 1, 1)]  # fmt: skip
    assert mw.lost_update_history == [1.0] * 64


@given(lost_update_cases())
def test_an_update_below_half_an_ulp_is_lost_in_float16_and_kept_by_the_master(case: Any) -> None:
    w16, lr, g16 = case
    for w, g in zip(w16.ravel(), g16.ravel()):
        assert formats.update_is_lost(float(w), -lr * float(g))
    plain = nn.Parameter(w16)
    plain.grad = g16.copy()
    optim.SGD([plain], lr=lr).step()
    assert_bit_equal(plain.data, w16)  # float16 weights: the update is lost

    model = nn.Parameter(w16)
    mw = MasterWeights(optim.SGD([model], lr=lr))
    model.grad = g16.copy()
    mw.step()
    master = mw.master_params[0].data
    exact = w16.astype(np.float64) - lr * g16.astype(np.float64)  # exact in float64 for these values
    assert (master.astype(np.float64) == exact).all()  # the master moved by exactly the update
    assert (master != w16.astype(np.float32)).all()
    assert_bit_equal(model.data, w16)  # one such step does not move the 16-bit copy
    assert mw.history == [UpdateRecord(1, w16.size, w16.size, w16.size)]


def test_large_updates_are_never_lost() -> None:
    w = nn.Parameter(np.linspace(0.5, 2.0, 40).astype(np.float16))
    mw = MasterWeights(optim.SGD([w], lr=0.25))
    w.grad = np.where(np.arange(40) % 2 == 0, 1.0, -1.0).astype(np.float16)
    mw.step()
    assert mw.lost_update_fraction == 0.0
    assert mw.history == [UpdateRecord(1, 40, 0, 0)]


@given(half_arrays((4, 5), -4.0, 4.0), half_arrays((4, 5)), st.sampled_from([2.0**-14, 1e-3, 0.1]))
def test_lost_updates_are_exactly_those_a_plain_16bit_step_would_lose(w16: Any, g16: Any, lr: float) -> None:
    """At the first step (masters = widened weights) the same update applied without masters,
    by the same optimizer on the float16 weight, leaves exactly the counted elements unchanged."""
    plain = nn.Parameter(w16)
    plain.grad = g16.copy()
    optim.SGD([plain], lr=lr).step()
    model = nn.Parameter(w16)
    mw = MasterWeights(optim.SGD([model], lr=lr))
    model.grad = g16.copy()
    mw.step()
    changed = mw.master_params[0].data != w16.astype(np.float32)
    lost_by_plain = (plain.data == w16) & changed
    assert mw.history == [UpdateRecord(1, int(changed.sum()), int(lost_by_plain.sum()), int(lost_by_plain.sum()))]


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16])
@given(st.data())
def test_lost_updates_is_the_float32_sum_rounded_back_to_the_weight(dtype: np.dtype, data: st.DataObject) -> None:
    """The one definition, element by element with NumPy scalars: a nonzero float32 update is lost
    when fp16(fp32(w) + update) == w.  NaN weights never match (NaN != NaN); -0 and +0 do."""
    w = np.concatenate([data.draw(bit_pattern_arrays(dtype, (12,))), np.array([-0.0, 0.0, np.nan, -np.inf], dtype)])
    update = data.draw(bit_pattern_arrays(np.float32, (16,)))
    update[::3] = np.float32(2.0**-20)  # small updates: some lost, some not
    with np.errstate(all="ignore"):
        expected = [bool(u != 0 and dtype.type(np.float32(x) + u) == x) for x, u in zip(w, update)]
        assert lost_updates(w, update).tolist() == expected


# ---- the 16-bit copy and the masters, step by step ---------------------------------------------
@pytest.mark.parametrize("name", OPTIMIZERS)
@given(
    st.tuples(*(half_arrays(s) for s in SHAPES)),
    st.lists(st.tuples(*(half_arrays(s) for s in SHAPES)), min_size=1, max_size=4),
)
def test_masters_match_the_optimizer_run_in_float32(name: str, weights: Any, grads: Any) -> None:
    """MasterWeights(opt) over float16 weights == opt over float32 copies, given the same (widened)
    gradients: masters and moments bit for bit; and the model holds the rounded masters."""
    make = OPTIMIZERS[name]
    model = params_of(*weights)
    mw = MasterWeights(make(model))
    ref = params_of(*(w.astype(np.float32) for w in weights))
    ref_opt = make(ref)
    for step_grads in grads:
        for p, r, g in zip(model, ref, step_grads):
            p.grad, r.grad = g.copy(), g.astype(np.float32)
        mw.step()
        ref_opt.step()
        for p, m, r in zip(model, mw.master_params, ref):
            assert_bit_equal(m.data, r.data)
            assert_bit_equal(p.data, r.data.astype(np.float16))
        for s, s_ref in zip(mw.optimizer.state, ref_opt.state):
            assert s.keys() == s_ref.keys()
            for k in s:
                assert_bit_equal(np.asarray(s[k]), np.asarray(s_ref[k]))
        rec = mw.history[-1]
        assert 0 <= rec.lost <= rec.changed and 0 <= rec.unchanged <= rec.changed
        mw.zero_grad()
    assert mw.optimizer.step_count == ref_opt.step_count == len(grads)


def test_a_parameter_without_gradient_is_skipped() -> None:
    a, b = nn.Parameter(np.ones(2, np.float16)), nn.Parameter(np.ones(3, np.float16))
    mw = MasterWeights(optim.SGD([a, b], lr=0.5))
    a.grad = np.ones(2, np.float16)
    mw.gather_grads()
    assert mw.master_params[1].grad is None
    mw.step()
    assert_bit_equal(b.data, np.ones(3, np.float16))
    assert_bit_equal(mw.master_params[1].data, np.ones(3, np.float32))
    assert_bit_equal(a.data, np.full(2, 0.5, np.float16))
    assert mw.history == [UpdateRecord(1, 2, 0, 0)]


# ---- the protocol a LossScaler drives ------------------------------------------------------------
@given(half_arrays((6,), -8.0, 8.0))
def test_gather_grads_widens_exactly_and_leaves_the_model_gradient_alone(g16: np.ndarray) -> None:
    w = nn.Parameter(np.zeros(6, np.float16))
    mw = MasterWeights(optim.SGD([w], lr=1.0))
    w.grad = g16.copy()
    mw.gather_grads()
    assert_bit_equal(mw.params[0].grad, g16.astype(np.float32))
    assert_bit_equal(w.grad, g16)
    mw.zero_grad()
    assert w.grad is None and mw.params[0].grad is None


def test_unscaling_the_gathered_float32_gradients_is_what_step_uses() -> None:
    scale = 2.0**12
    g = np.array([3e-6, -1e-3, 0.5, 0.0], np.float32)  # 3e-6 is subnormal in float16
    grads16 = (g * scale).astype(np.float16)  # what a scaled backward leaves
    w = nn.Parameter(np.ones(4, np.float16))
    mw = MasterWeights(optim.SGD([w], lr=2.0**-3))
    w.grad = grads16
    mw.gather_grads()
    for p in mw.params:
        p.grad *= np.float32(1 / scale)  # as a LossScaler does, in float32 and in place
    mw.step()  # must not gather again: the unscaled gradients stay
    expected = np.float32(1.0) - np.float32(2.0**-3) * (grads16.astype(np.float32) * np.float32(1 / scale))
    assert_bit_equal(mw.master_params[0].data, expected)


def test_step_gathers_again_after_a_new_backward() -> None:
    w = nn.Parameter(np.ones(3, np.float16))
    mw = MasterWeights(optim.SGD([w], lr=2.0**-4))
    (w * 2.0).sum().backward()
    mw.gather_grads()
    (w * 3.0).sum().backward()  # accumulates: w.grad is now 5
    mw.step()
    assert_bit_equal(mw.master_params[0].data, np.full(3, 1 - 5 * 2.0**-4, np.float32))
    assert_bit_equal(w.data, np.full(3, 1 - 5 * 2.0**-4, np.float16))


def test_tracking_can_be_switched_off_and_changes_no_weight() -> None:
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((4, 4)).astype(np.float16)
    grads = [rng.standard_normal((4, 4)).astype(np.float16) for _ in range(3)]
    runs = []
    for track in (True, False):
        w = nn.Parameter(w0)
        mw = MasterWeights(optim.Adam([w], lr=1e-3), track_lost_updates=track)
        for g in grads:
            w.grad = g.copy()
            mw.step()
        runs.append((w.data, mw.master_params[0].data, mw))
    assert_bit_equal(runs[0][0], runs[1][0])
    assert_bit_equal(runs[0][1], runs[1][1])
    assert len(runs[0][2].history) == 3 and runs[1][2].history == [] and runs[1][2].lost_update_fraction is None


def test_wrapping_keeps_the_state_of_an_optimizer_that_already_stepped() -> None:
    w = nn.Parameter(np.ones(4, np.float16))
    opt = optim.Adam([w], lr=0.1)
    w.grad = np.ones(4, np.float16)
    opt.step()
    moments = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in opt.state[0].items()}
    mw = MasterWeights(opt)
    assert opt.step_count == 1
    for k, v in moments.items():
        assert_bit_equal(np.asarray(opt.state[0][k]), np.asarray(v))
    # a float64 master converts the float32 state
    w32 = nn.Parameter(np.ones(2, np.float32))
    sgd = optim.SGD([w32], lr=0.1, momentum=0.9)
    w32.grad = np.ones(2, np.float32)
    sgd.step()
    mw64 = MasterWeights(sgd, master_dtype="float64")
    assert mw64.master_params[0].dtype == np.float64 and sgd.state[0]["momentum_buffer"].dtype == np.float64
    assert mw.master_dtype == np.float32


def test_repr_and_summary_show_both_copies() -> None:
    model = nn.MLP([3, 5, 2], dtype="float16")
    mw = MasterWeights(optim.SGD(model.named_parameters(), lr=0.1))
    n = model.num_parameters()
    assert mw.model_bytes == 2 * n and mw.master_bytes == 4 * n
    text = mw.summary()
    for name, p in model.named_parameters():
        assert name in text and str(p.shape) in text
    assert "float16" in text and "float32" in text and f"{2 * n}" in text and f"{4 * n}" in text
    assert "MasterWeights(SGD(" in repr(mw) and "4 of 4 parameters copied" in repr(mw)


# ---- state_dict ---------------------------------------------------------------------------------------
def make_run(seed: int, dtype: str = "float16", master_dtype: str = "float32", named: bool = True) -> Any:
    ta.manual_seed(seed)
    model = nn.MLP([3, 6, 2], dtype=dtype)
    opt = optim.Adam(model.named_parameters() if named else model.parameters(), lr=1e-2)
    return model, MasterWeights(opt, master_dtype=master_dtype)


def train(model: nn.Module, mw: MasterWeights, steps: range) -> None:
    for step in steps:
        rng = np.random.default_rng(step)
        x = ta.tensor(rng.standard_normal((4, 3)).astype(model.parameters()[0].dtype))
        loss = ta.cross_entropy(model(x), ta.tensor(rng.integers(0, 2, 4)))
        loss.backward()
        mw.step()
        mw.zero_grad()


def flat_state(model: nn.Module, mw: MasterWeights) -> list[tuple[str, bytes]]:
    out = [(k, v.tobytes()) for k, v in model.state_dict().items()]
    out += [(f"master {n}", m.data.tobytes()) for n, m in zip(mw.names, mw.master_params)]
    for i, s in enumerate(mw.optimizer.state):
        out += [(f"state {i} {k}", np.asarray(v).tobytes()) for k, v in sorted(s.items())]
    return out + [("step_count", bytes(mw.optimizer.step_count))]


def test_state_dict_resumes_bit_identically_and_holds_copies() -> None:
    model, mw = make_run(0)
    train(model, mw, range(3))
    sd = mw.state_dict()
    saved_master = sd["master"]["0.weight"].copy()
    train(model, mw, range(3, 6))
    assert_bit_equal(sd["master"]["0.weight"], saved_master)  # a copy: training on did not change it
    model2, mw2 = make_run(1)  # other initial weights
    mw2.load_state_dict(sd)
    for p, m in zip(model2.parameters(), mw2.master_params):
        assert_bit_equal(p.data, m.data.astype(np.float16))  # the model copies were rewritten
    assert mw2.history == mw.history[:3]
    train(model2, mw2, range(3, 6))
    assert flat_state(model2, mw2) == flat_state(model, mw)


@pytest.mark.parametrize(
    "other, match",
    [
        (dict(named=False), "saved for parameters"),
        (dict(master_dtype="float64"), "masters were saved as float32"),
        (dict(dtype="bfloat16"), "saved from a float16 model"),
    ],
)
def test_a_state_dict_that_does_not_fit_changes_nothing(other: dict, match: str) -> None:
    model, mw = make_run(0)
    train(model, mw, range(2))
    sd = mw.state_dict()
    model2, mw2 = make_run(1, **other)
    train(model2, mw2, range(1))
    before = flat_state(model2, mw2)
    with pytest.raises(MasterWeightsStateError, match=match):
        mw2.load_state_dict(sd)
    assert flat_state(model2, mw2) == before


def test_a_state_dict_of_other_shapes_or_another_optimizer_changes_nothing() -> None:
    model, mw = make_run(0)
    train(model, mw, range(2))
    ta.manual_seed(1)
    wide = nn.MLP([3, 7, 2], dtype="float16")
    mw_wide = MasterWeights(optim.Adam(wide.named_parameters(), lr=1e-2))
    before = flat_state(wide, mw_wide)
    with pytest.raises(MasterWeightsStateError, match=r"0.weight has shape \(7, 3\); the state_dict has shape"):
        mw_wide.load_state_dict(mw.state_dict())
    assert flat_state(wide, mw_wide) == before

    ta.manual_seed(1)
    model2 = nn.MLP([3, 6, 2], dtype="float16")
    mw_sgd = MasterWeights(optim.SGD(model2.named_parameters(), lr=0.1, momentum=0.9))
    before = flat_state(model2, mw_sgd)
    with pytest.raises(OptimizerStateError, match="state_dict of Adam"):  # the inner optimizer refuses
        mw_sgd.load_state_dict(mw.state_dict())
    with pytest.raises(MasterWeightsStateError, match="not a MasterWeights state_dict"):
        mw_sgd.load_state_dict(mw.optimizer.state_dict())
    assert flat_state(model2, mw_sgd) == before


# ---- errors -----------------------------------------------------------------------------------------------
def test_wrapping_twice_is_an_error() -> None:
    opt = optim.SGD([nn.Parameter(np.ones(2, np.float16))], lr=0.1)
    mw = MasterWeights(opt)
    with pytest.raises(ValueError, match="already wrapped by a MasterWeights"):
        MasterWeights(opt)
    with pytest.raises(TypeError, match="not another MasterWeights"):
        MasterWeights(mw)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="wraps a tinyamp.optim optimizer"):
        MasterWeights([nn.Parameter(np.ones(2, np.float16))])  # type: ignore[arg-type]


@pytest.mark.parametrize("master_dtype", ["float16", "bfloat16", "int32"])
def test_a_master_dtype_that_is_not_wider_is_an_error(master_dtype: str) -> None:
    p = nn.Parameter(np.ones(2, np.float16))
    opt = optim.SGD([p], lr=0.1)
    with pytest.raises(ValueError, match=f"master_dtype='{master_dtype}': a master copy must be float32"):
        MasterWeights(opt, master_dtype=master_dtype)
    assert opt.params == [p] and getattr(opt, "_master_weights", None) is None  # untouched


def test_parameters_wider_than_the_master_or_all_float32_are_errors() -> None:
    p16, p64 = nn.Parameter(np.ones(2, np.float16)), nn.Parameter(np.ones(3, np.float64))
    opt = optim.SGD([("a", p16), ("b", p64)], lr=0.1)
    with pytest.raises(ValueError, match=r"parameter b \(shape \(3,\)\) is float64, wider than master_dtype float32"):
        MasterWeights(opt)
    assert opt.params == [p16, p64]  # nothing was rebound
    with pytest.raises(ValueError, match="every parameter is already float32"):
        MasterWeights(optim.SGD([nn.Parameter(np.ones(2, np.float32))], lr=0.1))
    with pytest.raises(ValueError, match=r"names must be unique.*\['w'\]"):
        MasterWeights(optim.SGD([("w", p16), ("w", nn.Parameter(np.ones(2, np.float16)))], lr=0.1))


def test_free_model_grads_drops_the_16bit_gradients_once_widened_and_steps_the_same() -> None:
    results = []
    for free in (False, True):
        ta.manual_seed(0)
        model = nn.MLP([6, 8, 3]).half()
        opt = MasterWeights(optim.SGD(model.parameters(), lr=0.1), track_lost_updates=False, free_model_grads=free)
        x = ta.tensor(np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6))
        with autocast():
            loss = ta.cross_entropy(model(x), ta.tensor([0, 1, 2, 0]))
        loss.backward()
        opt.gather_grads()
        assert all((p.grad is None) == free for p in opt.model_params)
        assert all(m.grad is not None and m.grad.dtype == np.float32 for m in opt.master_params)
        opt.step()  # does not gather again: the masters' gradients are current
        results.append([p.data.tobytes() for p in model.parameters()])
    assert results[0] == results[1]
