"""Runs that survive: stopped by a real signal, resumed, and ending bit for bit where a straight run ends.

The in-process tests deliver a real SIGINT or SIGTERM to this process in the middle of a
chosen step (from inside the learning-rate schedule, which every step calls), so the
handler, the step boundary and the checkpoint are the ones a user's Ctrl-C meets.  The
subprocess tests stop a separate `python -m tinyamp train` at whatever step it reached.
"""

from __future__ import annotations

import copy
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tinyamp.amp.training_state import read_checkpoint, save_checkpoint
from tinyamp.cli import main
from tinyamp.experiments import tasks
from tinyamp.experiments.output_folder import MANIFEST

pytestmark = pytest.mark.checkpoints


@pytest.fixture(autouse=True)
def no_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """Figures are not what these tests are about, and drawing them takes most of a short run's time."""
    monkeypatch.setattr("tinyamp.experiments.figures.matplotlib_available", lambda: False)


def assert_same(a: Any, b: Any, where: str = "") -> None:
    """Two checkpoint contents equal bit for bit (arrays by their bytes, NaN included)."""
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, where
        assert a.tobytes() == b.tobytes(), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}/{i}")
    else:
        assert a == b or (a != a and b != b), f"{where}: {a!r} != {b!r}"


def assert_same_run(straight: dict[str, Any], resumed: dict[str, Any], resumed_at: list[int]) -> None:
    """A resumed run's checkpoint is the straight run's, bit for bit, except that its history says where it resumed."""
    assert straight["extra"]["history"].pop("resumed_at") == []
    assert resumed["extra"]["history"].pop("resumed_at") == resumed_at
    assert_same(straight, resumed)


def signal_during_step(monkeypatch: pytest.MonkeyPatch, task: type, step: int, signum: int) -> None:
    """Deliver `signum` to this process while step `step` runs (its learning rate is being looked up)."""
    lr_at = task.lr_at

    def lr_at_with_signal(self: Any, s: int, steps: int) -> float:
        if s == step:
            signal.raise_signal(signum)
        return lr_at(self, s, steps)

    monkeypatch.setattr(task, "lr_at", lr_at_with_signal)


@pytest.mark.parametrize("schedule", ["cosine", "constant"])
@pytest.mark.parametrize(
    ("precision", "stop_at", "signum"),
    [
        ("fp32", 7, signal.SIGINT),
        ("fp16", 13, signal.SIGTERM),
        ("fp16-master", 1, signal.SIGINT),
        ("mixed", 0, signal.SIGTERM),
        ("mixed", 22, signal.SIGINT),
        ("bf16-mixed", 18, signal.SIGTERM),
    ],
)
def test_a_run_stopped_by_a_signal_and_resumed_ends_bit_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    precision: str, stop_at: int, signum: int, schedule: str,
) -> None:  # fmt: skip
    if precision == "bf16-mixed":
        pytest.importorskip("ml_dtypes")
    common = ["train", "--quiet", "--precision", precision, "--schedule", schedule, "--steps", "25"]
    assert main([*common, "--out", str(tmp_path / "straight")]) == 0
    with monkeypatch.context() as m:
        signal_during_step(m, tasks.DigitsMLP, stop_at, signum)
        assert main([*common, "--out", str(tmp_path / "run"), "--checkpoint-every", "10"]) == 128 + signum
    err = capsys.readouterr().err
    name = signal.Signals(signum).name
    assert f"stopped by {name} at step {stop_at + 1} of 25" in err  # the step it was in was finished
    assert f"tinyamp train --resume {tmp_path / 'run' / 'checkpoint.npz'}" in err
    saved = read_checkpoint(tmp_path / "run" / "checkpoint.npz")["extra"]["train"]
    assert (saved["step"], saved["total_steps"]) == (stop_at + 1, 25)
    assert json.loads((tmp_path / "run" / MANIFEST).read_text())["files"] == ["checkpoint.npz"]
    resume = ["train", "--quiet", "--resume", str(tmp_path / "run" / "checkpoint.npz")]
    assert main([*resume, "--out", str(tmp_path / "run")]) == 0
    straight, resumed = (read_checkpoint(tmp_path / d / "checkpoint.npz") for d in ("straight", "run"))
    assert_same_run(straight, resumed, [stop_at + 1])


