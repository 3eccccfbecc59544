"""Differentiable operations, one family per module.

Each module holds Function classes (the math: forward and backward on arrays) and
lowercase functions (the user's verbs, which check their inputs and call ``apply``).
"""

from tinyamp.ops.arithmetic import add, compare, div, equal, mul, pow, sub  # noqa: A004
from tinyamp.ops.casting import cast, to_device
from tinyamp.ops.dropout import dropout
from tinyamp.ops.embedding import embedding
from tinyamp.ops.losses import cross_entropy
from tinyamp.ops.matmul import linear, matmul
from tinyamp.ops.normalization import layer_norm
from tinyamp.ops.reduce import max, mean, sum  # noqa: A004
from tinyamp.ops.shape import concatenate, getitem, reshape, transpose
from tinyamp.ops.softmax import log_softmax, softmax
from tinyamp.ops.unary import exp, gelu, log, neg, relu, sigmoid, sqrt, tanh

__all__ = [
    "add", "sub", "mul", "div", "pow", "neg", "compare", "equal",
    "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "gelu",
    "sum", "mean", "max",
    "reshape", "transpose", "getitem", "concatenate",
    "matmul", "linear",
    "softmax", "log_softmax", "cross_entropy", "layer_norm", "embedding", "dropout",
    "cast", "to_device",
]  # fmt: skip
