"""benchmarks/fp8_step.py: its emulated FP8 step computes what it says (FP8 products of the right tensors,
gradients near FP32's, a loss that falls), and the script writes its table and JSON (quick sizes, for CI)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import tinyamp as ta
from tinyamp.fp8 import Fp8Scales, ScalingRecipe

pytestmark = pytest.mark.fp8

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def fp8_step():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("fp8_step")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_fp8_linear_casts_three_tensors_and_its_gradients_are_near_fp32s(fp8_step) -> None:
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((16, 64), (32, 64), (32,)))
    g = rng.standard_normal((16, 32)).astype(np.float32)
    scales = Fp8Scales(ScalingRecipe(recipe="current"))  # the tensors' own amaxes: a fair comparison at step 0
    xt, wt, bt = (ta.tensor(a, requires_grad=True) for a in (x, w, b))
    y = fp8_step.Fp8Linear.apply(xt, wt, bt, scales=scales, name="fc")
    y.backward(g)
    assert set(scales.tensors) == {"fc.input", "fc.weight", "fc.grad_output"}
    assert [scales.tensors[n].format.name for n in sorted(scales.tensors)] == ["E5M2", "E4M3", "E4M3"]
    for got, exact, bound in ((y.data, x @ w.T + b, 0.05), (xt.grad, g @ w, 0.1), (wt.grad, g.T @ x, 0.1)):
        error = np.linalg.norm(got - exact) / np.linalg.norm(exact)
        assert 0 < error < bound, error  # inexact (8 bits), but near: E4M3 keeps 4 significant bits, E5M2 3
    assert np.array_equal(bt.grad, g.sum(axis=0))


def test_the_emulated_fp8_step_trains(fp8_step) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 64)).astype(np.float32), rng.integers(0, 10, 32)
    step, losses = fp8_step.fp8_model_step(x, y, fp8_step.QUICK_SIZES)
    for _ in range(30):
        step()
    assert losses[-1] < losses[0] - 0.05, (losses[0], losses[-1])


def test_the_quick_run_writes_its_table_and_json(fp8_step, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "fp8.json"
    assert fp8_step.main(["--quick", "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    rows = saved["results"]
    assert saved["meta"]["quick"] is True and rows[0]["over_reference"] == 1.0
    assert rows[1]["contender"].startswith("FP8 emulated") and rows[1]["value"] > 0
    casts = [r for r in rows if "ns per value" in r["benchmark"]]
    assert len(casts) in (0, 8) and all(r["value"] > 0 for r in casts)  # 0: ml_dtypes not installed
    table = capsys.readouterr().out
    assert all(r["contender"] in table for r in rows) and f"wrote {out}" in table


def test_the_stored_results_are_a_full_run() -> None:
    saved = json.loads((BENCHMARKS / "results" / "fp8_step.json").read_text())
    assert saved["meta"]["quick"] is False
    step = [r for r in saved["results"] if r["benchmark"].startswith("MLP 784-1024-1024-10")]
    assert len(step) == 2 and step[1]["over_reference"] == pytest.approx(step[1]["value"] / step[0]["value"], rel=1e-9)
