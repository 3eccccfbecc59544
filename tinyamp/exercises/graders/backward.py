"""Graders of Exercises 2.1 to 2.3: your backward as the backward of a node, against finite differences.

Each wraps the student's function as the ``backward`` of a ``Function`` whose forward is
the usual one, then runs ``tinyamp.testing.check_backward`` on drawn shapes (and axes).  A
failure names what the student's function was given (y or xhat, rstd, and g, the gradient of
L = sum(r * output) with fixed random weights r, so g = r) and what it returned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

from tinyamp.function import Function
from tinyamp.ops.softmax import stable_log_softmax
from tinyamp.tensor import Tensor
from tinyamp.testing import check_backward
from tinyamp.testing.counterexamples import array_in_words
from tinyamp.testing.strategies import distinct_arrays, float_arrays, shapes

Backward = Callable[..., np.ndarray]
LAST_CALL: dict[str, np.ndarray] = {}  # the arrays the student's function was last given, for the message


def given_to_yours(**arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """Copies of `arrays` for the student's function (one that writes in place harms no one), noted in LAST_CALL."""
    LAST_CALL.clear()
    LAST_CALL.update({name: a.copy() for name, a in arrays.items()})
    return tuple(a.copy() for a in arrays.values())


class SoftmaxWithYourBackward(Function):
    """softmax along `axis`; the backward is the student's softmax_backward(y, g, axis)."""

    def forward(self, x: Any, axis: int, backward: Backward) -> Any:
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        y = e / e.sum(axis=axis, keepdims=True)
        self.axis, self.yours = axis, backward
        self.save_for_backward(y)
        return y

    def backward(self, g: Any) -> tuple[Any]:
        (y,) = self.saved
        return (returned(self.yours(*given_to_yours(y=y, g=g), self.axis), y, "softmax_backward"),)


class LogSoftmaxWithYourBackward(Function):
    """log_softmax along `axis`; the backward is the student's log_softmax_backward(y, g, axis)."""

    def forward(self, x: Any, axis: int, backward: Backward) -> Any:
        y = stable_log_softmax(x, axis)
        self.axis, self.yours = axis, backward
        self.save_for_backward(y)
        return y

    def backward(self, g: Any) -> tuple[Any]:
        (y,) = self.saved
        return (returned(self.yours(*given_to_yours(y=y, g=g), self.axis), y, "log_softmax_backward"),)


class LayerNormWithYourBackward(Function):
    """Layer norm over the last axis, no weight or bias; the backward is the student's layer_norm_backward."""

    def forward(self, x: Any, backward: Backward) -> Any:
        centered = x - x.mean(axis=-1, keepdims=True)
        rstd = 1 / np.sqrt((centered * centered).mean(axis=-1, keepdims=True) + 1e-5)
        xhat = centered * rstd
        self.yours = backward
        self.save_for_backward(xhat, rstd)
        return xhat

    def backward(self, g: Any) -> tuple[Any]:
        xhat, rstd = self.saved
        return (returned(self.yours(*given_to_yours(xhat=xhat, rstd=rstd, g=g)), xhat, "layer_norm_backward"),)


def returned(grad: Any, like: np.ndarray, name: str) -> Any:
    """The student's gradient, if it is an array of the shape and dtype of `like`; TypeError in words if not."""
    if not isinstance(grad, np.ndarray) or grad.shape != like.shape or grad.dtype != like.dtype:
        what = f"{type(grad).__name__} {getattr(grad, 'dtype', '')} {getattr(grad, 'shape', '')}".rstrip()
        raise TypeError(f"your {name} returned {what}: return dL/dx, a {like.dtype} array of shape {like.shape}")
    return grad


@st.composite
def arrays_and_axes(draw: Any) -> tuple[np.ndarray, int]:
    """(x, axis): float64 arrays of 1 to 3 axes in [-3, 3], and any axis of them, negative ones too."""
    x = draw(float_arrays(shapes(min_dims=1), -3.0, 3.0))
    return x, draw(st.integers(-x.ndim, x.ndim - 1))


def grade_softmax_backward(softmax_backward: Backward, examples: int) -> None:
    """softmax's gradient, checked through a softmax node on drawn shapes and axes."""

    def softmax(x: Tensor, axis: int) -> Tensor:
        return SoftmaxWithYourBackward.apply(x, axis=axis, backward=softmax_backward)

    checked_backward(softmax, arrays_and_axes(), "softmax_backward", "y", examples)


def grade_log_softmax_backward(log_softmax_backward: Backward, examples: int) -> None:
    """log_softmax's gradient, checked through a log_softmax node on drawn shapes and axes."""

    def log_softmax(x: Tensor, axis: int) -> Tensor:
        return LogSoftmaxWithYourBackward.apply(x, axis=axis, backward=log_softmax_backward)

    checked_backward(log_softmax, arrays_and_axes(), "log_softmax_backward", "y", examples)


def grade_layer_norm_backward(layer_norm_backward: Backward, examples: int) -> None:
    """layer_norm's gradient on rows whose values differ (a variance well above eps)."""

    def layer_norm(x: Tensor) -> Tensor:
        return LayerNormWithYourBackward.apply(x, backward=layer_norm_backward)

    checked_backward(layer_norm, st.tuples(distinct_arrays(shapes(min_dims=1))), "layer_norm_backward", "xhat",
                     examples)  # fmt: skip


def checked_backward(fn: Callable[..., Tensor], inputs: Any, name: str, output: str, examples: int) -> None:
    """check_backward on `fn`, its message in the student's words: the forward's input is x, its output `output`,
    and the arrays `name` was given are shown."""
    try:
        check_backward(fn, inputs, names=["x", "axis"], output=output, backward=name, max_examples=examples)
    except AssertionError as exc:
        if "with fixed random weights r" not in str(exc):  # it raised: the message ends where it raised
            raise
        got = ", ".join(array_in_words(a, k) for k, a in LAST_CALL.items())
        raise AssertionError(f"{exc}, so g = dL/d{output} = r.  Your {name} was given {got}") from None
