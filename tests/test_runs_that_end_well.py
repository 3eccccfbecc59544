"""Runs that end well: the real `tinyamp train` in a subprocess, at its edges.

Each test starts the command as a user would (ranks through ``mpiexec -n 2`` where the case
is a distributed one) and checks the exit status, the one sentence it prints, and that
nothing the run produced is lost.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


# ---- what a checkpoint carries --------------------------------------------------------------------------
METADATA = "tinyamp_checkpoint.npy"


def npy(value: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, value, allow_pickle=False)
    return buffer.getvalue()


def edited(src: Path, dst: Path, text: Callable[[bytes], bytes] = lambda t: t, **arrays: np.ndarray) -> Path:
    """A copy of checkpoint `src` with its metadata's JSON text rewritten by `text`, and entries replaced
    (keyword "a__b" is the entry "a/b.npy")."""
    with zipfile.ZipFile(src) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    old = np.load(io.BytesIO(entries[METADATA])).tobytes()
    entries[METADATA] = npy(np.frombuffer(text(old), dtype=np.uint8))
    for key, value in arrays.items():
        name = key.replace("__", "/") + ".npy"
        assert name in entries, name
        entries[name] = npy(value)
    with zipfile.ZipFile(dst, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return dst


def json_edit(change: Callable[[dict[str, Any]], None]) -> Callable[[bytes], bytes]:
    def text(old: bytes) -> bytes:
        document = json.loads(old)
        change(document)
        return json.dumps(document).encode()

    return text


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Checkpoints of two real 2-step runs: the MLP (SGD with momentum) and the transformer (Adam)."""
    folder = tmp_path_factory.mktemp("checkpoints")
    found = {}
    for model in ("mlp", "transformer"):
        done = tinyamp("train", "--model", model, "--steps", "2", "--quiet", "--out", str(folder / model))
        assert done.returncode == 0, done.stderr
        found[model] = folder / model / "checkpoint.npz"
    return found


def step_count(value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["optimizer"]["optimizer"].__setitem__("step_count", value)


def adam_step(value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["optimizer"]["optimizer"]["state"][0].__setitem__("step", value)


EDITED_STATE = [
    ("mlp", json_edit(step_count("abc")), {}, "the state_dict's step_count is 'abc'; it counts steps"),
    ("mlp", json_edit(step_count(-3)), {}, "the state_dict's step_count is -3; it counts steps"),
    ("transformer", json_edit(adam_step(-1)), {}, "state 'step' of parameter tok_emb.weight is -1"),
    ("transformer", json_edit(adam_step(1.5)), {}, "state 'step' of parameter tok_emb.weight is 1.5"),
    ("mlp", lambda t: t, {"optimizer__optimizer__state__0__momentum_buffer": np.full((256, 64), np.nan, np.float32)},
     "state 'momentum_buffer' of parameter 0.weight holds 16,384 NaN or inf values"),
]  # fmt: skip


@pytest.mark.parametrize(("model", "text", "arrays", "says"), EDITED_STATE, ids=["abc", "-3", "t-1", "t1.5", "nan"])
def test_edited_optimizer_state_is_refused_in_one_sentence_with_exit_2(
    checkpoints: dict[str, Path], tmp_path: Path, model: str, text: Any, arrays: Any, says: str
) -> None:
    bad = edited(checkpoints[model], tmp_path / "bad.npz", text, **arrays)
    done = tinyamp("train", "--resume", str(bad), "--steps", "3", "--extend", "--quiet")
    assert done.returncode == 2, done.stderr
    said = one_line(done.stderr, "tinyamp: error: --resume: ")
    assert says in said and str(bad) in said and done.stdout == ""


def peak_rss_of(*args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run ``python -m tinyamp args`` as the only child of a fresh process; return it and its peak RSS in bytes."""
    measure = (
        "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); print(done.stderr, end='')"
    )
    cmd = [sys.executable, "-c", measure, sys.executable, "-m", "tinyamp", *args]
    run = subprocess.run(cmd, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=TIMEOUT_S)
    first, _, stderr = run.stdout.partition("\n")
    status, kib = map(int, first.split())
    return subprocess.CompletedProcess(args, status, "", stderr), kib * 1024  # ru_maxrss is in KiB on Linux


JUNK = {  # about 15 MiB of JSON text each, the shapes that cost json.loads most and least per byte
    "dicts": b"[" + b"{}," * (5 * 2**20) + b"{}]",
    "string": b'"' + b"x" * (15 * 2**20) + b'"',
    "numbers": b"[" + b"0.5," * (4 * 2**20) + b"0]",
    "under the bound": b"[" + b"{}," * 200_000 + b"{}]",
}


@pytest.fixture(scope="module")
def real_peak(checkpoints: dict[str, Path]) -> int:
    """The peak RSS of resuming the real MLP checkpoint for one more step."""
    done, peak = peak_rss_of("train", "--resume", str(checkpoints["mlp"]), "--steps", "3", "--extend", "--quiet")
    assert done.returncode == 0, done.stderr
    return peak


@pytest.mark.parametrize("junk", JUNK, ids=list(JUNK))
def test_junk_in_the_metadata_is_refused_before_it_costs_more_memory_than_a_real_resume(
    checkpoints: dict[str, Path], real_peak: int, tmp_path: Path, junk: str
) -> None:
    real = checkpoints["mlp"]
    bad = edited(
        real, tmp_path / "junk.npz", lambda t: t.replace(b'"extra": {', b'"extra": {"junk": ' + JUNK[junk] + b", ", 1)
    )
    done, peak = peak_rss_of("train", "--resume", str(bad), "--steps", "3", "--extend", "--quiet")
    assert done.returncode == 2, done.stderr
    said = one_line(done.stderr, "tinyamp: error: --resume")
    assert str(bad) in said and ("'junk', which `tinyamp train` never writes" in said or "Python objects" in said)
    print(
        f"{junk}: refused at a peak RSS of {peak / 2**20:.0f} MiB; a real resume peaks at {real_peak / 2**20:.0f} MiB"
    )
    assert peak < real_peak


def test_a_section_save_checkpoint_never_writes_is_refused(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    bad = edited(checkpoints["mlp"], tmp_path / "bad.npz", json_edit(lambda d: d.__setitem__("notes", "hello")))
    done = tinyamp("train", "--resume", str(bad), "--steps", "3", "--extend", "--quiet")
    assert done.returncode == 2
    assert "its metadata has the section 'notes', which save_checkpoint never writes" in one_line(
        done.stderr, "tinyamp: error: --resume"
    )


@pytest.mark.parametrize("case", [0, 2, 4], ids=["abc", "t-1", "nan"])
def test_a_bad_checkpoint_under_mpiexec_is_refused_once_with_exit_2_on_every_rank(
    checkpoints: dict[str, Path], tmp_path: Path, case: int
) -> None:
    needs_mpiexec()
    model, text, arrays, says = EDITED_STATE[case]
    bad = edited(checkpoints[model], tmp_path / "bad.npz", text, **arrays)
    done = tinyamp("train", "--distributed", "--resume", str(bad), "--steps", "4", "--extend", "--quiet", ranks=2)
    assert done.returncode == 2, done.stderr
    assert says in one_line(done.stderr, "tinyamp: error: --resume: ")
    assert "Abort" not in done.stderr and "Abort" not in done.stdout
