"""An FP8 run's scales in its checkpoint: every tensor's state, as columns of NumPy arrays.

``tinyamp train`` stores ``to_extra(casts)`` in the checkpoint's ``extra["fp8"]``, and a
resumed run loads it with ``load_extra``: the next casts then use the scales, amax histories
and records the straight run would have had, bit for bit.  A tensor's casts are stored as
one array per field (a step costs about 40 bytes a tensor, where a JSON row would cost
about 200, inside the checkpoint's 16 MB metadata), and read back, like everything in a
checkpoint, as input: checked, then loaded whole or not at all, with one sentence naming
the file for anything ``to_extra`` never writes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tinyamp.fp8.scaling import EVENTS
from tinyamp.fp8.training import BlockCasts, Fp8Casts
from tinyamp.nn.linear import Linear as LinearLayer
from tinyamp.nn.module import Module

# field: the dtype it is stored as (float32 values stored as float32 are exact; counts as int64)
PER_TENSOR = {"amax": np.float32, "scale": np.float32, "next_scale": np.float32, "event": np.uint8,
              "saturated": np.int64, "flushed": np.int64, "nonfinite": np.int64}  # fmt: skip
BLOCKS = {"amax": np.float32, "scale_low": np.float32, "scale_high": np.float32,
          "saturated": np.int64, "flushed": np.int64, "nonfinite": np.int64}  # fmt: skip
BYTES_PER_CAST = sum(np.dtype(t).itemsize for t in PER_TENSOR.values())


def to_extra(casts: Fp8Casts) -> dict[str, Any]:
    """The state of `casts` as a checkpoint's ``extra`` stores it: numbers, strings and arrays."""
    tensors = {}
    if isinstance(casts, BlockCasts):
        for name, rows in casts.history.items():
            columns = {k: np.array([getattr(r, k) for r in rows], dtype=t) for k, t in BLOCKS.items()}
            tensors[name] = {"pass": casts.passes[name], "values": casts.sizes[name], "casts": columns}
    else:
        for name, tensor in casts.scales.tensors.items():
            columns = {k: np.array([EVENTS.index(r.event) if k == "event" else getattr(r, k) for r in tensor.history],
                                   dtype=t) for k, t in PER_TENSOR.items()}  # fmt: skip
            tensors[name] = {"pass": casts.scales.passes[name], "values": casts.sizes[name], "scale": tensor.scale,
                             "amax_history": tensor.amax_history.copy(), "casts": columns}  # fmt: skip
    rounding = {"rounding": casts.ROUNDING} if isinstance(casts, BlockCasts) else {}  # of the block scales
    return {"recipe": casts.recipe, "tensors": tensors, **rounding}


def cast_tensors(casts: Fp8Casts, model: Module) -> tuple[list[str], list[str]]:
    """The tensors a training step of `model` casts under `casts`: (those every step casts, those it may).

    Every Linear layer casts its input, its weight and its output's gradient at every step
    (MXFP8: each of them once more along the other axis, ``.T``); MXFP8 casts a layer's
    ``grad_output`` along its outputs only where the layer's input needs a gradient (not the
    first layer of an MLP), so that one may be missing.
    """
    layers = [name for name, m in model.named_modules() if isinstance(m, LinearLayer)]
    if isinstance(casts, BlockCasts):
        kinds, optional = ("input", "weight", "input.T", "weight.T", "grad_output.T"), ("grad_output",)
    else:
        kinds, optional = ("input", "weight", "grad_output"), ()
    return [f"{n}.{k}" for n in layers for k in kinds], [f"{n}.{k}" for n in layers for k in optional]


