"""An output folder is written as a unit: the whole new set of files, or the folder as it was."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tinyamp.cli import main
from tinyamp.experiments import figures, results
from tinyamp.experiments.output_folder import MANIFEST, OutputFolder, OutputFolderError

pytestmark = pytest.mark.cli


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_the_manifest_lists_every_file_written(tmp_path: Path) -> None:
    assert main(["train", "--quiet", "--steps", "5", "--out", str(tmp_path / "run")]) == 0
    manifest = json.loads((tmp_path / "run" / MANIFEST).read_text())
    assert manifest["command"] == "train" and manifest["finished"] is True
    assert sorted([*manifest["files"], MANIFEST]) == sorted(contents(tmp_path / "run"))
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_a_failure_while_writing_leaves_the_old_set_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    assert main(["train", "--quiet", "--steps", "5", "--out", str(run)]) == 0
    before = contents(run)

    def disk_full(document: dict, folder: Path, name: str = "results.json") -> Path:
        (folder / name).write_text("{half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results, "write_json", disk_full)
    capsys.readouterr()
    assert main(["train", "--quiet", "--steps", "7", "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert str(run) in err and "No space left on device" in err and "left as it was" in err
    assert "checkpoint.npz" in err and "results.json" in err  # what the folder still holds
    assert contents(run) == before
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_a_failure_in_a_figure_leaves_the_old_set_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    assert main(["train", "--quiet", "--steps", "5", "--out", str(run)]) == 0
    before = contents(run)

    def broken(document: dict, folder: Path) -> list[Path]:
        (folder / "mlp_loss.png").write_bytes(b"\x89PNG half")
        raise RuntimeError("a bug in a figure")

    monkeypatch.setattr(figures, "matplotlib_available", lambda: True)
    monkeypatch.setattr(figures, "write_figures", broken)
    with pytest.raises(RuntimeError):
        main(["train", "--quiet", "--steps", "7", "--out", str(run)])
    assert contents(run) == before and [p.name for p in tmp_path.iterdir()] == ["run"]


def test_a_folder_with_files_tinyamp_did_not_write_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("my notes")
    assert main(["train", "--quiet", "--steps", "100000", "--out", str(tmp_path)]) == 2  # refused at once
    err = capsys.readouterr().err
    assert "notes.txt" in err and "tinyamp did not write" in err
    assert contents(tmp_path) == {"notes.txt": b"my notes"}


def test_a_demo_replaces_a_train_folder_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--quiet", "--steps", "5", "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert main(["demo", "--quiet", "--steps", "3", "--transformer-steps", "0", "--out", str(tmp_path / "run")]) == 0
    assert "holds an earlier `tinyamp train` run" in capsys.readouterr().out
    assert "checkpoint.npz" not in contents(tmp_path / "run")  # the train run's file is not left beside the demo's
    assert json.loads((tmp_path / "run" / MANIFEST).read_text())["command"] == "demo"


def test_the_current_folder_is_never_an_output_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for out in (".", str(tmp_path.parent)):
        assert main(["train", "--quiet", "--out", out]) == 2
        assert "contains the current directory" in capsys.readouterr().err


# ---- leftovers of killed runs -----------------------------------------------------------------------------
def test_leftovers_of_a_killed_run_are_cleaned_and_reported(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / MANIFEST).write_text(json.dumps({"command": "train", "files": ["results.json"]}))
    (run / "results.json").write_text("{}")
    (tmp_path / ".run.tinyamp-new-0a1b2c3d").mkdir()  # killed while writing the new set
    (run / ".tinyamp-partial-x1y2").mkdir()  # an older tinyamp's temporary folder
    done = OutputFolder(run).recover()
    assert len(done) == 2 and all("killed" in sentence for sentence in done)
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
    assert sorted(contents(run)) == sorted([MANIFEST, "results.json"])


def test_a_run_killed_between_the_two_renames_gets_its_folder_back(tmp_path: Path) -> None:
    old = tmp_path / ".run.tinyamp-old-00112233"
    old.mkdir()
    (old / "results.json").write_text("{}")
    (old / MANIFEST).write_text(json.dumps({"command": "train", "files": ["results.json"]}))
    (tmp_path / ".run.tinyamp-new-44556677").mkdir()
    done = OutputFolder(tmp_path / "run").recover()
    assert any("put back run" in sentence for sentence in done)
    assert [p.name for p in tmp_path.iterdir()] == ["run"] and (tmp_path / "run" / "results.json").exists()


SLOW_WRITER = textwrap.dedent(
    """
    import sys, time
    from tinyamp.experiments import results
    write_json = results.write_json
    def slow(document, folder, name="results.json"):
        path = write_json(document, folder, name)
        print("writing", flush=True)
        time.sleep(float(sys.argv[2]))
        return path
    results.write_json = slow
    from tinyamp.cli import main
    sys.exit(main(["train", "--quiet", "--steps", "5", "--out", sys.argv[1]]))
    """
)


def _writer(out: Path, sleep: float) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(out), str(sleep)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert process.stdout is not None
    for line in process.stdout:  # wait until it is in the write phase
        if line.startswith("writing"):
            return process
    raise AssertionError(process.communicate())


def test_sigkill_while_writing_leaves_the_old_set_and_the_next_run_cleans_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    assert main(["train", "--quiet", "--steps", "3", "--out", str(run)]) == 0
    before = contents(run)
    process = _writer(run, sleep=60)
    process.kill()  # SIGKILL: no handler runs
    process.communicate(timeout=60)
    assert contents(run) == before
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "run"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".run.tinyamp-new-")
    capsys.readouterr()
    assert main(["train", "--quiet", "--steps", "3", "--out", str(run)]) == 0
    assert f"removed {leftovers[0]}, left by a run killed while writing" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_sigterm_while_writing_finishes_the_write_then_stops(tmp_path: Path) -> None:
    run = tmp_path / "run"
    process = _writer(run, sleep=1.0)
    time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 143, err
    assert "SIGTERM arrived after the last step; the finished run was written" in err
    manifest = json.loads((run / MANIFEST).read_text())
    assert manifest["finished"] and sorted([*manifest["files"], MANIFEST]) == sorted(contents(run))
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_an_output_folder_error_is_an_os_error_that_names_the_folder(tmp_path: Path) -> None:
    a_file = tmp_path / "f"
    a_file.write_text("")
    with pytest.raises(OutputFolderError, match=str(a_file)):
        OutputFolder(a_file).check()
