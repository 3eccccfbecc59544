"""Containers: Sequential (a pipeline) and ModuleList (a list whose members are registered)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from tinyamp.nn.module import Module


class ModuleList(Module):
    """A list of modules registered under the names "0", "1", ... (so their parameters count).

    A plain Python list of layers would hide them from ``parameters()``.
    """

    def __init__(self, modules: Iterable[Module] = ()) -> None:
        super().__init__()
        if isinstance(modules, Module) or not isinstance(modules, Iterable):
            raise TypeError(
                f"{type(self).__name__} takes an iterable of Modules, e.g. {type(self).__name__}([nn.Linear(4, 4)]); "
                f"got {type(modules).__name__}"
            )
        for m in modules:
            self.append(m)

    def append(self, module: Module) -> ModuleList:
        if not isinstance(module, Module):
            raise TypeError(f"{type(self).__name__} holds Modules; got {type(module).__name__}")
        setattr(self, str(len(self._modules)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        for m in modules:
            self.append(m)
        return self

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._modules.values()))

    def __getitem__(self, index: int | slice) -> Any:
        items = list(self._modules.values())
        if isinstance(index, slice):
            return type(self)(items[index])
        if not -len(items) <= index < len(items):
            raise IndexError(f"index {index} is out of range for a {type(self).__name__} of {len(items)} modules")
        return items[index]


class Sequential(ModuleList):
    """$y = f_n(\\ldots f_2(f_1(x)))$: modules applied in order, named "0", "1", ..."""

    def __init__(self, *modules: Module) -> None:
        super().__init__(modules)

    def __getitem__(self, index: int | slice) -> Any:
        items = list(self._modules.values())
        if isinstance(index, slice):
            return Sequential(*items[index])
        return super().__getitem__(index)

    def forward(self, x: Any) -> Any:
        for m in self._modules.values():
            x = m(x)
        return x
