"""Engine room: fused GPU updates of FP32 master weights.  One kernel per parameter reads the
gradient, updates the master and the optimizer state, and writes the rounded float16 copy.

On NumPy the same step is several whole-array passes (the update's arithmetic, then the
rounding into the model); on the GPU each pass is a trip through memory.  The kernels
repeat the NumPy update of optim/sgd.py and optim/adam.py operation by operation, with the
float32 constants the NumPy code uses, and every multiply, add, divide and square root
written as one IEEE instruction (``f32_mul`` ... from exact_float32.py): a compiler may
otherwise fuse a * b + c into one FMA with one rounding instead of two, and CuPy's
``-ftz=true`` would flush float32 subnormals, and the GPU step would drift from the CPU
step.  With that, the two give the same bits (tests/engine_room/test_fused_cuda.py).
Only ``scaler_step.py`` calls them, for a whole loss-scaler step decided on the device.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np

from tinyamp import backend
from tinyamp.engine.cuda.device import on_gpu
from tinyamp.engine.cuda.exact_float32 import PREAMBLE
from tinyamp.optim import SGD, Adam, Optimizer

_F32, _F16 = np.dtype(np.float32), np.dtype(np.float16)

_SGD = """
if (skip[0] == 0) {
    float d = g;
    if (wd != 0.0f) d = f32_add(f32_mul(w, wd), g);
    w = f32_sub(w, f32_mul(lr, d));
    w16 = (float16)w;
}
"""

_SGD_MOMENTUM = """
if (skip[0] == 0) {
    float d = g;
    if (wd != 0.0f) d = f32_add(f32_mul(w, wd), g);
    buf = first ? d : f32_add(f32_mul(buf, mu), d);
    d = nesterov ? f32_add(d, f32_mul(mu, buf)) : buf;
    w = f32_sub(w, f32_mul(lr, d));
    w16 = (float16)w;
}
"""

_ADAM = """
if (skip[0] == 0) {
    float grad = g;
    if (decoupled) {
        if (wd != 0.0f) w = f32_mul(w, decay);
    } else if (wd != 0.0f) {
        grad = f32_add(f32_mul(w, wd), g);
    }
    m = f32_add(f32_mul(m, beta1), f32_mul(grad, one_minus_beta1));
    v = f32_add(f32_mul(v, beta2), f32_mul(f32_mul(grad, grad), one_minus_beta2));
    float denom = f32_add(f32_div(f32_sqrt(v), bias_correction2_sqrt), eps);
    w = f32_sub(w, f32_mul(f32_div(m, denom), step_size));
    w16 = (float16)w;
}
"""


# A float16 gradient straight from the model, unscaled inside the kernel: the product of
# the exact widening and 1/scale rounded once is what gather + unscale give on the CPU, so
# no float32 copy of the gradients is ever made.
_FROM_FLOAT16 = "const float g = f32_mul((float)g16, inverse);\n"

_SIGNATURES = {
    "sgd": ("float32 g, float32 lr, float32 wd, raw int32 skip", "float32 w, float16 w16", _SGD),
    "sgd_momentum": (
        "float32 g, float32 lr, float32 mu, float32 wd, bool nesterov, bool first, raw int32 skip",
        "float32 w, float32 buf, float16 w16",
        _SGD_MOMENTUM,
    ),
    "adam": (
        "float32 g, float32 beta1, float32 beta2, float32 one_minus_beta1, float32 one_minus_beta2, "
        "float32 bias_correction2_sqrt, float32 eps, float32 step_size, float32 wd, float32 decay, bool decoupled, "
        "raw int32 skip",
        "float32 w, float32 m, float32 v, float16 w16",
        _ADAM,
    ),
}


@cache
def _kernels() -> dict[tuple[str, bool], Any]:  # pragma: no cover - needs a GPU
    """Each update as two kernels: from a float32 gradient, and from a float16 one and 1/scale."""
    cupy = backend.array_module("cuda")
    kernels = {}
    for name, (params, outputs, body) in _SIGNATURES.items():
        kernels[name, False] = cupy.ElementwiseKernel(
            params, outputs, body, f"tinyamp_master_{name}", preamble=PREAMBLE
        )
        params16 = params.replace("float32 g,", "float16 g16, float32 inverse,", 1)
        kernels[name, True] = cupy.ElementwiseKernel(
            params16, outputs, _FROM_FLOAT16 + body, f"tinyamp_master_{name}_from_float16", preamble=PREAMBLE
        )
    return kernels


def applies(optimizer: Optimizer, w: Any, g: Any, copy: Any) -> bool:
    """An SGD or Adam(W) update of a float32 master, from a float32 or float16 gradient, into a float16 copy."""
    if not isinstance(optimizer, (SGD, Adam)) or copy is None:
        return False
    kinds = w.dtype == _F32 and g.dtype in (_F32, _F16) and copy.dtype == _F16 and w.flags.c_contiguous
    return kinds and on_gpu(w, g, copy)


def fused_update(optimizer: Optimizer, w: Any, g: Any, state: dict[str, Any], copy: Any, skip_if: Any,
                 inverse: float | None) -> None:  # fmt: skip
    """``optimizer.update(w, g, state)`` and the rounding of `w` into `copy`, as one kernel (see ``applies``)."""
    o = optimizer
    if isinstance(o, SGD):
        sgd_step(w, g, state, copy, o.lr, o.momentum, o.weight_decay, o.nesterov, skip_if, inverse)
    else:
        adam_step(w, g, state, copy, o.lr, o.betas, o.eps, o.weight_decay, o.decoupled_weight_decay, skip_if, inverse)


def _gradient(g: Any, inverse: float | None) -> tuple[tuple[Any, ...], bool]:
    """The kernel's leading arguments for gradient `g`, and whether it is the float16 variant."""
    if g.dtype == _F16:
        return (g, np.float32(1.0 if inverse is None else inverse)), True
    return (g,), False


