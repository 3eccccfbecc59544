"""Runs that end well: the real `tinyamp train` in a subprocess, at its edges.

Each test starts the command as a user would (ranks through ``mpiexec -n 2`` where the case
is a distributed one) and checks the exit status, the one sentence it prints, and that
nothing the run produced is lost.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_resume import assert_same  # checkpoint contents equal bit for bit

from tinyamp.amp.training_state import read_checkpoint

pytestmark = pytest.mark.cli

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 180  # a hung run fails its test, never CI


def environment(**extra: str) -> dict[str, str]:
    """The command's environment: this tinyamp, figures drawn off-screen, no BLAS setting of our own."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env.update({"PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1", **extra})
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


@pytest.mark.long_run
@pytest.mark.parametrize(
    "scaler, sentence",
    [
        ("deepspeed", "deepspeed: a step overflowed at loss scale 1, which is already min_scale=1, and "
                      "raise_error_at_min_scale=True ends the run here"),
        ("fairseq", "would be at or below min_loss_scale=0.0001: fairseq ends the run here ('Minimum loss scale "
                    "reached')"),
    ],
)  # fmt: skip
def test_a_hysteresis_scaler_at_its_floor_ends_the_run_with_its_sentence_and_exits_3(
    tmp_path: Path, scaler: str, sentence: str
) -> None:
    # lr 10 overflows at every step once the weights blow up: the scale backs off to the library's floor, which raises
    out = tmp_path / "run"
    done = tinyamp("train", "--lr", "10", "--steps", "300", "--scaler", scaler, "--quiet", "--out", str(out))
    assert done.returncode == 3, done.stderr
    said = one_line(done.stderr, "tinyamp: the run diverged: ")
    assert sentence in said
    step = assert_diverged_run_kept(out, 300)
    again = tinyamp("train", "--resume", str(out / "checkpoint.npz"), "--quiet", "--out", str(tmp_path / "again"))
    assert again.returncode == 3, again.stderr  # the checkpoint's HysteresisScaler resumes, and meets its floor again
    assert sentence in one_line(again.stderr, "tinyamp: the run diverged: ") and step > 0


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
def floor_peak(tmp_path_factory: pytest.TempPathFactory) -> int:
    """The peak RSS of the command refusing a file at its first byte: what any refusal costs before it reads."""
    not_a_zip = tmp_path_factory.mktemp("floor") / "checkpoint.npz"
    not_a_zip.write_text("not a checkpoint")
    done, peak = peak_rss_of("train", "--resume", str(not_a_zip), "--steps", "3", "--extend", "--quiet")
    assert done.returncode == 2, done.stderr
    return peak


@pytest.mark.parametrize("junk", JUNK, ids=list(JUNK))
def test_junk_in_the_metadata_is_refused_within_a_bounded_peak_memory(
    checkpoints: dict[str, Path], floor_peak: int, tmp_path: Path, junk: str
) -> None:
    """A refusal reads at most the metadata's text (and its decoded copy) and parses at most what json_cost
    allows: its peak, measured per process, stays within those bounds above the command's floor."""
    from tinyamp.amp.checkpoint_file import MAX_METADATA_BYTES, MAX_METADATA_OBJECT_BYTES

    real = checkpoints["mlp"]
    bad = edited(
        real, tmp_path / "junk.npz", lambda t: t.replace(b'"extra": {', b'"extra": {"junk": ' + JUNK[junk] + b", ", 1)
    )
    done, peak = peak_rss_of("train", "--resume", str(bad), "--steps", "3", "--extend", "--quiet")
    assert done.returncode == 2, done.stderr
    said = one_line(done.stderr, "tinyamp: error: --resume")
    assert str(bad) in said and ("'junk', which `tinyamp train` never writes" in said or "Python objects" in said)
    bound = 2 * MAX_METADATA_BYTES + MAX_METADATA_OBJECT_BYTES  # the text, its decoded copy, the parsed objects
    print(f"{junk}: refused at a peak RSS of {peak / 2**20:.0f} MiB; the command's floor is {floor_peak / 2**20:.0f}")
    assert peak - floor_peak <= bound


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


