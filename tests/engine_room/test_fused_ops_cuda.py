"""The fused ReLU, GELU and softmax kernels of tinyamp/engine/cuda/fused_ops.py against the reference code.

Each claim of the module's docstring, on a GPU: ReLU gives the reference's bits on every
16-bit pattern; GELU gives the bits of the reference run on the GPU, and against NumPy differs
only by what the two tanh functions differ by; softmax within its stated bound.  Without CUDA
only the dispatch is checked: on NumPy arrays the kernels decline and the reference runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tinyamp as ta
from tinyamp import kernels
from tinyamp.backend import to_device
from tinyamp.engine.cuda import fused_ops
from tinyamp.ops.softmax import softmax_backward, softmax_forward
from tinyamp.ops.unary import gelu_backward, gelu_forward

pytestmark = pytest.mark.engine_room

needs_cuda = pytest.mark.skipif(not ta.cuda_is_available(), reason="needs CuPy and a CUDA GPU")


def test_on_numpy_arrays_every_fused_kernel_declines_and_the_reference_runs() -> None:
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)
    for fn, args in ((fused_ops.relu, (x,)), (fused_ops.relu_backward, (x, x)), (fused_ops.gelu, (x,)),
                     (fused_ops.gelu_backward, (x, x)), (fused_ops.softmax, (x, -1)),
                     (fused_ops.softmax_backward, (x, x, -1)), (fused_ops.layer_norm, (x, x[0], x[0], 1e-5)),
                     (fused_ops.layer_norm_backward, (x, x, x[:, :1], x[0]))):  # fmt: skip
        assert fn(*args) is NotImplemented
    assert np.array_equal(kernels.call("gelu", gelu_forward, x), gelu_forward(x))


def _gpu(x: np.ndarray) -> Any:
    return to_device(x, "cuda")


def _cpu(x: Any) -> np.ndarray:
    return to_device(x, "cpu")


def _reference_on_gpu(fn: Any, *args: Any) -> np.ndarray:
    with kernels.reference_only():
        return _cpu(fn(*args))


@needs_cuda
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_fused_relu_and_its_backward_give_the_reference_bits(dtype: Any) -> None:
    if dtype == np.float16:
        x = np.arange(1 << 16, dtype=np.uint16).view(np.float16)  # every pattern: NaNs, infs, -0, subnormals
    else:
        rng = np.random.default_rng(0)
        x = np.concatenate([rng.standard_normal(10_000).astype(np.float32),
                            np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45], np.float32)])  # fmt: skip
    g = np.random.default_rng(1).standard_normal(x.shape).astype(dtype)
    out = kernels.relu(x)
    assert _cpu(fused_ops.relu(_gpu(x))).tobytes() == out.tobytes()
    assert _cpu(fused_ops.relu_backward(_gpu(g), _gpu(out))).tobytes() == kernels.relu_backward(g, out).tobytes()


def _gelu_inputs(dtype: Any) -> np.ndarray:
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.standard_normal(20_000) * 3, [0.0, -4.5, -9.0, 12.0, 45.0, -45.0, 700.0, -700.0]])
    return x.astype(dtype)


@needs_cuda
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_fused_gelu_gives_the_bits_of_the_reference_run_on_the_gpu(dtype: Any) -> None:
    x = _gelu_inputs(dtype)
    g = np.random.default_rng(3).standard_normal(x.shape).astype(dtype)
    xd, gd = _gpu(x), _gpu(g)
    assert _cpu(fused_ops.gelu(xd)).tobytes() == _reference_on_gpu(gelu_forward, xd).tobytes()
    assert _cpu(fused_ops.gelu_backward(gd, xd)).tobytes() == _reference_on_gpu(gelu_backward, gd, xd).tobytes()


@needs_cuda
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_fused_gelu_against_numpy_differs_only_by_the_tanh_functions(dtype: Any) -> None:
    """A few float32 ulps of tanh, scaled by what multiplies t, then one rounding to `dtype`."""
    x = _gelu_inputs(dtype)
    g = np.random.default_rng(3).standard_normal(x.shape).astype(dtype)
    w, wg = x.astype(np.float64), g.astype(np.float64)
    # t's two values differ by at most 4 ulp of 1 (CUDA's tanhf and NumPy's tanh each within 2 ulp, |t| <= 1);
    # each float32 rounding after t (at most 4 on the way to d) may then go the other way, one ulp each
    tanh_error = (4 + 8) * 2.0**-24
    forward_bound = np.abs(0.5 * w) * tanh_error
    d_bound = (0.5 + np.abs(w) * 0.8 * (1 + 0.134145 * w * w)) * tanh_error  # |d d / d t| <= 1/2 + |x| c (1 + 3 a x^2)
    for got, ref, bound in (
        (fused_ops.gelu(_gpu(x)), gelu_forward(x), forward_bound),
        (fused_ops.gelu_backward(_gpu(g), _gpu(x)), gelu_backward(g, x), np.abs(wg) * d_bound),
    ):
        got, ref = _cpu(got).astype(np.float64), ref.astype(np.float64)
        ulp = np.spacing(np.abs(ref).astype(dtype)).astype(np.float64)  # one rounding of a value off by `bound`
        assert np.all(np.abs(got - ref) <= bound + ulp)


@needs_cuda
@pytest.mark.parametrize("axis", [-1, 1])
def test_fused_softmax_and_its_backward_stay_within_the_stated_bound(axis: int) -> None:
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((6, 256, 64)) * 4).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    n = x.shape[axis]
    sum_bound = 2 * (n - 1) * 2.0**-24
    xd, gd = _gpu(x), _gpu(g)
    y = _cpu(fused_ops.softmax(xd, axis)).astype(np.float64)
    ref = _reference_on_gpu(softmax_forward, xd, axis).astype(np.float64)
    assert np.all(np.abs(y - ref) <= ref * (sum_bound + 2.0**-23))
    assert np.all(np.abs(y.sum(axis=axis) - 1) <= n * 2.0**-23)
    yd = _gpu(ref.astype(np.float32))
    r = _cpu(fused_ops.softmax_backward(gd, yd, axis)).astype(np.float64)
    r_ref = _reference_on_gpu(softmax_backward, gd, yd, axis).astype(np.float64)
    y32 = ref.astype(np.float32).astype(np.float64)
    dot_bound = sum_bound * np.sum(np.abs(g * y32), axis=axis, keepdims=True)
    assert np.all(np.abs(r - r_ref) <= y32 * dot_bound + np.spacing(np.abs(r_ref).astype(np.float32)) * 2)


@needs_cuda
def test_fused_layer_norm_and_its_backward_stay_close_to_the_reference() -> None:
    """Row sums in another order: the means within 2 (D - 1) * 2^-24 of the row's mean |x|, and what follows."""
    from tinyamp.ops.normalization import layer_norm_backward, layer_norm_forward

    rng = np.random.default_rng(5)
    rows, d = 512, 1024
    x = (rng.standard_normal((rows, d)) * 3 + 1).astype(np.float32)
    w, b = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    g = rng.standard_normal((rows, d)).astype(np.float32)
    xd, wd, bd, gd = _gpu(x), _gpu(w), _gpu(b), _gpu(g)
    out, xhat, rstd = (_cpu(a).astype(np.float64) for a in fused_ops.layer_norm(xd, wd, bd, 1e-5))
    with kernels.reference_only():
        ref = [_cpu(a).astype(np.float64) for a in layer_norm_forward(xd, wd, bd, 1e-5)]
    sum_error = 2 * (d - 1) * 2.0**-24
    mean_abs = np.mean(np.abs(x), axis=-1, keepdims=True)
    # the mean moves by sum_error * mean|x|, the variance by about 2 |xhat| / rstd times that, relative
    assert np.all(np.abs(rstd - ref[2]) <= ref[2] * (4 * sum_error * mean_abs * ref[2] + 4 * sum_error + 2.0**-22))
    xhat_bound = ref[2] * sum_error * mean_abs * (1 + 4 * np.abs(ref[1])) + 4 * sum_error * np.abs(ref[1]) + 2.0**-22
    assert np.all(np.abs(xhat - ref[1]) <= xhat_bound)
    assert np.all(np.abs(out - ref[0]) <= np.abs(w) * xhat_bound + np.spacing(np.abs(ref[0]).astype(np.float32)))
    xhat_d, rstd_d = _gpu(ref[1].astype(np.float32)), _gpu(ref[2].astype(np.float32))
    dx = _cpu(fused_ops.layer_norm_backward(gd, xhat_d, rstd_d, wd)).astype(np.float64)
    dx_ref = _reference_on_gpu(layer_norm_backward, gd, xhat_d, rstd_d, wd).astype(np.float64)
    gw = np.abs(g * w)
    mean_bound = sum_error * np.mean(gw * (1 + np.abs(ref[1])), axis=-1, keepdims=True) * (1 + np.abs(ref[1]))
    assert np.all(np.abs(dx - dx_ref) <= ref[2] * mean_bound + np.spacing(np.abs(dx_ref).astype(np.float32)) * 4)


