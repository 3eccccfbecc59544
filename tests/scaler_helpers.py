"""What the loss-scaler tests share: float32 rounding, byte-for-byte equality, the smallest optimizer, a model.

Imported by tests/test_scale_rule.py, test_scaler_presets.py, test_scaler_step.py, test_scaler_clip.py
and test_scaler_state.py (``from scaler_helpers import ...``, as ``strategies`` is).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import tinyamp as ta
from tinyamp import nn
from tinyamp.amp.scaler import LossScaler
from tinyamp.backend import to_device


def f32(x: float) -> float:
    """`x` rounded to float32, as a Python float (inf when out of range)."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def assert_bit_equal(a: Any, b: Any) -> None:
    a, b = to_device(a, "cpu"), to_device(b, "cpu")
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


class FakeOptimizer:
    """The optimizer protocol in its smallest form: params, names, step (counts calls)."""

    def __init__(self, params: list[ta.Tensor], names: list[str] | None = None) -> None:
        self.params = params
        self.names = names or [f"p{i}" for i in range(len(params))]
        self.steps = 0

    def step(self) -> None:
        self.steps += 1


def begin_step(scaler: LossScaler) -> None:
    """Put the scaler in phase "scaled" without a model (the loss itself is not needed)."""
    scaler.scale_loss(ta.tensor(1.0))


def snapshot(scaler: LossScaler) -> tuple:
    return (
        scaler.scale, scaler.growth_tracker, scaler.step_count, scaler.state, scaler.phase,
        scaler.history, scaler.last_report, repr(scaler),
    )  # fmt: skip


def one_param(value: float = 1.0) -> tuple[ta.Tensor, FakeOptimizer]:
    w = ta.tensor([value, 2.0 * value], requires_grad=True)
    return w, FakeOptimizer([w], ["w"])


def linear_problem(device: str, dtype: str = "float32") -> tuple[nn.Linear, ta.Tensor]:
    ta.manual_seed(0)
    model = nn.Linear(4, 3, dtype=dtype).to(device)
    x = ta.randn((5, 4), dtype=dtype, device=device)
    return model, x


def loss_of(model: nn.Linear, x: ta.Tensor) -> ta.Tensor:
    return (model(x).tanh() * model(x)).sum()
