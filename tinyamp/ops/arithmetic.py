"""Binary arithmetic: + - * / ** and comparisons, with broadcasting.

Each backward returns ``unbroadcast(...)`` so that the gradient of an input has that
input's shape (broadcast axes summed) and dtype (float16 + float32 -> float32 in the
forward, so the float16 input's gradient is rounded back to float16).
"""

from __future__ import annotations

from typing import Any

from tinyamp import dtypes, kernels
from tinyamp.autocast import cast_inputs
from tinyamp.backend import get_array_module
from tinyamp.function import Function
from tinyamp.ops.broadcasting import unbroadcast
from tinyamp.tensor import Scalar, Tensor, as_tensor, not_a_tensor


class Add(Function):
    """$c = a + b$; $\\partial c/\\partial a = \\partial c/\\partial b = 1$."""

    def forward(self, a: Any, b: Any) -> Any:
        self.inputs_like = (a.shape, a.dtype), (b.shape, b.dtype)
        return kernels.add(a, b)  # a + b; two float16 activations meet here (residual connections)

    def backward(self, g: Any) -> tuple[Any, Any]:
        (a_shape, a_dtype), (b_shape, b_dtype) = self.inputs_like
        need_a, need_b = self.needs_input_grad
        return (
            unbroadcast(g, a_shape, a_dtype) if need_a else None,
            unbroadcast(g, b_shape, b_dtype) if need_b else None,
        )


class Sub(Function):
    """$c = a - b$; the gradient of b is $-g$."""

    def forward(self, a: Any, b: Any) -> Any:
        self.inputs_like = (a.shape, a.dtype), (b.shape, b.dtype)
        return a - b

    def backward(self, g: Any) -> tuple[Any, Any]:
        (a_shape, a_dtype), (b_shape, b_dtype) = self.inputs_like
        need_a, need_b = self.needs_input_grad
        return (
            unbroadcast(g, a_shape, a_dtype) if need_a else None,
            unbroadcast(-g, b_shape, b_dtype) if need_b else None,
        )


class Mul(Function):
    """$c = a b$; $\\partial c/\\partial a = b$, $\\partial c/\\partial b = a$."""

    def forward(self, a: Any, b: Any) -> Any:
        self.save_for_backward(a, b)
        return a * b

    def backward(self, g: Any) -> tuple[Any, Any]:
        a, b = self.saved
        need_a, need_b = self.needs_input_grad
        return (
            unbroadcast(g * b, a.shape, a.dtype) if need_a else None,
            unbroadcast(g * a, b.shape, b.dtype) if need_b else None,
        )


class Div(Function):
    """$c = a / b$; $\\partial c/\\partial a = 1/b$, $\\partial c/\\partial b = -a/b^2 = -c/b$."""

    def forward(self, a: Any, b: Any) -> Any:
        out = a / b
        self.a_like = a.shape, a.dtype  # a itself is not kept: both derivatives need only b and c
        self.save_for_backward(b, out)
        return out

    def backward(self, g: Any) -> tuple[Any, Any]:
        (a_shape, a_dtype), (b, out) = self.a_like, self.saved
        need_a, need_b = self.needs_input_grad
        return (
            unbroadcast(g / b, a_shape, a_dtype) if need_a else None,
            unbroadcast(-g * out / b, b.shape, b.dtype) if need_b else None,
        )


class Pow(Function):
    """$c = a^b$; $\\partial c/\\partial a = b a^{b-1}$, $\\partial c/\\partial b = c \\ln a$."""

    def forward(self, a: Any, b: Any) -> Any:
        out = a**b
        self.save_for_backward(a, b, out)
        return out

    def backward(self, g: Any) -> tuple[Any, Any]:
        a, b, out = self.saved
        need_a, need_b = self.needs_input_grad
        return (
            unbroadcast(g * b * a ** (b - 1), a.shape, a.dtype) if need_a else None,
            unbroadcast(g * out * get_array_module(a).log(a), b.shape, b.dtype) if need_b else None,
        )


def operands(a: Tensor | Scalar, b: Tensor | Scalar, op: str | None = None) -> tuple[Tensor, Tensor]:
    """Make both operands Tensors on one device; an integer operand takes the float's dtype.

    Inside autocast, `op` names the entry of the policy table that applies.
    """
    if isinstance(a, Tensor):
        b = as_tensor(b, a)
    elif isinstance(b, Tensor):
        a = as_tensor(a, b)
    else:  # two NumPy arrays, say: neither says which device or dtype the result should have
        raise not_a_tensor(a, op or "an operation")
    da, db = a.data.dtype, b.data.dtype
    if da != db and not (dtypes.is_floating(da) and dtypes.is_floating(db)):
        target = dtypes.promote(da, db)
        if da != target:
            a = Tensor._make(kernels.cast(a.data, target), False, None)
        if db != target:
            b = Tensor._make(kernels.cast(b.data, target), False, None)
    return cast_inputs(op, a, b) if op is not None else (a, b)


def add(a: Tensor | Scalar, b: Tensor | Scalar) -> Tensor:
    """Elementwise $a + b$ with broadcasting."""
    return Add.apply(*operands(a, b, "add"))


def sub(a: Tensor | Scalar, b: Tensor | Scalar) -> Tensor:
    """Elementwise $a - b$ with broadcasting."""
    return Sub.apply(*operands(a, b, "sub"))


def mul(a: Tensor | Scalar, b: Tensor | Scalar) -> Tensor:
    """Elementwise $a b$ with broadcasting."""
    return Mul.apply(*operands(a, b, "mul"))


def div(a: Tensor | Scalar, b: Tensor | Scalar) -> Tensor:
    """Elementwise $a / b$ with broadcasting."""
    return Div.apply(*operands(a, b, "div"))


def pow(a: Tensor | Scalar, b: Tensor | Scalar) -> Tensor:  # noqa: A001 (the operator's name)
    """Elementwise $a^b$ with broadcasting (the gradient in b needs $a > 0$)."""
    return Pow.apply(*operands(a, b, "pow"))


_COMPARISONS = {"lt": "less", "le": "less_equal", "gt": "greater", "ge": "greater_equal", "eq": "equal"}


def compare(op: str, a: Tensor | Scalar, b: Tensor | Scalar) -> Tensor:
    """Elementwise comparison ("lt", "le", "gt", "ge", "eq"): a bool tensor, no gradient."""
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise not_a_tensor(a, "equal" if op == "eq" else f"compare({op!r})")
    a, b = operands(a, b)
    xp = get_array_module(a.data)
    return Tensor._make(getattr(xp, _COMPARISONS[op])(a.data, b.data), False, None)


def equal(a: Tensor | Scalar, b: Tensor | Scalar) -> Tensor:
    """Elementwise a == b as a bool tensor."""
    return compare("eq", a, b)
