"""FP32 master weights: the optimizer updates a float32 copy, the model computes with a 16-bit one.

Why: float16 keeps 11 significant bits, so $1 + 2^{-11}$ rounds back to 1 and an update
a few thousand times smaller than its weight is *lost* (``lost_updates.py`` has the exact
rule).  Late in training, with small learning rates, most updates are that small.  The
cure (Micikevicius et al., 2018) is a float32 *master* copy of every 16-bit weight: the
optimizer adds each update to the master, where float32's 24 significant bits keep it,
and the 16-bit weight is rounded from the master after every step.  Many small updates
then add up in the master until they move the 16-bit copy.

One step, with the roles spelled out::

    loss.backward()        # 16-bit gradients land on the model's parameters
    opt.gather_grads()     # widened (exactly) into each master's .grad, float32
                           # (a LossScaler unscales those float32 gradients here)
    opt.step()             # the inner optimizer updates the float32 masters,
                           # then each 16-bit weight is rounded from its master
    opt.zero_grad()

``MasterWeights`` is that wrapper.  It also *measures* the effect it exists for: at each
step, among the elements whose master changed, the fraction whose update would have been
lost had it been added to the 16-bit weight directly (``lost_update_fraction``).
"""

from __future__ import annotations

from typing import Any

from tinyamp import backend, kernels
from tinyamp.amp import master_state
from tinyamp.amp.lost_updates import UpdateRecord, lost_updates
from tinyamp.backend import get_array_module
from tinyamp.optim.optimizer import Optimizer
from tinyamp.tensor import Tensor
from tinyamp.units import format_bytes


class MasterWeights:
    """Keep a float32 master copy of 16-bit parameters and let `optimizer` update the masters.

    ``MasterWeights(Adam(model.parameters()))`` rebinds the Adam to the masters: from then on
    ``optimizer.params`` are the float32 masters (same names; state arrays converted to
    `master_dtype`), and after each step every 16-bit parameter is rounded from its master,
    once (to nearest, ties to even), into the array the model already holds.  Each master
    starts as the exact widening of its parameter.  A parameter that already has
    `master_dtype` (a float32 LayerNorm in a float16 model) is its own master.

    It is also what a LossScaler drives: ``params`` (the masters, whose float32 ``.grad`` it
    unscales), ``names``, ``gather_grads()``, ``step()``, ``zero_grad()``.

    Args:
        optimizer: a tinyamp.optim optimizer over the model's parameters (wrapped once; change
            its hyperparameters there, ``opt.optimizer.lr``).
        master_dtype: "float32" (or "float64"), at least as wide as every parameter.
        track_lost_updates: record an UpdateRecord per step in ``history``; it costs a few
            passes over every updated weight, so switch it off for benchmarks.
        free_model_grads: drop each 16-bit gradient once ``gather_grads()`` has widened it, so
            the peak of a step holds 4 bytes of gradient per parameter, not 6.
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
        dt = master_state.checked_master_dtype(optimizer, master_dtype)  # refuses what cannot be wrapped, saying why
        params, names = optimizer.params, optimizer.names
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
        self.master_dtype: Any = dt
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
                master.grad = None if g is None else kernels.cast(g, master.dtype)
                if self.free_model_grads:
                    model.grad = None  # its exact widening is in the master: 2 bytes/parameter less at the peak
        self._gathered_from = [p.grad for p in self.model_params]

    def _gathered_is_current(self) -> bool:
        # Gradients accumulate into *new* arrays (autograd does grad = grad + g), so a
        # backward after gather_grads() leaves a model .grad that is not the one gathered.
        gathered = self._gathered_from
        return gathered is not None and all(p.grad is g for p, g in zip(self.model_params, gathered))

    def step(self) -> None:
        """Update the masters with the inner optimizer (in `master_dtype`), then round them into the model.

        Gradients are gathered first unless ``gather_grads()`` already read the current
        model gradients.  Each 16-bit weight becomes its master rounded once (to nearest,
        ties to even), written into the model's own array: always the rounded master, bit for bit.
        """
        if not self._gathered_is_current():
            self.gather_grads()
        self._gathered_from = None
        pairs = [(w, m) for w, m in zip(self.model_params, self.master_params) if m is not w and m.grad is not None]
        masters_before = [m.data.copy() for _, m in pairs] if self.track_lost_updates else None
        self.optimizer.step()  # the update, computed on the masters (and checked first)
        self._round_into_model(pairs)
        if masters_before is not None:
            self._count_lost_updates(pairs, masters_before)

    def _count_lost_updates(self, pairs: list[tuple[Tensor, Tensor]], masters_before: list[Any]) -> None:
        """Append this step's UpdateRecord: which master elements changed, and what 16 bits did with them."""
        counts = []
        for (model, master), before in zip(pairs, masters_before):
            xp = get_array_module(before)
            w16_before = kernels.cast(before, model.dtype)  # what the model held: its master, rounded
            changed = master.data != before
            update = xp.subtract(master.data, before, out=before)  # in place: the copy is not needed again
            lost = lost_updates(w16_before, update) & changed
            unchanged = (model.data == w16_before) & changed
            counts += [xp.count_nonzero(changed), xp.count_nonzero(lost), xp.count_nonzero(unchanged)]
        host = backend.host_floats(counts)  # one device-to-host read per device
        changed, lost, unchanged = (int(sum(host[i::3])) for i in range(3))
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
        self._round_into_model([(w, m) for w, m in zip(self.model_params, self.master_params) if m is not w])

    @staticmethod
    def _round_into_model(pairs: list[tuple[Tensor, Tensor]]) -> None:
        for model, master in pairs:
            kernels.cast(master.data, model.dtype, out=model.data)  # one rounding, into the model's own array

    def copy_model_to_masters(self) -> None:
        """Reset every master to the exact widening of its model parameter.

        Call it after changing the model's weights yourself (e.g. ``model.load_state_dict``):
        otherwise the next ``step()`` overwrites them from the old masters.
        """
        for model, master in zip(self.model_params, self.master_params):
            if master is not model:
                kernels.cast(model.data, master.dtype, out=master.data)  # exact

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

    # ---- checkpoints (checked in master_state.py) -------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The masters (copied), the inner optimizer's state_dict and the update history.

        With the masters saved, a resumed run continues bit-identically; the 16-bit weights
        are the rounded masters (they live in the model's own state_dict too).
        """
        return master_state.state_dict(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the masters and the inner optimizer, then round the masters into the model.

        Everything is checked before anything changes: a state_dict saved for other
        parameters raises ``MasterWeightsStateError`` and leaves this object and the model as they were.
        """
        self.history = master_state.load(self, state_dict)
        self.copy_masters_to_model()
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

    def model_dtypes(self) -> str:
        """The dtypes of the parameters that have a master copy, e.g. "float16"."""
        return "/".join(sorted({p.dtype.name for p, m in zip(self.model_params, self.master_params) if m is not p}))

    def summary(self) -> str:
        """A table: name, shape, model dtype and bytes, master dtype and bytes, per parameter, with totals."""
        return master_state.summary(self)

    def __repr__(self) -> str:
        copied = sum(m is not p for p, m in zip(self.model_params, self.master_params))
        last = f", last lost_update_fraction={self.lost_update_fraction:.3g}" if self.history else ""
        return (
            f"MasterWeights({self.optimizer!r}, {self.model_dtypes()} -> {self.master_dtype}: {copied} of "
            f"{len(self.model_params)} parameters copied, model {format_bytes(self.model_bytes)} + master "
            f"{format_bytes(self.master_bytes)}{last})"
        )
