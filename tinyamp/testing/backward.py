"""check_backward: a backward against float64 central differences, on drawn shapes and values.

    from tinyamp.testing import check_backward, strategies

    def test_my_softmax_backward():
        check_backward(lambda x: MySoftmax.apply(x, axis=-1))

`fn` takes tinyamp Tensors and returns a Tensor built from tinyamp ops or your own
``Function`` subclasses; the check compares its backward with ``tinyamp.gradcheck``'s
central differences in float64 (error near 1e-10 at a step of 1e-6, so a tolerance of
1e-6 catches any wrong derivative).  A tensor output is reduced to the scalar
L = sum(r * f) with fixed random weights r, which checks every output's gradient at once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from tinyamp.autograd import GradientError
from tinyamp.gradcheck import gradcheck
from tinyamp.tensor import Tensor
from tinyamp.testing.counterexamples import array_in_words, check_settings, reported_at_the_call
from tinyamp.testing.strategies import float_arrays


@reported_at_the_call
def check_backward(
    fn: Callable[..., Tensor],
    inputs: SearchStrategy[tuple[Any, ...]] | None = None,
    *,
    names: Sequence[str] | None = None,
    output: str = "f",
    backward: str = "backward",
    max_examples: int | None = None,
    atol: float = 1e-6,
    rtol: float = 1e-5,
) -> None:
    """Check the gradients of `fn` against float64 finite differences on drawn inputs.

    `inputs` draws the tuple of arguments: float64 arrays become Tensors that require grad,
    anything else (an axis) is passed as it is.  Default: one float64 array of any shape
    with values in [-2, 2] (``strategies.float_arrays()``).  `names` name the arguments in
    messages (default: the parameter names of `fn`), `output` names fn's output in
    ``L = sum(r * output)``, and `backward` the code whose gradient is checked ("your
    {backward} gives").  Raises AssertionError naming the inputs, the element, your gradient
    and the finite difference.
    """
    inputs = st.tuples(float_arrays()) if inputs is None else inputs
    names = list(names) if names is not None else _parameter_names(fn)

    @check_settings(max_examples)
    @given(args=inputs)
    def backward_matches_finite_differences(args: tuple[Any, ...]) -> None:
        args = tuple(args)
        is_array = [isinstance(a, np.ndarray) for a in args]
        tensors = [Tensor(a.astype(np.float64), requires_grad=True) for a, arr in zip(args, is_array) if arr]

        def with_tensors(*ts: Tensor) -> Tensor:
            given_tensors = iter(ts)
            return fn(*[next(given_tensors) if arr else a for a, arr in zip(args, is_array)])

        try:
            gradcheck(with_tensors, tensors, atol=atol, rtol=rtol)
        except NotImplementedError:
            raise
        except GradientError as exc:
            message = str(exc).removeprefix("gradcheck: ").replace("backward gives", f"your {backward} gives")
            tensor_names = [_name(names, i) for i, arr in enumerate(is_array) if arr]
            for i, name in enumerate(tensor_names):
                message = message.replace(f"input {i} ", f"{name} ")
            raise AssertionError(
                f"for {_args_in_words(args, names)}: {message}; L = sum(r * {output}) with fixed random weights r"
            ) from None
        except Exception as exc:  # the code under test failed: the inputs that make it fail, in words
            raise AssertionError(
                f"for {_args_in_words(args, names)}: the forward or backward raised {type(exc).__name__}: {exc}"
            ) from exc

    backward_matches_finite_differences()


def _parameter_names(fn: Callable[..., Any]) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def _name(names: Sequence[str], i: int) -> str:
    return names[i] if i < len(names) else f"input {i}"


def _args_in_words(args: tuple[Any, ...], names: Sequence[str]) -> str:
    parts = [array_in_words(a, _name(names, i)) if isinstance(a, np.ndarray) else f"{_name(names, i)} = {a!r}"
             for i, a in enumerate(args)]  # fmt: skip
    return " and ".join(parts)
