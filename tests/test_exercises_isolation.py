"""Grading code it did not write: each exercise in a child process, so that student code that exits,
hangs, hogs memory or deletes files fails its own exercise with one line of reason, and every other
exercise is still graded.  Each case is a real workspace graded by the real command, in a subprocess."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from exercise_helpers import Channel

from tinyamp.exercises.catalog import EXERCISES, PACKAGE
from tinyamp.exercises.workspace import write_workspace

pytestmark = pytest.mark.cli

ROOT = Path(__file__).resolve().parents[1]


def tinyamp(*argv: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m tinyamp ...` from this checkout, as a student or a course runs it (bytecode writes allowed)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "tinyamp", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or ROOT, env=env)  # fmt: skip


def with_first_line(workspace: Path, module: str, function: str, line: str) -> Path:
    """The reference solution of `function`, with `line` as its first statement (after the docstring)."""
    path = workspace / PACKAGE / f"{module}.py"
    source = path.read_text()
    start = source.index(f"def {function}(")
    after_docstring = source.index('"""', source.index('"""', start) + 3) + 3
    path.write_text(f"{source[:after_docstring]}\n    {line}{source[after_docstring:]}")
    return workspace


def line_of(workspace: Path, module: str, text: str) -> int:
    """The line number of `text` in myamp/<module>.py."""
    lines = (workspace / PACKAGE / f"{module}.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def row(out: str, number: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(f"{number} "))


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` and the hash of its bytes."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}  # fmt: skip


@pytest.fixture
def solutions(tmp_path: Path) -> Path:
    write_workspace(tmp_path / "ws", solutions=True)
    return tmp_path / "ws"


# ---- student code that ends, hangs or breaks the grading fails its own exercise, and only that one --------
CASES = {
    "sys.exit(0)": ("import sys; sys.exit(0)", r"called sys\.exit\(0\) at myamp/backward\.py:{line}: a graded"),
    "os._exit(0)": ("import os; os._exit(0)", r"called os\._exit\(0\) at myamp/backward\.py:{line}$"),
    "KeyboardInterrupt": ("raise KeyboardInterrupt", r"raised KeyboardInterrupt at myamp/backward\.py:{line}$"),
    "a BaseException": ("raise GeneratorExit('bye')", r"raised GeneratorExit: bye at myamp/backward\.py:{line}$"),
    "an infinite loop": ("while True: pass", r"still running after 3 s: an infinite loop\? \(--timeout SECONDS"),
    "a thread left running": ("import threading, time; threading.Thread(target=lambda: time.sleep(3600)).start()",
                              r"gave a verdict but was still running after 3 s: a thread or process of yours left"),
    "a SIGKILL": ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
                  r"the grading process was killed by SIGKILL \(out of memory\?\) before a verdict"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_student_code_that_ends_or_hangs_the_grading_fails_its_exercise_only(solutions: Path, case: str) -> None:
    line, reason = CASES[case]
    with_first_line(solutions, "backward", "softmax_backward", line)
    done = tinyamp("exercises", "check", str(solutions), "--only", "2.1", "--only", "2.2", "--timeout", "3")
    assert done.returncode == 1, done.stdout + done.stderr
    failed = row(done.stdout, "2.1")
    assert "failed" in failed
    assert re.search(reason.format(line=line_of(solutions, "backward", line)), failed), failed
    assert "passed" in row(done.stdout, "2.2")  # graded after it, in a process of its own
    assert "1 passed, 1 failed" in done.stdout and not done.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is enforced on Linux only")
def test_a_memory_hog_fails_with_a_memory_error_at_its_line(solutions: Path) -> None:
    hog = "hog = b'x' * (2 * 2**30)"  # 2 GiB, written: beyond the 0.5 GiB allowed
    with_first_line(solutions, "formats", "fp16_matmul", hog)
    done = tinyamp("exercises", "check", str(solutions), "--only", "1.3", "--only", "1.2", "--memory", "0.5")
    assert done.returncode == 1
    assert re.search(
        rf"failed .* ran out of memory at myamp/formats\.py:{line_of(solutions, 'formats', hog)} \(MemoryError; the "
        r"limit is 0\.5 GiB beyond the grader's own, --memory GIB\)$",
        row(done.stdout, "1.3"),
    ), done.stdout
    assert "passed" in row(done.stdout, "1.2")


def test_code_that_deletes_files_changes_only_its_own_copy_and_nothing_is_written_into_the_workspace(
    solutions: Path,
) -> None:
    delete = ("import shutil, pathlib; here = pathlib.Path(__file__).resolve().parents[1]; shutil.rmtree(here / "
              "'tests', ignore_errors=True); (here / 'myamp' / 'formats.py').write_text('')")  # fmt: skip
    with_first_line(solutions, "op_policy", "autocast_dtypes", delete)
    before = snapshot(solutions)
    done = tinyamp("exercises", "check", str(solutions), "--only", "6.1", "--only", "1.1", "--jobs", "1")
    assert done.returncode == 0, done.stdout  # 6.1 is right after its deletions; 1.1 is graded on its own copy
    assert "2 passed" in done.stdout
    assert snapshot(solutions) == before  # no deletion, no __pycache__, no .hypothesis: the workspace as it was


def test_exit_status_0_only_when_every_exercise_asked_for_passes(solutions: Path, tmp_path: Path) -> None:
    done = tinyamp("exercises", "check", str(solutions))
    assert done.returncode == 0, done.stdout
    assert f"{len(EXERCISES)} passed" in done.stdout
    write_workspace(tmp_path / "stubs")
    done = tinyamp("exercises", "check", str(tmp_path / "stubs"), "--only", "1.1")
    assert done.returncode == 1 and "1 not started" in done.stdout


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_grading_command_ends_its_children_and_their_copies(
    solutions: Path, tmp_path: Path, signum: int, channel: Channel
) -> None:
    """Ctrl-C during `exercises check` while a student's endless loop runs: one line, 128 + the signal, and no
    child left spinning (it has a process group of its own, so the terminal's Ctrl-C never reaches it)."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    loop = f"import os; open({str(channel.path)!r}, 'w').write(f'{{os.getpid()}} ')\n    while True: pass"
    with_first_line(solutions, "backward", "softmax_backward", loop)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), TMPDIR=str(temporary))
    argv = [sys.executable, "-m", "tinyamp", "exercises", "check", str(solutions), "--only", "2.1"]
    command = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child = 0
    try:
        deadline = time.monotonic() + 120
        while not channel.read() and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(channel.read())  # the student's loop is running
        command.send_signal(signum)
        _, stderr = command.communicate(timeout=60)
        assert command.returncode == 128 + signum, stderr
        assert stderr.strip() == f"tinyamp: stopped by {signal.Signals(signum).name}; nothing was written"
        with pytest.raises(ProcessLookupError):  # killed and reaped by the command before it ended
            os.kill(child, 0)
        assert list(temporary.iterdir()) == []  # its copy of the workspace removed
    finally:
        command.kill()
        if child:  # a failing run must not leave the loop spinning either
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


