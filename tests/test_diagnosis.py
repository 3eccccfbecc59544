"""tinyamp.experiments.diagnosis: the demo's verdicts, at their thresholds, and the overflow a replay names."""

from __future__ import annotations

import numpy as np
import pytest

from tinyamp.amp import LossScaler
from tinyamp.experiments.diagnosis import FAILED_LOSS_RATIO, FAILED_POINTS, MATCH_POINTS, diagnose, overflows
from tinyamp.experiments.regimes import REGIMES, build
from tinyamp.experiments.runner import run_regime
from tinyamp.experiments.tasks import DigitsMLP

pytestmark = pytest.mark.cli


def row(loss: float, accuracy: float, **extra: object) -> dict:
    return {"metrics": {"train_loss": loss, "accuracy": accuracy}, "lost_update_fraction": None,
            "underflow_fraction": None, "skipped_steps": 0, **extra}  # fmt: skip


def test_a_run_fails_at_twice_fp32s_loss_or_five_points_below() -> None:
    fp32 = row(0.5, 0.90)
    got = diagnose({
        "fp32": fp32,
        "fp16": row(0.5 * FAILED_LOSS_RATIO, 0.90),  # exactly twice: failed
        "bf16": row(0.5 * 1.99, 0.90 - FAILED_POINTS / 100 + 1e-9),  # just inside both limits: apart
        "mixed": row(0.5, 0.90 - FAILED_POINTS / 100 - 1e-9),  # just past 5 points below: failed
        "fp16-master": row(0.5, 0.90 - MATCH_POINTS / 100 + 1e-9),  # within a point: matches
    })  # fmt: skip
    assert got["fp16"].failed and got["mixed"].failed
    assert not got["bf16"].failed and not got["bf16"].matches
    assert got["fp16-master"].matches and not got["fp16-master"].failed
    assert "fp32" not in got


def test_a_failed_run_names_the_repair_that_ran_beside_it() -> None:
    lost = dict(lost_update_fraction=0.953, underflow_fraction=0.0)
    got = diagnose({"fp32": row(0.4, 0.9), "bf16": row(2.0, 0.72, **lost), "bf16-mixed": row(0.4, 0.9, **lost)})
    lines = got["bf16"].lines()
    assert lines[0].startswith("bf16         FAILED: training loss 5.00x FP32's, test accuracy 18.00 points below")
    assert "95% of its updates too small to move a 16-bit weight" in lines[1]
    assert (
        "(its FP32 masters kept them)" not in lines[1]
        and "(its FP32 masters kept them)" in got["bf16-mixed"].lines()[1]
    )
    assert lines[2] == "             add FP32 master weights: bf16-mixed ends 1.00x, 0.00 points below"
    assert got["bf16-mixed"].repair is None  # nothing one repair away from it


def test_without_fp32_or_an_accuracy_there_is_nothing_to_read() -> None:
    assert diagnose({"mixed": row(0.4, 0.9)}) == {}
    assert diagnose({"fp32": {"metrics": {"val_loss": 2.5}}, "mixed": {"metrics": {"val_loss": 2.5}}}) == {}


def test_a_skipped_step_is_replayed_and_the_op_that_overflowed_named() -> None:
    """A loss scale of 2^40 overflows the FP16 gradients at the first step; the replay finds where."""
    task = DigitsMLP(hidden=(32,))
    setup = build(REGIMES["mixed"], task.make_model(), task.make_optimizer)
    setup.scaler = LossScaler(init_scale=2.0**40)
    with np.errstate(all="ignore"):
        result, _ = run_regime(task, "mixed", 3, setup=setup)
    first = result.first_overflow
    assert result.skipped_steps >= 1 and first["step"] == 0 and first["scale"] == 2.0**40
    assert first["where"].startswith("backward of ") and "float16" in first["where"], first
    said = overflows(result.to_json())
    assert said.startswith(f"{result.skipped_steps} step") and "the first at step 0 (scale 1.09951e+12)" in said
    assert overflows(row(0.4, 0.9)) is None
