"""The flags and files of `tinyamp exercises check`, tried for real in a subprocess: a --results path that
is a device or a pipe, limits far out of range, --results without the format that writes it, and help
printed into a full disk."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tinyamp.exercises.workspace import write_workspace

pytestmark = pytest.mark.cli

ROOT = Path(__file__).resolve().parents[1]


def tinyamp(*argv: str, timeout: float = 120, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """`python -m tinyamp ...` from this checkout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if "stdout" not in kwargs:
        kwargs["capture_output"] = True
    return subprocess.run([sys.executable, "-m", "tinyamp", *argv], text=True, timeout=timeout, cwd=ROOT, env=env,
                          **kwargs)  # type: ignore[call-overload]  # fmt: skip


def one_error(done: subprocess.CompletedProcess[str]) -> str:
    """The one line of a refusal (exit status 2, nothing on stdout, no traceback)."""
    assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    write_workspace(tmp_path / "ws")
    return tmp_path / "ws"


def test_the_child_process_imports_this_checkout() -> None:
    done = tinyamp("info", timeout=120)
    assert done.returncode == 0 and f"tinyamp     {__import__('tinyamp').__version__}" in done.stdout
    found = subprocess.run([sys.executable, "-c", "import tinyamp; print(tinyamp.__file__)"], capture_output=True,
                           text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd="/", timeout=60)  # fmt: skip
    assert Path(found.stdout.strip()).parent == ROOT / "tinyamp"


# ---- --results: a new path or a regular file, nothing else -----------------------------------------------
def test_results_is_never_written_over_a_fifo_or_through_a_link_to_a_device(workspace: Path, tmp_path: Path) -> None:
    """As root, os.replace onto /dev/full turned the device into a regular file, and a FIFO too."""
    fifo = tmp_path / "grades.fifo"
    os.mkfifo(fifo)
    targets = {fifo: "a named pipe (FIFO)"}
    if Path("/dev/full").exists():  # a link to it: the test never names the device itself as the target
        (tmp_path / "full").symlink_to("/dev/full")
        targets[tmp_path / "full"] = "a character device"
    (tmp_path / "folder").mkdir()
    targets[tmp_path / "folder"] = "a folder"
    for target, kind in targets.items():
        done = tinyamp("exercises", "check", str(workspace), "--only", "1.1", "--format", "gradescope",
                       "--results", str(target))  # fmt: skip
        line = one_error(done)
        assert line.startswith(f"tinyamp: error: --results {target} is ") and kind in line, line
        assert "give a new path or a regular file" in line or "give a file path" in line, line
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    if Path("/dev/full").exists():
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode) and os.path.islink(tmp_path / "full")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ws", "folder", fifo.name, *(
        ["full"] if Path("/dev/full").exists() else [])])  # no temporary file left  # fmt: skip


def test_results_replaces_a_regular_file_and_a_new_path_is_written(workspace: Path, tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text("last week's grades")
    for target in (old, tmp_path / "new.json"):
        done = tinyamp("exercises", "check", str(workspace), "--only", "1.1", "--format", "gradescope",
                       "--results", str(target))  # fmt: skip
        assert done.returncode == 1, done.stderr  # 1.1 is not started
        assert f"wrote {target}: score 0 of 1" in done.stdout
        assert '"score": 0' in target.read_text()


def test_write_atomically_leaves_a_fifo_put_in_place_after_the_check(tmp_path: Path) -> None:
    """The check runs again just before the replace: a pipe made there while grading ran is left alone."""
    from tinyamp.exercises.reports import write_atomically

    fifo = tmp_path / "results.json"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="is a named pipe"):
        write_atomically(fifo, "{}")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_results_without_format_gradescope_is_refused_naming_the_flag(workspace: Path, tmp_path: Path) -> None:
    """It printed the table and wrote nothing: a course would look for results.json in vain."""
    for extra in ([], ["--json"], ["--format", "table"]):
        done = tinyamp("exercises", "check", str(workspace), "--only", "1.1", *extra, "--results",
                       str(tmp_path / "r.json"))  # fmt: skip
        assert one_error(done) == (f"tinyamp: error: --results {tmp_path / 'r.json'} names where --format gradescope "
                                   "writes Gradescope's results.json; add --format gradescope, or leave out "
                                   "--results")  # fmt: skip
    assert not (tmp_path / "r.json").exists()


# ---- the limits: a range, in one sentence ----------------------------------------------------------------
@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--timeout", str(2**70), "--timeout takes a number of seconds above 0 and up to 86,400, such as 60"),
        ("--timeout", "1e12", "--timeout takes a number of seconds above 0 and up to 86,400, such as 60"),
        ("--timeout", "1e9", "--timeout takes a number of seconds above 0 and up to 86,400, such as 60"),
        ("--memory", "1e308", "--memory takes a number of GiB from 0.001 to 1,048,576, such as 2"),
        ("--memory", "1e10", "--memory takes a number of GiB from 0.001 to 1,048,576, such as 2"),
        ("--memory", "1e-300", "--memory takes a number of GiB from 0.001 to 1,048,576, such as 2"),
    ],
)
def test_limits_out_of_range_are_one_sentence(workspace: Path, flag: str, value: str, message: str) -> None:
    """--timeout 2**70 and --memory 1e308 ended in OverflowError tracebacks."""
    done = tinyamp("exercises", "check", str(workspace), "--only", "1.1", flag, value, timeout=60)
    assert one_error(done) == f"tinyamp: error: {message}; got {value!r}"


def test_the_largest_memory_limit_still_passes_the_reference_solution(tmp_path: Path) -> None:
    """--memory 1e10 (GiB) made RLIMIT_AS pass 2^63 bytes: setrlimit raised in the child, and the reference
    solution "failed" with exit status 1.  The largest limit accepted leaves room below 2^63."""
    write_workspace(tmp_path / "ws", solutions=True)
    done = tinyamp("exercises", "check", str(tmp_path / "ws"), "--only", "1.1", "--memory", "1048576")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^1\.1 .* passed ", done.stdout, re.M), done.stdout


# ---- help into a full disk: status 74, as every other output ---------------------------------------------
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["exercises", "--help"], ["exercises", "check", "-h"],
                                  ["train", "--help"]])  # fmt: skip
def test_help_written_to_a_full_disk_exits_74_with_one_sentence(argv: list[str]) -> None:
    with open("/dev/full", "w") as full:
        done = tinyamp(*argv, stdout=full, stderr=subprocess.PIPE, timeout=60)
    assert done.returncode == 74, done.stderr
    assert done.stderr == ("tinyamp: could not write to standard output (No space left on device): the help or "
                           "version it printed is lost\n")  # fmt: skip
