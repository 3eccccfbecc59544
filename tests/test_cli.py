"""The `tinyamp` command: real training runs, resuming, and exit status 2 with a message on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tinyamp as ta
from tinyamp import cli, extras
from tinyamp.amp.training_state import read_checkpoint
from tinyamp.cli import main
from tinyamp.experiments import figures

pytestmark = pytest.mark.cli


def test_train_learns_the_digits(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--quiet", "--steps", "150", "--precision", "mixed"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert row[0] == "mixed"
    accuracy = float(row[2].rstrip("%"))
    assert accuracy > 85.0, row  # chance is 10%


def test_train_shows_a_progress_bar_unless_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--steps", "20", "--precision", "fp32"]) == 0
    captured = capsys.readouterr()
    assert "mlp fp32" in captured.err and "/20" in captured.err  # tqdm writes to stderr
    assert main(["train", "--steps", "20", "--precision", "fp32", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_train_the_transformer(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--model", "transformer", "--steps", "3", "--quiet"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("mixed")


def test_a_run_whose_every_step_was_measured_shows_no_time_rather_than_nan(capsys: pytest.CaptureFixture[str]) -> None:
    # the first and the last step are measurement steps, which are not timed
    assert main(["train", "--steps", "2", "--quiet"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1]
    assert row.startswith("mixed") and row.split()[-1] == "-" and "nan" not in row


def test_train_memory_itemizes_the_held_bytes_and_measures_the_peak(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "--steps", "5", "--quiet", "--memory", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    # MLP 64-256-256-10 has 85,002 parameters: FP16 copies 2 bytes each, FP32 masters 4
    assert "parameters        float16          170,004" in out
    assert "master weights    float32          340,008" in out
    memory = json.loads((tmp_path / "run" / "results.json").read_text())
    peaks = [r["memory"]["peak_step_bytes"] for t in memory["tasks"].values() for r in t["regimes"].values()]
    assert peaks and all(p > 0 for p in peaks)


def test_info_prints_versions_formats_policy_and_presets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for word in ("numpy", "gpu", "float16", "65504", "layer_norm", "pytorch", "chainer"):
        assert word in out, word


def test_info_gives_an_install_hint_only_for_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    assert main(["info"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("matplotlib"))
    assert "pip install" not in line and "(figures)" in line, line
    monkeypatch.setattr(cli, "_version", lambda module: "not installed")
    assert main(["info"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert next(x for x in lines if x.startswith("matplotlib")).endswith(f"(figures: {extras.install_hint('plots')})")
    assert "pip install ml_dtypes, a dependency of tinyamp" in next(x for x in lines if x.startswith("ml_dtypes"))


def test_install_hints_fit_a_source_checkout_and_a_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert extras.install_hint("plots") == 'pip install -e ".[plots]"'  # the tests run from a checkout
    (tmp_path / "tinyamp").mkdir()  # a wheel's copy: site-packages/tinyamp, no pyproject.toml beside it
    monkeypatch.setattr(extras, "__file__", str(tmp_path / "tinyamp" / "extras.py"))
    assert extras.install_hint("plots") == "pip install 'tinyamp[plots]'"


def test_the_demo_says_why_its_bf16_row_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tinyamp.experiments import runner

    monkeypatch.setattr(runner, "bfloat16_available", lambda: False)
    assert main(["demo", "--quiet", "--steps", "2", "--transformer-steps", "0"]) == 0
    out = capsys.readouterr().out
    why = "(no bf16 or bf16-mixed rows: ml_dtypes is not installed: pip install ml_dtypes, a dependency of tinyamp)"
    assert why in out
    assert "bf16" not in out.split("Against FP32")[1]  # no row and no verdict


def test_ml_dtypes_is_a_dependency() -> None:
    """The demo's BF16 row and the FP8 chapter need it; ``import tinyamp`` still does not load it
    (tests/test_fp8_chapter.py checks that)."""
    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text(encoding="utf-8")
    dependencies = next(line for line in text.splitlines() if line.startswith("dependencies = "))
    assert '"ml_dtypes>=0.5"' in dependencies


def test_python_dash_m_tinyamp_runs_the_command() -> None:
    done = subprocess.run([sys.executable, "-m", "tinyamp", "info"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "float16" in done.stdout


# ---- --out and --resume ----------------------------------------------------------------------------
def model_weights(path: Path) -> dict[str, np.ndarray]:
    return read_checkpoint(path)["model"]


def test_out_writes_results_figures_and_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--steps", "30", "--quiet", "--out", str(tmp_path / "run")]) == 0
    run = tmp_path / "run"
    doc = json.loads((run / "results.json").read_text())
    result = doc["tasks"]["mlp"]["regimes"]["mixed"]
    assert len(result["series"]["loss"]) == 30 and result["scaler"] == "pytorch"
    assert (run / "checkpoint.npz").is_file()
    if figures.matplotlib_available():
        assert (run / "mlp_loss.png").read_bytes()[:4] == b"\x89PNG"
    assert not [p for p in run.iterdir() if p.name.startswith(".")]


def test_extending_a_constant_rate_run_continues_exactly_where_it_stopped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["train", "--quiet", "--precision", "mixed", "--schedule", "constant"]
    assert main([*common, "--steps", "40", "--out", str(tmp_path / "straight")]) == 0
    assert main([*common, "--steps", "20", "--out", str(tmp_path / "first")]) == 0
    resume = ["train", "--quiet", "--resume", str(tmp_path / "first" / "checkpoint.npz"), "--steps", "40"]
    capsys.readouterr()
    assert main([*resume, "--extend", "--out", str(tmp_path / "second")]) == 0
    assert "the steps from 20 on are those a straight 40-step run takes" in capsys.readouterr().out
    straight, resumed = (model_weights(tmp_path / d / "checkpoint.npz") for d in ("straight", "second"))
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert np.array_equal(straight[name], resumed[name]), name
    doc = json.loads((tmp_path / "second" / "results.json").read_text())
    assert doc["config"]["resumed_from"] == 20


def test_resume_refuses_different_settings_and_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--quiet", "--steps", "5", "--out", str(tmp_path)]) == 0
    checkpoint = str(tmp_path / "checkpoint.npz")
    capsys.readouterr()
    assert main(["train", "--resume", checkpoint, "--precision", "fp16", "--steps", "10"]) == 2
    assert "--precision" in capsys.readouterr().err
    assert main(["train", "--resume", checkpoint, "--steps", "5"]) == 2
    assert "finished (5 of 5 steps)" in capsys.readouterr().err
    assert main(["train", "--resume", checkpoint, "--steps", "3", "--extend"]) == 2
    assert "already trained 5 steps" in capsys.readouterr().err
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(Path(checkpoint).read_bytes()[:200])  # a truncated download
    assert main(["train", "--resume", str(corrupt)]) == 2
    assert "checkpoint" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "missing.npz")]) == 2
    assert "no such file" in capsys.readouterr().err


# ---- bad input ---------------------------------------------------------------------------------------
@pytest.mark.skipif(ta.cuda_is_available(), reason="a GPU is present")
@pytest.mark.parametrize("command", ["train", "demo"])
def test_cuda_without_a_gpu_exits_2_and_says_why(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--device", "cuda"]) == 2
    assert "cuda" in capsys.readouterr().err


def test_bfloat16_and_fp8_are_refused_on_cuda_and_left_out_of_its_demo() -> None:
    """tinyamp's GPU code is FP16 only and its FP8 is emulated on NumPy: `train --precision bf16-mixed
    --device cuda` (or fp8) is a usage error (exit 2, checked after the GPU check), and the GPU demo runs
    the other regimes."""
    from tinyamp.cli import UsageError, _check_precision
    from tinyamp.experiments.runner import demo_regimes

    with pytest.raises(UsageError, match="CPU only"):
        _check_precision("bf16-mixed", "cuda")
    with pytest.raises(UsageError, match="CPU only"):
        _check_precision("bf16", "cuda")
    with pytest.raises(UsageError, match="CPU only"):
        _check_precision("fp8", "cuda")
    _check_precision("mixed", "cuda")
    assert "bf16-mixed" not in demo_regimes("cuda") and "fp8" in demo_regimes("cpu")
    assert demo_regimes("cuda") == [r for r in demo_regimes("cpu") if r not in ("bf16", "bf16-mixed", "fp8")]


@pytest.mark.parametrize("args", [["--steps", "0"], ["--batch-size", "-1"], ["--lr", "0"], ["--steps", "-3"]])
def test_bad_numbers_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", *args]) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "listed"),
    [
        ("--model", "resnet", "transformer"),
        ("--precision", "fp4", "mxfp8"),
        ("--scaler", "torch", "chainer"),
        ("--device", "tpu", "cuda"),
    ],
)
def test_unknown_choices_list_the_valid_ones(
    flag: str, value: str, listed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["train", flag, value])
    assert exc.value.code == 2
    assert listed in capsys.readouterr().err


def test_an_output_folder_that_cannot_be_written_exits_2_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a folder")
    for out in (a_file, a_file / "run"):
        assert main(["train", "--quiet", "--steps", "100000", "--out", str(out)]) == 2  # fails fast
        assert str(out) in capsys.readouterr().err
    assert main(["demo", "--quiet", "--out", str(a_file)]) == 2


def test_a_failure_while_writing_leaves_nothing_half_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(document: dict, folder: Path) -> list[Path]:
        (folder / "mlp_loss.png").write_bytes(b"\x89PNG half")
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(figures, "matplotlib_available", lambda: True)
    monkeypatch.setattr(figures, "write_figures", broken)
    with pytest.raises(RuntimeError):
        main(["train", "--quiet", "--steps", "5", "--out", str(tmp_path)])
    assert list(tmp_path.iterdir()) == []  # no results.json, no checkpoint, no half figure, no temp folder


def test_without_matplotlib_results_are_written_and_figures_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(figures, "matplotlib_available", lambda: False)
    assert main(["train", "--quiet", "--steps", "5", "--out", str(tmp_path)]) == 0
    assert "figures skipped" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.npz", "results.json", "tinyamp-run.json"]


def test_the_weights_do_not_depend_on_the_machines_blas_threads(tmp_path: Path) -> None:
    """OpenBLAS splits a product differently with 2 threads than with 1, and the float32 sums
    round differently (measured: the weights differ after 60 steps); the command runs BLAS on
    one thread, so a run gives the same bits on a laptop and on a 64-core server."""
    pytest.importorskip("threadpoolctl")
    weights = []
    for threads in ("1", "2"):
        env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}
        out = tmp_path / threads
        done = subprocess.run(
            [sys.executable, "-m", "tinyamp", "train", "--quiet", "--steps", "60", "--out", str(out)],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        weights.append(model_weights(out / "checkpoint.npz"))
    for name in weights[0]:
        assert weights[0][name].tobytes() == weights[1][name].tobytes(), name
