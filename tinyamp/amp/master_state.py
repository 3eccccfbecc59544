"""MasterWeights' checks (the optimizer it wraps, the checkpoints it loads) and its summary table.

A checkpoint that does not fit (other parameter names, shapes or dtypes; a history of the
wrong shape; a master that is NaN or inf) is refused before anything changes, with every
problem named.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tinyamp import backend, dtypes, kernels
from tinyamp.amp.lost_updates import UpdateRecord
from tinyamp.backend import get_array_module
from tinyamp.optim.optimizer import Optimizer


class MasterWeightsStateError(ValueError):
    """A MasterWeights state_dict that does not fit these parameters (names, shapes, dtypes)."""


def checked_master_dtype(optimizer: Any, master_dtype: Any) -> np.dtype:
    """`master_dtype` resolved, once `optimizer` is known to be one MasterWeights can wrap (else a clear error)."""
    if not isinstance(optimizer, Optimizer):
        raise TypeError(
            f"MasterWeights wraps a tinyamp.optim optimizer (SGD, Adam, AdamW); got {type(optimizer).__name__}"
        )
    if getattr(optimizer, "_master_weights", None) is not None:
        raise ValueError(
            f"this {type(optimizer).__name__} is already wrapped by a MasterWeights, so its params are float32 "
            "masters already; wrap each optimizer once (use the existing MasterWeights)"
        )
    dt = dtypes.resolve(master_dtype)
    if dt is None or not dtypes.is_floating(dt) or dt.itemsize < 4:
        raise ValueError(
            f"master_dtype={master_dtype!r}: a master copy must be float32 (or float64), wider than the "
            "16-bit weights it keeps; in a 16-bit master, small updates are lost exactly as in the weights"
        )
    params, names = optimizer.params, optimizer.names
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"parameter names must be unique to tell the masters apart; {twice} appear twice")
    for p, name in zip(params, names):
        if p.dtype.itemsize > dt.itemsize:
            raise ValueError(
                f"parameter {name} (shape {p.shape}) is {p.dtype}, wider than master_dtype {dt}: a master copy "
                f"must be at least as wide as its parameter; use master_dtype={p.dtype.name!r}"
            )
    if all(p.dtype == dt for p in params):
        raise ValueError(
            f"every parameter is already {dt}, so master_dtype {dt} is not wider than the parameters and there "
            "is nothing to keep a master copy of; cast the model to float16 first, or use the optimizer directly"
        )
    return dt


def state_dict(mw: Any) -> dict[str, Any]:
    """The masters (copied), the inner optimizer's state_dict and the update history as an int64 array."""
    fields = len(UpdateRecord._fields)
    return {
        "kind": "MasterWeights",
        "master_dtype": mw.master_dtype.name,
        "params": [
            {"name": n, "shape": model.shape, "model_dtype": model.dtype.name, "shared": master is model}
            for n, model, master in zip(mw.names, mw.model_params, mw.master_params)
        ],
        "master": {n: m.data.copy() for n, m in zip(mw.names, mw.master_params)},
        "optimizer": mw.optimizer.state_dict(),
        "history": np.array(mw.history, dtype=np.int64).reshape(-1, fields),
    }


