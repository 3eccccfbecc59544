"""Engine room: ReLU, GELU and softmax on the GPU, each pass of the reference in one kernel.

The reference code of these ops is a chain of whole-array operations (ReLU's select is
``where((x > 0) | isnan(x), x, 0)``: four kernels; GELU widens x to float32, then about ten
multiplies, adds and a tanh, then rounds; softmax is max, subtract, exp, sum, divide).  On a
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
Softmax sums each row in one reduction of its own, in float32 like the reference but in
another order: any two orders of a float32 sum of n positive terms agree within
2 (n - 1) * 2^-24 of the sum, so each output is within that (relative) plus an ulp of the
reference's; the backward pass's sum of g * y within 2 (n - 1) * 2^-24 of the sum of |g * y|.
tests/engine_room/test_fused_ops_cuda.py checks each statement on a GPU.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np

from tinyamp import backend
from tinyamp.cuda.device import on_gpu
from tinyamp.cuda.exact_float32 import PREAMBLE

_GELU_C, _GELU_A = np.float32(math.sqrt(2 / math.pi)), np.float32(0.044715)
_GELU_3A = np.float32(3 * 0.044715)  # the reference's 3 * a is a Python (double) product, then rounded

_RELU = "float v = (float)x; y = (v > 0.0f || v != v) ? x : (T)0.0f;"  # NaN kept, -0 becomes +0
_RELU_BACKWARD = "r = ((float)out > 0.0f) ? g : (T)0.0f;"
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


@cache
def _kernels() -> dict[str, Any]:  # pragma: no cover - needs a GPU
    cupy = backend.array_module("cuda")
    E, R = cupy.ElementwiseKernel, cupy.ReductionKernel
    return {
        "relu": E("T x", "T y", _RELU, "tinyamp_relu"),
        "relu_backward": E("T g, U out", "T r", _RELU_BACKWARD, "tinyamp_relu_backward"),
        "gelu": E("T x, float32 c, float32 a", "T y", _GELU, "tinyamp_gelu", preamble=PREAMBLE),
        "gelu_backward": E(
            "T g, U x, float32 c, float32 a, float32 a3",
            "T r",
            _GELU_BACKWARD,
            "tinyamp_gelu_backward",
            preamble=PREAMBLE,
        ),
        "exp_sum": R(
            "float32 x, float32 m",
            "float32 s",
            "expf(f32_sub(x, m))",
            "a + b",
            "s = a",
            "0",
            "tinyamp_softmax_sum",
            preamble=PREAMBLE,
        ),
        "softmax": E(
            "float32 x, float32 m, float32 s",
            "float32 y",
            "y = f32_div(expf(f32_sub(x, m)), s);",
            "tinyamp_softmax",
            preamble=PREAMBLE,
        ),
        "dot": R(
            "float32 g, float32 y",
            "float32 s",
            "f32_mul(g, y)",
            "a + b",
            "s = a",
            "0",
            "tinyamp_softmax_dot",
            preamble=PREAMBLE,
        ),
        "softmax_backward": E(
            "float32 g, float32 y, float32 s",
            "float32 r",
            "r = f32_mul(y, f32_sub(g, s));",
            "tinyamp_softmax_backward",
            preamble=PREAMBLE,
        ),
    }


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
    return k["softmax"](x, m, k["exp_sum"](x, m, axis=axis, keepdims=True))


def softmax_backward(g: Any, out: Any, axis: int) -> Any:
    """Softmax's backward pass (ops/softmax.softmax_backward) in two: the row sums of g * y, then y (g - sum)."""
    if not _floats(g, out, dtypes=(np.float32,)):
        return NotImplemented
    k = _kernels()
    return k["softmax_backward"](g, out, k["dot"](g, out, axis=axis, keepdims=True))
