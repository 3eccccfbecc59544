"""tinyamp: mixed-precision training you can read, on NumPy (CPU) and CuPy (GPU).

import tinyamp as ta
x = ta.tensor([[1.0, 2.0]], requires_grad=True)
y = (x * x).sum()
y.backward()
x.grad  # array([[2., 4.]], dtype=float32)
"""

from tinyamp import nn, ops, optim  # noqa: E402,I001  (they build on Tensor and the ops above)
from tinyamp.allocator import keep_freed_memory
from tinyamp.autograd import Function, GradientError, enable_grad, is_grad_enabled, no_grad
from tinyamp.backend import DeviceError, cuda_is_available
from tinyamp.checkpoint import checkpoint, checkpoint_sequential
from tinyamp.creation import arange, full, ones, rand, randn, zeros
from tinyamp.dtypes import bool_, float16, float32, float64, int32, int64
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

__version__ = "0.1.0"

__all__ = [
    "Tensor", "tensor", "Function", "GradientError", "DeviceError",
    "checkpoint", "checkpoint_sequential",
    "no_grad", "enable_grad", "is_grad_enabled", "cuda_is_available", "manual_seed", "gradcheck",
    "keep_freed_memory",
    "zeros", "ones", "full", "randn", "rand", "arange",
    "float16", "float32", "float64", "int32", "int64", "bool_",
    "ops", "nn", "optim", "matmul", "linear", "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "gelu",
    "softmax", "log_softmax", "cross_entropy", "layer_norm", "embedding", "dropout", "concatenate", "equal",
]  # fmt: skip
