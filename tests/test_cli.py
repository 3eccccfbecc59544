"""The `tinyamp` command: a real training run, and exit status 2 with a message on bad input."""

from __future__ import annotations

import re

import pytest

import tinyamp as ta
from tinyamp.cli import main


def test_train_fits_the_spiral(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--quiet", "--steps", "600"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    accuracy = float(re.search(r"accuracy ([\d.]+)%", line).group(1))
    assert accuracy > 90.0, line  # a linear model stays near 1/3 on three spiral arms


def test_info_names_numpy_and_the_gpu_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "numpy" in out and "gpu" in out


@pytest.mark.skipif(ta.cuda_is_available(), reason="a GPU is present")
def test_cuda_without_a_gpu_exits_2_and_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--device", "cuda"]) == 2
    assert "cuda" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--steps", "0"], ["--batch-size", "-1"], ["--device", "tpu"]])
def test_bad_numbers_and_devices_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", *args]) == 2
    assert "error" in capsys.readouterr().err


def test_unknown_model_lists_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["train", "--model", "resnet"])
    assert exc.value.code == 2
    assert "mlp" in capsys.readouterr().err
