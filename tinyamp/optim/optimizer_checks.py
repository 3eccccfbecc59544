"""What an optimizer checks: the parameters it is given, its hyperparameters, and the checkpoints it loads.

Each problem is an error that names the parameter and says what was expected, raised
before anything changes.
"""

from __future__ import annotations

import math
import numbers
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
    if hasattr(params, "parameters") and hasattr(params, "named_parameters"):  # a Module, not its parameters
        raise TypeError(f"an optimizer takes the parameters of a model, not the {type(params).__name__} itself: "
                        "pass model.named_parameters() (or model.parameters())")  # fmt: skip
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


# The hyperparameters that must be finite numbers >= 0: a typical value, and what a NaN or inf would do.
# 0 turns a term off (lr=0 leaves the weights where they are while the moments update, as in PyTorch).
_NAN_OR_INF_WEIGHTS = "the steps would make the weights NaN or inf"
NON_NEGATIVE = {
    "lr": ("1e-3", _NAN_OR_INF_WEIGHTS),
    "momentum": ("0.9", _NAN_OR_INF_WEIGHTS),
    "weight_decay": ("0.01", _NAN_OR_INF_WEIGHTS),
    "eps": ("1e-8", "Adam divides by sqrt(v) + eps: NaN makes the weights NaN, inf zeroes every step"),
}


def checked_hyperparameter(optimizer: str, name: str, value: Any) -> Any:
    """`value` for the hyperparameter `name` of the optimizer class `optimizer`, or an error naming both and the fix.

    lr, momentum, weight_decay, eps: a finite number >= 0.  A NaN or inf lr would reach every
    weight at the next step (``w -= lr * g`` gives inf or NaN), and a loss scaler cannot skip
    that step: its gradients are finite.  betas: a tuple of two numbers in [0, 1).
    nesterov: True or False.
    """
    if name in NON_NEGATIVE:
        example, nan_or_inf = NON_NEGATIVE[name]
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise TypeError(
                f"{optimizer}: {name} must be a number; got {type(value).__name__} {value!r}. "
                f"Pass a Python float, e.g. {name}={example}"
            )
        if not (math.isfinite(value) and value >= 0):
            why = "" if math.isfinite(value) else f" ({nan_or_inf})"
            schedule = "; if a learning-rate schedule computed it, check the schedule" if name == "lr" else ""
            raise ValueError(
                f"{optimizer}: {name} must be a finite number >= 0; got {name}={value!r}{why}. "
                f"Pass one, e.g. {name}={example}{schedule}"
            )
    elif name == "betas":
        ok = isinstance(value, tuple) and len(value) == 2
        if not (ok and all(isinstance(b, numbers.Real) and not isinstance(b, bool) and 0 <= b < 1 for b in value)):
            raise ValueError(
                f"{optimizer}: betas must be a tuple of two numbers in [0, 1) (a beta of 1 keeps its moment at 0 and "
                f"divides by 1 - beta^t = 0); got betas={value!r}. Pass e.g. betas=(0.9, 0.999)"
            )
    elif name == "nesterov" and not isinstance(value, bool):
        raise TypeError(f"{optimizer}: nesterov must be True or False; got {value!r}")
    return value


def _whole_number(value: Any) -> bool:
    """A Python or NumPy integer >= 0 (not a bool, not a float: a count of steps)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0


def check_state_dict(optimizer: Any, state_dict: dict[str, Any]) -> None:
    """Raise OptimizerStateError unless `state_dict` was saved by an optimizer like this one, for these parameters.

    A checkpoint is input, so its state is checked as its hyperparameters are: the keys a
    state_dict has, a step count that is a whole number >= 0, each parameter's state holding
    the keys its optimizer writes (``state_keys``), counts that are whole numbers >= 0 (Adam's
    t = -1 would divide by 1 - beta^0 = 0 at the next step) and arrays that are finite (a
    NaN moment makes its weight NaN at the next step, and no loss scaler can skip that: the
    gradients are finite).
    """
    if not isinstance(state_dict, dict):
        raise OptimizerStateError(f"an optimizer state_dict is a dict; got {type(state_dict).__name__}")
    expected_keys = {"optimizer", "hyperparameters", "step_count", "params", "state"}
    if set(state_dict) != expected_keys:
        missing, extra = sorted(expected_keys - set(state_dict)), sorted(set(state_dict) - expected_keys)
        raise OptimizerStateError(
            f"an optimizer state_dict has the keys {sorted(expected_keys)}; this one "
            + (f"lacks {missing}" if missing else "")
            + (" and " if missing and extra else "")
            + (f"has the unknown {extra}" if extra else "")
            + "; pass what optimizer.state_dict() returned"
        )
    for key, kind in (("hyperparameters", dict), ("params", list), ("state", list)):
        if not isinstance(state_dict[key], kind):
            raise OptimizerStateError(
                f"the state_dict's {key} is a {type(state_dict[key]).__name__}, not a {kind.__name__}"
            )
    if not _whole_number(state_dict["step_count"]):
        raise OptimizerStateError(
            f"the state_dict's step_count is {state_dict['step_count']!r}; it counts steps, a whole number >= 0"
        )
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
    for name, value in hyper.items():  # checked here too, so that a bad one changes nothing
        try:
            checked_hyperparameter(type(optimizer).__name__, name, tuple(value) if isinstance(value, list) else value)
        except (TypeError, ValueError) as exc:
            raise OptimizerStateError(f"the state_dict's hyperparameters do not fit: {exc}") from exc
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
        if not isinstance(state, dict) or not isinstance(saved, dict):
            raise OptimizerStateError(f"the state_dict's entry for parameter {name} is not a dict")
        keys = getattr(optimizer, "state_keys", None)
        if state and keys is not None and set(state) != set(keys):
            raise OptimizerStateError(
                f"the state of parameter {name} has the keys {sorted(state)}; {type(optimizer).__name__} keeps "
                f"{sorted(keys)} (or nothing, before the parameter's first step)"
            )
        for key, value in state.items():
            if backend.is_array(value):
                if value.shape != p.shape or value.dtype != expected:
                    raise OptimizerStateError(
                        f"state {key!r} of parameter {name}: expected shape {p.shape} and dtype {expected}, "
                        f"got shape {value.shape} and dtype {value.dtype}"
                    )
                bad = _nonfinite(value)
                if bad:
                    raise OptimizerStateError(
                        f"state {key!r} of parameter {name} holds {bad:,} NaN or inf values: the next step would "
                        "make the weight NaN; the file was edited or the saved run had diverged"
                    )
            elif not _whole_number(value):
                raise OptimizerStateError(
                    f"state {key!r} of parameter {name} is {value!r}; it counts steps, a whole number >= 0"
                )


def _nonfinite(values: Any) -> int:
    """How many elements of the array `values` (NumPy or CuPy) are NaN or inf."""
    xp = backend.get_array_module(values)
    return int(values.size - int(xp.count_nonzero(xp.isfinite(values))))