# ---- the student's line, never the grader's ---------------------------------------------------------------
def test_a_failure_names_the_students_file_and_line(solutions: Path) -> None:
    backward = solutions / PACKAGE / "backward.py"
    backward.write_text(
        "import numpy as np\n\n\ndef softmax_backward(y, g, axis):\n    s = (g * y).sum(axis=axis, keepdims=True)\n"
        "    return y[5] * (g - s)\n\n\ndef log_softmax_backward(y, g, axis):\n    return g\n\n\n"
        "def layer_norm_backward(xhat, rstd, g):\n    return helper(g)\n\n\ndef helper(g):\n"
        "    return g / 0.0 + {}[1]\n"
    )
    done = tinyamp("exercises", "check", str(solutions), "--only", "2.1", "--only", "2.2", "--only", "2.3")
    assert done.returncode == 1
    assert row(done.stdout, "2.1").endswith("raised IndexError: index 5 is out of bounds for axis 0 with size 1 "
                                            "(at myamp/backward.py:6)")  # fmt: skip
    assert row(done.stdout, "2.2").endswith("(log_softmax_backward, myamp/backward.py:9)")  # a wrong value: its def
    assert row(done.stdout, "2.3").endswith("raised KeyError: 1 (at myamp/backward.py:18)")  # the helper's line
    assert "tinyamp/" not in done.stdout.replace(str(ROOT), "")  # no grader source in any reason


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("if True", r"myamp/backward\.py does not import: SyntaxError: expected ':' \(backward\.py, line {line}\)"),
        (
            "from dataclasses import dataclass\n    @dataclass(frozen=True)\n    class P:\n        a: int = 0\n    "
            "P().a = 2",
            r"raised FrozenInstanceError: cannot assign to field 'a'",
        ),
    ],
    ids=["a syntax error", "code a dataclass generated"],
)
def test_code_with_no_file_of_its_own_is_placed_at_the_students_line(solutions: Path, line: str, reason: str) -> None:
    """Python names a frame with no file "<string>" or "<frozen importlib._bootstrap>"; grading runs in the
    workspace, where such a name resolved to a path looked like the student's file: the line must be theirs."""
    with_first_line(solutions, "backward", "softmax_backward", line)
    at = line_of(solutions, "backward", line.split("\n")[-1].strip())
    done = tinyamp("exercises", "check", str(solutions), "--only", "2.1")
    assert re.search(rf"failed .*{reason.format(line=at)} \(at myamp/backward\.py:{at}\)$", row(done.stdout, "2.1"))


