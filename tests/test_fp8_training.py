"""tinyamp/fp8/training.py and `tinyamp train --precision fp8 | fp8-current | mxfp8`: training with FP8 products.

The laws: a Linear layer's three products under FP8 are ``fp8_matmul`` of the quantized operands
(E4M3 forward, E5M2 gradients), bit for bit; each tensor is cast once a step and evaluation
casts change no scale; the digits MLP trained in FP8 ends within one accuracy point of FP32;
a NaN or inf reaching a cast is cast to NaN, skips its step, holds its scale and is reported
with its tensor and step; a stopped FP8 run resumes bit for bit, scales included; every
tensor's series is in results.json and drawn; bad names get one sentence.
"""

from __future__ import annotations

import json
import math
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_resume import assert_same_run, signal_during_step

import tinyamp as ta
from tinyamp import nn
from tinyamp.amp.training_state import read_checkpoint
from tinyamp.cli import UsageError, _check_precision, main
from tinyamp.experiments import tasks
from tinyamp.experiments.figures import matplotlib_available
from tinyamp.experiments.runner import run_regime
from tinyamp.fp8.blocks import quantize
from tinyamp.fp8.products import fp8_matmul
from tinyamp.fp8.scales import Fp8Scales
from tinyamp.fp8.training import RECIPES, Fp8Casts, fp8_training, transposed
from tinyamp.fp8.training_state import load_extra, to_extra

pytestmark = pytest.mark.fp8

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def layer_and_batch(in_features: int = 64, out_features: int = 10, rows: int = 96) -> tuple[nn.Linear, np.ndarray]:
    ta.manual_seed(3)
    layer = nn.Linear(in_features, out_features)
    x = np.random.default_rng(3).standard_normal((rows, in_features)).astype(np.float32)
    return layer, x


def forward_backward(layer: nn.Linear, x: np.ndarray, casts: Fp8Casts, g: np.ndarray) -> tuple[np.ndarray, ...]:
    xt = ta.tensor(x, requires_grad=True)
    with casts.autocast(layer):
        y = layer(xt)
    (y * ta.tensor(g)).sum().backward()
    return y.numpy(), xt.grad, layer.weight.grad, layer.bias.grad  # (a gradient is an array)


# ---- the products ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", ["fp8", "fp8-current"])
def test_the_three_products_are_fp8_matmuls_of_the_quantized_operands(recipe: str) -> None:
    layer, x = layer_and_batch()
    g = np.random.default_rng(4).standard_normal((96, 10)).astype(np.float32) * np.float32(1e-3)
    casts = fp8_training(recipe)
    y, gx, gw, gb = forward_backward(layer, x, casts, g)
    by_hand = Fp8Scales(casts.scales.recipe)  # the same casts in the same order
    qx, qw = by_hand.quantize("x", x), by_hand.quantize("w", layer.weight.numpy())
    qg = by_hand.quantize("g", g, "backward")
    assert (qx.fmt.name, qw.fmt.name, qg.fmt.name) == ("E4M3", "E4M3", "E5M2")  # HYBRID
    assert np.array_equal(y, fp8_matmul(qx, transposed(qw)) + layer.bias.numpy())
    assert np.array_equal(gx, fp8_matmul(qg, qw))  # dgrad: g (E5M2) @ W (E4M3)
    assert np.array_equal(gw, fp8_matmul(transposed(qg), qx))  # wgrad: g^T (E5M2) @ x (E4M3)
    assert np.array_equal(gb, g.sum(axis=0, dtype=np.float32))  # the bias gradient from the unquantized g
    assert y.dtype == gx.dtype == gw.dtype == np.float32


