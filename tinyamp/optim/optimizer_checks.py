"""What an optimizer checks: the parameters it is given, and the checkpoints it loads.

Each problem is an error that names the parameter and says what was expected, raised
before anything changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tinyamp import backend, dtypes
from tinyamp.tensor import Tensor

Params = Iterable[Tensor] | Iterable[tuple[str, Tensor]]


class OptimizerStateError(ValueError):
    """An optimizer state_dict that does not fit this optimizer or its parameters."""


def collect(params: Params) -> tuple[list[Tensor], list[str]]:
    """Parameters and their names ("0", "1", ... unless given as named_parameters() pairs)."""
    if isinstance(params, Tensor):
        raise TypeError("an optimizer takes an iterable of parameters, e.g. model.parameters(); wrap one in a list")
    tensors: list[Tensor] = []
    names: list[str] = []
    seen: set[int] = set()
    for i, item in enumerate(params):
        name, t = item if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) else (str(i), item)
        if not isinstance(t, Tensor):
            raise TypeError(f"an optimizer can only update Tensors; parameter {name} is a {type(t).__name__}")
        if not t.is_leaf:
            raise ValueError(f"parameter {name} (shape {t.shape}) is not a leaf: it is the output of an operation")
        if not dtypes.is_floating(t.dtype):
            raise TypeError(f"parameter {name} has dtype {t.dtype}; only floating-point tensors can be trained")
        if id(t) in seen:
            raise ValueError(f"parameter {name} (shape {t.shape}) appears twice in the parameter list")
        seen.add(id(t))
        tensors.append(t)
        names.append(name)
    if not tensors:
        raise ValueError("the optimizer got an empty parameter list")
    return tensors, names


def check_state_dict(optimizer: Any, state_dict: dict[str, Any]) -> None:
    """Raise OptimizerStateError unless `state_dict` was saved by an optimizer like this one, for these parameters."""
    kind = state_dict.get("optimizer")
    if kind != type(optimizer).__name__:
        raise OptimizerStateError(
            f"this is a state_dict of {kind}; it cannot be loaded into {type(optimizer).__name__}"
        )
    hyper = state_dict["hyperparameters"]
    if set(hyper) != set(optimizer.hyperparameters):
        raise OptimizerStateError(
            f"the state_dict has hyperparameters {sorted(hyper)}; "
            f"{type(optimizer).__name__} has {sorted(optimizer.hyperparameters)}"
        )
    states = state_dict["state"]
    if len(states) != len(optimizer.params):
        raise OptimizerStateError(
            f"the state_dict holds state for {len(states)} parameters; this optimizer has {len(optimizer.params)}"
        )
    for p, name, saved, state in zip(optimizer.params, optimizer.names, state_dict["params"], states):
        expected = dtypes.accumulation_dtype(p.dtype)
        if tuple(saved["shape"]) != p.shape or saved["dtype"] != p.dtype.name:
            raise OptimizerStateError(
                f"parameter {name} has shape {p.shape} and dtype {p.dtype}, but the state_dict was saved for "
                f"{saved['name']} of shape {tuple(saved['shape'])} and dtype {saved['dtype']}"
            )
        for key, value in state.items():
            if backend.is_array(value) and (value.shape != p.shape or value.dtype != expected):
                raise OptimizerStateError(
                    f"state {key!r} of parameter {name}: expected shape {p.shape} and dtype {expected}, "
                    f"got shape {value.shape} and dtype {value.dtype}"
                )