# ---- bad input: one sentence, exit status 2 ----------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, message",
    [
        (["check", "{tmp}/nowhere"], r"{tmp}/nowhere does not exist; write a workspace there with tinyamp exercises"),
        (["check", "{tmp}"], r"{tmp} is not a workspace \(it has no myamp/ folder\); write one with tinyamp"),
        (["list", "{tmp}"], r"{tmp} is not a workspace"),
        (["check", "{ws}", "--only", "9.9"], r"no exercise '9.9'; the exercises are 1.1, 1.2"),
        (["init", ""], r"exercises init needs the name of a new folder, e.g. tinyamp exercises init ws$"),
        (["check", "{ws}", "--timeout", "abc"], r"--timeout takes a number > 0, such as 60; got 'abc'"),
        (["check", "{ws}", "--timeout", "0"], r"--timeout takes a number > 0, such as 60; got '0'"),
        (["check", "{ws}", "--timeout", "-5"], r"--timeout takes a number > 0, such as 60; got '-5'"),
        (["check", "{ws}", "--timeout", "nan"], r"--timeout takes a number > 0, such as 60; got 'nan'"),
        (["check", "{ws}", "--timeout", "inf"], r"--timeout takes a number > 0, such as 60; got 'inf'"),
        (["check", "{ws}", "--memory", "lots"], r"--memory takes a number > 0, such as 2; got 'lots'"),
        (["check", "{ws}", "--jobs", "1.5"], r"--jobs takes a whole number > 0, such as 2; got '1.5'"),
        (["check", "{ws}", "--format", "gradescope", "--results", "{ws}/results.json"],
         r"--results .* is inside the workspace .*, which grading never writes into; give a path outside it"),
        (["check", "{ws}", "--format", "gradescope", "--results", "{tmp}/no/results.json"],
         r"--results .*: .* is not a folder to write results.json into"),
    ],
)  # fmt: skip
def test_bad_input_is_one_sentence_and_exit_status_2(tmp_path: Path, argv: list[str], message: str) -> None:
    write_workspace(tmp_path / "ws")
    before = snapshot(tmp_path)
    argv = [a.format(tmp=tmp_path, ws=tmp_path / "ws") for a in argv]
    done = tinyamp("exercises", *argv, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert re.search("tinyamp: error: " + message.format(tmp=re.escape(str(tmp_path))), done.stderr), done.stderr
    assert snapshot(tmp_path) == before


def test_an_init_that_cannot_finish_takes_back_what_it_wrote_and_names_what_is_in_the_way(tmp_path: Path) -> None:
    """A file named `tests` where the workspace needs a folder: before, init wrote myamp/ and two files, then
    failed with '[Errno 17] File exists', and the next init refused to write over the half workspace it had left."""
    folder = tmp_path / "ws"
    folder.mkdir()
    (folder / "tests").write_text("my notes")
    done = tinyamp("exercises", "init", str(folder), timeout=60)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"tinyamp: error: cannot write the workspace into {folder} ({folder / 'tests'} is a file "
                           "where the workspace needs a folder; move it aside or give a new folder); nothing was left "
                           "there\n")  # fmt: skip
    assert [p.name for p in folder.iterdir()] == ["tests"] and (folder / "tests").read_text() == "my notes"
    (folder / "tests").rename(tmp_path / "notes")
    done = tinyamp("exercises", "init", str(folder), timeout=60)
    assert done.returncode == 0 and (folder / PACKAGE / "formats.py").is_file(), done.stderr


