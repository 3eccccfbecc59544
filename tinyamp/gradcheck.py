"""Checking a backward against central finite differences, in float64.

For a scalar $s(x)$, $\\partial s/\\partial x_i \\approx (s(x + h e_i) - s(x - h e_i)) / 2h$
with error $h^2 |s'''| / 6$ from the Taylor series plus about $\\varepsilon |s| / h$ from
rounding.  In float64 ($\\varepsilon \\approx 2.2 \\times 10^{-16}$) with $h = 10^{-6}$ the
rounding term is near $10^{-10}$ and the Taylor term near $10^{-13}$ (for $s$ and $s'''$ of
order 1), so tolerances of about $10^{-6}$ catch any wrong derivative.  In
float32 ($\\varepsilon \\approx 1.2 \\times 10^{-7}$) the rounding term alone is near
0.1: that is why the check refuses anything but float64.

A function with a tensor output is reduced to a scalar as $s = \\sum_k r_k f_k(x)$
with fixed random weights $r$, which checks every output's gradient at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tinyamp.autograd import GradientError
from tinyamp.backend import to_device
from tinyamp.grad_mode import no_grad
from tinyamp.tensor import Tensor


def numerical_gradient(scalar_fn: Callable[[], float], x: np.ndarray, h: float) -> np.ndarray:
    """Central differences of `scalar_fn` with respect to each element of `x` (changed in place and restored)."""
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        original = flat[i]
        flat[i] = original + h
        up = scalar_fn()
        flat[i] = original - h
        down = scalar_fn()
        flat[i] = original
        gflat[i] = (up - down) / (2 * h)
    return grad


def gradcheck(
    fn: Callable[..., Tensor],
    inputs: Sequence[Tensor],
    h: float = 1e-6,
    atol: float = 1e-6,
    rtol: float = 1e-5,
    seed: int = 0,
) -> bool:
    """Compare the analytic gradient of `fn(*inputs)` with finite differences.

    Every input that requires grad must be a float64 CPU tensor.  Returns True, or raises
    GradientError naming the input, the element and both values when they disagree by
    more than ``atol + rtol * |numerical|``.
    """
    for i, t in enumerate(inputs):
        if t.requires_grad and (t.dtype != np.float64 or t.device != "cpu"):
            raise GradientError(
                f"gradcheck needs float64 CPU inputs; input {i} is {t.dtype} on {t.device}. "
                "Float32 rounding (1.2e-7) divided by a step h swamps the derivative."
            )
        if t.requires_grad and not np.isfinite(t.data).all():
            raise GradientError(
                f"gradcheck needs finite inputs; input {i} (shape {t.shape}) holds "
                f"{int((~np.isfinite(t.data)).sum())} NaN or inf value(s), where no derivative can be checked"
            )
    out = fn(*inputs)
    if not isinstance(out, Tensor):
        raise GradientError(f"gradcheck needs fn to return a Tensor; it returned {type(out).__name__}")
    weights = np.random.default_rng(seed).standard_normal(out.shape)

    def scalar() -> float:
        with no_grad():
            return float((to_device(fn(*inputs).data, "cpu") * weights).sum())

    for t in inputs:
        t.grad = None
    out.backward(weights.astype(out.dtype))
    for i, t in enumerate(inputs):
        if not t.requires_grad:
            continue
        analytic = np.zeros_like(t.data) if t.grad is None else t.grad
        numeric = numerical_gradient(scalar, t.data, h)
        # Written as "not close" so that a NaN on either side is a disagreement, never a pass.
        bad = ~((analytic == numeric) | (np.abs(analytic - numeric) <= atol + rtol * np.abs(numeric)))
        if bad.any():
            j = tuple(int(k) for k in np.unravel_index(int(np.argmax(bad)), t.shape)) if t.ndim else ()
            raise GradientError(
                f"gradcheck: input {i} (shape {t.shape}) element {j}: backward gives {float(analytic[j])!r}, "
                f"finite differences give {float(numeric[j])!r} (max abs error "
                f"{float(np.max(np.abs(analytic - numeric))):.3g}, {int(bad.sum())} elements off)"
            )
    return True
