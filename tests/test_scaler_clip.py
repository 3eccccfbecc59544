"""Clipping by global norm through the scaler: it reads unscaled gradients, and skips what overflowed.

The norm is checked against a float64 sum computed here; the clipped gradients byte for byte.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scaler_helpers import assert_bit_equal, linear_problem, loss_of, one_param

from tinyamp import optim
from tinyamp.amp.scaler import LossScaler
from tinyamp.backend import to_device

pytestmark = pytest.mark.scaler


# ---- clipping -------------------------------------------------------------------------------------------
def test_clip_grad_norm_clips_the_unscaled_gradients(device: str) -> None:
    model, x = linear_problem(device)
    opt = optim.SGD(model.named_parameters(), lr=0.1)
    scaler = LossScaler(init_scale=2.0**8)
    scaler.scale_loss(loss_of(model, x)).backward()
    scaler.unscale_(opt)
    grads = [to_device(p.grad, "cpu").astype(np.float64).ravel() for p in opt.params]
    # float64 accumulation: a dot product per parameter, an exactly rounded sum across them
    norm = math.sqrt(math.fsum(float(np.dot(g, g)) for g in grads))
    assert norm > 1.0
    clipped = scaler.clip_grad_norm_(opt, 1.0)
    if device == "cpu":
        assert clipped == norm
    else:  # the GPU reduction kernel sums each gradient in another order: float64 rounding, ~1e-16 relative
        assert abs(clipped - norm) <= 1e-12 * norm
        norm = clipped
    coefficient = np.float32(1.0 / (norm + 1e-6))
    for p, g in zip(opt.params, grads):
        assert_bit_equal(p.grad, g.astype(np.float32).reshape(p.shape) * coefficient)
    report = scaler.step(opt)
    assert report.grad_norm == norm and not report.skipped


def test_clip_grad_norm_leaves_small_and_nonfinite_gradients_alone() -> None:
    w, opt = one_param()
    scaler = LossScaler(init_scale=2.0)
    scaler.scale_loss((w * 1.0).sum()).backward()  # unscaled gradient [1, 1], norm sqrt(2)
    scaler.unscale_(opt)
    assert scaler.clip_grad_norm_(opt, 10.0) == math.sqrt(2.0)
    assert_bit_equal(w.grad, np.ones(2, np.float32))
    with pytest.raises(ValueError, match="max_norm must be a number > 0"):
        scaler.clip_grad_norm_(opt, 0.0)
    w.grad[0] = np.inf
    assert scaler.clip_grad_norm_(opt, 1.0) == math.inf
    assert w.grad[1] == 1.0
    assert scaler.step(opt).skipped and opt.steps == 0


@pytest.mark.parametrize("size", [1 << 16, (1 << 16) + 1, 3 * 1024 * 97 + 5])
def test_sum_of_squares_of_a_large_float32_gradient(size: int) -> None:
    """Large float32 gradients are summed in float32 rows of 1024, the rows in float64: close to
    the exact sum, and never inf for a finite gradient whose float32 squares overflow."""
    from tinyamp.kernels import sum_of_squares as _sum_of_squares

    rng = np.random.default_rng(size)
    g = (rng.standard_normal(size) * np.exp(rng.uniform(-8, 8, size))).astype(np.float32)
    exact = math.fsum((g.astype(np.float64) ** 2).tolist())
    assert abs(float(_sum_of_squares(g)) - exact) <= 1e-6 * exact
    g[size // 2] = 3e19  # finite, but its square (9e38) is not a float32
    exact = math.fsum((g.astype(np.float64) ** 2).tolist())
    assert math.isfinite(float(_sum_of_squares(g)))
    assert abs(float(_sum_of_squares(g)) - exact) <= 1e-12 * exact  # recomputed in float64
    g[size - 1] = -np.inf
    assert float(_sum_of_squares(g)) == math.inf
    g[0] = np.nan
    assert math.isnan(float(_sum_of_squares(g)))