# ---- resume across processes --------------------------------------------------------------------------
def stopped_while_training(*args: str, signum: int = signal.SIGINT) -> subprocess.CompletedProcess[str]:
    """``python -m tinyamp args`` stopped by a real `signum` once its progress bar shows it training."""
    process, seen = started_training(*args)
    process.send_signal(signum)
    out, err = process.communicate(timeout=TIMEOUT_S)
    return subprocess.CompletedProcess(args, process.returncode, out.decode(), (seen + err).decode(errors="replace"))


def regime_of(out: Path) -> dict[str, Any]:
    return json.loads((out / "results.json").read_text())["tasks"]["mlp"]["regimes"]["mixed"]


@pytest.mark.long_run
def test_a_resumed_run_reports_the_whole_run_and_where_it_resumed(tmp_path: Path) -> None:
    steps = ["--steps", "800"]
    straight = tinyamp("train", *steps, "--quiet", "--out", str(tmp_path / "straight"))
    assert straight.returncode == 0, straight.stderr
    out = tmp_path / "run"
    stopped = stopped_while_training("train", *steps, "--out", str(out))
    assert stopped.returncode == 130, stopped.stderr
    at = json.loads((out / "tinyamp-run.json").read_text())["step"]
    assert 0 < at < 800
    again = tinyamp("train", "--resume", str(out / "checkpoint.npz"), "--quiet", "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert f"* the whole run, steps 0 to 800: resumed at step {at}" in again.stdout
    whole, resumed = regime_of(tmp_path / "straight"), regime_of(out)
    assert resumed["resumed_at"] == [at] and resumed["first_step"] == 0 and whole["resumed_at"] == []
    for key in ("series", "measured", "metrics", "skipped_steps", "underflow_fraction", "lost_update_fraction"):
        assert resumed[key] == whole[key], key  # bit for bit: the history travelled in the checkpoint


def test_a_distributed_run_resumed_by_the_command_it_prints_ends_bit_for_bit_without_pinning_blas_by_hand(
    tmp_path: Path,
) -> None:
    needs_mpiexec()
    assert not any(k.endswith("_NUM_THREADS") for k in environment())  # the command pins BLAS itself
    small = ["--batch-size", "64", "--steps", "6", "--quiet"]
    straight = tinyamp("train", "--distributed", *small, "--out", str(tmp_path / "straight"), ranks=2)
    assert straight.returncode == 0, straight.stderr
    out = tmp_path / "run"
    cmd = ["mpiexec", "-n", "2", sys.executable, "-m", "tinyamp.distributed", *small, "--out", str(out)]
    stopped = subprocess.run([*cmd, "--fault", "sigint@2:1"], cwd=ROOT, env=environment(), capture_output=True,
                             text=True, timeout=TIMEOUT_S)  # fmt: skip
    assert stopped.returncode == 130, stopped.stderr
    printed = stopped.stderr.strip().splitlines()[-1].split()  # "mpiexec -n 2 python -m tinyamp.distributed ..."
    assert printed[:5] == ["mpiexec", "-n", "2", "python", "-m"], printed
    again = subprocess.run(["mpiexec", "-n", "2", sys.executable, *printed[4:], "--quiet"],
                           cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=TIMEOUT_S)  # fmt: skip
    assert again.returncode == 0, again.stderr
    a, b = read_checkpoint(tmp_path / "straight" / "checkpoint.npz"), read_checkpoint(out / "checkpoint.npz")
    for part in ("model", "optimizer", "scaler"):
        assert_same(a[part], b[part], part)
    assert regime_of(out)["series"] == regime_of(tmp_path / "straight")["series"]


# ---- edges of the command --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--steps", str(2**70)], f"--steps must be a whole number from 1 to 100,000 (a checkpoint keeps the loss "
                                  f"scale of every step); got {2**70}"),
        (["--resume", "/dev/zero"], "--resume: /dev/zero is not a checkpoint: it is a device"),
        (["--resume", str(ROOT)], f"--resume: {ROOT} is not a checkpoint: it is a folder"),
    ],
    ids=["steps-2**70", "device", "folder"],
)  # fmt: skip
def test_values_that_would_run_forever_or_hang_are_refused_in_one_sentence(args: list[str], says: str) -> None:
    done = tinyamp("train", "--quiet", *args, timeout=60)
    assert done.returncode == 2, done.stderr
    assert says in one_line(done.stderr, "tinyamp: error: ") and done.stdout == ""