def _skip_flag(w: Any, skip_if: Any) -> Any:
    """The device int32 flag the kernels read: `skip_if`, or a zero (never skip), beside `w`."""
    if skip_if is not None:
        return skip_if
    return backend.get_array_module(w).zeros((), np.int32)


def sgd_step(w: Any, g: Any, state: dict[str, Any], copy: Any, lr: float, momentum: float, weight_decay: float,
             nesterov: bool, skip_if: Any = None, inverse: float | None = None) -> None:  # fmt: skip
    """SGD.update on the master `w` and the rounding into `copy`, in one kernel.

    `skip_if`: a device int32 flag; where it is nonzero the kernel changes nothing (the
    overflow skip decided on the GPU, without waiting for the host to read the flag).
    `g` may be the model's float16 gradient, then multiplied by `inverse` (1/scale) in the kernel.
    """
    skip = _skip_flag(w, skip_if)
    grad, from16 = _gradient(g, inverse)
    f32 = np.float32
    if momentum == 0:
        _kernels()["sgd", from16](*grad, f32(lr), f32(weight_decay), skip, w, copy)
        return
    buf = state.get("momentum_buffer")
    first = buf is None
    if first:
        buf = state["momentum_buffer"] = backend.get_array_module(w).empty_like(w)  # the kernel writes d into it
    kernel = _kernels()["sgd_momentum", from16]
    kernel(*grad, f32(lr), f32(momentum), f32(weight_decay), np.bool_(nesterov), np.bool_(first), skip, w, buf, copy)


def adam_step(w: Any, g: Any, state: dict[str, Any], copy: Any, lr: float, betas: tuple[float, float], eps: float,
              weight_decay: float, decoupled: bool, skip_if: Any = None,
              inverse: float | None = None) -> None:  # fmt: skip
    """Adam.update (or AdamW's) on the master `w` and the rounding into `copy`, in one kernel.

    The scalars are the float32 roundings of the same float64 expressions adam.py uses.
    `skip_if` and `inverse` as in ``sgd_step``.
    """
    skip = _skip_flag(w, skip_if)
    grad, from16 = _gradient(g, inverse)
    xp = backend.get_array_module(w)
    beta1, beta2 = betas
    if not state:
        state.update(step=0, exp_avg=xp.zeros_like(w), exp_avg_sq=xp.zeros_like(w))
    state["step"] += 1
    t = state["step"]
    f32 = np.float32
    _kernels()["adam", from16](
        *grad, f32(beta1), f32(beta2), f32(1 - beta1), f32(1 - beta2), f32(math.sqrt(1 - beta2**t)), f32(eps),
        f32(lr / (1 - beta1**t)), f32(weight_decay), f32(1 - lr * weight_decay), np.bool_(decoupled), skip,
        w, state["exp_avg"], state["exp_avg_sq"], copy,
    )  # fmt: skip