def test_mxfp8_products_are_exact_sums_of_block_decoded_values_with_zero_padding() -> None:
    layer, x = layer_and_batch(out_features=10)  # 10 outputs: g and W^T are padded to 32 along them
    g = np.random.default_rng(5).standard_normal((96, 10)).astype(np.float32)
    y, gx, gw, _ = forward_backward(layer, x, fp8_training("mxfp8"), g)
    w = layer.weight.numpy()

    def mx(a: np.ndarray, scheme: str) -> np.ndarray:  # blocks along the last axis, padded with zeros, scales up
        padded = np.pad(a, ((0, 0), (0, -a.shape[1] % 32)))
        return quantize(padded, scheme, rounding="up").dequantize()

    assert np.array_equal(y, mx(x, "mxfp8_e4m3") @ mx(w, "mxfp8_e4m3").T + layer.bias.numpy())
    assert np.array_equal(gx, mx(g, "mxfp8_e5m2") @ mx(w.T.copy(), "mxfp8_e4m3").T)
    assert np.array_equal(gw, mx(g.T.copy(), "mxfp8_e5m2") @ mx(x.T.copy(), "mxfp8_e4m3").T)


def test_the_graph_keeps_one_byte_a_value_for_backward() -> None:
    from tinyamp.inspect import saved_tensors

    layer, x = layer_and_batch(64, 32)
    with fp8_training("fp8").autocast(layer):
        y = layer(ta.tensor(x))
    report = saved_tensors(y.sum())
    fp8_rows = [r for r in report.rows if r.op == "Fp8Linear"]
    assert [(r.shape, r.dtype) for r in fp8_rows] == [((96, 64), "uint8"), ((32, 64), "uint8")]


def test_autocast_routes_only_inside_its_block_and_evaluation_changes_no_scale() -> None:
    layer, x = layer_and_batch()
    fp32 = layer(ta.tensor(x)).numpy()
    casts = fp8_training("fp8")
    forward_backward(layer, x, casts, np.ones((96, 10), np.float32))
    assert "forward" not in layer.__dict__ and np.array_equal(layer(ta.tensor(x)).numpy(), fp32)  # outside: FP32
    before = casts.state_dict()
    with ta.no_grad(), casts.autocast(layer):
        evaluated = layer(ta.tensor(x)).numpy()
    assert casts.state_dict() == before  # scoring a model leaves its scales as they were
    assert not np.array_equal(evaluated, fp32)  # ... but it did run in FP8, with the current scales


def test_each_tensor_is_cast_once_a_step_under_its_layers_name() -> None:
    result, setup = run_regime(tasks.DigitsMLP(), "fp8", 7, measure_every=1000)
    names = {f"{layer}.{kind}" for layer in ("0", "2", "4") for kind in ("input", "weight", "grad_output")}
    assert set(result.fp8["tensors"]) == names
    for name, t in setup.fp8.scales.tensors.items():
        assert [c.step for c in t.history] == list(range(7)), name
        assert len(result.fp8["tensors"][name]["series"]["scale"]) == 7
    formats = {name: t["format"] for name, t in result.fp8["tensors"].items()}
    assert formats["0.grad_output"] == "E5M2" and formats["2.input"] == formats["4.weight"] == "E4M3"


@pytest.mark.long_run
def test_the_transformer_trains_in_fp8_with_every_linear_layer_cast() -> None:
    task = tasks.CharTransformer(chars=20_000, eval_batches=1)
    for recipe in ("fp8", "mxfp8"):  # mxfp8: the vocabulary of the head is padded to a multiple of 32
        result, _ = run_regime(task, recipe, 2, measure_every=1000)
        assert math.isfinite(result.metrics["val_loss"]) and result.skipped_steps == 0
        assert {"blocks.0.attn.qkv.input", "blocks.1.mlp.2.weight", "head.grad_output"} <= set(result.fp8["tensors"])


# ---- what FP8 costs the digits MLP ------------------------------------------------------------------------------
@pytest.mark.long_run
def test_fp8_ends_within_one_point_of_fp32_on_the_digits(capsys: pytest.CaptureFixture[str]) -> None:
    task = tasks.DigitsMLP()
    steps = 1500  # the demo's run
    accuracy = {r: run_regime(task, r, steps, measure_every=10**6)[0].metrics["accuracy"] for r in ("fp32", "fp8")}
    with capsys.disabled():
        print(f"\ndigits MLP, {steps} steps: test accuracy FP32 {100 * accuracy['fp32']:.2f}%, "
              f"FP8 (delayed scaling) {100 * accuracy['fp8']:.2f}%")  # fmt: skip
    assert abs(accuracy["fp8"] - accuracy["fp32"]) <= 0.01