@pytest.mark.parametrize("steps", [-1, 10**12])
def test_a_demo_transformer_that_would_run_forever_is_refused_in_one_sentence(steps: int) -> None:
    done = tinyamp("demo", "--quiet", "--steps", "1", "--transformer-steps", str(steps), timeout=60)
    assert done.returncode == 2, done.stderr
    said = one_line(done.stderr, "tinyamp: error: ")
    assert said.endswith(f"--transformer-steps must be 0 (skip the transformer) or a whole number up to 100,000; "
                         f"got {steps}")  # fmt: skip


def test_a_fifo_given_to_resume_is_refused_without_being_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "checkpoint.npz"
    os.mkfifo(fifo)
    done = tinyamp("train", "--quiet", "--resume", str(fifo), timeout=60)  # opening it would block: the timeout fails
    assert done.returncode == 2, done.stderr
    assert f"--resume: {fifo} is not a checkpoint: it is a named pipe (FIFO)" in one_line(done.stderr, "tinyamp: ")


@pytest.mark.parametrize("ranks", [0, 2], ids=["one process", "mpiexec"])
def test_a_bogus_engine_room_setting_is_one_sentence_and_exit_2(ranks: int) -> None:
    if ranks:
        needs_mpiexec()
    cmd = [sys.executable, "-m", "tinyamp", "train", "--steps", "2", "--quiet"]
    cmd = ["mpiexec", "-n", str(ranks), *cmd] if ranks else cmd
    done = subprocess.run(cmd, cwd=ROOT, env=environment(TINYAMP_ENGINE_ROOM="bogus"), capture_output=True,
                          text=True, timeout=TIMEOUT_S)  # fmt: skip
    assert done.returncode == 2, done.stderr
    said = one_line(done.stderr, "tinyamp: error: ")
    assert "TINYAMP_ENGINE_ROOM='bogus' is neither on nor off" in said


def test_a_program_importing_tinyamp_with_a_bogus_engine_room_setting_gets_the_exception() -> None:
    script = "import tinyamp"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=environment(TINYAMP_ENGINE_ROOM="of"),
                          capture_output=True, text=True, timeout=TIMEOUT_S)  # fmt: skip
    assert done.returncode == 1
    assert "EngineRoomSettingError: TINYAMP_ENGINE_ROOM='of' is neither on nor off" in done.stderr


@pytest.mark.long_run
def test_a_checkpoint_moved_aside_by_a_run_killed_mid_swap_is_put_back_before_resume_reads_it(tmp_path: Path) -> None:
    run, newer = tmp_path / "run", tmp_path / "newer"
    assert tinyamp("train", "--steps", "4", "--quiet", "--out", str(run)).returncode == 0
    assert tinyamp("train", "--steps", "3", "--quiet", "--out", str(newer)).returncode == 0
    # SIGKILL between the swap's two renames: NAME moved aside, the new set not yet in its place
    run.rename(tmp_path / ".run.tinyamp-old-0a1b2c3d")
    newer.rename(tmp_path / ".run.tinyamp-new-4e5f6a7b")
    done = tinyamp("train", "--resume", str(run / "checkpoint.npz"), "--steps", "5", "--extend", "--quiet",
                   "--out", str(run))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "put back run, which a killed run had moved aside to .run.tinyamp-old-0a1b2c3d" in done.stderr
    assert "removed .run.tinyamp-new-4e5f6a7b, left by a run killed while writing" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert read_checkpoint(run / "checkpoint.npz")["extra"]["train"]["step"] == 5