def load_extra(casts: Fp8Casts, saved: Any, path: str, model: Module | None = None) -> None:
    """Restore `casts` from a checkpoint's ``extra["fp8"]``; ValueError (one sentence naming `path`) if damaged.

    With `model`, the saved tensors must be those a step of `model` casts (``cast_tensors``):
    a tensor left out would start again from scale 1 and an empty history, silently.
    """

    def bad(what: str) -> ValueError:
        return ValueError(f"{path}: the checkpoint's FP8 state {what}; the file was edited or damaged")

    blocks = isinstance(casts, BlockCasts)
    written = {"recipe", "tensors"}  # and "rounding" in MXFP8 checkpoints: how its block scales were rounded
    if not isinstance(saved, dict) or not written <= set(saved) <= written | ({"rounding"} if blocks else set()) \
            or not isinstance(saved["tensors"], dict):  # fmt: skip
        raise bad("is not the table of tensors tinyamp writes")
    if saved["recipe"] != casts.recipe:
        raise bad(f"is of the recipe {saved['recipe']!r}, not this run's {casts.recipe!r}")
    rounding = saved.get("rounding", getattr(casts, "ROUNDING", None))  # older files do not say: taken as this one's
    if blocks and rounding != casts.ROUNDING:  # the run would go on with other block scales than it began with
        raise ValueError(f"{path}: the checkpoint's MXFP8 block scales were rounded {rounding!r}, this recipe rounds "
                         f"them {casts.ROUNDING!r}: resume it with the tinyamp version that made it")
    if model is not None:
        required, optional = cast_tensors(casts, model)
        missing = [name for name in required if name not in saved["tensors"]]
        if missing:
            raise bad(f"has no tensor {missing[0]!r} (its scale, amax history and casts), which every step of "
                      f"this model casts")  # fmt: skip
        unknown = [name for name in saved["tensors"] if name not in {*required, *optional}]
        if unknown:
            raise bad(f"holds a tensor {unknown[0]!r} that no Linear layer of this model casts")
    fields = BLOCKS if blocks else PER_TENSOR
    keys = {"pass", "values", "casts"} | (set() if blocks else {"scale", "amax_history"})
    state: dict[str, Any] = {}
    for name, t in saved["tensors"].items():
        if not isinstance(t, dict) or set(t) != keys or not isinstance(t["casts"], dict) or set(t["casts"]) != set(
                fields):  # fmt: skip
            raise bad(f"of tensor {name!r} is not the table of casts tinyamp writes")
        if type(t["values"]) is not int or t["values"] < 0:
            raise bad(f"says tensor {name!r} has {t['values']!r} values a cast")
        columns = t["casts"]
        for key, dtype in fields.items():
            if not (isinstance(columns[key], np.ndarray) and columns[key].ndim == 1 and columns[key].dtype == dtype):
                raise bad(f"stores the {key} of tensor {name!r} as something other than a list of "
                          f"{np.dtype(dtype).name}")  # fmt: skip
        lengths = {len(c) for c in columns.values()}
        if len(lengths) != 1:
            raise bad(f"holds columns of different lengths for tensor {name!r}")
        counts = [columns[k] for k in ("saturated", "flushed", "nonfinite")]
        if any(c.size and (c.min() < 0 or c.max() > t["values"]) for c in counts):
            raise bad(f"counts more values of tensor {name!r} than a cast holds, or fewer than 0")
        if not blocks and columns["event"].size and columns["event"].max() >= len(EVENTS):
            raise bad(f"names an event of tensor {name!r} that does not exist")
        rows = [dict(zip(fields, values)) for values in zip(*(columns[k].tolist() for k in fields))]
        for i, row in enumerate(rows):
            row["step"] = i
            if not blocks:
                row["event"] = EVENTS[row["event"]]
        state[name] = {"pass": t["pass"], "values": t["values"], "history": rows}
        if not blocks:
            state[name] |= {"scale": t["scale"], "amax_history": t["amax_history"]}
    try:
        if blocks:
            casts.load_state_dict({"tensors": state})
        else:
            _load_per_tensor(casts, state)
    except (ValueError, TypeError, KeyError) as exc:
        raise bad(f"does not load ({exc})") from None


def _load_per_tensor(casts: Any, state: dict[str, Any]) -> None:
    recipe = casts.scales.state_dict()["recipe"]
    tensors = {}
    for name, t in state.items():
        if not isinstance(t["amax_history"], np.ndarray) or t["amax_history"].dtype != np.float32:
            raise ValueError(f"the amax history of tensor {name!r} is not a float32 array")
        fmt = casts.scales.recipe.format_for(t["pass"]).name
        tensors[name] = {"pass": t["pass"], "name": name, "format": fmt, "recipe": recipe, "scale": t["scale"],
                         "amax_history": t["amax_history"].tolist(), "history": t["history"]}  # fmt: skip
    casts.load_state_dict({"scales": {"recipe": recipe, "tensors": tensors},
                           "sizes": {n: t["values"] for n, t in state.items()}})  # fmt: skip


def extra_bytes(tensors: int, steps: int) -> int:
    """The most bytes of arrays an FP8 state of `tensors` tensors over `steps` steps holds (for load_checkpoint)."""
    return tensors * (steps * BYTES_PER_CAST + 4 * 1024 + 4096)