@needs_cuda
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("shape", [(1, 7), (16384, 1024), (300, 4096), (64, 3)])
def test_sum_rows_as_a_product_by_ones_is_a_float32_sum_of_the_rows(dtype: Any, shape: tuple[int, int]) -> None:
    """Within (R - 1) * 2^-24 of the exact column sums' |x| sums: a bound every order of float32 sums meets."""
    from tinyamp.engine.cuda import gemm

    x = (np.random.default_rng(6).standard_normal(shape) * 50).astype(dtype)
    got = _cpu(gemm.sum_rows(_gpu(x)))
    assert got.dtype == np.float32 and got.shape == (shape[1],)
    exact = x.astype(np.float64).sum(axis=0)
    bound = (shape[0] - 1) * 2.0**-24 * np.abs(x.astype(np.float64)).sum(axis=0)
    assert np.all(np.abs(got - exact) <= bound)


@needs_cuda
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_fused_cross_entropy_within_the_sum_bound_and_its_backward_bit_for_bit(reduction: str) -> None:
    from tinyamp.ops.losses import cross_entropy_backward, cross_entropy_forward

    rng = np.random.default_rng(7)
    n, c = 4096, 128
    rows = (rng.standard_normal((n, c)) * 3).astype(np.float32)
    labels = rng.integers(0, c, size=n)
    rows_d, labels_d = _gpu(rows), _gpu(labels)
    loss, log_probs = (_cpu(a).astype(np.float64) for a in fused_ops.cross_entropy(rows_d, labels_d, reduction))
    with kernels.reference_only():
        ref_loss, ref_lp = (_cpu(a).astype(np.float64) for a in cross_entropy_forward(rows_d, labels_d, reduction))
    lp_bound = 2 * (c - 1) * 2.0**-24 + 2 * np.spacing(np.abs(ref_lp).astype(np.float32))  # log of a sum, re-ordered
    assert np.all(np.abs(log_probs - ref_lp) <= lp_bound)
    per_loss = lp_bound.max() * (1 if reduction == "mean" else n)
    assert abs(loss - ref_loss) <= per_loss + n * 2.0**-24 * abs(ref_loss)
    g = _gpu(np.array(0.75, np.float32))
    lp_d = _gpu(ref_lp.astype(np.float32))
    got = _cpu(fused_ops.cross_entropy_backward(g, lp_d, labels_d, reduction))
    assert got.tobytes() == _reference_on_gpu(cross_entropy_backward, g, lp_d, labels_d, reduction).tobytes()
