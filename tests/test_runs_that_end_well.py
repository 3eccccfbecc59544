"""Runs that end well: the real `tinyamp train` in a subprocess, at its edges.

Each test starts the command as a user would (ranks through ``mpiexec -n 2`` where the case
is a distributed one) and checks the exit status, the one sentence it prints, and that
nothing the run produced is lost.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinyamp.amp.training_state import read_checkpoint

pytestmark = pytest.mark.cli

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 180  # a hung run fails its test, never CI


def environment(**extra: str) -> dict[str, str]:
    """The command's environment: this tinyamp, figures drawn off-screen, no BLAS setting of our own."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env.update(PYTHONPATH=str(ROOT), MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1", **extra)
    return env


def tinyamp(*args: str, ranks: int = 0, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """``python -m tinyamp args`` (or ``mpiexec -n ranks python -m tinyamp args``), its output captured."""
    cmd = [sys.executable, "-m", "tinyamp", *args]
    if ranks:
        cmd = ["mpiexec", "-n", str(ranks), *cmd]
    kwargs.setdefault("timeout", TIMEOUT_S)
    return subprocess.run(cmd, cwd=ROOT, env=environment(), capture_output=True, text=True, **kwargs)  # type: ignore


def needs_mpiexec() -> None:
    pytest.importorskip("mpi4py", reason="tinyamp.distributed needs mpi4py: pip install -e '.[mpi]'")
    if shutil.which("mpiexec") is None:
        pytest.skip("no mpiexec on PATH (pip install mpich)")


def one_line(stderr: str, start: str) -> str:
    """The only line of `stderr` that starts with `start` (a traceback or a second copy fails the test)."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith(start)]
    assert len(lines) == 1, stderr
    return lines[0]


# ---- a run that diverges ------------------------------------------------------------------------------
def assert_diverged_run_kept(out: Path, total: int) -> int:
    """results.json marked diverged, and a checkpoint of a good step before the end; return that step."""
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["diverged"], results["config"]
    manifest = json.loads((out / "tinyamp-run.json").read_text())
    assert manifest["diverged"] is True and manifest["finished"] is False and manifest["total_steps"] == total
    saved = read_checkpoint(out / "checkpoint.npz")
    step = saved["extra"]["train"]["step"]
    assert 0 < step < total and manifest["step"] == step
    for master in saved["optimizer"]["master"].values():
        assert np.isfinite(master).all()
    assert saved["scaler"]["scale"] > 0
    return step


def test_a_loss_scale_that_underflows_to_0_ends_in_one_sentence_exit_3_and_the_last_good_checkpoint(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    done = tinyamp("train", "--lr", "10", "--steps", "300", "--quiet", "--out", str(out))
    assert done.returncode == 3, done.stderr
    said = one_line(done.stderr, "tinyamp: the run diverged: ")
    assert "the loss scale underflowed to 0 at step" in said and "min_scale=1.0" in said  # the library's sentence
    step = assert_diverged_run_kept(out, 300)
    assert f"the checkpoint is of step {step}" in done.stdout
    # the kept state is one a run can continue from: it takes a step before the run diverges again, the same way
    again = tinyamp("train", "--resume", str(out / "checkpoint.npz"), "--quiet", "--out", str(tmp_path / "again"))
    assert again.returncode == 3, again.stderr
    assert one_line(again.stderr, "tinyamp: the run diverged: ").split(";")[0] == said.split(";")[0]


def test_a_run_that_skips_most_of_its_steps_says_so_and_exits_3() -> None:
    done = tinyamp("train", "--lr", "10", "--steps", "300", "--scaler", "static", "--quiet")
    assert done.returncode == 3, done.stderr
    said = one_line(done.stderr, "tinyamp: the run diverged: ")
    assert "297 of 300 steps were skipped for non-finite gradients, more than 50%: the run did not train" in said


def test_a_diverging_distributed_run_says_it_once_exits_3_on_every_rank_and_keeps_its_last_good_step(
    tmp_path: Path,
) -> None:
    needs_mpiexec()
    out = tmp_path / "run"
    done = tinyamp("train", "--distributed", "--lr", "10", "--steps", "300", "--quiet", "--out", str(out), ranks=2)
    assert done.returncode == 3, done.stderr
    assert "the loss scale underflowed to 0" in one_line(done.stderr, "tinyamp: the run diverged: ")
    assert_diverged_run_kept(out, 300)
