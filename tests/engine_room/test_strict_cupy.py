"""The GPU code paths, run on a strict CuPy stand-in: no host/device mix-ups, without a GPU.

CuPy refuses to mix its arrays with NumPy's (``np.asarray(device_array)``, a NumPy operand
in a CuPy op, ``x[...] = host_array``, ``np.add.at`` on device data...).  Code that does so
works on the CPU and fails only on a GPU, where this project rarely runs.  The stand-in in
``tests/engine_room/strict_cupy`` raises on each of those mixes (and records it), so the suite's
``device="cuda"`` cases and the command line with ``--device cuda`` run here against it.
What it cannot check (the kernels, the numbers) is for benchmarks/gpu_check.py on a GPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tinyamp as ta

ROOT = Path(__file__).resolve().parents[2]
STAND_IN = ROOT / "tests" / "engine_room" / "strict_cupy"

pytestmark = [
    pytest.mark.engine_room,
    pytest.mark.skipif(ta.cuda_is_available(), reason="a real GPU is here: the GPU tests run on it"),
]


def run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(STAND_IN), str(ROOT)]), OPENBLAS_NUM_THREADS="1",
               MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1")  # fmt: skip
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_the_suites_gpu_cases_pass_on_the_stand_in(tmp_path: Path) -> None:
    result = run(["-m", "pytest", "-p", "strict_cupy_plugin", "-p", "no:cacheprovider", "-k", "cuda",
                  "--rootdir", str(ROOT), str(ROOT / "tests")], tmp_path)  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    assert "STRICT-CUPY VIOLATIONS: 0" in out, out[-6000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) >= 130, out[-2000:]  # the GPU cases really ran here


@pytest.mark.parametrize(
    "command",
    [
        ["train", "--model", "mlp", "--precision", "mixed", "--steps", "12"],
        ["train", "--model", "transformer", "--precision", "fp16-master", "--steps", "3", "--memory"],
        ["demo", "--steps", "12", "--transformer-steps", "2"],
    ],
    ids=["train-mlp", "train-transformer", "demo"],
)
def test_the_command_line_runs_on_the_stand_in(command: list[str], tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    result = run([str(STAND_IN / "run_cli.py"), *command, "--device", "cuda", "--quiet", "--out", str(out_dir)],
                 tmp_path)  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    assert "STRICT-CUPY VIOLATIONS: 0" in out, out[-6000:]
    assert (out_dir / "results.json").exists()
