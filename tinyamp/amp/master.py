"""FP32 master weights: the optimizer updates a float32 copy, the model computes with a 16-bit one.

Why: float16 has 10 mantissa bits, so $1 + 2^{-11}$ rounds back to 1.  An update below
half an ulp of the weight is *lost*: in float16 a weight 2048 times its update does not
move if it is a power of two (the figure Micikevicius et al., 2018 quote), and no normal
weight 4096 times its update moves, step after step.  Late in
training, with small learning rates, most updates are that small.  The cure is to keep
a float32 *master* copy of every 16-bit weight: the optimizer adds each update to the
master, where it is kept (float32 has 23 mantissa bits), and the model's 16-bit weight
is re-rounded from the master after every step.  Many small updates then add up in the
master until they move the 16-bit copy.

One step, with the roles spelled out::

    loss.backward()        # 16-bit gradients land on the model's parameters
    opt.gather_grads()     # widened (exactly) into each master's .grad, float32
                           # (a LossScaler unscales those float32 gradients here)
    opt.step()             # the inner optimizer updates the float32 masters;
                           # then model.data[...] = master.data, one rounding (nearest-even)
    opt.zero_grad()

``MasterWeights`` is that wrapper.  It also *measures* the effect it exists for: at each
step, among the elements whose master changed, the fraction whose update would have been
lost had it been added to the 16-bit weight directly (``lost_update_fraction``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from tinyamp import backend, dtypes
from tinyamp.backend import get_array_module
from tinyamp.ops.casting import convert
from tinyamp.optim.optimizer import Optimizer
from tinyamp.tensor import Tensor

_FLOAT32 = np.dtype(np.float32)


class MasterWeightsStateError(ValueError):
    """A MasterWeights state_dict that does not fit these parameters (names, shapes, dtypes)."""


class UpdateRecord(NamedTuple):
    """What one step did to the 16-bit weights, in element counts (over the parameters with a master copy).

    ``changed``: elements whose master changed.  Of those, ``lost``: the update would have
    been lost if added to the 16-bit weight directly, i.e. ``w16 + fp16(Δ) == w16`` in
    16-bit arithmetic, Δ = master_new - master_old; and ``unchanged``: the 16-bit copy
    did not change this step (the update waits in the master until it adds up).
    """

    step: int
    changed: int
    lost: int
    unchanged: int

    @property
    def lost_update_fraction(self) -> float:
        """lost / changed (NaN when no master changed: nothing to measure)."""
        return self.lost / self.changed if self.changed else math.nan

    @property
    def unchanged_fraction(self) -> float:
        """unchanged / changed (NaN when no master changed)."""
        return self.unchanged / self.changed if self.changed else math.nan


def _format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # unreachable


class MasterWeights:
    """Keep a float32 master copy of 16-bit parameters and let `optimizer` update the masters.

    ``MasterWeights(Adam(model.parameters()))`` rebinds the Adam to the masters: from then
    on ``optimizer.params`` are the float32 masters (same names, same state, the state
    arrays converted to `master_dtype`), and the model's float16 or bfloat16 parameters are
    written from them after each step, in place (``model.data[...] = master.data``: one
    round-to-nearest-even; the arrays the model holds are never replaced).

    The rule behind it: an update is lost in 16 bits when it is below half an ulp of
    the weight (float16: always from 4096x the update, and from 2048x for a power-of-two
    weight; bfloat16, with 7 mantissa bits: 512x and 256x), while float32 keeps it.  Each
    master starts as the exact widening of its 16-bit parameter (every float16 and bfloat16
    value is a float32 value).

    A parameter that already has `master_dtype` (a float32 LayerNorm in a float16 model)
    is its own master: no copy is made, and the optimizer updates it directly.

    This is also the interface a LossScaler drives: ``params`` (the masters, whose
    ``.grad`` it unscales in float32), ``names``, ``gather_grads()``, ``step()`` and
    ``zero_grad()``.

    Args:
        optimizer: a tinyamp.optim optimizer built over the model's parameters; wrap it once.
        master_dtype: "float32" (or "float64"); at least as wide as every parameter.
        track_lost_updates: record an UpdateRecord per step (``history``).  It costs about
            as much as an Adam update (~7 ns per 16-bit element on a 2-core CPU, ~15% of a
            float16 MLP training step there); switch it off for benchmarks.
        free_model_grads: drop each 16-bit model gradient as soon as ``gather_grads()`` has
            widened it into its master, instead of keeping both until ``zero_grad()``.  The
            peak of a step then holds 4 bytes of gradient per parameter, not 6 (with FP32
            weights it would hold 4 too); the model's ``.grad`` is None after a step.

    Attributes:
        optimizer: the wrapped optimizer (change its hyperparameters there: ``opt.optimizer.lr``).
        model_params: the tensors the model computes with (16-bit).
        master_params: the master copies (`master_dtype`); also ``params``.
        names: one name per parameter, from the optimizer.
        history: one UpdateRecord per step (when ``track_lost_updates``), for plotting.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        master_dtype: Any = "float32",
        track_lost_updates: bool = True,
        free_model_grads: bool = False,
    ) -> None:
        if isinstance(optimizer, MasterWeights):
            raise TypeError("MasterWeights wraps an optimizer, not another MasterWeights: the masters already exist")
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
        masters = []
        for p, name in zip(params, names):
            if p.dtype == dt:
                masters.append(p)  # already full precision: its own master, no copy
            else:
                m = Tensor(p.data, dtype=dt)  # a fresh array on p's device; widening is exact
                m.name = name
                masters.append(m)
        # The optimizer's per-parameter state (moments, momentum) moves over unchanged: for a
        # 16-bit parameter it is kept in float32 already, so only a float64 master converts it.
        state = [
            {k: v.astype(dt) if backend.is_array(v) and v.dtype != dt else v for k, v in s.items()}
            for s in optimizer.state
        ]
        # everything checked: rebind the optimizer to the masters
        optimizer.params = masters
        optimizer.state = state
        optimizer._master_weights = self  # type: ignore[attr-defined]  (refuses a second wrap)
        self.optimizer = optimizer
        self.model_params: list[Tensor] = list(params)
        self.master_params: list[Tensor] = masters
        self.names: list[str] = list(names)
        self.master_dtype: np.dtype = dt
        self.track_lost_updates = track_lost_updates
        self.free_model_grads = free_model_grads
        self.history: list[UpdateRecord] = []
        self._gathered_from: list[Any] | None = None  # the model .grad arrays gather_grads() read

    # ---- the LossScaler's protocol -------------------------------------------------------------
    @property
    def params(self) -> list[Tensor]:
        """The tensors ``step()`` updates from their ``.grad``: the masters."""
        return self.master_params

    def gather_grads(self) -> None:
        """Copy each model gradient into its master's ``.grad``, widened to the master dtype.

        Widening float16 or bfloat16 to float32 is exact, so this loses nothing; unscaling
        and clipping then run on the float32 copies.  A model gradient that is None (the
        parameter took no part in the loss) leaves the master's ``.grad`` None, and
        ``step()`` skips that parameter.
        """
        for model, master in zip(self.model_params, self.master_params):
            if master is not model:
                g = model.grad
                master.grad = None if g is None else convert(g, master.dtype)
                if self.free_model_grads:
                    model.grad = None  # its exact widening is in the master: 2 bytes/parameter less at the peak
        self._gathered_from = [p.grad for p in self.model_params]

    def _gathered_is_current(self) -> bool:
        # Gradients accumulate into *new* arrays (autograd does grad = grad + g), so a
        # backward after gather_grads() leaves a model .grad that is not the one gathered.
        gathered = self._gathered_from
        return gathered is not None and all(p.grad is g for p, g in zip(self.model_params, gathered))

    def _rounded_copies(self) -> list[Any]:
        return [
            model.data if master is not model else None for model, master in zip(self.model_params, self.master_params)
        ]

    def fuses_every_update(self) -> bool:
        """True when ``step(skip_if=...)`` can run on the gathered gradients: every update a fused GPU kernel."""
        return not self.track_lost_updates and self.optimizer.fuses_every_update(self._rounded_copies())

    def updates_from_model_grads(self) -> bool:
        """True when ``step_from_model_grads`` can run: on the GPU, every parameter a 16-bit
        model weight with its own FP32 master, every update a fused kernel, no tracking."""
        if self.track_lost_updates or any(
            master is model for model, master in zip(self.model_params, self.master_params)
        ):
            return False
        grads = [model.grad for model in self.model_params]
        return self.optimizer.fuses_every_update(self._rounded_copies(), grads)

    def step_from_model_grads(self, inverse_scale: float, skip_if: Any = None) -> None:
        """Update the masters straight from the model's float16 gradients, unscaled inside the kernels.

        The same arithmetic as ``gather_grads()``, unscaling and ``step()`` (the widening is
        exact, the product with 1/scale is rounded once), but no float32 gradient is ever
        stored: at the peak of a GPU step that is 4 bytes per parameter saved.  The masters'
        ``.grad`` stay None.
        """
        grads = [model.grad for model in self.model_params]
        self.optimizer.step(rounded_copies=self._rounded_copies(), skip_if=skip_if, grads=grads,
                            grad_scale=inverse_scale)  # fmt: skip
        self._gathered_from = None

    def bookkeeping(self) -> Any:
        """The inner optimizer's step counters and state entries (to undo a step skipped on the GPU)."""
        return self.optimizer.bookkeeping()

    def restore_bookkeeping(self, record: Any) -> None:
        self.optimizer.restore_bookkeeping(record)

    def step(self, skip_if: Any = None) -> None:
        """Update the masters with the inner optimizer (math in `master_dtype`), then round them into the model.

        Gradients are gathered first unless ``gather_grads()`` already read the current
        model gradients (a backward since then makes step gather again).  The 16-bit
        weight becomes ``master.astype(model dtype)``: one rounding to nearest, ties to
        even, so it always equals the rounded master bit for bit.

        `skip_if`: a device flag for a step the GPU may skip (``Optimizer.step``).
        """
        if not self._gathered_is_current():
            self.gather_grads()
        track = self.track_lost_updates
        pairs = [
            (model, master)
            for model, master in zip(self.model_params, self.master_params)
            if master is not model and master.grad is not None
        ]
        self._gathered_from = None
        if not track:
            # the update and the rounding into the model in one call (one fused kernel per
            # parameter on the GPU); the optimizer checks every gradient before it changes anything
            self.optimizer.step(rounded_copies=self._rounded_copies(), skip_if=skip_if)
            return
        if skip_if is not None:
            raise ValueError("step(skip_if=...) needs track_lost_updates=False (the measure reads the host)")
        before = [master.data.copy() for _, master in pairs]
        self.optimizer.step()  # checks every gradient before it changes anything
        counts = [0, 0, 0]
        for i, (model, master) in enumerate(pairs):
            new16 = convert(master.data, model.dtype)
            for k, c in enumerate(_count_updates(before[i], master.data, model.data, new16)):
                counts[k] += c
            model.data[...] = new16
        changed, lost, unchanged = (int(v) for v in backend.host_floats(counts))  # one read per device
        self.history.append(UpdateRecord(self.optimizer.step_count, changed, lost, unchanged))

    def zero_grad(self) -> None:
        """Set the ``.grad`` of every model parameter and every master to None."""
        for model, master in zip(self.model_params, self.master_params):
            model.grad = None
            master.grad = None
        self._gathered_from = None

    # ---- moving values between the two copies ----------------------------------------------------
    def copy_masters_to_model(self) -> None:
        """Write every model parameter from its master, rounded once (what ``step()`` ends with)."""
        for model, master in zip(self.model_params, self.master_params):
            if master is not model:
                model.data[...] = master.data

    def copy_model_to_masters(self) -> None:
        """Reset every master to the exact widening of its model parameter.

        Call it after changing the model's weights yourself (e.g. ``model.load_state_dict``):
        otherwise the next ``step()`` overwrites them from the old masters.
        """
        for model, master in zip(self.model_params, self.master_params):
            if master is not model:
                master.data[...] = model.data

    # ---- the teaching measure --------------------------------------------------------------------
    @property
    def lost_update_fraction(self) -> float | None:
        """Of the elements whose master changed in the last step, the fraction whose update would
        have been lost in 16 bits (None before the first tracked step, NaN if none changed)."""
        return self.history[-1].lost_update_fraction if self.history else None

    @property
    def lost_update_history(self) -> list[float]:
        """``lost_update_fraction`` of every tracked step, in order (ready to plot)."""
        return [r.lost_update_fraction for r in self.history]

    # ---- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The masters (copied), the inner optimizer's state_dict and the update history.

        With the masters saved, a resumed run continues bit-identically; the 16-bit model
        weights are not needed (they are the rounded masters) but live in the model's own
        state_dict.
        """
        return {
            "kind": "MasterWeights",
            "master_dtype": self.master_dtype.name,
            "params": [
                {"name": n, "shape": model.shape, "model_dtype": model.dtype.name, "shared": master is model}
                for n, model, master in zip(self.names, self.model_params, self.master_params)
            ],
            "master": {n: m.data.copy() for n, m in zip(self.names, self.master_params)},
            "optimizer": self.optimizer.state_dict(),
            "history": np.array(self.history, dtype=np.int64).reshape(-1, len(UpdateRecord._fields)),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the masters and the inner optimizer, then rewrite the 16-bit model weights from the masters.

        Everything is checked before anything changes: a state_dict saved for other
        parameters (names, shapes, dtypes) raises MasterWeightsStateError (or the inner
        optimizer's OptimizerStateError) and leaves this object and the model as they were.
        """
        kind = state_dict.get("kind") if isinstance(state_dict, dict) else None
        if kind != "MasterWeights":
            found = state_dict.get("optimizer") if isinstance(state_dict, dict) else type(state_dict).__name__
            raise MasterWeightsStateError(
                f"this is not a MasterWeights state_dict (it looks like one of {found!r}); a plain optimizer's "
                f"state goes into optimizer.load_state_dict, not into a MasterWeights"
            )
        problems = []
        if state_dict["master_dtype"] != self.master_dtype.name:
            problems.append(f"the masters were saved as {state_dict['master_dtype']}; these are {self.master_dtype}")
        saved_params, masters = state_dict["params"], state_dict["master"]
        saved_names = [saved["name"] for saved in saved_params]
        if saved_names != self.names or list(masters) != self.names:
            problems.append(
                f"the state_dict was saved for parameters {saved_names}; this MasterWeights has {self.names}"
            )
        else:
            for name, model, master, saved in zip(self.names, self.model_params, self.master_params, saved_params):
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
        fields = len(UpdateRecord._fields)
        history = state_dict.get("history")
        history = np.zeros((0, fields), np.int64) if history is None else backend.to_device(history, "cpu")
        if not (backend.is_array(history) and history.ndim == 2 and history.shape[1] == fields):
            problems.append(f"history: expected an array of shape (steps, {fields})")
        if problems:
            raise MasterWeightsStateError("cannot load the MasterWeights state_dict:\n  " + "\n  ".join(problems))
        self.optimizer.load_state_dict(state_dict["optimizer"])  # checks first; raises before changing anything
        for name, master in zip(self.names, self.master_params):
            master.data[...] = backend.to_device(masters[name], master.device)
        self.copy_masters_to_model()
        self.history = [UpdateRecord(*(int(x) for x in row)) for row in history]
        self._gathered_from = None

    # ---- printing -----------------------------------------------------------------------------------
    @property
    def model_bytes(self) -> int:
        """Bytes of the model's weights (2 per element in float16)."""
        return sum(p.nbytes for p in self.model_params)

    @property
    def master_bytes(self) -> int:
        """Extra bytes the master copies take (4 per element of each 16-bit parameter; 0 for shared ones)."""
        return sum(m.nbytes for p, m in zip(self.model_params, self.master_params) if m is not p)

    def _model_dtypes(self) -> str:
        return "/".join(sorted({p.dtype.name for p, m in zip(self.model_params, self.master_params) if m is not p}))

    def summary(self) -> str:
        """A table: name, shape, model dtype and bytes, master dtype and bytes, per parameter, with totals."""
        rows = [("name", "shape", "model dtype", "model bytes", "master dtype", "master bytes")]
        for name, p, m in zip(self.names, self.model_params, self.master_params):
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
        rows.append(("total", "", "", str(self.model_bytes), "", str(self.master_bytes)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        right = {3, 5}

        def line(r: Sequence[str]) -> str:
            return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))

        out = [f"MasterWeights over {type(self.optimizer).__name__}: {self._model_dtypes()} -> {self.master_dtype}"]
        out += [line(r) for r in rows[:-1]] + ["-" * len(line(rows[0]).rstrip()), line(rows[-1])]
        if self.history:
            r = self.history[-1]
            out.append(
                f"step {r.step}: {r.changed} master elements changed; {r.lost_update_fraction:.1%} of those updates "
                f"would be lost in 16 bits; {r.unchanged_fraction:.1%} of their 16-bit copies did not change"
            )
        return "\n".join(out)

    def __repr__(self) -> str:
        copied = sum(m is not p for p, m in zip(self.model_params, self.master_params))
        last = f", last lost_update_fraction={self.lost_update_fraction:.3g}" if self.history else ""
        return (
            f"MasterWeights({self.optimizer!r}, {self._model_dtypes()} -> {self.master_dtype}: {copied} of "
            f"{len(self.model_params)} parameters copied, model {_format_bytes(self.model_bytes)} + master "
            f"{_format_bytes(self.master_bytes)}{last})"
        )


