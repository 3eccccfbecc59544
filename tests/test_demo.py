"""`tinyamp demo` at its full size on the MLP (the transformer reduced): results.json and the claims of its table.

The demo trains the digits MLP from one seed in every regime, with Keras's default SGD
settings; the checks here are the claims the README makes about it, as inequalities:

* pure BF16 (no master weights) fails: 2x FP32's training loss or 5 points of accuracy
  lost, with most of its updates lost; the FP32 masters alone repair it;
* without master weights FP16 loses updates too, and loss scaling alone does not keep them;
* mixed precision ends within 1 accuracy point of FP32, with half the saved bytes;
* FP8 (every Linear product on 8-bit inputs, delayed scaling) ends within 1 point of FP32 too.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

import tinyamp as ta
from tinyamp import nn, optim
from tinyamp.amp import MasterWeights
from tinyamp.cli import DEMO_MLP_STEPS, main
from tinyamp.experiments import measure
from tinyamp.experiments.diagnosis import diagnose
from tinyamp.experiments.figures import matplotlib_available
from tinyamp.experiments.regimes import REGIMES, bfloat16_available

pytestmark = [pytest.mark.cli, pytest.mark.long_run]

STEPS = DEMO_MLP_STEPS  # the failure of pure BF16 grows over the run: the curves part after about step 400
TRANSFORMER_STEPS = 4
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    out = tmp_path_factory.mktemp("demo")
    argv = ["demo", "--steps", str(STEPS), "--transformer-steps", str(TRANSFORMER_STEPS), "--out", str(out), "--quiet"]
    printed = io.StringIO()  # (capsys is function-scoped; this fixture runs once for the module)
    with contextlib.redirect_stdout(printed):
        assert main(argv) == 0
    return json.loads((out / "results.json").read_text()), printed.getvalue(), out


def regimes(doc: dict, task: str = "mlp") -> dict:
    return doc["tasks"][task]["regimes"]


def test_results_json_has_every_number_of_the_table_per_regime_and_per_step(demo_run: tuple) -> None:
    doc, _, _ = demo_run
    assert doc["schema"] == "tinyamp-results/1"
    bf16 = ["bf16", "bf16-mixed"] if bfloat16_available() else []
    expected = ["fp32", "fp16", "fp16-scaled", "fp16-master", "mixed", *bf16, "fp8"]
    assert list(regimes(doc)) == expected
    assert list(regimes(doc, "transformer")) == ["fp32", "mixed"]
    for name, r in regimes(doc).items():
        assert set(r["metrics"]) == {"train_loss", "test_loss", "accuracy"}
        assert 0.0 <= r["metrics"]["accuracy"] <= 1.0
        assert isinstance(r["skipped_steps"], int) and r["final_scale"] > 0
        assert r["saved_bytes"] > 0 and r["ms_per_step"] > 0
        for key in ("loss", "scale", "skipped", "lr"):
            assert len(r["series"][key]) == STEPS, (name, key)
        measured = r["measured"]
        assert len({len(v) for v in measured.values()}) == 1 and measured["step"][-1] == STEPS - 1
        assert len(r["histogram"]["unscaled"]) == len(r["histogram"]["log2_bins"])
        assert r["memory"]["peak_step_bytes"] > 0
        held = r["memory"]["held_bytes"]
        weights = 4 if name in ("fp32", "fp8") else 2  # bytes per parameter of the model's own copy (FP8: the masters)
        assert sum(held["parameters"].values()) == weights * 85_002  # MLP 64-256-256-10
        assert ("master weights" in held) == REGIMES[name].master_weights
        if name in ("fp32", "fp8"):  # FP32 gradients and weights (FP8's casts are counted in r["fp8"])
            assert r["underflow_fraction"] is None and r["lost_update_fraction"] is None
            assert bool(r["fp8"]) == (name == "fp8")
        else:
            assert 0.0 <= r["underflow_fraction"] <= 1.0 and 0.0 <= r["lost_update_fraction"] <= 1.0
    for r in regimes(doc, "transformer").values():
        assert math.isfinite(r["metrics"]["val_loss"]) and len(r["series"]["loss"]) == TRANSFORMER_STEPS


def test_without_master_weights_updates_are_lost_and_the_loss_ends_higher(demo_run: tuple) -> None:
    r = regimes(demo_run[0])
    assert r["fp16"]["lost_update_fraction"] > 0.3
    assert r["fp16"]["metrics"]["train_loss"] > r["mixed"]["metrics"]["train_loss"]
    # with masters the same updates are kept: the loss follows FP32's
    assert r["fp16-master"]["metrics"]["train_loss"] == pytest.approx(r["fp32"]["metrics"]["train_loss"], rel=0.01)


def test_pure_bf16_fails_from_lost_updates_and_fp32_masters_alone_repair_it(demo_run: tuple) -> None:
    if not bfloat16_available():
        pytest.skip("bfloat16 needs ml_dtypes")
    r = regimes(demo_run[0])
    verdicts = diagnose(r)
    assert verdicts["bf16"].failed and not verdicts["bf16-mixed"].failed
    fp32 = r["fp32"]["metrics"]
    assert r["bf16"]["metrics"]["train_loss"] > 2 * fp32["train_loss"]
    assert r["bf16"]["metrics"]["accuracy"] < fp32["accuracy"] - 0.05
    assert r["bf16"]["lost_update_fraction"] > 0.9  # 8 significant bits: nearly every update of plain SGD rounds away
    assert r["bf16"]["underflow_fraction"] < 0.001 and r["bf16"]["skipped_steps"] == 0  # nothing else went wrong
    assert abs(r["bf16-mixed"]["metrics"]["accuracy"] - fp32["accuracy"]) <= 0.01
    assert r["bf16-mixed"]["metrics"]["train_loss"] == pytest.approx(fp32["train_loss"], rel=0.01)
    printed = demo_run[1]
    assert "bf16         FAILED" in printed and "add FP32 master weights: bf16-mixed ends 1.00x" in printed


def test_loss_scaling_alone_keeps_no_update_and_here_has_little_underflow_to_repair(demo_run: tuple) -> None:
    r = regimes(demo_run[0])
    assert r["fp16-scaled"]["final_scale"] > 1 and r["fp16"]["final_scale"] == 1
    assert r["fp16-scaled"]["lost_update_fraction"] == pytest.approx(r["fp16"]["lost_update_fraction"], abs=0.01)
    assert r["fp16-scaled"]["metrics"]["train_loss"] == pytest.approx(r["fp16"]["metrics"]["train_loss"], rel=0.01)
    assert r["fp16-scaled"]["metrics"]["train_loss"] > r["mixed"]["metrics"]["train_loss"]
    # errors of a loss still near 0.4 are large: under 1% of the gradient values underflow without scaling
    assert r["mixed"]["underflow_fraction"] <= r["fp16-master"]["underflow_fraction"] < 0.01


def test_mixed_precision_is_within_one_point_of_fp32_with_half_the_saved_bytes(demo_run: tuple) -> None:
    r = regimes(demo_run[0])
    assert abs(r["mixed"]["metrics"]["accuracy"] - r["fp32"]["metrics"]["accuracy"]) <= 0.01
    assert r["mixed"]["saved_bytes"] < 0.6 * r["fp32"]["saved_bytes"]


def test_fp8_is_within_one_point_of_fp32_and_its_casts_are_counted(demo_run: tuple) -> None:
    r = regimes(demo_run[0])
    assert abs(r["fp8"]["metrics"]["accuracy"] - r["fp32"]["metrics"]["accuracy"]) <= 0.01
    assert r["fp8"]["saved_bytes"] < r["fp32"]["saved_bytes"]  # x and W kept for backward as one byte a value
    totals = r["fp8"]["fp8"]["totals"]
    assert totals["forward"]["values"] > 0 and totals["backward"]["nonfinite"] == 0
    assert (
        r["fp8"]["skipped_steps"] == 0 and "fp8: of the" in demo_run[1] and "fp8          matches FP32" in demo_run[1]
    )


def test_the_printed_table_names_every_regime_and_defines_its_columns(demo_run: tuple) -> None:
    _, printed, _ = demo_run
    for name in ("fp32", "fp16", "fp16-master", "mixed", "underflow@end", "lost upd."):
        assert name in printed
    assert "2^-25" in printed and "within 1 point" in printed and "Keras's defaults" in printed


def test_figures_are_png_files(demo_run: tuple) -> None:
    if not matplotlib_available():
        pytest.skip("matplotlib is not installed")
    out = demo_run[2]
    for task in ("mlp", "transformer"):
        for kind in ("loss", "loss_scale", "measured", "gradients"):
            path = out / f"{task}_{kind}.png"
            assert path.read_bytes()[:8] == PNG_MAGIC, path
    assert (out / "mlp_fp8_tensors.png").read_bytes()[:8] == PNG_MAGIC
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary leftovers


# ---- the two measurements, on cases small enough to check by hand -------------------------------
def test_underflow_fraction_counts_values_at_or_below_half_the_smallest_subnormal() -> None:
    g = np.array([2.0**-26, 2.0**-25, 2.0**-24, 1e-3, 0.0])  # the 0 is not counted: nothing to lose
    assert measure.underflow_fraction(g) == 0.5  # 2^-26 and 2^-25 (a tie, to even: 0) vanish
    assert measure.underflow_fraction(g, scale=2.0**10) == 0.0


def test_underflow_norm_fraction_weighs_the_vanished_values_by_their_squares() -> None:
    g = np.array([2.0**-26, -(2.0**-25), 2.0**-24, 0.5, 0.0])
    lost = 2.0**-52 + 2.0**-50
    expected = lost / (lost + 2.0**-48 + 0.25)
    assert measure.underflow_norm_fraction(g) == pytest.approx(expected, rel=1e-12)
    assert measure.underflow_fraction(g) == 0.5 and measure.underflow_norm_fraction(g) < 1e-13  # many, and tiny
    assert measure.underflow_norm_fraction(g, scale=2.0**10) == 0.0


def test_lost_update_meter_agrees_with_master_weights() -> None:
    """Plain SGD on FP16 weights loses exactly the updates MasterWeights says FP16 would lose."""
    rng = np.random.default_rng(0)
    w = rng.uniform(0.5, 2.0, 64).astype(np.float16)  # ulp/2 is 2^-12..2^-10 here
    g = np.where(np.arange(64) % 2 == 0, 1e-2, 1e-5).astype(np.float32)  # updates of 1e-3 (kept), 1e-6 (lost)
    plain = ta.tensor(w, requires_grad=True)
    opt = optim.SGD([plain], lr=0.1)
    meter = measure.LostUpdateMeter(opt)
    plain.grad = g.astype(np.float16)
    meter.before_step()
    opt.step()
    changed, lost = meter.after_step(skipped=False)

    model = nn.Linear(64, 1)
    model.weight.data = w.reshape(1, 64).copy()
    model.half()
    masters = MasterWeights(optim.SGD([model.weight], lr=0.1))
    model.weight.grad = g.reshape(1, 64).astype(np.float16)
    masters.step()
    record = masters.history[-1]
    assert (changed, lost) == (record.changed, record.lost) == (64, 32)


def test_the_loss_figure_names_the_failed_run_and_its_cause(demo_run: tuple) -> None:
    if not matplotlib_available() or not bfloat16_available():
        pytest.skip("needs matplotlib and ml_dtypes")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from tinyamp.experiments.figures import draw_loss_curves

    task = demo_run[0]["tasks"]["mlp"]
    fig = draw_loss_curves(task, "digits MLP: training loss")
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    notes = [t for t in ax.texts if "FAILED" in t.get_text()]
    assert [t.get_text().split()[0] for t in notes] == ["bf16"]  # the one failed run, and no other
    lost = round(100 * task["regimes"]["bf16"]["lost_update_fraction"])
    assert f"{lost}% of its updates lost" in notes[0].get_text()
    box, legend = notes[0].get_window_extent(), ax.get_legend().get_window_extent()
    assert ax.bbox.contains(box.x0, box.y0) and ax.bbox.contains(box.x1, box.y1) and not box.overlaps(legend)
