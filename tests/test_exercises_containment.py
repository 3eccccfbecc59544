"""Student code that tries to reach past its grading process: each attack is made for real, by a workspace
graded by the real command in a subprocess, and each must fail its own exercise with one sentence and leave
nothing running, nothing written outside its copy, and nothing of its own executed in the grading command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from exercise_helpers import Channel

from tinyamp.exercises import unprivileged
from tinyamp.exercises.catalog import PACKAGE
from tinyamp.exercises.workspace import write_workspace

pytestmark = pytest.mark.cli

ROOT = Path(__file__).resolve().parents[1]


def check(workspace: Path, *only: str, timeout: str = "20") -> subprocess.CompletedProcess[str]:
    """`python -m tinyamp exercises check WORKSPACE --only ...` from this checkout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    argv = [sys.executable, "-m", "tinyamp", "exercises", "check", str(workspace), "--timeout", timeout]
    for number in only:
        argv += ["--only", number]
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)


def row(out: str, number: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(f"{number} "))


@pytest.fixture
def solutions(tmp_path: Path) -> Path:
    write_workspace(tmp_path / "ws", solutions=True)
    return tmp_path / "ws"


def first_statement(workspace: Path, module: str, function: str, code: str) -> None:
    """Put `code` (lines, indented for a function body) first in `function` of myamp/<module>.py."""
    path = workspace / PACKAGE / f"{module}.py"
    source = path.read_text()
    start = source.index(f"def {function}(")
    after_docstring = source.index('"""', source.index('"""', start) + 3) + 3
    body = "".join(f"\n    {line}" for line in code.splitlines())
    path.write_text(f"{source[:after_docstring]}{body}{source[after_docstring:]}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]


# As root, the grading command runs student code as nobody where nobody can read the installation, else as
# user 0 without capabilities; and, for any user where the kernel allows it, with every file but its copy
# read-only (tests/test_exercises_unprivileged.py).  Only where none of it works does root's code keep its rights.
_plan = unprivileged.plan()
student_code_is_root = unprivileged.is_root() and _plan.user is None and not _plan.sealed

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process trees and limits: Linux only")


@linux
def test_a_daemon_that_left_its_process_group_is_killed_with_its_exercise(solutions: Path, channel: Channel) -> None:
    """A double fork and setsid: the daemon is in no group of the grader's, yet it must not outlive the grading
    (it would rewrite results.json after the verdict, or run for ever)."""
    first_statement(solutions, "backward", "softmax_backward", f"""import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open({str(channel.path)!r}, 'w').write(f'pid {{os.getpid()}}\\n')
        time.sleep(4)
        open({str(channel.path)!r}, 'w').write('too late')
    os._exit(0)""")
    done = check(solutions, "2.1")
    assert "2.1 " in done.stdout, done.stderr
    daemon = int(channel.read().split()[1])
    assert not alive(daemon), "the daemon outlived the grading"
    time.sleep(5)
    assert "too late" not in channel.read()


@linux
def test_processes_past_the_limit_end_the_exercise_with_a_sentence(solutions: Path, channel: Channel) -> None:
    """Many children, each sleeping: past PROCESS_LIMIT at once the exercise fails at once, and all of them end."""
    first_statement(solutions, "backward", "softmax_backward", f"""import os, time
for _ in range(200):
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    open({str(channel.path)!r}, 'a').write(f'{{pid}}\\n')""")
    began = time.monotonic()
    done = check(solutions, "2.1", "2.2")
    assert time.monotonic() - began < 60
    # the census's sentence; or, as a user RLIMIT_NPROC binds (nobody), os.fork's own error when the student's
    # process ended first and its children, adopted by the grading command, were no longer below it to count
    assert re.search(r"started more than 64 processes at once \(a fork bomb\?\)|raised BlockingIOError: \[Errno 11\]",
                     row(done.stdout, "2.1")), done.stdout  # fmt: skip
    assert " passed " in row(done.stdout, "2.2")  # the next exercise is graded as usual
    started = [int(p) for p in channel.read().split()]
    assert len(started) > 64 and not any(alive(p) for p in started)


@linux
def test_an_endless_print_is_stopped_at_the_output_limit(solutions: Path) -> None:
    first_statement(solutions, "backward", "softmax_backward", "while True:\n    print('x' * 4096)")
    began = time.monotonic()
    done = check(solutions, "2.1", timeout="60")
    assert time.monotonic() - began < 50  # long before the time limit
    assert "killed by SIGXFSZ (a file, or what it printed, reached 64 MiB: an endless print?)" in row(done.stdout,
                                                                                                     "2.1")  # fmt: skip


def test_reading_standard_input_ends_at_once(solutions: Path) -> None:
    first_statement(solutions, "backward", "softmax_backward", "input()")
    began = time.monotonic()
    done = check(solutions, "2.1", timeout="60")
    assert time.monotonic() - began < 50
    assert "raised EOFError" in row(done.stdout, "2.1"), done.stdout


def test_a_pickle_sent_down_the_result_pipe_runs_nothing_in_the_grader(solutions: Path, tmp_path: Path) -> None:
    """The child's message is JSON: a pickle whose loading would run `touch` is not a verdict, and never runs."""
    ran = tmp_path / "ran-in-the-grader"
    first_statement(solutions, "backward", "softmax_backward", f"""import gc, os
from multiprocessing.connection import Connection
class Evil:
    def __reduce__(self):
        return (os.system, ('touch {ran}',))
for c in [o for o in gc.get_objects() if isinstance(o, Connection) and o.writable]:
    c.send(('result', Evil()))""")
    done = check(solutions, "2.1")
    assert not ran.exists(), "the pickle ran in the grading command"
    assert "failed" in row(done.stdout, "2.1") and " passed " not in row(done.stdout, "2.1")


def test_the_reference_solution_loaded_through_a_helper_module_fails(solutions: Path) -> None:
    """A helper module that puts a checkout's tests/ on sys.path and imports the reference solution: refused before
    the student's process runs anything (``reach``).  Past that check, the modules the grading loaded would still
    name it (``remote.is_solution``, in the grader's last question)."""
    write_workspace(solutions.parent / "stubs")
    stubs = solutions.parent / "stubs"
    (stubs / PACKAGE / "helper.py").write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'tests')!r})\n"
                                               "from exercise_solutions import backward as b\n")  # a checkout's
    path = stubs / PACKAGE / "backward.py"
    source = path.read_text()
    path.write_text(source.replace("import numpy as np\n", "import numpy as np\n\nfrom myamp import helper\n", 1)
                    .replace("    raise NotImplementedError", "    return helper.b.softmax_backward(y, g, axis)\n"
                             "    raise NotImplementedError", 1))  # fmt: skip
    done = check(stubs, "2.1")
    assert ("myamp/helper.py line 2: uses sys.path.insert, which loads or runs code the grader cannot read: the "
            "grader cannot tell what such code changes") in row(done.stdout, "2.1"), done.stdout  # fmt: skip


