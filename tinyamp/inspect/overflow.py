"""The overflow locator: the first op whose output or gradient left the FP16 range.

    with tinyamp.inspect.find_overflow(model) as found:
        loss = cross_entropy(model(x), y)
        loss.backward()
    print(found.first)   # e.g. forward of Linear in module "2", max |value| 7.1e+04

Inside the block every forward output and every backward gradient is checked: a
non-finite value, or a finite magnitude above the limit (65504 for float16, the
largest finite FP16 value) in a wider dtype, is recorded with the op, the module
that ran it, the direction (forward or backward), and the offending value.  Outside
the block nothing is checked and nothing costs anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tinyamp import autograd
from tinyamp.backend import get_array_module, to_device
from tinyamp.dtypes import finfo, resolve
from tinyamp.function import Function


@dataclass(frozen=True)
class OverflowEvent:
    """Where a value first left the range: op, module, direction, dtype and the value."""

    direction: str  # "forward" or "backward"
    op: str
    module: str | None
    dtype: str
    shape: tuple[int, ...]
    value: float  # the offending value (inf, nan, or the largest magnitude)
    count: int  # how many elements were out of range

    def __str__(self) -> str:
        where = f" in module {self.module!r}" if self.module is not None else ""
        return (
            f"{self.direction} of {self.op}{where}: {self.count} of the values of a {self.dtype} {self.shape} "
            f"array are out of range (e.g. {self.value:.6g})"
        )


class find_overflow:  # noqa: N801  (a context manager read as a verb)
    """Record every op whose forward output or backward gradient leaves the range of `dtype`.

    ``model`` (optional) gives module names: the innermost module running when the
    value appeared.  ``raise_on_overflow=True`` stops at the first event with an
    OverflowError naming it.
    """

    def __init__(self, model: Any = None, dtype: Any = "float16", raise_on_overflow: bool = False) -> None:
        self.limit = float(finfo(resolve(dtype)).max)
        self.dtype_name = resolve(dtype).name
        self.raise_on_overflow = raise_on_overflow
        self.events: list[OverflowEvent] = []
        self._names = {id(m): name or type(m).__name__ for name, m in model.named_modules()} if model else {}
        self._module_stack: list[int] = []

    @property
    def first(self) -> OverflowEvent | None:
        return self.events[0] if self.events else None

    def __enter__(self) -> find_overflow:
        from tinyamp.nn import module as nn_module

        autograd.hooks.append(self._check)
        nn_module.running_module_stacks.append(self._module_stack)
        return self

    def __exit__(self, *exc: object) -> None:
        from tinyamp.nn import module as nn_module

        autograd.hooks.remove(self._check)
        nn_module.running_module_stacks.remove(self._module_stack)

    def _check(self, direction: str, fn: Function, arrays: Any) -> None:
        if direction == "forward":  # remember the module on the node, for its backward
            fn.module_name = self._names.get(self._module_stack[-1]) if self._module_stack else None
        for array in arrays:
            if array is None or getattr(array, "dtype", None) is None or array.dtype.kind not in "fV":
                continue
            xp = get_array_module(array)
            magnitude = xp.abs(array.astype("float32", copy=False))
            bad = ~(magnitude <= self.limit)  # NaN fails every comparison, so it counts as bad
            count = int(bad.sum())
            if not count:
                continue
            worst = to_device(array[bad].astype("float64"), "cpu")
            value = float(worst[~(abs(worst) <= self.limit)][0]) if worst.size else float("nan")
            module = getattr(fn, "module_name", None)
            event = OverflowEvent(direction, fn.name, module, array.dtype.name, tuple(array.shape), value, count)
            self.events.append(event)
            if self.raise_on_overflow:
                raise OverflowError(f"overflow beyond the {self.dtype_name} range: {event}")