# ---- results a course platform reads -----------------------------------------------------------------------
def test_json_prints_one_record_per_exercise(tmp_path: Path) -> None:
    write_workspace(tmp_path / "ws")
    (tmp_path / "ws" / PACKAGE / "backward.py").write_text(
        "def softmax_backward(y, g, axis):\n    return y * g\n"
    )  # fmt: skip
    done = tinyamp("exercises", "check", str(tmp_path / "ws"), "--only", "2.1", "--only", "5.3", "--json")
    assert done.returncode == 1
    records = json.loads(done.stdout)  # only JSON on stdout
    assert [r["number"] for r in records] == ["2.1", "5.3"]
    assert set(records[0]) == {"number", "id", "title", "status", "reason", "seconds", "points", "max_points"}
    assert records[0]["status"] == "failed" and "your softmax_backward gives" in records[0]["reason"]
    assert records[1]["status"] == "not started" and records[1]["reason"].startswith("write scaling_is_exact in")
    assert [r["points"] for r in records] == [0, 0] and [r["max_points"] for r in records] == [1, 1]
    assert all(isinstance(r["seconds"], float) and r["seconds"] >= 0 for r in records)


def test_gradescope_results_have_the_fields_gradescope_reads(solutions: Path, tmp_path: Path) -> None:
    (solutions / PACKAGE / "op_policy.py").write_text("def autocast_dtypes(op, dtypes, lower='float16', o=None):\n"
                                                       "    return list(dtypes)\n")  # fmt: skip
    results = tmp_path / "results.json"
    done = tinyamp("exercises", "check", str(solutions), "--format", "gradescope", "--results", str(results))
    assert done.returncode == 1
    assert f"wrote {results}: score {len(EXERCISES) - 1} of {len(EXERCISES)}" in done.stdout
    grades = json.loads(results.read_text())
    assert set(grades) == {"score", "execution_time", "output", "tests"}
    assert grades["score"] == len(EXERCISES) - 1 == sum(t["score"] for t in grades["tests"])
    assert len(grades["tests"]) == len(EXERCISES)
    for test, e in zip(grades["tests"], EXERCISES):
        assert set(test) == {"name", "number", "score", "max_score", "status", "output"}
        assert test["name"] == f"Exercise {e.number}: {e.title}" and test["max_score"] == e.points == 1
        assert isinstance(test["output"], str) and test["status"] in ("passed", "failed")
        assert (test["score"], test["status"]) == ((0, "failed") if e.number == "6.1" else (1, "passed"))
    policy = next(t for t in grades["tests"] if t["number"] == "6.1")
    assert policy["output"].startswith("failed: for op '")