@pytest.mark.parametrize("recipe", ["fp8-current", "mxfp8"])
def test_the_other_recipes_end_within_one_point_of_fp32_at_a_fifth_of_the_run(recipe: str) -> None:
    task = tasks.DigitsMLP()  # 300 steps; at 1500, fp8-current ends 0.28 points below FP32, mxfp8 level with it
    accuracy = {r: run_regime(task, r, 300, measure_every=10**6)[0].metrics["accuracy"] for r in ("fp32", recipe)}
    assert abs(accuracy[recipe] - accuracy["fp32"]) <= 0.01


# ---- not a number ---------------------------------------------------------------------------------------------
@dataclass
class PoisonedDigits(tasks.DigitsMLP):
    """The digits, with one input value of one batch replaced (NaN by default)."""

    poison_step: int = 5
    poison: float = math.nan

    def batches(self, start: int = 0) -> Any:
        for step, (x, y) in enumerate(super().batches(start), start):
            if step == self.poison_step:
                data = x.numpy().copy()
                data[3, 7] = self.poison
                x = ta.tensor(data)
            yield x, y


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("poison", [math.nan, math.inf])
def test_a_nan_or_inf_is_cast_to_nan_skips_its_step_holds_the_scale_and_is_reported(recipe: str, poison: float) -> None:
    result, setup = run_regime(PoisonedDigits(poison=poison), recipe, 9, measure_every=1000)
    assert result.series["skipped"] == [i == 5 for i in range(9)]  # skipped as an overflow is, and only that step
    events = result.fp8["nonfinite"]
    assert {"step": 5, "tensor": "0.input", "values": 1} in events and {e["step"] for e in events} == {5}
    assert result.fp8["tensors"]["0.input"]["series"]["nonfinite"][5] == 1
    assert result.fp8["tensors"]["0.input"]["series"]["saturated"][5] == 0  # the inf was not saturated to 448
    if recipe != "mxfp8":  # (MXFP8 keeps no scale from step to step)
        casts = setup.fp8.scales.tensors["0.input"].history
        assert casts[5].event == "held" and casts[5].next_scale == casts[4].next_scale
        assert np.isfinite(setup.fp8.scales.tensors["0.input"].amax_history).all()  # the history did not take it
    assert np.isfinite(np.concatenate([p.numpy().ravel() for p in setup.model.parameters()])).all()


def test_mxfp8_rounds_block_scales_up_so_that_no_finite_value_saturates() -> None:
    """Transformer Engine's MXFP8 rule: a block's amax lands in (224, 448], never above E4M3's largest value."""
    result, setup = run_regime(tasks.DigitsMLP(), "mxfp8", 5, measure_every=1000)
    assert setup.fp8.settings()["rounding"] == "up"
    series = [t["series"] for t in result.fp8["tensors"].values()]
    assert sum(sum(s["saturated"]) for s in series) == 0 and sum(sum(s["flushed"]) for s in series) > 0
    x = (np.random.default_rng(0).standard_normal((64, 96)) * 2.0 ** np.arange(-10, 14, 0.25)).astype(np.float32)
    q, _ = setup.fp8.cast("probe", x, "forward", False)
    assert np.array_equal(q.codes, quantize(x, "mxfp8_e4m3", rounding="up").codes)
    assert not np.array_equal(q.codes, quantize(x, "mxfp8_e4m3").codes)  # the OCP floor would give other bytes


