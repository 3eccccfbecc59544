"""Engine room: ReLU, GELU, softmax and layer norm on the GPU, each pass of the reference in one kernel or a few.

The reference code of these ops is a chain of whole-array operations (ReLU's select is
``where((x > 0) | isnan(x), x, 0)``: four kernels; GELU widens x to float32, then about ten
multiplies, adds and a tanh, then rounds; softmax is max, subtract, exp, sum, divide; layer
norm twelve passes forward and ten backward; cross-entropy's gradient an exp, a scatter by
fancy indexing and a multiply).  On a
GPU each of them is a trip through memory: on an H200 the elementwise kernels took 77% of the
GPU time of gpu_check's transformer step in mixed precision (122 of 159 ms).  Here each
forward or backward pass reads its inputs once and writes its result once, and inside the
kernel it does the reference's float32 operations in the reference's order:

* every multiply, add, subtract and divide is one IEEE instruction (``f32_mul`` ... from
  exact_float32.py), so no FMA contracts two of them and float32 subnormals are kept, as
  NumPy keeps them;
* constants are the float32 values NumPy rounds the Python constants to (weak scalars);
* ``tanhf`` and ``expf`` are CUDA's, the same functions CuPy's own ``tanh`` and ``exp`` call.

So ReLU gives the reference's bits exactly, and GELU gives the bits of the reference run on
the GPU (NumPy's tanh is another implementation: against the CPU the two differ by what
the two tanh functions differ by, CUDA's tanhf being within 2 ulp, before the final rounding).
Softmax and layer norm sum each row in a reduction of their own (one block per row), in float32
like the reference but in another order: any two orders of a float32 sum of n terms agree
within 2 (n - 1) * 2^-24 of the sum of the terms' magnitudes, so softmax's outputs are within
that (relative) plus an ulp of the reference's, its backward pass's row sums of g * y within
that of the sum of |g * y|, and layer norm's means, variances and outputs within what those
sums' differences carry through (the test states the bounds).  Cross-entropy's log-probabilities are
(x - m) - log(sum), that sum re-ordered as softmax's; its backward pass, (exp(lp) - onehot) * g,
gives the reference's bits on the GPU, except where a product is a float32 subnormal: CuPy's
own kernels flush those to 0, these keep them, as NumPy does.
tests/engine_room/test_fused_ops_cuda.py checks each statement on a GPU.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np

from tinyamp import backend
from tinyamp.engine.cuda.device import on_gpu
from tinyamp.engine.cuda.exact_float32 import PREAMBLE

_GELU_C, _GELU_A = np.float32(math.sqrt(2 / math.pi)), np.float32(0.044715)
_GELU_3A = np.float32(3 * 0.044715)  # the reference's 3 * a is a Python (double) product, then rounded

# ReLU's tests and select, exact.  CuPy compiles with -ftz=true, so a float comparison would see a
# positive float32 subnormal as 0; the tests read the bits instead.  And the select stays a select:
# the compiler would turn (x > 0 || x != x) ? x : 0 into a float max, which returns CUDA's canonical
# NaN (0x7fffffff) instead of x's own bits, so the bits are made opaque to it first.
_SELECT = r"""
__device__ __forceinline__ bool positive(float v) { int b = __float_as_int(v); return b > 0 && b <= 0x7f800000; }
__device__ __forceinline__ bool is_nan(float v) { return (__float_as_int(v) & 0x7fffffff) > 0x7f800000; }
template <typename T> __device__ __forceinline__ T keep_or_zero(bool keep, T x) { return keep ? x : T(0.0f); }
__device__ __forceinline__ float keep_or_zero(bool keep, float x) {
    unsigned int bits = __float_as_uint(x);
    asm("" : "+r"(bits));
    return __uint_as_float(keep ? bits : 0u);
}
"""
_RELU = "float v = (float)x; y = keep_or_zero(positive(v) || is_nan(v), x);"  # NaN kept, -0 becomes +0
_RELU_BACKWARD = "r = keep_or_zero(positive((float)out), g);"  # where out > 0 (not NaN), else +0
_GELU_T = """
float w = (float)x;
float t = tanhf(f32_mul(c, f32_add(w, f32_mul(f32_mul(f32_mul(a, w), w), w))));
"""
_GELU = _GELU_T + "y = (T)f32_mul(f32_mul(0.5f, w), f32_add(1.0f, t));"
_GELU_BACKWARD = (
    _GELU_T
    + """
