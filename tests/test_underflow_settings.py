"""benchmarks/underflow_settings.py, the study tinyamp/experiments/README.md quotes on loss scaling and the digits MLP.

Here at a few steps per setting: that each setting builds and trains in the three regimes,
and that the table reports what that README says it does.  The numbers are the script's
business (about 3 minutes); these checks keep it from rotting.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tinyamp import optim
from tinyamp.experiments.tasks import DigitsMLP

pytestmark = pytest.mark.cli

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "underflow_settings.py"


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("underflow_settings", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_every_setting_is_a_valid_digits_task(study) -> None:
    for setting in study.SETTINGS:
        DigitsMLP(**setting.task)  # an unknown field would raise TypeError here
        assert setting.steps >= 1500, setting


def test_a_setting_runs_in_three_regimes_and_only_the_16_bit_ones_measure_underflow(study) -> None:
    setting = study.Setting("tiny", 100, {"hidden": (16,), "batch_size": 32})
    rows = study.run_setting(setting, fraction=0.03, seed=1)
    assert [r["regime"] for r in rows] == ["fp32", "fp16-master", "mixed"]
    assert all(r["steps"] == 3 for r in rows)
    assert rows[0]["underflow"] is None and rows[0]["underflow_norm"] is None
    for r in rows[1:]:
        assert 0.0 <= r["underflow"] <= 1.0 and 0.0 <= r["underflow_norm"] <= 1.0
        assert 0.0 <= r["accuracy"] <= 1.0 and r["train_loss"] > 0
    text = study.format_rows(rows)
    assert "tiny (3 steps, seed 1)" in text and "fp16-master / mixed training loss" in text


def test_digits_task_passes_weight_decay_to_either_optimizer() -> None:
    for name, cls in (("sgd", optim.SGD), ("adam", optim.Adam)):
        task = DigitsMLP(optimizer=name, weight_decay=5e-4, lr=1e-3)
        opt = task.make_optimizer(task.make_model().parameters())
        assert isinstance(opt, cls) and opt.weight_decay == 5e-4


def test_only_must_name_a_setting(study, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        study.main(["--only", "no such setting"])
    assert exit_info.value.code == 2
    assert "the settings are: tinyamp train's defaults" in capsys.readouterr().err