def test_a_leftover_reported_removed_is_gone(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert tinyamp("train", "--steps", "2", "--quiet", "--out", str(run)).returncode == 0
    (tmp_path / ".run.tinyamp-old-0a1b2c3d").write_text("a file, not a folder")  # rmtree alone would not remove it
    done = tinyamp("train", "--steps", "2", "--quiet", "--out", str(run))
    assert done.returncode == 0, done.stderr
    assert "removed .run.tinyamp-old-0a1b2c3d, left by a run killed while writing" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.skipif(not os.path.ismount("/proc"), reason="needs /proc mounted")
def test_an_out_folder_that_cannot_be_renamed_is_refused_before_training() -> None:
    done = tinyamp("train", "--steps", "2", "--quiet", "--out", "/proc")
    assert done.returncode == 2 and done.stdout == ""
    assert "--out /proc: this is a mount point" in one_line(done.stderr, "tinyamp: error: ")


def started_training(*args: str) -> tuple[subprocess.Popen[bytes], bytes]:
    """``python -m tinyamp args`` started, returned once its progress bar shows it taking steps."""
    cmd = [sys.executable, "-m", "tinyamp", *args]
    process = subprocess.Popen(cmd, cwd=ROOT, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = b""
    while b"it/s" not in seen and b"s/it" not in seen:  # tqdm's rate: steps are being taken
        byte = process.stderr.read(1)  # type: ignore[union-attr]
        assert byte, seen.decode(errors="replace")
        seen += byte
    return process, seen


def test_a_second_run_on_the_same_out_folder_is_refused_naming_the_first(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first, _ = started_training("train", "--steps", "100000", "--out", str(out))
    try:
        second = tinyamp("train", "--steps", "2", "--quiet", "--out", str(out))
        assert second.returncode == 2 and second.stdout == ""
        said = one_line(second.stderr, "tinyamp: error: ")
        assert f"--out {out}: another tinyamp run is writing this folder (process {first.pid}: " in said
        assert "--steps 100000" in said
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=TIMEOUT_S)
    assert first.returncode == 130  # the first run saved where it stopped: nothing of it was lost
    assert 0 < read_checkpoint(out / "checkpoint.npz")["extra"]["train"]["step"] < 100_000
    again = tinyamp("train", "--steps", "2", "--quiet", "--out", str(out))  # the folder is free again
    assert again.returncode == 0, again.stderr


def numpy_loaded(pid: int) -> bool:
    """Whether process `pid` has mapped NumPy's compiled core (tinyamp imports it after its start-up handler)."""
    try:
        return "_multiarray_umath" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps (Linux)")
@pytest.mark.parametrize("after", [0.0, 0.03, 0.1])
def test_ctrl_c_while_the_command_starts_ends_quietly_with_130(after: float) -> None:
    """From `import tinyamp` on (NumPy loaded), a Ctrl-C during the imports is one line, not a traceback."""
    cmd = [sys.executable, "-m", "tinyamp", "train", "--steps", "100000", "--quiet"]  # still running at any delay
    process = subprocess.Popen(cmd, cwd=ROOT, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while not numpy_loaded(process.pid):
        assert process.poll() is None
        time.sleep(0.001)
    time.sleep(after)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=TIMEOUT_S)
    stderr = err.decode()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert "tinyamp: stopped by SIGINT" in stderr and "nothing was written" in stderr


def test_ctrl_c_pressed_again_and_again_says_truly_what_the_folder_holds(tmp_path: Path) -> None:
    """Ctrl-C every 20 ms until the run ends: a second one abandons the step or the save in progress, and the
    message names what the folder then holds (never "step None ... nothing was written" beside a checkpoint)."""
    out = tmp_path / "run"
    process, _ = started_training("train", "--steps", "100000", "--checkpoint-every", "1", "--out", str(out))
    while process.poll() is None:
        process.send_signal(signal.SIGINT)
        time.sleep(0.02)
    stderr = process.stderr.read().decode(errors="replace")  # type: ignore[union-attr]
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "None" not in stderr, stderr
    checkpoint = out / "checkpoint.npz"
    if not checkpoint.exists():
        assert f"{out} holds no checkpoint of this run" in stderr, stderr
        return
    step = read_checkpoint(checkpoint)["extra"]["train"]["step"]
    assert json.loads((out / "tinyamp-run.json").read_text())["step"] == step
    assert f"{checkpoint} holds step {step} of 100000" in stderr or f"at step {step} of 100000; wrote" in stderr


@pytest.mark.parametrize("stdout", ["/dev/full", "closed"])
def test_a_stdout_that_cannot_be_written_loses_no_file_and_says_so_on_stderr(tmp_path: Path, stdout: str) -> None:
    if stdout == "/dev/full" and not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "tinyamp", "train", "--steps", "20", "--quiet", "--out", str(out)]
    if stdout == "closed":
        done = subprocess.run(cmd, cwd=ROOT, env=environment(), stderr=subprocess.PIPE, text=True,
                              timeout=TIMEOUT_S, preexec_fn=lambda: os.close(1))  # fmt: skip
        why = "it is closed"
    else:
        with open(stdout, "w") as full:
            done = subprocess.run(cmd, cwd=ROOT, env=environment(), stdout=full, stderr=subprocess.PIPE, text=True,
                                  timeout=TIMEOUT_S)  # fmt: skip
        why = "No space left on device"
    assert done.returncode == 74, done.stderr
    said = one_line(done.stderr, "tinyamp: could not write to standard output")
    assert f"({why}): the printed results are lost; the run's files are in {out}" in said
    manifest = json.loads((out / "tinyamp-run.json").read_text())
    assert manifest["finished"] and "results.json" in manifest["files"]
    assert read_checkpoint(out / "checkpoint.npz")["extra"]["train"]["step"] == 20


@pytest.mark.parametrize("stdout", ["/dev/full", "closed", "a pipe nobody reads"])
@pytest.mark.parametrize(
    ("argv", "status"),
    [(["info"], 0), (["exercises", "list"], 0), (["exercises", "check", "{stubs}", "--only", "1.1"], 1),
     (["exercises", "check", "{solutions}", "--only", "1.2"], 0)],
    ids=["info", "exercises list", "check failed", "check passed"],
)  # fmt: skip
def test_every_command_whose_stdout_cannot_be_written_says_so_and_never_looks_passed(
    tmp_path: Path, stdout: str, argv: list[str], status: int
) -> None:
    """Closed, full, or a pipe whose reader left before the first line: one sentence and 74 in place of 0, never
    a traceback and never `exercises check`'s 0, its "every exercise passes"; the pipe alone is no error for a
    listing that was read in part (`tinyamp info | head`)."""
    from tinyamp.exercises.workspace import write_workspace

    if stdout == "/dev/full" and not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    write_workspace(tmp_path / "stubs")
    write_workspace(tmp_path / "solutions", solutions=True)
    cmd = [sys.executable, "-m", "tinyamp", *(a.format(stubs=tmp_path / "stubs", solutions=tmp_path / "solutions")
                                              for a in argv)]  # fmt: skip
    run = dict(cwd=ROOT, env=environment(), stderr=subprocess.PIPE, text=True, timeout=TIMEOUT_S)
    if stdout == "closed":
        done = subprocess.run(cmd, **run, preexec_fn=lambda: os.close(1))  # type: ignore[call-overload]
    elif stdout == "/dev/full":
        with open(stdout, "w") as full:
            done = subprocess.run(cmd, **run, stdout=full)  # type: ignore[call-overload]
    else:
        read, write = os.pipe()
        os.close(read)  # gone before the first line is written: every write fails with EPIPE
        try:
            done = subprocess.run(cmd, **run, stdout=write)  # type: ignore[call-overload]
        finally:
            os.close(write)
    if stdout == "a pipe nobody reads" and "check" not in argv:
        assert (done.returncode, done.stderr) == (0, "")
        return
    assert done.returncode == (status or 74), done.stderr
    why = {"closed": "it is closed", "/dev/full": "No space left on device"}.get(stdout, "Broken pipe")
    said = one_line(done.stderr, "tinyamp: ")
    assert said == f"tinyamp: could not write to standard output ({why}): the printed results are lost"


@pytest.mark.parametrize("which", [0, 1])
def test_a_rank_started_without_distributed_is_refused_with_the_others_at_once(which: int) -> None:
    needs_mpiexec()
    train = [sys.executable, "-m", "tinyamp", "train", "--steps", "3", "--quiet"]
    ranks = [train, [*train, "--distributed"]]
    ranks = ranks if which == 0 else ranks[::-1]
    cmd = ["mpiexec", "-n", "1", *ranks[0], ":", "-n", "1", *ranks[1]]
    began = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 2, done.stderr
    flags = "rank 0 False, rank 1 True" if which == 0 else "rank 0 True, rank 1 False"
    assert f"started with different settings (--distributed: {flags})" in one_line(done.stderr, "tinyamp: error: ")
    assert time.monotonic() - began < 60  # not the collective time-out (300 s): the check itself refused


def rank_processes(marker: str) -> list[int]:
    """The pids of the Python processes whose command line holds `marker` (the ranks of one job)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker.encode() in argv and any(b"python" in a for a in argv[:1]) and b"mpiexec" not in argv[0]:
                found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the ranks in /proc (Linux)")
def test_the_collective_time_out_is_an_option_and_a_stopped_rank_ends_the_job_after_it(tmp_path: Path) -> None:
    needs_mpiexec()
    out = tmp_path / "run"
    cmd = ["mpiexec", "-n", "2", sys.executable, "-m", "tinyamp", "train", "--distributed", "--timeout", "3",
           "--steps", "100000", "--checkpoint-every", "1", "--quiet", "--out", str(out)]  # fmt: skip
    job = subprocess.Popen(cmd, cwd=ROOT, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not (out / "tinyamp-run.json").exists():  # a first checkpoint: the ranks are training
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.05)
        ranks = rank_processes(str(out))
        assert len(ranks) == 2, ranks
        os.kill(max(ranks), signal.SIGSTOP)  # one rank stops answering, as a rank stuck in a debugger would
        stopped_at = time.monotonic()
        _, stderr = job.communicate(timeout=TIMEOUT_S)
        waited = time.monotonic() - stopped_at
    finally:
        for pid in rank_processes(str(out)):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        job.kill()
    assert job.returncode != 0
    assert "waited more than 3 s for the other ranks" in stderr, stderr[-2000:]
    assert waited < 60, waited  # 3 s and the abort, not the default 300 s


def test_the_time_out_is_checked_and_documented() -> None:
    needs_mpiexec()
    done = tinyamp("train", "--distributed", "--timeout", "-1", "--steps", "2", "--quiet", ranks=2)
    assert done.returncode == 2
    assert "--timeout must be a number of seconds > 0, e.g. --timeout 60; got -1.0" in one_line(
        done.stderr, "tinyamp: error: "
    )
    alone = tinyamp("train", "--timeout", "5", "--steps", "2", "--quiet")
    assert alone.returncode == 2 and "--timeout bounds the wait of a rank for the others; it needs --distributed" in (
        one_line(alone.stderr, "tinyamp: error: ")
    )
    helped = tinyamp("train", "--help")
    assert "--timeout SECONDS" in helped.stdout and "(default 300)" in helped.stdout
    from tinyamp.cli import DEFAULT_TIMEOUT_S
    from tinyamp.distributed.communicator import DEFAULT_TIMEOUT_S as USED

    assert DEFAULT_TIMEOUT_S == USED


# ---- the library's own API ---------------------------------------------------------------------------------
def _layers() -> Any:
    from tinyamp import nn

    return nn


@pytest.mark.parametrize(
    ("build", "error", "says"),
    [
        (lambda nn: nn.Linear(0, 3), ValueError, "Linear: in_features must be at least 1; got in_features=0. Pass"),
        (lambda nn: nn.Linear(-1, 3), ValueError, "Linear: in_features must be at least 1; got in_features=-1"),
        (lambda nn: nn.Linear(3, 0), ValueError, "Linear: out_features must be at least 1; got out_features=0"),
        (lambda nn: nn.Linear(2.5, 3), TypeError, "Linear: in_features is a number of features or rows, a whole "
                                                  "number; got 2.5 (float)"),
        (lambda nn: nn.Linear(3, 3, bias="no"), TypeError, "Linear: bias must be True or False; got 'no'"),
        (lambda nn: nn.Embedding(0, 8), ValueError, "Embedding: num_embeddings must be at least 1"),
        (lambda nn: nn.Embedding(8, 8, std=-1.0), ValueError, "Embedding: std must be a finite number >= 0"),
        (lambda nn: nn.LayerNorm(8, eps=0.0), ValueError, "LayerNorm: eps must be a finite number > 0; got eps=0.0"),
        (lambda nn: nn.LayerNorm("8"), TypeError, "LayerNorm: dim is a number of features or rows"),
        (lambda nn: nn.Dropout(1.0), ValueError, "Dropout: p must be a finite number in [0, 1); got p=1.0"),
        (lambda nn: nn.Dropout(float("nan")), ValueError, "Dropout: p must be a finite number in [0, 1)"),
        (lambda nn: nn.CausalSelfAttention(8, 0), ValueError, "CausalSelfAttention: heads must be at least 1"),
        (lambda nn: nn.MLP([4, 0, 3]), ValueError, "Linear: out_features must be at least 1"),
        (lambda nn: nn.ModuleList(3), TypeError, "ModuleList takes an iterable of Modules, e.g. ModuleList(["),
    ],
)  # fmt: skip
def test_a_constructor_given_a_bad_value_says_which_and_what_to_pass(build: Any, error: type, says: str) -> None:
    with pytest.raises(error) as info:
        build(_layers())
    assert says in str(info.value) and "\n" not in str(info.value)


def test_load_state_dict_with_a_missing_or_an_extra_key_names_them_and_the_fix() -> None:
    nn = _layers()
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    before = model.state_dict()
    short = dict(before)
    del short["2.bias"]
    with pytest.raises(ValueError) as info:
        model.load_state_dict({**short, "extra.weight": before["0.weight"]})
    message = str(info.value)
    assert "missing keys (in the model, not in the state_dict): 2.bias" in message
    assert "unexpected keys (in the state_dict, not in the model): extra.weight" in message
    assert "strict=False" in message and "state_dict() of a model built with the same layers" in message
    result = model.load_state_dict(short, strict=False)
    assert result.missing_keys == ["2.bias"]
    with pytest.raises(TypeError, match="load_state_dict takes a mapping of names to arrays"):
        model.load_state_dict([("0.weight", before["0.weight"])])  # type: ignore[arg-type]


NCCL_NEVER_STARTS = """
import sys, time, types
import cupy  # the strict stand-in, first on PYTHONPATH
import strict_cupy_plugin  # noqa: F401

distributed = types.ModuleType("cupyx.distributed")
distributed.init_process_group = lambda n, rank, **kw: time.sleep(3600)  # NCCL waiting for a rank that never joins
sys.modules["cupyx.distributed"] = distributed
cupy.cuda.runtime.getDeviceCount = lambda: 1
cupy.cuda.Device.use = lambda self: None
from tinyamp.distributed.__main__ import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.engine_room  # the CuPy stand-in swaps the engine room's GPU kernels
def test_an_nccl_set_up_that_never_ends_stops_the_job_after_the_time_out(tmp_path: Path) -> None:
    needs_mpiexec()
    script = tmp_path / "nccl_never_starts.py"
    script.write_text(NCCL_NEVER_STARTS)
    env = environment(PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "engine_room" / "strict_cupy"), str(ROOT)]))
    cmd = ["mpiexec", "-n", "2", sys.executable, str(script), "--device", "cuda", "--steps", "2", "--timeout", "3"]
    began = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode != 0
    assert "waited more than 3 s for NCCL to start (init_process_group)" in done.stderr, done.stderr[-2000:]
    assert time.monotonic() - began < 60  # the time-out and the abort, not an endless wait


def test_a_program_run_with_python_m_whose_package_imports_tinyamp_keeps_its_own_ctrl_c(tmp_path: Path) -> None:
    """The quiet start-up Ctrl-C is the command's alone: `python -m userpkg.run` keeps KeyboardInterrupt."""
    package = tmp_path / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text("import tinyamp\n")
    (package / "run.py").write_text(
        "import signal\nprint(signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    # SIGINT reset to its default in the child: a test run as a background job inherits it ignored, and Python then
    # leaves it ignored, whatever tinyamp does
    done = subprocess.run([sys.executable, "-m", "userpkg.run"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
