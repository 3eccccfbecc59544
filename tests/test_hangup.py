"""SIGHUP (the terminal closed, the ssh session dropped) stops a run as Ctrl-C and SIGTERM do: at the end of
the step, with a checkpoint, status 129.  It used to end the process at once with nothing saved.  Under
nohup (SIGHUP ignored) the run was asked to outlive its terminal, and it does.  Each case is a real run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cli, pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on Windows")]

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120


def hangup_as_a_terminal_delivers_it() -> None:
    """In the child: SIGHUP's default action, whatever this test process inherited.  A suite run under
    nohup ignores SIGHUP, every child would inherit that, and the run would rightly outlive it."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def start(out: Path, ignore_hangup: bool = False) -> subprocess.Popen[str]:
    """A long `tinyamp train` saving a checkpoint every step; returns once its first checkpoint is written."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg", OPENBLAS_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "tinyamp", "train", "--steps", "100000", "--quiet", "--out", str(out),
           "--checkpoint-every", "1"]  # fmt: skip

    def nohup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    job = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=nohup if ignore_hangup else hangup_as_a_terminal_delivers_it)  # fmt: skip
    deadline = time.monotonic() + TIMEOUT_S
    while not (out / "tinyamp-run.json").exists():
        if job.poll() is not None or time.monotonic() > deadline:
            job.kill()
            pytest.fail(f"the run ended or never started training: {job.communicate()}")
        time.sleep(0.05)
    return job


def saved_step(out: Path) -> int:
    return json.loads((out / "tinyamp-run.json").read_text())["step"]


def test_sighup_saves_a_checkpoint_at_the_end_of_the_step_and_exits_129(tmp_path: Path) -> None:
    out = tmp_path / "run"
    job = start(out)
    job.send_signal(signal.SIGHUP)
    _, stderr = job.communicate(timeout=TIMEOUT_S)
    assert job.returncode == 129, stderr
    assert "Traceback" not in stderr
    step = saved_step(out)
    checkpoint = out / "checkpoint.npz"
    assert f"tinyamp: stopped by SIGHUP at step {step} of 100000; wrote {checkpoint}. Continue with:" in stderr
    assert f"tinyamp train --resume {checkpoint} --out {out}" in stderr


def test_under_nohup_sighup_changes_nothing_and_the_run_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "run"
    job = start(out, ignore_hangup=True)
    try:
        job.send_signal(signal.SIGHUP)
        before = saved_step(out)
        deadline = time.monotonic() + 30
        while saved_step(out) < before + 5:  # still training, checkpoint after checkpoint
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "the run stopped training after SIGHUP"
            time.sleep(0.05)
    finally:
        job.send_signal(signal.SIGTERM)
        _, stderr = job.communicate(timeout=TIMEOUT_S)
    assert job.returncode == 143 and "stopped by SIGTERM" in stderr, stderr


def test_sighup_on_one_rank_stops_every_rank_after_the_same_step_with_a_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("mpi4py", reason="tinyamp.distributed needs mpi4py: pip install -e '.[mpi]'")
    if shutil.which("mpiexec") is None:
        pytest.skip("no mpiexec on PATH (pip install mpich)")
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg", OPENBLAS_NUM_THREADS="1")
    cmd = ["mpiexec", "-n", "2", sys.executable, "-m", "tinyamp.distributed", "--model", "mlp", "--batch-size", "64",
           "--quiet", "--steps", "6", "--out", str(out), "--fault", "sighup@2:1"]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                          preexec_fn=hangup_as_a_terminal_delivers_it)  # fmt: skip
    assert done.returncode == 129, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"stopped by SIGHUP at step 3 of 6 on every rank; wrote {out / 'checkpoint.npz'}" in done.stderr
    assert saved_step(out) == 3