def test_a_module_linked_to_the_solutions_is_not_graded(solutions: Path) -> None:
    write_workspace(solutions.parent / "stubs")
    stubs = solutions.parent / "stubs"
    (stubs / PACKAGE / "backward.py").unlink()
    (stubs / PACKAGE / "backward.py").symlink_to(solutions / PACKAGE / "backward.py")
    done = check(stubs, "2.1")
    assert "myamp/backward.py -> " in row(done.stdout, "2.1")
    assert "is a link: the grader grades the files in the workspace itself, so copy the code into it" in done.stdout


@pytest.mark.skipif(student_code_is_root, reason="root's rights: it may raise any limit")
def test_student_code_cannot_raise_its_memory_limit(solutions: Path) -> None:
    first_statement(solutions, "backward", "softmax_backward", """import resource
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))""")
    done = check(solutions, "2.1")
    assert "raised ValueError" in row(done.stdout, "2.1"), done.stdout


@pytest.mark.skipif(student_code_is_root, reason="root's rights: it may open any process's files")
def test_student_code_cannot_write_into_the_graders_table(solutions: Path) -> None:
    first_statement(solutions, "backward", "softmax_backward", """import os
with open(f'/proc/{os.getppid()}/fd/1', 'w') as out:
    out.write('2.1  forged  passed')""")
    done = check(solutions, "2.1")
    assert "forged" not in done.stdout
    assert "raised PermissionError" in row(done.stdout, "2.1"), done.stdout


@pytest.mark.skipif(not _plan.sealed, reason="no mount namespace here: student code writes with the grader's rights")
def test_student_code_cannot_change_the_real_workspace_by_its_path(solutions: Path) -> None:
    target = solutions / PACKAGE / "formats.py"
    before = target.read_text()
    first_statement(solutions, "backward", "softmax_backward", f"open({str(target)!r}, 'w').write('')")
    done = check(solutions, "2.1")
    assert target.read_text() == before
    assert re.search(r"raised (PermissionError|OSError): \[Errno (13|30)\]", row(done.stdout, "2.1")), done.stdout