def load(mw: Any, state_dict: dict[str, Any]) -> list[UpdateRecord]:
    """Check `state_dict` against `mw`, load the masters and the inner optimizer; return the history.

    Raises MasterWeightsStateError (or the optimizer's OptimizerStateError) before anything changes.
    """
    kind = state_dict.get("kind") if isinstance(state_dict, dict) else None
    if kind != "MasterWeights":
        found = state_dict.get("optimizer") if isinstance(state_dict, dict) else type(state_dict).__name__
        raise MasterWeightsStateError(
            f"this is not a MasterWeights state_dict (it looks like one of {found!r}); a plain optimizer's "
            f"state goes into optimizer.load_state_dict, not into a MasterWeights"
        )
    keys = {"kind", "master_dtype", "params", "master", "optimizer", "history"}
    if set(state_dict) != keys:
        missing, unknown = sorted(keys - set(state_dict)), sorted(map(str, set(state_dict) - keys))
        raise MasterWeightsStateError(
            f"a MasterWeights state_dict has the keys {sorted(keys)}; this one "
            + "; ".join(([f"lacks {missing}"] if missing else []) + ([f"has the unknown {unknown}"] if unknown else []))
            + ": pass what MasterWeights.state_dict() returned"
        )
    problems = []
    if state_dict["master_dtype"] != mw.master_dtype.name:
        problems.append(f"the masters were saved as {state_dict['master_dtype']}; these are {mw.master_dtype}")
    saved_params, masters = state_dict["params"], state_dict["master"]
    saved_names = [saved["name"] for saved in saved_params]
    if saved_names != mw.names or list(masters) != mw.names:
        problems.append(f"the state_dict was saved for parameters {saved_names}; this MasterWeights has {mw.names}")
    else:
        for name, model, master, saved in zip(mw.names, mw.model_params, mw.master_params, saved_params):
            value = masters[name]
            if tuple(saved["shape"]) != model.shape:
                problems.append(
                    f"parameter {name} has shape {model.shape}; the state_dict has shape {tuple(saved['shape'])}"
                )
            elif saved["model_dtype"] != model.dtype.name:
                problems.append(
                    f"parameter {name} is {model.dtype}, but the state_dict was saved from a "
                    f"{saved['model_dtype']} model; cast the model's parameters to {saved['model_dtype']} first"
                )
            elif not backend.is_array(value) or value.shape != master.shape or value.dtype != master.dtype:
                got = f"{value.shape} {value.dtype}" if backend.is_array(value) else type(value).__name__
                problems.append(f"master of {name}: expected {master.shape} {master.dtype}, got {got}")
            elif bad := _count_nonfinite(value):  # a NaN master would train the model to NaN
                problems.append(f"master of {name} holds {bad} non-finite values (NaN or inf)")
    fields = len(UpdateRecord._fields)
    history = state_dict.get("history")
    history = np.zeros((0, fields), np.int64) if history is None else backend.to_device(history, "cpu")
    if not (backend.is_array(history) and history.ndim == 2 and history.shape[1] == fields):
        problems.append(f"history: expected an array of shape (steps, {fields})")
    if problems:
        raise MasterWeightsStateError("cannot load the MasterWeights state_dict:\n  " + "\n  ".join(problems))
    mw.optimizer.load_state_dict(state_dict["optimizer"])  # checks first; raises before changing anything
    for name, master in zip(mw.names, mw.master_params):
        master.data[...] = backend.to_device(masters[name], master.device)
    return [UpdateRecord(*(int(x) for x in row)) for row in history]


def _count_nonfinite(array: Any) -> int:
    xp = get_array_module(array)
    return int(xp.count_nonzero(~xp.isfinite(array)))


def saved_copies_problem(mw: Any, state_dict: Any, saved_weights: list[Any]) -> str | None:
    """What is wrong with the two copies of each weight in a checkpoint, or None.

    A master must be finite, and the model's saved 16-bit weight must be its master rounded
    once (``kernels.cast``, as ``step()`` rounds it).  save_checkpoint writes both from the
    same masters, so they always agree; when they do not, the file was edited.
    `saved_weights[i]` is the saved model value of parameter i (None if absent); anything
    malformed is left to ``load``, which names it.
    """
    masters = state_dict.get("master") if isinstance(state_dict, dict) else None
    for name, model, saved in zip(mw.names, mw.model_params, saved_weights):
        master = masters.get(name) if isinstance(masters, dict) else None
        if not (backend.is_array(master) and master.shape == model.shape and master.dtype == mw.master_dtype):
            continue
        bad = _count_nonfinite(master)
        if bad:
            return f"the master weight {name} holds {bad} non-finite values (NaN or inf) among {master.size}"
        if backend.is_array(saved) and saved.shape == model.shape and saved.dtype == model.dtype:
            bits = f"u{model.dtype.itemsize}"  # compared as bit patterns: -0.0 is not 0.0
            differ = int(
                get_array_module(saved).count_nonzero(kernels.cast(master, model.dtype).view(bits) != saved.view(bits))
            )
            if differ:
                return (
                    f"the model weight {name} differs from its master rounded to {model.dtype} in {differ} of "
                    f"{master.size} elements, so the file was edited (to change a weight, edit its master)"
                )
    return None


def summary(mw: Any) -> str:
    """A table: name, shape, model dtype and bytes, master dtype and bytes, per parameter, with totals."""
    rows = [("name", "shape", "model dtype", "model bytes", "master dtype", "master bytes")]
    for name, p, m in zip(mw.names, mw.model_params, mw.master_params):
        shared = m is p
        rows.append(
            (
                name,
                str(p.shape),
                p.dtype.name,
                str(p.nbytes),
                "(itself)" if shared else m.dtype.name,
                "0" if shared else str(m.nbytes),
            )
        )
    rows.append(("total", "", "", str(mw.model_bytes), "", str(mw.master_bytes)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    right = {3, 5}

    def line(r: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))

    out = [f"MasterWeights over {type(mw.optimizer).__name__}: {mw.model_dtypes()} -> {mw.master_dtype}"]
    out += [line(r) for r in rows[:-1]] + ["-" * len(line(rows[0]).rstrip()), line(rows[-1])]
    if mw.history:
        r = mw.history[-1]
        out.append(
            f"step {r.step}: {r.changed} master elements changed; {r.lost_update_fraction:.1%} of those updates "
            f"would be lost in 16 bits; {r.unchanged_fraction:.1%} of their 16-bit copies did not change"
        )
    return "\n".join(out)
