"""PyTorch's own ``torch.amp.GradScaler`` as a scaler that check_scaler can drive, through public API only.

    from tinyamp.testing import check_scaler
    from tinyamp.testing.pytorch import GradScalerAdapter

    check_scaler(GradScalerAdapter, reference="pytorch")

check_scaler steps a scaler with one flag per step (``update(found_inf)``); a GradScaler
learns of an overflow from the gradients it unscales.  So each step here gives a
one-element parameter a gradient that is inf (an overflow) or 0 (a clean step) and runs
the step as a training loop would: ``scale``, ``step`` (which unscales, finds the inf and
skips the step) and ``update``.  The counter is read from ``state_dict()``, PyTorch's
public way to save and restore it.  Needs PyTorch; importing this module does not import it.
"""

from __future__ import annotations

import math
from typing import Any


class GradScalerAdapter:
    """A ``torch.amp.GradScaler`` (on the CPU) with check_scaler's interface: update(found_inf), scale,
    growth_tracker, state_dict() and load_state_dict(d)."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        min_scale: float | None = None,
        max_scale: float | None = None,
    ) -> None:
        if min_scale is not None or max_scale is not None:
            raise ValueError(
                f"PyTorch's GradScaler has no floor or ceiling (min_scale={min_scale}, max_scale={max_scale}): "
                "compare it with reference='pytorch', whose settings have neither"
            )
        import torch

        self._torch = torch
        self.scaler = torch.amp.GradScaler(
            "cpu", init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
            growth_interval=growth_interval,
        )  # fmt: skip
        self._weight = torch.nn.Parameter(torch.zeros(1))
        self._optimizer = torch.optim.SGD([self._weight], lr=0.0)

    def update(self, found_inf: bool) -> None:
        """One training step whose gradient overflowed (found_inf) or not: scale, step (skipped), update."""
        torch = self._torch
        self.scaler.scale(torch.zeros(()))  # a step scales its loss first (this also sets the scale up)
        self._weight.grad = torch.full((1,), math.inf if found_inf else 0.0)
        self.scaler.step(self._optimizer)  # unscales, records the inf and skips the step
        self.scaler.update()

    @property
    def scale(self) -> float:
        """The current scale, from ``get_scale()``."""
        return float(self.scaler.get_scale())

    @property
    def growth_tracker(self) -> int:
        """The clean steps counted towards the next growth, as ``state_dict()`` saves it."""
        return int(self.scaler.state_dict()["_growth_tracker"])

    def state_dict(self) -> dict[str, Any]:
        """GradScaler's own ``state_dict()``."""
        return self.scaler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """GradScaler's own ``load_state_dict``."""
        self.scaler.load_state_dict(state_dict)
