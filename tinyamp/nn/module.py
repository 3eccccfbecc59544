"""Module: the container of parameters that every layer and model is built from.

A Module registers what is assigned to it: ``self.weight = Parameter(...)`` records a
parameter and ``self.fc = Linear(...)`` a submodule, in assignment order.  From that
registry come the dotted names ("blocks.0.attn.qkv.weight"), the ``state_dict`` a
checkpoint saves, ``train()``/``eval()``, ``zero_grad()`` and ``to(device)``.  The
attributes are stored as ordinary attributes too, so reading ``self.weight`` in
``forward`` costs a plain attribute lookup.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, NamedTuple

from tinyamp import backend, dtypes
from tinyamp.nn.parameter import Parameter
from tinyamp.tensor import Tensor

# Stacks of the ids of the modules running now, innermost last; each is kept by an
# inspection tool (tinyamp.inspect.find_overflow) while it is active.
running_module_stacks: list[list[int]] = []


class StateDictError(ValueError):
    """A state_dict that does not fit the model: missing or unexpected keys, wrong shapes or dtypes."""


class LoadResult(NamedTuple):
    """What ``load_state_dict`` ignored (always empty lists when ``strict=True`` succeeds)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class Module:
    """Base class of layers and models: subclass it, assign parameters and submodules
    in ``__init__`` (after ``super().__init__()``), and write ``forward``.

    ``module(x)`` calls ``module.forward(x)``.  ``training`` is True after construction;
    ``eval()`` switches it off in the whole tree (dropout becomes the identity).
    """

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    # ---- registration -------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                f"cannot assign {name!r} before Module.__init__() ran; call super().__init__() "
                f"first in {type(self).__name__}.__init__"
            )
        params, buffers, modules = self._parameters, self._buffers, self._modules
        if isinstance(value, Parameter):
            buffers.pop(name, None)
            modules.pop(name, None)
            params[name] = value
        elif isinstance(value, Module):
            params.pop(name, None)
            buffers.pop(name, None)
            modules[name] = value
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"buffer {name!r} must be a Tensor or None; got {type(value).__name__}")
            buffers[name] = value
        else:
            if isinstance(value, Tensor) and value.requires_grad and value.is_leaf:
                # a bare leaf that wants a gradient would be silently left out of
                # parameters() and so never trained: almost always a mistake
                raise TypeError(
                    f"{type(self).__name__}.{name} is a Tensor with requires_grad=True but not a Parameter, "
                    f"so it would not be registered or trained; assign nn.Parameter(value) instead"
                )
            params.pop(name, None)
            modules.pop(name, None)
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        for registry in (self._parameters, self._buffers, self._modules):
            registry.pop(name, None)
        self._non_persistent.discard(name)
        object.__delattr__(self, name)

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Register a Tensor that is state but not a parameter (e.g. running statistics).

        Buffers move with ``to(device)``; persistent ones are saved in ``state_dict``.
        """
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"buffer {name!r} must be a Tensor or None; got {type(tensor).__name__}")
        if name in self._parameters or name in self._modules:
            raise KeyError(f"{name!r} is already a parameter or a submodule of {type(self).__name__}")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)
        object.__setattr__(self, name, tensor)

    # ---- walking the tree -----------------------------------------------------------------
    def named_children(self) -> list[tuple[str, Module]]:
        """Direct submodules, in assignment order."""
        return list(self._modules.items())

    def children(self) -> list[Module]:
        """Direct submodules, in assignment order."""
        return list(self._modules.values())

    def named_modules(self, prefix: str = "") -> list[tuple[str, Module]]:
        """This module (name `prefix`, "" by default) and every descendant, depth first."""
        out: list[tuple[str, Module]] = []
        seen: set[int] = set()
        stack: list[tuple[str, Module]] = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            out.append((name, module))
            kids = [(f"{name}.{k}" if name else k, m) for k, m in module._modules.items()]
            stack.extend(reversed(kids))
        return out

    def modules(self) -> list[Module]:
        """This module and every descendant."""
        return [m for _, m in self.named_modules()]

    def named_parameters(self, prefix: str = "") -> list[tuple[str, Parameter]]:
        """``(dotted name, parameter)`` pairs, each parameter once (a shared one under its first name).

        A list, not a generator as in PyTorch, so it can be iterated twice.
        """
        out: list[tuple[str, Parameter]] = []
        seen: set[int] = set()
        for mod_name, module in self.named_modules(prefix):
            for name, p in module._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append((f"{mod_name}.{name}" if mod_name else name, p))
        return out

    def parameters(self) -> list[Parameter]:
        """Every parameter once, in the order of ``named_parameters``."""
        return [p for _, p in self.named_parameters()]

    def named_buffers(self, prefix: str = "") -> list[tuple[str, Tensor]]:
        """``(dotted name, buffer)`` pairs for every buffer that is not None."""
        return [
            (f"{mod_name}.{name}" if mod_name else name, b)
            for mod_name, module in self.named_modules(prefix)
            for name, b in module._buffers.items()
            if b is not None
        ]

    def num_parameters(self) -> int:
        """The number of trainable scalars: $\\sum_p \\mathrm{size}(p)$."""
        return sum(p.size for p in self.parameters())

    # ---- modes, gradients, devices ----------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        """Set ``training`` to `mode` on this module and every descendant."""
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> Module:
        """``train(False)``: dropout off in the whole tree."""
        return self.train(False)

    def zero_grad(self) -> None:
        """Drop every parameter's gradient (``.grad = None``): the next backward starts afresh."""
        for p in self.parameters():
            p.grad = None

    def to(self, device: str) -> Module:
        """Move every parameter, gradient and buffer to `device`, in place (the Tensor objects stay).

        An optimizer creates its state at its first step, on the parameters' device: move
        the model before training starts (or reload the optimizer's state_dict, which
        puts each state array on its parameter's device).
        """
        device = backend.check_device(device)
        tensors = self.parameters() + [b for _, b in self.named_buffers()]
        for t in tensors:
            dtypes.check_supported(t.dtype, device)
        for t in tensors:
            t.data = backend.to_device(t.data, device)
            if t.grad is not None:
                t.grad = backend.to_device(t.grad, device)
        return self

    def astype(self, dtype: Any) -> Module:
        """Round every floating parameter (and its gradient) to `dtype`, in place.

        ``model.astype("float16")`` makes a model that computes and *stores* its weights
        in FP16: the Parameter objects stay (an optimizer built on them keeps working),
        their arrays are replaced by rounded copies.  Values beyond 65504 become inf.
        """
        dt = dtypes.resolve(dtype)
        if not dtypes.is_floating(dt):
            raise TypeError(f"astype needs a floating dtype for parameters; got {dt}")
        for p in self.parameters():
            dtypes.check_supported(dt, p.device)
        for p in self.parameters():
            p.data = p.data.astype(dt)
            if p.grad is not None:
                p.grad = p.grad.astype(dt)
        return self

    def half(self) -> Module:
        """``astype("float16")``."""
        return self.astype("float16")

    def float(self) -> Module:
        """``astype("float32")``."""
        return self.astype("float32")

    # ---- checkpoints --------------------------------------------------------------------------
    def _state_tensors(self) -> OrderedDict[str, Tensor]:
        """Parameters and persistent buffers by dotted name, in PyTorch's order."""
        out: OrderedDict[str, Tensor] = OrderedDict()
        for mod_name, module in self.named_modules():
            dot = f"{mod_name}." if mod_name else ""
            for name, p in module._parameters.items():
                out[dot + name] = p
            for name, b in module._buffers.items():
                if b is not None and name not in module._non_persistent:
                    out[dot + name] = b
        return out

    def state_dict(self) -> OrderedDict[str, Any]:
        """Name -> a *copy* of each parameter's and persistent buffer's array (NumPy or CuPy).

        Copies, so that training on does not change a checkpoint already taken.
        """
        return OrderedDict((name, t.data.copy()) for name, t in self._state_tensors().items())

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> LoadResult:
        """Copy the values of `state_dict` into the existing arrays, in place.

        Every problem is checked before anything is copied, so a failed load changes
        nothing.  Keys missing from, or unexpected in, `state_dict` are errors when
        `strict` and are returned otherwise; a wrong shape or dtype is always an error
        (no silent cast: a float16 checkpoint loaded into a float32 model is a choice
        to make explicitly).  Values may be NumPy/CuPy arrays or Tensors.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(
                f"{type(self).__name__}.load_state_dict takes a mapping of names to arrays, as model.state_dict() "
                f"returns; got {type(state_dict).__name__}"
            )
        own = self._state_tensors()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        problems = []
        if strict and missing:
            problems.append(f"missing keys (in the model, not in the state_dict): {', '.join(missing)}")
        if strict and unexpected:
            problems.append(f"unexpected keys (in the state_dict, not in the model): {', '.join(map(str, unexpected))}")
        if strict and (missing or unexpected):
            problems.append(
                "pass the state_dict() of a model built with the same layers, or strict=False to load the keys "
                "both have (the result lists the others)"
            )
        values: dict[str, Any] = {}
        for name, t in own.items():
            if name not in state_dict:
                continue
            value = state_dict[name]
            value = value.data if isinstance(value, Tensor) else value
            if not backend.is_array(value):
                problems.append(f"{name}: expected a NumPy or CuPy array, got {type(value).__name__}")
            elif value.shape != t.shape:
                problems.append(
                    f"shape mismatch for {name}: the model has shape {t.shape}, the state_dict {value.shape}"
                )
            elif value.dtype != t.dtype:
                problems.append(
                    f"dtype mismatch for {name}: the model has dtype {t.dtype}, the state_dict {value.dtype} "
                    f"(cast the array, or build the model with dtype={value.dtype.name!r})"
                )
            else:
                values[name] = value
        if problems:
            raise StateDictError(f"cannot load the state_dict into {type(self).__name__}:\n  " + "\n  ".join(problems))
        for name, value in values.items():
            t = own[name]
            t.data[...] = backend.to_device(value, t.device)
        return LoadResult(missing, unexpected)

    # ---- calling and printing -----------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not running_module_stacks:
            return self.forward(*args, **kwargs)
        for stack in running_module_stacks:  # an inspection tool wants to know who runs
            stack.append(id(self))
        try:
            return self.forward(*args, **kwargs)
        finally:
            for stack in running_module_stacks:
                stack.pop()

    def extra_repr(self) -> str:
        """The text inside the parentheses of this module's repr (its settings)."""
        return ""

    def __repr__(self) -> str:
        lines = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self._modules.items()]
        extra = self.extra_repr()
        if not lines:
            return f"{type(self).__name__}({extra})"
        if extra:
            lines.insert(0, extra)
        return f"{type(self).__name__}(\n  " + "\n  ".join(lines) + "\n)"
