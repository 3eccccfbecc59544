"""tinyamp: mixed-precision training you can read, on NumPy (CPU) and CuPy (GPU).

import tinyamp as ta
x = ta.tensor([[1.0, 2.0]], requires_grad=True)
y = (x * x).sum()
y.backward()
x.grad  # array([[2., 4.]], dtype=float32)

The README's "Read the code" section lists the modules to read, in order.  The engine room
(``tinyamp.engine.fast`` on a CPU, ``tinyamp.engine.cuda`` on a GPU) registers its faster
implementations of the same bits behind ``tinyamp.kernels`` here, at import; set the
environment variable ``TINYAMP_ENGINE_ROOM=off`` to run the reference code alone.
"""

from tinyamp import _startup  # noqa: F401, I001  (first: a quiet Ctrl-C while the command starts)
from tinyamp import backend, kernels, nn, ops, optim
from tinyamp.engine import cuda, fast
from tinyamp.autograd import GradientError
from tinyamp.backend import DeviceError, OutOfRangeError, cuda_is_available
from tinyamp.recompute import checkpoint, checkpoint_sequential
from tinyamp.creation import arange, full, ones, rand, randn, zeros
from tinyamp.dtypes import bool_, float16, float32, float64, int32, int64
from tinyamp.engine.fast.allocator import keep_freed_memory
from tinyamp.function import Function
from tinyamp.grad_mode import enable_grad, is_grad_enabled, no_grad
from tinyamp.gradcheck import gradcheck
from tinyamp.ops import (
    concatenate,
    cross_entropy,
    dropout,
    embedding,
    equal,
    exp,
    gelu,
    layer_norm,
    linear,
    log,
    log_softmax,
    matmul,
    relu,
    sigmoid,
    softmax,
    sqrt,
    tanh,
)
from tinyamp.random import manual_seed
from tinyamp.tensor import Tensor, tensor

try:
    ENGINE_ROOM = backend.engine_room_setting()
except backend.EngineRoomSettingError as _exc:
    backend.refuse_engine_room_setting(_exc)  # the command: one sentence, exit 2
    raise
if ENGINE_ROOM == "on":  # the engine room answers before the reference kernels, where it applies
    for _engine in (fast, cuda):
        for _name, _implementation in _engine.IMPLEMENTATIONS.items():
            kernels.register(_name, _implementation)

__version__ = "0.1.0"

__all__ = [
    "Tensor", "tensor", "Function", "GradientError", "DeviceError", "OutOfRangeError",
    "checkpoint", "checkpoint_sequential",
    "no_grad", "enable_grad", "is_grad_enabled", "cuda_is_available", "manual_seed", "gradcheck",
    "keep_freed_memory", "kernels",
    "zeros", "ones", "full", "randn", "rand", "arange",
    "float16", "float32", "float64", "int32", "int64", "bool_",
    "ops", "nn", "optim", "matmul", "linear", "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "gelu",
    "softmax", "log_softmax", "cross_entropy", "layer_norm", "embedding", "dropout", "concatenate", "equal",
]  # fmt: skip
