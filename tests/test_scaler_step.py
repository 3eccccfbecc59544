"""One scaled step: exact scaling and unscaling, the order checks, and skipped steps that change nothing.

Gradients and weights are compared byte for byte.  For a power-of-two scale, unscaling undoes
scaling exactly whenever scaling was exact; each call out of order is a sentence that changes no
state; a skipped step leaves every weight and optimizer moment as it was, on a real model and
optimizer, on every device; and a clean scaled step is the unscaled step to the last bit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scaler_helpers import FakeOptimizer, assert_bit_equal, begin_step, linear_problem, loss_of, one_param, snapshot
from strategies import gradient_values

import tinyamp as ta
from tinyamp import optim
from tinyamp.amp import MasterWeights
from tinyamp.amp.loss_scale import ScaleEvent
from tinyamp.amp.scaler import LossScaler, ScalerOrderError, StepReport
from tinyamp.backend import to_device

pytestmark = pytest.mark.scaler


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@given(data=st.data(), k=st.integers(-30, 30))
def test_unscaling_undoes_power_of_two_scaling_exactly_iff_scaling_was_exact(dtype: Any, data: Any, k: int) -> None:
    """For S = 2^k: unscale(round(x * S)) == x bit for bit exactly when x * S was representable.

    S >= 1: always, unless x * S overflows (scaling only shifts the exponent up; a subnormal x
    gains precision).  S < 1: fails when x * S lands in the subnormals with bits to spare, the
    very underflow that loss scaling exists to prevent; the result is then the rounded value
    unscaled, and differs from x.  Non-finite results are reported.
    """
    x = data.draw(gradient_values(dtype))
    s = 2.0**k
    with np.errstate(over="ignore"):
        y = (x.astype(np.float64) * s).astype(dtype)  # correctly rounded: x * s is exact in float64
    exact = np.isfinite(y) & (y.astype(np.float64) == x.astype(np.float64) * s)
    if k >= 0:
        assert np.array_equal(exact, np.isfinite(y))
    p = ta.tensor(np.zeros_like(x), requires_grad=True)
    p.grad = y.copy()
    scaler = LossScaler(init_scale=s)
    begin_step(scaler)
    flags = scaler.unscale_(FakeOptimizer([p], ["g"]))
    u = p.grad
    assert u.dtype == x.dtype
    assert flags == {"g": not np.isfinite(u).all()}
    if not np.isfinite(y).all():
        assert flags["g"]  # an inf in the scaled gradient is never hidden
    assert u[exact].tobytes() == x[exact].tobytes()  # bit for bit, signed zeros included
    changed = ~exact & np.isfinite(u)
    assert (u[changed] != x[changed]).all()


def test_subnormal_counterexample_in_float16() -> None:
    x = np.array([3 * 2.0**-24], np.float16)  # a float16 subnormal: 3 units of 2^-24
    p = ta.tensor(np.zeros(1, np.float16), requires_grad=True)
    p.grad = (x * np.float16(0.5)).astype(np.float16)  # 1.5 units rounds (to even) to 2 units
    assert p.grad[0] == 2.0**-23
    scaler = LossScaler(init_scale=0.5)
    begin_step(scaler)
    assert scaler.unscale_(FakeOptimizer([p])) == {"p0": False}
    assert p.grad[0] == 2.0**-22 != x[0]  # finite, not flagged, and not x: the bits were lost when scaling


def test_scale_loss_scales_a_float16_loss_in_float32() -> None:
    scaler = LossScaler()
    loss = ta.tensor(4.0, dtype="float16")  # 4 * 2^16 = 2^18 would be inf in float16
    scaled = scaler.scale_loss(loss)
    assert scaled.dtype == np.float32 and scaled.item() == 2.0**18
    tiny = ta.tensor(2.0**-20, dtype="float16")  # a subnormal float16 loss survives, exactly
    assert LossScaler().scale_loss(tiny).item() == 2.0**-4


def test_scale_loss_gradient_flows_back_scaled() -> None:
    w = ta.tensor([1.5, -2.0], requires_grad=True)
    scaler = LossScaler(init_scale=1024.0)
    scaler.scale_loss((w * w).sum()).backward()
    assert_bit_equal(w.grad, np.array([3.0 * 1024, -4.0 * 1024], np.float32))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # the overflow under test
def test_scale_above_float32_range_overflows_honestly_and_is_reported() -> None:
    scaler = LossScaler(init_scale=2.0**200)  # a Python float scale, beyond float32
    w = ta.tensor([1.0], requires_grad=True)
    scaled = scaler.scale_loss((w * 2.0).sum())
    assert scaled.dtype == np.float64 and scaled.item() == 2.0**201
    scaled.backward()
    report = scaler.step(FakeOptimizer([w], ["w"]))
    assert report.skipped and report.nonfinite_params == ["w"] and scaler.scale == 2.0**199


def test_off_mode_returns_the_loss_and_still_skips_overflow() -> None:
    scaler = LossScaler(mode="off")
    w = ta.tensor([1.0, 2.0], requires_grad=True)
    loss = (w * w).sum()
    assert scaler.scale_loss(loss) is loss
    loss.backward()
    w.grad[1] = np.nan
    opt = FakeOptimizer([w], ["w"])
    report = scaler.step(opt)
    assert report.skipped and report.nonfinite_params == ["w"] and opt.steps == 0
    assert math.isnan(report.grad_norm) and scaler.scale == 1.0 and scaler.state == "off"
    (w * w).sum().backward()  # mode off: stepping without scale_loss is allowed
    w.grad = np.array([1.0, 1.0], np.float32)
    assert not scaler.step(opt).skipped and opt.steps == 1


# ---- order errors: each is a sentence, and changes nothing ------------------------------------------------
def test_unscale_twice_is_an_error_and_does_not_divide_twice() -> None:
    scaler = LossScaler(init_scale=8.0)
    w, opt = one_param()
    scaler.scale_loss((w * w).sum()).backward()
    scaler.unscale_(opt)
    grad, before = w.grad.copy(), snapshot(scaler)
    with pytest.raises(ScalerOrderError, match="gradients were already unscaled at step 0; call unscale_ once"):
        scaler.unscale_(opt)
    assert snapshot(scaler) == before
    assert_bit_equal(w.grad, grad)
    assert_bit_equal(w.grad, np.array([2.0, 4.0], np.float32))


def test_step_before_backward_is_an_error() -> None:
    scaler = LossScaler()
    w, opt = one_param()
    scaler.scale_loss((w * w).sum())  # ... and no backward
    before = snapshot(scaler)
    with pytest.raises(ScalerOrderError, match="no parameter of the optimizer has a gradient at step 0"):
        scaler.step(opt)
    with pytest.raises(ScalerOrderError, match="call .backward"):
        scaler.unscale_(opt)
    assert snapshot(scaler) == before and opt.steps == 0


def test_clip_before_unscale_is_an_error() -> None:
    scaler = LossScaler(init_scale=8.0)
    w, opt = one_param()
    scaler.scale_loss((w * w).sum()).backward()
    grad, before = w.grad.copy(), snapshot(scaler)
    with pytest.raises(ScalerOrderError, match="reading scaled gradients as if unscaled"):
        scaler.clip_grad_norm_(opt, 1.0)
    assert snapshot(scaler) == before
    assert_bit_equal(w.grad, grad)


def test_scale_loss_twice_is_an_error_unless_accumulating() -> None:
    scaler = LossScaler(init_scale=4.0)
    w, opt = one_param()
    scaler.scale_loss((w * w).sum()).backward()
    before = snapshot(scaler)
    with pytest.raises(ScalerOrderError, match="scale_loss was already called at step 0"):
        scaler.scale_loss((w * w).sum())
    assert snapshot(scaler) == before
    scaler.scale_loss((w * w).sum(), accumulate=True).backward()  # a second micro-batch
    scaler.step(opt)
    assert_bit_equal(w.grad, np.array([4.0, 8.0], np.float32))  # 2 micro-batches of 2w, unscaled


def test_scale_loss_after_unscale_is_an_error() -> None:
    scaler = LossScaler()
    w, opt = one_param()
    scaler.scale_loss((w * w).sum()).backward()
    scaler.unscale_(opt)
    before = snapshot(scaler)
    with pytest.raises(ScalerOrderError, match="were already unscaled: finish the step"):
        scaler.scale_loss((w * w).sum(), accumulate=True)
    assert snapshot(scaler) == before


def test_step_without_scale_loss_is_an_error() -> None:
    scaler = LossScaler()
    w, opt = one_param()
    (w * w).sum().backward()
    grad, before = w.grad.copy(), snapshot(scaler)
    for call in (scaler.step, scaler.unscale_):
        with pytest.raises(ScalerOrderError, match="scale_loss was not called at step 0"):
            call(opt)
    assert snapshot(scaler) == before and opt.steps == 0
    assert_bit_equal(w.grad, grad)


def test_update_mid_step_or_after_step_is_an_error() -> None:
    scaler = LossScaler()
    w, opt = one_param()
    scaler.scale_loss((w * w).sum()).backward()
    before = snapshot(scaler)
    with pytest.raises(ScalerOrderError, match="would unscale the gradients by a different scale"):
        scaler.update(False)
    assert snapshot(scaler) == before
    scaler.step(opt)
    before = snapshot(scaler)
    with pytest.raises(ScalerOrderError, match="already updated the scale for step 0; calling update"):
        scaler.update(False)
    assert snapshot(scaler) == before


def test_clip_or_step_with_another_optimizer_is_an_error() -> None:
    scaler = LossScaler()
    w, opt = one_param()
    scaler.scale_loss((w * w).sum()).backward()
    scaler.unscale_(opt)
    other = FakeOptimizer([w], ["w"])
    with pytest.raises(ScalerOrderError, match="different optimizer"):
        scaler.clip_grad_norm_(other, 1.0)
    with pytest.raises(ScalerOrderError, match="different optimizer"):
        scaler.step(other)
    assert other.steps == 0 and scaler.phase == "unscaled"


def test_a_non_optimizer_is_a_type_error() -> None:
    scaler = LossScaler()
    begin_step(scaler)
    with pytest.raises(TypeError, match=r"needs an optimizer with .params, .names and .step\(\)"):
        scaler.unscale_([ta.tensor(1.0)])


# ---- a real model: skipped steps change nothing ---------------------------------------------------------
OPTIMIZERS = {
    "adam": lambda params: optim.Adam(params, lr=1e-2),
    "sgd_momentum": lambda params: optim.SGD(params, lr=1e-2, momentum=0.9),
}


def optimizer_arrays(opt: optim.Optimizer) -> list[np.ndarray]:
    out = [to_device(p.data, "cpu").copy() for p in opt.params]
    for state in opt.state:
        out += [to_device(v, "cpu").copy() if hasattr(v, "shape") else np.array(v) for _, v in sorted(state.items())]
    return out


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_a_skipped_step_leaves_weights_and_moments_untouched(device: str, kind: str) -> None:
    model, x = linear_problem(device)
    opt = OPTIMIZERS[kind](model.named_parameters())
    scaler = LossScaler(init_scale=2.0**10)
    for _ in range(2):  # clean steps first, so that the moments are not zero
        opt.zero_grad()
        scaler.scale_loss(loss_of(model, x)).backward()
        assert not scaler.step(opt).skipped
    before, steps = optimizer_arrays(opt), opt.step_count
    opt.zero_grad()
    scaler.scale_loss(loss_of(model, x)).backward()
    model.bias.grad[1] = np.inf
    report = scaler.step(opt)
    assert isinstance(report, StepReport) and scaler.last_report is report
    assert report.skipped and report.nonfinite_params == ["bias"]
    assert (report.step, report.scale_before, report.scale_after, report.event) == (2, 1024.0, 512.0, "backed_off")
    assert report.grad_norm == math.inf and report.state == "backed_off"
    assert "SKIPPED (non-finite gradients in bias)" in str(report)
    after = optimizer_arrays(opt)
    assert len(after) == len(before) and opt.step_count == steps
    for a, b in zip(after, before):
        assert_bit_equal(a, b)
    assert scaler.history[-1] == ScaleEvent(2, 1024.0, 512.0, True, "backed_off", 0, "backed_off")


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_a_clean_scaled_step_equals_the_unscaled_step_bit_for_bit(device: str, kind: str) -> None:
    # Powers of two commute with rounding: every gradient of the scaled loss is exactly S times
    # the unscaled one, and unscaling gives it back, so training is unchanged to the last bit.
    weights = []
    for scaler in (None, LossScaler(init_scale=2.0**12)):
        model, x = linear_problem(device)
        opt = OPTIMIZERS[kind](model.named_parameters())
        for _ in range(3):
            opt.zero_grad()
            loss = loss_of(model, x)
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale_loss(loss).backward()
                assert not scaler.step(opt).skipped
        weights.append(optimizer_arrays(opt))
    for a, b in zip(*weights):
        assert_bit_equal(a, b)


def test_float16_gradients_are_unscaled_in_float32_and_rounded_once(device: str) -> None:
    model, x = linear_problem(device, "float16")
    opt = optim.SGD(model.named_parameters(), lr=0.0)
    scaler = LossScaler(init_scale=2.0**-3)  # a scale below 1: unscaling multiplies by 8
    scaler.scale_loss(loss_of(model, x)).backward()
    scaled = [to_device(p.grad, "cpu").copy() for p in opt.params]
    scaler.unscale_(opt)
    for p, g in zip(opt.params, scaled):
        assert p.grad.dtype == np.float16
        assert_bit_equal(p.grad, (g.astype(np.float32) * np.float32(8.0)).astype(np.float16))


def test_unscale_reports_every_parameter_by_name(device: str) -> None:
    model, x = linear_problem(device)
    opt = optim.SGD(model.named_parameters(), lr=0.1)
    scaler = LossScaler()
    scaler.scale_loss(loss_of(model, x)).backward()
    model.weight.grad[0, 0] = np.nan
    assert scaler.unscale_(opt) == {"weight": True, "bias": False}
    report = scaler.step(opt)
    assert report.nonfinite_params == ["weight"] and math.isnan(report.grad_norm)


def test_huge_finite_float64_gradients_are_not_reported_as_overflow() -> None:
    """The finiteness check reads the sum of squares; (1e200)^2 overflows float64, yet 1e200 is finite."""
    big, bad = ta.tensor([1.0], dtype="float64", requires_grad=True), ta.tensor([1.0], requires_grad=True)
    opt = FakeOptimizer([big, bad], ["big", "bad"])
    scaler = LossScaler(init_scale=1.0)
    scaler.scale_loss((big * 1e200).sum() + (bad * 1.0).sum()).backward()
    bad.grad[0] = -np.inf
    assert scaler.unscale_(opt) == {"big": False, "bad": True}
    report = scaler.step(opt)
    assert report.nonfinite_params == ["bad"] and report.skipped and opt.steps == 0


def test_parameters_without_gradient_are_skipped_not_reported() -> None:
    used, unused = ta.tensor([1.0], requires_grad=True), ta.tensor([1.0], requires_grad=True)
    opt = FakeOptimizer([used, unused], ["used", "unused"])
    scaler = LossScaler()
    scaler.scale_loss((used * 3.0).sum()).backward()
    assert scaler.unscale_(opt) == {"used": False}
    assert scaler.step(opt).grad_norm == 3.0 and opt.steps == 1


# ---- the optimizer protocol: gather_grads (FP32 master weights) ---------------------------------------------
class GatheringOptimizer(FakeOptimizer):
    """Like MasterWeights: step() reads float32 masters whose gradients gather_grads() copies from float16."""

    def __init__(self, model_params: list[ta.Tensor]) -> None:
        self.model_params = model_params
        super().__init__([ta.tensor(p.data, dtype="float32") for p in model_params], ["a"])
        self.gathered = 0

    def gather_grads(self) -> None:
        self.gathered += 1
        for m, p in zip(self.params, self.model_params):
            m.grad = None if p.grad is None else p.grad.astype(np.float32)


def test_unscale_gathers_first_and_unscales_the_float32_copies() -> None:
    w16 = ta.tensor([2.0**-20, 1.0], dtype="float16", requires_grad=True)
    opt = GatheringOptimizer([w16])
    scaler = LossScaler(init_scale=2.0**10)
    scaler.scale_loss((w16 * w16).sum()).backward()  # d/dw = 2w, times 2^10: exact in float16
    assert scaler.unscale_(opt) == {"a": False} and opt.gathered == 1
    master = opt.params[0].grad
    assert master.dtype == np.float32 and master.tolist() == [2.0**-19, 2.0]
    assert not scaler.step(opt).skipped and opt.gathered == 1 and opt.steps == 1


def test_with_master_weights() -> None:
    master = pytest.importorskip("tinyamp.amp.master")
    model, x = linear_problem("cpu", "float16")
    opt = master.MasterWeights(optim.SGD(model.named_parameters(), lr=0.5))
    scaler = LossScaler(init_scale=2.0**8)
    scaler.scale_loss(loss_of(model, x)).backward()
    weights = [p.data.copy() for p in model.parameters()]
    model.weight.grad[0, 0] = np.inf
    report = scaler.step(opt)
    assert report.skipped and report.nonfinite_params == ["weight"]
    for p, w in zip(model.parameters(), weights):
        assert_bit_equal(p.data, w)
    opt.zero_grad()
    scaler.scale_loss(loss_of(model, x)).backward()
    assert not scaler.step(opt).skipped
    assert all(m.grad.dtype == np.float32 for m in opt.params)


# ---- 0-d parameters: NumPy's 0-d arithmetic returns scalars, and every gradient must still be an array ------
ZERO_D_OPTIMIZERS = {
    "sgd": lambda p: optim.SGD(p, lr=0.1),
    "sgd-momentum-wd": lambda p: optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
    "adam": lambda p: optim.Adam(p, lr=0.01, weight_decay=0.01),
    "adamw": lambda p: optim.AdamW(p, lr=0.01),
}


def two_steps(shape: tuple[int, ...], dtype: str, make: Any, mode: str, masters: bool) -> tuple[Any, list[Any]]:
    """Two scaled steps of loss = 3 w^2 on a parameter of `shape` starting at 0.5; the weight and the grads."""
    w = ta.tensor(np.full(shape, 0.5), dtype=dtype, requires_grad=True)
    opt = MasterWeights(make([w])) if masters else make([w])
    scaler, grads = LossScaler(mode=mode, init_scale=1.0 if mode == "off" else 2.0**10), []
    for _ in range(2):
        opt.zero_grad()
        scaler.scale_loss((w * w) * 3.0).backward()
        grads.append(w.grad)
        assert not scaler.step(opt).skipped
    return w.data, grads


@pytest.mark.parametrize("mode", ["dynamic", "static", "off"])
@pytest.mark.parametrize("name", sorted(ZERO_D_OPTIMIZERS))
@pytest.mark.parametrize("dtype, masters", [("float32", False), ("float16", True)], ids=["fp32", "fp16-master"])
def test_zero_dim_parameters_train_with_every_scaler_mode_and_optimizer(
    mode: str, name: str, dtype: str, masters: bool
) -> None:
    """A 0-d parameter's gradient is a 0-d array of its dtype, and its steps are those of a 1-element one."""
    w0, grads0 = two_steps((), dtype, ZERO_D_OPTIMIZERS[name], mode, masters)
    w1, grads1 = two_steps((1,), dtype, ZERO_D_OPTIMIZERS[name], mode, masters)
    for g in grads0:
        assert isinstance(g, np.ndarray) and g.shape == () and g.dtype == np.dtype(dtype)
    assert isinstance(w0, np.ndarray) and w0.shape == ()
    assert w0.reshape(1).tobytes() == w1.tobytes()  # the same arithmetic, element for element
    assert float(w0) != 0.5