def test_the_transformer_resumes_bit_identical_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["train", "--quiet", "--model", "transformer", "--steps", "6"]
    assert main([*common, "--out", str(tmp_path / "straight")]) == 0
    with monkeypatch.context() as m:
        signal_during_step(m, tasks.CharTransformer, 2, signal.SIGINT)
        assert main([*common, "--out", str(tmp_path / "run")]) == 130
    assert main(["train", "--quiet", "--resume", str(tmp_path / "run" / "checkpoint.npz"), "--out",
                 str(tmp_path / "run")]) == 0  # fmt: skip
    assert_same_run(*(read_checkpoint(tmp_path / d / "checkpoint.npz") for d in ("straight", "run")), [3])


def test_periodic_checkpoints_hold_the_run_so_far(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps_saved = []
    real = save_checkpoint

    def spy(path: Any, model: Any, optimizer: Any, scaler: Any = None, extra: Any = None) -> None:
        steps_saved.append(extra["train"]["step"])
        real(path, model, optimizer, scaler, extra)

    monkeypatch.setattr("tinyamp.amp.save_checkpoint", spy)
    assert main(["train", "--quiet", "--steps", "25", "--checkpoint-every", "10", "--out", str(tmp_path)]) == 0
    assert steps_saved == [10, 20, 25]
    steps_saved.clear()
    assert main(["train", "--quiet", "--steps", "25", "--checkpoint-every", "0", "--out", str(tmp_path)]) == 0
    assert steps_saved == [25]


# ---- a separate process, stopped for real --------------------------------------------------------------
def _start(out: Path, *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tinyamp", "train", "--quiet", "--steps", "1500", "--checkpoint-every", "20",
               "--out", str(out), *args]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, process: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def straight_1500(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("straight") / "run"
    assert main(["train", "--quiet", "--steps", "1500", "--precision", "mixed", "--out", str(out)]) == 0
    return read_checkpoint(out / "checkpoint.npz")


@pytest.mark.long_run
@pytest.mark.parametrize(("signum", "delay"), [(signal.SIGINT, 0.0), (signal.SIGTERM, 0.4), (signal.SIGINT, 0.8)])
def test_a_process_stopped_anywhere_resumes_to_the_straight_runs_weights(
    tmp_path: Path, signum: int, delay: float, straight_1500: dict[str, Any]
) -> None:
    run = tmp_path / "run"
    process = _start(run, "--precision", "mixed")
    _wait_for(run / "checkpoint.npz", process)
    time.sleep(delay)
    process.send_signal(signum)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, err
    assert "Traceback" not in err and "RuntimeWarning" not in err
    step = read_checkpoint(run / "checkpoint.npz")["extra"]["train"]["step"]
    assert 20 <= step < 1500 and f"at step {step} of 1500" in err
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no hidden leftovers beside it
    # finish it (to 1500) here, and compare with the straight run
    assert main(["train", "--quiet", "--resume", str(run / "checkpoint.npz"), "--out", str(run)]) == 0
    assert_same_run(copy.deepcopy(straight_1500), read_checkpoint(run / "checkpoint.npz"), [step])


# ---- the schedule belongs to the run: changing its length is asked for, and said -----------------------
def test_a_finished_run_is_extended_only_when_asked_and_the_change_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "--quiet", "--steps", "30", "--out", str(tmp_path / "a")]) == 0
    checkpoint = str(tmp_path / "a" / "checkpoint.npz")
    capsys.readouterr()
    assert main(["train", "--resume", checkpoint]) == 2
    assert "finished (30 of 30 steps)" in capsys.readouterr().err
    assert main(["train", "--resume", checkpoint, "--steps", "60"]) == 2
    err = capsys.readouterr().err
    lr_then, lr_now = tasks.DigitsMLP().lr_at(30, 30), tasks.DigitsMLP().lr_at(30, 60)
    assert "--extend" in err and f"becomes {lr_now:.3g}" in err and f"gives {lr_then:.3g}" in err
    assert main(["train", "--quiet", "--resume", checkpoint, "--steps", "60", "--extend"]) == 0
    assert "differs from a straight 60-step run" in capsys.readouterr().out