float left = f32_mul(0.5f, f32_add(1.0f, t));
float right = f32_mul(f32_mul(f32_mul(0.5f, w), f32_sub(1.0f, f32_mul(t, t))), c);
float d = f32_add(left, f32_mul(right, f32_add(1.0f, f32_mul(f32_mul(a3, w), w))));
r = (T)f32_mul((float)g, d);
"""
)


# A row's mean is its float32 sum divided by the count, as CuPy's own mean computes it; the division
# happens in the kernel that reads the sum (a reduction run through CUB cannot see the count).
_LAYER_NORM_BACKWARD = """
float gh = f32_mul(g, w);
dx = f32_mul(r, f32_sub(f32_sub(gh, f32_div(sg, d)), f32_mul(xhat, f32_div(sgx, d))));
"""


_PREAMBLE = PREAMBLE + _SELECT

# name: (kind, inputs, outputs, body); a reduction's body is (map, reduce, post-map, identity), it uses PREAMBLE
_SOURCES: dict[str, tuple[str, str, str, Any]] = {
    "relu": ("map", "T x", "T y", _RELU),
    "relu_backward": ("map", "T g, U out", "T r", _RELU_BACKWARD),
    "gelu": ("map", "T x, float32 c, float32 a", "T y", _GELU),
    "gelu_backward": ("map", "T g, U x, float32 c, float32 a, float32 a3", "T r", _GELU_BACKWARD),
    "softmax_sum": ("reduce", "float32 x, float32 m", "float32 s", ("expf(f32_sub(x, m))", "a + b", "s = a", "0")),
    "softmax": ("map", "float32 x, float32 m, float32 s", "float32 y", "y = f32_div(expf(f32_sub(x, m)), s);"),
    "softmax_dot": ("reduce", "float32 g, float32 y", "float32 s", ("f32_mul(g, y)", "a + b", "s = a", "0")),
    "softmax_backward": ("map", "float32 g, float32 y, float32 s", "float32 r", "r = f32_mul(y, f32_sub(g, s));"),
    "row_sum": ("reduce", "float32 x", "float32 s", ("x", "a + b", "s = a", "0")),
    "divide": ("map", "float32 s, float32 d", "float32 m", "m = f32_div(s, d);"),
    "row_squares": ("reduce", "float32 x, float32 m", "float32 s", ("f32_mul(f32_sub(x, m), f32_sub(x, m))", "a + b",
                                                                     "s = a", "0")),
    "rstd": ("map", "float32 s, float32 d, float32 eps", "float32 r",
             "r = f32_div(1.0f, f32_sqrt(f32_add(f32_div(s, d), eps)));"),
    "layer_norm": ("map", "float32 x, float32 m, float32 r, float32 w, float32 b", "float32 xhat, float32 y",
                   "xhat = f32_mul(f32_sub(x, m), r); y = f32_add(f32_mul(xhat, w), b);"),
    "layer_norm_sum_g": ("reduce", "float32 g, float32 w", "float32 s", ("f32_mul(g, w)", "a + b", "s = a", "0")),
    "layer_norm_sum_gx": ("reduce", "float32 g, float32 w, float32 xhat", "float32 s",
                          ("f32_mul(f32_mul(g, w), xhat)", "a + b", "s = a", "0")),
    "layer_norm_backward": ("map", "float32 g, float32 w, float32 xhat, float32 r, float32 sg, float32 sgx, float32 d",
                            "float32 dx", _LAYER_NORM_BACKWARD),
    "log_softmax": ("map", "float32 x, float32 m, float32 s", "float32 lp", "lp = f32_sub(f32_sub(x, m), logf(s));"),
    "pick": ("map", "L label, raw float32 lp, int32 c", "float32 p", "p = lp[i * c + label];"),
    "cross_entropy_backward": ("map", "float32 lp, raw L labels, float32 scale, int32 c", "float32 grad",
                               "grad = f32_mul(f32_sub(expf(lp), i % c == labels[i / c] ? 1.0f : 0.0f), scale);"),
}  # fmt: skip


@cache
def _kernels() -> dict[str, Any]:  # pragma: no cover - needs a GPU
    """Every kernel of _SOURCES, compiled by CuPy on first use (named tinyamp_NAME in a profiler's table)."""
    cupy = backend.array_module("cuda")
    made = {}
    for name, (kind, inputs, outputs, body) in _SOURCES.items():
        if kind == "map":
            made[name] = cupy.ElementwiseKernel(inputs, outputs, body, f"tinyamp_{name}", preamble=_PREAMBLE)
        else:
            made[name] = cupy.ReductionKernel(inputs, outputs, *body, f"tinyamp_{name}", preamble=_PREAMBLE)
    return made


def _floats(*arrays: Any, dtypes: tuple[Any, ...] = (np.float16, np.float32)) -> bool:
    """CuPy arrays of one of `dtypes`, all of one shape (the kernels do not broadcast the data)."""
    return (on_gpu(*arrays) and all(a.dtype in dtypes for a in arrays)
            and all(a.shape == arrays[0].shape for a in arrays))  # fmt: skip


def relu(x: Any) -> Any:
    """``tinyamp.kernels.relu`` in one kernel: the reference's select, bit for bit."""
    return _kernels()["relu"](x) if _floats(x) else NotImplemented


def relu_backward(g: Any, out: Any) -> Any:
    """``tinyamp.kernels.relu_backward`` in one kernel: g where out > 0, else +0."""
    return _kernels()["relu_backward"](g, out) if _floats(g, out) else NotImplemented


def gelu(x: Any) -> Any:
    """GELU's forward pass (ops/unary.gelu_forward) in one kernel."""
    return _kernels()["gelu"](x, _GELU_C, _GELU_A) if _floats(x) else NotImplemented


def gelu_backward(g: Any, x: Any) -> Any:
    """GELU's backward pass (ops/unary.gelu_backward) in one kernel: x read once, t recomputed."""
    if not _floats(g, x):
        return NotImplemented
    return _kernels()["gelu_backward"](g, x, _GELU_C, _GELU_A, _GELU_3A)


def softmax(x: Any, axis: int) -> Any:
    """Softmax of a float32 array (ops/softmax.softmax_forward) in three passes: max, sum of exp, divide."""
    if not _floats(x, dtypes=(np.float32,)):
        return NotImplemented
    k = _kernels()
    m = x.max(axis=axis, keepdims=True)
    return k["softmax"](x, m, k["softmax_sum"](x, m, axis=axis, keepdims=True))


def softmax_backward(g: Any, out: Any, axis: int) -> Any:
    """Softmax's backward pass (ops/softmax.softmax_backward) in two: the row sums of g * y, then y (g - sum)."""
    if not _floats(g, out, dtypes=(np.float32,)):
        return NotImplemented
    k = _kernels()
    return k["softmax_backward"](g, out, k["softmax_dot"](g, out, axis=axis, keepdims=True))


def layer_norm(x: Any, weight: Any, bias: Any, eps: float) -> Any:
    """LayerNorm's forward pass (ops/normalization.layer_norm_forward) in five kernels: the row sums and
    means, the sums of squares about them, 1/sqrt(var + eps), then xhat and the output together."""
    if weight is None or bias is None or not _floats(x, dtypes=(np.float32,)) or not _floats(weight, bias):
        return NotImplemented
    if weight.dtype != np.float32 or bias.dtype != np.float32:
        return NotImplemented
    k, d = _kernels(), np.float32(x.shape[-1])
    m = k["divide"](k["row_sum"](x, axis=-1, keepdims=True), d)
    r = k["rstd"](k["row_squares"](x, m, axis=-1, keepdims=True), d, np.float32(eps))
    xhat, out = k["layer_norm"](x, m, r, weight, bias)
    return out, xhat, r


def layer_norm_backward(g: Any, xhat: Any, rstd: Any, weight: Any) -> Any:
    """LayerNorm's backward pass for x (ops/normalization.layer_norm_backward) in three kernels."""
    if weight is None or not _floats(g, xhat, dtypes=(np.float32,)) or not on_gpu(rstd, weight):
        return NotImplemented
    if rstd.dtype != np.float32 or weight.dtype != np.float32:  # rstd (rows, 1) and weight (D,) broadcast
        return NotImplemented
    k = _kernels()
    sum_g = k["layer_norm_sum_g"](g, weight, axis=-1, keepdims=True)
    sum_gx = k["layer_norm_sum_gx"](g, weight, xhat, axis=-1, keepdims=True)
    return k["layer_norm_backward"](g, weight, xhat, rstd, sum_g, sum_gx, np.float32(g.shape[-1]))


def cross_entropy(rows: Any, labels: Any, reduction: str) -> Any:
    """Cross-entropy's forward pass (ops/losses.cross_entropy_forward) for "mean" and "sum": the row maxima,
    the sums of exp, the log-probabilities in one kernel, the picked ones gathered in another, then the
    reference's own sum and division."""
    if reduction == "none" or not _floats(rows, dtypes=(np.float32,)) or not on_gpu(labels) or rows.ndim != 2:
        return NotImplemented
    k = _kernels()
    m = rows.max(axis=1, keepdims=True)
    log_probs = k["log_softmax"](rows, m, k["softmax_sum"](rows, m, axis=1, keepdims=True))
    picked = k["pick"](labels, log_probs, np.int32(rows.shape[1]))
    total = -picked.sum(dtype=np.float32)
    if reduction == "mean":
        total = total / rows.shape[0]
    return total, log_probs


def cross_entropy_backward(g: Any, log_probs: Any, labels: Any, reduction: str) -> Any:
    """Cross-entropy's backward pass for "mean" and "sum" in one kernel: (exp(lp) - onehot(y)) * g (/ N)."""
    if reduction == "none" or not _floats(log_probs, dtypes=(np.float32,)) or not on_gpu(g, labels):
        return NotImplemented
    if g.dtype != np.float32 or g.ndim != 0 or log_probs.ndim != 2:
        return NotImplemented
    scale = g / log_probs.shape[0] if reduction == "mean" else g
    return _kernels()["cross_entropy_backward"](log_probs, labels, scale, np.int32(log_probs.shape[1]))