# ---- findable -----------------------------------------------------------------------------------------------
def test_list_names_every_exercise_and_how_far_each_is_in_a_workspace(tmp_path: Path) -> None:
    done = tinyamp("exercises", "list", timeout=60)
    assert done.returncode == 0
    for e in EXERCISES:
        assert re.search(rf"^{re.escape(e.number)} +{re.escape(e.title)} +1 +{e.minutes}  {re.escape(e.tutorial)}$",
                         done.stdout, re.M), e.number  # fmt: skip
    assert "tinyamp exercises init ws  then  tinyamp exercises check ws" in done.stdout
    workspace = tmp_path / "ws"
    write_workspace(workspace)
    (workspace / PACKAGE / "backward.py").write_text(
        "def softmax_backward(y, g, axis):\n    return y * g\n\n"
        "def log_softmax_backward(y, g, axis):\n    s = g.sum()\n    raise NotImplementedError\n"
    )
    before = snapshot(workspace)
    done = tinyamp("exercises", "list", str(workspace), timeout=60)
    assert done.returncode == 0
    status = {line[:5].strip(): re.split(r"  +", line)[4] for line in done.stdout.splitlines() if line[:1].isdigit()}
    assert status["2.1"] == "written" and status["2.2"] == "in progress" and status["1.1"] == "not started"
    assert status["2.3"] == "missing"  # no layer_norm_backward in myamp/backward.py
    assert snapshot(workspace) == before  # read, never run


def test_help_lists_the_exercises_and_the_first_two_commands() -> None:
    done = tinyamp("exercises", "--help", timeout=60)
    assert done.returncode == 0
    assert all(f"  {e.number:<4} {e.title}" in done.stdout for e in EXERCISES)
    assert "tinyamp exercises init ws  then  tinyamp exercises check ws" in done.stdout


def test_the_readme_says_how_to_start_and_how_to_grade_a_class() -> None:
    readme = (ROOT / "README.md").read_text()
    top = readme[: readme.index("## A first look")]  # the first screen
    assert "tinyamp exercises init ws" in top and "tinyamp exercises check ws" in top
    assert f"{len(EXERCISES)} graded exercises" in top
    grading = readme[readme.index("**Grading a class.**") :]
    assert "--format gradescope" in grading and "--json" in grading
    assert all(e.points == 1 for e in EXERCISES) and "each exercise passed is worth 1 point" in readme
    assert "with a time limit (60 s; `--timeout SECONDS`)" in readme and "(2 GiB beyond the" in readme
    from tinyamp.exercises.isolation import DEFAULT_MEMORY_GIB, DEFAULT_TIMEOUT

    assert (DEFAULT_TIMEOUT, DEFAULT_MEMORY_GIB) == (60, 2)


def test_a_workspace_that_cannot_be_copied_is_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse
    import shutil

    from tinyamp.exercises import command, isolation

    write_workspace(tmp_path / "ws")

    def unreadable(source: Path, *args: object, **kwargs: object) -> None:
        raise shutil.Error([(str(Path(source) / "secret"), "copy", "[Errno 13] Permission denied")])

    monkeypatch.setattr(isolation.shutil, "copytree", unreadable)
    copies = set(Path(isolation.tempfile.gettempdir()).glob("tinyamp-grading-*"))
    p = argparse.ArgumentParser(prog="tinyamp")
    command.add_parser(p.add_subparsers(dest="command", required=True))
    assert command.run(p.parse_args(["exercises", "check", str(tmp_path / "ws"), "--only", "1.1"])) == 2
    err = capsys.readouterr().err
    assert err == (f"tinyamp: error: cannot copy the workspace {tmp_path / 'ws'} to grade it: "
                   f"{tmp_path / 'ws' / 'secret'}: [Errno 13] Permission denied\n")  # fmt: skip
    assert set(Path(isolation.tempfile.gettempdir()).glob("tinyamp-grading-*")) <= copies  # its folder removed
