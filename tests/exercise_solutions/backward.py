"""Exercises 2.1 to 2.3: three backwards that mixed precision keeps in FP32 (tutorials/02 and 06)."""

from __future__ import annotations

import numpy as np


def softmax_backward(y: np.ndarray, g: np.ndarray, axis: int) -> np.ndarray:
    """Exercise 2.1: the gradient of softmax, from its output.

    Task: `y` = softmax(x) along `axis` (float64), `g` = dL/dy (same shape); return dL/dx,
    a float64 array of the same shape.  The grader runs your function as the backward of a
    softmax node and compares it with float64 finite differences on drawn shapes and axes.

    Math: dy_i/dx_j = y_i (delta_ij - y_j), so dL/dx_j = sum_i g_i y_i (delta_ij - y_j)
    = y_j (g_j - sum_i g_i y_i): one sum along `axis` (keep its dimension to broadcast back).

    Read: tutorials/02_autograd_from_the_inside.py, sections 3, 4 and 6 (one op read from the
    source; checking a backward; a row-wise op's backward, with keepdims);
    tutorials/06_the_op_policy.py, section 2 (why softmax stays in FP32).

    Time: about 15 minutes of work once the reading is done (an estimate, for planning a lab).
    """
    # >>> exercise 2.1
    return y * (g - (g * y).sum(axis=axis, keepdims=True))
    # <<< exercise 2.1


def log_softmax_backward(y: np.ndarray, g: np.ndarray, axis: int) -> np.ndarray:
    """Exercise 2.2: the gradient of log_softmax, from its output.

    Task: `y` = log_softmax(x) along `axis` (float64: log-probabilities, all <= 0), `g` = dL/dy;
    return dL/dx, a float64 array of the same shape.

    Math: y_i = x_i - log sum_k e^(x_k), so dy_i/dx_j = delta_ij - softmax(x)_j, and
    softmax(x) = e^y: dL/dx_j = g_j - e^(y_j) sum_i g_i, one sum along `axis`.

    Read: tutorials/02_autograd_from_the_inside.py, sections 4 and 6 (checking a backward; a
    row-wise op's backward); tutorials/06_the_op_policy.py, section 3 (log, and the loss: why
    log_softmax is computed without forming softmax).

    Time: about 10 minutes of work once the reading is done (an estimate, for planning a lab).
    """
    # >>> exercise 2.2
    return g - np.exp(y) * g.sum(axis=axis, keepdims=True)
    # <<< exercise 2.2


def layer_norm_backward(xhat: np.ndarray, rstd: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Exercise 2.3: the gradient of layer norm (no weight, no bias) over the last axis.

    Task: the forward computed, for each row of x (the last axis, D values), the mean mu,
    the variance var = mean((x - mu)^2), ``rstd = 1 / sqrt(var + eps)`` (eps = 1e-5; shape (..., 1)) and
    ``xhat = (x - mu) * rstd``, and returned xhat.  Given `xhat`, `rstd` and `g` = dL/dxhat,
    return dL/dx, a float64 array of the shape of xhat.  (The grader checks it with float64 finite
    differences of L = sum(r * xhat), for fixed random weights r: so g = r.)

    Math: with means taken along the last axis,
    dL/dx = rstd * (g - mean(g) - xhat * mean(g * xhat)): the first mean because shifting a
    row does not change xhat, the second because scaling a row barely does (not at all with
    eps = 0; the formula is exact with eps too: rstd's own derivative gives the second term).

    Read: tutorials/02_autograd_from_the_inside.py, sections 4 and 6 (checking a backward; a
    row-wise op's backward: section 6's op is layer norm's first step); tutorials/06_the_op_policy.py,
    section 5 (Layer norm: why its variance stays in FP32).

    Time: about 25 minutes of work once the reading is done (an estimate, for planning a lab).
    """
    # >>> exercise 2.3
    return rstd * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    # <<< exercise 2.3
