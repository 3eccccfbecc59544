"""Memory accounting: bytes held, itemized, and the peak of a step, measured."""

from __future__ import annotations

import numpy as np
import pytest

import tinyamp as ta
from tinyamp import nn, optim
from tinyamp.amp import LossScaler, MasterWeights, autocast
from tinyamp.inspect import format_training_memory, peak_memory, training_memory

pytestmark = pytest.mark.memory


def test_training_memory_itemizes_a_known_mixed_precision_model_exactly() -> None:
    ta.manual_seed(0)
    model = nn.MLP([8, 16, 4]).half()  # 8*16 + 16 + 16*4 + 4 = 212 parameters
    opt = MasterWeights(optim.Adam(model.parameters()))
    scaler = LossScaler()
    x, y = ta.tensor(np.ones((5, 8), np.float32)), ta.tensor(np.arange(5) % 4)
    with autocast():
        loss = ta.cross_entropy(model(x), y)
    scaler.scale_loss(loss).backward()
    scaler.step(opt)
    report = training_memory(model, opt)
    assert report["parameters"] == {"float16": 212 * 2}
    assert report["master weights"] == {"float32": 212 * 4}
    assert report["optimizer state"] == {"float32": 2 * 212 * 4}  # Adam: two moments per weight
    assert report["gradients"] == {"float16": 212 * 2, "float32": 212 * 4}
    assert "total" in format_training_memory(report)


def test_peak_memory_sees_numpy_allocations() -> None:
    def allocate() -> float:
        a = np.ones(1_000_000, np.float32)  # 4 MB, freed before returning
        return float(a[0])

    result, peak = peak_memory(allocate)
    assert result == 1.0
    assert 4_000_000 <= peak < 4_200_000


def test_checkpointing_lowers_the_measured_peak_of_a_deep_step() -> None:
    ta.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(36)]
    x = ta.tensor(np.random.default_rng(0).standard_normal((512, 32)), dtype="float32")

    def step(every: int | None) -> None:
        h = nn.Sequential(*blocks)(x) if every is None else ta.checkpoint_sequential(blocks, every, x)
        (h * h).mean().backward()

    _, plain = peak_memory(lambda: step(None))
    _, checked = peak_memory(lambda: step(6))
    # 36 blocks keep about 2 arrays of 64 KB each; checkpointing every 6 keeps 6 segment
    # inputs and one segment's arrays while it is recomputed: the peak must fall twofold.
    assert checked * 2 < plain, (plain, checked)


@pytest.mark.skipif(ta.ENGINE_ROOM == "off", reason="measures peak memory with the engine room's in-block casts")
def test_step_peak_bytes_measures_both_regimes_and_mixed_saves_where_activations_dominate() -> None:
    from tinyamp.inspect.memory import step_peak_bytes

    peaks = step_peak_bytes("cpu", sizes=(64, 256, 256, 256, 256, 10), batch=2048)  # activations dominate
    assert set(peaks) == {"fp32", "mixed"} and all(isinstance(v, int) and v > 0 for v in peaks.values())
    # float16 activations are half the bytes; the CPU's transient float32 widenings eat part of that
    assert peaks["mixed"] < 0.85 * peaks["fp32"]
