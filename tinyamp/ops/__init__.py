"""Differentiable operations, one family per module.

Each module holds Function classes (the math: forward and backward on arrays) and
lowercase functions (the user's verbs, which check their inputs and call ``apply``).
``setup_tensor()`` (run once, at the end of this file) gives Tensor its operators, as
DeZero's ``setup_variable()`` does: ``a + b`` is ``add(a, b)``.
"""

from __future__ import annotations

from typing import Any

from tinyamp import dtypes
from tinyamp.casting import cast, to_device
from tinyamp.ops.arithmetic import add, compare, div, equal, mul, pow, sub  # noqa: A004
from tinyamp.ops.dropout import dropout
from tinyamp.ops.embedding import embedding
from tinyamp.ops.losses import cross_entropy
from tinyamp.ops.matmul import linear, matmul
from tinyamp.ops.normalization import layer_norm
from tinyamp.ops.reduce import max, mean, sum  # noqa: A004
from tinyamp.ops.shape import concatenate, getitem, reshape, transpose
from tinyamp.ops.softmax import log_softmax, softmax
from tinyamp.ops.unary import exp, gelu, log, neg, relu, sigmoid, sqrt, tanh
from tinyamp.tensor import Tensor

__all__ = [
    "add", "sub", "mul", "div", "pow", "neg", "compare", "equal",
    "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "gelu",
    "sum", "mean", "max",
    "reshape", "transpose", "getitem", "concatenate",
    "matmul", "linear",
    "softmax", "log_softmax", "cross_entropy", "layer_norm", "embedding", "dropout",
    "cast", "to_device", "setup_tensor",
]  # fmt: skip


def _to(x: Tensor, device_or_dtype: Any) -> Tensor:
    """Move to a device ("cpu"/"cuda") or cast to a dtype, differentiably."""
    if isinstance(device_or_dtype, str):
        try:
            dtypes.resolve(device_or_dtype)
        except TypeError:  # not a dtype: a device (check_device names the valid ones)
            return to_device(x, device_or_dtype)
    return cast(x, device_or_dtype)


def _reshape(x: Tensor, *shape: Any) -> Tensor:
    return reshape(x, tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)


def setup_tensor() -> None:
    """Attach the operators and the operation methods to Tensor (comparisons give bool tensors).

    ``==`` stays identity, so that tensors can sit in lists and sets: use ``tinyamp.equal``.
    """
    methods = {
        "__add__": add, "__radd__": lambda a, b: add(b, a), "__sub__": sub, "__rsub__": lambda a, b: sub(b, a),
        "__mul__": mul, "__rmul__": lambda a, b: mul(b, a), "__truediv__": div,
        "__rtruediv__": lambda a, b: div(b, a), "__pow__": pow, "__rpow__": lambda a, b: pow(b, a),
        "__neg__": neg, "__matmul__": matmul, "__rmatmul__": lambda a, b: matmul(b, a), "__getitem__": getitem,
        "__lt__": lambda a, b: compare("lt", a, b), "__le__": lambda a, b: compare("le", a, b),
        "__gt__": lambda a, b: compare("gt", a, b), "__ge__": lambda a, b: compare("ge", a, b),
        "exp": exp, "log": log, "sqrt": sqrt, "tanh": tanh, "sigmoid": sigmoid, "relu": relu, "gelu": gelu,
        "sum": sum, "mean": mean, "max": max, "softmax": softmax, "log_softmax": log_softmax,
        "reshape": _reshape, "transpose": lambda x, *axes: transpose(x, axes or None),
        "astype": cast, "half": lambda x: cast(x, dtypes.float16), "float": lambda x: cast(x, dtypes.float32),
        "double": lambda x: cast(x, dtypes.float64), "to": _to,
        "cpu": lambda x: to_device(x, "cpu"), "cuda": lambda x: to_device(x, "cuda"),
    }  # fmt: skip
    for name, fn in methods.items():
        setattr(Tensor, name, fn)
    Tensor.T = property(lambda x: transpose(x, None))  # type: ignore[attr-defined]


setup_tensor()
