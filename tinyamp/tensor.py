"""Tensor: an array (NumPy or CuPy), its gradient, and the node that created it.

A Tensor is deliberately thin.  ``.data`` is the real array, so its dtype and its
bytes are the real ones: a float16 tensor holds 2 bytes per element.  ``.grad`` is an
array of the same backend, dtype and shape, filled by ``backward()``.  Every operator
is a Function in :mod:`tinyamp.ops`, where the forward and backward math live.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from tinyamp import autograd, backend, dtypes

Scalar = int | float | bool


class Tensor:
    """A node value in the graph: ``data`` (array), ``grad`` (array or None), and its creator.

    Make tensors with :func:`tinyamp.tensor`; results of operations are Tensors too.
    """

    __slots__ = ("data", "grad", "requires_grad", "_ctx", "name", "_edge", "__weakref__")
    __array_ufunc__ = None  # numpy_array * tensor must call Tensor.__rmul__, not loop in NumPy

    def __init__(self, data: Any, dtype: Any = None, requires_grad: bool = False, device: str | None = None) -> None:
        self.data = _to_array(data, dtype, device)
        self.grad: Any = None
        self._ctx: Any = None
        self.name: str | None = None
        self._edge: autograd.Edge | None = None
        self.requires_grad = False
        if requires_grad is not False:
            self.requires_grad_(requires_grad)

    @staticmethod
    def _make(data: Any, requires_grad: bool, ctx: Any) -> Tensor:
        """Wrap an array without checks: the fast path used by every op."""
        t = object.__new__(Tensor)
        t.data = data
        t.grad = None
        t.requires_grad = requires_grad
        t._ctx = ctx
        t.name = None
        t._edge = None
        return t

    # ---- what a tensor is -------------------------------------------------------------
    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def size(self) -> int:
        return self.data.size

    @property
    def nbytes(self) -> int:
        """Bytes of ``data``: 2 per element in float16, 4 in float32."""
        return self.data.nbytes

    @property
    def device(self) -> str:
        return backend.device_of(self.data)

    @property
    def creator(self) -> Any:
        """The Function that produced this tensor (None for a leaf)."""
        return self._ctx

    @property
    def is_leaf(self) -> bool:
        return self._ctx is None

    def edge(self) -> autograd.Edge:
        """This computed tensor as a graph edge (one per tensor): its creator, shape and dtype, not its array."""
        if self._edge is None:
            self._edge = autograd.Edge(self)
        return self._edge

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("a 0-d tensor (shape ()) has no length; read its value with .item()")
        return len(self.data)

    def __iter__(self) -> Any:
        """The rows along the first axis (without this, Python's old protocol would make a 0-d tensor an empty list)."""
        if self.ndim == 0:
            raise TypeError("cannot iterate over a 0-d tensor (shape ()); read its value with .item()")
        return (self[i] for i in range(len(self)))

    def __bool__(self) -> bool:
        """The truth of a one-element tensor; without this, every Tensor (even tensor(0.0)) would be true."""
        if self.size != 1:
            raise ValueError(
                f"the truth value of a tensor of shape {self.shape} ({self.size} elements) is ambiguous: "
                "reduce it to one value first, e.g. (x > 0).numpy().all() or x.max().item() > 0"
            )
        return bool(self.item())

    def __repr__(self) -> str:
        values = np.array2string(backend.to_device(self.data, "cpu"), separator=", ", prefix="tensor(", threshold=64)
        parts = [f"shape={self.shape}", f"dtype={self.dtype}", f"device='{self.device}'"]
        if self.requires_grad:
            parts.append("requires_grad=True")
        if self._ctx is not None:
            parts.append(f"creator={self._ctx.name}")
        return f"tensor({values}, {', '.join(parts)})"

    # ---- gradients -----------------------------------------------------------------------
    def requires_grad_(self, flag: bool = True) -> Tensor:
        """Mark a leaf as wanting a gradient (only floating-point tensors can)."""
        if not isinstance(flag, (bool, np.bool_)):  # "no" or 0.5 would be truthy, and silently mean yes
            raise TypeError(f"requires_grad must be True or False; got {flag!r} ({type(flag).__name__})")
        if flag and not dtypes.is_floating(self.dtype):
            raise TypeError(
                f"only floating-point tensors can require gradients; this one is {self.dtype}. "
                "Convert it first, e.g. x.astype('float32')"
            )
        if not self.is_leaf:
            raise autograd.GradientError("requires_grad_ can only change a leaf; use detach() first")
        self.requires_grad = flag
        return self

    def backward(self, grad: Any = None, retain_graph: bool = False) -> None:
        """Fill ``.grad`` of every leaf this tensor depends on (see autograd.backward)."""
        autograd.backward(self, grad, retain_graph)

    def retain_grad(self) -> None:
        """Keep the gradient of this intermediate tensor in ``.grad`` after backward."""
        if self._ctx is not None:
            self._ctx.output_ref = autograd.make_output_ref(self)

    def zero_grad(self) -> None:
        self.grad = None

    def detach(self) -> Tensor:
        """The same array, cut off from the graph."""
        return Tensor._make(self.data, False, None)

    # ---- conversions ---------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """The data as a NumPy array (copied from the GPU if needed)."""
        return backend.to_device(self.data, "cpu")

    def item(self) -> float | int | bool:
        if self.size != 1:
            raise ValueError(f"item() needs a tensor with one element; this one has shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    # Operators (+, *, @, ...) and methods that are operations (.sum(), .exp(), .astype(), ...)
    # are the functions of tinyamp.ops, attached by tinyamp.ops.setup_tensor(): the ops build
    # Tensors, so this module cannot import them.


def _to_array(data: Any, dtype: Any, device: str | None) -> Any:
    """Copy `data` into a fresh array of a supported dtype on `device`."""
    dtype = dtypes.resolve(dtype)
    if isinstance(data, Tensor):
        data = data.data
    if device is None:
        device = backend.device_of(data) if backend.is_array(data) else "cpu"
    device = backend.check_device(device)
    xp = backend.array_module(device)
    if backend.is_array(data):
        if backend.device_of(data) != device:
            data = backend.to_device(data, device)
        arr = xp.array(data, dtype=dtype, copy=True)
    else:
        host = np.asarray(data) if dtype is None else None
        if host is not None and host.dtype == np.float64:
            # Python floats become float32 (the training default, as in PyTorch);
            # a NumPy float64 array passed in directly keeps float64.
            dtype = dtypes.float32
        elif host is not None and host.dtype.kind in "OUSV":
            raise TypeError(f"cannot make a tensor from {type(data).__name__} data of dtype {host.dtype}")
        arr = xp.asarray(np.asarray(data, dtype=dtype))
    dtypes.check_supported(arr.dtype, device)
    return arr


def tensor(data: Any, dtype: Any = None, requires_grad: bool = False, device: str | None = None) -> Tensor:
    """Make a leaf tensor from a number, a (nested) list, or a NumPy/CuPy array (copied).

    ``dtype`` defaults to float32 for Python floats, int64 for ints, and the array's own
    dtype for arrays.  ``device`` is "cpu" (NumPy) or "cuda" (CuPy); by default, where
    `data` already is (a CuPy array stays on the GPU), and "cpu" for Python data.
    """
    return Tensor(data, dtype=dtype, requires_grad=requires_grad, device=device)


def as_tensor(value: Any, like: Tensor) -> Tensor:
    """Turn an operand into a Tensor that can meet `like` in an operation.

    A Python scalar takes the dtype of `like` (weak scalar), and must fit in it: a scalar
    that rounds to inf in float16 (|x| >= 65520) is an error, not a silent inf.
    """
    if isinstance(value, Tensor):
        if value.device != like.device:
            raise backend.DeviceError(
                f"an operation got tensors on two devices: {like.device} {like.shape} and "
                f"{value.device} {value.shape}; move one with .to('{like.device}')"
            )
        return value
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        value = value.item()  # a NumPy scalar is treated like the Python number it holds
    if isinstance(value, (int, float)):
        dt = dtypes.scalar_dtype(like.dtype, value)
        if dt.kind != "f" and dt.name != "bfloat16":
            return Tensor._make(dt.type(value), False, None)
        if math.isfinite(value) and abs(value) >= dtypes.overflow_threshold(dt):
            raise OverflowError(
                f"the scalar {value!r} does not fit in {dt} (it would round to inf); cast the "
                f"tensor of shape {like.shape} to a wider dtype first, e.g. x.float()"
            )
        # A NumPy scalar of the tensor's own dtype: weak like a Python scalar, and usable
        # by NumPy and CuPy alike without a host-to-device copy.
        return Tensor._make(dt.type(value), False, None)
    if backend.is_array(value):
        return as_tensor(Tensor._make(value, False, None), like)
    raise TypeError(f"cannot combine a Tensor with {type(value).__name__}; use a Tensor, an array or a number")


def takes_a_tensor(op: Callable[..., Any] | None = None, *, what: str = "") -> Any:
    """Decorate an op whose first argument must be a Tensor (``@takes_a_tensor``, or with
    ``what="logits"``): anything else is refused there with :func:`not_a_tensor`, named after the op."""
    if op is None:
        return functools.partial(takes_a_tensor, what=what)
    name = f"{op.__name__} ({what})" if what else op.__name__

    @functools.wraps(op)
    def checked(x: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(x, Tensor):
            raise not_a_tensor(x, name)
        return op(x, *args, **kwargs)

    return checked


def not_a_tensor(value: Any, op: str) -> TypeError:
    """The error for an operation given a NumPy array, a list or a number where it needs a Tensor.

    Without it, a NumPy array would reach the op as ``array.data`` (a memoryview) and fail far
    inside with "Cannot interpret '<memory at 0x...>' as a data type".
    """
    what = type(value).__name__
    if backend.is_array(value):
        what = f"a {type(value).__module__.split('.')[0]} array of shape {value.shape} and dtype {value.dtype}"
    return TypeError(f"{op} takes a tinyamp Tensor; got {what}. Wrap it first: ta.tensor(x)")