def _equal16(a: Any, b: Any) -> Any:
    """``a == b`` for two 16-bit float arrays, computed on their bits.

    NumPy's float16 ``==`` converts every element to float32 first (about 20x slower than
    comparing the bits).  Equal bits mean equal values except for NaN (never equal) and
    +0 / -0 (equal with different bits), which are handled here.
    """
    ua, ub = a.view(np.uint16), b.view(np.uint16)
    inf_bits = np.uint16(np.array(np.inf, dtype=a.dtype).view(np.uint16))  # 0x7C00 in float16, 0x7F80 in bfloat16
    magnitude = ua & np.uint16(0x7FFF)
    eq = ua == ub
    eq &= magnitude <= inf_bits  # NaN != NaN
    eq |= (magnitude | (ub & np.uint16(0x7FFF))) == 0  # -0 == +0
    return eq


def _count_updates(old: Any, new: Any, w16: Any, new16: Any) -> tuple[Any, Any, Any]:
    """(changed, lost, unchanged) element counts for one parameter (0-d arrays on CuPy: no sync here).

    `old` is a scratch copy of the master before the step (overwritten here).  An update
    Δ = new - old is *lost* when ``fp16(w16 + Δ) == w16``: the same update applied to the
    16-bit weight directly, in float32 arithmetic rounded once, as tinyamp's optimizers
    update a 16-bit parameter that has no master.  (Rounding Δ to 16 bits first, as a pure
    float16 update would, changes the verdict only for |Δ| within 2^-11 of half an ulp of
    the weight, and costs far more: NumPy converts subnormal float16 values slowly, and
    small updates are mostly subnormal in float16.)
    """
    xp = get_array_module(new)
    changed = new != old
    delta = xp.subtract(new, old, out=old)
    direct = w16.astype(_FLOAT32)
    direct += delta
    lost = _equal16(direct.astype(w16.dtype), w16)
    lost &= changed
    unchanged = _equal16(new16, w16)
    unchanged &= changed
    return xp.count_nonzero(changed), xp.count_nonzero(lost), xp.count_nonzero(unchanged)