def test_an_unfinished_run_keeps_its_total_unless_extended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with monkeypatch.context() as m:
        signal_during_step(m, tasks.DigitsMLP, 4, signal.SIGINT)
        assert main(["train", "--quiet", "--steps", "30", "--out", str(tmp_path)]) == 130
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "checkpoint.npz"), "--steps", "50"]) == 2
    assert "differs from the checkpoint's total of 30 steps" in capsys.readouterr().err
    assert main(["train", "--extend", "--steps", "50"]) == 2
    assert "needs --resume" in capsys.readouterr().err


# ---- what a checkpoint stores is checked like the command line ------------------------------------------
@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("step", -3, "setting step must be a whole number of at least 0; got -3"),
        ("step", 99, "trained 99 of 30 steps"),
        ("schedule", "linear", "setting schedule must be one of cosine, constant; got 'linear'"),
        ("precision", "fp64", "setting precision must be one of"),
        ("lr", float("nan"), "setting lr must be a finite number greater than 0"),
        ("lr", "0.05", "setting lr must be a finite number greater than 0; got '0.05'"),
        ("batch_size", 0, "setting batch_size must be a whole number of at least 1"),
        ("seed", None, "setting seed must be between 0 and 2^63-1"),
        ("model", None, "setting model must be one of mlp, transformer"),
        ("total_steps", True, "setting total_steps must be a whole number"),
    ],
)
def test_an_edited_setting_in_a_checkpoint_is_refused_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: Any, said: str
) -> None:
    assert main(["train", "--quiet", "--steps", "30", "--out", str(tmp_path / "a")]) == 0
    edited = tmp_path / "edited.npz"
    _rewrite_settings(tmp_path / "a" / "checkpoint.npz", edited, {key: value})
    capsys.readouterr()
    assert main(["train", "--quiet", "--resume", str(edited), "--steps", "40", "--extend"]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and str(edited) in err and len(err.splitlines()) == 1, err


def test_a_checkpoint_missing_a_setting_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--quiet", "--steps", "5", "--out", str(tmp_path / "a")]) == 0
    edited = tmp_path / "edited.npz"
    _rewrite_settings(tmp_path / "a" / "checkpoint.npz", edited, {"seed": ...})
    assert main(["train", "--quiet", "--resume", str(edited)]) == 2
    assert "does not store the setting seed" in capsys.readouterr().err


def test_a_crafted_checkpoint_gets_exit_2_and_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--quiet", "--steps", "5", "--out", str(tmp_path / "a")]) == 0
    import tinyamp.amp.training_state as training_state

    content = read_checkpoint(tmp_path / "a" / "checkpoint.npz")
    master = next(iter(content["optimizer"]["master"].values()))
    master.flat[3] = np.nan  # a NaN master would train to NaN
    arrays: dict[str, np.ndarray] = {}
    document = training_state._encode(content, "", arrays)
    arrays[training_state.METADATA_KEY] = np.frombuffer(json.dumps(document).encode(), dtype=np.uint8)
    crafted = tmp_path / "crafted.npz"
    with open(crafted, "wb") as f:
        np.savez(f, **arrays)
    capsys.readouterr()
    assert main(["train", "--quiet", "--resume", str(crafted), "--steps", "9", "--extend"]) == 2
    err = capsys.readouterr().err.strip()
    assert str(crafted) in err and "non-finite" in err and len(err.splitlines()) == 1, err


def _rewrite_settings(source: Path, target: Path, changes: dict[str, Any]) -> None:
    """A copy of `source` whose stored settings have `changes` (Ellipsis: the key removed)."""
    import tinyamp.amp.training_state as training_state

    content = read_checkpoint(source)
    settings = dict(content["extra"]["train"])
    for k, v in changes.items():
        if v is ...:
            settings.pop(k)
        else:
            settings[k] = v
    content["extra"] = {"train": settings}
    arrays: dict[str, np.ndarray] = {}
    document = training_state._encode(content, "", arrays)
    arrays[training_state.METADATA_KEY] = np.frombuffer(json.dumps(document).encode(), dtype=np.uint8)
    with open(target, "wb") as f:
        np.savez(f, **arrays)


# ---- bad input on the command line ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--lr", "inf"], "--lr must be a finite number greater than 0; got inf"),
        (["--lr", "nan"], "--lr must be a finite number greater than 0; got nan"),
        (["--seed", "-1"], "--seed must be between 0 and 2^63-1; got -1"),
        (["--batch-size", "1000000"], "--batch-size 1000000 is more than the 1,438 training images"),
        (["--out", ""], "--out needs a folder name"),
        (["--resume", ""], "--resume needs the path of a checkpoint"),
        (["--checkpoint-every", "10"], "--checkpoint-every writes into the output folder; it needs --out DIR"),
        (["--checkpoint-every", "-1", "--out", "x"], "--checkpoint-every must be a whole number of at least 0"),
    ],
)
def test_bad_command_line_values_exit_2_with_one_sentence(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "--quiet", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1, err


def test_a_diverging_run_says_when_and_why_and_exits_3(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tinyamp", "train", "--quiet", "--steps", "20", "--lr", "1e30", "--out",
         str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "the run diverged" in done.stderr and "weights are inf or NaN" in done.stderr
    assert "the loss is first nan at step 1" in done.stderr
    assert "RuntimeWarning" not in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "checkpoint.npz").exists() and (tmp_path / "run" / "results.json").exists()


def test_version_and_every_option_documented(capsys: pytest.CaptureFixture[str]) -> None:
    import tinyamp
    from tinyamp.cli import build_parser

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"tinyamp {tinyamp.__version__}"
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for name in ("demo", "train"):
        for action in commands[name]._actions:
            assert action.help, f"{name} {action.option_strings} has no help text"


def test_the_signal_handlers_are_restored_after_a_command() -> None:
    # a later Ctrl-C in the same process (a notebook, a test runner) behaves as before the command
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert main(["train", "--quiet", "--steps", "2"]) == 0
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_one_process_and_n_ranks_refuse_a_resume_in_the_same_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tinyamp train` and `tinyamp distributed` read --resume with one function (experiments/resume.py)."""
    from tinyamp.distributed.train import DistributedUsageError, _resume_settings
    from tinyamp.experiments.resume import KEPT

    assert main(["train", "--quiet", "--steps", "2", "--out", str(tmp_path / "run")]) == 0
    checkpoint = str(tmp_path / "run" / "checkpoint.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a checkpoint")
    cases = [(checkpoint, {"lr": 0.5}), (str(tmp_path / "missing.npz"), {}), (str(tmp_path / "junk.npz"), {})]
    for path, given in cases:
        capsys.readouterr()
        lr = ["--lr", str(given["lr"])] if "lr" in given else []
        assert main(["train", "--quiet", "--resume", path, *lr]) == 2
        single = capsys.readouterr().err.strip().removeprefix("tinyamp: ").removeprefix("error: ")
        with pytest.raises(DistributedUsageError) as refused:
            _resume_settings({"resume": path, **dict.fromkeys(KEPT), **given})
        assert str(refused.value) == single and single.startswith(("--resume", "--lr"))


@pytest.mark.parametrize("kind", ["loop", "dangling"])
def test_a_resume_through_a_symbolic_link_to_nothing_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    link = tmp_path / "checkpoint.npz"
    if kind == "loop":
        (tmp_path / "other.npz").symlink_to(link)
        link.symlink_to(tmp_path / "other.npz")
    else:
        link.symlink_to(tmp_path / "gone.npz")
    assert main(["train", "--quiet", "--resume", str(link)]) == 2
    assert f"--resume: no checkpoint at {link}: it is a symbolic link that leads to no file" in capsys.readouterr().err