def test_train_names_the_tensor_and_the_step_of_a_nan(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.setattr(tasks, "TASKS", {**tasks.TASKS, "mlp": PoisonedDigits})
    assert main(["train", "--precision", "fp8", "--steps", "9", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "fp8: step 5: 1 value of 0.input was inf or NaN before the cast: cast to NaN, not saturated" in out
    assert "the step was skipped (its gradients were not finite)" in out


# ---- bad input ----------------------------------------------------------------------------------------------
def test_an_unknown_precision_or_recipe_gets_one_sentence_naming_the_choices(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["train", "--precision", "fp9"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "invalid choice: 'fp9'" in err and all(name in err for name in ("'fp8'", "'fp8-current'", "'mxfp8'"))
    with pytest.raises(ValueError, match="unknown FP8 recipe 'e4m3'; use one of fp8, fp8-current, mxfp8"):
        fp8_training("e4m3")


def test_fp8_on_a_gpu_is_refused_in_one_sentence() -> None:
    with pytest.raises(UsageError, match=r"--precision mxfp8 runs on the CPU only: FP8 is emulated on NumPy"):
        _check_precision("mxfp8", "cuda")
    _check_precision("fp8", "cpu")  # no complaint


def test_distributed_fp8_is_refused_in_one_sentence() -> None:
    pytest.importorskip("mpi4py")
    from tinyamp.distributed.train import _problem

    unset = ("model", "scaler", "steps", "batch_size", "lr", "schedule", "seed", "checkpoint_every")
    settings = {**dict.fromkeys(unset), "precision": "fp8", "reduce_dtype": "float32", "zero": False}
    why = _problem(settings, 2)
    assert why == "--precision fp8 trains in one process (FP8 is emulated on NumPy); leave out --distributed"


@pytest.mark.parametrize("recipe", ["fp8", "mxfp8"])
def test_a_damaged_fp8_state_is_refused_whole(recipe: str) -> None:
    _, setup = run_regime(tasks.DigitsMLP(), recipe, 3, measure_every=1000)
    good = to_extra(setup.fp8)
    name = "0.input"
    damages = [
        (lambda s: s.update(recipe="fp8-current" if recipe == "fp8" else "fp8"), "is of the recipe"),
        (lambda s: s["tensors"][name]["casts"].update(amax=np.zeros(3, np.float64)), "as something other than"),
        (lambda s: s["tensors"][name]["casts"].update(flushed=np.array([0, 0, 10**9])), "counts more values"),
        (lambda s: s["tensors"][name]["casts"].update(amax=np.zeros(2, np.float32)), "different lengths"),
        (lambda s: s["tensors"][name].pop("casts"), "not the table of casts"),
    ]
    if recipe == "fp8":
        damages += [
            (lambda s: s["tensors"][name].update(scale=0.1), "scale holds 0.1"),
            (lambda s: s["tensors"][name]["casts"].update(event=np.full(3, 7, np.uint8)), "names an event"),
            (lambda s: s["tensors"][name]["amax_history"].__setitem__(-1, np.inf), "amax_history holds inf"),
        ]
    for damage, words in damages:
        fresh = fp8_training(recipe)
        bad = to_extra(setup.fp8)
        damage(bad)
        with pytest.raises(ValueError, match=words) as raised:
            load_extra(fresh, bad, "run/checkpoint.npz")
        assert str(raised.value).startswith("run/checkpoint.npz: the checkpoint's FP8 state")
        assert fresh.summary()["tensors"] == {}  # nothing loaded
    restored = fp8_training(recipe)
    load_extra(restored, good, "run/checkpoint.npz")
    assert restored.summary() == setup.fp8.summary()


# ---- a run: results.json, figures, checkpoints that resume bit for bit ---------------------------------------------
def stopped_and_resumed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, task: type, options: list[str],
                        stop_at: int, signum: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """`tinyamp train OPTIONS` straight, and stopped by `signum` at step `stop_at` then resumed: both checkpoints,
    after asserting the two runs' results.json hold the same FP8 record."""
    monkeypatch.setattr("tinyamp.experiments.figures.matplotlib_available", lambda: False)
    common = ["train", "--quiet", *options]
    assert main([*common, "--out", str(tmp_path / "straight")]) == 0
    with monkeypatch.context() as m:
        signal_during_step(m, task, stop_at, signum)
        assert main([*common, "--out", str(tmp_path / "run")]) == 128 + signum
    assert main(["train", "--quiet", "--resume", str(tmp_path / "run" / "checkpoint.npz"), "--out",
                 str(tmp_path / "run")]) == 0  # fmt: skip
    results = [json.loads((tmp_path / d / "results.json").read_text()) for d in ("straight", "run")]
    fp8 = [regime["fp8"] for r in results for t in r["tasks"].values() for regime in t["regimes"].values()]
    assert len(fp8) == 2 and fp8[0] == fp8[1]
    straight, resumed = (read_checkpoint(tmp_path / d / "checkpoint.npz") for d in ("straight", "run"))
    return straight, resumed


@pytest.mark.parametrize(("recipe", "stop_at"), [("fp8", 6), ("fp8-current", 0), ("mxfp8", 11)])
def test_a_stopped_fp8_run_resumes_bit_identical_scales_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recipe: str, stop_at: int
) -> None:
    options = ["--precision", recipe, "--steps", "16"]
    straight, resumed = stopped_and_resumed(tmp_path, monkeypatch, tasks.DigitsMLP, options, stop_at, signal.SIGINT)
    assert set(straight["extra"]["fp8"]["tensors"]) >= {"0.input", "4.grad_output"}
    assert_same_run(straight, resumed, [stop_at + 1])


@pytest.mark.parametrize(("recipe", "stop_at"), [("fp8", 3), ("mxfp8", 1)])
def test_a_stopped_fp8_transformer_resumes_bit_identical_scales_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recipe: str, stop_at: int
) -> None:
    """The transformer's 9 Linear layers (qkv, proj and the MLP's two in each of 2 blocks, the head) each cast an
    input, a weight and a gradient a step; every one's scale, history and record resumes."""
    options = ["--model", "transformer", "--precision", recipe, "--steps", "6"]
    straight, resumed = stopped_and_resumed(tmp_path, monkeypatch, tasks.CharTransformer, options, stop_at,
                                            signal.SIGTERM)  # fmt: skip
    tensors = straight["extra"]["fp8"]["tensors"]
    assert {"blocks.0.attn.qkv.input", "blocks.1.mlp.2.grad_output", "head.weight"} <= set(tensors), sorted(tensors)
    assert len({name.removesuffix(".T").rsplit(".", 1)[0] for name in tensors}) == 9
    assert_same_run(straight, resumed, [stop_at + 1])


def test_results_json_and_the_figure_hold_every_tensors_series(tmp_path: Path) -> None:
    assert main(["train", "--quiet", "--precision", "fp8", "--steps", "12", "--out", str(tmp_path)]) == 0
    fp8 = json.loads((tmp_path / "results.json").read_text())["tasks"]["mlp"]["regimes"]["fp8"]["fp8"]
    assert fp8["recipe"] == "fp8" and fp8["settings"]["amax_history_len"] == 1024
    for name, t in fp8["tensors"].items():
        assert set(t["series"]) == {"amax", "scale", "next_scale", "event", "saturated", "flushed", "nonfinite"}
        assert all(len(v) == 12 for v in t["series"].values()), name
        assert len(t["amax_history"]) == 1024 and t["amax_history"][-12:] == t["series"]["amax"]
        assert t["series"]["scale"][0] == 1.0 and t["series"]["scale"][1] == t["series"]["next_scale"][0]
    weights = fp8["tensors"]["2.weight"]
    assert weights["values"] == 256 * 256 and weights["pass"] == "forward"
    assert fp8["totals"]["forward"]["values"] == 12 * sum(t["values"] for t in fp8["tensors"].values()
                                                          if t["pass"] == "forward")  # fmt: skip
    if matplotlib_available():
        from tinyamp.experiments.figures import draw_fp8_tensors

        assert (tmp_path / "mlp_fp8_tensors.png").read_bytes()[:8] == PNG_MAGIC
        fig = draw_fp8_tensors({"fp8": fp8, "first_step": 0}, "digits")
        scale_axes = fig.axes[0]
        assert sorted(line.get_label() for line in scale_axes.get_lines()) == sorted(fp8["tensors"])


def test_a_diverged_fp8_run_saves_the_scales_of_its_last_good_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tinyamp.experiments.figures.matplotlib_available", lambda: False)
    huge = ["--lr", "1e20"]  # the weights overflow within a few steps
    assert main(["train", "--quiet", "--precision", "fp8", *huge, "--steps", "12", "--out", str(tmp_path)]) == 3
    extra = read_checkpoint(tmp_path / "checkpoint.npz")["extra"]
    step = extra["train"]["step"]
    assert 0 < step < 12
    assert {len(t["casts"]["amax"]) for t in extra["fp8"]["tensors"].values()} == {step}  # not the later casts
