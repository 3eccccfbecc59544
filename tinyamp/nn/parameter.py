"""Parameter: the Tensor a Module trains.

A Parameter is a leaf Tensor with ``requires_grad=True``.  It is a subclass of Tensor
for one reason only: so that ``Module.__setattr__`` can recognise it and register it.
Operations on a Parameter return plain Tensors (``Tensor._make`` always builds a
``Tensor``), so the fast path every op takes is unchanged.
"""

from __future__ import annotations

from typing import Any

from tinyamp.tensor import Tensor


class Parameter(Tensor):
    """A trainable leaf tensor: ``Parameter(data)`` copies `data` and sets requires_grad.

    ``dtype`` defaults to the dtype of `data` (float32 for Python floats); only
    floating-point parameters can carry gradients.
    """

    __slots__ = ()

    def __init__(self, data: Any, dtype: Any = None, requires_grad: bool = True) -> None:
        super().__init__(data, dtype=dtype, requires_grad=requires_grad)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()
